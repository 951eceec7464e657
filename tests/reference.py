"""Torch implementations of the memory ops, with the same argument checks as the C++ launchers.

They serve CPU tensors when the CPU emulation backend is unavailable, and the tests compare the
kernels against them. Errors name the argument (``'k_cache': ...``) and use the exception
classes the launchers raise (``TypeError`` for dtypes, ``ValueError`` for the rest); every check
runs before anything is written.
"""

from __future__ import annotations

import math

import torch

__all__ = ["store_cache", "indexing", "compare_key", "scale", "check_rows"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def check_rows(t: torch.Tensor, role: str, row_elems: int, *, like: torch.Tensor | None = None,
               like_role: str = "", dtype: torch.dtype | None = None, device: torch.device | None = None,
               written: bool = False) -> None:
    """Check a tensor of rows: 2-d ``[rows, row_elems]`` or 3-d ``[rows, heads, head_dim]``,
    contiguous within a row, any row stride; optionally the same rank and row shape as ``like``,
    and the given dtype and device. ``written``: the op writes ``t``, so its rows must not
    overlap (a row stride of at least ``row_elems`` when it has more than one row)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"'{role}': expected a tensor, got {type(t).__name__}")
    if t.dim() not in (2, 3):
        raise ValueError(f"'{role}': expected a 2-d [rows, {row_elems}] or 3-d [rows, heads, head_dim] tensor, "
                         f"got {t.dim()}-d")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"'{role}': expected dtype {str(dtype).removeprefix('torch.')}, got "
                        f"{str(t.dtype).removeprefix('torch.')}")
    if device is not None and t.device != device:
        raise ValueError(f"'{role}': expected device {device}, got {t.device}")
    if like is not None:
        if t.dim() != like.dim():
            raise ValueError(f"'{role}': expected a {like.dim()}-d tensor like '{like_role}', got {t.dim()}-d")
        if t.shape[1:] != like.shape[1:]:
            raise ValueError(f"'{role}': row shape {list(t.shape[1:])} differs from '{like_role}' "
                             f"{list(like.shape[1:])}")
    if math.prod(t.shape[1:]) != row_elems:
        raise ValueError(f"'{role}': rows of {math.prod(t.shape[1:])} elements, expected {row_elems}")
    inner_ok = t.stride(-1) == 1 or t.shape[-1] == 1
    if t.dim() == 3:
        inner_ok = inner_ok and (t.stride(1) == t.shape[2] or t.shape[1] == 1)
    if not inner_ok:
        raise ValueError(f"'{role}': rows must be contiguous, got shape {list(t.shape)} with strides "
                         f"{list(t.stride())}")
    if written and t.shape[0] > 1 and t.stride(0) < row_elems:
        raise ValueError(f"'{role}': rows overlap (row stride {t.stride(0)} elements, rows of {row_elems}); "
                         f"a tensor the op writes needs distinct rows")


def _check_index(t: torch.Tensor, role: str, n: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"'{role}': expected a tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"'{role}': expected a 1-d tensor, got {t.dim()}-d with shape {list(t.shape)}")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"'{role}': expected dtype one of {{int32, int64}}, got {str(t.dtype).removeprefix('torch.')}")
    if t.device != device:
        raise ValueError(f"'{role}': expected device {device}, got {t.device}")
    if t.shape[0] != n:
        raise ValueError(f"'{role}': dimension 0 ('num_tokens') expected {n}, got {t.shape[0]}")
    if not t.is_contiguous():
        raise ValueError(f"'{role}': expected a contiguous tensor, got strides {list(t.stride())}")


def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """``k_cache[indices[i]] = k[i]`` and ``v_cache[indices[i]] = v[i]`` for every ``i`` whose
    index lies in ``[0, pool)``; other rows are skipped. In place."""
    row_elems = math.prod(k_cache.shape[1:]) if isinstance(k_cache, torch.Tensor) else 0
    check_rows(k_cache, "k_cache", row_elems, written=True)
    dtype, device = k_cache.dtype, k_cache.device
    check_rows(v_cache, "v_cache", row_elems, like=k_cache, like_role="k_cache", dtype=dtype, device=device,
               written=True)
    if v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(f"'v_cache': dimension 0 ('pool') expected {k_cache.shape[0]}, got {v_cache.shape[0]}")
    check_rows(k, "k", row_elems, dtype=dtype, device=device)
    check_rows(v, "v", row_elems, like=k, like_role="k", dtype=dtype, device=device)
    n = k.shape[0]
    if v.shape[0] != n:
        raise ValueError(f"'v': dimension 0 ('num_tokens') expected {n}, got {v.shape[0]}")
    _check_index(indices, "indices", n, device)
    if n == 0:
        return
    pool = k_cache.shape[0]
    valid = (indices >= 0) & (indices < pool)
    idx = indices[valid].long()
    # Bytes, not values: index_put is not implemented for every dtype (fp8), and a copy must
    # keep every bit (NaN payloads, -0.0).
    row_shape = tuple(_bytes(k_cache).shape[1:])
    _bytes(k_cache)[idx] = _bytes(k)[valid].reshape((-1, *row_shape))
    _bytes(v_cache)[idx] = _bytes(v)[valid].reshape((-1, *row_shape))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as uint8 (its last dimension scaled by the element size)."""
    return t if t.element_size() == 1 and t.dtype == torch.uint8 else t.view(torch.uint8)


def indexing(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, start: int, length: int) -> None:
    """``out[t] = weight[ids[t] - start]``, a zero row when ``ids[t]`` is outside
    ``[start, start + length)``. Writes ``out``."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        got = f"{weight.dim()}-d" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"'weight': expected a 2-d [rows, hidden] table, got {got}")
    row_elems = weight.shape[1]
    check_rows(weight, "weight", row_elems)
    check_rows(out, "out", row_elems, like=weight, like_role="weight", dtype=weight.dtype, device=weight.device,
               written=True)
    n = out.shape[0]
    _check_index(ids, "ids", n, weight.device)
    if not 0 <= length <= weight.shape[0]:
        raise ValueError(f"'vocab_range': length {length} must lie in [0, {weight.shape[0]}], the rows of 'weight'")
    if start < 0:
        raise ValueError(f"'vocab_range': start {start} must be >= 0")
    if n == 0:
        return
    local = ids.long() - start
    valid = (local >= 0) & (local < length)
    dst = _bytes(out)
    dst.zero_()
    dst[valid] = _bytes(weight)[local[valid]]


def compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The length of the common prefix of two 1-d int32 CPU tensors."""
    for t, role in ((a, "a"), (b, "b")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"'{role}': expected a tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"'{role}': expected a 1-d tensor, got {t.dim()}-d")
        if t.dtype != torch.int32:
            raise TypeError(f"'{role}': expected dtype int32, got {str(t.dtype).removeprefix('torch.')}")
        if t.device.type != "cpu":
            raise ValueError(f"'{role}': expected a cpu tensor, got {t.device.type}")
        if not t.is_contiguous():
            raise ValueError(f"'{role}': expected a contiguous tensor, got strides {list(t.stride())}")
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = torch.nonzero(a[:n] != b[:n])
    return int(diff[0, 0]) if diff.numel() else n


_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def scale(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    """``out = src * factor``, computed in fp32 and rounded once to the dtype. ``out`` and ``src``
    are 1-d, contiguous, of one float16/bfloat16/float32 dtype, device and length. Writes ``out``."""
    for t, role in ((out, "out"), (src, "src")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"'{role}': expected a tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"'{role}': expected a 1-d tensor, got {t.dim()}-d")
        if t.dtype not in _SCALE_DTYPES:
            raise TypeError(f"'{role}': expected dtype one of {{float16, bfloat16, float32}}, got "
                            f"{str(t.dtype).removeprefix('torch.')}")
        if not t.is_contiguous():
            raise ValueError(f"'{role}': expected a contiguous tensor, got strides {list(t.stride())}")
    if src.dtype != out.dtype:
        raise TypeError(f"'src': expected dtype {str(out.dtype).removeprefix('torch.')} (from 'out'), got "
                        f"{str(src.dtype).removeprefix('torch.')}")
    if src.device != out.device:
        raise ValueError(f"'src': expected device {out.device} (from 'out'), got {src.device}")
    if src.shape[0] != out.shape[0]:
        raise ValueError(f"'src': dimension 0 ('num_elements') expected {out.shape[0]} (from 'out'), "
                         f"got {src.shape[0]}")
    out.copy_(src.float() * factor)
