"""kernkit.ops.per_token_group_quant_fp8 on CPU tensors, through the CPU emulator: the kernel
template the GPU runs, bit-exact against the torch reference (kernkit/testing/oracle.py) for every
dtype, group size and scale layout, within the documented error of float64, its special groups
(zeros, NaN, inf, tiny values, saturation, eps 0), its scale layouts (strides, packed UE8M0
bytes, padding), strided and misaligned rows (the scalar variant), ``out=``, its errors, and
its custom ops.

Specializations built (each an emulator build of about a second, 48 in all, built up front two
at a time): every dtype x group size x scale layout (row-major, row-major UE8M0, column-major,
column-major packed UE8M0)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops import per_token_group_quant_fp8, registered_ops
from kernkit.ops.per_token_group_quant_fp8 import (
    GROUP_QUANT_DTYPES,
    GROUP_SIZES,
    _module,
    per_token_group_quant_fp8_spec,
)
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import VALID, Arena, Bad, check_invalid, invalid_calls
from kernkit.testing.oracle import op_tests

quant = op_tests("per_token_quant_fp8")

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
i32 = torch.int32

#: (column_major_scales, scale_ue8m0): the four scale layouts.
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
LAYOUT_IDS = ["row", "row-ue8m0", "col", "col-ue8m0"]


# ----- the reference: what the kernel must compute


def ue8m0_ceil(scales: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 ``scales`` rounded up to a power of two, at least 2**-127 (UE8M0's
    smallest), by their bits: infinities and NaN are kept, a power of two is kept, anything
    else goes to the next exponent with a zero mantissa."""
    b = scales.view(torch.int32)
    up = torch.where((b & 0x007FFFFF) == 0, b, (b & 0x7F800000) + 0x00800000)
    b = torch.where(b >= 0x7F800000, b, torch.where(b <= 0x00400000, torch.full_like(b, 0x00400000), up))
    return b.view(torch.float32)


