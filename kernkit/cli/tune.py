"""Measure the candidate specializations of the tunable ops (``kernkit.jit.tuning.Tunable``) on
this device, and write the winners to a tuning table that the ops read at their first call in a
later process.

    python -m kernkit.jit tune                                # every tunable op, its serving grid
    python -m kernkit.jit tune rmsnorm --grid serving
    python -m kernkit.jit tune rmsnorm --shapes shapes.json   # [{"dtype": "bfloat16", "hidden": 4096, "rows": 1}]

For each shape: every candidate is built (in parallel, as warmup builds) and run once on the
default's inputs; a candidate whose outputs differ from the default's (bit for bit, or beyond
the op's stated bound) is reported and never chosen. The others are timed, ``--repeats`` times
each, the candidates' runs interleaved: on a GPU, a CUDA graph of launches on inputs rotated
beyond the L2; on the CPU (``--device cpu``: the emulator, for trying the machinery; its times
say nothing about a GPU) by the clock. A candidate replaces the default only when its median
is faster by more than the spread measured (the larger interquartile range of the two). The
table is written to ``<cache>/v2/tuning/<op>/<device>.json``, whose entries for other keys
stay; Ctrl-C writes what is done.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from .._version import __version__
from ..jit import cache_once
from ..jit.cache import root
from ..jit.tuning import FORMAT, Tunable, check_table, declared, graph_times_us_each, identity, key_of
from ..jit.untrusted import read_json
from . import output
from .warmup import WarmupError, build_all


def _timer(device: str, repeats: int) -> Callable[[Sequence[Sequence[Callable[[], object]]]], list[list[float]]]:
    """Times per launch (us) of each group of calls, one per repeat, the groups' repeats
    interleaved: CUDA-graph replays on a GPU (``graph_times_us_each``), the clock on the CPU."""
    def cpu(groups):
        times: list[list[float]] = [[] for _ in groups]
        for _ in range(repeats):
            for i, calls in enumerate(groups):
                t0 = time.perf_counter()
                for fn in calls:
                    fn()
                times[i].append((time.perf_counter() - t0) * 1e6 / len(calls))
        return times

    return functools.partial(graph_times_us_each, replays=repeats) if device == "cuda" else cpu


def _spread(times: list[float]) -> float:
    """The interquartile range of ``times``."""
    if len(times) < 2:
        return 0.0
    q = statistics.quantiles(times, n=4)
    return q[2] - q[0]


def _same(tunable: Tunable, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> bool:
    if tunable.close is not None:
        return tunable.close(got, want)
    return len(got) == len(want) and all(
        g.shape == w.shape and g.dtype == w.dtype and torch.equal(g.flatten().contiguous().view(torch.uint8),
                                                                  w.flatten().contiguous().view(torch.uint8))
        for g, w in zip(got, want, strict=True))


def table_path(tunable: Tunable, device: tuple[str, str]) -> Path:
    """Where ``tune`` writes ``tunable``'s table for ``device``: ``<cache>/v2/tuning/<op>/<slug>.json``."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{device[0]} sm{device[1]}".lower()).strip("-")
    return root() / "tuning" / tunable.name / f"{slug}.json"


def _shapes(tunable: Tunable, args: argparse.Namespace) -> list[Mapping]:
    if args.shapes:
        try:
            shapes = read_json(args.shapes)
        except (OSError, ValueError) as e:
            raise WarmupError(f"--shapes {args.shapes}: {e}") from e
        if type(shapes) is not list or not all(type(s) is dict for s in shapes):
            raise WarmupError(f"--shapes {args.shapes}: expected a list of objects")
        return shapes
    if args.grid not in tunable.grids:
        raise WarmupError(f"{tunable.name} has no grid {args.grid!r}; its grids: {', '.join(tunable.grids) or 'none'}")
    return list(tunable.grids[args.grid])


