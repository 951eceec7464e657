"""Deliberately broken kernels the emulator must catch (see emu_broken.cu)."""

import re
from pathlib import Path

import pytest

import emu_build

SRC = Path(__file__).resolve().parent / "emu_broken.cu"


def mark_line(mark: str) -> int:
    for i, line in enumerate(SRC.read_text().splitlines(), start=1):
        if f"MARK:{mark}" in line:
            return i
    raise AssertionError(mark)


def run_case(emu_exe, case, seed="0", sanitize=False, env=None):
    e = {"KERNKIT_EMU_SEED": seed}
    e.update(env or {})
    return emu_build.run(emu_exe("emu_broken.cu", sanitize), case, env=e)


def test_divergent_full_mask_shuffle_names_lane_and_line(emu_exe):
    res = run_case(emu_exe, "divergent_shfl")
    assert res.returncode == 3, res.stdout + res.stderr
    msg = res.stdout
    assert "divergent_shfl(int*)" in msg
    assert re.search(r"block \(\d+,0,0\), thread \(16,0,0\)", msg), msg  # which block meets it first is the schedule's
    assert "lane 16 exited without reaching __shfl_xor_sync" in msg
    assert f"emu_broken.cu:{mark_line('divergent_shfl')}" in msg


def test_divergent_call_sites_name_both_lines(emu_exe):
    res = run_case(emu_exe, "divergent_sites")
    assert res.returncode == 3, res.stdout
    assert f"emu_broken.cu:{mark_line('site_a')}" in res.stdout
    assert f"emu_broken.cu:{mark_line('site_b')}" in res.stdout
    assert "lane 8" in res.stdout and "divergent warp" in res.stdout


@pytest.mark.parametrize("case,needle", [
    ("divergent_syncthreads", "divergent __syncthreads"),
    ("syncwarp_vs_syncthreads", "waits for this lane at __syncwarp"),
    ("partial_warp_full_mask", "lane 20 does not exist (the block has 20 threads)"),
    ("trap", "block (1,0,0), thread (7,0,0) [warp 0 lane 7]: __trap() called"),
])
def test_other_errors(emu_exe, case, needle):
    res = run_case(emu_exe, case)
    assert res.returncode == 3, res.stdout
    assert needle in res.stdout, res.stdout


@pytest.mark.parametrize("seed", ["1", "2", "3"])
def test_divergence_is_found_under_any_schedule(emu_exe, seed):
    res = run_case(emu_exe, "divergent_shfl", seed=seed)
    assert res.returncode == 3 and f"emu_broken.cu:{mark_line('divergent_shfl')}" in res.stdout, res.stdout


def test_missing_syncthreads_changes_result_across_seeds(emu_exe):
    seeds = [str(s) for s in range(6)]
    broken = [run_case(emu_exe, "missing_sync", seed=s).stdout.split("\n")[0] for s in seeds]
    fixed = [run_case(emu_exe, "with_sync", seed=s).stdout.split("\n")[0] for s in seeds]
    assert fixed == ["WRONG 0"] * len(seeds), fixed
    # The race shows: wrong elements under every schedule, and different results between seeds.
    assert all(b.startswith("WRONG ") and b != "WRONG 0" for b in broken), broken
    assert len(set(broken)) > 1, broken


def _asan_env():
    return {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"}


@pytest.mark.slow
def test_asan_catches_out_of_bounds_global_write(emu_exe):
    res = run_case(emu_exe, "oob_global", sanitize=True, env=_asan_env())
    assert res.returncode != 0
    assert "heap-buffer-overflow" in res.stderr, res.stderr[-3000:]
    assert "oob_global" in res.stderr


@pytest.mark.slow
def test_asan_catches_out_of_bounds_dynamic_smem(emu_exe):
    res = run_case(emu_exe, "oob_dynamic_smem", sanitize=True, env=_asan_env())
    assert res.returncode != 0
    assert "heap-buffer-overflow" in res.stderr, res.stderr[-3000:]
    assert "oob_dynamic_smem" in res.stderr


@pytest.mark.slow
def test_sanitized_build_runs_correct_kernels_cleanly(emu_exe):
    exe = emu_exe("emu_primitives.cu", True)
    for case in ("shfl_widths", "barrier_early_exit", "smem_isolation", "atomics"):
        res = emu_build.run(exe, case, env={**_asan_env(), "KERNKIT_EMU_SEED": "7"})
        assert res.returncode == 0 and "PASS" in res.stdout, case + res.stdout + res.stderr[-3000:]
    res = run_case(emu_exe, "divergent_shfl", sanitize=True, env=_asan_env())
    assert res.returncode == 3 and "lane 16" in res.stdout, res.stdout + res.stderr[-3000:]
