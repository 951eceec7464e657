"""Host cost per call of kernkit's ops: the plain Python functions (the eager fast path) against
the torch.library custom ops (torch.ops.kernkit.*) and the bare tvm-ffi function of the kernel.

    python benchmark/bench_host_cost.py --out DIR [--device cuda|cpu] [--n 64] [--calls 2000]

Each figure is the wall time per call of ``--calls`` calls issued back to back (no
synchronization between them), the best of 15 rounds (the variants' rounds interleaved). On a GPU the ops run for real (default
n=64 rows of 8 x 128 bf16, 2 KB). Without a GPU the ops get n=0 rows (``--n 0``): the kernels
launch nothing, so the figures are the Python and tvm-ffi overhead alone, a proxy for the host
cost on a GPU machine (the CPU emulator would otherwise dominate). compare_key is a host op and
always runs on 64 tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.compiler import is_compiling, is_dynamo_compiling

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from kernkit import ops  # noqa: E402
from kernkit.ops import elementwise, embedding, kvcache, radix  # noqa: E402


def per_call_us(fns: list[Callable[[], object]], calls: int, sync: Callable[[], None],
                rounds: int = 15) -> list[float]:
    """Time per call of each of ``fns``: ``calls`` back to back per round, the rounds of the
    functions interleaved (so that a busy moment of the machine hits all alike), best round."""
    for fn in fns:
        for _ in range(50):
            fn()
    sync()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / calls * 1e6)
            sync()
    return best


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--n", type=int, default=None, help="rows per call (default: 64 on cuda, 0 on cpu)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = args.device
    n = args.n if args.n is not None else (64 if dev == "cuda" else 0)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    row = (args.heads, args.head_dim)
    hidden = args.heads * args.head_dim
    dtype = torch.bfloat16
    row_bytes = hidden * 2

    pool = 4096
    kc = torch.randn(pool, *row, device=dev).to(dtype)
    vc = torch.randn_like(kc)
    k, v = torch.randn(n, *row, device=dev).to(dtype), torch.randn(n, *row, device=dev).to(dtype)
    idx = torch.randperm(pool, device=dev)[:n].to(torch.int32)
    weight = torch.randn(32000, hidden, device=dev).to(dtype)
    ids = torch.randint(0, 32000, (n,), device=dev, dtype=torch.int32)
    emb_out = torch.empty(n, hidden, device=dev, dtype=dtype)
    x = torch.randn(n * hidden, device=dev).to(dtype)
    x_out = torch.empty_like(x)
    a = torch.arange(64, dtype=torch.int32)
    b = a.clone()
    b[40] = -1
    kk = torch.ops.kernkit

    store_bare = kvcache._store_fn(kc.dtype, kc.shape, kc.is_cuda)
    index_bare = embedding._indexing_fn(weight.dtype, weight.shape, weight.is_cuda)
    scale_bare = elementwise._scale_module(x.dtype, x.is_cuda).scale
    ck_bare = radix._compare_key_fn()
    cases = {
        "store_cache": (lambda: ops.store_cache(kc, vc, idx, k, v),
                        lambda: kk.store_cache(kc, vc, idx, k, v),
                        lambda: kk.store_cache.default(kc, vc, idx, k, v),
                        lambda: store_bare(kc, vc, idx, k, v)),
        "indexing (out=)": (lambda: ops.indexing(weight, ids, out=emb_out),
                            lambda: kk.indexing_out(emb_out, weight, ids, None),
                            lambda: kk.indexing_out.default(emb_out, weight, ids, None),
                            lambda: index_bare(emb_out, weight, ids, (0, weight.shape[0]))),
        "indexing (allocating)": (lambda: ops.indexing(weight, ids),
                                  lambda: kk.indexing(weight, ids),
                                  lambda: kk.indexing.default(weight, ids),
                                  None),
        "scale (out=)": (lambda: ops.scale(x, 0.5, out=x_out),
                         lambda: kk.scale_out(x_out, x, 0.5),
                         lambda: kk.scale_out.default(x_out, x, 0.5),
                         lambda: scale_bare(x_out, x, 0.5)),
        "compare_key (64 tokens, CPU)": (lambda: ops.compare_key(a, b),
                                         lambda: kk.compare_key(a, b),
                                         lambda: kk.compare_key.default(a, b),
                                         lambda: ck_bare(a, b)),
    }
    rows = []
    for name, fns in cases.items():
        timed = per_call_us([fn for fn in fns if fn is not None], args.calls, sync)
        times = [timed.pop(0) if fn is not None else float("nan") for fn in fns]
        rows.append([name, *times, times[1] / times[0]])
        print(name, " ".join(f"{t:.3f}" for t in times), flush=True)
    checks = [["torch.compiler.is_dynamo_compiling() (used)", check_cost_ns(is_dynamo_compiling)],
              ["torch.compiler.is_compiling()", check_cost_ns(is_compiling)]]

    device = f"{torch.cuda.get_device_name()}; host {common.host_cpu()}" if dev == "cuda" else f"{common.host_cpu()}, no GPU used"
    what = f"n={n} rows of {args.heads} x {args.head_dim} bf16 ({row_bytes} B)" + (
        " (n=0: no kernel work, overhead only)" if n == 0 else "")
    lines = common.header(f"Host cost per call: plain functions against torch.ops.kernkit.* ({dev})",
                          "python benchmark/bench_host_cost.py " + " ".join(sys.argv[1:]), device=device)
    lines += [f"{what}; {args.calls} calls back to back, best of 15 interleaved rounds, microseconds per call.", ""]
    lines += common.markdown_table(
        ["op", "kernkit.ops (plain)", "torch.ops.kernkit.op", "torch.ops.kernkit.op.default", "bare tvm-ffi call",
         "custom op / plain"], rows)
    lines += ["", "Per-call cost of the tracing check at the top of each plain function (ns, median of 7 rounds "
              "of 10^6 calls):", ""]
    lines += common.markdown_table(["check", "ns/call"], checks)
    text = "\n".join(lines) + "\n"
    (args.out / "host_cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
