"""``JitSpec``: one specialization of kernel templates, its cache key, and the one path that
builds it when needed and loads it (``build_and_load``); ``load_jit`` is that path as a call."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path

import torch
import tvm_ffi

from .._version import __version__
from . import cache, manifest, miss, wrappers
from .arch import CudaArch, target_arch
from .backends import BACKENDS, HOST, default_backend
from .backends.base import CXX_FLAGS, Backend, CompileError, ToolchainError, find_cxx, stamp, version
from .config import EMU_SANITIZE_VAR, FREEZE_VAR, JIT_VAR, emu_sanitizers, frozen, jit_enabled, shared_dirs
from .memo import requester
from .paths import (
    EMU_INCLUDE_DIR,
    INCLUDE_DIR,
    KERNELS_DIR,
    LIB_NAME,
    PACKAGE_ROOT,
    ROOT_PREFIX,
    root_name,
    shipped_name,
)
from .untrusted import control

logger = logging.getLogger("kernkit.jit")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SAFE = re.compile(r"[^A-Za-z0-9_.+=-]+")

#: ``paths.root_name``, once per file and root in a process: a warm ``load_jit`` resolves no path.
_root_name = lru_cache(maxsize=1024)(root_name)

#: How many times a build whose headers changed while it ran is made again before it fails.
BUILD_ATTEMPTS = 3
#: A header that the snapshot before a build did not cover counts as changed during the build
#: when it changed less than this before the build began: file times come from a clock that lags
#: ``time.time_ns``'s by up to a tick, and some file systems keep whole seconds.
CHANGE_SLACK_NS = 1_000_000_000


class JitDisabledError(RuntimeError):
    """``KERNKIT_JIT=off`` and the requested specialization is not in the cache."""


class FrozenCompileError(RuntimeError):
    """A specialization that is not built was requested after ``freeze`` (``KERNKIT_FREEZE=error``)."""


class CaptureCompileError(RuntimeError):
    """A specialization that is not built was requested while the current CUDA stream captures a
    graph: kernkit never compiles inside a capture."""


def _strings(value: str | os.PathLike[str] | Iterable[object], what: str) -> tuple[str, ...]:
    if isinstance(value, (str, os.PathLike)):
        return _plain((str(value),), what)
    try:  # load_jit passes its options on unchecked: one that is not iterable raises here
        return _plain(tuple(str(v) for v in value), what)
    except TypeError:
        raise TypeError(f"load_jit: {what} must be a sequence of strings, got {value!r}") from None


def _plain(values: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``values``, unless one holds a control character (``untrusted.control``): then a
    ``ValueError`` naming ``what``. A spec's strings name its build in messages and ``cache
    list``, and go into ``build.ninja`` and the manifest ``KERNKIT_RECORD`` writes, which
    ``warmup --manifest`` refuses with one."""
    bad = next((v for v in values if control(v)), None)
    if bad is not None:
        raise ValueError(f"load_jit: {what} {bad!r} holds a control character: no name, file or flag may (a "
                         "newline or an escape sequence would reach build.ninja, a manifest or a terminal)")
    return values


def _source(name: str, check: bool = True) -> str:
    """An absolute path stays; a relative one is taken under ``kernkit/kernels/``. With ``check``
    the file must exist."""
    path = Path(name)
    resolved = path if path.is_absolute() else KERNELS_DIR / path
    if check and not resolved.is_file():
        where = "" if path.is_absolute() else f" (relative names are looked up in {KERNELS_DIR})"
        raise FileNotFoundError(f"kernel source {name!r} not found{where}")
    return str(resolved)


def _caller_root(frame) -> str | None:
    """The default kernel root: the directory of the Python file whose code called ``make``,
    directly or through ``load_jit`` (this module's frames are passed over), as a real path; None
    for code without a file (``python -c``, ``exec``, an interactive session)."""
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return _module_dir(frame.f_code.co_filename) if frame is not None else None


@lru_cache(maxsize=256)
def _module_dir(filename: str) -> str | None:
    """The real directory of the file a code object was compiled from; None when there is none."""
    return os.path.dirname(os.path.realpath(filename)) if os.path.isfile(filename) else None


