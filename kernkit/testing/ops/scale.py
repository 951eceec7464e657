"""``scale``'s test material: its torch reference, hash cases and invalid calls."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import HUGE, SHARED, Bad, meta, neg_bit, requires_grad

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


def ref_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x * factor``, computed in fp32 and rounded once to the dtype."""
    return (x.float() * factor).to(x.dtype)


def scale_input(dtype: torch.dtype, size: int, gen: torch.Generator) -> torch.Tensor:
    """Normal values of several magnitudes, and the special values of ``dtype`` (infinities,
    zeros of both signs, the largest finite value, subnormals), no NaN."""
    x = torch.randn(size, generator=gen) * torch.exp2(torch.randint(-20, 21, (size,), generator=gen).float())
    x = x.to(dtype)
    fi = torch.finfo(dtype)
    specials = [float("inf"), float("-inf"), 0.0, -0.0, fi.max, -fi.max, fi.smallest_normal, fi.tiny / 4, -fi.eps]
    for p, value in zip(torch.randperm(size, generator=gen).tolist(), specials[: max(0, size - 1)], strict=False):
        x[p] = value
    if torch.isnan(x).any():
        raise AssertionError("scale inputs must hold no NaN")
    return x


def scale_case(dtype: torch.dtype, n: int, factor: float, *, offset: int = 0, out_view: bool = False) -> Case:
    """``scale`` of ``n`` elements. ``offset``: the input starts ``offset`` elements into its
    buffer (1: misaligned, the scalar path); ``out_view``: ``out=`` is the slice ``[1, n + 1)``
    of a buffer of ``n + 2`` (hashed whole)."""
    name = (f"scale/{SHORT[dtype]}-n{n}-f{factor!r}" + (f"-offset{offset}" if offset else "")
            + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        base = scale_input(dtype, n + offset, gen)
        x = base[offset:]
        want = ref_scale(x, factor)
        x_d = to_device(base, device)[offset:]
        if out_view:
            buf = scale_input(dtype, n + 2, gen)
            expect = buf.clone()
            expect[1 : n + 1] = want
            buf_d = to_device(buf, device)
            res = ops.scale(x_d, factor, out=buf_d[1 : n + 1])
            if res.data_ptr() != buf_d[1:].data_ptr():
                raise AssertionError(f"{name}: scale(out=...) did not return out")
            return {"out": (buf_d.cpu(), expect)}
        return {"out": (ops.scale(x_d, factor).cpu(), want)}

    return Case(name, "elementwise/scale.cuh", run)


def hash_cases() -> list[Case]:
    """The kernel-hash cases: the three builds, both paths, ``out=`` views."""
    out = []
    for dtype, sizes in ((fp16, (1, 7, 4099)), (bf16, (9, 100003)), (fp32, (5, 4099))):
        for n in sizes:
            for factor in (1.7, -0.3, 1e-40):
                out.append(scale_case(dtype, n, factor))
        out.append(scale_case(dtype, 1031, -2.5, offset=1))
        out.append(scale_case(dtype, 1029, 0.5, out_view=True))
    out.append(scale_case(fp16, 0, 1.7))
    return out


def _numel(p):
    return math.prod(p["shape"])


SCALE_BAD = [
    Bad("src", "dtype", TypeError,
        lambda a, p, d: a.tensor(p["shape"], d.draw(st.sampled_from(
            [torch.int32, torch.int16, torch.uint8, torch.bool, torch.float64, torch.float8_e4m3fn])))),
    Bad("src", "non-contiguous", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([
            a.tensor((max(_numel(p), 2),), p["dtype"], "step2"),
            a.tensor((4, 3), p["dtype"]).t()]))),
    Bad("src", "stride 0 (expand, maybe 2**40 long)", ValueError,
        lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(_numel(p), 2), HUGE])),), p["dtype"], "expand")),
    Bad("src", "meta tensor", ValueError, lambda a, p, d: meta(p["shape"], p["dtype"])),
    Bad("src", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1.0, 2.0], 2.0]))),
    Bad("out", "dtype", TypeError,
        lambda a, p, d: a.tensor(p["shape"], d.draw(st.sampled_from(
            [bf16 if p["dtype"] == fp32 else fp32, fp16, torch.int32, torch.bool])))),
    Bad("out", "elements differ", ValueError,
        lambda a, p, d: a.tensor((_numel(p) + d.draw(st.sampled_from([1, 5])),), p["dtype"])),
    Bad("out", "other shape, same elements", ValueError,
        lambda a, p, d: a.tensor((_numel(p),) if len(p["shape"]) != 1 else (1, _numel(p)), p["dtype"])),
    Bad("out", "non-contiguous", ValueError,
        lambda a, p, d: a.tensor((max(_numel(p), 2),), p["dtype"], "step2")),
    Bad("out", "transposed", ValueError, lambda a, p, d: a.tensor((3, 4), p["dtype"]).t()),
    Bad("out", "stride 0 (expand)", ValueError,
        lambda a, p, d: a.tensor((max(_numel(p), 2),), p["dtype"], "expand")),
    Bad("out", "meta tensor", ValueError, lambda a, p, d: meta(p["shape"], p["dtype"])),
    Bad("out", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([[0.0], 1.0]))),
    Bad("src", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor(p["shape"], p["dtype"]))),
    Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference(p["shape"], p["dtype"])),
    Bad("out", f"{SHARED}: src shifted", ValueError,
        lambda a, p, d: a.alias(p["args"]["src"], p["shape"], p["dtype"], d.draw(st.sampled_from([1, -1, 5])))),
    Bad("factor", "not a number", TypeError,
        lambda a, p, d: d.draw(st.sampled_from(["2", None, [2.0], torch.tensor(2.0), 1j]))),
]
