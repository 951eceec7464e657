"""Invalid calls, generated: every op (store_cache, indexing, scale, compare_key,
per_token_quant_fp8) gets calls with
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
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.oracle import op_tests
from kernkit.testing.invalid import (BAD_INDEX_DTYPES, HUGE, SHARED, UNSUPPORTED_ROW_DTYPES, VALID, Arena, Bad, bad_id,
                                     check_invalid, check_unallocatable, claims_huge, invalid_settings, meta,
                                     neg_bit, requires_grad)

act_tests = op_tests("activation")
compare_key = op_tests("compare_key")
group_quant = op_tests("group_quant")
indexing = op_tests("indexing")
norm = op_tests("norm")
qk = op_tests("qk_norm")
quant = op_tests("quant")
rope = op_tests("rope")
rope_store = op_tests("rope_store")
store = op_tests("store_cache")

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
i32, i64 = torch.int32, torch.int64


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
    store.ref_store_cache(**{key: a.twin(t, want) for key, t in args.items()})
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
    indexing.ref_indexing(want_out, a.twin(args["weight"], want), args["ids"], start, length)
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
# ----- per_token_quant_fp8

QUANT_DTYPES = [bf16, fp32]  # two of the three builds, all of hidden QUANT_HIDDEN; fp16 is the same template
QUANT_HIDDEN = 32
fp8 = torch.float8_e4m3fn


@st.composite
def quant_params(draw):
    return dict(
        dtype=draw(st.sampled_from(QUANT_DTYPES)),
        tokens=draw(st.sampled_from([0, 1, 3, 7])),
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        seed=draw(st.integers(0, 2**16)),
    )


def quant_x_out(a: Arena, p: dict, hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fp8 quant ops' ``x`` (``[tokens, hidden]``, laid out as ``p["x_layout"]``, random
    normal values: no NaN bit patterns) and ``out`` (None, or fp8 laid out as ``p["out"]``)."""
    shape = (p["tokens"], hidden)
    x = a.tensor(shape, p["dtype"], p["x_layout"])
    rows = x[:1] if p["x_layout"] == "expand" else x  # every row of an expanded x is row 0
    rows.copy_(torch.randn(rows.shape, generator=a.gen).to(p["dtype"]))
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return x, None if p["out"] is None else a.tensor(shape, fp8, p["out"])


def quant_args(a: Arena, p: dict) -> dict:
    x, out = quant_x_out(a, p, QUANT_HIDDEN)
    return dict(x=x, out=out)


def quant_io_bad(hidden: int, hidden_deltas: list[int], split: tuple[int, int]) -> tuple[list[Bad], list[Bad]]:
    """The bad ``x`` and ``out`` both fp8 quant ops refuse, for rows of ``hidden`` elements:
    ``out`` wider or narrower by ``hidden_deltas``, or of rank 3 as ``[tokens, *split]``."""
    def shape(p):
        return (p["tokens"], hidden)

    x = [
        Bad("x", "dtype", TypeError,
            lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64, fp8])))),
        Bad("x", "step 2 in the last dimension", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 1), hidden), p["dtype"], "step2")),
        Bad("x", "transposed", ValueError, lambda a, p, d: a.tensor((hidden, max(p["tokens"], 2)), p["dtype"]).t()),
        Bad("x", "meta tensor", ValueError, lambda a, p, d: meta(shape(p), p["dtype"])),
        Bad("x", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0, 2.0]], 2.0]))),
        Bad("x", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), p["dtype"]))),
    ]
    out = [
        Bad("out", "dtype", TypeError,
            lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                [p["dtype"], fp16, torch.uint8, torch.int8, torch.float8_e5m2])))),
        Bad("out", "other rows", ValueError,
            lambda a, p, d: a.tensor((p["tokens"] + d.draw(st.sampled_from([1, 5])), hidden), fp8)),
        Bad("out", "other hidden size", ValueError,
            lambda a, p, d: a.tensor((p["tokens"], hidden + d.draw(st.sampled_from(hidden_deltas))), fp8)),
        Bad("out", "other rank, same elements", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["tokens"] * hidden,), (p["tokens"], *split)])), fp8)),
        Bad("out", "non-contiguous", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 2), hidden), fp8, d.draw(st.sampled_from(["step2", "padded"])))),
        Bad("out", "transposed", ValueError, lambda a, p, d: a.tensor((hidden, max(p["tokens"], 2)), fp8).t()),
        Bad("out", "stride 0 (expand)", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 2), hidden), fp8, "expand")),
        Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(shape(p), fp8)),
        Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
        Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), fp8))),
        Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(shape(p), fp8))),
        Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(shape(p), fp8)),
        Bad("out", f"{SHARED}: x's bytes", ValueError,
            lambda a, p, d: a.alias(p["args"]["x"], shape(p), fp8, d.draw(st.sampled_from([0, 1, 17])))),
    ]
    return x, out


_QUANT_X_BAD, _QUANT_OUT_BAD = quant_io_bad(QUANT_HIDDEN, [-1, 1, 32], (2, 16))
QUANT_BAD = _QUANT_X_BAD + [
    Bad("x", "0-d", ValueError, lambda a, p, d: a.tensor((), p["dtype"])),
    Bad("x", "hidden size 0", ValueError, lambda a, p, d: a.tensor((max(p["tokens"], 1), 0), p["dtype"])),
] + _QUANT_OUT_BAD


def quant_bad_args(a: Arena, p: dict, bad: Bad, d, make_args: Callable) -> dict:
    """The arguments of a quant op's call with ``bad`` in place; the other tensors are remade
    where they would otherwise be named first (only the bad argument is wrong)."""
    if bad.what.startswith(SHARED):
        p = dict(p, tokens=7, x_layout="contiguous")  # bytes to share
    args = make_args(a, p)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "out" and bad.what in ("non-contiguous", "transposed", "stride 0 (expand)"):
        args["x"] = a.tensor(value.shape, p["dtype"])  # the same shape, contiguous: only out is wrong
        args["x"].copy_(torch.randn(value.shape, generator=a.gen).to(p["dtype"]))
        a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    if bad.arg == "x" and args["out"] is not None and isinstance(value, torch.Tensor) and value.dim() == 2:
        args["out"] = a.tensor(value.shape, fp8)  # matching sizes: only x is wrong
    args[bad.arg] = value
    return args


@pytest.mark.parametrize("bad", QUANT_BAD, ids=bad_id)
@invalid_settings(QUANT_BAD)
@given(p=quant_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_per_token_quant_fp8_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = quant_bad_args(a, p, bad, d, quant_args)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit"):
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.per_token_quant_fp8(args["x"]), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.per_token_quant_fp8_out(args["out"], args["x"]), a, bad)
    else:
        check_invalid(lambda: ops.per_token_quant_fp8(**args), a, bad)


