"""``python -m kernkit.jit`` (or the ``kernkit`` console script): the command line of kernkit's
developer tools. Each subcommand is a module of ``kernkit.cli`` with a ``run(args)``; its
docstring is the subcommand's help."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .._version import __version__
from ..jit import ArchError
from ..jit.backends import BACKENDS
from ..jit.config import ConfigError
from ..jit.manifest import ManifestError
from . import cache, clangd, doctor, tune, warmup

#: The subcommands; ``clangd`` runs when none is given.
COMMANDS = {"clangd": clangd, "cache": cache, "warmup": warmup, "tune": tune, "doctor": doctor}


def _clangd_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--cuda", metavar="ARCH", help="GPU architecture: 9.0, sm_90a, 100... (default: the "
                        "visible GPU, else $KERNKIT_CUDA_ARCH, else 9.0, written sm_90a)")
    parser.add_argument("--dep", nargs="+", default=[], choices=("cutlass", "flashinfer"), metavar="NAME",
                        help="also add the headers of these installed packages: cutlass, flashinfer")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    parser.add_argument("-o", "--output", default=".clangd", metavar="PATH",
                        help="where to write (default: ./.clangd); '-' prints it")
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m kernkit.jit`` (``kernkit``) and its subcommands."""
    raw = argparse.RawDescriptionHelpFormatter
    prog = "kernkit" if os.path.basename(sys.argv[0]) == "kernkit" else "python -m kernkit.jit"
    parser = _clangd_options(argparse.ArgumentParser(
        prog=prog, formatter_class=raw, description="kernkit's JIT tools. Without a "
        "subcommand, writes a .clangd (`clangd`, whose options are accepted here):\n\n" + clangd.__doc__))
    parser.add_argument("--version", action="version", version=f"kernkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    helps = {"clangd": "write a .clangd so that clangd parses kernels as CUDA (the default)",
             "cache": "list, clear, prune, export or import the built specializations",
             "doctor": "report toolchain, target, cache, versions; exits 1 when something is wrong",
             "warmup": "build the specializations of the registered ops for a model shape, in parallel",
             "tune": "time the tunable ops' candidate specializations here and write the winners' table"}
    cmd = {name: sub.add_parser(name, help=helps[name], description=module.__doc__, formatter_class=raw)
           for name, module in COMMANDS.items()}
    _clangd_options(cmd["clangd"])
    actions = cmd["cache"].add_subparsers(dest="action", metavar="{list,clear,prune,export,import}")
    actions.add_parser("list", help="one line per published build (the default)")
    actions.add_parser("clear", help="remove builds and kept failures").add_argument(
        "--kernel", metavar="NAME", help="only this kernel's (the first element of its marker, e.g. scale)")
    prune = actions.add_parser("prune", help="remove old builds")
    prune.add_argument("--keep", type=int, metavar="N", help="keep each kernel's newest N builds")
    prune.add_argument("--older-than", metavar="DATE", help="remove builds made before DATE (2026-11-01) or DAYS ago")
    export = actions.add_parser("export", help="write builds to one .tar.gz")
    export.add_argument("archive", metavar="FILE")
    export.add_argument("--manifest", metavar="M", help="only the builds of this manifest (KERNKIT_RECORD)")
    imp = actions.add_parser("import", help="check and publish the builds of an archive")
    imp.add_argument("archive", metavar="FILE")
    imp.add_argument("--arch", nargs="+", metavar="ARCH", help="architectures to accept (default: the target's)")
    imp.add_argument("--expect-sha256", metavar="HEX", help="import only if the archive's SHA-256 is this (as "
                     "`cache export` printed it); an archive is code, so pin the one you trust")
    w = cmd["warmup"]
    w.add_argument("ops", nargs="*", metavar="OP", help="registered ops, e.g. scale or kernkit::scale (default: all)")
    w.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import this module first, so that its ops register (repeatable)")
    w.add_argument("--dtype", nargs="+", metavar="DTYPE", help="fp16, bf16, fp32, fp8_e4m3, ... or torch names")
    w.add_argument("--set", "--shape", dest="shape", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                   help="the model shape, e.g. num_heads=8 head_dim=128 hidden_size=4096")
    w.add_argument("--backend", choices=sorted(BACKENDS),
                   help="nvrtc or nvcc (GPU; default: KERNKIT_BACKEND, else nvrtc where installed) or emu (CPU)")
    w.add_argument("--manifest", metavar="FILE", help="build exactly the requests of this manifest (recorded "
                   "with KERNKIT_RECORD=FILE) instead of the ops' specializations")
    w.add_argument("--arch", nargs="+", default=[], metavar="ARCH",
                   help="with --manifest: build its CUDA requests for these architectures, e.g. 9.0 10.0a")
    w.add_argument("--no-extra-flags", action="store_true", help="with --manifest: refuse it if a request carries "
                   "compiler or linker flags (a flag can run any program; use it for manifests from elsewhere)")
    w.add_argument("-j", "--jobs", type=int, help="builds at once (default: the number of cores)")
    w.add_argument("--list", action="store_true", help="print the specializations without building them")
    w.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    t = cmd["tune"]
    t.add_argument("ops", nargs="*", metavar="OP", help="tunable ops, e.g. rmsnorm (default: all)")
    t.add_argument("--grid", default="serving", metavar="NAME", help="the ops' grid of shapes (default: serving)")
    t.add_argument("--shapes", metavar="FILE", help="a JSON list of shapes instead of a grid")
    t.add_argument("--device", choices=("cuda", "cpu"), help="cuda (default where visible) or cpu (the emulator)")
    t.add_argument("--repeats", type=int, default=20, metavar="N", help="timed replays per candidate (default: 20)")
    t.add_argument("-j", "--jobs", type=int, help="builds at once (default: the number of cores)")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand.

    Parameters
    ----------
    argv
        The arguments after ``python -m kernkit.jit``; default: ``sys.argv[1:]``.

    Returns
    -------
    The exit status: 0; 1 when a warmup build failed, an import refused a build or ``doctor``
    found a problem; 2 for a command that cannot be done as asked (the message on stderr).
    A reader that stops early (``| head``) ends the command quietly, with status 0.
    """
    args = build_parser().parse_args(argv)
    try:
        status = COMMANDS[args.command or "clangd"].run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except (clangd.ClangdConfigError, warmup.WarmupError, ManifestError, cache.ArchiveError, ArchError,
            ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # What Python's documentation advises: send what is still buffered nowhere, so that the
        # interpreter's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0  # the reader has what it wanted: a script under `set -o pipefail` goes on


def console() -> int:
    """The ``kernkit`` console script: ``main`` with the current directory first on
    ``sys.path``, as ``python -m kernkit.jit`` has it, so that ``kernkit warmup --import
    my_ops`` finds the ``my_ops.py`` of the folder it runs in."""
    sys.path.insert(0, os.getcwd())
    return main()
