"""A kernel built through load_jit(..., backend="emu") and run on CPU tensors."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import emu_build  # noqa: E402

HERE = Path(__file__).resolve().parent


def _load(broken: bool):
    from kernkit.jit import load_jit

    flag = "true" if broken else "false"
    return load_jit(
        "emu_row_sum", flag, cuda_files=[str(HERE / "jit_row_sum.cuh")],
        cuda_wrappers=[("row_sum", f"RowSum<{flag}>::run")], backend="emu",
    )


@pytest.fixture(scope="module")
def needs_cuda_headers():
    if not emu_build.have_cuda_headers():
        pytest.skip("CUDA headers (CUDA_HOME) and a host C++ compiler are needed")


def test_row_sum_on_cpu_is_bit_exact_per_schedule(needs_cuda_headers, monkeypatch):
    mod = _load(False)
    x = torch.randn(37, 1000, generator=torch.Generator().manual_seed(0))
    results = []
    for seed in ("0", "5"):
        monkeypatch.setenv("KERNKIT_EMU_SEED", seed)
        out = torch.empty(37)
        mod.row_sum(x, out)
        results.append(out)
    # Reference with the kernel's exact association order (per-thread strided sums, xor tree
    # across the warp, warps added in order), in float32.
    xs = x.view(37, 1000)
    per_thread = torch.zeros(37, 128)
    for c in range(1000):
        per_thread[:, c % 128] += xs[:, c]
    lanes = per_thread.view(37, 4, 32).clone()
    for off in (16, 8, 4, 2, 1):
        idx = torch.arange(32) ^ off
        lanes = lanes + lanes[:, :, idx]
    want = torch.zeros(37)
    for w in range(4):
        want += lanes[:, w, 0]
    for out in results:
        assert torch.equal(out, want)
    torch.testing.assert_close(results[0], x.sum(1), rtol=1e-4, atol=1e-3)


def test_divergent_shuffle_raises_runtime_error_through_ffi(needs_cuda_headers):
    mod = _load(True)
    x = torch.ones(2, 64)
    line = next(i for i, s in enumerate((HERE / "jit_row_sum.cuh").read_text().splitlines(), 1)
                if "MARK:row_sum_shfl" in s)
    with pytest.raises(RuntimeError,
                       match=rf"lane 24 exited without reaching __shfl_xor_sync at .*jit_row_sum.cuh:{line}"):
        mod.row_sum(x, torch.empty(2))
