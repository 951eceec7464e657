"""kernkit beside sglang's own JIT kernels (``sglang.jit_kernel``) and torch.compile, over the
grids of sglang's ``bench_rmsnorm.py``, ``bench_rotary_embedding.py``, ``bench_qknorm.py`` and
``bench_per_token_group_quant_8bit.py``, plus the eager host cost per call of the ops both have.

    python benchmark/bench_sglang.py --out DIR [--only rmsnorm,rope,qknorm,ropestore,groupquant,host] [--no-compile]

- rmsnorm: in place (``out=x``, as sglang's benchmark calls it), bf16, hidden 1024-8192 (and
  1536, 16384) x 1 to 8192 tokens.
- rope: ``rotary_embedding`` against sglang's ``apply_rope_inplace``: bf16 q/k
  ``[tokens, heads, 128]``, (q, kv) heads (8, 1), (16, 2), (32, 8) and Qwen3-32B's (64, 8),
  neox and gpt-j, 1 to 32768 tokens, int64 positions drawn below 131072, an fp32 cos/sin cache
  of 131072 rows (as sglang's benchmark builds it).
- qknorm: ``qk_norm`` against sglang's ``fused_inplace_qknorm``: bf16 q ``[tokens, kv_heads *
  gqa, head_dim]`` and k ``[tokens, kv_heads, head_dim]``, head_dim 128 to 1024, gqa 4 and 8,
  kv_heads 1 to 8, 1 to 8192 tokens.
- ropestore: ``rotary_embedding_store`` against sglang's ``apply_rope_inplace_with_kvcache``,
  and each library's rope then store as two calls in one graph: bf16 q/k/v ``[tokens, heads,
  128]``, (q, kv) heads (8, 1), (16, 2), (32, 8), neox and gpt-j, 1 to 32768 tokens, caches of
  2**20 rows written at distinct random rows (sglang's ``bench_rotary_embedding.py`` store grid).
- groupquant: ``per_token_group_quant_fp8`` against sglang's ``per_token_group_quant_8bit``
  (sglang's scales allocated in the same layouts): bf16 x of 1 to 16384 tokens of hidden 1536,
  7168 and 16384, group size 128, row-major, column-major (TMA-aligned) and packed UE8M0 scales
  (the GEMM grid of sglang's benchmark), with the bytes moved and kernkit's % of the copy
  bandwidth.
- host: eager per-call cost in one process, the same work for both: rmsnorm (into ``out``, and
  in place, and into ``out`` under inference mode), fused_add_rmsnorm (and under inference
  mode), store_cache, rope, rope + store, qk_norm and group quant (kernkit allocates the scales
  it returns, sglang writes scales given to it), plus each library's
  bare module call for rmsnorm (the launcher without the Python layer).

Times are CUDA-graph medians per call with inputs rotated beyond the L2 (``common``). sglang's
jit_kernel is used when importable: from an installed sglang, or from a tree holding only
``sglang/jit_kernel`` (unpacked from the wheel) on ``PYTHONPATH``, for which the three small
sglang modules it imports are replaced by stand-ins that do what sglang's do with kernel-API
logging off (they return the function unchanged). torch.compile times the torch function of
each op at a subset of the shapes (it compiles once per shape). Measures and reports; asserts
nothing about speed.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import types
from pathlib import Path

import torch

import common

from kernkit import ops
from kernkit.ops.rmsnorm import _module as rmsnorm_module

EPS = 1e-6
NORM_HIDDENS = sorted([1536, *range(1024, 8192 + 1, 1024)]) + [16384]
NORM_TOKENS = [2**n for n in range(14)]
ROPE_HEADS = [(8, 1), (16, 2), (32, 8), (64, 8)]
ROPE_TOKENS = [2**n for n in range(16)]
ROPE_MAX_POS = 131072
ROPE_STORE_POOL = 1024 * 1024
QKNORM_HEAD_DIMS = [128, 256, 512, 1024]
GROUP_QUANT_TOKENS = [1, 4, 16, 64, 256, 768, 2048, 8192, 16384]
GROUP_QUANT_HIDDENS = [1536, 7168, 16384]
GROUP_QUANT_SIZE = 128
GROUP_QUANT_EPS = 1e-10
#: (column_major_scales, scale_ue8m0) of sglang's GEMM flag sets: row-major, column-major
#: TMA-aligned, and that with packed UE8M0 scales.
GROUP_QUANT_FLAGS = {"row-major": (False, False), "column-major": (True, False), "ue8m0": (True, True)}
QKNORM_GQA = [4, 8]
QKNORM_KV_HEADS = [1, 2, 4, 8]
QKNORM_TOKENS = [2**n for n in range(14)]
COMPILE_TOKENS = {1, 64, 1024, 8192, 16384}
_LIBRARIES: list = []


def load_sglang():
    """sglang's jit_kernel modules (norm, rope, kvcache, quant), or None when they cannot be imported."""
    try:
        import sglang.utils  # noqa: F401
    except ImportError:
        _stand_ins()
    try:
        from sglang.jit_kernel import kvcache, norm, rope
        from sglang.jit_kernel import per_token_group_quant_8bit as quant
    except ImportError as e:
        print(f"sglang's jit_kernel is not importable ({e}); timing kernkit and torch only", file=sys.stderr)
        return None
    return types.SimpleNamespace(norm=norm, rope=rope, kvcache=kvcache, quant=quant)


