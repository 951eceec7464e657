"""store_cache on CPU tensors (the kernel through the CPU emulator), compared byte for byte with
the torch reference; argument errors name the argument and write nothing."""

from __future__ import annotations

import pytest
import torch

from kernkit.testing import oracle
from kernkit import ops
from kernkit.testing.oracle import rand_bits, same_bytes
from kernkit.ops.kvcache import store_spec

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
    for k, match in [(torch.ones(2, 8, 32, dtype=torch.bfloat16), r"'k': dimension 1 \('heads'\) expected 4 \(from 'k_cache'\), got 8"),
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
    specs = {store_spec(d, (8, 128), "emu") for d in (torch.bfloat16, torch.float16, torch.int16)}
    assert [s.title for s in specs] == ["store_cache<2, 2048, 16, 2, false>"]
    assert store_spec(torch.float8_e4m3fn, (8, 128), "emu").title == "store_cache<1, 1024, 16, 2, false>"
