"""The oracle's shared parts: how to reach an op's torch reference, and the exact arithmetic
that references of several ops use.

An op's reference lives in its test module, ``tests/test_<name>.py``, next to its hash cases and
its invalid calls: ``op_tests(name)`` imports that module. A reference computes what the kernel
must produce on valid arguments, and checks nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

import kernkit


def tests_dir() -> Path:
    """``tests/`` of the source checkout kernkit is imported from.

    Raises
    ------
    FileNotFoundError
        kernkit is installed without its tests (not an editable install of a checkout).
    """
    tests = Path(kernkit.__file__).resolve().parent.parent / "tests"
    if not tests.is_dir():
        raise FileNotFoundError(f"kernkit.testing needs kernkit's source checkout: no {tests} next to the "
                                "kernkit package (install the checkout with `pip install -e .[test]`)")
    return tests


def load(path: str | Path) -> ModuleType:
    """Import the Python file ``path`` as the module named by its stem, once, as pytest does: a
    test module pytest already imported is that module, not a copy.

    Parameters
    ----------
    path
        A test module, e.g. ``tests/test_rotary_embedding.py``.

    Returns
    -------
    The module.

    Raises
    ------
    ImportError
        Another file of the same stem is imported already, or ``path`` is not a Python file.
    """
    path = Path(path).resolve()
    known = sys.modules.get(path.stem)
    if known is not None:
        if Path(getattr(known, "__file__", "") or "").resolve() != path:
            raise ImportError(f"cannot import {path}: a module named {path.stem!r} is imported from {known.__file__}")
        return known
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
    return module


def op_tests(name: str) -> ModuleType:
    """The test module of op ``name`` (``tests/test_<name>.py``), with its reference.

    Example
    -------
    .. code-block:: python

        rope = op_tests("rotary_embedding")
        rope.ref_rotary_embedding(positions, q, k, cos_sin_cache, is_neox=True)
    """
    return load(tests_dir() / f"test_{name}.py")


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
