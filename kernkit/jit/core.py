"""``load_jit``: from a marker and a list of wrappers to a loaded tvm-ffi module."""

from __future__ import annotations

import errno
import logging
import os
import socket
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import tvm_ffi

from .._version import __version__
from . import cache, records
from .arch import target_arch
from .build import BuildSpec, CompileError, Unit, run_build
from .codegen import INCLUDE_DIR, KERNELS_DIR, ClosureStats, check_wrappers, header_closure, render_unit, resolve_source
from .config import JIT_VAR, emu_sanitizers, jit_enabled
from .memo import KeyedLocks
from .toolchain import Toolchain, ToolchainError, toolchain

logger = logging.getLogger("kernkit.jit")

BACKENDS = ("cuda", "cpu")

# Loaded modules by (key, toolchain fingerprint or "*"): the in-memory cache.
_modules: dict[tuple[str, str], tvm_ffi.Module] = {}
_module_locks = KeyedLocks()


class JitDisabledError(RuntimeError):
    """``KERNKIT_JIT=off`` and the requested specialization is not in the cache."""


class CaptureCompileError(RuntimeError):
    """A specialization that is not in the cache was requested while the current CUDA stream is
    capturing a graph: kernkit never compiles inside a capture."""


def _refuse_build_during_capture(spec: BuildSpec, entry: cache.Entry) -> None:
    """Raise ``CaptureCompileError`` when the current CUDA stream is capturing. Runs only on the
    way to a build (a cold key), never on a hit; loading a published build is allowed."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise CaptureCompileError(
            f"{spec.title} ({spec.backend}, key {entry.key[:16]}) is not compiled, and the current CUDA stream "
            f"is capturing a graph: kernkit does not compile inside a capture. Warm it up first: run the op "
            f"once with the same dtypes and shapes before capturing, or build it ahead of time with "
            f"`python -m kernkit.jit warmup`"
        )


def _seq(value: Sequence[str] | str, what: str) -> tuple[str, ...]:
    if isinstance(value, (str, os.PathLike)):
        return (str(value),)
    try:
        return tuple(str(v) for v in value)
    except TypeError:
        raise TypeError(f"load_jit: {what} must be a sequence of strings, got {value!r}") from None


def make_spec(
    marker: Sequence[object],
    *,
    cuda_files: Sequence[str] = (),
    cpp_files: Sequence[str] = (),
    cuda_wrappers: Sequence[tuple[str, str]] = (),
    cpp_wrappers: Sequence[tuple[str, str]] = (),
    extra_cflags: Sequence[str] = (),
    extra_cuda_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    extra_include_paths: Sequence[str] = (),
    backend: str = "cuda",
    seen: ClosureStats | None = None,
) -> BuildSpec:
    """Describe a build: render its units and find the headers they read. Cheap; compiles
    nothing. ``seen`` receives the stats the header closure rests on."""
    if not marker:
        raise ValueError("load_jit: give at least one marker (the kernel's name)")
    if backend not in BACKENDS:
        raise ValueError(f"load_jit: backend must be one of {BACKENDS}, got {backend!r}")
    parts = [str(m) for m in marker]
    title = parts[0] + (f"<{', '.join(parts[1:])}>" if len(parts) > 1 else "")
    cuda_paths = [resolve_source(f) for f in _seq(cuda_files, "cuda_files")]
    cpp_paths = [resolve_source(f) for f in _seq(cpp_files, "cpp_files")]
    cuda_wrappers = check_wrappers(cuda_wrappers, "cuda_wrappers")
    cpp_wrappers = check_wrappers(cpp_wrappers, "cpp_wrappers")
    clash = {n for n, _ in cuda_wrappers} & {n for n, _ in cpp_wrappers}
    if clash:
        raise ValueError(f"load_jit: export names {sorted(clash)} appear in both cuda_wrappers and cpp_wrappers")
    if not cuda_wrappers and not cpp_wrappers:
        raise ValueError("load_jit: no wrappers given, so the module would export nothing")
    if cuda_wrappers and not cuda_paths:
        raise ValueError("load_jit: cuda_wrappers given without cuda_files")
    if cpp_wrappers and not cpp_paths:
        raise ValueError("load_jit: cpp_wrappers given without cpp_files")
    include_paths = tuple(str(Path(p).resolve()) for p in _seq(extra_include_paths, "extra_include_paths"))

    units = []
    if cuda_paths:
        text = render_unit(title, cuda_paths, cuda_wrappers)
        units.append(Unit("kernel.cu", text, "nvcc") if backend == "cuda" else Unit("kernel_emu.cc", text, "emu"))
    if cpp_paths:
        units.append(Unit("host.cc", render_unit(title, cpp_paths, cpp_wrappers), "cxx"))
    has_cuda = bool(cuda_paths)
    effective = backend if has_cuda else "host"
    roots = cuda_paths + cpp_paths
    if effective == "cpu":
        roots.append(INCLUDE_DIR / "kernkit" / "emu" / "runtime.h")
    deps = header_closure(roots, [INCLUDE_DIR, KERNELS_DIR, *map(Path, include_paths)], seen)
    return BuildSpec(
        title=title,
        kernel=parts[0],
        variant="_".join(parts[1:]),
        backend=effective,
        units=tuple(units),
        arch=target_arch() if effective == "cuda" else None,
        cflags=_seq(extra_cflags, "extra_cflags"),
        cuda_cflags=_seq(extra_cuda_cflags, "extra_cuda_cflags") if effective == "cuda" else (),
        ldflags=_seq(extra_ldflags, "extra_ldflags"),
        include_paths=include_paths,
        sanitizers=emu_sanitizers() if effective == "cpu" else (),
        deps=deps,
    )


@dataclass(frozen=True)
class JitRequest:
    """A ``load_jit`` call kept as data: ops describe the specializations a model needs with
    these, so they can be built ahead of time (``python -m kernkit.jit warmup``) or loaded."""

    marker: tuple[str, ...]
    options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def make(cls, *marker: object, **options: object) -> JitRequest:
        frozen = {k: _freeze(k, v) for k, v in options.items()}
        return cls(tuple(str(m) for m in marker), tuple(sorted(frozen.items())))

    @property
    def title(self) -> str:
        return self.marker[0] + (f"<{', '.join(self.marker[1:])}>" if len(self.marker) > 1 else "")

    def spec(self, seen: ClosureStats | None = None) -> BuildSpec:
        return make_spec(self.marker, seen=seen, **dict(self.options))  # type: ignore[arg-type]

    def load(self) -> tvm_ffi.Module:
        """The loaded module, compiled first when it is not in the cache. A request loaded
        before (by any process sharing the cache) is found through its record without
        rendering (``records.py``); otherwise the full path runs and writes the record."""
        ident = records.identity(self.marker, self.options)
        if ident is not None:
            hit = records.lookup(ident)
            if hit is not None:
                module = _load_hit(hit)
                if module is not None:
                    return module
        seen = ClosureStats()
        module, entry, fingerprint, tc = _load(self.spec(seen))
        # A "*" fingerprint with the JIT on means no compiler was found: which build such a
        # machine should load is not settled enough to remember.
        if ident is not None and (fingerprint != "*" or not jit_enabled()):
            records.store(ident, entry, fingerprint, seen, tc)
        return module

    def build(self) -> Path:
        """Make sure the library is in the disk cache (compiling if needed) without loading it."""
        return ensure_built(self.spec())


def load_jit(
    *marker: object,
    cuda_files: Sequence[str] = (),
    cpp_files: Sequence[str] = (),
    cuda_wrappers: Sequence[tuple[str, str]] = (),
    cpp_wrappers: Sequence[tuple[str, str]] = (),
    extra_cflags: Sequence[str] = (),
    extra_cuda_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    extra_include_paths: Sequence[str] = (),
    backend: str = "cuda",
) -> tvm_ffi.Module:
    """Build (or find in the cache) and load one specialization of kernel templates.

    ``marker`` names the specialization (its first element is the kernel's name; usually the
    rest is ``*make_cpp_args(...)``). ``cuda_files``/``cpp_files`` are included into a generated
    unit; relative names resolve under ``kernkit/kernels/``, absolute paths are used as given.
    Each wrapper ``(export_name, "symbol<args>")`` becomes a function of the returned module.
    ``backend="cpu"`` compiles the CUDA files with the host compiler against kernkit's CPU
    emulator instead of nvcc; C++-only modules (``cpp_files`` alone) need no CUDA at all.

    A cache hit loads the library without running a compiler. A miss compiles under a per-key
    file lock and publishes atomically; it raises ``CompileError`` when compilation fails and
    ``JitDisabledError`` when ``KERNKIT_JIT=off``.
    """
    return JitRequest.make(
        *marker,
        cuda_files=cuda_files,
        cpp_files=cpp_files,
        cuda_wrappers=cuda_wrappers,
        cpp_wrappers=cpp_wrappers,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
        backend=backend,
    ).load()


def _freeze(name: str, value: object) -> object:
    """An option as a hashable value (sequences become tuples). What cannot be converted is kept
    as given, for ``make_spec`` to reject with its own message."""
    if isinstance(value, (str, os.PathLike)):
        return value
    try:
        if name.endswith("wrappers"):
            return tuple(tuple(w) if isinstance(w, (list, tuple)) else w for w in value)  # type: ignore[attr-defined]
        return tuple(value)  # type: ignore[call-overload]
    except TypeError:
        return value


def _resolve(spec: BuildSpec) -> tuple[cache.Entry, Toolchain | None, ToolchainError | None, str, bool]:
    key = cache.key_material(spec)
    entry = cache.Entry.of(spec, key)
    allow_build = jit_enabled()
    tc: Toolchain | None = None
    tc_error: ToolchainError | None = None
    try:
        tc = toolchain(with_nvcc=spec.backend == "cuda")
    except ToolchainError as e:
        tc_error = e
    # With KERNKIT_JIT=off, or no compiler here, any published toolchain variant will do.
    fingerprint = tc.fingerprint() if (tc is not None and allow_build) else "*"
    return entry, tc, tc_error, fingerprint, allow_build


def ensure_built(spec: BuildSpec) -> Path:
    """The published library of ``spec``, compiled first if needed; nothing is loaded."""
    return _find_or_build(spec, *_resolve(spec))


def load_spec(spec: BuildSpec) -> tvm_ffi.Module:
    """Load a described build, compiling it first when it is not in the cache."""
    return _load(spec)[0]


def _memoized(mem_key: tuple[str, str], load) -> tvm_ffi.Module | None:
    """The in-memory module of ``mem_key``, else ``load()`` under that key's lock (so threads
    asking for one module load it once); a None from ``load`` is not remembered."""
    module = _modules.get(mem_key)
    if module is None:
        with _module_locks(mem_key):
            module = _modules.get(mem_key)
            if module is None:
                module = load()
                if module is not None:
                    _modules[mem_key] = module
    return module


def _load_hit(hit: records.Hit) -> tvm_ffi.Module | None:
    """The module a valid record points at; None when its build is gone or does not load (the
    full path then decides what to do, rebuilding a damaged build)."""

    def load() -> tvm_ffi.Module | None:
        lib = _published(hit.entry, hit.fingerprint)
        try:
            return tvm_ffi.load_module(str(lib)) if lib is not None else None
        except Exception:
            return None

    return _memoized((hit.entry.key, hit.fingerprint), load)


def _load(spec: BuildSpec) -> tuple[tvm_ffi.Module, cache.Entry, str, Toolchain | None]:
    entry, tc, tc_error, fingerprint, allow_build = _resolve(spec)

    def load() -> tvm_ffi.Module:
        path = _find_or_build(spec, entry, tc, tc_error, fingerprint, allow_build)
        try:
            return tvm_ffi.load_module(str(path))
        except Exception as e:
            # Size and mtime matched the record, yet the library does not load: hash it. A
            # library replaced with the same size and the same mtime is rebuilt here.
            if cache.content_matches(path.parent):
                raise
            warnings.warn(
                f"kernkit: discarding a damaged cache entry and rebuilding: {path} failed to load and "
                f"does not match its build record ({e})", RuntimeWarning, stacklevel=5,
            )
            cache.discard(path.parent)
            path = _find_or_build(spec, entry, tc, tc_error, fingerprint, allow_build)
            return tvm_ffi.load_module(str(path))

    return _memoized((entry.key, fingerprint), load), entry, fingerprint, tc


def _published(entry: cache.Entry, fingerprint: str) -> Path | None:
    """The published library for this key, or None; a corrupt one is discarded with a warning."""
    build_dir = entry.build_dir(fingerprint) if fingerprint != "*" else cache.newest_published(entry)
    if build_dir is None:
        return None
    try:
        meta = cache.check_published(build_dir)
    except cache.CorruptBuildError as e:
        warnings.warn(f"kernkit: discarding a damaged cache entry and rebuilding: {e}", RuntimeWarning, stacklevel=4)
        cache.discard(build_dir)
        return None
    return build_dir / "lib.so" if meta is not None else None


_NO_SPACE = ("No space left on device", "Disk quota exceeded")


def _out_of_space(log: str) -> str:
    """The compiler's "no space" line when a build failed for lack of disk space, else ''."""
    for line in log.splitlines():
        if any(s in line for s in _NO_SPACE):
            return line.strip()
    return ""


