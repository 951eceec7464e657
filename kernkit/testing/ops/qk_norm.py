"""``qk_norm``'s test material: its torch reference, hash cases and invalid calls."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import SHARED, Bad, meta, neg_bit
from kernkit.testing.ops import rmsnorm as norm
from kernkit.testing.ops import rotary_embedding as rope

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


def ref_qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                cast: bool = False) -> None:
    """In place, ``rmsnorm`` of each head of ``q`` (``[tokens, heads, head_dim]`` or
    ``[tokens, heads * head_dim]``) and of ``k``, with ``qk_norm_kernel``'s layout: 2 vectors a
    thread, or as many as keep a head inside one warp; ``cast`` is ``cast_x_before_out_mul``."""
    head_dim = q_weight.shape[0]
    vecs = head_dim * q.element_size() // 16
    target = max(2, -(-vecs // 32))
    for t, w in ((q, q_weight), (k, k_weight)):
        heads = t.unflatten(-1, (-1, head_dim)) if t.dim() == 2 else t
        norm.ref_rmsnorm(heads, heads.clone(), w, eps, target, cast)


def qk_norm_case(dtype: torch.dtype, head_dim: int, tokens: int, q_heads: int, k_heads: int, *,
                 k_2d: bool = False, cast: bool = False) -> Case:
    """``qk_norm`` of q and k sliced from one fused QKV buffer (3-d q, 3-d or 2-d k); the whole
    buffer is hashed, so v's columns must stay as they were."""
    name = (f"qk_norm/{SHORT[dtype]}-d{head_dim}-t{tokens}-q{q_heads}k{k_heads}" + ("-k2d" if k_2d else "")
            + ("-cast" if cast else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        width = (q_heads + 2 * k_heads) * head_dim
        qkv = norm.norm_input(dtype, (tokens * (q_heads + 2 * k_heads), head_dim), gen).view(tokens, width)
        wq, wk = (torch.randn(head_dim, generator=gen).to(dtype) for _ in range(2))

        def views(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            k = b[:, q_heads * head_dim:(q_heads + k_heads) * head_dim]
            return b[:, :q_heads * head_dim].view(tokens, q_heads, head_dim), (
                k if k_2d else k.view(tokens, k_heads, head_dim))

        ref, dev = qkv.clone(), to_device(qkv, device)
        ref_qk_norm(*views(ref), wq, wk, 1e-6, cast)
        ops.qk_norm(*views(dev), to_device(wq, device), to_device(wk, device), 1e-6, cast_x_before_out_mul=cast)
        return {"qkv": (dev.cpu(), ref)}

    return Case(name, "norm/qk_norm.cuh", run)


def hash_cases() -> list[Case]:
    """bf16 x 128 (8 lanes a head), fp16 x 64 (4 lanes), fp32 x 256 (16 lanes), bf16 x 1024 (a
    warp of 4 vectors a lane); bf16 x 128 and fp16 x 64 also with ``cast_x_before_out_mul``."""
    return [
        qk_norm_case(bf16, 128, 0, 8, 1),
        qk_norm_case(bf16, 128, 1, 8, 1),
        qk_norm_case(bf16, 128, 37, 16, 2, k_2d=True),
        qk_norm_case(fp16, 64, 9, 4, 4),
        qk_norm_case(fp32, 256, 5, 3, 1, k_2d=True),
        qk_norm_case(bf16, 1024, 3, 2, 1),
        qk_norm_case(bf16, 128, 37, 16, 2, k_2d=True, cast=True),
        qk_norm_case(fp16, 64, 9, 4, 4, cast=True),
    ]


QK_DIM = 64  # fp16 x 64: one build; the bad dtypes and head sizes never reach a build


def _qk_heads_bad(arg: str) -> list[Bad]:
    """``rope.heads_bad``, and the 16-byte alignment qk_norm's vectors need (rope takes any)."""
    return rope.heads_bad(arg) + [
        Bad(arg, "misaligned", ValueError,
            lambda a, p, d: a.tensor(rope.heads_shape(p, p[f"{arg}_heads"], p[f"{arg}_rank"],
                                                      max(p["n"], 2) if arg == "q" else None),
                                     fp16, d.draw(st.sampled_from(["offset", "padded"])))),
    ]


def _qk_weight_bad(arg: str) -> list[Bad]:
    # q_weight's length picks the build: a length without one is refused naming it; a supported
    # one other than q's head_dim names q (its heads), so k_weight carries the wrong-length kind.
    lengths = [96, 32, 0] if arg == "q_weight" else [QK_DIM // 2, 2 * QK_DIM]
    return [
        Bad(arg, "length", ValueError, lambda a, p, d: a.tensor((d.draw(st.sampled_from(lengths)),), fp16)),
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(1, QK_DIM), (2, QK_DIM)])), fp16)),
        Bad(arg, "dtype", TypeError,
            lambda a, p, d: a.tensor((QK_DIM,), d.draw(st.sampled_from([bf16, fp32, torch.int16, torch.bool])))),
        Bad(arg, "non-contiguous", ValueError, lambda a, p, d: a.tensor((QK_DIM,), fp16, "step2")),
        Bad(arg, "misaligned start", ValueError, lambda a, p, d: a.tensor((QK_DIM,), fp16, "offset")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta((QK_DIM,), fp16)),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1.0] * QK_DIM, 1.0]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((QK_DIM,), fp16))),
        Bad(arg, f"{SHARED}: bytes of k", ValueError,
            lambda a, p, d: a.alias(p["args"]["k"], (QK_DIM,), fp16, d.draw(st.sampled_from([0, 8, 64])))),
    ]


QK_NORM_BAD = _qk_heads_bad("q") + _qk_heads_bad("k") + _qk_weight_bad("q_weight") + _qk_weight_bad("k_weight") + [
    Bad("k", f"{SHARED}: bytes of q", ValueError,
        lambda a, p, d: a.alias(p["args"]["q"], rope.heads_shape(p, 1, p["k_rank"]), fp16,
                                d.draw(st.sampled_from([0, 8, 32])))),  # inside q and its guard bytes
    Bad("eps", "negative or not finite", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([-1e-6, -1.0, float("nan"), float("inf"), 1e300]))),
    Bad("eps", "not a number", TypeError, lambda a, p, d: d.draw(st.sampled_from(["1e-6", None, [1e-6], 1j]))),
]
