"""kernkit.ops.per_token_quant_fp8 on the GPU, bit for bit against the fp32 torch reference
(kernkit/testing/oracle.py) and within the documented error of float64: every dtype, model and odd hidden
sizes, strided and misaligned rows, special rows, a non-default stream, CUDA-graph replay, and
the PDL variant next to the plain one. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args
from kernkit.ops import per_token_quant_fp8
from kernkit.ops.per_token_quant_fp8 import per_token_quant_fp8_spec
from kernkit.testing.ops import per_token_quant_fp8 as quant

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
HIDDEN = [7, 128, 1000, 4096, 5120, 14336]
TOKENS = [0, 1, 3, 64, 1025]


def quant_with_pdl(dtype: torch.dtype, hidden: int, use_pdl: bool) -> JitSpec:
    """The specialization with PDL on or off, whatever the GPU would pick."""
    args = make_cpp_args(dtype, hidden, use_pdl)
    return JitSpec.make("per_token_quant_fp8", *args, cuda_files=["quant/per_token_quant_fp8.cuh"],
                        cuda_wrappers=[("per_token_quant_fp8", f"per_token_quant_fp8<{args}>")])


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    """Compile the specializations up front, in parallel (each nvcc run is its own process)."""
    from concurrent.futures import ThreadPoolExecutor

    reqs = [per_token_quant_fp8_spec(d, h) for d in DTYPES for h in HIDDEN]
    reqs += [quant_with_pdl(torch.bfloat16, 4096, False)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda r: r.build(), reqs))


def rows(tokens: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Normal rows of magnitudes 2**-10 to 2**10, made on the CPU (the same bits everywhere)."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-10, 11, (tokens, 1), generator=gen).float())
    return (torch.randn(tokens, hidden, generator=gen) * mag).to(dtype).cuda()


def assert_matches(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> None:
    """Bit-exact against the reference (run on the CPU), and within the docstring's bound of a
    float64 computation."""
    want_q, want_scales = quant.ref_per_token_quant_fp8(x.cpu())
    assert q.shape == x.shape and scales.shape == (*x.shape[:-1], 1)
    assert torch.equal(scales.cpu().view(torch.int32), want_scales.view(torch.int32))
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    xd = x.double()
    err = (q.double() * scales.double() - xd).abs()
    assert (err <= xd.abs() * (2**-4 + 2**-20) + scales.double() * 2**-10).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_matches_the_reference(dtype, hidden, tokens):
    x = rows(tokens, hidden, dtype, seed=tokens * 7 + hidden)
    assert_matches(x, *per_token_quant_fp8(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_and_misaligned_rows(dtype):
    wide = rows(65, 4096 + 520, dtype, seed=1)
    for x in (wide[:, :4096], wide[:, 512:4608], wide[::3, 8:4104], wide[:, 1:4097]):
        assert_matches(x, *per_token_quant_fp8(x))
    x = rows(33, 1001, dtype, seed=2)[:, 1:]
    assert_matches(x, *per_token_quant_fp8(x))


def test_out_and_other_ranks():
    x = rows(24, 5120, torch.bfloat16, seed=3).reshape(2, 12, 5120)
    out = torch.empty(2, 12, 5120, dtype=torch.float8_e4m3fn, device="cuda")
    q, scales = per_token_quant_fp8(x, out=out)
    assert q is out and scales.shape == (2, 12, 1)
    assert_matches(x, q, scales)


def test_special_rows():
    x = rows(6, 4096, torch.bfloat16, seed=4)
    x[1] = 0.0
    x[2] = -0.0
    x[3, 100] = float("nan")
    x[4, 7] = float("inf")
    q, scales = per_token_quant_fp8(x)
    s, qf = scales.cpu(), q.float().cpu()
    assert s[1].item() == 0.0 and s[2].item() == 0.0 and (q.view(torch.uint8)[1:3] == 0).all()
    assert torch.isnan(s[3]).all() and torch.isnan(qf[3]).all()
    assert s[4].item() == float("inf") and torch.isnan(qf[4, 7]) and (qf[4, :7] == 0).all()
    keep = torch.tensor([0, 1, 2, 5])
    assert_matches(x[keep.cuda()], q[keep.cuda()], scales[keep.cuda()])


@pytest.mark.parametrize("use_pdl", [False, True])
def test_both_pdl_variants(use_pdl):
    if use_pdl and not is_arch_support_pdl():
        pytest.skip("PDL needs sm_90")
    module = quant_with_pdl(torch.bfloat16, 4096, use_pdl).build_and_load()
    x = rows(513, 4096, torch.bfloat16, seed=5)
    qs = [torch.empty(513, 4096, dtype=torch.float8_e4m3fn, device="cuda") for _ in range(2)]
    ss = [torch.empty(513, 1, device="cuda") for _ in range(2)]
    for _ in range(3):  # back to back on one stream: each launch reads what the previous wrote
        module.per_token_quant_fp8(qs[0], ss[0], x)
        x2 = (qs[0].to(torch.bfloat16) * ss[0]).to(torch.bfloat16)
        module.per_token_quant_fp8(qs[1], ss[1], x2)
        assert_matches(x2, qs[1], ss[1])


def test_non_default_stream():
    x = rows(300, 5120, torch.float16, seed=6)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q, scales = per_token_quant_fp8(x)
    stream.synchronize()
    assert_matches(x, q, scales)


def test_cuda_graph_replay():
    x = rows(256, 4096, torch.bfloat16, seed=7)
    out = torch.empty(256, 4096, dtype=torch.float8_e4m3fn, device="cuda")
    per_token_quant_fp8(x, out=out)  # load the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, scales = per_token_quant_fp8(x, out=out)
    x.copy_(rows(256, 4096, torch.bfloat16, seed=8))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(x, out, scales)


def test_cpu_out_for_a_cuda_input_is_rejected():
    with pytest.raises(ValueError, match="out"):
        per_token_quant_fp8(rows(2, 128, torch.bfloat16), out=torch.empty(2, 128, dtype=torch.float8_e4m3fn))
