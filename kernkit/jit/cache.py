"""The on-disk cache of built specializations.

Layout under the cache root (``$KERNKIT_CACHE_DIR``, default ``~/.cache/kernkit``)::

    v1/<kernel>/<variant>-<key16>/<toolchain12>/   one published build: lib.so, meta.json,
                                                   the generated sources, build.ninja, build.log
    v1/.locks/<key16>-<toolchain12>.lock           per-build file lock
    v1/.staging/...                                builds in progress (private to one process)
    v1/.failed/<kernel>-<key16>/                   the last failed build of a key, for inspection
    v1/.records/<request32>.json                   what a request resolved to (``records.py``)

``key16`` hashes everything that decides the output except the compilers: the generated
sources, the content of every header they include (transitively), all flags, the target
architecture, and the tvm-ffi and kernkit versions. ``toolchain12`` hashes the compilers'
versions. Splitting the two lets a machine without compilers (a deployment image, or
``KERNKIT_JIT=off``) load what a build machine published.

A build happens in a private staging directory and is published by one ``rename`` of that
directory, which is atomic on local file systems and on NFS: a reader sees either no build or a
complete one. ``meta.json`` records the library's size, mtime and SHA-256, so a library that was
truncated or overwritten after publishing is detected when it is loaded. Staging directories
left by a killed build are removed once they are ``STALE_STAGING_SECONDS`` old.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi

from .._version import __version__
from .build import BASE_FLAGS, LIB_NAME, BuildSpec
from .codegen import PACKAGE_ROOT
from .config import CACHE_DIR_VAR, cache_dir

LAYOUT = "v1"

#: A staging directory untouched for this long belongs to a build that was killed (a live build
#: writes into its directory every few minutes at most); the next successful publish removes it.
STALE_STAGING_SECONDS = 6 * 3600


class CacheDirError(RuntimeError):
    """The cache directory cannot be created or written (read-only, full, not a directory)."""


def dir_problem(root: Path, doing: str, error: OSError) -> CacheDirError:
    """A ``CacheDirError`` for an ``OSError`` met while ``doing`` something in the cache at
    ``root``: it names the directory, the reason and the variable that moves the cache."""
    reason = error.strerror or str(error)
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    advice = "free space there or point" if full else "point"
    return CacheDirError(
        f"kernkit cannot {doing} in its cache directory {root}: {reason}; {advice} {CACHE_DIR_VAR} at a "
        f"writable directory{' with room' if full else ''}"
    )


def key_material(spec: BuildSpec) -> str:
    """The hash of everything but the toolchain that determines the build (hex, 64 chars)."""
    h = hashlib.sha256()

    def put(*parts: object) -> None:
        for p in parts:
            b = str(p).encode()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)

    put("layout", LAYOUT, "kernkit", __version__, "tvm_ffi", tvm_ffi.__version__, "backend", spec.backend)
    put("arch", spec.arch or "-")
    for rule in sorted({u.rule for u in spec.units}):
        put("rule", rule, *BASE_FLAGS[rule], "|")
    for unit in spec.units:
        put("unit", unit.filename, unit.rule, unit.text)
    for name in ("cflags", "cuda_cflags", "ldflags", "include_paths", "sanitizers"):
        put(name, *getattr(spec, name), "|")
    for path in sorted(spec.deps):
        try:  # kernkit's own files by their place in the package: keys survive a reinstall
            ident = path.relative_to(PACKAGE_ROOT).as_posix()
        except ValueError:
            ident = str(path)
        put("dep", ident, spec.deps[path])
    return h.hexdigest()


_SAFE = re.compile(r"[^A-Za-z0-9_.+=-]+")


def _readable(text: str, limit: int = 80) -> str:
    text = _SAFE.sub("_", text).strip("_") or "default"
    return text[:limit]


@dataclass(frozen=True)
class Entry:
    """Where one key lives in the cache."""

    root: Path  # <cache>/v1
    kernel: str
    variant: str
    key: str

    @classmethod
    def of(cls, spec: BuildSpec, key: str) -> Entry:
        return cls(cache_dir() / LAYOUT, _readable(spec.kernel), _readable(spec.variant), key)

    @property
    def dir(self) -> Path:
        return self.root / self.kernel / f"{self.variant}-{self.key[:16]}"

    def build_dir(self, fingerprint: str) -> Path:
        return self.dir / fingerprint

    def lock_path(self, fingerprint: str) -> Path:
        return self.root / ".locks" / f"{self.key[:16]}-{fingerprint}.lock"

    def failed_dir(self) -> Path:
        return self.root / ".failed" / f"{self.kernel}-{self.key[:16]}"


def ensure_dir(path: Path) -> None:
    """Create ``path``; a permission or space problem becomes a ``CacheDirError`` that says how to
    move the cache."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheDirError(
            f"kernkit cannot create its cache directory {path}: {e.strerror or e}; point {CACHE_DIR_VAR} "
            "at a writable directory"
        ) from e


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class CorruptBuildError(RuntimeError):
    """A published library no longer matches the record written when it was published."""


