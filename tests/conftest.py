"""Shared test setup: a private kernkit cache per test session, and a target architecture for
CUDA builds on machines without a GPU."""

from __future__ import annotations

import os
import tempfile
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

REPO = Path(__file__).resolve().parent.parent
CSRC = Path(__file__).resolve().parent / "csrc"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache directory for one test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
    return cache
