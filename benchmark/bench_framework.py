"""The framework's own speed: cold compile, warm load, import, host cost per call, warmup.

    python benchmark/bench_framework.py [--out DIR] [--tag NAME] [--repeats 3] [--loads 9] [--warmup-specs 16]
    python benchmark/bench_framework.py --cold [--backends emu nvrtc nvcc sglang] [--repeats 5] [--out DIR]

``--cold`` prints only the compile timeline a user meets (issue 27's figures): per backend, the
first call of a fresh install (empty cache, fresh process), a later new specialization in that cache
once its precompiled header and helper object are made, and the first call of a fresh process on
that warm cache (the load, the cubin's load at the first launch, the op's first run), for rmsnorm
bf16 (hidden 3072, then other sizes); on a GPU machine through the op on CUDA tensors, without one
through ``build_and_load`` (emu: the op on CPU tensors). ``sglang`` is the peer: sglang's JIT
rmsnorm on CUDA tensors (``bench_sglang.load_sglang``: 0.5.23's ``sglang.kernels``, else 0.5.10's
``jit_kernel``), its cache (``SGLANG_JIT_CACHE_DIR``, 0.5.10's ``TVM_FFI_CACHE_DIR``) as fresh as kernkit's.

Every figure comes from fresh subprocesses with private cache directories; the worker functions
(``w_*``) say what each measures. The specialization is store_cache for bf16 rows of 8 x 128
(2 KB), built by nvcc (without a GPU for $KERNKIT_CUDA_ARCH, default 9.0). Host cost runs on CUDA
tensors with a GPU, else as a CPU proxy (CPU tensors, emulator build, n=0: the launcher validates
and returns). It measures and prints; it never asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median as med

# No torch at module level: the import worker times `import torch` itself.
ROW_SHAPE = (8, 128)  # bf16: 2 KB rows

# Workers: each runs in a fresh interpreter (``--worker NAME ARGS``) and prints one JSON line.


def _count_subprocesses() -> list[str]:
    """Record every subprocess started from now on, by wrapping the functions that start them
    (an audit hook would run Python on every open, import and dlopen, inflating the timings)."""
    started: list[str] = []

    def wrap(owner, name: str) -> None:
        orig = getattr(owner, name, None)
        if orig is not None:
            def counted(*a, **k):
                started.append(name)
                return orig(*a, **k)

            setattr(owner, name, counted)

    wrap(subprocess.Popen, "__init__")
    for name in ("system", "fork", "posix_spawn", "posix_spawnp", "execv", "execve"):
        wrap(os, name)
    return started


def _child_cpu() -> float:
    """CPU seconds of the finished children (the compilers), which other load does not inflate."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def w_compile(how: str, where: str) -> dict:
    """Cold compile + load of the specialization: through kernkit into the empty cache ``where``
    (``how=nvcc`` or ``how=nvrtc``, the backend), or its generated unit through bare
    ``tvm_ffi.cpp.build_inline`` in the build directory ``where`` (``how=inline``), with the
    includes and defines the kernel needs."""
    import torch
    import tvm_ffi.cpp

    from kernkit.jit import INCLUDE_DIR, KERNELS_DIR
    from kernkit.jit.backends.base import find_cuda_home
    from kernkit.ops.store_cache import store_cache_spec

    os.environ["KERNKIT_CACHE_DIR"] = where
    spec = store_cache_spec(torch.bfloat16, ROW_SHAPE, "nvcc" if how == "inline" else how)
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = f"{spec.arch}{'a' if spec.arch.arch_specific else ''}"
    home = find_cuda_home()
    os.environ["CUDA_HOME"] = str(home)  # tvm-ffi looks next to the nvcc on PATH, maybe a wrapper
    (text,) = [text for _, text, _ in spec.units]
    t0, c0 = time.perf_counter(), _child_cpu()
    if how != "inline":
        spec.build_and_load()
    else:
        incs = [str(INCLUDE_DIR), str(KERNELS_DIR), str(home / "include" / "cccl")]
        tvm_ffi.load_module(tvm_ffi.cpp.build_inline(
            "store_inline", cuda_sources=text, build_directory=where,
            extra_cuda_cflags=["-DNDEBUG", "--expt-relaxed-constexpr"], extra_include_paths=incs))
    seconds, cpu = time.perf_counter() - t0, _child_cpu() - c0
    return {"seconds": seconds, "cpu": cpu, "lib": str(spec.build()) if how != "inline" else None}


