"""kernkit.ops.qk_norm on CPU tensors, through the CPU emulator: the kernel's bits against
``ref_qk_norm`` (rmsnorm's fp32 order with qk_norm's layout), the stated tolerance against
float64, q and k as 3-d and 2-d views and as slices of one fused QKV tensor, and the errors of
bad calls (each naming the argument, with nothing written).

Specializations built (each costs an emulator build): bf16 x 128 (8 lanes a head), fp16 x 64
(4 lanes), fp32 x 256 (16 lanes), bf16 x 1024 (a warp of 4 vectors a lane), each in both orders
(``cast_x_before_out_mul``)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.jit import JitSpec
from kernkit.ops import qk_norm, registered_ops, rmsnorm
from kernkit.testing.invalid import SHARED, VALID, Arena, check_invalid, invalid_calls
from kernkit.testing.ops import rmsnorm as norm
from kernkit.testing.ops import rotary_embedding as rope
from kernkit.testing.ops.qk_norm import QK_DIM, QK_NORM_BAD, bf16, fp16, fp32, ref_qk_norm

BUILDS = [(bf16, 128), (fp16, 64), (fp32, 256), (bf16, 1024)]


def randn(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def fused_qkv(tokens, q_heads, k_heads, head_dim, dtype, seed):
    """A ``[tokens, (q_heads + 2 * k_heads) * head_dim]`` tensor and its q and k slices (3-d q,
    2-d k), as a model's QKV projection gives them."""
    qkv = randn((tokens, (q_heads + 2 * k_heads) * head_dim), dtype, seed, scale=3.0)
    q = qkv[:, :q_heads * head_dim].view(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim:(q_heads + k_heads) * head_dim]
    return qkv, q, k


def as_bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype,head_dim", BUILDS, ids=str)
@pytest.mark.parametrize("tokens", [0, 1, 7, 300], ids=lambda n: f"{n}tok")
def test_bits_equal_the_reference_and_v_is_untouched(dtype, head_dim, tokens):
    qkv, q, k = fused_qkv(tokens, 4, 2, head_dim, dtype, head_dim + tokens)
    wq, wk = randn((head_dim,), dtype, 1), randn((head_dim,), dtype, 2)
    want_q, want_k, v = q.clone(), k.clone(), qkv[:, 6 * head_dim:].clone()
    ref_qk_norm(want_q, want_k, wq, wk, 1e-6)
    assert qk_norm(q, k, wq, wk) is None
    assert torch.equal(as_bytes(q), as_bytes(want_q)) and torch.equal(as_bytes(k), as_bytes(want_k))
    assert torch.equal(as_bytes(qkv[:, 6 * head_dim:]), as_bytes(v))


@pytest.mark.parametrize("dtype,head_dim", BUILDS, ids=str)
def test_cast_x_before_out_mul_bits_equal_the_reference(dtype, head_dim):
    """transformers' order (``cast_x_before_out_mul=True``): the reference's bits, a result the
    default order does not give for 16-bit types."""
    qkv, q, k = fused_qkv(37, 4, 2, head_dim, dtype, head_dim + 99)
    wq, wk = randn((head_dim,), dtype, 1), randn((head_dim,), dtype, 2)
    want_q, want_k, plain_q = q.clone(), k.clone(), q.clone()
    ref_qk_norm(want_q, want_k, wq, wk, 1e-6, cast=True)
    qk_norm(q, k, wq, wk, cast_x_before_out_mul=True)
    assert torch.equal(as_bytes(q), as_bytes(want_q)) and torch.equal(as_bytes(k), as_bytes(want_k))
    qk_norm(plain_q, k.clone(), wq, wk)
    assert torch.equal(plain_q, q) == (dtype == fp32)


