"""What the row-moving ops (``store_cache``, ``indexing``) share: the size of a row and the
build of one specialization for it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..jit import JitSpec, is_arch_support_pdl, make_cpp_args


def row_spec(kernel: str, file: str, elem_bytes: int, row_bytes: int, per_thread: int,
             backend: str | None) -> JitSpec:
    """One specialization of a row-moving kernel (``store_cache``, ``indexing``): rows of
    ``row_bytes`` bytes whose elements have ``elem_bytes`` bytes. The widest access that divides a
    row is a template argument; the launcher narrows it for less aligned pointers."""
    pdl = backend != "emu" and is_arch_support_pdl()
    args = make_cpp_args(elem_bytes, row_bytes, min(16, row_bytes & -row_bytes), per_thread, pdl)
    return JitSpec.make(kernel, *args, cuda_files=[file], cuda_wrappers=[(kernel, f"{kernel}<{args}>")],
                        backend=backend)


def row_bytes(dtype: torch.dtype, row_shape: Sequence[int], role: str) -> int:
    """Bytes per row of a tensor of ``dtype`` whose shape after the first dimension is
    ``row_shape``; a ``TypeError``/``ValueError`` naming ``role`` when no kernel takes it."""
    if dtype.itemsize not in (1, 2, 4, 8) or dtype.is_complex or dtype == torch.bool:
        raise TypeError(f"'{role}': dtype {str(dtype).removeprefix('torch.')} is not supported; the row kernels "
                        "take 1-, 2-, 4- or 8-byte integer and floating-point dtypes")
    if len(row_shape) not in (1, 2):
        raise ValueError(f"'{role}': expected rows of shape [elems] or [heads, head_dim], got "
                         f"[{', '.join(map(str, row_shape))}]")
    nbytes = math.prod(row_shape) * dtype.itemsize
    if nbytes <= 0:
        raise ValueError(f"'{role}': rows are empty (shape [*, {', '.join(map(str, row_shape))}])")
    return nbytes
