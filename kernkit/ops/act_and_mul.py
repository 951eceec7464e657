"""``silu_and_mul`` and ``gelu_and_mul``: the gated activations of SwiGLU / GeGLU MLPs,
``act(x[..., :d]) * x[..., d:]``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from .registry import register_op

#: The dtypes ``silu_and_mul`` and ``gelu_and_mul`` are specialized for.
ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The activations, as the kernel's ``kAct`` template argument (``kActSilu``... in the .cuh).
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}

#: ``gelu_and_mul``'s ``approximate`` values and the activation each selects.
GELU_APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}


def act_and_mul_spec(activation: str, dtype: torch.dtype, backend: str | None = None) -> JitSpec:
    """The build of one specialization: ``activation`` (a key of ``ACTIVATIONS``) for ``dtype``;
    the factories below and ``warmup`` share it."""
    if dtype not in ACT_DTYPES:
        raise TypeError(f"'x': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    args = make_cpp_args(dtype, ACTIVATIONS[activation], backend != "emu" and is_arch_support_pdl())
    return JitSpec.make(f"{activation}_and_mul", *args, cuda_files=["activation/act_and_mul.cuh"],
                        cuda_wrappers=[("act_and_mul", f"act_and_mul<{args}>")], backend=backend)


@cache_once
def _silu_module(dtype: torch.dtype, is_cuda: bool):
    return act_and_mul_spec("silu", dtype, None if is_cuda else "emu").build_and_load()


def _gelu_activation(approximate: object) -> str:
    """The activation ``approximate`` selects; a TypeError/ValueError naming it otherwise."""
    if not isinstance(approximate, str):
        raise TypeError(f"'approximate': expected a str ('none' or 'tanh'), got {type(approximate).__name__}")
    if approximate not in GELU_APPROXIMATE:
        raise ValueError(f"'approximate': expected 'none' or 'tanh', got {approximate!r}")
    return GELU_APPROXIMATE[approximate]


@cache_once
def _gelu_module(approximate: str, dtype: torch.dtype, is_cuda: bool):
    # Runs once per key: the place for checking `approximate` (cache_once names it when it does
    # not even hash).
    return act_and_mul_spec(_gelu_activation(approximate), dtype, None if is_cuda else "emu").build_and_load()


def _out(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    # [..., 2 d] -> [..., d]; a 0-d x gets a placeholder that the launcher never writes (it
    # refuses x, naming it).
    shape = x.shape
    return x.new_empty((*shape[:-1], shape[-1] // 2) if shape else (0,))


def _specializations(activations: Sequence[str], dtypes: Sequence[torch.dtype] = ACT_DTYPES,
                     backend: str | None = None) -> list[JitSpec]:
    return [act_and_mul_spec(a, d, backend) for a in activations for d in dict.fromkeys(dtypes)]


def _silu_specializations(dtypes: Sequence[torch.dtype] = ACT_DTYPES, backend: str | None = None,
                          **unused: object) -> list[JitSpec]:
    return _specializations(["silu"], dtypes, backend)


def _gelu_specializations(dtypes: Sequence[torch.dtype] = ACT_DTYPES, backend: str | None = None,
                          approximate: Sequence[str] = tuple(GELU_APPROXIMATE), **unused: object) -> list[JitSpec]:
    if isinstance(approximate, str):
        approximate = [approximate]
    return _specializations([_gelu_activation(a) for a in dict.fromkeys(approximate)], dtypes, backend)


@register_op(fake=_out, specializations=_silu_specializations)
def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` with ``silu(v) = v / (1 + exp(-v))``, computed in fp32
    and rounded once to ``x.dtype``.

    Accuracy against a float64 evaluation of the same formula on the same inputs
    (``kernkit/kernels/activation/act_and_mul.cuh``), in ulps of the result's dtype (subnormal
    results: in units of the dtype's smallest subnormal):

    - bf16: within 0.51 ulp; fp16: within 0.51 ulp. On the GPU ``exp`` and the reciprocal are
      the hardware's approximations (``ex2.approx``, ``rcp.approx``: relative errors below
      2**-21.6 and 2**-23), so results differ from the CPU emulator's in the last bit at times,
      each within the bound. Derivation: the result is rounded once from an fp32 value of
      relative error ``r``, so it is within ``0.5 + 2**p r`` ulp (``p`` = 8 for bf16, 11 for
      fp16). ``r`` is dominated by the rounding of ``t = -v log2(e)``: ``1.22 |v| 2**-24`` for
      ``v < 0``, plus 2**-20.6 for the approximations and the fp32 roundings; ``|v| <= 86``
      (bf16, below that the IEEE path of fp32 takes over, within 4 fp32 ulps) and ``|v| <= 36``
      (fp16: below, the result is under half fp16's smallest subnormal) give ``0.502`` and
      ``0.507`` ulp.
    - fp32: within 4 ulps (measured: 3.6), and the same bits on a GPU and the emulator: built
      only from IEEE-rounded operations (the approximations cannot reach a useful fp32 bound:
      ``ex2.approx`` alone is 2.5 fp32 ulps and the argument's rounding adds ``|v| / 2``).

    ``silu(-inf) * up`` is NaN, as in torch.

    Parameters
    ----------
    x
        float16, bfloat16 or float32, ``[..., 2 d]`` of any rank from 1: the gate half, then
        the up half. The last dimension must be contiguous; rows may be strided (a slice of a
        wider tensor) as long as the leading dimensions flatten into one row stride. On a CUDA
        device, or on the CPU through kernkit's CPU emulator.
    out
        Optional, contiguous, ``x``'s shape with the last dimension ``d``, same dtype and device,
        sharing no memory with ``x``.

    Returns
    -------
    torch.Tensor
        ``out``, or a new tensor of shape ``[..., d]``.

    Bad arguments raise ``TypeError``/``ValueError`` naming the argument, before anything is
    written.

    Example
    -------
    >>> x = torch.randn(4, 2 * 1024, dtype=torch.bfloat16)
    >>> y = silu_and_mul(x)  # doctest: +SKIP
    >>> y.shape
    torch.Size([4, 1024])
    """
    if out is None:
        out = _out(x)
    _silu_module(x.dtype, x.is_cuda).act_and_mul(out, x)
    return out


