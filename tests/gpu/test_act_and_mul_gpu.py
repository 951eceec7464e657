"""kernkit.ops.silu_and_mul and gelu_and_mul on the GPU: within the documented bound of the
float64 formulas for every dtype and activation, odd sizes and strided rows; fp16/bf16 over
every gate value, with the largest error in ulps printed (``-s`` shows it); fp32 the very bits
of the CPU emulator (fp16/bf16 use the hardware's approximate exp2 and reciprocal, so they agree
with the emulator within the bound, not bit for bit); a non-default stream, CUDA-graph replay,
and the PDL variant next to the plain one. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args
from kernkit.ops import gelu_and_mul, silu_and_mul
from kernkit.ops.act_and_mul import ACTIVATIONS, act_and_mul_spec
from kernkit.testing import oracle
from kernkit.testing.ops import act_and_mul as act_tests

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
ACTS = list(ACTIVATIONS)
SHAPES = [(1, 8), (1, 4096), (7, 1000), (33, 5120), (5, 13), (2, 3, 1), (256, 14336), (0, 64)]


def with_pdl(activation: str, dtype: torch.dtype, use_pdl: bool) -> JitSpec:
    """The specialization with PDL on or off, whatever the GPU would pick."""
    args = make_cpp_args(dtype, ACTIVATIONS[activation], use_pdl)
    return JitSpec.make(f"{activation}_and_mul", *args, cuda_files=["activation/act_and_mul.cuh"],
                        cuda_wrappers=[("act_and_mul", f"act_and_mul<{args}>")])


def run(x: torch.Tensor, activation: str, out: torch.Tensor | None = None) -> torch.Tensor:
    if activation == "silu":
        return silu_and_mul(x, out=out)
    return gelu_and_mul(x, "tanh" if activation == "gelu_tanh" else "none", out=out)


def assert_within_bound(got: torch.Tensor, x: torch.Tensor, activation: str) -> None:
    x, got = x.cpu(), got.cpu()
    ref = act_tests.ref_act_and_mul(x, activation)
    special = ~ref.to(x.dtype).isfinite()
    assert torch.equal(got[special].isnan(), ref[special].isnan())
    assert torch.equal(got[special & ~ref.isnan()], ref[special & ~ref.isnan()].to(x.dtype)), activation
    err = (got[~special].double() - ref[~special]).abs()
    assert bool((err <= act_tests.act_and_mul_bound(x, ref, activation)[~special]).all()), activation


def random_x(shape, dtype, seed=0, device="cuda") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    *lead, d = shape
    return (torch.randn(*lead, 2 * d, generator=g) * 4).to(dtype).to(device)


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    """Compile the specializations up front, in parallel (each nvcc run is its own process)."""
    from concurrent.futures import ThreadPoolExecutor

    reqs = [act_and_mul_spec(a, d) for a in ACTS for d in DTYPES]
    reqs += [with_pdl("silu", torch.bfloat16, False)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda r: r.build(), reqs))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_within_tolerance(dtype, act, shape):
    x = random_x(shape, dtype, seed=sum(shape))
    got = run(x, act)
    assert got.shape == (*shape[:-1], shape[-1]) and got.is_cuda
    assert_within_bound(got, x, act)


def sweep_x(dtype: torch.dtype) -> torch.Tensor:
    """A dense sweep of gate values (exp's subnormal range, erfc's pieces, the sigmoid's cut, the
    bf16 approximations' lower limits) with random up values, then random rows."""
    gate = torch.cat([torch.linspace(-210.0, 100.0, 30001), torch.linspace(-16.0, 16.0, 30001)]).to(dtype)
    up = (torch.randn(gate.shape, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    x = torch.stack([gate, up], dim=-1).reshape(-1, 2)
    return torch.cat([x, random_x((64, 1000), dtype, seed=5, device="cpu").reshape(-1, 2)])


@pytest.mark.parametrize("act", ACTS)
def test_fp32_same_bits_as_the_emulator(act):
    """fp32 is built from IEEE-rounded operations: the GPU and the CPU emulator agree on every
    bit."""
    x = sweep_x(torch.float32)
    assert torch.equal(run(x.cuda(), act).cpu().view(torch.uint8), run(x, act).view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_half_within_the_bound_like_the_emulator(dtype, act):
    """fp16/bf16 on the GPU and on the emulator, on the same sweep: each within the bound, and
    apart by at most one ulp of the dtype (the approximations differ only in their last bits)."""
    x = sweep_x(dtype)
    gpu, emu = run(x.cuda(), act).cpu(), run(x, act)
    assert_within_bound(gpu, x, act)
    assert_within_bound(emu, x, act)
    finite = gpu.isfinite() & emu.isfinite()
    assert torch.equal(gpu.isnan(), emu.isnan())
    apart = (gpu[finite].double() - emu[finite].double()).abs() / oracle.ulp(emu[finite].double(), dtype)
    assert float(apart.max()) <= 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_every_half_gate_value_max_ulps(dtype, act):
    """Every one of the 65536 gate values (NaNs and infinities too) against up values from tiny
    to huge: the GPU's largest error against float64, in ulps of the dtype, printed and within
    ``act_tests.ACT_BOUND_ULPS``."""
    gate = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
    ups = ((1.0, -3.5, 2.0**59, -(2.0**61), 2.0**-59, 2.0**-62, 3e38, -1e-38) if dtype == torch.bfloat16
           else (1.0, -3.5, 6.0e4, -65504.0, -1e-7, 6e-8))
    worst = 0.0
    for up in ups:
        x = torch.cat([gate, torch.full_like(gate, up)], dim=-1)
        got = run(x.cuda(), act).cpu()
        assert_within_bound(got, x, act)
        ref = act_tests.ref_act_and_mul(x, act)
        finite = ref.to(dtype).isfinite()
        err = (got[finite].double() - ref[finite]).abs() / oracle.ulp(ref[finite], dtype)
        worst = max(worst, float(err.max()))
    bound = act_tests.ACT_BOUND_ULPS[act, dtype]
    print(f"\n{act} {str(dtype).removeprefix('torch.')}: max {worst:.4f} ulp over every gate value "
          f"(bound {bound})")
    assert 0.25 < worst <= bound


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_rows(dtype):
    """Rows of a wider tensor (aligned: the vector path; misaligned: the scalar one) and 3-d x
    give the bits of the contiguous call."""
    d = 4096
    wide = random_x((64, 2 * d + 8), dtype, seed=3)
    for x in (wide[:, : 2 * d], wide[:, 1 : 2 * d + 1], wide[:, 8 : 2 * d + 8]):
        want = run(x.contiguous(), "silu")
        assert torch.equal(run(x, "silu"), want)
        assert torch.equal(run(x.unflatten(0, (8, 8)), "silu"), want.reshape(8, 8, d))


def test_non_default_stream():
    x = random_x((256, 4096), torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = gelu_and_mul(x, "tanh")
    stream.synchronize()
    assert torch.equal(y, gelu_and_mul(x, "tanh"))


def test_cuda_graph_replay():
    x = random_x((16, 4096), torch.bfloat16)
    out = torch.empty(16, 4096, dtype=torch.bfloat16, device="cuda")
    silu_and_mul(x, out=out)  # load the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        silu_and_mul(x, out=out)
    x.copy_(random_x((16, 4096), torch.bfloat16, seed=9))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, silu_and_mul(x))
    assert_within_bound(out, x, "silu")


@pytest.mark.parametrize("use_pdl", [False, True])
def test_both_pdl_variants(use_pdl):
    """Back to back on one stream, each launch reading what the previous one wrote: the same
    bits as the plain variant."""
    if use_pdl and not is_arch_support_pdl():
        pytest.skip("PDL needs sm_90")
    module = with_pdl("silu", torch.bfloat16, use_pdl).build_and_load()
    plain = with_pdl("silu", torch.bfloat16, False).build_and_load()
    x = random_x((300, 4 * 1024), torch.bfloat16)
    mid, out = (torch.empty(300, w, dtype=torch.bfloat16, device="cuda") for w in (4 * 1024, 2 * 1024))
    want_mid, want = torch.empty_like(mid), torch.empty_like(out)
    plain.act_and_mul(want_mid, x)
    plain.act_and_mul(want, want_mid)
    for _ in range(3):
        module.act_and_mul(mid, x)
        module.act_and_mul(out, mid)
    torch.cuda.synchronize()
    assert torch.equal(mid, want_mid) and torch.equal(out, want)


def test_cpu_out_for_a_cuda_input_is_rejected():
    with pytest.raises(ValueError, match="out"):
        silu_and_mul(random_x((2, 8), torch.float32), out=torch.empty(2, 8))
