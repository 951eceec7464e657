"""Invalid calls, generated: every op (store_cache, indexing, scale, compare_key) gets calls with
one bad argument each -- a wrong dtype (the caches' dtype against K/V's, float, bool and narrow
index tensors), a wrong rank, shapes that disagree between K/V/caches/indices/out, rows that are
not contiguous (transposed heads, a stride in the last dimension), caches or outputs whose rows
overlap (``expand``, stride 0, a claimed 2**40 rows), zero-width rows, meta tensors, non-tensor
values, tensors that share memory with a tensor the op writes (rows of the cache as K, a
shifted ``out``), heads laid out unlike the caches', tensors with torch's negative bit, written
tensors that require grad or are inference tensors -- and must raise a
``TypeError``/``ValueError``/``RuntimeError`` whose message names the argument, with every
tensor byte for byte unchanged.

Every tensor is a view of a buffer of random bytes with guard bytes on both sides
(``Arena``), so "unchanged" covers the bytes around and between the rows too.

The valid-but-unusual calls that must work (misaligned starts, padded row strides, inputs
expanded with stride 0, a table claiming 2**40 rows, ``n == 0``, out-of-range indices and ids)
are generated too and compared with the torch reference, byte for byte over the whole buffers.

Devices: without a GPU the wrong-device cases are meta tensors (DLPack cannot carry them), on
the plain ops; the ``torch.ops.kernkit`` custom ops are also called with the other invalid
arguments (a meta argument there dispatches to the fake implementation, which writes nothing by
construction). A CUDA tensor next to CPU ones needs a GPU and is not covered here.

Hypothesis runs derandomized (the same examples in every run); the argument errors are raised
before any kernel runs, and the shapes are chosen so that only a handful of specializations get
built for the CPU emulator.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference
from kernkit import ops

INVALID_PER_OP = 240  # at least this many invalid calls per op, spread evenly over its kinds of bad argument


def invalid_settings(kinds: list) -> settings:
    """Each kind of bad argument is its own parametrized test, with examples enough that the op
    gets ``INVALID_PER_OP`` in all."""
    return settings(max_examples=-(-INVALID_PER_OP // len(kinds)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def bad_id(bad) -> str:
    return f"{bad.arg}-{bad.what}".replace(" ", "_")


VALID = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))

GUARD = 64  # bytes on each side of every view
HUGE = 2**40

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
i32, i64 = torch.int32, torch.int64


# --------------------------------------------------------------------------------------------
# Tensors over guarded random buffers


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


@dataclass
class Arena:
    """Makes tensors as views of random byte buffers with guard bytes; remembers each buffer's
    bytes so that ``unchanged()`` can compare them, and each view so that ``twin()`` can make the
    same view over a copy."""

    gen: torch.Generator
    bufs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    views: dict[int, tuple[int, torch.dtype, tuple, tuple, int]] = field(default_factory=dict)

    @classmethod
    def seeded(cls, seed: int) -> "Arena":
        return cls(torch.Generator().manual_seed(seed))

    def tensor(self, shape, dtype: torch.dtype, layout: str = "contiguous") -> torch.Tensor:
        """A ``shape`` tensor of ``dtype`` laid out as ``layout``:

        ``contiguous``; ``offset`` (contiguous, starting one element into the buffer: misaligned);
        ``padded`` (rows 3 elements apart more than their size: a misaligned row stride);
        ``expand`` (stride 0 in dimension 0: every row is the same memory); ``step2`` (stride 2
        in the last dimension); ``transposed`` (3-d: heads and head_dim swapped in memory; 2-d
        and 1-d: ``step2``).
        """
        shape = tuple(shape)
        elem = torch.empty((), dtype=dtype).element_size()
        offset = 0
        if layout in ("contiguous", "offset"):
            strides = _contiguous_strides(shape)
            offset = 1 if layout == "offset" else 0
        elif layout == "padded":
            inner = _contiguous_strides(shape[1:])
            strides = (math.prod(shape[1:]) + 3, *inner)
        elif layout == "expand":
            strides = (0, *_contiguous_strides(shape[1:]))
        elif layout == "step2" or (layout == "transposed" and len(shape) < 3):
            strides = tuple(2 * s for s in _contiguous_strides(shape))
        elif layout == "transposed":
            _, h, d = shape
            strides = (h * d, 1, h)
        else:
            raise AssertionError(layout)
        span = 0 if 0 in shape else 1 + sum((s - 1) * st for s, st in zip(shape, strides))
        nbytes = 2 * GUARD + (offset + span) * elem
        nbytes += -nbytes % 16
        buf = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=self.gen)
        self.bufs.append((buf, buf.clone()))
        t = buf.view(dtype).as_strided(shape, strides, GUARD // elem + offset)
        self.views[id(t)] = (len(self.bufs) - 1, dtype, shape, strides, GUARD // elem + offset)
        return t

    def unchanged(self) -> bool:
        return all(torch.equal(buf, copy) for buf, copy in self.bufs)

    def copies(self) -> list[torch.Tensor]:
        """Fresh copies of every buffer as it was made."""
        return [copy.clone() for _, copy in self.bufs]

    def twin(self, t, copies: list[torch.Tensor]):
        """``t`` rebuilt over ``copies`` (anything that is not an arena tensor is returned as is)."""
        if id(t) not in self.views:
            return t
        i, dtype, shape, strides, offset = self.views[id(t)]
        return copies[i].view(dtype).as_strided(shape, strides, offset)

    def same_as(self, copies: list[torch.Tensor]) -> bool:
        return all(torch.equal(buf, c) for (buf, _), c in zip(self.bufs, copies))

    def alias(self, t: torch.Tensor, shape, dtype: torch.dtype, shift: int = 0) -> torch.Tensor:
        """A contiguous ``shape`` view of ``dtype`` over the buffer of ``t``, from ``t``'s first
        byte (rounded down to ``dtype``'s size) plus ``shift`` elements: memory ``t`` uses."""
        buf = next(b for b, _ in self.bufs if b.untyped_storage().data_ptr() == t.untyped_storage().data_ptr())
        start = t.storage_offset() * t.element_size() // dtype.itemsize + shift
        return buf.view(dtype).as_strided(tuple(shape), _contiguous_strides(tuple(shape)), start)

    def inference(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """``tensor(shape, dtype)`` made an inference tensor (under ``torch.inference_mode()``)."""
        with torch.inference_mode():
            return self.tensor(shape, dtype)


def meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class Bad:
    """One way to break one argument: ``make(arena, params)`` returns the bad value; ``exc`` the
    exception class it must raise."""

    arg: str
    what: str
    exc: type[Exception]
    make: Callable


def check_invalid(call: Callable[[], object], arena: Arena, bad: Bad) -> None:
    """``call()`` raises ``bad.exc`` naming ``bad.arg`` and leaves every buffer as it was."""
    with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
        call()
    msg = str(info.value)
    assert isinstance(info.value, bad.exc), f"{bad.arg}/{bad.what}: expected {bad.exc.__name__}, got " \
                                            f"{type(info.value).__name__}: {msg}"
    assert f"'{bad.arg}'" in msg, f"{bad.arg}/{bad.what}: the message does not name '{bad.arg}': {msg}"
    assert "Exception raised from" not in msg, msg  # a message, not a C++ stack dump
    assert arena.unchanged(), f"{bad.arg}/{bad.what}: a buffer was written by a call that raised"


def check_unallocatable(call: Callable[[], object], arena: Arena) -> None:
    """A view claiming 2**40 elements whose output the op allocates from its shape: torch's
    allocator refuses it, as it does for torch's own ops, before the launcher could name the
    view (the per-call path checks nothing); nothing is written."""
    with pytest.raises(RuntimeError, match="allocate"):
        call()
    assert arena.unchanged(), "a buffer was written by a call that raised"


#: What torch checks before an in-place op, on any tensor argument / on the ones an op writes.
#: The custom ops are not called with these: torch's own fallback resolves a negative-bit input
#: before kernkit sees it (and refuses a negative-bit output with its own message).
def neg_bit(make: Callable) -> Callable:
    return lambda a, p, d: torch._neg_view(make(a, p, d))


def requires_grad(make: Callable) -> Callable:
    return lambda a, p, d: make(a, p, d).requires_grad_()


SHARED = "shares memory"  # the bad kinds whose argument overlaps another one


def claims_huge(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() >= HUGE


UNSUPPORTED_ROW_DTYPES = [torch.bool, torch.complex64, torch.complex128]
BAD_INDEX_DTYPES = [torch.int16, torch.uint8, torch.int8, torch.float32, torch.float64, torch.bool]


# --------------------------------------------------------------------------------------------
# store_cache

ROW = {2: (32,), 3: (2, 16)}  # 32 elements of 2 bytes: one 64-byte specialization


def rows(rank: int, n: int) -> tuple[int, ...]:
    return (n, *ROW[rank])


@st.composite
def store_params(draw):
    return dict(
        dtype=draw(st.sampled_from([bf16, fp16])),
        cache_rank=draw(st.sampled_from([2, 3])),
        pool=draw(st.sampled_from([4, 16])),
        n=draw(st.sampled_from([0, 1, 3, 9])),
        index_dtype=draw(st.sampled_from([i32, i64])),
        cache_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
        input_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        seed=draw(st.integers(0, 2**16)),
    )


def store_args(a: Arena, p: dict) -> dict:
    p["input_rank"] = p["cache_rank"]  # rows of K are rows of the cache, head by head
    dt, pool, n = p["dtype"], p["pool"], p["n"]
    idx = a.tensor((n,), p["index_dtype"])
    perm = torch.randperm(pool, generator=a.gen)
    values = [perm[i % pool].item() if i < pool else pool + i for i in range(n)]  # distinct valid rows
    for i in range(0, n, 3):  # and out-of-range ones the kernel must skip
        values[i] = [-1, pool, -pool, 2**31 - 1, -(2**31)][i // 3 % 5]
    idx.copy_(torch.tensor(values, dtype=p["index_dtype"]))
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return dict(
        k_cache=a.tensor(rows(p["cache_rank"], pool), dt, p["cache_layout"]),
        v_cache=a.tensor(rows(p["cache_rank"], pool), dt, p["cache_layout"]),
        indices=idx,
        k=a.tensor(rows(p["input_rank"], n), dt, p["input_layout"]),
        v=a.tensor(rows(p["input_rank"], n), dt, p["input_layout"]),
    )


def _other_same_size(dt):
    return fp16 if dt == bf16 else bf16


def _store_bad() -> list[Bad]:
    out: list[Bad] = []
    for arg in ("k_cache", "v_cache", "k", "v"):
        cache = arg.endswith("cache")
        rank_key = "cache_rank" if cache else "input_rank"

        def n_of(p, cache=cache):
            return p["pool"] if cache else p["n"]

        def shape(p, cache=cache, rank_key=rank_key):
            return rows(p[rank_key], p["pool"] if cache else p["n"])

        out += [
            Bad(arg, "unsupported dtype", TypeError,
                lambda a, p, d, shape=shape: a.tensor(shape(p), d.draw(st.sampled_from(UNSUPPORTED_ROW_DTYPES)))),
            Bad(arg, "dtype of another size", TypeError, lambda a, p, d, shape=shape: a.tensor(shape(p), fp32)),
            Bad(arg, "dtype of the same size", TypeError,
                lambda a, p, d, shape=shape: a.tensor(shape(p), d.draw(st.sampled_from(
                    [_other_same_size(p["dtype"]), torch.int16])))),
            Bad(arg, "rank", ValueError,
                lambda a, p, d, n_of=n_of: a.tensor(d.draw(st.sampled_from(
                    [(n_of(p) * 32,), (n_of(p), 2, 4, 4), ()])), p["dtype"])),
            Bad(arg, "zero-width rows", ValueError,
                lambda a, p, d, n_of=n_of: a.tensor(d.draw(st.sampled_from(
                    [(n_of(p), 0), (n_of(p), 2, 0), (n_of(p), 0, 16)])), p["dtype"])),
            Bad(arg, "non-contiguous rows", ValueError,
                lambda a, p, d, shape=shape: a.tensor(shape(p), p["dtype"], d.draw(st.sampled_from(
                    ["step2", "transposed"])))),
            Bad(arg, "meta tensor", ValueError, lambda a, p, d, shape=shape: meta(shape(p), p["dtype"])),
            Bad(arg, "not a tensor", TypeError,
                lambda a, p, d: d.draw(st.sampled_from([None, 3, [[0.0] * 32]]))),
            Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d, shape=shape: a.tensor(shape(p), p["dtype"]))),
        ]
        if arg != "k_cache":  # k_cache defines the specialization: a row of another size is a new build
            out.append(Bad(arg, "row size", ValueError,
                           lambda a, p, d, n_of=n_of, rank_key=rank_key: a.tensor(
                               (n_of(p), 16) if p[rank_key] == 2 else (n_of(p), d.draw(st.sampled_from([4, 1])),
                                                                        d.draw(st.sampled_from([8, 64]))),
                               p["dtype"])))
            out.append(Bad(arg, "rank unlike its partner", ValueError,
                           lambda a, p, d, n_of=n_of, rank_key=rank_key: a.tensor(
                               rows(5 - p[rank_key], n_of(p)), p["dtype"])))
        else:
            out.append(Bad(arg, "row size (one more build)", ValueError,
                           lambda a, p, d: a.tensor((p["pool"], 16) if p["cache_rank"] == 2 else (p["pool"], 2, 8),
                                                    p["dtype"])))
        if cache:
            out += [
                Bad(arg, "pool differs", ValueError,
                    lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], p["pool"] + d.draw(
                        st.sampled_from([1, -1]))), p["dtype"])),
                Bad(arg, "overlapping rows (expand)", ValueError,
                    lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], d.draw(
                        st.sampled_from([p["pool"], HUGE]))), p["dtype"], "expand")),
                Bad(arg, "requires grad", RuntimeError,
                    requires_grad(lambda a, p, d, shape=shape: a.tensor(shape(p), p["dtype"]))),
                Bad(arg, "inference tensor", RuntimeError,
                    lambda a, p, d, shape=shape: a.inference(shape(p), p["dtype"])),
            ]
        else:
            out.append(Bad(arg, "rows differ", ValueError,
                           lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], p["n"] + 1), p["dtype"],
                                                                       d.draw(st.sampled_from(["contiguous",
                                                                                               "expand"])))))
            out.append(Bad(arg, "2**33 rows claimed (expand)", ValueError,
                           lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], 2**33), p["dtype"],
                                                                       "expand")))
    out += [
        Bad("k", f"{SHARED}: rows of k_cache", ValueError,
            lambda a, p, d: a.alias(p["args"]["k_cache"], rows(p["cache_rank"], p["n"]), p["dtype"])),
        Bad("v", f"{SHARED}: rows of k_cache", ValueError,
            lambda a, p, d: a.alias(p["args"]["k_cache"], rows(p["cache_rank"], p["n"]), p["dtype"],
                                    d.draw(st.sampled_from([0, 1, 17])))),
        Bad("v_cache", f"{SHARED}: k_cache shifted", ValueError,
            lambda a, p, d: a.alias(p["args"]["k_cache"], rows(p["cache_rank"], p["pool"]), p["dtype"],
                                    d.draw(st.sampled_from([0, 1, 31])))),
        Bad("indices", f"{SHARED}: bytes of v_cache", ValueError,
            lambda a, p, d: a.alias(p["args"]["v_cache"], (p["n"],), p["index_dtype"])),
        Bad("k", "head layout unlike the caches' (k and v)", ValueError,
            lambda a, p, d: a.tensor((p["n"], *d.draw(st.sampled_from(
                [(4, 8), (32,)] if p["cache_rank"] == 3 else [(2, 16), (4, 8)]))), p["dtype"])),
        Bad("indices", "dtype", TypeError,
            lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
        Bad("indices", "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["index_dtype"])),
        Bad("indices", "length", ValueError,
            lambda a, p, d: a.tensor((p["n"] + d.draw(st.sampled_from([1, 2])),), p["index_dtype"])),
        Bad("indices", "non-contiguous", ValueError,
            lambda a, p, d: a.tensor((max(p["n"], 2),), p["index_dtype"], "step2")),
        Bad("indices", "stride 0 (expand, maybe 2**40 long)", ValueError,
            lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(p["n"], 2), HUGE])),), p["index_dtype"],
                                     "expand")),
        Bad("indices", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["index_dtype"])),
        Bad("indices", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 1.5]))),
    ]
    return out


