"""The ``nvcc`` backend: the CUDA unit compiled by the CUDA toolkit's nvcc for one GPU
architecture, linked against the toolkit's runtime."""

from __future__ import annotations

from .base import Backend, ToolchainError, find_cxx, includes, need_cuda_home

#: nvcc's ``-O`` sets the host code's level only (the PTX and cubin of ``-O1`` and ``-O3`` are
#: byte-identical); ``-O1`` saves about a second of gcc per unit (docs/performance.md).
NVCC_FLAGS = ("-std=c++17", "-O1", "-DNDEBUG", "-Xcompiler=-fPIC", "--expt-relaxed-constexpr")


class Nvcc(Backend):
    name = "nvcc"
    flags = NVCC_FLAGS
    unit = "kernel.cu"

    def compilers(self) -> list[str]:
        nvcc = need_cuda_home("the nvcc backend") / "bin" / "nvcc"
        if not nvcc.is_file():
            raise ToolchainError(f"nvcc not found at {nvcc}; set CUDA_HOME to the CUDA toolkit's root")
        return [find_cxx(), str(nvcc)]

    def command(self, spec, compilers: list[str]) -> list[str]:
        return [compilers[1], *NVCC_FLAGS, *spec.arch.nvcc_flags, *includes(cuda=True), *spec.extra_cuda_cflags]

    def link_flags(self, spec) -> list[str]:
        lib64 = need_cuda_home("the nvcc backend") / "lib64"
        return [f"-L{lib64}", "-lcudart", f"-Wl,-rpath,{lib64}"]
