#!/usr/bin/env python3
"""scripts/gpu/summarize.py on the results of a quick profile run
(scripts/gpu-proof.sh, GPU_PROOF_STEPS=quick), made up here: every step of
that profile gets its table, each model's arms are compared with that
model's arm A, and the answers to issue 53's GPU goals are computed from
the arms (C/A and B/A step time, the growing pool's NVML peak against
expandable_segments', the largest batch near the limit). A GPU's minutes
are rare: the summary must read what its run wrote.

usage: test_gpu_summary.py SUMMARIZE WORKDIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

summarize, work = sys.argv[1:3]
testcheck.fresh_dir(work)
check = testcheck.Checks()
GB = 10 ** 9


def arm(step, workload, letter, label, ms, nvml=None, **more):
    return dict({"step": step, "workload": workload, "arm": letter, "arm_label": label,
                 "exit": 0, "step_ms_median": ms, "nvml_peak_bytes": nvml,
                 "loss_digest": "d"}, **more)


results = []
for run in (1, 2):  # two rounds, interleaved, as the profile runs them
    results += [
        arm("torch-abc", "torch-resnet", "A", "resnet-A-native", 100.0, 20 * GB),
        arm("torch-abc", "torch-resnet", "B", "resnet-B-shim-cache", 100.5, 60 * GB),
        arm("torch-abc", "torch-resnet", "C", "resnet-C-shim-nocache", 104.0, 60 * GB),
        arm("torch-abc", "torch-gpt", "A", "gpt-A-native", 200.0, 17 * GB),
        arm("torch-abc", "torch-gpt", "B", "gpt-B-shim-cache", 203.0, 60 * GB),
        arm("torch-abc", "torch-gpt", "C", "gpt-C-shim-nocache", 202.0, 60 * GB),
    ]
results += [
    arm("torch-growth", "torch-gpt", "G", "G-shim-nocache-growing", 201.0, 18.0 * GB),
    arm("torch-growth", "torch-gpt", "E", "E-native-expandable", 200.0, 17.36 * GB),
    arm("jax-pools", "jax-mlp", "A", "A-bfc-native", 40.0, 10 * GB),
    arm("jax-pools", "jax-mlp", "S-platform", "S-platform-shim", 40.4, 10 * GB),
    arm("near-limit", "torch-gpt-maxbatch", "C", "maxbatch-C-default", 900.0, None,
        max_batch=7, cap="16GiB", tried={"7": True, "8": False}),
]
with open(os.path.join(work, "results.jsonl"), "w") as f:
    for r in results:
        f.write(json.dumps(r) + "\n")
with open(os.path.join(work, "steps.tsv"), "w") as f:
    f.write("torch-abc\tresnet-A-native\t0\t3.0\n")

p = subprocess.run([sys.executable, summarize, work], capture_output=True, text=True)
out = p.stdout
check(p.returncode == 0, f"summarize exits {p.returncode}: {p.stderr[-400:]}")
for title in ("== torch-abc: torch-resnet", "== torch-abc: torch-gpt",
              "== torch-growth: torch-gpt", "== jax-pools: jax-mlp", "== near-limit",
              "== issue 53's GPU goals"):
    check(title in out, f"no section {title!r}")
# Each model against its own arm A: GPT-2's A is the base of its table.
gpt = out.split("== torch-abc: torch-gpt")[-1].split("==")[0]
check(any(line.startswith("gpt-A-native") and " 1.000 " in line for line in gpt.splitlines()),
      "GPT-2's arm A is not its table's base")
for line in ("torch-resnet: B/A step time 1.005 (goal <= 1.01: met)",
             "torch-resnet: C/A step time 1.040 (goal <= 1.03: missed)",
             "torch-gpt: B/A step time 1.015 (goal <= 1.01: missed)",
             "torch-gpt: C/A step time 1.010 (goal <= 1.03: met)",
             "growing pool: NVML peak 16.76G against expandable_segments' 16.17G: 1.037 "
             "(goal <= 1.05: met)",
             "maxbatch-C-default: largest batch 7 under 16GiB"):
    check(line in out, f"missing: {line}")
check("rehearsal" not in out, "NVML figures present: not a rehearsal")

# A rehearsal's results carry no NVML figure: the goals' lines say they
# measure nothing.
for r in results:
    r["nvml_peak_bytes"] = None
with open(os.path.join(work, "results.jsonl"), "w") as f:
    for r in results:
        f.write(json.dumps(r) + "\n")
out = subprocess.run([sys.executable, summarize, work], capture_output=True, text=True).stdout
check("measure no GPU" in out, "a rehearsal's goals are not marked as such")
check("growing pool" not in out, "a growing verdict without NVML figures")
sys.exit(check.finish())
