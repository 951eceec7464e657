#!/usr/bin/env python3
"""Runs every shipped CUDA kernel on small shapes, for ``tools/gpu_sanitize.py`` to run under
``compute-sanitizer`` (memcheck, racecheck, initcheck).

    PYTHONPATH=$PWD python3 tools/sanitize_driver.py --device cuda          # on the GPU
    PYTHONPATH=$PWD python3 tools/sanitize_driver.py --device cpu           # the same cases on the CPU emulator
    PYTHONPATH=$PWD python3 tools/sanitize_driver.py --device cuda --build  # only compile the specializations

The cases: ``store_cache`` with negative, ``>= pool`` and int64 indices (low 32 bits in range),
2-d and 3-d rows, fused-QKV inputs, K/V halves of one cache buffer, a misaligned input view
(narrower accesses) and 6-byte rows; ``indexing`` with out-of-range ids, int32 and int64 ids,
a vocabulary shard whose padding rows must not be read, a strided table and an ``out=`` view;
``scale`` with a tail (n not a multiple of the vector), a misaligned input (the scalar path)
and an ``out=`` view, for fp16, bf16 and fp32.

Every tensor the kernels touch is its own allocation of exactly its size (run the GPU side
with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so that each is its own ``cudaMalloc`` and memcheck
sees an access past it), except the cases that write into a view, which check the bytes around
it instead. Inputs are made on the CPU and copied over, so no torch kernel runs on the GPU
and every byte a kernel may read was written. Each output is compared with the torch reference
on the CPU, byte for byte.

Before any case runs, every specialization is built (in parallel); under a sanitizer run it
with ``KERNKIT_JIT=off`` after a plain run, so that a missing build fails instead of compiling
under the sanitizer. The last line is
``SANITIZE-DRIVER-OK <n> cases``.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from kernkit import ops
from kernkit.ops.indexing import indexing_spec
from kernkit.ops.scale import scale_spec
from kernkit.ops.store_cache import store_cache_spec
from kernkit.testing.ops import indexing as indexing
from kernkit.testing.ops import store_cache as store

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
i32, i64 = torch.int32, torch.int64

#: (dtype, heads, head_dim) of the store_cache cases: 2048-byte rows (16-byte accesses) and
#: 6-byte rows (2-byte accesses).
STORE_ROWS = [(bf16, 8, 128), (fp16, 1, 3)]
#: (dtype, hidden) of the indexing cases: 1152-byte rows (an MLA latent) and 400-byte rows.
INDEXING_ROWS = [(bf16, 576), (fp32, 100)]
SCALE_DTYPES = [fp16, bf16, fp32]


def short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def store_tag(dtype, heads, head_dim) -> str:
    return f"store_cache/{short(dtype)}-{heads}x{head_dim}"


def indexing_tag(dtype, hidden) -> str:
    return f"indexing/{short(dtype)}-h{hidden}"


def scale_tag(dtype) -> str:
    return f"scale/{short(dtype)}"


def requests(backend: str | None, names: list[str]) -> list:
    """The specializations the cases ``names`` load (each case's name starts with its tag)."""

    def wanted(tag: str) -> bool:
        return any(name.startswith(tag + "-") for name in names)

    out = [store_cache_spec(d, (heads, head_dim), backend) for d, heads, head_dim in STORE_ROWS
           if wanted(store_tag(d, heads, head_dim))]
    out += [indexing_spec(d, hidden, backend) for d, hidden in INDEXING_ROWS if wanted(indexing_tag(d, hidden))]
    out += [scale_spec(d, backend) for d in SCALE_DTYPES if wanted(scale_tag(d))]
    return list(dict.fromkeys(out))


def build_all(backend: str | None, names: list[str]) -> None:
    reqs = requests(backend, names)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, len(reqs))) as pool:
        list(pool.map(lambda r: r.build(), reqs))
    print(f"built {len(reqs)} specializations in {time.perf_counter() - t0:.1f} s", flush=True)


# --------------------------------------------------------------------------------------------


class Mismatch(AssertionError):
    pass


