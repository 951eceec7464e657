"""kernkit.ops.rotary_embedding on CPU tensors, through the CPU emulator: the GPU's kernel template
against a float64 rotation (within the bound the docstring states) and bit for bit against the
fp32 torch reference, neox and gpt-j pairing, partial rotary, fp32 and q-dtype caches, strided and
misaligned views, out-of-range positions, and the errors.

Four specializations are built: bf16/rot 128/neox, fp16/rot 64/gpt-j, fp32/rot 32/gpt-j and
fp16/rot 6/neox (half of 3: the scalar variant only)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops import registered_ops, rotary_embedding
from kernkit.testing.invalid import SHARED, VALID, Arena, check_invalid, invalid_calls
from kernkit.testing.ops.rotary_embedding import (
    MAX_POS,
    ROPE_BAD,
    ROPE_NEEDS_TWO_TOKENS,
    bf16,
    fp16,
    fp32,
    make_cache,
    rand,
    ref_rotary_embedding,
    rope_args,
    rope_params,
)

#: (dtype, head_dim, rot_dim, is_neox): one build each.
SPECS = [(bf16, 128, 128, True), (fp16, 64, 64, False), (fp32, 64, 32, False), (fp16, 10, 6, True)]


def exact(x: torch.Tensor, positions, cache, is_neox, head_dim):
    """The rotation in float64 (of the inputs' and the cache's values), and the error bound per
    element that the docstring states: 2**-23 * (|x cos| + |y sin|) plus half an ulp of the dtype."""
    heads = x.double().reshape(x.shape[0], -1, head_dim).clone()
    rot = cache.shape[1]
    half = rot // 2
    c = cache[positions.long(), :half].double()[:, None, :]
    s = cache[positions.long(), half:].double()[:, None, :]
    first, second = (slice(0, half), slice(half, rot)) if is_neox else (slice(0, rot, 2), slice(1, rot, 2))
    a, b = heads[:, :, first].clone(), heads[:, :, second].clone()
    fp32_err = torch.zeros_like(heads)
    heads[:, :, first] = a * c - b * s
    heads[:, :, second] = b * c + a * s
    fp32_err[:, :, first] = 2.0**-23 * ((a * c).abs() + (b * s).abs())
    fp32_err[:, :, second] = 2.0**-23 * ((b * c).abs() + (a * s).abs())
    fi = torch.finfo(x.dtype)
    mag = heads.abs() + fp32_err
    _, e = torch.frexp(mag.clamp_min(fi.smallest_normal))
    half_ulp = 0.0 if x.dtype == fp32 else torch.ldexp(torch.full_like(mag, fi.eps / 2), e - 1)
    return heads.reshape(x.shape), (fp32_err * (1 + 2.0**-20) + half_ulp).reshape(x.shape)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s[0]}-d{s[1]}-r{s[2]}-{'neox' if s[3] else 'gptj'}")
@pytest.mark.parametrize("cache_dtype", ["fp32", "q"])
def test_matches_float64_within_the_stated_bound_and_fp32_torch_bit_for_bit(spec, cache_dtype):
    dtype, head_dim, rot_dim, is_neox = spec
    tokens, q_heads, k_heads = 11, 4, 2
    q = rand((tokens, q_heads * head_dim), dtype, 1)
    k = rand((tokens, k_heads, head_dim), dtype, 2)
    cache = make_cache(rot_dim, fp32 if cache_dtype == "fp32" else dtype)
    positions = torch.randint(1, MAX_POS, (tokens,), generator=torch.Generator().manual_seed(3))
    q0, k0 = q.clone(), k.clone()
    want_q, want_k = q.clone(), k.clone()
    ref_rotary_embedding(positions, want_q, want_k, cache, is_neox, head_dim)

    rotary_embedding(positions, q, k, cache, is_neox, head_dim=head_dim)

    for got, before, want in ((q, q0, want_q), (k, k0, want_k)):
        value, bound = exact(before, positions, cache, is_neox, head_dim)
        err = (got.double() - value).abs()
        assert bool((err <= bound).all()), f"max error {err.max().item()} over the bound"
        assert torch.equal(got, want)
        assert not torch.equal(got, before)  # it rotated
        tail = got.reshape(tokens, -1, head_dim)[:, :, rot_dim:]
        assert torch.equal(tail, before.reshape(tokens, -1, head_dim)[:, :, rot_dim:])


def test_position_zero_is_the_identity_and_rotation_keeps_the_norm():
    q = rand((3, 2, 128), fp32, 4).to(bf16)
    k = rand((3, 1, 128), fp32, 5).to(bf16)
    q0, k0 = q.clone(), k.clone()
    rotary_embedding(torch.zeros(3, dtype=torch.int32), q, k, make_cache(128))
    assert torch.equal(q, q0) and torch.equal(k, k0)  # cos 1, sin 0: x * 1 - y * 0 is x
    qf = rand((3, 2, 64), fp32, 6)
    kf = rand((3, 1, 64), fp32, 7)
    norm = qf[..., :32].reshape(3, 2, 16, 2).norm(dim=-1)
    rotary_embedding(torch.tensor([5, 50, 96]), qf, kf, make_cache(32), False)
    assert torch.allclose(qf[..., :32].reshape(3, 2, 16, 2).norm(dim=-1), norm, rtol=1e-6)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_out_of_range_positions_leave_their_tokens_unchanged(index_dtype):
    """Negative positions, max_position and beyond (int64: low 32 bits in range too) are skipped;
    the rows past the cache's end are NaN, so a read of them would show."""
    bad = [-1, MAX_POS, MAX_POS + 1, 2**31 - 1, -(2**31)]
    if index_dtype == torch.int64:
        bad += [2**32 + 3, -(2**32) + 5, 2**40, -(2**62)]
    good = [0, 1, 50, MAX_POS - 1]
    values = [v for pair in zip(bad, good * 3, strict=False) for v in pair][: len(bad) + len(good)]
    positions = torch.tensor(values, dtype=index_dtype)
    tokens = positions.shape[0]
    big = torch.full((MAX_POS + 8, 128), float("nan"))
    big[:MAX_POS] = make_cache(128)
    cache = big[:MAX_POS]
    q = rand((tokens, 3, 128), bf16, 8)
    k = rand((tokens, 2, 128), bf16, 9)
    q0, k0 = q.clone(), k.clone()
    want_q, want_k = q.clone(), k.clone()
    ref_rotary_embedding(positions, want_q, want_k, cache)
    rotary_embedding(positions, q, k, cache)
    skipped = (positions < 0) | (positions >= MAX_POS)
    assert torch.equal(q[skipped], q0[skipped]) and torch.equal(k[skipped], k0[skipped])
    assert not torch.equal(q[~skipped], q0[~skipped])
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


