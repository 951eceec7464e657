"""Benchmark store_cache on the GPU: CUDA-graph time per call against torch index_put,
torch.compile of it and the device copy bandwidth, for n from 1 to 65536.

    python benchmark/bench_store_cache.py --out DIR [--ns 1,64,65536] [--variants 2:0,4:1]

Bytes counted per call: K and V rows read and written (4 x n x row bytes). Inputs are rotated
over enough buffers that each graph touches more than the L2 holds; destination rows are
random distinct rows of a 2^20-row pool. Variants (vectors in flight per thread, streaming
stores) are built as their own specializations. Every kernel is first checked against the torch
reference. Without a GPU the script only runs that check, on CPU tensors through the emulator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit import ops
from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args
from kernkit.ops._rows import row_bytes, row_spec
from kernkit.ops.store_cache import _module as store_cache_module


def variant_spec(dtype: torch.dtype, row_shape: tuple[int, ...], per_thread: int, stream: bool,
                 backend: str | None) -> JitSpec:
    """store_cache with ``per_thread`` vectors in flight and streaming stores on or off. Without
    streaming stores it is the op's own spec but for ``per_thread`` (same cache entry when equal)."""
    nbytes = row_bytes(dtype, row_shape, "k_cache")
    if not stream:
        return row_spec("store_cache", "kvcache/store_cache.cuh", dtype.itemsize, nbytes, per_thread, backend)
    pdl = backend != "emu" and is_arch_support_pdl()
    args = make_cpp_args(dtype.itemsize, nbytes, min(16, nbytes & -nbytes), per_thread, pdl, True)
    return JitSpec.make("store_cache", *args, cuda_files=["kvcache/store_cache.cuh"],
                        cuda_wrappers=[("store_cache", f"store_cache<{args}>")], backend=backend)


def torch_store(kc, vc, idx, k, v):
    kc[idx] = k
    vc[idx] = v


def check(fns: dict, device: str, dtype: torch.dtype, row_shape: tuple[int, ...]) -> None:
    """Each function against the reference on fresh random inputs (a skipped index included),
    into caches poisoned with random bytes; exits naming the first mismatch."""
    from kernkit.testing.ops import store_cache as ref
    pool = 1024
    for n in (1, 37, 300):
        kc = torch.empty(pool, *row_shape, dtype=dtype, device=device)
        kc.view(torch.uint8).random_()
        k = torch.empty(n, *row_shape, dtype=dtype, device=device)
        k.view(torch.uint8).random_()
        v = torch.empty_like(k)
        v.view(torch.uint8).random_()
        idx = torch.randperm(pool, device=device)[:n].to(torch.int32)
        idx[n // 2] = -1
        want_k, want_v = kc.clone(), kc.flip(0).clone()
        ref.ref_store_cache(want_k, want_v, idx, k, v)
        for name, fn in fns.items():
            got_k, got_v = kc.clone(), kc.flip(0).clone()
            fn(got_k, got_v, idx, k, v)
            if not (torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))
                    and torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))):
                sys.exit(f"store_cache {name}: wrong result at n={n} on {device}")
    print(f"checked against the reference on {device}: {', '.join(fns)}", flush=True)


