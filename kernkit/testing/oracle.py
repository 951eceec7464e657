"""Torch implementations of kernkit's ops: the tests' oracle. They compute what the kernels must
produce on valid arguments, and check nothing."""

from __future__ import annotations

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as uint8 (its last dimension scaled by the element size): copies keep every bit
    (NaN payloads, -0.0) and work for dtypes index_put does not take (fp8)."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """``k_cache[indices[i]] = k[i]`` and ``v_cache[indices[i]] = v[i]`` for every ``i`` whose
    index lies in ``[0, pool)``; other rows are skipped. In place."""
    valid = (indices >= 0) & (indices < k_cache.shape[0])
    idx = indices[valid].long()
    rows = tuple(_bytes(k_cache).shape[1:])
    _bytes(k_cache)[idx] = _bytes(k)[valid].reshape((-1, *rows))
    _bytes(v_cache)[idx] = _bytes(v)[valid].reshape((-1, *rows))


def indexing(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, start: int, length: int) -> None:
    """``out[t] = weight[ids[t] - start]``, a zero row where ``ids[t]`` is outside
    ``[start, start + length)``. Writes ``out``."""
    local = ids.long() - start  # wraps where ids < start; those rows are not valid
    valid = (ids.long() >= start) & (local < length)
    dst = _bytes(out)
    dst.zero_()
    dst[valid] = _bytes(weight)[local[valid]]


def compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The length of the common prefix of two 1-d tensors."""
    n = min(a.shape[0], b.shape[0])
    diff = torch.nonzero(a[:n] != b[:n])
    return int(diff[0, 0]) if diff.numel() else n


