"""Backends: how a specialization's units become ``lib.so``, one module each.

``nvcc`` compiles the CUDA unit for one GPU architecture; ``nvrtc`` compiles its device code
with NVRTC and its host code with the host compiler; ``emu`` compiles the same unit with the
host compiler against kernkit's CPU emulator, so CPU tensors run the same templates. Units made
of ``cpp_files`` alone always use the host compiler. A backend says which compilers it needs
(found without running them), which of its flags decide the output (they go into the cache
key), and how to build in a directory (``base``: what they share). ``BACKENDS`` is the one
place where backends plug in.
"""

from __future__ import annotations

import os

from ..config import BACKEND_VAR
from . import nvrtc
from .base import Backend
from .emu import Emu
from .nvcc import Nvcc
from .nvrtc import Nvrtc

#: The backends by name; ``default_backend()`` picks one for CUDA tensors.
BACKENDS: dict[str, Backend] = {b.name: b for b in (Nvcc(), Nvrtc(), Emu())}
#: What a spec without CUDA units builds with.
HOST = Backend()


def default_backend() -> str:
    """The backend of a CUDA build that names none: ``$KERNKIT_BACKEND``; else ``nvrtc`` where
    NVRTC and CUDA's headers are installed (``kernkit[nvrtc]``); else ``nvcc``."""
    explicit = os.environ.get(BACKEND_VAR, "").strip().lower()
    if explicit:
        return explicit
    return "nvrtc" if nvrtc.available() else "nvcc"