@VALID
@given(p=quant_params())
def test_per_token_quant_fp8_valid_views_give_the_reference(p):
    """Misaligned starts and row strides (the scalar variant), repeated rows (stride 0: x is only
    read), no rows, a misaligned ``out``: the reference's bytes, and nothing else written."""
    a = Arena.seeded(p["seed"])
    args = quant_args(a, p)
    want = a.copies()
    want_q, want_scales = quant.ref_per_token_quant_fp8(args["x"])
    if args["out"] is not None:
        a.twin(args["out"], want).view(torch.uint8).copy_(want_q.view(torch.uint8))
    q, scales = ops.per_token_quant_fp8(**args)
    if args["out"] is not None:
        assert q is args["out"]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# ----- per_token_group_quant_fp8

GQ_DTYPES = [bf16, fp32]  # x group size 16 x the four scale layouts: 8 of tests/test_group_quant.py's builds
GQ_GROUP = 16
GQ_HIDDEN = 48  # 3 groups: the packed UE8M0 word has a padding byte
GQ_LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]


@st.composite
def group_quant_params(draw):
    return dict(
        dtype=draw(st.sampled_from(GQ_DTYPES)),
        tokens=draw(st.sampled_from([0, 1, 3, 7])),
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        layout=draw(st.sampled_from(GQ_LAYOUTS)),
        eps=draw(st.sampled_from([1e-10, 0.0, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def group_quant_args(a: Arena, p: dict) -> dict:
    x, out = quant_x_out(a, p, GQ_HIDDEN)
    return dict(x=x, group_size=GQ_GROUP, column_major_scales=p["layout"][0], scale_ue8m0=p["layout"][1],
                eps=p["eps"], out=out)


_GQ_X_BAD, _GQ_OUT_BAD = quant_io_bad(GQ_HIDDEN, [-16, 1, 16], (3, 16))
GROUP_QUANT_BAD = _GQ_X_BAD + [
    Bad("x", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(), (GQ_HIDDEN,), (p["tokens"], 1, GQ_HIDDEN)])),
                                 p["dtype"])),
    Bad("x", "hidden size not a multiple of group_size", ValueError,
        lambda a, p, d: a.tensor((max(p["tokens"], 1), d.draw(st.sampled_from([8, 40, 50]))), p["dtype"])),
    Bad("group_size", "no kernel", ValueError, lambda a, p, d: d.draw(st.sampled_from([0, 8, 12, 96, 256, -16]))),
    Bad("group_size", "not an int", TypeError, lambda a, p, d: d.draw(st.sampled_from([16.0, "16", None, True]))),
    Bad("column_major_scales", "not a bool", TypeError,
        lambda a, p, d: d.draw(st.sampled_from([1, 0, "yes", None, 1.0]))),
    Bad("scale_ue8m0", "not a bool", TypeError, lambda a, p, d: d.draw(st.sampled_from([1, 0, "yes", None, 1.0]))),
    Bad("eps", "negative or not finite", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([-1e-10, -1.0, float("nan"), float("inf"), 1e300]))),
    Bad("eps", "not a number", TypeError, lambda a, p, d: d.draw(st.sampled_from(["1e-10", None, [1e-10], 1j]))),
] + _GQ_OUT_BAD

#: The kinds torch's own schema checks refuse before kernkit could name the argument.
GQ_NOT_VIA_CUSTOM_OP = ("meta tensor", "not a tensor", "negative bit", "not an int", "not a bool", "not a number")


@pytest.mark.parametrize("bad", GROUP_QUANT_BAD, ids=bad_id)
@invalid_settings(GROUP_QUANT_BAD)
@given(p=group_quant_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_per_token_group_quant_fp8_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = quant_bad_args(a, p, bad, d, group_quant_args)
    if via == "custom op" and bad.what not in GQ_NOT_VIA_CUSTOM_OP:
        flags = dict(column_major_scales=args["column_major_scales"], scale_ue8m0=args["scale_ue8m0"], eps=args["eps"])
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.per_token_group_quant_fp8(args["x"], args["group_size"], **flags),
                          a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.per_token_group_quant_fp8_out(args["out"], args["x"],
                                                                                  args["group_size"], **flags), a, bad)
    else:
        check_invalid(lambda: ops.per_token_group_quant_fp8(**args), a, bad)


@VALID
@given(p=group_quant_params())
def test_per_token_group_quant_fp8_valid_views_give_the_reference(p):
    """Misaligned starts and row strides (the scalar variant), repeated rows (stride 0: x is only
    read), no rows, a misaligned ``out``, every scale layout, eps 0: the reference's bytes and
    scale strides, and nothing else written."""
    a = Arena.seeded(p["seed"])
    args = group_quant_args(a, p)
    want = a.copies()
    want_q, want_scales = group_quant.ref_per_token_group_quant_fp8(args["x"], GQ_GROUP, *p["layout"], p["eps"])
    if args["out"] is not None:
        a.twin(args["out"], want).view(torch.uint8).copy_(want_q.view(torch.uint8))
    q, scales = ops.per_token_group_quant_fp8(**args)
    if args["out"] is not None:
        assert q is args["out"]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert p["tokens"] == 0 or scales.stride() == want_scales.stride()
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# ----- rotary_embedding

#: (dtype, head_dim, rot_dim, is_neox): two of the builds tests/test_rope.py makes.
ROPE_SPECS = [(bf16, 128, 128, True), (fp32, 64, 32, False)]
ROPE_NEEDS_TWO_TOKENS = ("overlapping heads (expand)",)


@st.composite
def rope_params(draw):
    dtype, head_dim, rot_dim, is_neox = draw(st.sampled_from(ROPE_SPECS))
    return dict(
        dtype=dtype, head_dim=head_dim, rot_dim=rot_dim, is_neox=is_neox,
        n=draw(st.sampled_from([0, 1, 3, 9])),
        q_heads=draw(st.sampled_from([1, 2, 3])),
        k_heads=draw(st.sampled_from([1, 2])),
        q_rank=draw(st.sampled_from([2, 3])),
        k_rank=draw(st.sampled_from([2, 3])),
        q_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
        k_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
        pos_dtype=draw(st.sampled_from([i32, i64])),
        cache_dtype=draw(st.sampled_from(["fp32", "q"])),
        cache_layout=draw(st.sampled_from(["contiguous", "offset"])),
        max_pos=draw(st.sampled_from([1, 8, 40])),
        seed=draw(st.integers(0, 2**16)),
    )


def _heads_shape(p: dict, heads: int, rank: int, n: int | None = None) -> tuple[int, ...]:
    n = p["n"] if n is None else n
    return (n, heads * p["head_dim"]) if rank == 2 else (n, heads, p["head_dim"])


