"""The on-disk cache of built specializations.

Layout under the cache root (``$KERNKIT_CACHE_DIR``, default ``~/.cache/kernkit``)::

    v2/<name>/<args>-<key16>/<build12>/   one published build: lib.so, meta.json, the generated
                                          units, build.ninja, build.log
    v2/.locks/<key16>.lock                the per-key build lock
    v2/.locks/<key16>.holder              "pid <pid> on <host>" of the build holding it
    v2/.staging/<key16>-<pid>-<uuid8>/    a build in progress (private to one process)
    v2/.locks/<key16>-<pid>-<uuid8>.staging   its lock, held by that process while it builds
    v2/.failed/<name>-<key16>/            the last failed build of a key, for inspection
    v2/pch/<key16>/                       precompiled host headers of the nvrtc and emu units
    v2/helpers/<key16>/                   the prebuilt helper object of the nvrtc and emu units
    v2/.locks/{pch,helpers}-<key16>.lock  held by the process making or publishing one (maker.py)

``key16`` hashes what a spec says: the generated units (a user's file under the kernel root
named by its path there), every flag, the backend, the target architecture, and the kernkit and
tvm-ffi versions. ``build12`` hashes what the build found: the
content of every header the compilers reported reading and the compilers' identities. One key may
hold several builds (before and after a header edit, or from two machines' compilers on a shared
cache); a load takes the one whose headers and compilers still match.

``meta.json`` records each header's path, stat and SHA-256, the compilers' (path, size, mtime)
and the library's size, mtime and SHA-256. A header under the spec's kernel root (a user's
project: ``JitSpec.kernel_root``) is recorded by its path relative to that root, so the build
stays current when the project moves; a load joins it to its own spec's root, after checking
that the name cannot leave it (``paths.root_relative``). A hit compares stats and hashes a file
only when its stat differs, so an unchanged tree costs a few dozen ``stat`` calls, a copied one
a few hashes, and an edited header makes the build stale. A build is immutable: it appears
through one ``rename`` of a complete directory (atomic on local file systems and on NFS) after
its files are flushed, and a library that no longer matches its record is discarded with a
warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from pathlib import Path

from .config import CACHE_DIR_VAR, cache_dir
from .paths import LIB_NAME, PACKAGE_ROOT, root_name, root_relative, under_root
from .untrusted import read_json

#: The layout version: the cache's builds live under ``<cache>/v2``.
LAYOUT = "v2"

#: A staging directory untouched for this long, whose builder no longer holds its lock, belongs
#: to a build that was killed; the next successful publish removes it. The lock decides, so a
#: host whose clock is ahead does not remove another host's live build on a shared cache.
STALE_STAGING_SECONDS = 6 * 3600

#: A build that has waited this long for its key's lock logs, once, who holds it; then it waits on.
LOCK_WARN_SECONDS = 5.0


class CacheDirError(RuntimeError):
    """The cache directory cannot be created or written (read-only, full, not a directory)."""


def dir_problem(root: Path, doing: str, error: OSError) -> CacheDirError:
    """A ``CacheDirError`` for an ``OSError`` met while ``doing`` something in the cache at
    ``root``: it names the directory, the reason and the variable that moves the cache."""
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    return CacheDirError(
        f"kernkit cannot {doing} in its cache directory {root}: {error.strerror or error}; "
        f"{'free space there or point' if full else 'point'} {CACHE_DIR_VAR} at a writable directory"
        f"{' with room' if full else ''}")


def root() -> Path:
    """```<cache>/v2```, absolute."""
    return cache_dir().absolute() / LAYOUT


def ensure_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise dir_problem(root(), f"create {path}", e) from e


def sha256(path: Path | str) -> str:
    """The SHA-256 (hex) of a file's content, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_record(path: Path | str, root: str | None = None) -> list:
    """``[path, size, mtime_ns, ctime_ns, inode, sha256]``: what a hit compares a file against.
    ``cp -p`` and ``touch -r`` can restore size and mtime, never the change time and inode. A
    file under ``root`` (a spec's kernel root) is named relative to it (``paths.root_name``)."""
    st = os.stat(path)
    return [root_name(path, root) or str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha256(path)]


def unchanged(record: list, root: str | None = None) -> bool:
    """Whether the file still has the recorded content: equal stats, else an equal hash. A
    relative path is the file's under ``root``; without a root, or for a name that could leave
    it, the file is not the recorded one."""
    path, size, *stat, digest = record
    try:
        if not path.startswith("/"):
            if root is None:
                return False
            path = under_root(path, root)
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    if st.st_size != size:
        return False
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino] == stat or sha256(path) == digest


class CorruptBuildError(RuntimeError):
    """A published build whose record cannot be read or whose library no longer matches it."""


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _int(value: object) -> bool:
    return type(value) is int


