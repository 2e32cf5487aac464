#!/usr/bin/env python3
"""The pool's map where each real trace below issue 12's bar first fails.

  scripts/research/failure-maps.py OUTDIR [TRACE...]

For each trace (by default the eight below the bar at 174f2b0), replays it
at one pool unit (64 KiB) below its smallest pool under the default placement
(`bfcshim replay --min-pool --dump-at-failure`), keeps the map in
OUTDIR/<trace>.txt, and prints one table row: where in the run it fails,
what it asked for, how much was free and in how many pieces, and the
offline packing's bound (`bfcshim plan`): the gap an online rule leaves.
Run from the repository root after building (build/bfcshim).
"""
import json
import os
import re
import subprocess
import sys

REAL = "../shared/traces/real/"
OURS = "tests/data/traces/"
DEFAULT = [OURS + "h100-torch-gpt2small-b8-nocache.csv.gz",
           OURS + "h100-torch-gpt2small-b8-snapshot.tensors.csv.gz",
           REAL + "gpt2-medium-1024_training.tensors.csv.gz",
           REAL + "gpt2-medium-128_training.tensors.csv.gz",
           REAL + "gpt2-medium-1024_inference.tensors.csv.gz",
           REAL + "gpt2-medium-512_inference.tensors.csv.gz",
           REAL + "gpt2-medium-256_inference.tensors.csv.gz",
           REAL + "gpt2-medium-128_inference.tensors.csv.gz"]


def bfcshim(*args):
    return json.loads(subprocess.run(["build/bfcshim", *args], check=True,
                                     capture_output=True, text=True).stdout)


def mib(b):
    return "%.1f MiB" % (b / 2**20)


def main():
    out, traces = sys.argv[1], sys.argv[2:] or DEFAULT
    os.makedirs(out, exist_ok=True)
    print("| trace | efficiency | first failure at event | request | free then | largest free "
          "block | free chunks (of 2 MiB or more) | offline bound |")
    print("|---|---|---|---|---|---|---|---|")
    for t in traces:
        name = os.path.basename(t).split(".csv")[0]
        dump = os.path.join(out, name + ".txt")
        if os.path.exists(dump):
            os.remove(dump)
        r = bfcshim("replay", "--min-pool", "--json", "--repeat", "1", "--dump-at-failure", dump, t)
        text = open(dump).read()
        ev, req = map(int, re.search(r"event (\d+): allocation of (\d+) bytes fails", text).groups())
        largest = int(re.search(r"LargestFreeBlock:\s+(\d+)", text).group(1))
        free = [int(x) for x in re.findall(r"^\s+Free\s+0x[0-9a-f]+ size (\d+)", text, re.M)]
        bound = bfcshim("plan", "--json", "-o", os.devnull, t)["offline_efficiency"]
        print(f"| {name} | {r['efficiency']:.4f} | {ev} of {r['events']} ({100 * ev / r['events']:.0f}%) "
              f"| {mib(req)} | {mib(sum(free))} | {mib(largest)} | {len(free)} "
              f"({sum(1 for f in free if f >= 2 << 20)}) | {bound:.4f} |")


if __name__ == "__main__":
    main()
