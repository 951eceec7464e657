"""The precompiled headers of the host-compiled units (``kernkit/jit/pch.py``): made after the
builds, detached, never on a build's path; published whole or not at all; a failed or killed
maker leaves nothing a later build could trip on."""

from __future__ import annotations

import os
import shutil
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
    assert _wait(lambda: maker.made(folder, pch.GCH))  # its record: published after the file
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
    monkeypatch.setattr(maker, "_intact", {}, raising=False)
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
    it; a damaged .gch in its place is not offered, and is asked to be made again: the results
    stay right."""
    from kernkit.ops.scale import scale_spec

    x = torch.arange(8, dtype=torch.float32)
    lib = scale_spec(torch.float32, "emu").build_and_load()
    (folder,) = _folders(empty_cache)
    out = torch.empty_like(x)
    lib.scale(out, x, 2.0)
    assert torch.equal(out, x * 2)
    (folder / "prelude.h.gch").write_bytes(b"gpch.013" + b"\0" * 64)  # damaged, in the right place
    (folder / "prelude.h.gch.json").write_text('{"sha256": "0"}')
    maker._asked.clear()  # as in a new process
    no_makers.clear()
    lib = scale_spec(torch.float16, "emu").build_and_load()
    build = next((empty_cache / "v2").glob("scale/*fp16*/*/build.ninja")).read_text()
    assert str(folder / "prelude.h") not in build  # not offered: it does not match its record
    assert [args[1] for args in no_makers] == [str(folder)]  # asked to be made again
    out16 = torch.empty(8, dtype=torch.float16)
    lib.scale(out16, x.half(), 2.0)
    assert torch.equal(out16, x.half() * 2)


def _make_queued(queued: list[list[str]]) -> int:
    """Run the last queued maker here, as its detached process would."""
    args = queued.pop()
    return maker.make(args[0], args[1], args[2], args[3:])


def _compile_with(header: Path, flags: list[str], tmp: Path) -> subprocess.CompletedProcess:
    unit = tmp / "unit.cc"
    unit.write_text("std::string f() { return \"pch\"; }\n")
    return subprocess.run([*flags, "-H", "-include", str(header), "-c", str(unit), "-o", str(tmp / "unit.o")],
                          capture_output=True, text=True)


@pytest.mark.parametrize("damage", ["cut in half", "overwritten in place", "copied whole"])
def test_a_damaged_header_is_not_offered_and_is_made_again(empty_cache, no_makers, damage):
    """A published .gch that no longer matches its record (cut in half, as a crash before the
    data reached the disk leaves it, or overwritten with its size kept) is not offered to the
    compiler, which could not read it and would fail every build; a maker is asked for and
    makes it again. One copied whole (another inode: a copied cache) is hashed and offered."""
    flags, text = ["c++", "-std=c++17", "-O2"], "#include <string>\n"
    assert pch.header(text, flags, ["damage"]) is None
    assert _make_queued(no_makers) == 0
    header = pch.header(text, flags, ["damage"])
    gch = header.parent / pch.GCH
    assert header is not None and _compile_with(header, flags, empty_cache).returncode == 0
    size = gch.stat().st_size
    if damage == "cut in half":
        os.truncate(gch, size // 2)
    elif damage == "overwritten in place":
        with open(gch, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\xff" * 4096)
    else:
        shutil.copyfile(gch, gch.with_name("copy"))
        os.replace(gch.with_name("copy"), gch)
    assert maker.made(header.parent, pch.GCH)  # the record is still there
    maker._asked.clear()  # as in a new process
    if damage == "copied whole":
        assert pch.header(text, flags, ["damage"]) == header and not no_makers
        return
    if damage == "cut in half":  # what using it would do to every build (one overwritten may pass, or crash)
        failed = _compile_with(header, flags, empty_cache)
        assert failed.returncode != 0 and "cannot read PCH file" in failed.stderr
    assert pch.header(text, flags, ["damage"]) is None
    assert _make_queued(no_makers) == 0  # made again
    assert maker.verified(header.parent, pch.GCH) and maker.intact(header.parent, pch.GCH)
    assert pch.header(text, flags, ["damage"]) == header
    used = _compile_with(header, flags, empty_cache)
    assert used.returncode == 0 and "prelude.h.gch" in used.stderr  # -H: the new .gch was read


def test_publishing_flushes_the_product_and_its_record_before_naming_them(tmp_path, monkeypatch):
    """The product and its record each reach the disk (fsync) before their rename publishes them,
    so a crash never leaves a record naming a product that is not whole."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def spy_replace(src, dst):
        events.append(("replace", str(src)))
        return replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    folder = tmp_path / "helpers" / "0123456789abcdef"
    folder.mkdir(parents=True)
    tmp = maker.scratch(folder, "helpers.o")
    tmp.write_bytes(b"object" * 1000)
    maker.publish(folder, "helpers.o", tmp)
    renamed = [path for kind, path in events if kind == "replace"]
    assert len(renamed) == 2 and renamed[0] == str(tmp)
    for path in renamed:
        assert ("fsync", path) in events[:events.index(("replace", path))], f"{path} renamed before it was flushed"
    assert maker.intact(folder, "helpers.o") and maker.verified(folder, "helpers.o")


