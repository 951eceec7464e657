"""kernkit.ops.rmsnorm and kernkit.ops.fused_add_rmsnorm on CPU tensors, through the CPU
emulator: the GPU's kernel templates against a float64 evaluation within the tolerance the
docstrings state, strided and multi-dimensional rows, where the fused op rounds the sum, and the
errors of bad calls (each naming the argument, with nothing written).

Specializations built (each costs an emulator build): bf16 x 4096 (a block per row, 128 threads
of 4 vectors), bf16 x 1024 (one warp per row), fp16 x 128 (groups of 4 lanes, several rows per
block), fp32 x 1000 (a block of 64 threads whose last vectors are missing); each also in
transformers' order (``cast_x_before_out_mul``)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops import fused_add_rmsnorm, registered_ops, rmsnorm
from kernkit.testing import oracle
from kernkit.testing.invalid import SHARED, VALID, Arena, Bad, check_invalid, invalid_calls
from kernkit.testing.ops.rmsnorm import (
    FUSED_NORM_BAD,
    RMSNORM_BAD,
    _norm_shape,
    bf16,
    fp16,
    fp32,
    norm_rows,
    ref_fused_add_rmsnorm,
    ref_rmsnorm,
    rmsnorm64,
    rmsnorm_bound,
    transformers_rmsnorm,
)

#: (dtype, hidden) of every build these tests use.
BUILDS = [(bf16, 4096), (bf16, 1024), (fp16, 128), (fp32, 1000)]


def assert_within_tolerance(got: torch.Tensor, want: torch.Tensor) -> None:
    """The docstring's bound (``rmsnorm_bound``)."""
    bound = rmsnorm_bound(want, got.dtype)
    err = (got.double() - want).abs()
    assert torch.isfinite(got).all()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.3g} times the stated bound"


def randn(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("dtype,hidden", BUILDS, ids=str)
@pytest.mark.parametrize("lead", [(), (1,), (7,), (2, 3), (0,)], ids=str)
def test_rmsnorm_within_the_stated_tolerance(dtype, hidden, lead):
    x = randn((*lead, hidden), dtype, hidden + len(lead), scale=3.0)
    w = randn((hidden,), dtype, 1)
    for eps in (1e-6, 1e-2):
        y = rmsnorm(x, w, eps)
        assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
        assert_within_tolerance(y, rmsnorm64(x, w, eps))


@pytest.mark.parametrize("dtype,hidden", BUILDS, ids=str)
@pytest.mark.parametrize("rows", [37, 1100], ids=lambda r: f"{r}rows")
def test_bits_equal_the_fp32_reference_in_the_kernel_order(dtype, hidden, rows):
    """``ref_rmsnorm`` (``row_inv_rms``) repeats the kernel's fp32 operations in its order (what
    ``kernkit/testing/hashes.py`` compares byte for byte): the emulator matches it exactly, for
    rows of several magnitudes, few rows and many."""
    g = torch.Generator().manual_seed(hidden)
    mag = torch.exp2(torch.randint(-8, 9, (rows, 1), generator=g).float())
    x = (torch.randn(rows, hidden, generator=g) * mag).to(dtype)
    r = (torch.randn(rows, hidden, generator=g) * mag).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    want = torch.empty_like(x)
    ref_rmsnorm(want, x, w, 1e-5)
    assert torch.equal(rmsnorm(x, w, 1e-5), want)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    ref_fused_add_rmsnorm(x1, r1, w, 1e-5)
    fused_add_rmsnorm(x2, r2, w, 1e-5)
    assert torch.equal(x2, x1) and torch.equal(r2, r1)


@pytest.mark.parametrize("dtype,hidden", BUILDS, ids=str)
def test_cast_x_before_out_mul_bits_equal_the_reference(dtype, hidden):
    """``cast_x_before_out_mul=True``: the emulator's bits equal the fp32 reference in the
    kernel's order with ``x * inv_rms`` rounded first, for both ops."""
    g = torch.Generator().manual_seed(hidden + 1)
    mag = torch.exp2(torch.randint(-8, 9, (37, 1), generator=g).float())
    x = (torch.randn(37, hidden, generator=g) * mag).to(dtype)
    r = (torch.randn(37, hidden, generator=g) * mag).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    want = torch.empty_like(x)
    ref_rmsnorm(want, x, w, 1e-5, cast=True)
    assert torch.equal(rmsnorm(x, w, 1e-5, cast_x_before_out_mul=True), want)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    ref_fused_add_rmsnorm(x1, r1, w, 1e-5, cast=True)
    fused_add_rmsnorm(x2, r2, w, 1e-5, cast_x_before_out_mul=True)
    assert torch.equal(x2, x1) and torch.equal(r2, r1)
    if dtype != fp32:  # the option changes the result (float32: both orders are one)
        assert not torch.equal(want, rmsnorm(x, w, 1e-5))
    else:
        assert torch.equal(want, rmsnorm(x, w, 1e-5))


def test_cast_x_before_out_mul_is_transformers_rmsnorm():
    """Against transformers' RMSNorm as written (torch's own reduction order, so ``inv_rms`` may
    differ in its last fp32 bit): the option agrees on nearly every element and is within one
    bfloat16 ulp everywhere, where the default order differs on a large share."""
    x, w = randn((64, 4096), bf16, 40, scale=3.0), (randn((4096,), bf16, 41) * 0.2 + 1).to(bf16)
    want = transformers_rmsnorm(x, w, 1e-6)
    got = rmsnorm(x, w, 1e-6, cast_x_before_out_mul=True)
    default = rmsnorm(x, w, 1e-6)
    assert (got == want).float().mean() > 0.999
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2.0**-7).all()
    assert (default != want).float().mean() > 0.1
    r = randn((64, 4096), bf16, 42)
    x2, r2 = x.clone(), r.clone()
    fused_add_rmsnorm(x2, r2, w, 1e-6, cast_x_before_out_mul=True)
    s = r + x  # transformers' residual add, in bfloat16
    assert torch.equal(r2, s)
    assert torch.equal(x2, rmsnorm(s, w, 1e-6, cast_x_before_out_mul=True))


