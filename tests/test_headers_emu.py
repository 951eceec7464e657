"""Value tests of the header library's device functions.

The kernels in ``tests/csrc/headers_kernels.cuh`` run each helper over tensors; the results are
compared with torch. Here they run on the CPU emulator (``backend="emu"``, CPU tensors);
``tests/gpu/test_headers_gpu.py`` runs the very same tests on a GPU by overriding the
``backend`` fixture.

Exactness. Reductions, max/min/abs, casts (fp8 included) and the atomics are compared bit for
bit: the warp and CTA reductions combine values in a fixed butterfly order, which the reference
replays in the same dtype, so even floating-point sums match exactly. Only fp32 ``rsqrt``,
``exp``, ``sin`` and ``cos`` are approximate on the GPU and are compared with a tolerance, and
``ex2_approx``, ``rcp_approx`` and ``tanh_approx``: bit for bit with their documented CPU
evaluation on the emulator, within the PTX ISA's stated error on the GPU.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

CSRC = Path(__file__).resolve().parent / "csrc"
KERNELS = CSRC / "headers_kernels.cuh"

WRAPPERS = [
    ("warp_reduce", "headers_test::Reduce::warp"),
    ("cta_reduce", "headers_test::Reduce::cta"),
    ("identity", "headers_test::Reduce::identity"),
    ("cast", "headers_test::cast"),
    ("math", "headers_test::math"),
    ("atomic_minmax", "headers_test::atomic_minmax"),
    ("vector_max", "headers_test::vector_max"),
    ("tile_abs", "headers_test::tile_abs"),
    ("ieee_math", "headers_test::ieee_math"),
    ("approx_math", "headers_test::approx_math"),
]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FLOATS = [torch.float32, torch.float16, torch.bfloat16, E4M3, E5M2]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
SCALARS = FLOATS + INTS
#: (element dtype, lanes) of every value type: scalars, then the packed x2 and x4 types.
VALUE_TYPES = [(d, 1) for d in SCALARS] + [(d, 2) for d in FLOATS] + [(d, 4) for d in (torch.float32, E4M3, E5M2)]
SUM, MAX, MIN = 0, 1, 2
OPS = {"sum": SUM, "max": MAX, "min": MIN}


def _name(dtype: torch.dtype, lanes: int = 1) -> str:
    return str(dtype).removeprefix("torch.") + (f"x{lanes}" if lanes > 1 else "")


def _is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (E4M3, E5M2)


def _cuda_headers_present() -> bool:
    home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    return (home / "include" / "cuda_runtime.h").is_file()


@pytest.fixture(scope="module")
def backend() -> str:
    """Where the kernels run: the CPU emulator here; the GPU module overrides this."""
    return "emu"


@pytest.fixture(scope="module")
def mod(backend):
    """The test kernels, built once per backend."""
    from kernkit.jit import load_jit

    if backend == "emu" and not _cuda_headers_present():
        pytest.skip("the CPU emulator needs the CUDA headers (set CUDA_HOME)")
    if backend != "emu" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return load_jit("headers_test", cuda_files=[str(KERNELS)], cuda_wrappers=WRAPPERS, backend=backend)


@pytest.fixture(scope="module")
def dev(backend) -> str:
    """The torch device of the tensors handed to the kernels."""
    return "cpu" if backend == "emu" else "cuda"


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _random(dtype: torch.dtype, shape, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * scale).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -100), min(info.max, 100)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a tensor, as an integer tensor of the same element size."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view)


def assert_bitwise_equal(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """Equal bit patterns, except that any NaN matches any NaN."""
    got, want = got.cpu(), want.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, msg
    if got.dtype.is_floating_point:
        gnan, wnan = got.float().isnan(), want.float().isnan()
        assert torch.equal(gnan, wnan), f"{msg}: NaN positions differ"
        got, want = got[~gnan], want[~wnan]
    ok = _bits(got) == _bits(want)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:8].flatten().tolist()
        pytest.fail(f"{msg}: {int((~ok).sum())} mismatches, e.g. at {bad}: got {got.flatten()[bad].tolist()}, "
                    f"want {want.flatten()[bad].tolist()}")


def _combine(op: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One reduction step in the values' own dtype (fp8 through fp32, which is exact for
    max/min)."""
    if op == SUM:
        return a + b
    if _is_fp8(a.dtype):
        f = torch.maximum if op == MAX else torch.minimum
        return f(a.float(), b.float()).to(a.dtype)
    return torch.maximum(a, b) if op == MAX else torch.minimum(a, b)


