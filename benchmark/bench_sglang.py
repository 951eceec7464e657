"""kernkit beside sglang's own JIT kernels and torch.compile, over the grids of sglang's
``bench_rmsnorm.py``, ``bench_rotary_embedding.py``, ``bench_qknorm.py`` and
``bench_per_token_group_quant_8bit.py``, the gated activations at the MLP widths of 8B to 70B
models, plus the eager host cost per call of the ops both have.

    python benchmark/bench_sglang.py --out DIR [--only host,rmsnorm,fusedadd,rope,qknorm,ropestore,store,groupquant,act]
                                     [--quick] [--no-compile] [--dry-run]

sglang is whichever of its JIT kernel packages imports: ``sglang.kernels`` (sglang 0.5.23 and
later, the current peer) or else ``sglang.jit_kernel`` (0.5.10). ``load_sglang`` puts each op
behind one call form (``Sglang``), so every grid calls either version the same way; where the
versions differ it passes what makes them do kernkit's work: 0.5.23's ``store_cache`` gets
``reserved_skip_index=-1`` (by default it skips writes to row 0, the CUDA-graph padding slot)
and only rows inside the cache; its group quant takes the fp8 range from ``q``'s dtype and its
eps (1e-10, as here) from the kernel; its ``fused_inplace_qknorm`` is wrapped in
``register_custom_op`` as sglang's model code wraps it. The header names the version.

- rmsnorm: in place (``out=x``, as sglang's benchmark calls it), bf16, hidden 1024-8192 (and
  1536, 16384) x 1 to 8192 tokens.
- fusedadd: ``fused_add_rmsnorm`` against sglang's, in place, over the rmsnorm grid.
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
- store: ``store_cache`` against sglang's (``reserved_skip_index=-1``): bf16 K and V rows of
  256, 1024 and 4096 bytes, 1 to 16384 tokens, caches of 2**20 rows at distinct random rows.
- groupquant: ``per_token_group_quant_fp8`` against sglang's group quant (0.5.23
  ``per_token_group_quant``, 0.5.10 ``per_token_group_quant_8bit``; its scales allocated in the
  same layouts): bf16 x of 1 to 16384 tokens of hidden 1536, 7168 and 16384, group size 128,
  row-major, column-major (TMA-aligned) and packed UE8M0 scales (the GEMM grid of sglang's
  benchmark), with the bytes moved and kernkit's % of the copy bandwidth.
- act: ``silu_and_mul`` and ``gelu_and_mul(approximate="tanh")`` against sglang's JIT
  ``silu_and_mul`` and ``gelu_tanh_and_mul`` (``sglang.kernels.ops.activation.activation``, not
  the module facade; 0.5.10 has none): bf16 x ``[tokens, 2 d]`` into ``out``, d = 12288
  (Qwen3-8B), 14336 (Llama-3-8B), 25600 (Qwen3-32B), 28672 (Llama-3-70B), 1 to 16384 tokens.
- host: eager per-call cost in one process, the same work for both, each op in grad mode (torch's
  default) and under ``torch.inference_mode()`` on inference tensors, as a server runs: rmsnorm
  (into ``out``, its bare module call, in place), fused_add_rmsnorm, store_cache, rope, rope +
  store, qk_norm, group quant into given q and scales, silu_and_mul and gelu_tanh_and_mul into
  ``out``. sglang 0.5.23's custom ops call their Python function directly when grad is off and
  go through torch's dispatcher otherwise, so the two modes differ for it.

``--quick`` thins every grid (``QUICK``) to about a quarter of the shapes. Times are CUDA-graph
medians per call with inputs rotated beyond the L2 (``common``). The first call of each sglang
JIT module compiles it (seconds); with ``sglang.kernels`` the modules the chosen grids use are
built first, in parallel (an op whose build fails is left out and named in the header).
torch.compile times the torch function of each op at a subset of the shapes (it compiles once
per shape). Results are written after each section, so a run cut short keeps what it measured.
``--dry-run`` imports sglang and lists the grids without a GPU.

sglang's packages come from an installed sglang or from a tree on ``PYTHONPATH``:
``tools/sglang_kernels_tree.py`` packs 0.5.23's from its wheel (with stand-ins for the few
runtime modules they import); for a tree holding only 0.5.10's ``sglang/jit_kernel`` (unpacked
from the wheel), the three small sglang modules it imports are replaced here by stand-ins
(``_stand_ins``) that do what sglang's do with kernel-API logging off. Measures and reports;
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.util
import os
import re
import shutil
import sys
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

import common

from kernkit import ops
from kernkit.ops.rmsnorm import _module as rmsnorm_module

EPS = 1e-6
ROPE_MAX_POS = 131072
ROPE_STORE_POOL = 1024 * 1024
GROUP_QUANT_SIZE = 128
GROUP_QUANT_EPS = 1e-10
#: (column_major_scales, scale_ue8m0) of sglang's GEMM flag sets: row-major, column-major
#: TMA-aligned, and that with packed UE8M0 scales.
GROUP_QUANT_FLAGS = {"row-major": (False, False), "column-major": (True, False), "ue8m0": (True, True)}
ACTS = ("silu", "gelu_tanh")
COMPILE_TOKENS = {1, 64, 1024, 8192, 16384}
SECTIONS = ("host", "rmsnorm", "fusedadd", "rope", "qknorm", "ropestore", "store", "groupquant", "act")
_LIBRARIES: list = []


@dataclasses.dataclass(frozen=True)
class Grids:
    """The shapes each section times."""
    norm_hiddens: tuple = (1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 16384)
    norm_tokens: tuple = tuple(2**n for n in range(14))
    rope_heads: tuple = ((8, 1), (16, 2), (32, 8), (64, 8))
    rope_tokens: tuple = tuple(2**n for n in range(16))
    rope_store_heads: tuple = ((8, 1), (16, 2), (32, 8))
    qknorm_head_dims: tuple = (128, 256, 512, 1024)
    qknorm_gqa: tuple = (4, 8)
    qknorm_kv_heads: tuple = (1, 2, 4, 8)
    qknorm_tokens: tuple = tuple(2**n for n in range(14))
    group_quant_tokens: tuple = (1, 4, 16, 64, 256, 768, 2048, 8192, 16384)
    group_quant_hiddens: tuple = (1536, 7168, 16384)
    act_ds: tuple = (12288, 14336, 25600, 28672)
    act_tokens: tuple = (1, 4, 16, 64, 256, 1024, 4096, 16384)
    store_row_bytes: tuple = (256, 1024, 4096)
    store_tokens: tuple = tuple(4**n for n in range(8))


FULL = Grids()
QUICK = Grids(norm_hiddens=(1024, 4096, 5120, 8192, 16384), norm_tokens=(1, 4, 16, 64, 256, 1024, 8192),
              rope_heads=((8, 1), (32, 8), (64, 8)), rope_tokens=(1, 4, 16, 64, 256, 1024, 8192, 32768),
              rope_store_heads=((8, 1), (32, 8)), qknorm_gqa=(8,), qknorm_kv_heads=(1, 8),
              qknorm_tokens=(1, 4, 16, 64, 256, 1024, 8192), group_quant_tokens=(1, 16, 256, 2048, 16384),
              act_ds=(14336, 28672), act_tokens=(1, 16, 256, 4096, 16384))


@dataclasses.dataclass
class Sglang:
    """sglang's JIT kernels, one call form per op whatever version provides them (0.5.23's forms;
    0.5.10's adapted). An op is None where this version has none or its build failed
    (``notes`` says which)."""
    version: str
    package: str  # "sglang.kernels" or "sglang.jit_kernel"
    #: (x, weight, out, eps) -> None; ``out=x`` normalizes in place.
    rmsnorm: Callable | None
    #: (hidden, dtype) -> the tvm-ffi module; ``.rmsnorm(x, weight, out, eps)``.
    rmsnorm_module: Callable | None
    #: (x, residual, weight, eps) -> None: residual += x, x = rmsnorm(residual), in place.
    fused_add_rmsnorm: Callable | None
    #: (q, k, q_weight, k_weight, eps) -> None, in place.
    qk_norm: Callable | None
    #: (q, k, cos_sin_cache, positions, *, is_neox) -> None, in place.
    rope: Callable | None
    #: (q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox) -> None.
    rope_store: Callable | None
    #: (k, v, k_cache, v_cache, indices) -> None: every row written.
    store_cache: Callable | None
    #: (x, q, scales, group_size, scale_ue8m0) -> None: fp8 e4m3 q, eps 1e-10, the scale layout
    #: read from ``scales``.
    group_quant: Callable | None
    #: (x, out) -> out.
    silu_and_mul: Callable | None = None
    #: (x, out) -> out.
    gelu_tanh_and_mul: Callable | None = None
    notes: list = dataclasses.field(default_factory=list)
    #: op -> the hidden sizes its norm refused (sglang's fused_add_rmsnorm stops below 16384):
    #: the op stays in for the others.
    refused: dict = dataclasses.field(default_factory=dict)


def load_sglang() -> Sglang | None:
    """sglang's JIT kernels: ``sglang.kernels`` when sglang has it (0.5.23), else
    ``sglang.jit_kernel`` (0.5.10); None, with the reason on stderr, when neither imports."""
    _ninja_on_path()
    try:
        has_kernels = importlib.util.find_spec("sglang.kernels") is not None
    except Exception:  # sglang itself is missing, or its package root fails to import
        has_kernels = False
    try:
        return _load_kernels() if has_kernels else _load_jit_kernel()
    except Exception as e:  # an import error anywhere inside sglang: time kernkit alone
        where = "sglang.kernels" if has_kernels else "sglang.jit_kernel"
        print(f"sglang's {where} is not importable ({type(e).__name__}: {e}); timing kernkit and torch only",
              file=sys.stderr)
        return None


def _ninja_on_path() -> None:
    """sglang 0.5.23 runs ``ninja`` from PATH: where none is there, the ninja wheel's (which
    kernkit uses) serves."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _version() -> str:
    import sglang

    version = getattr(sglang, "__version__", None)
    if version is None:
        try:
            import importlib.metadata

            version = importlib.metadata.version("sglang")
        except Exception:
            version = "unknown"
    return str(version)


