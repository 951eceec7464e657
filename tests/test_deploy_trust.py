"""What comes from elsewhere is input, not trusted code: a manifest replayed by ``warmup``, a
read-only shared cache (``KERNKIT_CACHE_SHARED``), the environment (``KERNKIT_FREEZE``,
``KERNKIT_RECORD``), another host's builds in progress, and a cache the tools cannot write.
CPU tensors, through the CPU emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernkit import ops
from kernkit.jit import manifest
from kernkit.ops import elementwise

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernkit.jit", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env})


@pytest.fixture
def scale_cold(monkeypatch, fresh_cache):
    """scale's module factory with nothing loaded, in a fresh cache; emptied again after."""
    elementwise._module.cache_clear()
    yield fresh_cache
    elementwise._module.cache_clear()


# --------------------------------------------------------------------------------------------
# KERNKIT_FREEZE


@pytest.mark.parametrize("value", ["1", "true", "on", "yes", "errors", "Error!"])
def test_an_unknown_freeze_value_raises_at_the_first_load_and_never_means_off(scale_cold, monkeypatch, value):
    from kernkit.tools import doctor

    monkeypatch.setenv("KERNKIT_FREEZE", value)
    with pytest.raises(ValueError, match=rf"KERNKIT_FREEZE must be one of 'error', 'warn', 'off' \(or unset\), "
                                         rf"got '{value}'"):
        ops.scale(torch.ones(4), 2.0)
    assert not list(scale_cold.glob("v2/scale/*/*/lib.so"))  # nothing compiled
    label, problem = next((v, p) for name, v, p in doctor.report() if name == "JIT")
    assert problem and f"got '{value}'" in label
    monkeypatch.setenv("KERNKIT_FREEZE", "off")
    elementwise.scale_spec(torch.float32, "emu").build()
    monkeypatch.setenv("KERNKIT_FREEZE", value)  # built now: a load still raises, it does not load unfrozen
    with pytest.raises(ValueError, match="KERNKIT_FREEZE must be one of"):
        ops.scale(torch.ones(4), 2.0)
