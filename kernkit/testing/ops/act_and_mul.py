"""The test material of ``silu_and_mul`` and ``gelu_and_mul``: their float64 references, ulp
bounds, hash cases and invalid calls."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.ops import gelu_and_mul, silu_and_mul
from kernkit.testing import oracle
from kernkit.testing.hashes import SHORT, Case, Outputs, ReferenceMismatch, Within, generator, to_device
from kernkit.testing.invalid import SHARED, Bad, meta, neg_bit, requires_grad
from kernkit.testing.oracle import same_bytes

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


def ref_act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(x[..., :d]) * x[..., d:]`` in float64 (``activation``: ``silu``, ``gelu`` or
    ``gelu_tanh``), from the formulas the ops document: ``v / (1 + exp(-v))``,
    ``0.5 v (1 + erf(v / sqrt 2))``, ``0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))``, the
    last two in the equal forms ``0.5 v erfc(-v / sqrt 2)`` and ``v / (1 + exp(-2 sqrt(2 / pi) (v +
    0.044715 v^3)))``: ``1 + erf`` and ``1 + tanh`` lose up to all their digits to cancellation
    for negative ``v``, in float64 too."""
    g, u = x.double().chunk(2, dim=-1)
    if activation == "silu":
        a = g / (1 + torch.exp(-g))
    elif activation == "gelu":
        a = 0.5 * g * torch.erfc(-g / 2**0.5)
    else:
        a = g / (1 + torch.exp(-2 * (2 / torch.pi) ** 0.5 * (g + 0.044715 * g**3)))
    return a * u


#: The bounds the ops' docstrings state for fp16 and bf16 results (the hardware's approximate
#: exp2 and reciprocal on the GPU), in ulps of the dtype: ``(activation, dtype) -> ulps``.
ACT_BOUND_ULPS = {
    ("silu", torch.bfloat16): 0.51, ("silu", torch.float16): 0.51,
    ("gelu", torch.bfloat16): 0.51, ("gelu", torch.float16): 0.53,
    ("gelu_tanh", torch.bfloat16): 0.51, ("gelu_tanh", torch.float16): 0.52,
}


def act_and_mul_bound(x: torch.Tensor, ref: torch.Tensor, activation: str) -> torch.Tensor:
    """The largest ``|out - ref|`` the ops' docstrings allow for ``x`` (of the op's dtype) and
    its float64 result ``ref``: fp32 4 ulp (silu) or ``8 ulp + 2**-22 (1 + v^2) |ref|`` (gelu;
    ``v`` the gate value); fp16/bf16 ``ACT_BOUND_ULPS`` ulps of the dtype."""
    if x.dtype != torch.float32:
        return ACT_BOUND_ULPS[activation, x.dtype] * oracle.ulp(ref, x.dtype)
    if activation == "silu":
        return 4 * oracle.ulp(ref, torch.float32)
    g = x.double().chunk(2, dim=-1)[0]
    return 8 * oracle.ulp(ref, torch.float32) + 2.0**-22 * (1 + g * g) * ref.abs()


def run(x: torch.Tensor, activation: str, out: torch.Tensor | None = None) -> torch.Tensor:
    if activation == "silu":
        return silu_and_mul(x, out=out)
    return gelu_and_mul(x, "tanh" if activation == "gelu_tanh" else "none", out=out)


ACT_OPS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_tanh": "gelu_and_mul"}


