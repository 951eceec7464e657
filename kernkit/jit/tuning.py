"""Tuned specializations: the template arguments an op may vary (``Tunable``), and the tables
that pick them per device, kernkit version and shape bucket.

An op declares which of its template arguments may vary and their candidates, the first of each
being the choice it makes untuned; its module factory asks ``Tunable.choose`` for the arguments
of one shape key and builds that specialization. Without a table entry the defaults come back,
so an untuned op builds what it always built.

A table holds one op's entries for one device and one kernkit version (``python -m kernkit.jit
tune`` writes them, ``<cache>/v2/tuning/<op>/<device>.json``)::

    {"format": 1, "op": "rmsnorm", "kernkit": "0.4.0", "device": "NVIDIA H200", "capability": "9.0",
     "entries": [{"key": {"dtype": "bfloat16", "hidden": 4096, "rows": 8},
                  "args": {"late_weight": true}, "default_us": 1.41, "tuned_us": 1.22, "spread_us": 0.01}]}

An op's tables are read at its first ``choose`` in a process, from ``v2/tuning/<op>/`` of the
local cache, of each shared cache (``KERNKIT_CACHE_SHARED``), then ``tuning/<op>/`` of the package: for a key, the
first table that has it wins. A table is data from elsewhere (an archive, a shared cache): it is
read within ``untrusted``'s limits and refused whole, with one warning, unless every entry has
the op's key names and picks candidate values of its arguments; so a table can only choose among
the specializations the op's author wrote, and never names a file or a command. A table for
another device or kernkit version is passed over with one log line. ``KERNKIT_TUNING=off``
reads none.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._version import __version__
from .cache import LAYOUT, root
from .config import flag, shared_dirs
from .paths import PACKAGE_ROOT
from .spec import JitSpec
from .untrusted import control, read_json

logger = logging.getLogger("kernkit.jit")

#: Set to ``off`` to read no tuning table: every op builds its defaults.
TUNING_VAR = "KERNKIT_TUNING"

#: The layout version of a table.
FORMAT = 1

#: The tables shipped with kernkit (``<package>/tuning/<op>/*.json``).
SHIPPED_DIR = PACKAGE_ROOT / "tuning"

#: What the CPU emulator is called in a table (``tune --device cpu``).
EMULATOR = ("kernkit CPU emulator", "emu")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")

#: A key's or an argument's value: what a template argument or a shape is made of.
Scalar = bool | int | str

_declared: dict[str, Tunable] = {}


@dataclass(frozen=True)
class Bench:
    """One shape of a tuning grid, as ``tune`` runs it: ``key`` (the op's shape key of this
    shape), ``spec(args)`` (the ``JitSpec`` of the candidate ``args``), ``calls(module)`` (launches
    of the candidate's kernel, each on its own copy of the inputs, so that together they reach
    beyond the L2: what is timed), and ``outputs(module)`` (one run on fresh inputs, whose
    outputs are compared with the default's: bit for bit, or by ``Tunable.close``)."""

    key: Mapping[str, Scalar]
    spec: Callable[[Mapping[str, Scalar]], JitSpec]
    calls: Callable[[object], Sequence[Callable[[], object]]]
    outputs: Callable[[object], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class Tunable:
    """The template arguments of an op's specialization that may vary, and how to tune them.

    Parameters
    ----------
    name
        The op's name in tables (``rmsnorm``; an op of another project: ``my_project.bias_gelu``).
    candidates
        ``{argument: (default, other, ...)}``: the values each argument may take, the op's
        untuned choice first. Booleans, integers or strings.
    key
        The names of the shape key ``choose`` takes (``("dtype", "hidden", "rows")``): what the
        best choice depends on, bucketed by the op (rmsnorm: elements by powers of two).
    grids
        Named lists of shapes (``{"serving": [{"dtype": "bfloat16", "hidden": 4096, "rows": 1},
        ...]}``) for ``tune --grid``; ``bench`` reads one shape.
    bench
        ``bench(shape, device) -> Bench``: the inputs of one shape on ``device`` (``"cuda"``, or
        ``"cpu"`` for the emulator), for ``tune``.
    close
        For an op whose candidates may round differently: ``close(got, want)`` tells whether a
        candidate's outputs are within the op's stated bound of the default's. None: bit for bit.

    Example
    -------
    >>> TUNABLE = Tunable("rmsnorm", {"late_weight": (False, True)}, ("dtype", "hidden", "rows"),
    ...                   grids={"serving": SHAPES}, bench=_bench)  # doctest: +SKIP
    >>> args = TUNABLE.choose(x.is_cuda, dtype=x.dtype, hidden=4096, elements=4096)  # doctest: +SKIP
    """

    name: str
    candidates: Mapping[str, tuple[Scalar, ...]]
    key: tuple[str, ...]
    grids: Mapping[str, Sequence[Mapping[str, Scalar]]] = field(default_factory=dict)
    bench: Callable[[Mapping[str, Scalar], str], Bench] | None = None
    close: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], bool] | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"Tunable: name {self.name!r} is not a dotted identifier")
        for arg, values in self.candidates.items():
            if not _NAME.fullmatch(arg) or not values or len(set(map(_typed, values))) != len(values) or not all(
                    _scalar(v) for v in values):
                raise ValueError(f"Tunable {self.name}: {arg!r} needs distinct bool, int or str candidates, "
                                 f"got {values!r}")
        if not self.key or len(set(self.key)) != len(self.key) or not all(_NAME.fullmatch(k) for k in self.key):
            raise ValueError(f"Tunable {self.name}: key {self.key!r} is not a tuple of distinct names")
        if _declared.setdefault(self.name, self) is not self:
            raise ValueError(f"Tunable: {self.name} is declared already")

    @property
    def defaults(self) -> dict[str, Scalar]:
        """The untuned choice: each argument's first candidate."""
        return {arg: values[0] for arg, values in self.candidates.items()}

    def choices(self) -> list[dict[str, Scalar]]:
        """Every combination of the candidates, the defaults first."""
        return [dict(zip(self.candidates, combo, strict=True))
                for combo in itertools.product(*self.candidates.values())]

    def choose(self, is_cuda: bool, **key: object) -> dict[str, Scalar]:
        """The arguments the tables pick for ``key`` on this process's device (the current CUDA
        device, or the emulator), else the defaults. Called by a module factory (``cache_once``),
        once per key.

        Parameters
        ----------
        is_cuda
            Whether the tensors are on a CUDA device (else the emulator runs them).
        key
            The op's key names and their values (a dtype is taken by its name).
        """
        device = identity(is_cuda)
        picked = {} if device is None else _entries(self.name, device).get(key_of(self, key), {})
        return {**self.defaults, **picked}

    def size_masks(self, is_cuda: bool, size: str, **key: object) -> dict[str, int]:
        """For an op that folds its per-size choices of boolean arguments into one build: for
        each argument, the mask whose bit ``b`` (1 to 62) is set when the tables pick ``True``
        for the size bucket of calls of bit length ``b`` (``size_bucket``), the rest of the key
        being ``key``; ``size`` is the key name of the bucket. A launcher picks a call's variant
        from it by the call's size, so the per-call Python path does nothing more."""
        masks = dict.fromkeys(self.candidates, 0)
        for bits in range(1, 63):
            args = self.choose(is_cuda, **key, **{size: size_bucket(1 << (bits - 1))})
            for arg in masks:
                masks[arg] |= int(bool(args[arg])) << bits
        return masks