def _stand_ins() -> None:
    """What jit_kernel imports from the rest of sglang, as sglang behaves with its kernel-API
    logging off: ``is_in_ci`` False; ``register_custom_op`` defines ``torch.ops.sglang.<name>``
    with a CUDA kernel (``torch.library`` define and impl, as sglang's
    ``direct_register_custom_op``) and returns that op, which eager calls then go through;
    ``debug_kernel_api`` returns the function itself."""
    def module(name: str, **attrs) -> None:
        sys.modules.setdefault(name, types.ModuleType(name)).__dict__.update(attrs)

    lib = torch.library.Library("sglang", "FRAGMENT")
    _LIBRARIES.append(lib)  # an op lives as long as its library object

    def register_custom_op(fn=None, *, op_name=None, mutates_args=None, **kwargs):
        def register(f):
            name = op_name or f.__name__
            lib.define(name + torch.library.infer_schema(f, mutates_args=mutates_args or []))
            lib.impl(name, f, "CUDA")
            return getattr(torch.ops.sglang, name)

        return register(fn) if fn is not None else register

    def debug_kernel_api(func=None, **kwargs):
        return func if func is not None else (lambda f: f)

    module("sglang.utils", is_in_ci=lambda: False)
    module("sglang.srt")
    module("sglang.srt.utils")
    module("sglang.srt.utils.custom_op", register_custom_op=register_custom_op)
    module("sglang.kernel_api_logging", debug_kernel_api=debug_kernel_api)


def torch_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> None:
    xf = x.float()
    x.copy_(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float())


def torch_rope(positions, q, k, cache, is_neox: bool) -> None:
    half = cache.shape[1] // 2
    cos, sin = cache[positions, :half].unsqueeze(1), cache[positions, half:].unsqueeze(1)
    for t in (q, k):
        f = t.float()
        if is_neox:
            x, y = f[..., :half], f[..., half:]
            t.copy_(torch.cat([x * cos - y * sin, y * cos + x * sin], -1))
        else:
            x, y = f[..., 0::2], f[..., 1::2]
            t.copy_(torch.stack([x * cos - y * sin, y * cos + x * sin], -1).flatten(-2))


