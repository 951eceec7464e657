"""Reliability of the build cache under stress and damage: many processes and threads racing on
one cold key, builds killed part-way, damaged libraries and records, read-only and full cache
directories, compiler output and paths that are not UTF-8, a lock held by a stopped build, a file
lock that does not lock (NFS without lock support), and two kernkit versions sharing one cache.
docs/reliability.md summarizes what these tests tried and what held.

Every build is a tiny host-only C++ module. A library this process has loaded is never damaged
afterwards (a mapped file that shrinks kills the process with SIGBUS): damage happens before the
load, or the load runs in a child process."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import filelock
import pytest

from kernkit.jit import CacheDirError, CompileError, JitDisabledError, JitSpec, load_jit
from kernkit.jit import cache as jit_cache

REPO = Path(__file__).resolve().parent.parent

SOURCE = """\
#pragma once
#include <cstdint>
#include <kernkit/utils.h>
namespace kernkit {{
inline int64_t answer(int64_t x) {{ return x + {offset}; }}
}}
"""


def _source(folder: Path, offset: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "answer.h"
    src.write_text(SOURCE.format(offset=offset))
    return src


def _spec(src: Path) -> JitSpec:
    return JitSpec.make("relia", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")])


def _load(src: Path):
    return load_jit("relia", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")])


def _cxx(tmp: Path, name: str = "counting-c++", before: str = "", after: str = "") -> Path:
    """A compiler wrapper that appends a line to ``compiles.txt`` next to the cache directory
    for each ``-c`` invocation; ``before`` runs before each compile, ``after`` after each compile
    and link (``$stage`` is ``compile`` or ``link``)."""
    wrapper = tmp / name
    wrapper.write_text("\n".join([
        "#!/bin/bash",
        'count="$(dirname "$KERNKIT_CACHE_DIR")/compiles.txt"',
        'case " $* " in *" -c "*) stage=compile; echo compile >> "$count";; *" -shared "*) stage=link;;'
        ' *) exec c++ "$@";; esac',
        f"if [ $stage = compile ]; then {before}\n:; fi",
        'c++ "$@" || exit $?',
        after,
        "",
    ]))
    wrapper.chmod(0o755)
    return wrapper


def _compiles(cache: Path) -> int:
    count = cache.parent / "compiles.txt"
    return len(count.read_text().splitlines()) if count.exists() else 0


def _published(cache: Path) -> list[Path]:
    return sorted((cache / "v2" / "relia").glob("*/*/lib.so"))


def _staging(cache: Path) -> list[Path]:
    staging = cache / "v2" / ".staging"
    return sorted(staging.iterdir()) if staging.is_dir() else []


def _locks_free(cache: Path) -> bool:
    """Every build lock of the cache can be taken at once (nobody holds one)."""
    for path in (cache / "v2" / ".locks").glob("*.lock"):
        lock = filelock.FileLock(str(path), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            return False
        lock.release()
    return True


def _assert_consistent(cache: Path) -> None:
    """Whatever is published is complete: its record reads and its library matches it."""
    for lib in _published(cache):
        meta = jit_cache.read_build(lib.parent)
        assert meta is not None and jit_cache.sha256(lib) == meta["lib"]["sha256"], f"{lib} does not match its record"


class Workers:
    """``n`` Python processes that import kernkit once, then on each line written to their stdin
    (``cache_dir src``) load that module and print its ``answer(1)``. Writing the line to all of
    them at once is the barrier: they block in ``readline`` until then, so they really race."""

    CODE = """
        import os, sys
        {prelude}
        from kernkit.jit import load_jit
        print("READY", flush=True)
        for line in sys.stdin:
            cache_dir, src = line.split()
            os.environ["KERNKIT_CACHE_DIR"] = cache_dir
            try:
                mod = load_jit("relia", cpp_files=[src], cpp_wrappers=[("answer", "answer")])
                print("RESULT", mod.answer(1), flush=True)
            except Exception as e:
                print("ERROR", repr(e).replace(chr(10), " "), flush=True)
    """

    def __init__(self, n: int, env: dict[str, str], logs: Path, prelude: str = "") -> None:
        code = textwrap.dedent(self.CODE).replace("{prelude}", prelude)
        logs.mkdir(parents=True, exist_ok=True)
        self.procs = [
            subprocess.Popen([sys.executable, "-c", code], env=env, cwd=str(REPO), text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=(logs / f"w{i}.err").open("w"))
            for i in range(n)
        ]
        self.watchdog = threading.Timer(240, self.close)
        self.watchdog.start()
        assert [p.stdout.readline().strip() for p in self.procs] == ["READY"] * n

    def round(self, cache: Path, src: Path) -> list[str]:
        line = f"{cache} {src}\n"
        for p in self.procs:
            p.stdin.write(line)
            p.stdin.flush()
        return [p.stdout.readline().strip() for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.watchdog.cancel()


@pytest.mark.slow
def test_16_processes_race_on_one_cold_key_10_times(tmp_path):
    env = {**os.environ, "CXX": str(_cxx(tmp_path))}
    workers = Workers(16, env, tmp_path / "logs")
    failures = []
    try:
        for r in range(10):
            cache = tmp_path / f"round{r}" / "cache"
            src = _source(tmp_path / f"round{r}", offset=100 + r)
            results = workers.round(cache, src)
            outcome = (results.count(f"RESULT {101 + r}"), _compiles(cache), len(_published(cache)),
                       len(_staging(cache)))
            if outcome != (16, 1, 1, 0):
                failures.append((r, outcome, results))
            _assert_consistent(cache)
    finally:
        workers.close()
    assert not failures, "(successes, compiles, published, staging leftovers) per failed round: " + repr(failures)


@pytest.mark.slow
def test_8_threads_race_on_load_jit_of_one_cold_key_10_times(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(_cxx(tmp_path)))
    for r in range(10):
        cache = tmp_path / f"round{r}" / "cache"
        monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
        src = _source(tmp_path / f"round{r}", offset=200 + r)
        barrier = threading.Barrier(8)
        modules, errors = [None] * 8, []

        def work(i: int, barrier=barrier, modules=modules, src=src, errors=errors) -> None:
            try:
                barrier.wait()
                modules[i] = _load(src)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, (r, errors)
        assert [m.answer(1) for m in modules] == [201 + r] * 8, f"round {r}"
        assert _compiles(cache) == 1, f"round {r}: {_compiles(cache)} compiles"
        assert len(_published(cache)) == 1 and not _staging(cache)


@pytest.mark.slow
def test_8_threads_race_on_the_disk_lock_of_one_cold_key(tmp_path, monkeypatch):
    """``JitSpec.build`` has no in-memory lock: the threads meet at the file lock."""
    monkeypatch.setenv("CXX", str(_cxx(tmp_path)))
    for r in range(3):
        cache = tmp_path / f"round{r}" / "cache"
        monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
        spec = _spec(_source(tmp_path / f"round{r}", offset=300 + r))
        barrier = threading.Barrier(8)
        paths, errors = [], []

        def work(barrier=barrier, paths=paths, spec=spec, errors=errors) -> None:
            try:
                barrier.wait()
                paths.append(spec.build())
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and len(set(paths)) == 1 and len(paths) == 8, (r, errors, paths)
        assert _compiles(cache) == 1 and len(_published(cache)) == 1 and not _staging(cache)


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["compile", "link"])
def test_compiler_killed_part_way_fails_that_build_only(tmp_path, fresh_cache, monkeypatch, stage):
    """The compiler (or the linker, after writing half a library) is killed with SIGKILL: that
    request fails with a CompileError, nothing is published, no lock stays held, and the next
    request builds and loads."""
    pid_file = tmp_path / "compiler.pid"
    after = (f'if [ $stage = {stage} ]; then\n'
             f'  [ $stage = link ] && truncate -s 1000 "${{@: -1}}"\n'
             f'  echo $$ > "{pid_file}"; exec sleep 60\nfi')
    monkeypatch.setenv("CXX", str(_cxx(tmp_path, "killed-c++", after=after)))
    spec = _spec(_source(tmp_path, offset=5))
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(CompileError, spec.build).value))
    thread.start()
    _wait_for(pid_file)
    if stage == "link":
        (partial,) = (fresh_cache / "v2" / ".staging").glob("*/lib.so")
        assert partial.stat().st_size == 1000
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], CompileError), errors
    assert _published(fresh_cache) == [] and _staging(fresh_cache) == []
    assert _locks_free(fresh_cache)

    monkeypatch.setenv("CXX", str(_cxx(tmp_path)))
    assert _load(_source(tmp_path, offset=5)).answer(1) == 6
    assert len(_published(fresh_cache)) == 1
    _assert_consistent(fresh_cache)


BUILD_ONE = """
    import sys
    from kernkit.jit import load_jit
    print(load_jit("relia", cpp_files=[sys.argv[1]], cpp_wrappers=[("answer", "answer")]).answer(1), flush=True)
