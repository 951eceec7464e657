"""The precompiled headers of the host-compiled units (``kernkit/jit/pch.py``): made after the
builds, detached, never on a build's path; published whole or not at all; a failed or killed
maker leaves nothing a later build could trip on."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest
import torch

from kernkit.jit import maker, pch

#: A "compiler" that writes part of its output, then fails (exit 3) or is killed (SIGKILL).
FAKE = ("import os, sys; out = sys.argv[sys.argv.index('-o') + 1]; open(out, 'w').write('partial');"
        "os.kill(os.getpid(), 9) if sys.argv[1] == 'kill' else sys.exit(3)")


def _wait(predicate, limit: float = 300.0) -> bool:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _folders(cache: Path) -> list[Path]:
    return list((cache / "v2" / "pch").glob("*"))


def test_the_header_is_made_after_the_call_that_asks_for_it(empty_cache):
    """The first request returns None at once, with no .gch made in its time; the detached maker,
    started where a build ends (``maker.start``), then publishes it, and the next request gets
    the header (which the compiler takes)."""
    flags = ["c++", "-std=c++17", "-O2"]
    assert pch.header("#include <string>\n", flags, ["test"]) is None
    (folder,) = _folders(empty_cache)
    assert not (folder / "prelude.h.gch").exists()  # not built inline
    maker.start()
    assert _wait(lambda: (folder / "prelude.h.gch").is_file())
    header = pch.header("#include <string>\n", flags, ["test"])
    assert header == folder / "prelude.h"
    unit = empty_cache / "unit.cc"
    unit.write_text("std::string f() { return \"pch\"; }\n")
    out = subprocess.run([*flags, "-Winvalid-pch", "-H", "-include", str(header), "-c", str(unit), "-o",
                          str(empty_cache / "unit.o")], capture_output=True, text=True)
    assert out.returncode == 0 and "prelude.h.gch" in out.stderr  # -H: the .gch was read


@pytest.fixture
def no_makers(monkeypatch):
    """Makers are queued, never started (as in a new process: nothing asked yet)."""
    monkeypatch.setattr(maker, "_asked", set())
    monkeypatch.setattr(maker, "_queued", [])
    monkeypatch.setattr(maker, "start", lambda: None)
    return maker._queued


@pytest.mark.parametrize("how", ["fail", "kill"])
def test_a_failed_or_killed_maker_publishes_nothing(empty_cache, no_makers, how):
    """A compile that fails or dies mid-output leaves no .gch and no partial file; a failure is
    recorded so that no later build starts a maker again, a killed one is retried."""
    flags = [sys.executable, "-c", FAKE, how]
    assert pch.header("#include <string>\n", flags, []) is None
    (folder,) = _folders(empty_cache)
    args = no_makers.pop()
    (folder / ".prelude.h.gch.99999").write_text("left by a maker that was killed")
    assert maker.make(args[0], args[1], args[2], args[3:]) == 1  # what the detached process runs
    assert not (folder / "prelude.h.gch").exists() and not maker.made(folder, pch.GCH)
    assert not [f for f in folder.iterdir() if f.name.startswith(".prelude.h.gch.")]
    assert (folder / "failed.log").exists() == (how == "fail")
    maker._asked.clear()  # as in a new process
    assert pch.header("#include <string>\n", flags, []) is None
    assert len(no_makers) == (0 if how == "fail" else 1)


def test_a_maker_does_nothing_while_another_holds_the_lock(empty_cache, no_makers):
    """Two makers of one key: the second leaves at once, compiling nothing."""
    flags = [sys.executable, "-c", FAKE, "fail"]
    pch.header("#include <string>\n", flags, [])
    (folder,) = _folders(empty_cache)
    args = no_makers.pop()
    assert args[0] == str(empty_cache / "v2" / ".locks" / f"pch-{folder.name}.lock")
    with filelock.FileLock(args[0]):
        t0 = time.perf_counter()
        assert maker.make(args[0], args[1], args[2], args[3:]) == 0
        assert time.perf_counter() - t0 < 5
    assert not (folder / "failed.log").exists()  # it did not run the compiler


def test_an_emu_build_neither_waits_for_nor_trips_on_the_header(empty_cache, no_makers):
    """While the header is being made (its lock held, no .gch) an emulator build compiles without
    it; a damaged .gch in its place is parsed around: the results stay right."""
    from kernkit.ops.scale import scale_spec

    x = torch.arange(8, dtype=torch.float32)
    lib = scale_spec(torch.float32, "emu").build_and_load()
    (folder,) = _folders(empty_cache)
    out = torch.empty_like(x)
    lib.scale(out, x, 2.0)
    assert torch.equal(out, x * 2)
    (folder / "prelude.h.gch").write_bytes(b"gpch.013" + b"\0" * 64)  # damaged, in the right place
    (folder / "prelude.h.gch.json").write_text('{"sha256": "0"}')
    lib = scale_spec(torch.float16, "emu").build_and_load()
    build = next((empty_cache / "v2").glob("scale/*fp16*/*/build.ninja")).read_text()
    assert str(folder / "prelude.h") in build  # the damaged header was offered to the compiler
    out16 = torch.empty(8, dtype=torch.float16)
    lib.scale(out16, x.half(), 2.0)
    assert torch.equal(out16, x.half() * 2)
