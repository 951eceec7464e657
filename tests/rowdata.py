"""Helpers shared by the row-op tests: random row bits and byte-level comparison."""

from __future__ import annotations

import torch


def rand_rows(shape, dtype, gen):
    """Random bits of ``dtype`` (NaN payloads and all), so equality is checked on bytes."""
    elem = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * elem), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def same_bytes(a, b):
    """Whether two tensors hold the same bytes (NaNs compare by payload)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
