"""Ahead-of-time builds: collect the specializations a model shape needs and compile them in
parallel, so that a deployment can run with ``KERNKIT_JIT=off``.

Each op module of ``kernkit.ops`` has ``specializations(...)``, which returns the
``JitRequest`` list for given shape options. ``collect`` calls it with the options it accepts;
``build_all`` builds the requests on a thread pool (the compilers are subprocesses, so threads
run them in parallel).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .core import JitRequest

#: Op modules of ``kernkit.ops`` with their ops; ``warmup`` accepts either name.
OP_MODULES: dict[str, tuple[str, ...]] = {
    "elementwise": ("scale",),
    "kvcache": ("store_cache",),
    "embedding": ("indexing",),
    "radix": ("compare_key",),
}


#: Command-line flag of each ``specializations`` parameter (others: ``--set name=value``).
FLAGS: dict[str, str] = {
    "dtypes": "--dtype",
    "num_heads": "--num-heads",
    "head_dim": "--head-dim",
    "hidden_size": "--hidden-size",
    "backend": "--backend",
}


class WarmupError(ValueError):
    """The warmup options do not describe a set of builds."""


def resolve_op(name: str) -> str:
    """The op module named by ``name``, which may be the module (``kvcache``) or one of its ops
    (``store_cache``)."""
    if name in OP_MODULES:
        return name
    for module, ops in OP_MODULES.items():
        if name in ops:
            return module
    known = sorted(set(OP_MODULES) | {op for ops in OP_MODULES.values() for op in ops})
    raise WarmupError(f"unknown op {name!r}; known: {', '.join(known)}")


def load_function(target: str) -> Callable[..., Iterable[JitRequest]]:
    """``package.module:function`` -> the function (a user's own ``specializations``)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise WarmupError(f"--spec expects 'module:function', got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise WarmupError(f"--spec {target}: cannot import {module_name}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise WarmupError(f"--spec {target}: {module_name} has no {attr!r}") from None


def call_with(fn: Callable[..., Iterable[JitRequest]], options: Mapping[str, object], label: str) -> list[JitRequest]:
    """Call ``fn`` with the ``options`` its signature accepts. A required parameter without an
    option raises ``WarmupError`` naming the command-line flag to give."""
    sig = inspect.signature(fn)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    kwargs = {k: v for k, v in options.items() if takes_any or k in sig.parameters}
    missing = [
        name for name, p in sig.parameters.items()
        if p.default is inspect.Parameter.empty and name not in kwargs
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if missing:
        flags = ", ".join(FLAGS.get(m, "--" + m.replace("_", "-")) for m in missing)
        raise WarmupError(f"{label} needs {flags}")
    requests = list(fn(**kwargs))
    bad = [r for r in requests if not isinstance(r, JitRequest)]
    if bad:
        raise WarmupError(f"{label} returned {type(bad[0]).__name__}, expected kernkit.jit.JitRequest items")
    return requests


@dataclass
class Collected:
    """The requests to build, and the op modules skipped for want of shape options."""

    requests: list[JitRequest] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def collect(ops: Sequence[str], specs: Sequence[str], options: Mapping[str, object]) -> Collected:
    """The unique requests of the named ops (all op modules when neither ``ops`` nor ``specs``
    is given) and of the ``module:function`` specs. With the default set, an op module whose
    required options are missing is skipped and reported; a named one raises."""
    out = Collected()
    named = [resolve_op(o) for o in ops]
    modules = list(dict.fromkeys(named)) if (named or specs) else list(OP_MODULES)
    for module in modules:
        try:
            fn = getattr(importlib.import_module(f"kernkit.ops.{module}"), "specializations", None)
        except ImportError as e:
            if module in named:
                raise WarmupError(f"cannot import kernkit.ops.{module}: {e}") from e
            out.skipped.append(f"{module}: not importable ({e})")
            continue
        if fn is None:
            if module in named:
                raise WarmupError(f"kernkit.ops.{module} has no specializations()")
            out.skipped.append(f"{module}: no specializations()")
            continue
        try:
            out.requests += call_with(fn, options, module)
        except WarmupError as e:
            if module in named:
                raise
            out.skipped.append(str(e))
        except Exception as e:  # e.g. a dtype the op does not support, no target architecture
            if module in named:
                raise WarmupError(f"{module}: {e}") from e
            out.skipped.append(f"{module}: {e}")
    for target in specs:
        try:
            out.requests += call_with(load_function(target), options, target)
        except WarmupError:
            raise
        except Exception as e:
            raise WarmupError(f"{target}: {type(e).__name__}: {e}") from e
    out.requests = list(dict.fromkeys(out.requests))
    return out


@dataclass(frozen=True)
class Outcome:
    """What happened to one request: ``built``, ``cached`` or ``failed`` (with the error)."""

    request: JitRequest
    status: str
    seconds: float
    error: str = ""


def _built_since(lib_path: Path, start: float) -> bool:
    """Whether the build record next to ``lib_path`` is newer than ``start`` (built by this run,
    or by another process meanwhile) rather than found in the cache."""
    try:
        meta = json.loads((Path(lib_path).parent / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return float(meta.get("built_at", 0.0)) >= start


def build_one(request: JitRequest, start: float) -> Outcome:
    t0 = time.perf_counter()
    try:
        path = request.build()
    except Exception as e:  # reported per request; the others still build
        return Outcome(request, "failed", time.perf_counter() - t0, f"{type(e).__name__}: {e}")
    status = "built" if _built_since(path, start) else "cached"
    return Outcome(request, status, time.perf_counter() - t0)


def build_all(
    requests: Sequence[JitRequest],
    jobs: int | None = None,
    progress: bool = True,
) -> list[Outcome]:
    """Build every request (in the disk cache, nothing loaded) with ``jobs`` parallel builds
    (default: the number of cores), showing a progress bar unless ``progress`` is false."""
    from tqdm import tqdm

    start = time.time()
    jobs = max(1, jobs or os.cpu_count() or 1)
    outcomes: list[Outcome] = []
    with tqdm(total=len(requests), desc="warmup", unit="build", disable=not progress) as bar:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(build_one, r, start) for r in requests]
            for future in as_completed(futures):
                outcome = future.result()
                outcomes.append(outcome)
                bar.set_postfix_str(f"{outcome.status} {outcome.request.title}", refresh=False)
                bar.update(1)
    order = {r: i for i, r in enumerate(requests)}
    return sorted(outcomes, key=lambda o: order[o.request])
