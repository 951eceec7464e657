"""The framework's own speed: cold compile, warm load, import, host cost per call, warmup.

    python benchmark/bench_framework.py [--out DIR] [--tag NAME] [--repeats 3] [--warmup-specs 16] [--skip-compile]

Every figure comes from fresh subprocesses with private cache directories (nothing from the
user's cache is read or written):

- cold compile of one ``store_cache`` specialization (2-byte elements, 2 KB rows) through kernkit,
  and a bare ``tvm_ffi.cpp.build_inline`` of the same generated unit (tvm-ffi's default flags,
  plus the includes and defines the kernel needs) in a fresh build directory. Without a GPU the
  target is ``$KERNKIT_CUDA_ARCH`` (default here: 9.0, so sm_90a); nvcc is all it needs.
- warm load: a fresh process imports torch, tvm_ffi and kernkit.ops (and creates the CUDA context
  when there is a GPU), then times the load of the already-built specialization; median of
  several processes, and the number of subprocesses started during the load (audit hook). The
  floor beside it is ``tvm_ffi.load_module`` of the same library in a fresh process.
- import: in a fresh process after ``import torch, tvm_ffi``, the time of ``import kernkit`` and of
  ``import kernkit.ops``, and the subprocesses started meanwhile; median of several processes.
- host cost per call: calls issued back to back without synchronizing, per call, best of 7
  rounds. On a GPU: ``ops.store_cache`` at n=64 against the same module function called
  directly, a bare tvm-ffi function launching a plain one-warp-per-row kernel, torch index_put
  and a tvm-ffi no-op. Without a GPU, a CPU proxy: the same calls with n=0 (the launchers
  validate every tensor and return before launching) on CPU tensors through the emulator build.
- warmup: ``kernkit.jit.warmup.build_all`` of 16 store_cache specializations (distinct row sizes)
  into an empty cache, against (16 / cores) x one cold compile.

The script measures and prints; it never asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for benchmark/common.py

HERE = Path(__file__).resolve().parent
ELEM, ROW_BYTES = 2, 2048  # bf16, 8 heads x 128 dims

# ---------------------------------------------------------------------------------------------
# Workers: each runs in a fresh interpreter and prints one JSON object as its last line.


def _audit_counter() -> list[str]:
    """Count the subprocesses started from now on. The process-starting functions are wrapped
    rather than watched with ``sys.addaudithook``: an audit hook runs Python code on every
    audited event (each ``open``, import and ``dlopen``), which would inflate the timings."""
    import subprocess as sp

    started: list[str] = []

    def wrap(owner, name: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return

        def counted(*a, **k):
            started.append(name)
            return orig(*a, **k)

        setattr(owner, name, counted)

    wrap(sp.Popen, "__init__")
    for name in ("system", "fork", "posix_spawn", "posix_spawnp", "execv", "execve"):
        wrap(os, name)
    return started


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _child_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: the compilers' work, which
    other load on the machine does not inflate the way it inflates wall time."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def w_compile_kernkit(cache: str) -> dict:
    os.environ["KERNKIT_CACHE_DIR"] = cache
    from kernkit.jit import is_arch_support_pdl
    from kernkit.ops.kvcache import store_request

    req = store_request(ELEM, ROW_BYTES, is_arch_support_pdl(), "cuda")
    t0, c0 = time.perf_counter(), _child_cpu()
    path = req.build()
    return {"seconds": time.perf_counter() - t0, "cpu": _child_cpu() - c0, "lib": str(path)}


def _unit_text() -> tuple[str, list[str]]:
    from kernkit.jit import is_arch_support_pdl
    from kernkit.jit.codegen import INCLUDE_DIR, KERNELS_DIR
    from kernkit.ops.kvcache import store_request

    spec = store_request(ELEM, ROW_BYTES, is_arch_support_pdl(), "cuda").spec()
    text = "\n".join(u.text for u in spec.units)
    return text, [str(INCLUDE_DIR), str(KERNELS_DIR)]


def w_compile_inline(build_dir: str) -> dict:
    import tvm_ffi.cpp

    from kernkit.jit import target_arch
    from kernkit.jit.toolchain import find_cuda_home

    arch = target_arch()
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = f"{arch}{'a' if arch.arch_specific else ''}"
    text, incs = _unit_text()
    home = find_cuda_home()
    incs += [str(home / "include" / "cccl")] if home else []
    if home:  # tvm-ffi looks for the toolkit next to the nvcc on PATH, which may be a wrapper script
        os.environ["CUDA_HOME"] = str(home)
    t0 = time.perf_counter()
    c0 = _child_cpu()
    tvm_ffi.cpp.build_inline("store_inline", cuda_sources=text, build_directory=build_dir,
                             extra_cuda_cflags=["-DNDEBUG", "--expt-relaxed-constexpr"], extra_include_paths=incs)
    return {"seconds": time.perf_counter() - t0, "cpu": _child_cpu() - c0}


def w_warm_load(cache: str) -> dict:
    os.environ["KERNKIT_CACHE_DIR"] = cache
    import torch
    import tvm_ffi  # noqa: F401

    import kernkit.ops  # noqa: F401
    from kernkit.jit import is_arch_support_pdl
    from kernkit.ops.kvcache import store_module

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # the context a real process already has
    pdl = is_arch_support_pdl()
    started = _audit_counter()
    import gc

    gc.collect()  # a collection of torch's objects falling inside the timed region is not the load's
    t0 = time.perf_counter()
    store_module(ELEM, ROW_BYTES, pdl, "cuda")
    dt = time.perf_counter() - t0
    return {"ms": dt * 1e3, "subprocesses": len(started)}


def w_load_module(lib: str) -> dict:
    import torch
    import tvm_ffi

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
    t0 = time.perf_counter()
    tvm_ffi.load_module(lib)
    return {"ms": (time.perf_counter() - t0) * 1e3}


def w_import() -> dict:
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import tvm_ffi  # noqa: F401

    t1 = time.perf_counter()
    started = _audit_counter()
    import kernkit  # noqa: F401

    t2 = time.perf_counter()
    import kernkit.ops  # noqa: F401

    t3 = time.perf_counter()
    return {"torch_tvm_ms": (t1 - t0) * 1e3, "kernkit_ms": (t2 - t1) * 1e3, "ops_ms": (t3 - t1) * 1e3,
            "subprocesses": len(started)}


_PLAIN_CPU = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <cstring>
using tvm::ffi::TensorView;
// A bare store: a few checks, then row copies (returns at once for n = 0).
void store_plain(TensorView kc, TensorView vc, TensorView idx, TensorView k, TensorView v) {
  TVM_FFI_ICHECK(kc.ndim() >= 2 && k.ndim() == kc.ndim() && idx.ndim() == 1) << "bad ranks";
  const int64_t n = idx.size(0);
  if (n == 0) return;
  const int64_t row = kc.numel() / kc.size(0) * ((kc.dtype().bits + 7) / 8);
  const int32_t* ix = static_cast<const int32_t*>(idx.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(static_cast<char*>(kc.data_ptr()) + ix[i] * row, static_cast<const char*>(k.data_ptr()) + i * row, row);
    std::memcpy(static_cast<char*>(vc.data_ptr()) + ix[i] * row, static_cast<const char*>(v.data_ptr()) + i * row, row);
  }
}
void noop(TensorView, TensorView, TensorView, TensorView, TensorView) {}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_plain, store_plain);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(noop, noop);
"""

