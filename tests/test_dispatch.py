"""The C++ dispatch of store_cache and indexing (kernkit/ops/dispatch.py,
kernkit/include/kernkit/dispatch.h): a hit calls the specialization registered for the key
tensor's dtype, device type and row shape; misses fall back to the Python path and register;
bad arguments after a hit raise exactly what the Python path raises, and write nothing; threads
share a table safely; without a dispatcher the ops work as before.

Every test gets fresh tables (the ops' dispatchers are replaced for its duration), so the order
of tests, and tables filled elsewhere in the session, do not matter. The kernels run on the CPU
emulator.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import tvm_ffi

from kernkit import ops
from kernkit.jit import CacheDirError, CaptureCompileError, CompileError, JitDisabledError, ToolchainError
from kernkit.ops import dispatch, embedding, fallback, kvcache, reference
from kernkit.ops.dispatch import Dispatcher
from rowdata import rand_rows, same_bytes

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
POOL = 24


@pytest.fixture(autouse=True)
def emulated():
    if fallback.cpu_backend() != "cpu":
        pytest.skip("the CPU emulation backend does not build here (CPU ops use the torch reference)")


def use_dispatch(monkeypatch, available: bool = True) -> None:
    """Give both ops fresh dispatchers; with ``available=False`` the module cannot be had, as
    without a compiler, so the ops keep their Python path."""
    loader = (lambda: dispatch.dispatch_request().load()) if available else (lambda: None)
    monkeypatch.setattr(dispatch, "dispatch_module", loader)
    monkeypatch.setattr(kvcache, "_dispatch", Dispatcher(arg_index=0))
    monkeypatch.setattr(embedding, "_dispatch", Dispatcher(arg_index=1))


@pytest.fixture
def fresh(monkeypatch):
    use_dispatch(monkeypatch)


def table(arg_index: int = 0) -> tuple:
    """The ``(call, add)`` functions of a new table."""
    return tuple(dispatch.dispatch_request().load().make_dispatch(arg_index))


def recorder(log: list, name: str):
    """A tvm-ffi function that records its name and arguments."""
    return tvm_ffi.convert(lambda *args: log.append((name, args)))


def store_args(dtype, row, n, gen, pool=POOL):
    kc, vc = rand_rows((pool, *row), dtype, gen), rand_rows((pool, *row), dtype, gen)
    k, v = rand_rows((n, *row), dtype, gen), rand_rows((n, *row), dtype, gen)
    idx = torch.randperm(pool, generator=gen)[:n]
    if n >= 2:
        idx[0] = -1  # skipped
    return kc, vc, idx, k, v


def store_matches_reference(kc, vc, idx, k, v) -> bool:
    want_k, want_v = kc.clone(), vc.clone()
    reference.store_cache(want_k, want_v, idx, k, v)
    ops.store_cache(kc, vc, idx, k, v)
    return same_bytes(kc, want_k) and same_bytes(vc, want_v)


def empty_store_args(dtype, row, pool=POOL):
    """Arguments that are valid and write nothing (n = 0): probes whether a key hits."""
    return (torch.zeros(pool, *row, dtype=dtype), torch.zeros(pool, *row, dtype=dtype),
            torch.zeros(0, dtype=torch.int64), torch.zeros(0, *row, dtype=dtype), torch.zeros(0, *row, dtype=dtype))


# -- the table -----------------------------------------------------------------------------------


def test_a_hit_forwards_every_argument_to_the_function_of_its_key():
    call, add = table(arg_index=1)
    log: list = []
    a, b = torch.zeros(4, 2, 8, dtype=fp16), torch.zeros(4, 16, dtype=fp16)
    assert add(a, recorder(log, "a")) and add(b, recorder(log, "b"))
    assert call("x", torch.zeros(9, 2, 8, dtype=fp16), 7, 2.5) is True  # another first dimension: same key
    assert call(None, torch.zeros(1, 16, dtype=fp16)) is True
    assert [name for name, _ in log] == ["a", "b"]
    assert log[0][1][0] == "x" and tuple(log[0][1][1].shape) == (9, 2, 8) and log[0][1][2:] == (7, 2.5)
    assert len(log[1][1]) == 2


@pytest.mark.parametrize("other", [
    torch.zeros(4, 16, dtype=fp16),  # rank
    torch.zeros(4, 2, 4, dtype=fp16),  # row shape
    torch.zeros(4, 2, 8, dtype=bf16),  # dtype of the same size
    torch.zeros(4, 2, 8, dtype=torch.int16),
    torch.zeros(4, 2, 8, dtype=fp16)[:, :, None, :],  # one more dimension
])
def test_keys_differ_in_dtype_rank_and_row_shape(other):
    call, add = table()
    log: list = []
    add(torch.zeros(4, 2, 8, dtype=fp16), recorder(log, "a"))
    assert call(other) is False and log == []


def test_a_miss_calls_nothing_and_returns_false():
    call, add = table(arg_index=1)
    log: list = []
    add(torch.zeros(3, 5), recorder(log, "f"))
    assert call() is False and call(torch.zeros(3, 5)) is False  # too few arguments
    for value in (None, 3, 1.5, "weight", [torch.zeros(3, 5)], object()):
        assert call(torch.zeros(3, 5), value, torch.zeros(3, 5)) is False
    assert call(0, torch.zeros(3, 6)) is False and call(0, torch.zeros(3, 5, dtype=torch.float64)) is False
    assert log == []


def test_scalars_and_tensors_of_more_than_six_dimensions_are_never_stored():
    call, add = table()
    log: list = []
    f = recorder(log, "f")
    assert add(torch.zeros(()), f) is False and call(torch.zeros(())) is False
    seven = torch.zeros((2,) * 7)
    assert add(seven, f) is False and call(seven) is False
    six = torch.zeros((2,) * 6)
    assert add(six, f) is True and call(six) is True and len(log) == 1


def test_the_first_function_of_a_key_stays_and_the_table_is_capped():
    call, add = table()
    log: list = []
    assert add(torch.zeros(2, 1), recorder(log, "first")) is True
    assert add(torch.zeros(5, 1), recorder(log, "second")) is False
    call(torch.zeros(1, 1))
    assert log[-1][0] == "first"
    for width in range(2, 40):
        add(torch.zeros(2, width), recorder(log, str(width)))
    hits = [width for width in range(1, 40) if call(torch.zeros(2, width))]
    assert hits == list(range(1, 17))  # 16 keys, in the order they came


def test_add_wants_a_tensor_and_a_function():
    _, add = table()
    with pytest.raises(TypeError):
        add(None, recorder([], "f"))
    with pytest.raises(TypeError):
        add(torch.zeros(2, 2), "not a function")


def test_make_dispatch_checks_the_argument_index():
    module = dispatch.dispatch_request().load()
    with pytest.raises(ValueError, match="arg_index"):
        module.make_dispatch(-1)
    with pytest.raises(ValueError, match="arg_index"):
        module.make_dispatch(64)


def test_the_stored_function_s_errors_come_through_unchanged():
    call, add = table()

    def fail(*args):
        raise ValueError("'k': something is wrong")

    add(torch.zeros(2, 3), tvm_ffi.convert(fail))
    with pytest.raises(ValueError, match="^'k': something is wrong$"):
        call(torch.zeros(2, 3))


# -- the Python side --------------------------------------------------------------------------


def test_only_functions_of_compiled_modules_are_registered(fresh):
    d = Dispatcher(arg_index=0)
    t = torch.zeros(2, 3)
    assert d.call(t) is False  # loads the module
    d.add(t, reference.store_cache)  # a torch fallback: a Python function
    assert d.call(t) is False
    log: list = []
    d.add(t, recorder(log, "f"))
    assert d.call(t) is True and len(log) == 1


def test_each_dispatcher_has_its_own_table(fresh):
    one, two = Dispatcher(0), Dispatcher(0)
    t = torch.zeros(2, 3)
    one.call(t), two.call(t)
    one.add(t, recorder([], "f"))
    assert one.call(t) is True and two.call(t) is False


def test_no_module_means_every_call_misses(monkeypatch):
    monkeypatch.setattr(dispatch, "dispatch_module", lambda: None)
    d = Dispatcher(0)
    t = torch.zeros(2, 3)
    assert d.call(t) is False
    d.add(t, recorder([], "f"))
    assert d.call(t) is False


@pytest.mark.parametrize("error", [ToolchainError("no c++"), JitDisabledError("KERNKIT_JIT=off"),
                                   CacheDirError("kernkit cannot create the build lock: Read-only file system")],
                         ids=lambda e: type(e).__name__)
def test_a_module_that_cannot_be_built_is_none(monkeypatch, error):
    class Request:
        def load(self):
            raise error

    monkeypatch.setattr(dispatch, "dispatch_request", lambda: Request())
    assert dispatch.dispatch_module.__wrapped__() is None


def test_a_compile_error_of_the_module_raises(monkeypatch):
    class Request:
        def load(self):
            raise CompileError("dispatch", "host.cc", "c++ ...", ["error: boom"], "")

    monkeypatch.setattr(dispatch, "dispatch_request", lambda: Request())
    with pytest.raises(CompileError, match="boom"):
        dispatch.dispatch_module.__wrapped__()
    monkeypatch.setattr(dispatch, "dispatch_module", dispatch.dispatch_module.__wrapped__)
    with pytest.raises(CompileError, match="boom"):
        Dispatcher(0).call(torch.zeros(2, 3))
    monkeypatch.setattr(kvcache, "_dispatch", Dispatcher(0))
    kc = torch.zeros(POOL, 16)
    with pytest.raises(CompileError, match="boom"):
        ops.store_cache(kc, kc.clone(), torch.tensor([1]), torch.ones(1, 16), torch.ones(1, 16))


def test_a_first_call_inside_a_capture_misses_and_loads_later(monkeypatch):
    attempts = []

    def loader():
        attempts.append(1)
        if len(attempts) == 1:
            raise CaptureCompileError("dispatch is not compiled, and the current CUDA stream is capturing")
        return dispatch.dispatch_request().load()

    monkeypatch.setattr(dispatch, "dispatch_module", loader)
    d = Dispatcher(0)
    t = torch.zeros(2, 3)
    assert d.call(t) is False and len(attempts) == 1
    assert d.call(t) is False and len(attempts) == 2  # loaded now
    d.add(t, recorder([], "f"))
    assert d.call(t) is True and len(attempts) == 2


# -- store_cache ------------------------------------------------------------------------------

STORE_CASES = [(bf16, (4, 64)), (fp32, (16,)), (bf16, (2, 16)), (fp16, (256,))]


def count_picks(monkeypatch, module, factory: str) -> list:
    """The dtypes the op's Python factory ``module.factory`` is asked for from now on."""
    picked = []
    real = getattr(module, factory)

    def counting(*key):
        picked.append(key[0])
        return real(*key)

    monkeypatch.setattr(module, factory, counting)
    return picked


