"""``per_token_group_quant_fp8``'s test material: its torch reference, hash cases and invalid
calls."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import Bad
from kernkit.testing.ops import per_token_quant_fp8 as quant

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn


def ue8m0_ceil(scales: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 ``scales`` rounded up to a power of two, at least 2**-127 (UE8M0's
    smallest), by their bits: infinities and NaN are kept, a power of two is kept, anything
    else goes to the next exponent with a zero mantissa."""
    b = scales.view(torch.int32)
    up = torch.where((b & 0x007FFFFF) == 0, b, (b & 0x7F800000) + 0x00800000)
    b = torch.where(b >= 0x7F800000, b, torch.where(b <= 0x00400000, torch.full_like(b, 0x00400000), up))
    return b.view(torch.float32)


def ref_per_token_group_quant_fp8(x: torch.Tensor, group_size: int, column_major_scales: bool = False,
                                  scale_ue8m0: bool = False, eps: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of ``group_size`` consecutive elements of a row of the 2-d ``x``:
    ``amax = max|x|`` and ``m = max(amax, |eps|)``, both compared as the bits of fp32 absolute
    values (so a NaN wins; ``eps`` is taken to fp32), a NaN ``m`` as 0x7fffffff (the NaN the
    GPU's division returns), ``scale = m / 448`` (one fp32 IEEE division), with ``scale_ue8m0``
    rounded up by ``ue8m0_ceil``; ``q = saturate_e4m3(x / scale)``
    with an fp32 IEEE division per element, rounded to nearest even, ``q = 0`` where
    ``scale == 0``, and every NaN E4M3's 0x7f (CUDA's conversion drops a NaN's sign). Returns
    ``(q, scales)``, the scales laid out as the op returns them: row-major float32
    ``[tokens, groups]``; with ``column_major_scales`` float32 of strides ``(1, align(tokens, 4))``;
    with both flags int32 ``[tokens, ceil(groups / 4)]`` of those strides, byte ``i`` of word ``j``
    the exponent byte (bits >> 23) of group ``4 j + i``, 0 past the last group."""
    tokens, hidden = x.shape
    groups = hidden // group_size
    xf = x.float().reshape(tokens, groups, group_size)
    amax_bits = (xf.view(torch.int32) & 0x7FFFFFFF).amax(dim=-1)
    eps_bits = torch.tensor(eps, dtype=torch.float32).view(torch.int32) & 0x7FFFFFFF
    m = torch.maximum(amax_bits, eps_bits)
    m = torch.where(m > 0x7F800000, 0x7FFFFFFF, m).view(torch.float32)  # one NaN, kept by the division
    scales = m / torch.full_like(m, 448.0)  # elementwise IEEE division, never a reciprocal
    if scale_ue8m0:
        scales = ue8m0_ceil(scales)
    s = scales[:, :, None]
    q = torch.where(s == 0, torch.zeros_like(xf), xf / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q_bytes = q.view(torch.uint8).reshape(tokens, hidden)
    q = torch.where(q_bytes == 0xFF, 0x7F, q_bytes).view(torch.float8_e4m3fn)  # -NaN (0xff) as 0x7f
    if not column_major_scales:
        return q, scales
    padded = -(-tokens // 4) * 4
    if not scale_ue8m0:
        out = torch.zeros(groups, padded, dtype=torch.float32, device=x.device).t()[:tokens]
        out.copy_(scales)
        return q, out
    words = -(-groups // 4)
    exponents = torch.zeros(tokens, 4 * words, dtype=torch.uint8, device=x.device)
    exponents[:, :groups] = (scales.view(torch.int32) >> 23).to(torch.uint8)
    out = torch.zeros(words, padded, dtype=torch.int32, device=x.device).t()[:tokens]
    out.copy_(exponents.view(torch.int32))  # little-endian: group 4 j + i in byte i of word j
    return q, out


def group_quant_input(dtype: torch.dtype, tokens: int, width: int, group_size: int, gen: torch.Generator,
                      specials: bool) -> torch.Tensor:
    """Normal values, each group of its own magnitude; with ``specials``, row 0's groups are
    zeros, -0.0, one NaN, two infinities, subnormals and the dtype's largest finite value (the
    kernel writes one NaN for all: 0x7fffffff scales, 0x7f values)."""
    span = 10 if dtype == torch.float16 else 20
    groups = width // group_size
    mag = torch.exp2(torch.randint(-span, span + 1, (tokens, groups, 1), generator=gen).float())
    x = (torch.randn(tokens, groups, group_size, generator=gen) * mag).to(dtype)
    if specials:
        fi = torch.finfo(dtype)
        x[0, 0] = 0.0
        x[0, 1] = -0.0
        x[0, 2, 3] = float("nan")
        x[0, 3, 1], x[0, 3, 2] = float("inf"), float("-inf")
        x[0, 4] = fi.smallest_normal * fi.eps * torch.arange(group_size)
        x[0, 5, 0] = -fi.max
    return x.view(tokens, width)


def group_quant_case(dtype: torch.dtype, group_size: int, tokens: int, groups: int, *, column_major: bool = False,
                     ue8m0: bool = False, offset: int = 0, specials: bool = False, eps: float = 1e-10) -> Case:
    """``per_token_group_quant_fp8`` of ``tokens`` rows of ``groups`` groups. ``offset``: the rows
    are ``x[:, offset : offset + hidden]`` of a buffer ``2 * offset`` wider (odd: the scalar
    variant); the scales are hashed as their view (the column-major padding is not written)."""
    layout = ("col" if column_major else "row") + ("-ue8m0" if ue8m0 else "")
    name = (f"per_token_group_quant_fp8/{SHORT[dtype]}-g{group_size}-t{tokens}-n{groups}-{layout}"
            + (f"-offset{offset}" if offset else "") + ("-specials" if specials else "")
            + (f"-eps{eps:g}" if eps != 1e-10 else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        hidden = groups * group_size
        base = group_quant_input(dtype, tokens, hidden + 2 * offset, 1 if offset else group_size, gen, specials)
        x = base[:, offset : offset + hidden]
        want_q, want_scales = ref_per_token_group_quant_fp8(x, group_size, column_major, ue8m0, eps)
        x_d = to_device(base, device)[:, offset : offset + hidden]
        q, scales = ops.per_token_group_quant_fp8(x_d, group_size, column_major_scales=column_major,
                                                  scale_ue8m0=ue8m0, eps=eps)
        if scales.stride() != want_scales.stride():
            raise AssertionError(f"{name}: scales of strides {scales.stride()}, want {want_scales.stride()}")
        return {"q": (q.cpu(), want_q), "scales": (scales.cpu(), want_scales)}

    return Case(name, "quant/per_token_group_quant_fp8.cuh", run)


def hash_cases() -> list[Case]:
    """Each dtype and scale layout: bf16 x 128 (16 lanes a group, several blocks), fp16 x 64
    column-major, fp32 x 16 packed UE8M0 (a padding byte), bf16 x 128 row-major UE8M0, bf16 x 32
    rows at an odd offset (the scalar variant), and bf16 x 16 special groups with eps 0. Then one
    bf16 token of DeepSeek-V3's widths (hidden 1536 and 7168) in groups of 64 and 128, both
    layouts: bf16 inputs put many quotients on an E4M3 midpoint, where a 1-ulp scale flips q."""
    return [
        group_quant_case(bf16, 128, 33, 8),
        group_quant_case(fp16, 64, 9, 10, column_major=True),
        group_quant_case(fp32, 16, 5, 7, column_major=True, ue8m0=True),
        group_quant_case(bf16, 128, 7, 7, ue8m0=True),
        group_quant_case(bf16, 32, 7, 8, column_major=True, ue8m0=True, offset=3),
        group_quant_case(bf16, 16, 3, 8, specials=True, eps=0.0),
        *(group_quant_case(bf16, g, 1, h // g, column_major=col)
          for h in (1536, 7168) for g in (64, 128) for col in (False, True)),
    ]


GQ_HIDDEN = 48  # 3 groups: the packed UE8M0 word has a padding byte

_GQ_X_BAD, _GQ_OUT_BAD = quant.quant_io_bad(GQ_HIDDEN, [-16, 1, 16], (3, 16))

GROUP_QUANT_BAD = _GQ_X_BAD + [
    Bad("x", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(), (GQ_HIDDEN,), (p["tokens"], 1, GQ_HIDDEN)])),
                                 p["dtype"])),
    Bad("x", "hidden size not a multiple of group_size", ValueError,
        lambda a, p, d: a.tensor((max(p["tokens"], 1), d.draw(st.sampled_from([8, 40, 50]))), p["dtype"])),
    Bad("group_size", "no kernel", ValueError, lambda a, p, d: d.draw(st.sampled_from([0, 8, 12, 96, 256, -16]))),
    Bad("group_size", "not an int", TypeError, lambda a, p, d: d.draw(st.sampled_from([16.0, "16", None, True]))),
    Bad("column_major_scales", "not a bool", TypeError,
        lambda a, p, d: d.draw(st.sampled_from([1, 0, "yes", None, 1.0]))),
    Bad("scale_ue8m0", "not a bool", TypeError, lambda a, p, d: d.draw(st.sampled_from([1, 0, "yes", None, 1.0]))),
    Bad("eps", "negative or not finite", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([-1e-10, -1.0, float("nan"), float("inf"), 1e300]))),
    Bad("eps", "not a number", TypeError, lambda a, p, d: d.draw(st.sampled_from(["1e-10", None, [1e-10], 1j]))),
] + _GQ_OUT_BAD + quant.scales_bad(lambda p: group_scales_layout(GQ_HIDDEN // 16, *p["layout"]))


def group_scales_layout(groups: int, column_major: bool, ue8m0: bool) -> tuple[int, torch.dtype, bool]:
    """The columns, dtype and order of the scales of ``groups`` groups a row in a layout: packed
    exponent words (int32, 4 groups a word) when column-major UE8M0, else fp32 per group."""
    if column_major and ue8m0:
        return -(-groups // 4), torch.int32, True
    return groups, fp32, column_major
