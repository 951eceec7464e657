"""Where kernkit's files are: the package, its C++ headers and kernel templates, the name of a
built library, and how a user's file under a spec's kernel root is named relative to it. A leaf:
the cache, the specs, the manifests and the backends all read it."""

from __future__ import annotations

import os
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
#: How a key names a file under the spec's kernel root: this, then its path under the root.
ROOT_PREFIX = "<root>/"


def shipped_name(f: str) -> str | None:
    """Source ``f``'s name under ``KERNELS_DIR`` (how units, trees and manifests name a shipped
    kernel, wherever kernkit is installed), or None for a file outside it."""
    path = Path(f)
    return path.relative_to(KERNELS_DIR).as_posix() if KERNELS_DIR in path.parents else None


def root_name(path: str | Path, root: str | None) -> str | None:
    """``path``'s name relative to a spec's kernel root (``JitSpec.kernel_root``, a real path),
    as keys and records give a file under it: both compared as real paths, ``/``-separated. None
    without a root, for a file outside it, and for kernkit's own files, which keep their name
    under ``KERNELS_DIR`` or their path in the package (``cache.local_path``)."""
    if root is None:
        return None
    real = Path(os.path.realpath(path))
    if PACKAGE_ROOT == real or PACKAGE_ROOT in real.parents or Path(root) not in real.parents:
        return None
    return real.relative_to(root).as_posix()


def root_relative(name: str) -> bool:
    """Whether ``name`` is a path that a record may give relative to a kernel root: not
    absolute, no NUL, and no part that is empty, ``.`` or ``..``. Such a name stays under the
    root whatever the root is; a record comes from a cache, which may be anyone's."""
    return (bool(name) and "\0" not in name and not name.startswith("/")
            and all(part not in ("", ".", "..") for part in name.split("/")))


def under_root(name: str, root: str) -> str:
    """The path of the file a record names ``name`` under ``root``; ``ValueError`` for a name
    that ``root_relative`` refuses, checked whole before it is joined."""
    if not root_relative(name):
        raise ValueError(f"{name!r} is not a path under the kernel root (absolute, '..', '.', an empty part or NUL)")
    return os.path.join(root, name)
