"""``compare_key``: the common-prefix length of two token sequences, for radix-tree matching."""

from __future__ import annotations

import torch

from ..jit import JitSpec, cache_once
from .registry import register_op


def compare_key_spec() -> JitSpec:
    """The host module (plain C++, no CUDA needed)."""
    return JitSpec.make("compare_key", cpp_files=["radix/compare_key.h"], cpp_wrappers=[("compare_key", "compare_key")])


@cache_once
def _module():
    return compare_key_spec().build_and_load()


def _fake(a: torch.Tensor, b: torch.Tensor) -> torch.SymInt:
    # A data-dependent int that later code may use in shapes (tokens[:n]).
    n = torch.library.get_ctx().new_dynamic_size()
    torch._check(n <= a.shape[0])
    torch._check(n <= b.shape[0])
    return n


@register_op(fake=_fake, specializations=lambda **_: [compare_key_spec()])
def compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The number of leading positions where two token sequences agree.

    Parameters
    ----------
    a, b
        1-d contiguous int32 CPU tensors; compared up to the shorter length.

    Returns
    -------
    int
        The first index where they differ, or the shorter length.

    Example
    -------
    >>> compare_key(torch.tensor([5, 6, 7], dtype=torch.int32), torch.tensor([5, 6, 0], dtype=torch.int32))
    2
    """
    return _module().compare_key(a, b)
