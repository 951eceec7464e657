"""kernkit.ops.rotary_embedding on the GPU: against the float64 rotation within the docstring's
bound and bit for bit against the fp32 torch reference and the CPU emulator, every dtype, both
pairings, fp32 and q-dtype caches, partial rotary, odd token counts, fused-QKV (strided) rows and
3-d head strides, misaligned views, out-of-range positions, a non-default stream, CUDA-graph
replay, torch.compile, and the PDL variant next to the plain one. Run with ``pytest -m gpu`` on a
GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args  # noqa: E402
from kernkit.ops import rotary_embedding  # noqa: E402
from kernkit.ops.rotary_embedding import rotary_embedding_spec  # noqa: E402
from kernkit.testing.ops import rotary_embedding as rope

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
#: (head_dim, rot_dim, is_neox): Llama-3 / Qwen3 heads with both pairings, and a partial rotary.
SHAPES = [(128, 128, True), (128, 128, False), (64, 32, False)]
MAX_POS = 8192


def rope_with_pdl(dtype: torch.dtype, rot_dim: int, is_neox: bool, use_pdl: bool) -> JitSpec:
    """The specialization with PDL on or off, whatever the GPU would pick."""
    args = make_cpp_args(dtype, rot_dim, is_neox, use_pdl)
    return JitSpec.make("rotary_embedding", *args, cuda_files=["rope/rotary_embedding.cuh"],
                        cuda_wrappers=[("rotary_embedding", f"rotary_embedding<{args}>")])


def make_cache(rot_dim: int, dtype: torch.dtype = torch.float32, rows: int = MAX_POS) -> torch.Tensor:
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    ang = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(dtype).cuda()


def rand(shape, dtype) -> torch.Tensor:
    return (torch.randn(shape, device="cuda") * 4).to(dtype)


def expected(positions, q, k, cache, is_neox, head_dim):
    """The fp32 torch reference, computed on the CPU: (q, k) as the kernel must leave them."""
    q_ref, k_ref = q.cpu().clone(), k.cpu().clone()
    rope.ref_rotary_embedding(positions.cpu(), q_ref, k_ref, cache.cpu(), is_neox, head_dim)
    return q_ref, k_ref


def check_float64(got, before, positions, cache, is_neox, head_dim):
    """|got - exact| <= 2**-23 * (|x cos| + |y sin|) + half an ulp of the dtype, per element."""
    x = before.double().reshape(before.shape[0], -1, head_dim)
    rot, half = cache.shape[1], cache.shape[1] // 2
    c = cache[positions.long(), :half].double()[:, None, :]
    s = cache[positions.long(), half:].double()[:, None, :]
    first, second = (slice(0, half), slice(half, rot)) if is_neox else (slice(0, rot, 2), slice(1, rot, 2))
    a, b = x[:, :, first].clone(), x[:, :, second].clone()
    value, err = x.clone(), torch.zeros_like(x)
    value[:, :, first], value[:, :, second] = a * c - b * s, b * c + a * s
    err[:, :, first] = 2.0**-23 * ((a * c).abs() + (b * s).abs())
    err[:, :, second] = 2.0**-23 * ((b * c).abs() + (a * s).abs())
    fi = torch.finfo(before.dtype)
    mag = value.abs() + err
    _, e = torch.frexp(mag.clamp_min(fi.smallest_normal))
    half_ulp = 0.0 if before.dtype == torch.float32 else torch.ldexp(torch.full_like(mag, fi.eps / 2), e - 1)
    diff = (got.double().reshape(value.shape) - value).abs()
    assert bool((diff <= err * (1 + 2.0**-20) + half_ulp).all()), diff.max().item()


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    """Compile the specializations up front, in parallel (each nvcc run is its own process)."""
    from concurrent.futures import ThreadPoolExecutor

    reqs = [rotary_embedding_spec(d, r, neox) for d in DTYPES for _, r, neox in SHAPES]
    reqs += [rope_with_pdl(torch.bfloat16, 128, True, False)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda r: r.build(), reqs))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s[0]}-r{s[1]}-{'neox' if s[2] else 'gptj'}")
@pytest.mark.parametrize("tokens", [1, 7, 257, 4099])
@pytest.mark.parametrize("cache_dtype", ["fp32", "q"])
def test_matches_the_references(dtype, shape, tokens, cache_dtype):
    head_dim, rot_dim, is_neox = shape
    q = rand((tokens, 32 * head_dim), dtype)
    k = rand((tokens, 8, head_dim), dtype)
    cache = make_cache(rot_dim, torch.float32 if cache_dtype == "fp32" else dtype)
    positions = torch.randint(0, MAX_POS, (tokens,), device="cuda")
    q0, k0 = q.clone(), k.clone()
    want_q, want_k = expected(positions, q, k, cache, is_neox, head_dim)
    rotary_embedding(positions, q, k, cache, is_neox, head_dim=head_dim)
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)
    check_float64(q, q0, positions, cache, is_neox, head_dim)
    check_float64(k, k0, positions, cache, is_neox, head_dim)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_same_bytes_as_the_cpu_emulator(dtype):
    q = rand((300, 32, 128), dtype)
    k = rand((300, 8, 128), dtype)
    cache = make_cache(128)
    positions = torch.randint(-5, MAX_POS + 5, (300,), device="cuda")
    q_cpu, k_cpu = q.cpu(), k.cpu()
    rotary_embedding(positions.cpu(), q_cpu, k_cpu, cache.cpu())
    rotary_embedding(positions, q, k, cache)
    assert torch.equal(q.cpu(), q_cpu) and torch.equal(k.cpu(), k_cpu)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_qkv_rows_and_3d_head_strides(dtype):
    tokens, hq, hk, d = 1000, 32, 8, 128
    qkv = rand((tokens, (hq + 2 * hk) * d), dtype)
    v_before = qkv[:, (hq + hk) * d :].clone()
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
    positions = torch.randint(0, MAX_POS, (tokens,), device="cuda")
    cache = make_cache(128)
    want_q, want_k = expected(positions, q, k, cache, True, d)
    rotary_embedding(positions, q, k, cache, head_dim=d)
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before)

    heads = qkv.view(tokens, hq + 2 * hk, d)  # 3-d views: q and k heads of the fused rows
    q3, k3 = heads[:, :hq], heads[:, hq : hq + hk]
    want_q, want_k = expected(positions, q3, k3, cache, False, d)
    rotary_embedding(positions, q3, k3, cache, False)
    assert torch.equal(q3.cpu(), want_q) and torch.equal(k3.cpu(), want_k)


def test_more_tokens_than_one_grid_holds():
    """Past 65536 CTAs the kernel loops over tokens (Llama-3 heads: one token per CTA)."""
    tokens = 70_001
    q = rand((tokens, 32 * 128), torch.bfloat16)
    k = rand((tokens, 8 * 128), torch.bfloat16)
    positions = torch.randint(0, MAX_POS, (tokens,), device="cuda")
    cache = make_cache(128)
    want_q, want_k = expected(positions, q, k, cache, True, 128)
    rotary_embedding(positions, q, k, cache, head_dim=128)
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)


@pytest.mark.parametrize("offset", [1, 3])
def test_misaligned_views(offset):
    tokens = 513
    q = torch.empty(tokens * 4 * 128 + offset, device="cuda", dtype=torch.bfloat16)[offset:].view(tokens, 4 * 128)
    q.copy_(rand((tokens, 4 * 128), torch.bfloat16))
    k = rand((tokens, 128), torch.bfloat16)
    cache = make_cache(128).reshape(-1)[offset:][: 4096 * 128].view(4096, 128)
    positions = torch.randint(0, 4096, (tokens,), device="cuda")
    want_q, want_k = expected(positions, q, k, cache, True, 128)
    rotary_embedding(positions, q, k, cache, head_dim=128)
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_out_of_range_positions_are_skipped(index_dtype):
    bad = [-1, MAX_POS, 2**31 - 1, -(2**31)] + ([2**32 + 3, 2**40, -(2**62)] if index_dtype == torch.int64 else [])
    positions = torch.randint(0, MAX_POS, (64,))
    positions[: len(bad)] = torch.tensor(bad)
    positions = positions.to(index_dtype).cuda()
    q = rand((64, 32, 128), torch.bfloat16)
    k = rand((64, 8, 128), torch.bfloat16)
    q0, k0 = q.clone(), k.clone()
    want_q, want_k = expected(positions, q, k, make_cache(128), True, 128)
    rotary_embedding(positions, q, k, make_cache(128))
    assert torch.equal(q[: len(bad)], q0[: len(bad)]) and torch.equal(k[: len(bad)], k0[: len(bad)])
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)


@pytest.mark.parametrize("use_pdl", [False, True])
def test_both_pdl_variants(use_pdl):
    if use_pdl and not is_arch_support_pdl():
        pytest.skip("PDL needs sm_90")
    module = rope_with_pdl(torch.bfloat16, 128, True, use_pdl).build_and_load()
    q = rand((2000, 32 * 128), torch.bfloat16)
    k = rand((2000, 8 * 128), torch.bfloat16)
    positions = torch.randint(0, MAX_POS, (2000,), device="cuda")
    cache = make_cache(128)
    want_q, want_k = q.cpu(), k.cpu()
    for _ in range(3):  # back to back on one stream: each launch reads what the previous wrote
        module.rotary_embedding(positions, q, k, cache, 128)
        rope.ref_rotary_embedding(positions.cpu(), want_q, want_k, cache.cpu())
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)


@pytest.mark.parametrize("n", [3000, 32768 + 5])
@pytest.mark.parametrize("shape", [(128, 128, True), (128, 64, False)], ids=str)
def test_every_grid_gives_the_defaults_bits_back_to_back(n, shape):
    """The fewer-blocks grid a tuning table may choose (``kernkit/ops/_rope.py``'s ``GRIDS``) at
    every token count, with PDL where the GPU has it, three calls back to back on one stream
    (each rotates what the previous wrote): the untuned build's bits. At these token counts the
    two grids differ (the CTAs loop over the tokens)."""
    from kernkit.ops._rope import EVERY_SIZE

    head_dim, rot_dim, is_neox = shape
    results = []
    for mask in (0, EVERY_SIZE):
        module = rotary_embedding_spec(torch.bfloat16, rot_dim, is_neox, None, mask).build_and_load()
        gen = torch.Generator(device="cuda").manual_seed(n)
        q, k = (torch.randn((n, h, head_dim), generator=gen, device="cuda").bfloat16() for h in (32, 8))
        positions = torch.randint(0, MAX_POS, (n,), generator=gen, device="cuda")
        cache = make_cache(rot_dim)
        for _ in range(3):
            module.rotary_embedding(positions, q, k, cache, head_dim)
        torch.cuda.synchronize()
        results.append((q.cpu(), k.cpu()))
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_non_default_stream():
    q = rand((777, 32, 128), torch.float16)
    k = rand((777, 8, 128), torch.float16)
    positions = torch.randint(0, MAX_POS, (777,), device="cuda")
    cache = make_cache(128)
    want_q, want_k = expected(positions, q, k, cache, True, 128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rotary_embedding(positions, q, k, cache)
    stream.synchronize()
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)


def test_cuda_graph_replay():
    q = rand((64, 32 * 128), torch.bfloat16)
    k = rand((64, 8 * 128), torch.bfloat16)
    positions = torch.zeros(64, dtype=torch.int64, device="cuda")
    cache = make_cache(128)
    rotary_embedding(positions, q, k, cache, head_dim=128)  # load the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rotary_embedding(positions, q, k, cache, head_dim=128)
    q.copy_(rand((64, 32 * 128), torch.bfloat16))
    k.copy_(rand((64, 8 * 128), torch.bfloat16))
    positions.copy_(torch.randint(0, MAX_POS, (64,), device="cuda"))
    want_q, want_k = expected(positions, q, k, cache, True, 128)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)


def test_torch_compile_calls_the_custom_op():
    def attention_prologue(positions, q, k, cache):
        q = q * 1.0  # something for the compiler to fuse around the op
        rotary_embedding(positions, q, k, cache, head_dim=128)
        return q, k

    q = rand((33, 32 * 128), torch.bfloat16)
    k = rand((33, 8 * 128), torch.bfloat16)
    positions = torch.randint(0, MAX_POS, (33,), device="cuda")
    cache = make_cache(128)
    want_q, want_k = expected(positions, q, k, cache, True, 128)
    got_q, got_k = torch.compile(attention_prologue, fullgraph=True)(positions, q, k, cache)
    assert torch.equal(got_q.cpu(), want_q) and torch.equal(got_k.cpu(), want_k)


def test_cpu_positions_for_cuda_q_are_rejected():
    q = rand((4, 128), torch.bfloat16)
    k = rand((4, 128), torch.bfloat16)
    before = q.clone()
    with pytest.raises(ValueError, match=r"^'positions': expected a cuda tensor, got cpu$"):
        rotary_embedding(torch.arange(4), q, k, make_cache(128), head_dim=128)
    assert torch.equal(q, before)