def scale(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    """``out = src * factor``, computed in fp32 and rounded once to the dtype."""
    out.copy_(src.float() * factor)


# ----- per_token_quant_fp8


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x`` (last dimension, at least one element): ``scale = max|x| / 448`` in fp32
    (a NaN wins the max, as in ``amax``), ``q = saturate_e4m3(x / scale)`` with an fp32 IEEE
    division per element, rounded to nearest even, and ``q = 0`` where ``scale == 0``. Returns
    ``(q, scales)``, ``scales`` shaped ``[*x.shape[:-1], 1]``."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scales = amax / torch.full_like(amax, 448.0)  # elementwise IEEE division, never a reciprocal
    q = torch.where(scales == 0, torch.zeros_like(xf), xf / scales).clamp(-448.0, 448.0)
    return q.to(torch.float8_e4m3fn), scales


# ----- per_token_group_quant_fp8


def ue8m0_ceil(scales: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 ``scales`` rounded up to a power of two, at least 2**-127 (UE8M0's
    smallest), by their bits: infinities and NaN are kept, a power of two is kept, anything
    else goes to the next exponent with a zero mantissa."""
    b = scales.view(torch.int32)
    up = torch.where((b & 0x007FFFFF) == 0, b, (b & 0x7F800000) + 0x00800000)
    b = torch.where(b >= 0x7F800000, b, torch.where(b <= 0x00400000, torch.full_like(b, 0x00400000), up))
    return b.view(torch.float32)


def per_token_group_quant_fp8(x: torch.Tensor, group_size: int, column_major_scales: bool = False,
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


# ----- rotary_embedding


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


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                     is_neox: bool = True, head_dim: int | None = None) -> None:
    """Rotary embedding of q and k in place: pairs (i, i + rot/2) with ``is_neox``, else (2i, 2i+1);
    ``x * cos - y * sin`` and ``y * cos + x * sin`` as fp32 products and one fp32 subtraction /
    addition, rounded once to the dtype. Tokens whose position is outside ``[0, max_position)``
    are left unchanged; the elements of a head after ``rot_dim`` too."""
    if head_dim is None:
        head_dim = q.shape[2] if q.dim() == 3 else cos_sin_cache.shape[1]
    for x in (q, k):
        _rope_heads(x, positions, cos_sin_cache, is_neox, head_dim)


def rotary_embedding_store(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           out_loc: torch.Tensor, is_neox: bool = True, head_dim: int | None = None) -> None:
    """``rotary_embedding`` of q and k, then ``store_cache`` of the rotated k and of v at
    ``out_loc``. In place."""
    rotary_embedding(positions, q, k, cos_sin_cache, is_neox, head_dim)
    store_cache(k_cache, v_cache, out_loc, k, v)


# ----- rmsnorm


def _norm_layout(itemsize: int, hidden: int, target: int = 4) -> tuple[int, int, int]:
    """``(vec, threads, per_thread)`` of ``NormLayout`` in ``kernkit/kernels/norm/rmsnorm.cuh``
    with ``target`` vectors a thread: elements per 16-byte vector, threads per row, vectors per
    thread (vector ``j`` belongs to thread ``j % threads``)."""
    vec = 16 // itemsize
    vecs = hidden // vec
    wanted = -(-vecs // target)
    if wanted <= 32:
        threads = 1 << (wanted - 1).bit_length()
    else:
        threads = min(1024, -(-wanted // 32) * 32)
    return vec, threads, -(-vecs // threads)


def _butterfly(v: torch.Tensor, width: int) -> torch.Tensor:
    """``warp::reduce_sum<width>`` over the last dimension (groups of ``width`` lanes): each lane
    adds its partner's value at XOR distances width/2, ..., 1, in fp32."""
    lanes = torch.arange(v.shape[-1])
    mask = width // 2
    while mask >= 1:
        v = v + v[..., lanes ^ mask]
        mask //= 2
    return v


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` of fp32 tensors with one rounding to fp32, as ``__fmaf_rn``. The product is
    exact in float64 (2 * 24 <= 53 bits); the sum is rounded to odd (TwoSum gives its error, and
    an inexact sum with an even last bit steps one float64 toward the exact value), and a value
    rounded to odd with 53 >= 24 + 2 bits rounds to fp32 as the exact one would. Finite values
    whose exact result fits float64; an infinite or NaN result is the one float64 gives."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bb = s - p
    e = (p - (s - bb)) + (cd - bb)  # s + e == p + c exactly
    step = (e != 0) & (s.view(torch.int64) % 2 == 0) & s.isfinite()
    s = torch.where(step, torch.nextafter(s, torch.where(e > 0, torch.inf, -torch.inf).double()), s)
    return s.float()


def rsqrt32(v: torch.Tensor) -> torch.Tensor:
    """``1 / sqrt(v)`` of an fp32 tensor correctly rounded to fp32, as ``__frsqrt_rn``: the
    float64 root and division, rounded to fp32 (correct for every fp32 input; test_norm.py checks
    every input of [1, 4), to which scaling by powers of 4 reduces the others)."""
    return (1.0 / torch.sqrt(v.double())).float()


def _row_inv_rms(xf: torch.Tensor, eps: float, itemsize: int, target: int = 4) -> torch.Tensor:
    """``1 / sqrt(sum(x**2) * (1 / hidden) + eps)`` of each row of the fp32 ``[rows, hidden]``
    tensor ``xf``, with the kernel's fp32 operations in the kernel's order (each thread's squares
    summed per vector position in order, each by a fused multiply-add; those sums by a halving
    tree; then the butterfly within the row's group of lanes, or within each warp and then the
    warps' sums in warp order; then one fused multiply-add and the correctly rounded reciprocal
    root); shaped ``[rows, 1]``."""
    rows, hidden = xf.shape
    vec, threads, per_thread = _norm_layout(itemsize, hidden, target)
    padded = torch.zeros(rows, per_thread * threads * vec, dtype=torch.float32)
    padded[:, :hidden] = xf  # missing vectors add +0.0, which changes no sum of squares
    padded = padded.view(rows, per_thread, threads, vec)
    acc = torch.zeros(rows, threads, vec, dtype=torch.float32)
    for i in range(per_thread):  # each position of the vectors, in order (the kernel's acc[k])
        acc = fma32(padded[:, i], padded[:, i], acc)
    w = vec // 2
    while w >= 1:  # tree_sum: acc[k] + acc[k + w], halving
        acc = acc[..., :w] + acc[..., w : 2 * w]
        w //= 2
    acc = acc[..., 0]
    if threads <= 32:
        total = _butterfly(acc, threads)[:, :1]
    else:
        warps = _butterfly(acc.view(rows, threads // 32, 32), 32)[:, :, 0]
        total = warps[:, :1]
        for i in range(1, threads // 32):  # the warps' sums added in warp order
            total = total + warps[:, i : i + 1]
    inv_hidden = torch.ones((), dtype=torch.float32) / torch.tensor(float(hidden), dtype=torch.float32)
    eps32 = torch.tensor(eps, dtype=torch.float32)
    return rsqrt32(fma32(total, inv_hidden.expand_as(total), eps32.expand_as(total)))


def rmsnorm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, target: int = 4) -> None:
    """``out = (x * inv_rms) * weight`` per row of ``[..., hidden]``, in fp32 with the kernel's
    order of operations (``_row_inv_rms``; ``target`` vectors a thread), rounded once to the
    dtype: the kernel's bits."""
    xf = x.reshape(-1, x.shape[-1]).float()
    r = _row_inv_rms(xf, eps, x.element_size(), target)
    out.copy_((xf * r * weight.float()).view(x.shape))


def qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float) -> None:
    """In place, ``rmsnorm`` of each head of ``q`` (``[tokens, heads, head_dim]`` or
    ``[tokens, heads * head_dim]``) and of ``k``, with ``qk_norm_kernel``'s layout: 2 vectors a
    thread, or as many as keep a head inside one warp."""
    head_dim = q_weight.shape[0]
    vecs = head_dim * q.element_size() // 16
    target = max(2, -(-vecs // 32))
    for t, w in ((q, q_weight), (k, k_weight)):
        heads = t.unflatten(-1, (-1, head_dim)) if t.dim() == 2 else t
        rmsnorm(heads, heads.clone(), w, eps, target)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: ``s = x + residual`` in fp32; ``residual = s`` rounded to the dtype; ``x`` is
    ``rmsnorm`` of the fp32 ``s`` (not of its rounded copy), as flashinfer's FusedAddRMSNorm."""
    s = x.reshape(-1, x.shape[-1]).float() + residual.reshape(-1, x.shape[-1]).float()
    r = _row_inv_rms(s, eps, x.element_size())
    residual.copy_(s.view(x.shape))
    x.copy_((s * r * weight.float()).view(x.shape))


def rmsnorm64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` in float64, of the values ``x`` holds: what the norm
    ops' stated accuracy is measured against."""
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def rmsnorm_bound(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The largest ``|out - ref|`` the norm ops' docstrings allow for a result of ``dtype``:
    ``(u + 128 * 2**-24) * |ref|`` (``u`` the unit roundoff, half of ``eps``) plus the smallest
    subnormal."""
    fi = torch.finfo(dtype)
    return (fi.eps / 2 + 128 * 2.0**-24) * ref.abs() + fi.smallest_normal * fi.eps


# ----- silu_and_mul, gelu_and_mul

#: Significand bits after the point and the smallest subnormal of each float dtype.
_FLOAT_BITS = {torch.float32: (23, 2.0**-149), torch.float16: (10, 2.0**-24), torch.bfloat16: (7, 2.0**-133)}


def act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
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


def ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at each (float64) value of ``ref``; the smallest
    subnormal below the normal range."""
    bits, tiny = _FLOAT_BITS[dtype]
    _, e = torch.frexp(ref.abs())
    return torch.ldexp(torch.ones_like(ref), e - 1 - bits).clamp_min(tiny)


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
        return ACT_BOUND_ULPS[activation, x.dtype] * ulp(ref, x.dtype)
    if activation == "silu":
        return 4 * ulp(ref, torch.float32)
    g = x.double().chunk(2, dim=-1)[0]
    return 8 * ulp(ref, torch.float32) + 2.0**-22 * (1 + g * g) * ref.abs()
