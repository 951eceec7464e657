"""``store_cache``: write new K/V rows into the KV-cache pool at given indices (in place)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Callable

import torch
from torch.compiler import is_dynamo_compiling

from ..jit import JitRequest, cache_once, is_arch_support_pdl, make_cpp_args
from . import reference
from .argerrors import named_error
from .fallback import kernel_for_device

__all__ = ["store_cache", "specializations"]

#: Vectors of each tensor a thread keeps in flight before a row is split over more threads
#: (see ``device::rows::RowLayout``): with 16-byte vectors a 2 KB row gets two warps, each
#: thread loading 2 x 16 bytes of K and 2 x 16 of V before storing them. Measured on an H200
#: (2 KB bf16 rows, CUDA graph): 1, 2, 4 and 8 tie at n=65536 (136 to 139 us) and at n<=64; at
#: n=4096 2 took 9.8 us against 11.3 for 4 (more warps to cover the scattered writes' latency).
STORE_PER_THREAD = 2

#: Whether the caches are written with streaming (evict-first) stores. Measured on an H200: no
#: difference at any n (137.0 against 136.6 us at n=65536), so plain stores, which leave the new
#: rows in L2 for the attention kernel that reads them next.
STORE_STREAMING = False

#: Element sizes the row kernels take, by dtype. The kernels move bytes, so one specialization
#: serves every dtype of a size (fp16 and bf16, fp32 and int32...).
ELEM_BYTES: dict[torch.dtype, int] = {
    torch.float32: 4,
    torch.float16: 2,
    torch.bfloat16: 2,
    torch.float8_e4m3fn: 1,
    torch.float8_e5m2: 1,
    torch.int8: 1,
    torch.uint8: 1,
    torch.int16: 2,
    torch.int32: 4,
    torch.float64: 8,
    torch.int64: 8,
}

def elem_bytes(dtype: torch.dtype, role: str) -> int:
    """The element size of a supported row dtype; ``TypeError`` naming ``role`` otherwise."""
    try:
        return ELEM_BYTES[dtype]
    except KeyError:
        names = ", ".join(str(d).removeprefix("torch.") for d in ELEM_BYTES)
        raise TypeError(f"'{role}': dtype {str(dtype).removeprefix('torch.')} is not supported; "
                        f"supported: {names}") from None


def max_vec(row_bytes: int) -> int:
    """The widest access (1, 2, 4, 8 or 16 bytes) that divides a row of ``row_bytes``. The
    launcher narrows it further when a pointer or row stride is less aligned."""
    return min(16, row_bytes & -row_bytes)


def row_bytes_of(row_shape: Sequence[int], elem: int, role: str) -> int:
    """Bytes per row of a tensor whose shape after the first dimension is ``row_shape``."""
    if len(row_shape) not in (1, 2):
        raise ValueError(f"'{role}': expected a 2-d [rows, elems] or 3-d [rows, heads, head_dim] tensor, "
                         f"got {len(row_shape) + 1}-d")
    nbytes = math.prod(row_shape) * elem
    if nbytes <= 0:
        raise ValueError(f"'{role}': rows are empty (shape [*, {', '.join(map(str, row_shape))}])")
    return nbytes


def store_request(elem: int, row_bytes: int, pdl: bool, backend: str = "cuda",
                  per_thread: int = STORE_PER_THREAD, stream_stores: bool = STORE_STREAMING) -> JitRequest:
    """The build of one ``store_cache`` specialization (the single description both the
    module factory and ahead-of-time builds use)."""
    args = make_cpp_args(elem, row_bytes, max_vec(row_bytes), per_thread, pdl, stream_stores)
    return JitRequest.make(
        "store_cache", *args,
        cuda_files=["kvcache/store_kv.cuh"],
        cuda_wrappers=[("store_cache", f"store_cache<{args}>")],
        backend=backend,
    )


@cache_once
def store_module(elem: int, row_bytes: int, pdl: bool, backend: str = "cuda", per_thread: int = STORE_PER_THREAD,
                 stream_stores: bool = STORE_STREAMING):
    """The loaded module of one ``store_cache`` specialization."""
    return store_request(elem, row_bytes, pdl, backend, per_thread, stream_stores).load()


# Keyed on the whole shape: slicing a torch.Size costs more than hashing it, and a cache's shape
# does not change between calls.
@cache_once
def _store_fn(dtype: torch.dtype, shape: torch.Size, is_cuda: bool) -> Callable[..., None]:
    elem = elem_bytes(dtype, "k_cache")
    row_bytes = row_bytes_of(shape[1:], elem, "k_cache")
    return kernel_for_device(
        "store_cache", is_cuda, lambda backend, pdl: store_module(elem, row_bytes, pdl, backend).store_cache,
        reference.store_cache)


def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """Write row ``i`` of ``k`` and ``v`` to row ``indices[i]`` of ``k_cache`` and ``v_cache``,
    in place.

    ``k_cache``/``v_cache``: ``[pool, heads, head_dim]`` or ``[pool, heads * head_dim]``, same
    shape and dtype (any 1-, 2-, 4- or 8-byte dtype: fp32, fp16, bf16, fp8...), contiguous
    within a row, any row stride. ``k``/``v``: ``[n, heads, head_dim]`` or
    ``[n, heads * head_dim]``, same dtype, rows may be strided (e.g. slices of a fused QKV
    tensor). ``indices``: int32 or int64 ``[n]``. Rows whose index is negative or
    ``>= pool`` are skipped (never written). Bad arguments raise before anything is written,
    naming the argument.
    """
    if is_dynamo_compiling():  # traced by torch.compile: the custom op (kernkit/ops/library.py)
        return torch.ops.kernkit.store_cache(k_cache, v_cache, indices, k, v)
    # Per-call path: pick the specialization from k_cache, call it; every tensor check is in the
    # launcher.
    try:
        _store_fn(k_cache.dtype, k_cache.shape, k_cache.is_cuda)(k_cache, v_cache, indices, k, v)
    except (AttributeError, TypeError, RuntimeError) as e:  # what torch or tvm-ffi could not name
        args = (("k_cache", k_cache), ("v_cache", v_cache), ("indices", indices), ("k", k), ("v", v))
        err = named_error(e, args, args)
        if err is e:
            raise
        raise err from e


def specializations(dtypes: torch.dtype | Sequence[torch.dtype], num_heads: int, head_dim: int, *,
                    backend: str = "cuda") -> list[JitRequest]:
    """The builds ``store_cache`` needs for a model's KV rows (``num_heads`` x ``head_dim`` of
    each dtype), for ahead-of-time compilation. ``backend="cuda"`` needs a GPU or
    ``KERNKIT_CUDA_ARCH`` (for the PDL choice)."""
    dtypes = [dtypes] if isinstance(dtypes, torch.dtype) else list(dtypes)
    pdl = is_arch_support_pdl() if backend == "cuda" else False
    out = []
    for dtype in dtypes:
        elem = elem_bytes(dtype, "dtype")
        req = store_request(elem, row_bytes_of((num_heads, head_dim), elem, "k_cache"), pdl, backend)
        if req not in out:
            out.append(req)
    return out
