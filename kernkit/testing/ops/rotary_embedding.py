"""``rotary_embedding``'s test material: its torch reference, hash cases and invalid calls."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import BAD_INDEX_DTYPES, SHARED, Arena, Bad, meta, neg_bit, requires_grad
from kernkit.testing.ops import store_cache as store

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32

i32, i64 = torch.int32, torch.int64

MAX_POS = 97


def _rope_heads(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                head_dim: int) -> None:
    """Rotate the heads of one of q/k in place (see ``rotary_embedding``)."""
    # head_dim is contiguous: a view, also of strided rows
    heads = x if x.dim() == 3 else x.view(x.shape[0], x.shape[1] // head_dim, head_dim)
    rot = cos_sin_cache.shape[1]
    half = rot // 2
    valid = ((positions >= 0) & (positions < cos_sin_cache.shape[0])).nonzero().squeeze(1)
    pos = positions[valid].long()
    cos = cos_sin_cache[pos, :half].float()[:, None, :]
    sin = cos_sin_cache[pos, half:].float()[:, None, :]
    first, second = (slice(0, half), slice(half, rot)) if is_neox else (slice(0, rot, 2), slice(1, rot, 2))
    rows = heads[valid]
    a, b = rows[:, :, first].float(), rows[:, :, second].float()  # fp32 rows: views of rows
    new_a, new_b = (a * cos - b * sin).to(x.dtype), (b * cos + a * sin).to(x.dtype)
    rows[:, :, first] = new_a
    rows[:, :, second] = new_b
    heads[valid] = rows


def ref_rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                         is_neox: bool = True, head_dim: int | None = None) -> None:
    """Rotary embedding of q and k in place: pairs (i, i + rot/2) with ``is_neox``, else (2i, 2i+1);
    ``x * cos - y * sin`` and ``y * cos + x * sin`` as fp32 products and one fp32 subtraction /
    addition, rounded once to the dtype. Tokens whose position is outside ``[0, max_position)``
    are left unchanged; the elements of a head after ``rot_dim`` too."""
    if head_dim is None:
        head_dim = q.shape[2] if q.dim() == 3 else cos_sin_cache.shape[1]
    for x in (q, k):
        _rope_heads(x, positions, cos_sin_cache, is_neox, head_dim)


def make_cache(rot_dim: int, dtype: torch.dtype = fp32, rows: int = MAX_POS, base: float = 10000.0) -> torch.Tensor:
    """``[rows, rot_dim]``: cos of position * inverse frequency in the first half, sin in the second."""
    inv = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    ang = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(dtype)


def rand(shape, dtype, seed) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)


def rope_cache(rot_dim: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, rot_dim]`` cos/sin of position x 10000**(-2i/rot_dim), computed in float64 and
    rounded once to ``dtype`` (on the CPU, so both devices see the same bytes)."""
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    ang = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(dtype)


