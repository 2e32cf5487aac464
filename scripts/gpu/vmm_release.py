#!/usr/bin/env python3
"""vmm_release.py - two processes share one GPU; the first gives memory back
mid-run and the second then gets it (issue 15's release, on a real device).

The holder (this process, run under the shim with BFCSHIM_VMM=on and
BFCSHIM_PREALLOCATE=false, PyTorch's cache off) allocates a share of the
device, frees it and calls bfcshim.trim(); a child process started with
LD_PRELOAD removed then asks for the same share with plain PyTorch. The
child's allocation is tried once before the trim (expected to fail: the
holder still maps the memory) and once after (expected to succeed).

Prints one `RESULT {json}` line: whether each attempt succeeded, the bytes
trim gave back, and how long trim took.
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def child(conn, nbytes, device):
    import torch
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        try:
            x = torch.empty(nbytes, dtype=torch.uint8, device=device)
            x.fill_(1)
            if device == "cuda":
                torch.cuda.synchronize()
            del x
            torch.cuda.empty_cache()
            conn.send(True)
        except RuntimeError:  # torch.OutOfMemoryError is one
            torch.cuda.empty_cache()
            conn.send(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="vmm")
    ap.add_argument("--share", type=float, default=0.6,
                    help="fraction of the device each side asks for")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    import torch
    import bfcshim

    total = torch.cuda.get_device_properties(0).total_memory if args.device == "cuda" else 1 << 30
    nbytes = int(total * args.share)
    # The child must not inherit the shim: it stands for another user's job.
    env_preload = os.environ.pop("LD_PRELOAD", None)
    ctx = mp.get_context("spawn")
    parent, other = ctx.Pipe()
    p = ctx.Process(target=child, args=(other, nbytes, args.device))
    p.start()
    if env_preload is not None:
        os.environ["LD_PRELOAD"] = env_preload

    x = torch.empty(nbytes, dtype=torch.uint8, device=args.device)
    x.fill_(2)
    del x
    if args.device == "cuda":
        torch.cuda.synchronize()

    parent.send("try")
    before_trim = parent.recv()
    t0 = time.perf_counter()
    given_back = bfcshim.trim() if bfcshim.active() else 0
    trim_s = time.perf_counter() - t0
    parent.send("try")
    after_trim = parent.recv()
    parent.send("stop")
    p.join(timeout=60)
    print("RESULT " + json.dumps({
        "workload": "vmm-release", "arm": args.arm, "device_bytes": total, "ask_bytes": nbytes,
        "other_before_trim": before_trim, "other_after_trim": after_trim,
        "trim_bytes": given_back, "trim_s": trim_s, "shim_active": bfcshim.active(),
        "ok": (not before_trim) and after_trim,
    }, sort_keys=True))
    return 0 if after_trim else 1


if __name__ == "__main__":
    sys.exit(main())
