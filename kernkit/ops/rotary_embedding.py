"""``rotary_embedding``: rotary position embedding of q and k, in place (neox and gpt-j pairs,
partial rotary)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once
from ._rope import fewer_blocks_mask, rope_builds, rope_spec
from .registry import register_op


def rotary_embedding_spec(dtype: torch.dtype, rot_dim: int, is_neox: bool, backend: str | None = None,
                          fewer_blocks: int = 0) -> JitSpec:
    """The build of one ``rotary_embedding`` specialization (``rope_spec``), with the grid mask a
    tuning table chose (``fewer_blocks``, 0 untuned): the factory below and ``warmup`` share it."""
    return rope_spec("rotary_embedding", dtype, rot_dim, is_neox, backend, fewer_blocks)


@cache_once
def _module(dtype: torch.dtype, rot_dim: int, is_neox: bool, is_cuda: bool):
    # Runs once per specialization key: the tuning tables give the grid of each number of tokens
    # (the launcher picks it by the call's tokens); the spec checks the key.
    mask = fewer_blocks_mask("rotary_embedding", is_cuda, dtype, rot_dim, is_neox)
    return rotary_embedding_spec(dtype, rot_dim, is_neox, None if is_cuda else "emu", mask).build_and_load()


def _specializations(dtypes: Sequence[torch.dtype], head_dim: int, rot_dim: int | None = None,
                     is_neox: bool = True, backend: str | None = None, **unused: object) -> list[JitSpec]:
    return rope_builds("rotary_embedding", dtypes, head_dim, rot_dim, is_neox, backend)


@register_op(mutates_args=("q", "k"), specializations=_specializations)
def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                     is_neox: bool = True, *, head_dim: int | None = None) -> None:
    """Rotate the first ``rot_dim`` elements of every head of ``q`` and ``k`` by the angle of
    its token's position, in place.

    Each head's first ``rot_dim`` elements form ``rot_dim / 2`` pairs (x, y): with ``is_neox``
    element ``i`` and ``i + rot_dim / 2`` (GPT-NeoX, Llama), else ``2i`` and ``2i + 1`` (GPT-J).
    Pair ``i`` of a token at position ``p`` becomes ``(x * cos - y * sin, y * cos + x * sin)``
    with ``cos = cos_sin_cache[p, i]`` and ``sin = cos_sin_cache[p, rot_dim / 2 + i]``; the
    elements of a head after ``rot_dim`` are left as they are.

    Rounding: x, y, cos and sin are taken to fp32 (exactly); each of the four products is an
    fp32 multiply rounded once, ``x * cos - y * sin`` and ``y * cos + x * sin`` one fp32
    subtraction / addition rounded once (no fused multiply-add), and that is rounded once to
    the dtype. The result equals torch's ``(x.float() * cos - y.float() * sin).to(dtype)`` bit
    for bit, on the GPU and on the CPU emulator alike; against exact arithmetic it is off by at
    most ``2**-23 * (|x cos| + |y sin|)`` plus half an ulp of the dtype.

    Parameters
    ----------
    positions
        int32 or int64 ``[tokens]``. A token whose position is negative or ``>= max_position``
        is skipped: its q and k are left unchanged and the cache is not read for it (int64
        positions are compared whole, so ``2**32 + 5`` is out of range).
    q
        ``[tokens, q_heads * head_dim]`` or ``[tokens, q_heads, head_dim]``, float16, bfloat16 or
        float32, each head contiguous; any token stride (a slice of a fused QKV tensor) and, for
        3-d, any head stride that keeps the heads apart. Rotated in place.
    k
        Like ``q`` with its own number of heads (``k_heads``, may be fewer), the same tokens,
        dtype and ``head_dim``, and its own strides. Rotated in place. Required: ``None`` is
        not accepted.
    cos_sin_cache
        ``[max_position, rot_dim]``, contiguous, float32 or q's dtype: the cosines in the first
        ``rot_dim / 2`` columns, the sines in the rest. ``rot_dim`` is even and ``<= head_dim``.
    is_neox
        Neox pairing (the default) or gpt-j pairing: ``True`` or ``False``, nothing else (``1``
        is a ``TypeError``, in every process, whatever ran before).
    head_dim
        Elements per head (``head_size`` in sglang and vLLM). Required when ``q`` is 2-d, whose
        rows do not say where a head ends; default ``q.shape[-1]`` for 3-d ``q``.

    Returns
    -------
    None; ``q`` and ``k`` hold the result.

    Bad arguments raise ``TypeError``/``ValueError`` naming the argument before anything is
    written; q and k may not share memory with each other, the cache or the positions. CUDA
    tensors run the GPU build, CPU tensors the CPU emulator.

    Example
    -------
    >>> q = torch.randn(4, 32 * 128, dtype=torch.bfloat16, device="cuda")
    >>> k = torch.randn(4, 8 * 128, dtype=torch.bfloat16, device="cuda")
    >>> inv = 1.0 / 10000 ** (torch.arange(0, 128, 2, device="cuda") / 128)
    >>> ang = torch.arange(4096, device="cuda")[:, None] * inv
    >>> cache = torch.cat([ang.cos(), ang.sin()], dim=1)  # [4096, 128] fp32
    >>> rotary_embedding(torch.tensor([0, 1, 2, 3], device="cuda"), q, k, cache, head_dim=128)  # doctest: +SKIP
    """
    # Before the memo: its key would take 1 for True (equal and of equal hash) once True is cached.
    if type(is_neox) is not bool:
        raise TypeError(f"'is_neox': expected a bool, got {type(is_neox).__name__}")
    rot_dim = cos_sin_cache.shape[1] if cos_sin_cache.dim() == 2 else -1
    _module(q.dtype, rot_dim, is_neox, q.is_cuda).rotary_embedding(positions, q, k, cos_sin_cache,
                                                                   -1 if head_dim is None else head_dim)
