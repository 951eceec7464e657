"""The emulator's own test programs: built once per session with the CPU backend's flags
(``emu_exe``). pytest puts this directory on ``sys.path`` to import this file, so ``emu_build``
imports from here."""

from pathlib import Path

import pytest

import emu_build


@pytest.fixture(scope="session")
def emu_exe(tmp_path_factory):
    """Build an emulator test program once per session: ``emu_exe("emu_broken.cu")``."""
    if not emu_build.have_cuda_headers():
        pytest.skip("CUDA headers (CUDA_HOME) and a host C++ compiler are needed")
    out = tmp_path_factory.mktemp("emu")
    built = {}

    def get(src: str, sanitize: bool = False):
        key = (src, sanitize)
        if key not in built:
            name = Path(src).stem + ("_san" if sanitize else "")
            built[key] = emu_build.build(src, out, name, emu_build.SANITIZE if sanitize else None)
        return built[key]

    return get
