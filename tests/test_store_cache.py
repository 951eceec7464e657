"""store_cache on CPU tensors (the kernel through the CPU emulator), compared byte for byte with
the torch reference; argument errors name the argument and write nothing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.ops.store_cache import store_cache_spec
from kernkit.testing import oracle
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import (
    BAD_INDEX_DTYPES,
    HUGE,
    SHARED,
    UNSUPPORTED_ROW_DTYPES,
    VALID,
    Arena,
    Bad,
    check_invalid,
    invalid_calls,
    meta,
    neg_bit,
    other_same_size,
    requires_grad,
)
from kernkit.testing.oracle import rand_bits, same_bytes

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
i32, i64 = torch.int32, torch.int64

POOL = 40


# ----- the reference: what the kernel must compute


def ref_store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """``k_cache[indices[i]] = k[i]`` and ``v_cache[indices[i]] = v[i]`` for every ``i`` whose
    index lies in ``[0, pool)``; other rows are skipped. In place."""
    valid = (indices >= 0) & (indices < k_cache.shape[0])
    idx = indices[valid].long()
    rows = tuple(oracle.bytes_view(k_cache).shape[1:])
    oracle.bytes_view(k_cache)[idx] = oracle.bytes_view(k)[valid].reshape((-1, *rows))
    oracle.bytes_view(v_cache)[idx] = oracle.bytes_view(v)[valid].reshape((-1, *rows))


def make_indices(n, pool, dtype, gen, out_of_range=True):
    idx = torch.randperm(pool, generator=gen)[:n]
    if out_of_range and n >= 4:
        idx[0], idx[1], idx[2], idx[3] = -1, pool, pool + 7, -pool
    return idx.to(dtype)


def run_both(kc, vc, idx, k, v):
    """Run the op and the reference on clones; return both results."""
    kc2, vc2 = kc.clone(), vc.clone()
    ops.store_cache(kc, vc, idx, k, v)
    ref_store_cache(kc2, vc2, idx, k, v)
    return (kc, vc), (kc2, vc2)


# (dtype, row shape): one specialization each (element size x row bytes), odd rows included.
CASES = [
    (torch.bfloat16, (4, 64)),  # 512 B
    (torch.float16, (256,)),  # 512 B, 2-d, shares the build with the line above
    (torch.float32, (16,)),  # 64 B
    (torch.float8_e4m3fn, (2, 64)),  # 128 B
    (torch.float16, (3,)),  # 6 B: 2-byte accesses
]


@pytest.mark.parametrize("dtype,row", CASES, ids=lambda x: str(x).removeprefix("torch."))
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_reference(dtype, row, index_dtype):
    gen = torch.Generator().manual_seed(hash((str(dtype), row)) % 1000)
    for n in (1, 7, 33):
        kc, vc = rand_bits((POOL, *row), dtype, gen), rand_bits((POOL, *row), dtype, gen)
        k, v = rand_bits((n, *row), dtype, gen), rand_bits((n, *row), dtype, gen)
        idx = make_indices(n, POOL, index_dtype, gen)
        before = kc.clone()
        got, want = run_both(kc, vc, idx, k, v)
        assert same_bytes(got[0], want[0]) and same_bytes(got[1], want[1])
        valid = (idx >= 0) & (idx < POOL)
        untouched = torch.ones(POOL, dtype=torch.bool)
        untouched[idx[valid].long()] = False
        assert same_bytes(got[0][untouched], before[untouched]), "a row outside the indices was written"


def test_fused_qkv_and_strided_caches():
    gen = torch.Generator().manual_seed(1)
    heads, dim, n = 4, 64, 9
    qkv = rand_bits((n, 3 * heads, dim), torch.bfloat16, gen)
    k, v = qkv[:, heads : 2 * heads], qkv[:, 2 * heads :]  # row stride 3 x the row
    kv = rand_bits((POOL, 2, heads, dim), torch.bfloat16, gen)
    kc, vc = kv[:, 0], kv[:, 1]
    idx = make_indices(n, POOL, torch.int64, gen)
    kv_ref = kv.clone()
    ops.store_cache(kc, vc, idx, k, v)
    ref_store_cache(kv_ref[:, 0], kv_ref[:, 1], idx, k, v)
    assert same_bytes(kv, kv_ref)


def test_misaligned_views():
    gen = torch.Generator().manual_seed(2)
    n = 5
    kc, vc = rand_bits((POOL, 4, 64), torch.bfloat16, gen), rand_bits((POOL, 4, 64), torch.bfloat16, gen)
    buf = rand_bits((n * 256 + 1,), torch.bfloat16, gen)
    k = buf[1:].view(n, 4, 64)  # 2-byte aligned only: the launcher narrows the access width
    v = rand_bits((n, 4, 64), torch.bfloat16, gen)
    idx = make_indices(n, POOL, torch.int32, gen)
    got, want = run_both(kc, vc, idx, k, v)
    assert same_bytes(got[0], want[0]) and same_bytes(got[1], want[1])


def test_rows_must_have_the_caches_head_layout():
    """Same bytes per row, other heads: refused, as torch's index_copy_ refuses it."""
    kc, vc = torch.zeros(POOL, 4, 64, dtype=torch.bfloat16), torch.zeros(POOL, 4, 64, dtype=torch.bfloat16)
    idx = torch.tensor([1, 2])
    for k, match in [(torch.ones(2, 8, 32, dtype=torch.bfloat16),
                      r"'k': dimension 1 \('heads'\) expected 4 \(from 'k_cache'\), got 8"),
                     (torch.ones(2, 256, dtype=torch.bfloat16), r"'k': expected a 3-d tensor like 'k_cache', got 2-d")]:
        with pytest.raises(ValueError, match=match):
            ops.store_cache(kc, vc, idx, k, k.clone())
    assert not kc.any() and not vc.any()