STORE_BAD = _store_bad()


@pytest.mark.parametrize("bad", STORE_BAD, ids=bad_id)
@invalid_settings(STORE_BAD)
@given(p=store_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_store_cache_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what.startswith(SHARED):
        p = dict(p, n=min(max(p["n"], 1), p["pool"]))  # an empty K or index shares no bytes
    args = store_args(a, p)
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    if bad.what.startswith("head layout"):
        args["v"] = a.tensor(args["k"].shape, p["dtype"])
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit"):
        check_invalid(lambda: torch.ops.kernkit.store_cache(**args), a, bad)
    else:
        check_invalid(lambda: ops.store_cache(**args), a, bad)


@VALID
@given(p=store_params())
def test_store_cache_valid_views_give_the_reference_bytes(p):
    """Misaligned starts, padded row strides, K/V expanded with stride 0, n == 0,
    out-of-range indices: the whole buffers (guards included) match the reference."""
    a = Arena.seeded(p["seed"])
    args = store_args(a, p)
    want = a.copies()
    reference.store_cache(**{key: a.twin(t, want) for key, t in args.items()})
    ops.store_cache(**args)
    assert a.same_as(want)


def test_store_cache_pool_of_zero_rows_skips_every_index():
    a = Arena.seeded(1)
    kc, vc = a.tensor((0, 2, 16), bf16), a.tensor((0, 2, 16), bf16)
    idx = torch.tensor([0, -1, 5], dtype=i64)
    ops.store_cache(kc, vc, idx, a.tensor((3, 2, 16), bf16), a.tensor((3, 2, 16), bf16))
    assert a.unchanged()


# --------------------------------------------------------------------------------------------
# indexing

HIDDEN = 32  # 64-byte rows of 2-byte elements: one specialization


@st.composite
def indexing_params(draw):
    rows_ = draw(st.sampled_from([6, 40]))
    shard = draw(st.booleans())
    return dict(
        dtype=draw(st.sampled_from([bf16, fp16])),
        rows=rows_,
        n=draw(st.sampled_from([0, 1, 2, 5, 9])),
        id_dtype=draw(st.sampled_from([i32, i64])),
        weight_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        huge_table=draw(st.booleans()),
        out=draw(st.sampled_from([None, "contiguous", "offset", "padded"])),
        vocab_range=(draw(st.sampled_from([0, 3, 1000])), draw(st.integers(0, rows_))) if shard else None,
        seed=draw(st.integers(0, 2**16)),
    )


def indexing_args(a: Arena, p: dict) -> dict:
    n = p["n"]
    huge = p["weight_layout"] == "expand" and p["huge_table"]
    weight = a.tensor((HUGE if huge else p["rows"], HIDDEN), p["dtype"], p["weight_layout"])
    start, length = p["vocab_range"] or (0, weight.shape[0])
    pool = [start, start + length - 1, start - 1, start + length, -1, 2**31 - 1, -(2**31), start + 2, HUGE - 1,
            HUGE]
    ids = a.tensor((n,), p["id_dtype"])
    values = [pool[int(torch.randint(0, len(pool), (), generator=a.gen))] for _ in range(n)]
    if p["id_dtype"] == i32:
        values = [v if -(2**31) <= v < 2**31 else -1 for v in values]
    ids.copy_(torch.tensor(values, dtype=p["id_dtype"]))
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    out = None if p["out"] is None else a.tensor((n, HIDDEN), p["dtype"], p["out"])
    return dict(weight=weight, ids=ids, out=out, vocab_range=p["vocab_range"])


INDEXING_BAD = [
    Bad("weight", "unsupported dtype", TypeError,
        lambda a, p, d: a.tensor((p["rows"], HIDDEN), d.draw(st.sampled_from(UNSUPPORTED_ROW_DTYPES)))),
    Bad("weight", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["rows"] * HIDDEN,), (p["rows"], 2, 16), ()])),
                                 p["dtype"])),
    Bad("weight", "zero-width rows", ValueError, lambda a, p, d: a.tensor((p["rows"], 0), p["dtype"])),
    Bad("weight", "non-contiguous rows", ValueError,
        lambda a, p, d: a.tensor((p["rows"], HIDDEN), p["dtype"], "step2")),
    Bad("weight", "meta tensor", ValueError, lambda a, p, d: meta((p["rows"], HIDDEN), p["dtype"])),
    Bad("weight", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0] * HIDDEN]]))),
    Bad("ids", "dtype", TypeError, lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
    Bad("ids", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["id_dtype"])),
    Bad("ids", "non-contiguous", ValueError, lambda a, p, d: a.tensor((max(p["n"], 2),), p["id_dtype"], "step2")),
    Bad("ids", "stride 0 (expand, maybe 2**40 long)", ValueError,
        lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(p["n"], 2), HUGE])),), p["id_dtype"], "expand")),
    Bad("ids", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["id_dtype"])),
    Bad("ids", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 2]))),
    Bad("out", "dtype", TypeError,
        lambda a, p, d: a.tensor((p["n"], HIDDEN), d.draw(st.sampled_from(
            [fp32, _other_same_size(p["dtype"]), torch.int16, torch.bool])))),
    Bad("out", "rows differ from ids", ValueError, lambda a, p, d: a.tensor((p["n"] + 1, HIDDEN), p["dtype"])),
    Bad("out", "hidden differs", ValueError,
        lambda a, p, d: a.tensor((p["n"], d.draw(st.sampled_from([16, 64]))), p["dtype"])),
    Bad("out", "3-d", ValueError, lambda a, p, d: a.tensor((p["n"], 2, 16), p["dtype"])),
    Bad("out", "non-contiguous rows", ValueError, lambda a, p, d: a.tensor((p["n"], HIDDEN), p["dtype"], "step2")),
    Bad("out", "overlapping rows (expand)", ValueError,
        lambda a, p, d: a.tensor((max(p["n"], 2), HIDDEN), p["dtype"], "expand")),
    Bad("out", "meta tensor", ValueError, lambda a, p, d: meta((p["n"], HIDDEN), p["dtype"])),
    Bad("out", "not a tensor", TypeError, lambda a, p, d: [[0.0] * HIDDEN]),
    Bad("weight", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["rows"], HIDDEN), p["dtype"]))),
    Bad("ids", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"],), p["id_dtype"]))),
    Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"], HIDDEN), p["dtype"]))),
    Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor((p["n"], HIDDEN), p["dtype"]))),
    Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference((p["n"], HIDDEN), p["dtype"])),
    Bad("out", f"{SHARED}: rows of weight", ValueError,
        lambda a, p, d: a.alias(p["args"]["weight"], (p["n"], HIDDEN), p["dtype"], d.draw(st.sampled_from([0, 1, 40])))),
    Bad("ids", f"{SHARED}: bytes of out", ValueError, lambda a, p, d: a.alias(p["args"]["out"], (p["n"],), p["id_dtype"])),
    Bad("vocab_range", "length beyond the table", ValueError,
        lambda a, p, d: (d.draw(st.sampled_from([0, 5])), p["rows"] + d.draw(st.sampled_from([1, 1000])))),
    Bad("vocab_range", "negative", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([(-1, 2), (0, -1), (-(2**40), 1)]))),
    Bad("vocab_range", "not a pair", ValueError, lambda a, p, d: d.draw(st.sampled_from([(0, 1, 2), (3,), ()]))),
    Bad("vocab_range", "not integers", TypeError, lambda a, p, d: d.draw(st.sampled_from([(0.5, 2), (0, "2")]))),
    Bad("vocab_range", "beyond int64", TypeError, lambda a, p, d: d.draw(st.sampled_from([(2**63, 1), (0, -2**64)]))),
]


