#!/usr/bin/env python3
"""Issue 12's table: every trace's efficiency under each placement, and the
default's cross-validated figure.

    scripts/research/placement-table.py [--bfcshim build/bfcshim] [--offline] \\
        REAL.csv[.gz]... [-- SYNTHETIC.csv[.gz]...]

For each trace: its peak live bytes and `bfcshim replay --min-pool`'s
efficiency under the default placement, age, low and TSL's policy (`--tsl`);
with --offline also the greedy offline packing's bound (`bfcshim plan`), the
figure a planner that knew every lifetime in advance reaches. Real traces
also get the bar the issue sets (>= 0.99 for a peak of 1 GiB or more, >= 0.97
below) and whether the default is below both age and low.

Cross-validation over the real traces (leave one out, candidates as in
scripts/research/placement-cv.py): for each held-out trace, the setting with the best
mean on the others, scored on it. Traces after `--` (synthetic ones) get
their own table and take no part in the choice.
"""
import argparse
import json
import os
import subprocess
import sys

from placement_scores import CANDIDATES, efficiency, leave_one_out, replay

POLICIES = [("default", []), ("age", ["--placement", "age"]),
            ("low", ["--placement", "low"]), ("TSL", ["--tsl"])]
GIB = 1 << 30


def offline_bound(bfcshim, trace):
    r = subprocess.run([bfcshim, "plan", "--json", "-o", os.devnull, trace],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["offline_efficiency"]


def name(trace):
    b = os.path.basename(trace)
    return b[: b.index(".csv")] if ".csv" in b else b


def size(b):
    return "%.2f GiB" % (b / GIB) if b >= GIB else "%.0f MiB" % (b / (1 << 20))


def table(bfcshim, traces, offline, real):
    cols = [p for p, _ in POLICIES] + (["offline"] if offline else [])
    head = ["trace", "peak live"] + cols + (["bar", "met"] if real else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    rows = {}
    for t in traces:
        runs = {p: replay(bfcshim, args, t) for p, args in POLICIES}
        eff = {p: r["efficiency"] for p, r in runs.items()}
        if offline:
            eff["offline"] = offline_bound(bfcshim, t)
        peak = runs["default"]["peak_live_bytes"]
        cells = [name(t), size(peak)] + ["%.4f" % eff[c] for c in cols]
        if real:
            bar = 0.99 if peak >= GIB else 0.97
            met = "yes" if eff["default"] >= bar else "no"
            if eff["default"] < eff["age"] and eff["default"] < eff["low"]:
                met += ", below age and low"
            cells += ["%.2f" % bar, met]
        print("| " + " | ".join(cells) + " |")
        rows[t] = eff
    worst = ["**worst / mean**", ""] + [
        "%.4f / %.4f" % (min(r[c] for r in rows.values()),
                         sum(r[c] for r in rows.values()) / len(rows)) for c in cols]
    print("| " + " | ".join(worst + ([""] * 2 if real else [])) + " |")
    return rows


def main():
    argv = sys.argv[1:]
    synthetic = []
    if "--" in argv:
        i = argv.index("--")
        argv, synthetic = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bfcshim", default="build/bfcshim")
    ap.add_argument("--offline", action="store_true")
    ap.add_argument("real", nargs="+")
    a = ap.parse_args(argv)
    print("## real traces\n")
    table(a.bfcshim, a.real, a.offline, True)
    if len(a.real) >= 2:
        scores = {n: {t: efficiency(a.bfcshim, args, t) for t in a.real} for n, args in CANDIDATES}
        held = leave_one_out(scores)
        chosen = sorted({c for _, c, _ in held})
        vals = [s for _, _, s in held]
        print("\ncross-validated (leave one out over %d real traces, chose %s): "
              "held-out mean %.4f, worst %.4f" % (len(vals), ", ".join(chosen),
                                                  sum(vals) / len(vals), min(vals)))
        for t, c, s in held:
            print("  %-50s chose %-12s held-out %.4f" % (name(t), c, s))
    if synthetic:
        print("\n## synthetic traces\n")
        table(a.bfcshim, synthetic, a.offline, False)


if __name__ == "__main__":
    main()
