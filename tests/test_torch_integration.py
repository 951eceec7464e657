"""kernkit's ops inside PyTorch on the CPU: the torch.library custom ops (torch.ops.kernkit.*),
torch.compile(fullgraph=True) of a module that calls them against eager, torch.library.opcheck
of every op, the reference fallback when no kernel can be built and strict mode, and the refusal
to compile while a CUDA graph is being captured."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from kernkit import ops
from kernkit.jit import CaptureCompileError, CompileError, JitDisabledError, ToolchainError, core
from kernkit.ops import elementwise, embedding, fallback, kvcache, radix, reference
from rowdata import rand_rows, same_bytes


@pytest.fixture(scope="module")
def emulated():
    """These tests exercise the kernels (CPU emulator); the fallback tests need it resolved
    before they turn compilation off."""
    if fallback.cpu_backend() != "cpu":
        pytest.skip("the CPU emulation backend does not build here (CPU ops use the torch reference)")


class DecodeStep(torch.nn.Module):
    """A decode-like step: embed the new tokens, scale them into K and V, store them in the KV
    pool, and read rows of the pool back."""

    def __init__(self, vocab=50, heads=4, head_dim=64, pool=24, dtype=torch.bfloat16):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.heads, self.head_dim = heads, head_dim
        self.register_buffer("emb", torch.randn(vocab, heads * head_dim, generator=gen).to(dtype))
        self.register_buffer("kc", torch.zeros(pool, heads, head_dim, dtype=dtype))
        self.register_buffer("vc", torch.zeros(pool, heads, head_dim, dtype=dtype))

    def forward(self, ids, slots, read):
        h = ops.indexing(self.emb, ids)
        k = ops.scale(h, 0.5).view(-1, self.heads, self.head_dim)
        v = h.view(-1, self.heads, self.head_dim)
        ops.store_cache(self.kc, self.vc, slots, k, v)
        pool = self.kc.shape[0]
        return ops.indexing(self.kc.view(pool, -1), read), ops.indexing(self.vc.view(pool, -1), read, vocab_range=(4, 16))


def decode_inputs(step):
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(-3, 53, (5,), generator=gen)  # some ids outside the table: zero rows
    slots = torch.randperm(24, generator=gen)[:5]
    slots[0] = -1  # skipped
    read = torch.randint(0, 24, (7,), generator=gen).to(torch.int32)
    return ids, slots, read


def test_compiled_module_matches_eager(emulated):
    """torch.compile(fullgraph=True) with the default backend (inductor): same outputs and the
    same KV pool, bit for bit, over several steps."""
    eager, compiled_mod = DecodeStep(), DecodeStep()
    compiled = torch.compile(compiled_mod, fullgraph=True)
    for step in range(3):
        args = decode_inputs(step)
        want = eager(*args)
        got = compiled(*args)
        for g, w in zip(got, want):
            assert same_bytes(g, w), step
        assert same_bytes(compiled_mod.kc, eager.kc) and same_bytes(compiled_mod.vc, eager.vc), step
    assert eager.kc.abs().sum() > 0  # something was stored


def graph_of(fn, *args):
    """Compile ``fn`` with fullgraph=True and a backend that records the FX graphs it gets."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    out = torch.compile(fn, fullgraph=True, backend=backend)(*args)
    return out, graphs


def calls_in(gm):
    """The ops an FX graph calls, overloads given as their packet (torch.ops.kernkit.x)."""
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    return [t.overloadpacket if isinstance(t, torch._ops.OpOverload) else t for t in targets]


def test_traced_calls_become_the_custom_ops(emulated):
    """The public functions route to torch.ops.kernkit.* under Dynamo (one node each, no graph
    break), out= variants included, and the traced graph computes what eager does."""
    gen = torch.Generator().manual_seed(3)
    weight = rand_rows((30, 256), torch.float16, gen)
    ids = torch.tensor([0, 29, 30, -1, 7], dtype=torch.int64)
    kv = rand_rows((16, 2, 256), torch.float16, gen)  # K and V caches interleaved: strided rows
    qkv = rand_rows((5, 3, 256), torch.float16, gen)  # fused QKV: k and v rows strided
    slots = torch.tensor([3, 15, 16, 0, 9], dtype=torch.int32)

    def fn(weight, ids, kv, qkv, slots):
        out = torch.empty(5, 256, dtype=torch.float16)
        ops.indexing(weight, ids, out=out, vocab_range=(0, 30))
        scaled = torch.empty_like(out)
        ops.scale(out, 3.0, out=scaled)
        ops.store_cache(kv[:, 0], kv[:, 1], slots, qkv[:, 1], qkv[:, 2])
        return out, scaled

    kv_eager = kv.clone()
    want = fn(weight, ids, kv_eager, qkv, slots)
    got, graphs = graph_of(fn, weight, ids, kv, qkv, slots)
    assert len(graphs) == 1
    targets = calls_in(graphs[0])
    for op in (torch.ops.kernkit.indexing_out, torch.ops.kernkit.scale_out, torch.ops.kernkit.store_cache):
        assert op in targets, (op, targets)
    assert same_bytes(got[0], want[0]) and same_bytes(got[1], want[1]) and same_bytes(kv, kv_eager)


