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

import json
import os
from pathlib import Path

from .._version import __version__
from .config import RECORD_VAR
from .paths import shipped_name

FORMAT = 1

#: The requests this process has recorded, by manifest path: each is merged into the file once.
_recorded: dict[str, set[str]] = {}


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
    """Add ``spec``'s request to the manifest ``$KERNKIT_RECORD`` names, if it names one."""
    target = os.environ.get(RECORD_VAR, "").strip()
    if not target:
        return
    req = request(spec)
    entry = _identity(req)
    seen = _recorded.setdefault(os.path.abspath(target), set())
    if entry in seen:
        return
    import filelock  # only recording processes need it

    path = Path(target)
    with filelock.FileLock(str(path) + ".lock"):
        try:
            requests = read(path) if path.exists() else []
        except ManifestError as e:
            raise ManifestError(f"{RECORD_VAR}={target} names a file that is not a manifest to record into: {e}; "
                                f"point {RECORD_VAR} at a manifest or a new file, or unset it") from None
        if entry not in {_identity(r) for r in requests}:
            requests.append(req)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"format": FORMAT, "kernkit": __version__, "requests": requests}, indent=1)
                           + "\n")
            os.replace(tmp, path)  # a reader sees the old manifest or the new one, never half of one
    seen.add(entry)


def _identity(req: dict) -> str:
    return json.dumps(req, sort_keys=True)


def read(path: str | os.PathLike) -> list[dict]:
    """The requests of a manifest; raises ``ManifestError`` naming the file when it is not one."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read the manifest {path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("requests"), list):
        raise ManifestError(f"{path} is not a kernkit manifest of format {FORMAT} (a JSON object with "
                            "'format' and 'requests')")
    return data["requests"]
