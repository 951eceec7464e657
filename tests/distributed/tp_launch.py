"""Runs ``tp_worker.py`` in a fresh interpreter (its ranks are spawned from there, away from the
pytest process) and returns the per-rank results it reports. Imported by the tests by file path,
so it never depends on which ``conftest`` is importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKER = HERE / "tp_worker.py"


def run_worker(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> list[dict]:
    """``tp_worker.py --cold-cache <tmp>/cache --report <tmp>/report.json *args``; fails the
    test with the worker's output when it exits non-zero."""
    report = tmp_path / "report.json"
    cache = tmp_path / "cache"
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p)
    full_env.pop("MASTER_PORT", None)  # the worker picks a free one
    cmd = [sys.executable, str(WORKER), "--cold-cache", str(cache), "--report", str(report), *args]
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited with {proc.returncode}:\n{out[-8000:]}"
    print(out)
    results = json.loads(report.read_text())
    for r in results:
        assert r["cache_dir"] == str(cache.resolve()), r
    return results


def check_results(results: list[dict], world: int) -> None:
    """What the worker asserted, checked again from its report."""
    assert sorted(r["rank"] for r in results) == list(range(world))
    for r in results:
        assert r["checks"] and all(r["checks"].values()), r
    compiled = Counter(t for r in results for t in r["compiled"])
    # Every specialization the ops need was compiled exactly once over all ranks...
    needed = set(results[0]["used"])
    assert needed <= set(compiled), (needed, compiled)
    assert all(c == 1 for c in compiled.values()), compiled
    # ...and every rank that did not compile one loaded the published build.
    for r in results:
        assert set(r["compiled"]).isdisjoint(r["loaded"]), r
        assert set(r["compiled"]) | set(r["loaded"]) == set(compiled), r
    # The shards cover the vocabulary contiguously, the heads are split evenly.
    shards = sorted(tuple(r["shard"]) for r in results)
    assert all(a[0] + a[1] == b[0] for a, b in zip(shards, shards[1:], strict=False)) and shards[0][0] == 0
