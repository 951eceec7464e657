"""cache_once: memoization that is thread-safe and computes each key once."""

from __future__ import annotations

import threading
import time

import pytest

from kernkit.jit import cache_once


def test_hit_returns_the_same_object_and_keys_include_kwargs():
    calls = []

    @cache_once
    def factory(a, b=0):
        calls.append((a, b))
        return object()

    first = factory(1)
    assert factory(1) is first
    assert factory(1, b=2) is not first
    assert factory(1, b=2) is factory(1, b=2)
    assert calls == [(1, 0), (1, 2)]


def test_two_threads_asking_for_one_cold_key_compute_it_once():
    calls = []
    started = threading.Barrier(8)

    @cache_once
    def slow(key):
        calls.append(key)
        time.sleep(0.2)  # long enough that every thread arrives while the first computes
        return [key]

    results = [None] * 8

    def worker(i):
        started.wait()
        results[i] = slow("cold")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["cold"]
    assert all(r is results[0] for r in results)


def test_different_keys_do_not_wait_for_each_other():
    gate = threading.Event()

    @cache_once
    def f(key):
        if key == "blocked":
            gate.wait(5)
        return key

    t = threading.Thread(target=f, args=("blocked",))
    t.start()
    start = time.perf_counter()
    assert f("free") == "free"
    assert time.perf_counter() - start < 1.0
    gate.set()
    t.join()


def test_exceptions_are_not_cached():
    attempts = []

    @cache_once
    def flaky(x):
        attempts.append(x)
        if len(attempts) == 1:
            raise RuntimeError("first call fails")
        return x

    with pytest.raises(RuntimeError):
        flaky(3)
    assert flaky(3) == 3
    assert attempts == [3, 3]


def test_an_unhashable_argument_is_a_type_error_naming_its_parameter():
    calls = []

    @cache_once
    def factory(dtype, approximate):
        calls.append(approximate)
        return approximate

    with pytest.raises(TypeError, match=r"^'approximate': expected a hashable value \(.*factory caches on it\), "
                                        r"got list$"):
        factory("bf16", ["tanh"])
    with pytest.raises(TypeError, match=r"^'approximate': .* got dict$"):
        factory("bf16", approximate={})
    assert calls == [] and factory("bf16", "tanh") == "tanh"


def test_traced_by_torch_compile_without_graph_break():
    torch = pytest.importorskip("torch")

    @cache_once
    def scale_for(dtype):
        return 2.0 if dtype == torch.float32 else 3.0

    def fn(x):
        return x * scale_for(x.dtype)

    scale_for(torch.float32)  # warm, as a module factory would be
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    x = torch.ones(4)
    assert torch.equal(compiled(x), x * 2.0)


def test_a_cold_key_inside_torch_compile_is_a_graph_break_not_an_error():
    """Without fullgraph a miss (a module that still has to be loaded) runs eagerly between two
    graphs; kwargs keys included."""
    torch = pytest.importorskip("torch")
    calls = []

    @cache_once
    def factor(dtype, *, extra=0.0):
        calls.append(dtype)
        time.sleep(0.01)  # a load takes time; the lock is held meanwhile
        return 2.0 + extra

    def fn(x):
        return (x + 1) * factor(x.dtype, extra=1.0) - 1

    compiled = torch.compile(fn, backend="eager")
    x = torch.ones(4)
    assert torch.equal(compiled(x), (x + 1) * 3.0 - 1)
    assert torch.equal(compiled(x), (x + 1) * 3.0 - 1)
    assert calls == [torch.float32]


def test_an_error_of_a_miss_is_not_chained_to_the_lookup_that_missed():
    """The first-call error of an op is its own: no ``KeyError`` of the memo's lookup and no
    "During handling of the above exception" before it."""

    @cache_once
    def factory(dtype, flag):
        raise ValueError(f"cannot build {dtype}")

    with pytest.raises(ValueError, match="cannot build") as info:
        factory("fp32", False)
    assert info.value.__context__ is None and info.value.__cause__ is None
