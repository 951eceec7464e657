"""The header library's value tests (``tests/test_headers_emu.py``) on a CUDA GPU.

Every test of that module runs here with the kernels built for the GPU by the default backend
(``KERNKIT_BACKEND``: nvcc unless set, see ``tests/conftest.py``; ``KERNKIT_BACKEND=nvrtc`` runs
them through NVRTC) and the tensors on the GPU; references are computed by torch on the CPU.
The comparisons are the same: bit-exact wherever the operation is exact, a tolerance for fp32
rsqrt/exp/sin/cos, and PTX's stated error for ex2_approx/rcp_approx/tanh_approx. Run with
``pytest -m gpu``; skipped when torch sees no GPU.
"""

from __future__ import annotations

import pytest

from test_headers_emu import *  # noqa: F401,F403  (the tests, collected again here; tests/ is on pytest's path)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend() -> str:
    """Where the kernels run: the GPU, built by the default backend."""
    from kernkit.jit.backends import default_backend

    return default_backend()