def w_load(how: str, where: str) -> dict:
    """A warm load in a fresh process that has imported torch, tvm_ffi and kernkit.ops (and made
    the CUDA context on a GPU): through the op's module factory (``how=factory``, ``where`` the
    cache) or, the floor, ``tvm_ffi.load_module`` of the library (``how=floor``)."""
    import gc

    if how == "factory":
        os.environ["KERNKIT_CACHE_DIR"] = where
    import torch
    import tvm_ffi

    from kernkit.ops.store_cache import _module as store_cache_module

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
    shape = torch.Size([4096, *ROW_SHAPE])
    started = _count_subprocesses()
    gc.collect()  # a collection of torch's objects inside the timed region is not the load's
    t0 = time.perf_counter()
    if how == "factory":
        store_cache_module(torch.bfloat16, shape, True)
    else:
        tvm_ffi.load_module(where)
    return {"ms": (time.perf_counter() - t0) * 1e3, "subprocesses": len(started)}


def w_import() -> dict:
    """``import torch, tvm_ffi``, then ``import kernkit`` and ``kernkit.ops`` on top (ms)."""
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import tvm_ffi  # noqa: F401

    t1, started = time.perf_counter(), _count_subprocesses()
    import kernkit  # noqa: F401

    t2 = time.perf_counter()
    import kernkit.ops  # noqa: F401

    t3 = time.perf_counter()
    return {"torch_tvm_ms": (t1 - t0) * 1e3, "kernkit_ms": (t2 - t1) * 1e3, "ops_ms": (t3 - t1) * 1e3,
            "subprocesses": len(started)}


_NOOP = """
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
void noop(tvm::ffi::TensorView, tvm::ffi::TensorView, tvm::ffi::TensorView, tvm::ffi::TensorView,
          tvm::ffi::TensorView) {}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(noop, noop);
"""


