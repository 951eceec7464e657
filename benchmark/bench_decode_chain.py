"""A decode step's chain of small kernels in one CUDA graph, with and without Programmatic
Dependent Launch: ``fused_add_rmsnorm`` -> ``per_token_quant_fp8`` -> a stand-in for the
projection (``scale`` of a K/V-sized tensor) -> ``store_cache``, at batch 1, 64 and 512.

    python benchmark/bench_decode_chain.py --out DIR [--batches 1,64,512]

Each variant runs in a process of its own, twice, interleaved: without PDL the child replaces
the ops' choice (they pick PDL from the GPU) before its first call. A child times every batch. Inputs are
rotated over enough buffers that each graph touches more than the L2 holds. Times are the
median per chain. Measures and reports; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

import common

HIDDEN = 4096
HEADS, HEAD_DIM = 8, 128  # Llama-3-8B's K/V rows
POOL = 1 << 16


def child(batches: list[int], pdl: bool) -> list[float]:
    """Median microseconds per chain for each batch size, PDL as asked."""
    import importlib

    from kernkit import ops

    if not pdl:
        for name in ("norm", "quant", "elementwise", "kvcache"):
            importlib.import_module(f"kernkit.ops.{name}").is_arch_support_pdl = lambda: False
    return [chain_us(ops, batch) for batch in batches]


def chain_us(ops, batch: int) -> float:
    """Median microseconds per chain at one batch size."""
    dt = torch.bfloat16
    per_chain = batch * HIDDEN * dt.itemsize * 6 + batch * 2 * HEADS * HEAD_DIM * dt.itemsize * 4
    calls = common.calls_for(per_chain, max_calls=100)
    weight = torch.randn(HIDDEN, device="cuda").to(dt)
    xs = torch.randn(calls, batch, HIDDEN, device="cuda").to(dt)
    res = torch.randn(calls, batch, HIDDEN, device="cuda").to(dt)
    kv_in = torch.randn(calls, batch, 2, HEADS, HEAD_DIM, device="cuda").to(dt)
    kv = torch.empty_like(kv_in)
    k_cache = torch.zeros(POOL, HEADS, HEAD_DIM, device="cuda", dtype=dt)
    v_cache = torch.zeros_like(k_cache)
    idx = torch.randperm(POOL, device="cuda")[: calls * batch].view(calls, batch).to(torch.int32)

    def step(c: int) -> None:
        ops.fused_add_rmsnorm(xs[c], res[c], weight)
        ops.per_token_quant_fp8(xs[c])
        ops.scale(kv_in[c], 1.0, out=kv[c])
        ops.store_cache(k_cache, v_cache, idx[c], kv[c, :, 0], kv[c, :, 1])

    return common.graph_time_us([lambda c=c: step(c) for c in range(calls)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--batches", default="1,64,512")
    p.add_argument("--child", metavar="PDL", help=argparse.SUPPRESS)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(child(batches, args.child == "on")))
        return
    if not torch.cuda.is_available():
        sys.exit("bench_decode_chain: needs a CUDA GPU")
    times = {"off": [], "on": []}
    for pdl in ("off", "on", "off", "on"):  # interleaved, two runs each
        out = subprocess.run([sys.executable, __file__, "--child", pdl, "--batches", args.batches],
                             capture_output=True, text=True, check=True).stdout
        times[pdl].append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for i, batch in enumerate(batches):
        runs_off, runs_on = [t[i] for t in times["off"]], [t[i] for t in times["on"]]
        off, on = min(runs_off), min(runs_on)
        rows.append([batch, off, on, off - on, ", ".join(f"{t:.2f}" for t in runs_off + runs_on)])
        print(f"batch {batch:>4}: without PDL {off:.2f} us, with PDL {on:.2f} us", flush=True)
    lines = common.header("A decode step's kernel chain in one CUDA graph, with and without PDL",
                          common.command_line())
    lines += [f"Chain: fused_add_rmsnorm -> per_token_quant_fp8 -> scale (stand-in) -> store_cache; hidden "
              f"{HIDDEN} bf16, K/V rows {HEADS}x{HEAD_DIM} bf16. Per chain, us (the better of two processes "
              "each, all runs listed):", ""]
    lines += common.markdown_table(["batch", "without PDL", "with PDL", "saved", "runs (off, off, on, on)"], rows)
    common.write_report(args.out, "decode_chain.md", lines)


if __name__ == "__main__":
    main()
