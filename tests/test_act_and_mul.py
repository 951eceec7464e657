"""kernkit.ops.silu_and_mul and gelu_and_mul on CPU tensors, through the CPU emulator (the same
kernel template the GPU runs): within the documented tolerance of a float64 evaluation of the
formulas (exhaustively over every bf16 and fp16 gate value, densely in fp32), the same bits
whatever the layout of x (vector and scalar paths), errors that name the argument and write
nothing, the custom ops, the warmup specializations, and the hash tool's tolerance check.

Builds: fp32 x (silu, gelu, gelu_tanh), bf16 x (silu, gelu, gelu_tanh), fp16 x silu."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops import gelu_and_mul, registered_ops, silu_and_mul
from kernkit.testing.invalid import (
    SHARED,
    VALID,
    Arena,
    Bad,
    check_invalid,
    check_unallocatable,
    claims_huge,
    invalid_calls,
)
from kernkit.testing.ops.act_and_mul import (
    ACT_BAD,
    _act_out_shape,
    act_and_mul_bound,
    bf16,
    fp16,
    fp32,
    ref_act_and_mul,
    run,
)

ACTS = ["silu", "gelu", "gelu_tanh"]

BUILDS = [(dtype, a) for dtype in (fp32, bf16, fp16) for a in ACTS]


def build_id(b) -> str:
    return f"{str(b[0]).removeprefix('torch.')}-{b[1]}"


def assert_within_bound(got: torch.Tensor, x: torch.Tensor, activation: str) -> None:
    """``got`` is within ``act_and_mul_bound`` of the float64 result; where that rounds
    to an infinity or is NaN, ``got`` is that infinity / NaN."""
    ref = ref_act_and_mul(x, activation)
    assert got.shape == ref.shape and got.dtype == x.dtype
    special = ~ref.to(x.dtype).isfinite()
    assert torch.equal(got[special].isnan(), ref[special].isnan())
    assert torch.equal(got[special & ~ref.isnan()], ref[special & ~ref.isnan()].to(x.dtype))
    assert bool(got[~special].isfinite().all()), "a finite result came out infinite or NaN"
    err = (got[~special].double() - ref[~special]).abs()
    bound = act_and_mul_bound(x, ref, activation)[~special]
    worst = int((err / bound).argmax()) if err.numel() else 0
    assert bool((err <= bound).all()), (
        f"{activation} {x.dtype}: error {err[worst].item():.3g} > bound {bound[worst].item():.3g} "
        f"at ref {ref[~special][worst].item()!r}")


def one_ulp_away(got: torch.Tensor, x: torch.Tensor, activation: str, index: int) -> torch.Tensor:
    """``got`` with element ``index`` (of the flattened tensor; a finite, normal result) moved
    one ulp further from the float64 result: at least one ulp off."""
    ref = ref_act_and_mul(x, activation).reshape(-1)[index]
    bad = got.clone().reshape(-1)
    step = 1 if (bad[index].double() >= ref) == (bad[index] >= 0) else -1  # away from ref in magnitude
    bad.view(torch.int16 if got.element_size() == 2 else torch.int32)[index] += step
    return bad.view(got.shape)


@pytest.mark.parametrize("build", [(bf16, "silu"), (fp16, "gelu"), (bf16, "gelu_tanh")], ids=build_id)
def test_a_result_one_ulp_off_fails_the_bound(build):
    """The bound check is tight enough to see one ulp: each of a few results moved one ulp
    further from the float64 value fails it, while the op's own result passes."""
    dtype, act = build
    x = randn_x(4, 64, dtype, seed=11)
    got = run(x, act)
    assert_within_bound(got, x, act)
    for index in (0, 77, 255):
        with pytest.raises(AssertionError, match=f"{act} {dtype}: error"):
            assert_within_bound(one_ulp_away(got, x, act, index), x, act)


def randn_x(rows: int, d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 2 * d, generator=g) * 3).to(dtype)


