"""Inspect or clear kernkit's on-disk cache of built specializations ($KERNKIT_CACHE_DIR, default
~/.cache/kernkit).

`cache` or `cache list` prints one line per published build (specialization, backend,
architecture, size, age) and a total. `cache clear` removes every build and kept failure;
`cache clear --kernel NAME` only those of one kernel. Locks and builds in progress are left
alone. The builds are all the cache holds: a cleared kernel simply compiles again when used.

`cache prune --keep N` keeps each kernel's newest N builds, `--older-than DATE|DAYS` removes the
builds made before. `cache export FILE [--manifest M]` writes every build, or those of a manifest
(KERNKIT_RECORD), to one .tar.gz; `cache import FILE [--arch ARCH...]` publishes each build of
such an archive after checking its library's hash, its kernkit and tvm-ffi versions, its
architecture and that the headers it was built from are this installation's, byte for byte. A
build that fails a check is refused, named, and nothing of it is published.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import tvm_ffi

from .._version import __version__
from ..jit import manifest
from ..jit.arch import ArchError, CudaArch, target_arch
from ..jit.backends import LIB_NAME, PACKAGE_ROOT
from ..jit.cache import CacheDirError, discard, file_record, find, publish, root, sha256, staging_dir

#: The archive's layout version (its ``index.json``).
ARCHIVE_FORMAT = 1


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


def published(kernel: str | None = None) -> list[tuple[Path, dict]]:
    """The published builds, ``<cache>/v2/<name>/<args>-<key16>/<build12>/``.

    Parameters
    ----------
    kernel
        Only this kernel's (the first element of its marker, e.g. ``scale``); default: all.

    Returns
    -------
    ``(build directory, its meta.json record)`` pairs, sorted by path.
    """
    builds = []
    for meta in sorted(root().glob("[!.]*/[!.]*/[!.]*/meta.json")):  # not .locks, .staging, .failed
        if kernel is None or meta.parents[2].name == kernel:
            try:
                builds.append((meta.parent, json.loads(meta.read_bytes())))
            except (OSError, ValueError):  # being removed
                pass
    return builds


def clear(kernel: str | None = None) -> int:
    """Remove the published builds and kept failures (``.failed/<name>-<key16>``) of ``kernel``,
    or all of them; ``.locks`` and ``.staging`` (builds in progress) stay.

    Returns
    -------
    The number of published builds removed.
    """
    top = root()
    count = len(published(kernel))
    kernels = [p for p in top.iterdir() if p.is_dir() and not p.name.startswith(".")] if top.is_dir() else []
    failed = list((top / ".failed").iterdir()) if (top / ".failed").is_dir() else []
    for path in kernels + failed:
        if kernel is None or (path.name if path in kernels else path.name.rsplit("-", 1)[0]) == kernel:
            discard(path)
    return count


def prune(keep: int | None = None, before: float | None = None) -> int:
    """Remove published builds: each kernel's beyond its newest ``keep``, and any built before
    ``before`` (seconds since the epoch). Builds in progress and locks stay.

    Returns
    -------
    The number of builds removed.
    """
    by_kernel: dict[str, list[tuple[float, Path]]] = {}
    for path, meta in published():
        by_kernel.setdefault(path.parent.parent.name, []).append((meta.get("built_at", 0), path))
    removed = 0
    for builds in by_kernel.values():
        builds.sort(reverse=True)
        for rank, (built_at, path) in enumerate(builds):
            if (keep is not None and rank >= keep) or (before is not None and built_at < before):
                discard(path)
                removed += 1
    return removed


def parse_date(text: str) -> float:
    """``2026-11-01`` (midnight, local time) or a number of days ago, as seconds since the epoch."""
    try:
        return time.time() - float(text) * 86400
    except ValueError:
        pass
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d"))
    except ValueError:
        raise ArchiveError(f"--older-than takes a date (2026-11-01) or a number of days, got {text!r}") from None


class ArchiveError(ValueError):
    """An archive cannot be written or read as asked (not an archive, a manifest build missing)."""


def export_builds(archive: Path, manifest_file: str | None = None) -> int:
    """Write the published builds (their library and record), or those a manifest names, to one
    ``.tar.gz`` with an index of what each member is.

    Returns
    -------
    The number of builds written. Raises ``ArchiveError`` when a manifest's build is not in the
    cache, naming it.
    """
    if manifest_file is None:
        builds = published()
    else:
        builds = []
        for spec in manifest.specs(manifest_file):
            lib = find(spec.key_dir, None)
            if lib is None:
                raise ArchiveError(f"{spec.label} (from {manifest_file}) is not built in {root()}: run "
                                   f"`python -m kernkit.jit warmup --manifest {manifest_file}` first")
            builds.append((lib.parent, json.loads((lib.parent / "meta.json").read_bytes())))
    index = [{"dir": path.relative_to(root()).as_posix(), "title": meta["title"], "sha256": meta["lib"]["sha256"]}
             for path, meta in builds]
    tmp = archive.with_name(f".{archive.name}.{os.getpid()}")
    with tarfile.open(tmp, "w:gz") as tar:
        data = json.dumps({"format": ARCHIVE_FORMAT, "builds": index}).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path, _ in builds:
            for name in (LIB_NAME, "meta.json"):
                tar.add(path / name, f"{path.relative_to(root()).as_posix()}/{name}")
    os.replace(tmp, archive)
    return len(builds)


def import_builds(archive: Path, archs: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Publish the builds of an archive into the cache, each only after ``_check_member`` passes
    (hash, versions, architecture from ``archs`` or the target's when one is known, headers), with
    the same atomic publish as a compile; a build that fails is not published and nothing of it
    remains.

    Returns
    -------
    ``(published, refused)``: titles, and one line per refused member naming it and why.
    """
    if archs:
        allowed = {str(CudaArch.parse(a)) for a in archs}
    else:
        try:
            allowed = {str(target_arch())}
        except ArchError:
            allowed = None  # no GPU and no KERNKIT_CUDA_ARCH: any architecture
    try:
        tar = tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as e:
        raise ArchiveError(f"cannot read the archive {archive}: {e}") from None
    done, refused = [], []
    with tar:
        try:
            head = json.loads(tar.extractfile("index.json").read())
            index = head["builds"]
        except (KeyError, AttributeError, TypeError, ValueError, tarfile.TarError) as e:
            raise ArchiveError(f"{archive} is not a kernkit cache archive (no readable index.json: {e})") from None
        if head.get("format") != ARCHIVE_FORMAT:
            raise ArchiveError(f"{archive} is a kernkit cache archive of format {head.get('format')!r}; this "
                               f"kernkit reads format {ARCHIVE_FORMAT}")
        for entry in index:
            staging = None
            try:
                staging = staging_dir(str(entry.get("sha256", "import"))[:16])
                meta = _check_member(tar, entry, staging, allowed)
                publish(staging, root() / entry["dir"], meta)
                done.append(entry["title"])
            except CacheDirError as e:  # no member can be published: stop, saying why
                raise ArchiveError(f"cannot import {archive}: {e}") from None
            except (KeyError, TypeError, ValueError, OSError, tarfile.TarError) as e:
                refused.append(f"{entry.get('dir')} ({entry.get('title')}): {e}")
            finally:
                if staging is not None:  # gone once published; else what was extracted
                    discard(staging)
    return done, refused


