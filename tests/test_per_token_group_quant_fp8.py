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
    _outputs,
    per_token_group_quant_fp8_spec,
)
from kernkit.testing.invalid import VALID, Arena, check_invalid, invalid_calls
from kernkit.testing.ops import per_token_quant_fp8 as quant
from kernkit.testing.ops.per_token_group_quant_fp8 import (
    GQ_HIDDEN,
    GROUP_QUANT_BAD,
    bf16,
    fp8,
    fp16,
    fp32,
    group_scales_layout,
    ref_per_token_group_quant_fp8,
    ue8m0_ceil,
)

i32 = torch.int32

#: (column_major_scales, scale_ue8m0): the four scale layouts.
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]

LAYOUT_IDS = ["row", "row-ue8m0", "col", "col-ue8m0"]


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


def test_custom_ops_their_schemas_and_opcheck():
    x = groups_of(3, 256, bf16, 128, seed=11)
    q, s = torch.ops.kernkit.per_token_group_quant_fp8(x, 128, column_major_scales=True, scale_ue8m0=True)
    assert_bit_exact(x, q, s, 128, True, True)
    out, s = torch.empty(3, 256, dtype=fp8), torch.empty(3, 4)
    assert torch.ops.kernkit.per_token_group_quant_fp8_out(out, s, x, 64) is None
    assert_bit_exact(x, out, s, 64)
    schema = str(torch.ops.kernkit.per_token_group_quant_fp8_out.default._schema)
    assert schema == ("kernkit::per_token_group_quant_fp8_out(Tensor(a0!) out, Tensor(a1!) out_scales, Tensor x, "
                      "SymInt group_size=128, *, bool column_major_scales=False, bool scale_ue8m0=False, "
                      "float eps=1e-10) -> ()")
    for layout in LAYOUTS:
        torch.library.opcheck(torch.ops.kernkit.per_token_group_quant_fp8.default, (x, 128),
                              dict(column_major_scales=layout[0], scale_ue8m0=layout[1]))


def test_torch_compile_fullgraph_matches_the_reference():
    def fn(x, out, out_scales, packed):
        q1, s1 = per_token_group_quant_fp8(x, 128, column_major_scales=True)
        q2, s2 = per_token_group_quant_fp8(x, 64, scale_ue8m0=True, out=out)
        q3, s3 = per_token_group_quant_fp8(x, 64, column_major_scales=True, out_scales=out_scales)
        q4, s4 = per_token_group_quant_fp8(x, 16, column_major_scales=True, scale_ue8m0=True, out=q3.new_empty(5, 256),
                                           out_scales=packed)
        return q1, s1, q2, s2, q3, s3, q4, s4

    x = groups_of(5, 256, bf16, 64, seed=12)
    out = torch.empty(5, 256, dtype=fp8)
    out_scales, packed = torch.empty(4, 8).t()[:5], torch.empty(4, 8, dtype=torch.int32).t()[:5]
    q1, s1, q2, s2, q3, s3, q4, s4 = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, out, out_scales, packed)
    assert_bit_exact(x, q1, s1, 128, True)
    assert_bit_exact(x, q2, s2, 64, False, True)
    assert_bit_exact(x, q3, s3, 64, True)
    assert_bit_exact(x, q4, s4, 16, True, True)
    assert torch.equal(out.view(torch.uint8), q2.view(torch.uint8))
    assert torch.equal(out_scales, s3) and torch.equal(packed, s4)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_scales_is_written_and_returned_and_its_padding_kept(layout):
    x = groups_of(5, 512, bf16, 128, seed=8)
    cols, dtype, column_major = group_scales_layout(4, *layout)
    buf = torch.full((cols, 8) if column_major else (5, cols), 7, dtype=dtype)
    out_scales = buf.t()[:5] if column_major else buf
    q, scales = per_token_group_quant_fp8(x, 128, column_major_scales=layout[0], scale_ue8m0=layout[1],
                                          out_scales=out_scales)
    assert scales is out_scales
    assert_bit_exact(x, q, scales, 128, *layout)
    if column_major:
        assert (buf[:, 5:] == 7).all()  # the padding tokens


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


GQ_DTYPES = [bf16, fp32]  # x group size 16 x the four scale layouts: 8 of the builds above

GQ_GROUP = 16

GQ_LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]


@st.composite
def group_quant_params(draw):
    return dict(
        dtype=draw(st.sampled_from(GQ_DTYPES)),
        tokens=draw(st.sampled_from([0, 1, 3, 7])),
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        out_scales=draw(st.sampled_from([None, "given"])),
        layout=draw(st.sampled_from(GQ_LAYOUTS)),
        eps=draw(st.sampled_from([1e-10, 0.0, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def group_quant_args(a: Arena, p: dict) -> dict:
    x, out = quant.quant_x_out(a, p, GQ_HIDDEN)
    out_scales = p["out_scales"] and quant.scales_view(a, p["tokens"], *group_scales_layout(GQ_HIDDEN // GQ_GROUP,
                                                                                             *p["layout"]))
    return dict(x=x, group_size=GQ_GROUP, column_major_scales=p["layout"][0], scale_ue8m0=p["layout"][1],
                eps=p["eps"], out=out, out_scales=out_scales)


#: The kinds torch's own schema checks refuse before kernkit could name the argument.
GQ_NOT_VIA_CUSTOM_OP = ("meta tensor", "not a tensor", "negative bit", "not an int", "not a bool", "not a number")


@invalid_calls(GROUP_QUANT_BAD, group_quant_params())
def test_per_token_group_quant_fp8_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = quant.quant_bad_args(a, p, bad, d, group_quant_args)
    if via == "custom op" and bad.what not in GQ_NOT_VIA_CUSTOM_OP:
        flags = dict(column_major_scales=args["column_major_scales"], scale_ue8m0=args["scale_ue8m0"], eps=args["eps"])
        if args["out"] is None and args["out_scales"] is None:
            check_invalid(lambda: torch.ops.kernkit.per_token_group_quant_fp8(args["x"], args["group_size"], **flags),
                          a, bad)
        else:  # the _out op takes every output: the ones not given, as the op would allocate them
            def outs():
                return _outputs(args["x"], GQ_GROUP, column_major_scales=flags["column_major_scales"],
                                scale_ue8m0=flags["scale_ue8m0"], out=args["out"], out_scales=args["out_scales"])

            check_invalid(lambda: torch.ops.kernkit.per_token_group_quant_fp8_out(
                *outs(), args["x"], args["group_size"], **flags), a, bad)
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
    if args["out_scales"] is not None:
        a.twin(args["out_scales"], want).copy_(want_scales)
    q, scales = ops.per_token_group_quant_fp8(**args)
    if args["out"] is not None:
        assert q is args["out"]
    if args["out_scales"] is not None:
        assert scales is args["out_scales"]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert p["tokens"] == 0 or scales.stride() == want_scales.stride()
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    assert a.same_as(want)
