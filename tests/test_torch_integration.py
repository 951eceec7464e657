"""kernkit's ops inside PyTorch on the CPU: the torch.library custom ops (torch.ops.kernkit.*),
torch.compile(fullgraph=True) and torch.export of a module that calls them against eager,
torch.library.opcheck of every op, the error (never a silent fallback) when no kernel can be
built, ``available``, and the refusal to compile while a CUDA graph is being captured."""

from __future__ import annotations

import contextlib
import re
import warnings

import pytest
import torch

from kernkit import ops
from kernkit.jit import CaptureCompileError, JitDisabledError, ToolchainError
from kernkit.ops.compare_key import _module as compare_key_module
from kernkit.ops.indexing import _module as indexing_module
from kernkit.ops.scale import _module as scale_module
from kernkit.ops.scale import scale_spec
from kernkit.ops.store_cache import _module as store_cache_module
from kernkit.ops.store_cache import store_cache_spec
from kernkit.testing.ops import compare_key as compare_key
from kernkit.testing.ops import indexing as indexing
from kernkit.testing.ops import store_cache as store
from kernkit.testing.oracle import rand_bits, same_bytes


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
        return (ops.indexing(self.kc.view(pool, -1), read),
                ops.indexing(self.vc.view(pool, -1), read, vocab_range=(4, 16)))


def decode_inputs(step):
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(-3, 53, (5,), generator=gen)  # some ids outside the table: zero rows
    slots = torch.randperm(24, generator=gen)[:5]
    slots[0] = -1  # skipped
    read = torch.randint(0, 24, (7,), generator=gen).to(torch.int32)
    return ids, slots, read


def test_compiled_module_matches_eager():
    """torch.compile(fullgraph=True) with the default backend (inductor): same outputs and the
    same KV pool, bit for bit, over several steps."""
    eager, compiled_mod = DecodeStep(), DecodeStep()
    compiled = torch.compile(compiled_mod, fullgraph=True)
    for step in range(3):
        args = decode_inputs(step)
        want = eager(*args)
        got = compiled(*args)
        for g, w in zip(got, want, strict=True):
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


def test_traced_calls_become_the_custom_ops():
    """The public functions route to torch.ops.kernkit.* under Dynamo (one node each, no graph
    break), out= variants included, and the traced graph computes what eager does."""
    gen = torch.Generator().manual_seed(3)
    weight = rand_bits((30, 256), torch.float16, gen)
    ids = torch.tensor([0, 29, 30, -1, 7], dtype=torch.int64)
    kv = rand_bits((16, 2, 256), torch.float16, gen)  # K and V caches interleaved: strided rows
    qkv = rand_bits((5, 3, 256), torch.float16, gen)  # fused QKV: k and v rows strided
    slots = torch.tensor([3, 15, 16, 0, 9], dtype=torch.int32)

    def fn(weight, ids, kv, qkv, slots):
        out = torch.empty(5, 256, dtype=torch.float16)
        ops.indexing(weight, ids, vocab_range=(0, 30), out=out)
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


def test_compare_key_traces_as_a_data_dependent_int():
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


