"""The ops under the CPU emulator with AddressSanitizer: out-of-range and negative indices of
store_cache (and out-of-range ids of indexing) never touch memory outside the tensors, shown on
exactly sized tensors, where any stray access is a heap overflow ASan reports. A planted
scatter kernel without the bounds check (tests/csrc/unchecked_scatter.cuh) must be reported.

Sanitized builds go to a private cache (``KERNKIT_EMU_SANITIZE`` is part of the build flags),
are compiled in a plain subprocess, and are loaded in subprocesses that preload the ASan
runtime and libstdc++ (see docs/emulator.md). A bad argument still raises the Python exception."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CSRC = Path(__file__).resolve().parent / "csrc"

_PLANTED_REQUEST = f"""
from kernkit.jit import JitSpec
PLANTED = JitSpec.make(
    "unchecked_scatter", "float", cuda_files=[{str(CSRC / 'unchecked_scatter.cuh')!r}],
    cuda_wrappers=[("scatter", "UncheckedScatter<float>::run")], backend="emu")
"""

# Compile every sanitized build the runs below load, in parallel and without the ASan runtime
# preloaded into the compilers. The ops' specs are the ones they load for these shapes; a
# mismatch only costs a build later.
BUILD = _PLANTED_REQUEST + """
import torch
from concurrent.futures import ThreadPoolExecutor
from kernkit.ops.indexing import indexing_spec
from kernkit.ops.store_cache import store_cache_spec
specs = [store_cache_spec(torch.bfloat16, (1, 576), "emu"), indexing_spec(torch.bfloat16, 576, "emu"), PLANTED]
with ThreadPoolExecutor(len(specs)) as pool:
    print([p.name for p in pool.map(lambda s: s.build(), specs)])
"""

OPS = """
import torch
from kernkit import ops
from kernkit.testing.ops import indexing, store_cache as store
gen = torch.Generator().manual_seed(0)

def rand_rows(rows, elems):
    # An allocation of exactly rows x elems bf16 values (torch allocates exactly the bytes).
    return torch.randint(0, 256, (rows, 2 * elems), dtype=torch.uint8, generator=gen).view(torch.bfloat16)

