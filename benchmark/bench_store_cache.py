"""Benchmark store_cache on the GPU: CUDA-graph time per call against torch index_put,
torch.compile of it and the device copy bandwidth, for n from 1 to 65536.

    python benchmark/bench_store_cache.py --out DIR [--ns 1,64,65536] [--variants 2:0,4:1]

Bytes counted per call: K and V rows read and written (4 x n x row bytes). Inputs are rotated
over enough buffers that each graph touches more than the L2 holds; destination rows are
random distinct rows of a 2^20-row pool.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from kernkit import ops  # noqa: E402
from kernkit.jit import is_arch_support_pdl  # noqa: E402
from kernkit.ops import kvcache  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}


def torch_store(kc, vc, idx, k, v):
    kc[idx] = k
    vc[idx] = v


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--ns", default="1,4,16,64,256,1024,4096,16384,65536")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=DTYPES)
    p.add_argument("--pool", type=int, default=2**20)
    p.add_argument("--variants", default="",
                   help="extra kernel variants, comma-separated PER_THREAD:STREAM (e.g. 2:0,4:1): vectors in "
                        "flight per thread and tensor, and streaming stores on or off")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = DTYPES[args.dtype]
    ns = [int(x) for x in args.ns.split(",")]
    variants = [tuple(int(y) for y in x.split(":")) for x in args.variants.split(",") if x]
    row_shape = (args.heads, args.head_dim)
    elem = torch.empty((), dtype=dtype).element_size()
    row_bytes = args.heads * args.head_dim * elem
    pdl = is_arch_support_pdl()

    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    kc = torch.empty(args.pool, *row_shape, dtype=dtype, device="cuda")
    vc = torch.empty_like(kc)
    kc.view(torch.uint8).random_()
    vc.view(torch.uint8).random_()
    perm = torch.randperm(args.pool, device="cuda", dtype=torch.int64)
    compiled = None if args.no_compile else torch.compile(torch_store, dynamic=True)
    var_fns = {f"P={P},stream={S}": kvcache.store_module(elem, row_bytes, pdl, "cuda", P, bool(S)).store_cache
               for P, S in variants}

    rows, series = [], {"kernkit": [], "torch index_put": [], "torch.compile": []}
    for n in ns:
        per_call = 4 * n * row_bytes
        calls = common.calls_for(per_call)
        k = torch.empty(calls, n, *row_shape, dtype=dtype, device="cuda")
        v = torch.empty_like(k)
        k.view(torch.uint8).random_()
        v.view(torch.uint8).random_()
        starts = [(c * n) % max(args.pool - n, 1) for c in range(calls)]
        idx64 = [perm[s : s + n] for s in starts]
        idx32 = [i.to(torch.int32) for i in idx64]

        def t(fn):
            return common.graph_time_us([lambda c=c: fn(kc, vc, idx32[c], k[c], v[c]) for c in range(calls)])

        res = {"kernkit": t(ops.store_cache)}
        res["torch index_put"] = common.graph_time_us(
            [lambda c=c: torch_store(kc, vc, idx64[c], k[c], v[c]) for c in range(min(calls, 200))])
        if compiled is not None:
            res["torch.compile"] = common.graph_time_us(
                [lambda c=c: compiled(kc, vc, idx64[c], k[c], v[c]) for c in range(min(calls, 200))])
        for name, fn in var_fns.items():
            res[name] = t(fn)
        tbs = {name: per_call / (us * 1e-6) / 1e12 for name, us in res.items()}
        for name in series:
            series[name].append(tbs.get(name, float("nan")))
        row = [n, calls, res["kernkit"], tbs["kernkit"], 100 * tbs["kernkit"] / ceiling, res["torch index_put"],
               res.get("torch.compile", float("nan"))] + [res[name] for name in var_fns]
        rows.append(row)
        print(" ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in row), flush=True)
        del k, v, idx64, idx32
        torch.cuda.empty_cache()

    # Host cost of one call at n=64 (CPU time per call, calls issued back to back).
    n = 64
    k = torch.randn(n, *row_shape, device="cuda").to(dtype)
    v = torch.randn(n, *row_shape, device="cuda").to(dtype)
    i32 = perm[:n].to(torch.int32)
    bare = kvcache.store_module(elem, row_bytes, pdl, "cuda").store_cache
    host = {
        "kernkit ops.store_cache": common.host_us_per_call(lambda: ops.store_cache(kc, vc, i32, k, v)),
        "bare tvm-ffi call of the same kernel": common.host_us_per_call(lambda: bare(kc, vc, i32, k, v)),
        "torch index_put": common.host_us_per_call(lambda: torch_store(kc, vc, perm[:n], k, v)),
    }

    columns = ["n", "calls/graph", "kernkit us", "kernkit TB/s", "% of copy", "torch us", "torch.compile us"]
    columns += [f"{name} us" for name in var_fns]
    lines = common.header(f"store_cache, {args.heads} x {args.head_dim} {args.dtype} rows ({row_bytes} B)",
                          "python benchmark/bench_store_cache.py " + " ".join(sys.argv[1:]))
    lines += [f"Device copy bandwidth (bytes read + written): {ceiling:.3f} TB/s. Time per call inside a CUDA "
              f"graph, median of 30 replays; bytes counted 4 x n x {row_bytes}.", ""]
    lines += common.markdown_table(columns, rows)
    lines += ["", "Host cost per call at n=64 (us, calls issued back to back):", ""]
    lines += common.markdown_table(["what", "us/call"], [[k_, v_] for k_, v_ in host.items()])
    text = "\n".join(lines) + "\n"
    (args.out / "store_cache.md").write_text(text)
    common.plot_bandwidth(args.out / "store_cache.png", f"store_cache, {row_bytes} B rows", ns, series, ceiling)
    print(text)


if __name__ == "__main__":
    main()
