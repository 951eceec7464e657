"""kernkit.ops.per_token_quant_fp8 on CPU tensors, through the CPU emulator: the kernel template
the GPU runs, bit-exact against the fp32 torch reference (kernkit/testing/oracle.py), within the
documented error of a float64 computation, its special rows (zeros, NaN, inf, saturation), its
layouts (strided and misaligned rows, other ranks, ``out=``), its errors, and its custom ops."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops import per_token_quant_fp8, registered_ops
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import (
    SHARED,
    VALID,
    Arena,
    Bad,
    check_invalid,
    invalid_calls,
    meta,
    neg_bit,
    requires_grad,
)

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn

# The specializations built here (each an emulator build of a few seconds):
#  (bf16, 5120): 160 threads, a CTA reduction over 5 warps, 16-byte loads and 8-byte fp8 stores;
#  (bf16, 1000): one warp, the last vectors guarded, and the scalar variant for misaligned rows;
#  (fp16, 7):    an odd row, the scalar variant only;
#  (fp32, 100):  4 fp32 per load, one fp8x4 store.
SHAPES = [(bf16, 5120), (bf16, 1000), (fp16, 7), (fp32, 100)]


# ----- the reference: what the kernel must compute


def ref_per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x`` (last dimension, at least one element): ``scale = max|x| / 448`` in fp32
    (a NaN wins the max, as in ``amax``), ``q = saturate_e4m3(x / scale)`` with an fp32 IEEE
    division per element, rounded to nearest even, and ``q = 0`` where ``scale == 0``. Returns
    ``(q, scales)``, ``scales`` shaped ``[*x.shape[:-1], 1]``."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scales = amax / torch.full_like(amax, 448.0)  # elementwise IEEE division, never a reciprocal
    q = torch.where(scales == 0, torch.zeros_like(xf), xf / scales).clamp(-448.0, 448.0)
    return q.to(torch.float8_e4m3fn), scales


def rows(tokens: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Normal rows, each of its own magnitude (2**-20 to 2**20, within the dtype's range)."""
    gen = torch.Generator().manual_seed(seed)
    lo = -12 if dtype == fp16 else -20
    hi = 12 if dtype == fp16 else 20
    mag = torch.exp2(torch.randint(lo, hi + 1, (tokens, 1), generator=gen).float())
    return (torch.randn(tokens, hidden, generator=gen) * mag).to(dtype)


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
    out = torch.empty(3, 1000, dtype=fp8)
    scales2 = torch.ops.kernkit.per_token_quant_fp8_out(out, x)
    assert_bit_exact(x, out, scales2)
    schema = str(torch.ops.kernkit.per_token_quant_fp8_out.default._schema)
    assert schema == "kernkit::per_token_quant_fp8_out(Tensor(a0!) out, Tensor x) -> Tensor"


def test_torch_compile_fullgraph_with_and_without_out_matches_the_reference():
    def fn(x, out):
        q1, s1 = per_token_quant_fp8(x)
        q2, s2 = per_token_quant_fp8(x, out=out)
        return q1, s1, q2, s2

    x = rows(3, 1000, bf16, seed=7)
    out = torch.empty(3, 1000, dtype=fp8)
    q1, s1, q2, s2 = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, out)
    assert_bit_exact(x, q1, s1)
    assert_bit_exact(x, q2, s2)
    assert torch.equal(out.view(torch.uint8), q1.view(torch.uint8))


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


# ----- the kernel-hash cases (python -m kernkit.testing.hashes)


