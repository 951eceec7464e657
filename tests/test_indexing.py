"""indexing on CPU tensors (the kernel through the CPU emulator), compared byte for byte with the
torch reference and with F.embedding; argument errors name the argument and write nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kernkit import ops
from kernkit.ops.indexing import indexing_spec
from kernkit.testing.invalid import (
    HUGE,
    SHARED,
    VALID,
    Arena,
    check_invalid,
    check_unallocatable,
    claims_huge,
    invalid_calls,
)
from kernkit.testing.ops.indexing import HIDDEN, INDEXING_BAD, bf16, fp16, i32, i64, ref_indexing
from kernkit.testing.oracle import rand_bits, same_bytes

VOCAB = 50


def expected(weight, ids, start, length):
    out = torch.empty(ids.shape[0], weight.shape[1], dtype=weight.dtype)
    ref_indexing(out, weight, ids, start, length)
    return out


CASES = [(torch.bfloat16, 256), (torch.float16, 256), (torch.float32, 16), (torch.float8_e5m2, 128), (torch.float16, 3)]


@pytest.mark.parametrize("dtype,hidden", CASES, ids=lambda x: str(x).removeprefix("torch."))
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_full_vocab_matches_reference(dtype, hidden, id_dtype):
    gen = torch.Generator().manual_seed(hidden)
    weight = rand_bits((VOCAB, hidden), dtype, gen)
    for n in (1, 7, 40):
        ids = torch.randint(0, VOCAB, (n,), generator=gen)
        if n >= 3:
            ids[0], ids[1], ids[2] = -1, VOCAB, VOCAB + 1000  # outside the table: zero rows
        ids = ids.to(id_dtype)
        got = ops.indexing(weight, ids)
        assert got.shape == (n, hidden) and got.dtype == dtype
        assert same_bytes(got, expected(weight, ids, 0, VOCAB))
        inside = (ids >= 0) & (ids < VOCAB)
        if dtype in (torch.float32, torch.float16, torch.bfloat16):
            assert same_bytes(got[inside], F.embedding(ids[inside].long(), weight))
        assert not got[~inside].view(torch.uint8).any()


def test_vocab_shard_with_padding_and_strided_tensors():
    gen = torch.Generator().manual_seed(3)
    start, length, hidden = 100, 37, 256
    table = rand_bits((length + 3, 2 * hidden), torch.bfloat16, gen)  # 3 padding rows
    weight = table[:, :hidden]  # strided rows
    ids = torch.randint(start - 20, start + length + 20, (60,), generator=gen, dtype=torch.int64)
    big_out = torch.full((60, 3 * hidden), 7.0, dtype=torch.bfloat16)
    out = big_out[:, hidden : 2 * hidden]
    res = ops.indexing(weight, ids, out=out, vocab_range=(start, length))
    assert res is out
    assert same_bytes(out, expected(weight, ids, start, length))
    assert (big_out[:, :hidden] == 7).all() and (big_out[:, 2 * hidden :] == 7).all()


def test_ids_at_the_int64_limits_never_overflow():
    """``ids - start`` is never formed for an id below ``start``: with id -2**63 and
    ``vocab_range=(2**63 - 1, 50)`` the difference would wrap to 1 and return ``weight[1]``."""
    weight = rand_bits((50, 16), torch.float32, torch.Generator().manual_seed(5))
    top = 2**63 - 1
    ids = torch.tensor([-(2**63), top, top - 1, 0, -1], dtype=torch.int64)
    got = ops.indexing(weight, ids, vocab_range=(top, 50))
    assert not got[[0, 2, 3, 4]].any() and torch.equal(got[1], weight[0])
    assert same_bytes(got, expected(weight, ids, top, 50))
    got = ops.indexing(weight, torch.tensor([-(2**63), 2**63 - 1, 49]), vocab_range=(0, 50))
    assert not got[:2].any() and torch.equal(got[2], weight[49])


def test_misaligned_output_view():
    gen = torch.Generator().manual_seed(4)
    weight = rand_bits((VOCAB, 256), torch.bfloat16, gen)
    ids = torch.randint(0, VOCAB, (9,), generator=gen, dtype=torch.int32)
    out = torch.empty(9 * 256 + 1, dtype=torch.bfloat16)[1:].view(9, 256)
    ops.indexing(weight, ids, out=out)
    assert same_bytes(out, expected(weight, ids, 0, VOCAB))


def test_empty():
    weight = torch.randn(VOCAB, 256).bfloat16()
    out = ops.indexing(weight, torch.empty(0, dtype=torch.int32))
    assert out.shape == (0, 256)


def _bad_cases():
    def base():
        return dict(weight=torch.ones(VOCAB, 256, dtype=torch.bfloat16), ids=torch.arange(3, dtype=torch.int32),
                    out=torch.zeros(3, 256, dtype=torch.bfloat16), vocab_range=None)

    def with_(**kw):
        def make():
            args = base()
            args.update({key: f(args) for key, f in kw.items()})
            return args
        return make

    return [
        ("ids", TypeError, with_(ids=lambda a: torch.arange(3, dtype=torch.float32))),
        ("ids", ValueError, with_(ids=lambda a: torch.zeros(3, 2, dtype=torch.int32))),
        ("out", TypeError, with_(out=lambda a: torch.zeros(3, 256, dtype=torch.float16))),
        ("out", ValueError, with_(out=lambda a: torch.zeros(3, 128, dtype=torch.bfloat16))),
        ("out", ValueError, with_(out=lambda a: torch.zeros(3, 512, dtype=torch.bfloat16)[:, ::2])),
        ("vocab_range", ValueError, with_(vocab_range=lambda a: (0, VOCAB + 1))),
        ("vocab_range", ValueError, with_(vocab_range=lambda a: (-5, 10))),
    ]


@pytest.mark.parametrize("role,exc,make", _bad_cases())
def test_bad_arguments_name_the_argument_and_write_nothing(role, exc, make):
    args = make()
    with pytest.raises(exc, match=f"'{role}'"):
        ops.indexing(**args)
    assert not args["out"].float().any()


def test_three_d_weight_is_refused():
    with pytest.raises(ValueError, match="'weight'"):
        ops.indexing(torch.zeros(4, 2, 8), torch.arange(2))


def test_one_specialization_per_element_size_and_row_bytes():
    specs = {indexing_spec(d, 1024, "emu") for d in (torch.bfloat16, torch.float16)}
    assert [s.title for s in specs] == ["indexing<2, 2048, 16, 2, false>"]


def test_launcher_vocab_range():
    """The launcher takes ``vocab_range`` as one argument: None (the whole table), or a tuple
    or list of exactly two ints, checked after the tensors."""
    fn = indexing_spec(torch.bfloat16, 256, "emu").build_and_load().indexing
    gen = torch.Generator().manual_seed(5)
    weight = rand_bits((VOCAB, 256), torch.bfloat16, gen)
    ids = torch.tensor([3, 49, 50, -1, 12], dtype=torch.int64)
    out = torch.empty(5, 256, dtype=torch.bfloat16)
    fn(out, weight, ids, None)
    assert same_bytes(out, expected(weight, ids, 0, VOCAB))
    fn(out, weight, ids, [10, 30])
    assert same_bytes(out, expected(weight, ids, 10, 30))
    fn(out, weight, ids, (0, 0))
    assert not out.view(torch.uint8).any()
    for bad in ((), (1,), (0, 10, 1), [1, 2, 3, 4]):
        with pytest.raises(ValueError, match=rf"^'vocab_range': expected \(start, length\), got {len(bad)} values$"):
            fn(out, weight, ids, bad)
    with pytest.raises(ValueError, match=r"^'vocab_range': length 51 must lie in \[0, 50\], the rows of 'weight'$"):
        fn(out, weight, ids, (0, 51))
    with pytest.raises(ValueError, match=r"^'vocab_range': start -1 must be >= 0$"):
        fn(out, weight, ids, (-1, 5))
    # The tensors are checked first: a bad ids wins over a bad vocab_range.
    with pytest.raises(TypeError, match=r"^'ids': "):
        fn(out, weight, ids.float(), (1,))


@st.composite
def indexing_params(draw):
    rows_ = draw(st.sampled_from([6, 40]))
    shard = draw(st.booleans())
    return dict(
        dtype=draw(st.sampled_from([bf16, fp16])),
        rows=rows_,
        n=draw(st.sampled_from([0, 1, 2, 5, 9])),
        id_dtype=draw(st.sampled_from([i32, i64])),
        weight_layout=draw(st.sampled_from(["contiguous", "offset", "padded", "expand"])),
        huge_table=draw(st.booleans()),
        out=draw(st.sampled_from([None, "contiguous", "offset", "padded"])),
        vocab_range=(draw(st.sampled_from([0, 3, 1000])), draw(st.integers(0, rows_))) if shard else None,
        seed=draw(st.integers(0, 2**16)),
    )


def indexing_args(a: Arena, p: dict) -> dict:
    n = p["n"]
    huge = p["weight_layout"] == "expand" and p["huge_table"]
    weight = a.tensor((HUGE if huge else p["rows"], HIDDEN), p["dtype"], p["weight_layout"])
    start, length = p["vocab_range"] or (0, weight.shape[0])
    pool = [start, start + length - 1, start - 1, start + length, -1, 2**31 - 1, -(2**31), start + 2, HUGE - 1,
            HUGE]
    ids = a.tensor((n,), p["id_dtype"])
    values = [pool[int(torch.randint(0, len(pool), (), generator=a.gen))] for _ in range(n)]
    if p["id_dtype"] == i32:
        values = [v if -(2**31) <= v < 2**31 else -1 for v in values]
    ids.copy_(torch.tensor(values, dtype=p["id_dtype"]))
    a.bufs[-1] = (a.bufs[-1][0], a.bufs[-1][0].clone())
    out = None if p["out"] is None else a.tensor((n, HIDDEN), p["dtype"], p["out"])
    return dict(weight=weight, ids=ids, out=out, vocab_range=p["vocab_range"])


@invalid_calls(INDEXING_BAD, indexing_params())
def test_indexing_rejects_invalid_calls(bad, p, via, d):
    a = Arena.seeded(p["seed"])
    if bad.arg == "vocab_range":
        p = dict(p, huge_table=False)  # so that rows + 1 is beyond the table
    if bad.what.startswith(SHARED):  # rows of a real table to share, and at least one of them
        p = dict(p, n=min(max(p["n"], 1), 4), weight_layout="contiguous", huge_table=False)
    args = indexing_args(a, p)
    if bad.arg in ("out", "ids") and args["out"] is None:
        args["out"] = a.tensor((p["n"], HIDDEN), p["dtype"])  # placeholder, or what ids shares
    args[bad.arg] = bad.make(a, dict(p, args=args), d)
    if bad.arg == "out" and bad.what == "overlapping rows (expand)":
        args["ids"] = a.tensor((args["out"].shape[0],), p["id_dtype"])
    if args["out"] is None and claims_huge(args["ids"]):
        check_unallocatable(lambda: ops.indexing(**args), a)
    elif via == "custom op" and bad.what not in ("meta tensor", "not a tensor", "not a pair", "not integers",
                                                 "beyond int64", "negative bit"):
        vr = None if args["vocab_range"] is None else list(args["vocab_range"])
        if args["out"] is None:
            check_invalid(lambda: torch.ops.kernkit.indexing(args["weight"], args["ids"], vr), a, bad)
        else:
            check_invalid(lambda: torch.ops.kernkit.indexing_out(args["out"], args["weight"], args["ids"], vr), a, bad)
    else:
        check_invalid(lambda: ops.indexing(**args), a, bad)


@VALID
@given(p=indexing_params())
def test_indexing_valid_views_give_the_reference_bytes(p):
    """Misaligned and padded tables and outputs, a table expanded to 2**40 rows with stride 0,
    shards, out-of-range ids, n == 0: the result (and every buffer) matches the reference."""
    a = Arena.seeded(p["seed"])
    args = indexing_args(a, p)
    want = a.copies()
    start, length = p["vocab_range"] or (0, args["weight"].shape[0])
    if args["out"] is None:
        want_out = torch.empty(p["n"], HIDDEN, dtype=p["dtype"])
    else:
        want_out = a.twin(args["out"], want)
    ref_indexing(want_out, a.twin(args["weight"], want), args["ids"], start, length)
    got = ops.indexing(**args)
    if args["out"] is not None:
        assert got is args["out"]
    assert torch.equal(got.contiguous().view(torch.uint8), want_out.contiguous().view(torch.uint8))
    assert a.same_as(want)