def time_sizes(args, dtype, row_shape, row_bytes, ceiling, variants: dict) -> tuple[list, dict]:
    """Graph time per call of every method at every n; the table rows and the TB/s series."""
    kc = torch.empty(args.pool, *row_shape, dtype=dtype, device="cuda")
    vc = torch.empty_like(kc)
    kc.view(torch.uint8).random_()
    vc.view(torch.uint8).random_()
    perm = torch.randperm(args.pool, device="cuda", dtype=torch.int64)
    compiled = None if args.no_compile else torch.compile(torch_store, dynamic=True)
    rows, series = [], {"kernkit": [], "torch index_put": [], "torch.compile": []}
    for n in (int(x) for x in args.ns.split(",")):
        per_call = 4 * n * row_bytes
        calls = common.calls_for(per_call)
        k = torch.empty(calls, n, *row_shape, dtype=dtype, device="cuda")
        v = torch.empty_like(k)
        k.view(torch.uint8).random_()
        v.view(torch.uint8).random_()
        starts = [(c * n) % max(args.pool - n, 1) for c in range(calls)]
        idx64 = [perm[s : s + n] for s in starts]
        idx32 = [i.to(torch.int32) for i in idx64]

        def t(fn, idx, count=calls, k=k, v=v):
            return common.graph_time_us([lambda c=c: fn(kc, vc, idx[c], k[c], v[c]) for c in range(count)])

        res = {"kernkit": t(ops.store_cache, idx32), "torch index_put": t(torch_store, idx64, min(calls, 200))}
        if compiled is not None:
            res["torch.compile"] = t(compiled, idx64, min(calls, 200))
        res.update({name: t(fn, idx32) for name, fn in variants.items()})
        tbs = {name: per_call / (us * 1e-6) / 1e12 for name, us in res.items()}
        for name in series:
            series[name].append(tbs.get(name, float("nan")))
        row = [n, calls, res["kernkit"], tbs["kernkit"], 100 * tbs["kernkit"] / ceiling, res["torch index_put"],
               res.get("torch.compile", float("nan"))] + [res[name] for name in variants]
        rows.append(row)
        print(" ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in row), flush=True)
        del k, v, idx64, idx32, t
        torch.cuda.empty_cache()
    return rows, series


def host_cost(dtype, row_shape) -> dict[str, float]:
    """CPU time per call at n=64, calls issued back to back."""
    n, pool = 64, 4096
    kc = torch.randn(pool, *row_shape, device="cuda").to(dtype)
    vc = torch.randn_like(kc)
    k, v = torch.randn(n, *row_shape, device="cuda").to(dtype), torch.randn(n, *row_shape, device="cuda").to(dtype)
    i64 = torch.randperm(pool, device="cuda")[:n]
    i32 = i64.to(torch.int32)
    module_fn = store_cache_module(kc.dtype, kc.shape, True).store_cache
    return common.host_us({
        "kernkit ops.store_cache": lambda: ops.store_cache(kc, vc, i32, k, v),
        "module function of the same kernel": lambda: module_fn(kc, vc, i32, k, v),
        "torch index_put": lambda: torch_store(kc, vc, i64, k, v),
    }, rounds=7)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--ns", default="1,4,16,64,256,1024,4096,16384,65536")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=common.DTYPES)
    p.add_argument("--pool", type=int, default=2**20)
    p.add_argument("--variants", default="",
                   help="extra kernel variants, comma-separated PER_THREAD:STREAM (e.g. 2:0,4:1): vectors in "
                        "flight per thread and tensor, and streaming stores on or off")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = p.parse_args()
    dtype = common.DTYPES[args.dtype]
    row_shape = (args.heads, args.head_dim)
    nbytes = row_bytes(dtype, row_shape, "k_cache")
    gpu = torch.cuda.is_available()
    backend, device = (None, "cuda") if gpu else ("emu", "cpu")
    variants = {}
    for item in filter(None, args.variants.split(",")):
        per_thread, stream = (int(x) for x in item.split(":"))
        spec = variant_spec(dtype, row_shape, per_thread, bool(stream), backend)
        variants[f"P={per_thread},stream={stream}"] = spec.build_and_load().store_cache
    check({"ops.store_cache": ops.store_cache, **variants}, device, dtype, row_shape)
    if not gpu:
        print("no CUDA GPU: checked the kernels on the CPU emulator; the timings need a GPU")
        return

    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    rows, series = time_sizes(args, dtype, row_shape, nbytes, ceiling, variants)
    host = host_cost(dtype, row_shape)

    columns = ["n", "calls/graph", "kernkit us", "kernkit TB/s", "% of copy", "torch us", "torch.compile us"]
    columns += [f"{name} us" for name in variants]
    lines = common.header(f"store_cache, {args.heads} x {args.head_dim} {args.dtype} rows ({nbytes} B)",
                          common.command_line())
    lines += [f"Device copy bandwidth (bytes read + written): {ceiling:.3f} TB/s. Time per call inside a CUDA "
              f"graph, median of 30 replays; bytes counted 4 x n x {nbytes}.", ""]
    lines += common.markdown_table(columns, rows)
    lines += ["", "Host cost per call at n=64 (us, calls issued back to back, best of 7 interleaved rounds):", ""]
    lines += common.markdown_table(["what", "us/call"], [[name, us] for name, us in host.items()])
    common.write_report(args.out, "store_cache.md", lines)
    common.plot_bandwidth(args.out / "store_cache.png", f"store_cache, {nbytes} B rows",
                          [r[0] for r in rows], series, ceiling)


if __name__ == "__main__":
    main()