def test_cast_x_before_out_mul_must_be_a_bool():
    x, w = randn((3, 128), fp16, 43), randn((128,), fp16, 44)
    for bad in (1, "true", None):
        with pytest.raises(TypeError, match="'cast_x_before_out_mul': expected a bool"):
            rmsnorm(x, w, cast_x_before_out_mul=bad)
        with pytest.raises(TypeError, match="'cast_x_before_out_mul': expected a bool"):
            fused_add_rmsnorm(x.clone(), x.clone(), w, cast_x_before_out_mul=bad)


def _nearest_fp32(exact: Fraction, got: torch.Tensor) -> bool:
    """Whether the fp32 ``got`` is ``exact`` rounded to nearest, ties to even."""
    y = got.item()
    neighbours = [torch.nextafter(got, torch.tensor(d, dtype=torch.float32)).item() for d in (-math.inf, math.inf)]
    err = abs(exact - Fraction(y))
    for n in neighbours:
        other = abs(exact - Fraction(n))
        if other < err or (other == err and torch.tensor(n).view(torch.int32).item() % 2 == 0):
            return False
    return True


def test_reference_fma32_rounds_once():
    """``fma32`` (the reference's ``__fmaf_rn``) is ``a * b + c`` rounded once to fp32: random
    triples, cancellation (``c = -a * b`` in fp32: the result is the product's rounding error),
    and triples whose float64 sum lands on an fp32 tie that the exact value misses by 2**-46 of
    half an ulp (``c`` with an odd last bit, ``a * b`` just under half its ulp), where rounding
    the float64 sum to fp32 goes the wrong way."""
    g = torch.Generator().manual_seed(5)
    n = 1000
    a = torch.randn(2 * n, generator=g) * torch.exp2(torch.randint(-20, 20, (2 * n,), generator=g).float())
    b = torch.randn(2 * n, generator=g)
    c = torch.cat([torch.randn(n, generator=g), -(a[n:] * b[n:])])
    odd = (torch.randn(n, generator=g) * 100).view(torch.int32).bitwise_or(1).view(torch.float32)
    half_ulp = torch.exp2(torch.frexp(odd).exponent.float() - 25)  # odd = m * 2**e, m in [0.5, 1)
    a = torch.cat([a, half_ulp * (1 + 2.0**-23) * torch.sign(odd)])
    b = torch.cat([b, torch.full((n,), 1 - 2.0**-23)])
    c = torch.cat([c, odd])
    got = oracle.fma32(a, b, c)
    for i in range(3 * n):
        exact = Fraction(a[i].item()) * Fraction(b[i].item()) + Fraction(c[i].item())
        assert _nearest_fp32(exact, got[i]), (a[i].item(), b[i].item(), c[i].item())