def rope_input(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Finite values of several magnitudes, zeros of both signs; no NaN or infinity (a NaN's
    payload, and inf * 0, are not the same on both sides)."""
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-12, 9, shape, generator=gen).float())
    flat = x.view(-1)
    if flat.numel() >= 2:
        flat[0], flat[-1] = 0.0, -0.0
    return x.to(dtype)


def rope_case(dtype: torch.dtype, head_dim: int, rot_dim: int, is_neox: bool, n: int, q_heads: int, k_heads: int,
              pos_dtype: torch.dtype, *, cache_dtype: torch.dtype = torch.float32, max_pos: int = 300,
              layout: str = "2d") -> Case:
    """``rotary_embedding`` of ``n`` tokens, with out-of-range positions mixed in (``bad_indices``).
    ``layout``: ``2d`` / ``3d`` separate q and k; ``fused``: q and k are column slices of one
    ``[n, (q_heads + 2 k_heads) * head_dim]`` QKV buffer, hashed whole (v must stay as it was);
    ``offset``: 3-d q and k start one element into their buffers (the scalar variant)."""
    name = (f"rotary_embedding/{SHORT[dtype]}-d{head_dim}-r{rot_dim}-{'neox' if is_neox else 'gptj'}"
            f"-q{q_heads}k{k_heads}-{SHORT[pos_dtype]}-n{n}-cache_{SHORT[cache_dtype]}-{layout}")

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        cache = rope_cache(rot_dim, max_pos, cache_dtype)
        pos = store.case_indices(n, max_pos, pos_dtype, gen) if n <= max_pos else torch.randint(
            0, max_pos, (n,), generator=gen).to(pos_dtype)
        if n > max_pos:
            for p, value in zip(torch.randperm(n, generator=gen).tolist(), store.bad_indices(max_pos, pos_dtype),
                                strict=False):
                pos[p] = value
        qs, ks = q_heads * head_dim, k_heads * head_dim
        if layout == "fused":
            bufs = {"qkv": rope_input((n, qs + 2 * ks), dtype, gen)}
        elif layout == "offset":
            bufs = {"q": rope_input((n * qs + 1,), dtype, gen), "k": rope_input((n * ks + 1,), dtype, gen)}
        else:
            bufs = {"q": rope_input((n, qs), dtype, gen), "k": rope_input((n, ks), dtype, gen)}

        def views(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            if layout == "fused":
                return b["qkv"][:, :qs], b["qkv"][:, qs : qs + ks]
            if layout == "offset":
                return b["q"][1:].view(n, q_heads, head_dim), b["k"][1:].view(n, k_heads, head_dim)
            if layout == "3d":
                return b["q"].view(n, q_heads, head_dim), b["k"].view(n, k_heads, head_dim)
            return b["q"], b["k"]

        ref = {key: t.clone() for key, t in bufs.items()}
        ref_rotary_embedding(pos, *views(ref), cache, is_neox, head_dim)
        dev = {key: to_device(t, device) for key, t in bufs.items()}
        ops.rotary_embedding(to_device(pos, device), *views(dev), to_device(cache, device), is_neox,
                             head_dim=head_dim)
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "rope/rotary_embedding.cuh", run)


def hash_cases() -> list[Case]:
    """Four builds: bf16/rot 128/neox (Llama-3 heads), fp16/rot 64/gpt-j, fp32/rot 32/gpt-j
    (partial, head_dim 64) and fp16/rot 6/neox (partial, head_dim 10: the scalar variant only)."""
    return [
        rope_case(bf16, 128, 128, True, 0, 32, 8, i64),
        rope_case(bf16, 128, 128, True, 7, 32, 8, i64),
        rope_case(bf16, 128, 128, True, 513, 8, 2, i32, cache_dtype=bf16, layout="fused"),
        rope_case(bf16, 128, 128, True, 33, 4, 1, i64, layout="offset"),
        rope_case(fp16, 64, 64, False, 33, 8, 2, i64, layout="3d"),
        rope_case(fp16, 64, 64, False, 513, 2, 1, i32, cache_dtype=fp16, layout="fused"),
        rope_case(fp32, 64, 32, False, 33, 3, 1, i32),
        rope_case(fp32, 64, 32, False, 7, 2, 2, i64, layout="offset"),
        rope_case(fp16, 10, 6, True, 513, 3, 1, i64, layout="3d"),
    ]


#: (dtype, head_dim, rot_dim, is_neox): two of the builds above.
ROPE_SPECS = [(bf16, 128, 128, True), (fp32, 64, 32, False)]

ROPE_NEEDS_TWO_TOKENS = ("overlapping heads (expand)",)


@st.composite
def rope_params(draw):
    dtype, head_dim, rot_dim, is_neox = draw(st.sampled_from(ROPE_SPECS))
    return dict(
        dtype=dtype, head_dim=head_dim, rot_dim=rot_dim, is_neox=is_neox,
        n=draw(st.sampled_from([0, 1, 3, 9])),
        q_heads=draw(st.sampled_from([1, 2, 3])),
        k_heads=draw(st.sampled_from([1, 2])),
        q_rank=draw(st.sampled_from([2, 3])),
        k_rank=draw(st.sampled_from([2, 3])),
        q_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
        k_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
        pos_dtype=draw(st.sampled_from([i32, i64])),
        cache_dtype=draw(st.sampled_from(["fp32", "q"])),
        cache_layout=draw(st.sampled_from(["contiguous", "offset"])),
        max_pos=draw(st.sampled_from([1, 8, 40])),
        seed=draw(st.integers(0, 2**16)),
    )


def heads_shape(p: dict, heads: int, rank: int, n: int | None = None) -> tuple[int, ...]:
    n = p["n"] if n is None else n
    return (n, heads * p["head_dim"]) if rank == 2 else (n, heads, p["head_dim"])


def filled(a: Arena, t: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``t`` holding ``values``, remembered as its buffer's original bytes."""
    t.copy_(values)
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return t


def rope_args(a: Arena, p: dict) -> dict:
    dt, n, mp = p["dtype"], p["n"], p["max_pos"]
    out = {}
    for name, heads, rank, layout in (("q", p["q_heads"], p["q_rank"], p["q_layout"]),
                                      ("k", p["k_heads"], p["k_rank"], p["k_layout"])):
        shape = heads_shape(p, heads, rank)
        out[name] = filled(a, a.tensor(shape, dt, layout), torch.randn(shape, generator=a.gen).to(dt))
    values = torch.randint(0, mp, (n,), generator=a.gen).tolist()
    bad = [-1, mp, 2**31 - 1, -(2**31)] + ([2**32 + 1, -(2**32), 2**40] if p["pos_dtype"] == i64 else [])
    for i in range(0, n, 3):  # positions the kernel must skip
        values[i] = bad[i // 3 % len(bad)]
    positions = filled(a, a.tensor((n,), p["pos_dtype"]), torch.tensor(values, dtype=p["pos_dtype"]))
    cache_dtype = fp32 if p["cache_dtype"] == "fp32" else dt
    cache = filled(a, a.tensor((mp, p["rot_dim"]), cache_dtype, p["cache_layout"]),
                    (torch.rand(mp, p["rot_dim"], generator=a.gen) * 2 - 1).to(cache_dtype))
    return dict(positions=positions, q=out["q"], k=out["k"], cos_sin_cache=cache, is_neox=p["is_neox"],
                head_dim=p["head_dim"])


def rope_other_float(p: dict) -> torch.dtype:
    return fp16 if p["dtype"] != fp16 else bf16


def heads_bad(arg: str) -> list[Bad]:
    """The bad q or k views of rope and qk_norm, which ``rows::verify_heads`` and the op's dtype
    check refuse; ``p`` holds ``n``, ``dtype``, ``head_dim`` and the argument's heads and rank."""
    heads, rank = f"{arg}_heads", f"{arg}_rank"

    def shape(p, n=None):
        return heads_shape(p, p[heads], p[rank], n)

    out = [
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"] * p["head_dim"],), (p["n"], 1, 2, p["head_dim"]),
                                                             ()])), p["dtype"])),
        Bad(arg, "row not whole heads", ValueError,
            lambda a, p, d: a.tensor((p["n"], p[heads] * p["head_dim"] + d.draw(st.sampled_from([2, -2]))),
                                     p["dtype"])),
        Bad(arg, "head_dim differs (3-d)", ValueError,
            lambda a, p, d: a.tensor((p["n"], p[heads], p["head_dim"] * d.draw(st.sampled_from([2, 3]))),
                                     p["dtype"])),
        Bad(arg, "no heads", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 0), (p["n"], 0, p["head_dim"])])), p["dtype"])),
        Bad(arg, "non-contiguous head_dim", ValueError,  # transposed: heads and head_dim swapped, 2 heads or more
            lambda a, p, d: a.tensor(heads_shape(p, max(p[heads], 2), p[rank]), p["dtype"],
                                     d.draw(st.sampled_from(["step2", "transposed"])))),
        Bad(arg, "overlapping heads (expand)", ValueError,
            lambda a, p, d: a.tensor(shape(p), p["dtype"], "expand")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta(shape(p), p["dtype"])),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, 3, [[0.0] * 4]]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), p["dtype"]))),
        Bad(arg, "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(shape(p), p["dtype"]))),
        Bad(arg, "inference tensor", RuntimeError, lambda a, p, d: a.inference(shape(p), p["dtype"])),
    ]
    if arg == "q":  # q's dtype picks the build: a float dtype would be another build, then 'k' is named
        out.append(Bad(arg, "unsupported dtype", TypeError,
                       lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                           [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64])))))
    else:  # q binds the tokens and the dtype first
        out += [Bad(arg, "dtype unlike q's", TypeError,
                    lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                        [rope_other_float(p), torch.int32, torch.float64])))),
                Bad(arg, "tokens differ", ValueError, lambda a, p, d: a.tensor(shape(p, p["n"] + 1), p["dtype"]))]
    return out


