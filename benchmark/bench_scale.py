"""Benchmark kernkit.ops.scale on the GPU against torch ``x * factor``: CUDA-graph time per call
and achieved bandwidth, for n from 2^10 to 2^28 elements.

    python benchmark/bench_scale.py --out DIR [--dtype bf16] [--ns 1024,1048576]

Bytes counted per call: the input read and the output written (2 x n x element size). Inputs
are rotated over enough buffers that each graph touches more than the L2 holds. Measures and
reports; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from kernkit.ops import scale  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--ns", default=",".join(str(1 << k) for k in range(10, 29, 2)))
    p.add_argument("--dtype", default="bf16", choices=DTYPES)
    p.add_argument("--factor", type=float, default=1.25)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_scale needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = DTYPES[args.dtype]
    elem = torch.empty((), dtype=dtype).element_size()
    ns = [int(x) for x in args.ns.split(",")]

    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    rows, series = [], {"kernkit": [], "torch x * factor": []}
    for n in ns:
        per_call = 2 * n * elem
        calls = common.calls_for(per_call, max_calls=200)
        xs = torch.randn(calls, n, device="cuda").to(dtype)
        outs = torch.empty_like(xs)

        kk = common.graph_time_us([lambda c=c: scale(xs[c], args.factor, out=outs[c]) for c in range(calls)])
        th = common.graph_time_us([lambda c=c: torch.mul(xs[c], args.factor, out=outs[c]) for c in range(calls)])
        for name, us in (("kernkit", kk), ("torch x * factor", th)):
            series[name].append(per_call / (us * 1e-6) / 1e12)
        rows.append([n, kk, th, series["kernkit"][-1], series["torch x * factor"][-1]])
        print(f"n={n:>10}  kernkit {kk:9.2f} us  torch {th:9.2f} us", flush=True)
        del xs, outs
        torch.cuda.empty_cache()

    host = common.host_us_per_call(lambda x=torch.randn(1024, device="cuda").to(dtype): scale(x, args.factor))
    lines = common.header(f"scale ({args.dtype})", " ".join(sys.argv))
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s", f"- host cost per scale call: {host:.2f} us", ""]
    lines += common.markdown_table(["n", "kernkit us", "torch us", "kernkit TB/s", "torch TB/s"], rows)
    out = args.out / f"scale_{args.dtype}.md"
    out.write_text("\n".join(lines) + "\n")
    common.plot_bandwidth(args.out / f"scale_{args.dtype}.png", f"scale {args.dtype}", ns, series, ceiling)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
