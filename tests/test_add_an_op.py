"""Adding an op the tutorial's way touches only the op's own files: in a copy of the repository,
a throwaway op made from the tutorial's ``scale`` (its kernel file, op file, test material, test
module and benchmark, every ``scale`` renamed) is registered, built, tested, hashed and
benchmarked by discovery, and ``git status`` lists those five files, of one stem, and nothing
else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NAME = "throwaway"

#: The tutorial's files and where the throwaway op's copies go (docs/tutorial-add-a-kernel.md).
FILES = {
    "kernkit/kernels/elementwise/scale.cuh": f"kernkit/kernels/elementwise/{NAME}.cuh",
    "kernkit/ops/scale.py": f"kernkit/ops/{NAME}.py",
    "kernkit/testing/ops/scale.py": f"kernkit/testing/ops/{NAME}.py",
    "tests/test_scale.py": f"tests/test_{NAME}.py",
    "benchmark/bench_scale.py": f"benchmark/bench_{NAME}.py",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """The working tree's tracked files, committed into a fresh repository, plus the throwaway op."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail("this test needs git and kernkit's git checkout")
    dst = tmp_path_factory.mktemp("repo")
    for rel in git(REPO, "ls-files", "-z").split("\0"):
        if rel and (REPO / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dst / rel)
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "base")
    for src, new in FILES.items():
        text = re.sub(r"\bscale\b", NAME, (REPO / src).read_text())
        (dst / new).write_text(text)
    return dst


def run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=900)


def test_git_status_lists_only_the_ops_own_files(repo):
    status = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert sorted(line.removeprefix("?? ") for line in status) == sorted(FILES.values()), status


def test_the_op_is_registered_tested_hashed_and_benchmarked(repo):
    listed = run(repo, "-c", f"import kernkit, kernkit.ops as o; print(kernkit.__file__, o.{NAME}.__name__)")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [str(repo / "kernkit" / "__init__.py"), NAME]
    tests = run(repo, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/test_{NAME}.py", "-k",
                "matches_torch_bit_for_bit or valid_views",
                "tests/test_kernel_hashes.py::test_every_shipped_kernel_has_cases")
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert re.search(r"\b\d+ passed\b", tests.stdout) and " failed" not in tests.stdout, tests.stdout
    cases = run(repo, "-m", "kernkit.testing.hashes", "--list")
    assert cases.returncode == 0, cases.stderr
    assert any(line.startswith(f"{NAME}/") for line in cases.stdout.splitlines()), cases.stdout
    bench = run(repo, f"benchmark/bench_{NAME}.py", "--out", str(repo / "out"))
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert f"checked {NAME} against fp32 torch on cpu" in bench.stdout, bench.stdout


def test_each_shipped_op_has_one_stem_at_every_layer():
    """Each op module of kernkit.ops (one op, or a family sharing one kernel) has a kernel file,
    test material, a test module and a benchmark of its stem."""
    import pkgutil

    import kernkit.ops

    stems = {op.fn.__module__.rsplit(".", 1)[1] for op in kernkit.ops.registered_ops()
             if op.qualname.startswith("kernkit::")}
    assert {m.name for m in pkgutil.iter_modules(kernkit.ops.__path__)} == stems | {"registry", "_flags", "_rope",
                                                                                   "_rows"}
    kernels = {p.name.split(".")[0] for p in (REPO / "kernkit" / "kernels").rglob("*.*h")}
    for stem in sorted(stems):
        assert stem in kernels, f"no kernkit/kernels/<area>/{stem}.cuh"
        for path in (f"kernkit/testing/ops/{stem}.py", f"tests/test_{stem}.py", f"benchmark/bench_{stem}.py"):
            assert (REPO / path).is_file(), path


def test_kernkit_names_no_path_into_tests():
    """The shipped package never imports or names a file of the test suite's directory."""
    found = [f"{p.relative_to(REPO)}: {line.strip()}" for p in (REPO / "kernkit").rglob("*")
             if p.is_file() and p.suffix in (".py", ".h", ".cuh", ".cc", ".md")
             for line in p.read_text().splitlines() if "tests/" in line or '"tests"' in line]
    assert not found, found