def ref_per_token_group_quant_fp8(x: torch.Tensor, group_size: int, column_major_scales: bool = False,
                                  scale_ue8m0: bool = False, eps: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of ``group_size`` consecutive elements of a row of the 2-d ``x``:
    ``amax = max|x|`` and ``m = max(amax, |eps|)``, both compared as the bits of fp32 absolute
    values (so a NaN wins; ``eps`` is taken to fp32), a NaN ``m`` as 0x7fffffff (the NaN the
    GPU's division returns), ``scale = m / 448`` (one fp32 IEEE division), with ``scale_ue8m0``
    rounded up by ``ue8m0_ceil``; ``q = saturate_e4m3(x / scale)``
    with an fp32 IEEE division per element, rounded to nearest even, ``q = 0`` where
    ``scale == 0``, and every NaN E4M3's 0x7f (CUDA's conversion drops a NaN's sign). Returns
    ``(q, scales)``, the scales laid out as the op returns them: row-major float32
    ``[tokens, groups]``; with ``column_major_scales`` float32 of strides ``(1, align(tokens, 4))``;
    with both flags int32 ``[tokens, ceil(groups / 4)]`` of those strides, byte ``i`` of word ``j``
    the exponent byte (bits >> 23) of group ``4 j + i``, 0 past the last group."""
    tokens, hidden = x.shape
    groups = hidden // group_size
    xf = x.float().reshape(tokens, groups, group_size)
    amax_bits = (xf.view(torch.int32) & 0x7FFFFFFF).amax(dim=-1)
    eps_bits = torch.tensor(eps, dtype=torch.float32).view(torch.int32) & 0x7FFFFFFF
    m = torch.maximum(amax_bits, eps_bits)
    m = torch.where(m > 0x7F800000, 0x7FFFFFFF, m).view(torch.float32)  # one NaN, kept by the division
    scales = m / torch.full_like(m, 448.0)  # elementwise IEEE division, never a reciprocal
    if scale_ue8m0:
        scales = ue8m0_ceil(scales)
    s = scales[:, :, None]
    q = torch.where(s == 0, torch.zeros_like(xf), xf / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q_bytes = q.view(torch.uint8).reshape(tokens, hidden)
    q = torch.where(q_bytes == 0xFF, 0x7F, q_bytes).view(torch.float8_e4m3fn)  # -NaN (0xff) as 0x7f
    if not column_major_scales:
        return q, scales
    padded = -(-tokens // 4) * 4
    if not scale_ue8m0:
        out = torch.zeros(groups, padded, dtype=torch.float32, device=x.device).t()[:tokens]
        out.copy_(scales)
        return q, out
    words = -(-groups // 4)
    exponents = torch.zeros(tokens, 4 * words, dtype=torch.uint8, device=x.device)
    exponents[:, :groups] = (scales.view(torch.int32) >> 23).to(torch.uint8)
    out = torch.zeros(words, padded, dtype=torch.int32, device=x.device).t()[:tokens]
    out.copy_(exponents.view(torch.int32))  # little-endian: group 4 j + i in byte i of word j
    return q, out


@pytest.fixture(scope="module", autouse=True)
def prebuild():
    specs = [per_token_group_quant_fp8_spec(d, g, c, u, "emu") for d in GROUP_QUANT_DTYPES for g in GROUP_SIZES
             for c, u in LAYOUTS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda s: s.build(), specs))


def groups_of(tokens: int, hidden: int, dtype: torch.dtype, group_size: int, seed: int = 0) -> torch.Tensor:
    """Normal values, each group of its own magnitude (2**-20 to 2**20, 2**-10 to 2**10 for
    fp16, whose range is narrower)."""
    gen = torch.Generator().manual_seed(seed)
    span = 10 if dtype == fp16 else 20
    mag = torch.exp2(torch.randint(-span, span + 1, (tokens, hidden // group_size, 1), generator=gen).float())
    x = torch.randn(tokens, hidden // group_size, group_size, generator=gen) * mag
    return x.reshape(tokens, hidden).to(dtype)


def align4(n: int) -> int:
    return -(-n // 4) * 4


def assert_bit_exact(x, q, scales, group_size, column_major=False, ue8m0=False, eps=1e-10):
    """``q`` and ``scales`` are the reference's bits, and ``scales`` has its layout (dtype, shape,
    strides)."""
    want_q, want_scales = ref_per_token_group_quant_fp8(x, group_size, column_major, ue8m0, eps)
    assert q.dtype == fp8 and q.shape == x.shape and q.is_contiguous()
    assert (scales.dtype, scales.shape) == (want_scales.dtype, want_scales.shape)
    if x.shape[0] > 0:
        assert scales.stride() == want_scales.stride()
    assert torch.equal(scales.view(i32), want_scales.view(i32))
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


def assert_within_tolerance(x, q, scales, group_size, eps=1e-10):
    """The docstring's arithmetic against float64, for finite float32 scales (either rounding):
    the scale within one fp32 rounding of ``max(amax, eps) / 448`` (or its power of two), and
    ``q * scale`` within half an E4M3 step of ``x`` (2**-4 relative, or 2**-10 * scale where E4M3
    is subnormal), plus the fp32 roundings."""
    tokens, hidden = x.shape
    xd = x.double().view(tokens, hidden // group_size, group_size)
    s = scales.double()[:, :, None]
    scale64 = xd.abs().amax(dim=-1, keepdim=True).clamp(min=torch.tensor(eps, dtype=fp32).item()) / 448
    assert (s >= scale64 * (1 - 2**-23)).all() and (s <= 2 * scale64).all()
    err = (q.double().view_as(xd) * s - xd).abs()
    bound = xd.abs() * (2**-4 + 2**-20) + s * 2**-10
    assert (err <= bound).all(), float((err - bound).max())


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("dtype", GROUP_QUANT_DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_matches_the_reference_bit_for_bit(tokens, dtype, group_size, layout):
    """7 groups a row: 259 groups at 37 tokens fill several blocks and end in a partial one, and
    the packed layout has padding bytes."""
    x = groups_of(tokens, 7 * group_size, dtype, group_size, seed=tokens + group_size)
    q, scales = per_token_group_quant_fp8(x, group_size, column_major_scales=layout[0], scale_ue8m0=layout[1])
    assert_bit_exact(x, q, scales, group_size, *layout)
    if layout != (True, True):  # float scales
        assert_within_tolerance(x, q, scales, group_size)


@pytest.mark.parametrize("tokens", [0, 1, 3, 4, 5])
@pytest.mark.parametrize("groups", [1, 4, 5])
def test_scale_layouts(tokens, groups):
    x = groups_of(tokens, 16 * groups, bf16, 16, seed=groups)
    _, s = per_token_group_quant_fp8(x, 16)
    assert (s.dtype, s.shape) == (fp32, (tokens, groups)) and s.is_contiguous()
    _, s = per_token_group_quant_fp8(x, 16, scale_ue8m0=True)
    assert (s.dtype, s.shape) == (fp32, (tokens, groups)) and s.is_contiguous()
    _, s = per_token_group_quant_fp8(x, 16, column_major_scales=True)
    assert (s.dtype, s.shape) == (fp32, (tokens, groups))
    assert s.untyped_storage().nbytes() == 4 * groups * align4(tokens)
    _, p = per_token_group_quant_fp8(x, 16, column_major_scales=True, scale_ue8m0=True)
    assert (p.dtype, p.shape) == (i32, (tokens, -(-groups // 4)))
    assert p.untyped_storage().nbytes() == 4 * -(-groups // 4) * align4(tokens)
    if tokens > 0:
        assert s.stride() == p.stride() == (1, align4(tokens))


def test_packed_exponents_and_their_padding_bytes():
    """Byte i of word j is group 4 j + i's exponent byte; the 3 bytes after the 5th group are 0."""
    x = groups_of(3, 5 * 16, bf16, 16, seed=1)
    _, s = per_token_group_quant_fp8(x, 16)
    _, p = per_token_group_quant_fp8(x, 16, column_major_scales=True, scale_ue8m0=True)
    b = p.clone(memory_format=torch.contiguous_format).view(torch.uint8)
    assert b.shape == (3, 8)
    assert torch.equal(b[:, :5], (ue8m0_ceil(s).view(i32) >> 23).to(torch.uint8))
    assert (b[:, 5:] == 0).all()


@pytest.mark.parametrize("ue8m0", [False, True])
def test_only_the_view_of_column_major_scales_is_written(ue8m0):
    """The token padding (tokens 3 of 4) is outside the view and stays as it was."""
    x = groups_of(3, 5 * 16, fp32, 16, seed=2)
    module = _module(fp32, 16, True, ue8m0, False)
    q = torch.empty(3, 80, dtype=fp8)
    storage = torch.full((2 if ue8m0 else 5, 4), -1, dtype=i32 if ue8m0 else fp32)
    scales = storage.t()[:3]
    module.per_token_group_quant_fp8(q, scales, x, 1e-10)
    assert (storage[:, 3] == -1).all()
    assert_bit_exact(x, q, scales, 16, True, ue8m0)


def test_ue8m0_scales_are_the_next_power_of_two():
    x = groups_of(37, 7 * 128, bf16, 128, seed=3)
    _, s = per_token_group_quant_fp8(x, 128)
    _, e = per_token_group_quant_fp8(x, 128, scale_ue8m0=True)
    assert ((e.view(i32) & 0x7FFFFF) == 0).all()
    assert (e >= s).all() and (e < 2 * s).all()
    exact = torch.tensor([2.0**-20, 1.0, 2.0**-127, 1.5, 2.0**-127 * 1.5, 0.0, 1e-45, float("inf")])
    assert torch.equal(ue8m0_ceil(exact),
                       torch.tensor([2.0**-20, 1.0, 2.0**-127, 2.0, 2.0**-126, 2.0**-127, 2.0**-127, float("inf")]))


def test_no_tokens_launches_nothing():
    for layout in LAYOUTS:
        q, s = per_token_group_quant_fp8(torch.empty(0, 256, dtype=bf16), 128, column_major_scales=layout[0],
                                         scale_ue8m0=layout[1])
        assert q.shape == (0, 256) and s.shape[0] == 0


def test_strided_and_misaligned_rows():
    wide = groups_of(9, 832, bf16, 64, seed=4)
    for x in (wide[:, 64:832], wide[::2, :768]):  # 16-byte aligned rows: the vector variant
        for layout in LAYOUTS:
            assert_bit_exact(x, *per_token_group_quant_fp8(x, 128, column_major_scales=layout[0],
                                                           scale_ue8m0=layout[1]), 128, *layout)
    x = wide[:, 3:771]  # rows that start mid-vector: the scalar variant of the same module
    assert_bit_exact(x, *per_token_group_quant_fp8(x, 64), 64)
    x = groups_of(5, 775, fp32, 1, seed=5)[:, :768]  # a row stride of 3100 bytes
    for group_size in GROUP_SIZES:
        assert_bit_exact(x, *per_token_group_quant_fp8(x, group_size), group_size)
    x = groups_of(1, 256, fp16, 16, seed=6).expand(5, 256)  # row stride 0: x is only read
    q, s = per_token_group_quant_fp8(x, 16, column_major_scales=True)
    assert_bit_exact(x, q, s, 16, True)
    assert torch.equal(q.view(torch.uint8)[0], q.view(torch.uint8)[4])


def test_out_is_written_and_returned():
    x = groups_of(4, 512, bf16, 128, seed=7)
    out = torch.full((4, 512), 3.0).to(fp8)
    q, s = per_token_group_quant_fp8(x, 128, column_major_scales=True, out=out)
    assert q is out
    assert_bit_exact(x, out, s, 128, True)
    buf = torch.zeros(4 * 512 + 1, dtype=torch.uint8)
    out = buf[1:].view(fp8).view(4, 512)  # an odd address: the scalar variant's byte stores
    q, s = per_token_group_quant_fp8(x, 128, out=out)
    assert q is out and buf[0] == 0
    assert_bit_exact(x, out, s, 128)


@pytest.mark.parametrize("dtype", GROUP_QUANT_DTYPES, ids=str)
def test_special_groups(dtype):
    """Groups of zeros and of -0.0, with a NaN, with infinities, of the dtype's smallest
    subnormals, holding its largest finite value, and ordinary ones: the reference's bits in
    every layout, and what the docstring says of each."""
    x = groups_of(2, 8 * 32, dtype, 32, seed=8)
    g = x.view(2, 8, 32)
    fi = torch.finfo(dtype)
    g[0, 0] = 0.0
    g[0, 1] = -0.0
    g[0, 2, 5] = float("nan")
    g[0, 3, 1], g[0, 3, 9] = float("inf"), float("-inf")
    g[0, 4] = fi.smallest_normal * fi.eps * torch.arange(-16, 16)  # the 31 smallest subnormals and 0
    g[0, 5, 7] = -fi.max
    for layout in LAYOUTS:
        for eps in (1e-10, 0.0, 1e-3):
            q, s = per_token_group_quant_fp8(x, 32, column_major_scales=layout[0], scale_ue8m0=layout[1], eps=eps)
            assert_bit_exact(x, q, s, 32, *layout, eps=eps)
    q, s = per_token_group_quant_fp8(x, 32)
    qf, qb = q.float().view(2, 8, 32), q.view(torch.uint8).view(2, 8, 32)
    eps32 = torch.tensor(1e-10, dtype=fp32)
    assert s[0, 0] == s[0, 1] == eps32 / 448 and (qf[0, :2] == 0).all()
    assert torch.isnan(s[0, 2]) and (qb[0, 2] == 0x7F).all()
    assert s[0, 3] == float("inf") and (qb[0, 3, [1, 9]] == 0x7F).all() and (qf[0, 3].nan_to_num() == 0).all()
    assert qf[0, 5, 7] == -448
    q, s = per_token_group_quant_fp8(x, 32, eps=0.0)
    assert s[0, 0] == s[0, 1] == 0 and (q.view(torch.uint8).view(2, 8, 32)[0, :2] == 0).all()  # +0, no NaN
    _, s = per_token_group_quant_fp8(x, 32, scale_ue8m0=True, eps=0.0)
    assert s[0, 0] == 2.0**-127


def test_fp32_groups_on_both_sides_of_the_reciprocals_threshold():
    """Scales from 2**-69 (kRecipMinScale) up take the reciprocal, smaller ones the division;
    tiny, subnormal and signed-zero elements under maxima around it, and a scale that underflows
    to 0 (eps 0)."""
    threshold_max = 448 * 2.0**-69
    maxima = torch.tensor([3e38, 1.0, 2.0**-50, threshold_max * 1.0000001, threshold_max, threshold_max * 0.9999999,
                           2.0**-100, 1e-38, 1e-45])
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(len(maxima), 16, generator=gen) * torch.exp2(-torch.randint(0, 150, (len(maxima), 16),
                                                                                  generator=gen).float())
    x[:, :4] = torch.tensor([0.0, -0.0, 1e-45, -1e-42])
    x = x / x.abs().amax(dim=1, keepdim=True) * maxima[:, None] * 0.5
    x[:, 4] = maxima
    for eps in (0.0, 1e-30):
        for layout in LAYOUTS:
            q, s = per_token_group_quant_fp8(x, 16, column_major_scales=layout[0], scale_ue8m0=layout[1], eps=eps)
            assert_bit_exact(x, q, s, 16, *layout, eps=eps)


def test_the_group_maximum_saturates_to_448():
    x = groups_of(3, 4 * 128, bf16, 128, seed=10)
    q, _ = per_token_group_quant_fp8(x, 128)
    qf, xf = q.float().view(3, 4, 128), x.float().view(3, 4, 128)
    arg = xf.abs().argmax(dim=-1, keepdim=True)
    assert (qf.gather(-1, arg).abs() == 448).all()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(tokens=st.integers(0, 9), groups=st.integers(1, 6), dtype=st.sampled_from(GROUP_QUANT_DTYPES),
       group_size=st.sampled_from(GROUP_SIZES), layout=st.sampled_from(LAYOUTS),
       eps=st.sampled_from([0.0, 1e-10, 1e-4, 1.0]), offset=st.sampled_from([0, 1, 8]),
       specials=st.lists(st.sampled_from([0.0, -0.0, float("inf"), float("nan"), 1e-40, 448.0, -1e4]), max_size=4),
       seed=st.integers(0, 2**16))
def test_any_call_matches_the_reference(tokens, groups, dtype, group_size, layout, eps, offset, specials, seed):
    """Rows of any magnitudes, a few special values anywhere, rows at any element offset in a
    wider buffer (the scalar variant where it is not 16 bytes), any layout and eps."""
    hidden = groups * group_size
    base = groups_of(tokens, hidden + 16, dtype, 1, seed=seed)
    x = base[:, offset:offset + hidden]
    gen = torch.Generator().manual_seed(seed)
    for value in specials:
        if tokens:
            x[torch.randint(tokens, (), generator=gen), torch.randint(hidden, (), generator=gen)] = value
    q, s = per_token_group_quant_fp8(x, group_size, column_major_scales=layout[0], scale_ue8m0=layout[1], eps=eps)
    assert_bit_exact(x, q, s, group_size, *layout, eps=eps)


# ------------------------------------------------------------------------------------------
# Custom ops, tracing and specializations


def test_custom_ops_their_schemas_and_opcheck():
    x = groups_of(3, 256, bf16, 128, seed=11)
    q, s = torch.ops.kernkit.per_token_group_quant_fp8(x, 128, column_major_scales=True, scale_ue8m0=True)
    assert_bit_exact(x, q, s, 128, True, True)
    out = torch.empty(3, 256, dtype=fp8)
    s = torch.ops.kernkit.per_token_group_quant_fp8_out(out, x, 64)
    assert_bit_exact(x, out, s, 64)
    schema = str(torch.ops.kernkit.per_token_group_quant_fp8_out.default._schema)
    assert schema == ("kernkit::per_token_group_quant_fp8_out(Tensor(a0!) out, Tensor x, SymInt group_size=128, *, "
                      "bool column_major_scales=False, bool scale_ue8m0=False, float eps=1e-10) -> Tensor")
    for layout in LAYOUTS:
        torch.library.opcheck(torch.ops.kernkit.per_token_group_quant_fp8.default, (x, 128),
                              dict(column_major_scales=layout[0], scale_ue8m0=layout[1]))


def test_torch_compile_fullgraph_matches_the_reference():
    def fn(x, out):
        q1, s1 = per_token_group_quant_fp8(x, 128, column_major_scales=True)
        q2, s2 = per_token_group_quant_fp8(x, 64, scale_ue8m0=True, out=out)
        return q1, s1, q2, s2

    x = groups_of(5, 256, bf16, 64, seed=12)
    out = torch.empty(5, 256, dtype=fp8)
    q1, s1, q2, s2 = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, out)
    assert_bit_exact(x, q1, s1, 128, True)
    assert_bit_exact(x, q2, s2, 64, False, True)
    assert torch.equal(out.view(torch.uint8), q2.view(torch.uint8))


