"""kernkit.ops.rotary_embedding_store on CPU tensors, through the CPU emulator: bit for bit the
result of ``rotary_embedding`` followed by ``store_cache`` (kernkit's two ops, and the torch
reference of the two), over neox and gpt-j, partial rotary, 2-d and 3-d q/k/v and caches, slices
of a fused QKV tensor, strided cache rows, misaligned views, out-of-range positions and cache
rows, and every launch shape; then the errors and the custom op.

Four specializations are built, those of ``test_rotary_embedding.py``: bf16/rot 128/neox, fp16/rot
64/gpt-j, fp32/rot 32/gpt-j (head_dim 64: partial) and fp16/rot 6/neox (head_dim 10: the scalar
variant only)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.ops import registered_ops, rotary_embedding, rotary_embedding_store, store_cache
from kernkit.testing.invalid import SHARED, VALID, Arena, check_invalid, invalid_calls
from kernkit.testing.ops import rotary_embedding as rope
from kernkit.testing.ops.rotary_embedding_store import (
    ROPE_STORE_BAD,
    _kv_cache_shape,
    bf16,
    fp16,
    fp32,
    i32,
    i64,
    ref_rotary_embedding_store,
)

#: (dtype, head_dim, rot_dim, is_neox): one build each.
SPECS = [(bf16, 128, 128, True), (fp16, 64, 64, False), (fp32, 64, 32, False), (fp16, 10, 6, True)]

POOL = 23


def call(positions, q, k, v, cache, k_cache, v_cache, out_loc, is_neox, head_dim=None, pair=True):
    """The fused op, the two ops in sequence (unless not ``pair``) and the reference, each on its
    own copies; asserts they give the same bits in q, k and both caches, and returns the fused
    op's tensors."""
    def copies():
        return [t.clone() for t in (q, k, k_cache, v_cache)]

    fused, seq, ref = copies(), copies(), copies()
    rotary_embedding_store(positions, fused[0], fused[1], v, cache, fused[2], fused[3], out_loc, is_neox,
                           head_dim=head_dim)
    ref_rotary_embedding_store(positions, ref[0], ref[1], v, cache, ref[2], ref[3], out_loc, is_neox, head_dim)
    for name, a, c in zip(("q", "k", "k_cache", "v_cache"), fused, ref, strict=True):
        assert torch.equal(a, c), f"{name}: fused != reference"
    if pair:
        rotary_embedding(positions, seq[0], seq[1], cache, is_neox, head_dim=head_dim)
        n = positions.shape[0]
        as_cache = (lambda t: t.reshape(n, *k_cache.shape[1:])) if k.dim() != k_cache.dim() else (lambda t: t)
        store_cache(seq[2], seq[3], out_loc, as_cache(seq[1]), as_cache(v))
        for name, a, b in zip(("q", "k", "k_cache", "v_cache"), fused, seq, strict=True):
            assert torch.equal(a, b), f"{name}: fused != rotary_embedding + store_cache"
    return fused


def cache_rows(rows: torch.Tensor, pool: int = POOL) -> torch.Tensor:
    """Distinct in-range cache rows, one per token (as a serving engine allots them)."""
    return torch.randperm(pool, generator=torch.Generator().manual_seed(rows.numel()))[: rows.numel()]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s[0]}-d{s[1]}-r{s[2]}-{'neox' if s[3] else 'gptj'}")
