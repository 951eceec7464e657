"""The GPU check of CPU emulator builds (``kernkit/jit/backends/emu.py``): a kernel that a GPU
build rejects is rejected on the CPU too, with the GPU compiler's message at the user's line;
one it accepts builds as before; the check can be picked, turned off, and is said to be skipped
where no GPU compiler is installed."""

from __future__ import annotations

import textwrap

import pytest
import torch

from kernkit.jit import CompileError, load_jit
from kernkit.jit.backends import emu, nvrtc
from kernkit.jit.backends.base import find_cuda_home

#: A kernel that calls a host function: the emulator runs it, no GPU build takes it.
BAD = textwrap.dedent("""\
    #pragma once
    #include <kernkit/tensor.h>
    #include <kernkit/utils.cuh>
    namespace kernkit {
    inline float host_only(float v) { return v + 1.0f; }
    template <int N>
    __global__ void add_one_kernel(float* p) { p[threadIdx.x] = host_only(p[threadIdx.x]) + N; }
    template <int N>
    void add_one(tvm::ffi::TensorView t) {
      host::LaunchKernel(1, static_cast<uint32_t>(t.numel()), t.device())(add_one_kernel<N>,
                                                                          static_cast<float*>(t.data_ptr()));
    }
    }  // namespace kernkit
    """)
LINE = 7  # the kernel's body


def _load(tmp_path, text=BAD):
    src = tmp_path / "add_one.cuh"
    src.write_text(text)
    return src, load_jit("add_one", cuda_files=[str(src)], cuda_wrappers=[("add_one", "add_one<0>")], backend="emu")


def needs_nvcc():
    home = find_cuda_home()
    if home is None or not (home / "bin" / "nvcc").is_file():
        pytest.skip("no nvcc (CUDA_HOME) to check with")


def test_nvrtc_rejects_a_kernel_calling_a_host_function_at_the_users_line(tmp_path, fresh_cache):
    if not nvrtc.available():
        pytest.skip("the nvrtc extra (pip install 'kernkit[nvrtc]') is not installed")
    with pytest.raises(CompileError) as info:
        _load(tmp_path)
    message = str(info.value)
    assert f'{tmp_path / "add_one.cuh"}({LINE}): error: identifier "host_only" is undefined' in message, message
    assert "a GPU build rejects this kernel" in message and "KERNKIT_EMU_CHECK=off" in message


def test_nvcc_rejects_it_with_nvccs_message(tmp_path, fresh_cache, monkeypatch):
    needs_nvcc()
    monkeypatch.setenv("KERNKIT_EMU_CHECK", "nvcc")
    with pytest.raises(CompileError) as info:
        _load(tmp_path)
    assert f"add_one.cuh({LINE}): error: calling a __host__ function" in str(info.value), str(info.value)


def test_off_builds_what_the_emulator_takes_and_a_sound_kernel_passes_the_check(tmp_path, fresh_cache, monkeypatch):
    """The rejection comes from the check: without it the emulator runs the kernel; with it, a
    kernel that a GPU takes builds, and its cubin is made for the target."""
    monkeypatch.setenv("KERNKIT_EMU_CHECK", "off")
    _, mod = _load(tmp_path)
    x = torch.zeros(4)
    mod.add_one(x)
    assert torch.equal(x, torch.ones(4))
    monkeypatch.setenv("KERNKIT_EMU_CHECK", "auto")
    good = BAD.replace("inline float host_only", "KERNKIT_DEVICE float host_only")
    src, mod = _load(tmp_path, good)
    x = torch.zeros(4)
    mod.add_one(x)
    assert torch.equal(x, torch.ones(4))
    built = max(fresh_cache.glob("v2/add_one/*/*/lib.so"), key=lambda p: p.stat().st_mtime_ns).parent
    assert nvrtc.available() <= (built / "kernel.cubin").is_file()
    assert not (built / "device").exists()  # the check's sources go once it passed


def test_a_misspelt_mode_is_refused(tmp_path, fresh_cache, monkeypatch):
    monkeypatch.setenv("KERNKIT_EMU_CHECK", "no")
    with pytest.raises(ValueError, match="KERNKIT_EMU_CHECK must be one of 'auto', 'nvrtc', 'nvcc', 'off'"):
        _load(tmp_path)


def test_without_a_gpu_compiler_the_skip_is_said_once(tmp_path, fresh_cache, monkeypatch):
    monkeypatch.setattr(nvrtc, "available", lambda: False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    emu._skipped.cache_clear()
    with pytest.warns(RuntimeWarning, match="not checked for a GPU") as record:
        _, mod = _load(tmp_path)
        _load(tmp_path, BAD.replace("+ N;", "+ N + 0;"))
    assert sum("not checked for a GPU" in str(w.message) for w in record) == 1
