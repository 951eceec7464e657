"""tools/gpu_sanitize.py and tools/sanitize_driver.py, run here on the CPU emulator with a
stand-in compute-sanitizer (the real runs need the GPU): the driver lists every kernel, the tool
reports clean runs, fails on errors and on a missing summary, and never compiles."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

FAKE_SANITIZER = """#!{python}
# Stands in for compute-sanitizer: runs the command, then prints the tool's summary line.
# FAKE_SANITIZER_MODE: clean (default), errors (2 errors, exit 1), silent (no summary line).
import os, subprocess, sys

args = sys.argv[1:]
if args == ["--version"]:
    print("Compute Sanitizer stand-in Version 0.0"); sys.exit(0)
tool = "memcheck"
while args and args[0].startswith("--"):
    if args[0] == "--tool":
        tool = args[1]
    args = args[2:]
rc = subprocess.call(args)
mode = os.environ.get("FAKE_SANITIZER_MODE", "clean")
errors = 2 if mode == "errors" and tool in os.environ.get("FAKE_SANITIZER_TOOLS", tool) else 0
if mode != "silent":
    if tool == "racecheck":
        print(f"========= RACECHECK SUMMARY: {{errors}} hazards displayed ({{errors}} errors, 0 warnings)")
    else:
        print(f"========= ERROR SUMMARY: {{errors}} errors")
sys.exit(rc or (1 if errors else 0))
"""


@pytest.fixture
def fake_sanitizer(tmp_path):
    path = tmp_path / "bin" / "compute-sanitizer"
    path.parent.mkdir()
    path.write_text(FAKE_SANITIZER.format(python=sys.executable))
    path.chmod(0o755)
    return path


def run_sanitize(fake, out, mode, only="scale/float32-n1031", tools="memcheck,racecheck,initcheck", **env):
    """tools/gpu_sanitize.py on the CPU emulator, one small case, sharing the test run's
    build cache."""
    e = dict(os.environ, FAKE_SANITIZER_MODE=mode, **env)
    e.pop("KERNKIT_JIT", None)
    cmd = [sys.executable, "tools/gpu_sanitize.py", "--out", str(out), "--device", "cpu", "--sanitizer", str(fake),
           "--only", only, "--tools", tools, "--cache-dir", os.environ["KERNKIT_CACHE_DIR"]]
    return subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=600)


def test_driver_lists_every_kernel_and_the_hard_cases():
    names = subprocess.run([sys.executable, "tools/sanitize_driver.py", "--list"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    assert {n.split("/")[0] for n in names} == {"store_cache", "indexing", "scale"}
    for must in ("store_cache/bfloat16-8x128-i64", "store_cache/float16-1x3-i32-fused-kvbuffer",
                 "store_cache/bfloat16-8x128-i32-only-bad", "indexing/bfloat16-h576-i64-shard",
                 "indexing/float32-h100-i32-shard-outview", "scale/bfloat16-n1031-misaligned", "scale/float16-n70001"):
        assert must in names


def test_sanitize_tool_reports_clean_runs(fake_sanitizer, tmp_path):
    res = run_sanitize(fake_sanitizer, tmp_path / "out", "clean")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "plain run: exit 0, 1 cases" in res.stdout
    for line in ("memcheck: ERROR SUMMARY: 0 errors", "initcheck: ERROR SUMMARY: 0 errors",
                 "racecheck: RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"):
        assert line in res.stdout, res.stdout
    md = (tmp_path / "out" / "sanitize.md").read_text()
    assert md.count("| clean |") == 3 and "FAILED" not in md
    assert "`compute-sanitizer --tool memcheck --error-exitcode 1" in md and "python3 tools/sanitize_driver.py" in md
    assert str(REPO) not in md and sys.executable not in md  # no machine paths
    log = (tmp_path / "out" / "memcheck.log").read_text()
    assert "ok scale/float32-n1031-misaligned" in log and "SANITIZE-DRIVER-OK 1 cases" in log


def test_sanitize_tool_fails_on_errors_and_on_a_missing_summary(fake_sanitizer, tmp_path):
    res = run_sanitize(fake_sanitizer, tmp_path / "a", "errors", tools="memcheck,racecheck",
                       FAKE_SANITIZER_TOOLS="racecheck")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "memcheck: ERROR SUMMARY: 0 errors" in res.stdout
    assert "racecheck: RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings) (exit 1" in res.stdout
    assert "| racecheck |" in (tmp_path / "a" / "sanitize.md").read_text()
    assert "**FAILED**" in (tmp_path / "a" / "sanitize.md").read_text()
    res = run_sanitize(fake_sanitizer, tmp_path / "b", "silent", tools="initcheck")
    assert res.returncode == 1 and "initcheck: no summary line" in res.stdout, res.stdout + res.stderr


def test_sanitized_runs_never_compile(fake_sanitizer, tmp_path):
    """The tool runs have KERNKIT_JIT=off: a specialization missing from
    the cache fails the driver instead of compiling under the sanitizer (here: the plain run
    builds into one cache, and a stand-in that empties it before running shows the failure)."""
    cache = tmp_path / "cache"
    wiping = tmp_path / "bin" / "wipe-then-sanitize"
    wiping.write_text(f"#!/bin/sh\nrm -rf {shlex.quote(str(cache))}\nexec {shlex.quote(str(fake_sanitizer))} \"$@\"\n")
    wiping.chmod(0o755)
    e = dict(os.environ, FAKE_SANITIZER_MODE="clean")
    cmd = [sys.executable, "tools/gpu_sanitize.py", "--out", str(tmp_path / "out"), "--device", "cpu",
           "--sanitizer", str(wiping), "--only", "scale/bfloat16-n1031", "--tools", "memcheck",
           "--cache-dir", str(cache)]
    res = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "plain run: exit 0, 1 cases" in res.stdout
    assert "the driver did not finish" in res.stdout
    assert "JitDisabledError" in (tmp_path / "out" / "memcheck.log").read_text()