def test_reference_rsqrt32_is_correctly_rounded_for_every_fp32():
    """``rsqrt32`` (the reference's and the emulator's ``__frsqrt_rn``: the float64 root and
    division, rounded to fp32) is correctly rounded for every fp32 in [1, 4). Scaling an input
    by 4**k scales the exact value, the float64 steps and the result by 2**-k exactly, so this
    covers every positive fp32. Each result ``y`` is checked against the midpoints ``m`` to its
    neighbours: ``1 / sqrt(v)`` lies between them iff ``m**2 * v`` and 1 compare the right way;
    ``m**2`` is exact in float64 and the product is rounded once, so only products within
    2**-50 of 1 need exact integers."""
    lo = torch.tensor(1.0).view(torch.int32).item()
    hi = torch.tensor(4.0).view(torch.int32).item()
    v = torch.arange(lo, hi, dtype=torch.int32).view(torch.float32)
    y = oracle.rsqrt32(v)
    vd, yd = v.double(), y.double()
    near = []
    for toward, want_below_one in ((-math.inf, True), (math.inf, False)):
        m = (yd + torch.nextafter(y, torch.tensor(toward)).double()) / 2  # exact: 25 bits
        prod = m * m * vd  # m * m exact (50 bits), times v rounded once
        close = (prod - 1).abs() <= 2.0**-50
        assert ((prod < 1) == want_below_one)[~close].all()
        near += [(m[i].item(), v[i].item(), want_below_one) for i in close.nonzero().flatten().tolist()]
    for m, x, want_below_one in near:
        assert (Fraction(m) ** 2 * Fraction(x) < 1) == want_below_one, (x, m)
    specials = torch.tensor([0.0, -0.0, math.inf, -1.0, math.nan, 2.0**-149])
    got = oracle.rsqrt32(specials)
    assert got[0] == math.inf and got[1] == -math.inf and got[2] == 0 and got[3:5].isnan().all()
    assert got[5] == oracle.rsqrt32(torch.tensor(2.0)) * 2.0**75  # the smallest subnormal, 2 / 4**75


def test_rmsnorm_is_not_the_identity_or_unweighted():
    """The tolerance test fails for a kernel that skips the scaling or the weight."""
    x, w = randn((4, 1024), bf16, 3, scale=5.0), randn((1024,), bf16, 4)
    y = rmsnorm(x, w)
    unweighted = rmsnorm64(x, torch.ones_like(w), 1e-6)
    assert (y.double() - unweighted).abs().max() > 0.1
    assert (y.double() - x.double()).abs().max() > 0.1


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_rmsnorm_is_scale_invariant_away_from_eps(scale):
    x, w = randn((3, 128), fp16, 5), randn((128,), fp16, 6)
    y = rmsnorm(x, w, 0.0)
    z = rmsnorm((x.float() * scale).to(fp16), w, 0.0)
    assert_within_tolerance(y, rmsnorm64(x, w, 0.0))
    assert_within_tolerance(z, rmsnorm64((x.float() * scale).to(fp16), w, 0.0))