def check_published(build_dir: Path) -> dict | None:
    """The build's metadata if ``build_dir`` holds a published build, None if it holds none.
    Raises ``CorruptBuildError`` when the library differs from its record. The cheap stat check
    runs first; only when size or mtime differ is the content hashed (a copied cache with new
    mtimes still loads)."""
    try:
        meta = json.loads((build_dir / "meta.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise CorruptBuildError(f"unreadable build record in {build_dir}: {e}") from e
    rec = meta.get("lib") if isinstance(meta, dict) else None
    if not isinstance(rec, dict):
        raise CorruptBuildError(f"the build record {build_dir / 'meta.json'} has no library entry")
    lib = build_dir / LIB_NAME
    try:
        st = lib.stat()
    except FileNotFoundError:
        raise CorruptBuildError(f"{lib} is missing") from None
    if st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns"):
        return meta
    if st.st_size != rec.get("size") or _sha256(lib) != rec.get("sha256"):
        raise CorruptBuildError(
            f"{lib} does not match its build record (size {st.st_size}, recorded {rec.get('size')})"
        )
    return meta


def content_matches(build_dir: Path) -> bool:
    """Whether the library's content still has the SHA-256 recorded at publish time (the full
    check, for a library that failed to load although its size and mtime match the record)."""
    try:
        meta = json.loads((build_dir / "meta.json").read_text())
        return _sha256(build_dir / LIB_NAME) == meta["lib"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def newest_published(entry: Entry) -> Path | None:
    """The most recently published build of a key, whatever its toolchain."""
    try:
        # Dot names are builds being discarded (``.trash-*``), never candidates.
        candidates = [d for d in entry.dir.iterdir() if not d.name.startswith(".") and (d / "meta.json").is_file()]
    except FileNotFoundError:
        return None
    return max(candidates, key=lambda d: (d / "meta.json").stat().st_mtime_ns, default=None)


def staging_dir(entry: Entry, fingerprint: str) -> Path:
    path = entry.root / ".staging" / f"{entry.key[:16]}-{fingerprint}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ensure_dir(path)
    return path


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staging: Path, entry: Entry, fingerprint: str, meta: dict) -> Path:
    """Record the library in ``meta.json`` and move the staging directory into place atomically.
    If another process published first, its build wins and ours is discarded.

    Only operations that are atomic on NFS as well are used: the staging directory sits on the
    same file system as the cache, the library and its record are flushed (``fsync``) before
    the one ``rename`` of the directory, and a rename onto an existing published build fails
    rather than replacing it. An ``OSError`` (read-only or full file system) becomes a
    ``CacheDirError``; nothing is published then."""
    final = entry.build_dir(fingerprint)
    try:
        lib = staging / LIB_NAME
        _fsync(lib)
        st = lib.stat()
        meta = {**meta, "lib": {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(lib)}}
        _write_synced(staging / "meta.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        ensure_dir(final.parent)
        for attempt in (1, 2):
            try:
                os.rename(staging, final)
                break
            except OSError:
                if (final / "meta.json").is_file():  # another process published first: its build wins
                    shutil.rmtree(staging, ignore_errors=True)
                    break
                if attempt == 2 or not final.is_dir():
                    raise
                discard(final)  # a directory without a record (damaged by hand): move it aside
    except OSError as e:
        raise dir_problem(entry.root, f"publish {final.relative_to(entry.root)}", e) from e
    remove_stale_staging(entry.root)
    return final


def remove_stale_staging(root: Path, older_than: float = STALE_STAGING_SECONDS) -> list[Path]:
    """Remove staging directories not modified for ``older_than`` seconds: builds whose process
    was killed. Returns what was removed; errors are ignored (another process may be removing
    the same directory)."""
    removed = []
    limit = now() - older_than
    try:
        entries = list((root / ".staging").iterdir())
    except OSError:
        return removed
    for path in entries:
        try:
            if path.stat().st_mtime >= limit:
                continue
            trash = path.with_name(f".trash-{uuid.uuid4().hex[:8]}")
            os.rename(path, trash)
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    return removed


def discard(build_dir: Path) -> None:
    """Move a corrupt build out of the way (rename first, so no reader sees it half-deleted)."""
    trash = build_dir.parent / f".trash-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(build_dir, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def keep_failed(staging: Path, entry: Entry) -> Path:
    """Keep a failed build for inspection (replacing the previous failure of the same key)."""
    target = entry.failed_dir()
    shutil.rmtree(target, ignore_errors=True)
    try:
        ensure_dir(target.parent)
        os.rename(staging, target)
        return target
    except (OSError, CacheDirError):
        return staging


def now() -> float:
    return time.time()


@dataclass(frozen=True)
class Published:
    """One published build found in the cache (for listing and clearing)."""

    kernel: str
    variant: str
    key16: str
    fingerprint: str
    path: Path  # the build directory
    meta: dict

    @property
    def size(self) -> int:
        """Bytes of the whole build directory (library, generated sources, logs)."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    @property
    def built_at(self) -> float:
        return float(self.meta.get("built_at") or (self.path / "meta.json").stat().st_mtime)


def iter_published(root: Path | None = None):
    """Every published build under the cache root (``v1/<kernel>/<variant>-<key16>/<toolchain>``),
    sorted by kernel and variant; entries whose record cannot be read are skipped."""
    base = (root if root is not None else cache_dir()) / LAYOUT
    if not base.is_dir():
        return
    for kernel_dir in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for key_dir in sorted(p for p in kernel_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            variant, _, key16 = key_dir.name.rpartition("-")
            for build_dir in sorted(p for p in key_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                try:
                    meta = json.loads((build_dir / "meta.json").read_text())
                except (OSError, ValueError):
                    continue
                yield Published(kernel_dir.name, variant, key16, build_dir.name, build_dir, meta)


def remove_tree(path: Path) -> bool:
    """Delete a cache subtree: renamed aside first (one atomic step, so no reader finds it half
    deleted), then removed. False when it did not exist."""
    if not path.exists():
        return False
    trash = path.parent / f".trash-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)
    return True


def clear(kernel: str | None = None, root: Path | None = None) -> int:
    """Remove every published build (or those of ``kernel``) and the kept failures; returns the
    number of builds removed. Locks and the toolchain registry stay."""
    base = (root if root is not None else cache_dir()) / LAYOUT
    removed = sum(1 for p in iter_published(root) if kernel is None or p.kernel == _readable(kernel))
    if not base.is_dir():
        return 0
    if kernel is None:
        # Locks and builds in progress belong to running processes; everything else goes.
        targets = [p for p in base.iterdir() if p.name not in (".locks", ".staging")]
    else:
        name = _readable(kernel)
        failed = base / ".failed"
        targets = [base / name] + (sorted(failed.glob(f"{name}-*")) if failed.is_dir() else [])
    for target in targets:
        if target.is_dir():
            remove_tree(target)
        elif target.exists():
            target.unlink()
    return removed