def test_explain_reports_no_graph_break():
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
    for dtype, row, n, index_dtype in ((torch.bfloat16, (4, 64), 5, torch.int64),
                                       (torch.float32, (16,), 7, torch.int32),
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


def test_opcheck_every_op():
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


def test_custom_ops_compute_what_the_plain_functions_do():
    for kc, vc, idx, k, v in store_samples():
        kc2, vc2 = kc.clone(), vc.clone()
        torch.ops.kernkit.store_cache(kc, vc, idx, k, v)
        store.ref_store_cache(kc2, vc2, idx, k, v)
        assert same_bytes(kc, kc2) and same_bytes(vc, vc2)
    for weight, ids, vocab in indexing_samples():
        want = torch.empty(ids.shape[0], weight.shape[1], dtype=weight.dtype)
        indexing.ref_indexing(want, weight, ids, *(vocab or (0, weight.shape[0])))
        assert same_bytes(torch.ops.kernkit.indexing(weight, ids, vocab), want)
        out = torch.full_like(want, 1)
        torch.ops.kernkit.indexing_out(out, weight, ids, vocab)
        assert same_bytes(out, want)
    for x, f in scale_samples():
        assert torch.equal(torch.ops.kernkit.scale(x, f), (x.float() * f).to(x.dtype))
    for a, b in compare_key_samples():
        assert torch.ops.kernkit.compare_key(a, b) == compare_key.ref_compare_key(a, b) == ops.compare_key(a, b)


def test_custom_ops_declare_their_mutations():
    schemas = {name: str(getattr(torch.ops.kernkit, name).default._schema)
               for name in ("store_cache", "indexing", "indexing_out", "scale", "scale_out", "compare_key")}
    assert re.search(r"\(Tensor\(\w+!\) k_cache, Tensor\(\w+!\) v_cache, Tensor indices, Tensor k, Tensor v\) -> \(\)",
                     schemas["store_cache"]), schemas["store_cache"]
    assert re.search(r"\(Tensor\(\w+!\) out, Tensor weight", schemas["indexing_out"])
    assert re.search(r"\(Tensor\(\w+!\) out, Tensor src", schemas["scale_out"])
    assert "!" not in schemas["indexing"] + schemas["scale"] + schemas["compare_key"]
    assert schemas["compare_key"].endswith("-> SymInt")


def test_torch_export_non_strict_routes_to_the_custom_ops():
    """torch.export's default (non-strict) mode traces the plain functions with fake tensors:
    they must become the custom ops, and the exported program computes what eager does."""
    module, args = DecodeStep(), decode_inputs(1)
    eager_mod = DecodeStep()
    want = eager_mod(*args)
    exported = torch.export.export(module, args)
    targets = {n.target for n in exported.graph.nodes if n.op == "call_function"}
    assert {t.name() for t in targets if isinstance(t, torch._ops.OpOverload) and t.namespace == "kernkit"} >= {
        "kernkit::indexing", "kernkit::scale", "kernkit::store_cache"}, targets
    got = exported.module()(*args)
    for g, w in zip(got, want, strict=True):
        assert same_bytes(g, w)


def _overwrite(via: str, what: str, target: torch.Tensor) -> None:
    """Write 100 into every element of the [4, 8] float32 ``target`` through one op."""
    full = torch.full((4, 8), 100.0)
    if what == "store_cache":
        args = (target, torch.zeros(4, 8), torch.arange(4), full, full)
        (torch.ops.kernkit.store_cache if via == "custom op" else ops.store_cache)(*args)
    elif what == "indexing":
        if via == "custom op":
            torch.ops.kernkit.indexing_out(target, full, torch.arange(4), None)
        else:
            ops.indexing(full, torch.arange(4), out=target)
    elif via == "custom op":
        torch.ops.kernkit.scale_out(target, full, 1.0)
    else:
        ops.scale(full, 1.0, out=target)


@pytest.mark.parametrize("via", ["op", "custom op"])
@pytest.mark.parametrize("what", ["store_cache", "indexing", "scale"])
def test_in_place_writes_bump_version_counters(via, what):
    """As torch's in-place ops do: autograd refuses a saved tensor an op overwrote (the gradient
    would be 100 where it is 3), in both the plain and the torch.ops form."""
    weight = torch.ones(4, 8, requires_grad=True)
    saved = torch.full((4, 8), 3.0)
    loss = (weight * saved).sum()  # saves `saved` for backward
    version = saved._version
    _overwrite(via, what, saved)
    assert saved._version > version and torch.equal(saved, torch.full((4, 8), 100.0))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("via", ["op", "custom op"])
@pytest.mark.parametrize("what", ["store_cache", "indexing", "scale"])
def test_writes_torch_refuses_are_refused(via, what):
    """A tensor that requires grad (under grad mode) and an inference tensor outside
    inference mode are refused, as torch refuses them for its in-place ops, and not written;
    under torch.no_grad() and inside inference mode they are written."""
    leaf = torch.zeros(4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^'(k_cache|out)': requires grad, and kernkit ops are not differentiable"):
        _overwrite(via, what, leaf)
    with pytest.raises(RuntimeError, match=r"^'(k_cache|out)': requires grad"):
        _overwrite(via, what, leaf * 1.0)
    assert not leaf.any()
    with torch.no_grad():
        _overwrite(via, what, leaf)
    assert torch.equal(leaf.detach(), torch.full((4, 8), 100.0))
    with torch.inference_mode():
        frozen = torch.zeros(4, 8)
    with pytest.raises(RuntimeError, match=r"^'(k_cache|out)': is an inference tensor"):
        _overwrite(via, what, frozen)
    assert not frozen.any()
    with torch.inference_mode():
        _overwrite(via, what, frozen)
    assert torch.equal(frozen, torch.full((4, 8), 100.0))


def test_the_refusal_path_runs_only_where_it_refuses_or_warns(monkeypatch):
    """The per-call test sends a call to the slow path (``_refuse``, which raises or warns) only
    where it would raise or warn: a server's calls under inference mode (inference tensors) and
    under no_grad (a weight that requires grad, written or read) stay on the fast path, and
    the op still writes."""
    calls = []
    slow = ops.scale.__globals__["refuse"]  # the generated wrapper's own scope
    monkeypatch.setitem(ops.scale.__globals__, "refuse", lambda *a, **k: calls.append(1) or slow(*a, **k))
    with torch.inference_mode():
        src, out = torch.ones(4, 8), torch.zeros(4, 8)
        ops.scale(src, 2.0, out=out)
    assert calls == [] and torch.equal(out, torch.full((4, 8), 2.0))
    leaf, param = torch.zeros(4, 8, requires_grad=True), torch.ones(4, 8, requires_grad=True)
    with torch.no_grad():
        ops.scale(param, 3.0, out=leaf)
    assert calls == [] and torch.equal(leaf.detach(), torch.full((4, 8), 3.0))
    with pytest.raises(RuntimeError, match=r"^'out': is an inference tensor"):
        ops.scale(torch.ones(4, 8), 2.0, out=out)
    assert calls == [1] and torch.equal(out, torch.full((4, 8), 2.0))


def test_negative_bit_is_refused_by_the_op_and_resolved_by_torch_ops():
    """torch's lazy negation (z.conj().imag) is not in DLPack: the plain op refuses it, naming
    the argument, and writes nothing, in grad mode and inside inference mode (where the per-call
    test reads the negative bit alone); through torch.ops torch's own fallback resolves an input
    with it before the kernel runs, so the result is right."""
    z = torch.randn(4, 8, dtype=torch.complex64)
    neg = z.conj().imag
    assert neg.is_neg()
    for mode in (contextlib.nullcontext, torch.inference_mode):
        with mode():
            with pytest.raises(ValueError, match=r"^'src': has torch's negative bit set"):
                ops.scale(neg, 2.0)
            out = torch.zeros(4, 8)
            with pytest.raises(ValueError, match=r"^'out': has torch's negative bit set"):
                ops.scale(torch.ones(4, 8), 2.0, out=torch._neg_view(out))
            assert not out.any()
    assert torch.equal(torch.ops.kernkit.scale(neg, 2.0), -2.0 * z.imag)
    assert torch.equal(ops.scale(neg.resolve_neg(), 2.0), -2.0 * z.imag)


def test_conjugate_bit_only_exists_on_complex_tensors_which_no_kernel_takes():
    z = torch.randn(4, 8, dtype=torch.complex64).conj()
    assert z.is_conj()
    with pytest.raises(TypeError, match=r"'src': unsupported dtype"):
        ops.scale(z, 2.0)
    with pytest.raises(TypeError, match=r"'k_cache': dtype complex64 is not supported"):
        ops.store_cache(z, z, torch.arange(4), z, z)


# --- fork: the emulator's host threads do not survive into a child -------------------------

FORK_SCRIPT = r"""
import os, sys, torch
from kernkit import ops

x = torch.ones(100_000)
assert torch.equal(ops.scale(x, 2.0), x * 2)  # big enough to run on the emulator's thread pool
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(1)  # torch's own OpenMP pool is not fork-safe (DataLoader does this too)
        os._exit(0 if torch.equal(ops.scale(x, 3.0), x * 3) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
else:
    class Scaled(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return ops.scale(torch.full((50_000,), float(i)), 2.0)

    loader = torch.utils.data.DataLoader(Scaled(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    got = torch.cat([b.flatten() for b in loader])
    assert torch.equal(got, torch.arange(8.0).repeat_interleave(50_000) * 2)
print("ok")
"""


@pytest.mark.parametrize("how", ["fork", "dataloader"])
def test_ops_work_in_forked_children(how):
    """After the parent ran an op on the emulator's host-thread pool, a fork()ed child (and a
    DataLoader worker) runs ops too; before, the child waited forever for the parent's threads."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", FORK_SCRIPT, how], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr


# --- no kernel here: an error that says what to do, never a silent fallback ------------------


FACTORIES = (store_cache_module, indexing_module, scale_module, compare_key_module)


@pytest.fixture
def cold(fresh_cache):
    """An empty cache and empty op factories (restored afterwards)."""
    saved = [dict(f.cache) for f in FACTORIES]
    for f in FACTORIES:
        f.cache.clear()
    yield fresh_cache
    for f, cache in zip(FACTORIES, saved, strict=True):
        f.cache.clear()
        f.cache.update(cache)


def every_op_fails(error, *needles):
    kc = torch.zeros(6, 2, 13, dtype=torch.float16)
    calls = [lambda: ops.store_cache(kc, kc.clone(), torch.tensor([0]), torch.ones(1, 2, 13).half(),
                                     torch.ones(1, 2, 13).half()),
             lambda: ops.indexing(torch.ones(5, 19).half(), torch.tensor([1])),
             lambda: ops.scale(torch.ones(3).half(), 2.0),
             lambda: ops.compare_key(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))]
    titles = ("store_cache<2, 52,", "indexing<2, 38,", "scale<fp16_t, false>", "compare_key")
    for call, title in zip(calls, titles, strict=True):
        with pytest.raises(error) as info:
            call()
        assert title in str(info.value) and all(n in str(info.value) for n in needles), str(info.value)
    assert not kc.any()


def test_jit_off_with_a_cold_cache_names_the_specialization(cold, monkeypatch):
    monkeypatch.setenv("KERNKIT_JIT", "off")
    every_op_fails(JitDisabledError, "KERNKIT_JIT=off", "python -m kernkit.jit warmup")


def test_no_compiler_names_the_specialization_and_what_to_do(cold, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    every_op_fails(ToolchainError, "no-such-compiler", "install one or set CXX", "warmup")


def test_available_says_whether_an_op_can_run_here(cold, monkeypatch, caplog):
    shape = dict(dtypes=[torch.float16], num_heads=2, head_dim=21, backend="emu")
    monkeypatch.setenv("KERNKIT_JIT", "off")
    assert not ops.available("store_cache", **shape)
    assert "store_cache is not available here" in caplog.text and "KERNKIT_JIT=off" in caplog.text
    monkeypatch.delenv("KERNKIT_JIT")
    assert ops.available("store_cache", **shape) and ops.available("kernkit::compare_key")
    with pytest.raises(ValueError, match="not a registered op"):
        ops.available("no_such_op")


def _register_user_op(qualname: str) -> None:
    """A user's op outside kernkit's namespace whose build is scale's fp32 kernel."""
    def user_op(x: torch.Tensor) -> torch.Tensor:
        return ops.scale(x, 1.0)

    ops.register_op(qualname, fake=lambda x: torch.empty_like(x),
                    specializations=lambda backend=None: [scale_spec(torch.float32, backend)])(user_op)


def test_available_on_cpu_means_the_emulator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # whatever this machine has
    assert ops.available("scale", "cpu", dtypes=[torch.bfloat16])
    assert ops.available("scale", torch.device("cpu"), dtypes=[torch.bfloat16], backend="emu")
    # No device named and no GPU visible: the tensors can only be CPU tensors.
    assert ops.available("scale", dtypes=[torch.bfloat16])
    with pytest.raises(ValueError, match=r"^'backend': 'nvcc' does not build for cpu tensors"):
        ops.available("scale", "cpu", dtypes=[torch.bfloat16], backend="nvcc")
    with pytest.raises(ValueError, match=r"^'backend': 'emu' does not build for cuda tensors"):
        ops.available("scale", "cuda", dtypes=[torch.bfloat16], backend="emu")
    with pytest.raises(ValueError, match=r"^'device': expected cuda or cpu, got 'meta'"):
        ops.available("scale", "meta", dtypes=[torch.bfloat16])


def test_available_reads_a_bare_name_as_warmup_does():
    _register_user_op("avail_test::add_residual_scale")
    assert ops.available("add_residual_scale", "cpu")
    assert ops.available("avail_test::add_residual_scale", "cpu")
    _register_user_op("avail_test2::add_residual_scale")
    with pytest.raises(ValueError, match=r"^'add_residual_scale' names several ops: avail_test::add_residual_scale, "
                                         r"avail_test2::add_residual_scale"):
        ops.available("add_residual_scale", "cpu")
    _register_user_op("avail_test::scale")
    assert ops.available("scale", "cpu", dtypes=[torch.float32])  # kernkit's own, which takes dtypes


# --- no compiling while a CUDA graph is captured ----------------------------------------------


@pytest.fixture
def capturing(monkeypatch):
    """Make the JIT layer see a capturing CUDA stream (there is no GPU here; the GPU tests
    capture for real)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)


def test_cold_key_during_capture_raises_before_compiling(cold, monkeypatch, capturing):
    monkeypatch.setenv("KERNKIT_JIT", "off")  # the capture error comes first
    spec = store_cache_spec(torch.float16, (29,), "emu")
    with pytest.raises(CaptureCompileError,
                       match=r"store_cache<2, 58, .*capturing a graph.*python -m kernkit.jit warmup"):
        spec.build_and_load()
    kc = torch.zeros(5, 29, dtype=torch.float16)
    with pytest.raises(CaptureCompileError, match="before capturing"):
        ops.store_cache(kc, kc.clone(), torch.tensor([0]), torch.ones(1, 29).half(), torch.ones(1, 29).half())
    assert not any(cold.rglob("lib.so"))


def test_a_published_build_loads_during_capture(monkeypatch):
    spec = store_cache_spec(torch.float16, (256,), "emu")
    spec.build()  # published on disk, not loaded
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert hasattr(spec.build_and_load(), "store_cache")


def test_a_table_that_requires_grad_traces_like_eager():
    """The kernels are not differentiable: eager outputs do not require grad, and a compiled
    model whose embedding is a trainable Parameter traces and gives the same (no failure on the
    missing backward)."""
    emb = torch.nn.Parameter(torch.randn(20, 256))
    ids = torch.tensor([1, 19, 20])

    def fn(ids):
        return ops.scale(ops.indexing(emb, ids), 2.0)

    with pytest.warns(UserWarning, match=r"indexing: 'weight' requires grad"):
        want = fn(ids)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(ids)
    assert not want.requires_grad and not got.requires_grad
    assert torch.equal(got, want)
    torch.library.opcheck(torch.ops.kernkit.indexing.default, (emb, ids))


@pytest.mark.parametrize("returns", ["tuple[torch.Tensor, torch.Tensor, torch.Tensor]", "tuple[torch.Tensor, ...]"])
def test_an_op_with_out_returning_more_than_out_and_one_other_is_refused(returns):
    namespace = {}
    exec(f"""
from typing import Optional
import torch

def op(x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> {returns}:
    return x, x, x
""", namespace)
    with pytest.raises(TypeError, match=r"^register_op: kernkit_test::three returns .*; with out=, an op returns out"):
        ops.register_op("kernkit_test::three", fake=lambda x: (x, x, x))(namespace["op"])
    assert "kernkit_test::three" not in {op.qualname for op in ops.registered_ops()}


def test_an_input_that_requires_grad_is_warned_about_once_per_op_and_argument():
    """The result of a kernkit op never requires grad: an input that does, under grad mode, gets
    one warning naming the op and the argument; under no_grad (a Parameter in serving code) none."""
    x = torch.randn(4, 64, requires_grad=True)
    with pytest.warns(UserWarning, match=r"^kernkit.ops.scale: 'src' requires grad, but kernkit ops are not "
                                         r"differentiable") as seen:
        for _ in range(3):
            y = ops.scale(x, 2.0)
    assert len([w for w in seen if "requires grad" in str(w.message)]) == 1
    assert not y.requires_grad and torch.equal(y, x.detach() * 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            ops.scale(torch.randn(4, 64, requires_grad=True), 2.0)
        ops.scale(x.detach(), 2.0)


def test_small_errors_name_the_argument():
    """A 0-d cache is called 0-d, a complex dtype by its name, an int beyond int64 and a
    read-only numpy array (whose DLPack export raises ``BufferError``) by the argument."""
    import numpy as np

    bf = torch.bfloat16
    k = torch.zeros(2, 32, dtype=bf)
    with pytest.raises(ValueError, match=r"^'k_cache': expected a 2-d \[rows, elems\] or 3-d .* got 0-d$"):
        ops.store_cache(torch.zeros((), dtype=bf), k, torch.tensor([0, 1]), k, k)
    with pytest.raises(TypeError, match=r"^'k': expected dtype bfloat16 \(from 'k_cache'\), got complex64$"):
        ops.store_cache(torch.zeros(4, 32, dtype=bf), torch.zeros(4, 32, dtype=bf), torch.tensor([0, 1]),
                        torch.zeros(2, 32, dtype=torch.complex64), k)
    with pytest.raises(TypeError,
                       match=r"^'vocab_range': expected a sequence of int64 values, got \(9223372036854775808, 1\)$"):
        ops.indexing(torch.zeros(4, 32, dtype=bf), torch.tensor([0]), (2**63, 1))
    frozen = np.zeros(4, dtype=np.float32)
    frozen.setflags(write=False)
    with pytest.raises(TypeError, match=r"^'src': expected a tensor, got ndarray$"):
        ops.scale(frozen, 2.0)
