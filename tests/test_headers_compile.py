"""Compile checks for the header library under ``kernkit/include/kernkit/``.

``tests/csrc/headers_all.cu`` includes every header and instantiates each template for every type
it supports. It is compiled with nvcc for sm_90 and sm_90a, and as plain C++ the way the CPU
emulation backend compiles kernels (``-DKERNKIT_EMU=1`` with the emulator's runtime header
force-included; while that header does not exist, a declarations-only stand-in,
``tests/csrc/headers_host_stub.h``, takes its place). Misuse that a ``static_assert`` must reject
is compiled too, and must fail. The slow nvcc builds run concurrently.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tvm_ffi.libinfo

REPO = Path(__file__).resolve().parent.parent
INCLUDE = REPO / "kernkit" / "include"
HEADER_DIR = INCLUDE / "kernkit"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "headers_all.cu"
STUB = CSRC / "headers_host_stub.h"
EMU_INCLUDE = REPO / "kernkit" / "emu" / "include"
EMU_RUNTIME = EMU_INCLUDE / "kernkit" / "emu" / "runtime.h"

#: The headers this library consists of (utils.h, utils.cuh and tensor.h are checked elsewhere).
HEADERS = ["type.cuh", "vec.cuh", "tile.cuh", "math.cuh", "warp.cuh", "cta.cuh", "atomic.cuh", "runtime.cuh", "ffi.h",
           "rows.cuh"]

#: KERNKIT_HEADERS_EXPECT_FAIL cases in headers_all.cu and the message each must produce.
MISUSE = {
    1: "N must be a power of two",
    2: "at most 32 bytes",
    3: "kNumThreads must be a power of two",
    4: "SUM is not defined for this type",
    5: "DTypeTrait<double>",
    6: "element counts differ",
    7: "sqrt",
}


def _cuda_home() -> Path:
    return Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")


def _nvcc() -> str | None:
    candidate = _cuda_home() / "bin" / "nvcc"
    return str(candidate) if candidate.is_file() else shutil.which("nvcc")


def _cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _includes() -> list[str]:
    dirs = [str(INCLUDE), tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
    return [f"-I{d}" for d in dict.fromkeys(dirs)]


def _emu_flags() -> list[str]:
    """How the CPU emulation backend compiles a kernel unit, with the stand-in runtime header
    while the real one is absent."""
    runtime = EMU_RUNTIME if EMU_RUNTIME.is_file() else STUB
    return [
        "-x", "c++", "-std=c++17", "-ffp-contract=off", "-DKERNKIT_EMU=1", "-include", str(runtime),
        f"-I{EMU_INCLUDE}", f"-I{_cuda_home() / 'include'}", *_includes(),
    ]


def _jobs(out: Path) -> dict[str, list[str]]:
    """Every compiler run of this module, keyed by name; the slow nvcc builds first."""
    jobs: dict[str, list[str]] = {}
    nvcc = _nvcc()
    if nvcc:
        base = [nvcc, "-std=c++17", "-c", str(SOURCE), *_includes()]
        jobs["sm_90"] = [*base, "-arch=sm_90", "-o", str(out / "sm90.o")]
        jobs["sm_90a"] = [*base, "-gencode", "arch=compute_90a,code=sm_90a", "-o", str(out / "sm90a.o")]
    cxx = _cxx()
    if cxx:
        emu = [cxx, *_emu_flags()]
        jobs["emu"] = [*emu, "-Wall", "-Wextra", "-O0", "-c", str(SOURCE), "-o", str(out / "emu.o")]
        for case in MISUSE:
            jobs[f"misuse{case}"] = [*emu, f"-DKERNKIT_HEADERS_EXPECT_FAIL={case}", "-fsyntax-only", str(SOURCE)]
        for header in HEADERS:
            unit = out / f"{header.replace('.', '_')}.cc"
            unit.write_text(f"#include <kernkit/{header}>\n")
            # Host headers need neither CUDA nor the emulator.
            flags = ["-x", "c++", "-std=c++17", *_includes()] if header.endswith(".h") else _emu_flags()
            jobs[f"alone:{header}"] = [cxx, *flags, "-Wall", "-fsyntax-only", str(unit)]
    return jobs


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, tuple[int, str, list[str]]]:
    """Run every compile of this module concurrently, one per CPU, and collect the results."""
    jobs = _jobs(tmp_path_factory.mktemp("headers"))

    def run(cmd: list[str]) -> tuple[int, str, list[str]]:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return proc.returncode, proc.stdout, cmd

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(run, cmd) for name, cmd in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def _check(builds, name: str, missing: str) -> str:
    if name not in builds:
        pytest.skip(missing)
    rc, log, cmd = builds[name]
    assert rc == 0, f"{' '.join(cmd)}\n{log}"
    return log


def test_nvcc_sm90(builds):
    _check(builds, "sm_90", "nvcc not found (set CUDA_HOME)")


def test_nvcc_sm90a(builds):
    _check(builds, "sm_90a", "nvcc not found (set CUDA_HOME)")


def test_plain_cxx_emu(builds):
    log = _check(builds, "emu", "no host C++ compiler")
    own = [line for line in log.splitlines() if "warning" in line and "kernkit/include/kernkit/" in line
           and not any(h in line.split(":")[0] for h in ("utils.h", "utils.cuh", "tensor.h"))]
    assert not own, "warnings from the header library:\n" + "\n".join(own)


@pytest.mark.parametrize("case", sorted(MISUSE))
def test_misuse_is_rejected(builds, case):
    if f"misuse{case}" not in builds:
        pytest.skip("no host C++ compiler")
    rc, log, _ = builds[f"misuse{case}"]
    assert rc != 0, f"case {case} compiled but must not"
    assert MISUSE[case] in log, log[-4000:]


@pytest.mark.parametrize("header", HEADERS)
def test_header_is_self_contained(builds, header):
    """Each header compiles on its own, first in its unit, as plain C++ (emulator flags)."""
    _check(builds, f"alone:{header}", "no host C++ compiler")


@pytest.mark.parametrize("header", HEADERS)
def test_header_style(header):
    """ASCII only; a file comment; every namespace-scope declaration documented with ///."""
    path = HEADER_DIR / header
    data = path.read_bytes()
    bad = [i + 1 for i, line in enumerate(data.split(b"\n")) if any(b > 0x7F for b in line)]
    assert not bad, f"non-ASCII bytes on lines {bad}"
    text = data.decode()
    assert text.startswith(f"/// \\file {header}\n/// \\brief "), "missing \\file / \\brief header comment"
    lines = text.splitlines()
    # Declarations at namespace or class scope (indent 0 or 2): each must follow a /// block,
    # possibly with its template<> line in between.
    decl = re.compile(r"^( {0,2})(template <|struct |class |inline |KERNKIT_DEVICE |enum |using \w+ =)")
    undocumented = []
    for i, line in enumerate(lines):
        if not decl.match(line):
            continue
        j = i - 1
        while j >= 0 and (lines[j].lstrip().startswith("template <") or lines[j].startswith("#")):
            j -= 1
        prev = lines[j].strip() if j >= 0 else ""
        if lines[i - 1].lstrip().startswith("template <") and not line.lstrip().startswith("template <"):
            pass  # the template line was checked
        elif not prev.startswith("///") and not prev.startswith("//") and "private" not in prev:
            undocumented.append(f"{i + 1}: {line.strip()}")
    assert not undocumented, "undocumented declarations:\n" + "\n".join(undocumented)
