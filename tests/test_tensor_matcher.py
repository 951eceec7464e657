"""TensorMatcher through a host-only C++ module on CPU tensors: every kind of mismatch, and the
message naming the tensor's role, the dimension and the expected and actual values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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
            ("match_heads", "match_heads"),
            ("match_pinned", "match_pinned"),
            ("footprints_overlap", "footprints_overlap"),
            ("refuse_overlap", "refuse_overlap"),
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


def test_a_pinned_size_names_where_it_comes_from(mod):
    """``set_value(4, "w's length")``: a mismatch names the argument the size came from, never
    the method that set it."""
    mod.match_pinned(torch.zeros(4), True)
    with pytest.raises(ValueError, match=r"^'t': dimension 0 \('n'\) expected 4 \(w's length\), got 3 "):
        mod.match_pinned(torch.zeros(3), True)
    with pytest.raises(ValueError, match=r"^'t': dimension 0 \('n'\) expected 4 \(set by the launcher\), got 3 "):
        mod.match_pinned(torch.zeros(3), False)


def test_rank_mismatch(mod):
    with pytest.raises(ValueError, match=r"'a': expected a 2-d tensor, got 1-d with shape \[4\]"):
        mod.match_pair(torch.zeros(4), torch.zeros(3, 4))


def test_dtype_not_in_options_is_a_type_error(mod):
    with pytest.raises(TypeError, match=r"'b': expected dtype one of \{float32, int64\}, got int32"):
        mod.match_pair(torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.int32))


def test_non_contiguous_rejected_without_stride_pattern(mod):
    with pytest.raises(ValueError,
                       match=r"'b': expected a contiguous tensor, got shape \[3, 4\] with strides \[1, 3\]"):
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
    with pytest.raises(RuntimeError,
                       match=r"check failed: n > 0 \(.*matcher_check.h:\d+\): n must be positive, got -2"):
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
    with pytest.raises(RuntimeError,
                       match=r"check failed: n > 0 \(.*matcher_check.h:\d+\): n must be positive, got -3"):
        mod.check_in_if_else(True, -3)
    with pytest.raises(ValueError, match=r"^'n': expected n < 10, got 12$"):
        mod.check_in_if_else(True, 12)


def test_panic_and_runtime_check_raise_runtime_error(mod):
    mod.check_panic(0)
    with pytest.raises(RuntimeError, match=r"^RuntimeCheck: n is 1$"):
        mod.check_panic(1)
    with pytest.raises(RuntimeError, match=r"^Panic: n is 2$"):
        mod.check_panic(2)


def test_dtype_names_follow_torch(mod):
    with pytest.raises(TypeError, match=r"'b': expected dtype one of \{float32, int64\}, got complex64$"):
        mod.match_pair(torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.complex64))


def test_size_one_dimensions_strides_are_ignored(mod):
    """torch calls [rows, 1, head_dim] with strides (128, 1, 1) contiguous, and `.contiguous()`
    leaves it so: the stride of a size-1 dimension is neither checked nor binds a symbol."""
    t = torch.zeros(4, 1, 128).as_strided((4, 1, 128), (128, 1, 1))
    assert t.is_contiguous() and t.contiguous().stride() == (128, 1, 1)
    assert mod.match_heads(t) == 128
    assert mod.match_heads(torch.zeros(1, 2, 8).as_strided((1, 2, 8), (7, 8, 1))) == -1
    mod.match_pair(torch.zeros(1, 4).as_strided((1, 4), (1, 1)), torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"'t': stride 1 \('head_dim'\) expected 8 \(from 't'\), got 9"):
        mod.match_heads(torch.zeros(80).as_strided((4, 2, 8), (18, 9, 1)))


def _bytes_of(t: torch.Tensor) -> set[int]:
    """Every byte address an element of ``t`` occupies, the slow way."""
    if t.numel() == 0:
        return set()
    elem = t.element_size()
    offsets = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride(), strict=True):
        offsets = offsets.unsqueeze(-1) + torch.arange(n) * s
    base = t.data_ptr()
    return {base + int(o) * elem + b for o in offsets.flatten().tolist() for b in range(elem)}


@st.composite
def two_views(draw):
    """Two strided views of one 4096-byte buffer, of 1 to 3 dimensions and 1-, 2- or 4-byte
    elements, often sharing dimension 0's stride (the case ``Footprint`` decides exactly)."""
    buf = torch.zeros(4096, dtype=torch.uint8)
    shared = draw(st.integers(1, 40))
    views = []
    for _ in range(2):
        dtype = draw(st.sampled_from([torch.uint8, torch.int16, torch.int32]))
        elem = torch.empty((), dtype=dtype).element_size()
        shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=3))
        strides = [shared if draw(st.booleans()) else draw(st.integers(0, 40))] + \
            draw(st.lists(st.integers(-6, 12), min_size=len(shape) - 1, max_size=len(shape) - 1))
        lo = sum(min(0, s * (n - 1)) for n, s in zip(shape, strides, strict=True))
        offset = draw(st.integers(-lo, -lo + 200))
        views.append(buf.view(dtype)[: 4096 // elem].as_strided(shape, strides, offset) if min(strides) >= 0
                     else None)
    return views


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(views=two_views())
def test_footprints_never_miss_an_overlap_and_are_exact_for_one_stride(mod, views):
    a, b = views
    if a is None or b is None:  # torch has no negative strides; Footprint's handling of them is not reachable here
        return
    real = bool(_bytes_of(a) & _bytes_of(b))
    said = mod.footprints_overlap(a, b)
    assert said or not real, (a.shape, a.stride(), b.shape, b.stride())
    if a.numel() == 0 or b.numel() == 0:
        assert not said
        return
    repeats = [t.shape[0] <= 1 or t.stride(0) == 0 or t.is_contiguous() for t in (a, b)]  # one segment
    same_stride = any(repeats) or a.stride(0) * a.element_size() == b.stride(0) * b.element_size()
    dense_rows = all(t.dim() < 2 or t[0].is_contiguous() for t in (a, b))  # a segment is exactly a row
    if same_stride and dense_rows:
        assert said == real, (a.shape, a.stride(), b.shape, b.stride())


def test_check_no_overlap_names_both_tensors(mod):
    buf = torch.zeros(64)
    kv = torch.zeros(8, 2, 4)
    mod.refuse_overlap(kv[:, 0], kv[:, 1], torch.zeros(3))  # interleaved rows never meet
    mod.refuse_overlap(buf[:8], buf[8:16], buf[16:])
    with pytest.raises(ValueError, match=r"^'w' and 'r' overlap in memory, and the kernel writes 'w'"):
        mod.refuse_overlap(buf[:8], buf[8:16], buf[7:9])
    with pytest.raises(ValueError, match=r"^'w' and 'w2' overlap in memory"):
        mod.refuse_overlap(buf[:8], buf[7:16], torch.zeros(3))
    with pytest.raises(ValueError, match=r"^'w2' and 'r' overlap in memory"):
        mod.refuse_overlap(kv[:, 0], kv[:, 1], kv[3, 1, 2:])
    mod.refuse_overlap(buf[:0], buf[:0], buf)  # no elements, no bytes
