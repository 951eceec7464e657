"""The kernel-hash runner: hashes of every shipped CUDA kernel's outputs on fixed inputs.

Each op's test material (``kernkit.testing.ops.<name>``) lists its cases in ``hash_cases()``,
each naming the kernel file it runs; ``cases()`` finds every module of that package, so an op's
cases sit with the op and no list here names it. A project's own ops have their material in a
package of their own: ``--cases my_project.testing`` hashes its modules instead.

The same cases run on the GPU (``--device cuda``) and on the CPU emulator (``--device cpu``).
An exact output must be the same bytes on both: it is first compared with the torch reference
computed on the CPU (so a wrong result is never hashed), then its hash is recorded. A bound
output (an op built on the hardware's approximate exp2 / reciprocal, whose bits differ between
the GPU and the emulator: docs/emulator.md) is instead checked against the float64 reference
within the bound the op's docstring states; the file records that bound and the largest error
measured on the device that wrote it, and a check passes where the computing device stays
within the same bound.

    python -m kernkit.testing.hashes --device cuda --write kernel_hashes.json   # on a GPU
    python -m kernkit.testing.hashes --device cpu --check kernel_hashes.json    # anywhere
    python -m kernkit.testing.hashes --cases my_project.testing.my_op --write my_hashes.json

Inputs come from a ``torch.Generator`` seeded per case (from the case's name) on the CPU and are
then copied to the device, so both sides see identical bytes. An output's hash is the sha256 of
``t.cpu().contiguous().view(torch.uint8)``; where an op writes into a view, the whole
underlying buffer is hashed (the bytes it must not touch included).

Cases avoid what the GPU leaves unspecified (two writes to one row, a NaN's payload): the GPU
and the emulator must agree on every byte that is hashed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import json
import os
import pkgutil
import platform
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from .oracle import as_bytes, same_bytes

FORMAT = 2

#: Where ``cases`` looks by default: kernkit's own ops' test material.
DEFAULT_CASES = "kernkit.testing.ops"


@dataclass(frozen=True)
class Within:
    """A bound output: already checked against the float64 reference, ``got`` (on the CPU) is
    within ``bound_ulps`` ulps of its dtype everywhere; ``max_ulps`` is the largest error."""

    got: torch.Tensor
    bound_ulps: float
    max_ulps: float


#: What an output is: (the op's result, moved to the CPU; the reference's result), compared
#: byte for byte, or a ``Within``.
Outputs = dict[str, "tuple[torch.Tensor, torch.Tensor] | Within"]

#: The short dtype names of case names.
SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8e4m3",
         torch.int32: "i32", torch.int64: "i64"}


@dataclass(frozen=True)
class Case:
    """One fixed input set for one kernel: ``run(device)`` runs the op there and returns its
    outputs together with the torch reference's.

    ``kernel`` is the kernel file the case runs, relative to ``kernkit/kernels``. Only an
    ``approximate`` case (an op built on the hardware's approximate exp2 / reciprocal, whose
    docstring states an ulp bound) may return ``Within`` outputs; every other output is exact.
    """

    name: str
    kernel: str
    run: Callable[[torch.device], Outputs]
    approximate: bool = False


def generator(name: str) -> torch.Generator:
    """A CPU generator seeded from the case's name (stable across runs and case order)."""
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of ``t`` on ``device``, never ``t`` itself (on the CPU too): the reference's
    tensors stay apart from the op's."""
    return t.to(device, copy=True)


def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(as_bytes(t).numpy().tobytes()).hexdigest()


def case_modules(name: str = DEFAULT_CASES) -> list[ModuleType]:
    """The module ``name`` if it defines ``hash_cases``, else every module of package ``name``
    (found with ``pkgutil``, not by file name) that does.

    Parameters
    ----------
    name
        A module or package, importable by name: ``kernkit.testing.ops`` by default.

    Returns
    -------
    The modules, by name.

    Raises
    ------
    ImportError
        ``name`` is not a module name, cannot be imported, or neither it nor any module of it
        defines ``hash_cases``.
    """
    if not all(part.isidentifier() for part in name.split(".")):
        raise ImportError(f"{name!r} is not a module name (a module or package importable by name, "
                          "e.g. my_project.testing)")
    module = importlib.import_module(name)
    if hasattr(module, "hash_cases"):
        return [module]
    found = [importlib.import_module(m.name) for m in pkgutil.iter_modules(getattr(module, "__path__", []), f"{name}.")]
    found = sorted((m for m in found if hasattr(m, "hash_cases")), key=lambda m: m.__name__)
    if not found:
        raise ImportError(f"{name} defines no hash_cases(), and no module of it does")
    return found


