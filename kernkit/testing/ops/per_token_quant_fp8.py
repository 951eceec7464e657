"""``per_token_quant_fp8``'s test material: its torch reference, hash cases and invalid calls."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import SHARED, Arena, Bad, meta, neg_bit, requires_grad

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn


def ref_per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x`` (last dimension, at least one element): ``scale = max|x| / 448`` in fp32
    (a NaN wins the max, as in ``amax``), ``q = saturate_e4m3(x / scale)`` with an fp32 IEEE
    division per element, rounded to nearest even, and ``q = 0`` where ``scale == 0``. Returns
    ``(q, scales)``, ``scales`` shaped ``[*x.shape[:-1], 1]``."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scales = amax / torch.full_like(amax, 448.0)  # elementwise IEEE division, never a reciprocal
    q = torch.where(scales == 0, torch.zeros_like(xf), xf / scales).clamp(-448.0, 448.0)
    return q.to(torch.float8_e4m3fn), scales


def rows(tokens: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Normal rows, each of its own magnitude (2**-20 to 2**20, within the dtype's range)."""
    gen = torch.Generator().manual_seed(seed)
    lo = -12 if dtype == fp16 else -20
    hi = 12 if dtype == fp16 else 20
    mag = torch.exp2(torch.randint(lo, hi + 1, (tokens, 1), generator=gen).float())
    return (torch.randn(tokens, hidden, generator=gen) * mag).to(dtype)


