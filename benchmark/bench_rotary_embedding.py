"""Benchmark kernkit.ops.rotary_embedding on the GPU against a torch implementation of the same
rotation, eager and under torch.compile: CUDA-graph time per call and achieved bandwidth, for the
heads of Llama-3-8B (32 q heads, 8 kv heads, head_dim 128) and Qwen3 (64 q heads, 8 kv heads,
head_dim 128), full rotary, neox pairing, 1 to 16384 tokens.

    python benchmark/bench_rotary_embedding.py --out DIR [--dtype bf16] [--tokens 1,16,64] [--cache-dtype fp32]

Bytes counted per call, each once: the rotated part of q and k read and written, the positions
read and one cache row per token read. Inputs (q, k, positions) are rotated over enough buffers
that each graph touches more than the L2 holds; the cache is shared, as in a model. The kernel is
first checked against the torch reference (bit for bit) and against the torch implementation
timed below; without a GPU the script only runs that check, on CPU tensors through the emulator.
Measures and reports; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit.ops import rotary_embedding

#: name: (q heads, kv heads, head_dim)
MODELS = {"llama3-8b": (32, 8, 128), "qwen3": (64, 8, 128)}
MAX_POS = 8192


def torch_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor,
               head_dim: int) -> None:
    """The rotation in torch ops (neox pairing, in place): gather the cache rows, split cos and
    sin, rotate the first ``rot_dim`` elements of every head in fp32, write them back."""
    rot_dim = cache.shape[1]
    cos, sin = cache.index_select(0, positions).float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for x in (q, k):
        heads = x.view(x.shape[0], -1, head_dim)
        x1, x2 = heads[..., : rot_dim // 2].float(), heads[..., rot_dim // 2 : rot_dim].float()
        heads[..., :rot_dim] = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def make_cache(rot_dim: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    ang = torch.arange(MAX_POS, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(dtype).to(device)


def check(device: str, dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """``rotary_embedding`` against the reference of ``kernkit.testing.ops.rotary_embedding`` and against
    ``torch_rope`` on fresh random inputs of each model's heads; exits on a mismatch."""
    from kernkit.testing.ops import rotary_embedding as ref
    for name, (hq, hk, d) in MODELS.items():
        cache = make_cache(d, cache_dtype, device)
        for tokens in (1, 7, 33):
            q = torch.randn(tokens, hq * d, device=device).to(dtype)
            k = torch.randn(tokens, hk, d, device=device).to(dtype)
            positions = torch.randint(0, MAX_POS, (tokens,), device=device)
            want_q, want_k = q.cpu().clone(), k.cpu().clone()  # q.cpu() is q itself on the CPU
            ref.ref_rotary_embedding(positions.cpu(), want_q, want_k, cache.cpu())
            th_q, th_k = q.clone(), k.clone()
            torch_rope(positions, th_q, th_k, cache, d)
            rotary_embedding(positions, q, k, cache, head_dim=d)
            if not (torch.equal(q.cpu(), want_q) and torch.equal(k.cpu(), want_k)):
                sys.exit(f"rotary_embedding: wrong result for {name}, {tokens} tokens on {device}")
            if not (torch.equal(q, th_q) and torch.equal(k, th_k)):
                sys.exit(f"rotary_embedding: differs from the torch implementation for {name}, {tokens} tokens")
    print(f"checked rotary_embedding against the torch reference on {device}", flush=True)


def time_model(name: str, tokens_list: list[int], dtype: torch.dtype, cache_dtype: torch.dtype,
               ceiling: float) -> tuple[list, dict]:
    hq, hk, d = MODELS[name]
    cache = make_cache(d, cache_dtype, "cuda")
    compiled = torch.compile(torch_rope, dynamic=False)
    rows: list[list] = []
    series: dict[str, list[float]] = {}
    for tokens in tokens_list:
        per_call = 2 * tokens * (hq + hk) * d * dtype.itemsize + tokens * 8 + tokens * d * cache_dtype.itemsize
        calls = common.calls_for(per_call, max_calls=200)
        qs = torch.randn(calls, tokens, hq * d, device="cuda").to(dtype)
        ks = torch.randn(calls, tokens, hk * d, device="cuda").to(dtype)
        ps = torch.randint(0, MAX_POS, (calls, tokens), device="cuda")
        fns = {
            "kernkit": lambda c, ps=ps, qs=qs, ks=ks: rotary_embedding(ps[c], qs[c], ks[c], cache, head_dim=d),
            "torch eager": lambda c, ps=ps, qs=qs, ks=ks: torch_rope(ps[c], qs[c], ks[c], cache, d),
            "torch.compile": lambda c, ps=ps, qs=qs, ks=ks: compiled(ps[c], qs[c], ks[c], cache, d),
        }
        rows.append(common.bandwidth_row(f"{name} tokens={tokens:>6}", [tokens], common.graph_times_us_by(fns, calls),
                                         per_call, ceiling, series))
        del qs, ks, ps, fns
        torch.cuda.empty_cache()
    return rows, series


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--tokens", default="1,16,64,256,1024,4096,16384")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--cache-dtype", default="fp32", choices=["fp32", "q"], help="fp32, or q's dtype")
    p.add_argument("--models", default=",".join(MODELS))
    args = p.parse_args()
    dtype = common.DTYPES[args.dtype]
    cache_dtype = torch.float32 if args.cache_dtype == "fp32" else dtype
    gpu = torch.cuda.is_available()
    check("cuda" if gpu else "cpu", dtype, cache_dtype)
    if not gpu:
        print("no CUDA GPU: checked the kernel on the CPU emulator; the timings need a GPU")
        return

    common.allow_recompiles()
    args.out.mkdir(parents=True, exist_ok=True)
    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    tokens_list = [int(x) for x in args.tokens.split(",")]
    q = torch.randn(16, 32 * 128, device="cuda").to(dtype)
    k = torch.randn(16, 8 * 128, device="cuda").to(dtype)
    positions = torch.arange(16, device="cuda")
    cache = make_cache(128, cache_dtype, "cuda")
    host = common.host_us({"rope": lambda: rotary_embedding(positions, q, k, cache, head_dim=128)}, rounds=7)["rope"]

    title = f"rotary_embedding ({args.dtype}, cache {str(cache_dtype).removeprefix('torch.')})"
    lines = common.header(title, common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s",
              f"- host cost per rotary_embedding call (16 tokens, Llama-3-8B heads): {host:.2f} us",
              "- bytes per call: rotated q and k read + written, positions and one cache row per token read", ""]
    for name in args.models.split(","):
        rows, series = time_model(name, tokens_list, dtype, cache_dtype, ceiling)
        hq, hk, d = MODELS[name]
        lines += [f"## {name}: {hq} q heads, {hk} kv heads, head_dim {d}", ""]
        lines += common.markdown_table(["tokens", *common.BANDWIDTH_COLUMNS], rows) + [""]
        common.plot_bandwidth(args.out / f"rope_{name}_{args.dtype}.png", f"rotary_embedding {name} {args.dtype}",
                              [r[0] for r in rows], series, ceiling)
    common.write_report(args.out, f"rope_{args.dtype}.md", lines)


if __name__ == "__main__":
    main()
