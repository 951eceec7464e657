"""The test material of ``rmsnorm`` and ``fused_add_rmsnorm``: their torch references (kernkit's
order and transformers'), hash cases and invalid calls."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing import oracle
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import SHARED, Arena, Bad, meta, neg_bit, requires_grad

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


def norm_layout(itemsize: int, hidden: int, target: int = 4) -> tuple[int, int, int]:
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


def row_inv_rms(xf: torch.Tensor, eps: float, itemsize: int, target: int = 4) -> torch.Tensor:
    """``1 / sqrt(sum(x**2) * (1 / hidden) + eps)`` of each row of the fp32 ``[rows, hidden]``
    tensor ``xf``, with the kernel's fp32 operations in the kernel's order (each thread's squares
    summed per vector position in order, each by a fused multiply-add; those sums by a halving
    tree; then the butterfly within the row's group of lanes, or within each warp and then the
    warps' sums in warp order; then one fused multiply-add and the correctly rounded reciprocal
    root); shaped ``[rows, 1]``."""
    rows, hidden = xf.shape
    vec, threads, per_thread = norm_layout(itemsize, hidden, target)
    padded = torch.zeros(rows, per_thread * threads * vec, dtype=torch.float32)
    padded[:, :hidden] = xf  # missing vectors add +0.0, which changes no sum of squares
    padded = padded.view(rows, per_thread, threads, vec)
    acc = torch.zeros(rows, threads, vec, dtype=torch.float32)
    for i in range(per_thread):  # each position of the vectors, in order (the kernel's acc[k])
        acc = oracle.fma32(padded[:, i], padded[:, i], acc)
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
    return oracle.rsqrt32(oracle.fma32(total, inv_hidden.expand_as(total), eps32.expand_as(total)))


def _scaled(xf: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, cast: bool) -> torch.Tensor:
    """``(x * inv_rms) * weight`` in fp32, with ``x * inv_rms`` first rounded to ``dtype`` when
    ``cast`` (``cast_x_before_out_mul``)."""
    xr = xf * r
    return (xr.to(dtype).float() if cast else xr) * weight.float()


def ref_rmsnorm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, target: int = 4,
                cast: bool = False) -> None:
    """``out = (x * inv_rms) * weight`` per row of ``[..., hidden]``, in fp32 with the kernel's
    order of operations (``_row_inv_rms``; ``target`` vectors a thread), rounded once to the
    dtype (with ``cast``, also ``x * inv_rms`` before the product): the kernel's bits."""
    xf = x.reshape(-1, x.shape[-1]).float()
    r = row_inv_rms(xf, eps, x.element_size(), target)
    out.copy_(_scaled(xf, r, weight, x.dtype, cast).view(x.shape))


def ref_fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                          cast: bool = False) -> None:
    """In place: ``s = x + residual`` in fp32; ``residual = s`` rounded to the dtype; ``x`` is
    ``rmsnorm`` of the fp32 ``s`` (not of its rounded copy), as flashinfer's FusedAddRMSNorm, or
    with ``cast`` ``rmsnorm(residual, cast=True)`` of the rounded sum (transformers' layer)."""
    s = x.reshape(-1, x.shape[-1]).float() + residual.reshape(-1, x.shape[-1]).float()
    if cast:
        s = s.to(x.dtype).float()
    r = row_inv_rms(s, eps, x.element_size())
    residual.copy_(s.view(x.shape))
    x.copy_(_scaled(s, r, weight, x.dtype, cast).view(x.shape))


def transformers_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm.forward``, as written there: fp32 statistics, the
    normalized value rounded to the input's dtype, then the weight's product in that dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


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


