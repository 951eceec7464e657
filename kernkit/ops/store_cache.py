"""``store_cache``: write new K/V rows into the KV-cache pool at given indices (in place)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once
from ._rows import row_bytes, row_spec
from .registry import register_op

#: Vectors of each tensor a thread keeps in flight before a row is split over more threads
#: (``device::rows::RowLayout``): with 16-byte vectors a 2 KB row gets two warps, each thread
#: loading 2 x 16 bytes of K and of V before storing them. On an H200, 2 was the fastest at
#: 4096 rows and tied with 1, 4 and 8 elsewhere
#: (benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md).
STORE_PER_THREAD = 2


def store_cache_spec(dtype: torch.dtype, row_shape: Sequence[int], backend: str | None = None) -> JitSpec:
    """The ``store_cache`` specialization for caches of ``dtype`` with rows of ``row_shape``."""
    nbytes = row_bytes(dtype, row_shape, "k_cache")
    return row_spec("store_cache", "kvcache/store_cache.cuh", dtype.itemsize, nbytes, STORE_PER_THREAD, backend)


# Keyed on the whole shape: hashing a torch.Size costs less than slicing it, and a pool's shape
# does not change between calls.
@cache_once
def _module(dtype: torch.dtype, shape: torch.Size, is_cuda: bool):
    if len(shape) not in (2, 3):
        raise ValueError(f"'k_cache': expected a 2-d [rows, elems] or 3-d [rows, heads, head_dim] tensor, got "
                         f"{len(shape)}-d")
    return store_cache_spec(dtype, shape[1:], None if is_cuda else "emu").build_and_load()


def _specializations(dtypes: Sequence[torch.dtype], num_heads: int, head_dim: int,
                     backend: str | None = None) -> list[JitSpec]:
    return [store_cache_spec(d, (num_heads, head_dim), backend) for d in dict.fromkeys(dtypes)]


@register_op(mutates_args=("k_cache", "v_cache"), specializations=_specializations)
def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """Write row ``i`` of ``k`` and ``v`` to row ``indices[i]`` of ``k_cache`` and ``v_cache``.

    Parameters
    ----------
    k_cache, v_cache
        ``[pool, heads, head_dim]`` or ``[pool, heads * head_dim]``, same shape and dtype (any 1-,
        2-, 4- or 8-byte dtype: fp32, fp16, bf16, fp8...), contiguous within a row, any row
        stride; written in place.
    indices
        int32 or int64 ``[n]``. Rows whose index is negative or ``>= pool`` are skipped.
    k, v
        ``[n, heads, head_dim]`` or ``[n, heads * head_dim]`` of the caches' dtype; rows may be
        strided (slices of a fused QKV tensor).

    Bad arguments raise ``TypeError``/``ValueError`` naming the argument, before anything is
    written. CUDA tensors run the GPU build (nvrtc or nvcc), CPU tensors the CPU emulator.

    Example
    -------
    >>> kc = torch.zeros(16, 8, 128, dtype=torch.bfloat16, device="cuda"); vc = torch.zeros_like(kc)
    >>> k = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
    >>> store_cache(kc, vc, torch.tensor([3, 7], device="cuda"), k, v)  # doctest: +SKIP
    """
    _module(k_cache.dtype, k_cache.shape, k_cache.is_cuda).store_cache(k_cache, v_cache, indices, k, v)
