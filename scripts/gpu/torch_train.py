#!/usr/bin/env python3
"""torch_train.py - a deterministic PyTorch training job for A/B runs of the
allocator: the same losses whatever serves the memory.

  torch_train.py --model gpt --steps 30 --warmup 5       time steps
  torch_train.py --model gpt --max-batch 1:64 --cap 16GiB   largest batch that fits

Models: `gpt` (GPT-2-small shape, eager attention written out, so every step
allocates and frees a few thousand tensors, as eager training does) and
`resnet` (torchvision ResNet-50 on 224 px images). Inputs are drawn from a
seeded generator; cuDNN and cuBLAS run deterministically, so two runs give
bit-identical losses: `loss_digest` compares them across arms.

Printed: one `RESULT {json}` line (gpucommon.emit) with the median step time
after warm-up, every loss, the peak allocated/reserved from PyTorch, the
device's peak used memory from NVML, the number of driver allocations
PyTorch made after warm-up (arms without caching count each tensor) and,
under the shim, its pool statistics before and after the timed steps.

--cap SIZE gives every arm the same memory for --max-batch: native caching
through set_per_process_memory_fraction, under the shim by
BFCSHIM_MEM_LIMIT (set by the caller; checked here), and native without
caching (which no PyTorch setting caps) by a ballast allocation that leaves
only SIZE free on the device.
"""
import argparse
import gc
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().rstrip("b").rstrip("i")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


# ---- models ------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(mask[:t, :t] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=50304, seq=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)))

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln(x))


def make_job(args, device):
    """(model, batch_fn(batch, step) -> (inputs, targets), loss_fn)."""
    g = torch.Generator(device="cpu").manual_seed(1234)
    if args.model == "gpt":
        model = GPT(seq=args.seq, d=args.d, layers=args.layers, heads=args.heads)
        vocab = 50304

        def batch_fn(b, step):
            gen = torch.Generator(device="cpu").manual_seed(1000 + step)
            x = torch.randint(0, vocab, (b, args.seq + 1), generator=gen)
            x = x.to(device)
            return x[:, :-1], x[:, 1:]

        def loss_fn(out, y):
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    else:
        import torchvision
        model = torchvision.models.resnet50(num_classes=1000)

        def batch_fn(b, step):
            gen = torch.Generator(device="cpu").manual_seed(1000 + step)
            x = torch.randn(b, 3, args.px, args.px, generator=gen).to(device)
            y = torch.randint(0, 1000, (b,), generator=gen).to(device)
            return x, y

        def loss_fn(out, y):
            return F.cross_entropy(out, y)
    del g
    return model.to(device), batch_fn, loss_fn


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_steps(model, opt, batch_fn, loss_fn, batch, steps, first_step, device):
    """Runs `steps` steps; returns ([loss], [seconds per step])."""
    losses, times = [], []
    for s in range(first_step, first_step + steps):
        x, y = batch_fn(batch, s)
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del x, y, loss
    return losses, times


def allocator_stat(read, default=None):
    """One of PyTorch's allocator statistics, or `default` where the allocator
    keeps none: a pluggable allocator (bfcshim.torch) answers RuntimeError
    ("CUDAPluggableAllocator does not yet support getDeviceStats", torch 2.11)."""
    try:
        return read()
    except RuntimeError:
        return default


def driver_allocs(device):
    """cudaMalloc calls PyTorch has made (each tensor when caching is off)."""
    if device.type != "cuda":
        return 0
    return allocator_stat(lambda: torch.cuda.memory_stats().get("num_device_alloc", 0), 0)


# ---- modes ---------------------------------------------------------------------------