def norm_input(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Normal rows, each of its own magnitude (2**-20 to 2**20; float16: 2**-10 to 2**10, its
    range), zeros of both signs, and where there are rows enough a zero row (whose result is 0).
    No NaN and no infinity (a NaN's payload is not the same on both sides)."""
    rows = 1
    for n in shape[:-1]:
        rows *= n
    span = 10 if dtype == torch.float16 else 20
    mag = torch.exp2(torch.randint(-span, span + 1, (rows, 1), generator=gen).float())
    x = (torch.randn(rows, shape[-1], generator=gen) * mag).to(dtype)
    if not torch.isfinite(x).all():
        raise AssertionError("rmsnorm inputs must be finite")
    if rows > 2:
        x[1] = 0.0
        x[2, 0], x[2, -1] = 0.0, -0.0
    return x.view(shape)


def norm_case(dtype: torch.dtype, hidden: int, lead: tuple[int, ...], *, fused: bool = False, row_pad: int = 0,
              eps: float = 1e-6, cast: bool = False) -> Case:
    """``rmsnorm`` (or ``fused_add_rmsnorm``, ``fused``) of ``[*lead, hidden]`` rows. ``row_pad``:
    every tensor the op reads or writes is ``[..., :hidden]`` of a buffer ``hidden + row_pad``
    wide (strided rows; the buffers are hashed whole, the padding must stay as it was)."""
    shape = "x".join(map(str, lead)) or "1d"
    name = (f"{'fused_add_rmsnorm' if fused else 'rmsnorm'}/{SHORT[dtype]}-h{hidden}-{shape}-eps{eps!r}"
            + (f"-pad{row_pad}" if row_pad else "") + ("-cast" if cast else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        width = hidden + row_pad
        weight = torch.randn(hidden, generator=gen).to(dtype)
        bufs = {"x": norm_input(dtype, (*lead, width), gen)}
        bufs["residual" if fused else "out"] = norm_input(dtype, (*lead, width), gen)

        def views(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {key: t[..., :hidden] for key, t in b.items()}

        ref = {key: t.clone() for key, t in bufs.items()}
        dev = {key: to_device(t, device) for key, t in bufs.items()}
        w_d = to_device(weight, device)
        r, d = views(ref), views(dev)
        if fused:
            ref_fused_add_rmsnorm(r["x"], r["residual"], weight, eps, cast=cast)
            ops.fused_add_rmsnorm(d["x"], d["residual"], w_d, eps, cast_x_before_out_mul=cast)
        elif row_pad:
            ref_rmsnorm(r["out"], r["x"], weight, eps, cast=cast)
            returned = ops.rmsnorm(d["x"], w_d, eps, out=d["out"], cast_x_before_out_mul=cast)
            if returned.data_ptr() != d["out"].data_ptr():
                raise AssertionError(f"{name}: rmsnorm(out=...) did not return out")
        else:  # a new output
            want = torch.empty((*lead, hidden), dtype=dtype)
            ref_rmsnorm(want, r["x"], weight, eps, cast=cast)
            got = ops.rmsnorm(d["x"], w_d, eps, cast_x_before_out_mul=cast).cpu()
            return {"out": (got, want), "x": (dev["x"].cpu(), ref["x"])}
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "norm/rmsnorm.cuh", run)


def hash_cases() -> list[Case]:
    """Four builds: bf16 x 4096 (a block of 128 threads per row), fp16 x 5120 (160 threads),
    fp32 x 1000 (64 threads whose last vectors are missing), fp16 x 128 (groups of 4 lanes, 32
    rows per block); and, with ``cast_x_before_out_mul``, bf16 x 4096 and fp16 x 128."""
    return [
        norm_case(bf16, 4096, (0,)),
        norm_case(bf16, 4096, ()),
        norm_case(bf16, 4096, (33,)),
        norm_case(bf16, 4096, (7,), row_pad=512),
        norm_case(bf16, 4096, (2, 9), fused=True),
        norm_case(bf16, 4096, (7,), fused=True, row_pad=8, eps=1e-5),
        norm_case(fp16, 5120, (9,)),
        norm_case(fp16, 5120, (5,), fused=True),
        norm_case(fp32, 1000, (17,), eps=1e-2),
        norm_case(fp32, 1000, (7,), fused=True, row_pad=4),
        norm_case(fp16, 128, (513,)),
        norm_case(fp16, 128, (19, 8), row_pad=64),
        norm_case(fp16, 128, (513,), fused=True, row_pad=8),
        norm_case(bf16, 4096, (33,), cast=True),
        norm_case(bf16, 4096, (7,), fused=True, row_pad=8, cast=True),
        norm_case(fp16, 128, (19, 8), row_pad=64, cast=True),
        norm_case(fp16, 128, (513,), fused=True, cast=True),
    ]


NORM_HIDDEN = 128  # fp16 x 128: one build (groups of 4 lanes); the bad dtypes never reach a build


def norm_rows(a: Arena, lead: tuple, layout: str, dtype: torch.dtype = fp16, values: bool = True) -> torch.Tensor:
    """A ``[*lead, NORM_HIDDEN]`` tensor: contiguous, or (``wide``) the first half of the rows of
    a tensor twice as wide (16-byte aligned strided rows). With ``values`` it holds normal
    numbers (no NaN bit patterns) and the arena remembers them."""
    if layout == "wide":
        t = a.tensor((*lead, 2 * NORM_HIDDEN), dtype)[..., :NORM_HIDDEN]
    else:
        t = a.tensor((*lead, NORM_HIDDEN), dtype)
    if values and dtype.is_floating_point and dtype.itemsize > 1:
        t.copy_(torch.randn(t.shape, generator=a.gen).to(dtype))
        a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    return t


def _norm_shape(p):
    return (*p["lead"], NORM_HIDDEN)


def _norm_bad(fused: bool) -> list[Bad]:
    H = NORM_HIDDEN
    out: list[Bad] = [
        Bad("x", "unsupported dtype", TypeError,
            lambda a, p, d: a.tensor(_norm_shape(p), d.draw(st.sampled_from(
                [torch.int32, torch.int16, torch.bool, torch.float64, torch.float8_e4m3fn])))),
        Bad("x", "hidden without a kernel", ValueError,
            lambda a, p, d: a.tensor((*p["lead"], d.draw(st.sampled_from([100, 6, 0, 2**18]))), fp16)),
        Bad("x", "0-d", ValueError, lambda a, p, d: a.tensor((), fp16)),
        Bad("x", "strided last dimension", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "step2")),
        Bad("x", "misaligned start", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "offset")),
        Bad("x", "misaligned row stride", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "padded")),
        Bad("x", "leading dimensions do not collapse", ValueError,
            lambda a, p, d: a.tensor((3, 2, H), fp16).transpose(0, 1)),
        Bad("x", "meta tensor", ValueError, lambda a, p, d: meta(_norm_shape(p), fp16)),
        Bad("x", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0] * H], 2.0]))),
        Bad("x", "negative bit", ValueError, neg_bit(lambda a, p, d: norm_rows(a, p["lead"], p["x_layout"]))),
        Bad("weight", "dtype", TypeError,
            lambda a, p, d: a.tensor((H,), d.draw(st.sampled_from([bf16, fp32, torch.int16, torch.bool])))),
        Bad("weight", "shape", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(H // 2,), (H + 8,), (1, H), (2, H), ()])), fp16)),
        Bad("weight", "non-contiguous", ValueError, lambda a, p, d: a.tensor((H,), fp16, "step2")),
        Bad("weight", "misaligned start", ValueError, lambda a, p, d: a.tensor((H,), fp16, "offset")),
        Bad("weight", "meta tensor", ValueError, lambda a, p, d: meta((H,), fp16)),
        Bad("weight", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1.0] * H, 1.0]))),
        Bad("weight", "negative bit", ValueError, neg_bit(lambda a, p, d: norm_rows(a, (), "contiguous"))),
        Bad("eps", "negative or not finite", ValueError,
            lambda a, p, d: d.draw(st.sampled_from([-1e-6, -1.0, float("nan"), float("inf"), 1e300]))),
        Bad("eps", "not a number", TypeError, lambda a, p, d: d.draw(st.sampled_from(["1e-6", None, [1e-6], 1j]))),
    ]
    other = "residual" if fused else "out"
    written = "x" if fused else "out"  # weight may share bytes with what is only read
    out.append(Bad("weight", f"{SHARED}: bytes of {written}", ValueError,
                   lambda a, p, d: a.alias(p["args"][written], (H,), fp16, d.draw(st.sampled_from([0, 8, 64])))))
    out += [
        Bad(other, "dtype", TypeError,
            lambda a, p, d: a.tensor(_norm_shape(p), d.draw(st.sampled_from([bf16, fp32, torch.int16, torch.bool])))),
        Bad(other, "shape differs", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([
                (4, 7, H), (H,) if p["lead"] != () else (2, H), (1, 3, H) if p["lead"] != (1, 3) else (3, H)])), fp16)),
        Bad(other, "overlapping rows (expand)", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "expand")),
        Bad(other, "strided last dimension", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "step2")),
        Bad(other, "misaligned start", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "offset")),
        Bad(other, "meta tensor", ValueError, lambda a, p, d: meta(_norm_shape(p), fp16)),
        Bad(other, "not a tensor", TypeError, lambda a, p, d: [[0.0] * H]),
        Bad(other, "negative bit", ValueError, neg_bit(lambda a, p, d: norm_rows(a, p["lead"], "contiguous"))),
        Bad(other, "requires grad", RuntimeError, requires_grad(lambda a, p, d: norm_rows(a, p["lead"], "contiguous"))),
        Bad(other, "inference tensor", RuntimeError, lambda a, p, d: a.inference(_norm_shape(p), fp16)),
        # A shift of 0 is rmsnorm's exact in-place form where x is contiguous, which is accepted.
        Bad(other, f"{SHARED}: x shifted", ValueError,
            lambda a, p, d: a.alias(p["args"]["x"], _norm_shape(p), fp16,
                                    d.draw(st.sampled_from([0, 8, -8, 24] if fused else [8, -8, 24])))),
    ]
    if fused:  # x is written too
        out += [
            Bad("x", "overlapping rows (expand)", ValueError, lambda a, p, d: a.tensor((3, H), fp16, "expand")),
            Bad("x", "requires grad", RuntimeError,
                requires_grad(lambda a, p, d: norm_rows(a, p["lead"], p["x_layout"]))),
            Bad("x", "inference tensor", RuntimeError, lambda a, p, d: a.inference(_norm_shape(p), fp16)),
        ]
    return out


RMSNORM_BAD = _norm_bad(False)

FUSED_NORM_BAD = _norm_bad(True)