_PLAIN_CUDA = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <cuda_runtime.h>
using tvm::ffi::TensorView;
// A plain one-warp-per-row kernel, 16-byte vectors, int32 indices, contiguous rows.
__global__ void store_plain_kernel(const uint4* k, const uint4* v, uint4* kc, uint4* vc, const int32_t* idx,
                                   int64_t n, int64_t pool, int64_t vecs) {
  const int64_t row = blockIdx.x * 4 + threadIdx.x / 32;
  if (row >= n) return;
  const int64_t d = idx[row];
  if (d < 0 || d >= pool) return;
  for (int64_t j = threadIdx.x % 32; j < vecs; j += 32) {
    kc[d * vecs + j] = k[row * vecs + j];
    vc[d * vecs + j] = v[row * vecs + j];
  }
}
void store_plain(TensorView kc, TensorView vc, TensorView idx, TensorView k, TensorView v) {
  TVM_FFI_ICHECK(kc.ndim() >= 2 && k.ndim() == kc.ndim() && idx.ndim() == 1) << "bad ranks";
  const int64_t n = idx.size(0);
  if (n == 0) return;
  const int64_t vecs = kc.numel() / kc.size(0) * ((kc.dtype().bits + 7) / 8) / 16;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, kc.device().device_id));
  store_plain_kernel<<<(n + 3) / 4, 128, 0, stream>>>(
      static_cast<const uint4*>(k.data_ptr()), static_cast<const uint4*>(v.data_ptr()),
      static_cast<uint4*>(kc.data_ptr()), static_cast<uint4*>(vc.data_ptr()),
      static_cast<const int32_t*>(idx.data_ptr()), n, kc.size(0), vecs);
}
void noop(TensorView, TensorView, TensorView, TensorView, TensorView) {}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_plain, store_plain);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(noop, noop);
"""


def w_host_cost(cache: str, build_dir: str) -> dict:
    import common  # benchmark/common.py, next to this file

    os.environ["KERNKIT_CACHE_DIR"] = cache
    import torch
    import tvm_ffi.cpp

    from kernkit import ops
    from kernkit.jit import is_arch_support_pdl, target_arch
    from kernkit.ops import fallback, kvcache

    gpu = torch.cuda.is_available()
    heads, dim, dtype = 8, 128, torch.bfloat16
    if gpu:
        arch = target_arch()
        os.environ["TVM_FFI_CUDA_ARCH_LIST"] = f"{arch}{'a' if arch.arch_specific else ''}"
        plain = tvm_ffi.cpp.load_inline("plain_store", cuda_sources=_PLAIN_CUDA, build_directory=build_dir)
        dev, n, pool = "cuda", 64, 1 << 20
        module_fn = kvcache.store_module(ELEM, ROW_BYTES, is_arch_support_pdl(), "cuda").store_cache
        sync = torch.cuda.synchronize
    else:
        plain = tvm_ffi.cpp.load_inline("plain_store", cpp_sources=_PLAIN_CPU, build_directory=build_dir)
        dev, n, pool = "cpu", 0, 4096
        if fallback.cpu_backend() != "cpu":
            return {"error": "the CPU emulation backend does not build here"}
        module_fn = kvcache.store_module(ELEM, ROW_BYTES, False, "cpu").store_cache
        sync = lambda: None  # noqa: E731
    g = torch.Generator(device="cpu").manual_seed(0)
    kc = torch.randn(pool, heads, dim, generator=g).to(dtype).to(dev)
    vc = torch.randn(pool, heads, dim, generator=g).to(dtype).to(dev)
    k = torch.randn(n, heads, dim, generator=g).to(dtype).to(dev)
    v = torch.randn(n, heads, dim, generator=g).to(dtype).to(dev)
    idx = torch.randperm(pool, generator=g)[:n].to(torch.int32).to(dev)
    ops.store_cache(kc, vc, idx, k, v)  # load everything before timing

    def index_put():
        kc[idx] = k
        vc[idx] = v

    out = {
        "device": dev,
        "n": n,
        "ops.store_cache": common.host_us_per_call(lambda: ops.store_cache(kc, vc, idx, k, v), sync=sync),
        "module function": common.host_us_per_call(lambda: module_fn(kc, vc, idx, k, v), sync=sync),
        "bare tvm-ffi store": common.host_us_per_call(lambda: plain.store_plain(kc, vc, idx, k, v), sync=sync),
        "tvm-ffi no-op": common.host_us_per_call(lambda: plain.noop(kc, vc, idx, k, v), sync=sync),
        "torch index_put": common.host_us_per_call(index_put, sync=sync),
    }
    out["dlpack_fast_path"] = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    return out


def w_warmup(cache: str, count: str) -> dict:
    os.environ["KERNKIT_CACHE_DIR"] = cache
    count = int(count)
    from kernkit.jit import is_arch_support_pdl
    from kernkit.jit.warmup import build_all
    from kernkit.ops.kvcache import store_request

    pdl = is_arch_support_pdl()
    reqs = [store_request(ELEM, 128 * (i + 1), pdl, "cuda") for i in range(count)]
    t0, c0 = time.perf_counter(), _child_cpu()
    outcomes = build_all(reqs, progress=False)
    wall = time.perf_counter() - t0
    return {"seconds": wall, "cpu": _child_cpu() - c0, "built": sum(o.status == "built" for o in outcomes),
            "failed": [o.error[:300] for o in outcomes if o.status == "failed"], "jobs": os.cpu_count()}


WORKERS = {
    "compile-kernkit": w_compile_kernkit,
    "compile-inline": w_compile_inline,
    "warm-load": w_warm_load,
    "load-module": w_load_module,
    "import": w_import,
    "host-cost": w_host_cost,
    "warmup": w_warmup,
}

# ---------------------------------------------------------------------------------------------
# The driver.


def run_worker(name: str, *args: object, env: dict | None = None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        return {"error": " / ".join(tail)[-800:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernkit"], capture_output=True, text=True,
                               cwd=HERE).stdout.strip()
        return (out.stdout.strip() or "unknown") + (" (with local changes under kernkit/)" if dirty else "")
    except OSError:
        return "unknown"


def machine() -> str:
    import common
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}; host {common.host_cpu()}"
    return f"{os.cpu_count()}-core CPU machine, no GPU ({common.host_cpu()})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the markdown table to DIR/framework-<tag>-<date>.md")
    ap.add_argument("--repeats", type=int, default=3, help="cold compiles per row (each in a fresh cache)")
    ap.add_argument("--loads", type=int, default=9, help="fresh processes for the warm-load and import rows")
    ap.add_argument("--warmup-specs", type=int, default=16, help="specializations in the warmup row (0: skip)")
    ap.add_argument("--skip-compile", action="store_true", help="skip the cold-compile rows")
    ap.add_argument("--tag", help="the results file's machine tag (default: gpu or cpu), e.g. h200")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker[0]](*args.worker[1:])))
        return 0

    import torch

    gpu = torch.cuda.is_available()
    env = {} if gpu else {"KERNKIT_CUDA_ARCH": os.environ.get("KERNKIT_CUDA_ARCH", "9.0")}
    os.environ.update(env)
    have_nvcc = True
    try:
        from kernkit.jit.toolchain import find_nvcc

        find_nvcc()
    except Exception:
        have_nvcc = False
    cores = os.cpu_count() or 1
    rows: list[tuple[str, str, str]] = []
    notes: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="kernkit-bench-"))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        # Cold compile.
        compile_s = float("nan")
        kk_cpu: list[float] = []
        cache = tmp / "cache"
        if have_nvcc and not args.skip_compile:
            kk, inl, kk_cpu, inl_cpu = [], [], [], []
            for i in range(args.repeats):
                log(f"cold compile {i + 1}/{args.repeats}")
                r = run_worker("compile-kernkit", tmp / f"cold{i}", env=env)
                if "error" in r:
                    notes.append(f"kernkit compile failed: {r['error']}")
                    break
                kk.append(r["seconds"])
                kk_cpu.append(r["cpu"])
                r = run_worker("compile-inline", tmp / f"inline{i}", env=env)
                if "error" in r:
                    notes.append(f"bare load_inline failed: {r['error']}")
                else:
                    inl.append(r["seconds"])
                    inl_cpu.append(r["cpu"])
            compile_s = median(kk)
            rows.append(("cold compile + publish, one store_cache specialization (kernkit): wall s; compiler CPU s",
                         f"{compile_s:.2f} (runs: {', '.join(f'{x:.2f}' for x in kk)}); CPU {median(kk_cpu):.2f}",
                         "<= 4 s on the H200 host; <= bare build_inline here"))
            rows.append(("cold compile, the same unit via bare tvm_ffi.cpp.build_inline (tvm-ffi defaults): wall s; "
                         "compiler CPU s",
                         f"{median(inl):.2f} (runs: {', '.join(f'{x:.2f}' for x in inl)}); CPU {median(inl_cpu):.2f}",
                         "peer"))
            if kk and inl:
                rows.append(("kernkit / bare build_inline: wall; compiler CPU",
                             f"{compile_s / median(inl):.2f}; {median(kk_cpu) / median(inl_cpu):.2f}", "<= 1.0"))
        # Warm load (needs a build; make one in the shared cache if the compile rows were skipped).
        lib = None
        if have_nvcc:
            r = run_worker("compile-kernkit", cache, env=env)
            lib = r.get("lib")
            if lib is None:
                notes.append(f"build for the warm-load rows failed: {r.get('error')}")
        if lib:
            loads, subs = [], 0
            for i in range(args.loads):
                r = run_worker("warm-load", cache, env=env)
                if "error" in r:
                    notes.append(f"warm load failed: {r['error']}")
                    break
                loads.append(r["ms"])
                subs = max(subs, r["subprocesses"])
            floors = [run_worker("load-module", lib, env=env).get("ms", float("nan")) for _ in range(args.loads)]
            rows.append(("warm load of a built specialization in a fresh process, ms (median)",
                         f"{median(loads):.2f} (min {min(loads):.2f}, max {max(loads):.2f})", "<= 2 ms"))
            rows.append(("  of which the floor: tvm_ffi.load_module of the same library, ms (median)",
                         f"{median(floors):.2f}", "-"))
            rows.append(("subprocesses started by a warm load", str(subs), "0"))
        # Import.
        imps = [run_worker("import", env=env) for _ in range(args.loads)]
        imps = [r for r in imps if "error" not in r]
        if imps:
            rows.append(("import torch, tvm_ffi in a fresh process, ms (median)",
                         f"{median([r['torch_tvm_ms'] for r in imps]):.0f}", "-"))
            rows.append(("+ import kernkit, ms (median)", f"{median([r['kernkit_ms'] for r in imps]):.1f}", "<= 100 ms"))
            rows.append(("+ import kernkit.ops, ms (median)", f"{median([r['ops_ms'] for r in imps]):.1f}", "<= 100 ms"))
            rows.append(("subprocesses started by import kernkit.ops", str(max(r["subprocesses"] for r in imps)), "0"))
        # Host cost per call.
        log("host cost per call")
        r = run_worker("host-cost", tmp / "cache-host", tmp / "plain", env=env)
        if "error" in r:
            notes.append(f"host cost: {r['error']}")
        else:
            where = "GPU, n=64" if r["device"] == "cuda" else "CPU proxy: CPU tensors, emulator build, n=0"
            for name in ("ops.store_cache", "module function", "bare tvm-ffi store", "tvm-ffi no-op",
                         "torch index_put"):
                rows.append((f"host cost per call, {name} ({where}), us", f"{r[name]:.2f}", "-"))
            rows.append(("ops.store_cache / bare tvm-ffi store", f"{r['ops.store_cache'] / r['bare tvm-ffi store']:.2f}",
                         "<= 1.1"))
            rows.append(("ops.store_cache - bare tvm-ffi store, us", f"{r['ops.store_cache'] - r['bare tvm-ffi store']:.2f}",
                         "<= 0.1 x bare"))
            rows.append(("torch tensors take tvm-ffi's C DLPack path (__dlpack_c_exchange_api__)",
                         "yes" if r["dlpack_fast_path"] else "no", "yes"))
        # Warmup.
        if have_nvcc and args.warmup_specs > 0:
            log(f"warmup of {args.warmup_specs} specializations")
            r = run_worker("warmup", tmp / "cache-warmup", args.warmup_specs, env=env)
            if "error" in r:
                notes.append(f"warmup: {r['error']}")
            else:
                ideal = args.warmup_specs / cores * compile_s
                rows.append((f"warmup of {args.warmup_specs} specializations ({r['jobs']} jobs), wall s",
                             f"{r['seconds']:.1f} (built {r['built']}; compiler CPU {r['cpu']:.1f} s)", f"<= {1.3 * ideal:.1f} (1.3 x {ideal:.1f})"))
                rows.append((f"warmup / ({args.warmup_specs} / {cores} cores x one compile)",
                             f"{r['seconds'] / ideal:.2f}", "<= 1.3"))
                # Cores the compilers kept busy: below `cores` when other work shares the machine.
                rows.append(("cores busy with compilers during warmup (compiler CPU s / wall s)",
                             f"{r['cpu'] / r['seconds']:.2f} of {cores}", f"~{cores}"))
                if kk_cpu:
                    rows.append(("warmup compiler CPU / (16 x one compile's CPU)",
                                 f"{r['cpu'] / (args.warmup_specs * median(kk_cpu)):.2f}", "~1"))
                if r["failed"]:
                    notes.append(f"warmup failures: {r['failed'][:2]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    import tvm_ffi

    lines = [
        "# kernkit framework speed",
        "",
        f"- date: {time.strftime('%Y-%m-%d')}",
        f"- machine: {machine()}",
        f"- software: Python {platform.python_version()}, torch {torch.__version__}, apache-tvm-ffi {tvm_ffi.__version__}",
        f"- command: `python benchmark/bench_framework.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        f"- kernkit commit: {commit()}",
        "",
        "| what | measured | target |",
        "| --- | --- | --- |",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
    ]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        tag = args.tag or ("gpu" if gpu else "cpu")
        path = args.out / f"framework-{tag}-{time.strftime('%Y-%m-%d')}.md"
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
