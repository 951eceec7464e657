"""Every row-kernel template family builds with nvcc for sm_90 (compile only: the modules load
without a GPU). Kept to three nvcc runs: the two builds a typical model needs, and one unit
that instantiates the unusual shapes (odd rows, 1-byte elements, split rows, no PDL)."""

from __future__ import annotations

import os

import pytest
import torch

from kernkit.jit import JitSpec
from kernkit.ops.indexing import indexing_spec
from kernkit.ops.store_cache import store_cache_spec


@pytest.fixture(autouse=True)
def sm90(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the GPU tests build for it")
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "9.0")


def test_model_specializations_build_and_load():
    specs = [store_cache_spec(torch.bfloat16, (8, 128)), indexing_spec(torch.bfloat16, 1024)]
    assert [s.template_args[4] for s in specs] == ["true", "true"]  # sm_90 launches with PDL
    assert all(s.backend == "nvcc" and s.arch.sm == "90a" for s in specs)
    for spec in specs:
        assert callable(getattr(spec.build_and_load(), spec.name))


def test_unusual_instantiations_build():
    wrappers = [
        ("store_odd", "store_cache<2, 6, 2, 4, true>"),  # 6-byte rows: 2-byte accesses only
        ("store_fp8", "store_cache<1, 576, 16, 4, false, true>"),  # streaming stores
        ("store_split", "store_cache<4, 8192, 16, 4, true>"),  # a row split over 4 warps
        ("store_ragged", "store_cache<2, 1152, 16, 4, true>"),  # 72 vectors over 32 threads
        ("index_odd", "indexing<1, 7, 1, 4, true>"),
        ("index_fp32", "indexing<4, 4096, 16, 4, false>"),
    ]
    spec = JitSpec.make("row_kernels_compile_check", cuda_files=["kvcache/store_cache.cuh", "embedding/indexing.cuh"],
                        cuda_wrappers=wrappers)
    module = spec.build_and_load()
    for name, _ in wrappers:
        assert callable(getattr(module, name))
    assert os.path.isfile(spec.build())