def quant_input(dtype: torch.dtype, tokens: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """Normal rows, each of its own magnitude; where there are rows enough, a zero row, a row of
    -0.0, a row holding the dtype's largest finite value and one holding subnormals. No NaN and
    no infinity: either makes a NaN, whose sign the GPU and the CPU choose differently."""
    span = 10 if dtype == torch.float16 else 20  # fp16 overflows past 65504
    mag = torch.exp2(torch.randint(-span, span + 1, (tokens, 1), generator=gen).float())
    x = (torch.randn(tokens, width, generator=gen) * mag).to(dtype)
    fi = torch.finfo(dtype)
    specials = [0.0, -0.0, None, None]
    for i, value in enumerate(specials[: max(0, tokens - 1)]):
        if value is not None:
            x[i + 1] = value
    if tokens > 3:
        x[3, width // 2] = -fi.max
    if tokens > 4:
        x[4] = x[4].float().mul(fi.tiny).to(dtype)
    if not torch.isfinite(x).all():
        raise AssertionError("per_token_quant_fp8 inputs must be finite")
    return x


def quant_case(dtype: torch.dtype, hidden: int, tokens: int, *, row_pad: int = 0, offset: int = 0,
               out_view: bool = False) -> Case:
    """``per_token_quant_fp8`` of ``tokens`` rows of ``hidden``. ``row_pad``/``offset``: the rows
    are ``x[:, offset : offset + hidden]`` of a ``hidden + row_pad`` wide buffer (an odd offset:
    the scalar variant); ``out_view``: ``out=`` is a view ``hidden`` bytes into a buffer of
    random bytes two rows longer (hashed whole)."""
    name = (f"per_token_quant_fp8/{SHORT[dtype]}-h{hidden}-t{tokens}" + (f"-pad{row_pad}" if row_pad else "")
            + (f"-offset{offset}" if offset else "") + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = quant_input(dtype, tokens, hidden + row_pad, gen)
        x = base[:, offset : offset + hidden]
        want_q, want_scales = ref_per_token_quant_fp8(x)
        x_d = to_device(base, device)[:, offset : offset + hidden]
        if out_view:
            buf = torch.randint(0, 256, ((tokens + 2) * hidden,), dtype=torch.uint8, generator=gen)
            expect = buf.clone()
            expect[hidden : (tokens + 1) * hidden] = want_q.view(torch.uint8).reshape(-1)
            buf_d = to_device(buf, device)
            out = buf_d[hidden : (tokens + 1) * hidden].view(torch.float8_e4m3fn).view(tokens, hidden)
            q, scales = ops.per_token_quant_fp8(x_d, out=out)
            if q.data_ptr() != out.data_ptr():
                raise AssertionError(f"{name}: per_token_quant_fp8(out=...) did not return out")
            return {"q": (buf_d.cpu(), expect), "scales": (scales.cpu(), want_scales)}
        q, scales = ops.per_token_quant_fp8(x_d)
        return {"q": (q.cpu(), want_q), "scales": (scales.cpu(), want_scales)}

    return Case(name, "quant/per_token_quant_fp8.cuh", run)


def hash_cases() -> list[Case]:
    """Four builds: bf16 x 4096 (4 warps), fp16 x 5120 (5 warps), fp32 x 100 (one warp, and the
    scalar variant for misaligned rows), bf16 x 7 (scalar only)."""
    return [
        quant_case(bf16, 4096, 0),
        quant_case(bf16, 4096, 1),
        quant_case(bf16, 4096, 33),
        quant_case(bf16, 4096, 7, row_pad=512, offset=256),
        quant_case(bf16, 4096, 7, out_view=True),
        quant_case(fp16, 5120, 9),
        quant_case(fp16, 5120, 5, row_pad=8, offset=8, out_view=True),
        quant_case(fp32, 100, 513),
        quant_case(fp32, 100, 17, row_pad=3, offset=1),
        quant_case(bf16, 7, 65),
        quant_case(bf16, 7, 9, row_pad=1, offset=1, out_view=True),
    ]


QUANT_HIDDEN = 32

fp8 = torch.float8_e4m3fn


def quant_x_out(a: Arena, p: dict, hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fp8 quant ops' ``x`` (``[tokens, hidden]``, laid out as ``p["x_layout"]``, random
    normal values: no NaN bit patterns) and ``out`` (None, or fp8 laid out as ``p["out"]``)."""
    shape = (p["tokens"], hidden)
    x = a.tensor(shape, p["dtype"], p["x_layout"])
    rows = x[:1] if p["x_layout"] == "expand" else x  # every row of an expanded x is row 0
    rows.copy_(torch.randn(rows.shape, generator=a.gen).to(p["dtype"]))
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return x, None if p["out"] is None else a.tensor(shape, fp8, p["out"])


def quant_io_bad(hidden: int, hidden_deltas: list[int], split: tuple[int, int]) -> tuple[list[Bad], list[Bad]]:
    """The bad ``x`` and ``out`` both fp8 quant ops refuse, for rows of ``hidden`` elements:
    ``out`` wider or narrower by ``hidden_deltas``, or of rank 3 as ``[tokens, *split]``."""
    def shape(p):
        return (p["tokens"], hidden)

    x = [
        Bad("x", "dtype", TypeError,
            lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64, fp8])))),
        Bad("x", "step 2 in the last dimension", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 1), hidden), p["dtype"], "step2")),
        Bad("x", "transposed", ValueError, lambda a, p, d: a.tensor((hidden, max(p["tokens"], 2)), p["dtype"]).t()),
        Bad("x", "meta tensor", ValueError, lambda a, p, d: meta(shape(p), p["dtype"])),
        Bad("x", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0, 2.0]], 2.0]))),
        Bad("x", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), p["dtype"]))),
    ]
    out = [
        Bad("out", "dtype", TypeError,
            lambda a, p, d: a.tensor(shape(p), d.draw(st.sampled_from(
                [p["dtype"], fp16, torch.uint8, torch.int8, torch.float8_e5m2])))),
        Bad("out", "other rows", ValueError,
            lambda a, p, d: a.tensor((p["tokens"] + d.draw(st.sampled_from([1, 5])), hidden), fp8)),
        Bad("out", "other hidden size", ValueError,
            lambda a, p, d: a.tensor((p["tokens"], hidden + d.draw(st.sampled_from(hidden_deltas))), fp8)),
        Bad("out", "other rank, same elements", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["tokens"] * hidden,), (p["tokens"], *split)])), fp8)),
        Bad("out", "non-contiguous", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 2), hidden), fp8, d.draw(st.sampled_from(["step2", "padded"])))),
        Bad("out", "transposed", ValueError, lambda a, p, d: a.tensor((hidden, max(p["tokens"], 2)), fp8).t()),
        Bad("out", "stride 0 (expand)", ValueError,
            lambda a, p, d: a.tensor((max(p["tokens"], 2), hidden), fp8, "expand")),
        Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(shape(p), fp8)),
        Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
        Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(shape(p), fp8))),
        Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(shape(p), fp8))),
        Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(shape(p), fp8)),
        Bad("out", f"{SHARED}: x's bytes", ValueError,
            lambda a, p, d: a.alias(p["args"]["x"], shape(p), fp8, d.draw(st.sampled_from([0, 1, 17])))),
    ]
    return x, out


_QUANT_X_BAD, _QUANT_OUT_BAD = quant_io_bad(QUANT_HIDDEN, [-1, 1, 32], (2, 16))

def scales_view(a: Arena, tokens: int, cols: int, dtype: torch.dtype, column_major: bool) -> torch.Tensor:
    """Scales ``[tokens, cols]`` of ``dtype`` in an arena buffer: contiguous, or column-major with
    the tokens padded to a multiple of 4 (``buf.t()[:tokens]``, the quant ops' TMA layout)."""
    if not column_major:
        return a.tensor((tokens, cols), dtype)
    return a.tensor((cols, -(-tokens // 4) * 4), dtype).t()[:tokens]


def scales_bad(layout: Callable[[dict], tuple[int, torch.dtype, bool]]) -> list[Bad]:
    """The bad ``out_scales`` of a quant op whose scales, for the parameters ``p``, are
    ``layout(p) = (columns, dtype, column-major)``. The calls have at least 2 tokens
    (``quant_bad_args``), so that a layout can be wrong."""
    def view(a, p, tokens=0, cols=0, dtype=None, flip=False):
        c, dt, cm = layout(p)
        return scales_view(a, p["tokens"] + tokens, c + cols, dtype or dt, cm != flip)

    def other_layout(a, p, d):  # with one column the column-major view is contiguous: rows 2 apart
        c, dt, cm = layout(p)
        return a.tensor((p["tokens"], c), dt, "step2") if c == 1 else view(a, p, flip=True)

    return [
        Bad("out_scales", "dtype", TypeError, lambda a, p, d: view(a, p, dtype=d.draw(st.sampled_from(
            [t for t in (fp32, torch.int32, fp16, torch.float64, torch.uint8) if t != layout(p)[1]])))),
        Bad("out_scales", "other rows", ValueError, lambda a, p, d: view(a, p, tokens=d.draw(st.sampled_from([1, 5])))),
        Bad("out_scales", "other columns", ValueError, lambda a, p, d: view(a, p, cols=1)),
        Bad("out_scales", "other layout", ValueError, other_layout),
        Bad("out_scales", "meta tensor", ValueError, lambda a, p, d: meta((p["tokens"], layout(p)[0]), layout(p)[1])),
        Bad("out_scales", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
        Bad("out_scales", "negative bit", ValueError, neg_bit(lambda a, p, d: view(a, p))),
        Bad("out_scales", "requires grad", RuntimeError,  # fp32: an int32 tensor cannot require grad
            requires_grad(lambda a, p, d: view(a, p, dtype=fp32))),
        Bad("out_scales", "inference tensor", RuntimeError,
            lambda a, p, d: a.inference((p["tokens"], layout(p)[0]), layout(p)[1])),
        Bad("out_scales", f"{SHARED}: x's bytes", ValueError,
            lambda a, p, d: a.alias(p["args"]["x"], (p["tokens"], layout(p)[0]), layout(p)[1])),
        Bad("out_scales", f"{SHARED}: out's bytes", ValueError,
            lambda a, p, d: a.alias(p["args"]["out"], (p["tokens"], layout(p)[0]), layout(p)[1])),
    ]


QUANT_BAD = _QUANT_X_BAD + [
    Bad("x", "0-d", ValueError, lambda a, p, d: a.tensor((), p["dtype"])),
    Bad("x", "hidden size 0", ValueError, lambda a, p, d: a.tensor((max(p["tokens"], 1), 0), p["dtype"])),
] + _QUANT_OUT_BAD + scales_bad(lambda p: (1, fp32, False))


def quant_bad_args(a: Arena, p: dict, bad: Bad, d, make_args: Callable) -> dict:
    """The arguments of a quant op's call with ``bad`` in place; the other tensors are remade
    where they would otherwise be named first (only the bad argument is wrong)."""
    if bad.what.startswith(SHARED):
        p = dict(p, tokens=7, x_layout="contiguous")  # bytes to share
    if bad.arg == "out_scales":
        p = dict(p, tokens=max(p["tokens"], 2), out=p["out"] or "contiguous")  # a layout to get wrong; out's bytes
    args = make_args(a, p)
    value = bad.make(a, dict(p, args=args), d)
    if bad.arg == "out" and bad.what in ("non-contiguous", "transposed", "stride 0 (expand)"):
        args["x"] = a.tensor(value.shape, p["dtype"])  # the same shape, contiguous: only out is wrong
        args["x"].copy_(torch.randn(value.shape, generator=a.gen).to(p["dtype"]))
        a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
        args["out_scales"] = None  # x's rows are others now
    if bad.arg == "x" and args["out"] is not None and isinstance(value, torch.Tensor) and value.dim() == 2:
        args["out"] = a.tensor(value.shape, fp8)  # matching sizes: only x is wrong
    args[bad.arg] = value
    return args