def _filled(a: Arena, t: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``t`` holding ``values``, remembered as its buffer's original bytes."""
    t.copy_(values)
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return t


def rope_args(a: Arena, p: dict) -> dict:
    dt, n, mp = p["dtype"], p["n"], p["max_pos"]
    out = {}
    for name, heads, rank, layout in (("q", p["q_heads"], p["q_rank"], p["q_layout"]),
                                      ("k", p["k_heads"], p["k_rank"], p["k_layout"])):
        shape = _heads_shape(p, heads, rank)
        out[name] = _filled(a, a.tensor(shape, dt, layout), torch.randn(shape, generator=a.gen).to(dt))
    values = torch.randint(0, mp, (n,), generator=a.gen).tolist()
    bad = [-1, mp, 2**31 - 1, -(2**31)] + ([2**32 + 1, -(2**32), 2**40] if p["pos_dtype"] == i64 else [])
    for i in range(0, n, 3):  # positions the kernel must skip
        values[i] = bad[i // 3 % len(bad)]
    positions = _filled(a, a.tensor((n,), p["pos_dtype"]), torch.tensor(values, dtype=p["pos_dtype"]))
    cache_dtype = fp32 if p["cache_dtype"] == "fp32" else dt
    cache = _filled(a, a.tensor((mp, p["rot_dim"]), cache_dtype, p["cache_layout"]),
                    (torch.rand(mp, p["rot_dim"], generator=a.gen) * 2 - 1).to(cache_dtype))
    return dict(positions=positions, q=out["q"], k=out["k"], cos_sin_cache=cache, is_neox=p["is_neox"],
                head_dim=p["head_dim"])


def _rope_other_float(p: dict) -> torch.dtype:
    return fp16 if p["dtype"] != fp16 else bf16


def _heads_bad(arg: str) -> list[Bad]:
    """The bad q or k views of rope and qk_norm, which ``rows::verify_heads`` and the op's dtype
    check refuse; ``p`` holds ``n``, ``dtype``, ``head_dim`` and the argument's heads and rank."""
    heads, rank = f"{arg}_heads", f"{arg}_rank"

    def shape(p, n=None):
        return _heads_shape(p, p[heads], p[rank], n)

    out = [
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"] * p["head_dim"],), (p["n"], 1, 2, p["head_dim"]),
                                                             ()])), p["dtype"])),
        Bad(arg, "row not whole heads", ValueError,
            lambda a, p, d: a.tensor((p["n"], p[heads] * p["head_dim"] + d.draw(st.sampled_from([2, -2]))),
                                     p["dtype"])),
        Bad(arg, "head_dim differs (3-d)", ValueError,
            lambda a, p, d: a.tensor((p["n"], p[heads], p["head_dim"] * d.draw(st.sampled_from([2, 3]))),
                                     p["dtype"])),
        Bad(arg, "no heads", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 0), (p["n"], 0, p["head_dim"])])), p["dtype"])),
        Bad(arg, "non-contiguous head_dim", ValueError,  # transposed: heads and head_dim swapped, 2 heads or more
            lambda a, p, d: a.tensor(_heads_shape(p, max(p[heads], 2), p[rank]), p["dtype"],
                                     d.draw(st.sampled_from(["step2", "transposed"])))),
        Bad(arg, "overlapping heads (expand)", ValueError,
            lambda a, p, d: a.tensor(shape(p), p["dtype"], "expand")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta(shape(p), p["dtype"])),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, 3, [[0.0] * 4]]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), p["dtype"]))),
        Bad(arg, "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(shape(p), p["dtype"]))),
        Bad(arg, "inference tensor", RuntimeError, lambda a, p, d: a.inference(shape(p), p["dtype"])),
    ]
    if arg == "q":  # q's dtype picks the build: a float dtype would be another build, then 'k' is named
        out.append(Bad(arg, "unsupported dtype", TypeError,
                       lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                           [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64])))))
    else:  # q binds the tokens and the dtype first
        out += [Bad(arg, "dtype unlike q's", TypeError,
                    lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                        [_rope_other_float(p), torch.int32, torch.float64])))),
                Bad(arg, "tokens differ", ValueError, lambda a, p, d: a.tensor(shape(p, p["n"] + 1), p["dtype"]))]
    return out


ROPE_BAD = _heads_bad("q") + _heads_bad("k") + [
    # positions bind the tokens before q
    Bad("q", "tokens differ", ValueError,
        lambda a, p, d: a.tensor(_heads_shape(p, p["q_heads"], p["q_rank"], p["n"] + 1), p["dtype"])),
    Bad("positions", "dtype", TypeError,
        lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
    Bad("positions", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["pos_dtype"])),
    Bad("positions", "tokens differ", ValueError,
        lambda a, p, d: a.tensor((p["n"] + d.draw(st.sampled_from([1, 2])),), p["pos_dtype"])),
    Bad("positions", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((p["n"],), p["pos_dtype"], "step2") if p["n"] > 1 else
        a.tensor((2,), p["pos_dtype"], "step2")),
    Bad("positions", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["pos_dtype"])),
    Bad("positions", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 2]))),
    Bad("positions", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"],), p["pos_dtype"]))),
    Bad("cos_sin_cache", "dtype", TypeError,
        lambda a, p, d: a.tensor((p["max_pos"], p["rot_dim"]), d.draw(st.sampled_from(
            [_rope_other_float(p), torch.float64, torch.int32])))),
    Bad("cos_sin_cache", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["max_pos"] * p["rot_dim"],),
                                                          (p["max_pos"], 2, p["rot_dim"]), ()])), fp32)),
    Bad("cos_sin_cache", "odd or empty rot_dim", ValueError,
        lambda a, p, d: a.tensor((p["max_pos"], d.draw(st.sampled_from([p["rot_dim"] - 1, 0]))), fp32)),
    Bad("cos_sin_cache", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((p["max_pos"], p["rot_dim"]), fp32, d.draw(st.sampled_from(["step2", "padded"])))
        if p["max_pos"] > 1 else a.tensor((2, p["rot_dim"]), fp32, "step2")),
    Bad("cos_sin_cache", "meta tensor", ValueError, lambda a, p, d: meta((p["max_pos"], p["rot_dim"]), fp32)),
    Bad("cos_sin_cache", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0, 0.0]]]))),
    Bad("cos_sin_cache", "negative bit", ValueError,
        neg_bit(lambda a, p, d: a.tensor((p["max_pos"], p["rot_dim"]), fp32))),
    Bad("head_dim", "below rot_dim", ValueError, lambda a, p, d: p["rot_dim"] - d.draw(st.sampled_from([2, 8]))),
    Bad("head_dim", "not an int", TypeError, lambda a, p, d: d.draw(st.sampled_from(["64", 64.0, 2**64]))),
    Bad("is_neox", "not a bool", TypeError, lambda a, p, d: d.draw(st.sampled_from(["yes", None, 2.5]))),
    Bad("k", f"{SHARED}: bytes of q", ValueError,
        lambda a, p, d: a.alias(p["args"]["q"], _heads_shape(p, 1, p["k_rank"]), p["dtype"],
                                d.draw(st.sampled_from([0, 1, -1, 8])))),
    Bad("q", f"{SHARED}: bytes of the cache", ValueError,
        lambda a, p, d: a.alias(p["args"]["cos_sin_cache"], _heads_shape(p, 1, p["q_rank"]), p["dtype"])),
    Bad("positions", f"{SHARED}: bytes of k", ValueError,
        lambda a, p, d: a.alias(p["args"]["k"], (p["n"],), p["pos_dtype"])),
]


