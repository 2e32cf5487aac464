#!/usr/bin/env python3
"""Writes a longer copy of a training trace: one steady step repeated.

    scripts/research/loop-trace.py IN OUT STEPS [--marks-per-step K] [--from-step S]

A real trace holds a few training steps, and what a pool does in its first
steps (growing, moving memory) may not be what it does for the rest of a job.
This keeps the trace up to the start of step S (default 2, counted from 0)
and then replays step S STEPS times. Steps are found by the trace's largest
allocation size: each step makes K blocks of it (K=4 for the H100 GPT-2
jobs, whose logits and their gradients are the largest; 1 for ResNet-50).
Blocks live across a step boundary (made in one step, freed in the next)
are matched by size, in order: each repetition frees what the one before
left live, as the next real step would. Fails if the step's blocks left
live and its frees of older blocks do not pair up (not a steady step).
Pointers are renumbered; sizes, streams and order are the trace's.
"""
import argparse
import collections
import csv
import gzip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("steps", type=int)
    ap.add_argument("--marks-per-step", type=int, default=1)
    ap.add_argument("--from-step", type=int, default=2)
    a = ap.parse_args()
    opener = gzip.open if a.inp.endswith(".gz") else open
    with opener(a.inp, "rt", newline="") as f:
        rows = list(csv.reader(f))
    hdr, ev = rows[0], rows[1:]
    act, ptr, size = hdr.index("Action"), hdr.index("Pointer"), hdr.index("Size")
    # One id per block: pointers are reused once freed.
    live, ids, size_of = {}, [], {}
    for r in ev:
        if r[act] == "allocate":
            live[r[ptr]] = len(size_of)
            size_of[len(size_of)] = int(r[size])
        ids.append(live[r[ptr]] if r[act] == "allocate" else live.pop(r[ptr]))
    largest = max(size_of.values())
    marks = [i for i, r in enumerate(ev) if r[act] == "allocate" and int(r[size]) == largest]
    k = a.marks_per_step
    lo, hi = marks[a.from_step * k], marks[(a.from_step + 1) * k]
    step = range(lo, hi)
    made = {ids[i] for i in step if ev[i][act] == "allocate"}
    freed = {ids[i] for i in step if ev[i][act] == "free"}
    older = [i for i in step if ev[i][act] == "free" and ids[i] not in made]
    left = [i for i in step if ev[i][act] == "allocate" and ids[i] not in freed]
    if collections.Counter(size_of[ids[i]] for i in older) != \
            collections.Counter(size_of[ids[i]] for i in left):
        raise SystemExit("%s: step %d is not steady (what it frees of older steps is not "
                         "what it leaves live); try another --marks-per-step or --from-step"
                         % (a.inp, a.from_step))
    out = [hdr]

    def emit(r, block, action):
        x = list(r)
        x[act], x[ptr] = action, hex(0x100000000000 + block * 512)
        out.append(x)

    for i in range(lo):
        emit(ev[i], ids[i], ev[i][act])
    before = collections.defaultdict(collections.deque)  # size -> blocks left live
    for i in older:
        before[size_of[ids[i]]].append(ids[i])
    block = len(size_of)
    for _ in range(a.steps):
        renamed, now = {}, collections.defaultdict(collections.deque)
        for i in step:
            r, b = ev[i], ids[i]
            if r[act] == "allocate":
                renamed[b] = block
                if b not in freed:
                    now[size_of[b]].append(block)
                emit(r, block, "allocate")
                block += 1
            elif b in made:
                emit(r, renamed[b], "free")
            else:
                emit(r, before[size_of[b]].popleft(), "free")
        before = now
    with open(a.out, "w", newline="") as f:
        csv.writer(f).writerows(out)
    print("%s: %d events kept, then step %d (%d events) %d times: %d events"
          % (a.out, lo, a.from_step, hi - lo, a.steps, len(out) - 1))


if __name__ == "__main__":
    main()
