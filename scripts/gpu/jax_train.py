#!/usr/bin/env python3
"""jax_train.py - a JAX training job for A/B runs of the allocator.

A jitted training step of a residual MLP stack (one large fused program, as
JAX users write it) followed by a few eager operations per step (each its
own buffers), on inputs drawn from a fixed key. Run it with JAX's own BFC
allocator, with XLA_PYTHON_CLIENT_ALLOCATOR=platform (one cuMemAlloc_v2 per
buffer), and with platform under libbfcshim.so (the shim's driver door
serves those calls from its pool).

Prints one `RESULT {json}` line: median step time after warm-up, the
losses and their digest, NVML's peak, JAX's memory_stats() where the
allocator keeps them, and the shim's pool statistics when it is loaded.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="?")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()

    nvml = gpucommon.NvmlPeak()
    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    key = jax.random.PRNGKey(0)
    keys = jax.random.split(key, args.layers + 2)
    params = [jax.random.normal(k, (args.width, args.width), jnp.float32) / args.width ** 0.5
              for k in keys[:args.layers]]
    x_all = jax.random.normal(keys[-2], (args.batch, args.width), jnp.float32)
    y_all = jax.random.normal(keys[-1], (args.batch, args.width), jnp.float32)

    def loss_fn(ps, x, y):
        h = x
        for w in ps:
            h = h + jnp.tanh(h @ w)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def step(ps, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
        return [w - 1e-3 * g for w, g in zip(ps, grads)], loss

    losses, times = [], []
    for s in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        # eager work between steps: a shifted batch, built op by op
        x = jnp.roll(x_all, s, axis=0) * (1.0 + 0.01 * s)
        y = jnp.roll(y_all, s, axis=0)
        params, loss = step(params, x, y)
        loss = float(loss.block_until_ready())
        dt = time.perf_counter() - t0
        losses.append(loss)
        if s >= args.warmup:
            times.append(dt)
    try:
        mstats = dev.memory_stats() or {}
    except Exception:  # platform allocator keeps none on some versions
        mstats = {}
    res = {
        "workload": "jax-mlp",
        "arm": args.arm,
        "jax": jax.__version__,
        "allocator_env": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
        **gpucommon.step_ms(times),
        "losses": losses,
        "loss_digest": gpucommon.float_digest(losses),
        "jax_peak_bytes_in_use": mstats.get("peak_bytes_in_use"),
        "jax_bytes_limit": mstats.get("bytes_limit"),
        # all of XLA's figures, to set beside the shim's pool bytes and its
        # bytes_lent (what XLA made with cuMemCreate, out of the pool's limit)
        "jax_memory_stats": {k: v for k, v in mstats.items() if isinstance(v, (int, float))},
        "xla_preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        "shim": gpucommon.shim_totals(gpucommon.shim_stats()),
        "nvml_peak_bytes": nvml.stop(),
    }
    gpucommon.emit(res)


if __name__ == "__main__":
    main()
