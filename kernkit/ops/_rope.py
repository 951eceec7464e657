"""What ``rotary_embedding`` and ``rotary_embedding_store`` share: the checks of a rope
specialization's arguments and its build, from the kernel file named after the op."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, is_arch_support_pdl, make_cpp_args

#: The dtypes of q and k the rope kernels are specialized for.
ROPE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def rope_spec(op: str, dtype: torch.dtype, rot_dim: int, is_neox: bool, backend: str | None = None) -> JitSpec:
    """The build of one specialization of ``op`` (``rotary_embedding`` or
    ``rotary_embedding_store``, from ``rope/<op>.cuh``): q/k dtype, rotary dimension (the
    cache's row length) and pairing."""
    if dtype not in ROPE_DTYPES:
        raise TypeError(f"'q': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    if not isinstance(is_neox, bool):
        raise TypeError(f"'is_neox': expected a bool, got {type(is_neox).__name__}")
    if rot_dim < 0:
        raise ValueError("'cos_sin_cache': expected a 2-d [max_position, rot_dim] tensor")
    if rot_dim == 0 or rot_dim % 2:
        raise ValueError(f"'cos_sin_cache': expected an even, positive rot_dim (its last dimension), got {rot_dim}")
    args = make_cpp_args(dtype, rot_dim, is_neox, backend != "emu" and is_arch_support_pdl())
    return JitSpec.make(op, *args, cuda_files=[f"rope/{op}.cuh"], cuda_wrappers=[(op, f"{op}<{args}>")],
                        backend=backend)


def rope_builds(op: str, dtypes: Sequence[torch.dtype], head_dim: int, rot_dim: int | None, is_neox: object,
                backend: str | None) -> list[JitSpec]:
    """The builds of ``op`` a model needs: one per dtype, for its rotary dimension (``head_dim``
    unless ``rot_dim`` is given) and pairing (``is_neox``: a bool, or ``0``/``1``/``true``/``false``
    as ``warmup --set`` passes it)."""
    rot = head_dim if rot_dim is None else rot_dim
    neox = is_neox if isinstance(is_neox, bool) else str(is_neox).lower() in ("1", "true")
    return [rope_spec(op, d, rot, neox, backend) for d in dict.fromkeys(dtypes)]
