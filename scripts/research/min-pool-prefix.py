#!/usr/bin/env python3
"""Where in a run its smallest pool is decided.

    scripts/research/min-pool-prefix.py [--bfcshim B] [--steps N] TRACE.csv[.gz]...

Replays the first 1/N, 2/N, ... N/N of each trace's events (`bfcshim replay
--min-pool`) under the default, age and low placement and prints each
prefix's peak live bytes and efficiency. Where a prefix already needs the
whole run's smallest pool, what follows cannot change the figure: a rule
that learns the training step's period helps only traces whose figure is
decided after their first step. A measuring tool for issue 12.
"""
import argparse
import gzip
import os
import tempfile

from placement_scores import replay

POLICIES = [("default", []), ("age", ["--placement", "age"]), ("low", ["--placement", "low"])]


def read_lines(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return f.readlines()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bfcshim", default="build/bfcshim")
    ap.add_argument("--steps", type=int, default=5, help="prefixes per trace")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for trace in a.traces:
            lines = read_lines(trace)
            header, events = lines[0], lines[1:]
            print(f"{os.path.basename(trace)} ({len(events)} events)")
            for k in range(1, a.steps + 1):
                n = len(events) * k // a.steps
                prefix = os.path.join(tmp, "prefix.csv")
                with open(prefix, "w") as f:
                    f.writelines([header] + events[:n])
                row = f"  first {n:6d} events"
                for name, args in POLICIES:
                    r = replay(a.bfcshim, args, prefix)
                    if name == "default":
                        row += f"  peak {r['peak_live_bytes'] / 2**20:9.1f} MiB"
                    row += f"  {name} {r['efficiency']:.4f}"
                print(row, flush=True)


if __name__ == "__main__":
    main()
