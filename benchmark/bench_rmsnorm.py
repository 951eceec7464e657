"""Benchmark kernkit.ops.rmsnorm and kernkit.ops.fused_add_rmsnorm on the GPU against the same
torch function run eagerly and through torch.compile: CUDA-graph time per call and achieved
bandwidth, for hidden sizes 4096 (Llama-3-8B) and 5120 (Qwen) and 1 to 16384 tokens.

    python benchmark/bench_rmsnorm.py --out DIR [--dtype bf16] [--hiddens 4096,5120] [--tokens 1,16,...]

Bytes counted per call, each once: rmsnorm reads x and weight and writes out
(2 x tokens x hidden + hidden elements); fused_add_rmsnorm reads x, residual and weight and
writes x and residual (4 x tokens x hidden + hidden). Inputs are rotated over enough buffers
that each graph touches more than the L2 holds. The kernels are first checked against the torch
reference (bit for bit against the kernel-order fp32 reference of ``kernkit.testing.ops.rmsnorm``,
and within the docstrings' tolerance of float64); without a GPU the script only runs that check, on
CPU tensors through the emulator. Measures and reports; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit.ops import fused_add_rmsnorm, rmsnorm

EPS = 1e-6


def torch_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The torch function timed eagerly and compiled: fp32 math, rounded once."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def torch_fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> None:
    """In place, as kernkit's: residual = x + residual (rounded); x = rmsnorm of the fp32 sum."""
    s = x.float() + residual.float()
    residual.copy_(s)
    x.copy_(s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float())


def _fail(what: str) -> None:
    sys.exit(f"norm: {what}")


def check(device: str, dtype: torch.dtype, hiddens: list[int]) -> None:
    """Both ops against the references on fresh random inputs of a few shapes, into poisoned
    outputs; exits on a mismatch."""
    from kernkit.testing.ops import rmsnorm as ref
    for hidden in hiddens:
        for lead in ((1,), (37,), (3, 5)):
            x = torch.randn(*lead, hidden).mul(3).to(dtype)
            r = torch.randn(*lead, hidden).to(dtype)
            w = torch.randn(hidden).to(dtype)
            out = torch.full_like(x, float("nan"), device=device)
            rmsnorm(x.to(device), w.to(device), EPS, out=out)
            want = torch.empty_like(x)
            ref.ref_rmsnorm(want, x, w, EPS)
            if not torch.equal(out.cpu(), want):
                _fail(f"rmsnorm differs from the reference for {dtype} {[*lead, hidden]} on {device}")
            exact = ref.rmsnorm64(x, w, EPS)
            if ((out.cpu().double() - exact).abs() > ref.rmsnorm_bound(exact, dtype)).any():
                _fail(f"rmsnorm outside its tolerance for {dtype} {[*lead, hidden]}")
            xd, rd = x.to(device), r.to(device)
            fused_add_rmsnorm(xd, rd, w.to(device), EPS)
            ref.ref_fused_add_rmsnorm(x, r, w, EPS)
            if not (torch.equal(xd.cpu(), x) and torch.equal(rd.cpu(), r)):
                _fail(f"fused_add_rmsnorm differs from the reference for {dtype} {[*lead, hidden]} on {device}")
    print(f"checked rmsnorm and fused_add_rmsnorm against the torch reference on {device}", flush=True)


def time_rmsnorm(dtype, hidden, tokens, compiled) -> tuple[int, dict[str, float]]:
    """Per-call us of kernkit, torch eager and torch.compile for one shape; the bytes per call."""
    e = dtype.itemsize
    per_call = (2 * tokens * hidden + hidden) * e
    calls = common.calls_for(per_call, max_calls=400)
    xs = torch.randn(calls, tokens, hidden, device="cuda").to(dtype)
    outs = torch.empty_like(xs)
    w = torch.randn(hidden, device="cuda").to(dtype)
    res = common.graph_times_us_by({"kernkit": lambda c, xs=xs, outs=outs: rmsnorm(xs[c], w, EPS, out=outs[c]),
                                    "torch eager": lambda c, xs=xs: torch_rmsnorm(xs[c], w),
                                    "torch.compile": lambda c, xs=xs: compiled(xs[c], w)}, calls)
    del xs, outs
    torch.cuda.empty_cache()
    return per_call, res


def time_fused(dtype, hidden, tokens, compiled) -> tuple[int, dict[str, float]]:
    e = dtype.itemsize
    per_call = (4 * tokens * hidden + hidden) * e
    calls = common.calls_for(per_call, max_calls=400)
    xs = torch.randn(calls, tokens, hidden, device="cuda").to(dtype)
    rs = torch.randn(calls, tokens, hidden, device="cuda").to(dtype)
    w = torch.randn(hidden, device="cuda").to(dtype)
    res = common.graph_times_us_by({"kernkit": lambda c, xs=xs, rs=rs: fused_add_rmsnorm(xs[c], rs[c], w, EPS),
                                    "torch eager": lambda c, xs=xs, rs=rs: torch_fused_add_rmsnorm(xs[c], rs[c], w),
                                    "torch.compile": lambda c, xs=xs, rs=rs: compiled(xs[c], rs[c], w)}, calls)
    del xs, rs
    torch.cuda.empty_cache()
    return per_call, res


def run_op(name, timer, compiled, dtype, hiddens, tokens_list, ceiling) -> list[str]:
    """The table of one op: per shape the three times, their TB/s and % of the copy bandwidth."""
    rows = []
    for hidden in hiddens:
        for tokens in tokens_list:
            nbytes, res = timer(dtype, hidden, tokens, compiled)
            rows.append(common.bandwidth_row(f"{name} hidden={hidden:>5} tokens={tokens:>6}", [hidden, tokens], res,
                                             nbytes, ceiling, {}))
    return [f"## {name}", ""] + common.markdown_table(["hidden", "tokens", *common.BANDWIDTH_COLUMNS], rows) + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--hiddens", default="4096,5120")
    p.add_argument("--tokens", default="1,16,64,256,1024,4096,16384")
    args = p.parse_args()
    dtype = common.DTYPES[args.dtype]
    hiddens = [int(h) for h in args.hiddens.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    gpu = torch.cuda.is_available()
    check("cuda" if gpu else "cpu", dtype, hiddens)
    if not gpu:
        print("no CUDA GPU: checked the kernels on the CPU emulator; the timings need a GPU")
        return

    common.allow_recompiles()
    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    lines = common.header(f"rmsnorm and fused_add_rmsnorm ({args.dtype})", common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s (bytes read + written), measured in this run",
              f"- eps {EPS}; torch eager and torch.compile run the same function (fp32 math, rounded once)", ""]
    compiled_norm = torch.compile(torch_rmsnorm, dynamic=False)
    compiled_fused = torch.compile(torch_fused_add_rmsnorm, dynamic=False)
    lines += run_op("rmsnorm", time_rmsnorm, compiled_norm, dtype, hiddens, tokens, ceiling)
    lines += run_op("fused_add_rmsnorm", time_fused, compiled_fused, dtype, hiddens, tokens, ceiling)
    common.write_report(args.out, f"norm_{args.dtype}.md", lines)


if __name__ == "__main__":
    main()
