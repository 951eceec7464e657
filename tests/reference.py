"""Torch implementations of kernkit's ops: the tests' oracle. They compute what the kernels must
produce on valid arguments, and check nothing."""

from __future__ import annotations

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as uint8 (its last dimension scaled by the element size): copies keep every bit
    (NaN payloads, -0.0) and work for dtypes index_put does not take (fp8)."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """``k_cache[indices[i]] = k[i]`` and ``v_cache[indices[i]] = v[i]`` for every ``i`` whose
    index lies in ``[0, pool)``; other rows are skipped. In place."""
    valid = (indices >= 0) & (indices < k_cache.shape[0])
    idx = indices[valid].long()
    rows = tuple(_bytes(k_cache).shape[1:])
    _bytes(k_cache)[idx] = _bytes(k)[valid].reshape((-1, *rows))
    _bytes(v_cache)[idx] = _bytes(v)[valid].reshape((-1, *rows))


def indexing(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, start: int, length: int) -> None:
    """``out[t] = weight[ids[t] - start]``, a zero row where ``ids[t]`` is outside
    ``[start, start + length)``. Writes ``out``."""
    local = ids.long() - start  # wraps where ids < start; those rows are not valid
    valid = (ids.long() >= start) & (local < length)
    dst = _bytes(out)
    dst.zero_()
    dst[valid] = _bytes(weight)[local[valid]]


def compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The length of the common prefix of two 1-d tensors."""
    n = min(a.shape[0], b.shape[0])
    diff = torch.nonzero(a[:n] != b[:n])
    return int(diff[0, 0]) if diff.numel() else n


def scale(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    """``out = src * factor``, computed in fp32 and rounded once to the dtype."""
    out.copy_(src.float() * factor)
