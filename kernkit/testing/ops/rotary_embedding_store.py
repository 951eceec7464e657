"""``rotary_embedding_store``'s test material: its torch reference, hash cases and invalid
calls."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import BAD_INDEX_DTYPES, SHARED, Bad, meta, neg_bit, requires_grad
from kernkit.testing.ops import rotary_embedding as rope
from kernkit.testing.ops import store_cache as store

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32

i32, i64 = torch.int32, torch.int64


def ref_rotary_embedding_store(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               out_loc: torch.Tensor, is_neox: bool = True, head_dim: int | None = None) -> None:
    """``rotary_embedding`` of q and k, then ``store_cache`` of the rotated k and of v at
    ``out_loc``. In place."""
    rope.ref_rotary_embedding(positions, q, k, cos_sin_cache, is_neox, head_dim)
    store.ref_store_cache(k_cache, v_cache, out_loc, k, v)


def rope_store_case(dtype: torch.dtype, head_dim: int, rot_dim: int, is_neox: bool, n: int, q_heads: int,
                    k_heads: int, index_dtype: torch.dtype, *, pool: int = 600, layout: str = "2d") -> Case:
    """``rotary_embedding_store`` of ``n`` tokens into ``[pool, k_heads * head_dim]`` caches, with
    out-of-range positions and cache rows mixed in (``case_indices``; the positions in the cache's
    300 rows). ``layout``: ``2d`` separate q, k and v; ``fused``: q, k and v are column slices of
    one QKV buffer and the caches ``kv[:, 0]`` and ``kv[:, 1]`` of one ``[pool, 2, k_heads,
    head_dim]`` buffer (3-d, strided rows), each hashed whole; ``offset``: 3-d q, k and v start one
    element into their buffers (the scalar variant). The caches start as random finite values."""
    name = (f"rotary_embedding_store/{SHORT[dtype]}-d{head_dim}-r{rot_dim}-{'neox' if is_neox else 'gptj'}"
            f"-q{q_heads}k{k_heads}-{SHORT[index_dtype]}-n{n}-{layout}")

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        cache = rope.rope_cache(rot_dim, 300, torch.float32)
        pos = store.case_indices(min(n, 300), 300, index_dtype, gen).repeat(n // 300 + 1)[:n]
        loc = store.case_indices(n, pool, index_dtype, gen)
        qs, ks = q_heads * head_dim, k_heads * head_dim
        if layout == "fused":
            bufs = {"qkv": rope.rope_input((n, qs + 2 * ks), dtype, gen),
                    "kv": rope.rope_input((pool, 2, ks), dtype, gen)}
        else:
            extra = 1 if layout == "offset" else 0
            bufs = {name: rope.rope_input((n * w + extra,), dtype, gen)
                    for name, w in (("q", qs), ("k", ks), ("v", ks))}
            bufs.update(k_cache=rope.rope_input((pool, ks), dtype, gen),
                        v_cache=rope.rope_input((pool, ks), dtype, gen))

        def views(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            if layout == "fused":
                qkv, kv = b["qkv"], b["kv"].view(pool, 2, k_heads, head_dim)
                return qkv[:, :qs], qkv[:, qs : qs + ks], qkv[:, qs + ks :], kv[:, 0], kv[:, 1]
            start = 1 if layout == "offset" else 0
            heads = [b[name][start:].view(n, h, head_dim)
                     for name, h in (("q", q_heads), ("k", k_heads), ("v", k_heads))]
            return (*heads, b["k_cache"], b["v_cache"])

        ref = {key: t.clone() for key, t in bufs.items()}
        q, k, v, kc, vc = views(ref)
        ref_rotary_embedding_store(pos, q, k, v, cache, kc, vc, loc, is_neox, head_dim)
        dev = {key: to_device(t, device) for key, t in bufs.items()}
        q, k, v, kc, vc = views(dev)
        ops.rotary_embedding_store(to_device(pos, device), q, k, v, to_device(cache, device), kc, vc,
                                   to_device(loc, device), is_neox, head_dim=head_dim)
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "rope/rotary_embedding_store.cuh", run)


def hash_cases() -> list[Case]:
    """rope's builds (``hash_cases``) with the store: Llama-3 heads at decode and prefill sizes,
    a fused QKV tensor with 3-d strided caches, partial rotary, and the scalar variant."""
    return [
        rope_store_case(bf16, 128, 128, True, 0, 32, 8, i64),
        rope_store_case(bf16, 128, 128, True, 7, 32, 8, i64),
        rope_store_case(bf16, 128, 128, True, 513, 8, 2, i32, layout="fused"),
        rope_store_case(fp16, 64, 64, False, 33, 8, 2, i64, layout="fused"),
        rope_store_case(fp32, 64, 32, False, 33, 3, 1, i32),
        rope_store_case(fp16, 10, 6, True, 37, 3, 1, i64, layout="offset"),
    ]


def _kv_cache_shape(p: dict, rank: int | None = None, pool: int | None = None) -> tuple[int, ...]:
    pool = p["pool"] if pool is None else pool
    return rope.heads_shape(dict(p, n=pool), p["k_heads"], p["cache_rank"] if rank is None else rank)


def _kv_cache_bad(arg: str) -> list[Bad]:
    """The bad K or V caches: ``rows::verify_rows`` with k's heads and head_dim."""
    return [
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["pool"] * p["k_heads"] * p["head_dim"],),
                                                             (p["pool"], p["k_heads"], 1, p["head_dim"]), ()])),
                                     p["dtype"])),
        Bad(arg, "dtype unlike q's", TypeError,
            lambda a, p, d: a.tensor(_kv_cache_shape(p), d.draw(st.sampled_from(
                [rope.rope_other_float(p), torch.int16, torch.float64])))),
        Bad(arg, "row unlike k's", ValueError,
            lambda a, p, d: a.tensor((p["pool"], (p["k_heads"] + d.draw(st.sampled_from([1, 2]))) * p["head_dim"]),
                                     p["dtype"])),
        Bad(arg, "heads unlike k's (3-d)", ValueError,
            lambda a, p, d: a.tensor((p["pool"], 2 * p["k_heads"], p["head_dim"] // 2), p["dtype"])),
        Bad(arg, "non-contiguous row", ValueError,
            lambda a, p, d: a.tensor(_kv_cache_shape(p), p["dtype"], d.draw(st.sampled_from(["step2", "transposed"])))),
        Bad(arg, "overlapping rows (expand)", ValueError,
            lambda a, p, d: a.tensor(_kv_cache_shape(p, pool=max(p["pool"], 2)), p["dtype"], "expand")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta(_kv_cache_shape(p), p["dtype"])),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, 3]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(_kv_cache_shape(p), p["dtype"]))),
        Bad(arg, "requires grad", RuntimeError,
            requires_grad(lambda a, p, d: a.tensor(_kv_cache_shape(p), p["dtype"]))),
    ]


