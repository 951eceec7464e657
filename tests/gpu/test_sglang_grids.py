"""The shapes of sglang's own jit_kernel tests (sglang 0.5.10.post1, ``tests/test_rmsnorm.py``,
``tests/test_rope.py`` and ``tests/test_qknorm.py``) with kernkit as the subject, against a float32 torch reference at
sglang's tolerances: what a user moving from sglang's kernels to kernkit's would run first. The
grids are sglang's (its CI batch sizes, every hidden size it tests); sglang itself is not
needed. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernkit.ops import qk_norm, rmsnorm, rotary_embedding

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
    """sglang's ``test_rope`` shapes: 3-d q/k of head_dim 128, an fp32 cache, int64 positions."""
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
