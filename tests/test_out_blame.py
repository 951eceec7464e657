"""Every op that takes ``out=`` blames a caller's ``out`` that disagrees with the inputs on
``out``, not on the input it was checked against (CPU tensors, through the CPU emulator)."""

from __future__ import annotations

import inspect

import pytest
import torch

from kernkit import ops

fp8 = torch.float8_e4m3fn


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


#: op name -> (the call with a given out, the wrong outs: shape, dtype, layout).
CASES = {
    "scale": (lambda out: ops.scale(_x(4, 64), 2.0, out=out),
              [torch.empty(4, 63), torch.empty(64, 4), torch.empty(256), torch.empty(4, 64, dtype=torch.float16),
               torch.empty(64, 4).t()]),
    "rmsnorm": (lambda out: ops.rmsnorm(_x(4, 64), torch.ones(64), out=out),
                [torch.empty(3, 64), torch.empty(4, 32), torch.empty(4, 64, dtype=torch.float16),
                 torch.empty(64, 4).t()]),
    "silu_and_mul": (lambda out: ops.silu_and_mul(_x(4, 128), out=out),
                     [torch.empty(3, 64), torch.empty(4, 65), torch.empty(4, 64, dtype=torch.bfloat16),
                      torch.empty(64, 4).t()]),
    "gelu_and_mul": (lambda out: ops.gelu_and_mul(_x(4, 128), out=out),
                     [torch.empty(3, 64), torch.empty(4, 128), torch.empty(4, 64, dtype=torch.float16),
                      torch.empty(64, 4).t()]),
    "per_token_quant_fp8": (lambda out: ops.per_token_quant_fp8(_x(4, 64), out=out),
                            [torch.empty(3, 64, dtype=fp8), torch.empty(4, 32, dtype=fp8), torch.empty(4, 64),
                             torch.empty(64, 4, dtype=fp8).t()]),
    "per_token_group_quant_fp8": (lambda out: ops.per_token_group_quant_fp8(_x(4, 64), 16, out=out),
                                  [torch.empty(3, 64, dtype=fp8), torch.empty(4, 32, dtype=fp8), torch.empty(4, 64),
                                   torch.empty(256, dtype=fp8), torch.empty(64, 4, dtype=fp8).t()]),
    "indexing": (lambda out: ops.indexing(_x(10, 64), torch.arange(5), out=out),
                 [torch.empty(4, 64), torch.empty(5, 32), torch.empty(5, 64, dtype=torch.float16),
                  torch.empty(64, 5).t()]),
}


def test_every_op_with_out_has_cases():
    with_out = {op.name for op in ops.registered_ops()
                if op.qualname.startswith("kernkit::") and "out" in inspect.signature(op.fn).parameters}
    assert with_out == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_wrong_out_is_blamed_on_out(name):
    call, outs = CASES[name]
    for out in outs:
        with pytest.raises((TypeError, ValueError)) as info:
            call(out)
        assert str(info.value).startswith("'out'"), (name, tuple(out.shape), out.dtype, str(info.value))