def test_fused_qkv_slices_and_3d_head_strides():
    """q and k as column slices of a fused QKV tensor (2-d, token stride > row), and as 3-d views
    with a head stride of their own; v and the padding between heads are never written."""
    tokens, hq, hk, d = 9, 4, 2, 64
    qkv = rand((tokens, (hq + 2 * hk) * d), fp16, 10)
    before = qkv.clone()
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
    positions = torch.arange(tokens) * 7
    cache = make_cache(64)
    want = qkv.clone()
    ref_rotary_embedding(positions, want[:, : hq * d], want[:, hq * d : (hq + hk) * d], cache, False)
    rotary_embedding(positions, q, k, cache, False, head_dim=d)
    assert torch.equal(qkv, want) and torch.equal(qkv[:, (hq + hk) * d :], before[:, (hq + hk) * d :])

    padded = rand((tokens, hq + hk, d + 8), fp16, 11)  # heads of 64 with 8 elements of padding each
    pbefore = padded.clone()
    q3, k3 = padded[:, :hq, :d], padded[:, hq:, :d]
    assert q3.stride() == ((hq + hk) * (d + 8), d + 8, 1)
    pwant = padded.clone()
    ref_rotary_embedding(positions, pwant[:, :hq, :d], pwant[:, hq:, :d], cache, False)
    rotary_embedding(positions, q3, k3, cache, False)
    assert torch.equal(padded, pwant) and torch.equal(padded[..., d:], pbefore[..., d:])


