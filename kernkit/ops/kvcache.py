"""``store_cache``: write new K/V rows into the KV-cache pool at given indices (in place)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from .registry import register_op

#: Vectors of each tensor a thread keeps in flight before a row is split over more threads
#: (``device::rows::RowLayout``): with 16-byte vectors a 2 KB row gets two warps, each thread
#: loading 2 x 16 bytes of K and of V before storing them. On an H200, 2 was the fastest at
#: 4096 rows and tied with 1, 4 and 8 elsewhere
#: (benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md).
STORE_PER_THREAD = 2


def row_spec(kernel: str, file: str, elem_bytes: int, row_bytes: int, per_thread: int,
             backend: str | None) -> JitSpec:
    """One specialization of a row-moving kernel (``store_cache``, ``indexing``): rows of
    ``row_bytes`` bytes whose elements have ``elem_bytes`` bytes. The widest access that divides a
    row is a template argument; the launcher narrows it for less aligned pointers."""
    pdl = backend != "emu" and is_arch_support_pdl()
    args = make_cpp_args(elem_bytes, row_bytes, min(16, row_bytes & -row_bytes), per_thread, pdl)
    return JitSpec.make(kernel, *args, cuda_files=[file], cuda_wrappers=[(kernel, f"{kernel}<{args}>")],
                        backend=backend)


def row_bytes(dtype: torch.dtype, row_shape: Sequence[int], role: str) -> int:
    """Bytes per row of a tensor of ``dtype`` whose shape after the first dimension is
    ``row_shape``; a ``TypeError``/``ValueError`` naming ``role`` when no kernel takes it."""
    if dtype.itemsize not in (1, 2, 4, 8) or dtype.is_complex or dtype == torch.bool:
        raise TypeError(f"'{role}': dtype {str(dtype).removeprefix('torch.')} is not supported; the row kernels "
                        "take 1-, 2-, 4- or 8-byte integer and floating-point dtypes")
    if len(row_shape) not in (1, 2):
        raise ValueError(f"'{role}': expected rows of shape [elems] or [heads, head_dim], got "
                         f"[{', '.join(map(str, row_shape))}]")
    nbytes = math.prod(row_shape) * dtype.itemsize
    if nbytes <= 0:
        raise ValueError(f"'{role}': rows are empty (shape [*, {', '.join(map(str, row_shape))}])")
    return nbytes


def store_spec(dtype: torch.dtype, row_shape: Sequence[int], backend: str | None = None) -> JitSpec:
    """The ``store_cache`` specialization for caches of ``dtype`` with rows of ``row_shape``."""
    nbytes = row_bytes(dtype, row_shape, "k_cache")
    return row_spec("store_cache", "kvcache/store_kv.cuh", dtype.itemsize, nbytes, STORE_PER_THREAD, backend)


# Keyed on the whole shape: hashing a torch.Size costs less than slicing it, and a pool's shape
# does not change between calls.
@cache_once
def _module(dtype: torch.dtype, shape: torch.Size, is_cuda: bool):
    if len(shape) not in (2, 3):
        raise ValueError(f"'k_cache': expected a 2-d [rows, elems] or 3-d [rows, heads, head_dim] tensor, got "
                         f"{len(shape)}-d")
    return store_spec(dtype, shape[1:], None if is_cuda else "emu").build_and_load()


def _specializations(dtypes: Sequence[torch.dtype], num_heads: int, head_dim: int,
                     backend: str | None = None) -> list[JitSpec]:
    return [store_spec(d, (num_heads, head_dim), backend) for d in dict.fromkeys(dtypes)]


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
