#!/usr/bin/env python3
"""bfcshim replay and tracegen, end to end through the command line.

usage: test_replay.py PATH/TO/bfcshim [BUNDLED_TRACES_DIR]
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

BFCSHIM = os.path.abspath(sys.argv[1])
BUNDLED = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else None
MiB = 1 << 20
HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)


def run(*args, ok=True):
    p = subprocess.run([BFCSHIM, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr, file=sys.stderr)
    return p


def write_trace(d, name, rows, header=True, compress=False):
    path = os.path.join(d, name)
    text = (HEADER if header else "") + "".join(rows)
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)
    return path


def row(action, ptr, size, us=[0]):
    us[0] += 7
    t = us[0]
    return f"1,00:00:{t // 1000000:02d}:{t % 1000000:06d},{action},{ptr},{size},0\n"


def replay_json(*args):
    p = run("replay", "--json", "--repeat", "1", *args)
    check(p.returncode == 0, f"replay {args} exits 0 (got {p.returncode}: {p.stderr})")
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    return [json.loads(l) for l in lines], p


def test_min_pool_and_placement(d):
    # A and B take 1 MiB each; A goes; C needs 2 MiB. Age placement puts B
    # against the pool's end, so A's hole joins the free middle and C fits in
    # 3 MiB; low placement leaves A's hole apart from the tail: 4 MiB.
    t = write_trace(d, "abc.csv", [
        row("allocate", "0x1000000", MiB), row("allocate", "0x2000000", MiB),
        row("free", "0x1000000", MiB), row("allocate", "0x3000000", 2 * MiB)])
    (r,), _ = replay_json(t)
    check(r["peak_live_bytes"] == 3 * MiB, f"peak_live_bytes {r['peak_live_bytes']}")
    check(r["min_pool_bytes"] == 3 * MiB, f"age min_pool_bytes {r['min_pool_bytes']}")
    check(abs(r["efficiency"] - 1.0) < 1e-9, f"efficiency {r['efficiency']}")
    check(r["failures"] == 0 and r["events"] == 4 and r["allocs"] == 3, f"counts {r}")
    (r,), _ = replay_json("--placement", "low", t)
    check(r["min_pool_bytes"] == 4 * MiB, f"low min_pool_bytes {r['min_pool_bytes']}")
    check(abs(r["efficiency"] - 0.75) < 1e-9, f"low efficiency {r['efficiency']}")
    # TSL's split rule gives a whole chunk away when it is under twice the
    # request: with nothing ever freed, the last allocations need room well
    # beyond the bytes requested. The bisection must still find a size.
    t2 = write_trace(d, "nofree.csv", [row("allocate", hex(0x1000000 * (i + 1)), (5 + i) * MiB)
                                       for i in range(6)])
    (r2,), _ = replay_json("--tsl", t2)
    check(r2["min_pool_bytes"] is not None and r2["min_pool_bytes"] >= r2["peak_live_bytes"],
          f"TSL policy on a trace without frees: {r2['min_pool_bytes']}")
    # Timed at a pool too small: failures are counted, frees of them skipped.
    (r,), _ = replay_json("--pool-size", "2MiB", t)
    check(r["failures"] == 1, f"failures at 2 MiB: {r['failures']}")
    check(r["pool_bytes"] == 2 * MiB, f"pool_bytes {r['pool_bytes']}")


def serves(trace, pool_bytes, *args):
    (r,), _ = replay_json("--pool-size", str(pool_bytes), "--no-min-pool", *args, trace)
    return r["failures"] == 0


def test_min_pool_above(d):
    """min_pool_bytes promises that larger pools serve the trace too. Success
    is not monotone in the pool's size (a block placed elsewhere moves every
    later hole): on this recorded trace, bisection alone at 4 KiB steps
    stopped under sizes that fail."""
    if not BUNDLED:
        return
    t = os.path.join(BUNDLED, "h100-cupy-mix-nopool.csv.gz")
    unit = 4096
    (r,), _ = replay_json("--pool-unit", str(unit), t)
    m = r["min_pool_bytes"]
    check(m % unit == 0, f"min_pool_bytes {m} is a multiple of the unit")
    check(not serves(t, m - unit), f"one unit below min_pool_bytes ({m - unit}) fails")
    failing = [m + k * unit for k in range(1, 2 * MiB // unit + 1) if not serves(t, m + k * unit)]
    check(not failing, f"every pool up to 2 MiB above {m} serves: {failing[:4]} fail")
    # Farther up, bands of failure are megabytes wide: on the ResNet
    # recording, pools 7 to 14 MiB above the bisected size failed.
    t = os.path.join(BUNDLED, "h100-torch-resnet50-b64-nocache.csv.gz")
    (r,), _ = replay_json(t)
    m = r["min_pool_bytes"]
    failing = [m + k * MiB for k in range(1, m // 128 // MiB + 1) if not serves(t, m + k * MiB)]
    check(not failing, f"every MiB up to 1/128 above {m} serves: {failing[:4]} fail")


def test_json_contract(d):
    t = write_trace(d, "one.csv", [row("allocate", "0x7f0000000000", 1000)])
    (r,), _ = replay_json(t)
    for key, kind in [("trace", str), ("events", int), ("allocs", int),
                      ("peak_live_bytes", int), ("min_pool_bytes", int),
                      ("efficiency", float), ("ns_per_op", (int, float)),
                      ("failures", int)]:
        check(key in r and isinstance(r[key], kind), f"JSON field {key} ({r.get(key)!r})")
    # A multiple of the pool unit (64 KiB by default: the sizes the shim's
    # regions come in), not of 1 MiB; --pool-unit 256 searches to the granule.
    check(r["min_pool_bytes"] == 65536 and r.get("pool_unit") == 65536,
          f"a 1000-byte trace needs one 64 KiB unit: {r['min_pool_bytes']}, {r.get('pool_unit')}")
    (r,), _ = replay_json("--pool-unit", "256", t)
    check(r["min_pool_bytes"] == 1024, f"a 1000-byte trace needs 1024 bytes: {r['min_pool_bytes']}")
    check(abs(r["fragmentation_gmlake"] - (1 - r["efficiency"])) < 1e-5,
          f"fragmentation_gmlake {r.get('fragmentation_gmlake')}")
    # One object per trace, one per line.
    rs, _ = replay_json(t, t)
    check(len(rs) == 2, "two traces, two JSON lines")


def test_unmatched_and_failed_lines(d):
    t = write_trace(d, "odd.csv", [
        row("free", "0xdead00", 512),                      # never allocated
        row("allocate", "0x100000", 4096),
        row("allocate failure", "(nil)", 1 << 40),
        row("allocate", "0x100000", 8192),                 # lost free: leak
        row("free", "0x100000", 8192),
        row("allocate", "0x200000", 0),                    # zero size (platform mode
        row("free", "0x200000", 0)])                       # records what a driver gave)
    (r,), p = replay_json(t)
    check(r["unmatched_frees"] == 1, f"unmatched_frees {r['unmatched_frees']}")
    check(r["trace_failed_allocs"] == 1, f"trace_failed_allocs {r['trace_failed_allocs']}")
    check(r["leaked_reuses"] == 1, f"leaked_reuses {r['leaked_reuses']}")
    check(r["allocs"] == 2 and r["frees"] == 1, f"allocs/frees {r['allocs']}/{r['frees']}")
    check(r["peak_live_bytes"] == 4096 + 8192, f"peak {r['peak_live_bytes']}")
    check("1 frees of pointers not live" in p.stderr, f"stderr names skipped frees: {p.stderr}")


def test_malformed_lines_name_their_line(d):
    cases = [
        ("fields.csv", "1,00:00:00:000001,allocate,0x1000\n", "expected 6"),
        ("time.csv", "1,00:00:0x:000001,allocate,0x1000,256,0\n", "Time"),
        ("action.csv", "1,00:00:00:000001,alloc,0x1000,256,0\n", "Action 'alloc'"),
        ("size.csv", "1,00:00:00:000001,allocate,0x1000,-5,0\n", "Size '-5'"),
        ("ptr.csv", "1,00:00:00:000001,allocate,0xzz,256,0\n", "Pointer"),
        ("huge.csv", "1,00:00:00:000001,allocate,0x1000,99999999999999999999,0\n", "Size"),
        ("header.csv", "Thread,Time,Action,Pointer,Bytes,Stream\n", "header"),
    ]
    for name, bad, needle in cases:
        text = row("allocate", "0x500000", 256) + row("free", "0x500000", 256) + bad
        t = write_trace(d, name, [text], header=not name.startswith("header"))
        p = run("replay", "--repeat", "1", t, ok=False)
        line = 4 if not name.startswith("header") else 3
        check(p.returncode != 0, f"{name}: malformed trace fails")
        check(f"{t}:{line}:" in p.stderr and needle in p.stderr,
              f"{name}: error names line {line} and '{needle}': {p.stderr.strip()}")
    # A bad trace does not stop the good ones after it.
    good = write_trace(d, "good.csv", [row("allocate", "0x1000", 512)])
    p = run("replay", "--json", "--repeat", "1", os.path.join(d, "time.csv"), good, ok=False)
    check(p.returncode != 0 and len(p.stdout.splitlines()) == 1, "good trace still reported")


def test_gzip_and_crlf(d):
    rows = [row("allocate", "0x1000000", 3 * MiB).replace("\n", "\r\n"),
            row("free", "0x1000000", 3 * MiB).replace("\n", "\r\n")]
    t = write_trace(d, "t.csv.gz", rows, compress=True)
    (r,), _ = replay_json(t)
    check(r["events"] == 2 and r["min_pool_bytes"] == 3 * MiB, f"gzip trace: {r}")


def test_inputs_refused(d):
    # Nothing to replay is not a row of zeros: the file is named, the exit
    # is not 0.
    for name, text in [("empty.csv", ""), ("header.csv", HEADER)]:
        t = os.path.join(d, name)
        with open(t, "w") as f:
            f.write(text)
        for cmd in ["replay", "plan"]:
            p = run(cmd, t, ok=False)
            check(p.returncode == 1 and p.stdout == "" and
                  f"{t}: no allocations" in p.stderr and len(p.stderr.splitlines()) == 1,
                  f"{cmd} {name} refused: {p.returncode} {p.stdout!r} {p.stderr!r}")
    # A gzip file cut short is named as such, not by the half line it ends on.
    text = HEADER + "".join(row("allocate", hex(0x100000 * (i + 1)), 4096) for i in range(3000))
    whole = gzip.compress(text.encode())
    cut = os.path.join(d, "cut.csv.gz")
    with open(cut, "wb") as f:
        f.write(whole[:len(whole) // 2])
    p = run("replay", cut, ok=False)
    check(p.returncode == 1 and f"{cut}: truncated or corrupt gzip file" in p.stderr,
          f"truncated gzip: {p.stderr.strip()}")


def test_bad_options(d):
    t = write_trace(d, "x.csv", [row("allocate", "0x1000", 512)])
    for args, needle in [(["--pool-size", "lots"], "--pool-size 'lots'"),
                         (["--repeat", "0"], "--repeat '0'"),
                         (["--granularity", "300"], "--granularity '300'"),
                         (["--pool-unit", "96KiB"], "--pool-unit '96KiB'"),
                         (["--granularity", "4096", "--pool-unit", "1024"], "at least the granularity"),
                         (["--placement", "middle"], "--placement 'middle'"),
                         (["--growth-headroom", "1001"], "--growth-headroom '1001'"),
                         # (fuzz_units) a sign after a blank, and a number
                         # past 2^64 - 1, were both read as 2^64 - 1
                         (["--warmup-events", " -1"], "--warmup-events ' -1'"),
                         (["--gpu-lag", "99999999999999999999999"],
                          "--gpu-lag '99999999999999999999999'"),
                         (["--fence-interval", "+5"], "--fence-interval '+5'"),
                         (["--pool-size", "1GiB", "--min-pool"], "exclude"),
                         (["--no-min-pool"], "needs --pool-size")]:
        p = run("replay", *args, t, ok=False)
        check(p.returncode == 2 and needle in p.stderr, f"{args}: {p.stderr.strip()}")
    p = run("replay", os.path.join(d, "missing.csv"), ok=False)
    check(p.returncode == 1 and "missing.csv" in p.stderr, f"missing file: {p.stderr}")
    # No trace: one line that says so, not the help's first screen.
    for cmd in ["replay", "report"]:
        p = run(cmd, ok=False)
        check(p.returncode == 2 and p.stderr.startswith(f"bfcshim {cmd}: no trace given") and
              len(p.stderr.splitlines()) == 1, f"{cmd} without a trace: {p.stderr!r}")
    # outputs that cannot be files: said before the replay, in one line
    os.makedirs(os.path.join(d, "outdir"), exist_ok=True)
    for opt, out, words in (("--dump-at-failure", os.path.join(d, "outdir"), "is a folder"),
                            ("--record", os.path.join(d, "outdir") + "/", "is a folder"),
                            ("--record", os.path.join(d, "nodir", "r.csv"), "does not exist")):
        p = run("replay", opt, out, t, ok=False)
        check(p.returncode == 2 and words in p.stderr and len(p.stderr.splitlines()) == 1,
              f"replay {opt} {out}: {p.returncode} {p.stderr!r}")
    p = run("frobnicate", ok=False)
    check(p.returncode == 2 and "unknown command" in p.stderr, "unknown command")
    # The demo is the Python package's: the C command lists it and says where it is.
    p = run("--help")
    check("\n  demo " in p.stdout, f"the help lists demo: {p.stdout}")
    p = run("demo", ok=False)
    check(p.returncode == 2 and "scripts/demo.sh" in p.stderr and "pip install" in p.stderr,
          f"demo from a build tree: {p.stderr!r}")


def test_tracegen(d):
    os.chdir(d)
    p = run("tracegen", "--model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "2",
            "--seq", "128", "--batch", "2", "--vocab", "512", "--steps", "2", "--vary-seq")
    check(p.returncode == 0, "tracegen gpt")
    name = p.stdout.split(":")[0]
    check(name.startswith("synthetic-gpt-") and os.path.exists(name), f"named {name}")
    first = open(name).read()
    run("tracegen", "--model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "2",
        "--seq", "128", "--batch", "2", "--vocab", "512", "--steps", "2", "--vary-seq")
    check(open(name).read() == first, "same seed, same trace")
    run("tracegen", "--model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "2",
        "--seq", "128", "--batch", "2", "--vocab", "512", "--steps", "2", "--vary-seq",
        "--seed", "2", "-o", "other.csv")
    check(open("other.csv").read() != first, "another seed, another trace")
    (r,), _ = replay_json(name)
    check(r["unmatched_frees"] == 0 and r["leaked_reuses"] == 0, "generated traces are closed")
    for model, extra in [("resnet", ["--blocks", "1", "--batch", "4", "--image", "64"]),
                         ("churn", ["--live", "100", "--ops", "1000"])]:
        p = run("tracegen", "--model", model, "--steps", "2", *extra, "-o", f"{model}.csv")
        check(p.returncode == 0 and os.path.getsize(f"{model}.csv") > 100, f"tracegen {model}")
        (r,), _ = replay_json(f"{model}.csv")
        check(r["events"] > 0, f"{model} replays")
    # A .gz name gets gzip (it used to get plain text under a .gz name).
    run("tracegen", "--model", "churn", "--live", "50", "--ops", "500", "-o", "churn.csv.gz")
    check(open("churn.csv.gz", "rb").read(2) == b"\x1f\x8b", "tracegen -o x.gz writes gzip")
    (r,), _ = replay_json("churn.csv.gz")
    check(r["events"] > 400, "and replay reads it back")
    p = run("tracegen", "-o", os.path.join(d, "no-such-dir", "x.csv"), ok=False)
    check(p.returncode == 1 and p.stderr.startswith("bfcshim tracegen: "),
          f"an unwritable output is named with the command's prefix: {p.stderr}")
    p = run("tracegen", "--model", "transformerXL", ok=False)
    check(p.returncode == 2 and "--model 'transformerXL'" in p.stderr, "bad model named")
    p = run("tracegen", "--layers", "zero", ok=False)
    check(p.returncode == 2 and "--layers 'zero'" in p.stderr, "bad number named")


def test_dump_at_failure(d):
    t = write_trace(d, "frag.csv", [
        row("allocate", "0x1000000", MiB), row("allocate", "0x2000000", MiB),
        row("free", "0x1000000", MiB), row("allocate", "0x3000000", 2 * MiB)])
    out = os.path.join(d, "dump.txt")
    replay_json("--dump-at-failure", out, t)
    text = open(out).read()
    check("fails in a pool of" in text and "Region 0 |" in text and "LargestFreeBlock" in text,
          f"dump at failure: {text[:300]}")
    # With --vmm the pool preallocated over virtual memory follows, one 2 MiB
    # granule below its smallest limit (4 MiB: the 2 MiB block cannot join
    # the granule the live 1 MiB block pins).
    out_vmm = os.path.join(d, "dump-vmm.txt")
    replay_json("--vmm", "--dump-at-failure", out_vmm, t)
    text = open(out_vmm).read()
    check("fails in a pool of" in text and
          "event 3: allocation of 2097152 bytes fails in a pool preallocated over virtual "
          "memory of 2097152" in text, f"dump at failure over virtual memory: {text[-600:]}")


def test_record(d):
    """--record: pairs of plain and recording replays; the recording holds
    every event of the recording replays, in order, and replays again."""
    os.chdir(d)
    run("tracegen", "--model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "2",
        "--seq", "128", "--batch", "2", "--vocab", "512", "--steps", "2", "-o", "rec-src.csv")
    (r,), _ = replay_json("--record", "rec-out.csv", "--repeat", "3", "rec-src.csv")
    check(r["plain_ns_per_op"] > 0 and r["ns_per_op"] > 0, f"both arms timed: {r}")
    check(abs(r["recording_cost"]) < 100, f"recording_cost is a ratio: {r['recording_cost']}")

    def actions(path):
        with open(path) as f:
            rows = [l.rstrip("\n").split(",") for l in f][1:]
        return [(a, int(size) if a == "allocate" else 0) for _, _, a, _, size, _ in rows], rows
    want, _ = actions("rec-src.csv")
    got, rows = actions("rec-out.csv")
    check(got == want * 3, f"recorded {len(got)} events, the 3 recording replays made {3 * len(want)}")
    check(all(int(t) > 0 and s == "0" for t, _, _, _, _, s in rows), "thread ids and stream 0")
    (again,), _ = replay_json("rec-out.csv")
    # (the trace leaves its weights live, so later repeats reuse their addresses)
    check(again["allocs"] == 3 * r["allocs"] and again["frees"] == 3 * r["frees"]
          and again["unmatched_frees"] == 0, f"the recording replays: {again}")
    p = run("replay", "--record", "rec-out2.csv", "--repeat", "1", "rec-src.csv")
    check(p.returncode == 0 and "recording:" in p.stdout and "plain" in p.stdout,
          f"the table says what recording cost: {p.stdout}")


def test_vmm(d):
    # Four 2 MiB blocks; the first and third go; a 4 MiB block comes. Peak
    # live is 8 MiB. Over virtual memory the two freed granules are unmapped
    # and the block mapped past them: 8 MiB is enough. One preallocated
    # region cannot do that (its holes are 2 MiB each).
    rows = [row("allocate", hex(0x1000000 * (i + 1)), 2 * MiB) for i in range(4)]
    rows += [row("free", "0x1000000", 2 * MiB), row("free", "0x3000000", 2 * MiB),
             row("allocate", "0x9000000", 4 * MiB)]
    t = write_trace(d, "vmm.csv", rows)
    (r,), _ = replay_json("--vmm", "--placement", "low", t)
    v = r.get("vmm", {})
    check(r["peak_live_bytes"] == 8 * MiB, f"peak live {r['peak_live_bytes']}")
    check(v.get("min_limit_bytes") == 8 * MiB, f"vmm min limit {v.get('min_limit_bytes')}")
    check(r["min_pool_bytes"] > 8 * MiB, f"one region needs more: {r['min_pool_bytes']}")
    check(v.get("min_limit_unmap_calls", 0) >= 1, f"the tight run unmapped: {v}")
    check(v.get("failures") == 0 and v.get("regions_failures") == 0, "roomy runs serve all")
    check(v.get("release_threshold", 1) is None, "default threshold: never (null)")
    # With room to spare the growing pool may map 3.5% past the most it
    # needed (8 MiB: 10 MiB in whole granules); the 4 MiB block would take
    # it to 12, so one freed granule moves behind it instead.
    check(v.get("growth_headroom") == 35, f"default growth headroom {v.get('growth_headroom')}")
    check(v.get("peak_mapped_bytes") == 10 * MiB and v.get("unmap_calls") == 1 and
          v.get("growth_moves") == 1,
          f"roomy run: {v.get('peak_mapped_bytes')} mapped, {v.get('unmap_calls')} unmaps, "
          f"{v.get('growth_moves')} moves")
    # Without the headroom nothing goes back: the freed granules stay
    # mapped and the block maps two more.
    (r0,), _ = replay_json("--vmm", "--placement", "low", "--growth-headroom", "0", t)
    v0 = r0.get("vmm", {})
    check(v0.get("peak_mapped_bytes") == 12 * MiB and v0.get("unmap_calls") == 0 and
          v0.get("growth_moves") == 0,
          f"headroom 0: {v0.get('peak_mapped_bytes')} mapped, {v0.get('unmap_calls')} unmaps")
    for key in ["curve_event", "curve_mapped", "curve_regions", "curve_live"]:
        check(len(v.get(key, [])) == 7, f"{key} has a point per event of a short trace")
    check(max(v.get("curve_mapped", [0])) <= v.get("peak_mapped_bytes", 0), "curve under peak")
    # The preallocated pool at five limits: its smallest, 1% above, one
    # region's smallest pool and 2% and 5% above that, in whole granules.
    gran = 2 * MiB
    up = lambda b: -(-b // gran) * gran
    one = r["min_pool_bytes"]
    want = [8 * MiB, up(8 * MiB + 8 * MiB // 100), up(one), up(one + one // 50), up(one + one // 20)]
    check(v.get("prealloc_limit") == want, f"preallocated limits {v.get('prealloc_limit')}, want {want}")
    for key in ["prealloc_failures", "prealloc_map_calls", "prealloc_unmap_calls",
                "prealloc_unmapped_bytes", "prealloc_created_bytes", "prealloc_mapped_refits"]:
        check(len(v.get(key, [])) == 5, f"{key} has five points")
    check(v.get("prealloc_failures") == [0] * 5, f"every limit serves: {v.get('prealloc_failures')}")
    check(v.get("prealloc_unmapped_bytes", [0])[0] >= 2 * MiB and
          v.get("prealloc_unmapped_bytes", [1] * 5)[4] == 0,
          f"remaps at the smallest limit, none 5% above one region's: {v.get('prealloc_unmapped_bytes')}")
    # Threshold 0: frees give granules back at once, so the roomy run's peak
    # is the tight limit.
    (r,), _ = replay_json("--vmm", "--placement", "low", "--release-threshold", "0", t)
    v = r.get("vmm", {})
    check(v.get("peak_mapped_bytes") == 8 * MiB and v.get("release_threshold") == 0,
          f"threshold 0: peak mapped {v.get('peak_mapped_bytes')}")
    # 4 KiB granules: a 1000-byte trace needs one granule.
    t1 = write_trace(d, "one-vmm.csv", [row("allocate", "0x7f0000000000", 1000)])
    (r,), _ = replay_json("--vmm", "--map-granularity", "4KiB", t1)
    check(r.get("vmm", {}).get("min_limit_bytes") == 4096, f"4 KiB granule: {r.get('vmm')}")
    for bad in [["--map-granularity", "3000"], ["--map-granularity", "256"],
                ["--release-threshold", "lots"]]:
        p = run("replay", *bad, t, ok=False)
        check(p.returncode == 2 and bad[0] in p.stderr, f"replay {bad} refused: {p.stderr}")


def block_after_block(n):
    """n blocks of 2 MiB, each freed before the next comes."""
    rows = []
    for i in range(n):
        rows += [row("allocate", hex(0x1000000 * (i + 1)), 2 * MiB),
                 row("free", hex(0x1000000 * (i + 1)), 2 * MiB)]
    return rows


def test_gpu_lag(d):
    # A block is freed and another of its size comes, three times. With
    # immediate frees one granule serves all. With the GPU ten events behind,
    # every free is still pending when the next block comes: both pools wait
    # for it rather than map (or grow) more, so the peak stays one granule.
    t = write_trace(d, "lag.csv", block_after_block(3))
    (r,), _ = replay_json("--vmm", "--gpu-lag", "10", t)
    v = r.get("vmm", {})
    check(v.get("gpu_lag_events") == 10, f"gpu_lag_events: {v.get('gpu_lag_events')}")
    check(v.get("peak_mapped_bytes") == 2 * MiB and v.get("fence_waits") == 2,
          f"lagging vmm pool: {v.get('peak_mapped_bytes')} mapped, {v.get('fence_waits')} waits")
    check(v.get("regions_peak_bytes") == 2 * MiB and v.get("regions_fence_waits") == 2,
          f"lagging regions: {v.get('regions_peak_bytes')} held, "
          f"{v.get('regions_fence_waits')} waits")
    (r,), _ = replay_json("--vmm", t)
    v = r.get("vmm", {})
    check(v.get("gpu_lag_events") == 0 and v.get("fence_waits") == 0,
          f"no lag, no waits: {v}")
    for bad, needle in [(["--gpu-lag", "10"], "needs --vmm"),
                        (["--vmm", "--gpu-lag", "-1"], "--gpu-lag '-1'"),
                        (["--vmm", "--gpu-lag", "soon"], "--gpu-lag 'soon'")]:
        p = run("replay", *bad, t, ok=False)
        check(p.returncode == 2 and needle in p.stderr, f"replay {bad} refused: {p.stderr}")


def test_fence_lag(d):
    # The trace of test_gpu_lag, its frees deferred as the shim's plain
    # frees are. In a pool of one block each allocation after a free must
    # fence it and wait: two fences, two waits, and one block still serves.
    # In a roomy pool the interval decides: every allocation after a free
    # fences (interval 1), or none does within four allocations (interval 4,
    # no byte trigger), or the byte trigger fences each 2 MiB free anyway.
    t = write_trace(d, "fence-lag.csv", block_after_block(3))
    (r,), _ = replay_json("--fence-lag", "10", t)
    f = r.get("fences", {})
    check(r["min_pool_bytes"] == 2 * MiB, f"one block serves: {r['min_pool_bytes']}")
    check(f.get("gpu_lag_events") == 10 and f.get("interval") == 1 and f.get("bytes") == 64 * MiB,
          f"the shim's defaults: {f}")
    check(f.get("seals") == 2 and f.get("fence_waits") == 2 and f.get("allocs") == 3,
          f"tight pool: {f}")
    for extra, seals in [([], 2), (["--fence-interval", "4", "--fence-bytes", "0"], 0),
                         (["--fence-interval", "4", "--fence-bytes", "1MiB"], 2)]:
        (r,), _ = replay_json("--fence-lag", "10", "--pool-size", "64MiB", *extra, t)
        f = r.get("fences", {})
        check(f.get("seals") == seals and f.get("fence_waits") == 0,
              f"roomy pool {extra}: {seals} fences, no wait: {f}")
    (r,), _ = replay_json(t)
    check("fences" not in r, "no fences without --fence-lag")
    for bad, needle in [(["--fence-interval", "16"], "need --fence-lag"),
                        (["--fence-bytes", "0"], "need --fence-lag"),
                        (["--fence-lag", "0"], "--fence-lag '0'"),
                        (["--fence-lag", "10", "--fence-interval", "0"], "--fence-interval '0'"),
                        (["--fence-lag", "10", "--fence-interval", "5000"], "1 to 4096"),
                        (["--fence-lag", "10", "--fence-bytes", "lots"], "--fence-bytes 'lots'"),
                        (["--fence-lag", "10", "--vmm"], "without --vmm")]:
        p = run("replay", *bad, t, ok=False)
        check(p.returncode == 2 and needle in p.stderr, f"replay {bad} refused: {p.stderr}")


def test_sizes_no_device_has(d):
    """Sizes that round onto 2^48 (at the replay's 256 B and at 512 B) once
    passed the engine's size check and indexed one past its last size
    class: replay and report died (SIGSEGV). Now they fail as out of
    memory, counted like any failure, and the rest of the trace replays."""
    t = write_trace(d, "huge.csv", [
        row("allocate", "0x1000000", MiB), row("allocate", "0x2000000", (1 << 48) - 100),
        row("allocate", "0x3000000", 1 << 48), row("free", "0x2000000", 0),
        row("free", "0x3000000", 0), row("allocate", "0x4000000", 2 * MiB),
        row("free", "0x1000000", 0), row("free", "0x4000000", 0)])
    # No pool serves the trace, so the timed one is a stand-in (which may
    # fail more); in a pool of 64 MiB the huge sizes are the only failures.
    for args in [[], ["--granularity", "512"], ["--pool-size", "64MiB"],
                 ["--pool-size", "64MiB", "--granularity", "512"]]:
        p = run("replay", "--json", "--repeat", "1", *args, t, ok=False)
        check(p.returncode == 0, f"replay {args} of huge sizes exits 0 (got {p.returncode})")
        if p.returncode == 0:
            r = json.loads(p.stdout)
            check(r["min_pool_bytes"] is None and r["allocs"] == 4, f"replay {args}: {r}")
            check(r["failures"] == 2 if "--pool-size" in args else r["failures"] >= 2,
                  f"replay {args}: the two huge sizes are failures: {r}")
    out = os.path.join(d, "huge.html")
    p = run("report", "-o", out, t, ok=False)
    check(p.returncode == 0 and os.path.getsize(out) > 0,
          f"report of huge sizes exits 0 (got {p.returncode}: {p.stderr})")


def test_live_bytes_past_2_64(d):
    """Live bytes past 2^64 - 1 wrapped: replay and plan printed a peak of
    3 * 2^62 ("12288 PiB") for 5 * 2^62 live, plan "efficiency 1.0000".
    Now every command refuses the trace, naming the line that passes it.
    Up to 2^64 - 1 live is a trace like any other: its figures saturate,
    never wrap (plan's packing of a 2^64 - 1 byte block, rounded, once
    wrapped to 1 MiB, "efficiency 17592186044416")."""
    q = 1 << 62
    t = write_trace(d, "past64.csv", [row("allocate", hex((i + 1) << 50), q) for i in range(5)])
    for cmd in [["replay", "--repeat", "1"], ["replay", "--json", "--repeat", "1"],
                ["replay", "--vmm", "--repeat", "1"], ["plan"], ["plan", "--json"],
                ["report", "-o", os.path.join(d, "past64.html")]]:
        p = run(*cmd, t, ok=False)
        check(p.returncode == 1 and f"{t}:5:" in p.stderr and "past 2^64 - 1" in p.stderr
              and "PiB" not in p.stdout,
              f"{cmd}: refused at line 5 ({p.returncode}): {p.stdout} {p.stderr}")
    most = (1 << 64) - 1
    t = write_trace(d, "max64.csv", [row("allocate", "0x1000", MiB), row("free", "0x1000", 0),
                                     row("allocate", "0x2000", most)])
    (r,), _ = replay_json(t)
    check(r["peak_live_bytes"] == most and r["failures"] == 1 and r["min_pool_bytes"] is None,
          f"replay of 2^64 - 1 live: {r}")
    p = run("plan", "--json", t)
    check(p.returncode == 0, f"plan of 2^64 - 1 live exits 0: {p.stderr}")
    if p.returncode == 0:
        r = json.loads(p.stdout)
        check(r["peak_live_bytes"] == most and r["offline_pool_bytes"] == most
              and r["offline_efficiency"] == 1.0, f"plan of 2^64 - 1 live saturates: {r}")


def test_plan(d):
    # The trace of test_min_pool_and_placement: low placement needs 4 MiB,
    # the offline packing 3 MiB. A plan of it brings low placement to 3 MiB,
    # every allocation where the plan said.
    t = write_trace(d, "abc-plan.csv", [
        row("allocate", "0x1000000", MiB), row("allocate", "0x2000000", MiB),
        row("free", "0x1000000", MiB), row("allocate", "0x3000000", 2 * MiB)])
    plan = os.path.join(d, "abc.plan")
    p = run("plan", "--json", "-o", plan, t)
    check(p.returncode == 0, f"plan exits 0: {p.stderr}")
    r = json.loads(p.stdout)
    check(r["offline_pool_bytes"] == 3 * MiB and r["allocations"] == 3,
          f"plan figures {r}")
    lines = open(plan).read().splitlines()
    # Packed at the pool's default alignment (BFCSHIM_ALIGNMENT, 512), so
    # that the shim with default settings uses the plan.
    check(lines[:4] == ["bfcshim-plan 1", "granularity 512", f"pool_bytes {3 * MiB}",
                        "entries 3"], f"plan header {lines[:4]}")
    # The replay takes the plan's granularity when not told one.
    (r,), _ = replay_json("--placement", "low", "--plan", plan, t)
    check(r["policy"]["granularity"] == 512, f"replay --plan policy {r['policy']}")
    check(r["min_pool_bytes"] == 3 * MiB, f"low with the plan: {r['min_pool_bytes']}")
    check(r["plan"]["planned"] == 3 and r["plan"]["misses"] == 0, f"plan counts {r['plan']}")
    # Bad plans are refused with a reason, before any replay.
    bad = os.path.join(d, "bad.plan")
    for text, why in [("not a plan\n", "not a bfcshim plan"),
                      ("bfcshim-plan 1\ngranularity 256\npool_bytes 1\nentries 2\n256 0\n",
                       "announced"),
                      ("bfcshim-plan 1\ngranularity 256\npool_bytes 1\nentries 1\n256 x\n",
                       ":5: expected 'size offset'"),
                      # A later format is not this one; a sign is no size
                      # (strtoull took -1 for 2^64 - 1); a line longer than
                      # the reader's buffer was read as two, the second
                      # blamed under the wrong number; an entry count the
                      # file cannot hold is refused before any memory.
                      ("bfcshim-plan 12\ngranularity 256\npool_bytes 1\nentries 0\n",
                       "not a bfcshim plan"),
                      ("bfcshim-plan 1\ngranularity 256\npool_bytes 1\nentries -1\n",
                       ":4: expected 'entries N'"),
                      ("bfcshim-plan 1\ngranularity 256\npool_bytes 1\nentries 1\n-256 0\n",
                       ":5: expected 'size offset'"),
                      ("bfcshim-plan 1\ngranularity 256\npool_bytes 1\nentries 1\n256 " +
                       "0" * 300 + "\n", ":5: a line longer than"),
                      ("bfcshim-plan 1\ngranularity 256\npool_bytes 1\nentries 99999999999\n",
                       "more entries than the file can hold"),
                      # A granularity no pool can have (fuzz_plan_file): 0
                      # divided the replay's --pool-size by zero (SIGFPE).
                      ("bfcshim-plan 1\ngranularity 0\npool_bytes 0\nentries 1\n512 0\n",
                       ":2: granularity 0: not a power of two"),
                      ("bfcshim-plan 1\ngranularity 25\npool_bytes 0\nentries 0\n",
                       ":2: granularity 25: not a power of two"),
                      ("bfcshim-plan 1\ngranularity 2097152\npool_bytes 0\nentries 0\n",
                       ":2: granularity 2097152: not a power of two")]:
        with open(bad, "w") as f:
            f.write(text)
        for size in [[], ["--pool-size", "1GiB"]]:
            p = run("replay", *size, "--plan", bad, t, ok=False)
            check(p.returncode == 2 and why in p.stderr,
                  f"bad plan ({why}) {size}: {p.returncode} {p.stderr}")
    # A plan whose lines end in CRLF (edited elsewhere) is the same plan.
    with open(bad, "w", newline="") as f:
        f.write(open(plan).read().replace("\n", "\r\n"))
    (r,), _ = replay_json("--placement", "low", "--plan", bad, t)
    check(r["plan"]["planned"] == 3, f"a CRLF plan: {r['plan']}")
    # (audit of 2aac5ac) Its blank lines too: skipped in LF, a blank CRLF
    # line ("\r\n") was read as a header line and the plan refused.
    with open(bad, "w", newline="") as f:
        f.write(open(plan).read().replace("\n", "\n\n", 1).replace("\n", "\r\n"))
    (r,), _ = replay_json("--placement", "low", "--plan", bad, t)
    check(r["plan"]["planned"] == 3, f"a CRLF plan with a blank line: {r['plan']}")
    p = run("replay", "--granularity", "256", "--plan", plan, t, ok=False)
    check(p.returncode == 2 and "granularity" in p.stderr, f"granularity mismatch: {p.stderr}")
    p = run("plan", "--granularity", "256", "-o", plan, t)
    (r,), _ = replay_json("--granularity", "256", "--placement", "low", "--plan", plan, t)
    check(r["plan"]["planned"] == 3, f"a plan at 256 B with --granularity 256: {r['plan']}")
    p = run("replay", "--vmm", "--plan", plan, t, ok=False)
    check(p.returncode == 2, "--plan with --vmm is refused")
    p = run("plan", os.path.join(d, "missing.csv"), ok=False)
    check(p.returncode == 1, "plan of a missing trace fails")


def test_plan_of_another_run(d):
    """Two recordings of one H100 GPT-2 job: PyTorch's memory history (arm
    A) and the shim's own trace (arm C), which has two cuBLAS workspaces
    (1 KiB and 32 MiB, twice) that A lacks. A's plan on C: the cursor keeps
    every other allocation on its entry and the four extras go above the
    plan, so C replays at its offline bound. Keyed by each size's
    occurrence count, the plan gave 0.914 here (every later block of those
    sizes on its successor's place, extras placed by the rule among them)."""
    if not BUNDLED:
        return
    a = os.path.join(BUNDLED, "h100-torch-gpt2small-b8-snapshot.tensors.csv.gz")
    c = os.path.join(BUNDLED, "h100-torch-gpt2small-b8-nocache.csv.gz")
    plan = os.path.join(d, "arm-a.plan")
    run("plan", "-o", plan, a)
    (r,), _ = replay_json("--plan", plan, c)
    check(r["efficiency"] >= 0.999, f"A's plan on C: efficiency {r['efficiency']}")
    p = r["plan"]
    check(p["planned"] == 7010 and p["misses"] == 0 and p["spare"] == 4 and not p["abandoned"],
          f"A's plan on C: {p}")
    # A plan of another job is abandoned before it does much harm.
    other = os.path.join(d, "resnet.plan")
    run("plan", "-o", other, os.path.join(BUNDLED, "h100-torch-resnet50-b64-nocache.csv.gz"))
    (r,), _ = replay_json("--plan", other, c)
    check(r["plan"]["abandoned"] and r["plan"]["planned"] < 50, f"ResNet's plan on GPT-2: {r['plan']}")


def test_bundled_traces(d):
    """The shipped traces. Synthetic ones: the efficiency bar
    (>= 0.97) holds on them, and the generator still writes them byte for
    byte (if it changes on purpose, regenerate them with the command in their
    README). Real ones, recorded on an H100: they replay cleanly and stay at
    or above 0.96, just under today's worst (0.967 on the GPT trace), so a
    placement change that loses on real training shows here."""
    if not BUNDLED:
        return
    every = sorted(os.path.join(BUNDLED, f) for f in os.listdir(BUNDLED) if f.endswith(".csv.gz"))
    traces = [t for t in every if os.path.basename(t).startswith("synthetic-")]
    real = [t for t in every if os.path.basename(t).startswith("h100-")]
    check(len(traces) >= 2 and len(real) >= 4, "bundled traces present")
    check(len(traces) + len(real) == len(every), "every bundled trace is synthetic- or h100-")
    rs, _ = replay_json(*traces)
    for r in rs:
        check(r["efficiency"] >= 0.97, f"{os.path.basename(r['trace'])}: efficiency {r['efficiency']}")
        check(r["failures"] == 0 and r["unmatched_frees"] == 0, f"{r['trace']} replays cleanly")
    # The table never cuts a name (a newcomer could not tell traces apart).
    table = run("replay", "--repeat", "1", "--pool-size", "64GiB", "--no-min-pool", *every).stdout
    for t in every:
        check(os.path.basename(t) in table, f"{os.path.basename(t)} whole in the table")
    rs, _ = replay_json("--vmm", *real)
    for r in rs:
        check(r["efficiency"] >= 0.96, f"{os.path.basename(r['trace'])}: efficiency {r['efficiency']}")
        check(r["failures"] == 0 and r["unmatched_frees"] == 0, f"{r['trace']} replays cleanly")
        # Over virtual memory every real trace of 1 GiB or more needs at most
        # peak live / 0.99 (issue 15's bar; 0.997-0.999 measured).
        check(len(r["vmm"]["curve_mapped"]) == 64, "64 points on a long trace")
        if r["peak_live_bytes"] >= 1 << 30:
            check(r["vmm"]["efficiency"] >= 0.99,
                  f"{os.path.basename(r['trace'])}: vmm efficiency {r['vmm']['efficiency']}")
    os.chdir(d)
    for path in traces:
        name = os.path.basename(path)[:-len(".gz")]
        # synthetic-<model>-...: regenerate from the options its name encodes.
        if name.startswith("synthetic-gpt-L12-d768-b8-s1024var-steps6-seed1"):
            run("tracegen", "--model", "gpt", "--vary-seq", "--steps", "6")
        elif name.startswith("synthetic-resnet-blocks3-b64-px224-steps4-seed1"):
            run("tracegen", "--model", "resnet", "--steps", "4")
        else:
            check(False, f"no recipe for bundled trace {name}")
            continue
        with gzip.open(path, "rt") as f:
            check(open(name).read() == f.read(), f"tracegen reproduces {name}")


with tempfile.TemporaryDirectory() as d:
    for test in [test_min_pool_and_placement, test_min_pool_above, test_json_contract,
                 test_unmatched_and_failed_lines, test_malformed_lines_name_their_line, test_gzip_and_crlf, test_inputs_refused, test_bad_options,
                 test_dump_at_failure, test_tracegen, test_record, test_vmm, test_gpu_lag,
                 test_fence_lag,
                 test_sizes_no_device_has, test_live_bytes_past_2_64, test_plan,
                 test_plan_of_another_run,
                 test_bundled_traces]:
        before = failures
        test(d)
        print(f"{test.__name__}: {'ok' if failures == before else 'FAILED'}")
sys.exit(1 if failures else 0)
