"""``store_cache``'s test material: its torch reference, hash cases and invalid calls."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernkit import ops
from kernkit.testing import oracle
from kernkit.testing.hashes import SHORT, Case, Outputs, generator, to_device
from kernkit.testing.invalid import (
    BAD_INDEX_DTYPES,
    HUGE,
    SHARED,
    UNSUPPORTED_ROW_DTYPES,
    Bad,
    meta,
    neg_bit,
    other_same_size,
    requires_grad,
)
from kernkit.testing.oracle import rand_bits

bf16, fp16, fp32, fp8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn

i32, i64 = torch.int32, torch.int64


def ref_store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """``k_cache[indices[i]] = k[i]`` and ``v_cache[indices[i]] = v[i]`` for every ``i`` whose
    index lies in ``[0, pool)``; other rows are skipped. In place."""
    valid = (indices >= 0) & (indices < k_cache.shape[0])
    idx = indices[valid].long()
    rows = tuple(oracle.bytes_view(k_cache).shape[1:])
    oracle.bytes_view(k_cache)[idx] = oracle.bytes_view(k)[valid].reshape((-1, *rows))
    oracle.bytes_view(v_cache)[idx] = oracle.bytes_view(v)[valid].reshape((-1, *rows))


def bad_indices(pool: int, index_dtype: torch.dtype) -> list[int]:
    """Indices the kernel must skip. The int64 ones include values whose low 32 bits are a
    valid row, so a kernel that truncated indices to int32 would write them."""
    out = [-1, pool, pool + 7, -pool, -(2**31), 2**31 - 1]
    if index_dtype == torch.int64:
        out += [2**32 + 5, -(2**32) + 3, 2**40, -(2**62)]
    return out


def case_indices(n: int, pool: int, index_dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Distinct valid rows, with out-of-range entries at random positions (about a third of
    them for short inputs, all of ``bad_indices`` for long ones)."""
    idx = torch.randperm(pool, generator=gen)[:n].to(torch.int64)
    bad = bad_indices(pool, index_dtype)
    count = min(len(bad), n // 2 if n < 16 else len(bad))
    pos = torch.randperm(n, generator=gen)[:count]
    for p, value in zip(pos.tolist(), bad, strict=False):
        idx[p] = value
    return idx.to(index_dtype)


def store_case(dtype: torch.dtype, row: tuple[int, ...], n: int, index_dtype: torch.dtype, *, pool: int = 600,
               strided_kv: bool = False, strided_cache: bool = False) -> Case:
    """``store_cache`` into ``[pool, *row]`` caches. ``strided_kv``: K and V are slices of a fused
    ``[n, 3, *row]`` tensor; ``strided_cache``: the caches are ``kv[:, 0]`` and ``kv[:, 1]`` of one
    ``[pool, 2, *row]`` buffer (which is hashed whole)."""
    shape = "x".join(map(str, row))
    name = (f"store_cache/{SHORT[dtype]}-{shape}-{SHORT[index_dtype]}-n{n}"
            + ("-strided_kv" if strided_kv else "") + ("-strided_cache" if strided_cache else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        if strided_cache:
            kv = rand_bits((pool, 2, *row), dtype, gen)
            bufs = {"kv_cache": kv}
        else:
            bufs = {"k_cache": rand_bits((pool, *row), dtype, gen), "v_cache": rand_bits((pool, *row), dtype, gen)}
        if strided_kv:
            qkv = rand_bits((n, 3, *row), dtype, gen)
            k, v = qkv[:, 1], qkv[:, 2]
        else:
            k, v = rand_bits((n, *row), dtype, gen), rand_bits((n, *row), dtype, gen)
        idx = case_indices(n, pool, index_dtype, gen)

        def caches(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return (b["kv_cache"][:, 0], b["kv_cache"][:, 1]) if strided_cache else (b["k_cache"], b["v_cache"])

        ref = {key: t.clone() for key, t in bufs.items()}
        ref_store_cache(*caches(ref), idx, k, v)

        dev = {key: to_device(t, device) for key, t in bufs.items()}
        if strided_kv:
            qkv_d = to_device(qkv, device)
            k_d, v_d = qkv_d[:, 1], qkv_d[:, 2]
        else:
            k_d, v_d = to_device(k, device), to_device(v, device)
        ops.store_cache(*caches(dev), to_device(idx, device), k_d, v_d)
        return {key: (dev[key].cpu(), ref[key]) for key in bufs}

    return Case(name, "kvcache/store_cache.cuh", run)


def hash_cases() -> list[Case]:
    """The kernel-hash cases: rows of 1152 B (576 x 2-byte), 2048 B, 512 B, 256 B and 6 B."""
    return [
        # 576 x 2 bytes (an MLA latent row), 3-d bf16 and 2-d fp16 share the build.
        *(store_case(bf16, (1, 576), n, i64) for n in (0, 1, 7, 513)),
        store_case(bf16, (1, 576), 7, i32),
        store_case(fp16, (576,), 7, i32, strided_kv=True),
        store_case(fp16, (576,), 513, i64, strided_kv=True),
        # 8 heads x 128, fused QKV inputs and K/V halves of one cache buffer.
        store_case(bf16, (8, 128), 7, i32, strided_kv=True, strided_cache=True),
        store_case(bf16, (8, 128), 513, i64, strided_kv=True, strided_cache=True),
        store_case(fp16, (8, 128), 513, i32),
        # 512 B rows of fp32, 3-d and 2-d.
        store_case(fp32, (4, 32), 7, i64),
        store_case(fp32, (128,), 513, i32, strided_cache=True),
        # fp8 (e4m3), 256 B rows.
        store_case(fp8, (2, 128), 1, i32),
        store_case(fp8, (2, 128), 7, i64, strided_kv=True),
        store_case(fp8, (256,), 513, i64),
        # 6-byte rows (3 x fp16): 2-byte accesses.
        store_case(fp16, (3,), 7, i32),
        store_case(fp16, (1, 3), 513, i64, strided_kv=True, strided_cache=True),
    ]


ROW = {2: (32,), 3: (2, 16)}  # 32 elements of 2 bytes: one 64-byte specialization


def rows(rank: int, n: int) -> tuple[int, ...]:
    return (n, *ROW[rank])


def _store_bad() -> list[Bad]:
    out: list[Bad] = []
    for arg in ("k_cache", "v_cache", "k", "v"):
        cache = arg.endswith("cache")
        rank_key = "cache_rank" if cache else "input_rank"

        def n_of(p, cache=cache):
            return p["pool"] if cache else p["n"]

        def shape(p, cache=cache, rank_key=rank_key):
            return rows(p[rank_key], p["pool"] if cache else p["n"])

        out += [
            Bad(arg, "unsupported dtype", TypeError,
                lambda a, p, d, shape=shape: a.tensor(shape(p), d.draw(st.sampled_from(UNSUPPORTED_ROW_DTYPES)))),
            Bad(arg, "dtype of another size", TypeError, lambda a, p, d, shape=shape: a.tensor(shape(p), fp32)),
            Bad(arg, "dtype of the same size", TypeError,
                lambda a, p, d, shape=shape: a.tensor(shape(p), d.draw(st.sampled_from(
                    [other_same_size(p["dtype"]), torch.int16])))),
            Bad(arg, "rank", ValueError,
                lambda a, p, d, n_of=n_of: a.tensor(d.draw(st.sampled_from(
                    [(n_of(p) * 32,), (n_of(p), 2, 4, 4), ()])), p["dtype"])),
            Bad(arg, "zero-width rows", ValueError,
                lambda a, p, d, n_of=n_of: a.tensor(d.draw(st.sampled_from(
                    [(n_of(p), 0), (n_of(p), 2, 0), (n_of(p), 0, 16)])), p["dtype"])),
            Bad(arg, "non-contiguous rows", ValueError,
                lambda a, p, d, shape=shape: a.tensor(shape(p), p["dtype"], d.draw(st.sampled_from(
                    ["step2", "transposed"])))),
            Bad(arg, "meta tensor", ValueError, lambda a, p, d, shape=shape: meta(shape(p), p["dtype"])),
            Bad(arg, "not a tensor", TypeError,
                lambda a, p, d: d.draw(st.sampled_from([None, 3, [[0.0] * 32]]))),
            Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d, shape=shape: a.tensor(shape(p), p["dtype"]))),
        ]
        if arg != "k_cache":  # k_cache defines the specialization: a row of another size is a new build
            out.append(Bad(arg, "row size", ValueError,
                           lambda a, p, d, n_of=n_of, rank_key=rank_key: a.tensor(
                               (n_of(p), 16) if p[rank_key] == 2 else (n_of(p), d.draw(st.sampled_from([4, 1])),
                                                                        d.draw(st.sampled_from([8, 64]))),
                               p["dtype"])))
            out.append(Bad(arg, "rank unlike its partner", ValueError,
                           lambda a, p, d, n_of=n_of, rank_key=rank_key: a.tensor(
                               rows(5 - p[rank_key], n_of(p)), p["dtype"])))
        else:
            out.append(Bad(arg, "row size (one more build)", ValueError,
                           lambda a, p, d: a.tensor((p["pool"], 16) if p["cache_rank"] == 2 else (p["pool"], 2, 8),
                                                    p["dtype"])))
        if cache:
            out += [
                Bad(arg, "pool differs", ValueError,
                    lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], p["pool"] + d.draw(
                        st.sampled_from([1, -1]))), p["dtype"])),
                Bad(arg, "overlapping rows (expand)", ValueError,
                    lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], d.draw(
                        st.sampled_from([p["pool"], HUGE]))), p["dtype"], "expand")),
                Bad(arg, "requires grad", RuntimeError,
                    requires_grad(lambda a, p, d, shape=shape: a.tensor(shape(p), p["dtype"]))),
                Bad(arg, "inference tensor", RuntimeError,
                    lambda a, p, d, shape=shape: a.inference(shape(p), p["dtype"])),
            ]
        else:
            out.append(Bad(arg, "rows differ", ValueError,
                           lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], p["n"] + 1), p["dtype"],
                                                                       d.draw(st.sampled_from(["contiguous",
                                                                                               "expand"])))))
            out.append(Bad(arg, "2**33 rows claimed (expand)", ValueError,
                           lambda a, p, d, rank_key=rank_key: a.tensor(rows(p[rank_key], 2**33), p["dtype"],
                                                                       "expand")))
    out += [
        Bad("k", f"{SHARED}: rows of k_cache", ValueError,
            lambda a, p, d: a.alias(p["args"]["k_cache"], rows(p["cache_rank"], p["n"]), p["dtype"])),
        Bad("v", f"{SHARED}: rows of k_cache", ValueError,
            lambda a, p, d: a.alias(p["args"]["k_cache"], rows(p["cache_rank"], p["n"]), p["dtype"],
                                    d.draw(st.sampled_from([0, 1, 17])))),
        Bad("v_cache", f"{SHARED}: k_cache shifted", ValueError,
            lambda a, p, d: a.alias(p["args"]["k_cache"], rows(p["cache_rank"], p["pool"]), p["dtype"],
                                    d.draw(st.sampled_from([0, 1, 31])))),
        Bad("indices", f"{SHARED}: bytes of v_cache", ValueError,
            lambda a, p, d: a.alias(p["args"]["v_cache"], (p["n"],), p["index_dtype"])),
        Bad("k", "head layout unlike the caches' (k and v)", ValueError,
            lambda a, p, d: a.tensor((p["n"], *d.draw(st.sampled_from(
                [(4, 8), (32,)] if p["cache_rank"] == 3 else [(2, 16), (4, 8)]))), p["dtype"])),
        Bad("indices", "dtype", TypeError,
            lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
        Bad("indices", "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["index_dtype"])),
        Bad("indices", "length", ValueError,
            lambda a, p, d: a.tensor((p["n"] + d.draw(st.sampled_from([1, 2])),), p["index_dtype"])),
        Bad("indices", "non-contiguous", ValueError,
            lambda a, p, d: a.tensor((max(p["n"], 2),), p["index_dtype"], "step2")),
        Bad("indices", "stride 0 (expand, maybe 2**40 long)", ValueError,
            lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(p["n"], 2), HUGE])),), p["index_dtype"],
                                     "expand")),
        Bad("indices", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["index_dtype"])),
        Bad("indices", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 1.5]))),
    ]
    return out


STORE_BAD = _store_bad()
