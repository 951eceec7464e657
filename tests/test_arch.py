"""Target architecture selection."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import ArchError, CudaArch, is_arch_support_pdl, target_arch


@pytest.mark.parametrize("text", ["9.0", "9.0a", "90", "sm_90", "sm_90a", "compute_90"])
def test_parse_spellings(text):
    assert CudaArch.parse(text) == CudaArch(9, 0)


def test_hopper_and_later_build_the_arch_specific_target():
    assert CudaArch(9, 0).nvcc_flags == ("-gencode=arch=compute_90a,code=sm_90a",)
    assert CudaArch(10, 0).sm == "100a"
    assert CudaArch(8, 9).nvcc_flags == ("-gencode=arch=compute_89,code=sm_89",)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the visible GPU decides the target")
def test_without_gpu_the_environment_decides(monkeypatch):
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "8.0")
    assert target_arch() == CudaArch(8, 0)
    assert not is_arch_support_pdl()
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "9.0")
    assert is_arch_support_pdl()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the visible GPU decides the target")
def test_without_gpu_or_variable_the_error_says_what_to_set(monkeypatch):
    monkeypatch.delenv("KERNKIT_CUDA_ARCH")
    with pytest.raises(ArchError, match="KERNKIT_CUDA_ARCH=9.0"):
        target_arch()


def test_unparsable_arch_is_rejected():
    with pytest.raises(ArchError, match="cannot parse"):
        CudaArch.parse("hopper")
