"""Benchmark kernkit.ops.per_token_quant_fp8 on the GPU against the same quantization in torch
eager and through torch.compile: CUDA-graph time per call and achieved bandwidth, for hidden
sizes 4096 and 5120 (Llama-3-8B's and Qwen's widths) and 14336 (Llama-3-8B's MLP width), from
1 to 16384 tokens.

    python benchmark/bench_per_token_quant_fp8.py --out DIR [--dtype bf16] [--hidden 4096,5120,14336]
                                                  [--tokens 1,16,...]

Bytes counted per call: the input read once, the fp8 output and the fp32 scales written once
(tokens x (hidden x (element size + 1) + 4)). Inputs are rotated over enough buffers that each
graph touches more than the L2 holds. The torch function is the op's reference
(``kernkit.testing.ops.per_token_quant_fp8``), which computes the same bits; torch.compile compiles it once per
shape. The kernel is first checked bit for bit against that reference; without a GPU the
script only runs that check, on CPU tensors through the emulator. Measures and reports;
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit.ops import per_token_quant_fp8

TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
HIDDEN = (4096, 5120, 14336)


def check(device: str, dtype: torch.dtype, hiddens: list[int]) -> None:
    """``per_token_quant_fp8`` against the reference on fresh random rows of a few shapes (a
    zero row included), into poisoned outputs; exits on a mismatch."""
    from kernkit.testing.ops import per_token_quant_fp8 as ref
    for hidden in hiddens:
        for shape in ((1, hidden), (5, hidden), (2, 3, hidden)):
            x = torch.randn(shape, device=device).to(dtype)
            x[0] = 0
            out = torch.full(shape, float("nan"), device=device).to(torch.float8_e4m3fn)
            q, scales = per_token_quant_fp8(x, out=out)
            want_q, want_scales = ref.ref_per_token_quant_fp8(x)
            if not (torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scales, want_scales)):
                sys.exit(f"per_token_quant_fp8: wrong result for shape {shape} on {device}")
    print(f"checked per_token_quant_fp8 against the fp32 torch reference on {device}", flush=True)


def time_shapes(args, dtype, ceiling) -> tuple[list, dict]:
    """Rows of the report and, per hidden size, the TB/s series of each method."""
    from kernkit.testing.ops import per_token_quant_fp8 as ref
    eager = ref.ref_per_token_quant_fp8
    compiled = torch.compile(ref.ref_per_token_quant_fp8, dynamic=False)
    rows, series = [], {}
    for hidden in args.hidden:
        s = series.setdefault(hidden, {})
        for tokens in args.tokens:
            per_call = tokens * (hidden * (dtype.itemsize + 1) + 4)
            calls = common.calls_for(per_call, max_calls=200)
            xs = torch.randn(calls, tokens, hidden, device="cuda").to(dtype)
            outs = torch.empty(calls, tokens, hidden, device="cuda", dtype=torch.float8_e4m3fn)
            fns = {"kernkit": lambda c, xs=xs, outs=outs: per_token_quant_fp8(xs[c], out=outs[c]),
                   "torch eager": lambda c, xs=xs: eager(xs[c]),
                   "torch.compile": lambda c, xs=xs: compiled(xs[c])}
            rows.append(common.bandwidth_row(f"tokens={tokens:>6} hidden={hidden:>6}", [tokens, hidden],
                                             common.graph_times_us_by(fns, calls), per_call, ceiling, s))
            del xs, outs
            torch.cuda.empty_cache()
    return rows, series


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--hidden", default=",".join(map(str, HIDDEN)))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = p.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",")]
    args.tokens = [int(t) for t in args.tokens.split(",")]
    dtype = common.DTYPES[args.dtype]
    gpu = torch.cuda.is_available()
    check("cuda" if gpu else "cpu", dtype, args.hidden)
    if not gpu:
        print("no CUDA GPU: checked the kernel on the CPU emulator; the timings need a GPU")
        return

    common.allow_recompiles()
    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    rows, series = time_shapes(args, dtype, ceiling)
    x = torch.randn(16, args.hidden[0], device="cuda").to(dtype)
    host = common.host_us({"quant": lambda: per_token_quant_fp8(x)}, rounds=7)["quant"]

    lines = common.header(f"per_token_quant_fp8 ({args.dtype})", common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s (measured in this run)",
              f"- host cost per call (16 x {args.hidden[0]}, allocating q and scales): {host:.2f} us",
              "- bytes per call: tokens x (hidden x (element size + 1) + 4), read + written once", ""]
    lines += common.markdown_table(["tokens", "hidden", *common.BANDWIDTH_COLUMNS], rows)
    common.write_report(args.out, f"per_token_quant_fp8_{args.dtype}.md", lines)
    for hidden, s in series.items():
        common.plot_bandwidth(args.out / f"per_token_quant_fp8_{args.dtype}_h{hidden}.png",
                              f"per_token_quant_fp8 {args.dtype}, hidden {hidden}", args.tokens, s, ceiling)


if __name__ == "__main__":
    main()
