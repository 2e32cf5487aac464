#!/usr/bin/env python3
"""Leave-one-out cross-validation of placement settings on real traces.

    scripts/research/placement-cv.py [--bfcshim build/bfcshim] TRACE.csv[.gz]...

Replays every trace with `bfcshim replay --min-pool` under each candidate
setting (age placement, and aligned placement at each --align cap), then, for
each trace in turn, picks the setting with the best mean efficiency on the
*other* traces and reports what that choice scores on the held-out one. The
cross-validated figure is the mean (and worst) of those held-out scores: what
a setting tuned on some jobs does on a job it has never seen.
"""
import argparse
import os
import sys

from placement_scores import CANDIDATES, efficiency, leave_one_out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bfcshim", default="build/bfcshim")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    if len(a.traces) < 2:
        sys.exit("placement-cv: need at least two traces")
    eff = {name: {t: efficiency(a.bfcshim, args, t) for t in a.traces}
           for name, args in CANDIDATES}
    print("%-14s %8s %8s" % ("setting", "mean", "worst"))
    for name, _ in CANDIDATES:
        v = list(eff[name].values())
        print("%-14s %8.4f %8.4f" % (name, sum(v) / len(v), min(v)))
    print("\nleave one out:")
    held = []
    for t, best, score in leave_one_out(eff):
        held.append(score)
        print("  %-50s chose %-12s held-out %.4f" % (os.path.basename(t), best, score))
    print("cross-validated: mean %.4f, worst %.4f over %d traces"
          % (sum(held) / len(held), min(held), len(held)))


if __name__ == "__main__":
    main()
