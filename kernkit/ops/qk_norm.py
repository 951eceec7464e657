"""``qk_norm``: RMS normalization of every head of q and of k, in place, in one launch (the
per-head q/k norm of Qwen3 and others, before rope)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from ..jit.tuning import Bench, Tunable, size_bucket
from ._flags import SCHEDULES, as_flag, check_cast_flag, every_size, schedule_masks, template_tail
from .registry import register_op

#: The dtypes ``qk_norm`` is specialized for.
QK_NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The head sizes ``qk_norm`` is built for.
QK_NORM_HEAD_DIMS = (64, 128, 256, 512, 1024)


def _check(dtype: torch.dtype, head_dim: int) -> None:
    if dtype not in QK_NORM_DTYPES:
        raise TypeError(f"'q': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    if head_dim not in QK_NORM_HEAD_DIMS:
        raise ValueError(f"'q_weight': head_dim {head_dim} (the weight's length) is not supported; supported: "
                         f"{', '.join(map(str, QK_NORM_HEAD_DIMS))}")


def qk_norm_spec(dtype: torch.dtype, head_dim: int, backend: str | None = None,
                 cast_x_before_out_mul: bool = False, schedules: tuple[int, int] = (0, 0)) -> JitSpec:
    """The build of one ``qk_norm`` specialization, for heads of ``head_dim`` elements of
    ``dtype``, in kernkit's order or (``cast_x_before_out_mul``) transformers', with the
    ``schedules`` a tuning table chose: ``(late_weight, late_trigger)``, each a mask of the sizes
    (bit ``b``: calls of ``2**(b - 1)`` to ``2**b - 1`` elements of q and k together) that take
    the late variant (``SCHEDULES``). The factory below, ``warmup`` and ``tune`` share it;
    untuned, the template arguments are those it always had."""
    _check(dtype, head_dim)
    args = make_cpp_args(dtype, head_dim, backend != "emu" and is_arch_support_pdl(),
                         *template_tail(cast_x_before_out_mul, *schedules))
    return JitSpec.make("qk_norm", *args, cuda_files=["norm/qk_norm.cuh"],
                        cuda_wrappers=[("qk_norm", f"qk_norm<{args}>")], backend=backend)


#: Tokens ``tune --grid serving`` measures, for each layout of ``SERVING_LAYOUTS``.
SERVING_TOKENS = tuple(1 << b for b in range(15))

#: ``(dtype, q_heads, k_heads, head_dim)`` of the serving grid, one layout per dtype and head
#: size (the key knows no heads): Qwen3-8B's 32 q and 8 kv heads of 128, in bfloat16 and
#: float16, and Gemma-3-12B's 16 and 8 of 256.
SERVING_LAYOUTS = (("bfloat16", 32, 8, 128), ("float16", 32, 8, 128), ("bfloat16", 16, 8, 256))


def _bench(shape: Mapping, device: str) -> Bench:
    """``tune``'s inputs for one shape ``{dtype, q_heads, k_heads, head_dim, tokens}`` on
    ``device``: copies of q and k that together exceed the L2, each call on its own."""
    dtype, head_dim = getattr(torch, str(shape["dtype"])), int(shape["head_dim"])
    hq, hk, n = int(shape["q_heads"]), int(shape["k_heads"]), int(shape["tokens"])
    if min(hq, hk, n) < 1:
        raise ValueError(f"expected heads and tokens >= 1, got {dict(shape)}")
    backend = None if device == "cuda" else "emu"
    gen = torch.Generator().manual_seed(n * 7919 + hq * 131 + hk * 17 + head_dim)
    copies = max(1, min(200, (180 << 20) // (2 * n * (hq + hk) * head_dim * dtype.itemsize)))  # beyond the L2

    def qk() -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(n, hq, head_dim, generator=gen).to(dtype).to(device),
                torch.randn(n, hk, head_dim, generator=gen).to(dtype).to(device))

    pairs = [qk() for _ in range(copies)]
    wq, wk = (torch.randn(head_dim, generator=gen).to(dtype).to(device) for _ in range(2))
    q0, k0 = pairs[0][0].clone(), pairs[0][1].clone()  # the timed calls overwrite theirs

    def calls(module):
        return [lambda q=q, k=k: module.qk_norm(q, k, wq, wk, 1e-6) for q, k in pairs]

    def outputs(module):
        q, k = q0.clone(), k0.clone()
        module.qk_norm(q, k, wq, wk, 1e-6)
        return [q, k]

    return Bench(key={"dtype": str(dtype).removeprefix("torch."), "head_dim": head_dim,
                      "elements": size_bucket(n * (hq + hk) * head_dim)},
                 spec=lambda args: qk_norm_spec(dtype, head_dim, backend, False, every_size(args)),
                 calls=calls, outputs=outputs)


#: qk_norm's tunable: the schedule per dtype, head size and number of elements of q and k (the
#: power of two at or below it), all of which go into the one build of a dtype and head size.
TUNED = Tunable("qk_norm", SCHEDULES, ("dtype", "head_dim", "elements"),
                grids={"serving": [{"dtype": d, "q_heads": hq, "k_heads": hk, "head_dim": h, "tokens": n}
                                   for d, hq, hk, h in SERVING_LAYOUTS for n in SERVING_TOKENS]},
                bench=_bench)


@cache_once
def _module(dtype: torch.dtype, head_dim: int, is_cuda: bool, cast_x_before_out_mul: bool):
    # Runs once per (dtype, head_dim, device kind, order): the tuning tables give the schedules,
    # and the spec checks the dtype and head_dim.
    return qk_norm_spec(dtype, head_dim, None if is_cuda else "emu", cast_x_before_out_mul,
                        schedule_masks(TUNED, is_cuda, dtype=dtype, head_dim=head_dim)).build_and_load()


def _specializations(dtypes: Sequence[torch.dtype], head_dim: int, backend: str | None = None,
                     cast_x_before_out_mul: object = False, **unused: object) -> list[JitSpec]:
    """The builds a model needs: one per dtype, for its ``head_dim``, in the order
    ``cast_x_before_out_mul`` names (a bool or ``0``/``1``/``true``/``false``), with the
    schedules this device's tuning tables give (what the op will load)."""
    cast = as_flag(cast_x_before_out_mul)
    return [qk_norm_spec(d, head_dim, backend, cast,
                         schedule_masks(TUNED, backend != "emu", dtype=d, head_dim=head_dim))
            for d in dict.fromkeys(dtypes)]


