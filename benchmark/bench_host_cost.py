"""Host cost per call of kernkit's ops: the plain Python functions (the eager path) against the
torch.library custom ops (torch.ops.kernkit.*) and the module function of the same kernel
called directly (what the op's ``_module`` factory returns).

    python benchmark/bench_host_cost.py [--out DIR] [--device cuda|cpu] [--n 64] [--calls 2000]

Each figure is the wall time per call of ``--calls`` calls issued back to back (no
synchronization between them), the best of 15 rounds, the variants' rounds interleaved. On a
GPU the ops run for real on CUDA tensors (default n=64 rows of 8 x 128 bf16, 2 KB). Without a GPU
(or with ``--device cpu``) it is a CPU proxy: CPU tensors through the emulator builds with n=0
rows by default, so the launchers validate every tensor and return before launching and the
figures are the Python, tvm-ffi and dispatcher overhead alone (the emulator's work would
otherwise dominate). compare_key is a host op and always runs on 64 tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.compiler import is_compiling, is_dynamo_compiling

import common

from kernkit import ops
from kernkit.ops.compare_key import _module as compare_key_module
from kernkit.ops.indexing import _module as indexing_module
from kernkit.ops.scale import _module as scale_module
from kernkit.ops.store_cache import _module as store_cache_module

VARIANTS = ("plain", "torch.ops", "torch.ops .default", "module function")


def check_cost_ns(check: Callable[[], bool], calls: int = 1_000_000) -> float:
    """Extra time of ``if check(): ...`` over an empty loop body, per call, in ns (median of 7)."""

    def with_check():
        for _ in range(calls):
            if check():
                pass

    def without():
        for _ in range(calls):
            pass

    diffs = []
    for _ in range(7):
        t0 = time.perf_counter()
        with_check()
        t1 = time.perf_counter()
        without()
        t2 = time.perf_counter()
        diffs.append(((t1 - t0) - (t2 - t1)) / calls * 1e9)
    return statistics.median(diffs)


def cases(dev: str, n: int, heads: int, head_dim: int) -> dict[str, tuple[Callable, ...]]:
    """Per op: the plain function, the custom op, its ``.default`` overload and the module
    function, each a call on the same prepared tensors."""
    dtype, hidden, pool = torch.bfloat16, heads * head_dim, 4096
    kc = torch.randn(pool, heads, head_dim, device=dev).to(dtype)
    vc = torch.randn_like(kc)
    k, v = torch.randn(n, heads, head_dim, device=dev).to(dtype), torch.randn(n, heads, head_dim, device=dev).to(dtype)
    idx = torch.randperm(pool, device=dev)[:n].to(torch.int32)
    weight = torch.randn(32000, hidden, device=dev).to(dtype)
    ids = torch.randint(0, 32000, (n,), device=dev, dtype=torch.int32)
    emb = torch.empty(n, hidden, device=dev, dtype=dtype)
    x = torch.randn(n, hidden, device=dev).to(dtype)
    x_out = torch.empty_like(x)
    a = torch.arange(64, dtype=torch.int32)
    b = a.clone()
    b[40] = -1
    kk = torch.ops.kernkit
    store = store_cache_module(kc.dtype, kc.shape, kc.is_cuda).store_cache
    index = indexing_module(weight.dtype, weight.shape, weight.is_cuda).indexing
    scale = scale_module(x.dtype, x.is_cuda).scale
    compare = compare_key_module().compare_key
    return {
        "store_cache": (lambda: ops.store_cache(kc, vc, idx, k, v), lambda: kk.store_cache(kc, vc, idx, k, v),
                        lambda: kk.store_cache.default(kc, vc, idx, k, v), lambda: store(kc, vc, idx, k, v)),
        "indexing (out=)": (lambda: ops.indexing(weight, ids, out=emb), lambda: kk.indexing_out(emb, weight, ids, None),
                            lambda: kk.indexing_out.default(emb, weight, ids, None),
                            lambda: index(emb, weight, ids, None)),
        "indexing (allocating)": (lambda: ops.indexing(weight, ids), lambda: kk.indexing(weight, ids),
                                  lambda: kk.indexing.default(weight, ids, None),
                                  lambda: index(weight.new_empty((n, hidden)), weight, ids, None)),
        "scale (out=)": (lambda: ops.scale(x, 0.5, out=x_out), lambda: kk.scale_out(x_out, x, 0.5),
                         lambda: kk.scale_out.default(x_out, x, 0.5), lambda: scale(x_out, x, 0.5)),
        "scale (allocating)": (lambda: ops.scale(x, 0.5), lambda: kk.scale(x, 0.5), lambda: kk.scale.default(x, 0.5),
                               lambda: scale(torch.empty_like(x), x, 0.5)),
        "compare_key (64 tokens, CPU)": (lambda: ops.compare_key(a, b), lambda: kk.compare_key(a, b),
                                         lambda: kk.compare_key.default(a, b), lambda: compare(a, b)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--n", type=int, default=None, help="rows per call (default: 64 on cuda, 0 on cpu)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    args = p.parse_args()
    dev = args.device
    n = args.n if args.n is not None else (64 if dev == "cuda" else 0)

    rows = []
    for name, fns in cases(dev, n, args.heads, args.head_dim).items():
        us = common.host_us(dict(zip(VARIANTS, fns, strict=True)), args.calls, sync=common.sync_for(dev))
        t = [us[v] for v in VARIANTS]
        rows.append([name, *t, t[1] / t[0], t[0] - t[3]])
        print(name, " ".join(f"{x:.3f}" for x in t), flush=True)
    checks = [["torch.compiler.is_compiling() (used by the plain functions)", check_cost_ns(is_compiling)],
              ["torch.compiler.is_dynamo_compiling()", check_cost_ns(is_dynamo_compiling)]]

    device = common.machine() if dev == "cuda" else f"{common.host_cpu()}, no GPU used (CPU proxy)"
    row_bytes = args.heads * args.head_dim * 2
    what = f"n={n} rows of {args.heads} x {args.head_dim} bf16 ({row_bytes} B)" + (
        " (n=0: no kernel work, overhead only)" if n == 0 else "")
    lines = common.header(f"Host cost per call: plain functions against torch.ops.kernkit.* ({dev})",
                          common.command_line(), device=device)
    lines += [f"{what}; {args.calls} calls back to back, best of 15 interleaved rounds, microseconds per call.", ""]
    lines += common.markdown_table(
        ["op", "kernkit.ops (plain)", "torch.ops.kernkit.op", "torch.ops.kernkit.op.default", "module function",
         "custom op / plain", "plain - module function"], rows)
    lines += ["", "Per-call cost of the tracing check at the top of each plain function (ns, median of 7 rounds "
              "of 10^6 calls):", ""]
    lines += common.markdown_table(["check", "ns/call"], checks)
    common.write_report(args.out, "host_cost.md", lines)


if __name__ == "__main__":
    main()
