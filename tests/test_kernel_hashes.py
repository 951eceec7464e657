"""GPU agreement: the CPU emulator reproduces ``tests/data/kernel_hashes.json``, the hashes of
every shipped kernel's outputs on the fixed cases of ``kernkit/testing/hashes.py`` (written on the
GPU with ``python -m kernkit.testing.hashes --device cuda --write tests/data/kernel_hashes.json``).
Bound cases (the activations in fp16/bf16, built on the hardware's approximate exp2 and
reciprocal) are checked within their stated bound on both sides instead of by their bytes."""

from __future__ import annotations

import copy
import json
import os
import pkgutil
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from kernkit import ops
from kernkit.testing import hashes

REPO = Path(__file__).resolve().parent.parent
HASH_FILE = REPO / "tests" / "data" / "kernel_hashes.json"

@pytest.fixture(scope="module")
def kh():
    return hashes


@pytest.fixture(scope="module")
def expected():
    return json.loads(HASH_FILE.read_text())


@pytest.fixture(scope="module")
def computed(kh):
    return kh.compute("cpu")


def test_hash_file_is_well_formed(expected):
    assert expected["format"] == 2
    assert expected["source"] in ("gpu", "cpu-emulator")
    for field in ("device", "torch", "date"):
        assert expected[field], field
    assert expected["cases"]
    for name, outs in expected["cases"].items():
        assert outs, name
        for key, out in outs.items():
            assert isinstance(out["shape"], list) and out["dtype"], (name, key)
            if out["exact"] is True:
                assert re.fullmatch(r"[0-9a-f]{64}", out["sha256"]), (name, key)
            else:
                assert out["exact"] is False and "sha256" not in out, (name, key)
                assert 0 < out["bound_ulps"] < 1, (name, key)
                assert 0 <= out["max_ulps"] <= out["bound_ulps"], f"{name}: the writing device exceeded the bound"


def test_only_approximate_cases_have_bound_outputs(kh, expected, computed):
    """A case's outputs are bound exactly where the case is approximate (the activations'
    fp16/bf16 cases, built on the hardware's approximate exp2 and reciprocal), in the file and as
    computed: a bound output elsewhere would let an op drift from the GPU's bits unnoticed."""
    approximate = {c.name for c in kh.cases() if c.approximate}
    for cases in (expected["cases"], computed):
        for name, outs in cases.items():
            for key, out in outs.items():
                assert out["exact"] is not (name in approximate), (name, key, out)
    assert any(not o["exact"] for outs in computed.values() for o in outs.values()), "no bound case ran"


def test_every_shipped_kernel_has_cases(kh):
    """Each kernel file with a ``__global__`` kernel has cases (``hash_cases()`` in its op's test
    material), and each case names such a file."""
    kernels_dir = REPO / "kernkit" / "kernels"
    with_kernels = {p.relative_to(kernels_dir).as_posix() for p in kernels_dir.rglob("*.cuh")
                    if "__global__" in p.read_text()}
    covered = {c.kernel for c in kh.cases()}
    assert covered == with_kernels, (f"without cases: {sorted(with_kernels - covered)}; "
                                     f"cases of no kernel file: {sorted(covered - with_kernels)}")


def test_emulator_reproduces_the_hash_file(kh, expected, computed):
    problems = kh.compare(expected, computed)
    assert not problems, f"{len(problems)} cases differ from {HASH_FILE.name}:\n" + "\n".join(problems)
    if expected["source"] != "gpu":
        warnings.warn(f"{HASH_FILE.name} was written by the CPU emulator, not on a GPU: regenerate it with "
                      "`python -m kernkit.testing.hashes --device cuda --write tests/data/kernel_hashes.json`",
                      UserWarning, stacklevel=1)


def test_a_differing_hash_is_reported_with_its_case(kh, expected, computed):
    store = next(n for n in expected["cases"] if n.startswith("store_cache/"))
    scale = next(n for n in expected["cases"] if n.startswith("scale/"))
    changed = copy.deepcopy(expected)
    out = changed["cases"][store]["k_cache"]
    out["sha256"] = ("0" if out["sha256"][0] != "0" else "1") + out["sha256"][1:]
    del changed["cases"][scale]
    problems = kh.compare(changed, computed)
    assert len(problems) == 2, problems
    assert any(p.startswith(f"{store}: output 'k_cache' differs (sha256)") for p in problems), problems
    assert any(p.startswith(f"{scale}: computed but not in the file") for p in problems), problems


