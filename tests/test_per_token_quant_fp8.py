"""kernkit.ops.per_token_quant_fp8 on CPU tensors, through the CPU emulator: the kernel template
the GPU runs, bit-exact against the fp32 torch reference (kernkit/testing/oracle.py), within the
documented error of a float64 computation, its special rows (zeros, NaN, inf, saturation), its
layouts (strided and misaligned rows, other ranks, ``out=``), its errors, and its custom ops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops import per_token_quant_fp8, registered_ops
from kernkit.ops.per_token_quant_fp8 import _outputs as per_token_quant_fp8_outputs
from kernkit.testing.invalid import VALID, Arena, check_invalid, invalid_calls
from kernkit.testing.ops.per_token_quant_fp8 import (
    QUANT_BAD,
    QUANT_HIDDEN,
    bf16,
    fp8,
    fp16,
    fp32,
    quant_bad_args,
    quant_x_out,
    ref_per_token_quant_fp8,
    rows,
    scales_view,
)

# The specializations built here (each an emulator build of a few seconds):
#  (bf16, 5120): 160 threads, a CTA reduction over 5 warps, 16-byte loads and 8-byte fp8 stores;
#  (bf16, 1000): one warp, the last vectors guarded, and the scalar variant for misaligned rows;
#  (fp16, 7):    an odd row, the scalar variant only;
#  (fp32, 100):  4 fp32 per load, one fp8x4 store.
SHAPES = [(bf16, 5120), (bf16, 1000), (fp16, 7), (fp32, 100)]


def assert_bit_exact(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> None:
    want_q, want_scales = ref_per_token_quant_fp8(x)
    assert q.dtype == fp8 and q.shape == x.shape and q.is_contiguous()
    assert scales.dtype == fp32 and scales.shape == (*x.shape[:-1], 1)
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


def assert_within_tolerance(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> None:
    """The docstring's bound against float64: the scale within one fp32 rounding of max|x| / 448;
    ``q * scale`` within half an E4M3 step of ``x`` (2**-4 relative, or 2**-10 * scale where
    E4M3 is subnormal), plus the fp32 roundings."""
    xd = x.double()
    scale64 = xd.abs().amax(dim=-1, keepdim=True) / 448
    assert ((scales.double() - scale64).abs() <= scale64 * 2**-23).all()
    err = (q.double() * scales.double() - xd).abs()
    bound = xd.abs() * (2**-4 + 2**-20) + scales.double() * 2**-10
    assert (err <= bound).all(), float((err - bound).max())


@pytest.mark.parametrize("dtype,hidden", SHAPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_matches_the_reference_bit_for_bit(dtype, hidden, tokens):
    x = rows(tokens, hidden, dtype, seed=tokens)
    q, scales = per_token_quant_fp8(x)
    assert_bit_exact(x, q, scales)
    assert_within_tolerance(x, q, scales)


def test_no_tokens_launches_nothing():
    q, scales = per_token_quant_fp8(torch.empty(0, 1000, dtype=bf16))
    assert q.shape == (0, 1000) and scales.shape == (0, 1)


def test_strided_rows_of_a_wider_tensor():
    wide = rows(9, 6000, bf16, seed=5)
    for x in (wide[:, :5120], wide[:, 16:5136], wide[::2, 800:5920]):  # 16-byte aligned rows
        assert_bit_exact(x, *per_token_quant_fp8(x))
    x = wide[:, 3:1003]  # rows that start mid-vector: the scalar variant of the same module
    assert_bit_exact(x, *per_token_quant_fp8(x))
    x = rows(1, 1001, bf16)[:, 1:]  # one misaligned row
    assert_bit_exact(x, *per_token_quant_fp8(x))


def test_repeated_rows_are_read_like_any_rows():
    x = rows(1, 100, fp32).expand(5, 100)  # row stride 0: x is only read
    q, scales = per_token_quant_fp8(x)
    assert_bit_exact(x, q, scales)
    assert torch.equal(q.view(torch.uint8)[0], q.view(torch.uint8)[4])


def test_other_ranks_are_rows_of_the_last_dimension():
    x3 = rows(6, 7, fp16, seed=3).reshape(2, 3, 7)
    assert_bit_exact(x3, *per_token_quant_fp8(x3))
    x4 = rows(6, 7, fp16, seed=5).reshape(3, 1, 2, 7)
    assert_bit_exact(x4, *per_token_quant_fp8(x4))
    x3t = rows(6, 7, fp16, seed=4).reshape(3, 2, 7).transpose(0, 1)  # leading dims not collapsible
    with pytest.raises(ValueError, match=r"^'x': the leading dimensions .* do not collapse"):
        per_token_quant_fp8(x3t)
    assert_bit_exact(x3t, *per_token_quant_fp8(x3t.contiguous()))
    x1 = rows(1, 7, fp16, seed=6)[0]
    q, scales = per_token_quant_fp8(x1)
    assert q.shape == (7,) and scales.shape == (1,)
    assert_bit_exact(x1, q, scales)
    out = torch.zeros(2, 3, 7, dtype=fp8)
    q, _ = per_token_quant_fp8(x3, out=out)
    assert q is out and torch.equal(out.view(torch.uint8), ref_per_token_quant_fp8(x3)[0].view(torch.uint8))


def test_out_is_written_and_returned():
    x = rows(4, 5120, bf16, seed=9)
    out = torch.full((4, 5120), 3.0).to(fp8)
    q, scales = per_token_quant_fp8(x, out=out)
    assert q is out
    assert_bit_exact(x, out, scales)


def test_zero_rows_get_scale_zero_and_q_zero_without_nan():
    x = rows(4, 1000, bf16)
    x[1] = 0.0
    x[2] = -0.0
    q, scales = per_token_quant_fp8(x)
    assert_bit_exact(x, q, scales)
    assert scales[1].item() == 0.0 and scales[2].item() == 0.0
    assert (q.view(torch.uint8)[1:3] == 0).all()  # +0 everywhere, -0 rows included
    assert not torch.isnan(q.float()).any()


def test_fp32_row_whose_scale_underflows_is_zero():
    x = torch.full((2, 100), 1e-45)  # the smallest subnormal: 1e-45 / 448 rounds to 0
    x[1] = 1e-42  # about 714 times the smallest subnormal: the scale is 2 of them
    q, scales = per_token_quant_fp8(x)
    assert_bit_exact(x, q, scales)
    assert scales[0].item() == 0.0 and (q.view(torch.uint8)[0] == 0).all()
    assert scales[1].item() > 0.0  # a subnormal scale, so x / scale is far from 448
    assert (q.float()[1] > 0).all() and (q.float()[1] < 448).all()


def test_rows_of_every_magnitude_match_the_reference_on_both_ways_to_divide():
    # Rows above a scale of 2**-69 divide through the row's reciprocal, the others by IEEE
    # division; both must give the reference's bits. Every finite bf16 value (its zeros and
    # subnormals included) is an element of rows whose maxima span the dtype, and fp32 rows put
    # tiny, subnormal and signed-zero elements under maxima on both sides of the threshold.
    finite = torch.arange(0, 2**16, dtype=torch.int32).to(torch.int16).view(bf16)
    finite = finite[torch.isfinite(finite)]
    hidden = 1000
    vals = finite[torch.randperm(finite.numel(), generator=torch.Generator().manual_seed(0))]
    vals = vals[: vals.numel() // hidden * hidden].view(-1, hidden).clone()
    q, scales = per_token_quant_fp8(vals)
    assert_bit_exact(vals, q, scales)

    threshold_max = 448 * 2.0**-69
    maxima = torch.tensor([3e38, 1.0, 2.0**-50, threshold_max * 1.0000001, threshold_max,
                           threshold_max * 0.9999999, 2.0**-100, 1e-38])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(len(maxima), 100, generator=gen) * torch.exp2(-torch.randint(0, 150, (len(maxima), 100),
                                                                                   generator=gen).float())
    x[:, :4] = torch.tensor([0.0, -0.0, 1e-45, -1e-42])
    x = x / x.abs().amax(dim=1, keepdim=True) * maxima[:, None] * 0.5
    x[:, 4] = maxima
    q, scales = per_token_quant_fp8(x)
    assert_bit_exact(x, q, scales)
    assert torch.equal(q.view(torch.uint8)[:, 1], torch.full((len(maxima),), 0x80, dtype=torch.uint8))  # -0 stays -0


def test_the_row_maximum_saturates_to_448():
    x = rows(3, 5120, bf16, seed=2)
    q, scales = per_token_quant_fp8(x)
    assert_bit_exact(x, q, scales)
    qf = q.float()
    arg = x.float().abs().argmax(dim=-1)
    assert (qf.gather(1, arg[:, None]).abs() == 448).all()
    assert qf.abs().max() == 448


def test_nan_makes_the_scale_and_the_whole_row_nan():
    x = rows(3, 1000, bf16)
    x[1, 17] = float("nan")
    x[1, 18] = float("inf")
    q, scales = per_token_quant_fp8(x)
    assert torch.isnan(scales[1]).all() and torch.isnan(q.float()[1]).all()
    keep = torch.tensor([0, 2])
    assert_bit_exact(x[keep], q[keep], scales[keep])


def test_inf_makes_the_scale_inf_finite_values_zero_and_infinities_nan():
    x = rows(2, 1000, bf16)
    x[0, 5] = float("inf")
    x[0, 9] = float("-inf")
    q, scales = per_token_quant_fp8(x)
    assert scales[0].item() == float("inf")
    qf = q.float()[0]
    assert torch.isnan(qf[[5, 9]]).all()
    finite = torch.ones(1000, dtype=torch.bool)
    finite[[5, 9]] = False
    assert (qf[finite] == 0).all()
    assert torch.equal(q.view(torch.uint8)[0, finite], ref_per_token_quant_fp8(x)[0].view(torch.uint8)[0, finite])
    assert_bit_exact(x[1:], q[1:], scales[1:])


def test_unsupported_dtype_is_a_type_error():
    msg = r"^'x': unsupported dtype torch.float64; supported: float16, bfloat16, float32$"
    with pytest.raises(TypeError, match=msg):
        per_token_quant_fp8(torch.zeros(2, 8, dtype=torch.float64))


def test_bad_hidden_sizes_and_ranks_are_value_errors():
    with pytest.raises(ValueError, match=r"^'x': the hidden size \(last dimension\) must be in \[1, 1048576\], got 0$"):
        per_token_quant_fp8(torch.zeros(2, 0, dtype=bf16))
    with pytest.raises(ValueError, match=r"^'x': expected a \[\.\.\., hidden\] tensor, got 0-d$"):
        per_token_quant_fp8(torch.tensor(1.0))


def test_bad_out_and_x_name_the_argument_and_write_nothing():
    x = rows(4, 1000, bf16)
    x_before = x.clone()
    cases = [
        (x, torch.zeros(4, 1000, dtype=fp16), TypeError, r"^'out': expected dtype float8_e4m3fn, got float16$"),
        (x, torch.zeros(4, 999, dtype=fp8), ValueError, r"'out'"),
        (x, torch.zeros(5, 1000, dtype=fp8), ValueError, r"'out'"),
        (x, torch.zeros(1000, 4, dtype=fp8).t(), ValueError, r"^'out': expected a contiguous last dimension"),
        (x, torch.zeros(4, 1016, dtype=fp8)[:, :1000], ValueError, r"^'out': expected contiguous rows"),
        (x.t().contiguous().t(), None, ValueError, r"'x'"),  # columns of a transposed buffer
    ]
    for xx, out, exc, msg in cases:
        before = None if out is None else out.view(torch.uint8).clone()
        with pytest.raises(exc, match=msg):
            per_token_quant_fp8(xx, out=out)
        if out is not None:
            assert torch.equal(out.view(torch.uint8), before)
    assert torch.equal(x, x_before)


def test_out_sharing_memory_with_x_is_refused():
    buf = torch.zeros(4 * 1000 * 2 + 64, dtype=torch.uint8)
    x = buf[:8000].view(bf16).view(4, 1000)
    x.copy_(rows(4, 1000, bf16))
    before = buf.clone()
    out = buf[4000:8000].view(fp8).view(4, 1000)  # the second half of x's bytes
    with pytest.raises(ValueError, match=r"^'out' and 'x' overlap in memory"):
        per_token_quant_fp8(x, out=out)
    assert torch.equal(buf, before)


def test_custom_ops_and_their_schemas():
    x = rows(3, 1000, bf16, seed=1)
    q, scales = torch.ops.kernkit.per_token_quant_fp8(x)
    assert_bit_exact(x, q, scales)
    out, scales2 = torch.empty(3, 1000, dtype=fp8), torch.empty(3, 1)
    assert torch.ops.kernkit.per_token_quant_fp8_out(out, scales2, x) is None
    assert_bit_exact(x, out, scales2)
    schema = str(torch.ops.kernkit.per_token_quant_fp8_out.default._schema)
    assert schema == "kernkit::per_token_quant_fp8_out(Tensor(a0!) out, Tensor(a1!) out_scales, Tensor x) -> ()"


def test_out_scales_is_written_and_returned():
    x = rows(3, 1000, bf16, seed=2)
    out, out_scales = torch.empty(3, 1000, dtype=fp8), torch.full((3, 1), 7.0)
    q, scales = per_token_quant_fp8(x, out=out, out_scales=out_scales)
    assert q is out and scales is out_scales
    assert_bit_exact(x, q, scales)
    q, scales = per_token_quant_fp8(x, out_scales=torch.zeros(3, 1))  # q allocated, the scales given
    assert_bit_exact(x, q, scales)


def test_torch_compile_fullgraph_with_and_without_out_matches_the_reference():
    def fn(x, out, out_scales):
        q1, s1 = per_token_quant_fp8(x)
        q2, s2 = per_token_quant_fp8(x, out=out)
        q3, s3 = per_token_quant_fp8(x, out_scales=out_scales)
        return q1, s1, q2, s2, q3, s3

    x = rows(3, 1000, bf16, seed=7)
    out, out_scales = torch.empty(3, 1000, dtype=fp8), torch.empty(3, 1)
    q1, s1, q2, s2, q3, s3 = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, out, out_scales)
    for q, s in ((q1, s1), (q2, s2), (q3, s3)):
        assert_bit_exact(x, q, s)
    assert torch.equal(out.view(torch.uint8), q1.view(torch.uint8))
    assert torch.equal(out_scales, s1)


def test_specializations_describe_the_builds():
    op = next(op for op in registered_ops() if op.qualname == "kernkit::per_token_quant_fp8")
    specializations = op.specializations
    specs = specializations(dtypes=[bf16, fp16, bf16], hidden_size=4096, intermediate_size=14336, num_heads=32,
                            backend="emu")
    assert [s.title for s in specs] == [
        "per_token_quant_fp8<bf16_t, 4096, false>", "per_token_quant_fp8<bf16_t, 14336, false>",
        "per_token_quant_fp8<fp16_t, 4096, false>", "per_token_quant_fp8<fp16_t, 14336, false>"]
    assert all(isinstance(s, JitSpec) and s.backend == "emu" for s in specs)
    with pytest.raises(TypeError, match="unsupported dtype"):
        specializations(dtypes=[torch.int8], hidden_size=4096)
    with pytest.raises(TypeError, match="hidden_size"):
        specializations(dtypes=[bf16])


QUANT_DTYPES = [bf16, fp32]  # two of the three builds, all of hidden QUANT_HIDDEN; fp16 is the same template


@st.composite
def quant_params(draw):
    return dict(
        dtype=draw(st.sampled_from(QUANT_DTYPES)),
        tokens=draw(st.sampled_from([0, 1, 3, 7])),
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        out_scales=draw(st.sampled_from([None, "given"])),
        seed=draw(st.integers(0, 2**16)),
    )


def quant_args(a: Arena, p: dict) -> dict:
    x, out = quant_x_out(a, p, QUANT_HIDDEN)
    return dict(x=x, out=out, out_scales=p["out_scales"] and scales_view(a, p["tokens"], 1, fp32, False))


@invalid_calls(QUANT_BAD, quant_params())
def test_per_token_quant_fp8_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = quant_bad_args(a, p, bad, d, quant_args)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit"):
        if args["out"] is None and args["out_scales"] is None:
            check_invalid(lambda: torch.ops.kernkit.per_token_quant_fp8(args["x"]), a, bad)
        else:  # the _out op takes every output: the ones not given, as the op would allocate them
            check_invalid(lambda: torch.ops.kernkit.per_token_quant_fp8_out(
                *per_token_quant_fp8_outputs(args["x"], out=args["out"], out_scales=args["out_scales"]), args["x"]),
                a, bad)
    else:
        check_invalid(lambda: ops.per_token_quant_fp8(**args), a, bad)


@VALID
@given(p=quant_params())
def test_per_token_quant_fp8_valid_views_give_the_reference(p):
    """Misaligned starts and row strides (the scalar variant), repeated rows (stride 0: x is only
    read), no rows, a misaligned ``out``: the reference's bytes, and nothing else written."""
    a = Arena.seeded(p["seed"])
    args = quant_args(a, p)
    want = a.copies()
    want_q, want_scales = ref_per_token_quant_fp8(args["x"])
    if args["out"] is not None:
        a.twin(args["out"], want).view(torch.uint8).copy_(want_q.view(torch.uint8))
    if args["out_scales"] is not None:
        a.twin(args["out_scales"], want).copy_(want_scales)
    q, scales = ops.per_token_quant_fp8(**args)
    if args["out"] is not None:
        assert q is args["out"]
    if args["out_scales"] is not None:
        assert scales is args["out_scales"]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    assert a.same_as(want)
