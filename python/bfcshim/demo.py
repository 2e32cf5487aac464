"""``bfcshim demo [OUTDIR]`` (or ``python -m bfcshim.demo``): what bfcshim
does, in six steps, on a machine without a GPU. It runs a sample CUDA
program (bin/bfcshim-sample-job, shipped in this package) under the shim on
the fake GPU that comes with it, compares it with the native path, shows an
out-of-memory report, writes the HTML report, replays real PyTorch traces
(shipped in data/traces) through the engine, and says what to run next on a
real GPU. Files go to OUTDIR (default demo-out/).

scripts/demo.sh runs the same steps from a meson build tree, naming the
build's command, sample job and the source tree's traces with --command,
--sample and --traces.
"""
import argparse
import glob
import os
import subprocess
import sys

_here = os.path.dirname(os.path.abspath(__file__))

# Steps of the sample job that bfcshim ab times: long enough (about 50 ms
# natively on the fake GPU) that the job's own allocations, not the
# programs' start, make the wall time.
AB_STEPS = 400


def _step(title, what):
    print(f"\n== {title}\n   {what}\n", flush=True)


def _run(argv, drop=(), head=None, check=True):
    """Runs argv with its output (stdout and stderr together) printed,
    leaving out the lines that contain any of ``drop``; returns the exit
    status."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [ln for ln in p.stdout.splitlines() if not any(d in ln for d in drop)]
    print("\n".join(lines[:head] if head else lines), flush=True)
    if check and p.returncode != 0:
        raise SystemExit(f"bfcshim demo: {' '.join(argv[:2])} failed (exit {p.returncode})")
    return p.returncode


def _packaged(*parts):
    return os.path.join(_here, *parts)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bfcshim demo",
                                 description="what bfcshim does, in six steps, on the fake GPU")
    ap.add_argument("outdir", nargs="?", default="demo-out",
                    help="where the trace, statistics and reports go (default: demo-out)")
    ap.add_argument("--command", help="the bfcshim command (default: this package's)")
    ap.add_argument("--sample", help="the sample CUDA job (default: this package's "
                    "bin/bfcshim-sample-job)")
    ap.add_argument("--traces", nargs="+", metavar="TRACE",
                    help="the traces of step 5 (default: this package's data/traces)")
    a = ap.parse_args(argv)

    if a.command:
        b = a.command
    else:
        from . import command_path
        b = command_path()
    job = a.sample or _packaged("bin", "bfcshim-sample-job")
    traces = a.traces or sorted(glob.glob(_packaged("data", "traces", "*.csv.gz")))
    for what, path in (("the bfcshim command", b), ("the sample job", job)):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"bfcshim demo: {what} is not at {path} (install the package with "
                             "pip, or run scripts/demo.sh in a source tree)")
    try:
        os.makedirs(a.outdir, exist_ok=True)
    except OSError as e:  # a file in the way, a read-only place
        raise SystemExit(f"bfcshim demo: {a.outdir}: cannot make this folder for the demo's "
                         f"files ({e.strerror}); name another") from None
    out = os.path.abspath(a.outdir)
    fake_notice = ("--fake-gpu:",)

    _step("1/6 A CUDA program under the shim, on the fake GPU",
          "bfcshim run --fake-gpu: a stand-in training loop (4 steps of 20 cudaMalloc/cudaFree "
          "through the runtime, LD_PRELOAD set by the command); its allocations come from "
          "one pool")
    _run([b, "run", "--fake-gpu", "--stats", "--trace", os.path.join(out, "job.csv"),
          "--stats-file", os.path.join(out, "job.json"), "--", job, "4"])

    _step("2/6 The same program natively and under the shim",
          f"bfcshim ab: interleaved runs of {AB_STEPS} steps; the native arm still counts its "
          "calls (platform mode); the shim's arm makes one region call where the native one "
          f"made {AB_STEPS * 20}")
    _run([b, "ab", "--fake-gpu", "--repeat", "3", "--metric", "([0-9.]+) us/step",
          "--metric-name", "steady state (us/step)", "--", job, str(AB_STEPS)],
         drop=fake_notice + ("bfcshim ab: run ",))
    print("\n   What the numbers mean: the fake GPU's cudaMalloc is an mmap of host memory, "
          "so this\n"
          "   compares the allocators' own costs, not a workload. The steady state (the "
          "job's own clock,\n"
          "   first step left out) is the cost per step of 20 allocations and frees; the "
          "shim's arm also\n"
          "   pays once, in its first step, for taking the pool. The pool is bigger on "
          "purpose: it takes\n"
          "   75% of the GPU at the first allocation (BFCSHIM_MEM_FRACTION, "
          "BFCSHIM_PREALLOCATE), as JAX\n"
          "   does; what the job used is the peak bytes in use.", flush=True)

    _step("3/6 Out of memory in a 128 MiB pool",
          "the job needs 210 MiB at once: the allocation fails with CUDA's own error, and the "
          "shim explains why (this step is meant to fail)")
    oom = os.path.join(out, "oom.txt")
    _run([b, "run", "--fake-gpu", "--limit", "128MiB", "--oom-report", oom, "--", job, "1"],
         drop=fake_notice, head=16, check=False)
    print(f"   (the full report, with the memory map, is in {oom})")

    _step("4/6 The HTML report of step 1",
          "bfcshim report: live bytes over time, the pool's map at the peak (the job's own "
          "pool, from job.json next to job.csv), sizes, statistics; one file, offline")
    _run([b, "report", os.path.join(out, "job.csv"), "-o", os.path.join(out, "report.html")])
    print(f"   open {os.path.join(out, 'report.html')} in a browser")

    _step("5/6 The engine on real PyTorch traces",
          "bfcshim replay: the smallest single pool that serves each trace (efficiency = peak "
          "live bytes / that pool; 1.0 is the limit), and the engine's speed")
    if not traces:
        raise SystemExit("bfcshim demo: no traces to replay (--traces)")
    _run([b, "replay", "--repeat", "3", *traces])
    print("\n   The same traces under TSL's policy (TSL: the TensorFlow/XLA support library "
          "whose\n   BFC allocator JAX and TensorFlow use: lowest-address best fit, split only "
          "at 2x):\n", flush=True)
    _run([b, "replay", "--tsl", "--repeat", "1", *traces])

    _step("6/6 Next, on a machine with a GPU",
          "the same commands without --fake-gpu, on your own job:")
    print("""\
   pip install .                                        # or: meson setup build && meson compile -C build
   bfcshim run --stats -- python train.py               # the job on the pool (75% of the GPU, taken once)
   bfcshim ab --metric 'loss ([0-9.]+)' -- python train.py   # A/B against the framework's own allocator
   bfcshim run --trace job.csv --stats-file job.json -- python train.py && bfcshim report job.csv
   PYTORCH_NO_CUDA_MEMORY_CACHING=1 bfcshim run -- python train.py   # the pool instead of PyTorch's cache
   docs/frameworks.md: PyTorch, CuPy and Numba plug-ins without LD_PRELOAD; JAX and TensorFlow""",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