def cases(modules: Sequence[str] = (DEFAULT_CASES,)) -> list[Case]:
    """Every case of ``modules``: ``hash_cases()`` of each module ``case_modules`` finds there.

    Parameters
    ----------
    modules
        Modules or packages of test material, by name (``case_modules``).

    Returns
    -------
    The cases, by module name.

    Raises
    ------
    ValueError
        Two cases share a name.
    """
    out = [c for name in modules for m in case_modules(name) for c in m.hash_cases()]
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"case names must be unique: {sorted({n for n in names if names.count(n) > 1})}")
    return out


class ReferenceMismatch(AssertionError):
    """An op's output differs from the torch reference."""


def run_case(case: Case, device: torch.device) -> dict[str, dict]:
    """Run one case; check every exact output against the reference byte for byte (a bound one
    was checked by the case); its records: shape, dtype, ``exact``, and the hash (exact) or the
    bound and the largest error in ulps (bound)."""
    result = {}
    for key, value in case.run(device).items():
        if isinstance(value, Within):
            if not case.approximate:
                raise ReferenceMismatch(f"{case.name}: '{key}' is a bound output, but the case is exact "
                                        "(only an approximate case may return Within)")
            got = value.got
            result[key] = {"shape": list(got.shape), "dtype": str(got.dtype).removeprefix("torch."), "exact": False,
                           "bound_ulps": value.bound_ulps, "max_ulps": round(value.max_ulps, 4)}
            continue
        got, want = value
        if not same_bytes(got, want):
            detail = ""
            if got.shape == want.shape:
                diff = (as_bytes(got) != as_bytes(want)).nonzero()
                detail = f"; {diff.shape[0]} bytes differ, first at byte index {diff[0].tolist()}"
            raise ReferenceMismatch(f"{case.name}: '{key}' differs from the torch reference ({device}): "
                                    f"got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}{detail}")
        result[key] = {"shape": list(got.shape), "dtype": str(got.dtype).removeprefix("torch."), "exact": True,
                       "sha256": sha256(got)}
    return result


def select(only: str | None = None, modules: Sequence[str] = (DEFAULT_CASES,)) -> list[Case]:
    """The cases of ``modules`` (``cases``) whose name contains ``only`` (all of them: None)."""
    return [c for c in cases(modules) if only is None or only in c.name]


def compute(device: str | torch.device, only: str | None = None,
            modules: Sequence[str] = (DEFAULT_CASES,)) -> dict[str, dict]:
    """Every case's output hashes on ``device`` (``cpu``: the CPU emulator; the ops have no other
    path, so a hash is always a kernel's); ``only``: the cases whose name contains it;
    ``modules``: where the cases are (``cases``)."""
    device = torch.device(device)
    return {c.name: run_case(c, device) for c in select(only, modules)}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"kernkit CPU emulator ({platform.machine()})"


def document(device: str | torch.device, hashes: dict[str, dict]) -> dict:
    device = torch.device(device)
    import kernkit

    return {
        "format": FORMAT,
        "source": "gpu" if device.type == "cuda" else "cpu-emulator",
        "device": device_name(device),
        "torch": torch.__version__,
        "kernkit": getattr(kernkit, "__version__", "?"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "cases": hashes,
    }


def dumps(doc: dict) -> str:
    """The hash file's text: the header fields, then one line per case."""
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in doc.items() if k != "cases"]
    body = [f"  {json.dumps(name)}: {json.dumps(outs, separators=(', ', ': '))}"
            for name, outs in doc["cases"].items()]
    return "{\n" + "\n".join(head) + '\n "cases": {\n' + ",\n".join(body) + "\n }\n}\n"


def compare(expected: dict, hashes: dict[str, dict]) -> list[str]:
    """Differences between a hash file's cases and freshly computed ones, one line each, naming
    the case (and the output): for an exact output its shape, dtype and hash; for a bound one its
    shape, dtype and bound (both sides were checked within it when computed)."""
    problems = []
    want = expected.get("cases", {})
    for name in sorted(want.keys() - hashes.keys()):
        problems.append(f"{name}: in the file but not computed (case removed or renamed?)")
    for name in sorted(hashes.keys() - want.keys()):
        problems.append(f"{name}: computed but not in the file (regenerate the file on the GPU)")
    for name in sorted(want.keys() & hashes.keys()):
        w, g = want[name], hashes[name]
        for key in sorted(w.keys() | g.keys()):
            if key not in w or key not in g:
                problems.append(f"{name}: output '{key}' present on one side only")
                continue
            # A bound output's max_ulps is what each device measured: not compared.
            fields = ("shape", "dtype", "exact", "sha256" if g[key].get("exact") else "bound_ulps")
            what = [f for f in fields if w[key].get(f) != g[key].get(f)]
            if what:
                problems.append(f"{name}: output '{key}' differs ({', '.join(what)}): file {w[key]}, computed {g[key]}")
    return problems