def _file(value: object) -> bool:
    """Whether ``value`` is a ``file_record``: ``[path, size, mtime_ns, ctime_ns, inode, sha256]``."""
    return (type(value) is list and len(value) == 6 and type(value[0]) is str and all(map(_int, value[1:5]))
            and type(value[5]) is str)


def _recorded_path(path: str) -> bool:
    """Whether a record may name a header ``path``: an absolute path, or one relative to the
    kernel root that cannot leave it (``paths.root_relative``); no NUL in either."""
    return (path.startswith("/") and "\0" not in path) or root_relative(path)


def check_record(meta: object) -> dict:
    """``meta`` when it is a build record as ``publish`` writes it, each field of the type kernkit
    reads it as and each header's path absolute or under the kernel root (``_recorded_path``);
    else a ``ValueError`` naming the first field or path that is not. A load skips such a build,
    ``cache import`` refuses it, and the cache tools name it and pass it over.

    Parameters
    ----------
    meta
        A parsed ``meta.json``.

    Returns
    -------
    ``meta`` itself.

    Example
    -------
    >>> check_record({"title": "scale<fp32_t, false>", "built_at": "2026-12-01"})  # doctest: +SKIP
    ValueError: its record's 'key' is not 64 hex digits
    """
    if type(meta) is not dict:
        raise ValueError(f"its record is a JSON {type(meta).__name__}, not an object")
    problem = next((f"{field!r} is not {expected}" for field, ok, expected in (
        ("title", type(meta.get("title")) is str, "a string"),
        ("key", type(meta.get("key")) is str and _SHA256.fullmatch(meta["key"]), "64 hex digits"),
        ("kernkit", type(meta.get("kernkit")) is str, "a string"),
        ("tvm_ffi", type(meta.get("tvm_ffi")) is str, "a string"),
        ("backend", meta.get("backend") is None or type(meta["backend"]) is str, "a string or null"),
        ("arch", meta.get("arch") is None or type(meta["arch"]) is str, "a string or null"),
        ("package", meta.get("package") is None or type(meta["package"]) is str, "a string or null"),
        ("built_at", type(meta.get("built_at")) in (int, float) and math.isfinite(meta["built_at"]),
         "a number (seconds since the epoch)"),
        ("imported", type(meta.get("imported", False)) is bool, "true or false"),
        ("request", type(meta.get("request", {})) is dict, "an object"),
        ("lib", type(meta.get("lib")) is dict and all(_int(meta["lib"].get(k)) for k in (
            "size", "mtime_ns", "ctime_ns", "inode")) and type(meta["lib"].get("sha256")) is str,
         "{size, mtime_ns, ctime_ns, inode, sha256}"),
        ("deps", type(meta.get("deps")) is list and all(map(_file, meta["deps"])),
         "a list of [path, size, mtime_ns, ctime_ns, inode, sha256]"),
        ("compilers", type(meta.get("compilers")) is list and all(
            type(c) is dict and type(c.get("stamp")) is list for c in meta["compilers"]), "a list of {stamp, ...}"),
    ) if not ok), None)
    if problem:
        raise ValueError(f"its record's {problem}")
    escape = next((d[0] for d in meta["deps"] if not _recorded_path(d[0])), None)
    if escape is not None:
        raise ValueError(f"its record's 'deps' names {escape!r}, which is neither an absolute path nor a path under "
                         "the kernel root (no '..', '.', empty part or NUL)")
    return meta


def read_build(build_dir: Path) -> dict | None:
    """The record of a published build, None when ``build_dir`` holds none (never published, or
    being removed). Raises ``CorruptBuildError`` for a damaged record (``check_record``; read as
    input, ``untrusted.read_json``: a regular file, within a size and a nesting limit) or library."""
    try:
        meta = check_record(read_json(build_dir / "meta.json", regular=True))
        lib = meta["lib"]
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise CorruptBuildError(f"unreadable build record in {build_dir}: {e}") from e
    if not unchanged([str(build_dir / LIB_NAME), lib["size"], lib["mtime_ns"], lib["ctime_ns"], lib["inode"],
                      lib["sha256"]]):
        raise CorruptBuildError(f"{build_dir / LIB_NAME} is missing or differs from its build record")
    return meta


#: The damaged builds of read-only caches this process has warned about (once each).
_warned: set[str] = set()


def warn_once(what: str, message: str) -> None:
    """Warn (``RuntimeWarning``) about ``what`` the first time only in this process."""
    if what not in _warned:
        _warned.add(what)
        warnings.warn(message, RuntimeWarning, stacklevel=5)


