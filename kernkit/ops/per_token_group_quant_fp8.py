"""``per_token_group_quant_fp8``: per-token-group dynamic quantization to fp8 E4M3 with one fp32
scale per group of consecutive elements of a row, as block-wise fp8 GEMMs (DeepSeek-V3,
DeepGEMM) take their activations (sglang's ``per_token_group_quant_8bit``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from ..jit.tuning import EVERY_SIZE, Bench, Tunable, size_bucket
from .registry import register_op

#: The input dtypes ``per_token_group_quant_fp8`` is specialized for.
GROUP_QUANT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The group sizes ``per_token_group_quant_fp8`` is built for.
GROUP_SIZES = (16, 32, 64, 128)


def _check_types(group_size: object, column_major_scales: object, scale_ue8m0: object) -> None:
    """Refuse a ``group_size`` that is not an int and flags that are not bools: ``128.0`` or
    ``1`` would pass for ``128`` or ``True`` as a memo key (equal, of equal hash)."""
    if type(group_size) is not int:  # worded as register_op words it
        raise TypeError(f"'group_size': expected an int64, got {group_size!r}")
    for name, flag in (("column_major_scales", column_major_scales), ("scale_ue8m0", scale_ue8m0)):
        if type(flag) is not bool:
            raise TypeError(f"'{name}': expected a bool, got {type(flag).__name__}")


def per_token_group_quant_fp8_spec(dtype: torch.dtype, group_size: int, column_major_scales: bool,
                                   scale_ue8m0: bool, backend: str | None = None, one_vector: int = 0) -> JitSpec:
    """The build of one ``per_token_group_quant_fp8`` specialization (input dtype, group size,
    scale layout), with the sizes a tuning table chose for one vector a thread: ``one_vector``,
    a mask whose bit ``b`` covers calls of ``2**(b - 1)`` to ``2**b - 1`` elements of ``x``. The
    factory below, ``warmup`` and ``tune`` share it; untuned, the template arguments are those it
    always had."""
    if dtype not in GROUP_QUANT_DTYPES:
        raise TypeError(f"'x': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    _check_types(group_size, column_major_scales, scale_ue8m0)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"'group_size': expected one of {', '.join(map(str, GROUP_SIZES))}, got {group_size!r}")
    args = make_cpp_args(dtype, group_size, column_major_scales, scale_ue8m0,
                         backend != "emu" and is_arch_support_pdl(), *((one_vector,) if one_vector else ()))
    return JitSpec.make("per_token_group_quant_fp8", *args, cuda_files=["quant/per_token_group_quant_fp8.cuh"],
                        cuda_wrappers=[("per_token_group_quant_fp8", f"per_token_group_quant_fp8<{args}>")],
                        backend=backend)


#: Tokens ``tune --grid serving`` measures, for each scale layout of ``SERVING_LAYOUTS``.
SERVING_TOKENS = tuple(1 << b for b in range(15))

#: ``(column_major_scales, scale_ue8m0)`` of the serving grid: the three layouts, each of
#: DeepSeek-V3's hidden size (7168) in bfloat16, group 128; one shape per key (the build knows no
#: hidden size: the key is the elements of ``x``).
SERVING_LAYOUTS = ((False, False), (True, False), (True, True))

#: The hidden size of the serving grid.
SERVING_HIDDEN = 7168


def _bench(shape: Mapping, device: str) -> Bench:
    """``tune``'s inputs for one shape ``{dtype, group_size, column_major_scales, scale_ue8m0,
    hidden, tokens}`` on ``device``: copies of x and the outputs that together exceed the L2."""
    dtype, group_size, hidden, n = (getattr(torch, str(shape["dtype"])), shape["group_size"], int(shape["hidden"]),
                                    int(shape["tokens"]))
    column_major, ue8m0 = shape["column_major_scales"], shape["scale_ue8m0"]
    _check_types(group_size, column_major, ue8m0)
    flags = {"column_major_scales": column_major, "scale_ue8m0": ue8m0}
    if min(hidden, n) < 1:
        raise ValueError(f"expected hidden and tokens >= 1, got {dict(shape)}")
    backend = None if device == "cuda" else "emu"
    gen = torch.Generator().manual_seed(n * 7919 + hidden)
    copies = max(1, min(200, (180 << 20) // (n * hidden * (dtype.itemsize + 1))))  # beyond the L2
    xs = [torch.randn(n, hidden, generator=gen).to(dtype).to(device) for _ in range(copies)]
    outs = [_outputs(x, group_size, **flags) for x in xs]

    def calls(module):
        return [lambda x=x, q=q, s=s: module.per_token_group_quant_fp8(q, s, x, 1e-10)
                for x, (q, s) in zip(xs, outs, strict=True)]

    def outputs(module):
        q, scales = _outputs(xs[0], group_size, **flags)
        module.per_token_group_quant_fp8(q, scales, xs[0], 1e-10)
        return [q, scales]

    return Bench(key={"dtype": str(dtype).removeprefix("torch."), "group_size": group_size, **flags,
                      "elements": size_bucket(n * hidden)},
                 spec=lambda args: per_token_group_quant_fp8_spec(dtype, group_size, column_major, ue8m0, backend,
                                                                  EVERY_SIZE * bool(args["one_vector"])),
                 calls=calls, outputs=outputs)


#: The op's tunable: one vector a thread (twice the blocks) or two, per dtype, group size, scale
#: layout and number of elements of ``x`` (the power of two at or below it), all of which go
#: into the one build of a dtype, group size and layout.
TUNED = Tunable("per_token_group_quant_fp8", {"one_vector": (False, True)},
                ("dtype", "group_size", "column_major_scales", "scale_ue8m0", "elements"),
                grids={"serving": [{"dtype": "bfloat16", "group_size": 128, "column_major_scales": c,
                                    "scale_ue8m0": u, "hidden": SERVING_HIDDEN, "tokens": n}
                                   for c, u in SERVING_LAYOUTS for n in SERVING_TOKENS]},
                bench=_bench)


def _spec(dtype: torch.dtype, group_size: int, column_major_scales: bool, scale_ue8m0: bool,
          backend: str | None) -> JitSpec:
    """The spec with the sizes this device's tuning tables give one vector a thread
    (``Tunable.size_masks``): the launcher picks a call's variant by its size."""
    mask = TUNED.size_masks(backend != "emu", "elements", dtype=dtype, group_size=group_size,
                            column_major_scales=column_major_scales, scale_ue8m0=scale_ue8m0)["one_vector"]
    return per_token_group_quant_fp8_spec(dtype, group_size, column_major_scales, scale_ue8m0, backend, mask)


