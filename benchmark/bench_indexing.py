"""Benchmark indexing (embedding lookup) on the GPU: CUDA-graph time per call against
F.embedding, torch.compile of it and the device copy bandwidth, for n from 1 to 65536.

    python benchmark/bench_indexing.py --out DIR [--ns 1,64,65536] [--per-thread 2,8]

Bytes counted per call: n table rows read and n output rows written (2 x n x row bytes). Ids
are random over the whole table; outputs are rotated over enough buffers that each graph
touches more than the L2 holds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from kernkit import ops  # noqa: E402
from kernkit.jit import is_arch_support_pdl  # noqa: E402
from kernkit.ops import embedding  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--ns", default="1,4,16,64,256,1024,4096,16384,65536")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--dtype", default="bf16", choices=DTYPES)
    p.add_argument("--per-thread", default="")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = DTYPES[args.dtype]
    ns = [int(x) for x in args.ns.split(",")]
    variants = [int(x) for x in args.per_thread.split(",") if x]
    elem = torch.empty((), dtype=dtype).element_size()
    row_bytes = args.hidden * elem
    pdl = is_arch_support_pdl()

    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    weight = torch.randn(args.vocab, args.hidden, device="cuda").to(dtype)
    compiled = None if args.no_compile else torch.compile(F.embedding, dynamic=True)
    var_fns = {P: embedding.indexing_module(elem, row_bytes, pdl, "cuda", P).indexing for P in variants}

    rows, series = [], {"kernkit": [], "F.embedding": [], "torch.compile": []}
    for n in ns:
        per_call = 2 * n * row_bytes
        calls = common.calls_for(per_call)
        ids64 = torch.randint(0, args.vocab, (calls, n), device="cuda")
        ids32 = ids64.to(torch.int32)
        out = torch.empty(calls, n, args.hidden, dtype=dtype, device="cuda")

        res = {"kernkit": common.graph_time_us(
            [lambda c=c: ops.indexing(weight, ids32[c], out=out[c]) for c in range(calls)])}
        res["F.embedding"] = common.graph_time_us(
            [lambda c=c: F.embedding(ids64[c], weight) for c in range(min(calls, 200))])
        if compiled is not None:
            res["torch.compile"] = common.graph_time_us(
                [lambda c=c: compiled(ids64[c], weight) for c in range(min(calls, 200))])
        for P, fn in var_fns.items():
            res[f"per_thread={P}"] = common.graph_time_us(
                [lambda c=c: fn(out[c], weight, ids32[c], (0, args.vocab)) for c in range(calls)])
        tbs = {name: per_call / (us * 1e-6) / 1e12 for name, us in res.items()}
        for name in series:
            series[name].append(tbs.get(name, float("nan")))
        row = [n, calls, res["kernkit"], tbs["kernkit"], 100 * tbs["kernkit"] / ceiling, res["F.embedding"],
               100 * tbs["F.embedding"] / ceiling, res.get("torch.compile", float("nan"))]
        row += [res[f"per_thread={P}"] for P in variants]
        rows.append(row)
        print(" ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in row), flush=True)
        del ids64, ids32, out
        torch.cuda.empty_cache()

    n = 64
    ids = torch.randint(0, args.vocab, (n,), device="cuda", dtype=torch.int32)
    out = torch.empty(n, args.hidden, dtype=dtype, device="cuda")
    bare = embedding.indexing_module(elem, row_bytes, pdl, "cuda").indexing
    host = {
        "kernkit ops.indexing (allocates out)": common.host_us_per_call(lambda: ops.indexing(weight, ids)),
        "kernkit ops.indexing (out given)": common.host_us_per_call(lambda: ops.indexing(weight, ids, out=out)),
        "bare tvm-ffi call of the same kernel": common.host_us_per_call(lambda: bare(out, weight, ids, (0, args.vocab))),
        "F.embedding": common.host_us_per_call(lambda: F.embedding(ids, weight)),
    }

    columns = ["n", "calls/graph", "kernkit us", "kernkit TB/s", "% of copy", "F.embedding us", "F.embedding % of copy",
               "torch.compile us"] + [f"per_thread={P} us" for P in variants]
    lines = common.header(f"indexing, {args.vocab} x {args.hidden} {args.dtype} table ({row_bytes} B rows)",
                          "python benchmark/bench_indexing.py " + " ".join(sys.argv[1:]))
    lines += [f"Device copy bandwidth (bytes read + written): {ceiling:.3f} TB/s. Time per call inside a CUDA "
              f"graph, median of 30 replays; bytes counted 2 x n x {row_bytes}.", ""]
    lines += common.markdown_table(columns, rows)
    lines += ["", "Host cost per call at n=64 (us, calls issued back to back):", ""]
    lines += common.markdown_table(["what", "us/call"], [[k_, v_] for k_, v_ in host.items()])
    text = "\n".join(lines) + "\n"
    (args.out / "indexing.md").write_text(text)
    common.plot_bandwidth(args.out / "indexing.png", f"indexing, {row_bytes} B rows", ns, series, ceiling)
    print(text)


if __name__ == "__main__":
    main()