@pytest.mark.parametrize("bad", ROPE_BAD, ids=bad_id)
@invalid_settings(ROPE_BAD)
@given(p=rope_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_rotary_embedding_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what in ROPE_NEEDS_TWO_TOKENS:
        p = dict(p, n=max(p["n"], 2))
    if bad.what.startswith(SHARED):  # something to share: one head of 3 tokens, a 40-row cache
        p = dict(p, n=3, q_heads=1, k_heads=1, max_pos=40)
    if bad.arg == "head_dim" and bad.what == "below rot_dim":
        p = dict(p, q_rank=2, k_rank=2)  # 3-d heads would be named by their head_dim first
    args = rope_args(a, p)
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not an int", "not a bool",
                                                "negative bit"):
        check_invalid(lambda: torch.ops.kernkit.rotary_embedding(
            args["positions"], args["q"], args["k"], args["cos_sin_cache"], args["is_neox"],
            head_dim=args["head_dim"]), a, bad)
    else:
        check_invalid(lambda: ops.rotary_embedding(**args), a, bad)


@VALID
@given(p=rope_params())
def test_rotary_embedding_valid_views_give_the_reference_bytes(p):
    """Misaligned and padded q/k (2-d and 3-d), misaligned caches of fp32 or q's dtype, out-of-range
    positions (int64 ones with in-range low bits), n == 0: every buffer matches the reference."""
    a = Arena.seeded(p["seed"])
    args = rope_args(a, p)
    want = a.copies()
    rope.ref_rotary_embedding(args["positions"], a.twin(args["q"], want), a.twin(args["k"], want),
                               args["cos_sin_cache"], p["is_neox"], p["head_dim"])
    assert ops.rotary_embedding(**args) is None
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# ----- rotary_embedding_store


@st.composite
def rope_store_params(draw):
    return dict(draw(rope_params()),
                v_rank=draw(st.sampled_from([2, 3])),
                v_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
                cache_rank=draw(st.sampled_from([2, 3])),
                kv_cache_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
                pool=draw(st.sampled_from([1, 8, 40])),
                loc_dtype=draw(st.sampled_from([i32, i64])))


def _kv_cache_shape(p: dict, rank: int | None = None, pool: int | None = None) -> tuple[int, ...]:
    pool = p["pool"] if pool is None else pool
    return _heads_shape(dict(p, n=pool), p["k_heads"], p["cache_rank"] if rank is None else rank)


def rope_store_args(a: Arena, p: dict) -> dict:
    args = rope_args(a, p)
    dt, n, pool = p["dtype"], p["n"], p["pool"]
    shape = _heads_shape(p, p["k_heads"], p["v_rank"])
    args["v"] = _filled(a, a.tensor(shape, dt, p["v_layout"]), torch.randn(shape, generator=a.gen).to(dt))
    for name in ("k_cache", "v_cache"):
        args[name] = a.tensor(_kv_cache_shape(p), dt, p["kv_cache_layout"])
    perm = torch.randperm(pool, generator=a.gen).tolist()
    values = [perm[i] if i < pool else pool + i for i in range(n)]  # distinct valid rows
    for i in range(1, n, 3):  # and out-of-range ones the kernel must skip
        values[i] = [-1, pool, 2**31 - 1, -(2**31)][i // 3 % 4]
    args["out_loc"] = _filled(a, a.tensor((n,), p["loc_dtype"]), torch.tensor(values, dtype=p["loc_dtype"]))
    return args


def _kv_cache_bad(arg: str) -> list[Bad]:
    """The bad K or V caches: ``rows::verify_rows`` with k's heads and head_dim."""
    return [
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["pool"] * p["k_heads"] * p["head_dim"],),
                                                             (p["pool"], p["k_heads"], 1, p["head_dim"]), ()])),
                                     p["dtype"])),
        Bad(arg, "dtype unlike q's", TypeError,
            lambda a, p, d: a.tensor(_kv_cache_shape(p), d.draw(st.sampled_from(
                [_rope_other_float(p), torch.int16, torch.float64])))),
        Bad(arg, "row unlike k's", ValueError,
            lambda a, p, d: a.tensor((p["pool"], (p["k_heads"] + d.draw(st.sampled_from([1, 2]))) * p["head_dim"]),
                                     p["dtype"])),
        Bad(arg, "heads unlike k's (3-d)", ValueError,
            lambda a, p, d: a.tensor((p["pool"], 2 * p["k_heads"], p["head_dim"] // 2), p["dtype"])),
        Bad(arg, "non-contiguous row", ValueError,
            lambda a, p, d: a.tensor(_kv_cache_shape(p), p["dtype"], d.draw(st.sampled_from(["step2", "transposed"])))),
        Bad(arg, "overlapping rows (expand)", ValueError,
            lambda a, p, d: a.tensor(_kv_cache_shape(p, pool=max(p["pool"], 2)), p["dtype"], "expand")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta(_kv_cache_shape(p), p["dtype"])),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, 3]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(_kv_cache_shape(p), p["dtype"]))),
        Bad(arg, "requires grad", RuntimeError,
            requires_grad(lambda a, p, d: a.tensor(_kv_cache_shape(p), p["dtype"]))),
    ]


ROPE_STORE_BAD = ROPE_BAD + [b for b in _heads_bad("v") if b.what not in ("requires grad", "inference tensor")] + [
    Bad("v", "heads unlike k's", ValueError,
        lambda a, p, d: a.tensor(_heads_shape(p, p["k_heads"] + 1, 3), p["dtype"])),
    Bad("out_loc", "dtype", TypeError, lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
    Bad("out_loc", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["loc_dtype"])),
    Bad("out_loc", "tokens differ", ValueError,
        lambda a, p, d: a.tensor((p["n"] + d.draw(st.sampled_from([1, 2])),), p["loc_dtype"])),
    Bad("out_loc", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((max(p["n"], 2),), p["loc_dtype"], "step2")),
    Bad("out_loc", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["loc_dtype"])),
    Bad("out_loc", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 2]))),
    Bad("out_loc", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"],), p["loc_dtype"]))),
    Bad("k_cache", f"{SHARED}: bytes of q", ValueError,
        lambda a, p, d: a.alias(p["args"]["q"], _kv_cache_shape(p, 2), p["dtype"])),
    Bad("v_cache", f"{SHARED}: bytes of the K cache", ValueError,
        lambda a, p, d: a.alias(p["args"]["k_cache"], _kv_cache_shape(p, 2), p["dtype"],
                                d.draw(st.sampled_from([0, 1])))),
    Bad("k_cache", f"{SHARED}: bytes of v", ValueError,
        lambda a, p, d: a.alias(p["args"]["v"], _kv_cache_shape(p, 2), p["dtype"])),
    Bad("out_loc", f"{SHARED}: bytes of the V cache", ValueError,
        lambda a, p, d: a.alias(p["args"]["v_cache"], (p["n"],), p["loc_dtype"])),
    Bad("v", f"{SHARED}: bytes of k", ValueError,
        lambda a, p, d: a.alias(p["args"]["k"], _heads_shape(p, 1, p["v_rank"]), p["dtype"])),
] + _kv_cache_bad("k_cache") + _kv_cache_bad("v_cache")


