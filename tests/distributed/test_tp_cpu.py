"""Tensor parallelism on CPU: two gloo ranks, a vocabulary-parallel embedding summed by an
all-reduce and per-rank KV-cache writes, on kernkit's CPU emulator, starting together on one cold
cache directory (each specialization compiled once, loaded by the other rank)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch.distributed as dist

_spec = importlib.util.spec_from_file_location("kernkit_tp_launch", Path(__file__).with_name("tp_launch.py"))
tp_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp_launch)

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def test_tp_gloo_two_ranks_cold_shared_cache(tmp_path):
    # vocab 1003 does not divide over 2 ranks; the embedding rows and each rank's 4 x 64 KV rows
    # are both 512 bytes, and the ranks need the same specializations.
    results = tp_launch.run_worker(
        tmp_path, "--backend", "gloo", "--world-size", "2", "--vocab", "1003", "--hidden", "256",
        "--heads", "8", "--head-dim", "64", "--dtype", "bfloat16", timeout=240)
    tp_launch.check_results(results, world=2)
    assert [r["shard"] for r in sorted(results, key=lambda r: r["rank"])] == [[0, 502], [502, 501]]
    assert all(r["device"] == "cpu" for r in results)
