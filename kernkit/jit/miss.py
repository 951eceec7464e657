"""Why a load that will not compile found no build: the nearest build of the same
specialization in the searched caches, and what it was made from that the spec would not be.
It reads one kernel's records, on the error path only (``JitDisabledError``,
``FrozenCompileError``)."""

from __future__ import annotations

from pathlib import Path

import tvm_ffi

from .._version import __version__
from . import cache, manifest
from .paths import ROOT_PREFIX, root_name
from .untrusted import read_json


def nearest(spec, tops: list[Path]) -> str:
    """For the error that ``spec`` is not built where it will not be compiled: what the closest
    build of the same specialization in the caches ``tops`` differs in (``_differences``), or the
    other specializations of the kernel they hold, as a sentence; '' when they hold none. It
    reads that kernel's records only, and only on the error path."""
    found, others = [], set()
    for top in tops:
        for path in sorted((top / spec.key_dir.parent.name).glob("[!.]*/[!.]*/meta.json")):
            try:
                meta = cache.check_record(read_json(path, regular=True))
            except (OSError, ValueError):
                continue
            if meta["title"] != spec.title:
                others.add(meta["title"])
                continue
            diff = _differences(spec, meta)
            found.append((len(diff), -meta["built_at"], str(path.parent), diff))
    if found:
        _, _, where, diff = min(found)
        return f" The nearest build of {spec.title}, {where}, differs in: {'; '.join(diff)}."
    if others:
        shown = ", ".join(_shown(t) for t in sorted(others)[:3])
        return f" Builds of {spec.name} are cached for other template arguments only: {shown}."
    return ""


#: The fields of a build request that name files and include directories (``_named``).
_PATH_FIELDS = ("cuda_files", "cpp_files", "extra_include_paths")


def _differences(spec, meta: dict) -> list[str]:
    """What the build a record describes was made from and ``spec`` would not be: kernkit's and
    tvm-ffi's versions, the backend and architecture, then the fields of its build request, the
    files and include directories as the key names them (``_named``); for a build of ``spec``'s
    own key, the first header that is no longer the one it read. Each as ``FIELD THERE there,
    HERE here``."""
    mine = manifest.request(spec)
    out = [f"{what} {_shown(there)} there, {here} here" for what, here, there in (
        ("kernkit", __version__, meta["kernkit"]), ("tvm-ffi", tvm_ffi.__version__, meta["tvm_ffi"]),
        ("backend", spec.backend, meta.get("backend")), ("arch", mine["arch"], meta.get("arch"))) if here != there]
    theirs = meta.get("request")
    if theirs is None:
        return out + ["its record holds no build request (made by an older kernkit)"]
    for field in (*_PATH_FIELDS, "cuda_wrappers", "cpp_wrappers", "extra_cflags", "extra_cuda_cflags", "extra_ldflags"):
        here, there = _named(mine, field), _named(theirs, field)
        if here != there:
            roots = (f" (kernel root {theirs.get('kernel_root') or 'none'} there, {spec.kernel_root or 'none'} here)"
                     if field in _PATH_FIELDS else "")
            out.append(f"{field} {there} there, {here} here{roots}")
    if meta["key"] == spec.key:
        out.append(_stale_header(spec, meta))
    return out or ["nothing its record names (the key also covers the layout and the backend's fixed flags)"]


def _stale_header(spec, meta: dict) -> str:
    """Why a build of ``spec``'s own key is not current: the first header it read that is edited
    or missing here."""
    stale = next((d[0] for d in meta["deps"] if not cache.unchanged(d, spec.kernel_root)), None)
    if stale is None:
        return "kernkit's headers, which are not those of the installation that built it"
    where = "" if stale.startswith("/") else f" (under the kernel root {spec.kernel_root})"
    return f"header {_shown(stale)}{where}, which is edited or missing here"


def _shown(value: object) -> str:
    """A string of a record (which anyone who writes the cache wrote) for a message: as it is
    when printable, else its ``repr``, so an escape sequence cannot rewrite the terminal."""
    return value if isinstance(value, str) and value.isprintable() else repr(value)


def _named(request: dict, field: str) -> object:
    """A request's ``field``; for files and include directories, each under the request's kernel
    root named ``<root>/`` and its path there, as the key names it."""
    value, root = request.get(field), request.get("kernel_root")
    if field not in _PATH_FIELDS or not isinstance(root, str) or not isinstance(value, list):
        return value
    return [ROOT_PREFIX + rel if isinstance(f, str) and f.startswith("/") and (rel := root_name(f, root)) else f
            for f in value]