@pytest.mark.parametrize("build", BUILDS, ids=build_id)
@pytest.mark.parametrize("rows,d", [(1, 8), (3, 40), (2, 1000), (2, 2104), (5, 13)])
def test_random_rows_within_tolerance(build, rows, d):
    dtype, act = build
    x = randn_x(rows, d, dtype, seed=rows * 1000 + d)
    assert_within_bound(run(x, act), x, act)


@pytest.mark.parametrize("build", [b for b in BUILDS if b[0] != fp32], ids=build_id)
def test_every_half_precision_gate_value(build):
    """All 65536 bit patterns as the gate (NaNs and infinities too; bf16 gates below the
    approximations' range take the general functions, with the other gates of their vector),
    with tiny and huge up values as well (bf16 up to 3e38; fp16 the largest and a subnormal)."""
    dtype, act = build
    gate = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
    edges = (2.0**59, -(2.0**61), 2.0**-59, 2.0**-62, 3e38) if dtype == bf16 else (6.0e4, -65504.0, -1e-7)
    for up in (1.0, -3.5, *edges):
        x = torch.cat([gate, torch.full_like(gate, up)], dim=-1)
        assert_within_bound(run(x, act), x, act)


@pytest.mark.parametrize("act", ACTS)
def test_dense_fp32_sweep(act):
    """fp32 gates over every range the activations switch formulas in (exp's subnormal results,
    erfc's pieces, the sigmoid's cut at -160, the fast paths' bounds), up = 1.25."""
    b = torch.tensor([87.0, 13.0, 2.0**-60, 10.53])  # the fast paths' bounds (10.53: tanh's |y| = 87)
    b = torch.cat([b.nextafter(b * 0), b, b.nextafter(b * 2)])
    gate = torch.cat([torch.linspace(-120.0, 100.0, 40001), torch.linspace(-16.0, 16.0, 40001),
                      torch.linspace(-1e-3, 1e-3, 2001), torch.tensor([1e-40, -1e-40, 3e38, -3e38, 0.0, -0.0]),
                      b, -b])
    x = torch.stack([gate, torch.full_like(gate, 1.25)], dim=-1).reshape(-1, 2)
    assert_within_bound(run(x, act), x, act)


@pytest.mark.parametrize("act", ACTS)
def test_fp32_extreme_up_values(act):
    """Tiny and huge up values against gates whose activation is tiny: the power of two of the
    exponential is applied last, so neither a subnormal nor an overflowing intermediate spoils a
    representable result (silu(-170) * 3e38 is about 1e-34)."""
    gate = torch.cat([torch.linspace(-210.0, 20.0, 4001), torch.tensor([1e-40, -1e-40, 1e-30, -1e-30])])
    for up in (3e38, -1e37, 1e30, 2.0**60, -(2.0**60) * 1.0000001, 31.0, 2.0**-60, 1e-30, -1e-38):
        x = torch.stack([gate, torch.full_like(gate, up)], dim=-1).reshape(-1, 2)
        assert_within_bound(run(x, act), x, act)


@pytest.mark.parametrize("act", ACTS)
def test_special_values(act):
    inf, nan = float("inf"), float("nan")
    gate = torch.tensor([inf, -inf, nan, 0.0, -0.0, 1.0])
    x = torch.stack([gate, torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0, nan])], dim=-1).reshape(-1, 2)
    got = run(x, act).reshape(-1)
    assert got[0].item() == inf, "act(inf) * 2 = inf"
    assert got[1].isnan(), "act(-inf) = -inf * 0 = NaN, as torch's formula gives"
    assert got[2].isnan() and got[5].isnan(), "NaN in, NaN out"
    assert got[3].item() == 0.0 and got[4].item() == 0.0