def test_compare_key_traces_as_a_data_dependent_int(emulated):
    def fn(a, b, tokens):
        n = ops.compare_key(a, b)
        return tokens[:n] * 2

    a = torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32)
    tokens = torch.arange(10)
    for b, n in ((torch.tensor([5, 6, 0], dtype=torch.int32), 2), (a.clone(), 5),
                 (torch.tensor([1], dtype=torch.int32), 0)):
        got, graphs = graph_of(fn, a, b, tokens)
        assert torch.equal(got, tokens[:n] * 2)
        assert torch.ops.kernkit.compare_key in calls_in(graphs[0])


def test_explain_reports_no_graph_break(emulated):
    module = DecodeStep()
    explanation = torch._dynamo.explain(module)(*decode_inputs(0))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


# --- torch.ops.kernkit.* in eager, and opcheck -----------------------------------------------


def finite_rows(shape, dtype, gen):
    """Finite values (opcheck compares outputs by value, and NaN is not equal to itself)."""
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype)


def store_samples():
    gen = torch.Generator().manual_seed(11)
    out = []
    # Row sizes shared with tests/test_store_cache.py, so that a full run builds each once.
    for dtype, row, n, index_dtype in ((torch.bfloat16, (4, 64), 5, torch.int64), (torch.float32, (16,), 7, torch.int32),
                                       (torch.float16, (3,), 1, torch.int64), (torch.int8, (128,), 0, torch.int32)):
        kc, vc = finite_rows((12, *row), dtype, gen), finite_rows((12, *row), dtype, gen)
        k, v = finite_rows((n, *row), dtype, gen), finite_rows((n, *row), dtype, gen)
        idx = torch.randperm(12, generator=gen)[:n].to(index_dtype)
        if n >= 3:
            idx[0], idx[1] = -1, 12  # skipped rows
        out.append((kc, vc, idx, k, v))
    qkv = finite_rows((4, 3, 256), torch.bfloat16, gen)  # strided K/V rows
    out.append((finite_rows((9, 256), torch.bfloat16, gen), finite_rows((9, 256), torch.bfloat16, gen),
                torch.tensor([8, 0, 4, 2]), qkv[:, 1], qkv[:, 2]))
    return out


def indexing_samples():
    gen = torch.Generator().manual_seed(12)
    out = []
    # Row sizes shared with tests/test_indexing.py.
    for dtype, rows, hidden, ids, vocab in ((torch.bfloat16, 20, 256, [0, 19, 20, -5, 3], None),
                                            (torch.float32, 10, 16, [4, 5, 6, 13], [4, 6]),
                                            (torch.float16, 7, 3, [], None)):
        out.append((finite_rows((rows, hidden), dtype, gen), torch.tensor(ids, dtype=torch.int32), vocab))
    return out


def scale_samples():
    gen = torch.Generator().manual_seed(13)
    return [(torch.randn(n, generator=gen).to(dtype), f) for dtype, n, f in
            ((torch.float16, 37, 1.5), (torch.bfloat16, 1, -2.0), (torch.float32, 1000, 0.25))] + \
           [(torch.randn(3, 5, generator=gen).half(), 0.0)]


def compare_key_samples():
    a = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    return [(a, torch.tensor([1, 2, 9], dtype=torch.int32)), (a, a.clone()),
            (a, torch.tensor([], dtype=torch.int32)), (torch.tensor([7], dtype=torch.int32), a)]


def test_opcheck_every_op(emulated):
    """torch.library.opcheck: schema (mutations declared), fake implementation, AOT dispatch with
    dynamic shapes, for several samples of every custom op."""
    checks = []
    checks += [(torch.ops.kernkit.store_cache.default, s) for s in store_samples()]
    for weight, ids, vocab in indexing_samples():
        checks.append((torch.ops.kernkit.indexing.default, (weight, ids, vocab)))
        out = torch.empty(ids.shape[0], weight.shape[1], dtype=weight.dtype)
        checks.append((torch.ops.kernkit.indexing_out.default, (out, weight, ids, vocab)))
    for x, f in scale_samples():
        checks.append((torch.ops.kernkit.scale.default, (x, f)))
        checks.append((torch.ops.kernkit.scale_out.default, (torch.empty_like(x), x, f)))
    checks += [(torch.ops.kernkit.compare_key.default, s) for s in compare_key_samples()]
    for op, args in checks:
        torch.library.opcheck(op, args)