@pytest.mark.parametrize("bad", INDEXING_BAD, ids=bad_id)
@invalid_settings(INDEXING_BAD)
@given(p=indexing_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_indexing_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.arg == "vocab_range":
        p = dict(p, huge_table=False)  # so that rows + 1 is beyond the table
    if bad.what.startswith(SHARED):  # rows of a real table to share, and at least one of them
        p = dict(p, n=min(max(p["n"], 1), 4), weight_layout="contiguous", huge_table=False)
    args = indexing_args(a, p)
    if bad.arg in ("out", "ids") and args["out"] is None:
        args["out"] = a.tensor((p["n"], HIDDEN), p["dtype"])  # placeholder, or what ids shares
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    if bad.arg == "out" and bad.what == "overlapping rows (expand)":
        args["ids"] = a.tensor((args["out"].shape[0],), p["id_dtype"])
    if args["out"] is None and claims_huge(args["ids"]):
        check_unallocatable(lambda: ops.indexing(**args), a)
    elif via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a pair", "not integers",
                                                 "beyond int64", "negative bit"):
        vr = None if args["vocab_range"] is None else list(args["vocab_range"])
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.indexing(args["weight"], args["ids"], vr), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.indexing_out(args["out"], args["weight"], args["ids"], vr), a, bad)
    else:
        check_invalid(lambda: ops.indexing(**args), a, bad)