#: Every size bucket (bits 1 to 62 of a size mask): one candidate at every size, as ``tune`` times it.
EVERY_SIZE = (1 << 63) - 2


def size_bucket(n: int) -> int:
    """The size key of a call of ``n`` elements or tokens: the power of two at or below ``n``
    (0 for none), whose bit is that of ``n``'s bit length in a size mask."""
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def declared() -> list[Tunable]:
    """Every ``Tunable`` declared in this process (its op's module is imported), in order."""
    return list(_declared.values())


def identity(is_cuda: bool) -> tuple[str, str] | None:
    """The device a table must name: the current CUDA device's name and compute capability
    (``("NVIDIA H200", "9.0")``), or the emulator's; None for CUDA where no GPU is visible (a
    build made ahead for another machine: no table applies)."""
    if not is_cuda:
        return EMULATOR
    if not torch.cuda.is_available():
        return None
    return _device(torch.cuda.current_device())


@functools.cache
def _device(index: int) -> tuple[str, str]:
    """The name and compute capability of CUDA device ``index``: asked of the driver once, as a
    norm factory's first call asks ``choose`` for each of 62 sizes."""
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"{major}.{minor}"


def graph_times_us(calls: Sequence[Callable[[], object]], replays: int = 20, warmup: int = 3) -> list[float]:
    """The time per call, in microseconds, of each of ``replays`` replays of one CUDA graph that
    holds ``calls`` in order (each on its own inputs), after ``warmup`` replays: how kernkit's
    benchmarks time a kernel (``tune`` times several this way at once: ``graph_times_us_each``).

    Parameters
    ----------
    calls
        Launches to capture; each is run once first (module loads, the allocator).
    replays, warmup
        Timed and untimed replays.

    Example
    -------
    >>> statistics.median(graph_times_us([lambda: ops.rmsnorm(x, w)] * 100))  # doctest: +SKIP
    1.31
    """
    return graph_times_us_each([calls], replays, warmup)[0]