def _check_member(tar: tarfile.TarFile, entry: dict, staging: Path, allowed: set[str] | None) -> dict:
    """Extract one build of the archive into ``staging`` and return the record to publish it
    with; raises ``ValueError`` saying which check failed: the library's sha256 is its record's,
    the record's kernkit and tvm-ffi versions are these, its architecture is ``allowed``, and each
    header it was built from is, byte for byte, this installation's (kernkit's own are looked up
    here, wherever kernkit is installed)."""
    member = entry["dir"]
    if member.startswith("/") or ".." in member.split("/") or member.count("/") != 2:
        raise ValueError("its path is not a build directory of a cache")
    for name in (LIB_NAME, "meta.json"):
        with tar.extractfile(f"{member}/{name}") as src, open(staging / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    meta = json.loads((staging / "meta.json").read_bytes())
    (staging / "meta.json").unlink()  # publish writes the record anew
    digest = sha256(staging / LIB_NAME)
    if digest != meta["lib"]["sha256"] or digest != entry["sha256"]:
        raise ValueError(f"{LIB_NAME} does not match its recorded sha256 (truncated or altered)")
    if (meta["kernkit"], meta["tvm_ffi"]) != (__version__, tvm_ffi.__version__):
        raise ValueError(f"built by kernkit {meta['kernkit']} with tvm-ffi {meta['tvm_ffi']}; this is "
                         f"kernkit {__version__} with tvm-ffi {tvm_ffi.__version__}")
    if meta.get("arch") and allowed is not None and meta["arch"] not in allowed:
        raise ValueError(f"built for {meta['arch']}, not for {', '.join(sorted(allowed))}")
    deps = []
    for dep in meta["deps"]:
        path = Path(dep[0])
        if meta.get("package") and Path(meta["package"]) in path.parents:
            path = PACKAGE_ROOT / path.relative_to(meta["package"])
        here = file_record(path) if path.is_file() else None
        if here is None or here[-1] != dep[-1]:
            raise ValueError(f"it was built from {dep[0]}, which {'differs' if here else 'is missing'} here ({path})")
        deps.append(here)
    return {**meta, "deps": deps, "imported": True}


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def run(args: argparse.Namespace) -> int:
    """The ``cache`` subcommand: ``list`` (the default), ``clear [--kernel NAME]``, ``prune``,
    ``export`` or ``import``; returns 1 when an import refused a build, else 0."""
    if args.action == "prune":
        if args.keep is None and args.older_than is None:
            raise ArchiveError("cache prune needs --keep N or --older-than DATE")
        if args.keep is not None and args.keep < 0:
            raise ArchiveError(f"--keep takes a count >= 0, got {args.keep}")
        n = prune(args.keep, parse_date(args.older_than) if args.older_than else None)
        print(f"removed {n} build{'s' * (n != 1)} from {root()}")
        return 0
    if args.action == "export":
        n = export_builds(Path(args.archive), args.manifest)
        print(f"wrote {n} build{'s' * (n != 1)} to {args.archive}")
        return 0
    if args.action == "import":
        done, refused = import_builds(Path(args.archive), args.arch)
        for line in refused:
            print(f"REFUSED {line}")
        print(f"imported {len(done)} build{'s' * (len(done) != 1)} into {root()}, refused {len(refused)}")
        return 1 if refused else 0
    if args.action == "clear":
        n = clear(args.kernel)
        print(f"removed {n} build{'s' * (n != 1)}{f' of {args.kernel}' if args.kernel else ''} from {root()}")
        return 0
    now, total = time.time(), 0
    rows = [("SPECIALIZATION", "BACKEND", "ARCH", "SIZE", "AGE")]
    for path, meta in published():
        size = tree_size(path)
        total += size
        rows.append((meta.get("title", path.parent.parent.name), meta.get("backend") or "c++",
                     meta.get("arch") or "-", human_size(size), _age(now - meta.get("built_at", now))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows if len(rows) > 1 else []:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"{len(rows) - 1} build{'s' * (len(rows) != 2)}, {human_size(total)}, in {root()}")
    return 0
