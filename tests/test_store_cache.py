"""store_cache on CPU tensors (the kernel through the CPU emulator), compared byte for byte with
the torch reference; argument errors name the argument and write nothing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.ops.store_cache import store_cache_spec
from kernkit.testing.invalid import SHARED, VALID, Arena, check_invalid, invalid_calls
from kernkit.testing.ops.store_cache import STORE_BAD, bf16, fp16, i32, i64, ref_store_cache, rows
from kernkit.testing.oracle import rand_bits, same_bytes

POOL = 40


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
