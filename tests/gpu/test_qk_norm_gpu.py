"""kernkit.ops.qk_norm on the GPU: bit for bit against the kernel-order fp32 reference
(``kernkit/testing/oracle.py``, run on the CPU) and within rmsnorm's tolerance of float64, every dtype
and head size, q and k sliced from one QKV tensor at model sizes, CUDA-graph replay and the PDL
variant next to the plain one. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args
from kernkit.ops import qk_norm
from kernkit.ops.qk_norm import QK_NORM_HEAD_DIMS, qk_norm_spec
from kernkit.testing.ops import qk_norm as qk
from kernkit.testing.ops import rmsnorm as norm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda s: s.build(), [qk_norm_spec(d, h) for d in DTYPES for h in QK_NORM_HEAD_DIMS]))


def fused_qkv(tokens, q_heads, k_heads, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, (q_heads + 2 * k_heads) * head_dim, generator=g) * 4).to(dtype)
    return qkv, lambda b: (b[:, :q_heads * head_dim].view(tokens, q_heads, head_dim),
                           b[:, q_heads * head_dim:(q_heads + k_heads) * head_dim])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", QK_NORM_HEAD_DIMS)
@pytest.mark.parametrize("tokens, q_heads, k_heads", [(1, 8, 1), (33, 32, 8), (4099, 16, 2)])
def test_bits_equal_the_reference_and_v_is_untouched(dtype, head_dim, tokens, q_heads, k_heads):
    qkv, views = fused_qkv(tokens, q_heads, k_heads, head_dim, dtype, head_dim + tokens)
    g = torch.Generator().manual_seed(tokens)
    wq, wk = (torch.randn(head_dim, generator=g).to(dtype) for _ in range(2))
    want = qkv.clone()
    qk.ref_qk_norm(*views(want), wq, wk, 1e-6)
    dev = qkv.cuda()
    qk_norm(*views(dev), wq.cuda(), wk.cuda())
    assert torch.equal(dev.cpu(), want)
    q64 = norm.rmsnorm64(views(qkv)[0], wq, 1e-6)
    assert ((views(dev.cpu())[0].double() - q64).abs() <= norm.rmsnorm_bound(q64, dtype)).all()


@pytest.mark.parametrize("use_pdl", [False, True])
def test_both_pdl_variants(use_pdl):
    if use_pdl and not is_arch_support_pdl():
        pytest.skip("PDL needs sm_90 or newer")
    args = make_cpp_args(torch.bfloat16, 128, use_pdl)
    module = JitSpec.make("qk_norm", *args, cuda_files=["norm/qk_norm.cuh"],
                          cuda_wrappers=[("qk_norm", f"qk_norm<{args}>")]).build_and_load()
    qkv, views = fused_qkv(300, 32, 8, 128, torch.bfloat16, 1)
    w = torch.randn(128, dtype=torch.bfloat16)
    want = qkv.clone()
    qk.ref_qk_norm(*views(want), w, w, 1e-6)
    dev = qkv.cuda()
    module.qk_norm(*views(dev), w.cuda(), w.cuda(), 1e-6)
    assert torch.equal(dev.cpu(), want)


@pytest.mark.parametrize("late_weight, late_trigger", [(True, False), (False, True), (True, True)])
def test_every_schedule_gives_the_defaults_bits_back_to_back(late_weight, late_trigger):
    """The schedules a tuning table may choose (``SCHEDULES``) at every size, with PDL where the
    GPU has it, each call reading what the one before wrote: the untuned build's bits."""
    from kernkit.jit.tuning import EVERY_SIZE

    tuned = qk_norm_spec(torch.bfloat16, 128, None, False, (EVERY_SIZE * late_weight, EVERY_SIZE * late_trigger))
    results = []
    for module in (qk_norm_spec(torch.bfloat16, 128).build_and_load(), tuned.build_and_load()):
        qkv, views = fused_qkv(3000, 32, 8, 128, torch.bfloat16, 7)
        dev, w = qkv.cuda(), torch.randn(128, generator=torch.Generator().manual_seed(7)).bfloat16().cuda()
        q, k = views(dev)
        for _ in range(3):
            module.qk_norm(q, k, w, w, 1e-6)
            q.mul_(3)  # the next call reads what this one wrote
        torch.cuda.synchronize()
        results.append(dev.cpu())
    assert torch.equal(*results)


def test_cuda_graph_replay():
    qkv, views = fused_qkv(64, 16, 2, 128, torch.bfloat16, 2)
    dev = qkv.cuda()
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    qk_norm(*views(dev), w, w)  # load the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qk_norm(*views(dev), w, w)
    dev.copy_(qkv.cuda())
    graph.replay()
    want = qkv.clone()
    qk.ref_qk_norm(*views(want), w.cpu(), w.cpu(), 1e-6)
    assert torch.equal(dev.cpu(), want)


def test_cpu_weight_next_to_cuda_heads_is_refused():
    q, k = torch.ones(2, 2, 64, device="cuda", dtype=torch.float16), torch.ones(2, 1, 64, device="cuda",
                                                                                 dtype=torch.float16)
    with pytest.raises(ValueError, match="'q_weight'"):
        qk_norm(q, k, torch.ones(64, dtype=torch.float16), torch.ones(64, device="cuda", dtype=torch.float16))
    assert (q == 1).all() and (k == 1).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_cast_x_before_out_mul_bits_equal_the_reference(dtype, head_dim):
    """transformers' order: the GPU gives the CPU reference's bits, as the emulator does."""
    qkv, views = fused_qkv(33, 32, 8, head_dim, dtype, head_dim + 5)
    g = torch.Generator().manual_seed(head_dim)
    wq, wk = (torch.randn(head_dim, generator=g).to(dtype) for _ in range(2))
    want = qkv.clone()
    qk.ref_qk_norm(*views(want), wq, wk, 1e-6, cast=True)
    dev = qkv.cuda()
    qk_norm(*views(dev), wq.cuda(), wk.cuda(), cast_x_before_out_mul=True)
    assert torch.equal(dev.cpu(), want)