@VALID
@given(p=indexing_params())
def test_indexing_valid_views_give_the_reference_bytes(p):
    """Misaligned and padded tables and outputs, a table expanded to 2**40 rows with stride 0,
    shards, out-of-range ids, n == 0: the result (and every buffer) matches the reference."""
    a = Arena.seeded(p["seed"])
    args = indexing_args(a, p)
    want = a.copies()
    start, length = p["vocab_range"] or (0, args["weight"].shape[0])
    if args["out"] is None:
        want_out = torch.empty(p["n"], HIDDEN, dtype=p["dtype"])
    else:
        want_out = a.twin(args["out"], want)
    reference.indexing(want_out, a.twin(args["weight"], want), args["ids"], start, length)
    got = ops.indexing(**args)
    if args["out"] is not None:
        assert got is args["out"]
    assert torch.equal(got.contiguous().view(torch.uint8), want_out.contiguous().view(torch.uint8))
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# scale

SCALE_DTYPES = [bf16, fp32]  # two of the three builds; fp16 is the same template


@st.composite
def scale_params(draw):
    return dict(
        dtype=draw(st.sampled_from(SCALE_DTYPES)),
        shape=draw(st.sampled_from([(0,), (1,), (7,), (33,), (3, 5), (2, 3, 4), ()])),
        src_layout=draw(st.sampled_from(["contiguous", "offset"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        factor=draw(st.sampled_from([1.5, -0.25, 0.0, 3, 1e-30])),
        seed=draw(st.integers(0, 2**16)),
    )


def scale_args(a: Arena, p: dict) -> dict:
    src = a.tensor(p["shape"], p["dtype"], p["src_layout"])
    src.copy_(torch.randn(p["shape"], generator=a.gen).to(p["dtype"]))  # no NaN bit patterns
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    if p["out"] is None:
        out = None
    else:
        out = a.tensor(p["shape"], p["dtype"], p["out"])
    return dict(src=src, factor=p["factor"], out=out)


def _numel(p):
    return math.prod(p["shape"])


SCALE_BAD = [
    Bad("src", "dtype", TypeError,
        lambda a, p, d: a.tensor(p["shape"], d.draw(st.sampled_from(
            [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64, torch.float8_e4m3fn])))),
    Bad("src", "non-contiguous", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([
            a.tensor((max(_numel(p), 2),), p["dtype"], "step2"),
            a.tensor((4, 3), p["dtype"]).t()]))),
    Bad("src", "stride 0 (expand, maybe 2**40 long)", ValueError,
        lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(_numel(p), 2), HUGE])),), p["dtype"], "expand")),
    Bad("src", "meta tensor", ValueError, lambda a, p, d: meta(p["shape"], p["dtype"])),
    Bad("src", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1.0, 2.0], 2.0]))),
    Bad("out", "dtype", TypeError,
        lambda a, p, d: a.tensor(p["shape"], d.draw(st.sampled_from(
            [bf16 if p["dtype"] == fp32 else fp32, fp16, torch.int32, torch.bool])))),
    Bad("out", "elements differ", ValueError,
        lambda a, p, d: a.tensor((_numel(p) + d.draw(st.sampled_from([1, 5])),), p["dtype"])),
    Bad("out", "other shape, same elements", ValueError,
        lambda a, p, d: a.tensor((_numel(p),) if len(p["shape"]) != 1 else (1, _numel(p)), p["dtype"])),
    Bad("out", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((max(_numel(p), 2),), p["dtype"], "step2")),
    Bad("out", "transposed", ValueError, lambda a, p, d: a.tensor((3, 4), p["dtype"]).t()),
    Bad("out", "stride 0 (expand)", ValueError,
        lambda a, p, d: a.tensor((max(_numel(p), 2),), p["dtype"], "expand")),
    Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(p["shape"], p["dtype"])),
    Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
    Bad("src", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(p["shape"], p["dtype"])),
    Bad("out", f"{SHARED}: src shifted", ValueError,
        lambda a, p, d: a.alias(p["args"]["src"], p["shape"], p["dtype"], d.draw(st.sampled_from([1, -1, 5])))),
    Bad("factor", "not a number", TypeError,
        lambda a, p, d: d.draw(st.sampled_from(["2", None, [2.0], torch.tensor(2.0), 1j]))),
]


