"""kernkit's ops as ``torch.library`` custom ops (namespace ``kernkit``), so that
``torch.compile(fullgraph=True)`` traces models that call them without graph breaks and
``torch.ops.kernkit.<op>`` works.

| custom op | public function | mutates |
| --- | --- | --- |
| ``kernkit::store_cache(k_cache, v_cache, indices, k, v) -> ()`` | ``store_cache`` | ``k_cache``, ``v_cache`` |
| ``kernkit::indexing(weight, ids, vocab_range=None) -> Tensor`` | ``indexing`` | |
| ``kernkit::indexing_out(out, weight, ids, vocab_range=None) -> ()`` | ``indexing(..., out=)`` | ``out`` |
| ``kernkit::scale(src, factor) -> Tensor`` | ``scale`` | |
| ``kernkit::scale_out(out, src, factor) -> ()`` | ``scale(..., out=)`` | ``out`` |
| ``kernkit::compare_key(a, b) -> SymInt`` | ``compare_key`` | |

The functional ops (``indexing``, ``scale``) declare their outputs non-differentiable, as the
plain functions are.

Each custom op's implementation calls the plain function, and each plain function, when
Dynamo traces it (``torch.compiler.is_dynamo_compiling()``, constant-folded during tracing and a
bare ``return False`` in eager), calls the custom op instead. Eager calls therefore keep the plain
path (about 25 ns for the check), while compiled graphs hold one node per op. The fake
implementations allocate outputs with the right shape, dtype and device and check what they
need to; the kernels' launchers check the rest when the graph runs.

``compare_key`` returns a Python ``int``: its custom op declares an ``int`` (``SymInt``) result,
whose fake implementation is an unbacked size (``ctx.new_dynamic_size()``), so a traced
``compare_key`` is a data-dependent integer that later code may use in shapes (``tokens[:n]``).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import elementwise, embedding, kvcache, radix

__all__ = ["compare_key", "indexing", "indexing_out", "scale", "scale_out", "store_cache"]


def _vocab_range(vocab_range: Optional[list[int]]) -> Optional[tuple[int, int]]:
    if vocab_range is None:
        return None
    if len(vocab_range) != 2:
        raise ValueError(f"'vocab_range': expected (start, length), got {list(vocab_range)}")
    return (vocab_range[0], vocab_range[1])


# --- store_cache -----------------------------------------------------------------------------


@torch.library.custom_op("kernkit::store_cache", mutates_args=("k_cache", "v_cache"))
def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """Write row ``i`` of ``k``/``v`` to row ``indices[i]`` of ``k_cache``/``v_cache``
    (``kernkit.ops.store_cache``)."""
    kvcache.store_cache(k_cache, v_cache, indices, k, v)


@store_cache.register_fake
def _store_cache_fake(k_cache, v_cache, indices, k, v):
    return None


# --- indexing --------------------------------------------------------------------------------


def _indexing_shape(weight: torch.Tensor, ids: torch.Tensor) -> tuple:
    if weight.dim() != 2:
        raise ValueError(f"'weight': expected a 2-d [rows, hidden] table, got {weight.dim()}-d")
    if ids.dim() != 1:
        raise ValueError(f"'ids': expected a 1-d tensor, got {ids.dim()}-d with shape {list(ids.shape)}")
    return (ids.shape[0], weight.shape[1])


@torch.library.custom_op("kernkit::indexing", mutates_args=())
def indexing(weight: torch.Tensor, ids: torch.Tensor, vocab_range: Optional[list[int]] = None) -> torch.Tensor:
    """Embedding lookup with the vocabulary-parallel mask (``kernkit.ops.indexing``)."""
    return embedding.indexing(weight, ids, vocab_range=_vocab_range(vocab_range))


@indexing.register_fake
def _indexing_fake(weight, ids, vocab_range=None):
    return weight.new_empty(_indexing_shape(weight, ids))


@torch.library.custom_op("kernkit::indexing_out", mutates_args=("out",))
def indexing_out(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
                 vocab_range: Optional[list[int]] = None) -> None:
    """``kernkit.ops.indexing(weight, ids, out=out, vocab_range=...)``."""
    embedding.indexing(weight, ids, out=out, vocab_range=_vocab_range(vocab_range))


@indexing_out.register_fake
def _indexing_out_fake(out, weight, ids, vocab_range=None):
    return None


# --- scale -----------------------------------------------------------------------------------


@torch.library.custom_op("kernkit::scale", mutates_args=())
def scale(src: torch.Tensor, factor: float) -> torch.Tensor:
    """``src * factor`` computed in fp32 (``kernkit.ops.scale``)."""
    return elementwise.scale(src, factor)


@scale.register_fake
def _scale_fake(src, factor):
    if src.dtype not in elementwise.SCALE_DTYPES:
        raise TypeError(f"'src': unsupported dtype {src.dtype}; supported: float16, bfloat16, float32")
    return torch.empty_like(src)


@torch.library.custom_op("kernkit::scale_out", mutates_args=("out",))
def scale_out(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    """``kernkit.ops.scale(src, factor, out=out)``."""
    elementwise.scale(src, factor, out=out)


@scale_out.register_fake
def _scale_out_fake(out, src, factor):
    return None


# --- autograd: none, as in eager ---------------------------------------------------------------
# The plain functions return tensors that do not require grad (the kernels are not differentiable).
# The functional custom ops say the same, so that a compiled model whose embedding table or
# input requires grad traces (its outputs do not require grad) instead of failing.


def _non_differentiable(ctx, inputs, output):
    ctx.mark_non_differentiable(output)


def _no_backward(ctx, grad):
    raise RuntimeError("kernkit ops are not differentiable")


indexing.register_autograd(_no_backward, setup_context=_non_differentiable)
scale.register_autograd(_no_backward, setup_context=_non_differentiable)


# --- compare_key -----------------------------------------------------------------------------


@torch.library.custom_op("kernkit::compare_key", mutates_args=())
def compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """Common-prefix length of two 1-d int32 CPU tensors (``kernkit.ops.compare_key``)."""
    return radix.compare_key(a, b)


@compare_key.register_fake
def _compare_key_fake(a, b):
    if a.dim() != 1 or b.dim() != 1:
        raise ValueError(f"compare_key: expected 1-d tensors, got {a.dim()}-d and {b.dim()}-d")
    n = torch.library.get_ctx().new_dynamic_size()
    torch._check(n <= a.shape[0])
    torch._check(n <= b.shape[0])
    return n