"""


def _start_build(src: Path, env: dict[str, str], code: str = BUILD_ONE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(src)], env=env, cwd=str(REPO),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_python_build_process_killed_while_compiling_leaves_nothing_that_matters(tmp_path, fresh_cache, monkeypatch):
    """SIGKILL to the building process's whole group (Python, ninja, the compiler) in the middle
    of a compile: no lock held, nothing published, a staging leftover that the next request
    ignores, and that a later publish removes once it is stale."""
    started = tmp_path / "compile-started"
    src = _source(tmp_path, offset=9)
    env = {**os.environ, "CXX": str(_cxx(tmp_path, before=f'touch "{started}"; sleep 2'))}
    proc = _start_build(src, env)
    _wait_for(started)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert _locks_free(fresh_cache)
    assert _published(fresh_cache) == []
    (leftover,) = _staging(fresh_cache)

    monkeypatch.setenv("CXX", str(_cxx(tmp_path)))
    assert _spec(src).build().is_file()  # the leftover is recent: a build may still own it
    assert len(_published(fresh_cache)) == 1 and leftover.exists()

    old = time.time() - jit_cache.STALE_STAGING_SECONDS - 60
    os.utime(leftover, (old, old))
    _spec(_source(tmp_path / "other", offset=10)).build()  # any successful publish sweeps
    assert not leftover.exists() and _staging(fresh_cache) == []
    _assert_consistent(fresh_cache)


@pytest.mark.slow
def test_killed_between_record_and_rename_publishes_nothing(tmp_path, fresh_cache):
    """The narrowest window: meta.json is written, the process dies before the rename."""
    src = _source(tmp_path, offset=11)
    code = """
        import os, signal
        real = os.rename
        def rename(a, b, *args, **kw):
            if "/.staging/" in str(a) and "/.staging/" not in str(b):  # the publishing rename
                os.kill(os.getpid(), signal.SIGKILL)
            return real(a, b, *args, **kw)
        os.rename = rename
    """
    proc = _start_build(src, dict(os.environ), textwrap.dedent(code) + textwrap.dedent(BUILD_ONE))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    (leftover,) = _staging(fresh_cache)
    assert (leftover / "meta.json").is_file() and (leftover / "lib.so").is_file()
    assert _published(fresh_cache) == [] and _locks_free(fresh_cache)
    proc = _start_build(src, dict(os.environ))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "12", err
    assert len(_published(fresh_cache)) == 1
    _assert_consistent(fresh_cache)


@pytest.mark.slow
def test_build_process_killed_at_random_moments(tmp_path, monkeypatch):
    """Six builds killed with SIGKILL at moments spread over import, compile, link and publish (a
    seeded draw over the time one whole build took here): after each, whatever is published is
    complete, no lock is held, and the next request builds."""
    rng = random.Random(20240611)
    monkeypatch.setenv("CXX", str(_cxx(tmp_path, before="sleep 0.3")))
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "timing" / "cache"))
    start = time.monotonic()
    proc = _start_build(_source(tmp_path / "timing", offset=99), dict(os.environ))
    assert proc.wait(120) == 0
    whole = time.monotonic() - start
    seen = []
    for i in range(6):
        cache = tmp_path / f"kill{i}" / "cache"
        monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
        src = _source(tmp_path / f"kill{i}", offset=i)
        proc = _start_build(src, dict(os.environ))
        delay = rng.uniform(0.05, 0.95) * whole
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        seen.append((round(delay, 2), proc.returncode, len(_published(cache))))
        _assert_consistent(cache)
        assert _locks_free(cache)
        assert _spec(src).build().is_file()
        assert len(_published(cache)) == 1
    print(f"one build: {whole:.2f} s; delay, return code, published:", seen)
    assert any(code == -signal.SIGKILL for _, code, _ in seen)


# -- damaged builds ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One published build, copied (mtimes kept) for each damage case."""
    base = tmp_path_factory.mktemp("pristine")
    cache = base / "cache"
    src = _source(base, offset=20)
    old = os.environ.get("KERNKIT_CACHE_DIR")
    os.environ["KERNKIT_CACHE_DIR"] = str(cache)
    try:
        _spec(src).build()
    finally:
        os.environ["KERNKIT_CACHE_DIR"] = old
    return cache, src


