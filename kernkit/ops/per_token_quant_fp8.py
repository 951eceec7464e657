"""``per_token_quant_fp8``: per-token (per-row) dynamic quantization to fp8 E4M3 with one fp32
scale per row, as the activations of an fp8 GEMM need it (sglang's ``per_token_quant_fp8``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from .registry import register_op

#: The input dtypes ``per_token_quant_fp8`` is specialized for.
QUANT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The largest hidden size (elements per row) a specialization may have.
MAX_HIDDEN = 1 << 20


def per_token_quant_fp8_spec(dtype: torch.dtype, hidden: int, backend: str | None = None) -> JitSpec:
    """The build of one ``per_token_quant_fp8`` specialization (input dtype, hidden size): the
    factory below and ``warmup`` share it."""
    if dtype not in QUANT_DTYPES:
        raise TypeError(f"'x': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"'x': the hidden size (last dimension) must be in [1, {MAX_HIDDEN}], got {hidden!r}")
    args = make_cpp_args(dtype, hidden, backend != "emu" and is_arch_support_pdl())
    return JitSpec.make("per_token_quant_fp8", *args, cuda_files=["quant/per_token_quant_fp8.cuh"],
                        cuda_wrappers=[("per_token_quant_fp8", f"per_token_quant_fp8<{args}>")], backend=backend)


@cache_once
def _module(dtype: torch.dtype, hidden: int, is_cuda: bool):
    # Runs once per (dtype, hidden size, device kind): the place for what Python must check.
    return per_token_quant_fp8_spec(dtype, hidden, None if is_cuda else "emu").build_and_load()


def _outputs(x: torch.Tensor, *, out: torch.Tensor | None = None,
             out_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` (``out``, or fp8 shaped like ``x``, contiguous) and ``scales`` (``out_scales``, or
    fp32 ``[*x.shape[:-1], 1]``)."""
    if out is None:  # empty_like: as norm's output, less Python time than torch.empty(x.shape, ...)
        out = torch.empty_like(x, dtype=torch.float8_e4m3fn, memory_format=torch.contiguous_format)
    if out_scales is None:
        out_scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    return out, out_scales


def _specializations(hidden_size: int, dtypes: Sequence[torch.dtype] = QUANT_DTYPES,
                     intermediate_size: int | None = None, backend: str | None = None, **unused) -> list[JitSpec]:
    """One build per dtype and per model width given: ``hidden_size`` (the attention and MLP
    inputs) and ``intermediate_size`` (the MLP's down projection input, when given)."""
    sizes = [hidden_size] + ([intermediate_size] if intermediate_size is not None else [])
    return [per_token_quant_fp8_spec(d, h, backend) for d in dict.fromkeys(dtypes) for h in dict.fromkeys(sizes)]


@register_op(fake=_outputs, specializations=_specializations)
def per_token_quant_fp8(x: torch.Tensor, *, out: torch.Tensor | None = None,
                        out_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row of ``x`` to fp8 E4M3 with its own fp32 scale.

    Per row: ``scale = max|x| / 448`` (fp32 IEEE division; 448 is E4M3's largest finite value)
    and ``q = saturate_e4m3(x / scale)``: the IEEE fp32 quotient (computed through the row's
    reciprocal with one fused correction, which gives the same E4M3 value), rounded to nearest
    even and saturated to +-448 (``device::cast`` to ``fp8_e4m3_t``). The result is bit-exact
    against ``(x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)``
    (``ref_per_token_quant_fp8`` in ``kernkit.testing.ops.per_token_quant_fp8`` spells it out).
    Against exact arithmetic: the scale is max|x| / 448 rounded once to fp32, and
    ``q.float() * scale`` is within half an E4M3 step of ``x``: ``2**-4 * |x|``, or ``2**-10 * scale``
    where ``x / scale`` is below E4M3's smallest normal (2**-6), plus fp32 rounding (2**-20 * |x|
    covers it); rows whose scale underflows to 0 are all 0.

    Special rows: a row of zeros gets scale 0 and q all +0 (no NaN; so does an fp32 row so small
    that max|x| / 448 rounds to 0). A NaN anywhere in a row makes max|x|, and so the scale, NaN,
    and every q of that row NaN. An infinity makes the scale inf: the finite elements become
    +-0 and the infinite ones NaN (inf / inf).

    Parameters
    ----------
    x
        ``[tokens, hidden]`` (or ``[..., hidden]``) float16, bfloat16 or float32, on a CUDA device
        (or on the CPU, through kernkit's CPU emulator). The last dimension must be contiguous;
        rows may be any stride apart (e.g. a slice of a wider tensor) as long as the leading
        dimensions flatten into one row stride (else ``x.contiguous()``). Each hidden size is its
        own specialization.
    out
        Optional ``q``: contiguous torch.float8_e4m3fn of ``x``'s shape, on its device.
    out_scales
        Optional scales: contiguous float32 ``[*x.shape[:-1], 1]``, on ``x``'s device, sharing
        no memory with ``x`` or ``out``. With ``out`` too, a call allocates nothing.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``(q, scales)``: ``q`` (``out`` when given) shaped like ``x``; ``scales`` (``out_scales``
        when given) float32 of shape ``[*x.shape[:-1], 1]`` (``[tokens, 1]``, as sglang returns
        them).

    Example
    -------
    >>> x = torch.randn(16, 4096, dtype=torch.bfloat16)
    >>> q, scales = per_token_quant_fp8(x)  # doctest: +SKIP
    >>> (q.float() * scales - x.float()).abs().max() <= x.float().abs().amax() / 16  # doctest: +SKIP
    tensor(True)
    """
    if x.dim() == 0:
        raise ValueError("'x': expected a [..., hidden] tensor, got 0-d")
    q, scales = _outputs(x, out=out, out_scales=out_scales)
    _module(x.dtype, x.shape[-1], x.is_cuda).per_token_quant_fp8(q, scales, x)
    return q, scales
