"""Compiling one specialization in a build directory.

kernkit writes its own small ``build.ninja`` rather than calling ``tvm_ffi.cpp.build``: that
helper takes the CUDA target from a process-wide environment variable or ``nvidia-smi`` and
keeps the compiler command to itself, while a kernkit build needs a per-build target, a CPU
emulation mode, a staging directory it fully controls, and the exact command for error reports.
tvm-ffi still supplies the include and library paths and the module loader. The ninja file stays
in the build directory, so ``ninja -C <dir>`` reproduces a build by hand.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import tvm_ffi.libinfo

from .arch import CudaArch
from .codegen import INCLUDE_DIR, KERNELS_DIR
from .toolchain import Toolchain, find_cuda_home

LIB_NAME = "lib.so"
_MAX_ERROR_LINES = 20


class CompileError(RuntimeError):
    """A specialization failed to compile or link.

    Attributes: ``spec`` (the specialization), ``source`` (path of the generated unit that
    failed), ``command`` (the compiler command line), ``errors`` (the first compiler errors) and
    ``log`` (the whole compiler output).
    """

    def __init__(self, spec: str, source: str, command: str, errors: list[str], log: str) -> None:
        self.spec, self.source, self.command, self.errors, self.log = spec, source, command, errors, log
        text = "\n".join(errors) if errors else log.strip()[-4000:]
        super().__init__(
            f"kernkit failed to build {spec}\n  source:  {source}\n  command: {command}\n  errors:\n{_indent(text)}"
        )


    def relocated(self, old: Path, new: Path) -> CompileError:
        """The same error with paths under ``old`` pointing under ``new`` (the kept build)."""
        o, n = str(old), str(new)
        return CompileError(
            self.spec, self.source.replace(o, n), self.command.replace(o, n), self.errors, self.log
        )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


@dataclass(frozen=True)
class Unit:
    """One translation unit: its file name in the build directory, its text, and which rule
    compiles it (``nvcc``, ``cxx`` or ``emu``)."""

    filename: str
    text: str
    rule: str


@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines a build's output. ``key_material`` (in ``cache.py``) hashes
    all of it."""

    title: str  # e.g. "store_cache<2048, 16, true>"
    kernel: str  # first marker element, the cache's first directory level
    variant: str  # the remaining marker elements, readable
    backend: str  # "cuda", "cpu" (the emulator) or "host" (C++ only)
    units: tuple[Unit, ...]
    arch: CudaArch | None
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    include_paths: tuple[str, ...] = ()
    sanitizers: tuple[str, ...] = ()
    deps: dict = field(default_factory=dict, compare=False)  # header path -> digest


#: The fixed flags of each rule; ``cache.key_material`` hashes them, so changing one here
#: rebuilds every specialization instead of silently reusing builds made with the old ones.
CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-DNDEBUG")
#: No FP contraction, so float results match the GPU's (kernels spell their fmas); no strict
#: aliasing, since CUDA code routinely reinterprets vectors (half2 as u32).
EMU_FLAGS = ("-x", "c++", "-std=c++17", "-O2", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing",
             "-DKERNKIT_EMU=1", "-include", "kernkit/emu/runtime.h")
#: nvcc's ``-O`` sets the optimization of the host code only: cicc and ptxas optimize the device
#: code fully whatever it says (the PTX and cubin of ``-O1`` and ``-O3`` are byte-identical). The
#: host side of a .cu unit (launcher, FFI glue, kernel stubs) spends its compile time in gcc's
#: optimizer over the inline functions of the tvm-ffi headers; ``-O1`` takes about a second of
#: CPU less than ``-O3`` per unit with no measurable difference per call (docs/performance.md).
NVCC_FLAGS = ("-std=c++17", "-O1", "-DNDEBUG", "-Xcompiler=-fPIC", "--expt-relaxed-constexpr")
BASE_FLAGS = {"cxx": CXX_FLAGS, "emu": EMU_FLAGS, "nvcc": NVCC_FLAGS}


