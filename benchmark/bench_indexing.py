"""Benchmark indexing (embedding lookup) on the GPU: CUDA-graph time per call against
F.embedding, torch.compile of it and the device copy bandwidth, for n from 1 to 65536.

    python benchmark/bench_indexing.py --out DIR [--ns 1,64,65536] [--per-thread 2,8]

Bytes counted per call: n table rows read and n output rows written (2 x n x row bytes). Ids
are random over the whole table; outputs are rotated over enough buffers that each graph
touches more than the L2 holds. Variants (vectors in flight per thread) are built as their own
specializations. Every kernel is first checked against the torch reference. Without a GPU the
script only runs that check, on CPU tensors through the emulator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import common

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops._rows import row_spec
from kernkit.ops.indexing import _module as indexing_module


def variant_spec(dtype: torch.dtype, hidden: int, per_thread: int, backend: str | None) -> JitSpec:
    """The op's indexing spec but for ``per_thread`` vectors in flight."""
    return row_spec("indexing", "embedding/ref.cuh", dtype.itemsize, hidden * dtype.itemsize,
                            per_thread, backend)


def check(fns: dict, device: str, dtype: torch.dtype, hidden: int) -> None:
    """Each function (``fn(out, weight, ids, vocab_range)``) against the reference on fresh
    random inputs, ids outside the shard included, into poisoned outputs; exits on a mismatch."""
    from kernkit.testing.ops import indexing as ref
    rows, start = 500, 100
    weight = torch.randn(rows, hidden, device=device).to(dtype)
    for n in (1, 37, 300):
        ids = torch.randint(0, start + rows + 50, (n,), device=device, dtype=torch.int32)
        want = torch.empty(n, hidden, dtype=dtype, device=device)
        ref.ref_indexing(want, weight, ids, start, rows)
        for name, fn in fns.items():
            got = torch.full_like(want, float("nan"))
            fn(got, weight, ids, (start, rows))
            if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                sys.exit(f"indexing {name}: wrong result at n={n} on {device}")
    print(f"checked against the reference on {device}: {', '.join(fns)}", flush=True)


def time_sizes(args, dtype, weight, row_bytes, ceiling, variants: dict) -> tuple[list, dict]:
    """Graph time per call of every method at every n; the table rows and the TB/s series."""
    compiled = None if args.no_compile else torch.compile(F.embedding, dynamic=True)
    rows, series = [], {"kernkit": [], "F.embedding": [], "torch.compile": []}
    for n in (int(x) for x in args.ns.split(",")):
        per_call = 2 * n * row_bytes
        calls = common.calls_for(per_call)
        ids64 = torch.randint(0, args.vocab, (calls, n), device="cuda")
        ids32 = ids64.to(torch.int32)
        out = torch.empty(calls, n, args.hidden, dtype=dtype, device="cuda")
        few = min(calls, 200)

        res = {"kernkit": common.graph_time_us(
            [lambda c=c, ids32=ids32, out=out: ops.indexing(weight, ids32[c], out=out[c]) for c in range(calls)])}
        res["F.embedding"] = common.graph_time_us(
            [lambda c=c, ids64=ids64: F.embedding(ids64[c], weight) for c in range(few)])
        if compiled is not None:
            res["torch.compile"] = common.graph_time_us(
                [lambda c=c, ids64=ids64: compiled(ids64[c], weight) for c in range(few)])
        for name, fn in variants.items():
            res[name] = common.graph_time_us(
                [lambda c=c, fn=fn, out=out, ids32=ids32: fn(out[c], weight, ids32[c], None) for c in range(calls)])
        tbs = {name: per_call / (us * 1e-6) / 1e12 for name, us in res.items()}
        for name in series:
            series[name].append(tbs.get(name, float("nan")))
        row = [n, calls, res["kernkit"], tbs["kernkit"], 100 * tbs["kernkit"] / ceiling, res["F.embedding"],
               100 * tbs["F.embedding"] / ceiling, res.get("torch.compile", float("nan"))]
        row += [res[name] for name in variants]
        rows.append(row)
        print(" ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in row), flush=True)
        del ids64, ids32, out
        torch.cuda.empty_cache()
    return rows, series


def host_cost(args, dtype, weight) -> dict[str, float]:
    """CPU time per call at n=64, calls issued back to back."""
    ids = torch.randint(0, args.vocab, (64,), device="cuda", dtype=torch.int32)
    out = torch.empty(64, args.hidden, dtype=dtype, device="cuda")
    module_fn = indexing_module(weight.dtype, weight.shape, True).indexing
    return common.host_us({
        "kernkit ops.indexing (allocates out)": lambda: ops.indexing(weight, ids),
        "kernkit ops.indexing (out given)": lambda: ops.indexing(weight, ids, out=out),
        "module function of the same kernel": lambda: module_fn(out, weight, ids, None),
        "F.embedding": lambda: F.embedding(ids, weight),
    }, rounds=7)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--ns", default="1,4,16,64,256,1024,4096,16384,65536")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--per-thread", default="", help="extra kernel variants: vectors in flight per thread, e.g. 1,4,8")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = p.parse_args()
    dtype = common.DTYPES[args.dtype]
    row_bytes = args.hidden * dtype.itemsize
    gpu = torch.cuda.is_available()
    backend, device = (None, "cuda") if gpu else ("emu", "cpu")
    variants = {f"per_thread={P}": variant_spec(dtype, args.hidden, P, backend).build_and_load().indexing
                for P in (int(x) for x in args.per_thread.split(",") if x)}

    def op(out, weight, ids, vocab_range):
        ops.indexing(weight, ids, vocab_range, out=out)

    check({"ops.indexing": op, **variants}, device, dtype, args.hidden)
    if not gpu:
        print("no CUDA GPU: checked the kernels on the CPU emulator; the timings need a GPU")
        return

    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    weight = torch.randn(args.vocab, args.hidden, device="cuda").to(dtype)
    rows, series = time_sizes(args, dtype, weight, row_bytes, ceiling, variants)
    host = host_cost(args, dtype, weight)

    columns = ["n", "calls/graph", "kernkit us", "kernkit TB/s", "% of copy", "F.embedding us", "F.embedding % of copy",
               "torch.compile us"] + [f"{name} us" for name in variants]
    lines = common.header(f"indexing, {args.vocab} x {args.hidden} {args.dtype} table ({row_bytes} B rows)",
                          common.command_line())
    lines += [f"Device copy bandwidth (bytes read + written): {ceiling:.3f} TB/s. Time per call inside a CUDA "
              f"graph, median of 30 replays; bytes counted 2 x n x {row_bytes}.", ""]
    lines += common.markdown_table(columns, rows)
    lines += ["", "Host cost per call at n=64 (us, calls issued back to back, best of 7 interleaved rounds):", ""]
    lines += common.markdown_table(["what", "us/call"], [[name, us] for name, us in host.items()])
    common.write_report(args.out, "ref.md", lines)
    common.plot_bandwidth(args.out / "ref.png", f"indexing, {row_bytes} B rows", [r[0] for r in rows], series,
                          ceiling)


if __name__ == "__main__":
    main()