def test_store_cache_keys_each_get_their_entry_and_match_the_reference(fresh, monkeypatch):
    picked = count_picks(monkeypatch, kvcache, "_store_fn")
    gen = torch.Generator().manual_seed(3)
    for dtype, row in STORE_CASES:
        assert not kvcache._dispatch.call(*empty_store_args(dtype, row))
    for rep in range(3):
        for dtype, row in STORE_CASES:
            assert store_matches_reference(*store_args(dtype, row, 7, gen, pool=POOL + rep))
    assert picked == [dtype for dtype, _ in STORE_CASES]  # the Python path once per key, then C++
    for dtype, row in STORE_CASES:
        assert kvcache._dispatch.call(*empty_store_args(dtype, row, pool=3))
    assert not kvcache._dispatch.call(*empty_store_args(fp16, (4, 64)))  # not seen yet


def test_store_cache_empty_and_out_of_range_calls_after_a_hit(fresh):
    gen = torch.Generator().manual_seed(4)
    assert store_matches_reference(*store_args(bf16, (4, 64), 5, gen))
    kc, vc, _, k, v = store_args(bf16, (4, 64), 3, gen)
    assert store_matches_reference(kc, vc, torch.tensor([POOL, -POOL, 2**31 - 1]), k, v)
    assert store_matches_reference(*empty_store_args(bf16, (4, 64)))


