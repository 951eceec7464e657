"""kernkit.ops.rmsnorm and kernkit.ops.fused_add_rmsnorm on the GPU: against the float64 formula
within the docstrings' tolerance and bit for bit against the kernel-order fp32 reference
(``kernkit/testing/oracle.py``, run on the CPU), every dtype, model and odd hidden sizes, strided rows,
multi-dimensional inputs, a non-default stream, CUDA-graph replay, torch.compile, and the PDL
variant next to the plain one. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args
from kernkit.ops import fused_add_rmsnorm, rmsnorm
from kernkit.ops.rmsnorm import rmsnorm_spec
from kernkit.testing.ops import rmsnorm as norm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [fp16, bf16, fp32]
#: Llama-3-8B / Qwen hidden sizes, a head_dim (q/k norm), a short row of one warp, and sizes
#: whose threads do not all get the same number of vectors.
HIDDENS = [4096, 5120, 128, 1024, 1000, 8200]
ROWS = [1, 7, 33, 1000, 16384 + 3]


def norm_with_pdl(dtype: torch.dtype, hidden: int, use_pdl: bool) -> JitSpec:
    """The norm specialization with PDL on or off, whatever the GPU would pick."""
    args = make_cpp_args(dtype, hidden, use_pdl)
    return JitSpec.make("rmsnorm", *args, cuda_files=["norm/rmsnorm.cuh"],
                        cuda_wrappers=[("rmsnorm", f"rmsnorm<{args}>"),
                                       ("fused_add_rmsnorm", f"fused_add_rmsnorm<{args}>")])


def assert_within_tolerance(got: torch.Tensor, want: torch.Tensor) -> None:
    """The docstrings' bound (``norm.rmsnorm_bound``)."""
    assert torch.isfinite(got).all()
    assert ((got.double() - want).abs() <= norm.rmsnorm_bound(want, got.dtype)).all()


def sizes(dtype):
    return [h for h in HIDDENS if h % (16 // dtype.itemsize) == 0]


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    """Compile the specializations up front, in parallel (each nvcc run is its own process)."""
    from concurrent.futures import ThreadPoolExecutor

    reqs = [rmsnorm_spec(d, h) for d in DTYPES for h in sizes(d)]
    reqs += [norm_with_pdl(bf16, 4096, False)] + ([norm_with_pdl(bf16, 4096, True)] if is_arch_support_pdl() else [])
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda r: r.build(), reqs))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_rmsnorm_matches_float64_and_the_kernel_order_bits(dtype, rows):
    for hidden in sizes(dtype):
        g = torch.Generator().manual_seed(rows * 7 + hidden)
        x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype)
        w = torch.randn(hidden, generator=g).to(dtype)
        y = rmsnorm(x.cuda(), w.cuda(), 1e-6).cpu()
        assert_within_tolerance(y, norm.rmsnorm64(x, w, 1e-6))
        want = torch.empty_like(x)
        norm.ref_rmsnorm(want, x, w, 1e-6)
        assert torch.equal(y, want), (hidden, rows)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 33, 4099])
def test_fused_add_rmsnorm_matches_float64_and_the_kernel_order_bits(dtype, rows):
    for hidden in sizes(dtype):
        g = torch.Generator().manual_seed(rows * 11 + hidden)
        x = torch.randn(rows, hidden, generator=g).to(dtype)
        r = torch.randn(rows, hidden, generator=g).to(dtype)
        w = torch.randn(hidden, generator=g).to(dtype)
        xd, rd = x.cuda(), r.cuda()
        fused_add_rmsnorm(xd, rd, w.cuda(), 1e-5)
        s = x.float() + r.float()
        assert torch.equal(rd.cpu(), s.to(dtype))
        assert_within_tolerance(xd.cpu(), norm.rmsnorm64(s, w, 1e-5))
        x1, r1 = x.clone(), r.clone()
        norm.ref_fused_add_rmsnorm(x1, r1, w, 1e-5)
        assert torch.equal(xd.cpu(), x1)


def test_strided_and_multi_dimensional_rows():
    buf = torch.randn(4, 9, 3 * 4096, device="cuda").bfloat16()
    x = buf[..., 4096 : 2 * 4096]
    w = torch.randn(4096, device="cuda").bfloat16()
    outbuf = torch.full((4, 9, 4096 + 64), 5.0, device="cuda", dtype=bf16)
    out = outbuf[..., :4096]
    rmsnorm(x, w, 1e-6, out=out)
    assert_within_tolerance(out.cpu(), norm.rmsnorm64(x.cpu(), w.cpu(), 1e-6))
    assert (outbuf[..., 4096:] == 5.0).all()
    q = torch.randn(1000, 32, 128, device="cuda").half()  # a per-head q norm
    wq = torch.randn(128, device="cuda").half()
    assert_within_tolerance(rmsnorm(q, wq).cpu(), norm.rmsnorm64(q.cpu(), wq.cpu(), 1e-6))
    r = torch.randn(4, 9, 2 * 4096, device="cuda").bfloat16()[..., :4096]
    s = x.float() + r.float()
    fused_add_rmsnorm(x, r, w)
    assert torch.equal(r, s.bfloat16())
    assert_within_tolerance(x.cpu(), norm.rmsnorm64(s.cpu(), w.cpu(), 1e-6))