def act_check(name: str, x: torch.Tensor, got: torch.Tensor, activation: str) -> float:
    """``got`` against the float64 result of ``x`` within ``act_and_mul_bound`` (where
    that rounds to an infinity or NaN, ``got`` must be it); the largest error in units of the
    bound's ulp (fp16/bf16: ulps of the dtype). Raises ``ReferenceMismatch`` naming the case."""
    dtype = x.dtype
    ref = ref_act_and_mul(x, activation)
    special = ~ref.to(dtype).isfinite()
    err = (got.double() - ref).abs()
    bound = act_and_mul_bound(x, ref, activation)
    ok = torch.where(special, got.double() == ref.to(dtype).double(), err <= bound)
    if not bool(ok.all()):
        i = int((~ok).reshape(-1).nonzero()[0])
        raise ReferenceMismatch(f"{name}: 'out' is not within the documented bound of the float64 result: "
                                f"element {i}: got {got.reshape(-1)[i].item()!r}, "
                                f"float64 {ref.reshape(-1)[i].item()!r}, "
                                f"bound {bound.reshape(-1)[i].item():.3g}")
    ulps = err[~special] / oracle.ulp(ref[~special], dtype)
    return float(ulps.max()) if ulps.numel() else 0.0


def act_input(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Gate and up values of several magnitudes; zeros of both signs, subnormals and the largest
    finite values among the gates. No NaN and no infinity (a NaN's bits differ between the GPU
    and the CPU; ``act(inf) * 0`` is one)."""
    span = 4 if dtype == torch.float16 else 8
    mag = torch.exp2(torch.randint(-span, span + 1, shape, generator=gen).float())
    x = (torch.randn(shape, generator=gen) * mag).to(dtype)
    fi = torch.finfo(dtype)
    gates = x[..., : shape[-1] // 2].reshape(-1).clone()
    specials = [0.0, -0.0, fi.tiny / 4, -fi.tiny / 4, fi.max, -fi.max, 30.0, -30.0, -90.0, -110.0]
    for p, value in zip(torch.randperm(gates.numel(), generator=gen).tolist(), specials[: gates.numel() // 2],
                        strict=False):
        gates[p] = value
    x[..., : shape[-1] // 2] = gates.reshape(x[..., : shape[-1] // 2].shape)
    if not torch.isfinite(x).all():
        raise AssertionError("act_and_mul inputs must be finite")
    return x


def act_case(activation: str, dtype: torch.dtype, rows: tuple[int, ...], d: int, *, row_pad: int = 0,
             offset: int = 0, out_view: bool = False) -> Case:
    """``activation``-and-mul of ``rows`` rows (``(tokens,)`` or ``(batch, tokens)``) of ``2 d``.
    ``row_pad``/``offset``: x is ``[..., offset : offset + 2 d]`` of rows ``2 d + row_pad`` wide
    (an odd offset: the scalar variant); ``out_view``: ``out=`` starts one element into a buffer
    two rows longer than it (hashed whole)."""
    name = (f"{ACT_OPS[activation]}/{activation}-{SHORT[dtype]}-d{d}-r{'x'.join(map(str, rows))}"
            + (f"-pad{row_pad}" if row_pad else "") + (f"-offset{offset}" if offset else "")
            + ("-out_view" if out_view else ""))
    approximate = "tanh" if activation == "gelu_tanh" else "none"

    def call(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if activation == "silu":
            return ops.silu_and_mul(x, out=out)
        return ops.gelu_and_mul(x, approximate, out=out)

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = act_input(dtype, (*rows, 2 * d + row_pad), gen)
        x = base[..., offset : offset + 2 * d]
        x_d = to_device(base, device)[..., offset : offset + 2 * d]
        n = math.prod(rows) * d
        if out_view:
            buf = act_input(dtype, (n + 2 * d + 1,), gen)
            buf_d = to_device(buf, device)
            out_d = buf_d[1 : n + 1].view(*rows, d)
            if call(x_d, out_d).data_ptr() != out_d.data_ptr():
                raise AssertionError(f"{name}: out= was not returned")
            whole = buf_d.cpu()
            got = whole[1 : n + 1].view(*rows, d)
            if not same_bytes(torch.cat([whole[:1], whole[n + 1 :]]), torch.cat([buf[:1], buf[n + 1 :]])):
                raise ReferenceMismatch(f"{name}: bytes outside 'out' were written")
        else:
            got = call(x_d, None).cpu()
            whole = got
        max_ulps = act_check(name, x, got, activation)
        if dtype == torch.float32:
            return {"out": (whole, whole.clone())}  # exact: the hash of the checked output
        return {"out": Within(whole, ACT_BOUND_ULPS[activation, dtype], max_ulps)}

    return Case(name, "activation/act_and_mul.cuh", run, approximate=dtype != torch.float32)


def hash_cases() -> list[Case]:
    out = []
    for activation in ("silu", "gelu", "gelu_tanh"):
        for dtype in (bf16, fp16, fp32):
            out += [
                act_case(activation, dtype, (1,), 8),
                act_case(activation, dtype, (7,), 1000),
                act_case(activation, dtype, (5,), 136, row_pad=24, offset=1),  # strided, misaligned: scalar
                act_case(activation, dtype, (2, 3), 64, row_pad=16),  # 3-d, strided rows, vectors
            ]
        out.append(act_case(activation, bf16, (33,), 4096))
        out.append(act_case(activation, fp16, (3,), 40, out_view=True))
        out.append(act_case(activation, fp32, (0,), 16))
    return out


def _act_out_shape(p):
    return (*p["lead"], p["d"])


ACT_BAD = [
    Bad("x", "unsupported dtype", TypeError,
        lambda a, p, d: a.tensor((*p["lead"], 2 * p["d"]), d.draw(st.sampled_from(
            [torch.int32, torch.int16, torch.bool, torch.float64, torch.float8_e4m3fn])))),
    Bad("x", "odd last dimension", ValueError,
        lambda a, p, d: a.tensor((*p["lead"], d.draw(st.sampled_from([1, 2 * p["d"] + 1]))), p["dtype"])),
    Bad("x", "0-d", ValueError, lambda a, p, d: a.tensor((), p["dtype"])),
    Bad("x", "strided last dimension", ValueError, lambda a, p, d: a.tensor((3, 2 * p["d"]), p["dtype"], "step2")),
    Bad("x", "rows not evenly spaced", ValueError,
        lambda a, p, d: a.tensor((3, 2, 2 * p["d"]), p["dtype"]).transpose(0, 1)),
    Bad("x", "meta tensor", ValueError, lambda a, p, d: meta((*p["lead"], 2 * p["d"]), p["dtype"])),
    Bad("x", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0] * 16], 2.0]))),
    Bad("x", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((*p["lead"], 2 * p["d"]), p["dtype"]))),
    Bad("out", "dtype", TypeError,
        lambda a, p, d: a.tensor(_act_out_shape(p), d.draw(st.sampled_from(
            [bf16 if p["dtype"] == fp32 else fp32, fp16, torch.int32, torch.bool])))),
    Bad("out", "last dimension", ValueError,
        lambda a, p, d: a.tensor((*p["lead"], d.draw(st.sampled_from([p["d"] + 1, 2 * p["d"], p["d"] - 1]))),
                                 p["dtype"])),
    Bad("out", "leading dimensions", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(5, p["d"]), (1, 1, 1, p["d"])]))
                                 if p["lead"] not in ((5,),) else (4, p["d"]), p["dtype"])),
    Bad("out", "non-contiguous", ValueError, lambda a, p, d: a.tensor((3, p["d"]), p["dtype"], "step2")),
    Bad("out", "overlapping rows (expand)", ValueError, lambda a, p, d: a.tensor((3, p["d"]), p["dtype"], "expand")),
    Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(_act_out_shape(p), p["dtype"])),
    Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
    Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(_act_out_shape(p), p["dtype"]))),
    Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(_act_out_shape(p), p["dtype"]))),
    Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(_act_out_shape(p), p["dtype"])),
    Bad("out", f"{SHARED}: x shifted", ValueError,
        lambda a, p, d: a.alias(p["args"]["x"], _act_out_shape(p), p["dtype"], d.draw(st.sampled_from([0, 1, -1, 5])))),
    Bad("approximate", "unknown", ValueError, lambda a, p, d: d.draw(st.sampled_from(["erf", "", "TANH", "exact"]))),
    Bad("approximate", "not a string", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, 1, ["tanh"], True]))),
]