def test_misaligned_views_take_the_scalar_path():
    tokens, d = 5, 128
    buf = rand((tokens * 2 * d + 1,), bf16, 12)
    q = buf[1:].view(tokens, 2 * d)  # starts one element into its buffer
    k = rand((tokens, d), bf16, 13)
    cache_buf = make_cache(128, rows=MAX_POS + 1).reshape(-1)
    cache = cache_buf[1 : 1 + MAX_POS * 128].view(MAX_POS, 128)  # a misaligned fp32 cache
    positions = torch.tensor([3, 0, 96, 40, 41])
    want_q, want_k = q.clone(), k.clone()
    ref_rotary_embedding(positions, want_q, want_k, cache)
    rotary_embedding(positions, q, k, cache, head_dim=d)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


def test_partial_rotary_on_2d_rows_takes_head_dim():
    q = rand((4, 3 * 64), fp32, 14)
    k = rand((4, 64), fp32, 15)
    q0 = q.clone()
    positions = torch.tensor([1, 2, 3, 4])
    want_q, want_k = q.clone(), k.clone()
    ref_rotary_embedding(positions, want_q, want_k, make_cache(32), False, 64)
    rotary_embedding(positions, q, k, make_cache(32), False, head_dim=64)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert not torch.equal(q.view(4, 3, 64)[:, :, :32], q0.view(4, 3, 64)[:, :, :32])
    assert torch.equal(q.view(4, 3, 64)[:, :, 32:], q0.view(4, 3, 64)[:, :, 32:])


