#!/usr/bin/env python3
"""What a lookahead of W allocations would buy: rolling-horizon packing.

    scripts/research/lookahead-packing.py TRACE W[,W...] oracle|online[,...]

Every W allocations, the next W are packed (greedily, at the lowest offset
free over their lifetime, largest size or largest size x lifetime first,
as bfcshim plan packs a whole run) around the blocks live at that moment.
"oracle": the death of every block is known, those already live included
(an upper bound for a planner that predicts the next W allocations
perfectly). "online": blocks already live are taken to live forever, and a
new block's death is known only within its window (what a planner that
learned the next W allocations from the previous period could know).
Prints peak live / the packing's extent. W larger than the trace is the
offline packing. A measuring tool for issue 12, not part of the engine.
"""
import gzip
import sys
INF = float("inf")
def load(path):
    op = gzip.open if path.endswith(".gz") else open
    blocks, live = [], {}
    with op(path, "rt") as f:
        next(f)
        for t, line in enumerate(f):
            p = line.rstrip("\n").split(",")
            act, ptr, size = p[2], p[3], int(p[4])
            if act.startswith("alloc"):
                b = [t, INF, (size + 255) // 256 * 256]
                live[ptr] = b; blocks.append(b)
            elif act == "free" and ptr in live:
                live.pop(ptr)[1] = t
    return blocks
def peak_live(blocks):
    ev = []
    for b, d, s in blocks:
        ev.append((b, s))
        if d != INF: ev.append((d, -s))
    ev.sort(); cur = pk = 0
    for _, s in ev:
        cur += s; pk = max(pk, cur)
    return pk
def run(blocks, W, mode, order):
    placed = []  # (offset, size, born, dies_known)
    top = 0
    for k in range(0, len(blocks), W):
        win = blocks[k:k + W]
        t0 = win[0][0]; tend = blocks[k + W][0] if k + W < len(blocks) else INF
        if mode == "oracle":
            obst = [(o, s, b, d) for (o, s, b, d, real) in placed if real > t0]
        else:
            obst = [(o, s, b, INF) for (o, s, b, d, real) in placed if real > t0]
        placed = [x for x in placed if x[4] > t0]
        cur = []
        def key(b):
            d = b[1] if mode == "oracle" or b[1] < tend else INF
            life = (d if d != INF else 10**9) - b[0]
            return -b[2] if order == "size" else -(b[2] * life)
        for b in sorted(win, key=key):
            born, dies, size = b
            dk = dies if mode == "oracle" or dies < tend else INF
            conf = sorted((o, s) for (o, s, bb, dd) in obst + cur if bb < dk and born < dd)
            at = 0
            for o, s in conf:
                if o >= at + size: break
                if o + s > at: at = o + s
            cur.append((at, size, born, dk))
            placed.append((at, size, born, dk, dies))
            top = max(top, at + size)
    return top
if __name__ == "__main__":
    path = sys.argv[1]; blocks = load(path); pk = peak_live(blocks)
    for W in map(int, sys.argv[2].split(",")):
        for mode in sys.argv[3].split(","):
            for order in ("size", "area"):
                top = run(blocks, W, mode, order)
                print("%-45s W=%-5d %-7s %-5s %.4f" % (path.split("/")[-1][:45], W, mode, order, pk / top), flush=True)