def bench_rmsnorm(sgl, compile_: bool) -> list[str]:
    rows, compiled = [], torch.compile(torch_rmsnorm, dynamic=False) if compile_ else None
    for hidden in NORM_HIDDENS:
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        for tokens in NORM_TOKENS:
            calls = common.calls_for(2 * tokens * hidden * 2, max_calls=400)
            xs = torch.randn(calls, tokens, hidden, device="cuda", dtype=torch.bfloat16)
            fns = {"kernkit": lambda c, xs=xs, w=w: ops.rmsnorm(xs[c], w, EPS, out=xs[c])}
            if sgl is not None:
                fns["sglang"] = lambda c, xs=xs, w=w: sgl.norm.rmsnorm(xs[c], w, xs[c], EPS)
            if compiled is not None and tokens in COMPILE_TOKENS and hidden in (4096, 5120):
                fns["torch.compile"] = lambda c, xs=xs, w=w: compiled(xs[c], w)
            us = {m: common.graph_time_us([lambda c=c, f=f: f(c) for c in range(calls)]) for m, f in fns.items()}
            rows.append([hidden, tokens, *(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")),
                         _ratio(us)])
            del xs, fns
    return ["## rmsnorm, bf16, in place (us per call)", "",
            *common.markdown_table(["hidden", "tokens", "kernkit", "sglang", "torch.compile", "kernkit / sglang"],
                                   rows), ""]


def torch_qknorm(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor) -> None:
    for x, w in ((q, wq), (k, wk)):
        xf = x.float()
        x.copy_(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float())


def bench_qknorm(sgl, compile_: bool) -> list[str]:
    rows, compiled = [], torch.compile(torch_qknorm, dynamic=False) if compile_ else None
    for head_dim in QKNORM_HEAD_DIMS:
        wq = torch.randn(head_dim, device="cuda", dtype=torch.bfloat16)
        wk = torch.randn(head_dim, device="cuda", dtype=torch.bfloat16)
        for gqa in QKNORM_GQA:
            for kv in QKNORM_KV_HEADS:
                for tokens in QKNORM_TOKENS:
                    calls = common.calls_for(2 * tokens * (gqa + 1) * kv * head_dim * 2, max_calls=400)
                    qs = torch.randn(calls, tokens, gqa * kv, head_dim, device="cuda", dtype=torch.bfloat16)
                    ks = torch.randn(calls, tokens, kv, head_dim, device="cuda", dtype=torch.bfloat16)
                    fns = {"kernkit": lambda c, qs=qs, ks=ks, wq=wq, wk=wk: ops.qk_norm(qs[c], ks[c], wq, wk, EPS)}
                    if sgl is not None:
                        fns["sglang"] = lambda c, qs=qs, ks=ks, wq=wq, wk=wk: sgl.norm.fused_inplace_qknorm(
                            qs[c], ks[c], wq, wk, EPS)
                    if compiled is not None and tokens in COMPILE_TOKENS and (gqa, kv) == (8, 8) and head_dim <= 256:
                        fns["torch.compile"] = lambda c, qs=qs, ks=ks, wq=wq, wk=wk: compiled(qs[c], ks[c], wq, wk)
                    us = {m: common.graph_time_us([lambda c=c, f=f: f(c) for c in range(calls)])
                          for m, f in fns.items()}
                    rows.append([head_dim, gqa, kv, tokens,
                                 *(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")),
                                 _ratio(us)])
                    del qs, ks, fns
    return ["## qk_norm, bf16, in place (us per call)", "",
            *common.markdown_table(["head_dim", "gqa", "kv heads", "tokens", "kernkit", "sglang", "torch.compile",
                                    "kernkit / sglang"], rows), ""]


def _ratio(us: dict) -> float:
    return us["kernkit"] / us["sglang"] if "sglang" in us else float("nan")


def rope_cache() -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32, device="cuda") / 128))
    ang = torch.arange(ROPE_MAX_POS, dtype=torch.float32, device="cuda")[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], -1)


