"""Benchmark kernkit.ops.silu_and_mul / gelu_and_mul on the GPU against torch eager and
torch.compile of the same function: CUDA-graph time per call and achieved bandwidth, for d =
4096 and 5120 and 1 to 16384 tokens.

    python benchmark/bench_act_and_mul.py --out DIR [--dtype bf16] [--ds 4096,5120] [--tokens 1,16]
                                         [--acts silu,gelu,gelu_tanh] [--no-compile]

Bytes counted per call: x read once and out written once (``tokens x 3 d x element size``).
Inputs are rotated over enough buffers that each graph touches more than the L2 holds. The
kernels are first checked against the float64 formulas within their documented tolerance;
without a GPU the script only runs that check, on CPU tensors through the emulator. Measures
and reports; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import common

from kernkit.ops import gelu_and_mul, silu_and_mul

ACTS = ("silu", "gelu", "gelu_tanh")


def kernkit_fn(act: str):
    """The kernkit call of ``act``: ``(x, out) -> out``."""
    if act == "silu":
        return lambda x, out=None: silu_and_mul(x, out=out)
    approximate = "tanh" if act == "gelu_tanh" else "none"
    return lambda x, out=None: gelu_and_mul(x, approximate, out=out)


def torch_fn(act: str):
    """The same function in torch: ``act(x[..., :d]) * x[..., d:]``."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        g, u = x[..., :d], x[..., d:]
        if act == "silu":
            return F.silu(g) * u
        return F.gelu(g, approximate="tanh" if act == "gelu_tanh" else "none") * u
    return fn


def check(device: str, dtype: torch.dtype, acts) -> None:
    """Each op against the float64 formula (``kernkit.testing.ops.act_and_mul``) within its
    documented bound, on fresh random inputs of a few shapes (strided rows among them), into poisoned outputs;
    exits on a mismatch."""
    from kernkit.testing.ops import act_and_mul as ref
    for act in acts:
        for shape in ((1, 16), (37, 258), (3, 5, 2048)):
            wide = torch.randn(*shape[:-1], shape[-1] + 8, device=device).mul(3).to(dtype)
            for x in (wide[..., : shape[-1]], wide[..., 1 : shape[-1] + 1]):
                out = torch.full((*shape[:-1], shape[-1] // 2), float("nan"), device=device, dtype=dtype)
                kernkit_fn(act)(x, out)
                xc, want = x.cpu(), ref.ref_act_and_mul(x.cpu(), act)
                if not bool(((out.cpu().double() - want).abs() <= ref.act_and_mul_bound(xc, want, act)).all()):
                    sys.exit(f"{act}_and_mul: result outside the documented tolerance for shape {shape} on {device}")
    print(f"checked {', '.join(acts)} against the float64 formulas on {device}", flush=True)


def time_case(act: str, dtype: torch.dtype, tokens: int, d: int, compiled) -> tuple[float, float, float, int]:
    """kernkit, torch eager and torch.compile microseconds per call, and bytes per call."""
    per_call = tokens * 3 * d * dtype.itemsize
    calls = common.calls_for(per_call, max_calls=200)
    xs = torch.randn(calls, tokens, 2 * d, device="cuda").to(dtype)
    outs = torch.empty(calls, tokens, d, device="cuda", dtype=dtype)
    kk_call, eager = kernkit_fn(act), torch_fn(act)
    fns = {"kernkit": lambda c, xs=xs, outs=outs: kk_call(xs[c], outs[c]), "torch eager": lambda c, xs=xs: eager(xs[c])}
    if compiled is not None:
        fns["torch.compile"] = lambda c, xs=xs: compiled(xs[c])
    us = common.graph_times_us_by(fns, calls)
    kk, th, tc = us["kernkit"], us["torch eager"], us.get("torch.compile", float("nan"))
    del xs, outs
    torch.cuda.empty_cache()
    return kk, th, tc, per_call


def run_all(args, dtype, ceiling) -> list[list]:
    common.allow_recompiles()
    rows = []
    for act in args.acts.split(","):
        compiled = None if args.no_compile else torch.compile(torch_fn(act), dynamic=False)
        for d in (int(v) for v in args.ds.split(",")):
            for tokens in (int(v) for v in args.tokens.split(",")):
                kk, th, tc, nbytes = time_case(act, dtype, tokens, d, compiled)
                tbs = [nbytes / (us * 1e-6) / 1e12 for us in (kk, th, tc)]
                rows.append([act, d, tokens, kk, th, tc, tbs[0], 100 * tbs[0] / ceiling, tbs[1], tbs[2]])
                print(f"{act:>9} d={d:>5} tokens={tokens:>6}  kernkit {kk:8.2f} us  eager {th:8.2f} us  "
                      f"compile {tc:8.2f} us  kernkit {tbs[0]:.2f} TB/s", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--ds", default="4096,5120", help="d: the width of out (x has 2 d)")
    p.add_argument("--tokens", default="1,16,64,256,1024,4096,16384")
    p.add_argument("--acts", default=",".join(ACTS))
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile column")
    args = p.parse_args()
    dtype = common.DTYPES[args.dtype]
    gpu = torch.cuda.is_available()
    check("cuda" if gpu else "cpu", dtype, args.acts.split(","))
    if not gpu:
        print("no CUDA GPU: checked the kernels on the CPU emulator; the timings need a GPU")
        return

    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    rows = run_all(args, dtype, ceiling)
    x = torch.randn(16, 2 * 4096, device="cuda").to(dtype)
    host = common.host_us({"silu_and_mul": lambda: silu_and_mul(x)}, rounds=7)["silu_and_mul"]

    lines = common.header(f"silu_and_mul / gelu_and_mul ({args.dtype})", common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s (bytes read + written, measured in this run)",
              f"- host cost per silu_and_mul call (16 x 8192, allocating): {host:.2f} us",
              "- bytes per call: x read once + out written once = tokens x 3 d x element size", ""]
    lines += common.markdown_table(["act", "d", "tokens", "kernkit us", "torch eager us", "torch.compile us",
                                    "kernkit TB/s", "kernkit % of copy", "eager TB/s", "compile TB/s"], rows)
    common.write_report(args.out, f"activation_{args.dtype}.md", lines)


if __name__ == "__main__":
    main()
