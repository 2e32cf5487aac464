#!/usr/bin/env python3
"""Is the smallest pool a promise? Replays every size near it.

    scripts/research/min-pool-scan.py [--bfcshim build/bfcshim] [--step B] [--below B]
        [--above B] [--args "REPLAY ARGS"] TRACE.csv[.gz]...

For each trace: `bfcshim replay --min-pool` with the replay args (add
`--pool-unit 256` for the search at the granule), then one replay at every
size from min - BELOW to min + ABOVE in steps of STEP (4 KiB, 256 KiB,
1 MiB). Prints the efficiency of the search's figure, of the smallest size
above which every scanned size serves ("robust"), and of the smallest size
that served at all, with how many sizes above the figure failed. Success is
not monotone in the size; this shows how far from it a policy is.
"""
import argparse
import os
from concurrent.futures import ThreadPoolExecutor

from placement_scores import replay


def scan(a, trace):
    d = replay(a.bfcshim, a.replay_args, trace)
    m, peak = d["min_pool_bytes"], d["peak_live_bytes"]
    sizes = list(range(m - a.below, m + a.above + 1, a.step))
    ok = [replay(a.bfcshim, a.replay_args + ["--no-min-pool", "--pool-size", str(x)],
                 trace, min_pool=False)["failures"] == 0 for x in sizes]
    robust = None
    for x, v in zip(reversed(sizes), reversed(ok)):
        if not v:
            break
        robust = x
    smallest = next((x for x, v in zip(sizes, ok) if v), None)
    above = sum(1 for x, v in zip(sizes, ok) if x > m and not v)
    eff = lambda x: peak / x if x else 0.0
    return "%-46s search %.5f robust %.5f smallest-seen %.5f failing-above %d" % (
        os.path.basename(trace)[:46], eff(m), eff(robust), eff(smallest), above)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bfcshim", default="build/bfcshim")
    ap.add_argument("--step", type=int, default=4096)
    ap.add_argument("--below", type=int, default=256 << 10)
    ap.add_argument("--above", type=int, default=1 << 20)
    ap.add_argument("--args", default="", help="bfcshim replay's arguments")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    a.replay_args = a.args.split()
    with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        for line in ex.map(lambda t: scan(a, t), a.traces):
            print(line)


if __name__ == "__main__":
    main()