@pytest.mark.parametrize("dtype", [bf16, fp32])
@pytest.mark.parametrize("tokens", [3, 256, 257, 700])
def test_every_launch_shape_gives_the_reference_bits(dtype, tokens):
    """Neox with 40 heads takes 8 pairs a thread up to 256 tokens and 4 beyond; the grid holds
    at most the CTAs the (emulated, 4-SM) GPU holds at once, so 700 tokens loop in each CTA.
    Out-of-range positions (a quarter) are left as they were."""
    q, k = rand((tokens, 32, 128), dtype, 40), rand((tokens, 8, 128), dtype, 41)
    positions = torch.randint(-MAX_POS // 3, MAX_POS, (tokens,), generator=torch.Generator().manual_seed(42))
    want_q, want_k = q.clone(), k.clone()
    ref_rotary_embedding(positions, want_q, want_k, make_cache(128), True, 128)
    rotary_embedding(positions, q, k, make_cache(128), True)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


def test_2d_rows_without_head_dim_are_refused_naming_head_dim():
    # Partial rotary on 2-d rows: a default of head_dim = rot_dim would rotate the wrong elements.
    q, k = rand((4, 3 * 64), fp32, 16), rand((4, 64), fp32, 17)
    before = q.clone(), k.clone()
    positions = torch.tensor([1, 2, 3, 4])
    msg = r"^'head_dim': required when q is 2-d \(\[tokens, heads \* head_dim\]\)"
    for call in (lambda: rotary_embedding(positions, q, k, make_cache(32), False),
                 lambda: torch.ops.kernkit.rotary_embedding(positions, q, k, make_cache(32), False)):
        with pytest.raises(ValueError, match=msg):
            call()
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    # 3-d q keeps its default, its last dimension.
    q3, k3 = q.view(4, 3, 64), k.view(4, 1, 64)
    want_q, want_k = q3.clone(), k3.clone()
    ref_rotary_embedding(positions, want_q, want_k, make_cache(32), False, 64)
    rotary_embedding(positions, q3, k3, make_cache(32), False)
    assert torch.equal(q3, want_q) and torch.equal(k3, want_k)


def test_no_tokens_is_a_no_op_and_the_custom_op_runs_the_kernel():
    rotary_embedding(torch.empty(0, dtype=torch.int64), torch.empty(0, 256, dtype=bf16),
                     torch.empty(0, 2, 128, dtype=bf16), make_cache(128), head_dim=128)
    q = rand((2, 128), bf16, 16)
    k = rand((2, 128), bf16, 17)
    want_q, want_k = q.clone(), k.clone()
    ref_rotary_embedding(torch.tensor([7, 8]), want_q, want_k, make_cache(128))
    torch.ops.kernkit.rotary_embedding(torch.tensor([7, 8]), q, k, make_cache(128), True, head_dim=128)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


def _bf16_call(**change):
    args = dict(positions=torch.tensor([1, 2, 3]), q=rand((3, 2 * 128), bf16, 18), k=rand((3, 1, 128), bf16, 19),
                cos_sin_cache=make_cache(128), head_dim=128)
    args.update(change)
    return args


def _fused(rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """q and a k that reuses q's second head: overlapping slices of one buffer."""
    qkv = rand((rows, 4 * 128), bf16, 20)
    return qkv[:, :256], qkv[:, 128:256]


#: (id, the arguments that differ from a valid bf16 call, exception, message)
ERRORS = [
    ("q-dtype", lambda: dict(q=torch.zeros(3, 256, dtype=torch.int32)), TypeError,
     r"^'q': unsupported dtype torch.int32"),
    ("k-dtype", lambda: dict(k=rand((3, 128), fp16, 0)), TypeError, r"^'k': expected dtype bfloat16, got float16$"),
    ("cache-dtype", lambda: dict(cos_sin_cache=make_cache(128, fp16)), TypeError,
     r"^'cos_sin_cache': expected dtype one of \{float32, bfloat16\}, got float16$"),
    ("positions-dtype", lambda: dict(positions=torch.tensor([1.0, 2.0, 3.0])), TypeError,
     r"^'positions': expected dtype one of \{int32, int64\}"),
    ("positions-tokens", lambda: dict(positions=torch.tensor([1, 2])), ValueError,
     r"^'q': dimension 0 \('num_tokens'\) expected 2 \(from 'positions'\)"),
    ("k-tokens", lambda: dict(k=rand((4, 128), bf16, 0)), ValueError, r"^'k': dimension 0 \('num_tokens'\) expected 3"),
    ("q-not-whole-heads", lambda: dict(q=rand((3, 200), bf16, 0)), ValueError,
     r"^'q': expected rows of heads \* head_dim elements"),
    ("k-head_dim", lambda: dict(k=rand((3, 1, 64), bf16, 0)), ValueError,
     r"^'k': dimension 2 \('head_dim'\) expected 128"),
    ("q-rank", lambda: dict(q=rand((3, 2, 128, 1), bf16, 0)), ValueError,
     r"^'q': expected a 2-d \[tokens, heads \* head_dim\] or 3-d"),
    ("cache-odd-rot_dim", lambda: dict(cos_sin_cache=make_cache(128)[:, :127]), ValueError,
     r"^'cos_sin_cache': expected an even, positive rot_dim"),
    ("cache-rank", lambda: dict(cos_sin_cache=make_cache(128).reshape(-1)), ValueError,
     r"^'cos_sin_cache': expected a 2-d"),
    ("q-head_dim-strided", lambda: dict(q=rand((3, 128, 2), bf16, 0).transpose(1, 2)), ValueError,
     r"^'q': stride 2 expected 1"),
    ("q-rows-overlap", lambda: dict(q=rand((1, 256), bf16, 0).expand(3, 256)), ValueError,
     r"^'q': its heads overlap in memory"),
    ("q-k-overlap", lambda: dict(zip(("q", "k"), _fused(), strict=True)), ValueError,
     r"^'q' and 'k' overlap in memory"),
]


@pytest.mark.parametrize("change, exc, msg", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_arguments_are_named_and_nothing_is_written(change, exc, msg):
    args = _bf16_call(**change())
    before = {n: t.clone() for n, t in args.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(exc, match=msg):
        rotary_embedding(**args)
    for n, t in before.items():
        assert torch.equal(args[n], t), n


def test_head_dim_below_rot_dim_and_q_inside_the_cache_are_refused():
    args = _bf16_call()
    before = {n: t.clone() for n, t in args.items() if isinstance(t, torch.Tensor)}
    msg = r"^'head_dim': expected at least the rotary dimension 128 \(the cache's row length\), got 64$"
    with pytest.raises(ValueError, match=msg):
        rotary_embedding(**dict(args, head_dim=64))
    cache = make_cache(128, bf16)
    cache_before = cache.clone()
    with pytest.raises(ValueError, match=r"^'q' and 'cos_sin_cache' overlap in memory"):
        rotary_embedding(args["positions"], cache[:3], args["k"], cache, head_dim=128)
    assert torch.equal(cache, cache_before)
    for n, t in before.items():
        assert torch.equal(args[n], t), n


def test_specializations_describe_the_builds():
    specializations = next(op for op in registered_ops() if op.qualname == "kernkit::rotary_embedding").specializations
    specs = specializations(dtypes=[bf16, fp32, bf16], head_dim=128, backend="emu", hidden_size=4096)
    assert [s.title for s in specs] == ["rotary_embedding<bf16_t, 128, true, false>",
                                        "rotary_embedding<fp32_t, 128, true, false>"]
    assert all(isinstance(s, JitSpec) and s.backend == "emu" for s in specs)
    partial = specializations(dtypes=[fp16], head_dim=128, rot_dim=64, is_neox=False, backend="emu")
    assert [s.title for s in partial] == ["rotary_embedding<fp16_t, 64, false, false>"]
    as_warmup_sets_it = specializations(dtypes=[fp16], head_dim=64, is_neox="false", backend="emu")
    assert [s.title for s in as_warmup_sets_it] == ["rotary_embedding<fp16_t, 64, false, false>"]
    with pytest.raises(TypeError, match="unsupported dtype"):
        specializations(dtypes=[torch.int8], head_dim=128)


def test_traced_by_torch_compile_as_one_mutating_op():
    """Under torch.compile (aot_eager: the graph torch.compile builds, without Inductor's C++
    compile) the call is the custom op, q and k come back rotated, and the result is the
    reference's."""
    def fn(positions, q, k, cache):
        q = q * 2.0
        rotary_embedding(positions, q, k, cache, head_dim=128)
        return q, k

    q = rand((5, 2 * 128), bf16, 21)
    k = rand((5, 128), bf16, 22)
    positions = torch.tensor([0, 9, 3, 96, 200])
    cache = make_cache(128)
    want_q, want_k = q * 2.0, k.clone()
    ref_rotary_embedding(positions, want_q, want_k, cache)
    torch._dynamo.reset()
    got_q, got_k = torch.compile(fn, backend="aot_eager", fullgraph=True)(positions, q, k.clone(), cache)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


@pytest.mark.parametrize("first", ["int", "bool"])
def test_is_neox_takes_a_bool_only_whatever_was_called_before(first):
    """``is_neox=1`` is refused in a fresh process and after a call with ``True`` alike: the
    check runs before the module factory's memo, which takes 1 for True."""
    from kernkit.ops.rotary_embedding import _module as rope_module

    rope_module.cache_clear()
    q, k = rand((3, 64), fp32, 31), rand((3, 64), fp32, 32)
    args = (torch.tensor([0, 1, 2]), q, k, make_cache(32))
    calls = [1, True, 1] if first == "int" else [True, 1]
    for value in calls:
        if value is True:
            rotary_embedding(*args, value, head_dim=64)
            continue
        before = (q.clone(), k.clone())
        with pytest.raises(TypeError, match=r"^'is_neox': expected a bool, got int$"):
            rotary_embedding(*args, value, head_dim=64)
        assert torch.equal(q, before[0]) and torch.equal(k, before[1])


@invalid_calls(ROPE_BAD, rope_params())
def test_rotary_embedding_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what in ROPE_NEEDS_TWO_TOKENS:
        p = dict(p, n=max(p["n"], 2))
    if bad.what.startswith(SHARED):  # something to share: one head of 3 tokens, a 40-row cache
        p = dict(p, n=3, q_heads=1, k_heads=1, max_pos=40)
    if bad.arg == "head_dim" and bad.what == "below rot_dim":
        p = dict(p, q_rank=2, k_rank=2)  # 3-d heads would be named by their head_dim first
    args = rope_args(a, p)
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not an int", "not a bool",
                                                "negative bit"):
        check_invalid(lambda: torch.ops.kernkit.rotary_embedding(
            args["positions"], args["q"], args["k"], args["cos_sin_cache"], args["is_neox"],
            head_dim=args["head_dim"]), a, bad)
    else:
        check_invalid(lambda: ops.rotary_embedding(**args), a, bad)


@VALID
@given(p=rope_params())
def test_rotary_embedding_valid_views_give_the_reference_bytes(p):
    """Misaligned and padded q/k (2-d and 3-d), misaligned caches of fp32 or q's dtype, out-of-range
    positions (int64 ones with in-range low bits), n == 0: every buffer matches the reference."""
    a = Arena.seeded(p["seed"])
    args = rope_args(a, p)
    want = a.copies()
    ref_rotary_embedding(args["positions"], a.twin(args["q"], want), a.twin(args["k"], want),
                               args["cos_sin_cache"], p["is_neox"], p["head_dim"])
    assert ops.rotary_embedding(**args) is None
    assert a.same_as(want)
