"""``rmsnorm`` and ``fused_add_rmsnorm``: RMS normalization of the rows of ``[..., hidden]``
tensors, and the residual-add variant of a transformer layer's boundary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from ..jit.tuning import Bench, Tunable, size_bucket
from ._flags import SCHEDULES, as_flag, check_cast_flag, every_size, schedule_masks, template_tail
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


def _check(dtype: torch.dtype, hidden: int) -> None:
    if dtype not in NORM_DTYPES:
        raise TypeError(f"'x': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    _check_hidden(dtype, hidden)


def rmsnorm_spec(dtype: torch.dtype, hidden: int, backend: str | None = None, cast_x_before_out_mul: bool = False,
                 schedules: Mapping[str, tuple[int, int]] | None = None) -> JitSpec:
    """The build of one specialization of both norm ops, for rows of ``hidden`` elements of
    ``dtype``, in kernkit's order or (``cast_x_before_out_mul``) transformers', with the
    ``schedules`` a tuning table chose: ``{op: (late_weight, late_trigger)}``, each a mask of
    the sizes (bit ``b``: calls of ``2**(b - 1)`` to ``2**b - 1`` elements) that take the late
    variant (``SCHEDULES``). The factory below, ``warmup`` and ``tune`` share it; untuned, the
    template arguments are those it always had."""
    _check(dtype, hidden)
    pdl = backend != "emu" and is_arch_support_pdl()
    masks = {"rmsnorm": (0, 0), "fused_add_rmsnorm": (0, 0), **(schedules or {})}

    def args(*tail: bool | int):
        return make_cpp_args(dtype, hidden, pdl, *template_tail(*tail))

    return JitSpec.make("rmsnorm", *args(cast_x_before_out_mul, *masks["rmsnorm"], *masks["fused_add_rmsnorm"]),
                        cuda_files=["norm/rmsnorm.cuh"],
                        cuda_wrappers=[(op, f"{op}<{args(cast_x_before_out_mul, *masks[op])}>") for op in masks],
                        backend=backend)


#: Rows ``tune --grid serving`` measures, for each hidden size and dtype of ``SERVING_HIDDEN``.
SERVING_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

#: Hidden sizes of the serving grid: heads of 128, and the widths of Llama 3 (2048 to 16384),
#: Qwen2.5 and Qwen3 (1024 to 5120), Mixtral-8x22B (6144) and DeepSeek-V3 (7168).
SERVING_HIDDEN = (128, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 16384)


def _bench(op: str, shape: Mapping, device: str) -> Bench:
    """``tune``'s inputs for one shape ``{dtype, hidden, rows}`` of ``op`` on ``device``."""
    dtype, hidden, rows = getattr(torch, str(shape["dtype"])), int(shape["hidden"]), int(shape["rows"])
    backend = None if device == "cuda" else "emu"
    gen = torch.Generator().manual_seed(rows * 7919 + hidden)
    copies = max(1, min(200, (180 << 20) // max(1, 3 * rows * hidden * dtype.itemsize)))  # beyond the L2
    xs = [torch.randn(rows, hidden, generator=gen).to(dtype).to(device) for _ in range(copies)]
    res = [torch.randn(rows, hidden, generator=gen).to(dtype).to(device) for _ in range(copies)]
    w = torch.randn(hidden, generator=gen).to(dtype).to(device)
    x0, r0 = xs[0].clone(), res[0].clone()  # fused_add_rmsnorm's timed calls overwrite theirs
    outs = [torch.empty_like(x) for x in xs]

    def calls(module):
        if op == "rmsnorm":
            return [lambda o=o, x=x: module.rmsnorm(o, x, w, 1e-6) for o, x in zip(outs, xs, strict=True)]
        return [lambda x=x, r=r: module.fused_add_rmsnorm(x, r, w, 1e-6) for x, r in zip(xs, res, strict=True)]

    def outputs(module):
        if op == "rmsnorm":
            out = torch.empty_like(x0)
            module.rmsnorm(out, x0, w, 1e-6)
            return [out]
        x, r = x0.clone(), r0.clone()
        module.fused_add_rmsnorm(x, r, w, 1e-6)
        return [x, r]

    return Bench(key={"dtype": str(dtype).removeprefix("torch."), "hidden": hidden,
                      "elements": size_bucket(rows * hidden)},
                 spec=lambda args: _schedule_spec(dtype, hidden, backend, op, args), calls=calls, outputs=outputs)


def _schedule_spec(dtype: torch.dtype, hidden: int, backend: str | None, op: str, args: Mapping) -> JitSpec:
    """The build of the candidate ``args`` (``SCHEDULES``' names) of ``op`` at every size."""
    return rmsnorm_spec(dtype, hidden, backend, False, {op: every_size(args)})


def _schedules(is_cuda: bool, dtype: torch.dtype, hidden: int) -> dict[str, tuple[int, int]]:
    """The schedule masks the tuning tables give both ops for ``dtype`` and ``hidden``
    (``Tunable.size_masks``): the launcher picks a call's variant by its size."""
    return {op: schedule_masks(t, is_cuda, dtype=dtype, hidden=hidden) for op, t in TUNED.items()}


def _tunable(op: str) -> Tunable:
    grid = [{"dtype": d, "hidden": h, "rows": r} for d in ("bfloat16", "float16") for h in SERVING_HIDDEN
            for r in SERVING_ROWS]
    return Tunable(op, SCHEDULES, ("dtype", "hidden", "elements"), grids={"serving": grid},
                   bench=lambda shape, device: _bench(op, shape, device))


#: The tunables of the two norm ops: each picks its schedule per dtype, hidden size and number of
#: elements (the power of two at or below ``x.numel()``: rows by powers of two, for one hidden
#: size), all of which go into the one build of a dtype and hidden size (``_schedules``).
TUNED = {op: _tunable(op) for op in ("rmsnorm", "fused_add_rmsnorm")}


@cache_once
def _module(dtype: torch.dtype, hidden: int, is_cuda: bool, cast_x_before_out_mul: bool):
    # Runs once per (dtype, hidden, device kind, order): the tuning tables give the schedules,
    # and the spec checks the dtype and hidden size.
    return rmsnorm_spec(dtype, hidden, None if is_cuda else "emu", cast_x_before_out_mul,
                        _schedules(is_cuda, dtype, hidden)).build_and_load()


def _out(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
         cast_x_before_out_mul: bool = False) -> torch.Tensor:
    # empty_like takes less Python time per call than torch.empty(x.shape, dtype=..., device=...)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _specializations(hidden_size: int, dtypes: Sequence[torch.dtype] = NORM_DTYPES, head_dim: int | None = None,
                     backend: str | None = None, cast_x_before_out_mul: object = False,
                     **unused: object) -> list[JitSpec]:
    """Builds for a model: rows of ``hidden_size`` (the layer norms) and, when given, of
    ``head_dim`` (a per-head q/k norm, as Qwen3's), for each dtype, in the order
    ``cast_x_before_out_mul`` names (``as_flag``), with the schedules this device's tuning
    tables give (what the ops will load); the other model-shape keywords are not needed."""
    sizes = [s for s in dict.fromkeys((hidden_size, head_dim)) if s is not None]
    cast = as_flag(cast_x_before_out_mul)
    return [rmsnorm_spec(d, s, backend, cast, _schedules(backend != "emu", d, s)) for d in dict.fromkeys(dtypes)
            for s in sizes]


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