def w_host_cost(cache: str, build_dir: str) -> dict:
    """Host cost per call (us) of the op, its module function, its custom op and a no-op."""
    os.environ["KERNKIT_CACHE_DIR"] = cache
    import torch
    import tvm_ffi.cpp

    import common  # benchmark/common.py, next to this file

    from kernkit import ops
    from kernkit.ops.store_cache import _module as store_cache_module

    dev, n = ("cuda", 64) if torch.cuda.is_available() else ("cpu", 0)
    noop = tvm_ffi.cpp.load_inline("noop5", cpp_sources=_NOOP, build_directory=build_dir).noop
    kc, vc = (torch.randn(4096, *ROW_SHAPE, device=dev).to(torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(n, *ROW_SHAPE, device=dev).to(torch.bfloat16) for _ in range(2))
    idx = torch.randperm(4096, device=dev)[:n].to(torch.int32)
    module_fn = store_cache_module(kc.dtype, kc.shape, kc.is_cuda).store_cache
    custom = torch.ops.kernkit.store_cache
    us = common.host_us({
        "ops.store_cache": lambda: ops.store_cache(kc, vc, idx, k, v),
        "module function": lambda: module_fn(kc, vc, idx, k, v),
        "torch.ops.kernkit.store_cache": lambda: custom(kc, vc, idx, k, v),
        "tvm-ffi no-op (same 5 tensors)": lambda: noop(kc, vc, idx, k, v),
    }, sync=common.sync_for(dev))
    return {"where": "GPU, CUDA tensors, n=64" if dev == "cuda" else "CPU proxy: CPU tensors, emulator build, n=0",
            "us": us}


def w_warmup(cache: str, count: str, first: str = "1") -> dict:
    """``build_all`` of ``count`` specializations (distinct row sizes from ``first`` heads) into
    ``cache``."""
    os.environ["KERNKIT_CACHE_DIR"] = cache
    import torch

    from kernkit.cli.warmup import build_all
    from kernkit.ops.store_cache import store_cache_spec

    specs = [store_cache_spec(torch.bfloat16, (heads, 128)) for heads in range(int(first), int(first) + int(count))]
    t0, c0 = time.perf_counter(), _child_cpu()
    results = build_all(specs, progress=False)
    return {"seconds": time.perf_counter() - t0, "cpu": _child_cpu() - c0, "jobs": os.cpu_count(),
            "built": sum(s == "built" for s, _ in results),
            "failed": [e[:300] for s, e in results if s == "failed"]}


def w_first(backend: str, where: str, hidden: str) -> dict:
    """The first rmsnorm call of a process with ``where`` as its cache: ``import kernkit.ops``
    (timed apart), then the call (``emu``: the op on CPU tensors; ``nvrtc``/``nvcc``: the op on
    CUDA tensors with a GPU, else ``build_and_load`` of its spec; ``sglang``: sglang's rmsnorm,
    import of its JIT kernels timed apart)."""
    os.environ["KERNKIT_CACHE_DIR"] = os.environ["TVM_FFI_CACHE_DIR"] = os.environ["SGLANG_JIT_CACHE_DIR"] = where
    t0 = time.perf_counter()
    import torch

    if backend == "sglang":
        from bench_sglang import load_sglang

        sgl = load_sglang()
        if sgl is None or sgl.rmsnorm is None:
            raise SystemExit("sglang's JIT kernels are not importable")
        x = torch.randn(4, int(hidden), dtype=torch.bfloat16, device="cuda")
        w = torch.randn(int(hidden), dtype=torch.bfloat16, device="cuda")
        t1, c1 = time.perf_counter(), _child_cpu()
        sgl.rmsnorm(x, w, x, 1e-6)
        torch.cuda.synchronize()
        return {"import_s": t1 - t0, "seconds": time.perf_counter() - t1, "cpu": _child_cpu() - c1}

    import kernkit.ops
    from kernkit.ops.rmsnorm import rmsnorm_spec

    t1, c1 = time.perf_counter(), _child_cpu()
    n = int(hidden)
    if backend == "emu" or torch.cuda.is_available():
        if backend != "emu":
            os.environ["KERNKIT_BACKEND"] = backend
        dev = "cpu" if backend == "emu" else "cuda"
        x, w = torch.randn(4, n, dtype=torch.bfloat16, device=dev), torch.randn(n, dtype=torch.bfloat16, device=dev)
        t1, c1 = time.perf_counter(), _child_cpu()
        kernkit.ops.rmsnorm(x, w)
        if dev == "cuda":
            torch.cuda.synchronize()
    else:
        rmsnorm_spec(torch.bfloat16, n, backend).build_and_load()
    return {"import_s": t1 - t0, "seconds": time.perf_counter() - t1, "cpu": _child_cpu() - c1}


WORKERS = {f.__name__[2:].replace("_", "-"): f for f in
           (w_compile, w_load, w_import, w_host_cost, w_warmup, w_first)}

# The driver: one function per group of rows, each returning (what, measured) pairs.


class WorkerError(RuntimeError):
    """A worker exited with an error; the message holds the end of its output."""


def run_worker(name: str, *args: object) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise WorkerError(f"{name}: " + " / ".join(tail)[-600:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def runs(values: list[float]) -> str:
    return f"{med(values):.2f} (runs: {', '.join(f'{x:.2f}' for x in values)})"


def compile_rows(tmp: Path, repeats: int, nvrtc: bool) -> list[tuple[str, str]]:
    """Cold compile + load, kernkit's backends against bare build_inline."""
    rows = []
    hows = ["nvcc", *(["nvrtc"] if nvrtc else []), "inline"]
    seconds = {}
    for how in hows:
        res = [run_worker("compile", how, tmp / f"cold-{how}{i}") for i in range(repeats)]
        seconds[how] = [r["seconds"] for r in res]
        what = f"kernkit, {how} backend" if how != "inline" else "the nvcc unit via bare tvm_ffi.cpp.build_inline"
        rows.append((f"cold compile + load, one store_cache specialization ({what}): wall s; compiler CPU s",
                     f"{runs(seconds[how])}; CPU {med([r['cpu'] for r in res]):.2f}"))
    rows.append(("kernkit nvcc / bare build_inline: wall", f"{med(seconds['nvcc']) / med(seconds['inline']):.2f}"))
    if nvrtc:
        rows.append(("kernkit nvrtc / kernkit nvcc: wall", f"{med(seconds['nvrtc']) / med(seconds['nvcc']):.2f}"))
    return rows


def default_backend() -> str:
    from kernkit.jit.backends import default_backend as backend

    return backend()


def warm_load_rows(tmp: Path, loads: int) -> list[tuple[str, str]]:
    """Warm load through the op's factory in fresh processes, and the load_module floor."""
    cache = tmp / "warm"
    lib = run_worker("compile", default_backend(), cache)["lib"]  # what store_cache_module loads
    warm = [run_worker("load", "factory", cache) for _ in range(loads)]
    floor = [run_worker("load", "floor", lib)["ms"] for _ in range(loads)]
    ms = [r["ms"] for r in warm]
    return [
        ("warm load of the built specialization in a fresh process (store_cache_module), ms (median)",
         f"{med(ms):.2f} (min {min(ms):.2f}, max {max(ms):.2f})"),
        ("  the floor: tvm_ffi.load_module of the same library in a fresh process, ms (median)", f"{med(floor):.2f}"),
        ("subprocesses started during a warm load (most in one process)", str(max(r["subprocesses"] for r in warm))),
    ]


def import_rows(loads: int) -> list[tuple[str, str]]:
    imps = [run_worker("import") for _ in range(loads)]
    return [
        ("import torch, tvm_ffi in a fresh process, ms (median)", f"{med([r['torch_tvm_ms'] for r in imps]):.0f}"),
        ("+ import kernkit, ms (median)", f"{med([r['kernkit_ms'] for r in imps]):.1f}"),
        ("+ import kernkit.ops, ms (median)", f"{med([r['ops_ms'] for r in imps]):.1f}"),
        ("subprocesses started by import kernkit.ops (most in one process)",
         str(max(r["subprocesses"] for r in imps))),
    ]


def host_cost_rows(tmp: Path) -> list[tuple[str, str]]:
    r = run_worker("host-cost", tmp / "cache-host", tmp / "noop")
    us, where = r["us"], r["where"]
    rows = [(f"host cost per call, {name} ({where}), us", f"{t:.2f}") for name, t in us.items()]
    rows.append(("ops.store_cache - module function, us", f"{us['ops.store_cache'] - us['module function']:.2f}"))
    what = "the launcher's checks and launch" if where.startswith("GPU") else "the launcher's checks"
    rows.append((f"module function - tvm-ffi no-op ({what}), us",
                 f"{us['module function'] - us['tvm-ffi no-op (same 5 tensors)']:.2f}"))
    return rows


def warmup_rows(tmp: Path, count: int) -> list[tuple[str, str]]:
    """build_all of ``count`` specializations against (count / cores) x one cold compile (its own)."""
    one_compile = run_worker("compile", default_backend(), tmp / "cold-ref")["seconds"]
    r = run_worker("warmup", tmp / "cache-warmup", count)
    again = run_worker("warmup", tmp / "cache-warmup", count, count + 1)  # what the toolchain made is there
    ideal = count / r["jobs"] * one_compile
    rows = [(f"warmup (build_all) of {count} store_cache specializations, {r['jobs']} jobs: wall s",
             f"{r['seconds']:.1f} (built {r['built']}, failed {len(r['failed'])}; compiler CPU {r['cpu']:.1f} s)"),
            (f"  then {count} other specializations into the same cache (nvrtc: its precompiled headers made): wall s",
             f"{again['seconds']:.1f} (built {again['built']}, failed {len(again['failed'])}; "
             f"compiler CPU {again['cpu']:.1f} s)"),
            (f"warmup / ({count} / {r['jobs']} cores x one cold compile of {one_compile:.2f} s)",
             f"{r['seconds'] / ideal:.2f}"),
            ("cores busy with compilers during warmup (compiler CPU s / wall s)",
             f"{r['cpu'] / r['seconds']:.2f} of {r['jobs']}")]
    return rows + [("first warmup failure", e.replace("|", "/").replace("\n", " ")) for e in r["failed"][:1]]


def _wait_for_pch(cache: Path, limit: float = 300.0) -> float:
    """Seconds until every precompiled header and prebuilt helper object started in ``cache``
    is made (or failed)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        made = [(f, "prelude.h.gch.json") for f in (cache / "v2" / "pch").glob("*")]
        made += [(f, "helpers.o.json") for f in (cache / "v2" / "helpers").glob("*")]
        if all((f / name).is_file() or (f / "failed.log").is_file() for f, name in made):
            break
        time.sleep(0.2)
    return time.perf_counter() - t0


def cold_rows(tmp: Path, backends: list[str], repeats: int) -> list[list[str]]:
    """Per backend: ``repeats`` fresh caches, each: the first call (hidden 3072), then, once the
    precompiled header and the helper object are made, a new specialization (hidden 2048) and the
    first call of a fresh process on the warm cache (3072)."""
    rows = []
    for backend in backends:
        first, later, warm, imp, cpu_first, cpu_later, pch = [], [], [], [], [], [], []
        for i in range(repeats):
            cache = tmp / f"cold-{backend}-{i}"
            r = run_worker("first", backend, cache, 3072)
            first.append(r["seconds"])
            cpu_first.append(r["cpu"])
            imp.append(r["import_s"])
            pch.append(_wait_for_pch(cache))
            r = run_worker("first", backend, cache, 2048 - 256 * (i % 4))
            later.append(r["seconds"])
            cpu_later.append(r["cpu"])
            warm.append(run_worker("first", backend, cache, 3072)["seconds"] * 1e3)
            shutil.rmtree(cache, ignore_errors=True)
        rows.append([backend, runs(first), f"{med(cpu_first):.2f}", runs(later), f"{med(cpu_later):.2f}",
                     f"{med(warm):.2f} (max {max(warm):.2f})", f"{med(imp):.2f}", f"{med(pch):.1f}"])
    return rows


def cold_main(args) -> int:
    import torch

    import common

    if not torch.cuda.is_available():
        os.environ.setdefault("KERNKIT_CUDA_ARCH", "9.0")  # inherited by the workers
    tmp = Path(tempfile.mkdtemp(prefix="kernkit-bench-"))
    try:
        rows = cold_rows(tmp, args.backends, args.repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cols = ["backend", "first call of a fresh install, s (median; runs)", "its compiler CPU s",
            "later new specialization, s", "its compiler CPU s", "first call on a warm cache, ms",
            "import kernkit.ops, s", "wait for the precompiled header and the helper object after the first call, s"]
    name = f"cold-{args.tag or ('gpu' if torch.cuda.is_available() else 'cpu')}-{time.strftime('%Y-%m-%d')}-" \
           f"{common.commit().split()[0]}.md"
    lines = common.header("kernkit cold compile: rmsnorm bf16", common.command_line())
    common.write_report(args.out, name, lines + common.markdown_table(cols, rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="also write the table to DIR/framework-<tag>-<date>-<commit>.md")
    ap.add_argument("--tag", help="the results file's machine tag (default: gpu or cpu), e.g. h200")
    ap.add_argument("--repeats", type=int, default=3, help="cold compiles per row (>= 1), each in a fresh cache")
    ap.add_argument("--loads", type=int, default=9, help="fresh processes for the warm-load and import rows (>= 1)")
    ap.add_argument("--warmup-specs", type=int, default=16, help="specializations in the warmup row (0: skip)")
    ap.add_argument("--skip-compile", action="store_true", help="skip the cold-compile rows")
    ap.add_argument("--cold", action="store_true", help="only the cold-compile timeline (first call, later "
                    "specialization, warm load) per backend")
    ap.add_argument("--backends", nargs="+", default=["emu", "nvrtc"],
                    help="--cold's backends (emu, nvrtc, nvcc; sglang for its JIT kernels)")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker[0]](*args.worker[1:])))
        return 0
    if args.cold:
        return cold_main(args)

    import torch

    import common  # next to this script; imports torch

    from kernkit.jit import ToolchainError
    from kernkit.jit.backends import BACKENDS

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ.setdefault("KERNKIT_CUDA_ARCH", "9.0")  # inherited by the workers
    available = {}
    for name in ("nvcc", "nvrtc"):
        try:
            available[name] = bool(BACKENDS[name].compilers())
        except ToolchainError:
            available[name] = False
    nvcc = available["nvcc"]
    rows: list[tuple[str, str]] = []
    notes = [] if nvcc else ["nvcc not found: the compile, warm-load and warmup rows are skipped"]
    tmp = Path(tempfile.mkdtemp(prefix="kernkit-bench-"))
    sections = [
        ("cold compile", nvcc and not args.skip_compile, lambda: compile_rows(tmp, args.repeats, available["nvrtc"])),
        ("warm load", nvcc, lambda: warm_load_rows(tmp, args.loads)),
        ("import", True, lambda: import_rows(args.loads)),
        ("host cost", True, lambda: host_cost_rows(tmp)),
        ("warmup", nvcc and args.warmup_specs > 0, lambda: warmup_rows(tmp, args.warmup_specs)),
    ]
    try:
        for name, enabled, measure in sections:
            if enabled:
                print(f"measuring: {name}", file=sys.stderr, flush=True)
                try:
                    rows += measure()
                except WorkerError as e:
                    notes.append(f"{name} failed: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tag = args.tag or ("gpu" if gpu else "cpu")
    name = f"framework-{tag}-{time.strftime('%Y-%m-%d')}-{common.commit().split()[0]}.md"
    lines = common.header("kernkit framework speed", common.command_line())
    lines += common.markdown_table(["what", "measured"], rows) + ([""] + [f"- {n}" for n in notes] if notes else [])
    common.write_report(args.out, name, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