def test_rmsnorm_special_rows():
    """A row of zeros gives zeros (1 / sqrt(eps) times 0); a constant row c gives
    c / sqrt(c**2 + eps) * weight."""
    w = randn((1000,), fp32, 7)
    x = torch.zeros(2, 1000)
    x[1] = 0.5
    y = rmsnorm(x, w, 1e-2)
    assert torch.equal(y[0], torch.zeros(1000))
    assert_within_tolerance(y[1], 0.5 / (0.25 + 1e-2) ** 0.5 * w.double())
    # Outside the stated range, as the docstring says: squares that overflow fp32 give zeros,
    # eps = 0 with a zero row gives NaN (0 * inf), as the formula evaluated in fp32 does.
    big = torch.full((1, 1024), 1e30, dtype=bf16)
    assert torch.equal(rmsnorm(big, torch.ones(1024, dtype=bf16)).abs(), torch.zeros(1, 1024, dtype=bf16))
    assert torch.isnan(rmsnorm(torch.zeros(1, 1024, dtype=bf16), torch.ones(1024, dtype=bf16), 0.0)).all()


def test_strided_rows_in_and_out_and_nothing_else_written():
    buf = randn((6, 3 * 1024), bf16, 8)
    x = buf[:, 1024:2048]  # rows 3072 elements apart
    w = randn((1024,), bf16, 9)
    outbuf = torch.full((6, 2048), 7.0, dtype=bf16)
    out = outbuf[:, :1024]
    result = rmsnorm(x, w, 1e-6, out=out)
    assert result is out
    assert_within_tolerance(out, rmsnorm64(x, w, 1e-6))
    assert torch.equal(outbuf[:, 1024:], torch.full((6, 1024), 7.0, dtype=bf16))


def test_collapsible_leading_dimensions_are_flattened():
    """[2, 3, hidden] views of a [2, 3, 2 * hidden] buffer: the leading dimensions step evenly,
    as do size-1 dimensions with any stride."""
    buf = randn((2, 3, 256), fp16, 10)
    x = buf[:, :, :128]
    w = randn((128,), fp16, 11)
    assert_within_tolerance(rmsnorm(x, w), rmsnorm64(x, w, 1e-6))
    y = randn((5, 1, 128), fp16, 12)
    assert_within_tolerance(rmsnorm(y, w), rmsnorm64(y, w, 1e-6))


def test_leading_dimensions_that_do_not_collapse_are_refused():
    x = randn((3, 2, 128), fp16, 13).transpose(0, 1)  # [2, 3, 128] with strides (128, 256, 1)
    with pytest.raises(ValueError, match=r"^'x': the leading dimensions .* do not collapse"):
        rmsnorm(x, torch.ones(128, dtype=fp16))


def test_fused_add_rmsnorm_residual_is_the_rounded_fp32_sum():
    x, r, w = randn((5, 4096), bf16, 14), randn((5, 4096), bf16, 15), randn((4096,), bf16, 16)
    s = x.float() + r.float()
    xp, rp = x.data_ptr(), r.data_ptr()
    assert fused_add_rmsnorm(x, r, w, 1e-6) is None
    assert x.data_ptr() == xp and r.data_ptr() == rp
    assert torch.equal(r, s.to(bf16))
    assert_within_tolerance(x, rmsnorm64(s, w, 1e-6))


def test_fused_add_rmsnorm_normalizes_the_fp32_sum_not_the_rounded_one():
    """As flashinfer: x is rmsnorm of the unrounded fp32 sum. The inputs are chosen so that the
    sum needs more bits than bfloat16 has (x + r where r is small against x), so normalizing
    the rounded sum gives a visibly different result."""
    g = torch.Generator().manual_seed(17)
    x = (torch.randn(8, 1024, generator=g) * 4).to(bf16)
    r = (torch.randn(8, 1024, generator=g) * 0.02).to(bf16)
    w = torch.ones(1024, dtype=bf16)
    s = x.float() + r.float()
    from_fp32 = rmsnorm64(s, w, 1e-6).to(bf16)
    from_rounded = rmsnorm64(s.to(bf16), w, 1e-6).to(bf16)
    assert (from_fp32 != from_rounded).float().mean() > 0.05  # the two readings differ
    fused_add_rmsnorm(x, r, w, 1e-6)
    agree_fp32 = (x == from_fp32).float().mean().item()
    agree_rounded = (x == from_rounded).float().mean().item()
    assert agree_fp32 > 0.99 and agree_rounded < agree_fp32 - 0.04, (agree_fp32, agree_rounded)


