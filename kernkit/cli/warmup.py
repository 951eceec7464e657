"""Build, ahead of time, the specializations a model shape needs, so that a deployment can run
with KERNKIT_JIT=off (no compiler at run time; same KERNKIT_CACHE_DIR, compilers and target
architecture).

Each registered op says what it needs through its specializations(**model_shape); warmup calls
it with the options it takes: --dtype, --backend, and --set NAME=VALUE for the rest of the shape
(ints and floats are parsed). Without OP names every registered op is considered, and those
whose required options are not given are skipped and listed; a named op that lacks one is an
error. --import MODULE imports your own op module first, so that its ops register. The builds
run in parallel (--jobs, default: the number of cores). Ctrl-C cancels the builds not started,
stops the running ones (none is kept as a failed build) and exits with status 130.

--manifest FILE builds exactly the requests a run recorded (KERNKIT_RECORD=FILE), ops and user
kernels alike, for the architectures --arch names (default: those recorded), on any machine,
with no GPU needed. Replaying a request runs the compilers with its flags, and a flag can start
any program (-wrapper, -fplugin, -B): for a manifest from elsewhere, add --no-extra-flags, which
refuses the whole manifest, before anything is built, if a request carries compiler or linker
flags. A request with a control character in any string is always refused.

examples:
  python -m kernkit.jit warmup scale --dtype bf16 fp16
  python -m kernkit.jit warmup store_cache --dtype bf16 --set num_heads=8 head_dim=128
  python -m kernkit.jit warmup --dtype bf16 --set num_heads=8 head_dim=128 hidden_size=4096
  python -m kernkit.jit warmup --import my_ops my_ns::my_op --set block=256 --list
  python -m kernkit.jit warmup --manifest kernels.json --arch 9.0 10.0
  python -m kernkit.jit warmup --manifest from-elsewhere.json --no-extra-flags
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

import torch
from tqdm import tqdm

from ..jit import ArchError, JitSpec
from ..jit.arch import ARCH_VAR
from . import replay

_DTYPES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32",
           "fp64": "float64", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}

#: The flags that give the ``specializations`` parameters other than the model shape's.
_FLAGS = {"dtypes": "--dtype", "backend": "--backend"}


class WarmupError(ValueError):
    """The options do not describe a set of builds: an unknown op or dtype, a missing option."""


def parse_dtype(name: str) -> torch.dtype:
    """``fp16``, ``bf16``, ``fp32``, ``fp8_e4m3``... or a torch name (``bfloat16``,
    ``torch.int32``) as a ``torch.dtype``; raises ``WarmupError`` for an unknown name."""
    key = name.strip().lower().removeprefix("torch.")
    dtype = getattr(torch, _DTYPES.get(key, key), None)
    if not isinstance(dtype, torch.dtype):
        raise WarmupError(f"unknown dtype {name!r} (e.g. fp16, bf16, fp32, fp8_e4m3, int32)")
    return dtype


def parse_shape(items: Sequence[str]) -> dict[str, object]:
    """``["num_heads=8", ...]`` as ``{"num_heads": 8, ...}``: ints and floats parsed, other
    values kept as strings; raises ``WarmupError`` for an item without ``=``."""
    shape: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise WarmupError(f"--set expects NAME=VALUE, got {item!r}")
        for kind in (int, float, str):
            try:
                shape[name.strip().replace("-", "_")] = kind(text.strip())
                break
            except ValueError:
                pass
    return shape


def _specializations(op, options: Mapping[str, object]) -> list[JitSpec]:
    """Call ``op.specializations`` with the options its signature takes; a required parameter
    that is not given raises ``WarmupError`` naming its flag."""
    params = inspect.signature(op.specializations).parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    kwargs = {k: v for k, v in options.items() if takes_any or k in {p.name for p in params}}
    missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise WarmupError("missing " + ", ".join(_FLAGS.get(m, f"--set {m}=VALUE") for m in missing))
    return list(op.specializations(**kwargs))


#: Why an op's GPU builds cannot be listed here, and the flags that would say what to build.
NO_ARCH = (f"no CUDA device is visible to say which GPU to build for: pass --backend emu for kernkit's CPU "
           f"emulator, or set {ARCH_VAR} to the target's compute capability (e.g. {ARCH_VAR}=9.0)")


def collect(names: Sequence[str], options: Mapping[str, object]) -> tuple[list[JitSpec], list[str]]:
    """The specializations of registered ops for a model shape.

    Parameters
    ----------
    names
        Op names (``scale`` or ``kernkit::scale``); empty for every registered op, kernkit's and
        those of the modules imported so far.
    options
        Keyword arguments of the ops' ``specializations``: ``dtypes``, ``backend`` and the model
        shape (``num_heads``...); each op gets those its signature takes.

    Returns
    -------
    ``(specs, skipped)``: the distinct specs in op order, and one line per op of the default
    set that was left out (an option missing, or its ``specializations`` raised). For a named
    op these, and an unknown name, raise ``WarmupError``.
    """
    import kernkit.ops  # registers kernkit's own ops

    ops = [op for op in kernkit.ops.registered_ops() if op.specializations is not None]
    for name in names:
        if not any(name in (op.qualname, op.name) for op in ops):
            raise WarmupError(f"unknown op {name!r}; registered: {', '.join(op.qualname for op in ops)}")
    specs: list[JitSpec] = []
    skipped: list[str] = []
    no_arch: list[str] = []  # the ops skipped for want of a target: one line for them all
    for op in ops:
        if names and op.qualname not in names and op.name not in names:
            continue
        try:
            specs += _specializations(op, options)
        except Exception as e:  # a missing option, a dtype the op does not take, no target arch
            why = NO_ARCH if isinstance(e, ArchError) and not os.environ.get(ARCH_VAR) else str(e)
            if names:
                raise WarmupError(f"{op.qualname}: {why}") from e
            if why is NO_ARCH:
                no_arch.append(op.qualname)
            else:
                skipped.append(f"{op.qualname}: {e}")
    if no_arch:
        skipped.insert(0, f"{', '.join(no_arch)}: {NO_ARCH}")
    return list(dict.fromkeys(specs)), skipped


def _only_warnings(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def _build(spec: JitSpec, start: float, stop: threading.Event) -> tuple[str, str]:
    if stop.is_set():  # Ctrl-C came before this build began
        return "not built", ""
    try:
        lib = spec.build()
        built_at = json.loads((lib.parent / "meta.json").read_bytes()).get("built_at", 0)
    except KeyboardInterrupt:  # Ctrl-C reached this build's compilers: this thread starts no other
        stop.set()
        raise
    except Exception as e:  # reported per spec; the others still build
        return "failed", f"{type(e).__name__}: {e}"
    return ("built" if built_at >= start else "cached"), ""


class WarmupInterrupted(KeyboardInterrupt):
    """Ctrl-C (``SIGINT``) stopped ``build_all``: the queued builds were cancelled and the running
    ones stopped, leaving nothing published or kept as failed. ``results`` is ``build_all``'s
    list, with ``not built`` for each of those."""

    def __init__(self, results: list[tuple[str, str]]) -> None:
        super().__init__("interrupted")
        self.results = results


def build_all(specs: Sequence[JitSpec], jobs: int | None = None, progress: bool = True) -> list[tuple[str, str]]:
    """Build every spec into the cache; nothing is loaded.

    Parameters
    ----------
    specs
        What to build.
    jobs
        Builds at once; default: the number of cores.
    progress
        Show a progress bar (on stderr).

    Returns
    -------
    ``(status, error)`` per spec, in order: ``built`` (by this call, or by another process
    meanwhile), ``cached`` or ``failed`` with the error's text. Ctrl-C raises
    ``WarmupInterrupted`` once the running builds have stopped.
    """
    start = time.time()
    # Each thread runs JitSpec.build, the same locked build-and-publish path as an op's first
    # call: a key another thread or process is building is waited for and found, never built
    # twice. The compilers are subprocesses, so threads build in parallel.
    #
    # The progress bar replaces the JIT layer's line per compile. A filter rather than a level:
    # that logger's INFO level is set by its first compile, and restoring NOTSET would leave the
    # process's later compiles silent.
    jit_log = logging.getLogger("kernkit.jit")
    jit_log.addFilter(_only_warnings)
    pool, stop = ThreadPoolExecutor(max(1, jobs or os.cpu_count() or 1)), threading.Event()
    futures: list[Future] = []
    try:
        futures = [pool.submit(_build, spec, start, stop) for spec in specs]
        with tqdm(total=len(futures), desc="warmup", unit="build", disable=not progress) as bar:
            for _ in as_completed(futures):
                bar.update(1)
        results = [f.result() for f in futures]
    except KeyboardInterrupt:
        stop.set()
        _stop(pool)
        raise WarmupInterrupted([_outcome(f) for f in futures]) from None
    finally:
        _stop(pool)
        jit_log.removeFilter(_only_warnings)
    return results


def _stop(pool: ThreadPoolExecutor) -> None:
    """Cancel the builds not started and wait for the running ones. After Ctrl-C, which reaches
    the compilers too (the terminal signals the whole process group), those stop at once
    (``run_ninja`` raises ``KeyboardInterrupt``) and leave nothing: waiting lets them clean up. A
    second Ctrl-C does not cut that short."""
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            return
        except KeyboardInterrupt:
            continue


def _outcome(future: Future) -> tuple[str, str]:
    """A finished build's ``(status, error)``; ``not built`` for one cancelled or interrupted."""
    if future.cancelled() or isinstance(future.exception(), KeyboardInterrupt):
        return "not built", ""
    return future.result()


