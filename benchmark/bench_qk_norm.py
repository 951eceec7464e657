"""Benchmark kernkit.ops.qk_norm on the GPU against the same per-head RMS normalization in torch,
eager and under torch.compile: CUDA-graph time per call and achieved bandwidth, for the heads of
Qwen3-8B (32 q heads, 8 kv heads, head_dim 128) and Qwen3-32B (64 q heads, 8 kv heads, head_dim
128), 1 to 16384 tokens.

    python benchmark/bench_qk_norm.py --out DIR [--dtype bf16] [--tokens 1,16,...] [--models qwen3-8b,qwen3-32b]

Bytes counted per call, each once: q and k read and written, and the two weights read
(2 x tokens x (q_heads + kv_heads) x head_dim + 2 x head_dim elements). q and k are rotated over
enough buffers that each graph touches more than the L2 holds; the weights are shared, as in a
model. torch eager and torch.compile run the same function (fp32 math, rounded once, in place);
its sum of squares is added in another order than the kernel's, so it may differ in the last
bit. The kernel is first checked bit for bit against the torch reference (``ref_qk_norm`` of
``kernkit.testing.ops.qk_norm``, the kernel's order of operations); without a GPU the script only
runs that check, on CPU tensors through the emulator. Measures and reports; asserts nothing about
speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import common

from kernkit.ops import qk_norm

EPS = 1e-6
#: name: (q heads, kv heads, head_dim)
MODELS = {"qwen3-8b": (32, 8, 128), "qwen3-32b": (64, 8, 128)}


def torch_qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                  eps: float = EPS) -> None:
    """The torch function timed eagerly and compiled: in place, rmsnorm of every head of q and of
    k (the last dimension), fp32 math, rounded once."""
    for x, w in ((q, q_weight), (k, k_weight)):
        xf = x.float()
        x.copy_(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float())


def qkv_views(qkv: torch.Tensor, hq: int, hk: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[tokens, hq, d]`` and k ``[tokens, hk, d]``: strided column slices of a fused QKV tensor."""
    return qkv[:, : hq * d].view(-1, hq, d), qkv[:, hq * d : (hq + hk) * d].view(-1, hk, d)


def check(device: str, dtype: torch.dtype) -> None:
    """``qk_norm`` against the reference on fresh random inputs of each model's heads, as separate
    q and k tensors and as slices of one fused QKV tensor (whose v columns must stay as they
    were); exits on a mismatch."""
    from kernkit.testing.ops import qk_norm as ref
    for name, (hq, hk, d) in MODELS.items():
        for tokens in (1, 7, 33):
            wq, wk = torch.randn(d).to(dtype), torch.randn(d).to(dtype)
            q = torch.randn(tokens, hq, d).mul(3).to(dtype)
            k = torch.randn(tokens, hk, d).mul(3).to(dtype)
            qd, kd = q.clone().to(device), k.clone().to(device)  # copies also on the CPU
            qk_norm(qd, kd, wq.to(device), wk.to(device), EPS)
            ref.ref_qk_norm(q, k, wq, wk, EPS)
            if not (torch.equal(qd.cpu(), q) and torch.equal(kd.cpu(), k)):
                sys.exit(f"qk_norm: differs from the reference for {name}, {tokens} tokens on {device}")
            qkv = torch.randn(tokens, (hq + 2 * hk) * d).mul(3).to(dtype)
            qkv_d = qkv.clone().to(device)
            qk_norm(*qkv_views(qkv_d, hq, hk, d), wq.to(device), wk.to(device), EPS)
            ref.ref_qk_norm(*qkv_views(qkv, hq, hk, d), wq, wk, EPS)
            if not torch.equal(qkv_d.cpu(), qkv):
                sys.exit(f"qk_norm: differs from the reference on slices of a fused QKV tensor for {name}, "
                         f"{tokens} tokens on {device}")
    print(f"checked qk_norm against the torch reference on {device}", flush=True)


def time_model(name: str, tokens_list: list[int], dtype: torch.dtype, ceiling: float) -> tuple[list, dict]:
    """Rows of one model's table and the TB/s series of each method."""
    hq, hk, d = MODELS[name]
    wq = torch.randn(d, device="cuda").to(dtype)
    wk = torch.randn(d, device="cuda").to(dtype)
    compiled = torch.compile(torch_qk_norm, dynamic=False)
    rows: list[list] = []
    series: dict[str, list[float]] = {}
    for tokens in tokens_list:
        per_call = (2 * tokens * (hq + hk) * d + 2 * d) * dtype.itemsize
        calls = common.calls_for(per_call, max_calls=400)
        qs = torch.randn(calls, tokens, hq, d, device="cuda").to(dtype)
        ks = torch.randn(calls, tokens, hk, d, device="cuda").to(dtype)
        fns = {
            "kernkit": lambda c, qs=qs, ks=ks: qk_norm(qs[c], ks[c], wq, wk, EPS),
            "torch eager": lambda c, qs=qs, ks=ks: torch_qk_norm(qs[c], ks[c], wq, wk),
            "torch.compile": lambda c, qs=qs, ks=ks: compiled(qs[c], ks[c], wq, wk),
        }
        rows.append(common.bandwidth_row(f"{name} tokens={tokens:>6}", [tokens], common.graph_times_us_by(fns, calls),
                                         per_call, ceiling, series))
        del qs, ks, fns
        torch.cuda.empty_cache()
    return rows, series


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--tokens", default="1,16,64,256,1024,4096,16384")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
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
    q = torch.randn(16, 32, 128, device="cuda").to(dtype)
    k = torch.randn(16, 8, 128, device="cuda").to(dtype)
    w = torch.randn(128, device="cuda").to(dtype)
    host = common.host_us({"qk_norm": lambda: qk_norm(q, k, w, w, EPS)}, rounds=7)["qk_norm"]

    lines = common.header(f"qk_norm ({args.dtype})", common.command_line())
    lines += [f"- device copy bandwidth: {ceiling:.3f} TB/s (bytes read + written), measured in this run",
              f"- host cost per qk_norm call (16 tokens, Qwen3-8B heads): {host:.2f} us",
              "- bytes per call: q and k read + written, both weights read",
              f"- eps {EPS}; torch eager and torch.compile run the same function (fp32 math, rounded once, in place)",
              ""]
    for name in args.models.split(","):
        rows, series = time_model(name, tokens_list, dtype, ceiling)
        hq, hk, d = MODELS[name]
        lines += [f"## {name}: {hq} q heads, {hk} kv heads, head_dim {d}", ""]
        lines += common.markdown_table(["tokens", *common.BANDWIDTH_COLUMNS], rows) + [""]
        common.plot_bandwidth(args.out / f"qk_norm_{name}_{args.dtype}.png", f"qk_norm {name} {args.dtype}",
                              [r[0] for r in rows], series, ceiling)
    common.write_report(args.out, f"qk_norm_{args.dtype}.md", lines)


if __name__ == "__main__":
    main()
