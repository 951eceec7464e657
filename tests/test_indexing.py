"""indexing on CPU tensors (the kernel through the CPU emulator), compared byte for byte with the
torch reference and with F.embedding; argument errors name the argument and write nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernkit.testing import oracle
from kernkit import ops
from kernkit.testing.oracle import rand_bits, same_bytes
from kernkit.ops.embedding import indexing_spec

VOCAB = 50


# ----- the reference: what the kernel must compute


def ref_indexing(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, start: int, length: int) -> None:
    """``out[t] = weight[ids[t] - start]``, a zero row where ``ids[t]`` is outside
    ``[start, start + length)``. Writes ``out``."""
    local = ids.long() - start  # wraps where ids < start; those rows are not valid
    valid = (ids.long() >= start) & (local < length)
    dst = oracle.bytes_view(out)
    dst.zero_()
    dst[valid] = oracle.bytes_view(weight)[local[valid]]


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