def test_cast_x_before_out_mul_is_qwen3s_norm():
    """Against transformers' RMSNorm applied per head (``Qwen3Attention``'s ``q_norm``), as written
    there: all but a few elements equal (torch sums the squares in another order), none further
    than one bfloat16 ulp."""
    q, k = randn((16, 8, 128), bf16, 70, scale=3.0), randn((16, 2, 128), bf16, 71)
    wq, wk = randn((128,), bf16, 72), randn((128,), bf16, 73)
    want = [norm.transformers_rmsnorm(t, w, 1e-6) for t, w in ((q, wq), (k, wk))]
    qk_norm(q, k, wq, wk, 1e-6, cast_x_before_out_mul=True)
    for got, ref in zip((q, k), want, strict=True):
        assert (got == ref).float().mean() > 0.999
        assert ((got.float() - ref.float()).abs() <= ref.float().abs() * 2.0**-7).all()
    with pytest.raises(TypeError, match="'cast_x_before_out_mul': expected a bool"):
        qk_norm(q, k, wq, wk, cast_x_before_out_mul=1)


@pytest.mark.parametrize("dtype,head_dim", BUILDS, ids=str)
def test_within_rmsnorms_stated_tolerance(dtype, head_dim):
    q, k = randn((9, 3, head_dim), dtype, 3, scale=5.0), randn((9, 1, head_dim), dtype, 4, scale=0.01)
    wq, wk = randn((head_dim,), dtype, 5), randn((head_dim,), dtype, 6)
    want = [norm.rmsnorm64(t, w, 1e-5) for t, w in ((q, wq), (k, wk))]
    qk_norm(q, k, wq, wk, 1e-5)
    for got, ref in zip((q, k), want, strict=True):
        assert torch.isfinite(got).all()
        assert ((got.double() - ref).abs() <= norm.rmsnorm_bound(ref, dtype)).all()


def test_heads_normalized_separately_with_their_own_weight():
    """Scaling one head scales nothing else, and q's weight is not k's."""
    q, k = randn((2, 3, 128), bf16, 7), randn((2, 2, 128), bf16, 8)
    wq, wk = randn((128,), bf16, 9), randn((128,), bf16, 10)
    q2, k2 = q.clone(), k.clone()
    q2[1, 2] *= 64  # a power of two and eps 0: the same normalized head, bit for bit
    qk_norm(q, k, wq, wk, 0.0)
    qk_norm(q2, k2, wq, wk, 0.0)
    assert torch.equal(q, q2) and torch.equal(k, k2)
    k3 = randn((2, 2, 128), bf16, 8)
    qk_norm(q.clone(), k3, wq, wq, 0.0)
    assert not torch.equal(k3, k)


def test_strided_heads_and_three_d_k():
    """Heads with a stride between them (``[tokens, heads, 2 * head_dim][..., :head_dim]``)."""
    buf = randn((5, 3, 256), fp16, 11)
    q = buf[:, :, :64]
    k = randn((5, 1, 64), fp16, 12)
    wq, wk = randn((64,), fp16, 13), randn((64,), fp16, 14)
    want_q, want_k, rest = q.clone(), k.clone(), buf[:, :, 64:].clone()
    ref_qk_norm(want_q, want_k, wq, wk, 1e-6)
    qk_norm(q, k, wq, wk)
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(buf[:, :, 64:], rest)


def test_custom_op_and_opcheck():
    q, k = randn((3, 2, 64), fp16, 15), randn((3, 1, 64), fp16, 16)
    wq, wk = randn((64,), fp16, 17), randn((64,), fp16, 18)
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    torch.ops.kernkit.qk_norm(q1, k1, wq, wk, 1e-6)
    qk_norm(q2, k2, wq, wk, 1e-6)
    assert torch.equal(q1, q2) and torch.equal(k1, k2)
    torch.library.opcheck(torch.ops.kernkit.qk_norm.default, (q.clone(), k.clone(), wq, wk, 1e-6))
    schema = str(torch.ops.kernkit.qk_norm.default._schema)
    assert re.search(r"\(Tensor\(\w+!\) q, Tensor\(\w+!\) k, Tensor q_weight, Tensor k_weight, float eps", schema)


def test_specializations_describe_the_builds():
    op = {op.qualname: op for op in registered_ops()}["kernkit::qk_norm"]
    specs = op.specializations(dtypes=[bf16, fp16, bf16], head_dim=128, hidden_size=4096, backend="emu")
    assert [s.title for s in specs] == ["qk_norm<bf16_t, 128, false>", "qk_norm<fp16_t, 128, false>"]
    assert all(isinstance(s, JitSpec) and s.backend == "emu" for s in specs)