def gen_for(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def rand_bits(shape, dtype, gen) -> torch.Tensor:
    """Random bytes as ``dtype`` (a CPU tensor)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (*shape[:-1], shape[-1] * elem), dtype=torch.uint8, generator=gen).view(dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def expect_same(name: str, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if got.shape != want.shape or not torch.equal(as_bytes(got), as_bytes(want)):
        raise Mismatch(f"{name}: '{what}' differs from the torch reference")


def bad_indices(pool: int, dtype: torch.dtype) -> list[int]:
    out = [-1, pool, pool + 1, -pool, 2**31 - 1, -(2**31)]
    if dtype == i64:
        out += [2**32 + 3, -(2**32) + 5, 2**40, -(2**62)]  # low 32 bits name valid rows
    return out


def store_case(name, device, dtype, heads, head_dim, index_dtype, *, pool=64, n=40, fused=False, kv_buffer=False,
               misaligned=False, two_d=False):
    gen = gen_for(name)
    row = (heads * head_dim,) if two_d else (heads, head_dim)
    idx = torch.randperm(pool, generator=gen)[:n].to(i64)
    bad = bad_indices(pool, index_dtype)
    for p, value in zip(torch.randperm(n, generator=gen).tolist(), bad, strict=False):
        idx[p] = value
    idx = idx.to(index_dtype)
    if kv_buffer:  # both caches are halves of one [pool, 2, row] buffer, checked whole
        kv = rand_bits((pool, 2, *row), dtype, gen)
        kv_d = kv.to(device)
        caches_d, whole, whole_d = (kv_d[:, 0], kv_d[:, 1]), [kv], [kv_d]
    else:
        kc, vc = rand_bits((pool, *row), dtype, gen), rand_bits((pool, *row), dtype, gen)
        whole = [kc, vc]
        whole_d = [kc.to(device), vc.to(device)]
        caches_d = tuple(whole_d)
    if fused:  # K and V are slices of a fused [n, 3, row] tensor
        qkv = rand_bits((n, 3, *row), dtype, gen)
        qkv_d = qkv.to(device)
        k, v, k_d, v_d = qkv[:, 1], qkv[:, 2], qkv_d[:, 1], qkv_d[:, 2]
    elif misaligned:  # K starts one element into its allocation
        buf = rand_bits((n * row[0] * (row[1] if len(row) > 1 else 1) + 1,), dtype, gen)
        k, v = buf[1:].view(n, *row), rand_bits((n, *row), dtype, gen)
        k_d, v_d = buf.to(device)[1:].view(n, *row), v.to(device)
    else:
        k, v = rand_bits((n, *row), dtype, gen), rand_bits((n, *row), dtype, gen)
        k_d, v_d = k.to(device), v.to(device)
    want = [t.clone() for t in whole]
    want_caches = (want[0][:, 0], want[0][:, 1]) if kv_buffer else (want[0], want[1])
    store.ref_store_cache(*want_caches, idx, k, v)
    ops.store_cache(*caches_d, idx.to(device), k_d, v_d)
    for i, (got, exp) in enumerate(zip(whole_d, want, strict=True)):
        expect_same(name, ["k_cache", "v_cache", "kv buffer"][2 if kv_buffer else i], got, exp)
    return 1


def indexing_case(name, device, dtype, hidden, id_dtype, *, rows=96, n=40, vocab_range=None, strided=False,
                  out_view=False):
    gen = gen_for(name)
    start, length = vocab_range or (0, rows)
    table = rand_bits((rows, 3 * hidden if strided else hidden), dtype, gen)
    ids = torch.randint(max(0, start - 20), start + length + 20, (n,), generator=gen)
    extremes = [-1, start - 1, start + length, rows, 2**31 - 1, -(2**31)]
    if id_dtype == i64:
        extremes += [2**32 + start + 1, 2**40]
    for p, value in zip(torch.randperm(n, generator=gen).tolist(), extremes, strict=False):
        ids[p] = value
    ids = ids.to(id_dtype)
    weight = table[:, hidden : 2 * hidden] if strided else table
    table_d = table.to(device)
    weight_d = table_d[:, hidden : 2 * hidden] if strided else table_d
    if out_view:  # out= is the middle third of a [n, 3 * hidden] buffer, checked whole
        buf = rand_bits((n, 3 * hidden), dtype, gen)
        want = buf.clone()
        indexing.ref_indexing(want[:, hidden : 2 * hidden], weight, ids, start, length)
        buf_d = buf.to(device)
        ops.indexing(weight_d, ids.to(device), out=buf_d[:, hidden : 2 * hidden], vocab_range=vocab_range)
        expect_same(name, "out buffer", buf_d, want)
    else:
        want = torch.empty(n, hidden, dtype=dtype)
        indexing.ref_indexing(want, weight, ids, start, length)
        expect_same(name, "out", ops.indexing(weight_d, ids.to(device), vocab_range=vocab_range), want)
    return 1


def scale_case(name, device, dtype, n, factor, *, offset=0, out_view=False):
    gen = gen_for(name)
    base = (torch.randn(n + offset, generator=gen) * 8).to(dtype)
    x = base[offset:]
    want = (x.float() * torch.tensor(factor, dtype=fp32)).to(dtype)
    x_d = base.to(device)[offset:]
    if out_view:
        buf = (torch.randn(n + 2, generator=gen)).to(dtype)
        exp = buf.clone()
        exp[1 : n + 1] = want
        buf_d = buf.to(device)
        ops.scale(x_d, factor, out=buf_d[1 : n + 1])
        expect_same(name, "out buffer", buf_d, exp)
    else:
        expect_same(name, "out", ops.scale(x_d, factor), want)
    return 1


def cases() -> list[tuple[str, Callable[[torch.device], int]]]:
    out = []

    def add(name, fn, *args, **kw):
        out.append((name, lambda device: fn(name, device, *args, **kw)))

    for dtype, heads, head_dim in STORE_ROWS:
        tag = store_tag(dtype, heads, head_dim)
        add(f"{tag}-i32", store_case, dtype, heads, head_dim, i32)
        add(f"{tag}-i64", store_case, dtype, heads, head_dim, i64)
        add(f"{tag}-i64-2d", store_case, dtype, heads, head_dim, i64, two_d=True)
        add(f"{tag}-i32-fused-kvbuffer", store_case, dtype, heads, head_dim, i32, fused=True, kv_buffer=True)
        add(f"{tag}-i64-misaligned-n1", store_case, dtype, heads, head_dim, i64, misaligned=True, n=1)
        add(f"{tag}-i64-misaligned", store_case, dtype, heads, head_dim, i64, misaligned=True, n=12)
        add(f"{tag}-i32-only-bad", store_case, dtype, heads, head_dim, i32, n=6)  # every index out of range
        add(f"{tag}-i64-n0", store_case, dtype, heads, head_dim, i64, n=0)
    for dtype, hidden in INDEXING_ROWS:
        tag = indexing_tag(dtype, hidden)
        add(f"{tag}-i32", indexing_case, dtype, hidden, i32)
        add(f"{tag}-i64", indexing_case, dtype, hidden, i64)
        add(f"{tag}-i64-shard", indexing_case, dtype, hidden, i64, rows=80, vocab_range=(250, 64), strided=True)
        add(f"{tag}-i32-shard-outview", indexing_case, dtype, hidden, i32, rows=70, vocab_range=(3, 70),
            out_view=True)
        add(f"{tag}-i64-n1", indexing_case, dtype, hidden, i64, n=1)
        add(f"{tag}-i64-n0", indexing_case, dtype, hidden, i64, n=0)
    for dtype in SCALE_DTYPES:
        tag = scale_tag(dtype)
        for n in (1, 7, 1029, 70001):  # tails of every length class; 70001: more than one block's worth
            add(f"{tag}-n{n}", scale_case, dtype, n, 1.7)
        add(f"{tag}-n1031-misaligned", scale_case, dtype, 1031, -0.5, offset=1)
        add(f"{tag}-n1029-outview", scale_case, dtype, 1029, 0.25, out_view=True)
        add(f"{tag}-n0", scale_case, dtype, 0, 2.0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (the GPU, default) or cpu (the CPU emulator)")
    p.add_argument("--build", action="store_true", help="only build the specializations (of the --only cases)")
    p.add_argument("--list", action="store_true", help="list the cases")
    p.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.list:
        print("\n".join(name for name, _ in cases()))
        return 0
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device visible", file=sys.stderr)
            return 2
        print(f"device: {torch.cuda.get_device_name(device)}", flush=True)
    else:
        print("device: kernkit CPU emulator", flush=True)
    selected = [(name, run) for name, run in cases() if not args.only or args.only in name]
    if not selected:
        print(f"no case matches {args.only!r}", file=sys.stderr)
        return 2
    build_all(None if device.type == "cuda" else "emu", [name for name, _ in selected])
    if args.build:
        return 0
    count = 0
    for name, run in selected:
        run(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a kernel's fault is reported at its own case
        print(f"ok {name}", flush=True)
        count += 1
    print(f"SANITIZE-DRIVER-OK {count} cases", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