@pytest.mark.parametrize("dtype,hidden", [(fp16, 128), (fp32, 1000)], ids=str)
def test_fused_add_rmsnorm_strided_rows(dtype, hidden):
    xbuf, rbuf = randn((3, 4, 2 * hidden), dtype, 18), randn((3, 4, 3 * hidden), dtype, 19)
    x, r = xbuf[..., :hidden], rbuf[..., hidden : 2 * hidden]
    w = randn((hidden,), dtype, 20)
    x_rest, r_rest = xbuf[..., hidden:].clone(), torch.cat([rbuf[..., :hidden], rbuf[..., 2 * hidden :]], -1)
    s = x.float() + r.float()
    fused_add_rmsnorm(x, r, w, 1e-5)
    assert torch.equal(r, s.to(dtype))
    assert_within_tolerance(x, rmsnorm64(s, w, 1e-5))
    assert torch.equal(xbuf[..., hidden:], x_rest)
    assert torch.equal(torch.cat([rbuf[..., :hidden], rbuf[..., 2 * hidden :]], -1), r_rest)


def test_custom_ops_match_the_functions():
    x, w = randn((3, 128), fp16, 21), randn((128,), fp16, 22)
    assert torch.equal(torch.ops.kernkit.rmsnorm(x, w, 1e-6), rmsnorm(x, w, 1e-6))
    out = torch.empty_like(x)
    torch.ops.kernkit.rmsnorm_out(out, x, w, 1e-6)
    assert torch.equal(out, rmsnorm(x, w, 1e-6))
    r = randn((3, 128), fp16, 23)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    torch.ops.kernkit.fused_add_rmsnorm(x1, r1, w, 1e-6)
    fused_add_rmsnorm(x2, r2, w, 1e-6)
    assert torch.equal(x1, x2) and torch.equal(r1, r2)


def test_opcheck_and_declared_mutations():
    """torch.library.opcheck (schema, fake implementation, AOT dispatch with dynamic shapes) of
    the three custom ops; fused_add_rmsnorm declares that it writes x and residual."""
    x, w, r = randn((3, 128), fp16, 29), randn((128,), fp16, 30), randn((3, 128), fp16, 31)
    torch.library.opcheck(torch.ops.kernkit.rmsnorm.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.kernkit.rmsnorm_out.default, (torch.empty_like(x), x, w, 1e-6))
    torch.library.opcheck(torch.ops.kernkit.fused_add_rmsnorm.default, (x.clone(), r.clone(), w, 1e-6))
    schema = str(torch.ops.kernkit.fused_add_rmsnorm.default._schema)
    assert re.search(r"\(Tensor\(\w+!\) x, Tensor\(\w+!\) residual, Tensor weight, float eps", schema), schema
    assert "!" not in str(torch.ops.kernkit.rmsnorm.default._schema)


def _unchanged(*tensors):
    return [t.clone() for t in tensors]


def _assert_same(before, after):
    """Byte for byte (NaN bit patterns included)."""
    assert all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
               for a, b in zip(before, after, strict=True))


def test_unsupported_dtype_is_a_type_error():
    with pytest.raises(TypeError, match=r"^'x': unsupported dtype torch.int32; supported: float16, bfloat16, float32$"):
        rmsnorm(torch.ones(4, 8, dtype=torch.int32), torch.ones(8, dtype=torch.int32))


