"""``indexing``: the (vocabulary-parallel) embedding lookup."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import torch
from torch.compiler import is_dynamo_compiling

from ..jit import JitRequest, cache_once, is_arch_support_pdl, make_cpp_args
from . import reference
from .argerrors import named_error
from .fallback import kernel_for_device
from .kvcache import elem_bytes, max_vec, row_bytes_of

__all__ = ["indexing", "specializations"]

#: Vectors a thread keeps in flight (see ``device::rows::RowLayout``); a 2 KB bf16 row gets two
#: warps with 2 x 16 bytes per thread. Measured on an H200 (151936 x 1024 bf16): 2 against 4
#: took 65.1 against 66.2 us at n=65536 and 5.7 against 6.5 us at n=4096.
INDEXING_PER_THREAD = 2


def indexing_request(elem: int, row_bytes: int, pdl: bool, backend: str = "cuda",
                     per_thread: int = INDEXING_PER_THREAD) -> JitRequest:
    """The build of one ``indexing`` specialization (shared by the module factory and
    ahead-of-time builds)."""
    args = make_cpp_args(elem, row_bytes, max_vec(row_bytes), per_thread, pdl)
    return JitRequest.make(
        "indexing", *args,
        cuda_files=["embedding/indexing.cuh"],
        cuda_wrappers=[("indexing", f"indexing<{args}>")],
        backend=backend,
    )


@cache_once
def indexing_module(elem: int, row_bytes: int, pdl: bool, backend: str = "cuda",
                    per_thread: int = INDEXING_PER_THREAD):
    """The loaded module of one ``indexing`` specialization."""
    return indexing_request(elem, row_bytes, pdl, backend, per_thread).load()


# Keyed on the whole shape: slicing a torch.Size costs more than hashing it, and a table's
# shape does not change between calls.
@cache_once
def _indexing_fn(dtype: torch.dtype, shape: torch.Size, is_cuda: bool) -> Callable[..., None]:
    elem = elem_bytes(dtype, "weight")
    if len(shape) != 2:
        raise ValueError(f"'weight': expected a 2-d [rows, hidden] table, got {len(shape)}-d")
    row_bytes = row_bytes_of(shape[1:], elem, "weight")
    return kernel_for_device(
        "indexing", is_cuda, lambda backend, pdl: indexing_module(elem, row_bytes, pdl, backend).indexing,
        _reference_indexing)


def _reference_indexing(out, weight, ids, vocab_range) -> None:
    """``reference.indexing`` called like the kernel: ``vocab_range`` as one ``(start, length)``."""
    reference.indexing(out, weight, ids, *vocab_range)


def indexing(weight: torch.Tensor, ids: torch.Tensor, out: torch.Tensor | None = None,
             vocab_range: tuple[int, int] | None = None) -> torch.Tensor:
    """Embedding lookup: ``out[t] = weight[ids[t] - start]``, and a zero row when ``ids[t]`` is
    outside ``[start, start + length)``.

    ``weight``: ``[rows, hidden]`` (any 1-, 2-, 4- or 8-byte dtype; rows may be strided), this
    rank's shard of the vocabulary. ``ids``: int32 or int64 ``[n]``. ``vocab_range``:
    ``(start, length)`` of the ids this shard holds, ``length <= rows``; ``None`` means
    ``(0, rows)``, so an id outside the table gives zeros and never reads out of bounds.
    ``out``: optional ``[n, hidden]`` of ``weight``'s dtype. Returns ``out``.
    """
    if is_dynamo_compiling():  # traced by torch.compile: the custom ops (kernkit/ops/library.py)
        if out is None:
            return torch.ops.kernkit.indexing(weight, ids, vocab_range)
        torch.ops.kernkit.indexing_out(out, weight, ids, vocab_range)
        return out
    # Per-call path: pick the specialization first (a bad weight raises before a bad
    # vocab_range or ids), then call it.
    try:
        out = _indexing_python(weight, ids, out, vocab_range)
    except (AttributeError, IndexError, TypeError, RuntimeError) as e:  # what torch or tvm-ffi could not name
        err = _named_error(e, weight, ids, out, vocab_range)
        if err is e:
            raise
        raise err from e
    return out


def _indexing_python(weight, ids, out, vocab_range) -> torch.Tensor:
    """``indexing`` through the Python lookup: pick the specialization (checking ``weight``),
    call it."""
    shape = weight.shape
    fn = _indexing_fn(weight.dtype, shape, weight.is_cuda)
    if vocab_range is None:
        start, length = 0, shape[0]
    else:
        start, length = _vocab_range(vocab_range)
    if out is None:
        out = weight.new_empty((ids.shape[0], shape[1]))
    fn(out, weight, ids, (start, length))
    return out


def _vocab_range(vocab_range) -> tuple[int, int]:
    try:
        start, length = vocab_range
    except (TypeError, ValueError):
        raise ValueError(f"'vocab_range': expected (start, length), got {vocab_range!r}") from None
    return start, length


def _named_error(e: BaseException, weight, ids, out, vocab_range) -> BaseException:
    if isinstance(e, IndexError) and isinstance(ids, torch.Tensor) and ids.dim() != 1:
        return ValueError(f"'ids': expected a 1-d tensor, got {ids.dim()}-d with shape {list(ids.shape)}")
    tensors = [("weight", weight), ("ids", ids)] + ([("out", out)] if out is not None else [])
    ffi_args = (("out", out), ("weight", weight), ("ids", ids), ("vocab_range", vocab_range))
    # ids of a claimed huge length (expand) fail in allocating out, before the launcher rejects them
    return named_error(e, tensors, ffi_args, contiguous=("ids",))


def specializations(dtypes: torch.dtype | Sequence[torch.dtype], hidden_size: int, *,
                    backend: str = "cuda") -> list[JitRequest]:
    """The builds ``indexing`` needs for an embedding of ``hidden_size`` of each dtype, for
    ahead-of-time compilation."""
    dtypes = [dtypes] if isinstance(dtypes, torch.dtype) else list(dtypes)
    pdl = is_arch_support_pdl() if backend == "cuda" else False
    out = []
    for dtype in dtypes:
        elem = elem_bytes(dtype, "dtype")
        req = indexing_request(elem, row_bytes_of((hidden_size,), elem, "weight"), pdl, backend)
        if req not in out:
            out.append(req)
    return out