def _rope_store_call(args: dict, via: str):
    if via == "op":
        return lambda: ops.rotary_embedding_store(**args)
    names = ("positions", "q", "k", "v", "cos_sin_cache", "k_cache", "v_cache", "out_loc", "is_neox")
    return lambda: torch.ops.kernkit.rotary_embedding_store(*(args[n] for n in names), head_dim=args["head_dim"])


@pytest.mark.parametrize("bad", ROPE_STORE_BAD, ids=bad_id)
@invalid_settings(ROPE_STORE_BAD)
@given(p=rope_store_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_rotary_embedding_store_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what in ROPE_NEEDS_TWO_TOKENS:
        p = dict(p, n=max(p["n"], 2))
    if bad.what.startswith(SHARED):  # something to share: one head of 3 tokens, one-row caches
        p = dict(p, n=3, q_heads=1, k_heads=1, max_pos=40, pool=1)
    if bad.arg == "head_dim" and bad.what == "below rot_dim":
        p = dict(p, q_rank=2, k_rank=2)  # 3-d heads would be named by their head_dim first
    if bad.arg.endswith("_cache") and bad.what == "heads unlike k's (3-d)":
        p = dict(p, cache_rank=3)
    p = dict(p, v_heads=p["k_heads"])
    args = rope_store_args(a, p)
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    direct = bad.what in ("meta tensor", "not a tensor", "not an int", "not a bool", "negative bit")
    check_invalid(_rope_store_call(args, "op" if direct else via), a, bad)


@VALID
@given(p=rope_store_params())
def test_rotary_embedding_store_valid_views_give_the_reference_bytes(p):
    """The views of rope's valid-call test, v of any rank and row stride, 2-d and 3-d caches with
    misaligned or padded rows, out-of-range positions and cache rows: every buffer matches the
    reference (rotary_embedding, then store_cache)."""
    a = Arena.seeded(p["seed"])
    args = rope_store_args(a, p)
    want = a.copies()
    twin = {n: a.twin(t, want) for n, t in args.items()}
    rope_store.ref_rotary_embedding_store(twin["positions"], twin["q"], twin["k"], twin["v"], twin["cos_sin_cache"],
                                     twin["k_cache"], twin["v_cache"], twin["out_loc"], p["is_neox"], p["head_dim"])
    assert ops.rotary_embedding_store(**args) is None
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# ----- qk_norm

QK_DIM = 64  # fp16 x 64: one build; the bad dtypes and head sizes never reach a build


@st.composite
def qk_params(draw):
    return dict(
        dtype=fp16, head_dim=QK_DIM,
        n=draw(st.sampled_from([0, 1, 3, 9])),
        q_heads=draw(st.sampled_from([1, 2, 3])),
        k_heads=draw(st.sampled_from([1, 2])),
        q_rank=draw(st.sampled_from([2, 3])),
        k_rank=draw(st.sampled_from([2, 3])),
        fused=draw(st.booleans()),  # q and k slices of one [n, (q_heads + 2 * k_heads) * QK_DIM] tensor
        eps=draw(st.sampled_from([1e-6, 0.0, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def _qk_heads(a: Arena, p: dict, heads: int, rank: int) -> torch.Tensor:
    t = a.tensor(_heads_shape(p, heads, rank), fp16)
    return _filled(a, t, torch.randn(t.shape, generator=a.gen).to(fp16))


def qk_args(a: Arena, p: dict) -> dict:
    if p["fused"]:
        qh, kh = p["q_heads"], p["k_heads"]
        qkv = _filled(a, a.tensor((p["n"], (qh + 2 * kh) * QK_DIM), fp16),
                      torch.randn(p["n"], (qh + 2 * kh) * QK_DIM, generator=a.gen).to(fp16))
        q, k = qkv[:, :qh * QK_DIM], qkv[:, qh * QK_DIM:(qh + kh) * QK_DIM]
        q = q if p["q_rank"] == 2 else q.unflatten(1, (qh, QK_DIM))
        k = k if p["k_rank"] == 2 else k.unflatten(1, (kh, QK_DIM))
    else:
        q, k = _qk_heads(a, p, p["q_heads"], p["q_rank"]), _qk_heads(a, p, p["k_heads"], p["k_rank"])
    weights = [_filled(a, a.tensor((QK_DIM,), fp16), torch.randn(QK_DIM, generator=a.gen).to(fp16)) for _ in "qk"]
    return dict(q=q, k=k, q_weight=weights[0], k_weight=weights[1], eps=p["eps"])


def _qk_heads_bad(arg: str) -> list[Bad]:
    """``_heads_bad``, and the 16-byte alignment qk_norm's vectors need (rope takes any)."""
    return _heads_bad(arg) + [
        Bad(arg, "misaligned", ValueError,
            lambda a, p, d: a.tensor(_heads_shape(p, p[f"{arg}_heads"], p[f"{arg}_rank"], max(p["n"], 2) if arg == "q"
                                                  else None), fp16, d.draw(st.sampled_from(["offset", "padded"])))),
    ]


def _qk_weight_bad(arg: str) -> list[Bad]:
    # q_weight's length picks the build: a length without one is refused naming it; a supported
    # one other than q's head_dim names q (its heads), so k_weight carries the wrong-length kind.
    lengths = [96, 32, 0] if arg == "q_weight" else [QK_DIM // 2, 2 * QK_DIM]
    return [
        Bad(arg, "length", ValueError, lambda a, p, d: a.tensor((d.draw(st.sampled_from(lengths)),), fp16)),
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(1, QK_DIM), (2, QK_DIM)])), fp16)),
        Bad(arg, "dtype", TypeError,
            lambda a, p, d: a.tensor((QK_DIM,), d.draw(st.sampled_from([bf16, fp32, torch.int16, torch.bool])))),
        Bad(arg, "non-contiguous", ValueError, lambda a, p, d: a.tensor((QK_DIM,), fp16, "step2")),
        Bad(arg, "misaligned start", ValueError, lambda a, p, d: a.tensor((QK_DIM,), fp16, "offset")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta((QK_DIM,), fp16)),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1.0] * QK_DIM, 1.0]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((QK_DIM,), fp16))),
        Bad(arg, f"{SHARED}: bytes of k", ValueError,
            lambda a, p, d: a.alias(p["args"]["k"], (QK_DIM,), fp16, d.draw(st.sampled_from([0, 8, 64])))),
    ]