def _load_kernels() -> Sglang:
    from sglang.kernels.ops.activation import activation
    from sglang.kernels.ops.attention import rope
    from sglang.kernels.ops.kvcache import kvcache
    from sglang.kernels.ops.layernorm import norm
    from sglang.kernels.ops.quantization import per_token_group_quant
    from sglang.srt.utils.custom_op import register_custom_op

    # What a server calls: sglang's model code registers the norm as a custom op (in place on q, k).
    qk_norm = register_custom_op(norm.fused_inplace_qknorm, mutates_args=["q", "k"])
    return Sglang(version=_version(), package="sglang.kernels", rmsnorm=norm.rmsnorm,
                  rmsnorm_module=norm._jit_rmsnorm_module, fused_add_rmsnorm=norm.fused_add_rmsnorm,
                  qk_norm=qk_norm, rope=rope.apply_rope_inplace, rope_store=rope.apply_rope_inplace_with_kvcache,
                  store_cache=functools.partial(kvcache.store_cache, reserved_skip_index=-1),
                  group_quant=per_token_group_quant.per_token_group_quant,
                  silu_and_mul=activation.silu_and_mul, gelu_tanh_and_mul=activation.gelu_tanh_and_mul)


def _load_jit_kernel() -> Sglang:
    try:
        import sglang.utils  # noqa: F401
    except ImportError:
        _stand_ins()
    from sglang.jit_kernel import kvcache, norm, rope
    from sglang.jit_kernel import per_token_group_quant_8bit as quant

    def group_quant(x, q, s, group_size, scale_ue8m0):
        quant.per_token_group_quant_8bit(x, q, s, group_size, GROUP_QUANT_EPS, -448.0, 448.0, scale_ue8m0)

    return Sglang(version=_version(), package="sglang.jit_kernel", rmsnorm=norm.rmsnorm,
                  rmsnorm_module=norm._jit_rmsnorm_module, fused_add_rmsnorm=norm.fused_add_rmsnorm,
                  qk_norm=norm.fused_inplace_qknorm, rope=rope.apply_rope_inplace,
                  rope_store=rope.apply_rope_inplace_with_kvcache, store_cache=kvcache.store_cache,
                  group_quant=group_quant)


