"""The ``emu`` backend: the CUDA unit compiled by the host compiler against kernkit's CPU
emulator (``docs/emulator.md``), so that CPU tensors run the same templates.

The emulator accepts code that no GPU build would (a kernel calling a host function), so the
build also compiles the kernels it launches for a GPU, compile-only, beside the host compile:
with NVRTC (``nvrtc.device_steps``: the instantiations the emulator's object defines) where
the ``nvrtc`` extra is installed, else with nvcc (``--ptx`` of the unit), else not, said once.
``KERNKIT_EMU_CHECK`` picks one (``config.emu_check``); the target is the visible GPU's, else
``KERNKIT_CUDA_ARCH``'s, else ``CHECK_ARCH``. The check decides whether the build succeeds,
not what it makes: it is not part of the key.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from functools import cache
from pathlib import Path

from .. import pch
from ..arch import ArchError, CudaArch, target_arch
from ..config import ARCH_VAR, EMU_CHECK_VAR, emu_check
from ..paths import EMU_INCLUDE_DIR
from . import nvrtc
from .base import (
    Backend,
    ToolchainError,
    find_cxx,
    includes,
    ninja_deps,
    own_headers,
    quote,
    run_ninja,
    stamp,
    write_ninja,
)
from .nvcc import NVCC_FLAGS, Nvcc

#: No FP contraction, so float results match the GPU's (kernels spell their fmas); no strict
#: aliasing, since CUDA code routinely reinterprets vectors (half2 as u32).
EMU_FLAGS = ("-x", "c++", "-std=c++17", "-O2", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing",
             "-DKERNKIT_EMU=1")
#: What every emulator unit starts with (force-included): the emulator's runtime, then the
#: third-party headers of ``pch.PRELUDE``, precompiled where ``pch.header`` has them.
EMU_PRELUDE = "#include <kernkit/emu/runtime.h>\n"
#: The GPU check's target where no GPU is visible and ``KERNKIT_CUDA_ARCH`` is unset: Hopper.
CHECK_ARCH = CudaArch(9, 0)


class Emu(Backend):
    name = "emu"
    flags = EMU_FLAGS
    unit = "kernel_emu.cc"
    prebuilt = True

    def compilers(self) -> list[str]:
        nvrtc.headers()  # CUDA's headers, from the wheels or a toolkit
        return [find_cxx()]

    def command(self, spec, compilers: list[str]) -> list[str]:
        system = [a for d in nvrtc.headers() for a in ("-isystem", d)]
        flags = [compilers[0], *EMU_FLAGS, f"-I{EMU_INCLUDE_DIR}", *includes(cuda=False), *system, *spec.extra_cflags]
        # The emulator's headers are in the precompiled header: its key covers their content.
        mine = [[str(f), hashlib.sha256(f.read_bytes()).hexdigest()] for f in own_headers()]
        header = pch.header(EMU_PRELUDE + pch.PRELUDE, flags, [stamp(compilers[0]), mine])
        return [*flags, "-include", str(header) if header else "kernkit/emu/runtime.h"]

    def link_flags(self, spec) -> list[str]:
        return ["-pthread"]

    def build(self, spec, compilers: list[str], build_dir: Path) -> list[Path]:
        steps = gpu_check(spec, build_dir, f"{self.unit}.o")
        run_ninja(build_dir, spec.title, write_ninja(self, spec, compilers, build_dir, steps))
        for halves in ("device", "shim"):  # the check's sources (2-3 times the library): kept only when it fails
            shutil.rmtree(build_dir / halves, ignore_errors=True)
        # A unit compiled with the precompiled header reports none of the headers inside it.
        return sorted({*ninja_deps(build_dir), *own_headers()})


def gpu_check(spec, build_dir: Path, obj: str) -> list[str]:
    """The ninja lines of the GPU check of ``spec``'s emulator build (whose object is ``obj``),
    as ``KERNKIT_EMU_CHECK`` says; none when it is ``off`` or no GPU compiler is installed."""
    mode = emu_check()
    sm = check_arch().sm
    macros = [f for f in spec.extra_cflags if f.startswith(("-D", "-U"))]  # the other flags are the host's
    if mode in ("auto", "nvrtc") and (mode == "nvrtc" or nvrtc.available()):
        nvrtc.toolkit()  # a ToolchainError naming what to install, for KERNKIT_EMU_CHECK=nvrtc
        steps, _ = nvrtc.device_steps(spec, build_dir, sm, obj, check=True, macros=macros)
        return [*steps, "default kernel.cubin", ""]
    if mode in ("auto", "nvcc"):
        try:
            nvcc = Nvcc().compilers()[1]  # its ToolchainError says how to name the toolkit
        except ToolchainError:
            if mode == "nvcc":
                raise
        else:
            user = [f"-I{p}" for p in spec.extra_include_paths]
            command = [nvcc, *NVCC_FLAGS, f"-arch=sm_{sm}", *includes(cuda=True), *user, *macros]
            return ["rule gpu_check", f"  command = {quote(command)} -x cu --ptx $in -o $out", "",
                    f"build gpu_check.ptx: gpu_check {Emu.unit}", "default gpu_check.ptx", ""]
    if mode == "auto":
        _skipped()
    return []


def check_arch() -> CudaArch:
    """The GPU check's target: the visible GPU's, else ``KERNKIT_CUDA_ARCH``'s, else ``CHECK_ARCH``."""
    try:
        return target_arch()
    except ArchError:
        if os.environ.get(ARCH_VAR):  # set, and not an architecture
            raise
        return CHECK_ARCH


@cache
def _skipped() -> None:
    """Say once per process that emulator builds are not checked for a GPU."""
    warnings.warn(f"kernkit: CPU emulator builds are not checked for a GPU here: neither NVRTC ({nvrtc.INSTALL}) "
                  f"nor nvcc (CUDA_HOME) is installed, so a kernel that a GPU build rejects may build and run on "
                  f"the CPU; {EMU_CHECK_VAR}=off silences this", RuntimeWarning, stacklevel=2)
