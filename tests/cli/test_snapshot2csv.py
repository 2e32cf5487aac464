#!/usr/bin/env python3
"""scripts/snapshot2csv.py: a snapshot-shaped pickle converts to a trace that
`bfcshim replay` accepts with the right counts, at both levels; a pickle that
names a class is refused without running anything.

usage: test_snapshot2csv.py BFCSHIM CONVERTER WORKDIR
"""
import json
import os
import pickle
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

bfcshim, converter, work = sys.argv[1:4]
testcheck.fresh_dir(work)
check = testcheck.Checks()


# A snapshot as _dump_snapshot writes it: plain dicts and lists. Three
# tensors in a 2 MiB segment, one freed (requested, then completed), an OOM.
MiB = 1 << 20
base = 0x7F0000000000
t = 1_700_000_000_000_000
events = [
    {"action": "segment_alloc", "addr": base, "size": 2 * MiB, "stream": 0, "time_us": t},
    {"action": "alloc", "addr": base, "size": 512 * 1024, "stream": 0, "time_us": t + 1,
     "frames": [{"name": "linear", "filename": "model.py", "line": 42},
                {"name": "forward", "filename": "model.py", "line": 7}]},
    {"action": "alloc", "addr": base + 2 * MiB, "size": 0, "stream": 0, "time_us": t + 1},
    {"action": "alloc", "addr": base + 512 * 1024, "size": 256 * 1024, "stream": 0,
     "time_us": t + 2},
    {"action": "free_requested", "addr": base, "size": 512 * 1024, "stream": 0, "time_us": t + 3},
    {"action": "free_completed", "addr": base, "size": 512 * 1024, "stream": 0, "time_us": t + 4},
    {"action": "alloc", "addr": base + 768 * 1024, "size": 1024 * 1024, "stream": 0,
     "time_us": t + 5},
    {"action": "oom", "addr": 0, "size": 64 * MiB, "stream": 0, "time_us": t + 6},
    {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t + 7},
]
snap = {"segments": [], "device_traces": [events, []]}
good = os.path.join(work, "snapshot.pickle")
with open(good, "wb") as f:
    pickle.dump(snap, f)


def convert(*args):
    return subprocess.run([sys.executable, converter, *args], capture_output=True, text=True)


out = os.path.join(work, "tensors.csv")
p = convert(good, "-o", out)
check(p.returncode == 0, f"convert: {p.stderr}")
lines = open(out).read().splitlines()
check(lines[0] == "Thread,Time,Action,Pointer,Size,Stream", "header")
check(len(lines) == 1 + 6, f"tensor events: {lines}")
lines = [l for l in lines if ",0," not in l or "allocate failure" in l]  # the 0-byte one
check(lines[1].split(",")[2:] == ["allocate", f"0x{base:x}", str(512 * 1024), "0"], lines[1])
check(lines[3].split(",")[2] == "free" and lines[5].split(",")[2] == "allocate failure",
      "free_completed and oom")
r = subprocess.run([bfcshim, "replay", "--json", "--repeat", "1", out], capture_output=True,
                   text=True)
check(r.returncode == 0, f"replay: {r.stderr}")
doc = json.loads(r.stdout or "{}")
check(doc.get("allocs") == 3 and doc.get("frees") == 1 and doc.get("trace_failed_allocs") == 1,
      f"replayed: {doc}")
check(doc.get("peak_live_bytes") == (256 + 1024) * 1024, f"peak {doc.get('peak_live_bytes')}")

# Frames: one line per allocation with a size, in the CSV's order.
frames = os.path.join(work, "tensors.frames.txt")
p = convert(good, "-o", out, "--frames", frames)
fl = open(frames).read().splitlines() if os.path.exists(frames) else []
check(p.returncode == 0 and len(fl) == 1 + 3 and fl[0].startswith("# bfcshim frames v1"),
      f"frames file: {fl}")
check(fl[1:] == ["linear model.py:42 < forward model.py:7", "-", "-"], f"frames: {fl[1:]}")

p = convert(good, "--level", "segments", "-o", os.path.join(work, "segments.csv"))
seg = open(os.path.join(work, "segments.csv")).read().splitlines()
check(p.returncode == 0 and len(seg) == 1 + 2 and ",allocate,0x" in seg[1], f"segments {seg}")
p = convert(good, "--device", "5")
check(p.returncode == 1 and "no device 5" in p.stderr, "missing device")


# A pickle that would run code when loaded: refused, and nothing runs.
class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {os.path.join(work, 'pwned')}",))


evil = os.path.join(work, "evil.pickle")
with open(evil, "wb") as f:
    pickle.dump({"device_traces": [[Evil()]]}, f)
p = convert(evil)
check(p.returncode == 1 and "refused" in p.stderr, f"evil pickle: {p.returncode} {p.stderr}")
check(not os.path.exists(os.path.join(work, "pwned")), "the evil pickle ran code")

check.finish()