def test_custom_ops_compute_what_the_plain_functions_do(emulated):
    for kc, vc, idx, k, v in store_samples():
        kc2, vc2 = kc.clone(), vc.clone()
        torch.ops.kernkit.store_cache(kc, vc, idx, k, v)
        reference.store_cache(kc2, vc2, idx, k, v)
        assert same_bytes(kc, kc2) and same_bytes(vc, vc2)
    for weight, ids, vocab in indexing_samples():
        want = torch.empty(ids.shape[0], weight.shape[1], dtype=weight.dtype)
        reference.indexing(want, weight, ids, *(vocab or (0, weight.shape[0])))
        assert same_bytes(torch.ops.kernkit.indexing(weight, ids, vocab), want)
        out = torch.full_like(want, 1)
        torch.ops.kernkit.indexing_out(out, weight, ids, vocab)
        assert same_bytes(out, want)
    for x, f in scale_samples():
        assert torch.equal(torch.ops.kernkit.scale(x, f), (x.float() * f).to(x.dtype))
    for a, b in compare_key_samples():
        assert torch.ops.kernkit.compare_key(a, b) == reference.compare_key(a, b) == ops.compare_key(a, b)


def test_custom_ops_declare_their_mutations():
    schemas = {name: str(getattr(torch.ops.kernkit, name).default._schema)
               for name in ("store_cache", "indexing", "indexing_out", "scale", "scale_out", "compare_key")}
    assert re.search(r"\(Tensor\(\w+!\) k_cache, Tensor\(\w+!\) v_cache, Tensor indices, Tensor k, Tensor v\) -> \(\)",
                     schemas["store_cache"]), schemas["store_cache"]
    assert re.search(r"\(Tensor\(\w+!\) out, Tensor weight", schemas["indexing_out"])
    assert re.search(r"\(Tensor\(\w+!\) out, Tensor src", schemas["scale_out"])
    assert "!" not in schemas["indexing"] + schemas["scale"] + schemas["compare_key"]
    assert schemas["compare_key"].endswith("-> SymInt")


# --- the reference fallback and strict mode ---------------------------------------------------


FACTORIES = (kvcache._store_fn, embedding._indexing_fn, elementwise._scale_module, radix._compare_key_fn)


@pytest.fixture
def cold_factories(emulated, fresh_cache, monkeypatch):
    """An empty cache, empty op factories (restored afterwards) and no fallback warned yet."""
    saved = [dict(f.cache) for f in FACTORIES]
    for f in FACTORIES:
        f.cache.clear()
    monkeypatch.setattr(fallback, "_warned", set())
    monkeypatch.delenv(fallback.STRICT_VAR, raising=False)
    yield
    for f, cache in zip(FACTORIES, saved):
        f.cache.clear()
        f.cache.update(cache)


def run_every_op(gen):
    """Each op once on fresh specializations (row sizes used nowhere else); checks results."""
    kc, vc = rand_rows((10, 2, 13), torch.float16, gen), rand_rows((10, 2, 13), torch.float16, gen)
    k, v = rand_rows((3, 2, 13), torch.float16, gen), rand_rows((3, 2, 13), torch.float16, gen)
    idx = torch.tensor([9, -1, 2])
    kc2, vc2 = kc.clone(), vc.clone()
    ops.store_cache(kc, vc, idx, k, v)
    reference.store_cache(kc2, vc2, idx, k, v)
    assert same_bytes(kc, kc2) and same_bytes(vc, vc2)
    weight = rand_rows((11, 19), torch.float16, gen)
    ids = torch.tensor([0, 10, 11, -2])
    want = torch.empty(4, 19, dtype=torch.float16)
    reference.indexing(want, weight, ids, 0, 11)
    assert same_bytes(ops.indexing(weight, ids), want)
    x = torch.randn(9, generator=gen).half()
    assert torch.equal(ops.scale(x, 1.25), (x.float() * 1.25).half())
    a = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert ops.compare_key(a, torch.tensor([1, 2, 4], dtype=torch.int32)) == 2


def fallback_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning) and "reference" in str(w.message)]