@pytest.mark.parametrize("bad", SCALE_BAD, ids=bad_id)
@invalid_settings(SCALE_BAD)
@given(p=scale_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_scale_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what.startswith(SHARED):
        p = dict(p, shape=(33,))  # elements to share; the buffer's guard bytes hold the shift
    args = scale_args(a, p)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "out" and bad.what == "transposed":
        args["src"] = a.tensor((3, 4), p["dtype"])  # the same shape, contiguous: only out is wrong
    if bad.arg in ("src", "out") and bad.what in ("non-contiguous", "stride 0 (expand)") and args["out"] is not None:
        other = "out" if bad.arg == "src" else "src"
        args[other] = a.tensor(value.shape, p["dtype"])  # matching sizes: only the layout is wrong
    args[bad.arg] = value
    if args["out"] is None and claims_huge(args["src"]):
        check_unallocatable(lambda: ops.scale(**args), a)
    elif via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a number", "negative bit"):
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.scale(args["src"], args["factor"]), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.scale_out(args["out"], args["src"], args["factor"]), a, bad)
    else:
        check_invalid(lambda: ops.scale(**args), a, bad)


@VALID
@given(p=scale_params())
def test_scale_valid_views_give_the_reference(p):
    """Misaligned starts (the scalar path), tails, 0-d, empty and n-d tensors: torch's
    fp32-then-round result, and nothing else in the buffers written."""
    a = Arena.seeded(p["seed"])
    args = scale_args(a, p)
    want = a.copies()
    src = args["src"]
    expect = (src.float() * torch.tensor(float(p["factor"]), dtype=fp32)).to(p["dtype"])
    if args["out"] is not None:
        a.twin(args["out"], want).view(-1).copy_(expect.view(-1))
    got = ops.scale(**args)
    assert got.shape == (args["out"].shape if args["out"] is not None else src.shape)
    assert torch.equal(got.reshape(-1).view(torch.uint8), expect.reshape(-1).view(torch.uint8))
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# compare_key