def _garbage(n: int) -> bytes:
    return random.Random(n).randbytes(n)


def _damage(lib: Path, how: str) -> None:
    meta = lib.parent / "meta.json"
    st = lib.stat()
    if how == "truncated":
        lib.write_bytes(lib.read_bytes()[: st.st_size // 2])
    elif how == "garbage, other size":
        lib.write_bytes(_garbage(st.st_size + 4096))
    elif how == "garbage, same size, new mtime":
        lib.write_bytes(_garbage(st.st_size))
        os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif how == "garbage, same size, same mtime":
        lib.write_bytes(_garbage(st.st_size))
        os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif how == "library missing":
        lib.unlink()
    elif how == "record garbage":
        meta.write_bytes(_garbage(300))
    elif how == "record not an object":
        meta.write_text("[1, 2, 3]")
    elif how == "record without library entry":
        meta.write_text(json.dumps({"title": "relia"}))
    elif how == "record missing":
        meta.unlink()
    else:
        raise AssertionError(how)


DAMAGES = [
    "truncated", "garbage, other size", "garbage, same size, new mtime", "garbage, same size, same mtime",
    "library missing", "record garbage", "record not an object", "record without library entry", "record missing",
]


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_build_is_detected_and_rebuilt(tmp_path, monkeypatch, pristine, how):
    base, src = pristine
    cache = tmp_path / "cache"
    shutil.copytree(base, cache, copy_function=shutil.copy2)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
    (lib,) = _published(cache)
    _damage(lib, how)
    warned = how != "record missing"  # without a record the directory was never published: no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = _spec(src).build()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("discarding a damaged cache entry" in m for m in messages) == warned, messages
    assert path.parent.parent == lib.parent.parent and path.read_bytes() != b""
    (rebuilt,) = _published(cache)
    _assert_consistent(cache)
    assert not list(rebuilt.parent.parent.glob(".trash-*")) and _staging(cache) == []


def test_leftover_of_a_discarded_build_is_never_a_candidate(empty_cache, tmp_path, monkeypatch, pristine):
    """A discard killed half-way leaves ``.trash-*`` with a record in the key directory; a load
    without a compiler (any toolchain accepted) must not pick it."""
    base, src = pristine
    shutil.copytree(base, empty_cache, copy_function=shutil.copy2)
    (lib,) = _published(empty_cache)
    lib.parent.rename(lib.parent.with_name(".trash-1234abcd"))
    monkeypatch.setenv("KERNKIT_JIT", "off")
    with pytest.raises(JitDisabledError):
        _spec(src).build()


# -- read-only and full cache directories --------------------------------------------------------


def _error_names_dir_and_variable(err: CacheDirError, root: Path) -> None:
    text = str(err)
    assert str(root) in text and "KERNKIT_CACHE_DIR" in text, text
    assert "Traceback" not in text


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root and mount rights; skipped elsewhere)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.parametrize("free_kib", [0, 40, 80])
def test_full_cache_dir_raises_cache_dir_error(tmp_path, tmpfs, monkeypatch, free_kib):
    """A real full file system, with space for nothing, for part of the compile, for part of the
    link: a CacheDirError naming the directory and the variable, nothing published or kept."""
    (tmpfs / "filler").write_bytes(b"\0" * (1024 * (1024 - free_kib)))
    cache = tmpfs / "cache"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
    with pytest.raises(CacheDirError) as info:
        _spec(_source(tmp_path, offset=30)).build()
    _error_names_dir_and_variable(info.value, cache / "v2")
    assert "No space left on device" in str(info.value)
    assert _published(cache) == [] and _staging(cache) == [] and not (cache / "v2" / ".failed").exists()
    (tmpfs / "filler").unlink()
    assert _spec(_source(tmp_path, offset=30)).build().is_file()  # space again: it builds


def test_read_only_file_system_warm_loads_and_refuses_cold_builds_clearly(tmp_path, tmpfs, monkeypatch):
    cache = tmpfs / "cache"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
    warm = _source(tmp_path / "warm", offset=40)
    _spec(warm).build()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(BUILD_ONE), str(warm)], env=dict(os.environ),
                          cwd=str(REPO), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "41", proc.stderr
    with pytest.raises(CacheDirError, match="Read-only file system") as info:
        _spec(_source(tmp_path / "cold", offset=42)).build()
    _error_names_dir_and_variable(info.value, cache / "v2")


