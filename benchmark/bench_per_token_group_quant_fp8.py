"""Benchmark kernkit.ops.per_token_group_quant_fp8 on the GPU against the same quantization in
torch eager and through torch.compile: CUDA-graph time per call and achieved bandwidth, for hidden
sizes 4096 (Llama-3-8B's width) and 7168 (DeepSeek-V3's), groups of 128, 1 to 16384 tokens,
row-major scales (or column-major, TMA-aligned, with ``--column-major``).

    python benchmark/bench_per_token_group_quant_fp8.py --out DIR [--dtype bf16] [--hidden 4096,7168]
                                                        [--tokens 1,16,...] [--column-major]

Bytes counted per call: the input read once, the fp8 output and the fp32 scales written once
(tokens x (hidden x (element size + 1) + 4 x hidden / 128)); the padding of the column-major
layout is not written and not counted. Inputs are rotated over enough buffers that each graph
touches more than the L2 holds. kernkit writes q into ``out=`` and allocates the scales it
returns; the torch function allocates both. The torch function is sglang's formula (``scale =
max(amax, eps) / 448``, ``q = saturate_e4m3(x / scale)``, fp32 IEEE divisions), its scales in the
op's layout; torch.compile compiles it once per shape. The kernel is first checked bit for bit
against the torch reference (``ref_per_token_group_quant_fp8`` of
``kernkit.testing.ops.per_token_group_quant_fp8``) in both scale layouts, and so is the torch
function timed below; without a GPU the script only runs that check, on CPU tensors through the
emulator. Measures and reports; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit.ops import per_token_group_quant_fp8

TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
HIDDEN = (4096, 7168)
GROUP_SIZE = 128
EPS = 1e-10
FP8_MAX = 448.0


def torch_group_quant(x: torch.Tensor, group_size: int = GROUP_SIZE, column_major: bool = False,
                      eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch function timed eagerly and compiled: ``(q, scales)`` of the 2-d ``x``, the scales
    row-major ``[tokens, groups]`` or, with ``column_major``, column-major with the tokens padded
    to 4, as the op lays them out."""
    tokens, hidden = x.shape
    xg = x.float().unflatten(-1, (-1, group_size))
    amax = xg.abs().amax(-1, keepdim=True).clamp(min=eps)
    scales = amax / torch.full_like(amax, FP8_MAX)  # an IEEE division, as the op's (not by a reciprocal)
    q = (xg / scales).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).flatten(-2)
    scales = scales.squeeze(-1)
    if not column_major:
        return q, scales
    out = torch.empty(hidden // group_size, -(-tokens // 4) * 4, device=x.device).t()[:tokens]
    out.copy_(scales)
    return q, out


def _same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """The same q bits and scales, the scales also of the same strides."""
    (q, s), (want_q, want_s) = got, want
    return (torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8)) and s.stride() == want_s.stride()
            and torch.equal(s.cpu(), want_s))


def check(device: str, dtype: torch.dtype, hiddens: list[int]) -> None:
    """``per_token_group_quant_fp8`` and ``torch_group_quant`` against the reference on fresh random
    rows of a few shapes (a zero row included), in both scale layouts, q into poisoned outputs;
    exits on a mismatch."""
    from kernkit.testing.ops import per_token_group_quant_fp8 as ref
    for hidden in hiddens:
        for tokens in (1, 5, 33):
            x = torch.randn(tokens, hidden).mul(torch.exp2(torch.randint(-8, 9, (tokens, 1)).float())).to(dtype)
            x[0, : hidden // 2] = 0
            for column_major in (False, True):
                want = ref.ref_per_token_group_quant_fp8(x, GROUP_SIZE, column_major, eps=EPS)
                out = torch.full((tokens, hidden), float("nan"), device=device).to(torch.float8_e4m3fn)
                got = per_token_group_quant_fp8(x.to(device), GROUP_SIZE, column_major_scales=column_major, eps=EPS,
                                                out=out)
                layout = "column-major" if column_major else "row-major"
                if not _same(got, want):
                    sys.exit(f"per_token_group_quant_fp8: wrong result for {[tokens, hidden]}, {layout} scales, "
                             f"on {device}")
                if not _same(torch_group_quant(x.to(device), GROUP_SIZE, column_major), want):
                    sys.exit(f"per_token_group_quant_fp8: the torch function differs from the reference for "
                             f"{[tokens, hidden]}, {layout} scales, on {device}")
    print(f"checked per_token_group_quant_fp8 against the torch reference on {device}", flush=True)


def time_shapes(args, dtype, ceiling) -> tuple[list, dict]:
    """Rows of the report and, per hidden size, the TB/s series of each method."""
    cm = args.column_major
    compiled = torch.compile(torch_group_quant, dynamic=False)
    rows, series = [], {}
    for hidden in args.hidden:
        s = series.setdefault(hidden, {})
        for tokens in args.tokens:
            per_call = tokens * (hidden * (dtype.itemsize + 1) + 4 * (hidden // GROUP_SIZE))
            calls = common.calls_for(per_call, max_calls=200)
            xs = torch.randn(calls, tokens, hidden, device="cuda").to(dtype)
            outs = torch.empty(calls, tokens, hidden, device="cuda", dtype=torch.float8_e4m3fn)
            fns = {"kernkit": lambda c, xs=xs, outs=outs: per_token_group_quant_fp8(
                       xs[c], GROUP_SIZE, column_major_scales=cm, eps=EPS, out=outs[c]),
                   "torch eager": lambda c, xs=xs: torch_group_quant(xs[c], GROUP_SIZE, cm),
                   "torch.compile": lambda c, xs=xs: compiled(xs[c], GROUP_SIZE, cm)}
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
    p.add_argument("--column-major", action="store_true",
                   help="column-major scales, tokens padded to 4 (DeepGEMM's TMA layout); default row-major")
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
    host = common.host_us({"quant": lambda: per_token_group_quant_fp8(x, GROUP_SIZE,
                                                                      column_major_scales=args.column_major)},
                          rounds=7)["quant"]

    layout = "column-major" if args.column_major else "row-major"
    stem = f"per_token_group_quant_fp8_{args.dtype}" + ("_column_major" if args.column_major else "")
    lines = common.header(f"per_token_group_quant_fp8 ({args.dtype}, group {GROUP_SIZE}, {layout} scales)",
                          common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s (measured in this run)",
              f"- host cost per call (16 x {args.hidden[0]}, allocating q and scales): {host:.2f} us",
              f"- bytes per call: tokens x (hidden x (element size + 1) + 4 x hidden / {GROUP_SIZE}), read + written "
              "once",
              f"- eps {EPS}; torch eager and torch.compile run the same function (sglang's formula, the op's bits)", ""]
    lines += common.markdown_table(["tokens", "hidden", *common.BANDWIDTH_COLUMNS], rows)
    common.write_report(args.out, f"{stem}.md", lines)
    for hidden, s in series.items():
        common.plot_bandwidth(args.out / f"{stem}_h{hidden}.png",
                              f"per_token_group_quant_fp8 {args.dtype} {layout}, hidden {hidden}", args.tokens, s,
                              ceiling)


if __name__ == "__main__":
    main()