QK_NORM_BAD = _qk_heads_bad("q") + _qk_heads_bad("k") + _qk_weight_bad("q_weight") + _qk_weight_bad("k_weight") + [
    Bad("k", f"{SHARED}: bytes of q", ValueError,
        lambda a, p, d: a.alias(p["args"]["q"], _heads_shape(p, 1, p["k_rank"]), fp16,
                                d.draw(st.sampled_from([0, 8, 64])))),
    Bad("eps", "negative or not finite", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([-1e-6, -1.0, float("nan"), float("inf"), 1e300]))),
    Bad("eps", "not a number", TypeError, lambda a, p, d: d.draw(st.sampled_from(["1e-6", None, [1e-6], 1j]))),
]


@pytest.mark.parametrize("bad", QK_NORM_BAD, ids=bad_id)
@invalid_settings(QK_NORM_BAD)
@given(p=qk_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_qk_norm_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what in ("overlapping heads (expand)", "misaligned") or bad.what.startswith(SHARED):
        p = dict(p, n=max(p["n"], 2), fused=False)  # rows to overlap or to misalign; own buffers to alias
    args = qk_args(a, p)
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a number", "negative bit"):
        check_invalid(lambda: torch.ops.kernkit.qk_norm(args["q"], args["k"], args["q_weight"], args["k_weight"],
                                                        args["eps"]), a, bad)
    else:
        check_invalid(lambda: ops.qk_norm(**args), a, bad)


@VALID
@given(p=qk_params())
def test_qk_norm_valid_views_give_the_reference_bytes(p):
    """q and k of 2 and 3 dimensions, on their own or sliced from one QKV tensor (whose v columns
    must stay as they were), n == 0: every buffer matches the reference."""
    a = Arena.seeded(p["seed"])
    args = qk_args(a, p)
    want = a.copies()
    q, k = a.twin(args["q"], want), a.twin(args["k"], want)
    qk.ref_qk_norm(q, k, args["q_weight"], args["k_weight"], p["eps"])
    assert ops.qk_norm(**args) is None
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# ----- rmsnorm (rmsnorm and fused_add_rmsnorm)

NORM_HIDDEN = 128  # fp16 x 128: one build (groups of 4 lanes); the bad dtypes never reach a build


@st.composite
def norm_params(draw):
    return dict(
        lead=draw(st.sampled_from([(0,), (1,), (3,), (2, 5), ()])),
        x_layout=draw(st.sampled_from(["contiguous", "wide"])),
        other_layout=draw(st.sampled_from(["contiguous", "wide"])),  # out or residual
        has_out=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-6, 1e-2, 0.0, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def norm_rows(a: Arena, lead: tuple, layout: str, dtype: torch.dtype = fp16, values: bool = True) -> torch.Tensor:
    """A ``[*lead, NORM_HIDDEN]`` tensor: contiguous, or (``wide``) the first half of the rows of
    a tensor twice as wide (16-byte aligned strided rows). With ``values`` it holds normal
    numbers (no NaN bit patterns) and the arena remembers them."""
    if layout == "wide":
        t = a.tensor((*lead, 2 * NORM_HIDDEN), dtype)[..., :NORM_HIDDEN]
    else:
        t = a.tensor((*lead, NORM_HIDDEN), dtype)
    if values and dtype.is_floating_point and dtype.itemsize > 1:
        t.copy_(torch.randn(t.shape, generator=a.gen).to(dtype))
        a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return t


def norm_args(a: Arena, p: dict, fused: bool) -> dict:
    x = norm_rows(a, p["lead"], p["x_layout"])
    weight = norm_rows(a, (), "contiguous")
    if fused:
        return dict(x=x, residual=norm_rows(a, p["lead"], p["other_layout"]), weight=weight, eps=p["eps"])
    out = norm_rows(a, p["lead"], p["other_layout"], values=False) if p["has_out"] else None
    return dict(x=x, weight=weight, eps=p["eps"], out=out)


def _norm_shape(p):
    return (*p["lead"], NORM_HIDDEN)


def _norm_bad(fused: bool) -> list[Bad]:
    H = NORM_HIDDEN
    out: list[Bad] = [
        Bad("x", "unsupported dtype", TypeError,
            lambda a, p, d: a.tensor(_norm_shape(p), d.draw(st.sampled_from(
                [torch.int32, torch.int16, torch.bool, torch.float64, torch.float8_e4m3fn])))),
        Bad("x", "hidden without a kernel", ValueError,
            lambda a, p, d: a.tensor((*p["lead"], d.draw(st.sampled_from([100, 6, 0, 2**18]))), fp16)),
        Bad("x", "0-d", ValueError, lambda a, p, d: a.tensor((), fp16)),
        Bad("x", "strided last dimension", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "step2")),
        Bad("x", "misaligned start", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "offset")),
        Bad("x", "misaligned row stride", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "padded")),
        Bad("x", "leading dimensions do not collapse", ValueError,
            lambda a, p, d: a.tensor((3, 2, H), fp16).transpose(0, 1)),
        Bad("x", "meta tensor", ValueError, lambda a, p, d: meta(_norm_shape(p), fp16)),
        Bad("x", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0] * H], 2.0]))),
        Bad("x", "negative bit", ValueError, neg_bit(lambda a, p, d: norm_rows(a, p["lead"], p["x_layout"]))),
        Bad("weight", "dtype", TypeError,
            lambda a, p, d: a.tensor((H,), d.draw(st.sampled_from([bf16, fp32, torch.int16, torch.bool])))),
        Bad("weight", "shape", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(H // 2,), (H + 8,), (1, H), (2, H), ()])), fp16)),
        Bad("weight", "non-contiguous", ValueError, lambda a, p, d: a.tensor((H,), fp16, "step2")),
        Bad("weight", "misaligned start", ValueError, lambda a, p, d: a.tensor((H,), fp16, "offset")),
        Bad("weight", "meta tensor", ValueError, lambda a, p, d: meta((H,), fp16)),
        Bad("weight", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1.0] * H, 1.0]))),
        Bad("weight", "negative bit", ValueError, neg_bit(lambda a, p, d: norm_rows(a, (), "contiguous"))),
        Bad("eps", "negative or not finite", ValueError,
            lambda a, p, d: d.draw(st.sampled_from([-1e-6, -1.0, float("nan"), float("inf"), 1e300]))),
        Bad("eps", "not a number", TypeError, lambda a, p, d: d.draw(st.sampled_from(["1e-6", None, [1e-6], 1j]))),
    ]
    other = "residual" if fused else "out"
    written = "x" if fused else "out"  # weight may share bytes with what is only read
    out.append(Bad("weight", f"{SHARED}: bytes of {written}", ValueError,
                   lambda a, p, d: a.alias(p["args"][written], (H,), fp16, d.draw(st.sampled_from([0, 8, 64])))))
    out += [
        Bad(other, "dtype", TypeError,
            lambda a, p, d: a.tensor(_norm_shape(p), d.draw(st.sampled_from([bf16, fp32, torch.int16, torch.bool])))),
        Bad(other, "shape differs", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(4, 7, H), (H,), (1, 3, H) if p["lead"] != (1, 3) else (3, H)])),
                                     fp16)),
        Bad(other, "overlapping rows (expand)", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "expand")),
        Bad(other, "strided last dimension", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "step2")),
        Bad(other, "misaligned start", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "offset")),
        Bad(other, "meta tensor", ValueError, lambda a, p, d: meta(_norm_shape(p), fp16)),
        Bad(other, "not a tensor", TypeError, lambda a, p, d: [[0.0] * H]),
        Bad(other, "negative bit", ValueError, neg_bit(lambda a, p, d: norm_rows(a, p["lead"], "contiguous"))),
        Bad(other, "requires grad", RuntimeError, requires_grad(lambda a, p, d: norm_rows(a, p["lead"], "contiguous"))),
        Bad(other, "inference tensor", RuntimeError, lambda a, p, d: a.inference(_norm_shape(p), fp16)),
        # A shift of 0 is rmsnorm's exact in-place form where x is contiguous, which is accepted.
        Bad(other, f"{SHARED}: x shifted", ValueError,
            lambda a, p, d: a.alias(p["args"]["x"], _norm_shape(p), fp16,
                                    d.draw(st.sampled_from([0, 8, -8, 24] if fused else [8, -8, 24])))),
    ]
    if fused:  # x is written too
        out += [
            Bad("x", "overlapping rows (expand)", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "expand")),
            Bad("x", "requires grad", RuntimeError,
                requires_grad(lambda a, p, d: norm_rows(a, p["lead"], p["x_layout"]))),
            Bad("x", "inference tensor", RuntimeError, lambda a, p, d: a.inference(_norm_shape(p), fp16)),
        ]
    return out


