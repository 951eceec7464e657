"""Detached makers of the files a cache's builds share but never wait for (the precompiled
header, ``pch.py``), and the publishing of such files (also the helper object, ``prebuilt.py``).

``request`` queues a compile of ``<cache>/v2/<kind>/<key16>/<product>``; ``start`` runs the
queued ones as detached processes (this file run as a script, at a low priority, under the
product's lock ``.locks/<kind>-<key16>.lock``), so no build waits for one. A maker compiles to
a private name, then publishes the product, flushed, by one ``os.replace`` and its record
(``<product>.json``: its SHA-256 and stat) by another, so a reader that finds the record finds
the whole product, after a crash too. A product that does not match its record (``intact``) is
not used, and is made again. A compile that fails on its input leaves ``failed.log`` and no
process asks for that key again (delete the folder to retry); one that is killed, or that runs
out of memory, disk or file size (``TRANSIENT``), leaves nothing, and a later process asks
again. This file imports nothing from kernkit: it runs as a script.

    python maker.py <lock file> <folder> <product> <compiler and arguments>...
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

#: The folders this process has asked for (one attempt per folder and process).
_asked: set[Path] = set()
#: The makers asked for and not started yet (``start``).
_queued: list[list[str]] = []
#: The published files this process found whole by their SHA-256 (``intact``), with the stat
#: each had then.
_intact: dict[Path, tuple[int, int, int, int]] = {}

#: What a compiler prints when it did not fail on its input, so that a later process tries again:
#: a program it runs was killed (the OOM killer, SIGKILL, SIGXFSZ: GCC's "... signal terminated
#: program cc1plus", Clang's "... failed due to signal" and "unable to execute command"), or it ran
#: out of memory, disk space, file size or processes (the C library's messages).
TRANSIENT = re.compile(rb"signal terminated program|due to signal|unable to execute command|out of memory|"
                       rb"No space left on device|Disk quota exceeded|File too large|Cannot allocate memory|"
                       rb"Resource temporarily unavailable|Too many open files")


def request(folder: Path, product: str, command: list[str]) -> None:
    """Queue the making of ``folder/product`` by ``command`` (run in ``folder``; ``-o <file>``
    is appended), unless this process asked for it before or an attempt failed. The caller has
    written the inputs the command reads into ``folder``.

    Parameters
    ----------
    folder
        ``<cache>/v2/<kind>/<key16>``; its lock is ``lock_of(folder)``.
    product
        The file's name in ``folder``.
    command
        The compiler and its arguments, without the output.

    Example
    -------
    >>> request(root / "pch" / key, "prelude.h.gch", ["g++", "-x", "c++-header", "-c", "prelude.h"])  # doctest: +SKIP
    >>> start()  # doctest: +SKIP
    """
    if not may_ask(folder):
        return
    _asked.add(folder)
    _queued.append([str(lock_of(folder)), str(folder), product, *command])


def lock_of(folder: Path) -> Path:
    """The lock of the product in ``folder`` (``<cache>/v2/<kind>/<key16>``):
    ``<cache>/v2/.locks/<kind>-<key16>.lock``, its folder made. Where ``<kind>`` links into
    another cache (the test suite's caches share their headers so), the lock is that cache's."""
    locks = folder.resolve().parent.parent / ".locks"
    locks.mkdir(exist_ok=True)
    return locks / f"{folder.parent.name}-{folder.name}.lock"


def may_ask(folder: Path) -> bool:
    """Whether ``request`` would queue a maker for ``folder``: this process has not asked for it
    and no attempt has failed."""
    return folder not in _asked and not (folder / "failed.log").exists()


def start() -> None:
    """Start the queued makers, detached: their own session and no inherited descriptors (a
    caller reading our output to its end, a test runner or a benchmark, would wait for them).
    Safe from several threads (a parallel ``warmup``): each queued maker is popped by one."""
    while True:
        try:
            args = _queued.pop(0)
        except IndexError:
            return
        subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)


def made(folder: Path, product: str) -> bool:
    """Whether ``folder/product`` is published (its record is there)."""
    return (folder / f"{product}.json").is_file()


def _record(folder: Path, product: str) -> dict | None:
    """The record of ``folder/product`` (``publish``), None when there is none that reads as one
    (a few hundred bytes: a longer or deeper file is not one)."""
    try:
        with open(folder / f"{product}.json", "rb") as f:
            record = json.loads(f.read(4096))
    except (OSError, ValueError, RecursionError):
        return None
    return record if type(record) is dict and type(record.get("sha256")) is str else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(folder: Path, product: str, copy: Path | None = None) -> bool:
    """Whether ``copy`` (default: ``folder/product``) has the SHA-256 its record names."""
    record = _record(folder, product)
    try:
        return record is not None and _sha256(copy or folder / product) == record["sha256"]
    except OSError:
        return False


def intact(folder: Path, product: str) -> bool:
    """Whether ``folder/product`` is published and whole: its stat is the one its record names
    (size, mtime, change time, inode: a write changes the change time, and ``publish`` flushed
    the file before the record existed), else its SHA-256 is, hashed once per process for each
    stat of the file (a copied cache). A product cut short or overwritten is not."""
    record = _record(folder, product)
    if record is None:
        return False
    path = folder / product
    try:
        st = os.stat(path)
    except OSError:
        return False
    now = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if [record.get(k) for k in ("size", "mtime_ns", "ctime_ns", "inode")] == list(now) or _intact.get(path) == now:
        return True
    if not verified(folder, product):
        return False
    _intact[path] = now
    return True


@contextlib.contextmanager
def holding(lock_file: str | Path):
    """Hold ``lock_file`` (``filelock``) if no other process does, without waiting: yields
    whether it is held."""
    import filelock

    lock = filelock.FileLock(lock_file)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def scratch(folder: Path, product: str) -> Path:
    """A private name in ``folder`` to write ``product`` to before ``publish``, after deleting
    those left by a killed writer (only the lock's holder writes)."""
    for old in folder.glob(f".{product}.*"):
        old.unlink()
    return folder / f".{product}.{os.getpid()}"


def publish(folder: Path, product: str, tmp: Path) -> None:
    """Publish ``tmp`` (from ``scratch``) as ``folder/product``: the product, flushed to the disk,
    by one ``os.replace``, then its record (its SHA-256 and the stat ``intact`` compares) by
    another, flushed too, so that a reader that finds the record finds the whole product, also
    after a crash. The caller holds the product's lock."""
    digest = _sha256(tmp)
    _flush(tmp)
    path = folder / product
    os.replace(tmp, path)
    st = os.stat(path)  # after the rename, which sets the change time
    record = folder / f".{product}.json.{os.getpid()}"
    record.write_text(json.dumps({"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                  "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}))
    _flush(record)
    _flush_names(folder)  # the product's name before the record's
    os.replace(record, folder / f"{product}.json")
    _flush_names(folder)


def _flush(path: Path) -> None:
    """``fsync`` a file: an ``OSError`` where its content may not be on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush_names(folder: Path) -> None:
    """``fsync`` a folder, making the renames in it durable where the file system can (some
    cannot flush a folder: the renames then stay as durable as it makes them)."""
    with contextlib.suppress(OSError):
        _flush(folder)


def make(lock_file: str, folder: str, product: str, command: list[str]) -> int:
    """Make ``folder/product`` with ``command`` unless another process holds ``lock_file`` or a
    product matching its record is there. Returns 0 when it is there or another maker works on
    it, 1 when the compile or the publishing failed (``failed.log`` keeps the compiler's output
    when it failed on its input: ``remembered``)."""
    path = Path(folder)
    with holding(lock_file) as held:
        if not held or verified(path, product):
            return 0
        tmp = scratch(path, product)
        try:
            proc = subprocess.run([*command, "-o", tmp.name], cwd=path, capture_output=True)
            if proc.returncode:
                tmp.unlink(missing_ok=True)
                if remembered(proc.returncode, proc.stdout + proc.stderr):
                    _write_log(path, proc.stdout + proc.stderr)
                return 1
            publish(path, product, tmp)
        except OSError:  # the disk filled, or the folder went: nothing is left behind, a later process tries again
            tmp.unlink(missing_ok=True)
            return 1
        return 0


def remembered(returncode: int, output: bytes) -> bool:
    """Whether a compile that ended with ``returncode`` and printed ``output`` failed for good: it
    exited with an error (it was not killed) and its output names no signal or exhausted resource
    (``TRANSIENT``), so another attempt would fail the same way."""
    return returncode > 0 and TRANSIENT.search(output) is None


def _write_log(folder: Path, output: bytes) -> None:
    """Write ``failed.log`` whole or not at all: its presence stops every later attempt."""
    tmp = folder / f".failed.log.{os.getpid()}"
    try:
        tmp.write_bytes(output)
        os.replace(tmp, folder / "failed.log")
    except OSError:
        tmp.unlink(missing_ok=True)


if __name__ == "__main__":
    os.nice(10)  # a build in the foreground goes first
    sys.exit(make(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