def _store_base() -> dict:
    return {"k_cache": torch.zeros(POOL, 4, 64, dtype=bf16), "v_cache": torch.zeros(POOL, 4, 64, dtype=bf16),
            "indices": torch.arange(3, dtype=torch.int32), "k": torch.ones(3, 4, 64, dtype=bf16),
            "v": torch.ones(3, 4, 64, dtype=bf16)}


def _meta(*shape):
    return torch.empty(shape, dtype=bf16, device="meta")


# (argument, what is wrong, its bad value): each replaces one argument of _store_base().
STORE_BAD = [
    ("v", "dtype", lambda: torch.ones(3, 4, 64)),
    ("v", "rows", lambda: torch.ones(4, 4, 64, dtype=bf16)),
    ("v", "none", lambda: None),
    ("v", "meta", lambda: _meta(3, 4, 64)),
    ("k", "strided-rows", lambda: torch.ones(3, 4, 128, dtype=bf16)[:, :, ::2]),
    ("k", "rank", lambda: torch.ones(3, 256, 1, dtype=bf16)),
    ("v_cache", "pool", lambda: torch.zeros(POOL + 1, 4, 64, dtype=bf16)),
    ("v_cache", "rank", lambda: torch.zeros(POOL, 256, dtype=bf16)),
    ("indices", "dtype", lambda: torch.arange(3, dtype=torch.float32)),
    ("indices", "length", lambda: torch.arange(4, dtype=torch.int32)),
    ("indices", "rank", lambda: torch.zeros(3, 1, dtype=torch.int64)),
    ("indices", "list", lambda: [0, 1, 2]),
    # k_cache keeps its key (so the call hits) and is bad in a way only the launcher sees.
    ("k_cache", "strided-rows", lambda: torch.zeros(POOL, 4, 128, dtype=bf16)[:, :, ::2]),
    ("k_cache", "overlapping-rows", lambda: torch.zeros(1, 4, 64, dtype=bf16).expand(POOL, 4, 64)),
    ("k_cache", "meta", lambda: _meta(POOL, 4, 64)),
    # k_cache of another key, or not a tensor: the Python path's own checks.
    ("k_cache", "complex64", lambda: torch.zeros(POOL, 4, 64, dtype=torch.complex64)),
    ("k_cache", "bits8", lambda: torch.zeros(POOL, 4, 64, dtype=torch.bits8)),  # DLPack refuses it
    ("k_cache", "empty-rows", lambda: torch.zeros(POOL, 0, dtype=bf16)),
    ("k_cache", "scalar", lambda: torch.zeros((), dtype=bf16)),
    ("k_cache", "none", lambda: None),
    ("k_cache", "str", lambda: "cache"),
]