def graph_times_us_each(groups: Sequence[Sequence[Callable[[], object]]], replays: int = 20,
                        warmup: int = 3) -> list[list[float]]:
    """``graph_times_us`` of each group of calls, one graph per group, their replays interleaved
    (round ``r`` replays every graph once, in reverse order on odd rounds): how ``tune`` times
    the candidates of one shape, so that a drift of the GPU's clock or temperature during the
    measurement falls on every candidate alike instead of on the one timed last.

    Parameters
    ----------
    groups
        One list of launches per graph; each launch is run once first.
    replays, warmup
        Timed and untimed replays of each graph.

    Returns
    -------
    The times per call (us) of each group, in ``groups``' order, one per replay.
    """
    graphs = []
    for calls in groups:
        for fn in calls:
            fn()
        torch.cuda.synchronize()
        stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            for fn in calls:
                fn()
        torch.cuda.synchronize()
        graphs.append((graph, len(calls)))
    for _ in range(warmup):
        for graph, _ in graphs:
            graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: list[list[float]] = [[] for _ in graphs]
    for r in range(replays):
        order = range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))
        for i in order:
            graph, n = graphs[i]
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[i].append(start.elapsed_time(end) * 1e3 / n)
    return times


def key_of(tunable: Tunable, key: Mapping[str, object]) -> tuple:
    """``key`` as a table entry's key: its values in ``tunable.key``'s order, a dtype by its name."""
    if set(key) != set(tunable.key):
        raise TypeError(f"{tunable.name}: a tuning key has {', '.join(tunable.key)}, got {', '.join(key)}")
    return tuple(str(key[k]).removeprefix("torch.") if isinstance(key[k], torch.dtype) else key[k]
                 for k in tunable.key)


def tables(name: str) -> list[Path]:
    """The table files of the op ``name``, in the order they are read: the local cache's, each
    shared cache's, the package's. None with ``KERNKIT_TUNING=off``."""
    if not flag(TUNING_VAR, True):
        return []
    found = []
    for top in (root() / "tuning", *(d.absolute() / LAYOUT / "tuning" for d in shared_dirs()), SHIPPED_DIR):
        folder = top / name
        if folder.is_dir():
            found += sorted(folder.glob("*.json"))
    return found