def test_jit_off_with_a_cold_cache_warns_once_per_op_and_uses_the_reference(cold_factories, monkeypatch):
    monkeypatch.setenv("KERNKIT_JIT", "off")
    gen = torch.Generator().manual_seed(21)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_every_op(gen)
        run_every_op(gen)  # same specializations: the factories are cached, nothing new
        # Another store_cache specialization: decided again, but not warned again.
        kc = torch.zeros(4, 7, dtype=torch.float32)
        ops.store_cache(kc, kc.clone(), torch.tensor([1]), torch.ones(1, 7), torch.ones(1, 7))
        assert torch.equal(kc[1], torch.ones(7))
    messages = fallback_warnings(record)
    assert sorted(m.split(":")[1].strip() for m in messages) == ["compare_key", "indexing", "scale", "store_cache"]
    assert all("KERNKIT_JIT=off" in m and "KERNKIT_STRICT=1" in m for m in messages)


def test_no_compiler_warns_and_uses_the_reference(cold_factories, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    gen = torch.Generator().manual_seed(22)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_every_op(gen)
    messages = fallback_warnings(record)
    assert len(messages) == 4 and all("no compiler" in m and "no-such-compiler" in m for m in messages)


@pytest.mark.parametrize("cause", ["jit-off", "no-compiler"])
def test_strict_mode_raises_instead(cold_factories, monkeypatch, tmp_path, cause):
    monkeypatch.setenv(fallback.STRICT_VAR, "1")
    if cause == "jit-off":
        monkeypatch.setenv("KERNKIT_JIT", "off")
        error = JitDisabledError
    else:
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
        error = ToolchainError
    kc = torch.zeros(6, 2, 13, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning on the way
        with pytest.raises(error):
            ops.store_cache(kc, kc.clone(), torch.tensor([0]), torch.ones(1, 2, 13).half(), torch.ones(1, 2, 13).half())
        with pytest.raises(error):
            ops.indexing(torch.ones(5, 19).half(), torch.tensor([1]))
        with pytest.raises(error):
            ops.scale(torch.ones(3).half(), 2.0)
        with pytest.raises(error):
            ops.compare_key(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    assert not kc.any()


def test_compile_errors_and_capture_errors_are_never_hidden():
    def broken():
        raise CompileError("k<1>", "kernel.cu", "nvcc ...", ["error: boom"], "")

    def capturing():
        raise CaptureCompileError("k<1> is not compiled")

    with pytest.raises(CompileError, match="boom"):
        fallback.kernel_or_reference("op", broken, None)
    with pytest.raises(CaptureCompileError):
        fallback.kernel_or_reference("op", capturing, None)


# --- no compiling while a CUDA graph is captured ----------------------------------------------


@pytest.fixture
def capturing(monkeypatch):
    """Make the JIT layer see a capturing CUDA stream (there is no GPU here; the GPU tests
    capture for real)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)


def test_cold_key_during_capture_raises_before_compiling(emulated, fresh_cache, monkeypatch, capturing):
    monkeypatch.setenv("KERNKIT_JIT", "off")  # the capture error comes first, and is not a fallback
    req = kvcache.store_request(2, 2 * 29, False, "cpu")
    with pytest.raises(CaptureCompileError, match=r"store_cache<2, 58, .*capturing a graph.*python -m kernkit.jit warmup"):
        req.load()
    kc = torch.zeros(5, 29, dtype=torch.float16)
    with pytest.raises(CaptureCompileError, match="Warm it up first"):
        ops.store_cache(kc, kc.clone(), torch.tensor([0]), torch.ones(1, 29).half(), torch.ones(1, 29).half())
    assert not any(fresh_cache.rglob("lib.so"))
    kvcache._store_fn.cache.pop((torch.float16, kc.shape, False), None)


def test_a_published_build_loads_during_capture(emulated, monkeypatch):
    req = kvcache.store_request(2, 512, False, "cpu")
    req.build()  # published on disk
    saved = dict(core._modules)
    core._modules.clear()  # and not loaded in memory
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        assert hasattr(req.load(), "store_cache")
    finally:
        core._modules.update(saved)


def test_a_table_that_requires_grad_traces_like_eager(emulated):
    """The kernels are not differentiable: eager outputs do not require grad, and a compiled
    model whose embedding is a trainable Parameter traces and gives the same (no failure on the
    missing backward)."""
    emb = torch.nn.Parameter(torch.randn(20, 256))
    ids = torch.tensor([1, 19, 20])

    def fn(ids):
        return ops.scale(ops.indexing(emb, ids), 2.0)

    want = fn(ids)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(ids)
    assert not want.requires_grad and not got.requires_grad
    assert torch.equal(got, want)
    torch.library.opcheck(torch.ops.kernkit.indexing.default, (emb, ids))
