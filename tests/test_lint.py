"""The tree passes its own checks, as CI runs them: ruff with the rules ``pyproject.toml``
selects, and mypy with its ``[tool.mypy]`` settings (``.pre-commit-config.yaml`` runs the same
two before a commit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_tool(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m module args`` from the repository's root, once the module is importable."""
    pytest.importorskip(module, reason="needs the test extra: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_ruff_finds_nothing_in_the_tree():
    r = run_tool("ruff", "check", "--no-cache", ".", timeout=300)
    assert r.returncode == 0, f"ruff check failed (exit {r.returncode}):\n{r.stdout}{r.stderr}"


@pytest.mark.slow
def test_mypy_finds_no_type_errors():
    r = run_tool("mypy", timeout=1800)  # no arguments: the files and settings of [tool.mypy]
    assert r.returncode == 0, f"mypy failed (exit {r.returncode}):\n{r.stdout}{r.stderr}"