@pytest.mark.parametrize("head_dim", [96, 32, 2048, 130])
def test_head_dims_without_a_kernel_are_refused_naming_head_dim(head_dim):
    q, k, w = torch.ones(2, 2, head_dim, dtype=bf16), torch.ones(2, 1, head_dim, dtype=bf16), torch.ones(head_dim,
                                                                                                       dtype=bf16)
    with pytest.raises(ValueError, match=rf"^'q_weight': head_dim {head_dim} \(the weight's length\) is not supported; "
                                         r"supported: 64, 128, 256, 512, 1024$"):
        qk_norm(q, k, w, w)
    assert (q == 1).all() and (k == 1).all()


def test_unsupported_dtype_is_a_type_error():
    q = torch.ones(2, 2, 64, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^'q': unsupported dtype torch.float64; supported: float16, bfloat16, "
                                        r"float32$"):
        qk_norm(q, q.clone(), torch.ones(64, dtype=torch.float64), torch.ones(64, dtype=torch.float64))


def test_launcher_errors_name_the_argument_and_write_nothing():
    qkv, q, k = fused_qkv(4, 2, 1, 64, fp16, 19)
    wq, wk = randn((64,), fp16, 20), randn((64,), fp16, 21)
    base = randn((4 * 3 * 64 + 8,), fp16, 22)
    cases = [
        (dict(k=torch.ones(5, 1, 64, dtype=fp16)), r"'k': dimension 0 \('num_tokens'\) expected 4 \(from 'q'\), got 5"),
        (dict(k=torch.ones(4, 1, 64, dtype=bf16)), "'k': expected dtype float16, got bfloat16"),
        (dict(k=torch.ones(4, 65, dtype=fp16)),
         "'k': expected rows of heads \\* head_dim elements with head_dim 64 \\(q_weight's length\\), got rows of 65"),
        (dict(q=torch.ones(4, 2, 128, dtype=fp16)),
         r"^'q': dimension 2 \('head_dim'\) expected 64 \(q_weight's length\), got 128"),
        (dict(k=torch.ones(4, 1, 128, dtype=fp16)),
         r"^'k': dimension 2 \('head_dim'\) expected 64 \(q_weight's length\), got 128"),
        (dict(k=torch.ones(4, 1, 1, 64, dtype=fp16)), "'k': expected a 2-d \\[tokens, heads \\* head_dim\\] or 3-d"),
        (dict(q=base[1:1 + 4 * 2 * 64].view(4, 2, 64)), "'q': heads must start on 16-byte boundaries"),
        (dict(q=base[:4 * 2 * 64 + 1].as_strided((4, 2, 64), (129, 64, 1))),
         "'q': heads must start on 16-byte.*strides \\[129, 64, 1\\]"),
        (dict(q=torch.ones(4, 2, 64, dtype=fp16).expand(4, 2, 64).as_strided((4, 2, 64), (64, 0, 1))),
         "'q': its heads overlap in memory"),
        (dict(k=q[:, :1]), "'q' and 'k' overlap in memory"),
        (dict(k_weight=q[0, 0]), "'q' and 'k_weight' overlap in memory"),
        (dict(q_weight=torch.ones(64, dtype=fp32)), "'q_weight': expected dtype float16, got float32"),
        (dict(k_weight=torch.ones(128, dtype=fp16)),
         r"^'k_weight': dimension 0 \('length'\) expected 64 \(q_weight's length\), got 128"),
        (dict(k_weight=base[1:65]), "'k_weight': must start on a 16-byte boundary"),
        (dict(k_weight=torch.ones(64, 2, dtype=fp16)[:, 0]), "'k_weight': expected a contiguous tensor"),
        (dict(eps=-1.0), "'eps': expected a finite value >= 0"),
        (dict(eps=float("nan")), "'eps': expected a finite value >= 0"),
    ]
    for change, message in cases:
        args = dict(q=q, k=k, q_weight=wq, k_weight=wk, eps=1e-6)
        args.update(change)
        before = [as_bytes(t).clone() for t in (qkv, base, args["q"], args["k"])]
        with pytest.raises(TypeError if "expected dtype" in message else ValueError, match=message):
            qk_norm(**args)
        after = [as_bytes(t) for t in (qkv, base, args["q"], args["k"])]
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)), change


