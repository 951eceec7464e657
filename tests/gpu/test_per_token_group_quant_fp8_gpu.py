"""kernkit.ops.per_token_group_quant_fp8 on the GPU, bit for bit against the torch reference
(kernkit/testing/oracle.py, run on the CPU): every dtype, group size and scale layout, DeepSeek-V3's
hidden size, strided and misaligned rows (the scalar variant), special groups (NaN included:
the kernel writes one NaN), ``out=``, a non-default stream, CUDA-graph replay, and the PDL
variant next to the plain one. Run with ``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, is_arch_support_pdl, make_cpp_args
from kernkit.ops import per_token_group_quant_fp8
from kernkit.ops.per_token_group_quant_fp8 import GROUP_QUANT_DTYPES, GROUP_SIZES, per_token_group_quant_fp8_spec
from kernkit.testing.ops import per_token_group_quant_fp8 as group_quant

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

fp8 = torch.float8_e4m3fn
#: (column_major_scales, scale_ue8m0).
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
LAYOUT_IDS = ["row", "row-ue8m0", "col", "col-ue8m0"]


def group_quant_with_pdl(dtype: torch.dtype, group_size: int, use_pdl: bool) -> JitSpec:
    """The row-major specialization with PDL on or off, whatever the GPU would pick."""
    args = make_cpp_args(dtype, group_size, False, False, use_pdl)
    return JitSpec.make("per_token_group_quant_fp8", *args, cuda_files=["quant/per_token_group_quant_fp8.cuh"],
                        cuda_wrappers=[("per_token_group_quant_fp8", f"per_token_group_quant_fp8<{args}>")])


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    """Compile the specializations up front, in parallel (each nvcc run is its own process)."""
    from concurrent.futures import ThreadPoolExecutor

    specs = [per_token_group_quant_fp8_spec(d, g, c, u) for d in GROUP_QUANT_DTYPES for g in GROUP_SIZES
             for c, u in LAYOUTS]
    specs.append(group_quant_with_pdl(torch.bfloat16, 128, False))
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda s: s.build(), specs))


def groups_of(tokens: int, hidden: int, dtype: torch.dtype, group_size: int, seed: int = 0) -> torch.Tensor:
    """Normal values, each group of its own magnitude (2**-10 to 2**10), made on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-10, 11, (tokens, hidden // group_size, 1), generator=gen).float())
    x = torch.randn(tokens, hidden // group_size, group_size, generator=gen) * mag
    return x.reshape(tokens, hidden).to(dtype)


def assert_matches(x, q, scales, group_size, column_major=False, ue8m0=False, eps=1e-10):
    """Bit-exact against the reference run on the CPU, the scales in their layout."""
    want_q, want_scales = group_quant.ref_per_token_group_quant_fp8(x.cpu(), group_size, column_major, ue8m0, eps)
    assert q.shape == x.shape and q.dtype == fp8 and q.is_contiguous()
    assert (scales.dtype, scales.shape) == (want_scales.dtype, want_scales.shape)
    assert x.shape[0] == 0 or scales.stride() == want_scales.stride()
    assert torch.equal(scales.cpu().view(torch.int32), want_scales.view(torch.int32))
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("dtype", GROUP_QUANT_DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [0, 1, 37, 1025])
def test_matches_the_reference(tokens, dtype, group_size, layout):
    """56 groups a row: DeepSeek-V3's 7168 at group size 128."""
    x = groups_of(tokens, 56 * group_size, dtype, group_size, seed=tokens + group_size).cuda()
    q, scales = per_token_group_quant_fp8(x, group_size, column_major_scales=layout[0], scale_ue8m0=layout[1])
    assert_matches(x, q, scales, group_size, *layout)


@pytest.mark.parametrize("dtype", GROUP_QUANT_DTYPES, ids=str)
def test_strided_and_misaligned_rows(dtype):
    wide = groups_of(65, 4096 + 520, dtype, 8, seed=1).cuda()
    for x in (wide[:, :4096], wide[:, 512:4608], wide[::3, 8:4104], wide[:, 1:4097], wide[:, 3:4099]):
        for layout in LAYOUTS:
            q, s = per_token_group_quant_fp8(x, 128, column_major_scales=layout[0], scale_ue8m0=layout[1])
            assert_matches(x, q, s, 128, *layout)
    x = groups_of(33, 1029, dtype, 3, seed=2)[:, 5:1029].cuda()  # a row stride of 1029 elements
    for group_size in GROUP_SIZES:
        assert_matches(x, *per_token_group_quant_fp8(x, group_size), group_size)
    x = groups_of(1, 512, dtype, 16, seed=3).cuda().expand(9, 512)  # row stride 0
    assert_matches(x, *per_token_group_quant_fp8(x, 16, column_major_scales=True), 16, True)


@pytest.mark.parametrize("dtype", GROUP_QUANT_DTYPES, ids=str)
def test_special_groups(dtype):
    """Zeros, -0.0, NaN, infinities, subnormals and the dtype's largest value, eps 0 and not: the
    reference's bits, NaN scales (0x7fffffff) and NaN values (0x7f) included."""
    x = groups_of(3, 16 * 32, dtype, 32, seed=4)
    g = x.view(3, 16, 32)
    fi = torch.finfo(dtype)
    g[0, 0] = 0.0
    g[0, 1] = -0.0
    g[0, 2, 5] = float("nan")
    g[0, 3, 1], g[0, 3, 9] = float("inf"), float("-inf")
    g[0, 4] = fi.smallest_normal * fi.eps * torch.arange(-16, 16)
    g[0, 5, 7] = -fi.max
    x = x.cuda()
    for layout in LAYOUTS:
        for eps in (1e-10, 0.0, 1e-3):
            q, s = per_token_group_quant_fp8(x, 32, column_major_scales=layout[0], scale_ue8m0=layout[1], eps=eps)
            assert_matches(x, q, s, 32, *layout, eps=eps)


def test_fp32_groups_on_both_sides_of_the_reciprocals_threshold():
    threshold_max = 448 * 2.0**-69
    maxima = torch.tensor([3e38, 1.0, 2.0**-50, threshold_max * 1.0000001, threshold_max, threshold_max * 0.9999999,
                           2.0**-100, 1e-38, 1e-45])
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(len(maxima), 128, generator=gen) * torch.exp2(-torch.randint(0, 150, (len(maxima), 128),
                                                                                   generator=gen).float())
    x[:, :4] = torch.tensor([0.0, -0.0, 1e-45, -1e-42])
    x = x / x.abs().amax(dim=1, keepdim=True) * maxima[:, None] * 0.5
    x[:, 4] = maxima
    x = x.cuda()
    for eps in (0.0, 1e-30):
        for layout in LAYOUTS:
            q, s = per_token_group_quant_fp8(x, 128, column_major_scales=layout[0], scale_ue8m0=layout[1], eps=eps)
            assert_matches(x, q, s, 128, *layout, eps=eps)


def test_out_aligned_and_not():
    x = groups_of(24, 7168, torch.bfloat16, 128, seed=6).cuda()
    out = torch.empty(24, 7168, dtype=fp8, device="cuda")
    q, s = per_token_group_quant_fp8(x, 128, column_major_scales=True, scale_ue8m0=True, out=out)
    assert q is out
    assert_matches(x, q, s, 128, True, True)
    buf = torch.zeros(24 * 7168 + 1, dtype=torch.uint8, device="cuda")
    out = buf[1:].view(fp8).view(24, 7168)  # an odd address: the scalar variant
    q, s = per_token_group_quant_fp8(x, 128, out=out)
    assert q is out and buf[0].item() == 0
    assert_matches(x, q, s, 128)


@pytest.mark.parametrize("use_pdl", [False, True])
def test_both_pdl_variants(use_pdl):
    if use_pdl and not is_arch_support_pdl():
        pytest.skip("PDL needs sm_90")
    module = group_quant_with_pdl(torch.bfloat16, 128, use_pdl).build_and_load()
    x = groups_of(513, 7168, torch.bfloat16, 128, seed=7).cuda()
    qs = [torch.empty(513, 7168, dtype=fp8, device="cuda") for _ in range(2)]
    ss = [torch.empty(513, 56, device="cuda") for _ in range(2)]
    for _ in range(3):  # back to back on one stream: each launch reads what the previous wrote
        module.per_token_group_quant_fp8(qs[0], ss[0], x, 1e-10)
        x2 = (qs[0].float().view(513, 56, 128) * ss[0][:, :, None]).view(513, 7168).to(torch.bfloat16)
        module.per_token_group_quant_fp8(qs[1], ss[1], x2, 1e-10)
        assert_matches(x2, qs[1], ss[1], 128)


def test_non_default_stream():
    x = groups_of(300, 7168, torch.float16, 128, seed=8).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q, s = per_token_group_quant_fp8(x, 128, column_major_scales=True)
    stream.synchronize()
    assert_matches(x, q, s, 128, True)


def test_cuda_graph_replay():
    x = groups_of(256, 7168, torch.bfloat16, 128, seed=9).cuda()
    out = torch.empty(256, 7168, dtype=fp8, device="cuda")
    per_token_group_quant_fp8(x, 128, column_major_scales=True, scale_ue8m0=True, out=out)  # load outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, scales = per_token_group_quant_fp8(x, 128, column_major_scales=True, scale_ue8m0=True, out=out)
    x.copy_(groups_of(256, 7168, torch.bfloat16, 128, seed=10).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(x, out, scales, 128, True, True)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_a_graph_with_out_and_out_scales_allocates_nothing(layout):
    x = groups_of(64, 7168, torch.bfloat16, 128, seed=11).cuda()
    out = torch.empty(64, 7168, dtype=fp8, device="cuda")
    cols, dtype, column_major = group_quant.group_scales_layout(56, *layout)
    buf = torch.empty((cols, 64) if column_major else (64, cols), dtype=dtype, device="cuda")
    scales = buf.t() if column_major else buf
    flags = dict(column_major_scales=layout[0], scale_ue8m0=layout[1])
    per_token_group_quant_fp8(x, 128, **flags, out=out, out_scales=scales)  # load outside
    for _ in range(2):  # the first capture of a process allocates 1 KiB of its own: count the second
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            q, s = per_token_group_quant_fp8(x, 128, **flags, out=out, out_scales=scales)
    assert q is out and s is scales and torch.cuda.memory_allocated() == before
    x.copy_(groups_of(64, 7168, torch.bfloat16, 128, seed=12).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(x, out, scales, 128, *layout)


def test_cpu_out_for_a_cuda_input_is_rejected():
    x = groups_of(2, 256, torch.bfloat16, 128).cuda()
    with pytest.raises(ValueError, match="'out'"):
        per_token_group_quant_fp8(x, out=torch.empty(2, 256, dtype=fp8))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", GROUP_QUANT_DTYPES, ids=str)
def test_one_vector_a_thread_at_every_size_gives_the_defaults_bits(dtype, layout):
    """The variant a tuning table may choose per size (one vector a thread, twice the blocks) at
    every size, every group size, aligned rows and the scalar variant's misaligned ones: the
    untuned build's bits."""
    from kernkit.jit.tuning import EVERY_SIZE

    for group_size in GROUP_SIZES:
        base, tuned = (per_token_group_quant_fp8_spec(dtype, group_size, *layout, None, mask).build_and_load()
                       for mask in (0, EVERY_SIZE))
        for tokens, offset in ((1, 0), (37, 0), (3000, 0), (37, 1)):
            wide = groups_of(tokens, 56 * group_size + 16, dtype, 8, seed=tokens + group_size).cuda()
            x = wide[:, offset:offset + 56 * group_size]
            got = []
            for module in (base, tuned):
                q, scales = per_token_group_quant_fp8(x, group_size, column_major_scales=layout[0],
                                                      scale_ue8m0=layout[1])
                q.zero_(), scales.zero_()
                module.per_token_group_quant_fp8(q, scales, x, 1e-10)
                got.append((q.view(torch.uint8).cpu(), scales.cpu().flatten().view(torch.uint8)))
            assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1]), (group_size, tokens)
