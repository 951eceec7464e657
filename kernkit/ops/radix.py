"""``compare_key``: the common-prefix length of two token sequences, for radix-tree matching."""

from __future__ import annotations

import torch

from ..jit import JitRequest, cache_once

__all__ = ["compare_key", "specializations"]


def compare_key_request() -> JitRequest:
    """The build of the host module (plain C++, no CUDA needed)."""
    return JitRequest.make("compare_key", cpp_files=["radix/compare_key.h"],
                           cpp_wrappers=[("compare_key", "compare_key")])


@cache_once
def _compare_key_fn():
    return compare_key_request().load().compare_key


def compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The number of leading positions where the 1-d int32 CPU tensors ``a`` and ``b`` hold the
    same token (compared up to the shorter length)."""
    return _compare_key_fn()(a, b)


def specializations() -> list[JitRequest]:
    """The one build ``compare_key`` needs, for ahead-of-time compilation."""
    return [compare_key_request()]
