"""Benchmark kernkit.ops.scale on the GPU against torch ``x * factor``: CUDA-graph time per call
and achieved bandwidth, for n from 2^10 to 2^28 elements.

    python benchmark/bench_scale.py --out DIR [--dtype bf16] [--ns 1024,1048576]

Bytes counted per call: the input read and the output written (2 x n x element size). Inputs
are rotated over enough buffers that each graph touches more than the L2 holds. The kernel is
first checked against fp32 torch arithmetic rounded once; without a GPU the script only runs
that check, on CPU tensors through the emulator. Measures and reports; asserts nothing about
speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit.ops import scale


def check(device: str, dtype: torch.dtype, factor: float) -> None:
    """``scale`` against ``(x.float() * factor).to(dtype)`` on fresh random inputs of a few
    shapes, into poisoned outputs; exits on a mismatch."""
    for shape in ((1,), (1000,), (37, 129), (3, 5, 1024)):
        x = torch.randn(shape, device=device).to(dtype)
        out = torch.full_like(x, float("nan"))
        scale(x, factor, out=out)
        if not torch.equal(out, (x.float() * factor).to(dtype)):
            sys.exit(f"scale: wrong result for shape {shape} on {device}")
    print(f"checked scale against fp32 torch on {device}", flush=True)


def time_sizes(args, dtype, ceiling) -> tuple[list, dict]:
    rows, series = [], {"kernkit": [], "torch x * factor": []}
    for n in (int(x) for x in args.ns.split(",")):
        per_call = 2 * n * dtype.itemsize
        calls = common.calls_for(per_call, max_calls=200)
        xs = torch.randn(calls, n, device="cuda").to(dtype)
        outs = torch.empty_like(xs)
        kk = common.graph_time_us([lambda c=c, xs=xs, outs=outs: scale(xs[c], args.factor, out=outs[c])
                                   for c in range(calls)])
        th = common.graph_time_us([lambda c=c, xs=xs, outs=outs: torch.mul(xs[c], args.factor, out=outs[c])
                                   for c in range(calls)])
        for name, us in (("kernkit", kk), ("torch x * factor", th)):
            series[name].append(per_call / (us * 1e-6) / 1e12)
        rows.append([n, kk, th, series["kernkit"][-1], series["torch x * factor"][-1]])
        print(f"n={n:>10}  kernkit {kk:9.2f} us  torch {th:9.2f} us", flush=True)
        del xs, outs
        torch.cuda.empty_cache()
    return rows, series


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--ns", default=",".join(str(1 << k) for k in range(10, 29, 2)))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--factor", type=float, default=1.25)
    args = p.parse_args()
    dtype = common.DTYPES[args.dtype]
    gpu = torch.cuda.is_available()
    check("cuda" if gpu else "cpu", dtype, args.factor)
    if not gpu:
        print("no CUDA GPU: checked the kernel on the CPU emulator; the timings need a GPU")
        return

    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    rows, series = time_sizes(args, dtype, ceiling)
    x = torch.randn(1024, device="cuda").to(dtype)
    host = common.host_us({"scale": lambda: scale(x, args.factor)}, rounds=7)["scale"]

    lines = common.header(f"scale ({args.dtype})", common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s", f"- host cost per scale call (1024 elements, "
              f"allocating): {host:.2f} us", ""]
    lines += common.markdown_table(["n", "kernkit us", "torch us", "kernkit TB/s", "torch TB/s"], rows)
    common.write_report(args.out, f"scale_{args.dtype}.md", lines)
    common.plot_bandwidth(args.out / f"scale_{args.dtype}.png", f"scale {args.dtype}", [r[0] for r in rows], series,
                          ceiling)


if __name__ == "__main__":
    main()