@st.composite
def key_params(draw):
    return dict(
        la=draw(st.sampled_from([0, 1, 5, 9, 40])),
        lb=draw(st.sampled_from([0, 1, 5, 9, 40])),
        layout_a=draw(st.sampled_from(["contiguous", "offset"])),
        layout_b=draw(st.sampled_from(["contiguous", "offset"])),
        common=draw(st.integers(0, 40)),
        seed=draw(st.integers(0, 2**16)),
    )


def key_args(a: Arena, p: dict) -> dict:
    x = a.tensor((p["la"],), i32, p["layout_a"])
    y = a.tensor((p["lb"],), i32, p["layout_b"])
    x.copy_(torch.randint(-3, 3, (p["la"],), generator=a.gen, dtype=i32))
    y.copy_(torch.randint(-3, 3, (p["lb"],), generator=a.gen, dtype=i32))
    k = min(p["common"], p["la"], p["lb"])
    y[:k] = x[:k]
    a.bufs[-2] = (a.bufs[-2][0], a.bufs[-2][0].clone())
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return dict(a=x, b=y)


def _key_bad(arg: str) -> list[Bad]:
    length = "la" if arg == "a" else "lb"
    return [
        Bad(arg, "dtype", TypeError,
            lambda a, p, d: a.tensor((p[length],), d.draw(st.sampled_from(
                [torch.int64, torch.int16, torch.uint8, torch.float32, torch.bool, torch.uint32])))),
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p[length], 1), (2, 3), ()])), i32)),
        Bad(arg, "non-contiguous", ValueError, lambda a, p, d: a.tensor((max(p[length], 2),), i32, "step2")),
        Bad(arg, "stride 0 (expand, maybe 2**40 long)", ValueError,
            lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(p[length], 2), HUGE])),), i32, "expand")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta((p[length],), i32)),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1, 2], 3]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p[length],), i32))),
    ]