class UsageError(Exception):
    """A command line that cannot be done as asked: ``main`` prints it on one line, status 2."""


def read_hash_file(path: str) -> dict:
    """The hash file ``path`` (``--check``), checked to be one: a JSON object whose ``cases``
    maps each case's name to its outputs' records.

    Raises
    ------
    UsageError
        ``path`` cannot be read, is not JSON or is not a hash file; the message names it.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"--check {path}: cannot read it ({e.strerror or e})") from e
    except (ValueError, RecursionError) as e:  # a JSON or UTF-8 decoding error; nesting too deep
        raise UsageError(f"--check {path}: not a JSON file ({e})") from e
    cases_ = doc.get("cases") if isinstance(doc, dict) else None
    if not (isinstance(cases_, dict)
            and all(isinstance(outs, dict) and all(isinstance(o, dict) for o in outs.values())
                    for outs in cases_.values())):
        raise UsageError(f"--check {path}: not a kernel-hash file (no \"cases\" object of case names to outputs, "
                         "as --write writes)")
    return doc


def _selected(only: str | None, modules: Sequence[str]) -> list[Case]:
    """The cases the command line selects; at least one (``UsageError`` otherwise)."""
    for name in modules:
        try:
            case_modules(name)
        except ImportError as e:
            raise UsageError(f"--cases {name}: {e}") from e
    try:
        chosen = select(only, modules)
    except ValueError as e:  # two cases share a name
        raise UsageError(str(e)) from e
    if not chosen:
        where = f"of {', '.join(modules)}"
        raise UsageError(f"--only {only}: no case {where} has it in its name (--list lists them)" if only
                         else f"--cases {', '.join(modules)}: hash_cases() gives no case")
    return chosen


def _run(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    modules = args.cases or [DEFAULT_CASES]
    if args.list:
        for c in _selected(None, modules):
            print(c.name)
        return 0
    if args.write and args.only:
        p.error("--write takes every case")
    expected = read_hash_file(args.check) if args.check else None  # before the cases run: a bad file fails fast
    device = torch.device(args.device)
    hashes = {c.name: run_case(c, device) for c in _selected(args.only, modules)}
    if expected is None:
        path = Path(args.write)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dumps(document(device, hashes)))
        except OSError as e:
            raise UsageError(f"--write {path}: cannot write it ({e.strerror or e})") from e
        print(f"{len(hashes)} cases on {device_name(device)}: wrote {path}")
        return 0
    if args.only:
        expected = {**expected, "cases": {k: v for k, v in expected["cases"].items() if args.only in k}}
    problems = compare(expected, hashes)
    for line in problems:
        print(line)
    src = f"{expected.get('source')} on {expected.get('device')}, {expected.get('date')}"
    print(f"{len(hashes)} cases on {device_name(device)} against {args.check} ({src}): "
          + (f"{len(problems)} differences" if problems else "all match"))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line (``python -m kernkit.testing.hashes``).

    Parameters
    ----------
    argv
        The arguments; default: ``sys.argv[1:]``.

    Returns
    -------
    The exit status: 0; 1 when ``--check`` found differences; 2 for a command line that cannot
    be done as asked (a ``--cases`` that is no test material, an ``--only`` that selects no case,
    a ``--check`` file that is no hash file, an unwritable ``--write`` file: one line on stderr).
    A reader that stops early (``--list | head``) ends the command quietly, with status 0.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda (the GPU) or cpu (the CPU emulator)")
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--write", metavar="FILE", help="compute the hashes and write them to FILE")
    act.add_argument("--check", metavar="FILE", help="compute the hashes and compare them with FILE")
    act.add_argument("--list", action="store_true", help="list the cases")
    p.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT (not with --write)")
    p.add_argument("--cases", metavar="MODULE", action="append",
                   help=f"a module or package of test material, by name (repeatable; default {DEFAULT_CASES})")
    args = p.parse_args(argv)
    try:
        status = _run(p, args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Send what is still buffered nowhere, so that the interpreter's flush at exit does not
        # fail again (what Python's documentation advises).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    # Run as ``python -m``, this file is ``__main__``; the test material imports
    # ``kernkit.testing.hashes``, whose ``Within`` the runner must check against.
    from kernkit.testing import hashes

    sys.exit(hashes.main())
