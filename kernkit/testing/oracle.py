"""The exact arithmetic that the references of several ops share, and the byte comparisons
of their results.

An op's reference lives in its test material, ``kernkit.testing.ops.<name>``, next to its hash
cases and its invalid calls. A reference computes what the kernel must produce on valid
arguments, and checks nothing.
"""

from __future__ import annotations

import torch


def rand_bits(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random bytes viewed as ``dtype`` (any bit pattern: NaN payloads, -0.0, subnormals)."""
    elem = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * elem), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``, on the CPU, in logical order."""
    return t.detach().cpu().contiguous().view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` have one shape and dtype and the same bytes (NaN payloads and -0.0
    compared as bits)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))


def bytes_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as uint8 (its last dimension scaled by the element size): copies keep every bit
    (NaN payloads, -0.0) and work for dtypes index_put does not take (fp8)."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` of fp32 tensors with one rounding to fp32, as ``__fmaf_rn``. The product is
    exact in float64 (2 * 24 <= 53 bits); the sum is rounded to odd (TwoSum gives its error, and
    an inexact sum with an even last bit steps one float64 toward the exact value), and a value
    rounded to odd with 53 >= 24 + 2 bits rounds to fp32 as the exact one would. Finite values
    whose exact result fits float64; an infinite or NaN result is the one float64 gives."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bb = s - p
    e = (p - (s - bb)) + (cd - bb)  # s + e == p + c exactly
    step = (e != 0) & (s.view(torch.int64) % 2 == 0) & s.isfinite()
    s = torch.where(step, torch.nextafter(s, torch.where(e > 0, torch.inf, -torch.inf).double()), s)
    return s.float()


def rsqrt32(v: torch.Tensor) -> torch.Tensor:
    """``1 / sqrt(v)`` of an fp32 tensor correctly rounded to fp32, as ``__frsqrt_rn``: the
    float64 root and division, rounded to fp32 (correct for every fp32 input; test_rmsnorm.py checks
    every input of [1, 4), to which scaling by powers of 4 reduces the others)."""
    return (1.0 / torch.sqrt(v.double())).float()


#: Significand bits after the point and the smallest subnormal of each float dtype.
_FLOAT_BITS = {torch.float32: (23, 2.0**-149), torch.float16: (10, 2.0**-24), torch.bfloat16: (7, 2.0**-133)}


def ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at each (float64) value of ``ref``; the smallest
    subnormal below the normal range."""
    bits, tiny = _FLOAT_BITS[dtype]
    _, e = torch.frexp(ref.abs())
    return torch.ldexp(torch.ones_like(ref), e - 1 - bits).clamp_min(tiny)
