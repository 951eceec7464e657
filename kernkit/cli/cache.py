"""List, clear, prune, export and import kernkit's on-disk cache of built specializations
($KERNKIT_CACHE_DIR, default ~/.cache/kernkit).

`cache` or `cache list` prints one line per published build (specialization, backend, with
`sanitize=...` for a build made with sanitizers such as KERNKIT_EMU_SANITIZE's, architecture,
size, age) and a total, for the local cache and for each read-only cache of
$KERNKIT_CACHE_SHARED (which loads search first). A cache that holds more than its builds gets
one more line: its precompiled headers, prebuilt helper objects and kept failures, and the size
of the whole cache, the size `doctor` reports. `cache clear` removes every build and kept
failure; `cache clear --kernel NAME` only those of one kernel. Locks and builds in progress are
left alone. Nothing else in the cache decides a load: a cleared kernel simply compiles again
when used.

`cache prune --keep N` keeps each kernel's newest N builds, `--older-than DATE|DAYS` removes the
builds made before. `cache export FILE [--manifest M]` writes every build of the local cache,
or those of a manifest (KERNKIT_RECORD) wherever loads find them ($KERNKIT_CACHE_SHARED first),
to one .tar.gz: a regular FILE is replaced whole (a link's target is updated), a FIFO or
/dev/stdout is written through. `cache import FILE [--arch ARCH...]` publishes each
build of such an archive after checking its library's hash, its kernkit and tvm-ffi versions,
its architecture, that its directory is the one its recorded build request keys to, and that the
headers it was built from are this installation's, byte for byte (those of a user's project,
recorded relative to its kernel root, are compared by each load, wherever the project is). A
build that fails a check is refused, named, and nothing of it is published; one the cache holds
already is counted as already present. Every build's record is checked before any build is
published. An archive that is not one kernkit wrote (a bad index, a member that is not a plain
file, a member larger than a build's can be, a truncated file) is refused whole, before anything
is written. An archive is code: `--expect-sha256 HEX` imports only the archive whose SHA-256 is
the one `cache export` printed on the build box.

An archive also carries the local cache's tuning tables (`v2/tuning/<op>/<device>.json`, which
`tune` writes), so that a deployment picks the tuned builds the archive holds. A table is data:
import checks it whole (`tuning.check_table`, within the limits of JSON from elsewhere) and
writes it in place of the local table of the same name, or refuses it by name. `cache clear`
and `prune` leave the tables alone: they are measurements, not builds.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import re
import sys
import tarfile
import time
import zlib
from pathlib import Path
from typing import IO, BinaryIO

import tvm_ffi

from .._version import __version__
from ..jit import ArchError, CacheDirError, CudaArch, JitSpec, maker, pch, prebuilt, target_arch
from ..jit.cache import LAYOUT as CACHE_LAYOUT
from ..jit.cache import CorruptBuildError, check_record, file_record, local_path, read_build, staging_dir
from ..jit.cache import discard as discard_build
from ..jit.cache import publish as publish_build
from ..jit.cache import root as cache_root
from ..jit.cache import sha256 as file_sha256
from ..jit.config import SHARED_VAR, shared_entries
from ..jit.paths import LIB_NAME
from ..jit.tuning import check_table, declared
from ..jit.untrusted import MAX_JSON_BYTES, parse_json
from . import output, replay

#: The archive's layout version (its ``index.json``); 2 added the tuning tables.
ARCHIVE_FORMAT = 2

#: The layouts this kernkit reads: format 1 is format 2 without tables.
_READS = (1, 2)

#: The folder of the cache's ``v2`` that holds the tuning tables.
TUNING = "tuning"

#: One part of a build directory ``<name>/<args>-<key16>/<build12>`` as ``JitSpec.key_dir``
#: names it: no separator, no dot part, nothing hidden (``.locks``, ``.staging``).
_PART = re.compile(r"[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: A table's member, ``tuning/<op>/<name>.json``: the op a dotted name, the file a plain name.
_TABLE = re.compile(r"tuning/[A-Za-z_][A-Za-z0-9_.]*/[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]*\.json")

#: The most bytes a build's library may have in an archive, far above any build's (a few MiB):
#: a member claiming more is refused before any of it is read or written.
MAX_LIB_BYTES = 1 << 30


def human_size(n: float) -> str:
    """``n`` bytes as ``512 B``, ``4.0 KiB``... ``1.2 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def tree_size(path: Path) -> int:
    """Bytes of the files under ``path``; 0 when it does not exist."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def published(kernel: str | None = None, top: Path | None = None) -> list[tuple[Path, dict]]:
    """The published builds, ``<cache>/v2/<name>/<args>-<key16>/<build12>/``.

    Parameters
    ----------
    kernel
        Only this kernel's (the first element of its marker, e.g. ``scale``); default: all.
    top
        The ``v2`` directory of the cache to read (``shared_roots()``); default: ``cache_root()``.

    Returns
    -------
    ``(build directory, its meta.json record)`` pairs, sorted by path. A damaged build (its record
    unreadable or of the wrong types, its library missing or altered) is named on stderr and
    left out.
    """
    builds = []
    for meta in sorted((top or cache_root()).glob("[!.]*/[!.]*/[!.]*/meta.json")):  # not .locks, .staging, .failed
        if kernel is None or meta.parents[2].name == kernel:
            try:
                record = read_build(meta.parent)
            except CorruptBuildError as e:
                print(f"kernkit: skipped a damaged build: {printable(str(e))}", file=sys.stderr)
                continue
            if record is not None:  # None: being removed
                builds.append((meta.parent, record))
    return builds


def shared_roots() -> list[Path]:
    """The ``v2`` directories of the read-only caches of ``KERNKIT_CACHE_SHARED``, in search order."""
    return [d.absolute() / CACHE_LAYOUT for d in shared_entries()]


def clear(kernel: str | None = None) -> tuple[int, list[Path]]:
    """Remove the published builds and kept failures (``.failed/<name>-<key16>``) of ``kernel``,
    or all of them; ``.locks`` and ``.staging`` (builds in progress) stay.

    Returns
    -------
    ``(removed, left)``: the number of published builds removed, and the directories (builds,
    kept failures) that could not be removed (a read-only cache).
    """
    top = cache_root()
    builds = [path for path, _ in published(kernel)]
    kernels = [p for p in top.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != TUNING
               ] if top.is_dir() else []
    failed = list((top / ".failed").iterdir()) if (top / ".failed").is_dir() else []
    kept_failures = []
    for path in kernels + failed:
        if kernel is None or (path.name if path in kernels else path.name.rsplit("-", 1)[0]) == kernel:
            if not discard_build(path) and path in failed:
                kept_failures.append(path)
    left = [b for b in builds if os.path.lexists(b)]
    return len(builds) - len(left), left + kept_failures


def prune(keep: int | None = None, before: float | None = None) -> tuple[int, list[Path]]:
    """Remove published builds: each kernel's beyond its newest ``keep``, and any built before
    ``before`` (seconds since the epoch). Builds in progress and locks stay.

    Returns
    -------
    ``(removed, left)``: the number of builds removed, and those that could not be (a
    read-only cache).
    """
    by_kernel: dict[str, list[tuple[float, Path]]] = {}
    for path, meta in published():
        by_kernel.setdefault(path.parent.parent.name, []).append((meta.get("built_at", 0), path))
    removed, left = 0, []
    for builds in by_kernel.values():
        builds.sort(reverse=True)
        for rank, (built_at, path) in enumerate(builds):
            if (keep is not None and rank >= keep) or (before is not None and built_at < before):
                if discard_build(path):
                    removed += 1
                else:
                    left.append(path)
    return removed, left


def parse_date(text: str) -> float:
    """``2026-11-01`` (midnight, local time) or a number of days ago (finite, >= 0), as seconds
    since the epoch."""
    try:
        days = float(text)
    except ValueError:
        days = None
    if days is not None and math.isfinite(days) and days >= 0:
        return time.time() - days * 86400
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d"))
    except ValueError:
        raise ArchiveError(f"--older-than takes a date (2026-11-01) or a number of days >= 0, got {text!r}") from None


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a terminal's escape sequences, a
    newline) written as its Python escape, for a line that names what an archive or a record
    says."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ArchiveError(ValueError):
    """An archive cannot be written or read as asked (not an archive, a manifest build missing)."""


def export_builds(archive: Path, manifest_file: str | None = None) -> int:
    """Write the published builds (their library and record) of the local cache, or those a
    manifest names wherever a load finds them (the shared caches of ``KERNKIT_CACHE_SHARED``
    first, then the local one), and the local cache's tuning tables, to one ``.tar.gz`` with an
    index of what each member is.
    ``archive`` is written as ``output.written`` says: a regular file replaced whole, a link's
    target updated, a FIFO or ``/dev/stdout`` written through.

    Returns
    -------
    The number of builds written. Raises ``ArchiveError`` when a manifest's build is not in the
    caches, naming it, or when the archive cannot be written; nothing is left behind then.
    """
    return _export(archive, manifest_file)[0]


class _Hashing(io.RawIOBase):
    """A writer that passes what it is given on to ``out`` and hashes it (SHA-256)."""

    def __init__(self, out: BinaryIO) -> None:
        super().__init__()
        self.out, self.hash = out, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.hash.update(data)
        return self.out.write(data)


def _export(archive: Path, manifest_file: str | None = None) -> tuple[int, str]:
    """``export_builds``, also returning the archive's SHA-256, hashed as it is written (a FIFO
    cannot be read back)."""
    if manifest_file is None:
        builds = published()
    else:
        builds = []
        for spec in replay.specs(manifest_file):
            lib = spec.cached()
            record = read_build(lib.parent) if lib is not None else None
            if lib is None or record is None:
                caches = ", ".join(map(str, [*shared_roots(), cache_root()]))
                raise ArchiveError(f"{spec.label} (from {manifest_file}) is not built in {caches}: run "
                                   f"`python -m kernkit.jit warmup --manifest {manifest_file}` first")
            builds.append((lib.parent, record))
    # A build's directory in the archive is its path under its cache's v2, whichever cache it is in.
    index = [{"dir": "/".join(path.parts[-3:]), "title": meta["title"], "sha256": meta["lib"]["sha256"]}
             for path, meta in builds]
    tables = {f"{TUNING}/{p.parent.name}/{p.name}": p.read_bytes() for p in local_tables()}
    try:
        with output.written(archive) as out:
            hashing = _Hashing(out)
            with tarfile.open(fileobj=hashing, mode="w|gz") as tar:
                head = {"format": ARCHIVE_FORMAT, "builds": index,
                        "tables": [{"path": n, "sha256": hashlib.sha256(d).hexdigest()} for n, d in tables.items()]}
                for name, data in {"index.json": json.dumps(head).encode(), **tables}.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                for (path, _), entry in zip(builds, index, strict=True):
                    for name in (LIB_NAME, "meta.json"):
                        tar.add(path / name, f"{entry['dir']}/{name}")
    except OSError as e:
        raise ArchiveError(f"cannot write the archive {archive}: {e.strerror or e}") from None
    return len(builds), hashing.hash.hexdigest()


def local_tables() -> list[Path]:
    """The tuning tables of the local cache, ``v2/tuning/<op>/<name>.json`` (regular files whose
    names an archive can hold), sorted."""
    return [p for p in sorted((cache_root() / TUNING).glob("*/*.json"))
            if p.is_file() and _TABLE.fullmatch(f"{TUNING}/{p.parent.name}/{p.name}")]


def import_builds(archive: Path, archs: list[str] | None = None,
                  expect_sha256: str | None = None) -> tuple[list[str], list[str], list[str]]:
    """Publish the builds of an archive into the cache, with the same atomic publish as a
    compile, and write its tuning tables. The archive is checked whole first (``_read_archive``:
    nothing is written for one that fails), then every build's record (``_claim``) and every
    table (``_table``), before anything is written; then each build is published only after
    ``_check_member`` passes, and a build that fails is not published and nothing of it remains.
    A table takes the place of the local cache's table of the same name.

    Parameters
    ----------
    archive
        A ``.tar.gz`` that ``export_builds`` wrote.
    archs
        The architectures to accept (``9.0``...); default: the target's when one is known, else any.
    expect_sha256
        The SHA-256 (64 hex digits) the archive must have, as ``cache export`` printed it; an
        archive of another hash is refused whole.

    Returns
    -------
    ``(published, refused, tables)``: the builds' titles, one line per refused member naming it
    and why, and the tables written (``<op>/<name>.json``). Raises ``ArchiveError`` for an
    archive refused whole.

    Example
    -------
    >>> import_builds(Path("kernels.tar.gz"), ["9.0"], expect_sha256="3f9a...")  # doctest: +SKIP
    (['scale<fp32_t, false>'], [], ['rmsnorm/nvidia-h200-sm9-0.json'])
    """
    if expect_sha256 is not None and not _SHA256.fullmatch(expect_sha256):
        raise ArchiveError(f"--expect-sha256 takes 64 hex digits (lower case), got {expect_sha256!r}")
    if archs:
        allowed = {str(CudaArch.parse(a)) for a in archs}
    else:
        try:
            allowed = {str(target_arch())}
        except ArchError:
            allowed = None  # no GPU and no KERNKIT_CUDA_ARCH: any architecture
    tar, index, listed_tables, files = _read_archive(archive, expect_sha256)
    done, refused = [], []
    with tar:
        claims = {}
        for entry in index:
            try:
                claims[entry["dir"]] = _claim(tar, files, entry["dir"])
            except _UNREADABLE as e:
                refused.append(f"{entry['dir']} ({entry['title']}): {e}")
        tables = {}
        for entry in listed_tables:
            try:
                tables[entry["path"]] = _table(tar, files[entry["path"]], entry["sha256"])
            except _UNREADABLE as e:
                refused.append(f"{entry['path']}: {e}")
        for entry in index:
            if entry["dir"] not in claims:
                continue
            staging = None
            try:
                staging = staging_dir(entry["sha256"][:16])
                meta = _check_member(tar, files, entry, staging, allowed, claims[entry["dir"]])
                publish_build(staging, cache_root() / entry["dir"], meta)
                done.append(entry["title"])
            except CacheDirError as e:  # no member can be published: stop, saying why
                raise ArchiveError(f"cannot import {archive}: {e}") from None
            except _UNREADABLE as e:
                refused.append(f"{entry['dir']} ({entry['title']}): {e}")
            finally:
                if staging is not None:  # gone once published; else what was extracted
                    discard_build(staging)
    for name, data in tables.items():
        path = cache_root().joinpath(*name.split("/"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with output.written(path) as f:
                f.write(data)
        except OSError as e:
            raise ArchiveError(f"cannot import {archive}: cannot write {path}: {e.strerror or e}") from None
    return done, refused, [n.removeprefix(f"{TUNING}/") for n in tables]


def _table(tar: tarfile.TarFile, info: tarfile.TarInfo, sha256: str) -> bytes:
    """The bytes of the table member ``info`` if they hash to the index's ``sha256`` and hold a
    whole table of the op its folder names (``tuning.check_table``: of that op's declared
    tunable, or, for an op not declared here, its structure); else ``ValueError`` saying why."""
    data = _member_data(tar, info).read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError("it does not match its sha256 in the index (altered)")
    op = info.name.split("/")[1]
    import kernkit.ops  # noqa: F401  (declares kernkit's tunables)

    table = check_table(parse_json(data), {t.name: t for t in declared()}.get(op))
    if table["op"] != op:
        raise ValueError(f"it is a table of {table['op']!r}, in the folder of {op!r}")
    return data


#: What reading an archive's member or checking a build of it raises: that build is refused.
_UNREADABLE = (ValueError, OSError, EOFError, zlib.error, tarfile.TarError)


def _read_archive(archive: Path, expect_sha256: str | None
                  ) -> tuple[tarfile.TarFile, list[dict], list[dict], dict[str, tarfile.TarInfo]]:
    """The archive, read whole (so a truncated one fails here) and checked whole before anything
    is written: its SHA-256 is ``expect_sha256`` when given; its members are plain regular files
    no larger than they can be (``_member_problem``, checked as each is listed, before tarfile
    reads past it), each once: ``index.json`` and, for each of its entries, ``<dir>/lib.so`` and
    ``<dir>/meta.json``, and the member of each of its tables, nothing else; the index is JSON
    (``untrusted.parse_json``), each build entry is ``{"dir", "title", "sha256"}``, strings,
    with ``dir`` a build directory ``<name>/<args>-<key16>/<build12>`` of plain names
    (``_PART``) and ``sha256`` 64 hex digits, and each table entry is ``{"path", "sha256"}``
    with ``path`` ``tuning/<op>/<name>.json`` (``_TABLE``).

    Returns
    -------
    ``(tar, builds, tables, members)``: the open archive, the index's build and table entries,
    its members by name.
    Raises ``ArchiveError`` saying why it is not a kernkit cache archive.
    """
    try:
        data = archive.read_bytes()
    except OSError as e:
        raise ArchiveError(f"cannot read the archive {archive}: {e.strerror or e}") from None
    if expect_sha256 is not None and hashlib.sha256(data).hexdigest() != expect_sha256:
        raise ArchiveError(f"{archive} has SHA-256 {hashlib.sha256(data).hexdigest()}, not the expected "
                           f"{expect_sha256}: nothing imported")

    def refuse(why: str) -> ArchiveError:
        return ArchiveError(f"{archive} is not a kernkit cache archive: {why}")

    files: dict[str, tarfile.TarInfo] = {}
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*", tarinfo=_Header)
        for m in tar:  # one at a time: a member is checked before tarfile skips over its data
            problem = _member_problem(m)
            if problem:
                raise refuse(f"its member {m.name!r} {problem}")
            if m.name in files:
                raise refuse(f"its member {m.name!r} appears twice")
            files[m.name] = m
        index = _member_data(tar, files["index.json"]).read() if "index.json" in files else None
    except (EOFError, OSError, zlib.error, tarfile.TarError) as e:
        raise refuse(f"not a readable tar file, or truncated ({type(e).__name__}: {e})") from None
    except _HeaderTooBig as e:
        raise refuse(str(e)) from None
    if index is None:
        raise refuse("it has no index.json")
    try:
        head = parse_json(index)
    except ValueError as e:
        raise refuse(f"its index.json cannot be read ({e})") from None
    if type(head) is not dict or type(head.get("builds")) is not list:
        raise refuse("its index.json is not an object with a list 'builds'")
    if head.get("format") not in _READS or type(head.get("format")) is not int:
        raise ArchiveError(f"{archive} is a kernkit cache archive of format {head.get('format')!r}; this "
                           f"kernkit reads formats {' and '.join(map(str, _READS))}")
    tables = head.get("tables", [])
    if type(tables) is not list:
        raise refuse("its index.json's 'tables' is not a list")
    listed = {"index.json"}
    for i, entry in enumerate(head["builds"], 1):
        if type(entry) is not dict or not all(type(entry.get(f)) is str for f in ("dir", "title", "sha256")):
            raise refuse(f"entry {i} of its index is not an object of strings 'dir', 'title' and 'sha256'")
        parts = entry["dir"].split("/")
        if len(parts) != 3 or not all(_PART.fullmatch(p) for p in parts):
            raise refuse(f"entry {i}'s dir {entry['dir']!r} is not a build directory <name>/<args>-<key16>/<build>")
        if not _SHA256.fullmatch(entry["sha256"]):
            raise refuse(f"entry {i}'s sha256 {entry['sha256']!r} is not 64 hex digits")
        for name in (f"{entry['dir']}/{LIB_NAME}", f"{entry['dir']}/meta.json"):
            if name not in files or name in listed:
                raise refuse(f"entry {i}'s {name} is {'listed twice' if name in listed else 'missing'}")
            listed.add(name)
    for i, entry in enumerate(tables, 1):
        if type(entry) is not dict or set(entry) != {"path", "sha256"} or not all(
                type(v) is str for v in entry.values()):
            raise refuse(f"table {i} of its index is not an object of strings 'path' and 'sha256'")
        if not _TABLE.fullmatch(entry["path"]) or not _SHA256.fullmatch(entry["sha256"]):
            raise refuse(f"table {i}'s path {entry['path']!r} is not tuning/<op>/<name>.json, or its sha256 "
                         f"is not 64 hex digits")
        if entry["path"] not in files or entry["path"] in listed:
            raise refuse(f"table {i}'s {entry['path']} is {'listed twice' if entry['path'] in listed else 'missing'}")
        listed.add(entry["path"])
    if len(files) > len(listed):
        raise refuse(f"its member {sorted(set(files) - listed)[0]!r} is in no entry of its index")
    return tar, head["builds"], tables, files


#: The most bytes an extended header (a long name, pax records) of an archive member may claim.
_MAX_HEADER_BYTES = 1 << 20
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)


class _HeaderTooBig(Exception):
    """An extended header that claims more than ``_MAX_HEADER_BYTES`` (not a ``tarfile.ReadError``,
    which ``tarfile.open`` would take as a sign to try another compression)."""


class _Header(tarfile.TarInfo):
    """A member's header as ``_read_archive`` reads it. tarfile reads an extended header into
    memory whole, as large as it claims, before it returns the member it belongs to: a header
    claiming a terabyte raised ``MemoryError``. One claiming more than ``_MAX_HEADER_BYTES`` is
    refused before it is read."""

    def _proc_member(self, tarfile):  # where tarfile lets a subclass handle a header its own way
        if self.type in _EXTENDED and self.size > _MAX_HEADER_BYTES:
            raise _HeaderTooBig(f"a header of its claims {self.size} bytes, more than the "
                                f"{human_size(_MAX_HEADER_BYTES)} one can be")
        # A private method of TarInfo, which typeshed does not declare.
        return super()._proc_member(tarfile)  # type: ignore[misc]


def _member_problem(m: tarfile.TarInfo) -> str | None:
    """Why the member ``m`` cannot be one ``export_builds`` wrote, or None. It must be a plain
    regular file: not a link, device or directory, nor a sparse file, whose holes tarfile writes
    out as zeros, however few bytes the archive holds (a 2 KB archive could fill the disk). And
    it must be no larger than it can be: ``MAX_JSON_BYTES`` for the index, a record and a
    table, ``MAX_LIB_BYTES`` for a library."""
    if m.issparse():
        return "is a sparse file"
    if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        return "is not a regular file"
    limit = MAX_LIB_BYTES if m.name.endswith(f"/{LIB_NAME}") else MAX_JSON_BYTES
    if m.size > limit:
        return f"holds {m.size} bytes, more than the {human_size(limit)} it can be"
    return None


def _member_data(tar: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    """The data of the member ``info``, to read; ``tarfile.ExtractError`` for a member that has
    none (``extractfile`` gives None for one that is not a regular file or a link, which
    ``_member_problem`` refuses as it lists the members)."""
    data = tar.extractfile(info)
    if data is None:
        raise tarfile.ExtractError(f"its member {info.name!r} is not a regular file")
    return data


def _record(tar: tarfile.TarFile, files: dict[str, tarfile.TarInfo], member: str) -> dict:
    """The record (``meta.json``) of the build at ``member``: JSON within the limits of
    ``untrusted.parse_json`` (its size is bounded by ``_member_problem``) and of the types
    ``check_record`` asks; else ``ValueError`` saying why."""
    try:
        value = parse_json(_member_data(tar, files[f"{member}/meta.json"]).read())
    except ValueError as e:
        raise ValueError(f"its meta.json cannot be read ({e})") from None
    return check_record(value)


def _claim(tar: tarfile.TarFile, files: dict[str, tarfile.TarInfo], member: str) -> int:
    """The size of the library of the build at ``member``, as its record (``_record``) gives it
    and its member in the archive holds; else ``ValueError``. It reads no library: every build's
    record is checked this way before any build is written."""
    claim, size = _record(tar, files, member)["lib"]["size"], files[f"{member}/{LIB_NAME}"].size
    if claim != size:
        raise ValueError(f"its {LIB_NAME} holds {size} bytes, and its record says {claim} (truncated or altered)")
    return size


def _extract(tar: tarfile.TarFile, info: tarfile.TarInfo, target: Path, claim: int) -> None:
    """Write the member ``info`` to ``target``, stopping with ``ValueError`` before it writes a
    byte beyond the ``claim`` its record makes, whatever the archive says it holds."""
    with _member_data(tar, info) as src, open(target, "wb") as dst:
        left = claim
        while block := src.read(min(left + 1, 1 << 20)):
            if len(block) > left:
                raise ValueError(f"its {Path(info.name).name} holds more than the {claim} bytes its record says")
            dst.write(block)
            left -= len(block)


def _check_member(tar: tarfile.TarFile, files: dict[str, tarfile.TarInfo], entry: dict, staging: Path,
                  allowed: set[str] | None, claim: int) -> dict:
    """Extract the library of one build of the archive into ``staging``, at most the ``claim``
    bytes its record makes (``_extract``), and return the record to publish it with; raises
    ``ValueError`` saying which check failed: the record is readable (``_record``), the
    library's sha256 is its record's, the record's kernkit and tvm-ffi versions are these, its
    architecture is ``allowed``, its directory is the key directory of the build request it
    records (the key recomputed here, so a build placed under another key is refused), and each
    header it was built from is, byte for byte, this installation's (kernkit's own are looked up
    here, wherever kernkit is installed). A header recorded relative to the kernel root of the
    user's project is kept as recorded: the project may be anywhere, and each load compares it,
    by SHA-256, with the file under the root of the spec it loads for."""
    member = entry["dir"]
    _extract(tar, files[f"{member}/{LIB_NAME}"], staging / LIB_NAME, claim)
    meta = _record(tar, files, member)
    digest = file_sha256(staging / LIB_NAME)
    if digest != meta["lib"]["sha256"] or digest != entry["sha256"]:
        raise ValueError(f"{LIB_NAME} does not match its recorded sha256 (truncated or altered)")
    if (meta["kernkit"], meta["tvm_ffi"]) != (__version__, tvm_ffi.__version__):
        raise ValueError(f"built by kernkit {meta['kernkit']} with tvm-ffi {meta['tvm_ffi']}; this is "
                         f"kernkit {__version__} with tvm-ffi {tvm_ffi.__version__}")
    if meta.get("arch") and allowed is not None and meta["arch"] not in allowed:
        raise ValueError(f"built for {meta['arch']}, not for {', '.join(sorted(allowed))}")
    _bind(member, meta)
    if not meta["deps"]:
        raise ValueError("its record lists no header it was built from")
    deps = []
    for dep in meta["deps"]:
        if not dep[0].startswith("/"):  # under the kernel root (check_record: it cannot leave it)
            if not meta["request"].get("kernel_root"):
                raise ValueError(f"it names the header {dep[0]!r} relative to a kernel root its build request lacks")
            deps.append(dep)
            continue
        path = local_path(dep[0], meta.get("package"))
        here = file_record(path) if path.is_file() else None
        if here is None or here[-1] != dep[-1]:
            raise ValueError(f"it was built from {dep[0]}, which {'differs' if here else 'is missing'} here"
                             + (f" ({path})" if path != Path(dep[0]) else ""))
        deps.append(here)
    return {**meta, "deps": deps, "imported": True}


def _bind(member: str, meta: dict) -> None:
    """Raise ``ValueError`` unless the build at ``member`` (``<name>/<args>-<key16>/<build>``) is
    of the spec its record's build request makes here: that spec's key, title, backend and
    architecture are the record's, and its key directory is ``member``'s. The request's sources
    need not be here (a project's files are wherever it runs); the headers are checked after."""
    if "request" not in meta:
        raise ValueError("its record holds no build request (a build made before kernkit recorded them): "
                         "rebuild it and export it again")
    try:
        spec = JitSpec.from_request(meta["request"], check_files=False)
    except (KeyError, TypeError, ValueError, OSError, ArchError) as e:
        raise ValueError(f"its build request cannot be made here: {type(e).__name__}: {e}") from None
    where, placed = spec.key_dir.relative_to(cache_root()).as_posix(), member.rsplit("/", 1)[0]
    if (spec.key, spec.title, spec.backend, str(spec.arch) if spec.arch else None) != (
            meta["key"], meta["title"], meta.get("backend"), meta.get("arch")):
        raise ValueError(f"its record is not of the build it requests, {spec.label} key {spec.key[:16]}")
    if placed != where:
        raise ValueError(f"it is a build of {spec.label}, whose builds go in {where}, not in {placed}")


#: What a cache holds besides its builds: its folder under ``v2``, the name of one entry, and the
#: file whose presence makes an entry count (None: every entry does).
EXTRAS = (("pch", "precompiled header", pch.GCH), ("helpers", "helper object", prebuilt.OBJECT),
          (".failed", "kept failure", None))


def extras(top: Path) -> list[tuple[str, int, int]]:
    """``(name, count, bytes)`` of each kind of entry of ``EXTRAS`` that the cache ``top`` holds
    (a precompiled header or helper object counts once made; its folder's bytes count in any
    case). A folder that links to another cache (as the test suite's caches share their
    headers) is that cache's: ``tree_size`` does not follow it, and neither does this."""
    found = []
    for folder, name, product in EXTRAS:
        path = top / folder
        if path.is_symlink() or not path.is_dir():
            continue
        entries = [e for e in path.iterdir() if e.is_dir() and not e.name.startswith(".")]
        count = sum(1 for e in entries if product is None or maker.made(e, product))
        size = tree_size(path)
        if count or size:
            found.append((name, count, size))
    return found


def sanitizers(meta: dict) -> str | None:
    """The sanitizers a build was made with (``address,undefined``), from the ``-fsanitize=``
    flags its record's build request names; None for a build without."""
    request = meta.get("request")
    flags = request.get("extra_cflags") if type(request) is dict else None
    if type(flags) is not list:  # none, or not what a record holds
        return None
    return ",".join(f.split("=", 1)[1] for f in flags if type(f) is str and f.startswith("-fsanitize=")) or None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def summary(top: Path, builds: int, builds_size: int, where: str) -> list[str]:
    """The total lines of the cache ``top``: its builds, then, when it holds any of ``EXTRAS``,
    one line naming those and the size of the whole cache (``tree_size``, as ``doctor`` counts
    it), with what is neither (builds in progress, damaged builds) as ``other``."""
    lines = [f"{_count(builds, 'build')}, {human_size(builds_size)}, in {where}"]
    found = extras(top)
    if found:
        total = tree_size(top)
        rest = total - builds_size - sum(size for _, _, size in found)
        parts = [f"{_count(n, name)}, {human_size(size)}" for name, n, size in found]
        parts += [f"{human_size(rest)} other"] if rest > 0 else []
        lines.append(f"{'; '.join(parts)}; {human_size(total)} in all")
    return lines


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def _report_removal(n: int, left: list[Path], which: str) -> int:
    """Print what ``clear`` or ``prune`` removed and each directory it could not remove; the
    exit status: 1 when something could not be removed, else 0."""
    for path in left:
        print(f"NOT REMOVED {path}")
    print(f"removed {n} build{'s' * (n != 1)}{which} from {cache_root()}"
          + (f"; {len(left)} could not be removed (is the cache writable?)" if left else ""))
    return 1 if left else 0


def run(args: argparse.Namespace) -> int:
    """The ``cache`` subcommand: ``list`` (the default), ``clear [--kernel NAME]``, ``prune``,
    ``export`` or ``import``; returns 1 when an import refused a build or ``clear``/``prune``
    could not remove one, else 0."""
    if args.action == "prune":
        if args.keep is None and args.older_than is None:
            raise ArchiveError("cache prune needs --keep N or --older-than DATE")
        if args.keep is not None and args.keep < 0:
            raise ArchiveError(f"--keep takes a count >= 0, got {args.keep}")
        n, left = prune(args.keep, parse_date(args.older_than) if args.older_than else None)
        return _report_removal(n, left, "")
    if args.action == "export":
        n, digest = _export(Path(args.archive), args.manifest)
        # An archive written through to a pipe or a terminal (/dev/stdout) may be this output: the
        # line goes to stderr then, after the archive, never into it.
        print(f"wrote {n} build{'s' * (n != 1)} to {args.archive}, SHA-256 {digest} "
              f"(import it with --expect-sha256 of this)", file=sys.stderr if output.streams(Path(args.archive))
              else sys.stdout)
        return 0
    if args.action == "import":
        before = {path for path, _ in published()}
        done, refused, tables = import_builds(Path(args.archive), args.arch, args.expect_sha256)
        for line in refused:
            print(f"REFUSED {printable(line)}")
        new = len({path for path, _ in published()} - before)
        present = f" ({len(done) - new} already present)" if len(done) > new else ""
        written = f", {len(tables)} tuning table{'s' * (len(tables) != 1)}" if tables else ""
        print(f"imported {new} build{'s' * (new != 1)}{written} into {cache_root()}{present}, "
              f"refused {len(refused)}")
        return 1 if refused else 0
    if args.action == "clear":
        n, left = clear(args.kernel)
        return _report_removal(n, left, f" of {args.kernel}" if args.kernel else "")
    # The local cache, then the shared ones (KERNKIT_CACHE_SHARED), which loads search first. A
    # record's strings are anyone's who could write the cache: escaped, so none rewrites the terminal.
    now, shared = time.time(), shared_roots()
    rows = [("SPECIALIZATION", "BACKEND", "ARCH", "SIZE", "AGE", *(("CACHE",) if shared else ()))]
    totals = []
    for i, top in enumerate([cache_root(), *shared]):
        builds = published(top=top)
        total = 0
        for path, meta in builds:
            size = tree_size(path)
            total += size
            san = sanitizers(meta)
            rows.append((printable(meta.get("title", path.parent.parent.name)),
                         printable((meta.get("backend") or "c++") + (f" sanitize={san}" if san else "")),
                         printable(meta.get("arch") or "-"), human_size(size), _age(now - meta.get("built_at", now)),
                         *((f"shared {i}" if i else "local",) if shared else ())))
        where = f"shared {i}: {top} ({SHARED_VAR}, read-only)" if i else str(top)
        totals += summary(top, len(builds), total, where)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows if len(rows) > 1 else []:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print("\n".join(totals))
    return 0
