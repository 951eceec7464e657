"""``rotary_embedding``: rotary position embedding of q and k, in place (neox and gpt-j pairs,
partial rotary); ``rotary_embedding_store``: the same, and the rotated k and v written into the
KV cache, in one launch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from .registry import register_op

#: The dtypes of q and k ``rotary_embedding`` is specialized for.
ROPE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


#: The kernel file of each op of this module.
ROPE_FILES = {"rotary_embedding": "rope/rotary.cuh", "rotary_embedding_store": "rope/rope_store.cuh"}


def rope_spec(dtype: torch.dtype, rot_dim: int, is_neox: bool, backend: str | None = None,
              op: str = "rotary_embedding") -> JitSpec:
    """The build of one specialization of ``op`` (``rotary_embedding`` or
    ``rotary_embedding_store``): q/k dtype, rotary dimension (the cache's row length) and
    pairing. The factories below and ``warmup`` share it."""
    if dtype not in ROPE_DTYPES:
        raise TypeError(f"'q': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    if not isinstance(is_neox, bool):
        raise TypeError(f"'is_neox': expected a bool, got {type(is_neox).__name__}")
    if rot_dim < 0:
        raise ValueError("'cos_sin_cache': expected a 2-d [max_position, rot_dim] tensor")
    if rot_dim == 0 or rot_dim % 2:
        raise ValueError(f"'cos_sin_cache': expected an even, positive rot_dim (its last dimension), got {rot_dim}")
    args = make_cpp_args(dtype, rot_dim, is_neox, backend != "emu" and is_arch_support_pdl())
    return JitSpec.make(op, *args, cuda_files=[ROPE_FILES[op]], cuda_wrappers=[(op, f"{op}<{args}>")],
                        backend=backend)


@cache_once
def _module(dtype: torch.dtype, rot_dim: int, is_neox: bool, is_cuda: bool, op: str = "rotary_embedding"):
    # Runs once per specialization key: the place for what Python must check.
    return rope_spec(dtype, rot_dim, is_neox, None if is_cuda else "emu", op).build_and_load()


def _builds(op: str, dtypes: Sequence[torch.dtype], head_dim: int, rot_dim: int | None, is_neox: object,
            backend: str | None) -> list[JitSpec]:
    """The builds of ``op`` a model needs: one per dtype, for its rotary dimension (``head_dim``
    unless ``rot_dim`` is given) and pairing (``is_neox``: a bool, or ``0``/``1``/``true``/``false``
    as ``warmup --set`` passes it)."""
    rot = head_dim if rot_dim is None else rot_dim
    neox = is_neox if isinstance(is_neox, bool) else str(is_neox).lower() in ("1", "true")
    return [rope_spec(d, rot, neox, backend, op) for d in dict.fromkeys(dtypes)]


def _specializations(dtypes: Sequence[torch.dtype], head_dim: int, rot_dim: int | None = None,
                     is_neox: bool = True, backend: str | None = None, **unused: object) -> list[JitSpec]:
    return _builds("rotary_embedding", dtypes, head_dim, rot_dim, is_neox, backend)


def _store_specializations(dtypes: Sequence[torch.dtype], head_dim: int, rot_dim: int | None = None,
                           is_neox: bool = True, backend: str | None = None, **unused: object) -> list[JitSpec]:
    return _builds("rotary_embedding_store", dtypes, head_dim, rot_dim, is_neox, backend)


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


@register_op(mutates_args=("q", "k", "k_cache", "v_cache"), specializations=_store_specializations)
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
        Like ``k``: its heads, ``head_dim`` and dtype, its own strides. Only read.
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
    _module(q.dtype, rot_dim, is_neox, q.is_cuda, "rotary_embedding_store").rotary_embedding_store(
        positions, q, k, v, cos_sin_cache, k_cache, v_cache, out_loc, -1 if head_dim is None else head_dim)
