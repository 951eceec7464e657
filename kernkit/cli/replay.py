"""Replaying a manifest: the ``JitSpec`` of each build request a run recorded
(``KERNKIT_RECORD``), each request checked first, for ``warmup --manifest`` and ``cache export
--manifest``."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..jit import ArchError, CudaArch, JitSpec
from ..jit.manifest import ManifestError
from ..jit.manifest import read as read_manifest
from ..jit.untrusted import control

#: The fields of a request that list flags: replaying a request passes them to the compilers.
FLAG_FIELDS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags")
_LISTS = ("cuda_files", "cpp_files", *FLAG_FIELDS, "extra_include_paths")


def _check_request(req: object, extra_flags: bool = True) -> dict:
    """``req`` if it is a whole, well-formed request, else ``ValueError`` naming the field:
    ``marker`` a non-empty list of strings, the file and flag fields lists of strings, the
    wrappers lists of ``[name, symbol]`` pairs, ``backend``, ``arch`` and ``kernel_root`` (which
    may be left out) a string or null, and no string anywhere with a control character
    (``untrusted.control``: a newline ends a line of ``build.ninja``). With
    ``extra_flags=False`` a request that carries flags (``FLAG_FIELDS``) is refused too."""
    if not isinstance(req, dict):
        raise ValueError(f"a request is a JSON object, got {type(req).__name__}")
    fields: dict[str, list[str]] = {}  # each field's strings, for the control-character check
    for field in ("marker", *_LISTS):
        value = req.get(field)
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"{field!r} must be a list of strings, got {value!r}")
        fields[field] = value
    if not fields["marker"]:
        raise ValueError("'marker' must name the kernel, got []")
    for field in ("cuda_wrappers", "cpp_wrappers"):
        value = req.get(field)
        if not (isinstance(value, list) and all(isinstance(w, list) and len(w) == 2
                                                and all(isinstance(x, str) for x in w) for w in value)):
            raise ValueError(f"{field!r} must be a list of [name, symbol] pairs, got {value!r}")
        fields[field] = [x for w in value for x in w]
    for field in ("backend", "arch", "kernel_root"):
        if not isinstance(req.get(field), (str, type(None))):
            raise ValueError(f"{field!r} must be a string or null, got {req.get(field)!r}")
        fields[field] = [req[field]] if req.get(field) else []
    for field, value in fields.items():
        bad = next((v for v in value if control(v)), None)
        if bad is not None:
            raise ValueError(f"{field!r} holds a control character: {bad!r}")
    flags = [f for field in FLAG_FIELDS for f in req[field]]
    if flags and not extra_flags:
        raise ValueError(f"it carries compiler flags {flags} and --no-extra-flags refuses them")
    return req


def _title(req: object) -> str:
    """`` (name<args>)`` of a request for a message, its ``repr`` if it holds a control
    character; empty when it has no marker to name."""
    marker = req.get("marker") if isinstance(req, dict) else None
    if not (isinstance(marker, list) and marker and all(isinstance(m, str) for m in marker)):
        return ""
    title = marker[0] + (f"<{', '.join(marker[1:])}>" if marker[1:] else "")
    return f" ({title!r})" if control(title) else f" ({title})"


def specs(path: str | os.PathLike, archs: Sequence[str] = (), extra_flags: bool = True) -> list[JitSpec]:
    """The ``JitSpec`` of each request of a manifest; a CUDA request (nvcc, nvrtc) once per
    architecture of ``archs`` when given, else for the one it was recorded with. Every request
    is checked (``_check_request``) before any spec is made, so a manifest is refused whole.

    Parameters
    ----------
    path
        The manifest (``KERNKIT_RECORD``).
    archs
        Architectures for its CUDA requests, e.g. ``["9.0", "10.0a"]``.
    extra_flags
        False refuses every request that carries compiler or linker flags: replaying a flag runs
        it (``-wrapper``, ``-fplugin``, ``-B`` can start any program), so give False for a
        manifest from elsewhere.

    Raises
    ------
    ManifestError
        The file is not a manifest, a request is malformed or refused, or it cannot be made here
        (a source file missing, an unknown backend), naming the request.
    """
    targets = [CudaArch.parse(a) for a in archs]
    requests = read_manifest(path)
    for i, req in enumerate(requests):
        try:
            _check_request(req, extra_flags)
        except ValueError as e:
            raise ManifestError(f"{path}: request {i + 1}{_title(req)} is refused: {e}") from None
    out = []
    for i, req in enumerate(requests):
        title = "?"
        try:
            name, *args = req["marker"]
            title = name + (f"<{', '.join(args)}>" if args else "")
            cuda = req["backend"] in ("nvcc", "nvrtc")
            for arch in (targets or [req["arch"]]) if cuda else [None]:
                out.append(JitSpec.from_request({**req, "arch": arch}))
        except (KeyError, TypeError, ValueError, FileNotFoundError, ArchError) as e:
            raise ManifestError(f"{path}: request {i + 1} ({title}) cannot be built here: "
                                f"{type(e).__name__}: {e}") from None
    return list(dict.fromkeys(out))
