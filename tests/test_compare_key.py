"""compare_key (host C++ through load_jit) against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernkit import ops


# ----- the reference: what the kernel must compute


def ref_compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The length of the common prefix of two 1-d tensors."""
    n = min(a.shape[0], b.shape[0])
    diff = torch.nonzero(a[:n] != b[:n])
    return int(diff[0, 0]) if diff.numel() else n


def plain(a, b):
    n = 0
    for x, y in zip(a.tolist(), b.tolist()):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("length", [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 64, 1000])
def test_every_mismatch_position(length):
    rng = np.random.default_rng(length)
    a = torch.from_numpy(rng.integers(-(2**31), 2**31 - 1, length, dtype=np.int32))
    assert ops.compare_key(a, a.clone()) == length
    for pos in range(length):
        b = a.clone()
        b[pos] ^= 1 << int(rng.integers(0, 32))
        assert ops.compare_key(a, b) == pos
        assert ops.compare_key(b, a) == pos


def test_lengths_differ_and_unaligned_slices():
    a = torch.arange(100, dtype=torch.int32)
    assert ops.compare_key(a, a[:37].clone()) == 37
    assert ops.compare_key(a[:0], a) == 0
    assert ops.compare_key(a[1:], torch.arange(1, 60, dtype=torch.int32)) == 59  # 4-byte aligned start


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 3), max_size=40), st.lists(st.integers(-3, 3), max_size=40))
def test_random_short_keys(xs, ys):
    a, b = torch.tensor(xs, dtype=torch.int32), torch.tensor(ys, dtype=torch.int32)
    assert ops.compare_key(a, b) == plain(a, b) == ref_compare_key(a, b)


@pytest.mark.parametrize(
    "a,b,role,exc",
    [
        (torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32), "a", TypeError),
        (torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), "b", ValueError),
        (torch.zeros(8, dtype=torch.int32)[::2], torch.zeros(4, dtype=torch.int32), "a", ValueError),
    ],
)
def test_bad_arguments(a, b, role, exc):
    with pytest.raises(exc, match=f"'{role}'"):
        ops.compare_key(a, b)