def bench_rotary_embedding(sgl, compile_: bool) -> list[str]:
    cache, rows = rope_cache(), []
    compiled = torch.compile(torch_rope, dynamic=False) if compile_ else None
    for hq, hk in ROPE_HEADS:
        for is_neox in (True, False):
            for tokens in ROPE_TOKENS:
                per_call = 2 * tokens * (hq + hk) * 128 * 2 + tokens * (8 + 512)
                calls = common.calls_for(per_call, max_calls=400)
                qs = torch.randn(calls, tokens, hq, 128, device="cuda", dtype=torch.bfloat16)
                ks = torch.randn(calls, tokens, hk, 128, device="cuda", dtype=torch.bfloat16)
                ps = torch.randint(ROPE_MAX_POS, (calls, tokens), device="cuda", dtype=torch.int64)
                fns = {"kernkit": lambda c, ps=ps, qs=qs, ks=ks, is_neox=is_neox: ops.rotary_embedding(
                    ps[c], qs[c], ks[c], cache, is_neox)}
                if sgl is not None:
                    fns["sglang"] = lambda c, ps=ps, qs=qs, ks=ks, is_neox=is_neox: sgl.rope.apply_rope_inplace(
                        qs[c], ks[c], cache, ps[c], is_neox=is_neox)
                if compiled is not None and tokens in COMPILE_TOKENS and (hq, hk) == (32, 8) and is_neox:
                    fns["torch.compile"] = lambda c, ps=ps, qs=qs, ks=ks, is_neox=is_neox: compiled(
                        ps[c], qs[c], ks[c], cache, is_neox)
                us = {m: common.graph_time_us([lambda c=c, f=f: f(c) for c in range(calls)])
                      for m, f in fns.items()}
                rows.append([f"{hq},{hk}", "neox" if is_neox else "gpt-j", tokens,
                             *(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")),
                             _ratio(us)])
                del qs, ks, ps, fns
    return ["## rope, bf16 q/k [tokens, heads, 128], fp32 cache, int64 positions (us per call)", "",
            *common.markdown_table(["q,kv heads", "pairs", "tokens", "kernkit", "sglang", "torch.compile",
                                    "kernkit / sglang"], rows), ""]


def torch_rope_store(positions, q, k, v, cache, k_cache, v_cache, out_loc, is_neox: bool) -> None:
    torch_rope(positions, q, k, cache, is_neox)
    k_cache[out_loc] = k.flatten(1)
    v_cache[out_loc] = v.flatten(1)


def bench_rope_store(sgl, compile_: bool) -> list[str]:
    """``rotary_embedding_store`` against sglang's ``apply_rope_inplace_with_kvcache``, and each
    library's rope and store as two calls in one graph, over sglang's bench_rotary_embedding.py store grid:
    caches of ROPE_STORE_POOL rows, distinct random cache rows."""
    cache, rows, bw = rope_cache(), [], common.copy_bandwidth_tbs()
    compiled = torch.compile(torch_rope_store, dynamic=False) if compile_ else None
    names = ("kernkit", "kernkit rope + store", "sglang", "sglang rope + store", "torch.compile")
    for hq, hk in ROPE_HEADS[:3]:
        kc = torch.zeros(ROPE_STORE_POOL, hk * 128, device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        for is_neox in (True, False):
            for tokens in ROPE_TOKENS:
                rows.append(_rope_store_row(sgl, compiled, cache, kc, vc, hq, hk, is_neox, tokens, names, bw))
        del kc, vc
    return ["## rope + KV-cache store, bf16 q/k/v [tokens, heads, 128], fp32 cache, int64 positions (us per call)",
            "", f"Caches of {ROPE_STORE_POOL} rows; % of copy: bytes moved by the kernkit kernel over the copy "
            f"bandwidth ({bw:.3f} TB/s).", "",
            *common.markdown_table(["q,kv heads", "pairs", "tokens", *names, "kernkit / sglang",
                                    "kernkit / kernkit pair", "kernkit % of copy"], rows), ""]


def _rope_store_row(sgl, compiled, cache, kc, vc, hq: int, hk: int, is_neox: bool, tokens: int, names: tuple,
                    bw: float) -> list:
    """One row of ``bench_rope_store``; its inputs are freed when it returns."""
    # q and k read and written, v read, k and v written to the caches, positions and
    # cache rows read, a cos/sin row of fp32 read per token.
    moved = 2 * tokens * (hq + hk) * 128 * 2 + 3 * tokens * hk * 128 * 2 + tokens * (16 + 512)
    calls = common.calls_for(moved, max_calls=400)
    qs = torch.randn(calls, tokens, hq, 128, device="cuda", dtype=torch.bfloat16)
    ks = torch.randn(calls, tokens, hk, 128, device="cuda", dtype=torch.bfloat16)
    vs = torch.randn(calls, tokens, hk, 128, device="cuda", dtype=torch.bfloat16)
    ps = torch.randint(ROPE_MAX_POS, (calls, tokens), device="cuda", dtype=torch.int64)
    ls = torch.stack([torch.randperm(ROPE_STORE_POOL, device="cuda")[:tokens] for _ in range(calls)])

    def pair(c):
        ops.rotary_embedding(ps[c], qs[c], ks[c], cache, is_neox)
        ops.store_cache(kc, vc, ls[c], ks[c].flatten(1), vs[c].flatten(1))

    fns = {"kernkit": lambda c: ops.rotary_embedding_store(ps[c], qs[c], ks[c], vs[c], cache, kc, vc,
                                                           ls[c], is_neox),
           "kernkit rope + store": pair}
    if sgl is not None:
        def sgl_pair(c):
            sgl.rope.apply_rope_inplace(qs[c], ks[c], cache, ps[c], is_neox=is_neox)
            sgl.kvcache.store_cache(ks[c].flatten(1), vs[c].flatten(1), kc, vc, ls[c])

        fns["sglang"] = lambda c: sgl.rope.apply_rope_inplace_with_kvcache(
            qs[c], ks[c], vs[c], kc, vc, cache, ps[c], ls[c], is_neox=is_neox)
        fns["sglang rope + store"] = sgl_pair
    if compiled is not None and tokens in COMPILE_TOKENS and (hq, hk) == (32, 8) and is_neox:
        fns["torch.compile"] = lambda c: compiled(ps[c], qs[c], ks[c], vs[c], cache, kc, vc, ls[c], is_neox)
    us = {m: common.graph_time_us([lambda c=c, f=f: f(c) for c in range(calls)]) for m, f in fns.items()}
    return [f"{hq},{hk}", "neox" if is_neox else "gpt-j", tokens,
            *(us.get(m, float("nan")) for m in names),
            _ratio(us), us["kernkit"] / us["kernkit rope + store"],
            100 * moved / (us["kernkit"] * 1e-6) / (bw * 1e12)]


def group_quant_scales(tokens: int, groups: int, column_major: bool, ue8m0: bool) -> torch.Tensor:
    """Scales in kernkit's layout, which is also sglang's: row-major fp32, or column-major with
    the tokens padded to 4 (fp32, or int32 words of 4 UE8M0 bytes)."""
    if not column_major:
        return torch.empty(tokens, groups, device="cuda")
    cols, dtype = (-(-groups // 4), torch.int32) if ue8m0 else (groups, torch.float32)
    return torch.empty(cols, -(-tokens // 4) * 4, device="cuda", dtype=dtype).t()[:tokens]


def torch_group_quant(x: torch.Tensor, column_major: bool, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The op in torch (sglang's formula), its scales in the op's layout."""
    tokens = x.shape[0]
    xg = x.float().unflatten(-1, (-1, GROUP_QUANT_SIZE))
    s = xg.abs().amax(-1).clamp(min=GROUP_QUANT_EPS) / 448.0
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (xg / s[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).flatten(-2)
    if not column_major:
        return q, s
    if ue8m0:  # exponent bytes, 4 to an int32 word
        s = torch.nn.functional.pad((s.view(torch.int32) >> 23).to(torch.uint8), (0, -s.shape[1] % 4))
        s = s.view(torch.int32)
    return q, torch.nn.functional.pad(s.t(), (0, -tokens % 4)).t()[:tokens]


def time_group_quant(sgl, compiled, column_major: bool, ue8m0: bool, hidden: int, tokens: int) -> list:
    """One shape: the us per call of each method, kernkit / sglang, the MB moved, and kernkit's
    bytes per second."""
    groups = hidden // GROUP_QUANT_SIZE
    moved = tokens * hidden * (2 + 1) + tokens * 4 * (-(-groups // 4) if ue8m0 else groups)  # x read; q, s written
    calls = common.calls_for(moved, max_calls=400)
    xs = torch.randn(calls, tokens, hidden, device="cuda", dtype=torch.bfloat16)
    qs = torch.empty(calls, tokens, hidden, device="cuda", dtype=torch.float8_e4m3fn)
    fns = {"kernkit": lambda c: ops.per_token_group_quant_fp8(xs[c], GROUP_QUANT_SIZE, column_major_scales=column_major,
                                                              scale_ue8m0=ue8m0, eps=GROUP_QUANT_EPS, out=qs[c])}
    if sgl is not None:
        ss = [group_quant_scales(tokens, groups, column_major, ue8m0) for _ in range(calls)]
        fns["sglang"] = lambda c: sgl.quant.per_token_group_quant_8bit(
            input=xs[c], output_q=qs[c], output_s=ss[c], group_size=GROUP_QUANT_SIZE, eps=GROUP_QUANT_EPS,
            fp8_min=-448.0, fp8_max=448.0, scale_ue8m0=ue8m0)
    if compiled is not None and tokens in COMPILE_TOKENS and hidden == 7168:
        fns["torch.compile"] = lambda c: compiled(xs[c], column_major, ue8m0)
    us = {m: common.graph_time_us([lambda c=c, f=f: f(c) for c in range(calls)]) for m, f in fns.items()}
    return [*(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")), _ratio(us), moved / 1e6,
            moved / (us["kernkit"] * 1e-6)]


def bench_group_quant(sgl, compile_: bool) -> list[str]:
    """``per_token_group_quant_fp8`` against sglang's ``per_token_group_quant_8bit`` over the GEMM
    grid of sglang's bench_per_token_group_quant_8bit.py; kernkit writes into ``out=`` and
    allocates its scales, sglang into outputs allocated beforehand."""
    rows, bw = [], common.copy_bandwidth_tbs()
    compiled = torch.compile(torch_group_quant, dynamic=False) if compile_ else None
    for name, (column_major, ue8m0) in GROUP_QUANT_FLAGS.items():
        for hidden in GROUP_QUANT_HIDDENS:
            for tokens in GROUP_QUANT_TOKENS:
                *times, bytes_per_s = time_group_quant(sgl, compiled, column_major, ue8m0, hidden, tokens)
                rows.append([name, hidden, tokens, *times, 100 * bytes_per_s / (bw * 1e12)])
    return ["## per_token_group_quant_fp8, bf16 x, group size 128 (us per call)", "",
            f"MB moved: x read, q and the scales written, once; % of copy: that over the copy bandwidth "
            f"({bw:.3f} TB/s).", "",
            *common.markdown_table(["scales", "hidden", "tokens", "kernkit", "sglang", "torch.compile",
                                    "kernkit / sglang", "MB moved", "kernkit % of copy"], rows), ""]


def bench_host(sgl) -> list[str]:
    """Eager per-call cost of the same work through each library, in one process."""
    bf16 = torch.bfloat16
    x = torch.randn(16, 4096, device="cuda", dtype=bf16)
    w = torch.randn(4096, device="cuda", dtype=bf16)
    out = torch.empty_like(x)
    res = torch.randn_like(x)
    kc = torch.zeros(4096, 8 * 128, device="cuda", dtype=bf16)
    vc = torch.zeros_like(kc)
    k = torch.randn(64, 8 * 128, device="cuda", dtype=bf16)
    v = torch.randn_like(k)
    idx = torch.randperm(4096, device="cuda")[:64].to(torch.int64)
    q3 = torch.randn(16, 32, 128, device="cuda", dtype=bf16)
    k3 = torch.randn(16, 8, 128, device="cuda", dtype=bf16)
    v3 = torch.randn_like(k3)
    loc16 = idx[:16].clone()
    pos = torch.arange(16, device="cuda")
    wq, wk = w[:128], w[128:256]
    xg = torch.randn(16, 7168, device="cuda", dtype=bf16)
    qg = torch.empty(16, 7168, device="cuda", dtype=torch.float8_e4m3fn)
    sg = torch.empty(16, 7168 // GROUP_QUANT_SIZE, device="cuda")
    cache = rope_cache()
    module = rmsnorm_module(bf16, 4096, True)
    fns = {
        "rmsnorm into out: kernkit": lambda: ops.rmsnorm(x, w, EPS, out=out),
        "rmsnorm into out: kernkit, bare module call": lambda: module.rmsnorm(out, x, w, EPS),
        "rmsnorm in place: kernkit": lambda: ops.rmsnorm(out, w, EPS, out=out),
        "fused_add_rmsnorm: kernkit": lambda: ops.fused_add_rmsnorm(out, res, w, EPS),
        "store_cache: kernkit": lambda: ops.store_cache(kc, vc, idx, k, v),
        "rope: kernkit": lambda: ops.rotary_embedding(pos, q3, k3, cache, True),
        "rope + store: kernkit": lambda: ops.rotary_embedding_store(pos, q3, k3, v3, cache, kc, vc, loc16, True),
        "qk_norm: kernkit": lambda: ops.qk_norm(q3, k3, wq, wk, EPS),
        "group quant into out: kernkit": lambda: ops.per_token_group_quant_fp8(xg, GROUP_QUANT_SIZE, out=qg),
    }
    if sgl is not None:
        sgl_module = sgl.norm._jit_rmsnorm_module(4096, bf16)
        fns.update({
            "rmsnorm into out: sglang": lambda: sgl.norm.rmsnorm(x, w, out, EPS),
            "rmsnorm into out: sglang, bare module call": lambda: sgl_module.rmsnorm(x, w, out, EPS),
            "rmsnorm in place: sglang": lambda: sgl.norm.rmsnorm(out, w, out, EPS),
            "fused_add_rmsnorm: sglang": lambda: sgl.norm.fused_add_rmsnorm(out, res, w, EPS),
            "store_cache: sglang": lambda: sgl.kvcache.store_cache(k, v, kc, vc, idx),
            "rope: sglang": lambda: sgl.rope.apply_rope_inplace(q3, k3, cache, pos, is_neox=True),
            "rope + store: sglang": lambda: sgl.rope.apply_rope_inplace_with_kvcache(
                q3, k3, v3, kc, vc, cache, pos, loc16, is_neox=True),
            "qk_norm: sglang": lambda: sgl.norm.fused_inplace_qknorm(q3, k3, wq, wk, EPS),
            "group quant into out: sglang": lambda: sgl.quant.per_token_group_quant_8bit(
                xg, qg, sg, GROUP_QUANT_SIZE, GROUP_QUANT_EPS, -448.0, 448.0),
        })
    us = common.host_us(fns, rounds=41)
    # A server runs its forward pass under inference mode, on inference tensors.
    with torch.inference_mode():
        xi, wi, oi, ri = x.clone(), w.clone(), out.clone(), res.clone()
        fns = {"rmsnorm into out, inference mode: kernkit": lambda: ops.rmsnorm(xi, wi, EPS, out=oi),
               "fused_add_rmsnorm, inference mode: kernkit": lambda: ops.fused_add_rmsnorm(oi, ri, wi, EPS)}
        if sgl is not None:
            fns["rmsnorm into out, inference mode: sglang"] = lambda: sgl.norm.rmsnorm(xi, wi, oi, EPS)
            fns["fused_add_rmsnorm, inference mode: sglang"] = lambda: sgl.norm.fused_add_rmsnorm(oi, ri, wi, EPS)
        us.update(common.host_us(fns, rounds=41))
    rows = [[name, t] for name, t in sorted(us.items())]
    return ["## eager host cost per call (us; best of 41 rounds of 2000 calls)", "",
            *common.markdown_table(["call", "us"], rows), ""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the results here (default: print only)")
    p.add_argument("--only", default="host,rmsnorm,rope,qknorm,ropestore,groupquant",
                   help="comma list of host, rmsnorm, rope, qknorm, ropestore, groupquant")
    p.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_sglang: needs a CUDA GPU")
    common.allow_recompiles(256)
    sgl = load_sglang()
    lines = common.header("kernkit beside sglang's jit_kernel", common.command_line())
    lines += [f"- device copy bandwidth: {common.copy_bandwidth_tbs():.3f} TB/s",
              f"- sglang jit_kernel: {'imported' if sgl is not None else 'not importable'}", ""]
    parts = args.only.split(",")
    if "host" in parts:
        lines += bench_host(sgl)
        print("\n".join(lines), flush=True)
    if "rmsnorm" in parts:
        lines += bench_rmsnorm(sgl, not args.no_compile)
    if "rope" in parts:
        lines += bench_rotary_embedding(sgl, not args.no_compile)
    if "qknorm" in parts:
        lines += bench_qknorm(sgl, not args.no_compile)
    if "ropestore" in parts:
        lines += bench_rope_store(sgl, not args.no_compile)
    if "groupquant" in parts:
        lines += bench_group_quant(sgl, not args.no_compile)
    common.write_report(args.out, f"sglang-h200-{datetime.date.today().isoformat()}.md", lines)


if __name__ == "__main__":
    main()