def test_empty_is_a_noop():
    kc = torch.randn(POOL, 4, 64).bfloat16()
    vc = kc.clone()
    before = kc.clone()
    ops.store_cache(kc, vc, torch.empty(0, dtype=torch.int32), torch.empty(0, 4, 64, dtype=torch.bfloat16),
                    torch.empty(0, 4, 64, dtype=torch.bfloat16))
    assert same_bytes(kc, before)


def _bad_cases():
    bf = torch.bfloat16

    def base():
        return dict(k_cache=torch.zeros(POOL, 4, 64, dtype=bf), v_cache=torch.zeros(POOL, 4, 64, dtype=bf),
                    indices=torch.arange(3, dtype=torch.int32), k=torch.ones(3, 4, 64, dtype=bf),
                    v=torch.ones(3, 4, 64, dtype=bf))

    def with_(**kw):
        def make():
            args = base()
            args.update({key: f(args) for key, f in kw.items()})
            return args
        return make

    return [
        ("v", TypeError, with_(v=lambda a: a["v"].float())),
        ("v", ValueError, with_(v=lambda a: torch.ones(4, 4, 64, dtype=bf))),
        ("k", ValueError, with_(k=lambda a: torch.ones(3, 4, 128, dtype=bf)[:, :, ::2])),
        ("v_cache", ValueError, with_(v_cache=lambda a: torch.zeros(POOL + 1, 4, 64, dtype=bf))),
        ("v_cache", ValueError, with_(v_cache=lambda a: torch.zeros(POOL, 256, dtype=bf))),
        ("indices", TypeError, with_(indices=lambda a: torch.arange(3, dtype=torch.float32))),
        ("indices", ValueError, with_(indices=lambda a: torch.arange(4, dtype=torch.int32))),
        ("indices", ValueError, with_(indices=lambda a: torch.zeros(3, 1, dtype=torch.int64))),
        ("k", ValueError, with_(k=lambda a: torch.ones(3, 256, 1, dtype=bf))),
    ]


@pytest.mark.parametrize("role,exc,make", _bad_cases())
def test_bad_arguments_name_the_argument_and_write_nothing(role, exc, make):
    args = make()
    with pytest.raises(exc, match=f"'{role}'"):
        ops.store_cache(**args)
    assert not args["k_cache"].any() and not args["v_cache"].any()


def test_unsupported_dtype():
    x = torch.zeros(4, 2, dtype=torch.complex64)
    with pytest.raises(TypeError, match="'k_cache'"):
        ops.store_cache(x, x, torch.arange(1), x[:1], x[:1])


