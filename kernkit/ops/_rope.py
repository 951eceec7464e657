"""What ``rotary_embedding`` and ``rotary_embedding_store`` share: the checks of a rope
specialization's arguments and its build, from the kernel file named after the op, and the
tuning of its grid (``TUNED``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..jit import JitSpec, is_arch_support_pdl, make_cpp_args
from ..jit.tuning import EVERY_SIZE, Bench, Scalar, Tunable, size_bucket

#: The dtypes of q and k the rope kernels are specialized for.
ROPE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_rope(dtype: torch.dtype, rot_dim: int, is_neox: bool) -> None:
    """A ``TypeError`` or ``ValueError`` naming the argument unless a rope specialization of
    ``dtype``, ``rot_dim`` and ``is_neox`` can be built."""
    if dtype not in ROPE_DTYPES:
        raise TypeError(f"'q': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    if not isinstance(is_neox, bool):
        raise TypeError(f"'is_neox': expected a bool, got {type(is_neox).__name__}")
    if rot_dim < 0:
        raise ValueError("'cos_sin_cache': expected a 2-d [max_position, rot_dim] tensor")
    if rot_dim == 0 or rot_dim % 2:
        raise ValueError(f"'cos_sin_cache': expected an even, positive rot_dim (its last dimension), got {rot_dim}")


def rope_spec(op: str, dtype: torch.dtype, rot_dim: int, is_neox: bool, backend: str | None = None,
              fewer_blocks: int = 0) -> JitSpec:
    """The build of one specialization of ``op`` (``rotary_embedding`` or
    ``rotary_embedding_store``, from ``rope/<op>.cuh``): q/k dtype, rotary dimension (the
    cache's row length) and pairing, with the grids a tuning table chose: ``fewer_blocks``, a
    mask of the token counts (bit ``b``: calls of ``2**(b - 1)`` to ``2**b - 1`` tokens) launched
    with 14 CTAs an SM instead of 16 (``host::rope::blocks_per_sm``). Untuned (0), the template
    arguments are those it always had."""
    check_rope(dtype, rot_dim, is_neox)
    if type(fewer_blocks) is not int or not 0 <= fewer_blocks < 1 << 63 or fewer_blocks & 1:
        raise ValueError(f"fewer_blocks: expected a mask of bits 1 to 62, got {fewer_blocks!r}")
    pdl = backend != "emu" and is_arch_support_pdl()
    args = make_cpp_args(dtype, rot_dim, is_neox, pdl, *([fewer_blocks] if fewer_blocks else []))  # 0: left out
    return JitSpec.make(op, *args, cuda_files=[f"rope/{op}.cuh"], cuda_wrappers=[(op, f"{op}<{args}>")],
                        backend=backend)


def rope_builds(op: str, dtypes: Sequence[torch.dtype], head_dim: int, rot_dim: int | None, is_neox: object,
                backend: str | None) -> list[JitSpec]:
    """The builds of ``op`` a model needs: one per dtype, for its rotary dimension (``head_dim``
    unless ``rot_dim`` is given) and pairing (``is_neox``: a bool, or ``0``/``1``/``true``/``false``
    as ``warmup --set`` passes it), with the grids this device's tuning tables give (what the op
    will load)."""
    rot = head_dim if rot_dim is None else rot_dim
    neox = is_neox if isinstance(is_neox, bool) else str(is_neox).lower() in ("1", "true")
    return [rope_spec(op, d, rot, neox, backend, fewer_blocks_mask(op, backend != "emu", d, rot, neox))
            for d in dict.fromkeys(dtypes)]


#: The rope kernels' grid a tuning table may choose per key, giving the same bits: at most 14
#: CTAs an SM instead of 16 (``host::rope::kFewerBlocksPerSM``); only which CTA takes a token
#: changes.
GRIDS = {"fewer_blocks": (False, True)}

#: Tokens ``tune --grid serving`` measures, for each layout of ``SERVING_LAYOUTS``: 1 to 32768.
SERVING_TOKENS = tuple(1 << b for b in range(16))

#: ``(dtype, q_heads, k_heads, head_dim, rot_dim, is_neox)`` of the serving grid, one per key
#: (the build knows no heads, so layouts of one dtype, rot_dim and pairing would share one):
#: Llama-3-8B, Qwen3-8B and Mistral-7B (32 q, 8 kv heads of 128) in bfloat16 and float16,
#: Gemma-2-9B (16 q, 8 kv of 256), GLM-4-9B (32 q, 2 kv of 128, half of each rotated, gpt-j).
SERVING_LAYOUTS = (("bfloat16", 32, 8, 128, 128, True), ("float16", 32, 8, 128, 128, True),
                   ("bfloat16", 16, 8, 256, 256, True), ("bfloat16", 32, 2, 128, 64, False))

#: Rows of the cos/sin cache the benches make: the positions are drawn from them.
_BENCH_POSITIONS = 8192


def _bench(op: str, shape: Mapping, device: str) -> Bench:
    """``tune``'s inputs for one shape ``{dtype, q_heads, k_heads, head_dim, rot_dim, is_neox,
    tokens}`` of ``op`` on ``device``: copies of q, k (and v and the caches) that together exceed
    the L2, each call on its own; the outputs compared are q and k (and the caches' rows)."""
    dtype, rot_dim, is_neox = getattr(torch, str(shape["dtype"])), int(shape["rot_dim"]), shape["is_neox"]
    hq, hk, head_dim, n = int(shape["q_heads"]), int(shape["k_heads"]), int(shape["head_dim"]), int(shape["tokens"])
    if type(is_neox) is not bool:
        raise TypeError(f"is_neox: expected a bool, got {is_neox!r}")
    check_rope(dtype, rot_dim, is_neox)
    if min(hq, hk, n) < 1 or head_dim < rot_dim:
        raise ValueError(f"expected heads and tokens >= 1 and head_dim >= rot_dim, got {dict(shape)}")
    store = op == "rotary_embedding_store"
    backend = None if device == "cuda" else "emu"
    seed = n * 7919 + hq * 131 + hk * 17 + head_dim
    per_copy = (hq + (4 if store else 1) * hk) * head_dim * n * dtype.itemsize  # q, k (v, both caches)
    copies = max(1, min(200, (180 << 20) // per_copy))  # beyond the L2

    def one(i: int) -> list[torch.Tensor]:
        """positions, q, k (then v, k_cache, v_cache, out_loc) of call ``i``, the same each time."""
        gen = torch.Generator(device=device).manual_seed(seed + i)

        def rand(*size: int) -> torch.Tensor:
            return torch.randn(size, generator=gen, device=device).to(dtype)

        t = [torch.randint(_BENCH_POSITIONS, (n,), generator=gen, device=device), rand(n, hq, head_dim),
             rand(n, hk, head_dim)]
        if store:
            t += [rand(n, hk, head_dim), rand(n, hk * head_dim), rand(n, hk * head_dim),
                  torch.randperm(n, generator=gen, device=device)]
        return t

    angles = torch.arange(_BENCH_POSITIONS, dtype=torch.float32, device=device)[:, None] / 10000 ** (
        torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim)
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1)
    inputs = [one(i) for i in range(copies)]

    def run(module, t: Sequence[torch.Tensor]) -> None:
        if store:
            pos, q, k, v, kc, vc, loc = t
            module.rotary_embedding_store(pos, q, k, v, cos_sin, kc, vc, loc, head_dim)
        else:
            pos, q, k = t
            module.rotary_embedding(pos, q, k, cos_sin, head_dim)

    def calls(module):
        return [lambda t=t: run(module, t) for t in inputs]

    def outputs(module):
        t = one(0)  # fresh: the timed calls overwrite theirs
        run(module, t)
        return [t[1], t[2], *(t[4:6] if store else [])]  # q, k (the caches)

    return Bench(key={"dtype": str(dtype).removeprefix("torch."), "rot_dim": rot_dim, "is_neox": is_neox,
                      "tokens": size_bucket(n)},
                 spec=lambda args: rope_spec(op, dtype, rot_dim, is_neox, backend,
                                             EVERY_SIZE * bool(args["fewer_blocks"])),
                 calls=calls, outputs=outputs)


def _tunable(op: str) -> Tunable:
    grid: list[dict[str, Scalar]] = [
        {"dtype": d, "q_heads": hq, "k_heads": hk, "head_dim": hd, "rot_dim": r, "is_neox": neox, "tokens": n}
        for d, hq, hk, hd, r, neox in SERVING_LAYOUTS for n in SERVING_TOKENS]
    return Tunable(op, GRIDS, ("dtype", "rot_dim", "is_neox", "tokens"), grids={"serving": grid},
                   bench=lambda shape, device: _bench(op, shape, device))


#: The tunables of the two rope ops: each picks its grid per dtype, rotary dimension, pairing
#: (what its build knows) and number of tokens (the power of two at or below it), all of which
#: go into the one build of a dtype, rotary dimension and pairing (``fewer_blocks_mask``).
TUNED = {op: _tunable(op) for op in ("rotary_embedding", "rotary_embedding_store")}


def fewer_blocks_mask(op: str, is_cuda: bool, dtype: torch.dtype, rot_dim: int, is_neox: bool) -> int:
    """The grid mask the tuning tables give ``op`` for ``dtype``, ``rot_dim`` and ``is_neox``
    (``Tunable.size_masks``): bit ``b`` set launches calls of ``2**(b - 1)`` to ``2**b - 1``
    tokens with fewer CTAs."""
    return TUNED[op].size_masks(is_cuda, "tokens", dtype=dtype, rot_dim=rot_dim, is_neox=is_neox)["fewer_blocks"]
