"""The suite removes what it creates: a pytest session run with this suite's conftest and
pytest settings, in which one test builds a kernel and fails, leaves only that test's folder,
without precompiled headers, and no cache of its own (in the temporary directories it was
given, so that this session's own folders are not counted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib

TESTS = Path(__file__).resolve().parent

FAILING = textwrap.dedent('''
    import torch
    import kernkit.ops as ops

    def test_builds_and_fails(fresh_cache, tmp_path):
        assert torch.equal(ops.scale(torch.ones(4), 2.0), torch.full((4,), 2.0))  # an emu build
        (tmp_path / "kept.txt").write_text("what a failed test leaves for a look")
        assert False, "fails on purpose"

    def test_passes(fresh_cache):
        assert torch.equal(ops.scale(torch.ones(8), 3.0), torch.full((8,), 3.0))
''')


def _size(top: Path) -> int:
    return sum(p.lstat().st_size for p in top.rglob("*"))


@pytest.mark.slow
def test_a_failing_session_leaves_its_failed_test_folder_and_little_else(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(TESTS / "conftest.py", project / "conftest.py")
    (project / "test_it.py").write_text(FAILING)
    ini = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    (project / "pytest.ini").write_text(f"[pytest]\ntmp_path_retention_policy = {ini['tmp_path_retention_policy']}\n")
    temp, root = tmp_path / "tmp", tmp_path / "root"  # mkdtemp's folder, and pytest's
    temp.mkdir()
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KERNKIT_CACHE_DIR"}
    env.update(TMPDIR=str(temp), PYTEST_DEBUG_TEMPROOT=str(root))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_it.py"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert not list(temp.iterdir())  # the session's cache is gone
    (kept,) = root.glob("pytest-of-*/pytest-[0-9]*/test_builds_and_fails0/kept.txt")
    assert not list(root.glob("**/test_passes0"))
    assert not list(root.glob("**/v2/pch")) and not list(root.glob("**/*.gch"))
    assert _size(root) < 50 * 2**20