@functools.cache
def _entries(name: str, device: tuple[str, str]) -> dict[tuple, dict[str, Scalar]]:
    """The entries of the op ``name`` that apply to ``device`` and this kernkit version, each key
    from the first table that has it: what ``choose`` reads, once per process."""
    tunable = _declared[name]
    chosen: dict[tuple, dict[str, Scalar]] = {}
    for path in tables(name):
        try:
            table = check_table(read_json(path, regular=True), tunable)
        except (OSError, ValueError) as e:
            logger.warning("kernkit: the tuning table %s is refused, none of it is used: %s", path, e)
            continue
        if (table["device"], table["capability"], table["kernkit"]) != (*device, __version__):
            logger.info("kernkit: the tuning table %s is for %s (sm %s) and kernkit %s, not this %s (sm %s) and "
                        "kernkit %s: passed over", path, table["device"], table["capability"], table["kernkit"],
                        *device, __version__)
            continue
        for entry in table["entries"]:
            chosen.setdefault(key_of(tunable, entry["key"]), entry["args"])
    return chosen


def check_table(table: object, tunable: Tunable | None) -> dict:
    """``table`` (a parsed JSON value) if it is a whole table of ``tunable``'s op; a ``ValueError``
    saying what is wrong otherwise.

    Every entry must have exactly the op's key names, with a bool, int or str for each, and name
    only arguments of the op with one of their candidates (compared with their types: ``1`` is
    not ``True``). Times are finite numbers >= 0. Strings hold no control character. With
    ``tunable`` None (an op this process has not declared: ``cache import`` of a project's
    table), the op is any dotted name and each entry's key and arguments any names with a bool,
    int or str; the op checks the rest when it reads the table."""
    fields = {"format", "op", "kernkit", "device", "capability", "entries"}
    if type(table) is not dict or set(table) != fields:
        raise ValueError(f"expected an object of {', '.join(sorted(fields))}")
    if table["format"] != FORMAT or type(table["format"]) is not int:
        raise ValueError(f"format {table['format']!r} is not {FORMAT}")
    if tunable is None and not (type(table["op"]) is str and _NAME.fullmatch(table["op"])):
        raise ValueError(f"op: expected a dotted name, got {table['op']!r}")
    if tunable is not None and table["op"] != tunable.name:
        raise ValueError(f"it is a table of {table['op']!r}, not {tunable.name!r}")
    for f in ("kernkit", "device", "capability"):
        if type(table[f]) is not str or control(table[f]):
            raise ValueError(f"{f}: expected a string without control characters, got {table[f]!r}")
    if type(table["entries"]) is not list:
        raise ValueError("entries: expected a list")
    for i, entry in enumerate(table["entries"]):
        if type(entry) is not dict or not {"key", "args"} <= set(entry) <= {"key", "args", *_TIMES}:
            raise ValueError(f"entry {i}: expected an object of key, args and times ({', '.join(_TIMES)})")
        key, args = entry["key"], entry["args"]
        if type(key) is not dict or not all(_scalar(v) for v in key.values()) or (
                set(key) != set(tunable.key) if tunable else not key or not all(map(_NAME.fullmatch, key))):
            expected = ", ".join(tunable.key) if tunable else "names"
            raise ValueError(f"entry {i}: key: expected {expected}, each a bool, int or string")
        if type(args) is not dict:
            raise ValueError(f"entry {i}: args: expected an object")
        for arg, value in args.items():
            if tunable is None:
                if not (_NAME.fullmatch(arg) and _scalar(value)):
                    raise ValueError(f"entry {i}: {arg}={value!r} is not a name with a bool, int or string")
                continue
            values = tunable.candidates.get(arg)
            if values is None or _typed(value) not in map(_typed, values):
                raise ValueError(f"entry {i}: {arg}={value!r} is not a candidate of {tunable.name} "
                                 f"({', '.join(f'{a}: {v}' for a, v in tunable.candidates.items())})")
        for t in _TIMES:
            value = entry.get(t, 0.0)
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"entry {i}: {t}: expected a finite number >= 0, got {value!r}")
    return table


#: The times an entry may carry (microseconds): what ``tune`` measured.
_TIMES = ("default_us", "tuned_us", "spread_us")


def _scalar(value: object) -> bool:
    return type(value) in (bool, int) or (type(value) is str and not control(value))


def _typed(value: object) -> tuple[type, object]:
    """A value with its type, so that ``True`` and ``1`` are different candidates."""
    return type(value), value
