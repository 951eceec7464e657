"""``compare_key``'s test material: its reference."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernkit.testing.invalid import HUGE, Bad, meta, neg_bit


def ref_compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The length of the common prefix of two 1-d tensors."""
    n = min(a.shape[0], b.shape[0])
    diff = torch.nonzero(a[:n] != b[:n])
    return int(diff[0, 0]) if diff.numel() else n


i32 = torch.int32


def _key_bad(arg: str) -> list[Bad]:
    length = "la" if arg == "a" else "lb"
    return [
        Bad(arg, "dtype", TypeError,
            lambda a, p, d: a.tensor((p[length],), d.draw(st.sampled_from(
                [torch.int64, torch.int16, torch.uint8, torch.float32, torch.bool, torch.uint32])))),
        Bad(arg, "rank", ValueError,
            lambda a, p, d: a.tensor(d.draw(st.sampled_from([(p[length], 1), (2, 3), ()])), i32)),
        Bad(arg, "non-contiguous", ValueError, lambda a, p, d: a.tensor((max(p[length], 2),), i32, "step2")),
        Bad(arg, "stride 0 (expand, maybe 2**40 long)", ValueError,
            lambda a, p, d: a.tensor((d.draw(st.sampled_from([max(p[length], 2), HUGE])),), i32, "expand")),
        Bad(arg, "meta tensor", ValueError, lambda a, p, d: meta((p[length],), i32)),
        Bad(arg, "not a tensor", TypeError, lambda a, p, d: d.draw(st.sampled_from([None, [1, 2], 3]))),
        Bad(arg, "negative bit", ValueError, neg_bit(lambda a, p, d: a.tensor((p[length],), i32))),
    ]


KEY_BAD = _key_bad("a") + _key_bad("b")
