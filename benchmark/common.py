"""Helpers shared by the benchmarks: CUDA-graph timing with inputs rotated beyond the L2, the
device copy bandwidth, host cost per call, the results header, a markdown table and a
bandwidth plot.

Benchmarks measure and report; they never assert speeds.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from kernkit.jit.tuning import graph_times_us, graph_times_us_each

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: The H200's L2 is 60 MB; a graph's calls together touch at least this many bytes, so the
#: replays read from device memory, not from the cache.
ROTATE_BYTES = 3 * 60 * 2**20

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}


def calls_for(bytes_per_call: int, min_calls: int = 20, max_calls: int = 1000) -> int:
    """Calls in one graph, each on its own inputs, so that they touch ``ROTATE_BYTES`` or more."""
    return max(min_calls, min(max_calls, math.ceil(ROTATE_BYTES / max(bytes_per_call, 1))))


def graph_time_us(calls: Sequence[Callable[[], object]], replays: int = 30, warmup: int = 3) -> float:
    """Median time per call, in microseconds, of one CUDA graph holding ``calls`` in order
    (each should use its own inputs), over ``replays`` replays after ``warmup``: the timer
    ``tune`` uses (``kernkit.jit.tuning.graph_times_us``)."""
    return statistics.median(graph_times_us(calls, replays, warmup))


def graph_times_us_by(fns: Mapping[str, Callable[[int], object]], calls: int, replays: int = 30,
                      warmup: int = 3) -> dict[str, float]:
    """Median time per call, in microseconds, of each method ``fns[name]``: one CUDA graph of
    ``fns[name](c)`` for ``c`` in ``range(calls)`` (call ``c`` on input copy ``c``), the graphs'
    replays interleaved (``graph_times_us_each``), so that a drift of the GPU's clock during a
    row falls on every method alike and not on the one timed last."""
    names = list(fns)
    times = graph_times_us_each([[lambda c=c, f=fns[m]: f(c) for c in range(calls)] for m in names], replays, warmup)
    return {m: statistics.median(t) for m, t in zip(names, times, strict=True)}


#: The columns of a per-op benchmark's table after its shape's (``bandwidth_row``).
BANDWIDTH_COLUMNS = ["kernkit us", "eager us", "compile us", "kernkit TB/s", "eager TB/s", "compile TB/s",
                     "kernkit % of copy"]


def bandwidth_row(label: str, shape: Sequence[object], us: Mapping[str, float], moved: int, ceiling_tbs: float,
                  series: dict[str, list[float]]) -> list:
    """One row of a per-op benchmark's table: the ``shape`` columns, then ``BANDWIDTH_COLUMNS``
    from the times ``us`` of kernkit, torch eager and torch.compile (in that order) for calls
    that move ``moved`` bytes each. Appends each method's TB/s to ``series`` and prints the
    times after ``label``."""
    tbs = {m: moved / (t * 1e-6) / 1e12 for m, t in us.items()}
    for m, v in tbs.items():
        series.setdefault(m, []).append(v)
    print(f"{label}  " + "  ".join(f"{m} {t:9.2f} us" for m, t in us.items()), flush=True)
    return [*shape, *us.values(), *tbs.values(), 100.0 * tbs["kernkit"] / ceiling_tbs]


def allow_recompiles(limit: int = 64) -> None:
    """Let one ``torch.compile``'d function recompile per shape (``dynamic=False``) up to
    ``limit`` times: past dynamo's default of 8 it would fall back to eager without a word, and
    the torch.compile column would time eager code."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)


def copy_bandwidth_tbs(nbytes: int = 2 * 2**30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes read plus bytes written, in TB/s (median)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times) / 1e12


def sync_for(device: str) -> Callable[[], object]:
    """What waits for queued work on ``device``: ``torch.cuda.synchronize`` or nothing."""
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def host_us(fns: Mapping[str, Callable[[], object]], calls: int = 2000, rounds: int = 15,
            sync: Callable[[], object] | None = None) -> dict[str, float]:
    """Host cost per call of each function, in microseconds: ``calls`` calls back to back without
    synchronizing (the CPU cost of one call, as long as the GPU keeps up), the best of ``rounds``
    rounds (the least disturbed), the functions' rounds interleaved so that a busy moment of the
    machine hits all alike. ``sync`` waits for queued work between rounds (default:
    ``torch.cuda.synchronize`` when a GPU is visible)."""
    sync = sync or sync_for("cuda" if torch.cuda.is_available() else "cpu")
    for fn in fns.values():
        for _ in range(50):
            fn()
    sync()
    best = dict.fromkeys(fns, math.inf)
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
            sync()
    return best


def host_cpu() -> str:
    """The host CPU's model name and core count."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def machine() -> str:
    """The GPU (when one is visible) and the host CPU."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}; host {host_cpu()}"
    return f"no GPU; {host_cpu()}"


def commit() -> str:
    """The checkout's short commit, marked when ``kernkit/`` has local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernkit"], capture_output=True, text=True,
                               cwd=REPO).stdout.strip()
    except OSError:
        return "unknown"
    return (head.stdout.strip() or "unknown") + (" (with local changes under kernkit/)" if dirty else "")


def software() -> str:
    import tvm_ffi

    return f"Python {platform.python_version()}, torch {torch.__version__}, apache-tvm-ffi {tvm_ffi.__version__}"


def header(title: str, command: str, device: str | None = None) -> list[str]:
    """The lines every results file starts with: date, machine (``device`` overrides it),
    software, command, kernkit commit."""
    return [
        f"# {title}",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {device or machine()}",
        f"- software: {software()}",
        f"- command: `{command}`",
        f"- kernkit commit: {commit()}",
        "",
    ]


def command_line() -> str:
    """How this script was run, relative to the repository."""
    script = Path(sys.argv[0]).resolve()
    name = script.relative_to(REPO) if REPO in script.parents else script.name
    return " ".join(["python", str(name), *sys.argv[1:]])


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def fmt(x):
        if isinstance(x, float):
            return "-" if math.isnan(x) else (f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}")
        return str(x)

    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    out += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return out


def write_report(out_dir: Path | None, name: str, lines: Sequence[str]) -> str:
    """Join ``lines``, print them, and write them to ``out_dir/name`` when a directory is given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_text(text)
        print(f"wrote {out_dir / name}", file=sys.stderr)
    return text


def plot_bandwidth(path: Path, title: str, ns: Sequence[int], series: dict[str, Sequence[float]],
                   ceiling_tbs: float) -> bool:
    """A PNG of achieved bandwidth (TB/s) against n, one line per method, with the copy
    ceiling; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in series.items():
        ax.plot(ns, values, marker="o", label=name)
    ax.axhline(ceiling_tbs, color="k", linestyle="--", label=f"device copy {ceiling_tbs:.2f} TB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (rows)")
    ax.set_ylabel("achieved TB/s (bytes read + written)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
