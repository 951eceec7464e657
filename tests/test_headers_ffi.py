"""kernkit/ffi.h from Python: tensors allocated or wrapped in C++ and returned through tvm-ffi.

The functions live in ``tests/csrc/headers_ffi.cc`` and build as a host-only module (g++, no
CUDA). What Python receives: when the call has a torch tensor argument, tvm-ffi allocates
through torch (``TVMFFIEnvTensorAlloc`` is torch's allocator for the call) and a returned tensor
arrives as a ``torch.Tensor``. A call without torch tensor arguments has no allocator and
returns ``tvm_ffi.Tensor`` objects; the tests pin both behaviours down.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "headers_ffi.cc"
FUNCS = ["empty", "empty_no_tensor_args", "empty_like", "workspace", "flat_view", "transposed_tail", "view_like",
         "owned_iota", "freed_count", "negative"]


@pytest.fixture(scope="module")
def mod():
    from kernkit.jit import load_jit

    return load_jit("headers_ffi_test", cpp_files=[str(SOURCE)],
                    cpp_wrappers=[(f, f"headers_ffi_test::Ffi::{f}") for f in FUNCS])


def test_empty_is_a_torch_tensor(mod):
    like = torch.zeros(1)
    t = mod.empty(3, 5, like)
    assert isinstance(t, torch.Tensor)
    assert t.shape == (3, 5) and t.dtype == torch.float16 and t.device == like.device and t.is_contiguous()
    t.fill_(2)  # writable, owned by torch
    assert float(t.sum()) == 30


def test_empty_needs_a_tensor_argument(mod):
    """tvm-ffi installs torch's allocator only for calls that receive a torch tensor."""
    with pytest.raises(RuntimeError, match="no environment allocator"):
        mod.empty_no_tensor_args(4)


def test_empty_like_is_contiguous(mod):
    like = torch.zeros(4, 6, dtype=torch.bfloat16).t()  # strided input
    t = mod.empty_like(like)
    assert t.shape == (6, 4) and t.dtype == torch.bfloat16 and t.is_contiguous()


@pytest.mark.parametrize("nbytes", [0, 1, 4096])
def test_workspace(mod, nbytes):
    t = mod.workspace(nbytes, torch.zeros(1))
    assert t.shape == (nbytes,) and t.dtype == torch.uint8


def test_from_blob_views_share_memory(mod):
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    flat = mod.flat_view(x)
    assert flat.shape == (12,) and flat.data_ptr() == x.data_ptr()
    flat[5] = -1
    assert x[1, 1] == -1
    tail = mod.transposed_tail(x)
    assert torch.equal(tail, x[:, 1:].t())
    assert tail.stride() == (1, 4)
    same = mod.view_like(x.t())
    assert torch.equal(same, x.t()) and same.stride() == x.t().stride()


def test_from_blob_deleter_runs_once(mod):
    before = mod.freed_count()
    t = mod.owned_iota(10)
    # No torch tensor went in, so what comes back is a tvm_ffi.Tensor; DLPack makes it torch's.
    assert not isinstance(t, torch.Tensor)
    assert torch.equal(torch.from_dlpack(t), torch.arange(10))
    assert mod.freed_count() == before
    del t
    gc.collect()
    assert mod.freed_count() == before + 1


def test_negative_extent_is_rejected(mod):
    with pytest.raises(RuntimeError, match="negative extent"):
        mod.negative()