KEY_BAD = _key_bad("a") + _key_bad("b")


@pytest.mark.parametrize("bad", KEY_BAD, ids=bad_id)
@invalid_settings(KEY_BAD)
@given(p=key_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_compare_key_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = key_args(a, p)
    args[bad.arg] = bad.make(a, p, d)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit"):
        check_invalid(lambda: torch.ops.kernkit.compare_key(args["a"], args["b"]), a, bad)
    else:
        check_invalid(lambda: ops.compare_key(**args), a, bad)


@VALID
@given(p=key_params())
def test_compare_key_valid_views_give_the_reference(p):
    a = Arena.seeded(p["seed"])
    args = key_args(a, p)
    assert ops.compare_key(**args) == reference.compare_key(**args)
    assert a.unchanged()


def test_small_errors_name_the_argument():
    """A 0-d cache is called 0-d, a complex dtype by its name, an int beyond int64 and a
    read-only numpy array (whose DLPack export raises ``BufferError``) by the argument."""
    import numpy as np

    bf = torch.bfloat16
    k = torch.zeros(2, 32, dtype=bf)
    with pytest.raises(ValueError, match=r"^'k_cache': expected a 2-d \[rows, elems\] or 3-d .* got 0-d$"):
        ops.store_cache(torch.zeros((), dtype=bf), k, torch.tensor([0, 1]), k, k)
    with pytest.raises(TypeError, match=r"^'k': expected dtype bfloat16 \(from 'k_cache'\), got complex64$"):
        ops.store_cache(torch.zeros(4, 32, dtype=bf), torch.zeros(4, 32, dtype=bf), torch.tensor([0, 1]),
                        torch.zeros(2, 32, dtype=torch.complex64), k)
    with pytest.raises(TypeError, match=r"^'vocab_range': expected a sequence of int64 values, got \(9223372036854775808, 1\)$"):
        ops.indexing(torch.zeros(4, 32, dtype=bf), torch.tensor([0]), (2**63, 1))
    frozen = np.zeros(4, dtype=np.float32)
    frozen.setflags(write=False)
    with pytest.raises(TypeError, match=r"^'src': expected a tensor, got ndarray$"):
        ops.scale(frozen, 2.0)


# --------------------------------------------------------------------------------------------
# tools/gpu_sanitize.py and tools/sanitize_driver.py, here on the CPU emulator with a stand-in
# compute-sanitizer (the real runs need the GPU)

REPO = Path(__file__).resolve().parent.parent

FAKE_SANITIZER = """#!{python}
# Stands in for compute-sanitizer: runs the command, then prints the tool's summary line.
# FAKE_SANITIZER_MODE: clean (default), errors (2 errors, exit 1), silent (no summary line).
import os, subprocess, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("Compute Sanitizer stand-in Version 0.0"); sys.exit(0)
tool = "memcheck"
while args and args[0].startswith("--"):
    if args[0] == "--tool":
        tool = args[1]
    args = args[2:]
rc = subprocess.call(args)
mode = os.environ.get("FAKE_SANITIZER_MODE", "clean")
errors = 2 if mode == "errors" and tool in os.environ.get("FAKE_SANITIZER_TOOLS", tool) else 0
if mode != "silent":
    if tool == "racecheck":
        print(f"========= RACECHECK SUMMARY: {{errors}} hazards displayed ({{errors}} errors, 0 warnings)")
    else:
        print(f"========= ERROR SUMMARY: {{errors}} errors")
sys.exit(rc or (1 if errors else 0))
"""


@pytest.fixture
def fake_sanitizer(tmp_path):
    path = tmp_path / "bin" / "compute-sanitizer"
    path.parent.mkdir()
    path.write_text(FAKE_SANITIZER.format(python=sys.executable))
    path.chmod(0o755)
    return path


def run_sanitize(fake, out, mode, only="scale/float32-n1031", tools="memcheck,racecheck,initcheck", **env):
    """tools/gpu_sanitize.py on the CPU emulator, one small case, sharing the test run's
    build cache."""
    e = dict(os.environ, FAKE_SANITIZER_MODE=mode, **env)
    e.pop("KERNKIT_JIT", None)
    cmd = [sys.executable, "tools/gpu_sanitize.py", "--out", str(out), "--device", "cpu", "--sanitizer", str(fake),
           "--only", only, "--tools", tools, "--cache-dir", os.environ["KERNKIT_CACHE_DIR"]]
    return subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=600)


