"""Manifests: the specializations a process loaded, written as build requests that another
machine can replay (``python -m kernkit.jit warmup --manifest FILE``).

A request is what ``JitSpec.make`` takes: the marker (name and template arguments), the
sources (a shipped kernel by its name under ``kernkit/kernels/``, a user's file by its path),
the wrappers and flags, the backend and the architecture, and the kernel root where the spec
has one (``kernel_root``, which keys the files under it by their path there). It names no
directory of a cache, so a manifest recorded on one machine builds on any other that has the
same sources.

The file is JSON: ``{"format": 1, "kernkit": "<version>", "requests": [...]}``. Recording
(``KERNKIT_RECORD=FILE``) merges into the file under a lock, so several processes (the ranks
of one server) may record into one manifest.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import warnings
from pathlib import Path

from .._version import __version__
from .config import RECORD_VAR
from .paths import shipped_name
from .untrusted import read_json

FORMAT = 1

#: The requests this process has recorded, by manifest path: each is merged into the file once.
_recorded: dict[str, set[str]] = {}
#: The manifests this process could not record into, warned about once each (``record``).
_unrecordable: set[str] = set()


class ManifestError(ValueError):
    """A manifest cannot be read, or one of its requests cannot be built here."""


def request(spec) -> dict:
    """``spec`` as a build request (JSON-ready): ``JitSpec.make``'s arguments, with
    ``kernel_root`` only where the spec has one."""
    req = {"marker": [spec.name, *spec.template_args], "cuda_files": [shipped_name(f) or f for f in spec.cuda_files],
           "cpp_files": [shipped_name(f) or f for f in spec.cpp_files],
           "cuda_wrappers": [list(w) for w in spec.cuda_wrappers],
           "cpp_wrappers": [list(w) for w in spec.cpp_wrappers], "extra_cflags": list(spec.extra_cflags),
           "extra_cuda_cflags": list(spec.extra_cuda_cflags), "extra_ldflags": list(spec.extra_ldflags),
           "extra_include_paths": list(spec.extra_include_paths), "backend": spec.backend,
           "arch": str(spec.arch) if spec.arch else None}
    return {**req, "kernel_root": spec.kernel_root} if spec.kernel_root else req


def record(spec) -> None:
    """Add ``spec``'s request to the manifest ``$KERNKIT_RECORD`` names, if it names one.

    A manifest that cannot be recorded into (a file that is not a manifest, a path under a
    regular file, a read-only or full file system, a directory where no file can be made such as
    ``/proc``) gets one ``RuntimeWarning`` naming ``KERNKIT_RECORD``, the file and the reason,
    and this process records nothing more there. It never fails the load: the build has loaded,
    and recording is bookkeeping beside it, so failing the op would turn a smoke test's note into
    a server's outage. The warning says the manifest is incomplete; a deployment frozen on it
    names each specialization it lacks (``docs/deploy.md``)."""
    target = os.environ.get(RECORD_VAR, "").strip()
    if not target:
        return
    where = os.path.abspath(target)
    if where in _unrecordable:
        return
    req = request(spec)
    entry = _identity(req)
    seen = _recorded.setdefault(where, set())
    if entry in seen:
        return
    try:
        _merge(Path(target), req, entry)
    except ManifestError as e:
        _give_up(where, f"{RECORD_VAR}={target} names a file that is not a manifest to record into: {e}; point "
                        f"{RECORD_VAR} at a manifest or a new file, or unset it")
        return
    except OSError as e:
        _give_up(where, f"{RECORD_VAR}={target} cannot be recorded into: {e.strerror or e}"
                        + (f" ({e.filename})" if e.filename else "")
                        + f"; point {RECORD_VAR} at a file in a writable directory, or unset it")
        return
    seen.add(entry)


def _give_up(where: str, why: str) -> None:
    _unrecordable.add(where)
    warnings.warn(f"kernkit: {why}. Nothing more is recorded there by this process.", RuntimeWarning, stacklevel=4)


def _merge(path: Path, req: dict, entry: str) -> None:
    """Add ``req`` to the manifest at ``path`` (made if missing) unless it holds it, under the
    ``flock`` of ``<path>.lock``, so that processes recording into one manifest do not lose
    each other's requests. Raises ``OSError`` where the lock or the manifest cannot be written,
    ``ManifestError`` for a file that is not a manifest (left as it is)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as e:  # a part of the directory is a file
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), e.filename) from None
    # The lock taken directly: an error opening it (no such directory, read-only, /proc) is
    # raised here, where a polling lock would wait for ever.
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        with contextlib.suppress(OSError):  # no flock here (NFS mounted nolock): merged unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        requests = read(path) if path.exists() else []
        if entry in {_identity(r) for r in requests}:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"format": FORMAT, "kernkit": __version__, "requests": [*requests, req]},
                                      indent=1) + "\n")
            os.replace(tmp, path)  # a reader sees the old manifest or the new one, never half of one
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


def _identity(req: dict) -> str:
    return json.dumps(req, sort_keys=True)


def read(path: str | os.PathLike) -> list[dict]:
    """The requests of a manifest; raises ``ManifestError`` naming the file when it is not one
    (not JSON, or larger or nested deeper than ``untrusted.read_json`` reads)."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read the manifest {path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("requests"), list):
        raise ManifestError(f"{path} is not a kernkit manifest of format {FORMAT} (a JSON object with "
                            "'format' and 'requests')")
    return data["requests"]