def test_immutable_cache_dir_warm_loads_and_refuses_cold_builds_clearly(tmp_path, empty_cache, monkeypatch):
    """``chattr +i`` stops even root from writing (skipped where chattr does not work)."""
    fresh_cache = empty_cache  # its own headers: chattr does not follow fresh_cache's links
    warm = _source(tmp_path / "warm", offset=50)
    _spec(warm).build()
    try:
        if subprocess.run(["chattr", "-R", "+i", str(fresh_cache)], capture_output=True).returncode:
            pytest.skip("chattr +i is not available here")
        assert _spec(warm).build().is_file()
        with pytest.raises(CacheDirError) as info:
            _spec(_source(tmp_path / "cold", offset=52)).build()
        _error_names_dir_and_variable(info.value, fresh_cache / "v2")
        assert "build lock" in str(info.value)
    finally:
        subprocess.run(["chattr", "-R", "-i", str(fresh_cache)], check=True)


def _raise(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("where,code", [
    ("sources", errno.ENOSPC),  # writing the generated unit into the staging directory
    ("ninja", errno.ENOSPC),  # writing build.ninja there
    ("flush", errno.ENOSPC),  # flushing the library and meta.json before publishing
    ("rename", errno.EROFS),  # the publishing rename
    ("lock", errno.EROFS),  # creating the lock file
])
def test_write_failures_anywhere_become_cache_dir_errors(tmp_path, fresh_cache, monkeypatch, where, code):
    """Simulated where no real file system can be made to fail at that step: each OSError comes
    out as a CacheDirError naming the directory and the variable, with nothing published."""
    spec = _spec(_source(tmp_path, offset=60))
    if where in ("sources", "ninja"):
        real = Path.write_bytes
        name = "host.cc" if where == "sources" else "build.ninja"
        monkeypatch.setattr(Path, "write_bytes",
                            lambda self, data: _raise(code)() if self.name == name else real(self, data))
    elif where == "flush":
        monkeypatch.setattr(os, "fsync", _raise(code))
    elif where == "rename":
        real_rename = os.rename
        monkeypatch.setattr(os, "rename",
                            lambda a, b: _raise(code)() if "/.staging/" in str(a) and "/.staging/" not in str(b)
                            else real_rename(a, b))
    else:
        monkeypatch.setattr(filelock.FileLock, "acquire", _raise(code))
    with pytest.raises(CacheDirError) as info:
        spec.build()
    _error_names_dir_and_variable(info.value, fresh_cache / "v2")
    assert os.strerror(code) in str(info.value)
    assert _published(fresh_cache) == [] and _staging(fresh_cache) == []
    assert not list((fresh_cache / "v2" / ".locks").glob("*.holder"))
    monkeypatch.undo()
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(fresh_cache))
    assert spec.build().is_file()  # once writes work again, it builds


