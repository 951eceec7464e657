"""``qk_norm``: RMS normalization of every head of q and of k, in place, in one launch (the
per-head q/k norm of Qwen3 and others, before rope)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from ._flags import as_flag, check_cast_flag
from .registry import register_op

#: The dtypes ``qk_norm`` is specialized for.
QK_NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The head sizes ``qk_norm`` is built for.
QK_NORM_HEAD_DIMS = (64, 128, 256, 512, 1024)


def qk_norm_spec(dtype: torch.dtype, head_dim: int, backend: str | None = None,
                 cast_x_before_out_mul: bool = False) -> JitSpec:
    """The build of one ``qk_norm`` specialization, for heads of ``head_dim`` elements of
    ``dtype``, in kernkit's order or (``cast_x_before_out_mul``) transformers': the factory
    below and ``warmup`` share it."""
    if dtype not in QK_NORM_DTYPES:
        raise TypeError(f"'q': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    if head_dim not in QK_NORM_HEAD_DIMS:
        raise ValueError(f"'q_weight': head_dim {head_dim} (the weight's length) is not supported; supported: "
                         f"{', '.join(map(str, QK_NORM_HEAD_DIMS))}")
    cast = (True,) if cast_x_before_out_mul else ()
    args = make_cpp_args(dtype, head_dim, backend != "emu" and is_arch_support_pdl(), *cast)
    return JitSpec.make("qk_norm", *args, cuda_files=["norm/qk_norm.cuh"],
                        cuda_wrappers=[("qk_norm", f"qk_norm<{args}>")], backend=backend)


@cache_once
def _module(dtype: torch.dtype, head_dim: int, is_cuda: bool, cast_x_before_out_mul: bool):
    # Runs once per (dtype, head_dim, device kind, order): dtype and head_dim are checked here.
    return qk_norm_spec(dtype, head_dim, None if is_cuda else "emu", cast_x_before_out_mul).build_and_load()


def _specializations(dtypes: Sequence[torch.dtype], head_dim: int, backend: str | None = None,
                     cast_x_before_out_mul: object = False, **unused: object) -> list[JitSpec]:
    """The builds a model needs: one per dtype, for its ``head_dim``, in the order
    ``cast_x_before_out_mul`` names (a bool or ``0``/``1``/``true``/``false``)."""
    cast = as_flag(cast_x_before_out_mul)
    return [qk_norm_spec(d, head_dim, backend, cast) for d in dict.fromkeys(dtypes)]


@register_op(mutates_args=("q", "k"), specializations=_specializations)
def qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
            eps: float = 1e-6, *, cast_x_before_out_mul: bool = False) -> None:
    """In place, ``rmsnorm`` of every head of ``q`` with ``q_weight`` and of every head of ``k``
    with ``k_weight``, in one launch, as sglang's ``fused_inplace_qknorm``.

    Each head is normalized with ``rmsnorm``'s arithmetic and within the tolerance its docstring
    states. A head is spread over twice the threads of an ``rmsnorm`` row of the same length
    (faster for short rows), so its sum of squares is added in another fixed order and a result
    can differ from ``rmsnorm(q, wq, out=q)`` in the last bit. The GPU and the CPU emulator give
    the same bits. ``cast_x_before_out_mul`` is ``rmsnorm``'s option: transformers' order
    (Qwen3's ``q_norm``/``k_norm`` are its RMSNorm), with ``rmsnorm``'s bound for that order.

    Parameters
    ----------
    q
        ``[tokens, q_heads, head_dim]`` or ``[tokens, q_heads * head_dim]``, float16, bfloat16 or
        float32, on a CUDA device (or on the CPU, through kernkit's CPU emulator); overwritten.
        ``head_dim`` is contiguous; tokens and heads may be strided, as in a slice of a fused QKV
        tensor (``qkv[:, :q_size]``), with the first element and both strides on 16-byte
        boundaries.
    k
        ``[tokens, k_heads, head_dim]`` or ``[tokens, k_heads * head_dim]``, with ``q``'s tokens and
        dtype; overwritten. It shares no memory with ``q`` (slices of one QKV tensor do not).
    q_weight
        ``[head_dim]``, contiguous, of ``q``'s dtype: its length is ``head_dim``, one of 64, 128,
        256, 512 and 1024; another length raises a ``ValueError`` naming it.
    k_weight
        ``[head_dim]``, contiguous, of ``q``'s dtype.
    eps
        Added to the mean of squares; finite and >= 0.
    cast_x_before_out_mul
        A bool: round ``x * inv_rms`` to the dtype before the weight multiplies it
        (transformers' order; a build of its own).

    Returns
    -------
    None

    Example
    -------
    >>> qkv = torch.randn(16, (32 + 2 * 8) * 128, dtype=torch.bfloat16)
    >>> q = qkv[:, :32 * 128].view(16, 32, 128)
    >>> k = qkv[:, 32 * 128:40 * 128].view(16, 8, 128)
    >>> w = torch.ones(128, dtype=torch.bfloat16)
    >>> qk_norm(q, k, w, w)  # doctest: +SKIP
    """
    check_cast_flag(cast_x_before_out_mul)
    _module(q.dtype, q_weight.shape[-1] if q_weight.ndim else -1, q.is_cuda, cast_x_before_out_mul).qk_norm(
        q, k, q_weight, k_weight, eps)