@register_op(mutates_args=("q", "k"), specializations=_specializations)
def qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
            eps: float = 1e-6, *, cast_x_before_out_mul: bool = False) -> None:
    """In place, ``rmsnorm`` of every head of ``q`` with ``q_weight`` and of every head of ``k``
    with ``k_weight``, in one launch, as sglang's ``fused_inplace_qknorm``.

    Each head is normalized with ``rmsnorm``'s arithmetic and within the tolerance its docstring
    states. A head is spread over twice the threads of an ``rmsnorm`` row of the same length
    (faster for short rows), so its sum of squares is added in another fixed order and a result
    can differ from ``rmsnorm(q, wq, out=q)`` in the last bit. The GPU and the CPU emulator give
    the same bits. ``cast_x_before_out_mul`` is ``rmsnorm``'s option: transformers' order
    (Qwen3's ``q_norm``/``k_norm`` are its RMSNorm), with ``rmsnorm``'s bound for that order.

    Parameters
    ----------
    q
        ``[tokens, q_heads, head_dim]`` or ``[tokens, q_heads * head_dim]``, float16, bfloat16 or
        float32, on a CUDA device (or on the CPU, through kernkit's CPU emulator); overwritten.
        ``head_dim`` is contiguous; tokens and heads may be strided, as in a slice of a fused QKV
        tensor (``qkv[:, :q_size]``), with the first element and both strides on 16-byte
        boundaries.
    k
        ``[tokens, k_heads, head_dim]`` or ``[tokens, k_heads * head_dim]``, with ``q``'s tokens and
        dtype; overwritten. It shares no memory with ``q`` (slices of one QKV tensor do not).
    q_weight
        ``[head_dim]``, contiguous, of ``q``'s dtype: its length is ``head_dim``, one of 64, 128,
        256, 512 and 1024; another length raises a ``ValueError`` naming it.
    k_weight
        ``[head_dim]``, contiguous, of ``q``'s dtype.
    eps
        Added to the mean of squares; finite and >= 0.
    cast_x_before_out_mul
        A bool: round ``x * inv_rms`` to the dtype before the weight multiplies it
        (transformers' order; a build of its own).

    Returns
    -------
    None

    Example
    -------
    >>> qkv = torch.randn(16, (32 + 2 * 8) * 128, dtype=torch.bfloat16)
    >>> q = qkv[:, :32 * 128].view(16, 32, 128)
    >>> k = qkv[:, 32 * 128:40 * 128].view(16, 8, 128)
    >>> w = torch.ones(128, dtype=torch.bfloat16)
    >>> qk_norm(q, k, w, w)  # doctest: +SKIP
    """
    check_cast_flag(cast_x_before_out_mul)
    _module(q.dtype, q_weight.shape[-1] if q_weight.ndim else -1, q.is_cuda, cast_x_before_out_mul).qk_norm(
        q, k, q_weight, k_weight, eps)
