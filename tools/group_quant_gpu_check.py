#!/usr/bin/env python3
"""Which side is wrong where ``per_token_group_quant_fp8``'s ``q`` differs from a float32 torch
reference computed on the GPU: kernkit's quotient, or torch's?

    PYTHONPATH=$PWD python3 tools/group_quant_gpu_check.py                 # on a GPU
    PYTHONPATH=$PWD python3 tools/group_quant_gpu_check.py --device cpu    # the emulator, anywhere

For each shape (tokens x hidden, a group size, row- or column-major scales, an input dtype) it
computes ``q`` four ways from the same input:

- ``kernkit``: the op on ``--device`` (the GPU; on the CPU, the emulator);
- ``torch-dev``: ``(x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`` in float32 on
  ``--device``, with ``scale = max(amax, 1e-10) / 448`` (``/ 448`` by a Python number, as the
  reference was written: torch's CUDA division by a CPU scalar multiplies by its reciprocal);
- ``torch-cpu``: the same formula on the CPU;
- ``ieee``: the arbiter: the IEEE float32 quotient (a float64 division rounded to float32 is the
  correctly rounded float32 quotient of two float32 values), rounded to E4M3 to nearest even by
  a table of E4M3's values here, not by any conversion under test, with kernkit's scales (the
  op's documented arithmetic). ``exact`` rounds the exact quotient itself, once: it differs from
  ``ieee`` only where the float32 rounding of the quotient lands on an E4M3 midpoint (checked
  with exact fractions wherever the float64 quotient is within 2**-40 of one).

It prints, per shape, how many values (and scales) differ between each pair, which side matches
``ieee``, and splits ``torch-dev``'s differences into its quotient (its float32 quotient against
the IEEE one, with kernkit's scale) and its conversion (torch-dev's ``.to(float8_e4m3fn)`` of the
IEEE quotient against the table). A conversion probe then rounds float32 values at and around
every E4M3 rounding midpoint (one ulp, and an fp16 half-ulp, either side) through torch on the
device, torch on the CPU and kernkit (a float32 group whose maximum is 448 has scale 1: its q is
the conversion of x itself), against the table. Exit status: 0 when kernkit matches ``ieee``
everywhere, 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from fractions import Fraction

import torch

from kernkit import ops

FP8 = torch.float8_e4m3fn
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SIDES = ("kernkit", "torch-dev", "torch-cpu", "ieee", "exact")


def e4m3_values() -> torch.Tensor:
    """The 127 non-negative finite E4M3 values (codes 0x00 to 0x7e), ascending, as float64."""
    codes = torch.arange(127)
    exp, man = codes >> 3, (codes & 7).double()
    return torch.where(exp == 0, man * 2.0**-9, (1 + man / 8) * torch.exp2((exp - 7).double()))


VALUES = e4m3_values()


def round_e4m3(v: torch.Tensor) -> torch.Tensor:
    """float64 ``v`` (no NaN) rounded to E4M3 to nearest, ties to the even code, saturated to
    +-448: the codes (uint8), the sign bit kept (-0.0 is 0x80)."""
    a = v.abs().clamp(max=448.0)
    hi = torch.searchsorted(VALUES, a).clamp(max=126)  # the first value >= a
    lo = (hi - 1).clamp(min=0)
    below, above = a - VALUES[lo], VALUES[hi] - a
    code = torch.where(above < below, hi, torch.where(below < above, lo, torch.where(lo % 2 == 0, lo, hi)))
    code = torch.where(VALUES[hi] == a, hi, code)
    return (code | torch.where(torch.signbit(v), 0x80, 0)).to(torch.uint8)


def round_exact(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` (float32 tensors of one shape) rounded once to E4M3 from the exact quotient:
    the float64 quotient, and exact fractions wherever it lies within 2**-40 of a midpoint."""
    v = x.double() / scale.double()
    codes = round_e4m3(v)
    mids = (VALUES[1:] + VALUES[:-1]) / 2
    a = v.abs().clamp(max=448.0)
    near = torch.searchsorted(mids, a).clamp(max=mids.numel() - 1)
    close = ((a - mids[near]).abs() <= a * 2.0**-40) | ((a - mids[(near - 1).clamp(min=0)]).abs() <= a * 2.0**-40)
    flat_x, flat_s, flat_c = x.reshape(-1), scale.reshape(-1), codes.reshape(-1)
    for i in close.reshape(-1).nonzero().flatten().tolist():
        q = Fraction(float(flat_x[i])) / Fraction(float(flat_s[i]))
        mag, sign = abs(q), 0x80 if q < 0 or (q == 0 and torch.signbit(flat_x[i])) else 0
        best = min(range(127), key=lambda c: (abs(Fraction(float(VALUES[c])) - min(mag, Fraction(448))), c % 2))
        flat_c[i] = best | sign
    return codes


