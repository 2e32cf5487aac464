#!/usr/bin/env python3
"""check_first_program.py PROGRAM LIBBFCSHIM - runs a user's first CUDA
program alone and then under the shim, and checks, from the stats file, that
the pool served its allocation (whichever door it came through). Exits 77
(skip) when the program alone finds no GPU."""
import json
import os
import subprocess
import sys
import tempfile


def main():
    program, lib = sys.argv[1], sys.argv[2]
    # Whether there is a GPU is the program's own answer, asked without the
    # shim (a sanitizer build of the shim preloaded into an uninstrumented
    # static-cudart program can fail before main, which is not a skip).
    alone = subprocess.run([program], capture_output=True, text=True, timeout=120)
    if alone.returncode == 77:
        sys.stdout.write(alone.stdout)
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats.json")
        env = dict(os.environ, LD_PRELOAD=lib, BFCSHIM_STATS_FILE=stats)
        r = subprocess.run([program], env=env, capture_output=True, text=True, timeout=120)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode == 77:
            return 77
        if r.returncode != 0:
            print(f"{program} exited {r.returncode}")
            return 1
        if not os.path.exists(stats):
            print("no stats file: the shim never served an allocation")
            return 1
        doc = json.load(open(stats))
        pools = doc.get("pools", [])
        allocs = sum(p["num_allocs"] for p in pools)
        passed = sum(p["passthrough_allocs"] for p in pools)
        print(f"pools: {len(pools)}, pooled allocations: {allocs}, passed through: {passed}")
        if allocs < 1:
            print("the program's cudaMalloc did not reach the pool")
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
