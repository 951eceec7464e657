"""``indexing``'s test material: its torch reference, hash cases and invalid calls."""

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


def ref_indexing(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, start: int, length: int) -> None:
    """``out[t] = weight[ids[t] - start]``, a zero row where ``ids[t]`` is outside
    ``[start, start + length)``. Writes ``out``."""
    local = ids.long() - start  # wraps where ids < start; those rows are not valid
    valid = (ids.long() >= start) & (local < length)
    dst = oracle.bytes_view(out)
    dst.zero_()
    dst[valid] = oracle.bytes_view(weight)[local[valid]]


def indexing_case(dtype: torch.dtype, hidden: int, n: int, id_dtype: torch.dtype, *, rows: int = 300,
                  vocab_range: tuple[int, int] | None = None, strided_weight: bool = False,
                  out_view: bool = False) -> Case:
    """``indexing`` from a ``[rows, hidden]`` table. ``vocab_range``: a shard ``(start, length)``
    (``length <= rows``: the rows past it are padding that must never be read);
    ``strided_weight``: the table is a column slice of a wider one; ``out_view``: ``out=`` is a
    strided slice of a wider buffer (hashed whole)."""
    name = (f"indexing/{SHORT[dtype]}-h{hidden}-{SHORT[id_dtype]}-n{n}"
            + (f"-shard{vocab_range[0]}+{vocab_range[1]}" if vocab_range else "")
            + ("-strided_weight" if strided_weight else "") + ("-out_view" if out_view else ""))

    def run(device: torch.device) -> Outputs:
        gen = generator(name)
        start, length = vocab_range if vocab_range else (0, rows)
        table = rand_bits((rows, 3 * hidden if strided_weight else hidden), dtype, gen)
        ids = torch.randint(max(0, start - 40), start + length + 40, (n,), generator=gen, dtype=torch.int64)
        extremes = [-1, start - 1, start + length, rows, 2**31 - 1, -(2**31)]
        if id_dtype == torch.int64:
            extremes += [2**32 + start + 1, 2**40]  # low 32 bits inside the range
        for p, value in zip(torch.randperm(n, generator=gen).tolist(), extremes[: n // 2 if n < 16 else None],
                            strict=False):
            ids[p] = value
        ids = ids.to(id_dtype)
        buf = rand_bits((n, 3 * hidden), dtype, gen) if out_view else None

        def weight_of(t: torch.Tensor) -> torch.Tensor:
            return t[:, hidden : 2 * hidden] if strided_weight else t

        if buf is not None:
            want = buf.clone()
            ref_indexing(want[:, hidden : 2 * hidden], weight_of(table), ids, start, length)
        else:
            want = torch.empty((n, hidden), dtype=dtype)
            ref_indexing(want, weight_of(table), ids, start, length)

        table_d = to_device(table, device)
        if buf is not None:
            buf_d = to_device(buf, device)
            out_d = buf_d[:, hidden : 2 * hidden]
            res = ops.indexing(weight_of(table_d), to_device(ids, device), out=out_d, vocab_range=vocab_range)
            if res.data_ptr() != out_d.data_ptr():
                raise AssertionError(f"{name}: indexing(out=...) did not return out")
            got = buf_d.cpu()
        else:
            got = ops.indexing(weight_of(table_d), to_device(ids, device), vocab_range=vocab_range).cpu()
        return {"out": (got, want)}

    return Case(name, "embedding/indexing.cuh", run)


def hash_cases() -> list[Case]:
    """The kernel-hash cases: full tables and vocabulary shards, rows of 1152 B, 400 B and 6 B."""
    return [
        indexing_case(bf16, 576, 0, i64),
        indexing_case(bf16, 576, 1, i32),
        indexing_case(bf16, 576, 7, i64),
        indexing_case(bf16, 576, 513, i64, out_view=True),
        indexing_case(fp16, 576, 513, i32, rows=260, vocab_range=(250, 200), strided_weight=True),
        indexing_case(fp16, 576, 7, i64, rows=200, vocab_range=(1000, 200), out_view=True),
        indexing_case(fp32, 100, 7, i32),
        indexing_case(fp32, 100, 513, i64, rows=120, vocab_range=(0, 100), out_view=True),
        indexing_case(fp8, 6, 7, i64),
        indexing_case(fp8, 6, 513, i32, rows=90, vocab_range=(37, 80), strided_weight=True, out_view=True),
    ]


HIDDEN = 32  # 64-byte rows of 2-byte elements: one specialization

INDEXING_BAD = [
    Bad("weight", "unsupported dtype", TypeError,
        lambda a, p, d: a.tensor((p["rows"], HIDDEN), d.draw(st.sampled_from(UNSUPPORTED_ROW_DTYPES)))),
    Bad("weight", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["rows"] * HIDDEN,), (p["rows"], 2, 16), ()])),
                                 p["dtype"])),
    Bad("weight", "zero-width rows", ValueError, lambda a, p, d: a.tensor((p["rows"], 0), p["dtype"])),
    Bad("weight", "non-contiguous rows", ValueError,
        lambda a, p, d: a.tensor((p["rows"], HIDDEN), p["dtype"], "step2")),
    Bad("weight", "meta tensor", ValueError, lambda a, p, d: meta((p["rows"], HIDDEN), p["dtype"])),
    Bad("weight", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [[1.0] * HIDDEN]]))),
    Bad("ids", "dtype", TypeError, lambda a, p, d: a.tensor((p["n"],), d.draw(st.sampled_from(BAD_INDEX_DTYPES)))),
    Bad("ids", "rank", ValueError,
        lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p["n"], 1), (1, p["n"]), ()])), p["id_dtype"])),
    Bad("ids", "non-contiguous", ValueError, lambda a, p, d: a.tensor((max(p["n"], 2),), p["id_dtype"], "step2")),
    Bad("ids", "stride 0 (expand, maybe 2**40 long)", ValueError,
        lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(p["n"], 2), HUGE])),), p["id_dtype"], "expand")),
    Bad("ids", "meta tensor", ValueError, lambda a, p, d: meta((p["n"],), p["id_dtype"])),
    Bad("ids", "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [0, 1], 2]))),
    Bad("out", "dtype", TypeError,
        lambda a, p, d: a.tensor((p["n"], HIDDEN), d.draw(st.sampled_from(
            [fp32, other_same_size(p["dtype"]), torch.int16, torch.bool])))),
    Bad("out", "rows differ from ids", ValueError, lambda a, p, d: a.tensor((p["n"] + 1, HIDDEN), p["dtype"])),
    Bad("out", "hidden differs", ValueError,
        lambda a, p, d: a.tensor((p["n"], d.draw(st.sampled_from([16, 64]))), p["dtype"])),
    Bad("out", "3-d", ValueError, lambda a, p, d: a.tensor((p["n"], 2, 16), p["dtype"])),
    Bad("out", "non-contiguous rows", ValueError, lambda a, p, d: a.tensor((p["n"], HIDDEN), p["dtype"], "step2")),
    Bad("out", "overlapping rows (expand)", ValueError,
        lambda a, p, d: a.tensor((max(p["n"], 2), HIDDEN), p["dtype"], "expand")),
    Bad("out", "meta tensor", ValueError, lambda a, p, d: meta((p["n"], HIDDEN), p["dtype"])),
    Bad("out", "not a tensor", TypeError, lambda a, p, d: [[0.0] * HIDDEN]),
    Bad("weight", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["rows"], HIDDEN), p["dtype"]))),
    Bad("ids", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"],), p["id_dtype"]))),
    Bad("out", "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p["n"], HIDDEN), p["dtype"]))),
    Bad("out", "requires grad", RuntimeError, requires_grad(lambda a, p, d: a.tensor((p["n"], HIDDEN), p["dtype"]))),
    Bad("out", "inference tensor", RuntimeError, lambda a, p, d: a.inference((p["n"], HIDDEN), p["dtype"])),
    Bad("out", f"{SHARED}: rows of weight", ValueError,
        lambda a, p, d: a.alias(p["args"]["weight"], (p["n"], HIDDEN), p["dtype"],
                                d.draw(st.sampled_from([0, 1, 40])))),
    Bad("ids", f"{SHARED}: bytes of out", ValueError,
        lambda a, p, d: a.alias(p["args"]["out"], (p["n"],), p["id_dtype"])),
    Bad("vocab_range", "length beyond the table", ValueError,
        lambda a, p, d: (d.draw(st.sampled_from([0, 5])), p["rows"] + d.draw(st.sampled_from([1, 1000])))),
    Bad("vocab_range", "negative", ValueError,
        lambda a, p, d: d.draw(st.sampled_from([(-1, 2), (0, -1), (-(2**40), 1)]))),
    Bad("vocab_range", "not a pair", ValueError, lambda a, p, d: d.draw(st.sampled_from([(0, 1, 2), (3,), ()]))),
    Bad("vocab_range", "not integers", TypeError, lambda a, p, d: d.draw(st.sampled_from([(0.5, 2), (0, "2")]))),
    Bad("vocab_range", "beyond int64", TypeError, lambda a, p, d: d.draw(st.sampled_from([(2**63, 1), (0, -2**64)]))),
]