def _includes(spec: BuildSpec, tc: Toolchain) -> list[str]:
    dirs = [str(INCLUDE_DIR), str(KERNELS_DIR), *spec.include_paths]
    dirs += [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
    cuda_home = tc.cuda_home or find_cuda_home()
    if spec.backend in ("cuda", "cpu") and cuda_home is not None:
        dirs += [str(cuda_home / "include"), str(cuda_home / "include" / "cccl")]
    return [f"-I{d}" for d in dict.fromkeys(dirs)]


def command_lines(spec: BuildSpec, tc: Toolchain) -> dict[str, list[str]]:
    """The compile command per rule and the link command (as argument lists, ``$in``/``$out``
    left for ninja)."""
    inc = _includes(spec, tc)
    san = [f"-fsanitize={','.join(spec.sanitizers)}", "-fno-omit-frame-pointer", "-g"] if spec.sanitizers else []
    cmds = {
        "cxx": [tc.cxx.path, *CXX_FLAGS, *inc, *spec.cflags],
        "emu": [tc.cxx.path, *EMU_FLAGS, *san, *inc, *spec.cflags],
    }
    if tc.nvcc is not None and spec.arch is not None:
        cmds["nvcc"] = [tc.nvcc.path, *NVCC_FLAGS, *spec.arch.nvcc_flags, *inc, *spec.cuda_cflags]
    tvm_lib = Path(tvm_ffi.libinfo.find_libtvm_ffi())
    link = [tc.cxx.path, "-shared", *san, f"-L{tvm_lib.parent}", "-ltvm_ffi", f"-Wl,-rpath,{tvm_lib.parent}"]
    if spec.backend == "cuda" and tc.cuda_home is not None:
        lib64 = tc.cuda_home / "lib64"
        link += [f"-L{lib64}", "-lcudart", f"-Wl,-rpath,{lib64}"]
    if spec.backend == "cpu":
        link += ["-pthread"]
    cmds["link"] = [*link, *spec.ldflags]
    return cmds


def _ninja_quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a).replace("$", "$$") for a in args)


def write_ninja(spec: BuildSpec, tc: Toolchain, build_dir: Path) -> None:
    cmds = command_lines(spec, tc)
    out = ["ninja_required_version = 1.3", ""]
    for rule in ("cxx", "emu", "nvcc"):
        if rule in cmds and any(u.rule == rule for u in spec.units):
            out += [f"rule {rule}", f"  command = {_ninja_quote(cmds[rule])} -c $in -o $out", f"  description = {rule} $in", ""]
    out += ["rule link", f"  command = {_ninja_quote(cmds['link'][:1])} $in {_ninja_quote(cmds['link'][1:])} -o $out", ""]
    objs = []
    for unit in spec.units:
        obj = unit.filename + ".o"
        out.append(f"build {obj}: {unit.rule} {unit.filename}")
        objs.append(obj)
    out += [f"build {LIB_NAME}: link {' '.join(objs)}", f"default {LIB_NAME}", ""]
    (build_dir / "build.ninja").write_text("\n".join(out))


def _ninja() -> str:
    try:
        import ninja  # the PyPI package ships the binary

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        return "ninja"


def run_build(spec: BuildSpec, tc: Toolchain, build_dir: Path) -> float:
    """Write the units and the ninja file into ``build_dir`` and build ``lib.so`` there.
    Returns the seconds it took; raises ``CompileError`` on failure."""
    for unit in spec.units:
        (build_dir / unit.filename).write_text(unit.text)
    write_ninja(spec, tc, build_dir)
    start = time.perf_counter()
    proc = subprocess.run([_ninja(), "-C", str(build_dir), "-v"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (build_dir / "build.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise _compile_error(spec, build_dir, proc.stdout + proc.stderr)
    return seconds


def _compile_error(spec: BuildSpec, build_dir: Path, log: str) -> CompileError:
    lines = log.splitlines()
    command, source, body = "", str(build_dir / spec.units[0].filename), lines
    for i, line in enumerate(lines):
        if line.startswith("FAILED:"):
            target = line.split(":", 1)[1].strip().split()[0] if line.split(":", 1)[1].strip() else ""
            command = lines[i + 1] if i + 1 < len(lines) else ""
            body = lines[i + 2 :]
            stem = target[:-2] if target.endswith(".o") else ""
            if stem:
                source = str(build_dir / stem)
            break
    body = [ln for ln in body if not ln.startswith("ninja: ")]
    errors = [ln for ln in body if re.search(r"\berror\b", ln, re.I)][:_MAX_ERROR_LINES]
    return CompileError(spec.title, source, command, errors or body[:_MAX_ERROR_LINES], log)