def _stand_ins() -> None:
    """What 0.5.10's jit_kernel imports from the rest of sglang, as sglang behaves with its
    kernel-API logging off: ``is_in_ci`` False; ``register_custom_op`` defines
    ``torch.ops.sglang.<name>`` with a CUDA kernel (``torch.library`` define and impl, as sglang's
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


def peer(sgl: Sglang | None, op: str, hidden: int | None = None) -> Callable | None:
    """sglang's call for ``op`` (at ``hidden``, for the norms), or None (no sglang, no such op in
    it, or its build failed)."""
    if sgl is None or hidden in sgl.refused.get(op, ()):
        return None
    return getattr(sgl, op)


def warm_calls(sgl: Sglang, parts: list[str], g: Grids) -> list[tuple[str, tuple, Callable[[], object]]]:
    """(op, its arguments, small call) triples that load every sglang JIT module the chosen
    sections use: one per module key (dtype, hidden size, head dim, rope style, row bytes,
    scale layout)."""
    bf16, dev = torch.bfloat16, "cuda"
    calls: list[tuple[str, tuple, Callable[[], object]]] = []

    def add(op: str, fn: Callable[..., object], *args) -> None:
        if getattr(sgl, op) is not None:
            calls.append((op, args, functools.partial(fn, *args)))

    def norm(hidden: int) -> None:
        x = torch.randn(1, hidden, device=dev, dtype=bf16)
        sgl.rmsnorm(x, torch.ones(hidden, device=dev, dtype=bf16), x, EPS)

    def qknorm(head_dim: int) -> None:
        q, k = torch.randn(1, 4, head_dim, device=dev, dtype=bf16), torch.randn(1, 1, head_dim, device=dev, dtype=bf16)
        w = torch.ones(head_dim, device=dev, dtype=bf16)
        sgl.qk_norm(q, k, w, w, EPS)

    def rope(is_neox: bool, store: bool) -> None:
        q, k, v = (torch.randn(1, h, 128, device=dev, dtype=bf16) for h in (8, 1, 1))
        cache, pos = torch.randn(16, 128, device=dev), torch.zeros(1, device=dev, dtype=torch.int64)
        if store:
            kc = torch.zeros(4, 128, device=dev, dtype=bf16)
            sgl.rope_store(q, k, v, kc, torch.zeros_like(kc), cache, pos, pos + 1, is_neox=is_neox)
        else:
            sgl.rope(q, k, cache, pos, is_neox=is_neox)

    def store(width: int) -> None:
        k = torch.randn(1, width, device=dev, dtype=bf16)
        kc = torch.zeros(4, width, device=dev, dtype=bf16)
        sgl.store_cache(k, k, kc, torch.zeros_like(kc), torch.ones(1, device=dev, dtype=torch.int64))

    def quant(column_major: bool, ue8m0: bool) -> None:
        x = torch.randn(4, 1536, device=dev, dtype=bf16)
        q = torch.empty(4, 1536, device=dev, dtype=torch.float8_e4m3fn)
        sgl.group_quant(x, q, group_quant_scales(4, 1536 // GROUP_QUANT_SIZE, column_major, ue8m0), GROUP_QUANT_SIZE,
                        ue8m0)

    def act(op: str) -> None:
        x = torch.randn(2, 2 * 14336, device=dev, dtype=bf16)
        getattr(sgl, op)(x, torch.empty(2, 14336, device=dev, dtype=bf16))

    def fused(hidden: int) -> None:
        x, r = (torch.randn(1, hidden, device=dev, dtype=bf16) for _ in range(2))
        sgl.fused_add_rmsnorm(x, r, torch.ones(hidden, device=dev, dtype=bf16), EPS)

    hiddens = set(g.norm_hiddens if "rmsnorm" in parts else ()) | ({4096} if "host" in parts else set())
    for hidden in sorted(hiddens):
        add("rmsnorm", norm, hidden)
    if "host" in parts:
        add("rmsnorm_module", lambda: sgl.rmsnorm_module(4096, bf16))
    for hidden in sorted(set(g.norm_hiddens if "fusedadd" in parts else ()) | ({4096} if "host" in parts else set())):
        add("fused_add_rmsnorm", fused, hidden)
    head_dims = set(g.qknorm_head_dims if "qknorm" in parts else ()) | ({128} if "host" in parts else set())
    for head_dim in sorted(head_dims):
        add("qk_norm", qknorm, head_dim)
    styles = (True, False) if {"rope", "ropestore"} & set(parts) else (True,) if "host" in parts else ()
    for is_neox in styles:
        add("rope", rope, is_neox, False)
        add("rope_store", rope, is_neox, True)
    widths = {hk * 128 for _, hk in g.rope_store_heads} if "ropestore" in parts else set()
    widths |= {b // 2 for b in g.store_row_bytes} if "store" in parts else set()
    for width in sorted(widths | ({8 * 128} if "host" in parts else set())):
        add("store_cache", store, width)
    layouts = GROUP_QUANT_FLAGS.values() if "groupquant" in parts else [(False, False)] if "host" in parts else []
    for column_major, ue8m0 in layouts:
        add("group_quant", quant, column_major, ue8m0)
    if {"act", "host"} & set(parts):
        add("silu_and_mul", act, "silu_and_mul")
        add("gelu_tanh_and_mul", act, "gelu_tanh_and_mul")
    return calls


def build_sglang(sgl: Sglang, parts: list[str], g: Grids) -> float:
    """Run ``warm_calls`` (in parallel for ``sglang.kernels``, whose builds lock per module; one
    at a time for 0.5.10); an op whose call fails is set to None and noted, except a norm's
    failure at one hidden size, which leaves that size out (``refused``). Returns the seconds."""
    calls = warm_calls(sgl, parts, g)
    workers = min(len(calls), os.cpu_count() or 1) if sgl.package == "sglang.kernels" else 1
    t0 = time.perf_counter()

    def attempt(fn: Callable[[], object]) -> BaseException | None:
        try:
            fn()
        except Exception as e:
            return e
        return None

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            errors = list(pool.map(attempt, [fn for *_, fn in calls]))
    else:
        errors = [attempt(fn) for *_, fn in calls]
    torch.cuda.synchronize()
    for (op, args, _), error in zip(calls, errors, strict=True):
        if error is None or getattr(sgl, op) is None:
            continue
        why = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        if op in ("rmsnorm", "fused_add_rmsnorm"):
            sgl.refused.setdefault(op, set()).add(args[0])
            sgl.notes.append(f"sglang's {op} left out at hidden {args[0]}: {why}")
        else:
            setattr(sgl, op, None)
            sgl.notes.append(f"sglang's {op} left out: {why}")
        print(sgl.notes[-1], file=sys.stderr)
    return time.perf_counter() - t0


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


def _ratio(us: dict) -> float:
    return us["kernkit"] / us["sglang"] if "sglang" in us else float("nan")


def bench_rmsnorm(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    rows, compiled = [], torch.compile(torch_rmsnorm, dynamic=False) if compile_ else None
    for hidden in g.norm_hiddens:
        sg = peer(sgl, "rmsnorm", hidden)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        for tokens in g.norm_tokens:
            calls = common.calls_for(2 * tokens * hidden * 2, max_calls=400)
            xs = torch.randn(calls, tokens, hidden, device="cuda", dtype=torch.bfloat16)
            fns = {"kernkit": lambda c, xs=xs, w=w: ops.rmsnorm(xs[c], w, EPS, out=xs[c])}
            if sg is not None:
                fns["sglang"] = lambda c, xs=xs, w=w, sg=sg: sg(xs[c], w, xs[c], EPS)
            if compiled is not None and tokens in COMPILE_TOKENS and hidden in (4096, 5120):
                fns["torch.compile"] = lambda c, xs=xs, w=w: compiled(xs[c], w)
            us = common.graph_times_us_by(fns, calls)
            rows.append([hidden, tokens, *(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")),
                         _ratio(us)])
            del xs, fns
    return ["## rmsnorm, bf16, in place (us per call)", "",
            *common.markdown_table(["hidden", "tokens", "kernkit", "sglang", "torch.compile", "kernkit / sglang"],
                                   rows), ""]


def bench_fused_add_rmsnorm(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    """``fused_add_rmsnorm`` against sglang's, in place, over the rmsnorm grid (sglang's default
    rounding, which is kernkit's)."""
    rows = []
    for hidden in g.norm_hiddens:
        sg = peer(sgl, "fused_add_rmsnorm", hidden)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        for tokens in g.norm_tokens:
            calls = common.calls_for(4 * tokens * hidden * 2, max_calls=400)
            xs, rs = (torch.randn(calls, tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            fns = {"kernkit": lambda c, xs=xs, rs=rs, w=w: ops.fused_add_rmsnorm(xs[c], rs[c], w, EPS)}
            if sg is not None:
                fns["sglang"] = lambda c, xs=xs, rs=rs, w=w, sg=sg: sg(xs[c], rs[c], w, EPS)
            us = common.graph_times_us_by(fns, calls)
            rows.append([hidden, tokens, us["kernkit"], us.get("sglang", float("nan")), _ratio(us)])
            del xs, rs, fns
    return ["## fused_add_rmsnorm, bf16, in place (us per call)", "",
            *common.markdown_table(["hidden", "tokens", "kernkit", "sglang", "kernkit / sglang"], rows), ""]


def bench_store_cache(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    """``store_cache`` against sglang's (every row written: ``reserved_skip_index=-1``): K and V
    rows of each width into caches of ROPE_STORE_POOL rows at distinct random rows."""
    rows, sg = [], peer(sgl, "store_cache")
    for row_bytes in g.store_row_bytes:
        width = row_bytes // 2
        kc = torch.zeros(ROPE_STORE_POOL, width, device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        for tokens in g.store_tokens:
            calls = common.calls_for(4 * tokens * row_bytes, max_calls=400)
            ks, vs = (torch.randn(calls, tokens, width, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            ls = torch.stack([torch.randperm(ROPE_STORE_POOL, device="cuda")[:tokens] for _ in range(calls)])
            fns = {"kernkit": lambda c, ks=ks, vs=vs, ls=ls, kc=kc, vc=vc: ops.store_cache(kc, vc, ls[c], ks[c], vs[c])}
            if sg is not None:
                fns["sglang"] = lambda c, ks=ks, vs=vs, ls=ls, kc=kc, vc=vc: sg(ks[c], vs[c], kc, vc, ls[c])
            us = common.graph_times_us_by(fns, calls)
            rows.append([row_bytes, tokens, us["kernkit"], us.get("sglang", float("nan")), _ratio(us)])
            del ks, vs, ls, fns
        del kc, vc
    return [f"## store_cache, bf16 K and V rows, caches of {ROPE_STORE_POOL} rows, int64 rows (us per call)", "",
            *common.markdown_table(["row bytes", "tokens", "kernkit", "sglang", "kernkit / sglang"], rows), ""]


def torch_qknorm(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor) -> None:
    for x, w in ((q, wq), (k, wk)):
        xf = x.float()
        x.copy_(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float())


def bench_qknorm(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    rows, compiled = [], torch.compile(torch_qknorm, dynamic=False) if compile_ else None
    sg = peer(sgl, "qk_norm")
    for head_dim in g.qknorm_head_dims:
        wq = torch.randn(head_dim, device="cuda", dtype=torch.bfloat16)
        wk = torch.randn(head_dim, device="cuda", dtype=torch.bfloat16)
        for gqa in g.qknorm_gqa:
            for kv in g.qknorm_kv_heads:
                for tokens in g.qknorm_tokens:
                    calls = common.calls_for(2 * tokens * (gqa + 1) * kv * head_dim * 2, max_calls=400)
                    qs = torch.randn(calls, tokens, gqa * kv, head_dim, device="cuda", dtype=torch.bfloat16)
                    ks = torch.randn(calls, tokens, kv, head_dim, device="cuda", dtype=torch.bfloat16)
                    fns = {"kernkit": lambda c, qs=qs, ks=ks, wq=wq, wk=wk: ops.qk_norm(qs[c], ks[c], wq, wk, EPS)}
                    if sg is not None:
                        fns["sglang"] = lambda c, qs=qs, ks=ks, wq=wq, wk=wk: sg(qs[c], ks[c], wq, wk, EPS)
                    if compiled is not None and tokens in COMPILE_TOKENS and (gqa, kv) == (8, 8) and head_dim <= 256:
                        fns["torch.compile"] = lambda c, qs=qs, ks=ks, wq=wq, wk=wk: compiled(qs[c], ks[c], wq, wk)
                    us = common.graph_times_us_by(fns, calls)
                    rows.append([head_dim, gqa, kv, tokens,
                                 *(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")),
                                 _ratio(us)])
                    del qs, ks, fns
    return ["## qk_norm, bf16, in place (us per call)", "",
            *common.markdown_table(["head_dim", "gqa", "kv heads", "tokens", "kernkit", "sglang", "torch.compile",
                                    "kernkit / sglang"], rows), ""]


def rope_cache() -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32, device="cuda") / 128))
    ang = torch.arange(ROPE_MAX_POS, dtype=torch.float32, device="cuda")[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], -1)


def bench_rotary_embedding(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    cache, rows = rope_cache(), []
    compiled = torch.compile(torch_rope, dynamic=False) if compile_ else None
    sg = peer(sgl, "rope")
    for hq, hk in g.rope_heads:
        for is_neox in (True, False):
            for tokens in g.rope_tokens:
                per_call = 2 * tokens * (hq + hk) * 128 * 2 + tokens * (8 + 512)
                calls = common.calls_for(per_call, max_calls=400)
                qs = torch.randn(calls, tokens, hq, 128, device="cuda", dtype=torch.bfloat16)
                ks = torch.randn(calls, tokens, hk, 128, device="cuda", dtype=torch.bfloat16)
                ps = torch.randint(ROPE_MAX_POS, (calls, tokens), device="cuda", dtype=torch.int64)
                fns = {"kernkit": lambda c, ps=ps, qs=qs, ks=ks, is_neox=is_neox: ops.rotary_embedding(
                    ps[c], qs[c], ks[c], cache, is_neox)}
                if sg is not None:
                    fns["sglang"] = lambda c, ps=ps, qs=qs, ks=ks, is_neox=is_neox: sg(
                        qs[c], ks[c], cache, ps[c], is_neox=is_neox)
                if compiled is not None and tokens in COMPILE_TOKENS and (hq, hk) == (32, 8) and is_neox:
                    fns["torch.compile"] = lambda c, ps=ps, qs=qs, ks=ks, is_neox=is_neox: compiled(
                        ps[c], qs[c], ks[c], cache, is_neox)
                us = common.graph_times_us_by(fns, calls)
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


def bench_rope_store(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    """``rotary_embedding_store`` against sglang's ``apply_rope_inplace_with_kvcache``, and each
    library's rope and store as two calls in one graph, over sglang's bench_rotary_embedding.py store grid:
    caches of ROPE_STORE_POOL rows, distinct random cache rows."""
    cache, rows, bw = rope_cache(), [], common.copy_bandwidth_tbs()
    compiled = torch.compile(torch_rope_store, dynamic=False) if compile_ else None
    names = ("kernkit", "kernkit rope + store", "sglang", "sglang rope + store", "torch.compile")
    for hq, hk in g.rope_store_heads:
        kc = torch.zeros(ROPE_STORE_POOL, hk * 128, device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        for is_neox in (True, False):
            for tokens in g.rope_tokens:
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
    # Rows inside the cache (0.5.23's store asserts on any other), row 0 among them.
    ls = torch.stack([torch.randperm(ROPE_STORE_POOL, device="cuda")[:tokens] for _ in range(calls)])

    def pair(c):
        ops.rotary_embedding(ps[c], qs[c], ks[c], cache, is_neox)
        ops.store_cache(kc, vc, ls[c], ks[c].flatten(1), vs[c].flatten(1))

    fns = {"kernkit": lambda c: ops.rotary_embedding_store(ps[c], qs[c], ks[c], vs[c], cache, kc, vc,
                                                           ls[c], is_neox),
           "kernkit rope + store": pair}
    rope, rope_store, store = peer(sgl, "rope"), peer(sgl, "rope_store"), peer(sgl, "store_cache")
    if rope_store is not None:
        fns["sglang"] = lambda c: rope_store(qs[c], ks[c], vs[c], kc, vc, cache, ps[c], ls[c], is_neox=is_neox)
    if rope is not None and store is not None:
        def sgl_pair(c):
            rope(qs[c], ks[c], cache, ps[c], is_neox=is_neox)
            store(ks[c].flatten(1), vs[c].flatten(1), kc, vc, ls[c])

        fns["sglang rope + store"] = sgl_pair
    if compiled is not None and tokens in COMPILE_TOKENS and (hq, hk) == (32, 8) and is_neox:
        fns["torch.compile"] = lambda c: compiled(ps[c], qs[c], ks[c], vs[c], cache, kc, vc, ls[c], is_neox)
    us = common.graph_times_us_by(fns, calls)
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
    sg = peer(sgl, "group_quant")
    if sg is not None:
        ss = [group_quant_scales(tokens, groups, column_major, ue8m0) for _ in range(calls)]
        fns["sglang"] = lambda c: sg(xs[c], qs[c], ss[c], GROUP_QUANT_SIZE, ue8m0)
    if compiled is not None and tokens in COMPILE_TOKENS and hidden == 7168:
        fns["torch.compile"] = lambda c: compiled(xs[c], column_major, ue8m0)
    us = common.graph_times_us_by(fns, calls)
    return [*(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")), _ratio(us), moved / 1e6,
            moved / (us["kernkit"] * 1e-6)]


def bench_group_quant(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    """``per_token_group_quant_fp8`` against sglang's group quant over the GEMM grid of sglang's
    bench_per_token_group_quant_8bit.py; kernkit writes into ``out=`` and allocates its scales,
    sglang into outputs allocated beforehand."""
    rows, bw = [], common.copy_bandwidth_tbs()
    compiled = torch.compile(torch_group_quant, dynamic=False) if compile_ else None
    for name, (column_major, ue8m0) in GROUP_QUANT_FLAGS.items():
        for hidden in g.group_quant_hiddens:
            for tokens in g.group_quant_tokens:
                *times, bytes_per_s = time_group_quant(sgl, compiled, column_major, ue8m0, hidden, tokens)
                rows.append([name, hidden, tokens, *times, 100 * bytes_per_s / (bw * 1e12)])
    return ["## per_token_group_quant_fp8, bf16 x, group size 128 (us per call)", "",
            f"MB moved: x read, q and the scales written, once; % of copy: that over the copy bandwidth "
            f"({bw:.3f} TB/s).", "",
            *common.markdown_table(["scales", "hidden", "tokens", "kernkit", "sglang", "torch.compile",
                                    "kernkit / sglang", "MB moved", "kernkit % of copy"], rows), ""]


def torch_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def torch_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def kernkit_act(act: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """kernkit's ``act``: ``(x, out) -> out``."""
    if act == "silu":
        return lambda x, out: ops.silu_and_mul(x, out=out)
    return lambda x, out: ops.gelu_and_mul(x, "tanh", out=out)


def bench_act(sgl: Sglang | None, compile_: bool, g: Grids) -> list[str]:
    """kernkit's gated activations against sglang's JIT ones, into ``out``, at MLP widths."""
    rows, bw = [], common.copy_bandwidth_tbs()
    for act in ACTS:
        torch_fn = torch_silu_and_mul if act == "silu" else torch_gelu_tanh_and_mul
        compiled = torch.compile(torch_fn, dynamic=False) if compile_ else None
        kk, sg = kernkit_act(act), peer(sgl, f"{act}_and_mul")
        for d in g.act_ds:
            for tokens in g.act_tokens:
                moved = tokens * 3 * d * 2  # x read, out written
                # A call of many tokens is itself far beyond the L2: few buffers keep the memory in bounds.
                calls = common.calls_for(moved, min_calls=3, max_calls=400)
                xs = torch.randn(calls, tokens, 2 * d, device="cuda", dtype=torch.bfloat16)
                outs = torch.empty(calls, tokens, d, device="cuda", dtype=torch.bfloat16)
                fns = {"kernkit": lambda c, xs=xs, outs=outs, kk=kk: kk(xs[c], outs[c])}
                if sg is not None:
                    fns["sglang"] = lambda c, xs=xs, outs=outs, sg=sg: sg(xs[c], outs[c])
                if compiled is not None and tokens in COMPILE_TOKENS and d == 14336:
                    fns["torch.compile"] = lambda c, xs=xs, compiled=compiled: compiled(xs[c])
                us = common.graph_times_us_by(fns, calls)
                rows.append([act, d, tokens, *(us.get(m, float("nan")) for m in ("kernkit", "sglang", "torch.compile")),
                             _ratio(us), 100 * moved / (us["kernkit"] * 1e-6) / (bw * 1e12)])
                del xs, outs, fns
                torch.cuda.empty_cache()
    return [f"## {' / '.join(f'{a}_and_mul' for a in ACTS)}, bf16 x [tokens, 2 d] into out (us per call)", "",
            f"% of copy: x read and out written over the copy bandwidth ({bw:.3f} TB/s).", "",
            *common.markdown_table(["act", "d", "tokens", "kernkit", "sglang", "torch.compile", "kernkit / sglang",
                                    "kernkit % of copy"], rows), ""]


def host_tensors() -> types.SimpleNamespace:
    """The inputs of the host-cost calls (made again under inference mode for those rows)."""
    bf16, dev = torch.bfloat16, "cuda"
    t = types.SimpleNamespace()
    t.x = torch.randn(16, 4096, device=dev, dtype=bf16)
    t.w = torch.randn(4096, device=dev, dtype=bf16)
    t.out, t.res = torch.empty_like(t.x), torch.randn_like(t.x)
    t.kc = torch.zeros(4096, 8 * 128, device=dev, dtype=bf16)
    t.vc = torch.zeros_like(t.kc)
    t.k = torch.randn(64, 8 * 128, device=dev, dtype=bf16)
    t.v = torch.randn_like(t.k)
    t.idx = torch.randperm(4096, device=dev)[:64].to(torch.int64)
    t.q3 = torch.randn(16, 32, 128, device=dev, dtype=bf16)
    t.k3 = torch.randn(16, 8, 128, device=dev, dtype=bf16)
    t.v3 = torch.randn_like(t.k3)
    t.loc16 = t.idx[:16].clone()
    t.pos = torch.arange(16, device=dev)
    t.wq, t.wk = t.w[:128].clone(), t.w[128:256].clone()
    t.xg = torch.randn(16, 7168, device=dev, dtype=bf16)
    t.qg = torch.empty(16, 7168, device=dev, dtype=torch.float8_e4m3fn)
    t.sg = torch.empty(16, 7168 // GROUP_QUANT_SIZE, device=dev)
    t.xa = torch.randn(16, 2 * 14336, device=dev, dtype=bf16)
    t.oa = torch.empty(16, 14336, device=dev, dtype=bf16)
    t.cache = rope_cache()
    return t


def host_calls(sgl: Sglang | None, t: types.SimpleNamespace) -> dict[tuple[str, str], Callable[[], object]]:
    """(op, library) -> one call of the op on ``t``'s tensors."""
    module = rmsnorm_module(torch.bfloat16, 4096, True, False)
    kernkit = {
        "rmsnorm into out": lambda: ops.rmsnorm(t.x, t.w, EPS, out=t.out),
        "rmsnorm into out, bare module call": lambda: module.rmsnorm(t.out, t.x, t.w, EPS),
        "rmsnorm in place": lambda: ops.rmsnorm(t.out, t.w, EPS, out=t.out),
        "fused_add_rmsnorm": lambda: ops.fused_add_rmsnorm(t.out, t.res, t.w, EPS),
        "store_cache": lambda: ops.store_cache(t.kc, t.vc, t.idx, t.k, t.v),
        "rope": lambda: ops.rotary_embedding(t.pos, t.q3, t.k3, t.cache, True),
        "rope + store": lambda: ops.rotary_embedding_store(t.pos, t.q3, t.k3, t.v3, t.cache, t.kc, t.vc, t.loc16,
                                                           True),
        "qk_norm": lambda: ops.qk_norm(t.q3, t.k3, t.wq, t.wk, EPS),
        "group quant into q and scales": lambda: ops.per_token_group_quant_fp8(t.xg, GROUP_QUANT_SIZE, out=t.qg,
                                                                               out_scales=t.sg),
        "silu_and_mul into out": lambda: ops.silu_and_mul(t.xa, out=t.oa),
        "gelu_tanh_and_mul into out": lambda: ops.gelu_and_mul(t.xa, "tanh", out=t.oa),
    }
    fns = {(op, "kernkit"): fn for op, fn in kernkit.items()}
    s = sgl
    if s is None:
        return fns
    sglang: dict[str, tuple[str, Callable[[], object]]] = {
        "rmsnorm into out": ("rmsnorm", lambda: s.rmsnorm(t.x, t.w, t.out, EPS)),
        "rmsnorm in place": ("rmsnorm", lambda: s.rmsnorm(t.out, t.w, t.out, EPS)),
        "fused_add_rmsnorm": ("fused_add_rmsnorm", lambda: s.fused_add_rmsnorm(t.out, t.res, t.w, EPS)),
        "store_cache": ("store_cache", lambda: s.store_cache(t.k, t.v, t.kc, t.vc, t.idx)),
        "rope": ("rope", lambda: s.rope(t.q3, t.k3, t.cache, t.pos, is_neox=True)),
        "rope + store": ("rope_store", lambda: s.rope_store(t.q3, t.k3, t.v3, t.kc, t.vc, t.cache, t.pos, t.loc16,
                                                            is_neox=True)),
        "qk_norm": ("qk_norm", lambda: s.qk_norm(t.q3, t.k3, t.wq, t.wk, EPS)),
        "group quant into q and scales": ("group_quant", lambda: s.group_quant(t.xg, t.qg, t.sg, GROUP_QUANT_SIZE,
                                                                              False)),
        "silu_and_mul into out": ("silu_and_mul", lambda: s.silu_and_mul(t.xa, t.oa)),
        "gelu_tanh_and_mul into out": ("gelu_tanh_and_mul", lambda: s.gelu_tanh_and_mul(t.xa, t.oa)),
    }
    if s.rmsnorm_module is not None:
        bare = s.rmsnorm_module(4096, torch.bfloat16)
        fns["rmsnorm into out, bare module call", "sglang"] = lambda: bare.rmsnorm(t.x, t.w, t.out, EPS)
    fns.update({(op, "sglang"): fn for op, (attr, fn) in sglang.items() if getattr(s, attr) is not None})
    return fns


def bench_host(sgl: Sglang | None) -> list[str]:
    """Eager per-call cost of the same work through each library, in one process, in grad mode
    and under inference mode (a server's forward pass: inference mode, inference tensors)."""
    grad = common.host_us({f"{op}|{lib}": fn for (op, lib), fn in host_calls(sgl, host_tensors()).items()},
                          rounds=41)
    with torch.inference_mode():
        inference = common.host_us({f"{op}|{lib}": fn for (op, lib), fn in host_calls(sgl, host_tensors()).items()},
                                   rounds=41)
    rows = []
    for key in dict.fromkeys(grad):
        op, lib = key.split("|")
        if lib != "kernkit":
            continue
        for mode, us in (("grad", grad), ("inference", inference)):
            kk, sg = us[key], us.get(f"{op}|sglang", float("nan"))
            rows.append([op, mode, kk, sg, kk / sg])
    return ["## eager host cost per call (us; best of 41 rounds of 2000 calls)", "",
            "grad: torch's default mode; inference: under `torch.inference_mode()`, on tensors made there.", "",
            *common.markdown_table(["call", "mode", "kernkit", "sglang", "kernkit / sglang"], rows), ""]


def shape_counts(g: Grids) -> dict[str, int]:
    """Shapes per grid section (each timed once per method)."""
    return {"rmsnorm": len(g.norm_hiddens) * len(g.norm_tokens), "fusedadd": len(g.norm_hiddens) * len(g.norm_tokens),
            "store": len(g.store_row_bytes) * len(g.store_tokens),
            "rope": len(g.rope_heads) * 2 * len(g.rope_tokens),
            "qknorm": len(g.qknorm_head_dims) * len(g.qknorm_gqa) * len(g.qknorm_kv_heads) * len(g.qknorm_tokens),
            "ropestore": len(g.rope_store_heads) * 2 * len(g.rope_tokens),
            "groupquant": len(GROUP_QUANT_FLAGS) * len(g.group_quant_hiddens) * len(g.group_quant_tokens),
            "act": len(ACTS) * len(g.act_ds) * len(g.act_tokens)}


def device_tag() -> str:
    """``h100``, ``h200``, ... from the GPU's name, for the results file's name."""
    match = re.search(r"\b([a-z]\d{2,3})\b", torch.cuda.get_device_name().lower())
    return match.group(1) if match else "gpu"


def save(out_dir: Path | None, name: str, lines: list[str]) -> None:
    """The report so far, so that a run cut short keeps what it measured."""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the results here (default: print only)")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma list of " + ", ".join(SECTIONS))
    p.add_argument("--quick", action="store_true", help="the thinned grids (QUICK): about a quarter of the shapes")
    p.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    p.add_argument("--dry-run", action="store_true", help="import sglang, list the grids and exit (no GPU needed)")
    args = p.parse_args()
    parts = args.only.split(",")
    unknown = sorted(set(parts) - set(SECTIONS))
    if unknown:
        p.error(f"unknown sections {', '.join(unknown)}: choose from {', '.join(SECTIONS)}")
    g = QUICK if args.quick else FULL
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("bench_sglang: needs a CUDA GPU (--dry-run imports sglang and lists the grids without one)")
    sgl = load_sglang()
    found = f"sglang {sgl.version} (`{sgl.package}`)" if sgl is not None else "not importable"
    if args.dry_run:
        counts = shape_counts(g)
        print(f"sglang: {found}")
        for part in parts:
            print(f"{part}: " + (f"{counts[part]} shapes" if part in counts else "one row per op and mode"))
        return
    common.allow_recompiles(256)
    t0 = time.perf_counter()
    built = build_sglang(sgl, parts, g) if sgl is not None else 0.0
    name = f"sglang-{device_tag()}-{datetime.date.today().isoformat()}.md"
    lines = common.header("kernkit beside sglang's JIT kernels", common.command_line())
    lines += [f"- device copy bandwidth: {common.copy_bandwidth_tbs():.3f} TB/s",
              f"- sglang: {found}" + (f"; its JIT modules for these grids loaded in {built:.1f} s"
                                      if sgl is not None else ""),
              *(f"- {note}" for note in (sgl.notes if sgl is not None else [])),
              f"- grids: {'quick' if args.quick else 'full'}", ""]
    print("\n".join(lines), flush=True)
    benches = {"host": lambda: bench_host(sgl), "rmsnorm": bench_rmsnorm, "fusedadd": bench_fused_add_rmsnorm,
               "rope": bench_rotary_embedding, "qknorm": bench_qknorm, "ropestore": bench_rope_store,
               "store": bench_store_cache, "groupquant": bench_group_quant, "act": bench_act}
    took = []
    for part in (s for s in SECTIONS if s in parts):
        t1 = time.perf_counter()
        section = benches[part]() if part == "host" else benches[part](sgl, not args.no_compile, g)
        took.append(f"{part} {time.perf_counter() - t1:.0f} s")
        lines += section
        print("\n".join(section), flush=True)
        save(args.out, name, lines + [f"Run time so far: {', '.join(took)}.", ""])
    lines += [f"Run time: {time.perf_counter() - t0:.0f} s ({', '.join(took)}; sglang's builds {built:.0f} s).", ""]
    save(args.out, name, lines)
    if args.out is not None:
        print(f"wrote {args.out / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