def _outcome(fn, args) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        fn(**args)
    return type(info.value), str(info.value).splitlines()[0]


@pytest.mark.parametrize("arg,what,bad", STORE_BAD, ids=[f"{a}-{w}" for a, w, _ in STORE_BAD])
def test_store_cache_bad_arguments_after_a_hit_raise_what_the_python_path_raises(monkeypatch, arg, what, bad):
    use_dispatch(monkeypatch, available=False)
    want = _outcome(ops.store_cache, {**_store_base(), arg: bad()})
    use_dispatch(monkeypatch, available=True)
    gen = torch.Generator().manual_seed(5)
    assert store_matches_reference(*store_args(bf16, (4, 64), 3, gen))  # registers the key
    assert kvcache._dispatch.call(*empty_store_args(bf16, (4, 64)))
    args = {**_store_base(), arg: bad()}
    got = _outcome(ops.store_cache, args)
    assert got == want
    if what != "bits8":  # torch's own DLPack error, on both paths
        assert f"'{arg}'" in got[1], got
    for name in ("k_cache", "v_cache"):
        value = args[name]
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype == bf16:
            assert not value.any(), f"{name} was written"


# -- indexing ---------------------------------------------------------------------------------


def indexing_matches_reference(weight, ids, out=None, vocab_range=None) -> bool:
    start, length = vocab_range if vocab_range is not None else (0, weight.shape[0])
    want = torch.empty(ids.shape[0], weight.shape[1], dtype=weight.dtype)
    reference.indexing(want, weight, ids, start, length)
    got = ops.indexing(weight, ids, out=out, vocab_range=vocab_range)
    return (out is None or got is out) and same_bytes(got, want)


