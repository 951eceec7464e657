"""Request records: the warm load of a specialization without rendering it again.

Finding a build's cache key means rendering its units, resolving every include of the header
closure (about 80 candidate paths for a shipped kernel), hashing, and finding the compilers on
``PATH``: about 1.3 ms of a fresh process's 2 ms warm load, every time. A record remembers the
answer per request (its marker, options and the environment that shapes the build) together
with the stats that would make the answer wrong:

- the (size, mtime) of every file of the header closure, and of the JIT layer's own modules,
  which render and hash a build (so an edited checkout does not reuse records of its old code);
- the mtime of every directory searched while resolving includes: adding a header that would
  shadow another changes the mtime of the directory it is added to;
- the (path, size, mtime) of the compilers whose versions make the toolchain fingerprint.

While all of them match, the slow path would compute the same key and fingerprint, so a hit
loads the library directly: one small JSON read and a few dozen stats. Any mismatch, a missing
or unreadable record, or a record of another request falls back to the full path, which writes
a fresh record. The compiler lookup itself is part of the request's identity through the
variables it reads (``PATH``, ``CXX``, ``CUDA_HOME``, ``CUDA_PATH``); a new compiler placed
earlier on an unchanged ``PATH`` is not noticed until a record is rewritten (the published build
of the old compiler still loads and runs correctly).

Records live in ``v1/.records/`` of the cache, one file per request, written by an atomic
replace; losing a race with another process costs one slow load, a read-only cache only the
speed-up. They are hints: deleting them is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi

from .._version import __version__
from . import cache
from .arch import target_arch
from .codegen import ClosureStats
from .config import emu_sanitizers, jit_enabled
from .toolchain import Toolchain

_VERSION = 1
_DIR = ".records"


def _code_stamp() -> tuple:
    """The (name, size, mtime) of the JIT layer's modules, whose code decides the rendered units
    and the key: a record made by other code (an edited checkout at the same version) does not
    apply. Stat-ed once, at import, so it describes the code this process runs."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            st = os.stat(os.path.join(here, name))
            out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


_CODE = _code_stamp()


@dataclass(frozen=True)
class Hit:
    """A record that still holds: where the build lives."""

    entry: cache.Entry
    fingerprint: str


def identity(marker: tuple[str, ...], options: tuple[tuple[str, object], ...]) -> str | None:
    """The hash naming one request in this environment, or None when it cannot be computed here
    (no target architecture: the full path then raises the proper error)."""
    opts = dict(options)
    backend = opts.get("backend", "cuda")
    try:
        arch = str(target_arch()) if backend == "cuda" and opts.get("cuda_files") else "-"
    except RuntimeError:  # ArchError, or a CUDA runtime that cannot report the device
        return None
    env = os.environ
    includes = opts.get("extra_include_paths") or ()
    parts = [
        _VERSION, __version__, tvm_ffi.__version__, _CODE, marker, options, arch, jit_enabled(),
        emu_sanitizers() if backend == "cpu" else (),
        tuple(str(Path(p).resolve()) for p in includes),
        env.get("PATH"), env.get("CXX"), env.get("CUDA_HOME"), env.get("CUDA_PATH"),
    ]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _path(ident: str) -> str:
    return os.path.join(cache.cache_dir(), cache.LAYOUT, _DIR, f"{ident[:32]}.json")


def lookup(ident: str) -> Hit | None:
    """The build a still-valid record points at, or None."""
    stat = os.stat
    try:
        with open(_path(ident), "rb") as f:
            rec = json.loads(f.read())
        if rec["ident"] != ident:
            return None
        for path, size, mtime in rec["files"] + rec["compilers"]:
            st = stat(path)
            if st.st_size != size or st.st_mtime_ns != mtime:
                return None
        for path, mtime in rec["dirs"]:
            if stat(path).st_mtime_ns != mtime:
                return None
        root = cache.cache_dir() / cache.LAYOUT
        return Hit(cache.Entry(root, rec["kernel"], rec["variant"], rec["key"]), rec["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(ident: str, entry: cache.Entry, fingerprint: str, seen: ClosureStats, tc: Toolchain | None) -> None:
    """Write the record of a request whose key and fingerprint the full path just computed from
    the stats in ``seen`` and, for the compilers, the stats their versions were read against."""
    compilers = [list(c.stat) for c in (tc.cxx, tc.nvcc) if c is not None] if tc is not None else []
    if any(len(c) != 3 for c in compilers):
        return
    rec = {
        "ident": ident,
        "key": entry.key,
        "kernel": entry.kernel,
        "variant": entry.variant,
        "fingerprint": fingerprint,
        "files": [[p, *st] for p, st in sorted(seen.files.items())],
        "dirs": [[p, m] for p, m in sorted(seen.dirs.items())],
        "compilers": compilers,
    }
    path = Path(_path(ident))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(rec, separators=(",", ":")))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache: loads stay correct, only slower
