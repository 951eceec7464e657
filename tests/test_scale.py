"""kernkit.ops.scale on CPU tensors, through the CPU emulator: the same kernel template the GPU
runs, bit-exact against torch, and its errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec, load_jit
from kernkit.ops import registered_ops, scale
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import (
    HUGE,
    SHARED,
    VALID,
    Arena,
    Bad,
    check_invalid,
    check_unallocatable,
    claims_huge,
    invalid_calls,
    meta,
    neg_bit,
    requires_grad,
)

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


# ----- the reference: what the kernel must compute


def ref_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x * factor``, computed in fp32 and rounded once to the dtype."""
    return (x.float() * factor).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 4099])
def test_matches_torch_bit_for_bit(dtype, n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).mul(3).to(dtype)
    for factor in (1.7, -0.3, 0.0, 1e-3):
        assert torch.equal(scale(x, factor), ref_scale(x, factor)), (n, factor)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unaligned_view_takes_the_scalar_path(dtype):
    base = torch.randn(1031).to(dtype)
    x = base[3:]  # contiguous, but not 16-byte aligned
    assert torch.equal(scale(x, 2.5), ref_scale(x, 2.5))


def test_keeps_the_shape_and_writes_into_out():
    x = torch.randn(4, 33, 5).half()
    out = torch.full_like(x, 7.0)
    result = scale(x, 0.5, out=out)
    assert result is out and out.shape == x.shape
    assert torch.equal(out, ref_scale(x, 0.5))


def test_overflow_rounds_to_infinity_like_torch():
    x = torch.tensor([60000.0, -60000.0, 1.0], dtype=torch.float16)
    assert torch.equal(scale(x, 4.0), ref_scale(x, 4.0))


def test_unsupported_dtype_is_a_type_error():
    with pytest.raises(TypeError, match=r"unsupported dtype torch.int32; supported: float16, bfloat16, float32"):
        scale(torch.arange(4, dtype=torch.int32), 2.0)


def test_out_of_another_dtype_names_out():
    with pytest.raises(TypeError, match="out"):
        scale(torch.randn(8), 2.0, out=torch.empty(8, dtype=torch.float16))


def test_out_of_another_shape_is_blamed_on_out_with_both_shapes():
    with pytest.raises(ValueError, match=r"^'out': expected shape \[8\] \(from 'src'\), got \[9\]$"):
        scale(torch.randn(8), 2.0, out=torch.empty(9))
    with pytest.raises(ValueError, match=r"^'out': expected shape \[2, 4\] \(from 'src'\), got \[4, 2\]$"):
        scale(torch.randn(2, 4), 2.0, out=torch.empty(4, 2))


def test_strided_input_is_rejected_by_the_launcher():
    x = torch.randn(16)[::2]  # a 1-d view with stride 2
    with pytest.raises(ValueError, match="src"):
        scale(x, 2.0)


@pytest.fixture(scope="module")
def launcher():
    """The fp16 launcher itself, called with tensors of any rank as they are."""
    return load_jit("scale", "fp16_t", "false", cuda_files=["elementwise/scale.cuh"],
                    cuda_wrappers=[("scale", "scale<fp16_t, false>")], backend="emu").scale


@pytest.mark.parametrize("shape", [(), (5,), (4, 33, 5), (2, 1, 3, 1, 2, 1, 2, 1, 3, 2)], ids=str)
def test_launcher_takes_any_rank(launcher, shape):
    x = torch.randn(shape).half()
    out = torch.full_like(x, 7.0)
    launcher(out, x, 0.5)
    assert torch.equal(out, ref_scale(x, 0.5))


def test_launcher_errors_name_the_tensor_and_what_was_expected(launcher):
    x = torch.randn(4, 33).half()
    cases = [
        (torch.empty(4, 32, dtype=torch.float16), x, ValueError,
         r"^'out': expected shape \[4, 33\] \(from 'src'\), got \[4, 32\]$"),
        (torch.empty(132, dtype=torch.float16), x, ValueError,
         r"^'out': expected shape \[4, 33\] \(from 'src'\), got \[132\]$"),
        (torch.empty(4, 33), x, TypeError, r"^'out': expected dtype float16, got float32$"),
        (torch.empty(4, 33, dtype=torch.float16), x.float(), TypeError,
         r"^'src': expected dtype float16, got float32$"),
        (torch.empty(33, 4, dtype=torch.float16).t(), x, ValueError, r"^'out': expected a contiguous tensor"),
        (torch.empty(4, 33, dtype=torch.float16), torch.randn(33, 4).half().t(), ValueError,
         r"^'src': expected a contiguous tensor"),
    ]
    for out, src, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            launcher(out, src, 2.0)