@register_op(fake=_out, specializations=_gelu_specializations)
def gelu_and_mul(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]``, computed in fp32 and rounded once to ``x.dtype``.

    ``approximate="none"``: ``gelu(v) = 0.5 v (1 + erf(v / sqrt 2))``; ``"tanh"``: ``0.5 v (1 +
    tanh(sqrt(2 / pi) (v + 0.044715 v**3)))`` (as ``torch.nn.functional.gelu``).

    Accuracy against a float64 evaluation of the same formula on the same inputs
    (``kernkit/kernels/activation/act_and_mul.cuh``), in ulps of the result's dtype (subnormal
    results: in units of the dtype's smallest subnormal):

    - bf16: within 0.51 ulp (both forms); fp16: within 0.53 ulp (``"none"``) and 0.52 ulp
      (``"tanh"``). On the GPU the exponential and the reciprocal are the hardware's
      approximations (``ex2.approx``, ``rcp.approx``), so results differ from the CPU
      emulator's in the last bit at times, each within the bound. Derivation as for
      ``silu_and_mul`` (``0.5 + 2**p r`` ulp, ``r`` the relative error before the final
      rounding). ``"tanh"`` is ``v / (1 + 2**t) * up`` with ``t`` the rounded
      ``-2 sqrt(2 / pi) log2(e) (v + 0.044715 v**3)``: ``r <= 3.5 |y| 2**-24 + 2**-20.6``
      (``y = t ln 2``, ``|y| <= 85`` for bf16, ``<= 30`` where an fp16 result is not below half
      its smallest subnormal): 0.505 and 0.514 ulp. ``"none"`` is ``v m * up`` (``v < 0``) or
      ``v (1 - m) * up`` with ``m = erfc(|v| / sqrt 2) / 2 = s 2**(P(s) - v**2 log2(e) / 2)``,
      ``s = 1 / (1 + |v| / (2 sqrt 2))`` and ``P`` a fitted polynomial (relative error of ``m``
      below 8e-6): ``r <= 8e-6 + (v**2 + 2) 2**-24 + 2**-20.6`` (``v**2`` and the exponent
      rounded) with ``|v| <= 13`` (bf16; below, the IEEE path of fp32) and ``|v| <= 6.5``
      (where fp16 results are normal): 0.505 and 0.523 ulp.
    - fp32: within ``8 ulp + 2**-22 * (1 + v**2) * |result|`` where ``v`` is the gate value (the
      second term is the rounding of the activation's argument, which the steep tail of erf /
      tanh amplifies where the result is tiny; measured: at most 19 ulps for ``|v| <= 4`` and
      ``2 (1 + v**2)`` ulps beyond), and the same bits on a GPU and the emulator: built only
      from IEEE-rounded operations.

    ``gelu(-inf) * up`` is NaN, as in torch.

    Parameters
    ----------
    x
        float16, bfloat16 or float32, ``[..., 2 d]`` of any rank from 1: the gate half, then
        the up half. The last dimension must be contiguous; rows may be strided as long as the
        leading dimensions flatten into one row stride. On a CUDA device, or on the CPU through
        kernkit's CPU emulator.
    approximate
        ``"none"`` (erf) or ``"tanh"``.
    out
        Optional, contiguous, ``x``'s shape with the last dimension ``d``, same dtype and device,
        sharing no memory with ``x``.

    Returns
    -------
    torch.Tensor
        ``out``, or a new tensor of shape ``[..., d]``.

    Bad arguments raise ``TypeError``/``ValueError`` naming the argument, before anything is
    written.

    Example
    -------
    >>> x = torch.randn(4, 2 * 1024, dtype=torch.float16)
    >>> y = gelu_and_mul(x, approximate="tanh")  # doctest: +SKIP
    >>> y.shape
    torch.Size([4, 1024])
    """
    if out is None:
        out = _out(x)
    _gelu_module(approximate, x.dtype, x.is_cuda).act_and_mul(out, x)
    return out