def test_specializations_describe_the_builds():
    op = next(op for op in registered_ops() if op.qualname == "kernkit::per_token_group_quant_fp8")
    specs = op.specializations(dtypes=[bf16, fp16, bf16], hidden_size=4096, backend="emu")
    assert [s.title for s in specs] == ["per_token_group_quant_fp8<bf16_t, 128, false, false, false>",
                                        "per_token_group_quant_fp8<fp16_t, 128, false, false, false>"]
    assert all(isinstance(s, JitSpec) and s.backend == "emu" for s in specs)
    specs = op.specializations(dtypes=[fp32], group_size=64, column_major_scales="true", scale_ue8m0=1, backend="emu")
    assert [s.title for s in specs] == ["per_token_group_quant_fp8<fp32_t, 64, true, true, false>"]
    with pytest.raises(ValueError, match="'group_size'"):
        op.specializations(dtypes=[bf16], group_size=96)


# ------------------------------------------------------------------------------------------
# Bad calls: a clear exception naming the argument, and nothing written


@pytest.mark.parametrize("group_size", [0, 8, 96, 256, -128])
def test_group_sizes_without_a_kernel_are_refused_naming_group_size(group_size):
    with pytest.raises(ValueError, match=rf"^'group_size': expected one of 16, 32, 64, 128, got {group_size}$"):
        per_token_group_quant_fp8(torch.ones(2, 256, dtype=bf16), group_size)


