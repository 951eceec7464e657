"""Shared test setup: a private kernkit cache per test session, and a target architecture for
CUDA builds on machines without a GPU."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import pytest

# Set before kernkit is imported anywhere, so every build of the session lands in one private
# cache (warm across tests, cold for each new session) unless the caller chose a directory.
if "KERNKIT_CACHE_DIR" not in os.environ:
    os.environ["KERNKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernkit-test-cache-")
os.environ.setdefault("KERNKIT_CUDA_ARCH", "9.0")
# CUDA builds that name no backend use nvcc unless the caller says otherwise
# (KERNKIT_BACKEND=nvrtc runs the suite through the nvrtc backend): what is installed on a
# machine would otherwise decide which backend the nvcc-specific tests see.
os.environ.setdefault("KERNKIT_BACKEND", "nvcc")

import torch  # noqa: E402

# torch.compile's first use imports torch.utils.mkldnn, which decorates 14 methods with torch's
# own deprecated torch.jit.script_method: import it now with that warning silenced, so that the
# warnings a run reports are about kernkit. (No kernkit code uses TorchScript.)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="`torch.jit.script_method` is deprecated", category=DeprecationWarning)
    import torch.utils.mkldnn  # noqa: E402,F401

REPO = Path(__file__).resolve().parent.parent
CSRC = Path(__file__).resolve().parent / "csrc"


#: How many tests marked gpu this session deselected.
_GPU_DESELECTED = pytest.StashKey[int]()


def pytest_collection_modifyitems(config, items):
    """Without a GPU the tests marked gpu are deselected, and counted in one line at the end,
    rather than skipped one by one (one -ra line each); asked for by name (-m gpu), they are
    skipped with the reason."""
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if "gpu" in item.keywords]
    if "gpu" in (config.getoption("markexpr") or ""):
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
        for item in gpu:
            item.add_marker(skip)
        return
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if "gpu" not in item.keywords]
    config.stash[_GPU_DESELECTED] = len(gpu)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.stash.get(_GPU_DESELECTED, 0)
    if n:
        terminalreporter.write_line(f"{n} tests marked gpu were deselected: no CUDA GPU is visible "
                                    "(they run with `pytest -m gpu` on a GPU machine)")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache directory for one test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
    return cache