#: Shell lines that GCC's ``-wrapper`` runs cc1plus through, each a failure that is not the
#: input's: what g++ then prints and returns (1 or 4) is what such a failure gives.
DIES = {
    "killed": "kill -KILL $$",  # as the OOM killer does
    "past its file size limit": 'ulimit -f 64; exec "$0" "$@"',  # SIGXFSZ
    "on a full disk": 'for a; do shift; [ "$o" = -o ] && a=/dev/full; o=$a; set -- "$@" "$a"; done; exec "$0" "$@"',
}


@pytest.mark.parametrize("how", [*DIES, "on its input"])
def test_only_a_compile_that_fails_on_its_input_turns_the_header_off(empty_cache, no_makers, how):
    """cc1plus killed, stopped by its file size limit or writing to a full disk (g++ still exits 1
    or 4): nothing is left, and a later process asks for the header again. A header that does not
    compile leaves ``failed.log`` (its whole output), and no process asks again."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++: its -wrapper runs cc1plus as each failure leaves it")
    text = "#include <string>\n" + ("#error not a header\n" if how == "on its input" else "")
    flags = [gxx, "-std=c++17", *(["-wrapper", f"/bin/sh,-c,{DIES[how]}"] if how in DIES else [])]
    assert pch.header(text, flags, []) is None
    (folder,) = _folders(empty_cache)
    assert _make_queued(no_makers) == 1
    assert not maker.made(folder, pch.GCH)
    assert not [f for f in folder.iterdir() if f.name.startswith((".prelude.h.gch.", ".failed.log."))]
    if how == "on its input":
        assert b"#error not a header" in (folder / "failed.log").read_bytes()
    else:
        assert not (folder / "failed.log").exists()
    maker._asked.clear()  # as in a new process
    assert pch.header(text, flags, []) is None
    assert len(no_makers) == (0 if how == "on its input" else 1)


@pytest.mark.parametrize(("output", "for_good"), [
    (b"clang++: error: unable to execute command: Killed\n", False),
    (b"clang++: error: clang frontend command failed due to signal (use -v to see invocation)\n", False),
    (b"cc1plus: out of memory allocating 65536 bytes after a total of 2097152 bytes\n", False),
    (b"virtual memory exhausted: Cannot allocate memory\n", False),
    (b"prelude.h:1: fatal error: cannot write PCH file: Disk quota exceeded\n", False),
    (b"prelude.h:1:10: fatal error: nope.h: No such file or directory\n", True),
    (b"", True),
])
def test_what_other_compilers_print_for_a_failure_that_is_not_the_inputs(output, for_good):
    """Clang's words for a killed frontend, GCC's for running out of memory or quota: tried again
    later; a missing header, or an error without a word, is remembered."""
    assert maker.remembered(1, output) is for_good
    assert maker.remembered(-9, output) is False  # the compiler itself killed