def run_steps(args, device, nvml):
    model, batch_fn, loss_fn = make_job(args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    w_losses, _ = train_steps(model, opt, batch_fn, loss_fn, args.batch, args.warmup, 0, device)
    shim_before = gpucommon.shim_totals(gpucommon.shim_stats())
    dev_before = driver_allocs(device)
    losses, times = train_steps(model, opt, batch_fn, loss_fn, args.batch, args.steps,
                                args.warmup, device)
    all_losses = w_losses + losses
    shim_after = gpucommon.shim_totals(gpucommon.shim_stats())
    res = {
        "workload": f"torch-{args.model}",
        "arm": args.arm,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        **gpucommon.step_ms(times),
        "losses": all_losses,
        "loss_digest": gpucommon.float_digest(all_losses),
        "torch_device_allocs_after_warmup": driver_allocs(device) - dev_before,
        "shim_before": shim_before,
        "shim_after": shim_after,
    }
    if args.profile_steps and device.type == "cuda":
        try:
            res.update(kernel_profile(model, opt, batch_fn, loss_fn, args, device))
        except Exception as e:  # a profiler that cannot start must not lose the run
            res["profile_error"] = f"{type(e).__name__}: {e}"
    if shim_before and shim_after:
        res["shim_region_allocs_after_warmup"] = (
            shim_after["num_region_allocs"] - shim_before["num_region_allocs"])
        # Over virtual memory near the limit: memory moved under new blocks
        # in the timed steps, the cost the pressure step weighs.
        res["shim_moved_bytes_after_warmup"] = (
            shim_after["moved_bytes_total"] - shim_before["moved_bytes_total"])
    if device.type == "cuda":
        res["torch_peak_allocated"] = allocator_stat(torch.cuda.max_memory_allocated)
        res["torch_peak_reserved"] = allocator_stat(torch.cuda.max_memory_reserved)
    return res


def kernel_profile(model, opt, batch_fn, loss_fn, args, device):
    """GPU time inside kernels and copies per step, from the profiler (CUPTI),
    over `--profile-steps` more steps: set beside the step time, it tells an
    arm whose kernels run slower (where its memory lies: caches, TLBs) from
    one whose GPU waits between kernels (time on the host: the allocator's
    calls, synchronisation)."""
    from torch.profiler import ProfilerActivity, profile

    n = args.profile_steps
    first = args.warmup + args.steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_steps(model, opt, batch_fn, loss_fn, args.batch, n, first, device)
    kernels = []
    for e in prof.key_averages():
        # self_device_time_total since torch 2.4; self_cuda_time_total before
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            kernels.append((us, e.count, e.key))
    kernels.sort(reverse=True)
    total_us = sum(k[0] for k in kernels)
    return {
        "profile_steps": n,
        "gpu_busy_ms_per_step": total_us / 1e3 / n,
        "top_kernels": [{"name": name[:80], "ms_per_step": us / 1e3 / n, "calls": c}
                        for us, c, name in kernels[:8]],
    }


def is_oom(e):
    """With caching off, PyTorch reports a failed cudaMalloc as a plain CUDA
    error (torch.AcceleratorError: CUDA error: out of memory), not as
    torch.OutOfMemoryError (seen with torch 2.11)."""
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def try_batch(model, opt, batch_fn, loss_fn, batch, device):
    try:
        train_steps(model, opt, batch_fn, loss_fn, batch, 2, 0, device)
        return True
    except RuntimeError as e:  # OutOfMemoryError and AcceleratorError are both
        if not is_oom(e):
            raise
        return False
    finally:
        opt.zero_grad(set_to_none=True)
        gc.collect()
        if device.type == "cuda" and args_caching():
            torch.cuda.empty_cache()


def args_caching():
    return os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") in ("", "0")


def apply_cap(cap, device):
    """Gives this arm `cap` bytes of device memory (see the module's doc);
    returns the ballast tensor to keep alive, if any."""
    if device.type != "cuda" or not cap:
        return None
    shim = gpucommon.shim_stats() is not None
    free, total = torch.cuda.mem_get_info()
    if shim:
        limit = parse_size(os.environ.get("BFCSHIM_MEM_LIMIT", "0"))
        if limit != cap:
            gpucommon.fail(f"under the shim the cap is BFCSHIM_MEM_LIMIT={cap} (got {limit})")
        return None
    if args_caching():
        torch.cuda.set_per_process_memory_fraction(cap / total)
        return None
    if free <= cap:
        gpucommon.fail(f"only {free} bytes free, cannot cap at {cap}")
    return torch.empty(free - cap, dtype=torch.uint8, device=device)


def run_max_batch(args, device, nvml):
    lo, hi = (int(v) for v in args.max_batch.split(":"))
    ballast = apply_cap(parse_size(args.cap) if args.cap else 0, device)
    model, batch_fn, loss_fn = make_job(args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tried = {}
    if not try_batch(model, opt, batch_fn, loss_fn, lo, device):
        best = 0
        tried[lo] = False
    else:
        tried[lo] = True
        best = lo
        # doubling, then bisection between the last fit and the first failure
        b = lo
        while b < hi:
            nb = min(hi, b * 2)
            ok = try_batch(model, opt, batch_fn, loss_fn, nb, device)
            tried[nb] = ok
            if not ok:
                hi = nb - 1
                break
            best = b = nb
        lo_fit, hi_fail = best, hi + 1
        while hi_fail - lo_fit > 1:
            mid = (lo_fit + hi_fail) // 2
            ok = try_batch(model, opt, batch_fn, loss_fn, mid, device)
            tried[mid] = ok
            if ok:
                lo_fit = mid
            else:
                hi_fail = mid
        best = lo_fit
    res = {"workload": f"torch-{args.model}-maxbatch", "arm": args.arm, "cap": args.cap,
           "max_batch": best, "tried": {str(k): v for k, v in sorted(tried.items())},
           "shim_after_search": gpucommon.shim_totals(gpucommon.shim_stats())}
    if args.then_steps and best:
        # Timed steps at the largest batch, near the limit: under the shim
        # the memory it moved meanwhile (granules remapped under new blocks)
        # and the time its pressure windows took, beside the step time.
        before = gpucommon.shim_totals(gpucommon.shim_stats())
        try:
            losses, times = train_steps(model, opt, batch_fn, loss_fn, best, args.then_steps,
                                        1000, device)
            res.update(gpucommon.step_ms(times), at_max_losses=losses)
        except RuntimeError as e:
            if not is_oom(e):
                raise
            res["at_max_error"] = "out of memory"
        after = gpucommon.shim_totals(gpucommon.shim_stats())
        res["at_max_steps"] = args.then_steps
        if before and after:
            res["at_max_shim"] = {k: after[k] - before[k] for k in (
                "moved_bytes_total", "num_pressure_maps", "pressure_map_us_total",
                "num_map_calls", "num_unmap_calls", "released_bytes_total", "num_fence_waits")}
    del ballast
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("gpt", "resnet"), default="gpt")
    ap.add_argument("--arm", default="?", help="label only, e.g. A, B, C, D")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--px", type=int, default=224)
    ap.add_argument("--max-batch", metavar="LO:HI", help="find the largest batch that fits")
    ap.add_argument("--cap", help="device memory for --max-batch, e.g. 16GiB")
    ap.add_argument("--then-steps", type=int, default=0, metavar="N",
                    help="after --max-batch, N timed steps at the largest batch (under the "
                         "shim: memory moved and the time of its pressure windows)")
    ap.add_argument("--snapshot", help="record PyTorch's memory history into this pickle")
    ap.add_argument("--profile-steps", type=int, default=0, metavar="N",
                    help="after the timed steps, N more under the profiler: GPU busy time "
                         "per step and the top kernels")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--plugin", action="store_true",
                    help="bfcshim.torch.install(): the pool as PyTorch's pluggable allocator")
    args = ap.parse_args()
    if args.plugin:
        import bfcshim.torch  # PYTHONPATH=python, BFCSHIM_LIBRARY (scripts/gpu-proof.sh)
        bfcshim.torch.install()

    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    nvml = gpucommon.NvmlPeak() if device.type == "cuda" else None
    if args.snapshot and device.type == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    t0 = time.perf_counter()
    res = run_max_batch(args, device, nvml) if args.max_batch else run_steps(args, device, nvml)
    res["wall_s"] = time.perf_counter() - t0
    if args.snapshot and device.type == "cuda":
        torch.cuda.memory._dump_snapshot(args.snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    res["nvml_peak_bytes"] = nvml.stop() if nvml else None
    res["caching"] = "bfcshim-plugin" if args.plugin else args_caching()
    res["torch"] = torch.__version__
    gpucommon.emit(res)


if __name__ == "__main__":
    main()
