"""Hashes of every shipped CUDA kernel's outputs on a fixed set of inputs.

The same cases run on the GPU (``--device cuda``) and on the CPU emulator (``--device cpu``).
An exact output must be the same bytes on both: it is first compared with the torch reference
computed on the CPU (so a wrong result is never hashed), then its hash is recorded. A bound
output (an op built on the hardware's approximate exp2 / reciprocal, whose bits differ between
the GPU and the emulator: docs/emulator.md) is instead checked against the float64 reference
within the bound the op's docstring states; the file records that bound and the largest error
measured on the device that wrote it, and a check passes where the computing device stays
within the same bound.

    python -m kernkit.testing.hashes --device cuda --write tests/data/kernel_hashes.json   # on a GPU
    python -m kernkit.testing.hashes --device cpu --check tests/data/kernel_hashes.json    # anywhere

Inputs come from a ``torch.Generator`` seeded per case (from the case's name) on the CPU and are
then copied to the device, so both sides see identical bytes. An output's hash is the sha256 of
``t.cpu().contiguous().view(torch.uint8)``; where an op writes into a view, the whole
underlying buffer is hashed (the bytes it must not touch included).

Cases deliberately avoid what the GPU leaves unspecified: no two valid ``store_cache`` indices
name the same row (the winner of a duplicate is not defined), and ``scale`` inputs hold no NaN
(the GPU returns the canonical NaN, the CPU keeps payloads).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import platform
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernkit import ops

from .oracle import op_tests


from . import oracle
from .oracle import as_bytes, rand_bits, same_bytes

act_tests = op_tests("activation")
group_quant = op_tests("group_quant")
indexing = op_tests("indexing")
norm = op_tests("norm")
qk = op_tests("qk_norm")
quant = op_tests("quant")
rope = op_tests("rope")
rope_store = op_tests("rope_store")
store = op_tests("store_cache")

FORMAT = 2


@dataclass(frozen=True)
class Within:
    """A bound output: already checked against the float64 reference, ``got`` (on the CPU) is
    within ``bound_ulps`` ulps of its dtype everywhere; ``max_ulps`` is the largest error."""

    got: torch.Tensor
    bound_ulps: float
    max_ulps: float


#: What an output is: (the op's result, moved to the CPU; the reference's result), compared
#: byte for byte, or a ``Within``.
Outputs = dict[str, "tuple[torch.Tensor, torch.Tensor] | Within"]

_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8e4m3",
          torch.int32: "i32", torch.int64: "i64"}


@dataclass(frozen=True)
class Case:
    """One fixed input set for one kernel: ``run(device)`` runs the op there and returns its
    outputs together with the torch reference's."""

    name: str
    kernel: str
    run: Callable[[torch.device], Outputs]


def generator(name: str) -> torch.Generator:
    """A CPU generator seeded from the case's name (stable across runs and case order)."""
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of ``t`` on ``device``, never ``t`` itself (on the CPU too): the reference's
    tensors stay apart from the op's."""
    return t.to(device, copy=True)