@pytest.mark.parametrize("build", [(fp32, "gelu"), (bf16, "silu")], ids=build_id)
def test_same_bits_whatever_the_layout(build):
    """Strided rows (a slice of a wider tensor), misaligned starts and row strides (the scalar
    path), 1-d, 3-d and 4-d x: each gives the bits of the contiguous 2-d call (and out must be
    contiguous)."""
    dtype, act = build
    d = 40
    wide = randn_x(6, 3 * d + 3, dtype, seed=7).reshape(6, -1)
    views = {
        "aligned rows, padded stride": wide[:, : 2 * d],
        "misaligned start": wide[:, 1 : 2 * d + 1],
        "odd row stride": wide.reshape(-1)[: 6 * (2 * d + 1)].view(6, 2 * d + 1)[:, : 2 * d],
        "expanded row": wide[:1, : 2 * d].expand(6, 2 * d),
    }
    for name, x in views.items():
        want = run(x.contiguous(), act)
        assert torch.equal(run(x, act), want), name
        assert torch.equal(run(x.reshape(2, 3, 2 * d) if x.is_contiguous() else x.unflatten(0, (2, 3)), act),
                           want.reshape(2, 3, d)), name + ", 3-d"
    one = wide[2, : 2 * d]
    assert torch.equal(run(one, act), run(one.reshape(1, -1), act).reshape(-1)), "1-d"
    x = wide[:, : 2 * d]
    want = run(x.contiguous(), act)
    assert torch.equal(run(x.unflatten(0, (2, 1, 3)), act), want.reshape(2, 1, 3, d)), "4-d"
    out = torch.full((6, d + 5), 7.0, dtype=dtype)
    with pytest.raises(ValueError, match=r"^'out': expected contiguous rows"):
        (silu_and_mul if act == "silu" else gelu_and_mul)(x, out=out[:, :d])
    assert (out == 7.0).all()
    odd = randn_x(3, 7, dtype, seed=3)  # d = 7: the scalar path whatever the alignment
    assert_within_bound(run(odd, act), odd, act)


def test_out_is_written_and_returned():
    x = randn_x(4, 24, bf16, seed=1)
    out = torch.full((4, 24), 7.0, dtype=bf16)
    assert silu_and_mul(x, out=out) is out
    assert torch.equal(out, silu_and_mul(x))
    out3 = torch.full((2, 2, 24), 7.0, dtype=bf16)
    assert gelu_and_mul(x.reshape(2, 2, 48), "tanh", out=out3) is out3
    assert torch.equal(out3.reshape(4, 24), gelu_and_mul(x, approximate="tanh"))


def test_empty_tensors_launch_nothing():
    assert silu_and_mul(torch.empty(0, 16, dtype=fp32)).shape == (0, 8)
    assert silu_and_mul(torch.empty(3, 0, dtype=fp32)).shape == (3, 0)
    assert gelu_and_mul(torch.empty(2, 0, 8, dtype=bf16)).shape == (2, 0, 4)


def _errors_case(x, out, exc, match):
    if out is not None:
        out.fill_(7.0)
    before = None if out is None else out.clone()
    with pytest.raises(exc, match=match):
        silu_and_mul(x, out=out)
    if out is not None:
        assert torch.equal(out, before), "out was written by a call that raised"


def test_errors_name_the_argument_and_write_nothing():
    x = randn_x(4, 16, fp32, seed=2)
    _errors_case(torch.zeros(4, 32, dtype=torch.int32), None, TypeError,
                 r"^'x': unsupported dtype torch.int32; supported: float16, bfloat16, float32$")
    _errors_case(x, torch.zeros(4, 16, dtype=bf16), TypeError, r"^'out': expected dtype float32, got bfloat16$")
    _errors_case(torch.zeros(4, 33), torch.zeros(4, 16), ValueError,
                 r"^'x': the last dimension .* must be even, got 33$")
    _errors_case(x, torch.zeros(4, 17), ValueError, r"^'out'.*17")
    _errors_case(x, torch.zeros(5, 16), ValueError, r"^'out'.*5")
    _errors_case(x, torch.zeros(16, 4).t(), ValueError, r"^'out': expected a contiguous last dimension")
    _errors_case(x.t(), None, ValueError, r"^'x'")  # the last dimension is strided
    _errors_case(torch.zeros(()), None, ValueError, r"^'x': expected a \[\.\.\., n\] tensor, got a 0-d tensor$")
    _errors_case(torch.zeros(2, 3, 32)[:, ::2], None, ValueError, r"^'x': the leading dimensions .* do not collapse")
    buf = torch.randn(64)
    _errors_case(buf[:32], buf[8:24], ValueError, r"^'out' and 'x' overlap in memory")
    with pytest.raises(ValueError, match=r"^'approximate': expected 'none' or 'tanh', got 'erf'$"):
        gelu_and_mul(x, approximate="erf")


