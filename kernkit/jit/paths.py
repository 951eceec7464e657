"""Where kernkit's files are: the package, its C++ headers and kernel templates, and the name of
a built library. A leaf: the cache, the specs, the manifests and the backends all read it."""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
#: kernkit's C++ headers (``#include <kernkit/...>``): what kernel authors include.
INCLUDE_DIR = PACKAGE_ROOT / "include"
#: The CPU emulator's headers (``#include <kernkit/emu/...>``), an include root of their own that
#: only the emu backend's builds put on the path.
EMU_INCLUDE_DIR = PACKAGE_ROOT / "emu" / "include"
#: The shipped kernel templates; relative file names given to ``load_jit`` resolve here.
KERNELS_DIR = PACKAGE_ROOT / "kernels"
#: The library a build makes, in its build directory.
LIB_NAME = "lib.so"


def shipped_name(f: str) -> str | None:
    """Source ``f``'s name under ``KERNELS_DIR`` (how units, trees and manifests name a shipped
    kernel, wherever kernkit is installed), or None for a file outside it."""
    path = Path(f)
    return path.relative_to(KERNELS_DIR).as_posix() if KERNELS_DIR in path.parents else None
