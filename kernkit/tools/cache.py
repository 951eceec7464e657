"""Inspect or clear kernkit's on-disk cache of built specializations ($KERNKIT_CACHE_DIR, default
~/.cache/kernkit).

`cache` or `cache list` prints one line per published build (specialization, backend,
architecture, size, age) and a total. `cache clear` removes every build and kept failure;
`cache clear --kernel NAME` only those of one kernel. Locks and builds in progress are left
alone. The builds are all the cache holds: a cleared kernel simply compiles again when used.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ..jit.cache import discard, root


def human_size(n: float) -> str:
    """``n`` bytes as ``512 B``, ``4.0 KiB``... ``1.2 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def tree_size(path: Path) -> int:
    """Bytes of the files under ``path``; 0 when it does not exist."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def published(kernel: str | None = None) -> list[tuple[Path, dict]]:
    """The published builds, ``<cache>/v2/<name>/<args>-<key16>/<build12>/``.

    Parameters
    ----------
    kernel
        Only this kernel's (the first element of its marker, e.g. ``scale``); default: all.

    Returns
    -------
    ``(build directory, its meta.json record)`` pairs, sorted by path.
    """
    builds = []
    for meta in sorted(root().glob("[!.]*/[!.]*/[!.]*/meta.json")):  # not .locks, .staging, .failed
        if kernel is None or meta.parents[2].name == kernel:
            try:
                builds.append((meta.parent, json.loads(meta.read_bytes())))
            except (OSError, ValueError):  # being removed
                pass
    return builds


def clear(kernel: str | None = None) -> int:
    """Remove the published builds and kept failures (``.failed/<name>-<key16>``) of ``kernel``,
    or all of them; ``.locks`` and ``.staging`` (builds in progress) stay.

    Returns
    -------
    The number of published builds removed.
    """
    top = root()
    count = len(published(kernel))
    kernels = [p for p in top.iterdir() if not p.name.startswith(".")] if top.is_dir() else []
    failed = list((top / ".failed").iterdir()) if (top / ".failed").is_dir() else []
    for path in kernels + failed:
        if kernel is None or (path.name if path in kernels else path.name.rsplit("-", 1)[0]) == kernel:
            discard(path)
    return count


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def run(args: argparse.Namespace) -> int:
    """The ``cache`` subcommand: ``list`` (the default) or ``clear [--kernel NAME]``; returns 0."""
    if args.action == "clear":
        n = clear(args.kernel)
        print(f"removed {n} build{'s' * (n != 1)}{f' of {args.kernel}' if args.kernel else ''} from {root()}")
        return 0
    now, total = time.time(), 0
    rows = [("SPECIALIZATION", "BACKEND", "ARCH", "SIZE", "AGE")]
    for path, meta in published():
        size = tree_size(path)
        total += size
        rows.append((meta.get("title", path.parent.parent.name), meta.get("backend") or "c++",
                     meta.get("arch") or "-", human_size(size), _age(now - meta.get("built_at", now))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows if len(rows) > 1 else []:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"{len(rows) - 1} build{'s' * (len(rows) != 2)}, {human_size(total)}, in {root()}")
    return 0
