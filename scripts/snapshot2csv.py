#!/usr/bin/env python3
"""snapshot2csv.py - PyTorch memory snapshot -> RMM logging CSV, for
`bfcshim replay`.

A snapshot is what `torch.cuda.memory._dump_snapshot(path)` writes after
`torch.cuda.memory._record_memory_history()`: a pickle holding plain dicts and
lists, with `device_traces`, one list of events per device, each event a dict
with `action`, `addr`, `size`, `stream` and (recent PyTorch) `time_us`.

The pickle is loaded with every class blocked: a snapshot needs none, and a
pickle that names one (a crafted file can run any code on loading) is
refused with an error instead of being trusted.

Levels:
  tensors   every tensor allocation (`alloc`) and the moment its memory is
            reusable (`free_completed`, or `free_requested` with --free
            requested): what cudaMalloc sees with PYTORCH_NO_CUDA_MEMORY_CACHING=1
  segments  the caching allocator's own cudaMalloc/cudaFree
            (`segment_alloc`, `segment_free`): what the device sees under it
`oom` events become `allocate failure` lines in both.

usage: snapshot2csv.py SNAPSHOT.pickle [-o OUT.csv] [--level tensors|segments]
                       [--device N] [--free completed|requested]
                       [--frames OUT.frames.txt]
Output is RMM's CSV: Thread,Time,Action,Pointer,Size,Stream (Time is
HH:MM:SS:microseconds of the event's day, UTC).

--frames writes where each allocation was made, for `bfcshim report` (which
finds OUT.frames.txt next to OUT.csv by itself): RMM's CSV has no column for
it and stays as it is. After a '#' header line, one line per allocation
that has a size (in the CSV's order): its innermost stack frames as
"function file:line", joined by " < ", or "-" when the snapshot has none.
"""
import argparse
import gzip
import io
import pickle
import sys


class BlockedClass(pickle.UnpicklingError):
    pass


class PlainUnpickler(pickle.Unpickler):
    """Builds only plain data: dicts, lists, tuples, strings, numbers."""

    def find_class(self, module, name):
        raise BlockedClass(f"the pickle names {module}.{name}; a memory snapshot holds "
                           f"plain data only, so it is refused (not loaded)")


def load_snapshot(path):
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        data = gzip.decompress(f.read()) if head == b"\x1f\x8b" else f.read()
    return PlainUnpickler(io.BytesIO(data)).load()


def clock(time_us):
    """HH:MM:SS:us of the day, as RMM writes it."""
    if time_us is None:
        return "00:00:00:000000"
    us = int(time_us)
    day_s = us // 1_000_000 % 86400
    return f"{day_s // 3600:02d}:{day_s // 60 % 60:02d}:{day_s % 60:02d}:{us % 1_000_000:06d}"


FRAMES_KEPT = 8       # innermost frames per allocation
FRAME_LINE_MAX = 600  # characters per allocation's line


def frames_text(event):
    """One line for an event's stack: its innermost frames, or "-"."""
    frames = event.get("frames") or []
    parts = []
    for fr in frames[:FRAMES_KEPT]:
        if isinstance(fr, dict):
            parts.append(f"{fr.get('name', '?')} {fr.get('filename', '?')}:{fr.get('line', '?')}")
    text = " < ".join(parts) or "-"
    return text.replace("\n", " ")[:FRAME_LINE_MAX]


def convert(snapshot, level, device, free_action, frames=None):
    """The CSV text and the counts; when `frames` is a list, one line per
    allocation with a size is appended to it (see --frames)."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError("not a memory snapshot: no 'device_traces' (was memory history "
                         "recorded with torch.cuda.memory._record_memory_history()?)")
    traces = snapshot["device_traces"]
    if device >= len(traces):
        raise ValueError(f"the snapshot has {len(traces)} device(s); no device {device}")
    events = traces[device]
    if level == "tensors":
        actions = {"alloc": "allocate", free_action: "free"}
    else:
        actions = {"segment_alloc": "allocate", "segment_free": "free"}
    actions["oom"] = "allocate failure"
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    counts = {"allocate": 0, "free": 0, "allocate failure": 0}
    for e in events:
        what = actions.get(e.get("action"))
        if what is None:
            continue
        addr = int(e.get("addr", 0) or 0)
        size = int(e.get("size", 0) or 0)
        stream = int(e.get("stream", 0) or 0)
        if what == "allocate failure":
            addr = 0
        lines.append(f"0,{clock(e.get('time_us'))},{what},0x{addr:x},{size},{stream}")
        counts[what] += 1
        if frames is not None and what == "allocate" and size > 0:
            frames.append(frames_text(e))
    return "\n".join(lines) + "\n", counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot")
    ap.add_argument("-o", "--output", help="output CSV (default: standard output)")
    ap.add_argument("--level", choices=["tensors", "segments"], default="tensors")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--free", choices=["completed", "requested"], default="completed",
                    help="which free event ends a tensor (default: completed)")
    ap.add_argument("--frames", metavar="PATH",
                    help="also write where each allocation was made (for bfcshim report)")
    a = ap.parse_args(argv)
    frames = [] if a.frames else None
    try:
        snap = load_snapshot(a.snapshot)
        text, counts = convert(snap, a.level, a.device, "free_" + a.free, frames)
        if a.frames:
            with open(a.frames, "w") as f:
                f.write("# bfcshim frames v1: one line per allocation with a size, in trace "
                        "order\n")
                f.write("".join(line + "\n" for line in frames))
    except (OSError, pickle.UnpicklingError, ValueError, EOFError) as err:
        print(f"snapshot2csv: {a.snapshot}: {err}", file=sys.stderr)
        return 1
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"snapshot2csv: {counts['allocate']} allocations, {counts['free']} frees, "
          f"{counts['allocate failure']} failures ({a.level}, device {a.device})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
