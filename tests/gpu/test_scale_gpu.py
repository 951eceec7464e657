"""kernkit.ops.scale on the GPU, bit for bit against torch: every dtype, sizes around the vector
width, misaligned views, a non-default stream, CUDA-graph replay, and the PDL variant next to the
plain one. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args
from kernkit.ops import scale
from kernkit.ops.scale import scale_spec
from kernkit.testing.ops.scale import ref_scale


def scale_with_pdl(dtype: torch.dtype, use_pdl: bool) -> JitSpec:
    """The scale specialization with PDL on or off, whatever the GPU would pick."""
    args = make_cpp_args(dtype, use_pdl)
    return JitSpec.make("scale", *args, cuda_files=["elementwise/scale.cuh"],
                        cuda_wrappers=[("scale", f"scale<{args}>")])

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
NS = [0, 1, 7, 8, 9, 255, 256, 257, 4099, 1 << 20, (1 << 24) + 3]


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    """Compile the specializations up front, in parallel (each nvcc run is its own process)."""
    from concurrent.futures import ThreadPoolExecutor

    reqs = [scale_spec(d) for d in DTYPES] + [scale_with_pdl(d, False) for d in DTYPES]
    with ThreadPoolExecutor(max_workers=len(reqs)) as pool:
        list(pool.map(lambda r: r.build(), reqs))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", NS)
def test_matches_torch(dtype, n):
    x = torch.randn(n, device="cuda").mul(3).to(dtype)
    for factor in (1.7, -0.3, 0.0):
        assert torch.equal(scale(x, factor), ref_scale(x, factor)), (n, factor)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("offset", [1, 3, 5])
def test_misaligned_views(dtype, offset):
    base = torch.randn(10_000, device="cuda").to(dtype)
    x = base[offset:]
    out = torch.empty(10_000, device="cuda", dtype=dtype)[offset:]
    scale(x, 0.75, out=out)
    assert torch.equal(out, ref_scale(x, 0.75))


@pytest.mark.parametrize("use_pdl", [False, True])
def test_both_pdl_variants(use_pdl):
    if use_pdl and not is_arch_support_pdl():
        pytest.skip("PDL needs sm_90")
    module = scale_with_pdl(torch.bfloat16, use_pdl).build_and_load()
    x = torch.randn(123_457, device="cuda").bfloat16()
    out = torch.empty_like(x)
    expected = x.clone()
    for _ in range(3):  # back to back on one stream: each launch reads what the previous wrote
        module.scale(out, x, 1.5)
        module.scale(x, out, -1.0)
        expected = ref_scale(ref_scale(expected, 1.5), -1.0)
    assert torch.equal(x, expected)


def test_non_default_stream():
    x = torch.randn(1 << 16, device="cuda").half()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = scale(x, 3.0)
    stream.synchronize()
    assert torch.equal(y, ref_scale(x, 3.0))


def test_cuda_graph_replay():
    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    scale(x, 2.0, out=out)  # load the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scale(x, 2.0, out=out)
    x.copy_(torch.randn(4096, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref_scale(x, 2.0))


def test_cpu_out_for_a_cuda_input_is_rejected():
    with pytest.raises(ValueError, match="out"):
        scale(torch.randn(8, device="cuda"), 2.0, out=torch.empty(8))
