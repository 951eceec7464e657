"""Every shipped CUDA kernel (store_cache, indexing, scale) on CPU tensors, through the CPU
emulator, under three thread schedules (``KERNKIT_EMU_SEED`` 0, 1 and 2, read at every launch):
bit-exact against plain torch, out-of-range indices never written, and the GPU hash file
reproduced under every schedule.

The shapes are those of kernkit/testing/hashes.py, so both files share their builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernkit import ops
from kernkit.testing import hashes as kh
from kernkit.testing.ops import scale as scale_tests
from kernkit.testing.ops import store_cache as store
from kernkit.testing.oracle import rand_bits

HASH_FILE = Path(__file__).resolve().parent / "data" / "kernel_hashes.json"

SEEDS = ["0", "1", "2"]
POOL = 600

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
i32, i64 = torch.int32, torch.int64


@pytest.fixture(params=SEEDS, ids=lambda s: f"seed{s}")
def seed(request, monkeypatch):
    monkeypatch.setenv("KERNKIT_EMU_SEED", request.param)
    return int(request.param)


def u8(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes (indexing works on them for every dtype, fp8 included)."""
    return t.view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(u8(a).contiguous(), u8(b).contiguous())


# (dtype, row shape, index dtype, K/V slices of a fused QKV tensor)
STORE = [
    (bf16, (1, 576), i64, False),
    (fp16, (576,), i32, True),
    (bf16, (8, 128), i32, True),
    (fp32, (128,), i64, False),
    (fp8, (2, 128), i32, False),
    (fp16, (3,), i64, True),
]


@pytest.mark.parametrize("dtype,row,index_dtype,fused", STORE, ids=lambda x: str(x).removeprefix("torch."))
@pytest.mark.parametrize("n", [7, 513])
def test_store_cache(seed, dtype, row, index_dtype, fused, n):
    gen = torch.Generator().manual_seed(1000 * seed + n)
    # Each cache is the middle of a buffer with a guard row on each side: an index of -1 or
    # POOL written anyway would land in a guard row.
    k_buf, v_buf = rand_bits((POOL + 2, *row), dtype, gen), rand_bits((POOL + 2, *row), dtype, gen)
    kc, vc = k_buf[1 : POOL + 1], v_buf[1 : POOL + 1]
    if fused:
        qkv = rand_bits((n, 3, *row), dtype, gen)
        k, v = qkv[:, 1], qkv[:, 2]
    else:
        k, v = rand_bits((n, *row), dtype, gen), rand_bits((n, *row), dtype, gen)
    idx = store.case_indices(n, POOL, index_dtype, gen)
    assert ((idx < 0) | (idx >= POOL)).sum() >= 3
    k_before, v_before = k_buf.clone(), v_buf.clone()

    ops.store_cache(kc, vc, idx, k, v)

    valid = (idx >= 0) & (idx < POOL)
    rows = idx[valid].long()
    assert same_bytes(u8(kc)[rows], u8(k)[valid]) and same_bytes(u8(vc)[rows], u8(v)[valid])
    untouched = torch.ones(POOL + 2, dtype=torch.bool)
    untouched[rows + 1] = False
    assert untouched[0] and untouched[-1]
    assert same_bytes(u8(k_buf)[untouched], u8(k_before)[untouched]), "a row no valid index names was written (K)"
    assert same_bytes(u8(v_buf)[untouched], u8(v_before)[untouched]), "a row no valid index names was written (V)"


def test_store_cache_only_out_of_range_indices_writes_nothing(seed):
    gen = torch.Generator().manual_seed(seed)
    kc, vc = rand_bits((POOL, 1, 576), bf16, gen), rand_bits((POOL, 1, 576), bf16, gen)
    bad = torch.tensor(store.bad_indices(POOL, i64), dtype=i64)
    k, v = rand_bits((bad.shape[0], 1, 576), bf16, gen), rand_bits((bad.shape[0], 1, 576), bf16, gen)
    kc0, vc0 = kc.clone(), vc.clone()
    ops.store_cache(kc, vc, bad, k, v)
    assert same_bytes(kc, kc0) and same_bytes(vc, vc0)


# (dtype, hidden, table rows, vocab_range, id dtype, strided table)
INDEXING = [
    (bf16, 576, 300, None, i64, False),
    (fp16, 576, 260, (250, 200), i32, True),
    (fp32, 100, 120, (0, 100), i64, False),
    (fp8, 6, 90, (37, 80), i32, True),
]


@pytest.mark.parametrize("dtype,hidden,rows,vocab_range,id_dtype,strided", INDEXING,
                         ids=lambda x: str(x).removeprefix("torch."))
@pytest.mark.parametrize("n", [7, 513])
def test_indexing(seed, dtype, hidden, rows, vocab_range, id_dtype, strided, n):
    gen = torch.Generator().manual_seed(1000 * seed + n + hidden)
    start, length = vocab_range or (0, rows)
    table = rand_bits((rows, 2 * hidden if strided else hidden), dtype, gen)
    weight = table[:, hidden:] if strided else table
    ids = torch.randint(max(0, start - 30), start + length + 30, (n,), generator=gen)
    ids[:4] = torch.tensor([-1, start + length, start - 1 if start else rows + 5, 2**31 - 1])
    ids = ids.to(id_dtype)

    out = ops.indexing(weight, ids, vocab_range=vocab_range)

    local = ids.long() - start
    valid = (local >= 0) & (local < length)
    assert not valid[:4].any() and valid.any()
    assert same_bytes(u8(out)[valid], u8(weight)[local[valid]])
    if dtype in (bf16, fp16, fp32):
        assert same_bytes(out[valid], F.embedding(local[valid], weight))
    assert not u8(out)[~valid].any(), "an id outside the range must give a zero row"


@pytest.mark.parametrize("dtype", [fp16, bf16, fp32], ids=str)
@pytest.mark.parametrize("n", [7, 4099])
def test_scale(seed, dtype, n):
    gen = torch.Generator().manual_seed(1000 * seed + n)
    base = scale_tests.scale_input(dtype, n + 1, gen)
    for x in (base[:n], base[1:]):  # aligned (vector path) and misaligned (scalar path)
        for factor in (1.7, -0.3, 1e-40):
            want = (x.float() * torch.tensor(factor, dtype=torch.float32)).to(dtype)
            assert torch.equal(ops.scale(x, factor), want), (n, factor, x.data_ptr() % 16)


def test_hash_cases_under_every_schedule(seed):
    """The fixed cases of kernkit/testing/hashes.py (each checked against the torch reference)
    give the hash file's bytes under this schedule too."""
    hashes = kh.compute("cpu")
    problems = kh.compare(json.loads(HASH_FILE.read_text()), hashes)
    assert not problems, "\n".join(problems)
