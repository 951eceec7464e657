"""Shared test setup: a private kernkit cache per test session, removed at its end, and a
target architecture for CUDA builds on machines without a GPU.

A run removes what it made but the folders of failed tests (``tmp_path_retention_policy =
"failed"`` in pyproject.toml), and those without their precompiled headers (about 100 MB each):
the session's cache goes, the makers still running are stopped, and tests share the session's
headers (``fresh_cache``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import warnings
from pathlib import Path

import pytest

# Set before kernkit is imported anywhere, so every build of the session lands in one private
# cache (warm across tests, cold for each new session) unless the caller chose a directory.
_SESSION_CACHE = None
if "KERNKIT_CACHE_DIR" not in os.environ:
    _SESSION_CACHE = os.environ["KERNKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernkit-test-cache-")
SHARED = Path(os.environ["KERNKIT_CACHE_DIR"]).absolute() / "v2"
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


def _stop_makers(roots: list[Path]) -> None:
    """Stop the detached makers (``kernkit/jit/maker.py``, each the leader of its own process
    group) still making a file under ``roots``: a stopped maker leaves nothing, and the removal
    of ``roots`` then finds nothing being written. SIGTERM first, so that the compiler's driver
    removes its temporary files (a ``cc*.s`` in ``TMPDIR``); SIGKILL for what is left after 5 s."""
    groups = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 3 and argv[1].endswith(b"maker.py") and any(
                Path(argv[3].decode()).is_relative_to(root) for root in roots):
            with contextlib.suppress(OSError):
                os.killpg(int(proc.name), signal.SIGTERM)
                groups.append(proc)
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        deadline = time.monotonic() + wait
        while any(_group_running(p) for p in groups) and time.monotonic() < deadline:
            time.sleep(0.05)
        if sig == signal.SIGTERM:
            for proc in groups:
                if _group_running(proc):
                    with contextlib.suppress(OSError):
                        os.killpg(int(proc.name), signal.SIGKILL)


def _group_running(leader: Path) -> bool:
    """Whether a process of the group ``leader`` leads (the maker and its compiler) is running."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == leader.name and fields[0] != "Z":
            return True
    return False


@pytest.fixture(scope="session", autouse=True)
def _makers_end_with_the_session(tmp_path_factory):
    """At the end: no maker still writing, and no precompiled header left in the folders pytest
    keeps (a failed test's: what it built stays, what any build would make again goes)."""
    yield
    basetemp = tmp_path_factory.getbasetemp()
    _stop_makers([basetemp, *([Path(_SESSION_CACHE)] if _SESSION_CACHE else [])])
    for pch in basetemp.glob("**/v2/pch"):
        if pch.is_symlink():
            pch.unlink()
        else:
            shutil.rmtree(pch, ignore_errors=True)


def pytest_unconfigure(config):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.stash.get(_GPU_DESELECTED, 0)
    if n:
        terminalreporter.write_line(f"{n} tests marked gpu were deselected: no CUDA GPU is visible "
                                    "(they run with `pytest -m gpu` on a GPU machine)")


@pytest.fixture
def into_b(tmp_path, monkeypatch):
    """The test runs in the cache ``b``, which does not exist yet (where it imports an archive
    that a module-scoped fixture made in a cache of its own)."""
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    return tmp_path / "b"


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty cache directory for one test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def fresh_cache(empty_cache):
    """A cache directory for one test, empty but for what its builds share and never wait for:
    its precompiled headers and helper objects (``v2/pch``, ``v2/helpers``) are links to the
    session cache's, so that the suite makes each once (about 100 MB and many CPU seconds a
    header) instead of once a test."""
    (empty_cache / "v2").mkdir(parents=True)
    for kind in ("pch", "helpers"):
        (SHARED / kind).mkdir(parents=True, exist_ok=True)
        (empty_cache / "v2" / kind).symlink_to(SHARED / kind, target_is_directory=True)
    return empty_cache
