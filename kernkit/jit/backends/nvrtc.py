"""The ``nvrtc`` backend: a specialization's device code compiled by NVRTC to a cubin, its host
code (the launchers) by the host compiler, with no CUDA toolkit on the machine.

NVRTC takes no host code and the host compiler no device code, so every source is split first
(``split.py``): the device halves of kernkit's headers and of the unit's files go to NVRTC,
the host halves to the host compiler. The host object then names, as undefined symbols, the
kernel instantiations its launchers take the address of; NVRTC compiles exactly those (by name
expression, so that ``int64_t``, ``long`` on the host and ``long long`` in NVRTC, does not
matter), and a generated assembly unit embeds the cubin and defines each of those symbols as a
record that ``LaunchKernel`` (``KERNKIT_NVRTC``) turns into a ``cudaKernel_t`` at its first
launch. NVRTC, the CUDA headers and the runtime come from the ``nvidia-cuda-*`` wheels (or a
toolkit); NVRTC is called through ``ctypes`` (``nvrtc_device.py`` says why).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import tvm_ffi.libinfo

from .. import pch
from ..paths import INCLUDE_DIR, KERNELS_DIR, shipped_name
from ..split import split
from .base import (
    CXX_FLAGS,
    Backend,
    ToolchainError,
    dir_stamp,
    find_cuda_home,
    find_cxx,
    ninja_deps,
    quote,
    run_ninja,
    stamp,
    write_ninja,
)

#: The host half's flags besides ``CXX_FLAGS``: ``-O1`` as for nvcc's host side; CUDA's
#: ``__launch_bounds__`` has no host meaning.
HOST_FLAGS = ("-O1", "-DKERNKIT_NVRTC=1", "-D__launch_bounds__(...)=")
#: NVRTC's: the device half has only device code, so unannotated (constexpr) functions are
#: device functions.
NVRTC_FLAGS = ("-std=c++17", "-default-device", "-DNDEBUG")
INSTALL = "pip install 'kernkit[nvrtc]' (nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl)"


@dataclass(frozen=True)
class Toolkit:
    """What an nvrtc build needs besides the host compiler."""

    nvrtc: str  #: libnvrtc's path
    include: tuple[str, ...]  #: CUDA's headers, crt's where apart, then CCCL's
    cudart: str  #: libcudart's path


@cache
def headers() -> tuple[str, ...]:
    """CUDA's headers as include directories: the runtime's, crt's where apart, then CCCL's; from
    the ``nvidia-cuda-*`` wheels of any site directory, else the toolkit's. The nvrtc backend
    and the CPU emulator compile against them. Raises ``ToolchainError`` naming what to install."""
    include = _roots("include")
    found = {
        "cuda_runtime.h": _find(include, "cuda_runtime.h"),
        "crt/host_defines.h": _find(include, "crt/host_defines.h"),
        "cuda/std/version": _find(include, "cccl/cuda/std/version") or _find(include, "cuda/std/version"),
    }
    paths = {name: path for name, path in found.items() if path is not None}
    missing = [name for name in found if name not in paths]
    if missing:
        raise ToolchainError(f"CUDA's headers are not installed ({', '.join(missing)} not found): {INSTALL}, "
                             "or set CUDA_HOME to a CUDA toolkit")
    cccl = paths["cuda/std/version"].parent.parent.parent
    return tuple(dict.fromkeys([str(paths["cuda_runtime.h"].parent), str(paths["crt/host_defines.h"].parent.parent),
                                str(cccl)]))


@cache
def toolkit() -> Toolkit:
    """NVRTC, the CUDA headers (``headers``) and the runtime: from the ``nvidia-cuda-*`` wheels
    of any site directory, else the toolkit's. Raises ``ToolchainError`` naming what to install.

    A plain search of the directories those wheels use, not ``cuda.pathfinder``: a warm load
    looks the compiler up too (its identity is part of the build record), and importing and
    asking pathfinder is slow and starts subprocesses
    (benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md)."""
    lib = _roots("lib")
    found = {"libnvrtc": _find(lib, "libnvrtc.so.*"), "libcudart": _find(lib, "libcudart.so.*")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise ToolchainError(f"the nvrtc backend cannot find {', '.join(missing)}: {INSTALL}")
    return Toolkit(str(found["libnvrtc"]), headers(), str(found["libcudart"]))


@cache
def available() -> bool:
    """Whether nvrtc builds can run here: ``toolkit`` finds what they need."""
    try:
        return bool(toolkit())
    except ToolchainError:
        return False


def _roots(kind: str) -> list[Path]:
    """Where the wheels put ``kind`` (``lib``, ``include``): ``nvidia/cu*/<kind>`` of each site
    directory; then the toolkit's ``lib64``/``include``."""
    roots = []
    for entry in sys.path:
        with contextlib.suppress(OSError):
            wheels = Path(entry or ".", "nvidia")
            roots += [wheels / d / kind for d in sorted(os.listdir(wheels), reverse=True) if d.startswith("cu")]
    home = find_cuda_home()
    return roots + ([home / ("lib64" if kind == "lib" else "include")] if home is not None else [])