def test_driver_lists_every_kernel_and_the_hard_cases():
    names = subprocess.run([sys.executable, "tools/sanitize_driver.py", "--list"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    assert {n.split("/")[0] for n in names} == {"store_cache", "indexing", "scale"}
    for must in ("store_cache/bfloat16-8x128-i64", "store_cache/float16-1x3-i32-fused-kvbuffer",
                 "store_cache/bfloat16-8x128-i32-only-bad", "indexing/bfloat16-h576-i64-shard",
                 "indexing/float32-h100-i32-shard-outview", "scale/bfloat16-n1031-misaligned", "scale/float16-n70001"):
        assert must in names


def test_sanitize_tool_reports_clean_runs(fake_sanitizer, tmp_path):
    res = run_sanitize(fake_sanitizer, tmp_path / "out", "clean")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "plain run: exit 0, 1 cases" in res.stdout
    for line in ("memcheck: ERROR SUMMARY: 0 errors", "initcheck: ERROR SUMMARY: 0 errors",
                 "racecheck: RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"):
        assert line in res.stdout, res.stdout
    md = (tmp_path / "out" / "sanitize.md").read_text()
    assert md.count("| clean |") == 3 and "FAILED" not in md
    assert "`compute-sanitizer --tool memcheck --error-exitcode 1" in md and "python3 tools/sanitize_driver.py" in md
    assert str(REPO) not in md and sys.executable not in md  # no machine paths
    log = (tmp_path / "out" / "memcheck.log").read_text()
    assert "ok scale/float32-n1031-misaligned" in log and "SANITIZE-DRIVER-OK 1 cases" in log


def test_sanitize_tool_fails_on_errors_and_on_a_missing_summary(fake_sanitizer, tmp_path):
    res = run_sanitize(fake_sanitizer, tmp_path / "a", "errors", tools="memcheck,racecheck",
                       FAKE_SANITIZER_TOOLS="racecheck")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "memcheck: ERROR SUMMARY: 0 errors" in res.stdout
    assert "racecheck: RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings) (exit 1" in res.stdout
    assert "| racecheck |" in (tmp_path / "a" / "sanitize.md").read_text()
    assert "**FAILED**" in (tmp_path / "a" / "sanitize.md").read_text()
    res = run_sanitize(fake_sanitizer, tmp_path / "b", "silent", tools="initcheck")
    assert res.returncode == 1 and "initcheck: no summary line" in res.stdout, res.stdout + res.stderr


def test_sanitized_runs_never_compile(fake_sanitizer, tmp_path):
    """The tool runs have KERNKIT_JIT=off: a specialization missing from
    the cache fails the driver instead of compiling under the sanitizer (here: the plain run
    builds into one cache, and a stand-in that empties it before running shows the failure)."""
    cache = tmp_path / "cache"
    wiping = tmp_path / "bin" / "wipe-then-sanitize"
    wiping.write_text(f"#!/bin/sh\nrm -rf {shlex.quote(str(cache))}\nexec {shlex.quote(str(fake_sanitizer))} \"$@\"\n")
    wiping.chmod(0o755)
    e = dict(os.environ, FAKE_SANITIZER_MODE="clean")
    cmd = [sys.executable, "tools/gpu_sanitize.py", "--out", str(tmp_path / "out"), "--device", "cpu",
           "--sanitizer", str(wiping), "--only", "scale/bfloat16-n1031", "--tools", "memcheck", "--cache-dir", str(cache)]
    res = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "plain run: exit 0, 1 cases" in res.stdout
    assert "the driver did not finish" in res.stdout
    assert "JitDisabledError" in (tmp_path / "out" / "memcheck.log").read_text()