def test_specializations_describe_the_builds():
    specializations = next(op for op in registered_ops() if op.qualname == "kernkit::scale").specializations
    specs = specializations(dtypes=[torch.bfloat16, torch.float32, torch.bfloat16], backend="emu")
    assert [s.title for s in specs] == ["scale<bf16_t, false>", "scale<fp32_t, false>"]
    assert all(isinstance(s, JitSpec) and s.backend == "emu" for s in specs)
    with pytest.raises(TypeError, match="unsupported dtype"):
        specializations(dtypes=[torch.int8])


# ----- the kernel-hash cases (python -m kernkit.testing.hashes)


def scale_input(dtype: torch.dtype, size: int, gen: torch.Generator) -> torch.Tensor:
    """Normal values of several magnitudes, and the special values of ``dtype`` (infinities,
    zeros of both signs, the largest finite value, subnormals), no NaN."""
    x = torch.randn(size, generator=gen) * torch.exp2(torch.randint(-20, 21, (size,), generator=gen).float())
    x = x.to(dtype)
    fi = torch.finfo(dtype)
    specials = [float("inf"), float("-inf"), 0.0, -0.0, fi.max, -fi.max, fi.smallest_normal, fi.tiny / 4, -fi.eps]
    for p, value in zip(torch.randperm(size, generator=gen).tolist(), specials[: max(0, size - 1)], strict=False):
        x[p] = value
    if torch.isnan(x).any():
        raise AssertionError("scale inputs must hold no NaN")
    return x


def scale_case(dtype: torch.dtype, n: int, factor: float, *, offset: int = 0, out_view: bool = False) -> Case:
    """``scale`` of ``n`` elements. ``offset``: the input starts ``offset`` elements into its
    buffer (1: misaligned, the scalar path); ``out_view``: ``out=`` is the slice ``[1, n + 1)``
    of a buffer of ``n + 2`` (hashed whole)."""
    name = (f"scale/{SHORT[dtype]}-n{n}-f{factor!r}" + (f"-offset{offset}" if offset else "")
            + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = scale_input(dtype, n + offset, gen)
        x = base[offset:]
        want = ref_scale(x, factor)
        x_d = to_device(base, device)[offset:]
        if out_view:
            buf = scale_input(dtype, n + 2, gen)
            expect = buf.clone()
            expect[1 : n + 1] = want
            buf_d = to_device(buf, device)
            res = ops.scale(x_d, factor, out=buf_d[1 : n + 1])
            if res.data_ptr() != buf_d[1:].data_ptr():
                raise AssertionError(f"{name}: scale(out=...) did not return out")
            return {"out": (buf_d.cpu(), expect)}
        return {"out": (ops.scale(x_d, factor).cpu(), want)}

    return Case(name, "elementwise/scale.cuh", run)


def hash_cases() -> list[Case]:
    """The kernel-hash cases: the three builds, both paths, ``out=`` views."""
    out = []
    for dtype, sizes in ((fp16, (1, 7, 4099)), (bf16, (9, 100003)), (fp32, (5, 4099))):
        for n in sizes:
            for factor in (1.7, -0.3, 1e-40):
                out.append(scale_case(dtype, n, factor))
        out.append(scale_case(dtype, 1031, -2.5, offset=1))
        out.append(scale_case(dtype, 1029, 0.5, out_view=True))
    out.append(scale_case(fp16, 0, 1.7))
    return out


# ----- invalid calls: one bad argument at a time, nothing written (kernkit.testing.invalid)

SCALE_DTYPES = [bf16, fp32]  # two of the three builds; fp16 is the same template


@st.composite
def scale_params(draw):
    return dict(
        dtype=draw(st.sampled_from(SCALE_DTYPES)),
        shape=draw(st.sampled_from([(0,), (1,), (7,), (33,), (3, 5), (2, 3, 4), ()])),
        src_layout=draw(st.sampled_from(["contiguous", "offset"])),
        out=draw(st.sampled_from([None, "contiguous", "offset"])),
        factor=draw(st.sampled_from([1.5, -0.25, 0.0, 3, 1e-30])),
        seed=draw(st.integers(0, 2**16)),
    )


def scale_args(a: Arena, p: dict) -> dict:
    src = a.tensor(p["shape"], p["dtype"], p["src_layout"])
    src.copy_(torch.randn(p["shape"], generator=a.gen).to(p["dtype"]))  # no NaN bit patterns
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    if p["out"] is None:
        out = None
    else:
        out = a.tensor(p["shape"], p["dtype"], p["out"])
    return dict(src=src, factor=p["factor"], out=out)


def _numel(p):
    return math.prod(p["shape"])


SCALE_BAD = [
    Bad("src", "dtype", TypeError,
        lambda a, p, d: a.tensor(p["shape"], d.draw(st.sampled_from(
            [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64, torch.float8_e4m3fn])))),
    Bad("src", "non-contiguous", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([
            a.tensor((max(_numel(p), 2),), p["dtype"], "step2"),
            a.tensor((4, 3), p["dtype"]).t()]))),
    Bad("src", "stride 0 (expand, maybe 2**40 long)", ValueError,
        lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(_numel(p), 2), HUGE])),), p["dtype"], "expand")),
    Bad("src", "meta tensor", ValueError, lambda a, p, d: meta(p["shape"], p["dtype"])),
    Bad("src", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1.0, 2.0], 2.0]))),
    Bad("out", "dtype", TypeError,
        lambda a, p, d: a.tensor(p["shape"], d.draw(st.sampled_from(
            [bf16 if p["dtype"] == fp32 else fp32, fp16, torch.int32, torch.bool])))),
    Bad("out", "elements differ", ValueError,
        lambda a, p, d: a.tensor((_numel(p) + d.draw(st.sampled_from([1, 5])),), p["dtype"])),
    Bad("out", "other shape, same elements", ValueError,
        lambda a, p, d: a.tensor((_numel(p),) if len(p["shape"]) != 1 else (1, _numel(p)), p["dtype"])),
    Bad("out", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((max(_numel(p), 2),), p["dtype"], "step2")),
    Bad("out", "transposed", ValueError, lambda a, p, d: a.tensor((3, 4), p["dtype"]).t()),
    Bad("out", "stride 0 (expand)", ValueError,
        lambda a, p, d: a.tensor((max(_numel(p), 2),), p["dtype"], "expand")),
    Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(p["shape"], p["dtype"])),
    Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
    Bad("src", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(p["shape"], p["dtype"])),
    Bad("out", f"{SHARED}: src shifted", ValueError,
        lambda a, p, d: a.alias(p["args"]["src"], p["shape"], p["dtype"], d.draw(st.sampled_from([1, -1, 5])))),
    Bad("factor", "not a number", TypeError,
        lambda a, p, d: d.draw(st.sampled_from(["2", None, [2.0], torch.tensor(2.0), 1j]))),
]


