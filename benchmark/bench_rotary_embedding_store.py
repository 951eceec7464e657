"""Benchmark kernkit.ops.rotary_embedding_store on the GPU against the same rotation and KV-cache
store in torch, eager and under torch.compile: CUDA-graph time per call and achieved bandwidth,
for the heads of Llama-3-8B (32 q heads, 8 kv heads, head_dim 128), full rotary, neox pairing,
1 to 16384 tokens, written into K and V caches of a pool of 2**20 rows.

    python benchmark/bench_rotary_embedding_store.py --out DIR [--dtype bf16] [--tokens 1,16,...] [--pool 1048576]

Bytes counted per call, each once: q and k read and written, v read, the rotated k and v written
to the caches, the positions and cache rows (int64) read and one fp32 cos/sin row per token read
(2 x tokens x (q_heads + kv_heads) x head_dim + 3 x tokens x kv_heads x head_dim elements, plus
tokens x (16 + 4 x head_dim) bytes). Inputs (q, k, v, positions, cache rows) are rotated over
enough buffers that each graph touches more than the L2 holds; each call writes distinct random
rows of the caches, which are shared, as in a model, and larger than the L2. The torch function
rotates in fp32 (rounded once) and stores with ``index_copy_``. The kernel is first checked bit
for bit against the torch reference (``ref_rotary_embedding_store`` of
``kernkit.testing.ops.rotary_embedding_store``) and against the torch function timed below;
without a GPU the script only runs that check, on CPU tensors through the emulator. Measures and
reports; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit.ops import rotary_embedding_store

#: name: (q heads, kv heads, head_dim)
MODELS = {"llama3-8b": (32, 8, 128)}
MAX_POS = 8192
POOL = 2**20


def torch_rope_store(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor) -> None:
    """The rotation and the store in torch ops (neox pairing, full rotary, in place): gather the
    cos/sin rows, rotate every head of q and k in fp32, write them back, then copy each token's
    rotated k and its v to row ``out_loc[i]`` of the caches."""
    half = cache.shape[1] // 2
    cos, sin = cache.index_select(0, positions).float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for x in (q, k):
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    k_cache.index_copy_(0, out_loc, k.flatten(1))
    v_cache.index_copy_(0, out_loc, v.flatten(1))


def make_cache(rot_dim: int, device: str) -> torch.Tensor:
    """``[MAX_POS, rot_dim]`` fp32: cos of position x 10000**(-2i/rot_dim), then sin."""
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    ang = torch.arange(MAX_POS, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).float().to(device)


def check(device: str, dtype: torch.dtype) -> None:
    """``rotary_embedding_store`` against the reference and against ``torch_rope_store`` on fresh
    random inputs of each model's heads, into caches of random rows (the rows not written are
    compared too); exits on a mismatch."""
    from kernkit.testing.ops import rotary_embedding_store as ref
    pool = 64
    for name, (hq, hk, d) in MODELS.items():
        cache = make_cache(d, "cpu")
        for tokens in (1, 7, 33):
            want = {"q": torch.randn(tokens, hq, d).to(dtype), "k": torch.randn(tokens, hk, d).to(dtype),
                    "v": torch.randn(tokens, hk, d).to(dtype), "k_cache": torch.randn(pool, hk * d).to(dtype),
                    "v_cache": torch.randn(pool, hk * d).to(dtype)}
            positions = torch.randint(0, MAX_POS, (tokens,))
            out_loc = torch.randperm(pool)[:tokens]
            got = {key: t.clone().to(device) for key, t in want.items()}  # copies also on the CPU
            th = {key: t.clone().to(device) for key, t in want.items()}
            args = (positions.to(device), got["q"], got["k"], got["v"], cache.to(device), got["k_cache"],
                    got["v_cache"], out_loc.to(device))
            rotary_embedding_store(*args)
            ref.ref_rotary_embedding_store(positions, want["q"], want["k"], want["v"], cache, want["k_cache"],
                                           want["v_cache"], out_loc)
            torch_rope_store(args[0], th["q"], th["k"], th["v"], args[4], th["k_cache"], th["v_cache"], args[7])
            for key in want:
                if not torch.equal(got[key].cpu(), want[key]):
                    sys.exit(f"rotary_embedding_store: wrong {key} for {name}, {tokens} tokens on {device}")
                if not torch.equal(got[key], th[key]):
                    sys.exit(f"rotary_embedding_store: {key} differs from the torch function for {name}, "
                             f"{tokens} tokens on {device}")
    print(f"checked rotary_embedding_store against the torch reference on {device}", flush=True)


def time_model(name: str, tokens_list: list[int], dtype: torch.dtype, pool: int,
               ceiling: float) -> tuple[list, dict]:
    hq, hk, d = MODELS[name]
    cache = make_cache(d, "cuda")
    kc = torch.zeros(pool, hk * d, device="cuda", dtype=dtype)
    vc = torch.zeros_like(kc)
    compiled = torch.compile(torch_rope_store, dynamic=False)
    rows: list[list] = []
    series: dict[str, list[float]] = {}
    for tokens in tokens_list:
        e = dtype.itemsize
        per_call = 2 * tokens * (hq + hk) * d * e + 3 * tokens * hk * d * e + tokens * (16 + 4 * d)
        calls = common.calls_for(per_call, max_calls=200)
        qs = torch.randn(calls, tokens, hq, d, device="cuda").to(dtype)
        ks = torch.randn(calls, tokens, hk, d, device="cuda").to(dtype)
        vs = torch.randn(calls, tokens, hk, d, device="cuda").to(dtype)
        ps = torch.randint(0, MAX_POS, (calls, tokens), device="cuda")
        ls = torch.stack([torch.randperm(pool, device="cuda")[:tokens] for _ in range(calls)])
        fns = {
            "kernkit": lambda c, ps=ps, qs=qs, ks=ks, vs=vs, ls=ls: rotary_embedding_store(
                ps[c], qs[c], ks[c], vs[c], cache, kc, vc, ls[c]),
            "torch eager": lambda c, ps=ps, qs=qs, ks=ks, vs=vs, ls=ls: torch_rope_store(
                ps[c], qs[c], ks[c], vs[c], cache, kc, vc, ls[c]),
            "torch.compile": lambda c, ps=ps, qs=qs, ks=ks, vs=vs, ls=ls: compiled(
                ps[c], qs[c], ks[c], vs[c], cache, kc, vc, ls[c]),
        }
        rows.append(common.bandwidth_row(f"{name} tokens={tokens:>6}", [tokens], common.graph_times_us_by(fns, calls),
                                         per_call, ceiling, series))
        del qs, ks, vs, ps, ls, fns
        torch.cuda.empty_cache()
    return rows, series


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--tokens", default="1,16,64,256,1024,4096,16384")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--pool", type=int, default=POOL, help="rows of the K and V caches (at least the most tokens)")
    p.add_argument("--models", default=",".join(MODELS))
    args = p.parse_args()
    dtype = common.DTYPES[args.dtype]
    gpu = torch.cuda.is_available()
    check("cuda" if gpu else "cpu", dtype)
    if not gpu:
        print("no CUDA GPU: checked the kernel on the CPU emulator; the timings need a GPU")
        return

    common.allow_recompiles()
    args.out.mkdir(parents=True, exist_ok=True)
    ceiling = common.copy_bandwidth_tbs()
    print(f"device copy bandwidth: {ceiling:.3f} TB/s", flush=True)
    tokens_list = [int(x) for x in args.tokens.split(",")]
    pool = max(args.pool, *tokens_list)
    q = torch.randn(16, 32, 128, device="cuda").to(dtype)
    k = torch.randn(16, 8, 128, device="cuda").to(dtype)
    v = torch.randn_like(k)
    kc = torch.zeros(4096, 8 * 128, device="cuda", dtype=dtype)
    vc = torch.zeros_like(kc)
    positions = torch.arange(16, device="cuda")
    loc = torch.randperm(4096, device="cuda")[:16]
    cache = make_cache(128, "cuda")
    host = common.host_us({"rope_store": lambda: rotary_embedding_store(positions, q, k, v, cache, kc, vc, loc)},
                          rounds=7)["rope_store"]

    lines = common.header(f"rotary_embedding_store ({args.dtype}, fp32 cos/sin cache, neox)", common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s (bytes read + written), measured in this run",
              f"- host cost per rotary_embedding_store call (16 tokens, Llama-3-8B heads): {host:.2f} us",
              "- bytes per call: q and k read + written, v read, k and v written to the caches, positions, cache "
              "rows and one cos/sin row per token read",
              f"- K and V caches of {pool} rows each; every call writes distinct random rows", ""]
    for name in args.models.split(","):
        rows, series = time_model(name, tokens_list, dtype, pool, ceiling)
        hq, hk, d = MODELS[name]
        lines += [f"## {name}: {hq} q heads, {hk} kv heads, head_dim {d}", ""]
        lines += common.markdown_table(["tokens", *common.BANDWIDTH_COLUMNS], rows) + [""]
        common.plot_bandwidth(args.out / f"rope_store_{name}_{args.dtype}.png",
                              f"rotary_embedding_store {name} {args.dtype}", [r[0] for r in rows], series, ceiling)
    common.write_report(args.out, f"rotary_embedding_store_{args.dtype}.md", lines)


if __name__ == "__main__":
    main()
