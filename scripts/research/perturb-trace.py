#!/usr/bin/env python3
"""Perturbs an RMM-format allocation trace the way a second run of a job may
differ from the recorded one, to measure how a placement plan of the
recording (bfcshim plan) holds up on it.

  perturb-trace.py IN OUT swap|drop|insert RATE [--seed N]

  swap    two allocations in a row change places with probability RATE
          (two threads or streams interleaving differently)
  drop    an allocation and its free are left out with probability RATE
          (a recorded allocation this run does not make)
  insert  after an allocation, with probability RATE, a block that lives
          until the next event (512 B, 4 KiB, 1 MiB, or the same size):
          an allocation the recording lacked

Deterministic for a seed. IN may be gzipped; OUT is plain CSV.
"""
import argparse
import gzip
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("mode", choices=["swap", "drop", "insert"])
    ap.add_argument("rate", type=float)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    opener = gzip.open if a.src.endswith(".gz") else open
    with opener(a.src, "rt") as f:
        lines = f.read().splitlines()
    head, events = lines[0], [e.split(",") for e in lines[1:] if e]
    out = []
    if a.mode == "swap":
        i = 0
        while i < len(events):
            if (i + 1 < len(events) and events[i][2] == "allocate" and
                    events[i + 1][2] == "allocate" and rnd.random() < a.rate):
                out += [events[i + 1], events[i]]
                i += 2
            else:
                out.append(events[i])
                i += 1
    elif a.mode == "drop":
        dropped = set()
        for e in events:
            if e[2] == "allocate" and rnd.random() < a.rate:
                dropped.add(e[3])
            elif e[2] == "free" and e[3] in dropped:
                dropped.discard(e[3])
            else:
                out.append(e)
    else:
        extra = 0
        for e in events:
            out.append(e)
            if e[2] == "allocate" and rnd.random() < a.rate:
                extra += 1
                ptr = "0xdead%08x" % extra
                size = str(rnd.choice([512, 4096, 1 << 20, int(e[4])]))
                out.append([e[0], e[1], "allocate", ptr, size, e[5]])
                out.append([e[0], e[1], "free", ptr, size, e[5]])
    with open(a.dst, "w") as f:
        f.write("\n".join([head] + [",".join(e) for e in out]) + "\n")


if __name__ == "__main__":
    main()
