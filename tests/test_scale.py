"""kernkit.ops.scale on CPU tensors, through the CPU emulator: the same kernel template the GPU
runs, bit-exact against torch, and its errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec, load_jit
from kernkit.ops import registered_ops, scale
from kernkit.testing.invalid import SHARED, VALID, Arena, check_invalid, check_unallocatable, claims_huge, invalid_calls
from kernkit.testing.ops.scale import SCALE_BAD, bf16, fp32, ref_scale

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


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
