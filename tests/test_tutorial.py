"""docs/tutorial-add-a-kernel.md stays true: its code blocks are the repository's files, its
commands parse, its snippets run, and its "own kernel outside kernkit" section works as written
(on CPU tensors, through the CPU emulator)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from kernkit.cli import cli
from kernkit.ops import registered_ops

REPO = Path(__file__).resolve().parent.parent
TUTORIAL = REPO / "docs" / "tutorial-add-a-kernel.md"

# A marker comment, then a fenced block: `<!-- file: path -->` (the whole file),
# `<!-- excerpt: path -->` (a contiguous part of it), `<!-- example: name -->` (a file the reader
# writes in their own project).
_MARKED = re.compile(r"<!-- (file|excerpt|example): (\S+) -->\n```[\w-]*\n(.*?)\n```", re.S)
_FENCE = re.compile(r"(<!--[^\n]*-->\n)?```([\w-]*)\n(.*?)\n```", re.S)


def marked_blocks() -> list[tuple[str, str, str]]:
    return [(m.group(1), m.group(2), m.group(3)) for m in _MARKED.finditer(TUTORIAL.read_text())]


def block(kind: str, name: str) -> str:
    found = [text for k, n, text in marked_blocks() if k == kind and n == name]
    assert len(found) == 1, f"the tutorial should have one {kind} block for {name}"
    return found[0]


def test_blocks_are_the_repository_files():
    blocks = marked_blocks()
    files = {name for kind, name, _ in blocks if kind == "file"}
    assert {"kernkit/kernels/elementwise/scale.cuh", "kernkit/ops/scale.py"} <= files
    for kind, name, text in blocks:
        if kind == "example":
            continue
        content = (REPO / name).read_text()
        if kind == "file":
            assert text + "\n" == content, f"the tutorial's copy of {name} differs from the file"
        else:
            assert text in content, f"the tutorial's excerpt of {name} is not in the file:\n{text}"


def test_kernkit_commands_parse():
    commands = []
    for m in _FENCE.finditer(TUTORIAL.read_text()):
        if m.group(2) != "bash":
            continue
        for line in m.group(3).splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("python -m kernkit.jit"):
                commands.append(shlex.split(line)[3:])
    assert len(commands) >= 4
    parser = cli.build_parser()
    for argv in commands:
        parser.parse_args(argv)  # exits on an unknown subcommand or flag


def test_the_snippets_run():
    snippets = [m.group(3) for m in _FENCE.finditer(TUTORIAL.read_text()) if m.group(2) == "python" and not m.group(1)]
    assert snippets
    for code in snippets:
        exec(compile(code, str(TUTORIAL), "exec"), {})


def test_own_kernel_outside_the_package(tmp_path, monkeypatch, capsys):
    """The last section as a reader follows it: the Step 1 kernel copied into a project
    directory, the example module next to it, an absolute path in the spec, the op registered
    under its own namespace and found by warmup."""
    project = tmp_path / "my_project"
    project.mkdir()
    (project / "scale.cuh").write_text(block("file", "kernkit/kernels/elementwise/scale.cuh") + "\n")
    (project / "my_ops.py").write_text(block("example", "my_ops.py") + "\n")
    spec = importlib.util.spec_from_file_location("my_ops", project / "my_ops.py")
    my_ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(my_ops)
    monkeypatch.setitem(sys.modules, "my_ops", my_ops)  # what `from my_ops import ...` finds

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(3, 77).to(dtype)
        y = my_ops.my_scale(x, -1.25)
        assert y.shape == x.shape
        assert torch.equal(y, (x.float() * -1.25).to(dtype)), dtype
    with pytest.raises(TypeError, match="unsupported dtype"):
        my_ops.my_scale(torch.ones(3, dtype=torch.int32), 2.0)
    # A transposed input is refused under its own name, not under the name of the out the op
    # allocated for it.
    with pytest.raises(ValueError, match=r"^'src': expected a contiguous tensor"):
        my_ops.my_scale(torch.randn(77, 3).t(), 2.0)

    x = torch.randn(5)
    assert torch.equal(torch.ops.my_project.my_scale(x, 2.0), x * 2)
    (op,) = [op for op in registered_ops() if op.qualname == "my_project::my_scale"]
    (spec,) = op.specializations(dtypes=[torch.float32], backend="emu")
    assert spec.title == "my_scale<fp32_t, false>"

    # The build includes the project's file by absolute path, under its own cache name; the key
    # names it relative to the module's folder (its kernel root), so a copy of the project finds
    # the same builds.
    assert spec.key_dir.parent.name == "my_scale"
    assert spec.kernel_root == str(project.resolve()) and spec.key_name(spec.cuda_files[0]) == "<root>/scale.cuh"
    units = list(spec.key_dir.glob("*/kernel_emu.cc"))
    assert units and all(str(project / "scale.cuh") in u.read_text() for u in units)

    # The section's warmup, for CPU tensors (the module is imported already), under the bare name.
    assert cli.main(["warmup", "my_scale", "--dtype", "bf16", "--backend", "emu", "-q"]) == 0
    assert "1 specializations: " in capsys.readouterr().out

    # The section's tests, run by pytest as a reader runs them (exit code 0: collected, and passed).
    (project / "test_my_ops.py").write_text(block("example", "test_my_ops.py") + "\n")
    assert pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(project),
                        str(project / "test_my_ops.py")]) == 0
    assert "\n20 passed" in capsys.readouterr().out
