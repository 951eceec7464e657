"""Tensor parallelism on two GPUs: the same check as ``test_tp_cpu.py`` with NCCL, each rank on
``cuda:<rank>``, NVLink multicast off, all ranks starting together on one cold cache directory.
Run with ``pytest -m gpu tests/distributed`` on a machine with at least two GPUs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("kernkit_tp_launch", Path(__file__).with_name("tp_launch.py"))
tp_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp_launch)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_tp_nccl_two_gpus_cold_shared_cache(tmp_path, dtype):
    results = tp_launch.run_worker(
        tmp_path, "--backend", "nccl", "--world-size", "2", "--vocab", "1003", "--hidden", "1024",
        "--heads", "8", "--head-dim", "128", "--tokens", "500", "--pool", "2048", "--dtype", dtype,
        env=NCCL_ENV, timeout=420)
    tp_launch.check_results(results, world=2)
    assert sorted(r["device"] for r in results) == ["cuda:0", "cuda:1"]
