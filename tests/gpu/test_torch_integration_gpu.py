"""kernkit's ops inside PyTorch on the GPU: torch.compile(fullgraph=True) of a decode-like module
against eager, CUDA-graph capture and replay of a decode step with inputs changed between
replays, ops on a side stream behind a long kernel, an op as a new thread's first CUDA call, and
the error for a cold specialization reached during capture. Run with ``pytest -m gpu`` on a GPU
machine."""

from __future__ import annotations

import threading

import pytest
import torch

from kernkit import ops
from kernkit.jit import CaptureCompileError
from kernkit.testing.ops import store_cache as store

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HEADS, HEAD_DIM, POOL, VOCAB = 8, 128, 4096, 32000  # 2 KB bf16 rows


def same_bytes(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


class DecodeStep(torch.nn.Module):
    """Embed the new tokens, scale them into K, store K and V in the pool, read rows back."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.register_buffer("emb", torch.randn(VOCAB, HEADS * HEAD_DIM, device="cuda", generator=gen).bfloat16())
        self.register_buffer("kc", torch.zeros(POOL, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
        self.register_buffer("vc", torch.zeros(POOL, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16))

    def forward(self, ids, slots, read):
        h = ops.indexing(self.emb, ids)
        k = ops.scale(h, 0.5).view(-1, HEADS, HEAD_DIM)
        ops.store_cache(self.kc, self.vc, slots, k, h.view(-1, HEADS, HEAD_DIM))
        return ops.indexing(self.kc.view(POOL, -1), read), ops.indexing(self.vc.view(POOL, -1), read)


def step_inputs(step, n=64, reads=96):
    gen = torch.Generator(device="cuda").manual_seed(100 + step)
    ids = torch.randint(-5, VOCAB + 5, (n,), device="cuda", generator=gen)
    slots = torch.randperm(POOL, device="cuda", generator=gen)[:n].to(torch.int32)
    slots[0] = -1  # skipped
    read = torch.randint(0, POOL, (reads,), device="cuda", generator=gen)
    read[: n // 2] = slots[: n // 2].long().clamp(min=0)  # read back some rows just written
    return ids, slots, read


def test_compiled_module_matches_eager():
    eager, compiled_mod = DecodeStep(), DecodeStep()
    compiled = torch.compile(compiled_mod, fullgraph=True)
    for step in range(3):
        args = step_inputs(step)
        want = eager(*args)
        got = compiled(*args)
        torch.cuda.synchronize()
        assert all(same_bytes(g, w) for g, w in zip(got, want, strict=True)), step
        assert same_bytes(compiled_mod.kc, eager.kc) and same_bytes(compiled_mod.vc, eager.vc), step


def test_cuda_graph_replay_with_new_inputs_is_bit_exact():
    """Capture store_cache + indexing once; copy new inputs into the static tensors before each
    replay; each replay equals the same step run eagerly on a twin module."""
    captured, eager = DecodeStep(), DecodeStep()
    static = [t.clone() for t in step_inputs(0)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: module loads happen here, not in the capture
        for _ in range(2):
            captured(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = captured(*static)
    captured.kc.zero_()  # undo the warm-up: both pools start from zeros
    captured.vc.zero_()
    for step in range(1, 6):
        args = step_inputs(step)
        for dst, src in zip(static, args, strict=True):
            dst.copy_(src)
        graph.replay()
        want = eager(*args)
        torch.cuda.synchronize()
        assert all(same_bytes(g, w) for g, w in zip(static_out, want, strict=True)), step
        assert same_bytes(captured.kc, eager.kc) and same_bytes(captured.vc, eager.vc), step


def test_ops_run_on_the_current_side_stream():
    """On a side stream: a long kernel, then a copy that produces the op's input, then the ops.
    They must launch on that stream (behind the copy); after the main stream waits for it, the
    results equal the reference."""
    kc = torch.zeros(POOL, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    n = 512
    k_new = torch.randn(n, HEADS, HEAD_DIM, device="cuda").bfloat16()
    v_new = torch.randn(n, HEADS, HEAD_DIM, device="cuda").bfloat16()
    slots = torch.randperm(POOL, device="cuda")[:n]
    k, v = torch.zeros_like(k_new), torch.zeros_like(v_new)
    a = torch.randn(8192, 8192, device="cuda")
    ops.store_cache(kc, vc, slots, k, v)  # warm: module loaded, nothing cold on the side stream
    ops.indexing(kc.view(POOL, -1), slots)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(4):
            a = a @ a / 8192  # tens of milliseconds of work ahead of the op on this stream
        k.copy_(k_new)
        v.copy_(v_new)
        ops.store_cache(kc, vc, slots, k, v)
        rows = ops.indexing(kc.view(POOL, -1), slots)
    torch.cuda.current_stream().wait_stream(side)
    rows.record_stream(torch.cuda.current_stream())
    kc_ref, vc_ref = torch.zeros_like(kc), torch.zeros_like(vc)
    store.ref_store_cache(kc_ref, vc_ref, slots, k_new, v_new)
    torch.cuda.synchronize()
    assert same_bytes(kc, kc_ref) and same_bytes(vc, vc_ref)
    assert same_bytes(rows, k_new.view(n, -1))


def test_an_op_as_the_first_cuda_call_of_a_new_thread():
    """A new thread has no current CUDA context until its first runtime call. The nvrtc backend
    launches through the driver, which needs one on the default stream; the launch then falls
    back to the runtime, which makes it current. Both calls in the thread give the main
    thread's bits."""
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    want = ops.rmsnorm(x, w)  # the module is loaded here: the thread only launches
    torch.cuda.synchronize()
    outs = [torch.zeros_like(x), torch.zeros_like(x)]
    errors = []

    def work():
        try:
            for out in outs:  # the first launch is the thread's first CUDA call, then a second
                ops.rmsnorm(x, w, out=out)
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert not errors, errors
    assert all(same_bytes(out, want) for out in outs)


def test_cold_specialization_during_capture_raises_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "cache"))
    row = 2 * 1000 + 6  # 2006-byte rows of fp16: a specialization built nowhere else
    kc = torch.zeros(64, row // 2, device="cuda", dtype=torch.float16)
    vc = torch.zeros_like(kc)
    k = torch.ones(4, row // 2, device="cuda", dtype=torch.float16)
    idx = torch.arange(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureCompileError, match=r"store_cache<2, 2006.*capturing a graph.*before capturing"):
        with torch.cuda.graph(graph):
            ops.store_cache(kc, vc, idx, k, k)
    assert not any((tmp_path / "cache").rglob("lib.so")), "a build ran inside the capture"
    torch.cuda.synchronize()
    # Outside a capture the same call compiles and runs.
    ops.store_cache(kc, vc, idx, k, k)
    torch.cuda.synchronize()
    assert torch.equal(kc[:4], k) and not kc[4:].any()


def test_published_build_loads_during_capture(tmp_path, monkeypatch):
    """Built on disk ahead of time (as `python -m kernkit.jit warmup` does) but never loaded in
    this process: the first call inside a capture loads it and the replay is right."""
    from kernkit.ops.store_cache import store_cache_spec

    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "cache"))
    row = 2 * 1000 + 10  # 2010-byte rows: not loaded anywhere else
    store_cache_spec(torch.float16, (row // 2,)).build()
    kc = torch.zeros(64, row // 2, device="cuda", dtype=torch.float16)
    vc = torch.zeros_like(kc)
    k = torch.randn(4, row // 2, device="cuda").half()
    idx = torch.tensor([5, 1, 63, 64], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.store_cache(kc, vc, idx, k, k)
    graph.replay()
    torch.cuda.synchronize()
    want = torch.zeros_like(kc)
    want[[5, 1, 63]] = k[:3]
    assert torch.equal(kc, want) and torch.equal(vc, want)