@pytest.mark.parametrize("name, value", [("group_size", 128.0), ("group_size", True), ("column_major_scales", 1),
                                         ("scale_ue8m0", "yes"), ("scale_ue8m0", None)])
def test_arguments_of_the_wrong_type_are_type_errors(name, value):
    per_token_group_quant_fp8(torch.ones(2, 256, dtype=bf16), 128, column_major_scales=True)  # cached: 1 == True
    kwargs = {"group_size": 128, "column_major_scales": True, "scale_ue8m0": False, name: value}
    got = repr(value) if name == "group_size" else type(value).__name__
    with pytest.raises(TypeError, match=rf"^'{name}': expected (an int64|a bool), got {got}$"):
        per_token_group_quant_fp8(torch.ones(2, 256, dtype=bf16), **kwargs)


def test_unsupported_dtype_is_a_type_error():
    with pytest.raises(TypeError, match=r"^'x': unsupported dtype torch.float64; supported: float16, bfloat16, "
                                        r"float32$"):
        per_token_group_quant_fp8(torch.zeros(2, 128, dtype=torch.float64))


def test_bad_x_out_and_eps_name_the_argument_and_write_nothing():
    x = groups_of(4, 256, bf16, 128)
    cases = [
        (dict(x=x[:, :200]), ValueError,
         r"^'x': expected a hidden size \(last dimension\) that is a multiple of group_size 128, got 200$"),
        (dict(x=x[0]), ValueError, r"^'x': expected a 2-d \[tokens, hidden\] tensor, got 1-d$"),
        (dict(x=x.view(2, 2, 256)), ValueError, r"^'x': expected a 2-d"),
        (dict(x=x.t().contiguous().t()), ValueError, r"^'x': stride"),
        (dict(out=torch.zeros(4, 256, dtype=fp16)), TypeError, r"^'out': expected dtype float8_e4m3fn, got float16$"),
        (dict(out=torch.zeros(5, 256, dtype=fp8)), ValueError, r"^'out': dimension 0"),
        (dict(out=torch.zeros(4, 128, dtype=fp8)), ValueError, r"^'out': dimension 1"),
        (dict(out=torch.zeros(256, 4, dtype=fp8).t()), ValueError, r"^'out': expected a contiguous tensor"),
        (dict(eps=-1e-10), ValueError, r"^'eps': expected a finite value >= 0"),
        (dict(eps=float("nan")), ValueError, r"^'eps': expected a finite value >= 0"),
        (dict(eps=1e300), ValueError, r"^'eps': expected a finite value >= 0, got inf$"),
    ]
    for change, exc, msg in cases:
        args = dict(x=x, group_size=128, out=torch.full((4, 256), 1.0).to(fp8), eps=1e-10)
        args.update(change)
        before = args["out"].view(torch.uint8).clone()
        with pytest.raises(exc, match=msg):
            per_token_group_quant_fp8(args.pop("x"), args.pop("group_size"), **args)
        assert torch.equal(args["out"].view(torch.uint8), before), change