def test_indexing_hits_with_and_without_out_and_a_vocab_range(fresh, monkeypatch):
    picked = count_picks(monkeypatch, embedding, "_indexing_fn")
    gen = torch.Generator().manual_seed(6)
    for dtype, hidden in [(fp16, 64), (fp32, 24), (fp16, 40)]:
        weight = rand_rows((30, hidden), dtype, gen)
        ids = torch.tensor([0, 29, 30, -1, 7, 100])
        assert indexing_matches_reference(weight, ids)
        assert indexing_matches_reference(weight, ids.int(), out=torch.empty(6, hidden, dtype=dtype))
        assert indexing_matches_reference(weight, ids, vocab_range=(5, 20))
        padded = rand_rows((30, hidden + 8), dtype, gen)[:, :hidden]  # strided rows: the same key
        assert indexing_matches_reference(padded, ids)
        assert indexing_matches_reference(weight, ids[:0])
        big = rand_rows((300, hidden), dtype, gen)  # another vocabulary size: the same key
        assert indexing_matches_reference(big, ids, out=torch.empty(6, hidden, dtype=dtype), vocab_range=[100, 200])
    assert picked == [fp16, fp32, fp16]
    assert embedding._dispatch.call(torch.empty(0, 64, dtype=fp16), torch.zeros(5, 64, dtype=fp16),
                                    torch.zeros(0, dtype=torch.int64), 0, 5)


V, H = 30, 64


def _indexing_base() -> dict:
    return {"weight": torch.ones(V, H, dtype=fp16), "ids": torch.tensor([1, 2, 3]),
            "out": torch.full((3, H), 7.0, dtype=fp16), "vocab_range": None}