def describe(spec: JitSpec) -> str:
    """``scale<bf16_t, true>  [nvcc sm_90a]``, ``compare_key  [c++]``: a spec and its backend."""
    return f"{spec.title}  [{spec.backend or 'c++'}{f' sm_{spec.arch.sm}' if spec.arch else ''}]"


def run(args: argparse.Namespace) -> int:
    """The ``warmup`` subcommand; returns 1 when a build failed, 130 when Ctrl-C stopped the
    builds (one line on stderr says how far they got), else 0."""
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise WarmupError(f"--import {module}: {e}") from e
    specs: list[JitSpec]
    skipped: list[str]
    if args.manifest:
        if args.ops or args.dtype or args.shape or args.backend:
            raise WarmupError("--manifest names the builds itself: give no OP, --dtype, --set or --backend with it")
        specs, skipped = replay.specs(args.manifest, args.arch, extra_flags=not args.no_extra_flags), []
    elif args.arch or args.no_extra_flags:
        raise WarmupError(f"{'--arch' if args.arch else '--no-extra-flags'} goes with --manifest")
    else:
        options = {**({"dtypes": [parse_dtype(d) for d in args.dtype]} if args.dtype else {}),
                   **parse_shape(args.shape)}
        if args.backend:
            options["backend"] = args.backend
        specs, skipped = collect(args.ops, options)
    for line in skipped:
        print(f"skipped {line}")
    if args.list:
        for spec in specs:
            print(describe(spec))
        return 0
    try:
        results = build_all(specs, args.jobs, progress=not args.quiet)
    except WarmupInterrupted as e:
        counts = [sum(status == s for status, _ in e.results) for s in ("built", "cached", "failed", "not built")]
        print("interrupted: {} specializations: {} built, {} already cached, {} failed, {} not built".format(
            len(e.results), *counts), file=sys.stderr)
        return 130  # as a shell reports a command that SIGINT ended
    for spec, (status, error) in zip(specs, results, strict=True):
        if status == "failed":
            print(f"FAILED {describe(spec)}:\n    " + "\n    ".join(error.splitlines()[:8]))
    counts = [sum(status == s for status, _ in results) for s in ("built", "cached", "failed")]
    print("{} specializations: {} built, {} already cached, {} failed".format(len(results), *counts))
    return 1 if counts[2] else 0