def _find(roots: list[Path], pattern: str) -> Path | None:
    """The first file matching ``pattern`` (a wildcard in its last part only) under ``roots``."""
    for root in roots:
        path = root / pattern
        if "*" not in pattern:
            if path.is_file():
                return path
            continue
        with contextlib.suppress(OSError):
            hits = sorted(fnmatch.filter(os.listdir(path.parent), path.name))
            if hits:
                return path.parent / hits[-1]
    return None


class Nvrtc(Backend):
    name = "nvrtc"
    flags = (*CXX_FLAGS, *HOST_FLAGS, *NVRTC_FLAGS)
    unit = "kernel_host.cc"
    prebuilt = True

    def compilers(self) -> list[str]:
        return [find_cxx(), toolkit().nvrtc]

    def command(self, spec, compilers: list[str]) -> list[str]:
        """The host half's compile: the host compiler, with the third-party headers precompiled
        (``prelude``) and the halves first on the path."""
        flags = _host_flags(compilers[0], spec.extra_cflags)
        header = prelude(flags)
        return [*flags, *(["-include", str(header)] if header else []), "-Ihost"]

    def link_flags(self, spec) -> list[str]:
        cudart = Path(toolkit().cudart)
        return [f"-L{cudart.parent}", f"-l:{cudart.name}", f"-Wl,-rpath,{cudart.parent}"]

    def unit_text(self, spec, text: str) -> str:
        for i, f in enumerate(spec.cuda_files):  # a user's file is included through its halves
            text = text.replace(f'#include "{f}"', f'#include "{_half_name(f, i)}"')
        return text

    def build(self, spec, compilers: list[str], build_dir: Path) -> list[Path]:
        steps, sources = device_steps(spec, build_dir, spec.arch.sm, f"{self.unit}.o")
        steps += ["rule asm", f"  command = {quote(compilers[:1])} -c $in -o $out", "",
                  "build kernels.S.o: asm kernels.S | kernel.cubin", ""]
        run_ninja(build_dir, spec.title, write_ninja(self, spec, compilers, build_dir, steps, ["kernels.S.o"]))
        return ninja_deps(build_dir) + sources


def device_steps(spec, build_dir: Path, sm: str, obj: str, check: bool = False,
                 macros: Sequence[str] = ()) -> tuple[list[str], list[Path]]:
    """The ninja lines of the device step (``nvrtc_device.py``): NVRTC compiles, for ``sm_<sm>``
    with ``macros`` (``-D``/``-U`` options), the device halves of the spec's sources (written
    here) with the kernel instantiations that object ``obj`` names, into ``kernel.cubin`` and its
    records ``kernels.S``; with ``check`` (``obj`` is an emulator object, which defines them),
    into ``kernel.cubin`` alone. Returns the lines and the sources read."""
    sources, kernels = _write_halves(spec, build_dir, host=not check)
    (build_dir / "kernels.txt").write_text("\n".join(sorted(kernels)) + "\n")
    (build_dir / "device.cu").write_text("".join(f'#include "{_half_name(f, i)}"\n'
                                                 for i, f in enumerate(spec.cuda_files)))
    # A user's file is compiled as its half, elsewhere: what it includes by a quoted name from its
    # own folder is found on the path, after the halves.
    beside = dict.fromkeys(str(Path(f).parent) for f in spec.cuda_files if not shipped_name(f))
    options = [*NVRTC_FLAGS, f"-arch=sm_{sm}", *macros, "-Idevice", "-Ishim",
               *(f"-I{d}" for d in (*beside, *spec.extra_include_paths, *toolkit().include))]
    driver = quote([sys.executable, str(Path(__file__).with_name("nvrtc_device.py")), *(["--check"] * check),
                    toolkit().nvrtc])
    outputs = "kernel.cubin" if check else "kernels.S kernel.cubin"
    return ["rule device", f"  command = {driver} $in {quote(['kernels.txt', *options])}", "",
            f"build {outputs}: device {obj} | kernels.txt device.cu", ""], sources


