"""kernkit.ops.rotary_embedding_store on the GPU: bit for bit ``rotary_embedding`` followed by
``store_cache`` (kernkit's two ops on the GPU, and the torch reference on the CPU), every dtype,
both pairings, partial rotary, decode and prefill sizes, fused-QKV slices with 3-d strided caches,
misaligned views, out-of-range positions and cache rows, CUDA-graph replay, and the PDL variant
next to the plain one. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, make_cpp_args  # noqa: E402
from kernkit.ops import rotary_embedding, rotary_embedding_store, store_cache  # noqa: E402
from kernkit.testing.ops import rotary_embedding_store as rope_store

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
#: (head_dim, rot_dim, is_neox)
SHAPES = [(128, 128, True), (128, 128, False), (64, 32, False), (256, 128, True)]
MAX_POS = 8192
POOL = 20000


def make_cache(rot_dim: int) -> torch.Tensor:
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    ang = torch.arange(MAX_POS, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).float().cuda()


def rand(shape, dtype) -> torch.Tensor:
    return (torch.randn(shape, device="cuda") * 4).to(dtype)


def inputs(n: int, hq: int, hk: int, head_dim: int, dtype: torch.dtype, index_dtype=torch.int64):
    """q, k, v, caches of random values, positions and cache rows with a few out of range."""
    q, k, v = rand((n, hq, head_dim), dtype), rand((n, hk, head_dim), dtype), rand((n, hk, head_dim), dtype)
    kc, vc = rand((POOL, hk * head_dim), dtype), rand((POOL, hk * head_dim), dtype)
    pos = torch.randint(MAX_POS, (n,), device="cuda")
    loc = torch.randperm(POOL, device="cuda")[:n]
    bad = torch.rand(n, device="cuda") < 0.1
    pos = torch.where(bad, -1, pos).to(index_dtype)
    loc = torch.where(torch.rand(n, device="cuda") < 0.1, POOL + 3, loc).to(index_dtype)
    return q, k, v, kc, vc, pos, loc


def check(pos, q, k, v, cache, kc, vc, loc, is_neox, head_dim=None, fn=None, pair=True):
    """``fn`` (the op by default) on copies against the two ops on the GPU and the CPU reference."""
    fn = fn or rotary_embedding_store
    fused = [t.clone() for t in (q, k, kc, vc)]
    fn(pos, fused[0], fused[1], v, cache, fused[2], fused[3], loc, is_neox, head_dim=head_dim)
    ref = [t.cpu() for t in (q, k, kc, vc)]
    rope_store.ref_rotary_embedding_store(pos.cpu(), ref[0], ref[1], v.cpu(), cache.cpu(), ref[2], ref[3], loc.cpu(),
                                     is_neox, head_dim)
    for name, got, want in zip(("q", "k", "k_cache", "v_cache"), fused, ref, strict=True):
        assert torch.equal(got.cpu(), want), f"{name}: GPU != reference"
    if pair:
        seq = [t.clone() for t in (q, k, kc, vc)]
        rotary_embedding(pos, seq[0], seq[1], cache, is_neox, head_dim=head_dim)
        n = pos.shape[0]
        store_cache(seq[2], seq[3], loc, seq[1].reshape(n, *kc.shape[1:]), v.reshape(n, *kc.shape[1:]))
        for name, got, want in zip(("q", "k", "k_cache", "v_cache"), fused, seq, strict=True):
            assert torch.equal(got, want), f"{name}: fused != rotary_embedding + store_cache"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 256, 257, 4099])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=str)
def test_equals_rope_then_store(dtype, shape, n, heads):
    head_dim, rot_dim, is_neox = shape
    q, k, v, kc, vc, pos, loc = inputs(n, *heads, head_dim, dtype, torch.int32 if n % 2 else torch.int64)
    check(pos, q, k, v, make_cache(rot_dim), kc, vc, loc, is_neox)


def test_fused_qkv_slices_into_3d_strided_caches_and_misaligned_views():
    n, hq, hk, d = 513, 16, 2, 128
    qkv = rand((n, (hq + 2 * hk) * d), torch.bfloat16)
    kv = rand((POOL, 2, hk, d), torch.bfloat16)
    pos = torch.randint(MAX_POS, (n,), device="cuda")
    loc = torch.randperm(POOL, device="cuda")[:n]
    q, k, v = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d], qkv[:, (hq + hk) * d :]
    check(pos, q, k, v, make_cache(d), kv[:, 0], kv[:, 1], loc, True, head_dim=d, pair=False)
    buf = rand((n * hq * d + 1,), torch.bfloat16)
    q_off = buf[1:].view(n, hq, d)  # one element into its buffer: the scalar variant
    k3, v3 = k.view(n, hk, d), v.reshape(n, hk, d)
    check(pos, q_off, k3, v3, make_cache(d), kv[:, 0], kv[:, 1], loc, False, pair=False)


def test_cuda_graph_replay_and_pdl_variants():
    n, hq, hk, d = 64, 32, 8, 128
    q, k, v, kc, vc, pos, loc = inputs(n, hq, hk, d, torch.bfloat16)
    cache = make_cache(d)
    for use_pdl in (False, True):
        args = make_cpp_args(torch.bfloat16, d, True, use_pdl)
        module = JitSpec.make("rotary_embedding_store", *args, cuda_files=["rope/rotary_embedding_store.cuh"],
                              cuda_wrappers=[("rotary_embedding_store", f"rotary_embedding_store<{args}>")]
                              ).build_and_load()

        def run(p, q_, k_, v_, c_, kc_, vc_, l_, neox, head_dim=None, module=module):
            module.rotary_embedding_store(p, q_, k_, v_, c_, kc_, vc_, l_, -1 if head_dim is None else head_dim)

        check(pos, q, k, v, cache, kc, vc, loc, True, fn=run)
    gq, gk, gkc, gvc = q.clone(), k.clone(), kc.clone(), vc.clone()
    saved = [t.clone() for t in (gq, gk, gkc, gvc)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        rotary_embedding_store(pos, gq, gk, v, cache, gkc, gvc, loc)  # build outside the capture
    torch.cuda.synchronize()
    for t, s in zip((gq, gk, gkc, gvc), saved, strict=True):
        t.copy_(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rotary_embedding_store(pos, gq, gk, v, cache, gkc, gvc, loc)
    graph.replay()
    torch.cuda.synchronize()
    want = [t.cpu() for t in saved]
    rope_store.ref_rotary_embedding_store(pos.cpu(), want[0], want[1], v.cpu(), cache.cpu(), want[2], want[3],
                                          loc.cpu())
    assert all(torch.equal(a.cpu(), b) for a, b in zip((gq, gk, gkc, gvc), want, strict=True))


@pytest.mark.parametrize("n", [3000, 32768 + 5])
@pytest.mark.parametrize("shape", [(128, 128, True), (128, 64, False)], ids=str)
def test_every_grid_gives_the_defaults_bits_back_to_back(n, shape):
    """The fewer-blocks grid a tuning table may choose (``kernkit/ops/_rope.py``'s ``GRIDS``) at
    every token count, with PDL where the GPU has it, three calls back to back on one stream
    (each rotates what the previous wrote and rewrites the caches' rows): the untuned build's bits
    in q, k and both caches. At these token counts the two grids differ (the CTAs loop over the
    tokens)."""
    from kernkit.ops._rope import EVERY_SIZE, rope_spec

    head_dim, rot_dim, is_neox = shape
    hk = 8
    results = []
    for mask in (0, EVERY_SIZE):
        module = rope_spec("rotary_embedding_store", torch.bfloat16, rot_dim, is_neox, None, mask).build_and_load()
        gen = torch.Generator(device="cuda").manual_seed(n)

        def randn(*shape: int, gen=gen):
            return torch.randn(shape, generator=gen, device="cuda").bfloat16()

        q, k, v = randn(n, 32, head_dim), randn(n, hk, head_dim), randn(n, hk, head_dim)
        kc, vc = randn(n + 7, hk * head_dim), randn(n + 7, hk * head_dim)
        pos = torch.randint(0, MAX_POS, (n,), generator=gen, device="cuda")
        loc = torch.randperm(n + 7, generator=gen, device="cuda")[:n]
        cache = make_cache(rot_dim)
        for _ in range(3):
            module.rotary_embedding_store(pos, q, k, v, cache, kc, vc, loc, head_dim)
        torch.cuda.synchronize()
        results.append([t.cpu() for t in (q, k, kc, vc)])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