def test_custom_ops_for_torch_compile():
    x = randn_x(2, 8, fp32, seed=4)
    assert torch.equal(torch.ops.kernkit.silu_and_mul(x), silu_and_mul(x))
    out = torch.empty(2, 8)
    torch.ops.kernkit.gelu_and_mul_out(out, x, "none")
    assert torch.equal(out, gelu_and_mul(x))
    traced = torch.compile(lambda t: silu_and_mul(t) + gelu_and_mul(t, "tanh"), backend="aot_eager", fullgraph=True)
    assert torch.equal(traced(x), silu_and_mul(x) + gelu_and_mul(x, "tanh"))


def test_specializations_describe_the_builds():
    ops = {op.qualname: op.specializations for op in registered_ops()}
    silu = ops["kernkit::silu_and_mul"](dtypes=[bf16, fp32, bf16], backend="emu", hidden_size=4096)
    assert [s.title for s in silu] == ["silu_and_mul<bf16_t, 0, false>", "silu_and_mul<fp32_t, 0, false>"]
    gelu = ops["kernkit::gelu_and_mul"](dtypes=[fp16], backend="emu", num_heads=8)
    assert [s.title for s in gelu] == ["gelu_and_mul<fp16_t, 1, false>", "gelu_tanh_and_mul<fp16_t, 2, false>"]
    assert [s.title for s in ops["kernkit::gelu_and_mul"](dtypes=[fp16], backend="emu", approximate="tanh")] == \
        ["gelu_tanh_and_mul<fp16_t, 2, false>"]
    assert all(isinstance(s, JitSpec) and s.backend == "emu" for s in silu + gelu)
    with pytest.raises(TypeError, match="unsupported dtype"):
        ops["kernkit::silu_and_mul"](dtypes=[torch.int8])
    with pytest.raises(ValueError, match="'approximate'"):
        ops["kernkit::gelu_and_mul"](approximate=["exact"])


def test_hash_cases_check_the_bound(monkeypatch):
    """kernkit/testing/hashes.py records a bf16 activation case as a bound case (no hash: the
    bound, and the error measured) only within the documented bound of the float64 formula: a
    result 1% off, or one element one ulp off, fails loudly, naming the case. An fp32 case is
    exact: hashed after the same check."""
    from kernkit.testing import hashes as kh

    case = next(c for c in kh.cases() if c.name == "silu_and_mul/silu-bf16-d1000-r7")
    rec = kh.run_case(case, torch.device("cpu"))["out"]
    assert rec["exact"] is False and "sha256" not in rec and rec["bound_ulps"] == 0.51
    assert 0.25 < rec["max_ulps"] <= 0.51, rec
    fp32 = kh.run_case(next(c for c in kh.cases() if c.name == "silu_and_mul/silu-fp32-d8-r1"), torch.device("cpu"))
    assert fp32["out"]["exact"] is True and len(fp32["out"]["sha256"]) == 64
    real = ops.silu_and_mul

    def one_percent_off(x, out=None):
        return real(x, out=out).mul_(1.01)

    def one_ulp_off(x, out=None):
        got = real(x, out=out)
        got.copy_(one_ulp_away(got, x, "silu", 1234))
        return got

    for wrong in (one_percent_off, one_ulp_off):
        monkeypatch.setattr(ops, "silu_and_mul", wrong)
        with pytest.raises(kh.ReferenceMismatch, match="silu_and_mul/silu-bf16-d1000-r7: 'out' is not within"):
            kh.run_case(case, torch.device("cpu"))


ACT_D = 8  # x rows of 2 * 8; bf16 and fp32 builds of silu and gelu (erf): four builds


