"""Every launcher reads a tensor's address as data pointer plus DLPack byte offset
(``host::data_ptr`` in tensor.h). torch always exports a byte offset of 0, so the views here
come from a small C++ helper (``tests/csrc/offset_view.h``) that keeps the data pointer at row 0
and moves the first element with the byte offset; the launchers run on the CPU emulator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import tvm_ffi

from kernkit.jit import load_jit

CSRC = Path(__file__).resolve().parent / "csrc"


@pytest.fixture(scope="module")
def view():
    mod = load_jit("test_offset_view", cpp_files=[str(CSRC / "offset_view.h")],
                   cpp_wrappers=[("offset_view", "offset_view")])

    def make(t: torch.Tensor, skip: int):
        # A call without torch tensor arguments returns a tvm_ffi.Tensor, which keeps the byte
        # offset (torch.from_dlpack would fold it into the data pointer).
        v = mod.offset_view(tvm_ffi.from_dlpack(t), skip)
        assert not isinstance(v, torch.Tensor)
        return v

    return make


@pytest.mark.parametrize("skip", [1, 4])  # a scalar-path start and a 16-byte aligned one
def test_scale(view, skip):
    mod = load_jit("scale", "fp32_t", "false", cuda_files=["elementwise/scale.cuh"],
                   cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="emu")
    src = torch.randn(67 + skip)
    out = torch.zeros_like(src)
    mod.scale(view(out, skip), view(src, skip), 2.0)
    assert torch.equal(out[skip:], src[skip:] * 2)
    assert not out[:skip].any()


def test_compare_key(view):
    mod = load_jit("compare_key", cpp_files=["radix/compare_key.h"], cpp_wrappers=[("compare_key", "compare_key")])
    a = torch.arange(40, dtype=torch.int32)
    b = a.clone()
    b[0] = -1  # differs only before the views start
    assert mod.compare_key(a, b) == 0
    assert mod.compare_key(view(a, 1), view(b, 1)) == 39


def test_store_cache(view):
    mod = load_jit("store_cache", "2", "128", "16", "2", "false", "false", cuda_files=["kvcache/store_cache.cuh"],
                   cuda_wrappers=[("store_cache", "store_cache<2, 128, 16, 2, false, false>")], backend="emu")
    k_cache, v_cache = torch.zeros(9, 64, dtype=torch.bfloat16), torch.zeros(9, 64, dtype=torch.bfloat16)
    k, v = torch.randn(5, 64).bfloat16(), torch.randn(5, 64).bfloat16()
    indices = torch.tensor([-1, 3, 0, 7, 2], dtype=torch.int64)
    mod.store_cache(view(k_cache, 1), view(v_cache, 1), view(indices, 1), view(k, 1), view(v, 1))
    want_k, want_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    want_k[1 + indices[1:]], want_v[1 + indices[1:]] = k[1:], v[1:]
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_indexing(view):
    mod = load_jit("indexing", "2", "128", "16", "2", "false", cuda_files=["embedding/indexing.cuh"],
                   cuda_wrappers=[("indexing", "indexing<2, 128, 16, 2, false>")], backend="emu")
    weight = torch.randn(11, 64).bfloat16()
    ids = torch.tensor([5, 0, 9, 3, 12], dtype=torch.int32)
    out = torch.zeros(5, 64, dtype=torch.bfloat16)
    mod.indexing(view(out, 2), view(weight, 1), view(ids, 2), (0, 10))
    assert not out[:2].any()
    assert torch.equal(out[2], weight[1 + 9]) and torch.equal(out[3], weight[1 + 3])
    assert not out[4].any()  # id 12 is outside the 10 rows of the view
