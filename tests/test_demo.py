"""`python -m kernkit.demo`: a case for every shipped op, each agreeing with its torch
computation on the CPU emulator with one line of output, and a non-zero exit when an op
disagrees."""

from __future__ import annotations

import pytest
import torch

from kernkit import demo, ops


def shipped_ops() -> set[str]:
    return {op.name for op in ops.registered_ops() if op.qualname.startswith("kernkit::")}


def test_the_demo_has_one_case_for_every_shipped_op():
    assert len(shipped_ops()) == 13
    assert sorted(case.op for case in demo.CASES) == sorted(shipped_ops())


@pytest.mark.slow
def test_every_op_agrees_with_torch_on_the_emulator_in_one_line_each(capsys):
    """The emulator builds of the cases, in parallel as the demo makes them, then each case: one
    line naming the op, what it ran and its largest error, and ok."""
    assert demo.build(demo.case_builds(demo.CASES, "emu"), "for cpu")
    capsys.readouterr()
    assert all(demo.check(case, "cpu") for case in demo.CASES)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(demo.CASES)
    for case, line in zip(demo.CASES, lines, strict=True):
        assert line.split()[0] == case.op and case.what in line and " max error " in line, line
        assert " ulp " in line and f" ok ({case.tolerance})" in line, line


def wrong_compare_key(device: str):
    """compare_key checked against a wrong answer: what a kernel that disagrees with torch gives."""
    a = torch.arange(100, dtype=torch.int32)
    return demo.errors((torch.tensor([ops.compare_key(a, a[:40])]), torch.tensor([41]))), 0


def raising(device: str):
    raise ValueError("planted")


def test_an_op_that_disagrees_with_torch_makes_the_demo_exit_1(monkeypatch, capsys):
    good = next(case for case in demo.CASES if case.op == "compare_key")
    monkeypatch.setattr(demo, "CASES", [good, demo.Case("compare_key", "a wrong answer", torch.int32,
                                                        wrong_compare_key)])
    assert demo.main(["--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "max error 0 ulp     ok (exact)" in out
    assert "max error 1 ulp     MISMATCH (exact)" in out and out.endswith("SOME OPS FAILED\n")

    monkeypatch.setattr(demo, "CASES", [good, demo.Case("compare_key", "a planted error", torch.int32, raising)])
    assert demo.main(["--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "a planted error" in out and "FAILED: ValueError: planted" in out and out.endswith("SOME OPS FAILED\n")
    monkeypatch.setattr(demo, "CASES", [good])
    assert demo.main(["--device", "cpu"]) == 0
    assert capsys.readouterr().out.endswith("ops match torch\n")