def _butterfly(v: torch.Tensor, masks, op: int) -> torch.Tensor:
    """Replay the xor-shuffle butterfly over dim 1 (the 32 lanes of a warp)."""
    lanes = torch.arange(32)
    for m in masks:
        v = _combine(op, v, v[:, lanes ^ m])
    return v


def _identity(dtype: torch.dtype, op: int) -> float:
    if op == SUM:
        return 0
    if dtype.is_floating_point:
        big = 448.0 if dtype == E4M3 else math.inf
        return -big if op == MAX else big
    info = torch.iinfo(dtype)
    return info.min if op == MAX else info.max


# ---------------------------------------------------------------------------------------------
# warp.cuh / cta.cuh / ReductionTrait
# ---------------------------------------------------------------------------------------------

WIDTHS = [1, 2, 4, 8, 16, 32]


#: (dtype, lanes, op) of every reduction the headers define: no SUM for fp8.
WARP_CASES = [(d, n, op) for op in OPS for d, n in VALUE_TYPES if not (op == "sum" and _is_fp8(d))]


@pytest.mark.parametrize("dtype,lanes,op", WARP_CASES, ids=[f"{_name(d, n)}-{op}" for d, n, op in WARP_CASES])
def test_warp_reduce_all_widths(mod, dev, dtype, lanes, op):
    op = OPS[op]
    n = 256
    shape = (n,) if lanes == 1 else (n, lanes)
    x = _random(dtype, shape, seed=lanes * 100 + op)
    out = torch.zeros((13, *shape), dtype=dtype, device=dev)
    mod.warp_reduce(x.to(dev), out, op, lanes)
    out = out.cpu()
    warps = x.view(n // 32, 32, *shape[1:])
    for k, w in enumerate(WIDTHS):
        inner = [w >> s for s in range(1, 6) if w >> s >= 1]
        outer = [m for m in (1, 2, 4, 8, 16) if m >= w]
        for row, masks in ((2 * k, inner), (2 * k + 1, outer)):
            want = _butterfly(warps, masks, op).reshape(shape)
            assert_bitwise_equal(out[row], want, f"width {w}, {'inner' if row % 2 == 0 else 'outer'}")
    assert_bitwise_equal(out[12], out[10], "reduce_sum/max/min vs reduce<Op, 32>")
    # And against torch's own reduction over each warp (exact for max/min and integers).
    full = out[10].view(n // 32, 32, *shape[1:])[:, 0]
    if op != SUM or not dtype.is_floating_point:
        ref = {SUM: lambda t: t.sum(1, dtype=dtype), MAX: lambda t: t.float().amax(1).to(dtype) if _is_fp8(dtype)
               else t.amax(1), MIN: lambda t: t.float().amin(1).to(dtype) if _is_fp8(dtype) else t.amin(1)}[op]
        assert_bitwise_equal(full, ref(warps), "vs torch")
    else:
        torch.testing.assert_close(full.float(), warps.float().sum(1), rtol=2e-2, atol=0.5)


CTA_CASES = [(d, n, op) for op in OPS for d, n in [(torch.float32, 1), (torch.float16, 1), (torch.bfloat16, 1),
                                                    (E4M3, 1), (torch.int32, 1), (torch.int64, 1), (torch.int8, 1),
                                                    (torch.float16, 2), (torch.float32, 4)]
             if not (op == "sum" and _is_fp8(d))]


@pytest.mark.parametrize("block", [32, 96, 256, 1024])
@pytest.mark.parametrize("dtype,lanes,op", CTA_CASES, ids=[f"{_name(d)}-{n}-{op}" for d, n, op in CTA_CASES])
def test_cta_reduce(mod, dev, dtype, lanes, op, block):
    op = OPS[op]
    blocks = 3
    rest = () if lanes == 1 else (lanes,)
    x = _random(dtype, (blocks * block, *rest), seed=block + op)
    out = torch.zeros((blocks, *rest), dtype=dtype, device=dev)
    mod.cta_reduce(x.to(dev), out, op, lanes, block)
    # Reference: a butterfly per warp, then one over the warp partials padded with the identity.
    masks = (16, 8, 4, 2, 1)
    warps = x.view(blocks * block // 32, 32, *rest)
    partial = _butterfly(warps, masks, op)[:, 0].view(blocks, block // 32, *rest)
    ident = _identity(dtype, op)
    pad = torch.full((blocks, 32 - block // 32, *rest), ident, dtype=torch.float64).to(dtype) \
        if dtype.is_floating_point else torch.full((blocks, 32 - block // 32, *rest), ident, dtype=dtype)
    want = _butterfly(torch.cat([partial, pad], 1), masks, op)[:, 0]
    assert_bitwise_equal(out, want, "cta reduce")


@pytest.mark.parametrize("dtype,lanes", VALUE_TYPES, ids=[_name(d, n) for d, n in VALUE_TYPES])
def test_reduction_identity(mod, dev, dtype, lanes):
    shape = (3,) if lanes == 1 else (3, lanes)
    out = torch.zeros(shape, dtype=dtype, device=dev)
    mod.identity(out, lanes)
    values = [_identity(dtype, MAX), _identity(dtype, MIN), 0]
    want = torch.tensor(values, dtype=torch.float64).to(dtype) if dtype.is_floating_point else \
        torch.tensor(values, dtype=dtype)
    if lanes > 1:
        want = want[:, None].expand(shape).contiguous()
    if _is_fp8(dtype):
        out[2] = 0  # no SUM identity for fp8: the kernel leaves it alone
    assert_bitwise_equal(out, want)


# ---------------------------------------------------------------------------------------------
# Casts
# ---------------------------------------------------------------------------------------------

SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, 1.0 / 3, 448.0, 449.0, 464.0, 465.0, 479.0, 480.0, 500.0, -1000.0, 57344.0,
            61439.0, 61440.0, 65504.0, 65520.0, 1e5, -1e30, 2.0**-6, 2.0**-9, 2.0**-10, 2.0**-10 * 1.5, 2.0**-16,
            2.0**-17, 2.0**-18, 2.0**-24, 2.0**-25, 1.0009765625, 1.0625, 1.1875, 3.4e38, -3.4e38, 1e-40,
            math.inf, -math.inf, math.nan]


def _cast_input(src: torch.dtype, dst: torch.dtype, n: int) -> torch.Tensor:
    """Random values plus edge cases (fp8 ties, saturation, subnormals, inf, NaN) that are
    representable in `src` and, for integer destinations, in range."""
    g = torch.Generator().manual_seed(7)
    if dst.is_floating_point:
        vals = torch.cat([torch.tensor(SPECIALS, dtype=torch.float64),
                          torch.randn(n, generator=g, dtype=torch.float64)
                          * torch.logspace(-8, 6, n, dtype=torch.float64)])
        if src.is_floating_point:
            return vals.to(src)
        info = torch.iinfo(src)
        return vals.nan_to_num(0, 0, 0).clamp(info.min, info.max).to(torch.int64).to(src)
    info = torch.iinfo(dst)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    if src.is_floating_point:
        lo, hi = max(lo, -400), min(hi, 400)  # inside every float format's range
        vals = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
        return vals.to(src).float().clamp(lo, hi).to(src)
    sinfo = torch.iinfo(src)
    return torch.randint(max(lo, sinfo.min), min(hi, sinfo.max) + 1, (n,), generator=g).to(src)


def reference_cast(x: torch.Tensor, dst: torch.dtype) -> torch.Tensor:
    """torch's cast, with E4M3 saturating: out-of-range values and infinities become +-448, NaN
    stays NaN. kernkit's casts saturate E4M3 (``__NV_SATFINITE``); torch's own cast agrees from
    2.13 on, while torch 2.11 gives NaN there, so the reference spells the rule out instead of
    depending on the installed torch. Clamping in fp32 first is exact for every source type the
    tests use (all reach fp8 through fp32), and leaves in-range values to torch's rounding."""
    if dst == E4M3:
        return x.to(torch.float32).clamp(-448.0, 448.0).to(dst)
    return x.to(dst)


@pytest.mark.parametrize("dst", SCALARS, ids=_name)
@pytest.mark.parametrize("src", SCALARS, ids=_name)
def test_cast_scalar(mod, dev, src, dst):
    x = _cast_input(src, dst, 300)
    out = torch.empty(x.shape, dtype=dst, device=dev)
    mod.cast(x.to(dev), out, 1)
    assert_bitwise_equal(out, reference_cast(x, dst), f"{_name(src)} -> {_name(dst)}")


PACKED2 = [torch.float32, torch.float16, torch.bfloat16, E4M3, E5M2]
PACKED4 = [torch.float32, E4M3, E5M2]


@pytest.mark.parametrize("lanes,src,dst", [(2, s, d) for s in PACKED2 for d in PACKED2] +
                         [(4, s, d) for s in PACKED4 for d in PACKED4],
                         ids=lambda v: _name(v) if isinstance(v, torch.dtype) else f"x{v}")
def test_cast_packed(mod, dev, lanes, src, dst):
    x = _cast_input(src, dst, 4 * 64 - len(SPECIALS))[: 4 * 64 // lanes * lanes].view(-1, lanes)
    out = torch.empty(x.shape, dtype=dst, device=dev)
    mod.cast(x.to(dev), out, lanes)
    assert_bitwise_equal(out, reference_cast(x, dst), f"{_name(src, lanes)} -> {_name(dst, lanes)}")


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=_name)
def test_fp8_round_trip_every_encoding(mod, dev, fmt):
    """All 256 encodings: fp8 -> fp32 -> fp8 and fp8 -> fp16 -> fp8 give the same bits (NaN
    aside), and fp8 -> fp32 matches torch."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt)
    wide = torch.empty(256, dtype=torch.float32, device=dev)
    mod.cast(codes.to(dev), wide, 1)
    assert_bitwise_equal(wide, codes.float(), "fp8 -> fp32")
    back = torch.empty(256, dtype=fmt, device=dev)
    mod.cast(wide, back, 1)
    assert_bitwise_equal(back, codes, "fp32 -> fp8")
    half = torch.empty(256, dtype=torch.float16, device=dev)
    mod.cast(codes.to(dev), half, 1)
    mod.cast(half, back, 1)
    assert_bitwise_equal(back, codes, "fp16 -> fp8")


def test_fp8_saturation(mod, dev):
    """E4M3 saturates to +-448 (infinities included); E5M2 overflows to +-inf."""
    x = torch.tensor([1e4, -1e4, math.inf, -math.inf, 470.0, 57344.0, 61440.0, 1e6], dtype=torch.float32)
    for fmt, want in ((E4M3, [448, -448, 448, -448, 448, 448, 448, 448]),
                      (E5M2, [10240, -10240, math.inf, -math.inf, 448, 57344, math.inf, math.inf])):
        out = torch.empty(x.shape, dtype=fmt, device=dev)
        mod.cast(x.to(dev), out, 1)
        assert out.cpu().float().tolist() == want
        assert_bitwise_equal(out, reference_cast(x, fmt))


# ---------------------------------------------------------------------------------------------
# math.cuh and unpack
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,lanes", VALUE_TYPES, ids=[_name(d, n) for d, n in VALUE_TYPES])
def test_math_exact(mod, dev, dtype, lanes):
    n = 200
    shape = (n,) if lanes == 1 else (n, lanes)
    a, b = _random(dtype, shape, seed=1), _random(dtype, shape, seed=2)
    if dtype.is_signed and not dtype.is_floating_point:
        a.view(-1)[0] = torch.iinfo(dtype).min  # abs keeps the most negative value
    out = torch.zeros((9, *shape), dtype=dtype, device=dev)
    mod.math(a.to(dev), b.to(dev), out, lanes)
    out = out.cpu()
    f = (lambda t: t.float()) if _is_fp8(dtype) else (lambda t: t)
    assert_bitwise_equal(out[0], f(a).abs().to(dtype) if not (dtype.is_signed and not dtype.is_floating_point)
                         else a.abs(), "abs")
    assert_bitwise_equal(out[1], torch.maximum(f(a), f(b)).to(dtype), "max")
    assert_bitwise_equal(out[2], torch.minimum(f(a), f(b)).to(dtype), "min")
    assert_bitwise_equal(out[3], _bits(a).flip(-1).view(dtype) if lanes > 1 else a, "unpack")


def test_math_fp32(mod, dev):
    g = torch.Generator().manual_seed(3)
    a = torch.cat([torch.randn(500, generator=g) * 4, torch.tensor([0.0, 1.0, 2.0, 1e-30, 1e30, 87.0, -87.0])])
    a[-2:] = a[-2:].clamp(-80, 80)
    b = torch.zeros_like(a)
    out = torch.zeros((9, a.numel()), device=dev)
    mod.math(a.to(dev), b.to(dev), out, 1)
    out = out.cpu()
    ax = a.abs()
    # The reference rounds the double-precision root once (exact: 53 >= 2 * 24 + 2 bits);
    # torch's own float32 sqrt on the CPU is not always correctly rounded.
    assert_bitwise_equal(out[4], ax.double().sqrt().float(), "sqrt is correctly rounded")
    finite = ax > 0
    torch.testing.assert_close(out[5][finite], ax[finite].rsqrt(), rtol=1e-6, atol=0)
    # __expf on the GPU: about 2 + 1.2 * |x| / ln 2 ulp.
    ref = a.double().exp()
    fin = ref.isfinite() & (ref < 3e38)
    assert torch.equal(out[6][~fin], ref[~fin].float()), "exp overflow"
    rel = ((out[6].double() - ref) / ref).abs()[fin]
    assert bool((rel <= 2.0**-23 * (4 + 2 * a.double().abs()[fin] / math.log(2))).all()), float(rel.max())
    torch.testing.assert_close(out[7], a.sin(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[8], a.cos(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# atomic.cuh
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["mixed", "all_negative", "init_above", "zeros"])
def test_atomic_max_min(mod, dev, case):
    g = torch.Generator().manual_seed(5)
    m = 7
    if case == "zeros":
        x = torch.tensor([-0.0] * 20 + [0.0] + [-0.0] * 20)
        m = 1
    else:
        x = torch.randn(3001, generator=g) * 100
        if case == "all_negative":
            x = -x.abs() - 1
    init_max = torch.full((m,), -math.inf)
    init_min = torch.full((m,), math.inf)
    if case == "init_above":
        x = -x.abs() - 1
        init_max = torch.full((m,), -0.5)  # every value is below: max must keep it
        init_min = torch.full((m,), -1e9)  # every value is above: min must keep it
    out_max, out_min = init_max.to(dev), init_min.to(dev)
    mod.atomic_minmax(x.to(dev), out_max, out_min)
    idx = torch.arange(x.numel()) % m
    want_max = init_max.scatter_reduce(0, idx, x, "amax")
    want_min = init_min.scatter_reduce(0, idx, x, "amin")
    if case == "zeros":  # -0.0 < +0.0 for both
        want_max, want_min = torch.tensor([0.0]), torch.tensor([-0.0])
    assert_bitwise_equal(out_max, want_max, "atomic max")
    assert_bitwise_equal(out_min, want_min, "atomic min")


# ---------------------------------------------------------------------------------------------
# vec.cuh / tile.cuh
# ---------------------------------------------------------------------------------------------

MEMORY_TYPES = [torch.float32, torch.float16, torch.bfloat16, E4M3, torch.int8, torch.int32, torch.int64]


#: (dtype, vector bytes) of every vector of whole elements.
VECTOR_CASES = [(d, b) for d in MEMORY_TYPES for b in (1, 2, 4, 8, 16, 32) if b >= d.itemsize]


@pytest.mark.parametrize("dtype,vec_bytes", VECTOR_CASES, ids=[f"{_name(d)}-{b}" for d, b in VECTOR_CASES])
def test_aligned_vector_tails(mod, dev, dtype, vec_bytes):
    size = torch.empty((), dtype=dtype).element_size()
    vec_n = vec_bytes // size
    fill = 0.5 if dtype.is_floating_point else 3
    for n in sorted({0, 1, vec_n - 1, vec_n, vec_n + 1, 7 * vec_n + 3, 1000}):
        x = _random(dtype, (n,), seed=n)
        out = torch.zeros(n, dtype=dtype, device=dev)
        mod.vector_max(x.to(dev), out, fill, vec_bytes)
        want = torch.maximum(x.float(), torch.tensor(float(fill))).to(dtype) if _is_fp8(dtype) else \
            torch.maximum(x, torch.tensor(fill, dtype=dtype))
        assert_bitwise_equal(out, want, f"n={n}")


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["cta", "cta_vector_and_tail", "warp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, E4M3, torch.int8, torch.int64], ids=_name)
def test_tile_memory_tails(mod, dev, dtype, mode):
    for block in (32, 96):
        for n in (0, 1, 31, 32, 33, block - 1, block + 1, 1000, 1029):
            x = _random(dtype, (n,), seed=n + block)
            out = torch.zeros(n, dtype=dtype, device=dev)
            mod.tile_abs(x.to(dev), out, mode, block)
            want = x.float().abs().to(dtype) if _is_fp8(dtype) else x.abs()
            assert_bitwise_equal(out, want, f"block={block}, n={n}")

# ---------------------------------------------------------------------------------------------
# ----- ieee math: exp_ieee, erf_ieee, erfc_ieee, tanh_ieee (math.cuh), against float64
# ---------------------------------------------------------------------------------------------

#: The bounds math.cuh's doc comments state, in fp32 ulps of the float64 value (units of 2**-149
#: for subnormal values).
IEEE_MAX_ULPS = {"exp": 1.0, "erf": 2.0, "erfc": 5.0, "tanh": 2.0}
IEEE_REFS = {"exp": torch.exp, "erf": torch.erf, "erfc": torch.erfc, "tanh": torch.tanh}


def _fp32_ulps(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| in ulps of fp32 at ref (ref float64 and finite in fp32)."""
    _, e = torch.frexp(ref.abs())
    ulp = torch.where(ref.abs() < 2.0**-126, torch.full_like(ref, 2.0**-149), torch.ldexp(torch.ones_like(ref), e - 24))
    return (got.double() - ref).abs() / ulp


def _ieee_run(mod, dev, a: torch.Tensor) -> dict[str, torch.Tensor]:
    out = torch.full((4, a.numel()), 7.0, device=dev)
    mod.ieee_math(a.to(dev), out)
    out = out.cpu()
    return dict(zip(IEEE_REFS, out, strict=True))


def _ieee_sweep() -> torch.Tensor:
    """Dense sweeps over each function's interesting range (every polynomial piece and its
    boundaries, the subnormal results of exp and erfc, the overflow of exp) and random values."""
    g = torch.Generator().manual_seed(11)
    parts = [torch.linspace(-104.0, 89.0, 120001), torch.linspace(-6.0, 11.0, 100001), torch.linspace(-1.0, 1.0, 20001),
             torch.linspace(-1e-3, 1e-3, 2001), torch.linspace(88.5, 88.8, 2001), torch.linspace(-104.0, -87.0, 5001),
             torch.randn(20000, generator=g) * 10]
    for edge in (0.5, 0.625, 2.0, 10.06):  # both sides of every piece boundary, a few ulps apart
        x = torch.tensor(edge).view(torch.int32) + torch.arange(-8, 9, dtype=torch.int32)
        parts += [x.view(torch.float32), -x.view(torch.float32)]
    return torch.cat(parts).float()


def test_ieee_math_error_bounds(mod, dev):
    a = _ieee_sweep()
    got = _ieee_run(mod, dev, a)
    for name, fn in IEEE_REFS.items():
        ref = fn(a.double())
        finite = ref.float().isfinite()
        assert torch.equal(got[name][~finite], ref[~finite].float()), f"{name}: overflow to inf"
        err = _fp32_ulps(got[name][finite], ref[finite])
        worst = int(err.argmax())
        assert float(err.max()) <= IEEE_MAX_ULPS[name], (
            f"{name}: {float(err.max()):.3f} ulp at x = {a[finite][worst].item()!r}")
        assert float(err.max()) > 0.0, f"{name}: exactly the float64 value everywhere: not the kernel's result"


def test_ieee_math_special_values(mod, dev):
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([0.0, -0.0, inf, -inf, nan, 88.72283, 88.72284, -103.97, -103.98, -87.33655, 1e-30, -1e-30,
                      1e-45, 20.0, -20.0, 10.0])
    got = _ieee_run(mod, dev, a)
    assert got["exp"][:5].tolist()[:4] == [1.0, 1.0, inf, 0.0] and got["exp"][4].isnan()
    assert got["exp"][5].isfinite() and got["exp"][6] == inf, "exp overflows exactly past FLT_MAX"
    assert got["exp"][7] > 0 and got["exp"][8] == 0, "exp underflows to 0 past half the smallest subnormal"
    assert 0 < got["exp"][9] < 2.0**-126 * 1.01, "subnormal results"
    for name in ("erf", "tanh"):  # odd, exact at 0 (signs kept), +-1 at infinity
        v = got[name]
        assert v[0].item() == 0.0 and not v[0].signbit() and v[1].item() == 0.0 and v[1].signbit(), name
        assert v[2].item() == 1.0 and v[3].item() == -1.0 and v[4].isnan(), name
        assert torch.equal(v[11], -v[10]) and v[13].item() == 1.0 and v[14].item() == -1.0, name
    assert got["tanh"][10].item() == a[10].item(), "tanh(x) = x for tiny x"
    tiny_erf = float(_fp32_ulps(got["erf"][10:11], torch.erf(a[10:11].double())))
    assert tiny_erf <= 1.0, "erf(x) = 2x / sqrt(pi) for tiny x"
    erfc = got["erfc"]
    assert erfc[0].item() == 1.0 and erfc[2].item() == 0.0 and erfc[3].item() == 2.0 and erfc[4].isnan()
    assert erfc[13].item() == 0.0 and 0.0 < erfc[15].item() < 2.0**-126, "erfc(10) is subnormal, erfc(20) is 0"


# ---------------------------------------------------------------------------------------------
# ----- approximate math: ex2_approx, rcp_approx, tanh_approx (math.cuh)
# ---------------------------------------------------------------------------------------------


def _flush(t: torch.Tensor) -> torch.Tensor:
    """Subnormal fp32 values replaced by zeros of their sign (``.ftz``)."""
    return torch.where(t.abs() < 2.0**-126, t * 0, t)


def _approx_sweep() -> torch.Tensor:
    g = torch.Generator().manual_seed(12)
    parts = [torch.linspace(-130.0, 130.0, 100001), torch.linspace(-2.0, 2.0, 20001),
             torch.randn(20000, generator=g) * 30,
             torch.exp2(torch.linspace(-149.0, 127.0, 20001)), -torch.exp2(torch.linspace(-149.0, 127.0, 2001)),
             torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40, -1e-40, 2.0**126 * 1.5, 3e38])]
    return torch.cat(parts).float()


def test_approx_math(mod, dev):
    """The emulator gives exactly the documented evaluation (``exp2``/``tanh`` in float64
    rounded once, the IEEE ``1 / x``, subnormals flushed for ex2/rcp); the GPU stays within
    PTX's stated error: ex2 2 ulp of the correctly rounded value, rcp 1 ulp, tanh 2**-11
    relative. Both: the documented special values."""
    a = _approx_sweep()
    out = torch.full((3, a.numel()), 7.0, device=dev)
    mod.approx_math(a.to(dev), out)
    ex2, rcp, tanh = out.cpu()
    want_ex2 = _flush(torch.exp2(_flush(a).double()).float())
    want_rcp = _flush(1.0 / _flush(a).double()).float()
    want_tanh = torch.tanh(a.double()).float()
    if dev == "cpu":
        for name, got, want in (("ex2", ex2, want_ex2), ("rcp", rcp, want_rcp), ("tanh", tanh, want_tanh)):
            assert_bitwise_equal(got, want, name)
        return
    for name, got, want, ulps in (("ex2", ex2, want_ex2, 2.0), ("rcp", rcp, want_rcp, 1.0)):
        finite = want.isfinite() & (want != 0)
        assert torch.equal(got[~finite], want[~finite]), f"{name}: special values"
        err = _fp32_ulps(got[finite], want[finite].double())
        assert float(err.max()) <= ulps + 0.5, f"{name}: {float(err.max()):.3f} ulp"
    rel = ((tanh.double() - torch.tanh(a.double())).abs() / torch.tanh(a.double()).abs().clamp_min(2.0**-149))
    assert float(rel[a != 0].max()) <= 2.0**-11, f"tanh: relative error {float(rel.max()):.3g}"
    assert tanh[a == float("inf")].eq(1).all() and tanh[a == float("-inf")].eq(-1).all()