# v is only read: grad and inference flags do not matter, and an expanded v (heads or tokens
# repeating memory) is a valid call.
ROPE_STORE_BAD = rope.ROPE_BAD + [
    b for b in rope.heads_bad("v") if b.what not in ("requires grad", "inference tensor", "overlapping heads (expand)")
] + [
    Bad("v", "heads unlike k's", ValueError,
        lambda a, p, d: a.tensor(rope.heads_shape(p, p["k_heads"] + 1, 3), p["dtype"])),
    Bad("out_loc", "dtype", TypeError, lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
    Bad("out_loc", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["loc_dtype"])),
    Bad("out_loc", "tokens differ", ValueError,
        lambda a, p, d: a.tensor((p["n"] + d.draw(st.sampled_from([1, 2])),), p["loc_dtype"])),
    Bad("out_loc", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((max(p["n"], 2),), p["loc_dtype"], "step2")),
    Bad("out_loc", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["loc_dtype"])),
    Bad("out_loc", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 2]))),
    Bad("out_loc", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"],), p["loc_dtype"]))),
    Bad("k_cache", f"{SHARED}: bytes of q", ValueError,
        lambda a, p, d: a.alias(p["args"]["q"], _kv_cache_shape(p, 2), p["dtype"])),
    Bad("v_cache", f"{SHARED}: bytes of the K cache", ValueError,
        lambda a, p, d: a.alias(p["args"]["k_cache"], _kv_cache_shape(p, 2), p["dtype"],
                                d.draw(st.sampled_from([0, 1])))),
    Bad("k_cache", f"{SHARED}: bytes of v", ValueError,
        lambda a, p, d: a.alias(p["args"]["v"], _kv_cache_shape(p, 2), p["dtype"])),
    Bad("out_loc", f"{SHARED}: bytes of the V cache", ValueError,
        lambda a, p, d: a.alias(p["args"]["v_cache"], (p["n"],), p["loc_dtype"])),
    Bad("v", f"{SHARED}: bytes of k", ValueError,
        lambda a, p, d: a.alias(p["args"]["k"], rope.heads_shape(p, 1, p["v_rank"]), p["dtype"])),
] + _kv_cache_bad("k_cache") + _kv_cache_bad("v_cache")