@pytest.mark.parametrize("dtype,hidden", [(bf16, 100), (fp32, 6), (fp16, 0), (bf16, 1 << 18)], ids=str)
def test_hidden_sizes_without_a_kernel_are_refused(dtype, hidden):
    with pytest.raises(ValueError, match=rf"^'x': hidden size {hidden} is not supported"):
        rmsnorm(torch.ones(2, hidden, dtype=dtype), torch.ones(hidden, dtype=dtype))


def test_zero_dim_input_is_refused():
    with pytest.raises(ValueError, match=r"^'x': expected a \[..., hidden\] tensor, got a 0-d tensor$"):
        rmsnorm(torch.ones((), dtype=fp16), torch.ones(128, dtype=fp16))


def test_launcher_errors_name_the_argument_and_write_nothing():
    x, w = randn((4, 128), fp16, 24), randn((128,), fp16, 25)
    base = torch.zeros(4 * 128 + 8, dtype=fp16)
    cases = [
        (dict(weight=torch.ones(64, dtype=fp16)), ValueError,
         r"^'weight': dimension 0 \('length'\) expected 128 \(x's last dimension\), got 64"),
        (dict(weight=torch.ones(128, dtype=bf16)), TypeError, r"^'weight': expected dtype float16, got bfloat16$"),
        (dict(weight=torch.ones(256, dtype=fp16)[::2]), ValueError, r"^'weight': expected a contiguous tensor"),
        (dict(out=torch.empty(4, 128, dtype=fp32)), TypeError, r"^'out': expected dtype float16, got float32$"),
        (dict(out=torch.empty(2, 2, 128, dtype=fp16)), ValueError,
         r"^'out': expected shape \[4, 128\] \(from 'x'\), got \[2, 2, 128\]$"),
        (dict(out=torch.empty(1, 128, dtype=fp16).expand(4, 128)), ValueError, r"^'out': rows overlap"),
        (dict(out=torch.empty(128, 4, dtype=fp16).t()), ValueError, r"^'out': expected a contiguous last dimension"),
        (dict(out=base[1 : 1 + 512].view(4, 128)), ValueError, r"^'out': rows must start on 16-byte boundaries"),
        (dict(x=torch.empty(4, 264, dtype=fp16)[:, 4:132]), ValueError, r"^'x': rows must start on 16-byte"),
        (dict(eps=-1e-6), ValueError, r"^'eps': expected a finite value >= 0"),
        (dict(eps=float("nan")), ValueError, r"^'eps': expected a finite value >= 0"),
        (dict(eps="1e-6"), TypeError, r"^'eps': expected a float, got str$"),
        (dict(weight=None), TypeError, r"^'weight': expected a tensor, got NoneType$"),
    ]
    for change, exc, msg in cases:
        args = dict(x=x, weight=w, eps=1e-6, out=torch.full((4, 128), 3.0, dtype=fp16))
        args.update(change)
        before = _unchanged(*(t for t in args.values() if isinstance(t, torch.Tensor)))
        with pytest.raises(exc, match=msg):
            rmsnorm(**args)
        _assert_same(before, [t for t in args.values() if isinstance(t, torch.Tensor)])


def test_out_overlapping_x_is_refused():
    buf = randn((9 * 128,), fp16, 26)
    before = buf.clone()
    x = buf[: 4 * 128].view(4, 128)
    strided = buf.view(9, 128)[:8:2]  # rows 0, 2, 4, 6: x's first row, another row stride
    for out in (buf[128:5 * 128].view(4, 128), buf[8:8 + 4 * 128].view(4, 128), strided):
        with pytest.raises(ValueError, match=r"^'out' and 'x' overlap in memory"):
            rmsnorm(x, torch.ones(128, dtype=fp16), out=out)
    assert torch.equal(buf, before)