def _host_flags(cxx: str, extra: tuple[str, ...]) -> list[str]:
    system = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path(), *toolkit().include]
    flags = [cxx, *CXX_FLAGS, *HOST_FLAGS, *extra]
    for d in dict.fromkeys(system):
        flags += ["-isystem", d]
    return flags


def prelude(flags: list[str]) -> Path | None:
    """``pch.PRELUDE`` as a header with its precompiled ``.gch`` beside it (``pch.header``), keyed by
    the compile flags and the identity of the compiler and of the headers' directories; None
    until a detached process has made it."""
    return pch.header(pch.PRELUDE, flags, [stamp(flags[0])] + [dir_stamp(d) for d in flags if Path(d).is_dir()])


def _half_name(f: str, i: int) -> str:
    """How the halves' trees name source ``f`` (``i``-th of the spec's CUDA files)."""
    return shipped_name(f) or f"user/{i}/{Path(f).name}"


def _write_halves(spec, build_dir: Path, host: bool = True) -> tuple[list[Path], set[str]]:
    """The host (unless not ``host``) and device halves of kernkit's headers, the shipped kernels
    and the spec's files under ``build_dir/host`` and ``build_dir/device``, and the shims that stand for the
    headers NVRTC cannot take; returns the sources read and the kernel names they define. Bytes
    that are not UTF-8 (a Latin-1 comment) pass through unchanged."""
    files = {f: f.relative_to(root) for root in (INCLUDE_DIR, KERNELS_DIR) for f in root.rglob("*")
             if f.suffix in (".h", ".cuh")}
    files.update((Path(f), Path(_half_name(f, i))) for i, f in enumerate(spec.cuda_files))
    kernels: set[str] = set()
    includes: set[str] = set()
    for source, rel in files.items():
        halves = _split(source.read_text(errors="surrogateescape"))
        kernels.update(halves.kernels)
        for side, text in (("host", halves.host), ("device", halves.device))[not host:]:
            out = build_dir / side / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            # The halves keep the source's line numbers; #line makes the compilers name the source.
            out.write_text(f"#line 1 {json.dumps(str(source), ensure_ascii=False)}\n{text}", errors="surrogateescape")
        includes.update(re.findall(r"^\s*#\s*include\s*<([^>]+)>", halves.device, re.M))
    kit = toolkit()
    (build_dir / "shim").mkdir()
    (build_dir / "shim" / _STD.name).write_text(_STD.read_text())
    for header in includes:
        if (build_dir / "device" / header).exists() or any(Path(d, header).exists() for d in kit.include):
            continue
        shim = build_dir / "shim" / header
        shim.parent.mkdir(parents=True, exist_ok=True)
        # The standard headers kernkit's device code uses become nvrtc_std.h; any other header
        # NVRTC lacks (tvm-ffi's, <tuple>, <array>) becomes empty: kernkit includes those for its
        # host code, and device code that needs more includes <cuda/std/...> itself. They are not
        # mapped to libcu++'s, whose type traits would weigh on every build (benchmark/results/
        # timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md).
        text = f'#include "{_STD.name}"\n' + _GLOBAL_NAMES.get(header, "") if header in _STD_HEADERS else ""
        shim.write_text("#pragma once\n" + text)
    return list(files), kernels


#: ``split`` by text: a process's later builds (a parallel ``warmup``, a server meeting a new
#: shape) re-split only what changed (what splitting every header costs:
#: benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md).
_split = lru_cache(maxsize=512)(split)

_STD = Path(__file__).with_name("nvrtc_std.h")
_STD_HEADERS = {"algorithm", "cstddef", "cstdint", "limits", "type_traits", "utility"}


#: What a C header's name in the global namespace brings, for the shims of <cstdint>/<cstddef>.
_GLOBAL_NAMES = {
    "cstdint": "".join(f"using cuda::std::{t};\n" for t in (
        "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "intptr_t",
        "uintptr_t")),
    "cstddef": "using cuda::std::size_t;\nusing cuda::std::ptrdiff_t;\n",
}
