#!/usr/bin/env python3
"""torch_ddp.py - two (or more) ranks on one GPU under torchrun, gloo
backend, DistributedDataParallel over a small MLP; each rank capped by the
shim's BFCSHIM_MEM_FRACTION when it is preloaded. Both ranks must finish with
the same parameters (DDP keeps them in step). Rank 0 prints one
`RESULT {json}` line; every rank prints its own pool statistics.

  torchrun --standalone --nproc_per_node=2 scripts/gpu/torch_ddp.py
"""
import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="?")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
    gen = torch.Generator(device="cpu").manual_seed(100 + rank)
    for _ in range(args.steps):
        x = torch.randn(256, 1024, generator=gen).to(device)
        loss = (ddp(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    digest = hashlib.sha1(flat.numpy().tobytes()).hexdigest()[:16]
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    shim = gpucommon.shim_totals(gpucommon.shim_stats())
    print(f"rank {rank}: loss {loss.item():.6f}, params {digest}, shim {shim}", flush=True)
    if rank == 0:
        gpucommon.emit({"workload": "torch-ddp-gloo", "arm": args.arm, "world": world,
                        "params_agree": len(set(digests)) == 1, "final_loss": loss.item(),
                        "shim_rank0": shim,
                        "fraction": os.environ.get("BFCSHIM_MEM_FRACTION")})
    dist.destroy_process_group()
    if len(set(digests)) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