def same_bytes(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

# 64 rows x 1152 B = 72 KiB per cache: ASan's redzones around a chunk that size are 2 KiB,
# wider than a row, so a write to row -1 or row P is a reported overflow.
P = 64
for index_dtype in (torch.int32, torch.int64):
    bad = [-1, P, P + 1, -P, 2**31 - 1, -(2**31)]
    if index_dtype == torch.int64:
        bad += [2**32 + 3, -(2**32) + 5, 2**40, -(2**62)]
    idx = torch.tensor(bad[:3] + [0] + bad[3:] + [P - 1, 3], dtype=index_dtype)
    n = idx.shape[0]
    kc, vc = rand_rows(P, 576).view(P, 1, 576), rand_rows(P, 576).view(P, 1, 576)
    k, v = rand_rows(n, 576).view(n, 1, 576), rand_rows(n, 576).view(n, 1, 576)
    want_k, want_v = kc.clone(), vc.clone()
    store.ref_store_cache(want_k, want_v, idx, k, v)
    ops.store_cache(kc, vc, idx, k, v)
    assert same_bytes(kc, want_k) and same_bytes(vc, want_v), index_dtype
    only_bad = torch.tensor(bad, dtype=index_dtype)
    before_k, before_v = kc.clone(), vc.clone()
    ops.store_cache(kc, vc, only_bad, k[: len(bad)], v[: len(bad)])
    assert same_bytes(kc, before_k) and same_bytes(vc, before_v), index_dtype

# indexing: a table of exactly its rows; ids outside it give zero rows and read nothing.
V = 64
weight = rand_rows(V, 576)
for id_dtype in (torch.int32, torch.int64):
    extra = [2**32 + 1, -(2**40)] if id_dtype == torch.int64 else []
    for vocab_range, ids in ((None, [-1, V, 0, V - 1, 2**31 - 1, -(2**31), 5] + extra),
                             ((100, V), [99, 100 + V, 100, 100 + V - 1, 0, -5, 130] + extra)):
        ids = torch.tensor(ids, dtype=id_dtype)
        got = ops.indexing(weight, ids, vocab_range=vocab_range)
        start, length = vocab_range or (0, V)
        want = torch.empty(ids.shape[0], 576, dtype=torch.bfloat16)
        indexing.ref_indexing(want, weight, ids, start, length)
        assert same_bytes(got, want), (id_dtype, vocab_range)
print("OPS-UNDER-ASAN-OK")
"""

SCATTER = _PLANTED_REQUEST + """
import sys
import torch
mod = PLANTED.build_and_load()
dst = torch.zeros(1000)  # 4000 bytes, exactly
idx = torch.tensor([int(a) for a in sys.argv[1:]], dtype=torch.int64)
mod.scatter(dst, torch.arange(1, idx.shape[0] + 1, dtype=torch.float32), idx)
assert dst[idx[idx < 1000]].tolist() == [float(i + 1) for i in range(idx.shape[0]) if idx[i] < 1000]
print("SCATTER-DONE")
"""


BAD_ARGUMENT = _PLANTED_REQUEST + """
import torch

mod = PLANTED.build_and_load()
try:
    mod.scatter(torch.zeros(1000), torch.ones(3), torch.zeros(3, dtype=torch.int32))  # idx must be int64
except TypeError as e:
    print("RAISED", e)
"""


def asan_preload() -> str | None:
    """``LD_PRELOAD`` for a sanitized module: the ASan runtime, then libstdc++. ASan binds its
    ``__cxa_throw`` interceptor at start-up; with libstdc++ loaded only later (by torch), the
    first C++ exception the module throws aborts the process ("CHECK failed ... __cxa_throw")."""
    paths = []
    for lib in ("libasan.so", "libstdc++.so.6"):
        try:
            path = subprocess.run(["c++", f"-print-file-name={lib}"], capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
        if not (os.path.isabs(path) and os.path.exists(path)):
            return None
        paths.append(path)
    return " ".join(paths)


@pytest.fixture(scope="module")
def asan(tmp_path_factory):
    """Runs a script in a subprocess with the sanitized builds of a private cache; ``preload``
    adds the ASan runtime and libstdc++."""
    libs = asan_preload()
    if libs is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime (libasan.so) or libstdc++.so.6")
    cache = tmp_path_factory.mktemp("asan-cache")
    env = dict(os.environ, KERNKIT_EMU_SANITIZE="1", KERNKIT_CACHE_DIR=str(cache),
               KERNKIT_EMU_SEED="0")
    env.pop("LD_PRELOAD", None)

    def run(script: str, *args: str, preload: bool = True) -> subprocess.CompletedProcess:
        e = dict(env)
        if preload:
            e.update(LD_PRELOAD=libs, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1")
        return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True,
                              text=True, env=e, timeout=900)

    built = run(BUILD, preload=False)
    assert built.returncode == 0, built.stdout + built.stderr[-4000:]
    yield run
    # Its sanitized builds (about 50 MB) are made again by any run: a failed session keeps the
    # factory's folders, and this one would be most of what it leaves.
    shutil.rmtree(cache, ignore_errors=True)


def no_sanitizer_report(res: subprocess.CompletedProcess) -> bool:
    return "ERROR: AddressSanitizer" not in res.stderr and "runtime error:" not in res.stderr


def test_ops_with_out_of_range_indices_are_clean_under_asan(asan):
    res = asan(OPS)
    assert res.returncode == 0 and no_sanitizer_report(res), res.stdout + res.stderr[-6000:]
    assert "OPS-UNDER-ASAN-OK" in res.stdout


def test_bad_argument_raises_the_python_exception_under_asan(asan):
    """The module's C++ exception (a TensorMatcher error) reaches Python; the process goes on."""
    res = asan(BAD_ARGUMENT)
    assert res.returncode == 0 and no_sanitizer_report(res), res.stdout + res.stderr[-6000:]
    assert "RAISED" in res.stdout and "idx" in res.stdout, res.stdout


def test_planted_scatter_in_range_is_clean(asan):
    """The control: the planted kernel with indices inside dst runs clean."""
    res = asan(SCATTER, "0", "999", "500")
    assert res.returncode == 0 and no_sanitizer_report(res), res.stdout + res.stderr[-6000:]
    assert "SCATTER-DONE" in res.stdout


@pytest.mark.parametrize("bad", ["1000", "-1"])
def test_planted_scatter_out_of_range_is_reported(asan, bad):
    res = asan(SCATTER, "0", bad, "999")
    assert res.returncode != 0, res.stdout + res.stderr[-6000:]
    assert "SCATTER-DONE" not in res.stdout
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in res.stderr, res.stderr[-6000:]
    assert "WRITE of size 4" in res.stderr, res.stderr[-6000:]
    line = next(i for i, text in enumerate((CSRC / "unchecked_scatter.cuh").read_text().splitlines(), 1)
                if "PLANTED BUG" in text)
    assert "unchecked_scatter_kernel<float>(float*, float const*, long const*, long) " in res.stderr
    assert f"unchecked_scatter.cuh:{line}" in res.stderr, res.stderr[-6000:]
    where = "0 bytes to the right of" if bad == "1000" else "4 bytes to the left of"
    assert f"{where} 4000-byte region" in res.stderr, res.stderr[-6000:]


def test_a_sanitized_build_without_the_runtime_raises_with_the_line_to_run(asan):
    """``KERNKIT_EMU_SANITIZE=1`` alone: the load raises a Python error that gives the exact
    ``LD_PRELOAD`` line (the one the fixture runs with), and the process goes on, where loading
    the module would have killed it ("ASan runtime does not come first")."""
    res = asan("""
import torch
from kernkit import ops
try:
    ops.indexing(torch.randn(8, 576, dtype=torch.bfloat16), torch.tensor([1, 2]))
except RuntimeError as e:
    print("RAISED", e)
print("STILL-RUNNING")
""", preload=False)
    assert res.returncode == 0 and "does not come first" not in res.stderr, res.stdout + res.stderr[-4000:]
    assert "RAISED indexing<" in res.stdout and "STILL-RUNNING" in res.stdout, res.stdout
    assert f'LD_PRELOAD="{asan_preload()}" ASAN_OPTIONS=detect_leaks=0 python' in res.stdout, res.stdout
