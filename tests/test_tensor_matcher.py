"""TensorMatcher through a host-only C++ module on CPU tensors: every kind of mismatch, and the
message naming the tensor's role, the dimension and the expected and actual values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernkit.jit import load_jit

CSRC = Path(__file__).resolve().parent / "csrc"


@pytest.fixture(scope="module")
def mod():
    return load_jit(
        "test_matcher",
        cpp_files=[str(CSRC / "matcher_check.h")],
        cpp_wrappers=[
            ("match_pair", "match_pair<4>"),
            ("match_strided", "match_strided"),
            ("match_same_dtype", "match_same_dtype"),
            ("match_unnamed", "match_unnamed"),
            ("match_shape_of", "match_shape_of"),
            ("check_positive", "check_positive"),
            ("check_kind", "check_kind"),
            ("check_in_if_else", "check_in_if_else"),
            ("check_panic", "check_panic"),
        ],
    )


def test_matching_tensors_pass(mod):
    a = torch.zeros(3, 4)
    mod.match_pair(a, torch.ones(3, 4))
    mod.match_pair(torch.zeros(0, 4, dtype=torch.int64), torch.zeros(0, 4))


def test_fixed_dimension_mismatch(mod):
    with pytest.raises(ValueError, match=r"'b': dimension 1 expected 4, got 5 \(dimensions \[3, 5\]\)"):
        mod.match_pair(torch.zeros(3, 4), torch.zeros(3, 5))


def test_symbolic_dimension_bound_by_first_tensor(mod):
    with pytest.raises(ValueError, match=r"'b': dimension 0 \('num_tokens'\) expected 3 \(from 'a'\), got 2"):
        mod.match_pair(torch.zeros(3, 4), torch.zeros(2, 4))


def test_rank_mismatch(mod):
    with pytest.raises(ValueError, match=r"'a': expected a 2-d tensor, got 1-d with shape \[4\]"):
        mod.match_pair(torch.zeros(4), torch.zeros(3, 4))


def test_dtype_not_in_options_is_a_type_error(mod):
    with pytest.raises(TypeError, match=r"'b': expected dtype one of \{float32, int64\}, got int32"):
        mod.match_pair(torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.int32))


def test_non_contiguous_rejected_without_stride_pattern(mod):
    with pytest.raises(ValueError, match=r"'b': expected a contiguous tensor, got shape \[3, 4\] with strides \[1, 3\]"):
        mod.match_pair(torch.zeros(3, 4), torch.zeros(4, 3).t())


def test_stride_pattern_binds_symbolic_row_stride(mod):
    base = torch.zeros(5, 10, dtype=torch.float64)
    rows = base[:, 2:6]  # row stride 10, unit element stride
    assert mod.match_strided(rows, torch.zeros(5, dtype=torch.int32)) == 10


def test_stride_pattern_fixed_entry_mismatch(mod):
    cols = torch.zeros(4, 5).t()  # element stride 4 where 1 is required
    with pytest.raises(ValueError, match=r"'rows': stride 1 expected 1, got 5"):
        mod.match_strided(cols, torch.zeros(5, dtype=torch.int32))


def test_symbolic_dtype_options(mod):
    with pytest.raises(TypeError, match=r"'rows': expected dtype one of \{float32, float64\}, got float16"):
        mod.match_strided(torch.zeros(2, 2, dtype=torch.float16), torch.zeros(2, dtype=torch.int32))


def test_shared_symbol_across_matchers(mod):
    with pytest.raises(ValueError, match=r"'index': dimension 0 \('num_rows'\) expected 5 \(from 'rows'\), got 4"):
        mod.match_strided(torch.zeros(5, 3), torch.zeros(4, dtype=torch.int32))


def test_symbolic_dtype_bound_by_first_tensor(mod):
    mod.match_same_dtype(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"'b': expected dtype bfloat16 \(from 'a'\), got float32"):
        mod.match_same_dtype(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(3))


def test_unnamed_tensor_is_reported_by_position(mod):
    with pytest.raises(ValueError, match=r"tensor #1: dimension 0 expected 4, got 3"):
        mod.match_unnamed(torch.zeros(3))


@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 4), (1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 3)], ids=str)
def test_shape_of_another_tensor_any_rank(mod, shape):
    mod.match_shape_of(torch.zeros(shape), torch.ones(shape, dtype=torch.int64), torch.zeros(shape))


def test_shape_of_another_tensor_mismatch(mod):
    with pytest.raises(ValueError, match=r"^'a': expected shape \[2, 3, 4\] \(from 'b'\), got \[2, 3\]$"):
        mod.match_shape_of(torch.zeros(2, 3), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"^'a': expected shape \[\] \(from 'b'\), got \[1\]$"):
        mod.match_shape_of(torch.zeros(1), torch.zeros(()), torch.zeros(()))
    with pytest.raises(ValueError, match=r"^'b': expected a contiguous tensor"):
        mod.match_shape_of(torch.zeros(3, 2), torch.zeros(2, 3).t(), torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"^'c': expected shape \[3\], got \[4\]$"):
        mod.match_shape_of(torch.zeros(3), torch.zeros(3), torch.zeros(4))


def test_check_host_streams_its_message_only_on_failure(mod):
    assert mod.check_positive(17) == 3
    with pytest.raises(RuntimeError, match=r"check failed: n > 0 \(.*matcher_check.h:\d+\): n must be positive, got -2"):
        mod.check_positive(-2)


def test_kernkit_check_raises_its_kind_with_exactly_the_message(mod):
    mod.check_kind(5)
    with pytest.raises(ValueError) as e:
        mod.check_kind(-1)
    assert str(e.value) == "'n': expected n >= 0, got -1"
    with pytest.raises(TypeError) as e:
        mod.check_kind(100)
    assert str(e.value) == "'n': expected n < 100, got 100"


def test_check_macros_are_single_statements(mod):
    assert mod.check_in_if_else(False, 5) == -1
    assert mod.check_in_if_else(True, 5) == 5
    with pytest.raises(RuntimeError, match=r"check failed: n > 0 \(.*matcher_check.h:\d+\): n must be positive, got -3"):
        mod.check_in_if_else(True, -3)
    with pytest.raises(ValueError, match=r"^'n': expected n < 10, got 12$"):
        mod.check_in_if_else(True, 12)


def test_panic_and_runtime_check_raise_runtime_error(mod):
    mod.check_panic(0)
    with pytest.raises(RuntimeError, match=r"^RuntimeCheck: n is 1$"):
        mod.check_panic(1)
    with pytest.raises(RuntimeError, match=r"^Panic: n is 2$"):
        mod.check_panic(2)
