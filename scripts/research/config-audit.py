#!/usr/bin/env python3
"""Runs the end-to-end tests again in a configuration they were not written
for, and says what changed.

    scripts/research/config-audit.py [--build build] [--jobs 4] [--replay] \\
        NAME=VALUE... [-- TEST-PREFIX...]

Each e2e test (and the Python tests that drive the shim) runs as meson
would run it, its own environment first and the given variables on top;
`%N` in a value becomes the test's name (so that each test writes its own
trace or statistics). Printed: the tests that no longer pass, each with the
first lines of what it said. With --replay, and BFCSHIM_TRACE among the
variables, every trace the run left is replayed (`bfcshim replay`) and
those with frees of pointers never allocated, or allocations at a pointer
still live, are named: a trace the shim writes must replay closed.

Most failures are a test's own premise (a test that counts driver regions
fails when the pool grows, one that counts log lines fails at log level
debug): read each. The real defects found this way so far: the runtime
door's first cudaMalloc with the driver door closed, capture into an
existing graph, pointer attributes over virtual memory (stop 38), and a
trace that lost every pool whose context went (stop 39).
"""
import argparse
import concurrent.futures
import glob
import json
import os
import subprocess
import sys

PREFIXES = ("e2e_", "test_numba", "test_module", "test_reporting", "test_run_ab")


def tests_of(build):
    out = subprocess.run(["meson", "introspect", build, "--tests"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def run_one(test, extra, timeout):
    env = dict(os.environ)
    env.update(test.get("env") or {})
    for k, v in extra.items():
        env[k] = v.replace("%N", test["name"])
    try:
        p = subprocess.run(test["cmd"], env=env, cwd=test.get("workdir") or None,
                           capture_output=True, text=True, timeout=timeout)
        return test["name"], p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return test["name"], "timeout", ""


def replay_closed(bfcshim, path):
    p = subprocess.run([bfcshim, "replay", "--json", "--repeat", "1", path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return f"replay failed: {p.stderr.strip()[-200:]}"
    for line in p.stdout.splitlines():
        d = json.loads(line)
        if d.get("unmatched_frees") or d.get("leaked_reuses"):
            return (f"{d['events']} events, {d['unmatched_frees']} unmatched frees, "
                    f"{d['leaked_reuses']} allocations at a live pointer")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("vars", nargs="*", help="NAME=VALUE, then -- and test name prefixes")
    args = ap.parse_args()
    extra, prefixes = {}, []
    for a in args.vars:
        if "=" in a and not prefixes:
            k, v = a.split("=", 1)
            extra[k] = v
        else:
            prefixes.append(a)
    prefixes = tuple(prefixes) or PREFIXES
    tests = [t for t in tests_of(args.build) if t["name"].startswith(prefixes)]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
        results = list(ex.map(lambda t: run_one(t, extra, args.timeout), tests))
    failed = [(n, rc, out) for n, rc, out in results if rc not in (0, 77)]
    print(f"{len(results)} tests with {' '.join(f'{k}={v}' for k, v in extra.items())}: "
          f"{len(failed)} no longer pass")
    for name, rc, out in failed:
        lines = [l for l in out.splitlines() if l.strip()][:3]
        print(f"  {name} ({rc}):")
        for l in lines:
            print(f"      {l[:160]}")
    if args.replay and "BFCSHIM_TRACE" in extra:
        pattern = extra["BFCSHIM_TRACE"].replace("%N", "*")
        bfcshim = os.path.join(args.build, "bfcshim")
        traces = sorted(glob.glob(pattern))
        odd = [(t, why) for t in traces if (why := replay_closed(bfcshim, t))]
        print(f"{len(traces)} traces replayed: {len(odd)} not closed")
        for t, why in odd:
            print(f"  {t}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
