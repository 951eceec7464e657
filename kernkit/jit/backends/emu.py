"""The ``emu`` backend: the CUDA unit compiled by the host compiler against kernkit's CPU
emulator (``docs/emulator.md``), so that CPU tensors run the same templates."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .. import pch
from ..paths import EMU_INCLUDE_DIR
from .base import Backend, find_cxx, includes, need_cuda_home, own_headers, stamp

#: No FP contraction, so float results match the GPU's (kernels spell their fmas); no strict
#: aliasing, since CUDA code routinely reinterprets vectors (half2 as u32).
EMU_FLAGS = ("-x", "c++", "-std=c++17", "-O2", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing",
             "-DKERNKIT_EMU=1")
#: What every emulator unit starts with (force-included): the emulator's runtime, then the
#: third-party headers of ``pch.PRELUDE``, precompiled where ``pch.header`` has them.
EMU_PRELUDE = "#include <kernkit/emu/runtime.h>\n"


class Emu(Backend):
    name = "emu"
    flags = EMU_FLAGS
    unit = "kernel_emu.cc"
    prebuilt = True

    def compilers(self) -> list[str]:
        need_cuda_home("the CPU emulator (it compiles against CUDA's headers)")
        return [find_cxx()]

    def command(self, spec, compilers: list[str]) -> list[str]:
        flags = [compilers[0], *EMU_FLAGS, f"-I{EMU_INCLUDE_DIR}", *includes(cuda=True), *spec.extra_cflags]
        # The emulator's headers are in the precompiled header: its key covers their content.
        mine = [[str(f), hashlib.sha256(f.read_bytes()).hexdigest()] for f in own_headers()]
        header = pch.header(EMU_PRELUDE + pch.PRELUDE, flags, [stamp(compilers[0]), mine])
        return [*flags, "-include", str(header) if header else "kernkit/emu/runtime.h"]

    def link_flags(self, spec) -> list[str]:
        return ["-pthread"]

    def build(self, spec, compilers: list[str], build_dir: Path) -> list[Path]:
        # A unit compiled with the precompiled header reports none of the headers inside it.
        return sorted({*super().build(spec, compilers, build_dir), *own_headers()})