def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(as_bytes(t).numpy().tobytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# store_cache


def bad_indices(pool: int, index_dtype: torch.dtype) -> list[int]:
    """Indices the kernel must skip. The int64 ones include values whose low 32 bits are a
    valid row, so a kernel that truncated indices to int32 would write them."""
    out = [-1, pool, pool + 7, -pool, -(2**31), 2**31 - 1]
    if index_dtype == torch.int64:
        out += [2**32 + 5, -(2**32) + 3, 2**40, -(2**62)]
    return out


def make_indices(n: int, pool: int, index_dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Distinct valid rows, with out-of-range entries at random positions (about a third of
    them for short inputs, all of ``bad_indices`` for long ones)."""
    idx = torch.randperm(pool, generator=gen)[:n].to(torch.int64)
    bad = bad_indices(pool, index_dtype)
    count = min(len(bad), n // 2 if n < 16 else len(bad))
    pos = torch.randperm(n, generator=gen)[:count]
    for p, value in zip(pos.tolist(), bad):
        idx[p] = value
    return idx.to(index_dtype)


def store_case(dtype: torch.dtype, row: tuple[int, ...], n: int, index_dtype: torch.dtype, *, pool: int = 600,
               strided_kv: bool = False, strided_cache: bool = False) -> Case:
    """``store_cache`` into ``[pool, *row]`` caches. ``strided_kv``: K and V are slices of a fused
    ``[n, 3, *row]`` tensor; ``strided_cache``: the caches are ``kv[:, 0]`` and ``kv[:, 1]`` of one
    ``[pool, 2, *row]`` buffer (which is hashed whole)."""
    shape = "x".join(map(str, row))
    name = (f"store_cache/{_SHORT[dtype]}-{shape}-{_SHORT[index_dtype]}-n{n}"
            + ("-strided_kv" if strided_kv else "") + ("-strided_cache" if strided_cache else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        if strided_cache:
            kv = rand_bits((pool, 2, *row), dtype, gen)
            bufs = {"kv_cache": kv}
        else:
            bufs = {"k_cache": rand_bits((pool, *row), dtype, gen), "v_cache": rand_bits((pool, *row), dtype, gen)}
        if strided_kv:
            qkv = rand_bits((n, 3, *row), dtype, gen)
            k, v = qkv[:, 1], qkv[:, 2]
        else:
            k, v = rand_bits((n, *row), dtype, gen), rand_bits((n, *row), dtype, gen)
        idx = make_indices(n, pool, index_dtype, gen)

        def caches(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return (b["kv_cache"][:, 0], b["kv_cache"][:, 1]) if strided_cache else (b["k_cache"], b["v_cache"])

        ref = {key: t.clone() for key, t in bufs.items()}
        store.ref_store_cache(*caches(ref), idx, k, v)

        dev = {key: to_device(t, device) for key, t in bufs.items()}
        if strided_kv:
            qkv_d = to_device(qkv, device)
            k_d, v_d = qkv_d[:, 1], qkv_d[:, 2]
        else:
            k_d, v_d = to_device(k, device), to_device(v, device)
        ops.store_cache(*caches(dev), to_device(idx, device), k_d, v_d)
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "store_cache", run)


# --------------------------------------------------------------------------------------------
# indexing


def indexing_case(dtype: torch.dtype, hidden: int, n: int, id_dtype: torch.dtype, *, rows: int = 300,
                  vocab_range: tuple[int, int] | None = None, strided_weight: bool = False,
                  out_view: bool = False) -> Case:
    """``indexing`` from a ``[rows, hidden]`` table. ``vocab_range``: a shard ``(start, length)``
    (``length <= rows``: the rows past it are padding that must never be read);
    ``strided_weight``: the table is a column slice of a wider one; ``out_view``: ``out=`` is a
    strided slice of a wider buffer (hashed whole)."""
    name = (f"indexing/{_SHORT[dtype]}-h{hidden}-{_SHORT[id_dtype]}-n{n}"
            + (f"-shard{vocab_range[0]}+{vocab_range[1]}" if vocab_range else "")
            + ("-strided_weight" if strided_weight else "") + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        start, length = vocab_range if vocab_range else (0, rows)
        table = rand_bits((rows, 3 * hidden if strided_weight else hidden), dtype, gen)
        ids = torch.randint(max(0, start - 40), start + length + 40, (n,), generator=gen, dtype=torch.int64)
        extremes = [-1, start - 1, start + length, rows, 2**31 - 1, -(2**31)]
        if id_dtype == torch.int64:
            extremes += [2**32 + start + 1, 2**40]  # low 32 bits inside the range
        for p, value in zip(torch.randperm(n, generator=gen).tolist(), extremes[: n // 2 if n < 16 else None]):
            ids[p] = value
        ids = ids.to(id_dtype)
        buf = rand_bits((n, 3 * hidden), dtype, gen) if out_view else None

        def weight_of(t: torch.Tensor) -> torch.Tensor:
            return t[:, hidden : 2 * hidden] if strided_weight else t

        if out_view:
            want = buf.clone()
            indexing.ref_indexing(want[:, hidden : 2 * hidden], weight_of(table), ids, start, length)
        else:
            want = torch.empty((n, hidden), dtype=dtype)
            indexing.ref_indexing(want, weight_of(table), ids, start, length)

        table_d = to_device(table, device)
        if out_view:
            buf_d = to_device(buf, device)
            out_d = buf_d[:, hidden : 2 * hidden]
            res = ops.indexing(weight_of(table_d), to_device(ids, device), out=out_d, vocab_range=vocab_range)
            if res.data_ptr() != out_d.data_ptr():
                raise AssertionError(f"{name}: indexing(out=...) did not return out")
            got = buf_d.cpu()
        else:
            got = ops.indexing(weight_of(table_d), to_device(ids, device), vocab_range=vocab_range).cpu()
        return {"out": (got, want)}

    return Case(name, "indexing", run)


# --------------------------------------------------------------------------------------------
# scale


def scale_input(dtype: torch.dtype, size: int, gen: torch.Generator) -> torch.Tensor:
    """Normal values of several magnitudes, and the special values of ``dtype`` (infinities,
    zeros of both signs, the largest finite value, subnormals), no NaN."""
    x = torch.randn(size, generator=gen) * torch.exp2(torch.randint(-20, 21, (size,), generator=gen).float())
    x = x.to(dtype)
    fi = torch.finfo(dtype)
    specials = [float("inf"), float("-inf"), 0.0, -0.0, fi.max, -fi.max, fi.smallest_normal, fi.tiny / 4, -fi.eps]
    for p, value in zip(torch.randperm(size, generator=gen).tolist(), specials[: max(0, size - 1)]):
        x[p] = value
    if torch.isnan(x).any():
        raise AssertionError("scale inputs must hold no NaN")
    return x


def scale_case(dtype: torch.dtype, n: int, factor: float, *, offset: int = 0, out_view: bool = False) -> Case:
    """``scale`` of ``n`` elements. ``offset``: the input starts ``offset`` elements into its
    buffer (1: misaligned, the scalar path); ``out_view``: ``out=`` is the slice ``[1, n + 1)``
    of a buffer of ``n + 2`` (hashed whole)."""
    name = (f"scale/{_SHORT[dtype]}-n{n}-f{factor!r}" + (f"-offset{offset}" if offset else "")
            + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = scale_input(dtype, n + offset, gen)
        x = base[offset:]
        # fp32 arithmetic with the factor rounded to fp32, rounded once to the dtype.
        want = (x.to(torch.float32) * torch.tensor(factor, dtype=torch.float32)).to(dtype)
        x_d = to_device(base, device)[offset:]
        if out_view:
            buf = scale_input(dtype, n + 2, gen)
            expect = buf.clone()
            expect[1 : n + 1] = want
            buf_d = to_device(buf, device)
            res = ops.scale(x_d, factor, out=buf_d[1 : n + 1])
            if res.data_ptr() != buf_d[1:].data_ptr():
                raise AssertionError(f"{name}: scale(out=...) did not return out")
            return {"out": (buf_d.cpu(), expect)}
        return {"out": (ops.scale(x_d, factor).cpu(), want)}

    return Case(name, "scale", run)


# --------------------------------------------------------------------------------------------
# ----- per_token_quant_fp8


def quant_input(dtype: torch.dtype, tokens: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """Normal rows, each of its own magnitude; where there are rows enough, a zero row, a row of
    -0.0, a row holding the dtype's largest finite value and one holding subnormals. No NaN and
    no infinity: either makes a NaN, whose sign the GPU and the CPU choose differently."""
    span = 10 if dtype == torch.float16 else 20  # fp16 overflows past 65504
    mag = torch.exp2(torch.randint(-span, span + 1, (tokens, 1), generator=gen).float())
    x = (torch.randn(tokens, width, generator=gen) * mag).to(dtype)
    fi = torch.finfo(dtype)
    specials = [0.0, -0.0, None, None]
    for i, value in enumerate(specials[: max(0, tokens - 1)]):
        if value is not None:
            x[i + 1] = value
    if tokens > 3:
        x[3, width // 2] = -fi.max
    if tokens > 4:
        x[4] = x[4].float().mul(fi.tiny).to(dtype)
    if not torch.isfinite(x).all():
        raise AssertionError("per_token_quant_fp8 inputs must be finite")
    return x


def quant_case(dtype: torch.dtype, hidden: int, tokens: int, *, row_pad: int = 0, offset: int = 0,
               out_view: bool = False) -> Case:
    """``per_token_quant_fp8`` of ``tokens`` rows of ``hidden``. ``row_pad``/``offset``: the rows
    are ``x[:, offset : offset + hidden]`` of a ``hidden + row_pad`` wide buffer (an odd offset:
    the scalar variant); ``out_view``: ``out=`` is a view ``hidden`` bytes into a buffer of
    random bytes two rows longer (hashed whole)."""
    name = (f"per_token_quant_fp8/{_SHORT[dtype]}-h{hidden}-t{tokens}" + (f"-pad{row_pad}" if row_pad else "")
            + (f"-offset{offset}" if offset else "") + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = quant_input(dtype, tokens, hidden + row_pad, gen)
        x = base[:, offset : offset + hidden]
        want_q, want_scales = quant.ref_per_token_quant_fp8(x)
        x_d = to_device(base, device)[:, offset : offset + hidden]
        if out_view:
            buf = torch.randint(0, 256, ((tokens + 2) * hidden,), dtype=torch.uint8, generator=gen)
            expect = buf.clone()
            expect[hidden : (tokens + 1) * hidden] = want_q.view(torch.uint8).reshape(-1)
            buf_d = to_device(buf, device)
            out = buf_d[hidden : (tokens + 1) * hidden].view(torch.float8_e4m3fn).view(tokens, hidden)
            q, scales = ops.per_token_quant_fp8(x_d, out=out)
            if q.data_ptr() != out.data_ptr():
                raise AssertionError(f"{name}: per_token_quant_fp8(out=...) did not return out")
            return {"q": (buf_d.cpu(), expect), "scales": (scales.cpu(), want_scales)}
        q, scales = ops.per_token_quant_fp8(x_d)
        return {"q": (q.cpu(), want_q), "scales": (scales.cpu(), want_scales)}

    return Case(name, "per_token_quant_fp8", run)


def quant_cases() -> list[Case]:
    """Four builds: bf16 x 4096 (4 warps), fp16 x 5120 (5 warps), fp32 x 100 (one warp, and the
    scalar variant for misaligned rows), bf16 x 7 (scalar only)."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    return [
        quant_case(bf16, 4096, 0),
        quant_case(bf16, 4096, 1),
        quant_case(bf16, 4096, 33),
        quant_case(bf16, 4096, 7, row_pad=512, offset=256),
        quant_case(bf16, 4096, 7, out_view=True),
        quant_case(fp16, 5120, 9),
        quant_case(fp16, 5120, 5, row_pad=8, offset=8, out_view=True),
        quant_case(fp32, 100, 513),
        quant_case(fp32, 100, 17, row_pad=3, offset=1),
        quant_case(bf16, 7, 65),
        quant_case(bf16, 7, 9, row_pad=1, offset=1, out_view=True),
    ]


# --------------------------------------------------------------------------------------------
# ----- per_token_group_quant_fp8


def group_quant_input(dtype: torch.dtype, tokens: int, width: int, group_size: int, gen: torch.Generator,
                      specials: bool) -> torch.Tensor:
    """Normal values, each group of its own magnitude; with ``specials``, row 0's groups are
    zeros, -0.0, one NaN, two infinities, subnormals and the dtype's largest finite value (the
    kernel writes one NaN for all: 0x7fffffff scales, 0x7f values)."""
    span = 10 if dtype == torch.float16 else 20
    groups = width // group_size
    mag = torch.exp2(torch.randint(-span, span + 1, (tokens, groups, 1), generator=gen).float())
    x = (torch.randn(tokens, groups, group_size, generator=gen) * mag).to(dtype)
    if specials:
        fi = torch.finfo(dtype)
        x[0, 0] = 0.0
        x[0, 1] = -0.0
        x[0, 2, 3] = float("nan")
        x[0, 3, 1], x[0, 3, 2] = float("inf"), float("-inf")
        x[0, 4] = fi.smallest_normal * fi.eps * torch.arange(group_size)
        x[0, 5, 0] = -fi.max
    return x.view(tokens, width)


def group_quant_case(dtype: torch.dtype, group_size: int, tokens: int, groups: int, *, column_major: bool = False,
                     ue8m0: bool = False, offset: int = 0, specials: bool = False, eps: float = 1e-10) -> Case:
    """``per_token_group_quant_fp8`` of ``tokens`` rows of ``groups`` groups. ``offset``: the rows
    are ``x[:, offset : offset + hidden]`` of a buffer ``2 * offset`` wider (odd: the scalar
    variant); the scales are hashed as their view (the column-major padding is not written)."""
    layout = ("col" if column_major else "row") + ("-ue8m0" if ue8m0 else "")
    name = (f"per_token_group_quant_fp8/{_SHORT[dtype]}-g{group_size}-t{tokens}-n{groups}-{layout}"
            + (f"-offset{offset}" if offset else "") + ("-specials" if specials else "")
            + (f"-eps{eps:g}" if eps != 1e-10 else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        hidden = groups * group_size
        base = group_quant_input(dtype, tokens, hidden + 2 * offset, 1 if offset else group_size, gen, specials)
        x = base[:, offset : offset + hidden]
        want_q, want_scales = group_quant.ref_per_token_group_quant_fp8(x, group_size, column_major, ue8m0, eps)
        x_d = to_device(base, device)[:, offset : offset + hidden]
        q, scales = ops.per_token_group_quant_fp8(x_d, group_size, column_major_scales=column_major,
                                                  scale_ue8m0=ue8m0, eps=eps)
        if scales.stride() != want_scales.stride():
            raise AssertionError(f"{name}: scales of strides {scales.stride()}, want {want_scales.stride()}")
        return {"q": (q.cpu(), want_q), "scales": (scales.cpu(), want_scales)}

    return Case(name, "per_token_group_quant_fp8", run)


def group_quant_cases() -> list[Case]:
    """Each dtype and scale layout: bf16 x 128 (16 lanes a group, several blocks), fp16 x 64
    column-major, fp32 x 16 packed UE8M0 (a padding byte), bf16 x 128 row-major UE8M0, bf16 x 32
    rows at an odd offset (the scalar variant), and bf16 x 16 special groups with eps 0."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    return [
        group_quant_case(bf16, 128, 33, 8),
        group_quant_case(fp16, 64, 9, 10, column_major=True),
        group_quant_case(fp32, 16, 5, 7, column_major=True, ue8m0=True),
        group_quant_case(bf16, 128, 7, 7, ue8m0=True),
        group_quant_case(bf16, 32, 7, 8, column_major=True, ue8m0=True, offset=3),
        group_quant_case(bf16, 16, 3, 8, specials=True, eps=0.0),
    ]


# --------------------------------------------------------------------------------------------
# rotary_embedding


def rope_cache(rot_dim: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, rot_dim]`` cos/sin of position x 10000**(-2i/rot_dim), computed in float64 and
    rounded once to ``dtype`` (on the CPU, so both devices see the same bytes)."""
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    ang = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(dtype)


def rope_input(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Finite values of several magnitudes, zeros of both signs; no NaN or infinity (a NaN's
    payload, and inf * 0, are not the same on both sides)."""
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-12, 9, shape, generator=gen).float())
    flat = x.view(-1)
    if flat.numel() >= 2:
        flat[0], flat[-1] = 0.0, -0.0
    return x.to(dtype)


def rope_case(dtype: torch.dtype, head_dim: int, rot_dim: int, is_neox: bool, n: int, q_heads: int, k_heads: int,
              pos_dtype: torch.dtype, *, cache_dtype: torch.dtype = torch.float32, max_pos: int = 300,
              layout: str = "2d") -> Case:
    """``rotary_embedding`` of ``n`` tokens, with out-of-range positions mixed in (``bad_indices``).
    ``layout``: ``2d`` / ``3d`` separate q and k; ``fused``: q and k are column slices of one
    ``[n, (q_heads + 2 k_heads) * head_dim]`` QKV buffer, hashed whole (v must stay as it was);
    ``offset``: 3-d q and k start one element into their buffers (the scalar variant)."""
    name = (f"rotary_embedding/{_SHORT[dtype]}-d{head_dim}-r{rot_dim}-{'neox' if is_neox else 'gptj'}"
            f"-q{q_heads}k{k_heads}-{_SHORT[pos_dtype]}-n{n}-cache_{_SHORT[cache_dtype]}-{layout}")

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        cache = rope_cache(rot_dim, max_pos, cache_dtype)
        pos = make_indices(n, max_pos, pos_dtype, gen) if n <= max_pos else torch.randint(
            0, max_pos, (n,), generator=gen).to(pos_dtype)
        if n > max_pos:
            for p, value in zip(torch.randperm(n, generator=gen).tolist(), bad_indices(max_pos, pos_dtype)):
                pos[p] = value
        qs, ks = q_heads * head_dim, k_heads * head_dim
        if layout == "fused":
            bufs = {"qkv": rope_input((n, qs + 2 * ks), dtype, gen)}
        elif layout == "offset":
            bufs = {"q": rope_input((n * qs + 1,), dtype, gen), "k": rope_input((n * ks + 1,), dtype, gen)}
        else:
            bufs = {"q": rope_input((n, qs), dtype, gen), "k": rope_input((n, ks), dtype, gen)}

        def views(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            if layout == "fused":
                return b["qkv"][:, :qs], b["qkv"][:, qs : qs + ks]
            if layout == "offset":
                return b["q"][1:].view(n, q_heads, head_dim), b["k"][1:].view(n, k_heads, head_dim)
            if layout == "3d":
                return b["q"].view(n, q_heads, head_dim), b["k"].view(n, k_heads, head_dim)
            return b["q"], b["k"]

        ref = {key: t.clone() for key, t in bufs.items()}
        rope.ref_rotary_embedding(pos, *views(ref), cache, is_neox, head_dim)
        dev = {key: to_device(t, device) for key, t in bufs.items()}
        ops.rotary_embedding(to_device(pos, device), *views(dev), to_device(cache, device), is_neox,
                             head_dim=head_dim)
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "rotary_embedding", run)


def rope_cases() -> list[Case]:
    """Four builds: bf16/rot 128/neox (Llama-3 heads), fp16/rot 64/gpt-j, fp32/rot 32/gpt-j
    (partial, head_dim 64) and fp16/rot 6/neox (partial, head_dim 10: the scalar variant only)."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    i32, i64 = torch.int32, torch.int64
    return [
        rope_case(bf16, 128, 128, True, 0, 32, 8, i64),
        rope_case(bf16, 128, 128, True, 7, 32, 8, i64),
        rope_case(bf16, 128, 128, True, 513, 8, 2, i32, cache_dtype=bf16, layout="fused"),
        rope_case(bf16, 128, 128, True, 33, 4, 1, i64, layout="offset"),
        rope_case(fp16, 64, 64, False, 33, 8, 2, i64, layout="3d"),
        rope_case(fp16, 64, 64, False, 513, 2, 1, i32, cache_dtype=fp16, layout="fused"),
        rope_case(fp32, 64, 32, False, 33, 3, 1, i32),
        rope_case(fp32, 64, 32, False, 7, 2, 2, i64, layout="offset"),
        rope_case(fp16, 10, 6, True, 513, 3, 1, i64, layout="3d"),
    ]


def rope_store_case(dtype: torch.dtype, head_dim: int, rot_dim: int, is_neox: bool, n: int, q_heads: int,
                    k_heads: int, index_dtype: torch.dtype, *, pool: int = 600, layout: str = "2d") -> Case:
    """``rotary_embedding_store`` of ``n`` tokens into ``[pool, k_heads * head_dim]`` caches, with
    out-of-range positions and cache rows mixed in (``make_indices``; the positions in the cache's
    300 rows). ``layout``: ``2d`` separate q, k and v; ``fused``: q, k and v are column slices of
    one QKV buffer and the caches ``kv[:, 0]`` and ``kv[:, 1]`` of one ``[pool, 2, k_heads,
    head_dim]`` buffer (3-d, strided rows), each hashed whole; ``offset``: 3-d q, k and v start one
    element into their buffers (the scalar variant). The caches start as random finite values."""
    name = (f"rotary_embedding_store/{_SHORT[dtype]}-d{head_dim}-r{rot_dim}-{'neox' if is_neox else 'gptj'}"
            f"-q{q_heads}k{k_heads}-{_SHORT[index_dtype]}-n{n}-{layout}")

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        cache = rope_cache(rot_dim, 300, torch.float32)
        pos = make_indices(min(n, 300), 300, index_dtype, gen).repeat(n // 300 + 1)[:n]
        loc = make_indices(n, pool, index_dtype, gen)
        qs, ks = q_heads * head_dim, k_heads * head_dim
        if layout == "fused":
            bufs = {"qkv": rope_input((n, qs + 2 * ks), dtype, gen), "kv": rope_input((pool, 2, ks), dtype, gen)}
        else:
            extra = 1 if layout == "offset" else 0
            bufs = {name: rope_input((n * w + extra,), dtype, gen) for name, w in (("q", qs), ("k", ks), ("v", ks))}
            bufs.update(k_cache=rope_input((pool, ks), dtype, gen), v_cache=rope_input((pool, ks), dtype, gen))

        def views(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            if layout == "fused":
                qkv, kv = b["qkv"], b["kv"].view(pool, 2, k_heads, head_dim)
                return qkv[:, :qs], qkv[:, qs : qs + ks], qkv[:, qs + ks :], kv[:, 0], kv[:, 1]
            start = 1 if layout == "offset" else 0
            heads = [b[name][start:].view(n, h, head_dim)
                     for name, h in (("q", q_heads), ("k", k_heads), ("v", k_heads))]
            return (*heads, b["k_cache"], b["v_cache"])

        ref = {key: t.clone() for key, t in bufs.items()}
        q, k, v, kc, vc = views(ref)
        rope_store.ref_rotary_embedding_store(pos, q, k, v, cache, kc, vc, loc, is_neox, head_dim)
        dev = {key: to_device(t, device) for key, t in bufs.items()}
        q, k, v, kc, vc = views(dev)
        ops.rotary_embedding_store(to_device(pos, device), q, k, v, to_device(cache, device), kc, vc,
                                   to_device(loc, device), is_neox, head_dim=head_dim)
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "rotary_embedding_store", run)


def rope_store_cases() -> list[Case]:
    """rope's builds (``rope_cases``) with the store: Llama-3 heads at decode and prefill sizes,
    a fused QKV tensor with 3-d strided caches, partial rotary, and the scalar variant."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    i32, i64 = torch.int32, torch.int64
    return [
        rope_store_case(bf16, 128, 128, True, 0, 32, 8, i64),
        rope_store_case(bf16, 128, 128, True, 7, 32, 8, i64),
        rope_store_case(bf16, 128, 128, True, 513, 8, 2, i32, layout="fused"),
        rope_store_case(fp16, 64, 64, False, 33, 8, 2, i64, layout="fused"),
        rope_store_case(fp32, 64, 32, False, 33, 3, 1, i32),
        rope_store_case(fp16, 10, 6, True, 37, 3, 1, i64, layout="offset"),
    ]


# --------------------------------------------------------------------------------------------
# ----- rmsnorm


def norm_input(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Normal rows, each of its own magnitude (2**-20 to 2**20; float16: 2**-10 to 2**10, its
    range), zeros of both signs, and where there are rows enough a zero row (whose result is 0).
    No NaN and no infinity (a NaN's payload is not the same on both sides)."""
    rows = 1
    for n in shape[:-1]:
        rows *= n
    span = 10 if dtype == torch.float16 else 20
    mag = torch.exp2(torch.randint(-span, span + 1, (rows, 1), generator=gen).float())
    x = (torch.randn(rows, shape[-1], generator=gen) * mag).to(dtype)
    if not torch.isfinite(x).all():
        raise AssertionError("rmsnorm inputs must be finite")
    if rows > 2:
        x[1] = 0.0
        x[2, 0], x[2, -1] = 0.0, -0.0
    return x.view(shape)


def norm_case(dtype: torch.dtype, hidden: int, lead: tuple[int, ...], *, fused: bool = False, row_pad: int = 0,
              eps: float = 1e-6) -> Case:
    """``rmsnorm`` (or ``fused_add_rmsnorm``, ``fused``) of ``[*lead, hidden]`` rows. ``row_pad``:
    every tensor the op reads or writes is ``[..., :hidden]`` of a buffer ``hidden + row_pad``
    wide (strided rows; the buffers are hashed whole, the padding must stay as it was)."""
    shape = "x".join(map(str, lead)) or "1d"
    name = (f"{'fused_add_rmsnorm' if fused else 'rmsnorm'}/{_SHORT[dtype]}-h{hidden}-{shape}-eps{eps!r}"
            + (f"-pad{row_pad}" if row_pad else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        width = hidden + row_pad
        weight = torch.randn(hidden, generator=gen).to(dtype)
        bufs = {"x": norm_input(dtype, (*lead, width), gen)}
        bufs["residual" if fused else "out"] = norm_input(dtype, (*lead, width), gen)

        def views(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {key: t[..., :hidden] for key, t in b.items()}

        ref = {key: t.clone() for key, t in bufs.items()}
        dev = {key: to_device(t, device) for key, t in bufs.items()}
        w_d = to_device(weight, device)
        r, d = views(ref), views(dev)
        if fused:
            norm.ref_fused_add_rmsnorm(r["x"], r["residual"], weight, eps)
            ops.fused_add_rmsnorm(d["x"], d["residual"], w_d, eps)
        elif row_pad:
            norm.ref_rmsnorm(r["out"], r["x"], weight, eps)
            if ops.rmsnorm(d["x"], w_d, eps, out=d["out"]).data_ptr() != d["out"].data_ptr():
                raise AssertionError(f"{name}: rmsnorm(out=...) did not return out")
        else:  # a new output
            want = torch.empty((*lead, hidden), dtype=dtype)
            norm.ref_rmsnorm(want, r["x"], weight, eps)
            got = ops.rmsnorm(d["x"], w_d, eps).cpu()
            return {"out": (got, want), "x": (dev["x"].cpu(), ref["x"])}
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "rmsnorm", run)


def norm_cases() -> list[Case]:
    """Four builds: bf16 x 4096 (a block of 128 threads per row), fp16 x 5120 (160 threads),
    fp32 x 1000 (64 threads whose last vectors are missing), fp16 x 128 (groups of 4 lanes, 32
    rows per block)."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    return [
        norm_case(bf16, 4096, (0,)),
        norm_case(bf16, 4096, ()),
        norm_case(bf16, 4096, (33,)),
        norm_case(bf16, 4096, (7,), row_pad=512),
        norm_case(bf16, 4096, (2, 9), fused=True),
        norm_case(bf16, 4096, (7,), fused=True, row_pad=8, eps=1e-5),
        norm_case(fp16, 5120, (9,)),
        norm_case(fp16, 5120, (5,), fused=True),
        norm_case(fp32, 1000, (17,), eps=1e-2),
        norm_case(fp32, 1000, (7,), fused=True, row_pad=4),
        norm_case(fp16, 128, (513,)),
        norm_case(fp16, 128, (19, 8), row_pad=64),
        norm_case(fp16, 128, (513,), fused=True, row_pad=8),
    ]


def qk_norm_case(dtype: torch.dtype, head_dim: int, tokens: int, q_heads: int, k_heads: int, *,
                 k_2d: bool = False) -> Case:
    """``qk_norm`` of q and k sliced from one fused QKV buffer (3-d q, 3-d or 2-d k); the whole
    buffer is hashed, so v's columns must stay as they were."""
    name = f"qk_norm/{_SHORT[dtype]}-d{head_dim}-t{tokens}-q{q_heads}k{k_heads}" + ("-k2d" if k_2d else "")

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        width = (q_heads + 2 * k_heads) * head_dim
        qkv = norm_input(dtype, (tokens * (q_heads + 2 * k_heads), head_dim), gen).view(tokens, width)
        wq, wk = (torch.randn(head_dim, generator=gen).to(dtype) for _ in range(2))

        def views(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            k = b[:, q_heads * head_dim:(q_heads + k_heads) * head_dim]
            return b[:, :q_heads * head_dim].view(tokens, q_heads, head_dim), (
                k if k_2d else k.view(tokens, k_heads, head_dim))

        ref, dev = qkv.clone(), to_device(qkv, device)
        qk.ref_qk_norm(*views(ref), wq, wk, 1e-6)
        ops.qk_norm(*views(dev), to_device(wq, device), to_device(wk, device), 1e-6)
        return {"qkv": (dev.cpu(), ref)}

    return Case(name, "qk_norm", run)


def qk_norm_cases() -> list[Case]:
    """bf16 x 128 (8 lanes a head), fp16 x 64 (4 lanes), fp32 x 256 (16 lanes), bf16 x 1024 (a
    warp of 4 vectors a lane)."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    return [
        qk_norm_case(bf16, 128, 0, 8, 1),
        qk_norm_case(bf16, 128, 1, 8, 1),
        qk_norm_case(bf16, 128, 37, 16, 2, k_2d=True),
        qk_norm_case(fp16, 64, 9, 4, 4),
        qk_norm_case(fp32, 256, 5, 3, 1, k_2d=True),
        qk_norm_case(bf16, 1024, 3, 2, 1),
    ]


# --------------------------------------------------------------------------------------------
# ----- silu_and_mul, gelu_and_mul (kernel file activation/act_and_mul.cuh)
#
# The activations are not torch's libm, so their outputs are not torch's bits: each is checked
# here against the float64 formula within the bound the ops document
# (act_tests.act_and_mul_bound), and a ReferenceMismatch is raised otherwise. fp32 is built
# from IEEE-rounded operations (the same bits on the GPU and the emulator): an exact case, hashed
# after that check. fp16 and bf16 use the hardware's approximate exp2 and reciprocal: bound
# cases (``Within``).

ACT_OPS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_tanh": "gelu_and_mul"}


def act_check(name: str, x: torch.Tensor, got: torch.Tensor, activation: str) -> float:
    """``got`` against the float64 result of ``x`` within ``act_tests.act_and_mul_bound`` (where
    that rounds to an infinity or NaN, ``got`` must be it); the largest error in units of the
    bound's ulp (fp16/bf16: ulps of the dtype). Raises ``ReferenceMismatch`` naming the case."""
    dtype = x.dtype
    ref = act_tests.ref_act_and_mul(x, activation)
    special = ~ref.to(dtype).isfinite()
    err = (got.double() - ref).abs()
    bound = act_tests.act_and_mul_bound(x, ref, activation)
    ok = torch.where(special, got.double() == ref.to(dtype).double(), err <= bound)
    if not bool(ok.all()):
        i = int((~ok).reshape(-1).nonzero()[0])
        raise ReferenceMismatch(f"{name}: 'out' is not within the documented bound of the float64 result: "
                                f"element {i}: got {got.reshape(-1)[i].item()!r}, float64 {ref.reshape(-1)[i].item()!r}, "
                                f"bound {bound.reshape(-1)[i].item():.3g}")
    ulps = err[~special] / oracle.ulp(ref[~special], dtype)
    return float(ulps.max()) if ulps.numel() else 0.0


def act_input(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Gate and up values of several magnitudes; zeros of both signs, subnormals and the largest
    finite values among the gates. No NaN and no infinity (a NaN's bits differ between the GPU
    and the CPU; ``act(inf) * 0`` is one)."""
    span = 4 if dtype == torch.float16 else 8
    mag = torch.exp2(torch.randint(-span, span + 1, shape, generator=gen).float())
    x = (torch.randn(shape, generator=gen) * mag).to(dtype)
    fi = torch.finfo(dtype)
    gates = x[..., : shape[-1] // 2].reshape(-1).clone()
    specials = [0.0, -0.0, fi.tiny / 4, -fi.tiny / 4, fi.max, -fi.max, 30.0, -30.0, -90.0, -110.0]
    for p, value in zip(torch.randperm(gates.numel(), generator=gen).tolist(), specials[: gates.numel() // 2]):
        gates[p] = value
    x[..., : shape[-1] // 2] = gates.reshape(x[..., : shape[-1] // 2].shape)
    if not torch.isfinite(x).all():
        raise AssertionError("act_and_mul inputs must be finite")
    return x


def act_case(activation: str, dtype: torch.dtype, rows: tuple[int, ...], d: int, *, row_pad: int = 0,
             offset: int = 0, out_view: bool = False) -> Case:
    """``activation``-and-mul of ``rows`` rows (``(tokens,)`` or ``(batch, tokens)``) of ``2 d``.
    ``row_pad``/``offset``: x is ``[..., offset : offset + 2 d]`` of rows ``2 d + row_pad`` wide
    (an odd offset: the scalar variant); ``out_view``: ``out=`` starts one element into a buffer
    two rows longer than it (hashed whole)."""
    name = (f"{ACT_OPS[activation]}/{activation}-{_SHORT[dtype]}-d{d}-r{'x'.join(map(str, rows))}"
            + (f"-pad{row_pad}" if row_pad else "") + (f"-offset{offset}" if offset else "")
            + ("-out_view" if out_view else ""))
    approximate = "tanh" if activation == "gelu_tanh" else "none"

    def call(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if activation == "silu":
            return ops.silu_and_mul(x, out=out)
        return ops.gelu_and_mul(x, approximate, out=out)

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = act_input(dtype, (*rows, 2 * d + row_pad), gen)
        x = base[..., offset : offset + 2 * d]
        x_d = to_device(base, device)[..., offset : offset + 2 * d]
        n = math.prod(rows) * d
        if out_view:
            buf = act_input(dtype, (n + 2 * d + 1,), gen)
            buf_d = to_device(buf, device)
            out_d = buf_d[1 : n + 1].view(*rows, d)
            if call(x_d, out_d).data_ptr() != out_d.data_ptr():
                raise AssertionError(f"{name}: out= was not returned")
            whole = buf_d.cpu()
            got = whole[1 : n + 1].view(*rows, d)
            if not same_bytes(torch.cat([whole[:1], whole[n + 1 :]]), torch.cat([buf[:1], buf[n + 1 :]])):
                raise ReferenceMismatch(f"{name}: bytes outside 'out' were written")
        else:
            got = call(x_d, None).cpu()
            whole = got
        max_ulps = act_check(name, x, got, activation)
        if dtype == torch.float32:
            return {"out": (whole, whole.clone())}  # exact: the hash of the checked output
        return {"out": Within(whole, act_tests.ACT_BOUND_ULPS[activation, dtype], max_ulps)}

    return Case(name, "act_and_mul", run)


def act_cases() -> list[Case]:
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    out = []
    for activation in ("silu", "gelu", "gelu_tanh"):
        for dtype in (bf16, fp16, fp32):
            out += [
                act_case(activation, dtype, (1,), 8),
                act_case(activation, dtype, (7,), 1000),
                act_case(activation, dtype, (5,), 136, row_pad=24, offset=1),  # strided, misaligned: scalar
                act_case(activation, dtype, (2, 3), 64, row_pad=16),  # 3-d, strided rows, vectors
            ]
        out.append(act_case(activation, bf16, (33,), 4096))
        out.append(act_case(activation, fp16, (3,), 40, out_view=True))
        out.append(act_case(activation, fp32, (0,), 16))
    return out


# --------------------------------------------------------------------------------------------
# The fixed set. Specializations (each costs a CPU build): store_cache rows of 1152 B (576 x
# 2-byte), 2048 B, 512 B, 256 B and 6 B; indexing rows of 1152 B, 400 B and 6 B; scale x 3.


def cases() -> list[Case]:
    bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
    i32, i64 = torch.int32, torch.int64
    out = [
        # 576 x 2 bytes (an MLA latent row), 3-d bf16 and 2-d fp16 share the build.
        *(store_case(bf16, (1, 576), n, i64) for n in (0, 1, 7, 513)),
        store_case(bf16, (1, 576), 7, i32),
        store_case(fp16, (576,), 7, i32, strided_kv=True),
        store_case(fp16, (576,), 513, i64, strided_kv=True),
        # 8 heads x 128, fused QKV inputs and K/V halves of one cache buffer.
        store_case(bf16, (8, 128), 7, i32, strided_kv=True, strided_cache=True),
        store_case(bf16, (8, 128), 513, i64, strided_kv=True, strided_cache=True),
        store_case(fp16, (8, 128), 513, i32),
        # 512 B rows of fp32, 3-d and 2-d.
        store_case(fp32, (4, 32), 7, i64),
        store_case(fp32, (128,), 513, i32, strided_cache=True),
        # fp8 (e4m3), 256 B rows.
        store_case(fp8, (2, 128), 1, i32),
        store_case(fp8, (2, 128), 7, i64, strided_kv=True),
        store_case(fp8, (256,), 513, i64),
        # 6-byte rows (3 x fp16): 2-byte accesses.
        store_case(fp16, (3,), 7, i32),
        store_case(fp16, (1, 3), 513, i64, strided_kv=True, strided_cache=True),
        # indexing: full tables and vocabulary shards.
        indexing_case(bf16, 576, 0, i64),
        indexing_case(bf16, 576, 1, i32),
        indexing_case(bf16, 576, 7, i64),
        indexing_case(bf16, 576, 513, i64, out_view=True),
        indexing_case(fp16, 576, 513, i32, rows=260, vocab_range=(250, 200), strided_weight=True),
        indexing_case(fp16, 576, 7, i64, rows=200, vocab_range=(1000, 200), out_view=True),
        indexing_case(fp32, 100, 7, i32),
        indexing_case(fp32, 100, 513, i64, rows=120, vocab_range=(0, 100), out_view=True),
        indexing_case(fp8, 6, 7, i64),
        indexing_case(fp8, 6, 513, i32, rows=90, vocab_range=(37, 80), strided_weight=True, out_view=True),
        *rope_cases(),  # rotary_embedding
        *rope_store_cases(),  # rotary_embedding_store
    ]
    for dtype, sizes in ((fp16, (1, 7, 4099)), (bf16, (9, 100003)), (fp32, (5, 4099))):
        for n in sizes:
            for factor in (1.7, -0.3, 1e-40):
                out.append(scale_case(dtype, n, factor))
        out.append(scale_case(dtype, 1031, -2.5, offset=1))
        out.append(scale_case(dtype, 1029, 0.5, out_view=True))
    out.append(scale_case(fp16, 0, 1.7))
    out.extend(quant_cases())
    out.extend(group_quant_cases())  # per_token_group_quant_fp8
    out.extend(norm_cases())  # rmsnorm, fused_add_rmsnorm
    out.extend(qk_norm_cases())
    out.extend(act_cases())  # silu_and_mul, gelu_and_mul
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise AssertionError("case names must be unique")
    return out


# --------------------------------------------------------------------------------------------


class ReferenceMismatch(AssertionError):
    """An op's output differs from the torch reference."""


def run_case(case: Case, device: torch.device) -> dict[str, dict]:
    """Run one case; check every exact output against the reference byte for byte (a bound one
    was checked by the case); its records: shape, dtype, ``exact``, and the hash (exact) or the
    bound and the largest error in ulps (bound)."""
    result = {}
    for key, value in case.run(device).items():
        if isinstance(value, Within):
            got = value.got
            result[key] = {"shape": list(got.shape), "dtype": str(got.dtype).removeprefix("torch."), "exact": False,
                           "bound_ulps": value.bound_ulps, "max_ulps": round(value.max_ulps, 4)}
            continue
        got, want = value
        if not same_bytes(got, want):
            detail = ""
            if got.shape == want.shape:
                diff = (as_bytes(got) != as_bytes(want)).nonzero()
                detail = f"; {diff.shape[0]} bytes differ, first at byte index {diff[0].tolist()}"
            raise ReferenceMismatch(f"{case.name}: '{key}' differs from the torch reference ({device}): "
                                    f"got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}{detail}")
        result[key] = {"shape": list(got.shape), "dtype": str(got.dtype).removeprefix("torch."), "exact": True,
                       "sha256": sha256(got)}
    return result


def compute(device: str | torch.device, only: str | None = None) -> dict[str, dict]:
    """Every case's output hashes on ``device`` (``cpu``: the CPU emulator; the ops have no other
    path, so a hash is always a kernel's)."""
    device = torch.device(device)
    return {c.name: run_case(c, device) for c in cases() if only is None or only in c.name}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"kernkit CPU emulator ({platform.machine()})"


def document(device: str | torch.device, hashes: dict[str, dict]) -> dict:
    device = torch.device(device)
    import kernkit

    return {
        "format": FORMAT,
        "source": "gpu" if device.type == "cuda" else "cpu-emulator",
        "device": device_name(device),
        "torch": torch.__version__,
        "kernkit": getattr(kernkit, "__version__", "?"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "cases": hashes,
    }


def dumps(doc: dict) -> str:
    """The hash file's text: the header fields, then one line per case."""
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in doc.items() if k != "cases"]
    body = [f"  {json.dumps(name)}: {json.dumps(outs, separators=(', ', ': '))}"
            for name, outs in doc["cases"].items()]
    return "{\n" + "\n".join(head) + '\n "cases": {\n' + ",\n".join(body) + "\n }\n}\n"


def compare(expected: dict, hashes: dict[str, dict]) -> list[str]:
    """Differences between a hash file's cases and freshly computed ones, one line each, naming
    the case (and the output): for an exact output its shape, dtype and hash; for a bound one its
    shape, dtype and bound (both sides were checked within it when computed)."""
    problems = []
    want = expected.get("cases", {})
    for name in sorted(want.keys() - hashes.keys()):
        problems.append(f"{name}: in the file but not computed (case removed or renamed?)")
    for name in sorted(hashes.keys() - want.keys()):
        problems.append(f"{name}: computed but not in the file (regenerate the file on the GPU)")
    for name in sorted(want.keys() & hashes.keys()):
        w, g = want[name], hashes[name]
        for key in sorted(w.keys() | g.keys()):
            if key not in w or key not in g:
                problems.append(f"{name}: output '{key}' present on one side only")
                continue
            # A bound output's max_ulps is what each device measured: not compared.
            fields = ("shape", "dtype", "exact", "sha256" if g[key].get("exact") else "bound_ulps")
            what = [f for f in fields if w[key].get(f) != g[key].get(f)]
            if what:
                problems.append(f"{name}: output '{key}' differs ({', '.join(what)}): file {w[key]}, computed {g[key]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda (the GPU) or cpu (the CPU emulator)")
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--write", metavar="FILE", help="compute the hashes and write them to FILE")
    act.add_argument("--check", metavar="FILE", help="compute the hashes and compare them with FILE")
    act.add_argument("--list", action="store_true", help="list the cases")
    p.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT (not with --write)")
    args = p.parse_args(argv)
    if args.list:
        for c in cases():
            print(c.name)
        return 0
    if args.write and args.only:
        p.error("--write takes every case")
    hashes = compute(args.device, args.only)
    if args.write:
        path = Path(args.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(document(args.device, hashes)))
        print(f"{len(hashes)} cases on {device_name(torch.device(args.device))}: wrote {path}")
        return 0
    expected = json.loads(Path(args.check).read_text())
    if args.only:
        expected = {**expected, "cases": {k: v for k, v in expected["cases"].items() if args.only in k}}
    problems = compare(expected, hashes)
    for line in problems:
        print(line)
    src = f"{expected.get('source')} on {expected.get('device')}, {expected.get('date')}"
    print(f"{len(hashes)} cases on {device_name(torch.device(args.device))} against {args.check} ({src}): "
          + (f"{len(problems)} differences" if problems else "all match"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