def test_out_sharing_memory_with_x_is_refused():
    buf = torch.zeros(4 * 256 * 2 + 64, dtype=torch.uint8)
    x = buf[:2048].view(bf16).view(4, 256)
    x.copy_(groups_of(4, 256, bf16, 128))
    before = buf.clone()
    out = buf[1024:2048].view(fp8).view(4, 256)  # the second half of x's bytes
    with pytest.raises(ValueError, match=r"^'out' and 'x' overlap in memory"):
        per_token_group_quant_fp8(x, out=out)
    assert torch.equal(buf, before)


# ----- the kernel-hash cases (python -m kernkit.testing.hashes)


def group_quant_input(dtype: torch.dtype, tokens: int, width: int, group_size: int, gen: torch.Generator,
                      specials: bool) -> torch.Tensor:
    """Normal values, each group of its own magnitude; with ``specials``, row 0's groups are
    zeros, -0.0, one NaN, two infinities, subnormals and the dtype's largest finite value (the
    kernel writes one NaN for all: 0x7fffffff scales, 0x7f values)."""
    span = 10 if dtype == torch.float16 else 20
    groups = width // group_size
    mag = torch.exp2(torch.randint(-span, span + 1, (tokens, groups, 1), generator=gen).float())
    x = (torch.randn(tokens, groups, group_size, generator=gen) * mag).to(dtype)
    if specials:
        fi = torch.finfo(dtype)
        x[0, 0] = 0.0
        x[0, 1] = -0.0
        x[0, 2, 3] = float("nan")
        x[0, 3, 1], x[0, 3, 2] = float("inf"), float("-inf")
        x[0, 4] = fi.smallest_normal * fi.eps * torch.arange(group_size)
        x[0, 5, 0] = -fi.max
    return x.view(tokens, width)