def _find_or_build(
    spec: BuildSpec,
    entry: cache.Entry,
    tc: Toolchain | None,
    tc_error: ToolchainError | None,
    fingerprint: str,
    allow_build: bool,
) -> Path:
    lib = _published(entry, fingerprint)
    if lib is not None:
        return lib
    _refuse_build_during_capture(spec, entry)
    if not allow_build:
        raise JitDisabledError(
            f"{JIT_VAR}=off and {spec.title} ({spec.backend}, key {entry.key[:16]}) is not in the cache "
            f"{entry.root}; build it ahead of time on a machine with the compilers (same cache directory, "
            f"e.g. `python -m kernkit.jit warmup`), or unset {JIT_VAR}"
        )
    if tc is None:
        assert tc_error is not None
        raise tc_error
    import filelock  # only a build needs it: importing it costs ~10 ms of every process start

    cache.ensure_dir(entry.root / ".locks")
    lock = filelock.FileLock(str(entry.lock_path(fingerprint)))
    try:
        lock.acquire()
    except filelock.Timeout:
        raise
    except OSError as e:
        raise cache.dir_problem(entry.root, "create the build lock", e) from e
    try:
        lib = _published(entry, fingerprint)  # another process may have built it meanwhile
        if lib is not None:
            return lib
        staging = cache.staging_dir(entry, fingerprint)
        try:
            seconds = run_build(spec, tc, staging)
        except CompileError as e:
            if _out_of_space(e.log):
                cache.discard(staging)  # a kept failure would hold on to the little space left
                raise cache.dir_problem(
                    entry.root, f"build {spec.title}", OSError(errno.ENOSPC, _out_of_space(e.log))
                ) from e
            kept = cache.keep_failed(staging, entry)
            raise e.relocated(staging, kept) from None
        except OSError as e:  # writing the sources or the log into the staging directory
            cache.discard(staging)
            raise cache.dir_problem(entry.root, f"build {spec.title}", e) from e
        except BaseException:
            cache.discard(staging)
            raise
        meta = {
            "title": spec.title,
            "backend": spec.backend,
            "arch": str(spec.arch) if spec.arch else None,
            "key": entry.key,
            "toolchain": {"cxx": tc.cxx.version, "nvcc": tc.nvcc.version if tc.nvcc else None},
            "kernkit": __version__,
            "tvm_ffi": tvm_ffi.__version__,
            "built_at": cache.now(),
            "build_seconds": round(seconds, 3),
            "host": socket.gethostname(),
        }
        try:
            final = cache.publish(staging, entry, fingerprint, meta)
        except cache.CacheDirError:
            cache.discard(staging)
            raise
    finally:
        lock.release()
    logger.info("kernkit: compiled %s (%s) in %.2f s", spec.title, spec.backend, seconds)
    return final / "lib.so"
