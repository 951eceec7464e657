"""kernkit's demo: JIT-compile the shipped ops, run them, and check them against torch.

On a GPU machine the ops run on the GPU. Without one, kernkit still compiles the CUDA
specializations (with NVRTC or nvcc, whichever is the default backend) for
``$KERNKIT_CUDA_ARCH`` (9.0 by default here), which proves they build, and runs the same kernel
templates on CPU tensors through the CPU emulator.

Run: ``python -m kernkit.demo``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable

import torch


class _Compiles(logging.Filter):
    """Counts the JIT layer's one line per compile instead of printing it: the demo's rows say
    what was built, so that each build is reported once. Warnings pass."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        self.count += 1
        return False


_compiles = _Compiles()


def _check(name: str, fn: Callable[[], bool]) -> bool:
    start, before = time.perf_counter(), _compiles.count
    try:
        ok = fn()
    except Exception as e:  # the demo reports every op, then fails at the end
        print(f"  {name:<56} FAILED: {type(e).__name__}: {e}", flush=True)
        return False
    compiled = ", compiled first" if _compiles.count > before else ""
    print(f"  {name:<56} {'ok' if ok else 'MISMATCH'}  ({time.perf_counter() - start:.2f} s{compiled})", flush=True)
    return ok


def run_ops(device: str) -> bool:
    from kernkit import ops

    g = torch.Generator().manual_seed(0)
    results = []

    # store_cache: 8 heads x 128 dims of bf16 K/V rows into a pool, with one padding index (-1).
    pool, n, heads, dim = 1024, 37, 8, 128
    k_cache = torch.randn(pool, heads, dim, generator=g).to(torch.bfloat16).to(device)
    v_cache = torch.randn(pool, heads, dim, generator=g).to(torch.bfloat16).to(device)
    k = torch.randn(n, heads, dim, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(n, heads, dim, generator=g).to(torch.bfloat16).to(device)
    idx = torch.randperm(pool, generator=g)[:n].to(torch.int32)
    idx[5] = -1
    idx = idx.to(device)

    def store() -> bool:
        kc, vc = k_cache.clone(), v_cache.clone()
        ops.store_cache(kc, vc, idx, k, v)
        rk, rv = k_cache.clone(), v_cache.clone()
        keep = (idx >= 0) & (idx < pool)  # padding indices are never written
        rk[idx[keep].long()] = k[keep]
        rv[idx[keep].long()] = v[keep]
        return torch.equal(kc, rk) and torch.equal(vc, rv)

    results.append(_check("store_cache  bf16 [1024, 8, 128], n=37", store))

    # indexing: a vocabulary shard [300, 700) of a 1000-row table; ids outside give zero rows.
    weight = torch.randn(400, 256, generator=g).to(torch.float16).to(device)
    ids = torch.randint(0, 1000, (64,), generator=g, dtype=torch.int32).to(device)

    def index() -> bool:
        out = ops.indexing(weight, ids, vocab_range=(300, 400))
        local = ids.long() - 300
        inside = (local >= 0) & (local < 400)
        expected = torch.where(inside[:, None], weight[local.clamp(0, 399)], torch.zeros_like(weight[:1]))
        return torch.equal(out, expected)

    results.append(_check("indexing     fp16 [400, 256], shard [300, 700)", index))

    x = torch.randn(4099, generator=g).to(device)

    def scale() -> bool:
        return torch.equal(ops.scale(x, 0.75), (x * 0.75))

    results.append(_check("scale        fp32 x 0.75, 4099 elements", scale))

    a = torch.randint(0, 50_000, (10_000,), generator=g, dtype=torch.int32)
    b = a.clone()
    b[7777] += 1

    def compare() -> bool:
        return ops.compare_key(a, b) == 7777 and ops.compare_key(a, a[:123]) == 123

    results.append(_check("compare_key  int32 tokens (CPU), prefix 7777", compare))
    return all(results)


def compile_cuda_specializations() -> bool:
    """Build (without running) the CUDA specializations the demo's shapes need, in parallel, the
    way `python -m kernkit.jit warmup` does."""
    from kernkit.cli.warmup import build_all
    from kernkit.ops.elementwise import scale_spec
    from kernkit.ops.embedding import indexing_spec
    from kernkit.ops.kvcache import store_spec

    specs = [store_spec(torch.bfloat16, (8, 128)), indexing_spec(torch.float16, 256), scale_spec(torch.float32)]
    start = time.perf_counter()
    results = build_all(specs, progress=False)  # in parallel: one thread, one compiler, per build
    seconds = time.perf_counter() - start
    for spec, (status, error) in zip(specs, results):
        said = {"built": "compiled", "cached": "already cached"}.get(status, f"FAILED: {error}")
        print(f"  build {spec.label:<50} {said}")
    print(f"  ({len(specs)} builds, at once, in {seconds:.1f} s)")
    return all(status != "failed" for status, _ in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernkit.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="where to run the ops (auto: the GPU when one is visible)")
    args = parser.parse_args(argv)

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"kernkit demo: torch {torch.__version__}, running the ops on {device}")
    ok = True
    logging.getLogger("kernkit.jit").addFilter(_compiles)
    if device == "cpu" and not torch.cuda.is_available():
        os.environ.setdefault("KERNKIT_CUDA_ARCH", "9.0")
        from kernkit.jit import target_arch

        print(f"No GPU here: compiling the CUDA specializations for sm_{target_arch().sm} "
              "(compile only), then running the same templates on the CPU emulator.")
        ok = compile_cuda_specializations() and ok
    print(f"Running the shipped ops on {device} and comparing with torch:")
    ok = run_ops(device) and ok
    print("all ops match torch" if ok else "SOME OPS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
