"""kernkit's demo: JIT-compile every shipped op, run each on a small case, and check it against
a plain torch computation.

On a GPU machine the ops run on the GPU. Without one, the same kernel templates run on CPU
tensors through the CPU emulator, whose builds also compile their kernels for a GPU (compile
only: ``docs/emulator.md``, "The GPU check"), which proves those build too. Everything the cases
need is built first, in parallel, as ``python -m kernkit.jit warmup`` builds.

Each op prints one line: what it ran and its largest error against torch, in units in the last
place (ulp) of the result's dtype (1 for an integer). The tolerance is the one the op's tests
use: exact for the copies (``store_cache``, ``indexing``), ``scale``, ``compare_key``, the fp8
quantizations and rope, whose docstrings promise torch's bits; the stated bound against float64
for the activations (0.51 ulp for bfloat16, 0.53 for float16) and for the norms
(``(u + 128 * 2**-24) |ref|`` plus the smallest subnormal, ``u`` the dtype's unit roundoff). The
demo exits 1 if an op disagrees with torch.

Run: ``python -m kernkit.demo``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn


@dataclass(frozen=True)
class Case:
    """One op on one small input: ``run(device)`` calls the op and the torch computation and
    returns the error of each result element in ulps and what each may be (``allowed``, a number
    or a tensor of the error's shape)."""

    op: str
    what: str
    dtype: torch.dtype
    run: Callable[[str], tuple[torch.Tensor, torch.Tensor | float]]
    #: The model shape of the op's ``specializations`` (what ``warmup --set`` gives).
    shape: dict = field(default_factory=dict)
    tolerance: str = "exact"


# ----- errors in ulps


def ulp(want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at each value of ``want`` (float64); the
    smallest subnormal below the normal range; 1 for an integer dtype."""
    if not dtype.is_floating_point:
        return torch.ones_like(want, dtype=torch.float64)
    fi = torch.finfo(dtype)
    exponent = torch.frexp(want.double().abs().clamp_min(fi.smallest_normal)).exponent
    return torch.ldexp(torch.full_like(want, fi.eps, dtype=torch.float64), exponent - 1)


def ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``|got - want|`` per element, in ulps of ``got``'s dtype at ``want``."""
    want = want.double().cpu()
    return (got.double().cpu() - want).abs() / ulp(want, got.dtype)


def errors(*pairs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The errors (``ulps``) of several results, as one flat tensor."""
    return torch.cat([ulps(got, want).flatten() for got, want in pairs])


def randn(*shape: int, dtype: torch.dtype, device: str, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)


# ----- the cases: the op, then the same thing in torch


def store_cache(device: str):
    from kernkit.ops import store_cache

    pool, n = 1024, 37
    k_cache, v_cache = (randn(pool, 8, 128, dtype=bf16, device=device, seed=s) for s in (1, 2))
    k, v = (randn(n, 8, 128, dtype=bf16, device=device, seed=s) for s in (3, 4))
    rows = torch.randperm(pool, generator=torch.Generator().manual_seed(5))[:n].to(torch.int32)
    rows[5] = -1  # padding: never written
    rows = rows.to(device)
    kc, vc = k_cache.clone(), v_cache.clone()
    store_cache(kc, vc, rows, k, v)
    keep = rows >= 0
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k[rows[keep].long()] = k[keep]
    want_v[rows[keep].long()] = v[keep]
    return errors((kc, want_k), (vc, want_v)), 0


def indexing(device: str):
    from kernkit.ops import indexing

    weight = randn(400, 256, dtype=fp16, device=device, seed=1)  # ids [300, 700) of a 1000-row vocabulary
    ids = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(2), dtype=torch.int32).to(device)
    got = indexing(weight, ids, vocab_range=(300, 400))
    local = ids.long() - 300
    inside = (local >= 0) & (local < 400)
    want = torch.where(inside[:, None], F.embedding(local.clamp(0, 399), weight), 0)
    return errors((got, want)), 0


def scale(device: str):
    from kernkit.ops import scale

    x = randn(4099, dtype=fp32, device=device, seed=1)
    return errors((scale(x, 0.75), x * 0.75)), 0


def compare_key(device: str):
    from kernkit.ops import compare_key

    a = torch.randint(0, 50_000, (10_000,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    b = a.clone()
    b[7777] += 1
    got = torch.tensor([compare_key(a, b), compare_key(a, a[:123])])
    return errors((got, torch.tensor([7777, 123]))), 0


def per_token_quant_fp8(device: str):
    from kernkit.ops import per_token_quant_fp8

    x = randn(37, 1000, dtype=bf16, device=device, seed=1, scale=3.0)
    q, scales = per_token_quant_fp8(x)
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    want_scales = amax / torch.full_like(amax, 448.0)  # an IEEE division, as the kernel's
    want_q = (x.float() / want_scales).clamp(-448, 448).to(fp8)
    return errors((q, want_q.float()), (scales, want_scales)), 0


def per_token_group_quant_fp8(device: str):
    from kernkit.ops import per_token_group_quant_fp8

    x = randn(37, 7 * 128, dtype=bf16, device=device, seed=1, scale=3.0)
    q, scales = per_token_group_quant_fp8(x, 128)
    groups = x.float().view(37, 7, 128)
    amax = groups.abs().amax(dim=-1).clamp_min(1e-10)  # eps 1e-10, the op's default
    want_scales = amax / torch.full_like(amax, 448.0)
    want_q = (groups / want_scales[:, :, None]).clamp(-448, 448).to(fp8).view(37, 7 * 128)
    return errors((q, want_q.float()), (scales, want_scales)), 0


def cos_sin_cache(rot_dim: int, device: str, positions: int = 4096) -> torch.Tensor:
    """``[positions, rot_dim]`` fp32: the cosines of position times each inverse frequency, then
    the sines."""
    inv = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    angle = torch.arange(positions, dtype=torch.float64)[:, None] * inv
    return torch.cat([angle.cos(), angle.sin()], dim=1).float().to(device)


def rotate(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """``x`` (``[tokens, heads, head_dim]``) rotated in fp32 as the ops document it: each product
    and sum rounded to fp32, then the result to ``x``'s dtype."""
    half = cache.shape[1] // 2
    cos, sin = cache[positions.long(), :half][:, None], cache[positions.long(), half:][:, None]
    pairs = (slice(0, half), slice(half, 2 * half)) if is_neox else (slice(0, 2 * half, 2), slice(1, 2 * half, 2))
    a, b = x[..., pairs[0]].float(), x[..., pairs[1]].float()
    out = x.clone()
    out[..., pairs[0]] = (a * cos - b * sin).to(x.dtype)
    out[..., pairs[1]] = (b * cos + a * sin).to(x.dtype)
    return out


def rotary_embedding(device: str):
    from kernkit.ops import rotary_embedding

    q, k = randn(11, 4, 128, dtype=bf16, device=device, seed=1), randn(11, 2, 128, dtype=bf16, device=device, seed=2)
    positions = torch.randint(0, 4096, (11,), generator=torch.Generator().manual_seed(3)).to(device)
    cache = cos_sin_cache(128, device)
    want_q, want_k = rotate(q, positions, cache, True), rotate(k, positions, cache, True)
    rotary_embedding(positions, q, k, cache, True)
    return errors((q, want_q), (k, want_k)), 0


def rotary_embedding_store(device: str):
    from kernkit.ops import rotary_embedding_store

    q, k, v = (randn(11, heads, 64, dtype=fp16, device=device, seed=s) for heads, s in ((4, 1), (2, 2), (2, 3)))
    k_cache, v_cache = (randn(64, 2, 64, dtype=fp16, device=device, seed=s) for s in (4, 5))
    positions = torch.randint(0, 4096, (11,), generator=torch.Generator().manual_seed(6)).to(device)
    out_loc = torch.randperm(64, generator=torch.Generator().manual_seed(7))[:11].to(device)
    cache = cos_sin_cache(64, device)
    want_q, want_k = rotate(q, positions, cache, False), rotate(k, positions, cache, False)
    want_kc, want_vc = k_cache.clone(), v_cache.clone()
    want_kc[out_loc], want_vc[out_loc] = want_k, v
    rotary_embedding_store(positions, q, k, v, cache, k_cache, v_cache, out_loc, False)
    return errors((q, want_q), (k, want_k), (k_cache, want_kc), (v_cache, want_vc)), 0


def rmsnorm64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last dimension, in float64."""
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def rmsnorm_allowed(want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The norm ops' stated bound at each float64 result ``want``, in ulps of ``dtype``:
    ``(u + 128 * 2**-24) |want|`` plus the smallest subnormal."""
    fi = torch.finfo(dtype)
    want = want.double().cpu()
    return ((fi.eps / 2 + 2.0**-17) * want.abs() + fi.smallest_normal * fi.eps) / ulp(want, dtype)


def norm_errors(*pairs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The errors of norm results against their float64 values, and the stated bound of each."""
    return errors(*pairs), torch.cat([rmsnorm_allowed(want, got.dtype).flatten() for got, want in pairs])


def rmsnorm(device: str):
    from kernkit.ops import rmsnorm

    x = randn(16, 1024, dtype=bf16, device=device, seed=1, scale=3.0)
    w = randn(1024, dtype=bf16, device=device, seed=2)
    return norm_errors((rmsnorm(x, w, 1e-6), rmsnorm64(x, w, 1e-6)))


def fused_add_rmsnorm(device: str):
    from kernkit.ops import fused_add_rmsnorm

    x, residual = (randn(16, 1024, dtype=bf16, device=device, seed=s) for s in (1, 2))
    w = randn(1024, dtype=bf16, device=device, seed=3)
    total = x.float() + residual.float()  # the sum in fp32: residual gets it rounded, x its norm
    want_x = rmsnorm64(total, w, 1e-6)
    fused_add_rmsnorm(x, residual, w, 1e-6)
    error, allowed = norm_errors((x, want_x))
    exact = errors((residual, total.to(bf16)))
    return torch.cat([exact, error]), torch.cat([torch.zeros_like(exact), allowed])


def qk_norm(device: str):
    from kernkit.ops import qk_norm

    q = randn(16, 8, 128, dtype=bf16, device=device, seed=1, scale=3.0)
    k = randn(16, 2, 128, dtype=bf16, device=device, seed=2)
    wq, wk = randn(128, dtype=bf16, device=device, seed=3), randn(128, dtype=bf16, device=device, seed=4)
    want_q, want_k = rmsnorm64(q, wq, 1e-6), rmsnorm64(k, wk, 1e-6)
    qk_norm(q, k, wq, wk, 1e-6)
    return norm_errors((q, want_q), (k, want_k))


def silu_and_mul(device: str):
    from kernkit.ops import silu_and_mul

    x = randn(37, 2 * 512, dtype=bf16, device=device, seed=1, scale=3.0)
    gate, up = x.double().chunk(2, dim=-1)
    return ulps(silu_and_mul(x), F.silu(gate) * up), 0.51


def gelu_and_mul(device: str):
    from kernkit.ops import gelu_and_mul

    x = randn(37, 2 * 512, dtype=fp16, device=device, seed=1, scale=3.0)
    gate, up = x.double().chunk(2, dim=-1)
    return ulps(gelu_and_mul(x), F.gelu(gate) * up), 0.53


CASES = [
    Case("store_cache", "bf16 rows [37, 8, 128] into a cache of 1024, one index -1", bf16, store_cache,
         {"num_heads": 8, "head_dim": 128}),
    Case("indexing", "fp16 64 ids, vocabulary shard [300, 700) of [400, 256]", fp16, indexing, {"hidden_size": 256}),
    Case("scale", "fp32 4099 elements x 0.75", fp32, scale),
    Case("compare_key", "int32 10000 tokens, first difference at 7777 (CPU)", torch.int32, compare_key),
    Case("per_token_quant_fp8", "bf16 [37, 1000] to fp8 e4m3, a scale per row", bf16, per_token_quant_fp8,
         {"hidden_size": 1000}),
    Case("per_token_group_quant_fp8", "bf16 [37, 896] to fp8 e4m3, a scale per 128", bf16,
         per_token_group_quant_fp8, {"group_size": 128}),
    Case("rotary_embedding", "bf16 q [11, 4, 128], k [11, 2, 128], neox", bf16, rotary_embedding, {"head_dim": 128}),
    Case("rotary_embedding_store", "fp16 q, k, v of 64, gpt-j, into caches of 64 rows", fp16,
         rotary_embedding_store, {"head_dim": 64, "is_neox": False}),
    Case("rmsnorm", "bf16 [16, 1024], eps 1e-6", bf16, rmsnorm, {"hidden_size": 1024}, "the stated bound"),
    Case("fused_add_rmsnorm", "bf16 [16, 1024] + residual, eps 1e-6", bf16, fused_add_rmsnorm,
         {"hidden_size": 1024}, "the stated bound"),
    Case("qk_norm", "bf16 q [16, 8, 128], k [16, 2, 128], eps 1e-6", bf16, qk_norm, {"head_dim": 128},
         "the stated bound"),
    Case("silu_and_mul", "bf16 [37, 2 x 512]", bf16, silu_and_mul, tolerance="0.51 ulp"),
    Case("gelu_and_mul", "fp16 [37, 2 x 512], erf", fp16, gelu_and_mul, {"approximate": "none"}, "0.53 ulp"),
]


# ----- running them


def case_builds(cases: list[Case], backend: str | None) -> list:
    """The specializations the cases load, for ``backend`` (None: the GPU's default), as
    ``warmup`` finds them: each op's ``specializations`` for the case's dtype and model shape."""
    from kernkit.cli.warmup import collect

    specs = []
    for case in cases:
        specs += collect([case.op], {"dtypes": [case.dtype], "backend": backend, **case.shape})[0]
    return list(dict.fromkeys(specs))


def build(specs: list, what: str) -> bool:
    """Build ``specs`` in parallel (one compiler a core), printing one line, and one more per
    failure."""
    from kernkit.cli.warmup import build_all

    start = time.perf_counter()
    results = build_all(specs, progress=False)
    statuses = [status for status, _ in results]
    print(f"  {len(specs)} builds ({what}) in {time.perf_counter() - start:.1f} s: {statuses.count('built')} "
          f"compiled, {statuses.count('cached')} already cached, {statuses.count('failed')} failed", flush=True)
    for spec, (status, error) in zip(specs, results, strict=True):
        if status == "failed":
            print(f"  FAILED {spec.label}: {error}")
    return "failed" not in statuses


def check(case: Case, device: str) -> bool:
    """Run one case and print its line: the op, what it ran, its largest error and whether each
    error is within the op's tolerance."""
    try:
        error, allowed = case.run(device)
    except Exception as e:  # the demo reports every op, then fails at the end
        print(f"  {case.op:<26} {case.what:<58} FAILED: {type(e).__name__}: {e}", flush=True)
        return False
    ok = bool((error <= allowed).all())
    worst = f"max error {error.max().item() if error.numel() else 0.0:.2g} ulp"
    print(f"  {case.op:<26} {case.what:<58} {worst:<19} {'ok' if ok else 'MISMATCH'} ({case.tolerance})", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernkit.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="where to run the ops (auto: the GPU when one is visible)")
    args = parser.parse_args(argv)

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"kernkit demo: torch {torch.__version__}, running the ops on {device}")
    ok = build(case_builds(CASES, None if device == "cuda" else "emu"), f"for {device}")
    print(f"Running the {len(CASES)} shipped ops on {device} and comparing with torch:")
    ok = all([check(case, device) for case in CASES]) and ok
    print(f"all {len(CASES)} ops match torch" if ok else "SOME OPS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