@pytest.mark.parametrize("dtype", [fp16, bf16, fp32])
@pytest.mark.parametrize("shape", [(1, 4096), (5, 128), (2, 3, 1024), (33, 5120)])
def test_out_that_is_x_normalizes_in_place(dtype, shape):
    x = randn(shape, dtype, 29)
    w = randn(shape[-1:], dtype, 30)
    expect = rmsnorm(x, w, 1e-6)
    assert rmsnorm(x, w, 1e-6, out=x) is x
    assert torch.equal(x, expect)
    # A strided x (rows of a wider buffer) in place: only its own elements change.
    buf = randn((4, shape[-1] + 64), dtype, 31)
    before = buf.clone()
    view = buf[:, 64:]
    expect = rmsnorm(view, w, 1e-6)
    rmsnorm(view, w, 1e-6, out=view)
    assert torch.equal(view, expect) and torch.equal(buf[:, :64], before[:, :64])


def test_fused_errors_name_the_argument_and_write_nothing():
    buf = randn((5 * 128,), fp16, 27)
    w = torch.ones(128, dtype=fp16)
    x = buf[: 4 * 128].view(4, 128)
    r = randn((4, 128), fp16, 28)
    cases = [
        (x, buf[128:].view(4, 128), ValueError, r"^'x' and 'residual' overlap in memory"),
        (x, x, ValueError, r"^'x' and 'residual' overlap in memory"),
        (x, r[:2], ValueError, r"^'residual': expected shape \[4, 128\] \(from 'x'\), got \[2, 128\]$"),
        (x, r.float(), TypeError, r"^'residual': expected dtype float16, got float32$"),
        (x, r[:1].expand(4, 128), ValueError, r"^'residual': rows overlap"),
        (x[:1].expand(4, 128), r, ValueError, r"^'x': rows overlap"),
    ]
    for xx, rr, exc, msg in cases:
        before = _unchanged(buf, r)
        with pytest.raises(exc, match=msg):
            fused_add_rmsnorm(xx, rr, w)
        _assert_same(before, [buf, r])
    with pytest.raises(ValueError, match=r"^'x' and 'weight' overlap in memory"):
        fused_add_rmsnorm(x, r, buf[: 128])
    assert torch.equal(r, _unchanged(r)[0])


def test_specializations_describe_the_builds():
    ops = {op.qualname: op for op in registered_ops()}
    for name in ("kernkit::rmsnorm", "kernkit::fused_add_rmsnorm"):
        specs = ops[name].specializations(dtypes=[bf16, fp16, bf16], hidden_size=4096, head_dim=128, num_heads=32,
                                          backend="emu")
        assert [s.title for s in specs] == ["rmsnorm<bf16_t, 4096, false>", "rmsnorm<bf16_t, 128, false>",
                                            "rmsnorm<fp16_t, 4096, false>", "rmsnorm<fp16_t, 128, false>"]
        assert all(isinstance(s, JitSpec) and s.backend == "emu" for s in specs)
    for flag in (True, "1", "TRUE"):
        specs = ops["kernkit::rmsnorm"].specializations(dtypes=[bf16], hidden_size=4096, backend="emu",
                                                        cast_x_before_out_mul=flag)
        assert [s.title for s in specs] == ["rmsnorm<bf16_t, 4096, false, true>"]
    with pytest.raises(TypeError, match="'cast_x_before_out_mul'"):
        ops["kernkit::rmsnorm"].specializations(dtypes=[bf16], hidden_size=4096, cast_x_before_out_mul="yes")
    with pytest.raises(ValueError, match="hidden size 100"):
        ops["kernkit::rmsnorm"].specializations(dtypes=[bf16], hidden_size=100)
    with pytest.raises(TypeError, match="unsupported dtype"):
        ops["kernkit::rmsnorm"].specializations(dtypes=[torch.int8], hidden_size=128)