@cache_once
def _module(dtype: torch.dtype, group_size: int, column_major_scales: bool, scale_ue8m0: bool, is_cuda: bool):
    # Runs once per specialization key: the tuning tables give the variant per size, and the
    # spec checks the key.
    return _spec(dtype, group_size, column_major_scales, scale_ue8m0, None if is_cuda else "emu").build_and_load()


def _outputs(x: torch.Tensor, group_size: int = 128, *, column_major_scales: bool = False, scale_ue8m0: bool = False,
             eps: float = 1e-10, out: torch.Tensor | None = None,
             out_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` (``out``, or contiguous fp8 shaped like ``x``) and the scales (``out_scales``, or new
    ones in their layout)."""
    if x.dim() != 2:
        raise ValueError(f"'x': expected a 2-d [tokens, hidden] tensor, got {x.dim()}-d")
    tokens, hidden = x.shape
    if out is None:
        out = torch.empty((tokens, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    if out_scales is not None:
        return out, out_scales
    groups = hidden // group_size
    if not column_major_scales:
        return out, torch.empty((tokens, groups), dtype=torch.float32, device=x.device)
    # Column-major, tokens padded to a multiple of 4 (16 bytes): the layout DeepGEMM's TMA reads.
    padded = (tokens + 3) // 4 * 4
    if scale_ue8m0:  # 4 exponent bytes per int32 word
        return out, torch.empty(((groups + 3) // 4, padded), dtype=torch.int32, device=x.device).t()[:tokens]
    return out, torch.empty((groups, padded), dtype=torch.float32, device=x.device).t()[:tokens]


def _flag(value: object) -> bool:
    """A bool, or ``0``/``1``/``true``/``false`` as ``warmup --set`` passes it."""
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true")


def _specializations(dtypes: Sequence[torch.dtype], group_size: int = 128, column_major_scales: object = False,
                     scale_ue8m0: object = False, backend: str | None = None, **unused: object) -> list[JitSpec]:
    """The builds a model needs: one per dtype, for its group size and scale layout (the op's
    defaults unless given), with the variants this device's tuning tables give (what the op
    will load)."""
    layout = _flag(column_major_scales), _flag(scale_ue8m0)
    return [_spec(d, group_size, *layout, backend) for d in dict.fromkeys(dtypes)]


@register_op(fake=_outputs, specializations=_specializations)
def per_token_group_quant_fp8(x: torch.Tensor, group_size: int = 128, *, column_major_scales: bool = False,
                              scale_ue8m0: bool = False, eps: float = 1e-10, out: torch.Tensor | None = None,
                              out_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each group of ``group_size`` consecutive elements of each row of ``x`` to fp8
    E4M3 with its own fp32 scale.

    Per group: ``amax = max|x|`` (a NaN wins, as in ``per_token_quant_fp8``), ``scale =
    max(amax, eps) / 448`` as one fp32 IEEE division (``eps`` taken to fp32; a NaN ``amax``
    still wins), and with ``scale_ue8m0`` that scale rounded up to a power of two, at least
    2**-127 (UE8M0's smallest; infinities and NaN kept). Then ``q = saturate_e4m3(x / scale)``:
    the IEEE fp32 quotient (through the group's reciprocal with one fused correction, which
    gives the same E4M3 value), rounded to nearest even and saturated to +-448; a zero scale
    gives ``q = 0``. The GPU and the CPU emulator give the same bits, and they equal the torch
    reference (``ref_per_token_group_quant_fp8`` in
    ``kernkit.testing.ops.per_token_group_quant_fp8``) bit for bit (a NaN q is E4M3's 0x7f,
    whatever its sign).
    Against exact arithmetic, ``q.float() * scale`` is within half an E4M3 step of ``x``:
    ``2**-4 * |x|``, or ``2**-10 * scale`` where ``x / scale`` is below E4M3's smallest normal,
    plus fp32 rounding (``2**-20 * |x|`` covers it).

    Special groups: a group of zeros gets the scale of ``eps`` and q all zero (with ``eps = 0``
    the scale is 0, or 2**-127 with ``scale_ue8m0``). A NaN makes the group's scale and every q
    of the group NaN (the scale 0x7fffffff, its UE8M0 byte 0xff). An infinity makes the scale
    inf: the finite elements become +-0 and the infinite ones NaN.

    Bad arguments raise ``TypeError``/``ValueError`` naming the argument before anything is
    written. CUDA tensors run the GPU build, CPU tensors the CPU emulator.

    Parameters
    ----------
    x
        ``[tokens, hidden]`` float16, bfloat16 or float32, on a CUDA device (or on the CPU,
        through kernkit's CPU emulator). The last dimension is contiguous; rows may be any
        stride apart (a slice of a wider tensor; rows not on 16-byte boundaries take a slower
        scalar variant of the kernel). ``hidden`` is a multiple of ``group_size``.
    group_size
        Elements per group: 16, 32, 64 or 128 (each its own specialization).
    column_major_scales
        Lay the scales out column-major, as DeepGEMM's TMA reads them (below).
    scale_ue8m0
        Round each scale up to a power of two (UE8M0, Blackwell's DeepGEMM scales).
    eps
        The scale's floor before the division by 448: a finite float >= 0.
    out
        Optional ``q``: contiguous torch.float8_e4m3fn ``[tokens, hidden]``, on ``x``'s device,
        sharing no memory with ``x``.
    out_scales
        Optional scales, in the layout below exactly (the column-major ones as a view of a
        padded buffer: ``buf.t()[:tokens]``), on ``x``'s device, sharing no memory with ``x`` or
        ``out``. With ``out`` too, a call allocates nothing (a CUDA graph, a layer that owns its
        buffers); the padding stays as it was.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``(q, scales)``: ``q`` (``out`` when given) shaped like ``x``, and ``scales``
        (``out_scales`` when given; ``groups = hidden // group_size``), in the layout the flags
        name:

        - ``column_major_scales=False``: float32 ``[tokens, groups]``, row-major and contiguous
          (with ``scale_ue8m0``, holding the powers of two).
        - ``column_major_scales=True``: float32 ``[tokens, groups]`` with strides ``(1,
          align(tokens, 4))``, i.e. ``torch.empty(groups, align(tokens, 4)).t()[:tokens]``:
          column-major with the tokens padded to a multiple of 4 (16 bytes), the layout
          DeepGEMM's TMA reads (sglang's ``scale_tma_aligned``).
        - ``column_major_scales=True, scale_ue8m0=True``: int32 ``[tokens, ceil(groups / 4)]``
          with strides ``(1, align(tokens, 4))``; byte ``i`` (little-endian) of word ``j`` is the
          biased exponent (bits 23 to 30 of the fp32 scale) of group ``4 j + i``, and the bytes
          past the last group are 0: DeepGEMM's packed UE8M0 layout.

        The padding of the column-major layouts (tokens past ``tokens``) is outside the view and
        left unwritten.

    Example
    -------
    >>> x = torch.randn(16, 7168, dtype=torch.bfloat16)
    >>> q, scales = per_token_group_quant_fp8(x, 128, column_major_scales=True)  # doctest: +SKIP
    >>> scales.shape, scales.stride()  # doctest: +SKIP
    (torch.Size([16, 56]), (1, 16))
    >>> deq = q.float().view(16, 56, 128) * scales[:, :, None]  # doctest: +SKIP
    >>> bool((deq.view(16, 7168) - x.float()).abs().max() <= x.float().abs().max() / 16)  # doctest: +SKIP
    True
    """
    # Before the memo, whose key would take 1 for True once True is cached.
    if type(group_size) is not int or type(column_major_scales) is not bool or type(scale_ue8m0) is not bool:
        _check_types(group_size, column_major_scales, scale_ue8m0)
    module = _module(x.dtype, group_size, column_major_scales, scale_ue8m0, x.is_cuda)
    q, scales = _outputs(x, group_size, column_major_scales=column_major_scales, scale_ue8m0=scale_ue8m0, out=out,
                         out_scales=out_scales)
    module.per_token_group_quant_fp8(q, scales, x, eps)
    return q, scales
