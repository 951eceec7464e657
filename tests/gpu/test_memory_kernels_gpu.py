"""store_cache and indexing on the GPU, bit for bit against torch: every dtype, row sizes from
6 B to 8 KB, n up to 65536, int32/int64 indices, strided and misaligned views, out-of-range
indices, a non-default stream, CUDA-graph replay. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from kernkit import ops
from kernkit.ops.indexing import indexing_spec
from kernkit.ops.store_cache import store_cache_spec
from kernkit.testing.ops import indexing as indexing
from kernkit.testing.ops import store_cache as store

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NS = [0, 1, 7, 64, 513, 4096, 65536]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
# Row shapes (heads, head_dim) per element size: 64 B to 8 KB, odd ones included.
ROWS = {
    4: [(16,), (4, 128), (2, 1024)],  # 64 B, 2 KB, 8 KB
    2: [(3,), (32,), (576,), (8, 128), (4096,)],  # 6 B, 64 B, 1152 B, 2 KB, 8 KB
    1: [(7,), (64,), (2, 1024), (8192,)],  # 7 B, 64 B, 2 KB, 8 KB
}
CASES = [(d, r) for d in DTYPES for r in ROWS[torch.empty((), dtype=d).element_size()]]


def case_id(x):
    return str(x).removeprefix("torch.") if isinstance(x, torch.dtype) else "x".join(map(str, x))


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    """Compile every specialization up front, in parallel (each nvcc run is a process)."""
    reqs = set()
    for d, r in CASES:
        reqs.add(store_cache_spec(d, r))
        reqs.add(indexing_spec(d, int(torch.tensor(r).prod())))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda r: r.build(), reqs))


def rand_rows(shape, dtype):
    elem = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * elem), dtype=torch.uint8, device="cuda")
    return raw.view(dtype)


def same_bytes(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def indices_for(n, pool, dtype):
    idx = torch.randperm(pool, device="cuda")[:n]
    if n >= 4:
        idx[:4] = torch.tensor([-1, pool, pool + 12345, -(2**31) + 1], device="cuda")
    return idx.to(dtype)


def row_bytes(dtype, row):
    return torch.empty((), dtype=dtype).element_size() * int(torch.tensor(row).prod())


@pytest.mark.parametrize("dtype,row", CASES, ids=case_id)
def test_store_cache_matches_torch(dtype, row):
    big = row_bytes(dtype, row) > 2048
    for n in NS:
        if big and n > 4096:
            continue
        pool = max(2 * n, 16)
        kc, vc = rand_rows((pool, *row), dtype), rand_rows((pool, *row), dtype)
        k, v = rand_rows((n, *row), dtype), rand_rows((n, *row), dtype)
        for index_dtype in (torch.int32, torch.int64):
            idx = indices_for(n, pool, index_dtype)
            kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
            ops.store_cache(kc1, vc1, idx, k, v)
            store.ref_store_cache(kc2, vc2, idx, k, v)
            torch.cuda.synchronize()
            assert same_bytes(kc1, kc2) and same_bytes(vc1, vc2), (n, index_dtype)


@pytest.mark.parametrize("dtype,row", CASES, ids=case_id)
def test_indexing_matches_torch(dtype, row):
    vocab = 1000
    weight = rand_rows((vocab, int(torch.tensor(row).prod())), dtype)
    big = row_bytes(dtype, row) > 2048
    for n in NS:
        if big and n > 4096:
            continue
        for id_dtype in (torch.int32, torch.int64):
            ids = torch.randint(-50, vocab + 50, (n,), device="cuda").to(id_dtype)
            got = ops.indexing(weight, ids)
            want = torch.empty_like(got)
            indexing.ref_indexing(want, weight, ids, 0, vocab)
            assert same_bytes(got, want), (n, id_dtype)
            got = ops.indexing(weight, ids, vocab_range=(300, 400))
            indexing.ref_indexing(want, weight, ids, 300, 400)
            assert same_bytes(got, want), (n, id_dtype, "shard")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32], ids=case_id)
def test_strided_and_misaligned_views(dtype):
    heads, dim, n, pool = 8, 128, 513, 2048
    qkv = rand_rows((n, 3 * heads, dim), dtype)
    k, v = qkv[:, heads : 2 * heads], qkv[:, 2 * heads :]
    kv = rand_rows((pool, 2, heads, dim), dtype)
    kc, vc = kv[:, 0], kv[:, 1]  # caches with a row stride of two rows, interleaved in one buffer
    idx = indices_for(n, pool, torch.int64)
    ref = kv.clone()
    ops.store_cache(kc, vc, idx, k, v)
    store.ref_store_cache(ref[:, 0], ref[:, 1], idx, k, v)
    assert same_bytes(kv, ref)
    # One element in: every access narrows to the element size.
    buf = rand_rows((n * heads * dim + 1,), dtype)
    k2 = buf[1:].view(n, heads, dim)
    ref = kv.clone()
    ops.store_cache(kc, vc, idx, k2, v)
    store.ref_store_cache(ref[:, 0], ref[:, 1], idx, k2, v)
    assert same_bytes(kv, ref)
    table = rand_rows((500, 2 * heads * dim), dtype)
    weight = table[:, 1 : heads * dim + 1]
    out = rand_rows((n, 3 * heads * dim), dtype)[:, heads * dim : 2 * heads * dim]
    ids = torch.randint(0, 500, (n,), device="cuda")
    ops.indexing(weight, ids, out=out)
    want = torch.empty(n, heads * dim, dtype=dtype, device="cuda")
    indexing.ref_indexing(want, weight, ids, 0, 500)
    assert same_bytes(out, want)


def test_out_of_range_rows_are_never_written():
    pool, n = 64, 32
    kc = torch.zeros(pool, 8, 128, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    k = torch.ones(n, 8, 128, dtype=torch.bfloat16, device="cuda")
    idx = torch.full((n,), -1, dtype=torch.int32, device="cuda")
    idx[::2] = pool + torch.arange(n // 2, device="cuda", dtype=torch.int32)
    ops.store_cache(kc, vc, idx, k, k)
    torch.cuda.synchronize()
    assert not kc.any() and not vc.any()


def test_non_default_stream():
    pool, n = 4096, 1024
    kc, vc = rand_rows((pool, 8, 128), torch.bfloat16), rand_rows((pool, 8, 128), torch.bfloat16)
    k, v = rand_rows((n, 8, 128), torch.bfloat16), rand_rows((n, 8, 128), torch.bfloat16)
    idx = indices_for(n, pool, torch.int32)
    ref_k, ref_v = kc.clone(), vc.clone()
    store.ref_store_cache(ref_k, ref_v, idx, k, v)
    weight = rand_rows((5000, 1024), torch.bfloat16)
    ids = torch.randint(0, 5000, (n,), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(2_000_000)  # keep the stream busy: a launch on another stream would race
        ops.store_cache(kc, vc, idx, k, v)
        out = ops.indexing(weight, ids)
    s.synchronize()
    assert same_bytes(kc, ref_k) and same_bytes(vc, ref_v)
    assert same_bytes(out, weight[ids])


def test_cuda_graph_replay():
    pool, n = 4096, 64
    kc, vc = rand_rows((pool, 8, 128), torch.bfloat16), rand_rows((pool, 8, 128), torch.bfloat16)
    k, v = rand_rows((n, 8, 128), torch.bfloat16), rand_rows((n, 8, 128), torch.bfloat16)
    idx = indices_for(n, pool, torch.int64)
    weight = rand_rows((5000, 1024), torch.bfloat16)
    ids = torch.randint(0, 5000, (n,), device="cuda", dtype=torch.int32)
    out = torch.empty(n, 1024, dtype=torch.bfloat16, device="cuda")
    ops.store_cache(kc, vc, idx, k, v)  # warm
    ops.indexing(weight, ids, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.store_cache(kc, vc, idx, k, v)
        ops.indexing(weight, ids, out=out)  # back to back: PDL between the two on sm_90
    for _ in range(3):
        k.copy_(rand_rows((n, 8, 128), torch.bfloat16))
        v.copy_(rand_rows((n, 8, 128), torch.bfloat16))
        idx.copy_(indices_for(n, pool, torch.int64))
        ids.copy_(torch.randint(0, 5000, (n,), device="cuda", dtype=torch.int32))
        ref_k, ref_v = kc.clone(), vc.clone()
        store.ref_store_cache(ref_k, ref_v, idx, k, v)
        graph.replay()
        torch.cuda.synchronize()
        assert same_bytes(kc, ref_k) and same_bytes(vc, ref_v)
        assert same_bytes(out, weight[ids.long()])


def test_errors_name_the_argument_and_write_nothing():
    kc = torch.zeros(64, 8, 128, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    k = torch.ones(4, 8, 128, dtype=torch.bfloat16, device="cuda")
    idx = torch.arange(4, device="cuda")
    with pytest.raises(ValueError, match="'v'"):
        ops.store_cache(kc, vc, idx, k, k.cpu())
    with pytest.raises(TypeError, match="'indices'"):
        ops.store_cache(kc, vc, idx.float(), k, k)
    with pytest.raises(ValueError, match="'k'"):
        ops.store_cache(kc, vc, idx, torch.ones(4, 8, 256, dtype=torch.bfloat16, device="cuda")[:, :, ::2], k)
    with pytest.raises(ValueError, match="'vocab_range'"):
        ops.indexing(kc.view(64, -1), idx, vocab_range=(0, 65))
    torch.cuda.synchronize()
    assert not kc.any() and not vc.any()