def torch_q(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 torch reference of the issue, where ``x`` lies: ``(q codes, scales)``."""
    t, h = x.shape
    xf = x.float().reshape(t, h // group_size, group_size)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp(min=1e-10) / 448
    q = (xf / scale).clamp(-448, 448).to(FP8)
    return q.view(torch.uint8).reshape(t, h), scale.reshape(t, -1)


def diff(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.cpu().reshape(-1) != b.cpu().reshape(-1)).sum())


def check_shape(dtype: torch.dtype, tokens: int, hidden: int, group_size: int, column_major: bool, seed: int,
                device: torch.device, show: int) -> dict[str, int]:
    """One shape: prints its line (and the first ``show`` differing values); returns the counts."""
    gen = torch.Generator().manual_seed(seed)
    x_cpu = torch.randn(tokens, hidden, generator=gen).to(dtype)
    x_dev = x_cpu.to(device, copy=True)
    groups = hidden // group_size

    q_k, s_k = ops.per_token_group_quant_fp8(x_dev, group_size, column_major_scales=column_major)
    q_k, s_k = q_k.cpu().view(torch.uint8), s_k.cpu().contiguous()
    q_d, s_d = (t.cpu() for t in torch_q(x_dev, group_size))
    q_c, s_c = torch_q(x_cpu, group_size)

    # The arbiters, from kernkit's scales: a scale that differs is counted on its own.
    xf = x_cpu.float().reshape(tokens, groups, group_size)
    s_b = s_k.reshape(tokens, groups, 1).expand_as(xf)
    quotient = (xf.double() / s_b.double()).float()  # the IEEE float32 quotient
    q_ieee = round_e4m3(quotient.double()).reshape(tokens, hidden)
    q_exact = round_exact(xf, s_b.contiguous()).reshape(tokens, hidden)
    q = {"kernkit": q_k, "torch-dev": q_d, "torch-cpu": q_c, "ieee": q_ieee, "exact": q_exact}

    # torch-dev's parts, with kernkit's scale: its float32 quotient, and its conversion of the
    # IEEE quotient.
    dev_quotient = (xf.to(device) / s_b.to(device)).cpu()
    dev_convert = quotient.to(device).clamp(-448, 448).to(FP8).view(torch.uint8).cpu().reshape(tokens, hidden)

    counts = {f"{a}~{b}": diff(q[a], q[b]) for a, b in itertools.combinations(SIDES, 2)}
    amax = torch.maximum(xf.abs().amax(dim=-1), torch.tensor(1e-10, dtype=torch.float32))
    counts["scales kernkit~ieee"] = diff(s_k, (amax.double() / 448).float())
    counts["scales kernkit~torch-dev"] = diff(s_k, s_d)
    counts["scales kernkit~torch-cpu"] = diff(s_k, s_c)
    counts["torch-dev quotient~ieee"] = diff(dev_quotient.view(torch.int32), quotient.view(torch.int32))
    counts["torch-dev conversion~table"] = diff(dev_convert, q_ieee)

    name = (f"{next(k for k, v in DTYPES.items() if v == dtype)} t{tokens} h{hidden} g{group_size} "
            f"{'col' if column_major else 'row'} seed{seed}")
    n = tokens * hidden
    match = [s for s in ("kernkit", "torch-dev", "torch-cpu") if counts[f"{s}~ieee"] == 0]
    differing = ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "nothing"
    print(f"{name}: {n} values; differ: {differing}; matching ieee: {', '.join(match) or 'none'}")
    bad = (q_k != q_ieee) | (q_d != q_ieee)
    for i in bad.reshape(-1).nonzero().flatten()[:show].tolist():
        tok, col = divmod(i, hidden)
        g = col // group_size
        v = float(xf[tok, g, col % group_size])
        print(f"    [{tok}, {col}] x {v!r} scale {float(s_k[tok, g])!r} (torch-dev {float(s_d[tok, g])!r}) "
              f"quotient {float(quotient.reshape(tokens, hidden)[tok, col])!r} (torch-dev "
              f"{float(dev_quotient.reshape(tokens, hidden)[tok, col])!r}): codes kernkit {int(q_k[tok, col]):#04x} "
              f"torch-dev {int(q_d[tok, col]):#04x} torch-cpu {int(q_c[tok, col]):#04x} "
              f"ieee {int(q_ieee[tok, col]):#04x} exact {int(q_exact[tok, col]):#04x}")
    return counts


def probe_values() -> torch.Tensor:
    """float32 values at every positive E4M3 rounding midpoint, one float32 ulp and an fp16
    half-ulp either side, and their negatives."""
    mids = ((VALUES[1:] + VALUES[:-1]) / 2).float()
    ulp = torch.nextafter(mids, torch.full_like(mids, float("inf"))) - mids
    half16 = mids * 2.0**-12
    pos = torch.cat([mids, mids + ulp, mids - ulp, mids + half16, mids - half16, mids + 3 * ulp, mids - 3 * ulp])
    return torch.cat([pos, -pos])


def conversion_probe(device: torch.device) -> dict[str, int]:
    """The probe values rounded to E4M3 by torch on ``device``, torch on the CPU and kernkit
    (through a float32 group whose maximum is 448: scale 1), each against the table."""
    v = probe_values()
    want = round_e4m3(v.double())
    got_dev = v.to(device).to(FP8).view(torch.uint8).cpu()
    got_cpu = v.to(FP8).view(torch.uint8)
    # kernkit: groups of 16, element 0 of each 448 (scale 448 / 448 = 1, x / 1 = x).
    per = 15
    pad = -v.numel() % per
    body = torch.cat([v, torch.zeros(pad)]).reshape(-1, per)
    x = torch.cat([torch.full((body.shape[0], 1), 448.0), body], dim=1).reshape(1, -1)
    q, scales = ops.per_token_group_quant_fp8(x.to(device), 16)
    if not bool((scales.cpu() == 1.0).all()):
        raise AssertionError("the probe's groups must have scale 1")
    got_k = q.cpu().view(torch.uint8).reshape(-1, 16)[:, 1:].reshape(-1)[: v.numel()]
    counts = {"torch-dev": diff(got_dev, want), "torch-cpu": diff(got_cpu, want), "kernkit": diff(got_k, want)}
    print(f"conversion probe, {v.numel()} float32 values at and around E4M3 midpoints, against the table: "
          + ", ".join(f"{k} {n} differ" for k, n in counts.items()))
    for name, got in (("torch-dev", got_dev), ("kernkit", got_k)):
        for i in (got != want).nonzero().flatten()[:5].tolist():
            print(f"    {name}: {float(v[i])!r} -> {int(got[i]):#04x}, nearest-even {int(want[i]):#04x}")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda (the GPU) or cpu (the emulator; torch-dev is then torch on the CPU)")
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=sorted(DTYPES))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 16, 128])
    p.add_argument("--hidden", nargs="+", type=int, default=[1536, 7168])
    p.add_argument("--group-sizes", nargs="+", type=int, default=[64, 128])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--show", type=int, default=3, help="differing values printed per shape")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    totals: dict[str, int] = {}
    shapes = 0
    for dt, t, h, g, col, seed in itertools.product(args.dtypes, args.tokens, args.hidden, args.group_sizes,
                                                   (False, True), args.seeds):
        counts = check_shape(DTYPES[dt], t, h, g, col, seed, device, args.show)
        shapes += 1
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + (v > 0)
    differing = ", ".join(f"{k} {v}" for k, v in totals.items() if v) or "none"
    print(f"{shapes} shapes; shapes with differences: {differing}")
    probe = conversion_probe(device)
    return 0 if totals["kernkit~ieee"] == 0 and probe["kernkit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