# (argument, what is wrong, the arguments that replace those of _indexing_base()).
INDEXING_BAD = [
    ("ids", "dtype", lambda: {"ids": torch.tensor([1.0, 2.0, 3.0])}),
    ("ids", "rank", lambda: {"ids": torch.zeros(3, 1, dtype=torch.int64)}),
    ("ids", "rank-allocating", lambda: {"ids": torch.zeros(3, 1, dtype=torch.int64), "out": None}),
    ("ids", "scalar-allocating", lambda: {"ids": torch.tensor(1), "out": None}),
    ("ids", "none", lambda: {"ids": None}),
    ("ids", "strided", lambda: {"ids": torch.arange(6)[::2]}),
    ("out", "rows", lambda: {"out": torch.zeros(4, H, dtype=fp16)}),
    ("out", "dtype", lambda: {"out": torch.zeros(3, H)}),
    ("out", "int", lambda: {"out": 3}),
    ("vocab_range", "three", lambda: {"vocab_range": (1, 2, 3)}),
    ("vocab_range", "str", lambda: {"vocab_range": ("a", 3)}),
    ("vocab_range", "too-long", lambda: {"vocab_range": (0, V + 1)}),
    # weight keeps its key (so the call hits) and is bad in a way only the launcher sees.
    ("weight", "strided-elements", lambda: {"weight": torch.ones(V, 2 * H, dtype=fp16)[:, ::2]}),
    ("weight", "meta", lambda: {"weight": torch.empty(V, H, dtype=fp16, device="meta")}),
    # weight of another key, or not a tensor: the Python path's own checks, which come first.
    ("weight", "complex64", lambda: {"weight": torch.ones(V, H, dtype=torch.complex64)}),
    ("weight", "3-d", lambda: {"weight": torch.ones(V, 2, H, dtype=fp16)}),
    ("weight", "1-d", lambda: {"weight": torch.ones(V, dtype=fp16)}),
    ("weight", "scalar", lambda: {"weight": torch.ones((), dtype=fp16), "vocab_range": (0, 1)}),
    ("weight", "none", lambda: {"weight": None}),
    ("weight", "1-d-and-bad-vocab_range", lambda: {"weight": torch.ones(V, dtype=fp16), "vocab_range": (1, 2, 3)}),
]


@pytest.mark.parametrize("arg,what,bad", INDEXING_BAD, ids=[f"{a}-{w}" for a, w, _ in INDEXING_BAD])
def test_indexing_bad_arguments_after_a_hit_raise_what_the_python_path_raises(monkeypatch, arg, what, bad):
    use_dispatch(monkeypatch, available=False)
    want = _outcome(embedding.indexing, {**_indexing_base(), **bad()})
    use_dispatch(monkeypatch, available=True)
    gen = torch.Generator().manual_seed(7)
    assert indexing_matches_reference(rand_rows((V, H), fp16, gen), torch.tensor([3, 1]))  # registers the key
    assert embedding._dispatch.call(torch.empty(0, H, dtype=fp16), torch.ones(V, H, dtype=fp16),
                                    torch.zeros(0, dtype=torch.int64), 0, V)
    args = {**_indexing_base(), **bad()}
    got = _outcome(embedding.indexing, args)
    assert got == want
    assert f"'{arg}'" in got[1], got
    out = args["out"]
    if isinstance(out, torch.Tensor) and out.shape == (3, H) and out.dtype == fp16:
        assert torch.equal(out, torch.full((3, H), 7.0, dtype=fp16)), "out was written"


# -- threads and the unavailable dispatcher ---------------------------------------------------


def test_threads_calling_concurrently_get_correct_results(fresh):
    """Eight threads start at once on fresh tables (racing on the load, the misses and the adds),
    then keep calling; every result matches the reference."""
    start = threading.Barrier(8)

    def work(i: int) -> bool:
        gen = torch.Generator().manual_seed(100 + i)
        dtype, row = STORE_CASES[i % len(STORE_CASES)]
        hidden = [64, 24][i % 2]
        weight = rand_rows((40, hidden), dtype, gen)
        start.wait()
        ok = True
        for _ in range(40):
            ok &= store_matches_reference(*store_args(dtype, row, 5, gen))
            ok &= indexing_matches_reference(weight, torch.randint(-3, 45, (9,), generator=gen))
        return ok

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(work, range(8)))
    for dtype, row in STORE_CASES:
        assert kvcache._dispatch.call(*empty_store_args(dtype, row))


def test_the_ops_work_when_no_dispatcher_is_available(monkeypatch):
    use_dispatch(monkeypatch, available=False)
    gen = torch.Generator().manual_seed(8)
    for _ in range(2):
        for dtype, row in STORE_CASES[:2]:
            assert store_matches_reference(*store_args(dtype, row, 6, gen))
        assert indexing_matches_reference(rand_rows((30, 64), fp16, gen), torch.tensor([0, 40, 5]))
    assert kvcache._dispatch.call is dispatch._miss and embedding._dispatch.call is dispatch._miss