@pytest.mark.parametrize("layout", ["3d", "2d"])
@pytest.mark.parametrize("cache_dtype", ["fp32", "q"])
def test_equals_rotary_embedding_then_store_cache(spec, layout, cache_dtype):
    dtype, head_dim, rot_dim, is_neox = spec
    tokens, hq, hk = 7, 4, 2
    q, k, v = rope.rand((tokens, hq, head_dim), dtype, 1), rope.rand((tokens, hk, head_dim), dtype, 2), rope.rand(
        (tokens, hk, head_dim), dtype, 3)
    k_cache = rope.rand((POOL, hk, head_dim), dtype, 4)
    v_cache = rope.rand((POOL, hk, head_dim), dtype, 5)
    if layout == "2d":
        q, k, v = (t.reshape(tokens, -1) for t in (q, k, v))
        k_cache, v_cache = (t.reshape(POOL, -1) for t in (k_cache, v_cache))
    cache = rope.make_cache(rot_dim, fp32 if cache_dtype == "fp32" else dtype)
    positions = torch.randint(rope.MAX_POS, (tokens,), generator=torch.Generator().manual_seed(6))
    out_loc = cache_rows(positions)
    q0, kc0 = q.clone(), k_cache.clone()
    q1, k1, kc1, vc1 = call(positions, q, k, v, cache, k_cache, v_cache, out_loc, is_neox, head_dim)
    assert not torch.equal(q1, q0)
    stored = out_loc.long()
    assert torch.equal(kc1[stored].reshape(tokens, -1), k1.reshape(tokens, -1))
    assert torch.equal(vc1[stored].reshape(tokens, -1), v.reshape(tokens, -1))
    untouched = torch.ones(POOL, dtype=torch.bool)
    untouched[stored] = False
    assert torch.equal(kc1[untouched], kc0[untouched])


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_out_of_range_positions_and_cache_rows_are_skipped(index_dtype):
    """A position out of range leaves q and k unrotated (and k is stored as it is); an out_loc
    entry out of range writes no cache row, while the token's q and k are still rotated."""
    bad = [-1, POOL, 2**31 - 1, -(2**31)] + ([2**32 + 3, -(2**62)] if index_dtype == torch.int64 else [])
    tokens = 2 * len(bad)
    positions = torch.tensor([rope.MAX_POS + 5 if i % 3 == 0 else i for i in range(tokens)], dtype=index_dtype)
    out_loc = torch.tensor([bad[i // 2] if i % 2 else i for i in range(tokens)], dtype=index_dtype)
    q, k, v = (rope.rand((tokens, 3, 128), bf16, 7), rope.rand((tokens, 2, 128), bf16, 8),
               rope.rand((tokens, 2, 128), bf16, 9))
    k_cache, v_cache = rope.rand((POOL, 256), bf16, 10), rope.rand((POOL, 256), bf16, 11)
    q1, k1, kc1, vc1 = call(positions, q, k, v, rope.make_cache(128), k_cache, v_cache, out_loc, True)
    skipped_pos = (positions < 0) | (positions >= rope.MAX_POS)
    assert torch.equal(k1[skipped_pos], k[skipped_pos]) and not torch.equal(k1[~skipped_pos], k[~skipped_pos])
    written = torch.zeros(POOL, dtype=torch.bool)
    written[out_loc[out_loc.ge(0) & out_loc.lt(POOL)].long()] = True
    assert torch.equal(kc1[~written], k_cache[~written]) and torch.equal(vc1[~written], v_cache[~written])


def test_fused_qkv_slices_strided_cache_rows_and_partial_rotary():
    """q, k and v as column slices of one QKV tensor (2-d, token stride > row), caches whose rows
    are slices of wider rows, rot_dim 32 of head_dim 64: the elements after rot_dim are copied."""
    tokens, hq, hk, d = 9, 4, 2, 64
    qkv = rope.rand((tokens, (hq + 2 * hk) * d), fp32, 12)
    q, k, v = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d], qkv[:, (hq + hk) * d :]
    wide_k, wide_v = rope.rand((POOL, hk * d + 16), fp32, 13), rope.rand((POOL, hk * d + 16), fp32, 14)
    k_cache, v_cache = wide_k[:, : hk * d], wide_v[:, : hk * d]
    positions = torch.arange(tokens) * 7
    out_loc = cache_rows(positions)
    fused = call(positions, q, k, v, rope.make_cache(32), k_cache, v_cache, out_loc, False, head_dim=d)
    assert torch.equal(fused[2][out_loc][:, 32:64], k[:, 32:64])  # head 0's unrotated tail

    # 3-d views with a head stride of their own (heads padded by 8 elements), which store_cache
    # refuses (it copies whole rows) and the fused op takes (it moves k and v head by head).
    padded = rope.rand((tokens, hq + 2 * hk, d + 8), fp32, 15)
    q3, k3, v3 = padded[:, :hq, :d], padded[:, hq : hq + hk, :d], padded[:, hq + hk :, :d]
    call(positions, q3, k3, v3, rope.make_cache(32), rope.rand((POOL, hk, d), fp32, 16),
         rope.rand((POOL, hk, d), fp32, 17), out_loc, False, pair=False)


def test_misaligned_views_take_the_scalar_path():
    tokens, d = 5, 128
    buf = rope.rand((tokens * 3 * d + 1,), bf16, 18)
    q = buf[1 : 1 + tokens * 2 * d].view(tokens, 2 * d)  # starts one element into its buffer
    k = rope.rand((tokens, d), bf16, 19)
    v_buf = rope.rand((tokens * d + 1,), bf16, 20)
    v = v_buf[1:].view(tokens, d)
    positions = torch.tensor([3, 0, 96, 40, 41])
    call(positions, q, k, v, rope.make_cache(128), rope.rand((POOL, d), bf16, 21), rope.rand((POOL, d), bf16, 22),
         cache_rows(positions), True, head_dim=d)


@pytest.mark.parametrize("dtype", [bf16, fp32])
@pytest.mark.parametrize("tokens", [1, 3, 256, 257, 700])
def test_every_launch_shape(dtype, tokens):
    """Neox with 40 heads takes 8 pairs a thread up to 256 tokens and 4 beyond; at 700 tokens the
    CTAs loop over tokens. A quarter of the positions and of the cache rows are out of range."""
    pool = 1024
    q, k, v = (rope.rand((tokens, 32, 128), dtype, 23), rope.rand((tokens, 8, 128), dtype, 24),
               rope.rand((tokens, 8, 128), dtype, 25))
    gen = torch.Generator().manual_seed(26)
    positions = torch.randint(-rope.MAX_POS // 3, rope.MAX_POS, (tokens,), generator=gen)
    out_loc = torch.randperm(pool + pool // 3, generator=gen)[:tokens] - pool // 3 // 2
    call(positions, q, k, v, rope.make_cache(128), torch.zeros(pool, 8 * 128, dtype=dtype),
         torch.zeros(pool, 8 * 128, dtype=dtype), out_loc, True)


# A 2-d v's heads are consecutive elements of its rows: only its tokens can repeat.
@pytest.mark.parametrize("rank, expand", [(3, "tokens"), (3, "heads"), (3, "both"), (2, "tokens")])
def test_an_expanded_v_is_read_as_it_is(rank, expand):
    """v is only read: one whose tokens or heads repeat memory (``expand``, stride 0) is stored
    as it reads, as the reference and store_cache store it."""
    tokens, hk, d = 6, 2, 128
    one = rope.rand((1 if expand != "heads" else tokens, 1 if expand != "tokens" else hk, d), bf16, 40)
    v = one.expand(tokens, hk, d)
    if rank == 2:
        v = one.reshape(1, hk * d).expand(tokens, hk * d)
    q, k = rope.rand((tokens, 4, d), bf16, 41), rope.rand((tokens, hk, d), bf16, 42)
    if rank == 2:
        q, k = q.reshape(tokens, -1), k.reshape(tokens, -1)
    positions = torch.tensor([3, 0, 96, 40, 41, 5])
    kc, vc = rope.rand((POOL, hk * d), bf16, 43), rope.rand((POOL, hk * d), bf16, 44)
    fused = call(positions, q, k, v, rope.make_cache(128), kc, vc, cache_rows(positions), True, head_dim=d,
                 pair=expand == "tokens")  # store_cache copies whole rows: it refuses repeated heads
    assert torch.equal(fused[3][cache_rows(positions)], v.reshape(tokens, -1))


#: (id, the arguments that differ from a valid call of 3 tokens, 4 q and 2 k heads of 64, the
#: message): a size the launcher fixed names the argument it comes from.
MISMATCHES = [
    ("k-head_dim-of-q", dict(k=(3, 2, 128)), r"^'k': dimension 2 \('head_dim'\) expected 64 \(q's last dimension\), "
     r"got 128"),
    ("v-head_dim-of-q", dict(v=(3, 2, 128)), r"^'v': dimension 2 \('head_dim'\) expected 64 \(q's last dimension\)"),
    ("k-head_dim-argument", dict(q=(3, 4 * 64), k=(3, 2, 128), head_dim=64),
     r"^'k': dimension 2 \('head_dim'\) expected 64 \(the argument 'head_dim'\), got 128"),
    ("q-rows-of-head_dim", dict(q=(3, 4 * 64 + 32), head_dim=64),
     r"^'q': expected rows of heads \* head_dim elements with head_dim 64 \(the argument 'head_dim'\), "
     r"got rows of 288"),
    ("cache-heads", dict(k_cache=(8, 4, 32)), r"^'k_cache': dimension 1 \('heads'\) expected 2 \(k's heads\), got 4"),
    ("cache-head_dim", dict(k_cache=(8, 2, 128)),
     r"^'k_cache': dimension 2 \('head_dim'\) expected 64 \(q's last dimension\), got 128"),
    ("cache-row", dict(v_cache=(8, 256)),
     r"^'v_cache': dimension 1 \('row_elems'\) expected 128 \(k's heads x head_dim\), got 256"),
]


@pytest.mark.parametrize("change, msg", [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES])
def test_a_mismatched_size_names_the_argument_it_comes_from(change, msg):
    shapes = dict(q=(3, 4, 64), k=(3, 2, 64), v=(3, 2, 64), k_cache=(8, 2 * 64), v_cache=(8, 2 * 64))
    shapes.update({n: s for n, s in change.items() if n != "head_dim"})
    t = {n: rope.rand(s, fp16, i) for i, (n, s) in enumerate(shapes.items())}
    before = {n: x.clone() for n, x in t.items()}
    with pytest.raises(ValueError, match=msg) as e:
        rotary_embedding_store(torch.tensor([1, 2, 3]), t["q"], t["k"], t["v"], rope.make_cache(64, fp16),
                               t["k_cache"], t["v_cache"], torch.tensor([0, 2, 5]), False,
                               head_dim=change.get("head_dim"))
    assert "set_value" not in str(e.value)
    assert all(torch.equal(t[n], before[n]) for n in t)


def test_no_tokens_is_a_no_op_and_the_custom_op_runs_the_kernel():
    empty = torch.empty(0, 1, 128, dtype=bf16)
    kc = rope.rand((POOL, 128), bf16, 27)
    before = kc.clone()
    rotary_embedding_store(torch.empty(0, dtype=torch.int64), empty, empty.clone(), empty.clone(), rope.make_cache(128),
                           kc, kc.clone(), torch.empty(0, dtype=torch.int64))
    assert torch.equal(kc, before)
    q, k, v = rope.rand((2, 1, 128), bf16, 28), rope.rand((2, 1, 128), bf16, 29), rope.rand((2, 1, 128), bf16, 30)
    want = [t.clone() for t in (q, k, kc, kc)]
    ref_rotary_embedding_store(torch.tensor([7, 8]), want[0], want[1], v, rope.make_cache(128), want[2], want[3],
                                     torch.tensor([4, 9]))
    vc = kc.clone()
    torch.ops.kernkit.rotary_embedding_store(torch.tensor([7, 8]), q, k, v, rope.make_cache(128), kc, vc,
                                             torch.tensor([4, 9]), True)
    assert all(torch.equal(a, b) for a, b in zip((q, k, kc, vc), want, strict=True))


def test_specializations_describe_the_builds():
    specializations = next(op for op in registered_ops()
                           if op.qualname == "kernkit::rotary_embedding_store").specializations
    specs = specializations(dtypes=[bf16, fp32], head_dim=128, rot_dim=64, is_neox="false", backend="emu")
    assert [s.title for s in specs] == ["rotary_embedding_store<bf16_t, 64, false, false>",
                                        "rotary_embedding_store<fp32_t, 64, false, false>"]


def test_traced_by_torch_compile_as_one_mutating_op():
    """Under torch.compile (aot_eager) the call is the custom op and mutates q, k and the caches."""
    def fn(positions, q, k, v, cache, kc, vc, loc):
        q = q * 2.0
        rotary_embedding_store(positions, q, k, v, cache, kc, vc, loc)
        return q, k

    q, k, v = rope.rand((5, 2, 128), bf16, 31), rope.rand((5, 1, 128), bf16, 32), rope.rand((5, 1, 128), bf16, 33)
    positions, loc, cache = torch.tensor([0, 9, 3, 96, 200]), torch.tensor([1, 5, -1, 7, 30]), rope.make_cache(128)
    kc, vc = torch.zeros(POOL, 128, dtype=bf16), torch.zeros(POOL, 128, dtype=bf16)
    want = [q * 2.0, k.clone(), kc.clone(), vc.clone()]
    ref_rotary_embedding_store(positions, want[0], want[1], v, cache, want[2], want[3], loc)
    torch._dynamo.reset()
    got_q, got_k = torch.compile(fn, backend="aot_eager", fullgraph=True)(positions, q, k, v, cache, kc, vc, loc)
    assert all(torch.equal(a, b) for a, b in zip((got_q, got_k, kc, vc), want, strict=True))


@st.composite
def rope_store_params(draw):
    return dict(draw(rope.rope_params()),
                v_rank=draw(st.sampled_from([2, 3])),
                v_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
                cache_rank=draw(st.sampled_from([2, 3])),
                kv_cache_layout=draw(st.sampled_from(["contiguous", "offset", "padded"])),
                pool=draw(st.sampled_from([1, 8, 40])),
                loc_dtype=draw(st.sampled_from([i32, i64])))


def rope_store_args(a: Arena, p: dict) -> dict:
    args = rope.rope_args(a, p)
    dt, n, pool = p["dtype"], p["n"], p["pool"]
    shape = rope.heads_shape(p, p["k_heads"], p["v_rank"])
    args["v"] = a.tensor(shape, dt, p["v_layout"])
    # An expanded v's tokens are one token's memory: fill that one.
    rows = args["v"][:1] if p["v_layout"] == "expand" else args["v"]
    rope.filled(a, rows, torch.randn(rows.shape, generator=a.gen).to(dt))
    for name in ("k_cache", "v_cache"):
        args[name] = a.tensor(_kv_cache_shape(p), dt, p["kv_cache_layout"])
    perm = torch.randperm(pool, generator=a.gen).tolist()
    values = [perm[i] if i < pool else pool + i for i in range(n)]  # distinct valid rows
    for i in range(1, n, 3):  # and out-of-range ones the kernel must skip
        values[i] = [-1, pool, 2**31 - 1, -(2**31)][i // 3 % 4]
    args["out_loc"] = rope.filled(a, a.tensor((n,), p["loc_dtype"]), torch.tensor(values, dtype=p["loc_dtype"]))
    return args


def _rope_store_call(args: dict, via: str):
    if via == "op":
        return lambda: ops.rotary_embedding_store(**args)
    names = ("positions", "q", "k", "v", "cos_sin_cache", "k_cache", "v_cache", "out_loc", "is_neox")
    return lambda: torch.ops.kernkit.rotary_embedding_store(*(args[n] for n in names), head_dim=args["head_dim"])


@invalid_calls(ROPE_STORE_BAD, rope_store_params())
def test_rotary_embedding_store_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what in rope.ROPE_NEEDS_TWO_TOKENS:
        p = dict(p, n=max(p["n"], 2))
    if bad.what.startswith(SHARED):  # something to share: one head of 3 tokens, one-row caches
        p = dict(p, n=3, q_heads=1, k_heads=1, max_pos=40, pool=1)
    if bad.arg == "head_dim" and bad.what == "below rot_dim":
        p = dict(p, q_rank=2, k_rank=2)  # 3-d heads would be named by their head_dim first
    if bad.arg.endswith("_cache") and bad.what == "heads unlike k's (3-d)":
        p = dict(p, cache_rank=3)
    p = dict(p, v_heads=p["k_heads"])
    args = rope_store_args(a, p)
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    direct = bad.what in ("meta tensor", "not a tensor", "not an int", "not a bool", "negative bit")
    check_invalid(_rope_store_call(args, "op" if direct else via), a, bad)


@VALID
@given(p=rope_store_params())
def test_rotary_embedding_store_valid_views_give_the_reference_bytes(p):
    """The views of rope's valid-call test, v of any rank and row stride, 2-d and 3-d caches with
    misaligned or padded rows, out-of-range positions and cache rows: every buffer matches the
    reference (rotary_embedding, then store_cache)."""
    a = Arena.seeded(p["seed"])
    args = rope_store_args(a, p)
    want = a.copies()
    twin = {n: a.twin(t, want) for n, t in args.items()}
    ref_rotary_embedding_store(twin["positions"], twin["q"], twin["k"], twin["v"], twin["cos_sin_cache"],
                                     twin["k_cache"], twin["v_cache"], twin["out_loc"], p["is_neox"], p["head_dim"])
    assert ops.rotary_embedding_store(**args) is None
    assert a.same_as(want)
