"""The shapes of sglang's own jit_kernel tests (sglang 0.5.10.post1, ``tests/test_rmsnorm.py``,
``tests/test_rotary_embedding.py``, ``tests/test_qknorm.py`` and ``tests/test_per_token_group_quant_8bit.py``)
with kernkit as the subject, against a float32 torch reference at
sglang's tolerances: what a user moving from sglang's kernels to kernkit's would run first. The
grids are sglang's (its CI batch sizes, every hidden size it tests); sglang itself is not
needed. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernkit.ops import per_token_group_quant_fp8, qk_norm, rmsnorm, rotary_embedding, rotary_embedding_store

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NORM_BATCHES = [1, 9, 256, 4109]
NORM_HIDDENS = [64, 128, 256, 512, *range(1024, 8192 + 1, 1024), 2304, 2560, 12288, 16384]


def torch_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


@pytest.mark.parametrize("batch, hidden", list(itertools.product(NORM_BATCHES, NORM_HIDDENS)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("specify_out", [True, False])
def test_rmsnorm_grid(batch, hidden, dtype, specify_out):
    """sglang's ``test_rmsnorm``: into a new ``out``, or in place (``out=x``)."""
    x = torch.randn(batch, hidden, device="cuda", dtype=dtype)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    want = torch_rmsnorm(x, w)
    if specify_out:
        got = torch.empty_like(x)
        rmsnorm(x, w, 1e-6, out=got)
    else:
        got = x.clone()
        rmsnorm(got, w, 1e-6, out=got)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)


def rope_reference(q, k, cache, positions, is_neox):
    """sglang's test reference: rotate in float32, round once."""
    half = cache.shape[1] // 2
    cos, sin = cache[positions, :half].unsqueeze(1), cache[positions, half:].unsqueeze(1)
    out = []
    for t in (q, k):
        f = t.float()
        if is_neox:
            x, y = f[..., :half], f[..., half:]
            out.append(torch.cat([x * cos - y * sin, y * cos + x * sin], -1).to(t.dtype))
        else:
            x, y = f[..., 0::2], f[..., 1::2]
            out.append(torch.stack([x * cos - y * sin, y * cos + x * sin], -1).flatten(-2).to(t.dtype))
    return out


