"""Benchmark compare_key (host C++) on the CPU against numpy and torch baselines.

    python benchmark/bench_compare_key.py [--out DIR]

Each case compares two int32 keys of length L whose first difference is at position L - 1
(the worst case: the whole prefix is scanned). Times are medians of repeated calls, in us.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import common

from kernkit import ops


def per_call_us(fn, reps):
    fn()
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        rounds.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(rounds)


def numpy_prefix(a, b):
    n = min(a.size, b.size)
    d = np.flatnonzero(a[:n] != b[:n])
    return int(d[0]) if d.size else n


def torch_prefix(a, b):
    n = min(a.shape[0], b.shape[0])
    d = (a[:n] != b[:n]).nonzero()
    return int(d[0, 0]) if d.numel() else n


def python_loop(a, b):
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    rows = []
    for length in (8, 64, 512, 4096, 32768, 262144):
        a = torch.randint(0, 150000, (length,), dtype=torch.int32)
        b = a.clone()
        b[-1] += 1
        an, bn = a.numpy(), b.numpy()
        al, bl = a.tolist(), b.tolist()
        assert ops.compare_key(a, b) == numpy_prefix(an, bn) == torch_prefix(a, b) == length - 1
        reps = max(10, min(20000, 2_000_000 // length))
        res = [
            per_call_us(lambda a=a, b=b: ops.compare_key(a, b), reps),
            per_call_us(lambda an=an, bn=bn: numpy_prefix(an, bn), reps),
            per_call_us(lambda a=a, b=b: torch_prefix(a, b), reps),
            per_call_us(lambda al=al, bl=bl: python_loop(al, bl), max(3, reps // 20)),
        ]
        gbs = 2 * 4 * length / (res[0] * 1e-6) / 1e9
        rows.append([length, *res, gbs])
        print(rows[-1], flush=True)
    gpu = f", host of an {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    lines = common.header("compare_key (CPU)", common.command_line(), f"CPU: {common.host_cpu()}{gpu}")
    lines += ["Common prefix of two int32 keys differing only at the last position; median us per call.", ""]
    lines += common.markdown_table(
        ["length", "kernkit us", "numpy us", "torch us", "python loop us", "kernkit GB/s scanned"], rows)
    common.write_report(args.out, "compare_key.md", lines)


if __name__ == "__main__":
    main()