ROPE_BAD = heads_bad("q") + heads_bad("k") + [
    # positions bind the tokens before q
    Bad("q", "tokens differ", ValueError,
        lambda a, p, d: a.tensor(heads_shape(p, p["q_heads"], p["q_rank"], p["n"] + 1), p["dtype"])),
    Bad("positions", "dtype", TypeError,
        lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
    Bad("positions", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["pos_dtype"])),
    Bad("positions", "tokens differ", ValueError,
        lambda a, p, d: a.tensor((p["n"] + d.draw(st.sampled_from([1, 2])),), p["pos_dtype"])),
    Bad("positions", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((p["n"],), p["pos_dtype"], "step2") if p["n"] > 1 else
        a.tensor((2,), p["pos_dtype"], "step2")),
    Bad("positions", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["pos_dtype"])),
    Bad("positions", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 2]))),
    Bad("positions", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"],), p["pos_dtype"]))),
    Bad("cos_sin_cache", "dtype", TypeError,
        lambda a, p, d: a.tensor((p["max_pos"], p["rot_dim"]), d.draw(st.sampled_from(
            [rope_other_float(p), torch.float64, torch.int32])))),
    Bad("cos_sin_cache", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["max_pos"] * p["rot_dim"],),
                                                          (p["max_pos"], 2, p["rot_dim"]), ()])), fp32)),
    Bad("cos_sin_cache", "odd or empty rot_dim", ValueError,
        lambda a, p, d: a.tensor((p["max_pos"], d.draw(st.sampled_from([p["rot_dim"] - 1, 0]))), fp32)),
    Bad("cos_sin_cache", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((p["max_pos"], p["rot_dim"]), fp32, d.draw(st.sampled_from(["step2", "padded"])))
        if p["max_pos"] > 1 else a.tensor((2, p["rot_dim"]), fp32, "step2")),
    Bad("cos_sin_cache", "meta tensor", ValueError, lambda a, p, d: meta((p["max_pos"], p["rot_dim"]), fp32)),
    Bad("cos_sin_cache", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0, 0.0]]]))),
    Bad("cos_sin_cache", "negative bit", ValueError,
        neg_bit(lambda a, p, d: a.tensor((p["max_pos"], p["rot_dim"]), fp32))),
    Bad("head_dim", "below rot_dim", ValueError, lambda a, p, d: p["rot_dim"] - d.draw(st.sampled_from([2, 8]))),
    Bad("head_dim", "not an int", TypeError, lambda a, p, d: d.draw(st.sampled_from(["64", 64.0, 2**64]))),
    Bad("is_neox", "not a bool", TypeError, lambda a, p, d: d.draw(st.sampled_from(["yes", None, 2.5]))),
    Bad("k", f"{SHARED}: bytes of q", ValueError,
        lambda a, p, d: a.alias(p["args"]["q"], heads_shape(p, 1, p["k_rank"]), p["dtype"],
                                d.draw(st.sampled_from([0, 1, -1, 8])))),
    Bad("q", f"{SHARED}: bytes of the cache", ValueError,
        lambda a, p, d: a.alias(p["args"]["cos_sin_cache"], heads_shape(p, 1, p["q_rank"]), p["dtype"])),
    Bad("positions", f"{SHARED}: bytes of k", ValueError,
        lambda a, p, d: a.alias(p["args"]["k"], (p["n"],), p["pos_dtype"])),
]