def test_a_changed_bound_or_kind_is_reported(kh, expected, computed):
    """A bound case whose bound differs from the file's (the docstring's bound changed since the
    GPU checked it), or that the file holds as exact, is a difference; its max_ulps is not."""
    names = [n for n, outs in computed.items() if any(not o["exact"] for o in outs.values())][:3]
    changed = copy.deepcopy(computed)
    changed[names[0]]["out"]["bound_ulps"] = 0.75
    changed[names[1]]["out"] = {**changed[names[1]]["out"], "exact": True, "sha256": "0" * 64}
    changed[names[2]]["out"]["max_ulps"] = 0.0
    problems = kh.compare({"cases": changed}, computed)
    assert len(problems) == 2, problems
    assert any(p.startswith(f"{names[0]}: output 'out' differs (bound_ulps)") for p in problems), problems
    assert any(p.startswith(f"{names[1]}: output 'out' differs (exact") for p in problems), problems


def _case(kh, name):
    return next(c for c in kh.cases() if c.name == name)


def test_a_wrong_result_is_never_hashed(kh, monkeypatch):
    """The tool checks each output against torch before hashing: a store_cache that wraps
    out-of-range indices (Python-style) and a scale that is one ulp off must fail loudly."""
    real_store, real_scale = ops.store_cache, ops.scale

    def wrapping_store(kc, vc, idx, k, v):
        real_store(kc, vc, idx % kc.shape[0], k, v)

    def off_by_one_ulp(x, factor, out=None):
        res = real_scale(x, factor, out=out)
        bits = res.view(torch.int16)
        bits[0] += 1
        return res

    monkeypatch.setattr(ops, "store_cache", wrapping_store)
    monkeypatch.setattr(ops, "scale", off_by_one_ulp)
    case = _case(kh, "store_cache/bf16-1x576-i64-n7")
    with pytest.raises(kh.ReferenceMismatch, match=re.escape(case.name) + ": 'k_cache' differs"):
        kh.run_case(case, torch.device("cpu"))
    case = _case(kh, "scale/fp16-n7-f1.7")
    with pytest.raises(kh.ReferenceMismatch, match=re.escape(case.name) + ": 'out' differs"):
        kh.run_case(case, torch.device("cpu"))


