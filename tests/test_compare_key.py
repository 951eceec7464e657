"""compare_key (host C++ through load_jit) against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.invalid import VALID, Arena, check_invalid, invalid_calls
from kernkit.testing.ops.compare_key import KEY_BAD, i32, ref_compare_key


def plain(a, b):
    n = 0
    for x, y in zip(a.tolist(), b.tolist(), strict=False):
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


@st.composite
def key_params(draw):
    return dict(
        la=draw(st.sampled_from([0, 1, 5, 9, 40])),
        lb=draw(st.sampled_from([0, 1, 5, 9, 40])),
        layout_a=draw(st.sampled_from(["contiguous", "offset"])),
        layout_b=draw(st.sampled_from(["contiguous", "offset"])),
        common=draw(st.integers(0, 40)),
        seed=draw(st.integers(0, 2**16)),
    )


def key_args(a: Arena, p: dict) -> dict:
    x = a.tensor((p["la"],), i32, p["layout_a"])
    y = a.tensor((p["lb"],), i32, p["layout_b"])
    x.copy_(torch.randint(-3, 3, (p["la"],), generator=a.gen, dtype=i32))
    y.copy_(torch.randint(-3, 3, (p["lb"],), generator=a.gen, dtype=i32))
    k = min(p["common"], p["la"], p["lb"])
    y[:k] = x[:k]
    a.bufs[-2] = (a.bufs[-2][0], a.bufs[-2][0].clone())
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return dict(a=x, b=y)


@invalid_calls(KEY_BAD, key_params())
def test_compare_key_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    args = key_args(a, p)
    args[bad.arg] = bad.make(a, p, d)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "negative bit"):
        check_invalid(lambda: torch.ops.kernkit.compare_key(args["a"], args["b"]), a, bad)
    else:
        check_invalid(lambda: ops.compare_key(**args), a, bad)


@VALID
@given(p=key_params())
def test_compare_key_valid_views_give_the_reference(p):
    a = Arena.seeded(p["seed"])
    args = key_args(a, p)
    assert ops.compare_key(**args) == ref_compare_key(**args)
    assert a.unchanged()
