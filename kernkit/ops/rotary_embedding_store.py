"""``rotary_embedding_store``: rotary position embedding of q and k in place, and the rotated
k and v written into the KV cache, in one launch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once
from ._rope import fewer_blocks_mask, rope_builds, rope_spec
from .registry import register_op


def rotary_embedding_store_spec(dtype: torch.dtype, rot_dim: int, is_neox: bool, backend: str | None = None,
                                fewer_blocks: int = 0) -> JitSpec:
    """The build of one ``rotary_embedding_store`` specialization (``rope_spec``), with the grid
    mask a tuning table chose (``fewer_blocks``, 0 untuned): the factory below and ``warmup``
    share it."""
    return rope_spec("rotary_embedding_store", dtype, rot_dim, is_neox, backend, fewer_blocks)


@cache_once
def _module(dtype: torch.dtype, rot_dim: int, is_neox: bool, is_cuda: bool):
    # Runs once per specialization key: the tuning tables give the grid of each number of tokens
    # (the launcher picks it by the call's tokens); the spec checks the key.
    mask = fewer_blocks_mask("rotary_embedding_store", is_cuda, dtype, rot_dim, is_neox)
    return rotary_embedding_store_spec(dtype, rot_dim, is_neox, None if is_cuda else "emu", mask).build_and_load()


def _specializations(dtypes: Sequence[torch.dtype], head_dim: int, rot_dim: int | None = None,
                     is_neox: bool = True, backend: str | None = None, **unused: object) -> list[JitSpec]:
    return rope_builds("rotary_embedding_store", dtypes, head_dim, rot_dim, is_neox, backend)


@register_op(mutates_args=("q", "k", "k_cache", "v_cache"), specializations=_specializations)
def rotary_embedding_store(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           out_loc: torch.Tensor, is_neox: bool = True, *, head_dim: int | None = None) -> None:
    """``rotary_embedding(positions, q, k, cos_sin_cache, is_neox)`` followed by
    ``store_cache(k_cache, v_cache, out_loc, k, v)``, in one launch: rotate ``q`` and ``k`` in
    place, and write each token's rotated k and its v to row ``out_loc[i]`` of the caches.

    The result is that of the two ops, bit for bit (the rotation's rounding is
    ``rotary_embedding``'s), and so are the skipped tokens: a position out of range leaves the
    token's q and k unchanged (and its k is stored as it is); an ``out_loc`` entry that is
    negative or ``>= pool`` writes nothing to the caches (CUDA-graph padding). One kernel reads k
    once instead of twice and saves a launch (``docs/performance.md`` gives the saving).

    Parameters
    ----------
    positions
        int32 or int64 ``[tokens]``, as in ``rotary_embedding``; fewer than 2**30 tokens.
    q, k
        As in ``rotary_embedding`` (2-d or 3-d, float16, bfloat16 or float32, any token stride);
        rotated in place.
    v
        Like ``k``: its heads, ``head_dim`` and dtype, its own strides, which may repeat memory
        (an ``expand``-ed v). Only read.
    cos_sin_cache
        ``[max_position, rot_dim]``, contiguous, float32 or q's dtype; ``rot_dim <= head_dim``
        (partial rotary: the elements after ``rot_dim`` are stored unrotated).
    k_cache, v_cache
        ``[pool, k_heads * head_dim]`` or ``[pool, k_heads, head_dim]`` of q's dtype, rows
        contiguous, any row stride (as in ``store_cache``); written in place.
    out_loc
        int32 or int64 ``[tokens]``: the cache row of each token.
    is_neox
        Neox pairing (the default) or gpt-j pairing: ``True`` or ``False``.
    head_dim
        Elements per head: required when ``q`` is 2-d; default ``q.shape[-1]`` for 3-d ``q``.

    Returns
    -------
    None; ``q``, ``k`` and the caches' rows at ``out_loc`` hold the result.

    Bad arguments raise ``TypeError``/``ValueError`` naming the argument before anything is
    written. q, k and the caches may not share memory with each other or with v, the cos/sin
    cache, the positions or ``out_loc``. CUDA tensors run the GPU build, CPU tensors the CPU
    emulator.

    Example
    -------
    >>> q = torch.randn(4, 32, 128, dtype=torch.bfloat16, device="cuda")
    >>> k = torch.randn(4, 8, 128, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
    >>> kc = torch.zeros(1024, 8 * 128, dtype=torch.bfloat16, device="cuda"); vc = torch.zeros_like(kc)
    >>> inv = 1.0 / 10000 ** (torch.arange(0, 128, 2, device="cuda") / 128)
    >>> ang = torch.arange(4096, device="cuda")[:, None] * inv
    >>> cache = torch.cat([ang.cos(), ang.sin()], dim=1)  # [4096, 128] fp32
    >>> pos = torch.tensor([7, 8, 9, 10], device="cuda")
    >>> rotary_embedding_store(pos, q, k, v, cache, kc, vc, torch.tensor([3, 5, 6, 9], device="cuda"))  # doctest: +SKIP
    """
    if type(is_neox) is not bool:
        raise TypeError(f"'is_neox': expected a bool, got {type(is_neox).__name__}")
    rot_dim = cos_sin_cache.shape[1] if cos_sin_cache.dim() == 2 else -1
    _module(q.dtype, rot_dim, is_neox, q.is_cuda).rotary_embedding_store(
        positions, q, k, v, cos_sin_cache, k_cache, v_cache, out_loc, -1 if head_dim is None else head_dim)