@st.composite
def act_params(draw):
    lead = draw(st.sampled_from([(), (0,), (1,), (3,), (2, 3), (2, 1, 2)]))
    return dict(
        op=draw(st.sampled_from(["silu", "gelu"])),
        dtype=draw(st.sampled_from([bf16, fp32])),
        lead=lead,
        d=draw(st.sampled_from([ACT_D, 3])),  # 3: the scalar variant
        # padded rows (a misaligned row stride) for 2-d x only: the rows of 3-d x must be evenly spaced
        x_layout=draw(st.sampled_from(["contiguous", "offset", "padded"][: 3 if len(lead) == 1 else 2])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        seed=draw(st.integers(0, 2**16)),
    )


def act_args(a: Arena, p: dict) -> dict:
    x = a.tensor((*p["lead"], 2 * p["d"]), p["dtype"], p["x_layout"])
    x.copy_(torch.randn(x.shape, generator=a.gen).to(p["dtype"]))  # no NaN bit patterns
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    out = None if p["out"] is None else a.tensor((*p["lead"], p["d"]), p["dtype"], p["out"])
    args = dict(x=x, out=out)
    if p["op"] == "gelu":
        args["approximate"] = "none"
    return args


#: The bad kinds that replace x or out with a tensor of another shape: the other one follows it.
_ACT_RESHAPING = ("strided last dimension", "rows not evenly spaced", "non-contiguous", "overlapping rows (expand)")


def _act_call(args: dict, p: dict, bad: Bad, a: Arena, via: str) -> None:
    custom = via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit", "not a string")
    if p["op"] == "silu":
        if not custom:
            check_invalid(lambda: ops.silu_and_mul(**args), a, bad)
        elif args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.silu_and_mul(args["x"]), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.silu_and_mul_out(args["out"], args["x"]), a, bad)
    elif not custom:
        check_invalid(lambda: ops.gelu_and_mul(**args), a, bad)
    elif args["out"] is None:
        check_invalid(lambda: torch.ops.kernkit.gelu_and_mul(args["x"], args["approximate"]), a, bad)
    else:
        check_invalid(lambda: torch.ops.kernkit.gelu_and_mul_out(args["out"], args["x"], args["approximate"]), a, bad)


@invalid_calls(ACT_BAD, act_params())
def test_act_and_mul_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.arg == "approximate":
        p = dict(p, op="gelu")
    if bad.arg == "out" or bad.what.startswith(SHARED):
        p = dict(p, out="contiguous")
    if bad.what.startswith(SHARED):
        p = dict(p, lead=(3,), x_layout="contiguous")  # elements to share
    if bad.arg == "out" and bad.what == "leading dimensions" and p["lead"] == ():
        p = dict(p, lead=(3,))
    args = act_args(a, p)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "x" and bad.what in _ACT_RESHAPING and args["out"] is not None:
        args["out"] = a.tensor((*value.shape[:-1], p["d"]), p["dtype"])  # matching: only x's layout is wrong
    if bad.arg == "out" and bad.what in _ACT_RESHAPING:
        args["x"] = a.tensor((*value.shape[:-1], 2 * p["d"]), p["dtype"])
    args[bad.arg] = value
    if args["out"] is None and claims_huge(args["x"]):
        check_unallocatable(lambda: ops.silu_and_mul(args["x"]), a)
    else:
        _act_call(args, p, bad, a, via)


@VALID
@given(p=act_params())
def test_act_and_mul_valid_views_are_within_tolerance(p):
    """Misaligned starts and row strides (the scalar variant), 1-d, empty and 3-d inputs, out
    given or not: within the documented tolerance of the float64 result, and no byte outside
    out written."""
    a = Arena.seeded(p["seed"])
    args = act_args(a, p)
    want = a.copies()
    activation = p["op"]
    got = ops.silu_and_mul(**args) if activation == "silu" else ops.gelu_and_mul(**args)
    assert got.shape == _act_out_shape(p) and got.dtype == p["dtype"]
    ref = ref_act_and_mul(args["x"], activation)
    assert bool(((got.double() - ref).abs() <= act_and_mul_bound(args["x"], ref, activation)).all())
    if args["out"] is not None:
        assert got is args["out"]
        a.twin(args["out"], want).copy_(got)  # the only bytes the call may change
    assert a.same_as(want)