def find(key_dir: Path, compilers: list | None, read_only: bool = False, root: str | None = None) -> Path | None:
    """The library of the newest build under ``key_dir`` whose headers are unchanged and, unless
    ``compilers`` is None, whose compilers are these (``backends.base.stamp`` of each). A header
    recorded relative to a kernel root is looked up under ``root``, the spec's. A damaged build
    is skipped: discarded with a warning, or, with ``read_only`` (a shared cache, which this
    process never modifies), left as it is with one warning per process."""
    try:
        dirs = [d for d in key_dir.iterdir() if not d.name.startswith(".")]
    except OSError:
        return None
    builds = []
    for build_dir in dirs:
        try:
            meta = read_build(build_dir)
        except CorruptBuildError as e:
            if read_only:
                warn_once(str(build_dir), f"kernkit: skipping a damaged build of a read-only cache (left as it "
                                          f"is): {e}")
                continue
            warnings.warn(f"kernkit: discarding a damaged cache entry: {e}", RuntimeWarning, stacklevel=4)
            discard(build_dir)
            continue
        # An imported build (``cache import``) was checked against this installation's headers
        # when it was published; its compilers are the exporting machine's.
        if meta is not None and (compilers is None or meta.get("imported")
                                 or [c["stamp"] for c in meta["compilers"]] == compilers):
            builds.append((meta["built_at"], build_dir, meta))
    for _, build_dir, meta in sorted(builds, key=lambda b: b[0], reverse=True):
        if all(unchanged(dep, root) for dep in meta["deps"]) and _same_package_files(meta):
            return build_dir / LIB_NAME
    return None


def local_path(path: str, package: str | None) -> Path:
    """Where this installation has a file a build recorded at ``path``: the same path, or, for a
    file of another kernkit installation's package directory (the record's ``package``), this
    installation's copy of it. ``find`` and ``cache import`` compare that copy by content."""
    if package and Path(package) != PACKAGE_ROOT and Path(package) in Path(path).parents:
        return PACKAGE_ROOT / Path(path).relative_to(package)
    return Path(path)


def _same_package_files(meta: dict) -> bool:
    """Whether this installation's kernkit files are those a build read. A build made by another
    installation of the same version (another checkout or environment) recorded that package's
    headers, which may differ from this one's while the key, which names the version and not the
    headers, is the same."""
    if not meta.get("package") or Path(meta["package"]) == PACKAGE_ROOT:
        return True
    for path, size, *_, digest in meta["deps"]:
        mine = local_path(path, meta["package"])
        try:
            if mine != Path(path) and (mine.stat().st_size != size or sha256(mine) != digest):
                return False
        except OSError:
            return False
    return True


@contextlib.contextmanager
def locked(key: str, label: str, wait: bool = True):
    """Hold the file lock of one key (``filelock``: an ``flock``, released if the process dies).
    A wait longer than ``LOCK_WARN_SECONDS`` logs once, through the ``kernkit.jit`` logger, that
    the build of ``label`` waits, for which process, and how to break the lock; it never times out.
    With ``wait=False`` it yields False at once where another process holds the lock, True where
    it took it."""
    import filelock  # only builds need it: not imported at every process start

    ensure_dir(root() / ".locks")
    path = root() / ".locks" / f"{key[:16]}.lock"
    # Not in the lock file: on a file system without flock, filelock keeps its own marker there.
    holder = path.with_suffix(".holder")
    lock = filelock.FileLock(str(path))
    try:
        try:
            lock.acquire(timeout=LOCK_WARN_SECONDS if wait else 0)
        except filelock.Timeout:
            if not wait:
                yield False
                return
            try:
                who = holder.read_text(errors="replace").strip()
            except OSError:
                who = ""
            logging.getLogger("kernkit.jit").warning(
                "kernkit: the build of %s has waited %g s for its lock %s, held by %s; still waiting. If that "
                "process is stopped or hung, kill it; if no process holds the lock any more (a stale lock on a "
                "network file system), delete %s", label, LOCK_WARN_SECONDS, path,
                who or "a process that recorded no pid", path)
            lock.acquire()
    except OSError as e:
        raise dir_problem(root(), "take the build lock", e) from e
    try:
        with contextlib.suppress(OSError):  # it only serves the message above
            holder.write_text(f"pid {os.getpid()} on {socket.gethostname()}")
        yield True
    finally:
        with contextlib.suppress(OSError):
            holder.unlink()
        lock.release()


#: The staging directories this process is filling, each with the descriptor that holds its
#: lock (an ``flock``, which the kernel releases however the process ends), until it is
#: published, kept as a failure or discarded.
_staging_locks: dict[Path, int] = {}


def _staging_lock(staging: Path) -> Path:
    return staging.parent.parent / ".locks" / f"{staging.name}.staging"


