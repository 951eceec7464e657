"""Request records (kernkit/jit/records.py): a warm load that skips rendering, and every change
that must send it back to the full path (edited or shadowing headers, another compiler, a lost
build, a damaged record)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernkit.jit import core, records
from kernkit.jit import load_jit

SRC = """\
#pragma once
#include <cstdint>
#include <answer_dep.h>
namespace kernkit {
inline int64_t answer(int64_t x) { return x + kOffset; }
}
"""


def _dep(directory: Path, offset: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "answer_dep.h").write_text(f"#pragma once\n#include <cstdint>\nconstexpr int64_t kOffset = {offset};\n")


@pytest.fixture
def kernel(tmp_path):
    """A host-only kernel whose header resolves through two include directories: ``first``
    (empty to begin with) and ``second`` (where ``answer_dep.h`` is)."""
    src = tmp_path / "answer.h"
    src.write_text(SRC)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    _dep(second, 1)
    return src, first, second


def _load(src: Path, first: Path, second: Path):
    return load_jit("answer_rec", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")],
                    extra_include_paths=[str(first), str(second)])


def _new_process(monkeypatch) -> list[int]:
    """Forget the loaded modules (as a new process would) and count the full-path renders."""
    core._modules.clear()
    calls: list[int] = []
    real = core.make_spec

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(core, "make_spec", counted)
    return calls


def _record_files(cache: Path) -> list[Path]:
    return sorted((cache / "v1" / ".records").glob("*.json"))


def test_warm_load_uses_the_record_without_rendering(fresh_cache, kernel, monkeypatch):
    src, first, second = kernel
    assert _load(src, first, second).answer(1) == 2
    assert len(_record_files(fresh_cache)) == 1
    renders = _new_process(monkeypatch)
    assert _load(src, first, second).answer(1) == 2
    assert renders == [], "a valid record must load without rendering the unit"


def test_edited_header_goes_back_to_the_full_path(fresh_cache, kernel, monkeypatch):
    src, first, second = kernel
    assert _load(src, first, second).answer(1) == 2
    renders = _new_process(monkeypatch)
    _dep(second, 5)
    st = (second / "answer_dep.h").stat()
    os.utime(second / "answer_dep.h", ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert _load(src, first, second).answer(1) == 6
    assert renders == [1]


def test_shadowing_header_goes_back_to_the_full_path(fresh_cache, kernel, monkeypatch):
    src, first, second = kernel
    assert _load(src, first, second).answer(1) == 2
    renders = _new_process(monkeypatch)
    _dep(first, 10)  # an earlier include directory now has the header too
    assert _load(src, first, second).answer(1) == 11
    assert renders == [1]


def test_shadowing_header_in_a_new_subdirectory(fresh_cache, tmp_path, monkeypatch):
    """An include by a nested name (``<sub/dep.h>``) is found through a directory that does not
    exist yet under the first include directory; creating it is noticed too."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    _dep(second / "sub", 1)
    src = tmp_path / "answer_sub.h"
    src.write_text(SRC.replace("<answer_dep.h>", "<sub/answer_dep.h>"))
    assert _load(src, first, second).answer(1) == 2
    renders = _new_process(monkeypatch)
    _dep(first / "sub", 20)
    assert _load(src, first, second).answer(1) == 21
    assert renders == [1]


def test_other_compiler_goes_back_to_the_full_path(fresh_cache, kernel, monkeypatch):
    src, first, second = kernel
    _load(src, first, second)
    (path,) = _record_files(fresh_cache)
    rec = json.loads(path.read_text())
    assert rec["compilers"], "the record names the compiler whose version made the fingerprint"
    rec["compilers"][0][2] += 1  # as if the binary had been replaced
    path.write_text(json.dumps(rec))
    renders = _new_process(monkeypatch)
    assert _load(src, first, second).answer(1) == 2
    assert renders == [1]
    assert json.loads(path.read_text())["compilers"][0][2] == rec["compilers"][0][2] - 1, "rewritten"


def test_lost_build_is_rebuilt(fresh_cache, kernel, monkeypatch):
    from kernkit.jit import cache as jit_cache

    src, first, second = kernel
    _load(src, first, second)
    assert jit_cache.clear("answer_rec") == 1
    renders = _new_process(monkeypatch)
    assert _load(src, first, second).answer(3) == 4
    assert renders == [1]


@pytest.mark.parametrize("damage", ["garbage", "other_ident", "missing_field"])
def test_damaged_record_is_ignored_and_rewritten(fresh_cache, kernel, monkeypatch, damage):
    src, first, second = kernel
    _load(src, first, second)
    (path,) = _record_files(fresh_cache)
    good = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{not json")
    elif damage == "other_ident":
        path.write_text(json.dumps({**good, "ident": "0" * 64, "key": "f" * 64}))
    else:
        path.write_text(json.dumps({k: v for k, v in good.items() if k != "dirs"}))
    renders = _new_process(monkeypatch)
    assert _load(src, first, second).answer(1) == 2
    assert renders == [1]
    assert json.loads(path.read_text()) == good


def test_unwritable_record_directory_still_loads(fresh_cache, kernel, monkeypatch):
    src, first, second = kernel
    _load(src, first, second)
    for p in _record_files(fresh_cache):
        p.unlink()
    rec_dir = fresh_cache / "v1" / ".records"
    rec_dir.chmod(0o500)
    try:
        renders = _new_process(monkeypatch)
        assert _load(src, first, second).answer(1) == 2
        if os.access(rec_dir, os.W_OK):  # running as root: the mode does not stop writes
            return
        assert renders == [1] and _record_files(fresh_cache) == []
    finally:
        rec_dir.chmod(0o700)


def test_identity_follows_request_and_environment(monkeypatch):
    base = records.identity(("k", "1"), (("backend", "cpu"),))
    assert base == records.identity(("k", "1"), (("backend", "cpu"),))
    assert base != records.identity(("k", "2"), (("backend", "cpu"),))
    monkeypatch.setenv("KERNKIT_JIT", "off")
    assert base != records.identity(("k", "1"), (("backend", "cpu"),))
    monkeypatch.delenv("KERNKIT_JIT")
    monkeypatch.setenv("CXX", "some-other-c++")
    assert base != records.identity(("k", "1"), (("backend", "cpu"),))
    monkeypatch.undo()  # the environment as it was
    assert base == records.identity(("k", "1"), (("backend", "cpu"),))
    monkeypatch.setattr(records, "_CODE", records._CODE[1:])  # as if the JIT layer's code differed
    assert base != records.identity(("k", "1"), (("backend", "cpu"),))