# -- compiler output and paths that are not UTF-8 ------------------------------------------------


def _latin1_source(folder: Path, directive: str, offset: int) -> Path:
    """``answer.h`` with a ``#warning`` or ``#error`` line holding a Latin-1 byte (not UTF-8)."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "answer.h"
    src.write_bytes(b"#%s caf\xe9 in the source\n" % directive.encode() + SOURCE.format(offset=offset).encode())
    return src


def _not_utf8(path: Path, name: bytes) -> Path:
    """``path / name`` for a name that is not UTF-8, spelled as ``os.fsdecode`` does (surrogates)."""
    return Path(os.fsdecode(os.fsencode(path) + b"/" + name))


def test_latin1_warning_builds_loads_and_keeps_the_compilers_bytes(tmp_path, fresh_cache):
    assert _load(_latin1_source(tmp_path, "warning", offset=100)).answer(1) == 101
    (lib,) = _published(fresh_cache)
    assert b"#warning caf\xe9 in the source" in (lib.parent / "build.log").read_bytes()


def test_latin1_error_raises_compile_error_and_keeps_the_log(tmp_path, fresh_cache):
    with pytest.raises(CompileError) as info:
        _load(_latin1_source(tmp_path, "error", offset=101))
    text = str(info.value)
    assert "#error caf\ufffd in the source" in text, text
    (failed,) = (fresh_cache / "v2" / ".failed").iterdir()
    assert f"log:     {failed / 'build.log'}" in text, text
    assert b"#error caf\xe9 in the source" in (failed / "build.log").read_bytes()
    assert _published(fresh_cache) == [] and _staging(fresh_cache) == []


def test_kernel_in_a_directory_whose_name_is_not_utf8_builds_and_hits(tmp_path, fresh_cache, monkeypatch):
    """The generated unit includes the header by that path, and ``ninja -t deps`` reports it back."""
    monkeypatch.setenv("CXX", str(_cxx(tmp_path)))
    src = _latin1_source(_not_utf8(tmp_path, b"caf\xe9"), "warning", offset=102)
    assert _load(src).answer(1) == 103
    assert _spec(src).build() == _published(fresh_cache)[0] and _compiles(fresh_cache) == 1
    meta = jit_cache.read_build(_published(fresh_cache)[0].parent)
    assert str(src) in [dep[0] for dep in meta["deps"]]


def test_cache_dir_whose_name_is_not_utf8_builds_and_loads(tmp_path, monkeypatch):
    """tvm-ffi takes UTF-8 paths only; the library still loads, cold here and warm in a new process."""
    cache = _not_utf8(tmp_path, b"caf\xe9") / "cache"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache))
    src = _source(tmp_path, offset=104)
    assert _load(src).answer(1) == 105 and _load(src).answer(2) == 106
    proc = _start_build(src, dict(os.environ))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "105", err
    assert len(_published(cache)) == 1


def test_compiler_version_that_is_not_utf8_is_recorded(tmp_path, fresh_cache, monkeypatch):
    cxx = tmp_path / "latin1-c++"
    cxx.write_text('#!/bin/bash\n[ "$1" = --version ] && { printf "c++ (caf\\xe9) 1.0\\n"; exit 0; }\nexec c++ "$@"\n')
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    path = _spec(_source(tmp_path, offset=106)).build()
    assert jit_cache.read_build(path.parent)["compilers"][0]["version"] == "c++ (caf\ufffd) 1.0"


def test_clangd_version_that_is_not_utf8_is_read(tmp_path, monkeypatch):
    from kernkit.cli.clangd import find_clangd

    clangd = tmp_path / "clangd"
    clangd.write_text('#!/bin/bash\nprintf "caf\\xe9 clangd version 21.1.0\\n"\n')
    clangd.chmod(0o755)
    monkeypatch.setenv("KERNKIT_CLANGD", str(clangd))
    assert find_clangd() == (str(clangd), (21, 1, 0))


# -- a lock held by a build that makes no progress -----------------------------------------------


def test_build_waiting_on_a_stopped_builds_lock_says_who_holds_it_and_waits_on(tmp_path, fresh_cache, monkeypatch):
    """A build process is stopped (SIGSTOP) while it compiles, holding the key's lock: after
    ``LOCK_WARN_SECONDS`` a second build logs once which specialization waits, for which pid and
    lock file, and how to break it; it keeps waiting and takes the build once the holder goes on."""
    started = tmp_path / "compile-started"
    monkeypatch.setenv("CXX", str(_cxx(tmp_path, before=f'touch "{started}"; sleep 1')))
    monkeypatch.setattr(jit_cache, "LOCK_WARN_SECONDS", 0.3)
    src = _source(tmp_path, offset=107)
    holder = _start_build(src, dict(os.environ))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("kernkit.jit").addHandler(handler)
    paths: list[Path] = []
    waiter = threading.Thread(target=lambda: paths.append(_spec(src).build()))
    try:
        _wait_for(started)
        os.killpg(holder.pid, signal.SIGSTOP)
        waiter.start()
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)  # long enough for a second message, if there were one
        assert waiter.is_alive() and not paths
    finally:
        os.killpg(holder.pid, signal.SIGCONT)
        out, err = holder.communicate(timeout=120)
        logging.getLogger("kernkit.jit").removeHandler(handler)
    waiter.join(60)
    assert holder.returncode == 0 and out.strip() == "108", err
    (message,) = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    (lock,) = (fresh_cache / "v2" / ".locks").glob("*.lock")
    assert _spec(src).label in message and f"pid {holder.pid} on " in message, message
    assert str(lock) in message and "kill it" in message and f"delete {lock}" in message, message
    assert paths == _published(fresh_cache) and _compiles(fresh_cache) == 1
    assert not list(lock.parent.glob("*.holder"))  # a holder's pid goes with its lock


# -- no working file lock (NFS without lock support) ---------------------------------------------

NO_LOCK = """
import filelock
class NoLock:
    def __init__(self, *a, **k): pass
    def acquire(self, *a, **k): return self
    def release(self, *a, **k): pass
    def __enter__(self): return self
    def __exit__(self, *exc): pass