@st.composite
def norm_params(draw):
    return dict(
        lead=draw(st.sampled_from([(0,), (1,), (3,), (2, 5), ()])),
        x_layout=draw(st.sampled_from(["contiguous", "wide"])),
        other_layout=draw(st.sampled_from(["contiguous", "wide"])),  # out or residual
        has_out=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-6, 1e-2, 0.0, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def norm_args(a: Arena, p: dict, fused: bool) -> dict:
    x = norm_rows(a, p["lead"], p["x_layout"])
    weight = norm_rows(a, (), "contiguous")
    if fused:
        return dict(x=x, residual=norm_rows(a, p["lead"], p["other_layout"]), weight=weight, eps=p["eps"])
    out = norm_rows(a, p["lead"], p["other_layout"], values=False) if p["has_out"] else None
    return dict(x=x, weight=weight, eps=p["eps"], out=out)


#: The bad kinds that replace x with a tensor of another shape: the other row tensor follows it.
_NORM_RESHAPING = ("strided last dimension", "misaligned start", "misaligned row stride",
                   "leading dimensions do not collapse", "overlapping rows (expand)")


def _norm_call(args: dict, fused: bool, bad: Bad, a: Arena, via: str) -> None:
    custom = via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a number", "negative bit")
    if fused:
        op = torch.ops.kernkit.fused_add_rmsnorm if custom else ops.fused_add_rmsnorm
        check_invalid(lambda: op(args["x"], args["residual"], args["weight"], args["eps"]), a, bad)
    elif not custom:
        check_invalid(lambda: ops.rmsnorm(**args), a, bad)
    elif args["out"] is None:
        check_invalid(lambda: torch.ops.kernkit.rmsnorm(args["x"], args["weight"], args["eps"]), a, bad)
    else:
        check_invalid(lambda: torch.ops.kernkit.rmsnorm_out(args["out"], args["x"], args["weight"], args["eps"]), a,
                      bad)


def _norm_invalid(bad: Bad, p: dict, via: str, d, fused: bool) -> None:
    a = Arena.seeded(p["seed"])
    other = "residual" if fused else "out"
    if bad.what.startswith(SHARED):
        p = dict(p, lead=(3,), x_layout="contiguous", other_layout="contiguous", has_out=True)  # rows to share
    if bad.arg == other or (not fused and bad.arg == "out"):
        p = dict(p, has_out=True)
    args = norm_args(a, p, fused)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "x" and bad.what in _NORM_RESHAPING:
        args[other] = a.tensor(value.shape, fp16) if fused or args["out"] is not None else None
    if bad.arg == other and bad.what in _NORM_RESHAPING:
        args["x"] = a.tensor(value.shape, fp16)  # x of the same shape: only the layout is wrong
    args[bad.arg] = value
    _norm_call(args, fused, bad, a, via)


@invalid_calls(RMSNORM_BAD, norm_params())
def test_rmsnorm_rejects_invalid_calls(bad, p, via, d):
    _norm_invalid(bad, p, via, d, False)


@invalid_calls(FUSED_NORM_BAD, norm_params())
def test_fused_add_rmsnorm_rejects_invalid_calls(bad, p, via, d):
    _norm_invalid(bad, p, via, d, True)


@VALID
@given(p=norm_params(), fused=st.booleans())
def test_norm_valid_views_give_the_reference_bytes(p, fused):
    """Strided (16-byte aligned) rows in and out, 1-d, empty and 3-d inputs, eps of several
    sizes: the bytes of the kernel-order reference (``ref_rmsnorm``), every other byte of
    every buffer (row padding, guards) unchanged."""
    a = Arena.seeded(p["seed"])
    args = norm_args(a, p, fused)
    want = a.copies()
    tw = {k: a.twin(v, want) for k, v in args.items()}
    if fused:
        ref_fused_add_rmsnorm(tw["x"], tw["residual"], tw["weight"], p["eps"])
        assert ops.fused_add_rmsnorm(**args) is None
    else:
        expect = tw["out"] if tw["out"] is not None else torch.empty(_norm_shape(p), dtype=fp16)
        ref_rmsnorm(expect, tw["x"], tw["weight"], p["eps"])
        got = ops.rmsnorm(**args)
        assert got.shape == expect.shape
        if args["out"] is not None:
            assert got is args["out"]
        assert torch.equal(got.contiguous().view(torch.uint8), expect.contiguous().view(torch.uint8))
    assert a.same_as(want)