def quant_input(dtype: torch.dtype, tokens: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """Normal rows, each of its own magnitude; where there are rows enough, a zero row, a row of
    -0.0, a row holding the dtype's largest finite value and one holding subnormals. No NaN and
    no infinity: either makes a NaN, whose sign the GPU and the CPU choose differently."""
    span = 10 if dtype == torch.float16 else 20  # fp16 overflows past 65504
    mag = torch.exp2(torch.randint(-span, span + 1, (tokens, 1), generator=gen).float())
    x = (torch.randn(tokens, width, generator=gen) * mag).to(dtype)
    fi = torch.finfo(dtype)
    specials = [0.0, -0.0, None, None]
    for i, value in enumerate(specials[: max(0, tokens - 1)]):
        if value is not None:
            x[i + 1] = value
    if tokens > 3:
        x[3, width // 2] = -fi.max
    if tokens > 4:
        x[4] = x[4].float().mul(fi.tiny).to(dtype)
    if not torch.isfinite(x).all():
        raise AssertionError("per_token_quant_fp8 inputs must be finite")
    return x


def quant_case(dtype: torch.dtype, hidden: int, tokens: int, *, row_pad: int = 0, offset: int = 0,
               out_view: bool = False) -> Case:
    """``per_token_quant_fp8`` of ``tokens`` rows of ``hidden``. ``row_pad``/``offset``: the rows
    are ``x[:, offset : offset + hidden]`` of a ``hidden + row_pad`` wide buffer (an odd offset:
    the scalar variant); ``out_view``: ``out=`` is a view ``hidden`` bytes into a buffer of
    random bytes two rows longer (hashed whole)."""
    name = (f"per_token_quant_fp8/{SHORT[dtype]}-h{hidden}-t{tokens}" + (f"-pad{row_pad}" if row_pad else "")
            + (f"-offset{offset}" if offset else "") + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = quant_input(dtype, tokens, hidden + row_pad, gen)
        x = base[:, offset : offset + hidden]
        want_q, want_scales = ref_per_token_quant_fp8(x)
        x_d = to_device(base, device)[:, offset : offset + hidden]
        if out_view:
            buf = torch.randint(0, 256, ((tokens + 2) * hidden,), dtype=torch.uint8, generator=gen)
            expect = buf.clone()
            expect[hidden : (tokens + 1) * hidden] = want_q.view(torch.uint8).reshape(-1)
            buf_d = to_device(buf, device)
            out = buf_d[hidden : (tokens + 1) * hidden].view(torch.float8_e4m3fn).view(tokens, hidden)
            q, scales = ops.per_token_quant_fp8(x_d, out=out)
            if q.data_ptr() != out.data_ptr():
                raise AssertionError(f"{name}: per_token_quant_fp8(out=...) did not return out")
            return {"q": (buf_d.cpu(), expect), "scales": (scales.cpu(), want_scales)}
        q, scales = ops.per_token_quant_fp8(x_d)
        return {"q": (q.cpu(), want_q), "scales": (scales.cpu(), want_scales)}

    return Case(name, "quant/per_token_quant_fp8.cuh", run)


def hash_cases() -> list[Case]:
    """Four builds: bf16 x 4096 (4 warps), fp16 x 5120 (5 warps), fp32 x 100 (one warp, and the
    scalar variant for misaligned rows), bf16 x 7 (scalar only)."""
    return [
        quant_case(bf16, 4096, 0),
        quant_case(bf16, 4096, 1),
        quant_case(bf16, 4096, 33),
        quant_case(bf16, 4096, 7, row_pad=512, offset=256),
        quant_case(bf16, 4096, 7, out_view=True),
        quant_case(fp16, 5120, 9),
        quant_case(fp16, 5120, 5, row_pad=8, offset=8, out_view=True),
        quant_case(fp32, 100, 513),
        quant_case(fp32, 100, 17, row_pad=3, offset=1),
        quant_case(bf16, 7, 65),
        quant_case(bf16, 7, 9, row_pad=1, offset=1, out_view=True),
    ]


# ----- invalid calls: one bad argument at a time, nothing written (kernkit.testing.invalid)

QUANT_DTYPES = [bf16, fp32]  # two of the three builds, all of hidden QUANT_HIDDEN; fp16 is the same template
QUANT_HIDDEN = 32
fp8 = torch.float8_e4m3fn


@st.composite
def quant_params(draw):
    return dict(
        dtype=draw(st.sampled_from(QUANT_DTYPES)),
        tokens=draw(st.sampled_from([0, 1, 3, 7])),
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        seed=draw(st.integers(0, 2**16)),
    )


def quant_x_out(a: Arena, p: dict, hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fp8 quant ops' ``x`` (``[tokens, hidden]``, laid out as ``p["x_layout"]``, random
    normal values: no NaN bit patterns) and ``out`` (None, or fp8 laid out as ``p["out"]``)."""
    shape = (p["tokens"], hidden)
    x = a.tensor(shape, p["dtype"], p["x_layout"])
    rows = x[:1] if p["x_layout"] == "expand" else x  # every row of an expanded x is row 0
    rows.copy_(torch.randn(rows.shape, generator=a.gen).to(p["dtype"]))
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return x, None if p["out"] is None else a.tensor(shape, fp8, p["out"])


def quant_args(a: Arena, p: dict) -> dict:
    x, out = quant_x_out(a, p, QUANT_HIDDEN)
    return dict(x=x, out=out)


def quant_io_bad(hidden: int, hidden_deltas: list[int], split: tuple[int, int]) -> tuple[list[Bad], list[Bad]]:
    """The bad ``x`` and ``out`` both fp8 quant ops refuse, for rows of ``hidden`` elements:
    ``out`` wider or narrower by ``hidden_deltas``, or of rank 3 as ``[tokens, *split]``."""
    def shape(p):
        return (p["tokens"], hidden)

    x = [
        Bad("x", "dtype", TypeError,
            lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64, fp8])))),
        Bad("x", "step 2 in the last dimension", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 1), hidden), p["dtype"], "step2")),
        Bad("x", "transposed", ValueError, lambda a, p, d: a.tensor((hidden, max(p["tokens"], 2)), p["dtype"]).t()),
        Bad("x", "meta tensor", ValueError, lambda a, p, d: meta(shape(p), p["dtype"])),
        Bad("x", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0, 2.0]], 2.0]))),
        Bad("x", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), p["dtype"]))),
    ]
    out = [
        Bad("out", "dtype", TypeError,
            lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                [p["dtype"], fp16, torch.uint8, torch.int8, torch.float8_e5m2])))),
        Bad("out", "other rows", ValueError,
            lambda a, p, d: a.tensor((p["tokens"] + d.draw(st.sampled_from([1, 5])), hidden), fp8)),
        Bad("out", "other hidden size", ValueError,
            lambda a, p, d: a.tensor((p["tokens"], hidden + d.draw(st.sampled_from(hidden_deltas))), fp8)),
        Bad("out", "other rank, same elements", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["tokens"] * hidden,), (p["tokens"], *split)])), fp8)),
        Bad("out", "non-contiguous", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 2), hidden), fp8, d.draw(st.sampled_from(["step2", "padded"])))),
        Bad("out", "transposed", ValueError, lambda a, p, d: a.tensor((hidden, max(p["tokens"], 2)), fp8).t()),
        Bad("out", "stride 0 (expand)", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 2), hidden), fp8, "expand")),
        Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(shape(p), fp8)),
        Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
        Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), fp8))),
        Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(shape(p), fp8))),
        Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(shape(p), fp8)),
        Bad("out", f"{SHARED}: x's bytes", ValueError,
            lambda a, p, d: a.alias(p["args"]["x"], shape(p), fp8, d.draw(st.sampled_from([0, 1, 17])))),
    ]
    return x, out


_QUANT_X_BAD, _QUANT_OUT_BAD = quant_io_bad(QUANT_HIDDEN, [-1, 1, 32], (2, 16))
QUANT_BAD = _QUANT_X_BAD + [
    Bad("x", "0-d", ValueError, lambda a, p, d: a.tensor((), p["dtype"])),
    Bad("x", "hidden size 0", ValueError, lambda a, p, d: a.tensor((max(p["tokens"], 1), 0), p["dtype"])),
] + _QUANT_OUT_BAD


def quant_bad_args(a: Arena, p: dict, bad: Bad, d, make_args: Callable) -> dict:
    """The arguments of a quant op's call with ``bad`` in place; the other tensors are remade
    where they would otherwise be named first (only the bad argument is wrong)."""
    if bad.what.startswith(SHARED):
        p = dict(p, tokens=7, x_layout="contiguous")  # bytes to share
    args = make_args(a, p)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "out" and bad.what in ("non-contiguous", "transposed", "stride 0 (expand)"):
        args["x"] = a.tensor(value.shape, p["dtype"])  # the same shape, contiguous: only out is wrong
        args["x"].copy_(torch.randn(value.shape, generator=a.gen).to(p["dtype"]))
        a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    if bad.arg == "x" and args["out"] is not None and isinstance(value, torch.Tensor) and value.dim() == 2:
        args["out"] = a.tensor(value.shape, fp8)  # matching sizes: only x is wrong
    args[bad.arg] = value
    return args


@invalid_calls(QUANT_BAD, quant_params())
def test_per_token_quant_fp8_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = quant_bad_args(a, p, bad, d, quant_args)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit"):
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.per_token_quant_fp8(args["x"]), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.per_token_quant_fp8_out(args["out"], args["x"]), a, bad)
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
    q, scales = ops.per_token_quant_fp8(**args)
    if args["out"] is not None:
        assert q is args["out"]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    assert a.same_as(want)