def group_quant_case(dtype: torch.dtype, group_size: int, tokens: int, groups: int, *, column_major: bool = False,
                     ue8m0: bool = False, offset: int = 0, specials: bool = False, eps: float = 1e-10) -> Case:
    """``per_token_group_quant_fp8`` of ``tokens`` rows of ``groups`` groups. ``offset``: the rows
    are ``x[:, offset : offset + hidden]`` of a buffer ``2 * offset`` wider (odd: the scalar
    variant); the scales are hashed as their view (the column-major padding is not written)."""
    layout = ("col" if column_major else "row") + ("-ue8m0" if ue8m0 else "")
    name = (f"per_token_group_quant_fp8/{SHORT[dtype]}-g{group_size}-t{tokens}-n{groups}-{layout}"
            + (f"-offset{offset}" if offset else "") + ("-specials" if specials else "")
            + (f"-eps{eps:g}" if eps != 1e-10 else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        hidden = groups * group_size
        base = group_quant_input(dtype, tokens, hidden + 2 * offset, 1 if offset else group_size, gen, specials)
        x = base[:, offset : offset + hidden]
        want_q, want_scales = ref_per_token_group_quant_fp8(x, group_size, column_major, ue8m0, eps)
        x_d = to_device(base, device)[:, offset : offset + hidden]
        q, scales = ops.per_token_group_quant_fp8(x_d, group_size, column_major_scales=column_major,
                                                  scale_ue8m0=ue8m0, eps=eps)
        if scales.stride() != want_scales.stride():
            raise AssertionError(f"{name}: scales of strides {scales.stride()}, want {want_scales.stride()}")
        return {"q": (q.cpu(), want_q), "scales": (scales.cpu(), want_scales)}

    return Case(name, "quant/per_token_group_quant_fp8.cuh", run)


def hash_cases() -> list[Case]:
    """Each dtype and scale layout: bf16 x 128 (16 lanes a group, several blocks), fp16 x 64
    column-major, fp32 x 16 packed UE8M0 (a padding byte), bf16 x 128 row-major UE8M0, bf16 x 32
    rows at an odd offset (the scalar variant), and bf16 x 16 special groups with eps 0."""
    return [
        group_quant_case(bf16, 128, 33, 8),
        group_quant_case(fp16, 64, 9, 10, column_major=True),
        group_quant_case(fp32, 16, 5, 7, column_major=True, ue8m0=True),
        group_quant_case(bf16, 128, 7, 7, ue8m0=True),
        group_quant_case(bf16, 32, 7, 8, column_major=True, ue8m0=True, offset=3),
        group_quant_case(bf16, 16, 3, 8, specials=True, eps=0.0),
    ]


# ----- invalid calls: one bad argument at a time, nothing written (kernkit.testing.invalid)

GQ_DTYPES = [bf16, fp32]  # x group size 16 x the four scale layouts: 8 of the builds above
GQ_GROUP = 16
GQ_HIDDEN = 48  # 3 groups: the packed UE8M0 word has a padding byte
GQ_LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]


@st.composite
def group_quant_params(draw):
    return dict(
        dtype=draw(st.sampled_from(GQ_DTYPES)),
        tokens=draw(st.sampled_from([0, 1, 3, 7])),
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        layout=draw(st.sampled_from(GQ_LAYOUTS)),
        eps=draw(st.sampled_from([1e-10, 0.0, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def group_quant_args(a: Arena, p: dict) -> dict:
    x, out = quant.quant_x_out(a, p, GQ_HIDDEN)
    return dict(x=x, group_size=GQ_GROUP, column_major_scales=p["layout"][0], scale_ue8m0=p["layout"][1],
                eps=p["eps"], out=out)


_GQ_X_BAD, _GQ_OUT_BAD = quant.quant_io_bad(GQ_HIDDEN, [-16, 1, 16], (3, 16))
GROUP_QUANT_BAD = _GQ_X_BAD + [
    Bad("x", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(), (GQ_HIDDEN,), (p["tokens"], 1, GQ_HIDDEN)])),
                                 p["dtype"])),
    Bad("x", "hidden size not a multiple of group_size", ValueError,
        lambda a, p, d: a.tensor((max(p["tokens"], 1), d.draw(st.sampled_from([8, 40, 50]))), p["dtype"])),
    Bad("group_size", "no kernel", ValueError, lambda a, p, d: d.draw(st.sampled_from([0, 8, 12, 96, 256, -16]))),
    Bad("group_size", "not an int", TypeError, lambda a, p, d: d.draw(st.sampled_from([16.0, "16", None, True]))),
    Bad("column_major_scales", "not a bool", TypeError,
        lambda a, p, d: d.draw(st.sampled_from([1, 0, "yes", None, 1.0]))),
    Bad("scale_ue8m0", "not a bool", TypeError, lambda a, p, d: d.draw(st.sampled_from([1, 0, "yes", None, 1.0]))),
    Bad("eps", "negative or not finite", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([-1e-10, -1.0, float("nan"), float("inf"), 1e300]))),
    Bad("eps", "not a number", TypeError, lambda a, p, d: d.draw(st.sampled_from(["1e-10", None, [1e-10], 1j]))),
] + _GQ_OUT_BAD

