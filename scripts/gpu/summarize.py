#!/usr/bin/env python3
"""summarize.py OUTDIR - the tables of a scripts/gpu-proof.sh run, from
OUTDIR/results.jsonl and OUTDIR/steps.tsv: step status, then one table per
workload with each arm's median time, its ratio to arm A, peak memory,
allocation counts and the digest that shows whether results agree.
"""
import collections
import json
import os
import statistics
import sys

GiB = 1 << 30


def fmt_bytes(v):
    return "-" if v is None else f"{v / GiB:.2f}G"


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*header)]
    out += [line.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(out)


def by_arm(results, step):
    arms = collections.OrderedDict()
    for r in results:
        if r.get("step") == step:
            arms.setdefault(r.get("arm_label"), []).append(r)
    return arms


def timed_table(results, step, key):
    arms = by_arm(results, step)
    if not arms:
        return None
    base = None
    rows = []
    for arm, runs in arms.items():
        t = med(r.get(key) for r in runs)
        if base is None:
            base = t
        shim = [r.get("shim_after") or r.get("shim") for r in runs]
        shim = shim[-1] if shim else None
        digests = sorted({r.get("loss_digest") or r.get("exact_digest") or r.get("sum_digest")
                          or "-" for r in runs})
        rows.append([
            arm, len(runs), ",".join(str(r.get("exit")) for r in runs), fmt(t, ".2f"),
            fmt(t / base, ".3f") if t and base else "-",
            fmt(med(r.get("gpu_busy_ms_per_step") for r in runs), ".2f"),
            fmt_bytes(med(r.get("nvml_peak_bytes") for r in runs)),
            fmt_bytes(med(r.get("torch_peak_allocated") for r in runs)),
            fmt_bytes(med(r.get("torch_peak_reserved") for r in runs)),
            fmt(med(r.get("torch_device_allocs_after_warmup") for r in runs), ".0f"),
            fmt(med(r.get("shim_region_allocs_after_warmup") for r in runs), ".0f"),
            fmt_bytes(med(r.get("shim_moved_bytes_after_warmup") for r in runs)),
            "-" if not shim else shim.get("num_allocs"),
            "-" if not shim else shim.get("num_fence_waits"),
            "-" if not shim else shim.get("passthrough_allocs"),
            " ".join(digests),
        ])
    return table(rows, ["arm", "runs", "exit", key, "vs first", "gpu busy", "nvml peak", "peak alloc",
                        "peak resv", "dev allocs*", "regions*", "moved*", "pool allocs",
                        "fence waits",
                        "passthru", "digest"])


def timed_tables(results, step, key):
    """timed_table per workload of STEP (torch-abc runs ResNet-50 and GPT-2
    in one step: each model's arms are compared with its own first arm)."""
    workloads = []
    for r in results:
        if r.get("step") == step and r.get(key) is not None and r.get("workload") not in workloads:
            workloads.append(r.get("workload"))
    out = []
    for w in workloads:
        t = timed_table([r for r in results if r.get("workload") == w and r.get(key) is not None],
                        step, key)
        if t:
            out.append((w, t))
    return out


def arm_median(results, step, workload, arm, key):
    return med(r.get(key) for r in results if r.get("step") == step and
               r.get("workload") == workload and r.get("arm") == arm)


def quick_goals(results):
    """The quick profile's answers to issue 53's GPU goals, where its arms
    ran: arm C within 3% of arm A and B within 1% (step time), the growing
    pool's NVML peak within 5% of expandable_segments', the largest GPT
    batch under C in 16 GiB (A's was 7, PyTorch's cudaMallocAsync's 8)."""
    lines = []
    for w in ("torch-resnet", "torch-gpt"):
        a = arm_median(results, "torch-abc", w, "A", "step_ms_median")
        for arm, goal in (("B", 1.01), ("C", 1.03)):
            x = arm_median(results, "torch-abc", w, arm, "step_ms_median")
            if a and x:
                lines.append(f"  {w}: {arm}/A step time {x / a:.3f} (goal <= {goal:.2f}: "
                             f"{'met' if x / a <= goal else 'missed'})")
    g = arm_median(results, "torch-growth", "torch-gpt", "G", "nvml_peak_bytes")
    e = arm_median(results, "torch-growth", "torch-gpt", "E", "nvml_peak_bytes")
    if g and e:
        lines.append(f"  growing pool: NVML peak {fmt_bytes(g)} against expandable_segments' "
                     f"{fmt_bytes(e)}: {g / e:.3f} (goal <= 1.05: "
                     f"{'met' if g / e <= 1.05 else 'missed'})")
    for r in results:
        if r.get("step") == "near-limit" and r.get("max_batch") is not None:
            lines.append(f"  {r.get('arm_label')}: largest batch {r['max_batch']} under "
                         f"{r.get('cap', '?')} (A's: 7; goal: at least 7, aiming at 8)")
    if lines and not any(r.get("nvml_peak_bytes") for r in results):
        lines.insert(0, "  (no NVML figure in these results, as in a rehearsal on the CPU: "
                        "the lines below try the scripts, they measure no GPU)")
    return "\n".join(lines) if lines else None


def pressure_verdict(results):
    """The pressure step's band arms side by side, where one region also
    runs: the default pool over virtual memory is laid out as one region
    until nothing fits there, so it should move nothing and take as long
    (docs/results/benchmarks-history.md, "One region first"; the granule choices of end
    made there change nothing on this job at 2% and 3% above its peak,
    replayed: "Granule choices of end before the first overflow"); None
    without both arms' step
    times. The band's limit is the one the arm ran at (its settings)."""
    arms = by_arm(results, "pressure")
    one = med(r.get("step_ms_median") for r in arms.get("C-band-one-region", []))
    dflt_runs = arms.get("C-band-default", [])
    dflt = med(r.get("step_ms_median") for r in dflt_runs)
    if not one or not dflt:
        return None
    limit = (dflt_runs[0].get("settings") or {}).get("BFCSHIM_MEM_LIMIT", "the band's limit")
    moved = med(r.get("shim_moved_bytes_after_warmup") for r in dflt_runs)
    moved_text = f", {fmt_bytes(moved)} moved after warm-up" if moved is not None else ""
    lines = [f"  at {limit} a step takes {one:.1f} ms in one region and {dflt:.1f} ms in the "
             f"default ({100 * (dflt / one - 1):+.1f}%{moved_text}; expected: 0 moved)"]
    # The spread layout (BFCSHIM_VMM_LAYOUT=spread) against the default at
    # the same limit: what its moves cost a step (issue 12's trade).
    for at in ("tight", "band"):
        d = med(r.get("step_ms_median") for r in arms.get(f"C-{at}-default", []))
        sp_runs = arms.get(f"C-{at}-spread", [])
        sp = med(r.get("step_ms_median") for r in sp_runs)
        if d and sp:
            sp_moved = med(r.get("shim_moved_bytes_after_warmup") for r in sp_runs)
            lines.append(f"  {at}: spread {sp:.1f} ms a step against the default's {d:.1f} ms "
                         f"({100 * (sp / d - 1):+.1f}%, {fmt_bytes(sp_moved)} moved after "
                         f"warm-up)")
    return "\n".join(lines)


def numba_suite_verdict(out):
    """Numba's own tests natively and under the shim: counts by outcome,
    and each test that ends otherwise under the shim; None without both."""
    ends = {}
    for arm in ("native", "shim"):
        path = os.path.join(out, f"numba-suite-{arm}.json")
        if not os.path.exists(path):
            return None
        ends[arm] = {t["id"]: t for t in json.load(open(path))["tests"]}
    lines = []
    for arm, tests in ends.items():
        counts = {}
        for t in tests.values():
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        lines.append(f"  {arm}: {counts}")
    changed = [k for k, t in ends["native"].items()
               if ends["shim"].get(k, {}).get("outcome") != t["outcome"]]
    lines.append(f"  tests that end otherwise under the shim: {len(changed)}")
    for k in changed:
        s = ends["shim"].get(k, {})
        lines.append(f"    {k}: {ends['native'][k]['outcome']} -> {s.get('outcome')} "
                     f"{s.get('reason', '')[:160]}")
    return "\n".join(lines)


def context_cache_verdict(results):
    """Arms run under BFCSHIM_CONTEXT_CACHE=check: how many, and each one
    whose remembered current context the driver contradicted (a change the
    shim's hooks did not see: a bug). None when no arm ran checked."""
    checked, wrong = 0, []
    for r in results:
        if (r.get("settings") or {}).get("BFCSHIM_CONTEXT_CACHE") != "check":
            continue
        checked += 1
        for key in ("shim_after_search", "shim_after", "shim"):
            shim = r.get(key)
            if shim and shim.get("context_cache_wrong"):
                wrong.append(f"{r.get('step')}/{r.get('arm_label')}: "
                             f"{shim['context_cache_wrong']} wrong")
                break
    if not checked:
        return None
    return "\n".join([f"  {checked} arm(s) checked, {len(wrong)} with a wrong remembered "
                      f"context (expected: 0)"] + ["  " + w for w in wrong])


def main():
    out = sys.argv[1]
    results = []
    path = os.path.join(out, "results.jsonl")
    if os.path.exists(path):
        for line in open(path):
            if line.strip():
                results.append(json.loads(line))
    print("\n== steps (exit status, seconds)")
    steps = os.path.join(out, "steps.tsv")
    if os.path.exists(steps):
        rows = [line.rstrip("\n").split("\t") for line in open(steps) if line.strip()]
        bad = [r for r in rows if r[2] not in ("0",)]
        print(f"{len(rows)} runs, {len(rows) - len(bad)} exit 0")
        for r in bad:
            print("  not ok:", " ".join(r))
    for step, key in (("torch-abc", "step_ms_median"), ("torch-growth", "step_ms_median"),
                      ("jax-pools", "step_ms_median"), ("quick-owed", "step_ms_median"),
                      ("torch-gpt", "step_ms_median"), ("torch-resnet", "step_ms_median"),
                      ("jax", "step_ms_median"), ("cupy", "iter_ms_median"),
                      ("vmm", "step_ms_median"), ("pressure", "step_ms_median"),
                      ("plan", "step_ms_median")):
        for workload, t in timed_tables(results, step, key):
            print(f"\n== {step}: {workload} (* = after warm-up)")
            print(t)
    goals = quick_goals(results)
    if goals:
        print(f"\n== issue 53's GPU goals, as far as these arms answer them\n{goals}")
    verdict = pressure_verdict(results)
    if verdict:
        print(f"\n== pressure: the default against one region, and spread\n{verdict}")
    cache = context_cache_verdict(results)
    if cache:
        print(f"\n== the remembered current context (BFCSHIM_CONTEXT_CACHE=check)\n{cache}")
    suite = numba_suite_verdict(out)
    if suite:
        print(f"\n== numba-suite: Numba's own driver tests, native and under the shim\n{suite}")
    for step in ("numba", "plugins", "three", "ddp", "maxbatch", "near-limit", "vmm",
                 "pressure"):
        arms = by_arm(results, step)
        if not arms:
            continue
        print(f"\n== {step}")
        for arm, runs in arms.items():
            for r in runs:
                keep = {k: r[k] for k in ("exit", "wrong_round_trips", "checks_failed",
                                          "seconds", "params_agree", "max_batch", "tried",
                                          "numba_binding", "sum_digest", "loss_digest",
                                          "exact_digest", "step_ms_median",
                                          "iter_ms_median", "other_before_trim",
                                          "other_after_trim", "trim_bytes", "trim_s",
                                          "ok") if k in r}
                if r.get("nvml_peak_bytes") is not None:
                    keep["nvml_peak"] = fmt_bytes(r["nvml_peak_bytes"])
                shim = (r.get("shim") or r.get("shim_rank0") or r.get("at_max_shim")
                        or r.get("shim_after_search"))
                if shim:
                    keep["pool"] = {k: shim[k] for k in ("num_allocs", "peak_bytes_in_use",
                                                         "peak_pool_bytes",
                                                         "passthrough_allocs", "vmm",
                                                         "num_map_calls", "num_unmap_calls",
                                                         "num_mapped_refits",
                                                         "num_growth_moves",
                                                         "growth_headroom",
                                                         "pressure_map_us_total",
                                                         "released_bytes_total",
                                                         "moved_bytes_total", "prealloc_us")
                                    if k in shim}
                print(f"  {arm}: {json.dumps(keep)}")
    bench = [r for r in results if r.get("workload") == "malloc-bench"]
    if bench:
        print("\n== malloc-bench: microseconds per allocation+free pair (median)")
        cells = collections.OrderedDict()
        arms = []
        for r in bench:
            cells.setdefault((r["api"], r["size"]), {})[r["arm_label"]] = r["us_median"]
            if r["arm_label"] not in arms:
                arms.append(r["arm_label"])
        rows = [[api, size] + [fmt(v.get(a), ".2f") for a in arms]
                for (api, size), v in cells.items()]
        print(table(rows, ["api", "bytes"] + arms))


if __name__ == "__main__":
    main()