@invalid_calls(SCALE_BAD, scale_params())
def test_scale_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what.startswith(SHARED):
        p = dict(p, shape=(33,))  # elements to share; the buffer's guard bytes hold the shift
    args = scale_args(a, p)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "out" and bad.what == "transposed":
        args["src"] = a.tensor((3, 4), p["dtype"])  # the same shape, contiguous: only out is wrong
    if bad.arg in ("src", "out") and bad.what in ("non-contiguous", "stride 0 (expand)") and args["out"] is not None:
        other = "out" if bad.arg == "src" else "src"
        args[other] = a.tensor(value.shape, p["dtype"])  # matching sizes: only the layout is wrong
    args[bad.arg] = value
    if args["out"] is None and claims_huge(args["src"]):
        check_unallocatable(lambda: ops.scale(**args), a)
    elif via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a number", "negative bit"):
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.scale(args["src"], args["factor"]), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.scale_out(args["out"], args["src"], args["factor"]), a, bad)
    else:
        check_invalid(lambda: ops.scale(**args), a, bad)


@VALID
@given(p=scale_params())
def test_scale_valid_views_give_the_reference(p):
    """Misaligned starts (the scalar path), tails, 0-d, empty and n-d tensors: torch's
    fp32-then-round result, and nothing else in the buffers written."""
    a = Arena.seeded(p["seed"])
    args = scale_args(a, p)
    want = a.copies()
    src = args["src"]
    expect = (src.float() * torch.tensor(float(p["factor"]), dtype=fp32)).to(p["dtype"])
    if args["out"] is not None:
        a.twin(args["out"], want).view(-1).copy_(expect.view(-1))
    got = ops.scale(**args)
    assert got.shape == (args["out"].shape if args["out"] is not None else src.shape)
    assert torch.equal(got.reshape(-1).view(torch.uint8), expect.reshape(-1).view(torch.uint8))
    assert a.same_as(want)
