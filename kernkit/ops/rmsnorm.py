"""``rmsnorm`` and ``fused_add_rmsnorm``: RMS normalization of the rows of ``[..., hidden]``
tensors, and the residual-add variant of a transformer layer's boundary."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from ._flags import as_flag, check_cast_flag
from .registry import register_op

#: The dtypes the norm kernels are specialized for.
NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The longest row a specialization takes, in bytes: 1024 threads x 16 vectors of 16 bytes.
MAX_ROW_BYTES = 1024 * 16 * 16

_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _check_hidden(dtype: torch.dtype, hidden: int) -> None:
    """A ``ValueError`` naming ``'x'`` unless rows of ``hidden`` elements of ``dtype`` are whole
    16-byte vectors, at most ``MAX_ROW_BYTES`` of them."""
    vec = 16 // dtype.itemsize
    if hidden < 0:
        raise ValueError("'x': expected a [..., hidden] tensor, got a 0-d tensor")
    if hidden == 0 or hidden % vec or hidden * dtype.itemsize > MAX_ROW_BYTES:
        raise ValueError(f"'x': hidden size {hidden} is not supported for {_NAMES[dtype]}: rows must be a positive "
                         f"multiple of {vec} elements (16 bytes) and at most {MAX_ROW_BYTES // dtype.itemsize}")


def rmsnorm_spec(dtype: torch.dtype, hidden: int, backend: str | None = None,
              cast_x_before_out_mul: bool = False) -> JitSpec:
    """The build of one specialization of both norm ops, for rows of ``hidden`` elements of
    ``dtype``, in kernkit's order or (``cast_x_before_out_mul``) transformers': the factory
    below and ``warmup`` share it. The default order keeps the template arguments it always had."""
    if dtype not in NORM_DTYPES:
        raise TypeError(f"'x': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    _check_hidden(dtype, hidden)
    cast = (True,) if cast_x_before_out_mul else ()
    args = make_cpp_args(dtype, hidden, backend != "emu" and is_arch_support_pdl(), *cast)
    return JitSpec.make("rmsnorm", *args, cuda_files=["norm/rmsnorm.cuh"],
                        cuda_wrappers=[("rmsnorm", f"rmsnorm<{args}>"),
                                       ("fused_add_rmsnorm", f"fused_add_rmsnorm<{args}>")], backend=backend)


@cache_once
def _module(dtype: torch.dtype, hidden: int, is_cuda: bool, cast_x_before_out_mul: bool):
    # Runs once per (dtype, hidden, device kind, order): the dtype and hidden size are checked here.
    return rmsnorm_spec(dtype, hidden, None if is_cuda else "emu", cast_x_before_out_mul).build_and_load()


def _out(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
         cast_x_before_out_mul: bool = False) -> torch.Tensor:
    # empty_like takes less Python time per call than torch.empty(x.shape, dtype=..., device=...)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _specializations(hidden_size: int, dtypes: Sequence[torch.dtype] = NORM_DTYPES, head_dim: int | None = None,
                     backend: str | None = None, cast_x_before_out_mul: object = False,
                     **unused: object) -> list[JitSpec]:
    """Builds for a model: rows of ``hidden_size`` (the layer norms) and, when given, of
    ``head_dim`` (a per-head q/k norm, as Qwen3's), for each dtype, in the order
    ``cast_x_before_out_mul`` names (``as_flag``); the other model-shape keywords are not needed."""
    sizes = [s for s in dict.fromkeys((hidden_size, head_dim)) if s is not None]
    cast = as_flag(cast_x_before_out_mul)
    return [rmsnorm_spec(d, s, backend, cast) for d in dict.fromkeys(dtypes) for s in sizes]


@register_op(fake=_out, specializations=_specializations)
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
            out: torch.Tensor | None = None, cast_x_before_out_mul: bool = False) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` over the last dimension, in fp32, rounded once
    to ``x.dtype``; or, with ``cast_x_before_out_mul``, in transformers' order.

    The sum of squares is accumulated in fp32 in a fixed order (each thread's squares per vector
    position by fused multiply-adds, those sums by a fixed tree, then the row's threads by a
    butterfly and, for a row of several warps, the warps' sums in order); ``inv_rms`` is the
    correctly rounded ``1 / sqrt`` (not the approximate ``rsqrtf``) of ``sum * (1 / hidden) +
    eps`` (one fused multiply-add); the product is ``(x * inv_rms) * weight``, as flashinfer's
    RMSNorm computes it. Against a
    float64 evaluation of the formula on the same inputs, every element is within
    ``(u + 128 * 2**-24) * |ref| + tiny`` where ``u`` is the unit roundoff of the dtype
    (``2**-8`` bfloat16, ``2**-11`` float16, ``2**-24`` float32) and ``tiny`` the dtype's smallest
    subnormal: the rounding of the result plus at most 128 fp32 ulps of the computation.
    That holds while the squares stay in fp32's normal range (roughly ``1e-19 < |x| < 1e19``):
    a row whose squares overflow gives zeros, and ``eps = 0`` with a row of zeros gives NaN (as
    the formula does). The GPU and the CPU emulator give the same bits.

    With ``cast_x_before_out_mul=True`` the product is ``weight * (x * inv_rms).to(dtype)``, as
    transformers' ``LlamaRMSNorm`` (and sglang 0.5.23's option of the same name) computes it:
    ``x * inv_rms`` is rounded to the dtype before the weight multiplies it, then the product
    is rounded again (a product of two float16 or bfloat16 values is exact in fp32, so the
    second rounding is the one a torch multiply of two such tensors makes). For float32 both
    orders give the same bits. Each rounding adds at most ``u * |value|``, so the bound above
    becomes ``(2 * u + u**2 + 128 * 2**-24) * |ref| + tiny``. The GPU and the emulator again give
    the same bits.

    Parameters
    ----------
    x
        ``[..., hidden]``, float16, bfloat16 or float32, on a CUDA device (or on the CPU, through
        kernkit's CPU emulator). The last dimension is contiguous; rows may be strided, as long
        as the leading dimensions collapse into one row stride (``x[:, :hidden]`` of a wider
        tensor does; a transposed batch does not and is refused). The first element and the row
        stride lie on 16-byte boundaries, and ``hidden`` is a multiple of 16 bytes (8 halves, 4
        floats) up to 256 KiB; other inputs are refused with a ``ValueError``.
    weight
        ``[hidden]``, contiguous, of ``x``'s dtype.
    eps
        Added to the mean of squares; finite and >= 0.
    out
        Optional, of ``x``'s shape and dtype, rows may be strided. ``out=x`` normalizes in
        place (each row is read whole before any of it is written); any other ``out`` shares no
        memory with ``x`` or ``weight``.
    cast_x_before_out_mul
        A bool: round ``x * inv_rms`` to the dtype before the weight multiplies it
        (transformers' order; a build of its own).

    Returns
    -------
    torch.Tensor
        ``out``, or a new contiguous tensor shaped like ``x``.

    Example
    -------
    >>> x = torch.randn(16, 4096, dtype=torch.bfloat16)
    >>> w = torch.ones(4096, dtype=torch.bfloat16)
    >>> y = rmsnorm(x, w, 1e-6)  # doctest: +SKIP
    """
    check_cast_flag(cast_x_before_out_mul)
    if out is None:
        out = _out(x, weight, eps)
    _module(x.dtype, x.shape[-1] if x.ndim else -1, x.is_cuda, cast_x_before_out_mul).rmsnorm(out, x, weight, eps)
    return out


@register_op(mutates_args=("x", "residual"), specializations=_specializations)
def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                      cast_x_before_out_mul: bool = False) -> None:
    """In place: ``residual = x + residual``, then ``x = rmsnorm(residual) * weight``, as
    sglang's ``fused_add_rmsnorm`` (flashinfer's FusedAddRMSNorm kernel) computes it.

    Where the sum is rounded: ``x + residual`` is computed in fp32; ``residual`` receives that sum
    rounded once to the dtype (bit for bit ``(x.float() + residual.float()).to(dtype)``), while
    the normalization uses the fp32 sum itself, not the rounded copy. So ``x`` equals
    ``rmsnorm`` of the fp32 sum, which for float16/bfloat16 can differ in the last bit from
    ``rmsnorm(residual)`` of the stored residual. The tolerance of ``x`` against a float64
    evaluation (of the fp32 sum) is that of ``rmsnorm``.

    With ``cast_x_before_out_mul=True`` it computes what transformers' decoder layer does with
    ``residual = residual + x`` then ``RMSNorm(residual)``: ``residual`` is the same rounded sum,
    ``x`` is ``rmsnorm(residual, weight, eps, cast_x_before_out_mul=True)`` of that rounded sum,
    bit for bit.

    Parameters
    ----------
    x
        ``[..., hidden]``, float16, bfloat16 or float32, rows may be strided (as for
        ``rmsnorm``); overwritten with the normalized sum.
    residual
        ``x``'s shape and dtype, rows may be strided; overwritten with the sum. Shares no memory
        with ``x`` or ``weight``.
    weight
        ``[hidden]``, contiguous, of ``x``'s dtype.
    eps
        Added to the mean of squares; finite and >= 0.
    cast_x_before_out_mul
        A bool: normalize the rounded sum and round ``s * inv_rms`` to the dtype before the
        weight multiplies it (transformers' order; a build of its own).

    Returns
    -------
    None

    Example
    -------
    >>> x, residual = torch.randn(2, 16, 4096, dtype=torch.bfloat16)
    >>> fused_add_rmsnorm(x, residual, torch.ones(4096, dtype=torch.bfloat16))  # doctest: +SKIP
    """
    check_cast_flag(cast_x_before_out_mul)
    _module(x.dtype, x.shape[-1] if x.ndim else -1, x.is_cuda, cast_x_before_out_mul).fused_add_rmsnorm(
        x, residual, weight, eps)
