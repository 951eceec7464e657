"""The invalid-call generator: tensors over guarded random buffers (``Arena``), one bad
argument at a time (``Bad``), and the check that a call raised an error naming that argument
and wrote nothing (``check_invalid``).

Each op's test material (``kernkit.testing.ops``) lists the ways to break each of its
arguments (``Bad``: a wrong dtype or rank, shapes that disagree, rows that are not contiguous or
overlap, meta tensors, non-tensor values, tensors that share memory with one the op writes,
torch's negative bit, written tensors that require grad or are inference tensors); its test
module draws the other arguments with hypothesis and calls ``check_invalid``: the call must
raise a ``TypeError``/``ValueError``/``RuntimeError`` whose message names the argument, with
every byte of every buffer unchanged, including the guard bytes around and between the rows.
The test module also draws valid-but-unusual views (misaligned starts, padded row strides,
stride-0 inputs, a table claiming 2**40 rows) and compares them with the reference.

Hypothesis runs derandomized (``invalid_calls``, ``VALID``): the same examples every run.
Without a GPU the wrong-device cases are meta tensors (DLPack cannot carry them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

INVALID_PER_OP = 240  # at least this many invalid calls per op, spread evenly over its kinds of bad argument


def invalid_calls(kinds: list, params: st.SearchStrategy) -> Callable[[Callable], Callable]:
    """The decorator of an op's invalid-call test ``test(bad, p, via, d)``: one parametrized case
    per kind of bad argument ``bad`` of ``kinds``, each with examples enough that the op gets
    ``INVALID_PER_OP`` calls in all; hypothesis draws the op's parameters ``p`` from ``params``,
    whether to call the plain op or its custom op (``via``), and data ``d`` for the bad value."""

    def wrap(test: Callable) -> Callable:
        test = given(p=params, via=st.sampled_from(["op", "custom op"]), d=st.data())(test)
        test = settings(max_examples=-(-INVALID_PER_OP // len(kinds)), deadline=None, derandomize=True, database=None,
                        suppress_health_check=list(HealthCheck))(test)
        return pytest.mark.parametrize("bad", kinds, ids=lambda bad: f"{bad.arg}-{bad.what}".replace(" ", "_"))(test)

    return wrap


VALID = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))

GUARD = 64  # bytes on each side of every view
HUGE = 2**40


# --------------------------------------------------------------------------------------------
# Tensors over guarded random buffers


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


@dataclass
class Arena:
    """Makes tensors as views of random byte buffers with guard bytes; remembers each buffer's
    bytes so that ``unchanged()`` can compare them and ``twin()`` can make a view of one over its
    copy."""

    gen: torch.Generator
    bufs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def seeded(cls, seed: int) -> Arena:
        return cls(torch.Generator().manual_seed(seed))

    def tensor(self, shape, dtype: torch.dtype, layout: str = "contiguous") -> torch.Tensor:
        """A ``shape`` tensor of ``dtype`` laid out as ``layout``:

        ``contiguous``; ``offset`` (contiguous, starting one element into the buffer: misaligned);
        ``padded`` (rows 3 elements apart more than their size: a misaligned row stride);
        ``expand`` (stride 0 in dimension 0: every row is the same memory); ``step2`` (stride 2
        in the last dimension); ``transposed`` (3-d: heads and head_dim swapped in memory; 2-d
        and 1-d, and 3-d with one head or head_dim 1, where swapping changes nothing: ``step2``).
        """
        shape = tuple(shape)
        elem = torch.empty((), dtype=dtype).element_size()
        offset = 0
        if layout in ("contiguous", "offset"):
            strides = _contiguous_strides(shape)
            offset = 1 if layout == "offset" else 0
        elif layout == "padded":
            inner = _contiguous_strides(shape[1:])
            strides = (math.prod(shape[1:]) + 3, *inner)
        elif layout == "expand":
            strides = (0, *_contiguous_strides(shape[1:]))
        elif layout == "step2" or (layout == "transposed" and (len(shape) < 3 or 1 in shape[1:])):
            strides = tuple(2 * s for s in _contiguous_strides(shape))
        elif layout == "transposed":
            _, h, d = shape
            strides = (h * d, 1, h)
        else:
            raise AssertionError(layout)
        span = 0 if 0 in shape else 1 + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))
        nbytes = 2 * GUARD + (offset + span) * elem
        nbytes += -nbytes % 16
        buf = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=self.gen)
        self.bufs.append((buf, buf.clone()))
        t = buf.view(dtype).as_strided(shape, strides, GUARD // elem + offset)
        return t

    def unchanged(self) -> bool:
        return all(torch.equal(buf, copy) for buf, copy in self.bufs)

    def copies(self) -> list[torch.Tensor]:
        """Fresh copies of every buffer as it was made."""
        return [copy.clone() for _, copy in self.bufs]

    def twin(self, t, copies: list[torch.Tensor]):
        """``t`` rebuilt over ``copies`` when it views an arena buffer (made here, or sliced from
        such a view); anything else is returned as is."""
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return t
        ptr = t.untyped_storage().data_ptr()
        i = next((i for i, (b, _) in enumerate(self.bufs) if b.untyped_storage().data_ptr() == ptr), None)
        return t if i is None else copies[i].view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())

    def same_as(self, copies: list[torch.Tensor]) -> bool:
        return all(torch.equal(buf, c) for (buf, _), c in zip(self.bufs, copies, strict=True))

    def alias(self, t: torch.Tensor, shape, dtype: torch.dtype, shift: int = 0) -> torch.Tensor:
        """A contiguous ``shape`` view of ``dtype`` over the buffer of ``t``, from ``t``'s first
        byte (rounded down to ``dtype``'s size) plus ``shift`` elements: memory ``t`` uses."""
        buf = next(b for b, _ in self.bufs if b.untyped_storage().data_ptr() == t.untyped_storage().data_ptr())
        start = t.storage_offset() * t.element_size() // dtype.itemsize + shift
        return buf.view(dtype).as_strided(tuple(shape), _contiguous_strides(tuple(shape)), start)

    def inference(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """``tensor(shape, dtype)`` made an inference tensor (under ``torch.inference_mode()``)."""
        with torch.inference_mode():
            return self.tensor(shape, dtype)


def meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class Bad:
    """One way to break one argument: ``make(arena, params)`` returns the bad value; ``exc`` the
    exception class it must raise."""

    arg: str
    what: str
    exc: type[Exception]
    make: Callable


def check_invalid(call: Callable[[], object], arena: Arena, bad: Bad) -> None:
    """``call()`` raises ``bad.exc`` naming ``bad.arg`` and leaves every buffer as it was."""
    with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
        call()
    msg = str(info.value)
    assert isinstance(info.value, bad.exc), f"{bad.arg}/{bad.what}: expected {bad.exc.__name__}, got " \
                                            f"{type(info.value).__name__}: {msg}"
    assert f"'{bad.arg}'" in msg, f"{bad.arg}/{bad.what}: the message does not name '{bad.arg}': {msg}"
    assert "Exception raised from" not in msg, msg  # a message, not a C++ stack dump
    assert arena.unchanged(), f"{bad.arg}/{bad.what}: a buffer was written by a call that raised"


def check_unallocatable(call: Callable[[], object], arena: Arena) -> None:
    """A view claiming 2**40 elements whose output the op allocates from its shape: torch's
    allocator refuses it, as it does for torch's own ops, before the launcher could name the
    view (the per-call path checks nothing); nothing is written."""
    with pytest.raises(RuntimeError, match="allocate"):
        call()
    assert arena.unchanged(), "a buffer was written by a call that raised"


#: What torch checks before an in-place op, on any tensor argument / on the ones an op writes.
#: The custom ops are not called with these: torch's own fallback resolves a negative-bit input
#: before kernkit sees it (and refuses a negative-bit output with its own message).
def neg_bit(make: Callable) -> Callable:
    return lambda a, p, d: torch._neg_view(make(a, p, d))


def requires_grad(make: Callable) -> Callable:
    return lambda a, p, d: make(a, p, d).requires_grad_()


SHARED = "shares memory"  # the bad kinds whose argument overlaps another one


def claims_huge(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() >= HUGE


def other_same_size(dtype: torch.dtype) -> torch.dtype:
    """A 2-byte float dtype other than ``dtype``: a dtype mismatch no size check catches."""
    return torch.float16 if dtype == torch.bfloat16 else torch.bfloat16


UNSUPPORTED_ROW_DTYPES = [torch.bool, torch.complex64, torch.complex128]
BAD_INDEX_DTYPES = [torch.int16, torch.uint8, torch.int8, torch.float32, torch.float64, torch.bool]