@pytest.mark.parametrize("tokens", [1, 16, 257, 4096])
@pytest.mark.parametrize("heads", [(8, 1), (16, 2), (32, 8), (64, 8)], ids=str)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_rope_grid(tokens, heads, is_neox, dtype):
    """sglang's ``test_rotary_embedding`` shapes: 3-d q/k of head_dim 128, an fp32 cache, int64 positions."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32, device="cuda") / 128))
    ang = torch.arange(8192, dtype=torch.float32, device="cuda")[:, None] * inv
    cache = torch.cat([ang.cos(), ang.sin()], -1)
    q = torch.randn(tokens, heads[0], 128, device="cuda", dtype=dtype)
    k = torch.randn(tokens, heads[1], 128, device="cuda", dtype=dtype)
    positions = torch.randint(8192, (tokens,), device="cuda")
    want_q, want_k = rope_reference(q, k, cache, positions, is_neox)
    rotary_embedding(positions, q, k, cache, is_neox)
    torch.testing.assert_close(q, want_q, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(k, want_k, atol=1e-2, rtol=1e-2)


QK_BATCHES = [2**n for n in range(0, 14)]
QK_BATCHES += [x + 1 + i for i, x in enumerate(QK_BATCHES)]


@pytest.mark.parametrize("batch", QK_BATCHES)
@pytest.mark.parametrize("n_k, n_q", [(2, 8), (2, 16), (4, 8), (4, 16)], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256, 512, 1024])
def test_qknorm_grid(batch, n_k, n_q, head_dim):
    """sglang's ``test_qknorm`` (its full grid, bf16): in place, against sglang's reference of two
    rmsnorm calls (here the float32 formula) at its tolerance."""
    q = torch.randn(batch, n_q, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, n_k, head_dim, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(head_dim, device="cuda", dtype=torch.bfloat16)
    wk = torch.randn(head_dim, device="cuda", dtype=torch.bfloat16)
    want_q, want_k = torch_rmsnorm(q, wq), torch_rmsnorm(k, wk)
    qk_norm(q, k, wq, wk)
    torch.testing.assert_close(q, want_q, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(k, want_k, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("batch", [1, 129, 2048, 2049])
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("kv_heads", [1, 2, 8])
@pytest.mark.parametrize("rope_dim", [64, 128, 256, 512])
@pytest.mark.parametrize("is_neox", [False, True])
def test_fused_rope_store_grid(batch, gqa, kv_heads, rope_dim, is_neox):
    """sglang's ``test_fused_rope_store`` (its CI batch sizes, the rest of its grid in full, bf16,
    caches of 131072 rows): q and the stored k against the float32 reference at sglang's
    tolerance, v stored exactly."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, rope_dim, 2, dtype=torch.float32, device="cuda") / rope_dim))
    ang = torch.arange(8192, dtype=torch.float32, device="cuda")[:, None] * inv
    cache = torch.cat([ang.cos(), ang.sin()], -1)
    q = torch.randn(batch, kv_heads * gqa, rope_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, rope_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, kv_heads, rope_dim, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(8192, (batch,), device="cuda")
    out_loc = torch.randperm(1024 * 128, device="cuda")[:batch]
    k_cache = torch.zeros(1024 * 128, kv_heads * rope_dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    want_q, want_k = rope_reference(q, k, cache, positions, is_neox)
    rotary_embedding_store(positions, q, k, v, cache, k_cache, v_cache, out_loc, is_neox)
    torch.testing.assert_close(q, want_q, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(k_cache[out_loc], want_k.view(batch, -1), atol=1e-2, rtol=1e-2)
    assert torch.equal(v_cache[out_loc], v.view(batch, -1))


GROUP_QUANT_TOKENS = [1, 4, 16, 64, 127, 128, 512, 1024, 4096, 8192]
GROUP_QUANT_HIDDENS = [128, 256, 384, 512, 1024, 1536, 1664, 2048, 4096, 7168, 16384]
#: sglang's four flag sets as (column_major_scales, scale_ue8m0): kernkit's column-major scales
#: are always TMA-aligned, so sglang's plain and TMA-aligned column-major sets are one call here.
GROUP_QUANT_FLAGS = {"row-major": (False, False), "column-major": (True, False), "column-major-tma": (True, False),
                     "column-major-tma-ue8m0": (True, True)}
#: (group_size, flags): UE8M0 at group size 128 only, as sglang tests it.
GROUP_QUANT_CASES = [(g, f) for g in (16, 32, 64, 128) for f, (_, ue8m0) in GROUP_QUANT_FLAGS.items()
                     if g == 128 or not ue8m0]


def torch_group_quant(x: torch.Tensor, group_size: int, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 per-group quantization (sglang's triton kernel's formula): the scale is
    ``max(max|x|, 1e-10) / 448``, with UE8M0 ``2 ** ceil(log2(scale))``."""
    xg = x.float().unflatten(-1, (-1, group_size))
    s = xg.abs().amax(-1).clamp(min=1e-10) / 448.0
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    return (xg / s[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).flatten(-2), s


def assert_fp8_close_or_tiny_diff(a: torch.Tensor, b: torch.Tensor) -> None:
    """sglang's ``assert_all_close_or_tiny_diff`` for fp8: no value of another sign, none more
    than one E4M3 step away, and few one step away (under 0.5%, or 4% of at most 4096 values)."""
    a8, b8 = a.view(torch.uint8).to(torch.int16), b.view(torch.uint8).to(torch.int16)
    sign = ((a8 ^ b8) & 0x80 != 0) & ((a8 & 0x7F) != 0) & ((b8 & 0x7F) != 0)
    diff = ((a8 & 0x7F) - (b8 & 0x7F)).abs()
    tiny, numel = int((diff == 1).sum()), a.numel()
    assert not sign.any() and not (diff >= 2).any()
    assert tiny / numel < 0.005 or (tiny / numel < 0.04 and numel <= 4096), (tiny, numel)


@pytest.mark.parametrize("group_size, flags", GROUP_QUANT_CASES, ids=str)
@pytest.mark.parametrize("hidden", GROUP_QUANT_HIDDENS)
@pytest.mark.parametrize("tokens", GROUP_QUANT_TOKENS)
def test_group_quant_grid(tokens, hidden, group_size, flags):
    """sglang's ``test_per_token_group_quant_with_column_major`` (its grid without the fused
    silu-and-mul cases; UE8M0 only at group size 128, as sglang): bf16 ``randn`` with about half
    the values times 10 (sglang's ``create_per_token_group_quant_test_data``), against the float32
    formula at sglang's tolerances."""
    column_major, ue8m0 = GROUP_QUANT_FLAGS[flags]
    gen = torch.Generator(device="cuda").manual_seed(tokens * 10000 + hidden)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    x[torch.randn(x.shape, device="cuda", generator=gen) < 0.001] *= 10  # as sglang's data: about half
    want_q, want_s = torch_group_quant(x, group_size, ue8m0)
    q, s = per_token_group_quant_fp8(x, group_size, column_major_scales=column_major, scale_ue8m0=ue8m0)
    if ue8m0:  # packed exponent bytes: group 4 j + i in byte i of word j
        s = s.clone(memory_format=torch.contiguous_format).view(torch.uint8)[:, :hidden // group_size]
        s = torch.exp2(s.float() - 127)
    assert_fp8_close_or_tiny_diff(q, want_q)
    torch.testing.assert_close(s.contiguous(), want_s, rtol=1e-3, atol=1e-5)
