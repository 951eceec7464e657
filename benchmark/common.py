"""Timing helpers shared by the benchmarks: CUDA-graph timing with inputs rotated beyond the L2,
the device copy bandwidth, host cost per call, a markdown table and a bandwidth plot.

Benchmarks measure and report; they never assert speeds.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

#: The H200's L2 is 60 MB; a graph's calls together touch at least this many bytes, so the
#: replays read from device memory, not from the cache.
ROTATE_BYTES = 3 * 60 * 2**20


def calls_for(bytes_per_call: int, min_calls: int = 20, max_calls: int = 1000) -> int:
    """Calls in one graph, each on its own inputs, so that they touch ``ROTATE_BYTES`` or more."""
    return max(min_calls, min(max_calls, math.ceil(ROTATE_BYTES / max(bytes_per_call, 1))))


def graph_time_us(calls: Sequence[Callable[[], object]], replays: int = 30, warmup: int = 3) -> float:
    """Median time per call, in microseconds, of one CUDA graph holding ``calls`` in order
    (each should use its own inputs), over ``replays`` replays after ``warmup``."""
    for fn in calls:  # warm: module loads, autotuning, allocator
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for fn in calls:
                fn()
    torch.cuda.synchronize()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)


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


def host_us_per_call(fn: Callable[[], object], calls: int = 2000,
                     sync: Callable[[], object] | None = None) -> float:
    """Wall time per call when issuing ``calls`` back to back without synchronizing (the CPU
    cost of one call, as long as the GPU keeps up), the best of 7 rounds (the least disturbed).
    ``sync`` waits for queued work between rounds (default: ``torch.cuda.synchronize``)."""
    sync = sync or torch.cuda.synchronize
    for _ in range(50):
        fn()
    sync()
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
        sync()
    return min(rounds)


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


def header(title: str, command: str, device: str | None = None) -> list[str]:
    """The lines every results file starts with: date, device (the GPU unless given), software,
    command, commit."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    gpu = device or (torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu")
    try:
        import tvm_ffi

        tvm = tvm_ffi.__version__
    except ImportError:
        tvm = "?"
    return [
        f"# {title}",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- device: {gpu}; torch {torch.__version__}, apache-tvm-ffi {tvm}, Python {platform.python_version()}",
        f"- command: `{command}`",
        f"- kernkit commit: {commit}",
        "",
    ]


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def fmt(x):
        return f"{x:.3g}" if isinstance(x, float) and abs(x) < 10 else (f"{x:.1f}" if isinstance(x, float) else str(x))

    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    out += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return out


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
