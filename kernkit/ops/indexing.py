"""``indexing``: the (vocabulary-parallel) embedding lookup."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once
from ._rows import row_bytes, row_spec
from .registry import register_op

#: Vectors a thread keeps in flight (``device::rows::RowLayout``): on an H200, 2 was faster than
#: 4 at 4096 and 65536 ids (benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md).
INDEXING_PER_THREAD = 2


def indexing_spec(dtype: torch.dtype, hidden: int, backend: str | None = None) -> JitSpec:
    """The ``indexing`` specialization for a table of ``dtype`` with rows of ``hidden`` elements."""
    nbytes = row_bytes(dtype, (hidden,), "weight")
    return row_spec("indexing", "embedding/indexing.cuh", dtype.itemsize, nbytes, INDEXING_PER_THREAD, backend)


@cache_once
def _module(dtype: torch.dtype, shape: torch.Size, is_cuda: bool):
    if len(shape) != 2:
        raise ValueError(f"'weight': expected a 2-d [rows, hidden] table, got {len(shape)}-d")
    return indexing_spec(dtype, shape[1], None if is_cuda else "emu").build_and_load()


def _out(weight: torch.Tensor, ids: torch.Tensor, vocab_range: Sequence[int] | None = None) -> torch.Tensor:
    # Never fails for tensors of any shape: the launcher checks them and names what is wrong.
    return weight.new_empty((*ids.shape, *weight.shape[1:]))


def _specializations(dtypes: Sequence[torch.dtype], hidden_size: int, backend: str | None = None) -> list[JitSpec]:
    return [indexing_spec(d, hidden_size, backend) for d in dict.fromkeys(dtypes)]


@register_op(fake=_out, specializations=_specializations)
def indexing(weight: torch.Tensor, ids: torch.Tensor, vocab_range: Sequence[int] | None = None, *,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Embedding lookup: ``out[t] = weight[ids[t] - start]``, a zero row where ``ids[t]`` is
    outside ``[start, start + length)``.

    Parameters
    ----------
    weight
        ``[rows, hidden]``, any 1-, 2-, 4- or 8-byte dtype, rows may be strided: this rank's
        shard of the vocabulary.
    ids
        int32 or int64 ``[n]``.
    vocab_range
        ``(start, length)`` of the ids this shard holds, ``length <= rows``; None means
        ``(0, rows)``, so an id outside the table gives a zero row and never reads out of bounds.
    out
        Optional ``[n, hidden]`` of ``weight``'s dtype, written.

    Returns
    -------
    torch.Tensor
        ``out``, or a new ``[n, hidden]`` tensor.

    Example
    -------
    >>> weight = torch.randn(1000, 256, dtype=torch.float16, device="cuda")
    >>> indexing(weight, torch.tensor([3, 999, 1000], device="cuda"))  # doctest: +SKIP
    """
    if out is None:
        out = _out(weight, ids)
    _module(weight.dtype, weight.shape, weight.is_cuda).indexing(out, weight, ids, vocab_range)
    return out