filelock.FileLock = NoLock
"""


@pytest.mark.slow
def test_without_a_working_lock_two_builds_race_and_one_is_published(tmp_path):
    """Two processes whose file lock does nothing build one key at the same moment, 3 times:
    both compile, both succeed, the rename publishes exactly one complete build."""
    env = {**os.environ, "CXX": str(_cxx(tmp_path, before="sleep 0.5"))}
    workers = Workers(2, env, tmp_path / "logs", prelude=NO_LOCK)
    try:
        for r in range(3):
            cache = tmp_path / f"round{r}" / "cache"
            results = workers.round(cache, _source(tmp_path / f"round{r}", offset=70 + r))
            assert results == [f"RESULT {71 + r}"] * 2, (r, results)
            assert _compiles(cache) == 2, "the lock was meant to be ineffective: both should compile"
            assert len(_published(cache)) == 1 and _staging(cache) == []
            _assert_consistent(cache)
    finally:
        workers.close()


# -- two kernkit versions ------------------------------------------------------------------------

BUILD_AND_DESCRIBE = """
    import json, sys
    from kernkit.jit import JitSpec
    spec = JitSpec.make("relia", cpp_files=[sys.argv[1]], cpp_wrappers=[("answer", "answer")])
    try:
        path = spec.build()
    except Exception as e:
        print(json.dumps({"error": type(e).__name__}))
        raise SystemExit
    print(json.dumps({"path": str(path), "result": spec.build_and_load().answer(1),
                      "kernkit": json.loads((path.parent / "meta.json").read_text())["kernkit"]}))