#: The kinds torch's own schema checks refuse before kernkit could name the argument.
GQ_NOT_VIA_CUSTOM_OP = ("meta tensor", "not a tensor", "negative bit", "not an int", "not a bool", "not a number")


@invalid_calls(GROUP_QUANT_BAD, group_quant_params())
def test_per_token_group_quant_fp8_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = quant.quant_bad_args(a, p, bad, d, group_quant_args)
    if via == "custom op" and bad.what not in GQ_NOT_VIA_CUSTOM_OP:
        flags = dict(column_major_scales=args["column_major_scales"], scale_ue8m0=args["scale_ue8m0"], eps=args["eps"])
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.per_token_group_quant_fp8(args["x"], args["group_size"], **flags),
                          a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.per_token_group_quant_fp8_out(args["out"], args["x"],
                                                                                  args["group_size"], **flags), a, bad)
    else:
        check_invalid(lambda: ops.per_token_group_quant_fp8(**args), a, bad)


@VALID
@given(p=group_quant_params())
def test_per_token_group_quant_fp8_valid_views_give_the_reference(p):
    """Misaligned starts and row strides (the scalar variant), repeated rows (stride 0: x is only
    read), no rows, a misaligned ``out``, every scale layout, eps 0: the reference's bytes and
    scale strides, and nothing else written."""
    a = Arena.seeded(p["seed"])
    args = group_quant_args(a, p)
    want = a.copies()
    want_q, want_scales = ref_per_token_group_quant_fp8(args["x"], GQ_GROUP, *p["layout"], p["eps"])
    if args["out"] is not None:
        a.twin(args["out"], want).view(torch.uint8).copy_(want_q.view(torch.uint8))
    q, scales = ops.per_token_group_quant_fp8(**args)
    if args["out"] is not None:
        assert q is args["out"]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert p["tokens"] == 0 or scales.stride() == want_scales.stride()
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    assert a.same_as(want)
