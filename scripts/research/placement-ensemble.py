#!/usr/bin/env python3
"""Placement measured on perturbed copies of real traces, not on one recording.

    scripts/research/placement-ensemble.py [--copies DIR] [--seeds N] [--figure KEY] \\
        NAME=BFCSHIM[,ARG...] [NAME=...] -- TRACE.csv[.gz]...

The smallest pool of one trace is a chaotic function of placement: one small
block placed elsewhere early moves every later hole, and a rule can win or
lose a few percent on a trace by luck. A second run of the same job differs
from the recording in just such small ways (allocations of two threads in
another order, one more or one fewer small block). So each candidate is
replayed (`bfcshim replay --min-pool`) on N copies of every trace made by
scripts/research/perturb-trace.py per kind (swap 2%, drop 1%, insert 1%; seeds 1..N),
and a trace's figure is the mean efficiency over its copies.

A candidate is a name, a bfcshim binary and replay arguments, comma
separated (e.g. `low=build/bfcshim,--placement,low`), so that two builds of
the engine can be compared as well as two settings of one. `--figure` picks
the replay JSON's figure: one region's efficiency by default;
`vmm.prealloc_efficiency` (candidates given `--vmm`) for the default
preallocated pool, one region until it overflows, then virtual memory. Prints, per trace,
each candidate's mean (and worst copy); then the mean and worst over traces;
then leave one trace out: the candidate with the best mean on the others,
scored on the held-out trace.
"""
import argparse
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from placement_scores import efficiency, leave_one_out

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = [("swap", "0.02"), ("drop", "0.01"), ("insert", "0.01")]


def base_name(path):
    b = os.path.basename(path)
    for ext in (".gz", ".csv"):
        if b.endswith(ext):
            b = b[: -len(ext)]
    return b


def make_copies(traces, out_dir, seeds):
    """{trace base name: [copy paths]}, made once (kept in out_dir)."""
    os.makedirs(out_dir, exist_ok=True)
    jobs, copies = [], {}
    for t in traces:
        for kind, rate in KINDS:
            for s in range(1, seeds + 1):
                dst = os.path.join(out_dir, "%s.%s%d.csv" % (base_name(t), kind, s))
                copies.setdefault(base_name(t), []).append(dst)
                if not os.path.exists(dst):
                    jobs.append([sys.executable, os.path.join(HERE, "perturb-trace.py"),
                                 t, dst, kind, rate, "--seed", str(s)])
    with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        for r in ex.map(lambda j: subprocess.run(j, capture_output=True, text=True), jobs):
            if r.returncode != 0:
                sys.exit("placement-ensemble: perturb-trace failed: " + r.stderr.strip())
    return copies


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", default="build/perturbed-traces",
                    help="where the perturbed copies are kept (made when missing)")
    ap.add_argument("--seeds", type=int, default=4, help="copies per kind of perturbation")
    ap.add_argument("--figure", default="efficiency",
                    help="the replay JSON field scored, dotted when nested "
                         "(vmm.prealloc_efficiency: the default preallocated pool)")
    ap.add_argument("candidates", nargs="+")
    a = ap.parse_args(argv[:split])
    traces = argv[split + 1:]
    if len(traces) < 2:
        sys.exit("placement-ensemble: need at least two traces")
    cands = {}
    for c in a.candidates:
        name, _, spec = c.partition("=")
        parts = spec.split(",")
        if not name or not parts[0]:
            sys.exit("placement-ensemble: a candidate is NAME=BFCSHIM[,ARG...]: " + c)
        cands[name] = (parts[0], parts[1:])
    copies = make_copies(traces, a.copies, a.seeds)
    jobs = [(n, t, p) for n in cands for t in copies for p in copies[t]]
    runs = {}
    with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        for (n, t, _), e in zip(jobs, ex.map(lambda j: efficiency(*cands[j[0]], j[2], a.figure), jobs)):
            runs.setdefault(n, {}).setdefault(t, []).append(e)
    mean = {n: {t: statistics.mean(v) for t, v in runs[n].items()} for n in cands}

    names = list(cands)
    print("%d copies of each of %d traces (%s; seeds 1-%d); figure %s"
          % (len(KINDS) * a.seeds, len(copies), ", ".join("%s %s" % k for k in KINDS), a.seeds,
             a.figure))
    print("%-42s " % "trace (mean over copies, worst copy)"
          + " ".join("%17s" % n[:17] for n in names))
    for t in sorted(copies):
        print("%-42s " % t[:42] + " ".join(
            "%8.4f (%6.4f)" % (mean[n][t], min(runs[n][t])) for n in names))
    print("%-42s " % "mean over traces" + " ".join(
        "%8.4f         " % statistics.mean(mean[n].values()) for n in names))
    print("%-42s " % "worst trace" + " ".join(
        "%8.4f         " % min(mean[n].values()) for n in names))
    if len(names) > 1:
        print("\nleave one trace out:")
        held = []
        for t, best, score in sorted(leave_one_out(mean)):
            held.append(score)
            print("  %-42s chose %-14s held-out %.4f" % (t[:42], best, score))
        print("cross-validated: mean %.4f, worst %.4f over %d traces"
              % (statistics.mean(held), min(held), len(held)))


if __name__ == "__main__":
    main()