def test_one_specialization_per_element_size_and_row_bytes():
    """fp16 and bf16 rows of the same size share a build: the kernel moves bytes."""
    specs = {store_cache_spec(d, (8, 128), "emu") for d in (torch.bfloat16, torch.float16, torch.int16)}
    assert [s.title for s in specs] == ["store_cache<2, 2048, 16, 2, false>"]
    assert store_cache_spec(torch.float8_e4m3fn, (8, 128), "emu").title == "store_cache<1, 1024, 16, 2, false>"


# ----- the kernel-hash cases (python -m kernkit.testing.hashes)


def bad_indices(pool: int, index_dtype: torch.dtype) -> list[int]:
    """Indices the kernel must skip. The int64 ones include values whose low 32 bits are a
    valid row, so a kernel that truncated indices to int32 would write them."""
    out = [-1, pool, pool + 7, -pool, -(2**31), 2**31 - 1]
    if index_dtype == torch.int64:
        out += [2**32 + 5, -(2**32) + 3, 2**40, -(2**62)]
    return out


def case_indices(n: int, pool: int, index_dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Distinct valid rows, with out-of-range entries at random positions (about a third of
    them for short inputs, all of ``bad_indices`` for long ones)."""
    idx = torch.randperm(pool, generator=gen)[:n].to(torch.int64)
    bad = bad_indices(pool, index_dtype)
    count = min(len(bad), n // 2 if n < 16 else len(bad))
    pos = torch.randperm(n, generator=gen)[:count]
    for p, value in zip(pos.tolist(), bad, strict=False):
        idx[p] = value
    return idx.to(index_dtype)


def store_case(dtype: torch.dtype, row: tuple[int, ...], n: int, index_dtype: torch.dtype, *, pool: int = 600,
               strided_kv: bool = False, strided_cache: bool = False) -> Case:
    """``store_cache`` into ``[pool, *row]`` caches. ``strided_kv``: K and V are slices of a fused
    ``[n, 3, *row]`` tensor; ``strided_cache``: the caches are ``kv[:, 0]`` and ``kv[:, 1]`` of one
    ``[pool, 2, *row]`` buffer (which is hashed whole)."""
    shape = "x".join(map(str, row))
    name = (f"store_cache/{SHORT[dtype]}-{shape}-{SHORT[index_dtype]}-n{n}"
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
        idx = case_indices(n, pool, index_dtype, gen)

        def caches(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return (b["kv_cache"][:, 0], b["kv_cache"][:, 1]) if strided_cache else (b["k_cache"], b["v_cache"])

        ref = {key: t.clone() for key, t in bufs.items()}
        ref_store_cache(*caches(ref), idx, k, v)

        dev = {key: to_device(t, device) for key, t in bufs.items()}
        if strided_kv:
            qkv_d = to_device(qkv, device)
            k_d, v_d = qkv_d[:, 1], qkv_d[:, 2]
        else:
            k_d, v_d = to_device(k, device), to_device(v, device)
        ops.store_cache(*caches(dev), to_device(idx, device), k_d, v_d)
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "kvcache/store_cache.cuh", run)


def hash_cases() -> list[Case]:
    """The kernel-hash cases: rows of 1152 B (576 x 2-byte), 2048 B, 512 B, 256 B and 6 B."""
    return [
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
    ]


# ----- invalid calls: one bad argument at a time, nothing written (kernkit.testing.invalid)

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
                    [other_same_size(p["dtype"]), torch.int16])))),
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


@invalid_calls(STORE_BAD, store_params())
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
    ref_store_cache(**{key: a.twin(t, want) for key, t in args.items()})
    ops.store_cache(**args)
    assert a.same_as(want)


def test_store_cache_pool_of_zero_rows_skips_every_index():
    a = Arena.seeded(1)
    kc, vc = a.tensor((0, 2, 16), bf16), a.tensor((0, 2, 16), bf16)
    idx = torch.tensor([0, -1, 5], dtype=i64)
    ops.store_cache(kc, vc, idx, a.tensor((3, 2, 16), bf16), a.tensor((3, 2, 16), bf16))
    assert a.unchanged()