def tune(tunable: Tunable, shapes: Sequence[Mapping], device: str, repeats: int = 20, jobs: int | None = None,
         progress: bool = True) -> tuple[list[dict], list[str]]:
    """Tune ``tunable`` over ``shapes`` on ``device`` (``cuda``, or ``cpu`` for the emulator).

    Returns
    -------
    ``(entries, notes)``: the table's entries (one per shape key, the chosen arguments with the
    default's and the chosen candidate's median time and the spread, us), and one line for each
    candidate refused for its outputs. Ctrl-C raises ``KeyboardInterrupt`` with what is done in
    its ``entries`` attribute.
    """
    entries: dict[tuple, dict] = {}
    notes: list[str] = []
    timer = _timer(device, repeats)
    choices = tunable.choices()
    try:
        benches = []
        for shape in shapes:
            if tunable.bench is None:
                raise WarmupError(f"{tunable.name} has no bench to tune with")
            try:
                benches.append((shape, tunable.bench(shape, device)))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise WarmupError(f"{tunable.name}: shape {shape}: {e}") from e
        specs = list(dict.fromkeys(b.spec(c) for _, b in benches for c in choices))
        failed = [(s, why) for s, (status, why) in zip(specs, build_all(specs, jobs, progress), strict=True)
                  if status == "failed"]
        if failed:
            raise WarmupError(f"{tunable.name}: {failed[0][0].title} did not build: {failed[0][1]}")
        load = cache_once(lambda spec: spec.build_and_load())  # each candidate once, shared by its shapes
        for shape, bench in tqdm(benches, desc=f"tune {tunable.name}", unit="shape", disable=not progress):
            key = key_of(tunable, bench.key)
            modules = [load(bench.spec(c)) for c in choices]
            want = bench.outputs(modules[0])
            usable = []
            for choice, module in zip(choices, modules, strict=True):
                if _same(tunable, bench.outputs(module), want):
                    usable.append((choice, module))
                else:
                    notes.append(f"{tunable.name} {shape}: {choice} gives other outputs than the default; not chosen")
            times = dict(enumerate(timer([bench.calls(module) for _, module in usable])))
            best = min(times, key=lambda i: statistics.median(times[i]))
            base, fast = statistics.median(times[0]), statistics.median(times[best])
            spread = max(_spread(times[0]), _spread(times[best]))
            if base - fast <= spread:
                best, fast = 0, base
            chosen = {a: v for a, v in usable[best][0].items() if v != tunable.defaults[a]}
            entries[key] = {"key": dict(bench.key), "args": chosen, "default_us": round(base, 4),
                            "tuned_us": round(fast, 4), "spread_us": round(spread, 4)}
    except KeyboardInterrupt as e:
        e.entries = list(entries.values())  # type: ignore[attr-defined]
        e.notes = notes  # type: ignore[attr-defined]
        raise
    return list(entries.values()), notes


def write_table(tunable: Tunable, device: tuple[str, str], entries: list[dict]) -> Path:
    """Write ``entries`` into ``tunable``'s table for ``device`` (``table_path``), keeping the
    entries of other keys that a table of this device and kernkit version there already had;
    returns the path."""
    path = table_path(tunable, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = check_table(read_json(path, regular=True), tunable)
    except FileNotFoundError:
        old = None
    except (OSError, ValueError) as e:
        print(f"replacing {path}, which is not a table of {tunable.name}: {e}", file=sys.stderr)
        old = None
    if old is not None and (old["device"], old["capability"], old["kernkit"]) == (*device, __version__):
        new = {key_of(tunable, e["key"]) for e in entries}
        entries = [e for e in old["entries"] if key_of(tunable, e["key"]) not in new] + entries
    text = json.dumps({"format": FORMAT, "op": tunable.name, "kernkit": __version__, "device": device[0],
                       "capability": device[1], "entries": entries}, indent=1)
    with output.written(path) as f:
        f.write(text.encode() + b"\n")
    return path


def run(args: argparse.Namespace) -> int:
    """The ``tune`` subcommand; returns 130 when Ctrl-C stopped it (after writing what was done)."""
    import kernkit.ops  # noqa: F401  (declares kernkit's tunables)

    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None:
        raise WarmupError("no CUDA device is visible to tune on; --device cpu tunes the CPU emulator (to try the "
                          "machinery: its times say nothing about a GPU)")
    if device == "cuda" and not torch.cuda.is_available():
        raise WarmupError("--device cuda: no CUDA device is visible")
    tunables = declared()
    names = {t.name for t in tunables}
    for name in args.ops:
        if name not in names:
            raise WarmupError(f"{name!r} is not a tunable op; tunable: {', '.join(sorted(names))}")
    device_id = identity(device == "cuda")
    assert device_id is not None, "identity is None only for CUDA with no GPU visible, refused above"
    status = 0
    for tunable in tunables:
        if args.ops and tunable.name not in args.ops:
            continue
        shapes = _shapes(tunable, args)
        try:
            entries, notes = tune(tunable, shapes, device, args.repeats, args.jobs, progress=not args.quiet)
        except KeyboardInterrupt as e:
            entries, notes = getattr(e, "entries", []), getattr(e, "notes", [])
            status = 130
        for line in notes:
            print(line)
        if entries:
            path = write_table(tunable, device_id, entries)
            tuned = sum(bool(e["args"]) for e in entries)
            print(f"{tunable.name}: {len(entries)} keys, {tuned} tuned away from the default: {path}")
        if status:
            print("interrupted: the keys done are written", file=sys.stderr)
            return status
    return status