def test_the_command_line_checks_exact_and_bound_cases():
    """``python -m kernkit.testing.hashes --check`` (the command the GPU runs) on an exact and a
    bound case: the runner is the module the test modules' cases were made with."""
    names = ("scale/fp16-n7-f1.7", "silu_and_mul/silu-bf16-d8-r1")
    for name in names:
        run = subprocess.run([sys.executable, "-m", "kernkit.testing.hashes", "--device", "cpu", "--check",
                              str(HASH_FILE), "--only", name], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.rstrip().endswith("all match"), run.stdout


MY_OP = """
import torch

from kernkit.testing.hashes import Case


def hash_cases():
    def run(device):
        x = torch.arange(8.0)
        return {"out": ((x.to(device) * 2).cpu(), x * 2)}

    return [Case("my_op/double-8", "my/my_op.cuh", run)]
"""


def test_cases_of_another_package_are_found_by_module_name(kh, tmp_path, monkeypatch, capsys):
    """``--cases`` takes a project's own test material by module or package name; a package's
    modules are found with pkgutil, and one without ``hash_cases`` is passed over."""
    pkg = tmp_path / "my_project" / "testing"
    pkg.mkdir(parents=True)
    (tmp_path / "my_project" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "my_op.py").write_text(MY_OP)
    (pkg / "helpers.py").write_text("SIZE = 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [m.__name__ for m in kh.case_modules("my_project.testing")] == ["my_project.testing.my_op"]
    assert kh.main(["--cases", "my_project.testing", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["my_op/double-8"]
    out = tmp_path / "hashes.json"
    assert kh.main(["--device", "cpu", "--cases", "my_project.testing.my_op", "--write", str(out)]) == 0
    assert list(json.loads(out.read_text())["cases"]) == ["my_op/double-8"]
    assert kh.main(["--device", "cpu", "--cases", "my_project.testing.my_op", "--check", str(out)]) == 0
    with pytest.raises(ImportError, match="my_project.testing.helpers defines no hash_cases"):
        kh.case_modules("my_project.testing.helpers")
    with pytest.raises(ModuleNotFoundError, match="no_such_project"):
        kh.case_modules("no_such_project")


def test_kernkit_s_own_cases_are_every_module_of_its_test_material(kh):
    import kernkit.testing.ops as material

    names = {m.name for m in pkgutil.iter_modules(material.__path__)}
    found = {m.__name__.rsplit(".", 1)[1] for m in kh.case_modules()}
    assert found == {n for n in names if n != "compare_key"}, found  # compare_key has no GPU kernel


def test_an_only_that_selects_no_case_is_an_error(kh, capsys):
    """``--check F --only <typo>`` runs nothing: that is an error naming --only, not "all match"."""
    assert kh.main(["--device", "cpu", "--check", str(HASH_FILE), "--only", "no_such_case"]) == 2
    out, err = capsys.readouterr()
    assert "all match" not in out, out
    assert err.startswith("error: --only no_such_case: no case of kernkit.testing.ops") and err.count("\n") == 1, err


@pytest.mark.parametrize(("text", "why"), [(None, "cannot read it (No such file or directory)"),
                                           ("{\"cases\": ", "not a JSON file"), ("\xff", "not a JSON file"),
                                           ("[1, 2]", "not a kernel-hash file"),
                                           ('{"cases": {"scale/x": 1}}', "not a kernel-hash file")])
def test_a_check_file_that_is_no_hash_file_is_named(kh, tmp_path, capsys, text, why):
    """A missing, non-JSON or non-hash ``--check`` file is one line naming it (status 2), before any
    case runs (``--only`` matches a case, which would take a build to run)."""
    path = tmp_path / "hashes.json"
    if text is not None:
        path.write_bytes(text.encode("latin-1"))
    assert kh.main(["--device", "cpu", "--check", str(path), "--only", "scale/"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: --check {path}: {why}") and err.count("\n") == 1, (out, err)


@pytest.mark.parametrize(("name", "why"), [("no_such_project", "No module named 'no_such_project'"),
                                           ("tests/", "'tests/' is not a module name"),
                                           (".ops", "'.ops' is not a module name"),
                                           ("", "'' is not a module name"),
                                           ("kernkit.testing.oracle", "defines no hash_cases()")])
def test_a_cases_name_that_is_no_test_material_is_named(kh, capsys, name, why):
    """``--cases`` takes a module name; a path, a typo or a module without cases is one line
    naming it, status 2."""
    assert kh.main(["--list", "--cases", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --cases {name}: ") and why in err and err.count("\n") == 1, err


def _my_op(tmp_path, monkeypatch) -> str:
    """A module of test material whose one case runs plain torch (no build)."""
    (tmp_path / "my_op_material.py").write_text(MY_OP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_op_material"


def test_an_unwritable_write_file_is_named(kh, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = blocker / "hashes.json"
    assert kh.main(["--device", "cpu", "--cases", _my_op(tmp_path, monkeypatch), "--write", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --write {target}: cannot write it") and err.count("\n") == 1, err


def test_cases_that_give_no_case_are_an_error(kh, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty_material.py").write_text("def hash_cases():\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kh.main(["--device", "cpu", "--cases", "empty_material", "--write", str(tmp_path / "h.json")]) == 2
    assert capsys.readouterr().err == "error: --cases empty_material: hash_cases() gives no case\n"
    assert not (tmp_path / "h.json").exists()


def test_a_reader_that_stops_early_ends_the_list_quietly():
    """``--list | head``: the pipe is closed before the tool writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "kernkit.testing.hashes", "--list"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 0 and "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
