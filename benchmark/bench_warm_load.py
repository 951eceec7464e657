"""What a warm load costs on the host: a fresh ``JitSpec`` of a cached specialization, then
``build()`` (the cache hit: the record read and type-checked, the headers' stats compared), and
``cache.read_build`` of that one record alone. No library is loaded (``dlopen`` costs the same
whatever the cache does).

    python benchmark/bench_warm_load.py [--rounds 2000]

Prints the best and the median of ``--rounds`` rounds, after 50 of warm-up. To compare two
versions, run it under each, interleaved, each with its own ``KERNKIT_CACHE_DIR``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernkit.jit import cache
from kernkit.ops.scale import scale_spec


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    rounds = parser.parse_args().rounds
    build = scale_spec(torch.float32, "emu").build().parent  # compiled once if needed
    hit = lambda: scale_spec(torch.float32, "emu").build()  # noqa: E731
    for _ in range(50):
        hit()
    for label, fn, unit, scale in (("build() hit", hit, "ms", 1e3),
                                   ("read_build", lambda: cache.read_build(build), "us", 1e6)):
        times = sorted(_timed(fn) for _ in range(rounds))
        print(f"{label}: best {times[0] * scale:.3f} {unit}, median {statistics.median(times) * scale:.3f} {unit}")


if __name__ == "__main__":
    main()