def _root_dir(path: object, check: bool) -> str:
    """``kernel_root`` as a real path; with ``check`` it must be a directory."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load_jit: kernel_root must be a path, got {path!r}")
    real = os.path.realpath(path)
    if check and not os.path.isdir(real):
        raise NotADirectoryError(f"load_jit: kernel_root {os.fspath(path)!r} is not a directory")
    return real


def _wrappers(wrappers: Iterable[object], what: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for item in wrappers:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise TypeError(f"{what}: each wrapper is (export_name, 'symbol<args>'), got {item!r}")
        name, symbol = item[0], item[1].strip()
        if not _IDENT.fullmatch(name):
            raise ValueError(f"{what}: export name {name!r} is not a C identifier")
        if name in (n for n, _ in out):
            raise ValueError(f"{what}: export name {name!r} given twice")
        if not symbol or any(c in symbol for c in ";{}") or control(symbol):
            raise ValueError(f"{what}: {symbol!r} is not a function or static member function name")
        out.append((name, symbol))
    return tuple(out)


#: The CUDA backends whose builds of the same sources can stand in for each other.
_CUDA_TWIN = {"nvcc": "nvrtc", "nvrtc": "nvcc"}


@dataclass(frozen=True)
class JitSpec:
    """One specialization: what it is built from, for which backend and architecture.

    Make one with ``JitSpec.make`` (the arguments of ``load_jit``), which checks and normalizes
    them; the spec is then immutable and hashable, so ops can list the specializations a model
    needs (ahead-of-time builds) and load them. ``key`` is its cache key.

    Example
    -------
    >>> from kernkit.jit import JitSpec, make_cpp_args
    >>> args = make_cpp_args(torch.bfloat16, True)
    >>> spec = JitSpec.make("scale", *args, cuda_files=["elementwise/scale.cuh"],
    ...                     cuda_wrappers=[("scale", f"scale<{args}>")])
    >>> spec.title
    'scale<bf16_t, true>'
    >>> module = spec.build_and_load()  # doctest: +SKIP
    """

    name: str
    template_args: tuple[str, ...]
    cuda_files: tuple[str, ...]
    cpp_files: tuple[str, ...]
    cuda_wrappers: tuple[tuple[str, str], ...]
    cpp_wrappers: tuple[tuple[str, str], ...]
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    extra_ldflags: tuple[str, ...]
    extra_include_paths: tuple[str, ...]
    #: The backend of the CUDA unit (``nvcc``, ``nvrtc`` or ``emu``); None without ``cuda_files``.
    backend: str | None
    #: The GPU architecture of an ``nvcc`` or ``nvrtc`` build; None for ``emu``.
    arch: CudaArch | None
    #: The real path of the directory that the user's files under it are keyed and recorded
    #: relative to (``make``'s ``kernel_root``); None when no file of the spec is under one.
    kernel_root: str | None = None

    @classmethod
    def make(cls, *marker: object, cuda_files: Sequence[str] = (), cpp_files: Sequence[str] = (),
             cuda_wrappers: Sequence[tuple[str, str]] = (), cpp_wrappers: Sequence[tuple[str, str]] = (),
             extra_cflags: Sequence[str] = (), extra_cuda_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
             extra_include_paths: Sequence[str] = (), backend: str | None = None,
             arch: CudaArch | str | None = None, kernel_root: str | os.PathLike | None = None) -> JitSpec:
        """Check and normalize a specialization's description; compiles nothing.

        Parameters
        ----------
        marker
            The kernel's name, then its template arguments (usually ``*make_cpp_args(...)``);
            together they name the specialization and its cache directory.
        cuda_files, cpp_files
            Headers included into the generated CUDA and C++ units: relative names resolve under
            ``kernkit/kernels/``, absolute paths are used as given.
        cuda_wrappers, cpp_wrappers
            ``(export_name, "symbol<args>")`` pairs, each a function of the loaded module,
            exported inside ``namespace kernkit``.
        extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths
            More flags for the host compiler, for nvcc (an ``nvrtc`` build passes none of them to
            NVRTC), for the linker, and include directories whose headers are tracked like
            kernkit's.
        backend
            ``"nvcc"`` or ``"nvrtc"`` (a GPU build; by default ``default_backend()``:
            ``$KERNKIT_BACKEND``, else nvrtc where it is installed, else nvcc) or ``"emu"`` (the
            CPU emulator, for CPU tensors). Ignored without ``cuda_files``.
        arch
            The GPU build's target, e.g. ``"9.0"``; default: the visible GPU, else
            ``$KERNKIT_CUDA_ARCH``.
        kernel_root
            The directory of the project the user's files belong to. A file under it (a source,
            a header those include, an ``extra_include_paths`` directory) enters the key, and the
            build's record, by its path relative to it, so the project finds its builds after it
            moves (another clone, a container that builds in ``/build`` and runs in ``/app``,
            the same wheel in another environment). Default: the directory of the Python file
            whose code calls ``make`` or ``load_jit`` (found from the caller's frame); code
            without a file (``python -c``, an interactive session) has none. Files outside it
            keep their absolute path.

        Returns
        -------
        JitSpec
            The frozen spec. Raises ``TypeError``/``ValueError``/``FileNotFoundError`` for a bad
            description (``NotADirectoryError`` for a ``kernel_root`` that is not a directory)
            and ``ArchError`` when a GPU build's target cannot be chosen.

        Example
        -------
        >>> KERNEL = Path(__file__).resolve().parent / "my_scale.cuh"  # next to the op's module
        >>> spec = JitSpec.make("my_scale", "fp32_t", "false", cuda_files=[str(KERNEL)],
        ...                     cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="emu")
        >>> spec.kernel_root == str(KERNEL.parent)  # doctest: +SKIP
        True
        """
        root = _caller_root(sys._getframe(1)) if kernel_root is None else _root_dir(kernel_root, check=True)
        return cls._normalized(marker, root, True, cuda_files, cpp_files, cuda_wrappers, cpp_wrappers, extra_cflags,
                               extra_cuda_cflags, extra_ldflags, extra_include_paths, backend, arch)

    @classmethod
    def _normalized(cls, marker: tuple, root: str | None, check: bool, cuda_files: Sequence[str],
                    cpp_files: Sequence[str], cuda_wrappers: Sequence[tuple[str, str]],
                    cpp_wrappers: Sequence[tuple[str, str]], extra_cflags: Sequence[str],
                    extra_cuda_cflags: Sequence[str], extra_ldflags: Sequence[str], extra_include_paths: Sequence[str],
                    backend: str | None, arch: CudaArch | str | None) -> JitSpec:
        """``make``'s work, with the kernel root chosen; with ``check`` False the sources need not
        exist here (``from_request`` binding a build made elsewhere)."""
        if not marker:
            raise ValueError("load_jit: give at least one marker (the kernel's name)")
        name, *args = _plain(tuple(str(m) for m in marker), "marker")
        cuda = tuple(_source(f, check) for f in _strings(cuda_files, "cuda_files"))
        cpp = tuple(_source(f, check) for f in _strings(cpp_files, "cpp_files"))
        cuda_w, cpp_w = _wrappers(cuda_wrappers, "cuda_wrappers"), _wrappers(cpp_wrappers, "cpp_wrappers")
        clash = {n for n, _ in cuda_w} & {n for n, _ in cpp_w}
        if clash:
            raise ValueError(f"load_jit: export names {sorted(clash)} appear in both cuda_wrappers and cpp_wrappers")
        if not cuda_w and not cpp_w:
            raise ValueError("load_jit: no wrappers given, so the module would export nothing")
        if bool(cuda_w) != bool(cuda) or bool(cpp_w) != bool(cpp):
            raise ValueError("load_jit: cuda_wrappers need cuda_files and cpp_wrappers need cpp_files, and the "
                             "other way round")
        cflags, ldflags = _strings(extra_cflags, "extra_cflags"), _strings(extra_ldflags, "extra_ldflags")
        if not cuda:
            backend = arch = None
        else:
            backend = backend or default_backend()
            if backend not in BACKENDS:
                raise ValueError(f"load_jit: backend must be one of {sorted(BACKENDS)}, got {backend!r}")
            if backend in ("nvcc", "nvrtc"):
                arch = CudaArch.parse(arch) if isinstance(arch, str) else (arch or target_arch())
            else:
                arch = None
            if backend == "emu" and emu_sanitizers():  # KERNKIT_EMU_SANITIZE: part of the key
                san = (f"-fsanitize={','.join(emu_sanitizers())}", "-fno-omit-frame-pointer", "-g")
                cflags, ldflags = cflags + san, ldflags + san
        includes = tuple(str(Path(p).resolve()) for p in _strings(extra_include_paths, "extra_include_paths"))
        if root is not None and not any(_root_name(f, root) for f in (*cuda, *cpp, *includes)):
            root = None  # nothing is under it: keyed as before, by absolute paths
        _plain((root,) if root else (), "kernel_root")
        return cls(name, tuple(args), cuda, cpp, cuda_w, cpp_w, cflags,
                   _strings(extra_cuda_cflags, "extra_cuda_cflags") if backend == "nvcc" else (), ldflags, includes,
                   backend, arch, root)

    @classmethod
    def from_request(cls, request: dict, check_files: bool = True) -> JitSpec:
        """The spec of a build request (``manifest.request``), for the architecture and kernel
        root it names: how ``warmup --manifest`` replays a request and ``cache import``
        recomputes the key of a shipped build from its record.

        Parameters
        ----------
        request
            ``{"marker": [name, *args], "cuda_files": [...], ..., "backend": ..., "arch": ...}``,
            and ``"kernel_root"`` where the spec had one.
        check_files
            False makes the spec of a request whose sources are not here (a build made in a
            project that has moved since): its key is the same, since it names the files under
            the kernel root by their path there.

        Returns
        -------
        JitSpec
            As ``make`` returns it; ``make``'s exceptions, and ``KeyError``/``TypeError`` for a
            request that lacks a field.

        Example
        -------
        >>> JitSpec.from_request(manifest.request(spec)) == spec  # doctest: +SKIP
        True
        """
        root = request.get("kernel_root")
        fields = ("cuda_files", "cpp_files", "cuda_wrappers", "cpp_wrappers", "extra_cflags", "extra_cuda_cflags",
                  "extra_ldflags", "extra_include_paths", "backend", "arch")
        return cls._normalized(tuple(request["marker"]), None if root is None else _root_dir(root, check=False),
                               check_files, *(request[k] for k in fields))

    @property
    def title(self) -> str:
        """``name<args>``, e.g. ``scale<bf16_t, true>``."""
        return self.name + (f"<{', '.join(self.template_args)}>" if self.template_args else "")

    @property
    def label(self) -> str:
        """How messages name it: ``scale<bf16_t, true> (nvcc, sm_90a)``."""
        return f"{self.title} ({self.backend or 'c++'}{f', sm_{self.arch.sm}' if self.arch else ''})"

    @property
    def _backend(self) -> Backend:
        return BACKENDS[self.backend] if self.backend else HOST

    def _units(self, name) -> tuple[tuple[str, str, str], ...]:
        """The translation units, each file included by ``name(file)``."""
        units = []
        if self.cuda_files:
            units.append((self._backend.unit, _render(self.title, map(name, self.cuda_files), self.cuda_wrappers),
                          "cuda"))
        if self.cpp_files:
            units.append(("host.cc", _render(self.title, map(name, self.cpp_files), self.cpp_wrappers), "cxx"))
        return tuple(units)

    @cached_property
    def units(self) -> tuple[tuple[str, str, str], ...]:
        """The generated translation units as ``(file name, text, ninja rule)``: a shipped kernel
        included by its name under ``kernels/``, a user's file by its absolute path."""
        return self._units(lambda f: shipped_name(f) or f)

    def key_name(self, path: str) -> str:
        """How the key names a source or include directory: a shipped kernel by its name under
        ``kernkit/kernels/``, a path under the kernel root as ``<root>/`` and its path there (so
        the key does not depend on where the project is), any other by its absolute path."""
        rel = _root_name(path, self.kernel_root)  # None for kernkit's own files
        return ROOT_PREFIX + rel if rel else shipped_name(path) or path

    @cached_property
    def key(self) -> str:
        """SHA-256 (hex) of everything the spec says that decides the build: layout, kernkit and
        tvm-ffi versions, backend and its fixed flags, architecture, units, every flag, with the
        files and include directories named as ``key_name`` names them. What the build reads
        besides (the content of the files and of their headers, the compilers) is checked
        against its record instead. Without a kernel root, the units are the build's own."""
        if self.kernel_root is None:
            units, includes = self.units, self.extra_include_paths
        else:
            units, includes = self._units(self.key_name), tuple(map(self.key_name, self.extra_include_paths))
        material = [cache.LAYOUT, __version__, tvm_ffi.__version__, self.backend, self._backend.flags,
                    CXX_FLAGS if self.cpp_files else (), str(self.arch), units, self.extra_cflags,
                    self.extra_cuda_cflags, self.extra_ldflags, includes]
        return hashlib.sha256(json.dumps(material).encode()).hexdigest()

    @property
    def key_dir(self) -> Path:
        """Where this key's builds live: ``<cache>/v2/<name>/<args>-<key16>``."""
        variant = (_SAFE.sub("_", "_".join(self.template_args)).strip("_") or "default")[:80]
        return cache.root() / _SAFE.sub("_", self.name)[:80] / f"{variant}-{self.key[:16]}"

    def build(self) -> Path:
        """The path of this specialization's library, compiling it first when the cache has no
        current build. Loads nothing (``warmup`` uses this).

        A hit starts no subprocess: it reads the key's ``meta.json`` records and compares the
        headers' and compilers' stats, in the shared caches (``KERNKIT_CACHE_SHARED``) first; a
        process that will not compile (frozen, ``KERNKIT_JIT=off``, no compiler, a graph capture)
        takes a build by any compilers, of either CUDA backend. A
        miss compiles under the key's file lock, in a private staging directory, and publishes
        the build atomically. With ``KERNKIT_RECORD`` set, the spec is added to that manifest.

        Raises
        ------
        JitDisabledError
            ``KERNKIT_JIT=off`` and no build is cached.
        CaptureCompileError
            No build is cached and the current CUDA stream is capturing a graph.
        FrozenCompileError
            No build is cached and compiling is frozen (``freeze``, ``KERNKIT_FREEZE=error``).
        ToolchainError
            No build is cached and a compiler (or CUDA's headers) is missing.
        CompileError
            The compiler failed; the build is kept under ``.failed/`` for inspection.
        CacheDirError
            The cache directory cannot be written (read-only, full).
        """
        lib = self._find_or_compile()
        manifest.record(self)  # KERNKIT_RECORD
        return lib

    def _find_or_compile(self) -> Path:
        backend, missing = self._backend, None
        try:
            compilers = backend.compilers()
            stamps = [stamp(c) for c in compilers]
        except (ToolchainError, OSError) as e:
            compilers, stamps, missing = None, None, e
        # A machine that will not compile takes any toolchain's current build of these sources,
        # by either CUDA backend (a server without the build box's toolchain resolves the default
        # backend to nvcc where NVRTC or CUDA's headers are missing); one that will compile takes
        # only a build by its own compilers.
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        will_not_compile = compilers is None or capturing or frozen() is not None or not jit_enabled()
        candidates = [self]
        if will_not_compile and self.backend in _CUDA_TWIN and not self.extra_cuda_cflags:
            candidates.append(replace(self, backend=_CUDA_TWIN[self.backend]))
        for spec in candidates:
            lib = spec._find(None if will_not_compile else stamps)
            if lib is not None:
                return lib
        where = f"{self.label} key {self.key[:16]}"
        tops = _searched()
        searched = f"the cache{'s' * (len(tops) > 1)} {', '.join(map(str, tops))}"
        if capturing:
            raise CaptureCompileError(
                f"{where} is not built and the current CUDA stream is capturing a graph: kernkit does not "
                "compile inside a capture. Run the op once with the same dtypes and shapes before capturing, "
                "or build it ahead of time with `python -m kernkit.jit warmup`")
        if not jit_enabled():
            raise JitDisabledError(
                f"{JIT_VAR}=off and {where} is not in {searched}; build it ahead of time on a "
                f"machine with the compilers (same cache directory, `python -m kernkit.jit warmup`), or unset "
                f"{JIT_VAR}.{miss.nearest(self, tops)}")
        mode = frozen()
        if mode:
            asked = f"{where}, asked for by {requester.get()}," if requester.get() else where
            if mode == "error":
                raise FrozenCompileError(
                    f"{FREEZE_VAR}=error (kernkit.jit.freeze) and {asked} is not in {searched}: "
                    "build it ahead of time (record the specializations a run loads with KERNKIT_RECORD=FILE, "
                    f"then `python -m kernkit.jit warmup --manifest FILE`), or freeze with mode='warn'."
                    f"{miss.nearest(self, tops)}")
            logger.warning("kernkit: %s=warn and %s is not in the cache: compiling it", FREEZE_VAR, asked)
            cache.note_frozen_compile({"title": self.title, "label": self.label, "asked_by": requester.get(),
                                       "pid": os.getpid(), "time": time.time()})
        if compilers is None:
            raise ToolchainError(f"cannot build {where}: {missing}. Or build it ahead of time on a machine that "
                                 "has the toolchain (`python -m kernkit.jit warmup`, same cache directory)")
        with cache.locked(self.key, self.label):
            lib = cache.find(self.key_dir, stamps, root=self.kernel_root)  # built by another process meanwhile?
            return lib if lib is not None else self._compile(backend, compilers)

    def _find(self, stamps: list | None) -> Path | None:
        """This key's current build (``cache.find``), in the shared read-only caches
        (``KERNKIT_CACHE_SHARED``) first: many machines, one build."""
        relative = self.key_dir.relative_to(cache.root())
        for top in _searched():
            lib = cache.find(top / relative, stamps, read_only=top != cache.root(), root=self.kernel_root)
            if lib is not None:
                return lib
        return None

    def cached(self) -> Path | None:
        """The library of this key's current build, by any compilers, where a load looks: the
        shared read-only caches (``KERNKIT_CACHE_SHARED``) first, then the local one; None when
        none holds one. Compiles, loads and records nothing (``cache export --manifest``)."""
        return self._find(None)

    def _compile(self, backend: Backend, compilers: list[str]) -> Path:
        """Build, and publish the build whose headers were the same from before its compile until
        its record holds them (``_changed_during``); a build that read a header changed meanwhile
        (saved by an editor, a ``git checkout``) is made again, up to ``BUILD_ATTEMPTS`` times."""
        start = time.perf_counter()
        known: list[Path] = []
        for attempt in range(1, BUILD_ATTEMPTS + 1):
            began = time.time_ns()
            before = _stat_files(self._expected_reads(known))
            staging, headers, deps, tools = self._build_once(backend, compilers)
            changed = _changed_during(headers, deps, before, began)
            if not changed:
                break
            if attempt == BUILD_ATTEMPTS:
                kept = cache.keep_failed(staging, cache.root() / ".failed" /
                                         f"{self.key_dir.parent.name}-{self.key[:16]}")
                why = (f"kernkit: {changed[0]} changed while {self.title} was built, in each of {attempt} builds: "
                       "nothing was published; build again once it no longer changes")
                raise CompileError(self.title, str(kept / "build.ninja"), "", [why], why)
            cache.discard(staging)
            known = headers
            _announce("kernkit: %s changed while %s was built: building it again", changed[0], self.label)
        seconds = time.perf_counter() - start
        meta = {"title": self.title, "backend": self.backend, "arch": str(self.arch) if self.arch else None,
                "key": self.key, "kernkit": __version__, "tvm_ffi": tvm_ffi.__version__, "deps": deps,
                "compilers": tools, "built_at": time.time(), "build_seconds": round(seconds, 3),
                "host": socket.gethostname(), "package": str(PACKAGE_ROOT), "request": manifest.request(self)}
        build_id = hashlib.sha256(json.dumps([[d[0], d[-1]] for d in deps] + [t["stamp"] for t in tools])
                                  .encode()).hexdigest()[:12]
        try:
            final = cache.publish(staging, self.key_dir / build_id, meta)
        except cache.CacheDirError:
            cache.discard(staging)
            raise
        _announce("kernkit: compiled %s in %.1f s", self.label, seconds)  # args[0] starts with the title
        return final / LIB_NAME

    def _expected_reads(self, known: Iterable[Path]) -> list[str]:
        """The files a build of this spec is expected to read, listed before it reads them:
        kernkit's headers and kernels, the files of the ``extra_include_paths``, the spec's files
        and the files beside them, and ``known`` (what an earlier attempt read)."""
        trees: list[str | Path] = [INCLUDE_DIR, KERNELS_DIR, EMU_INCLUDE_DIR, *self.extra_include_paths]
        beside = dict.fromkeys(os.path.dirname(f) for f in (*self.cuda_files, *self.cpp_files))
        return [*(f for tree in trees for f in _files_in(tree, recursive=True)),
                *(f for folder in beside for f in _files_in(folder, recursive=False)),
                *self.cuda_files, *self.cpp_files, *map(str, known)]

    def _build_once(self, backend: Backend, compilers: list[str]) -> tuple[Path, list[Path], list, list[dict]]:
        """Compile and link in a new staging directory; return it, the headers the build read, their
        records (None for one that is gone) and the compilers'. A failed build is kept in
        ``.failed/`` (``CompileError``) or discarded."""
        staging = cache.staging_dir(self.key)
        try:
            headers = backend.build(self, compilers, staging)
            deps = [_record_of(h, self.kernel_root) for h in headers]
            tools = [{"path": c, "stamp": stamp(c), "version": version(c)} for c in compilers]
        except CompileError as e:
            full = next((ln for ln in e.log.splitlines() if "No space left" in ln or "quota exceeded" in ln), "")
            if full:  # a kept failure would hold on to the little space left
                cache.discard(staging)
                raise cache.dir_problem(cache.root(), f"build {self.title}", OSError(errno.ENOSPC, full)) from e
            kept = cache.keep_failed(staging, cache.root() / ".failed" / f"{self.key_dir.parent.name}-{self.key[:16]}")
            old, new = str(staging), str(kept)
            source = e.source.replace(old, new)
            why = wrappers.blame(e.log, Path(source), (*self.cuda_wrappers, *self.cpp_wrappers),
                                 (*self.cuda_files, *self.cpp_files))
            raise CompileError(e.spec, source, e.command.replace(old, new), why + e.errors, e.log) from None
        except OSError as e:  # writing the units, the log or reading back a header
            cache.discard(staging)
            raise cache.dir_problem(cache.root(), f"build {self.title}", e) from e
        except BaseException:
            cache.discard(staging)
            raise
        return staging, headers, deps, tools

    def build_and_load(self) -> tvm_ffi.Module:
        """The loaded module, built first when needed (``build`` says what it raises; an
        AddressSanitizer build in a process without the ASan runtime raises RuntimeError)."""
        path = self.build()
        if self.backend == "emu" and any(f.startswith("-fsanitize=") and "address" in f for f in self.extra_cflags):
            _check_asan_runtime(self.title)
        return tvm_ffi.load_module(_utf8_path(path))


def _check_asan_runtime(title: str) -> None:
    """Loading an AddressSanitizer build into a process that did not start with the ASan
    runtime kills it ("ASan runtime does not come first in initial library list"): raise
    instead, with the command line that starts the process as it must."""
    try:
        if "libasan" in Path("/proc/self/maps").read_text():
            return
    except OSError:  # no /proc: the loader will say
        return
    cxx = find_cxx()
    libs = [subprocess.run([cxx, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip() or lib
            for lib in ("libasan.so", "libstdc++.so.6")]
    raise RuntimeError(f"{title} is an AddressSanitizer build "
                       f"({EMU_SANITIZE_VAR}={os.environ.get(EMU_SANITIZE_VAR, '')}), "
                       f"which loads only into a process started with the ASan runtime first (and libstdc++ with it); "
                       f"start it as: LD_PRELOAD=\"{' '.join(libs)}\" ASAN_OPTIONS=detect_leaks=0 python ... "
                       f"(docs/emulator.md), or unset {EMU_SANITIZE_VAR}")


def _files_in(folder: str | Path, recursive: bool) -> Iterator[str]:
    """The files of ``folder``, and of its subfolders with ``recursive``; none where it cannot be read."""
    if recursive:
        for top, _, names in os.walk(folder):
            yield from (os.path.join(top, name) for name in names)
        return
    try:
        with os.scandir(folder) as entries:
            yield from (e.path for e in entries if e.is_file())
    except OSError:
        return


def _stat_files(paths: Iterable[str]) -> dict[tuple[int, int], tuple[int, int, int]]:
    """``(device, inode) -> (size, mtime_ns, ctime_ns)`` of each of ``paths`` that is there: the
    state of a build's expected reads before it starts, however its compilers name the files."""
    found = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        found[(st.st_dev, st.st_ino)] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return found


def _record_of(header: Path, root: str | None) -> list | None:
    """``cache.file_record`` of a header a build read; None when it is gone (deleted meanwhile)."""
    try:
        return cache.file_record(header, root)
    except FileNotFoundError:
        return None


def _changed_during(headers: list[Path], deps: list, before: dict, began: int) -> list[Path]:
    """The headers a build read that may not hold, now, what it read: gone; changed while their
    record was taken (the stat after hashing is not the recorded one); changed since the snapshot
    taken before the build (``before``, from ``_stat_files``); or, for one the snapshot did not
    cover, changed less than ``CHANGE_SLACK_NS`` before the build began (``began``, from
    ``time.time_ns``) or after. An edit always moves the change time, which no tool restores."""
    changed = []
    for header, dep in zip(headers, deps, strict=True):
        try:
            st = os.stat(header)
        except OSError:
            st = None
        if dep is None or st is None or [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] != dep[1:5]:
            changed.append(header)
            continue
        was = before.get((st.st_dev, st.st_ino))
        if was is None:
            late = st.st_ctime_ns >= began - CHANGE_SLACK_NS
        else:
            late = (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != was
        if late:
            changed.append(header)
    return changed


def _searched() -> list[Path]:
    """The cache roots a load searches, in order: the shared ones (``KERNKIT_CACHE_SHARED``),
    then this process's own."""
    return [*(d.absolute() / cache.LAYOUT for d in shared_dirs()), cache.root()]


#: Descriptors of the build directories whose path is not UTF-8, by path (``_utf8_path``).
_DIR_FDS: dict[str, int] = {}


def _utf8_path(lib: Path) -> str:
    """A path of ``lib`` that tvm-ffi can take (UTF-8 only): ``lib`` itself, or, when the cache
    directory's name is in another encoding, ``/proc/self/fd/N/lib.so`` through a descriptor of
    its directory. That descriptor stays open: glibc would take the same name, with N reused for
    another directory, for the library it loaded first."""
    try:
        str(lib).encode()
        return str(lib)
    except UnicodeEncodeError:
        folder = str(lib.parent)
        if folder not in _DIR_FDS:
            _DIR_FDS[folder] = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{_DIR_FDS[folder]}/{lib.name}"


def _render(title: str, names: Iterable[str], wrappers: Sequence[tuple[str, str]]) -> str:
    """One translation unit: the files by the ``names`` given, then one ``KERNKIT_EXPORT``
    (``kernkit/export.h``) per wrapper, inside ``namespace kernkit`` so that symbols need no
    prefix. Shipped kernels are named by their name under ``kernels/``, so the text (hence the
    key) does not depend on where kernkit is installed."""
    lines = [f"// Generated by kernkit.jit for {title}. Do not edit: rebuilt from the sources below.",
             "#include <kernkit/export.h>", ""]
    lines += [f'#include "{name}"' for name in names]
    lines += ["", "namespace kernkit {"]
    # Parenthesized, so template argument lists with commas stay one macro argument.
    lines += [f"KERNKIT_EXPORT({name}, ({symbol}))" for name, symbol in wrappers]
    lines += ["}  // namespace kernkit", ""]
    return "\n".join(lines)


def _announce(message: str, *args: object) -> None:
    """One line per compile on stderr, through the ``kernkit.jit`` logger: configure that logger
    (a handler, or a level above INFO to silence it) to change where it goes."""
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    logger.info(message, *args)


def load_jit(*marker: object, **options: object) -> tvm_ffi.Module:
    """Build (or find in the cache) and load one specialization of kernel templates:
    ``JitSpec.make(*marker, **options).build_and_load()``.

    Parameters
    ----------
    marker, options
        As for ``JitSpec.make``: the kernel's name and template arguments, then ``cuda_files``,
        ``cpp_files``, ``cuda_wrappers``, ``cpp_wrappers``, ``extra_*``, ``backend``, ``arch``,
        ``kernel_root`` (default: the directory of the Python file that calls ``load_jit``; the
        user's files under it are keyed by their path there, so its builds follow the project
        when it moves).

    Returns
    -------
    tvm_ffi.Module
        A module with one function per wrapper, taking torch tensors directly.

    Example
    -------
    >>> @cache_once
    ... def _module(dtype):
    ...     args = make_cpp_args(dtype, is_arch_support_pdl())
    ...     return load_jit("scale", *args, cuda_files=["elementwise/scale.cuh"],
    ...                     cuda_wrappers=[("scale", f"scale<{args}>")])
    >>> _module(torch.float16).scale(out, x, 2.0)  # doctest: +SKIP

    A project's own kernel, keyed relative to the project's top directory rather than to the
    folder of the module that loads it:

    >>> PROJECT = Path(__file__).resolve().parent.parent
    >>> load_jit("my_scale", "fp32_t", "false", cuda_files=[str(PROJECT / "csrc" / "my_scale.cuh")],
    ...          cuda_wrappers=[("scale", "scale<fp32_t, false>")], kernel_root=PROJECT)  # doctest: +SKIP
    """
    return JitSpec.make(*marker, **options).build_and_load()  # type: ignore[arg-type]
