"""README.md stays true: its "Writing a kernel" snippet runs as written on a machine without a
GPU (CPU tensors, through the CPU emulator), with no target architecture set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_writing_a_kernel_snippet_runs_without_a_gpu(monkeypatch):
    section = README.read_text().split("## Writing a kernel", 1)[1]
    code = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    monkeypatch.delenv("KERNKIT_CUDA_ARCH", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only machine
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)  # the snippet asserts its own result
    x = torch.randn(6, 5).t()  # transposed: out is allocated contiguous, src is refused by name
    with pytest.raises(ValueError, match=r"^'src': expected a contiguous tensor"):
        scope["scale"](x, 2.0)