RMSNORM_BAD = _norm_bad(False)
FUSED_NORM_BAD = _norm_bad(True)

#: The bad kinds that replace x with a tensor of another shape: the other row tensor follows it.
_NORM_RESHAPING = ("strided last dimension", "misaligned start", "misaligned row stride",
                   "leading dimensions do not collapse", "overlapping rows (expand)")


def _norm_call(args: dict, fused: bool, bad: Bad, a: Arena, via: str) -> None:
    custom = via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a number", "negative bit")
    if fused:
        op = torch.ops.kernkit.fused_add_rmsnorm if custom else ops.fused_add_rmsnorm
        check_invalid(lambda: op(args["x"], args["residual"], args["weight"], args["eps"]), a, bad)
    elif not custom:
        check_invalid(lambda: ops.rmsnorm(**args), a, bad)
    elif args["out"] is None:
        check_invalid(lambda: torch.ops.kernkit.rmsnorm(args["x"], args["weight"], args["eps"]), a, bad)
    else:
        check_invalid(lambda: torch.ops.kernkit.rmsnorm_out(args["out"], args["x"], args["weight"], args["eps"]), a,
                      bad)


def _norm_invalid(bad: Bad, p: dict, via: str, d, fused: bool) -> None:
    a = Arena.seeded(p["seed"])
    other = "residual" if fused else "out"
    if bad.what.startswith(SHARED):
        p = dict(p, lead=(3,), x_layout="contiguous", other_layout="contiguous", has_out=True)  # rows to share
    if bad.arg == other or (not fused and bad.arg == "out"):
        p = dict(p, has_out=True)
    args = norm_args(a, p, fused)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "x" and bad.what in _NORM_RESHAPING:
        args[other] = a.tensor(value.shape, fp16) if fused or args["out"] is not None else None
    if bad.arg == other and bad.what in _NORM_RESHAPING:
        args["x"] = a.tensor(value.shape, fp16)  # x of the same shape: only the layout is wrong
    args[bad.arg] = value
    _norm_call(args, fused, bad, a, via)


