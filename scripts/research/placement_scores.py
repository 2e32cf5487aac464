"""What the placement and smallest-pool scripts share: one trace's replay
under `bfcshim replay` (its JSON, or only its efficiency), and the
leave-one-out choice of a placement setting."""
import json
import subprocess
import sys

# The settings cross-validation chooses among: age placement, and aligned
# placement at each cap from 4 KiB to 2 MiB (64 KiB is the default). A cap
# above 64 KiB is measured in pools that are multiples of the cap, as the
# shim's are (multiples of 2 MiB): in other pools its grid is off the region's
# top edge (replay's --pool-unit).
CANDIDATES = [("age", ["--placement", "age"])] + [
    ("aligned/%dK" % (a >> 10), ["--placement", "aligned", "--align", str(a)]
     + (["--pool-unit", str(a)] if a > 1 << 16 else []))
    for a in (1 << 12, 1 << 14, 1 << 15, 1 << 16, 1 << 18, 1 << 20, 1 << 21)
]


def replay(bfcshim, args, trace, min_pool=True):
    """`bfcshim replay --min-pool --json` of `trace` with `args`: its JSON
    (without --min-pool when `min_pool` is false: args give the pool)."""
    search = ["--min-pool"] if min_pool else []
    r = subprocess.run([bfcshim, "replay"] + search + ["--json", "--repeat", "1"] + args
                       + [trace], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s replay %s: %s" % (bfcshim, trace, r.stderr.strip()))
    return json.loads(r.stdout)


def efficiency(bfcshim, args, trace, figure="efficiency"):
    """peak live / smallest pool of `trace` replayed by `bfcshim` with `args`.
    `figure` names the JSON field, dotted for a nested one: the default is
    one region's smallest pool; "vmm.prealloc_efficiency" (with --vmm in
    `args`) the default preallocated pool's, laid out as one region until it
    overflows."""
    out = replay(bfcshim, args, trace)
    for key in figure.split("."):
        if not isinstance(out, dict) or key not in out:
            sys.exit("%s replay %s: no figure %s in its JSON" % (bfcshim, trace, figure))
        out = out[key]
    return out


def leave_one_out(scores):
    """scores: {setting: {trace: efficiency}}. For each trace in turn, the
    setting with the best mean on the others (ties: the better worst), and
    what it scores on the held-out trace: [(trace, setting, score)]."""
    names = list(scores)
    traces = list(scores[names[0]])
    out = []
    for t in traces:
        rest = [x for x in traces if x != t]
        best = max(names, key=lambda n: (sum(scores[n][x] for x in rest),
                                         min(scores[n][x] for x in rest)))
        out.append((t, best, scores[best][t]))
    return out