def staging_dir(key: str) -> Path:
    """A new private directory to build in, under ``.staging``; its lock is taken before it
    exists and held while this process uses it (``remove_stale_staging`` spares it)."""
    path = root() / ".staging" / f"{key[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ensure_dir(root() / ".locks")
    try:
        fd = os.open(_staging_lock(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise dir_problem(root(), "create a staging lock", e) from e
    with contextlib.suppress(OSError):  # no flock here: the directory is never judged stale
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _staging_locks[path] = fd
    try:
        ensure_dir(path)
    except CacheDirError:
        _release_staging(path)
        raise
    return path


def _release_staging(staging: Path) -> None:
    """Drop the lock of a staging directory this process no longer uses (published, kept or
    discarded: gone from where it was)."""
    fd = _staging_locks.pop(staging, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.unlink(_staging_lock(staging))
        os.close(fd)


def _builder_alive(staging: Path) -> bool:
    """Whether a process may still be building in ``staging``: its lock is held, or cannot be
    tested. A lock that is free (its builder died) is removed; a missing one (made by an older
    kernkit) leaves the age to decide."""
    lock = _staging_lock(staging)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (EWOULDBLOCK), or no flock on this file system: do not guess
        return True
    else:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        return False
    finally:
        os.close(fd)


def publish(staging: Path, final: Path, meta: dict) -> Path:
    """Record the library in ``meta.json`` and move the staging directory to ``final`` in one
    rename. If another process published ``final`` first, its build wins and ours is discarded.

    Only steps that are atomic on NFS as well are used: the staging directory is on the cache's
    file system, the library and its record are flushed before the rename, and a rename onto a
    published build fails rather than replacing it. An ``OSError`` becomes a ``CacheDirError``;
    nothing is published then."""
    try:
        with open(staging / LIB_NAME, "rb") as f:
            os.fsync(f.fileno())
        _, size, mtime, ctime, inode, digest = file_record(staging / LIB_NAME)
        meta = {**meta, "lib": {"size": size, "mtime_ns": mtime, "ctime_ns": ctime, "inode": inode,
                                "sha256": digest}}
        with open(staging / "meta.json", "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        ensure_dir(final.parent)
        for attempt in (1, 2):
            try:
                os.rename(staging, final)
                _release_staging(staging)
                break
            except OSError:
                if (final / "meta.json").is_file():  # published meanwhile: that build wins
                    discard(staging)
                    break
                if attempt == 2 or not final.is_dir():
                    raise
                discard(final)  # a directory without a record (damaged by hand): move it aside
    except OSError as e:
        raise dir_problem(root(), f"publish {final}", e) from e
    remove_stale_staging()
    return final


def remove_stale_staging() -> None:
    """Remove the staging directories of builds whose process was killed: untouched for
    ``STALE_STAGING_SECONDS`` and their lock free (``_builder_alive``). Errors are ignored,
    since another process may be removing the same one."""
    limit = time.time() - STALE_STAGING_SECONDS
    try:
        for path in list((root() / ".staging").iterdir()):
            if path.stat().st_mtime < limit and not _builder_alive(path):
                discard(path)
    except OSError:
        pass


def discard(path: Path) -> bool:
    """Remove a build or staging directory: renamed aside first, so no reader sees it half
    deleted. Returns whether it is gone (False: it could not be moved, e.g. a read-only cache)."""
    trash = path.parent / f".trash-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, trash)
    except OSError:
        return not os.path.lexists(path)
    finally:
        _release_staging(path)
    for attempt in range(3):  # a detached maker may still create a file in it as it goes
        shutil.rmtree(trash, ignore_errors=True)
        if not os.path.lexists(trash):
            break
        time.sleep(0.05 * (attempt + 1))
    return True


def keep_failed(staging: Path, target: Path) -> Path:
    """Keep a failed build at ``target`` for inspection (replacing an older failure there)."""
    shutil.rmtree(target, ignore_errors=True)
    try:
        ensure_dir(target.parent)
        os.rename(staging, target)
        return target
    except (OSError, CacheDirError):
        return staging  # left for inspection where it is, and removed once stale
    finally:
        _release_staging(staging)


def note_frozen_compile(entry: dict) -> None:
    """Append one compile done while frozen with ``warn`` to ``frozen-compiles.jsonl`` (one
    ``write`` of one line, so lines of concurrent processes do not interleave)."""
    ensure_dir(root())
    try:
        with open(root() / "frozen-compiles.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError as e:
        raise dir_problem(root(), "count a frozen compile in frozen-compiles.jsonl", e) from e


def frozen_compiles() -> list[dict]:
    """The compiles ``note_frozen_compile`` recorded, oldest first; a line that is not a whole
    record (a process killed while writing it, a full disk) is passed over."""
    try:
        lines = (root() / "frozen-compiles.jsonl").read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    seen = []
    for line in lines:
        try:
            seen.append(json.loads(line))
        except ValueError:
            continue
    return seen