@pytest.mark.parametrize("use_pdl", [False, True])
def test_both_pdl_variants(use_pdl):
    if use_pdl and not is_arch_support_pdl():
        pytest.skip("PDL needs sm_90")
    module = norm_with_pdl(bf16, 4096, use_pdl).build_and_load()
    x = torch.randn(3000, 4096, device="cuda").bfloat16()
    r = torch.randn(3000, 4096, device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    out = torch.empty_like(x)
    ex, er = x.cpu(), r.cpu()
    for _ in range(3):  # back to back on one stream: each launch reads what the previous wrote
        module.fused_add_rmsnorm(x, r, w, 1e-6)
        module.rmsnorm(out, x, w, 1e-6)
        module.fused_add_rmsnorm(out, r, w, 1e-6)
        norm.ref_fused_add_rmsnorm(ex, er, w.cpu(), 1e-6)
        eo = torch.empty_like(ex)
        norm.ref_rmsnorm(eo, ex, w.cpu(), 1e-6)
        norm.ref_fused_add_rmsnorm(eo, er, w.cpu(), 1e-6)
        x.copy_(out)
        ex = eo
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), ex) and torch.equal(r.cpu(), er)


@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
@pytest.mark.parametrize("late_weight, late_trigger", [(True, False), (False, True), (True, True)])
def test_every_schedule_gives_the_defaults_bits_back_to_back(op, late_weight, late_trigger):
    """The schedules a tuning table may choose (``SCHEDULES``) at every size, with PDL where the
    GPU has it, chained as in test_both_pdl_variants: the untuned build's bits."""
    from kernkit.jit.tuning import EVERY_SIZE
    from kernkit.ops.rmsnorm import rmsnorm_spec

    tuned = rmsnorm_spec(bf16, 4096, None, False, {op: (EVERY_SIZE * late_weight, EVERY_SIZE * late_trigger)})
    results = []
    for module in (rmsnorm_spec(bf16, 4096).build_and_load(), tuned.build_and_load()):
        gen = torch.Generator(device="cuda").manual_seed(5)
        x, r, w = (torch.randn(*shape, device="cuda", generator=gen).bfloat16() for shape in
                   ((3000, 4096), (3000, 4096), (4096,)))
        out = torch.empty_like(x)
        for _ in range(3):
            module.fused_add_rmsnorm(x, r, w, 1e-6)
            module.rmsnorm(out, x, w, 1e-6)
            module.fused_add_rmsnorm(out, r, w, 1e-6)
            x.copy_(out)
        torch.cuda.synchronize()
        results.append((x.cpu(), r.cpu()))
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_non_default_stream():
    x = torch.randn(512, 5120, device="cuda").half()
    w = torch.randn(5120, device="cuda").half()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = rmsnorm(x, w)
    stream.synchronize()
    assert_within_tolerance(y.cpu(), norm.rmsnorm64(x.cpu(), w.cpu(), 1e-6))


def test_cuda_graph_replay():
    x = torch.randn(64, 4096, device="cuda").bfloat16()
    r = torch.randn(64, 4096, device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    out = torch.empty_like(x)
    rmsnorm(x, w, out=out)  # load the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_add_rmsnorm(x, r, w)
        rmsnorm(x, w, out=out)
    x0 = torch.randn(64, 4096, device="cuda").bfloat16()
    r0 = torch.randn(64, 4096, device="cuda").bfloat16()
    x.copy_(x0)
    r.copy_(r0)
    graph.replay()
    torch.cuda.synchronize()
    ex, er = x0.cpu(), r0.cpu()
    norm.ref_fused_add_rmsnorm(ex, er, w.cpu(), 1e-6)
    eo = torch.empty_like(ex)
    norm.ref_rmsnorm(eo, ex, w.cpu(), 1e-6)
    assert torch.equal(r.cpu(), er) and torch.equal(x.cpu(), ex) and torch.equal(out.cpu(), eo)


def test_torch_compile_calls_the_custom_ops():
    def layer(h, res, w):
        fused_add_rmsnorm(h, res, w)
        return rmsnorm(h, w)

    h = torch.randn(16, 4096, device="cuda").bfloat16()
    res = torch.randn(16, 4096, device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    h2, res2 = h.clone(), res.clone()
    got = torch.compile(layer, fullgraph=True)(h, res, w)
    want = layer(h2, res2, w)
    assert torch.equal(got, want) and torch.equal(h, h2) and torch.equal(res, res2)


def test_cpu_tensors_next_to_cuda_ones_are_rejected():
    x = torch.randn(4, 128, device="cuda").half()
    with pytest.raises(ValueError, match="out"):
        rmsnorm(x, torch.ones(128, device="cuda").half(), out=torch.empty(4, 128).half())
    with pytest.raises(ValueError, match="weight|x"):
        rmsnorm(x, torch.ones(128).half())
    with pytest.raises(ValueError, match="residual"):
        fused_add_rmsnorm(x, torch.empty(4, 128).half(), torch.ones(128, device="cuda").half())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 33, 1000])
def test_cast_x_before_out_mul_bits_equal_the_reference(dtype, rows):
    """transformers' order, both ops: the GPU gives the CPU reference's bits."""
    for hidden in (4096, 128):
        g = torch.Generator().manual_seed(rows + hidden + 1)
        x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype)
        r = torch.randn(rows, hidden, generator=g).to(dtype)
        w = torch.randn(hidden, generator=g).to(dtype)
        want = torch.empty_like(x)
        norm.ref_rmsnorm(want, x, w, 1e-6, cast=True)
        assert torch.equal(rmsnorm(x.cuda(), w.cuda(), 1e-6, cast_x_before_out_mul=True).cpu(), want)
        x1, r1, x2, r2 = x.clone(), r.clone(), x.cuda(), r.cuda()
        norm.ref_fused_add_rmsnorm(x1, r1, w, 1e-6, cast=True)
        fused_add_rmsnorm(x2, r2, w.cuda(), 1e-6, cast_x_before_out_mul=True)
        assert torch.equal(x2.cpu(), x1) and torch.equal(r2.cpu(), r1)