def test_rmsnorm_and_qk_norm_agree_within_the_bound():
    """The two layouts sum in different orders; both stay within rmsnorm's bound of float64."""
    x = randn((16, 2, 128), bf16, 23, scale=2.0)
    w = randn((128,), bf16, 24)
    q, k = x[:, :1].clone(), x[:, 1:].clone()
    qk_norm(q, k, w, w)
    ref = norm.rmsnorm64(x, w, 1e-6)
    for got in (torch.cat([q, k], 1), rmsnorm(x, w)):
        assert ((got.double() - ref).abs() <= norm.rmsnorm_bound(ref, bf16)).all()


@st.composite
def qk_params(draw):
    return dict(
        dtype=fp16, head_dim=QK_DIM,
        n=draw(st.sampled_from([0, 1, 3, 9])),
        q_heads=draw(st.sampled_from([1, 2, 3])),
        k_heads=draw(st.sampled_from([1, 2])),
        q_rank=draw(st.sampled_from([2, 3])),
        k_rank=draw(st.sampled_from([2, 3])),
        fused=draw(st.booleans()),  # q and k slices of one [n, (q_heads + 2 * k_heads) * QK_DIM] tensor
        eps=draw(st.sampled_from([1e-6, 0.0, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def _qk_heads(a: Arena, p: dict, heads: int, rank: int) -> torch.Tensor:
    t = a.tensor(rope.heads_shape(p, heads, rank), fp16)
    return rope.filled(a, t, torch.randn(t.shape, generator=a.gen).to(fp16))


def qk_args(a: Arena, p: dict) -> dict:
    if p["fused"]:
        qh, kh = p["q_heads"], p["k_heads"]
        qkv = rope.filled(a, a.tensor((p["n"], (qh + 2 * kh) * QK_DIM), fp16),
                      torch.randn(p["n"], (qh + 2 * kh) * QK_DIM, generator=a.gen).to(fp16))
        q, k = qkv[:, :qh * QK_DIM], qkv[:, qh * QK_DIM:(qh + kh) * QK_DIM]
        q = q if p["q_rank"] == 2 else q.unflatten(1, (qh, QK_DIM))
        k = k if p["k_rank"] == 2 else k.unflatten(1, (kh, QK_DIM))
    else:
        q, k = _qk_heads(a, p, p["q_heads"], p["q_rank"]), _qk_heads(a, p, p["k_heads"], p["k_rank"])
    weights = [rope.filled(a, a.tensor((QK_DIM,), fp16), torch.randn(QK_DIM, generator=a.gen).to(fp16)) for _ in "qk"]
    return dict(q=q, k=k, q_weight=weights[0], k_weight=weights[1], eps=p["eps"])


@invalid_calls(QK_NORM_BAD, qk_params())
def test_qk_norm_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.what in ("overlapping heads (expand)", "misaligned") or bad.what.startswith(SHARED):
        p = dict(p, n=max(p["n"], 2), fused=False)  # rows to overlap or to misalign; own buffers to alias
    args = qk_args(a, p)
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    if via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a number", "negative bit"):
        check_invalid(lambda: torch.ops.kernkit.qk_norm(args["q"], args["k"], args["q_weight"], args["k_weight"],
                                                        args["eps"]), a, bad)
    else:
        check_invalid(lambda: ops.qk_norm(**args), a, bad)


@VALID
@given(p=qk_params())
def test_qk_norm_valid_views_give_the_reference_bytes(p):
    """q and k of 2 and 3 dimensions, on their own or sliced from one QKV tensor (whose v columns
    must stay as they were), n == 0: every buffer matches the reference."""
    a = Arena.seeded(p["seed"])
    args = qk_args(a, p)
    want = a.copies()
    q, k = a.twin(args["q"], want), a.twin(args["k"], want)
    ref_qk_norm(q, k, args["q_weight"], args["k_weight"], p["eps"])
    assert ops.qk_norm(**args) is None
    assert a.same_as(want)