"""


def _build_in(src: Path, cwd: Path, root: Path | None, **env: str) -> dict:
    """``BUILD_AND_DESCRIBE`` of ``src`` in a new process importing kernkit from ``root`` (None:
    this installation)."""
    path = {"PYTHONPATH": str(root)} if root is not None else {}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(BUILD_AND_DESCRIBE), str(src)],
                          env={**os.environ, **path, **env}, cwd=str(cwd), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_two_kernkit_versions_share_a_cache_without_loading_each_others_builds(tmp_path, fresh_cache):
    """A second kernkit installation (a copy of the package whose version says 9.9.9) and this one
    share a cache directory."""
    from kernkit import __version__

    other_root = tmp_path / "other-install"
    shutil.copytree(REPO / "kernkit", other_root / "kernkit", ignore=shutil.ignore_patterns("__pycache__"))
    (other_root / "kernkit" / "_version.py").write_text('__version__ = "9.9.9"\n')
    src = _source(tmp_path, offset=80)

    def run(version: str, **env: str) -> dict:
        return _build_in(src, tmp_path, other_root if version != "-" else None, **env)

    mine = run("-")
    assert mine["kernkit"] == __version__ and mine["result"] == 81
    # The other version, unable to compile, does not take this version's build.
    assert run("9.9.9", KERNKIT_JIT="off") == {"error": "JitDisabledError"}
    other = run("9.9.9")
    assert other["kernkit"] == "9.9.9" and other["result"] == 81
    assert Path(other["path"]).parent.parent != Path(mine["path"]).parent.parent  # different key directories
    assert run("-", KERNKIT_JIT="off")["path"] == mine["path"]
    assert run("9.9.9", KERNKIT_JIT="off")["path"] == other["path"]
    assert len(_published(fresh_cache)) == 2


@pytest.mark.slow
def test_installations_of_one_version_with_other_headers_do_not_share_builds(tmp_path, fresh_cache):
    """Two checkouts of the same version share a cache (one key: the key names the version), and
    one of them has edited a kernkit header the kernel includes: neither loads the other's build.
    A third copy whose files equal this installation's takes this installation's build."""
    edited, same = tmp_path / "edited-checkout", tmp_path / "same-checkout"
    for root in (edited, same):
        shutil.copytree(REPO / "kernkit", root / "kernkit", ignore=shutil.ignore_patterns("__pycache__"))
    with open(edited / "kernkit" / "include" / "kernkit" / "utils.h", "a") as f:
        f.write("// edited in this checkout\n")
    src = _source(tmp_path, offset=90)

    def run(root: Path | None, **env: str) -> dict:
        return _build_in(src, tmp_path, root, **env)

    mine = run(None)
    assert mine["result"] == 91
    assert run(edited, KERNKIT_JIT="off") == {"error": "JitDisabledError"}
    assert run(same, KERNKIT_JIT="off")["path"] == mine["path"]
    theirs = run(edited)
    assert Path(theirs["path"]).parent.parent == Path(mine["path"]).parent.parent  # one key directory
    assert theirs["path"] != mine["path"]
    assert run(None, KERNKIT_JIT="off")["path"] == mine["path"]
    assert run(edited, KERNKIT_JIT="off")["path"] == theirs["path"]