@pytest.mark.parametrize("bad", RMSNORM_BAD, ids=bad_id)
@invalid_settings(RMSNORM_BAD)
@given(p=norm_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_rmsnorm_rejects_invalid_calls(bad, p, via, d):
    _norm_invalid(bad, p, via, d, False)


@pytest.mark.parametrize("bad", FUSED_NORM_BAD, ids=bad_id)
@invalid_settings(FUSED_NORM_BAD)
@given(p=norm_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_fused_add_rmsnorm_rejects_invalid_calls(bad, p, via, d):
    _norm_invalid(bad, p, via, d, True)


@VALID
@given(p=norm_params(), fused=st.booleans())
def test_norm_valid_views_give_the_reference_bytes(p, fused):
    """Strided (16-byte aligned) rows in and out, 1-d, empty and 3-d inputs, eps of several
    sizes: the bytes of the kernel-order reference (``norm.ref_rmsnorm``), every other byte of
    every buffer (row padding, guards) unchanged."""
    a = Arena.seeded(p["seed"])
    args = norm_args(a, p, fused)
    want = a.copies()
    tw = {k: a.twin(v, want) for k, v in args.items()}
    if fused:
        norm.ref_fused_add_rmsnorm(tw["x"], tw["residual"], tw["weight"], p["eps"])
        assert ops.fused_add_rmsnorm(**args) is None
    else:
        expect = tw["out"] if tw["out"] is not None else torch.empty(_norm_shape(p), dtype=fp16)
        norm.ref_rmsnorm(expect, tw["x"], tw["weight"], p["eps"])
        got = ops.rmsnorm(**args)
        assert got.shape == expect.shape
        if args["out"] is not None:
            assert got is args["out"]
        assert torch.equal(got.contiguous().view(torch.uint8), expect.contiguous().view(torch.uint8))
    assert a.same_as(want)


# --------------------------------------------------------------------------------------------
# ----- silu_and_mul, gelu_and_mul

ACT_D = 8  # x rows of 2 * 8; bf16 and fp32 builds of silu and gelu (erf): four builds


@st.composite
def act_params(draw):
    lead = draw(st.sampled_from([(), (0,), (1,), (3,), (2, 3), (2, 1, 2)]))
    return dict(
        op=draw(st.sampled_from(["silu", "gelu"])),
        dtype=draw(st.sampled_from([bf16, fp32])),
        lead=lead,
        d=draw(st.sampled_from([ACT_D, 3])),  # 3: the scalar variant
        # padded rows (a misaligned row stride) for 2-d x only: the rows of 3-d x must be evenly spaced
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded"][: 3 if len(lead) == 1 else 2])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        seed=draw(st.integers(0, 2**16)),
    )


def act_args(a: Arena, p: dict) -> dict:
    x = a.tensor((*p["lead"], 2 * p["d"]), p["dtype"], p["x_layout"])
    x.copy_(torch.randn(x.shape, generator=a.gen).to(p["dtype"]))  # no NaN bit patterns
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    out = None if p["out"] is None else a.tensor((*p["lead"], p["d"]), p["dtype"], p["out"])
    args = dict(x=x, out=out)
    if p["op"] == "gelu":
        args["approximate"] = "none"
    return args


def _act_out_shape(p):
    return (*p["lead"], p["d"])


ACT_BAD = [
    Bad("x", "unsupported dtype", TypeError,
        lambda a, p, d: a.tensor((*p["lead"], 2 * p["d"]), d.draw(st.sampled_from(
            [torch.int32, torch.int16, torch.bool, torch.float64, torch.float8_e4m3fn])))),
    Bad("x", "odd last dimension", ValueError,
        lambda a, p, d: a.tensor((*p["lead"], d.draw(st.sampled_from([1, 2 * p["d"] + 1]))), p["dtype"])),
    Bad("x", "0-d", ValueError, lambda a, p, d: a.tensor((), p["dtype"])),
    Bad("x", "strided last dimension", ValueError, lambda a, p, d: a.tensor((3, 2 * p["d"]), p["dtype"], "step2")),
    Bad("x", "rows not evenly spaced", ValueError,
        lambda a, p, d: a.tensor((3, 2, 2 * p["d"]), p["dtype"]).transpose(0, 1)),
    Bad("x", "meta tensor", ValueError, lambda a, p, d: meta((*p["lead"], 2 * p["d"]), p["dtype"])),
    Bad("x", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0] * 16], 2.0]))),
    Bad("x", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((*p["lead"], 2 * p["d"]), p["dtype"]))),
    Bad("out", "dtype", TypeError,
        lambda a, p, d: a.tensor(_act_out_shape(p), d.draw(st.sampled_from(
            [bf16 if p["dtype"] == fp32 else fp32, fp16, torch.int32, torch.bool])))),
    Bad("out", "last dimension", ValueError,
        lambda a, p, d: a.tensor((*p["lead"], d.draw(st.sampled_from([p["d"] + 1, 2 * p["d"], p["d"] - 1]))),
                                 p["dtype"])),
    Bad("out", "leading dimensions", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(5, p["d"]), (1, 1, 1, p["d"])]))
                                 if p["lead"] not in ((5,),) else (4, p["d"]), p["dtype"])),
    Bad("out", "non-contiguous", ValueError, lambda a, p, d: a.tensor((3, p["d"]), p["dtype"], "step2")),
    Bad("out", "overlapping rows (expand)", ValueError, lambda a, p, d: a.tensor((3, p["d"]), p["dtype"], "expand")),
    Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(_act_out_shape(p), p["dtype"])),
    Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
    Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(_act_out_shape(p), p["dtype"]))),
    Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(_act_out_shape(p), p["dtype"]))),
    Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(_act_out_shape(p), p["dtype"])),
    Bad("out", f"{SHARED}: x shifted", ValueError,
        lambda a, p, d: a.alias(p["args"]["x"], _act_out_shape(p), p["dtype"], d.draw(st.sampled_from([0, 1, -1, 5])))),
    Bad("approximate", "unknown", ValueError, lambda a, p, d: d.draw(st.sampled_from(["erf", "", "TANH", "exact"]))),
    Bad("approximate", "not a string", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, 1, ["tanh"], True]))),
]

#: The bad kinds that replace x or out with a tensor of another shape: the other one follows it.
_ACT_RESHAPING = ("strided last dimension", "rows not evenly spaced", "non-contiguous", "overlapping rows (expand)")


def _act_call(args: dict, p: dict, bad: Bad, a: Arena, via: str) -> None:
    custom = via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit", "not a string")
    if p["op"] == "silu":
        if not custom:
            check_invalid(lambda: ops.silu_and_mul(**args), a, bad)
        elif args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.silu_and_mul(args["x"]), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.silu_and_mul_out(args["out"], args["x"]), a, bad)
    elif not custom:
        check_invalid(lambda: ops.gelu_and_mul(**args), a, bad)
    elif args["out"] is None:
        check_invalid(lambda: torch.ops.kernkit.gelu_and_mul(args["x"], args["approximate"]), a, bad)
    else:
        check_invalid(lambda: torch.ops.kernkit.gelu_and_mul_out(args["out"], args["x"], args["approximate"]), a, bad)


@pytest.mark.parametrize("bad", ACT_BAD, ids=bad_id)
@invalid_settings(ACT_BAD)
@given(p=act_params(), via=st.sampled_from(["op", "custom op"]), d=st.data())
def test_act_and_mul_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.arg == "approximate":
        p = dict(p, op="gelu")
    if bad.arg == "out" or bad.what.startswith(SHARED):
        p = dict(p, out="contiguous")
    if bad.what.startswith(SHARED):
        p = dict(p, lead=(3,), x_layout="contiguous")  # elements to share
    if bad.arg == "out" and bad.what == "leading dimensions" and p["lead"] == ():
        p = dict(p, lead=(3,))
    args = act_args(a, p)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "x" and bad.what in _ACT_RESHAPING and args["out"] is not None:
        args["out"] = a.tensor((*value.shape[:-1], p["d"]), p["dtype"])  # matching: only x's layout is wrong
    if bad.arg == "out" and bad.what in _ACT_RESHAPING:
        args["x"] = a.tensor((*value.shape[:-1], 2 * p["d"]), p["dtype"])
    args[bad.arg] = value
    if args["out"] is None and claims_huge(args["x"]):
        check_unallocatable(lambda: ops.silu_and_mul(args["x"]), a)
    else:
        _act_call(args, p, bad, a, via)


@VALID
@given(p=act_params())
def test_act_and_mul_valid_views_are_within_tolerance(p):
    """Misaligned starts and row strides (the scalar variant), 1-d, empty and 3-d inputs, out
    given or not: within the documented tolerance of the float64 result, and no byte outside
    out written."""
    a = Arena.seeded(p["seed"])
    args = act_args(a, p)
    want = a.copies()
    activation = p["op"]
    got = ops.silu_and_mul(**args) if activation == "silu" else ops.gelu_and_mul(**args)
    assert got.shape == _act_out_shape(p) and got.dtype == p["dtype"]
    ref = act_tests.ref_act_and_mul(args["x"], activation)
    assert bool(((got.double() - ref).abs() <= act_tests.act_and_mul_bound(args["x"], ref, activation)).all())
    if args["out"] is not None:
        assert got is args["out"]
        a.twin(args["out"], want).copy_(got)  # the only bytes the call may change
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
    assert ops.compare_key(**args) == compare_key.ref_compare_key(**args)
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
