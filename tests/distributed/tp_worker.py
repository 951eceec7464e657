"""Tensor-parallel check of kernkit ops: a vocabulary-parallel embedding summed by an all-reduce,
per-rank KV-cache writes, and (with ``--cold-cache``) one compile per specialization for all
ranks together.

Each rank:

1. builds the full embedding table from a seed (the same on every rank), keeps its contiguous
   shard of the vocabulary and runs ``ops.indexing(shard, ids, vocab_range=(start, length))``;
   an all-reduce (SUM) of the partial results must equal ``F.embedding(ids, table)`` bit for bit
   (every position has exactly one non-zero contributor, and the table has no negative zeros,
   so ``x + 0 + ... + 0 == x`` exactly);
2. owns heads ``[rank * H / W, (rank + 1) * H / W)`` and writes its slice of K and V, strided
   views of a fused ``[n, 3, H, D]`` QKV tensor, into its own pool with ``ops.store_cache``,
   checked against torch indexing;
3. reports its cache directory and the specializations it compiled (from the ``kernkit.jit``
   logger's "kernkit: compiled ..." records) and loaded.

With ``--cold-cache DIR`` every rank uses one fresh cache directory, all ranks start their first
op together (a barrier), and rank 0 checks that each specialization was compiled exactly once over
all ranks and published exactly once in the cache.

Run it with ``torchrun`` (``python -m torch.distributed.run --nproc_per_node=2 tp_worker.py ...``)
or by itself, which starts ``--world-size`` processes with ``torch.multiprocessing.spawn``::

    PYTHONPATH=$PWD python tests/distributed/tp_worker.py --backend gloo --world-size 2 --cold-cache "$(mktemp -d)"
    PYTHONPATH=$PWD python tests/distributed/tp_worker.py --backend nccl --world-size 2 --cold-cache "$(mktemp -d)"

Under torchrun every rank must be given the same empty ``--cold-cache`` directory.

The exit status is 0 only when every rank passed. ``--report FILE`` makes rank 0 write the
gathered per-rank results as JSON.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import logging
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

#: Environment for NCCL runs: NVLink multicast (NVLS) stays off.
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

COMPILED_PREFIX = "kernkit: compiled "


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard_of(vocab: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, length)`` of rank's contiguous shard; the first ``vocab % world`` shards hold one
    row more."""
    base, extra = divmod(vocab, world)
    start = rank * base + min(rank, extra)
    return start, base + (1 if rank < extra else 0)


class _CompileRecords(logging.Handler):
    """Collects the ``kernkit.jit`` logger's per-compile records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.compiled: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith(COMPILED_PREFIX):
            label = record.args[0] if isinstance(record.args, tuple) and record.args else msg
            title = str(label).split(" (")[0]  # "store_cache<...> (nvcc, sm_90a)"
            self.compiled.append({"title": str(title), "message": msg})


def _table(vocab: int, hidden: int, dtype, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, hidden, generator=g, dtype=torch.float32).to(dtype)
    # No zeros of either sign: -0.0 + 0.0 is +0.0, which would differ from the table bitwise.
    table[table == 0] = 0.5
    return table


def _ids(vocab: int, world: int, n_random: int, seed: int):
    import torch

    ids = [0, 1, vocab - 2, vocab - 1]
    for r in range(world):
        start, length = shard_of(vocab, world, r)
        ids += [start, start + 1, start + length - 2, start + length - 1]
        if start > 0:
            ids.append(start - 1)
    g = torch.Generator().manual_seed(seed + 1)
    ids += torch.randint(0, vocab, (n_random,), generator=g).tolist()
    return torch.tensor(ids, dtype=torch.int64)


def expected_requests(dtype, hidden: int, heads_local: int, head_dim: int, device_type: str) -> list[str]:
    """Titles of the specializations the two ops ask for (through the spec builders the ops
    themselves use). The cold-cache check counts whatever was compiled."""
    from kernkit.ops.indexing import indexing_spec
    from kernkit.ops.store_cache import store_cache_spec

    backend = None if device_type == "cuda" else "emu"
    return sorted({indexing_spec(dtype, hidden, backend).title,
                   store_cache_spec(dtype, (heads_local, head_dim), backend).title})


def run_rank(rank: int, world: int, opts: argparse.Namespace) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    handler = _CompileRecords()
    jit_logger = logging.getLogger("kernkit.jit")
    jit_logger.addHandler(handler)
    jit_logger.setLevel(logging.INFO)

    if opts.backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(opts.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=opts.timeout),
                            **({"device_id": device} if device.type == "cuda" else {}))
    try:
        import kernkit.ops as ops
        from kernkit.jit.config import cache_dir

        dtype = getattr(torch, opts.dtype)
        cache = str(cache_dir())
        t0 = time.perf_counter()

        # Everything a rank needs is made before the barrier, so the first ops start together.
        table = _table(opts.vocab, opts.hidden, dtype, opts.seed)
        start, length = shard_of(opts.vocab, world, rank)
        shard = table[start:start + length].to(device)
        ids = _ids(opts.vocab, world, opts.tokens, opts.seed)
        assert opts.heads % world == 0, f"--heads {opts.heads} must divide over {world} ranks"
        hl = opts.heads // world
        h0 = rank * hl
        g = torch.Generator().manual_seed(opts.seed + 2)
        n = opts.tokens
        qkv = torch.randn(n, 3, opts.heads, opts.head_dim, generator=g).to(dtype).to(device)
        k = qkv[:, 1, h0:h0 + hl]  # [n, hl, D], row stride 3 * H * D: a strided view
        v = qkv[:, 2, h0:h0 + hl]
        pool = opts.pool
        k_cache = torch.randn(pool, hl, opts.head_dim, generator=g).to(dtype).to(device)
        v_cache = torch.randn(pool, hl, opts.head_dim, generator=g).to(dtype).to(device)
        perm = torch.randperm(pool, generator=g)[:n]
        loc = perm.clone()
        loc[0], loc[-1] = -1, pool  # out of the pool: never written
        loc = loc.to(device)
        used = expected_requests(dtype, opts.hidden, hl, opts.head_dim, device.type)

        _barrier(dist, device)
        t_start = time.perf_counter()

        # 1. Vocabulary-parallel embedding.
        checks = {}
        for ids_dtype in (torch.int64, torch.int32):
            ids_d = ids.to(ids_dtype).to(device)
            part = ops.indexing(shard, ids_d, vocab_range=(start, length))
            dist.all_reduce(part, op=dist.ReduceOp.SUM)
            want = F.embedding(ids.to(device), table.to(device))
            ok = bool(torch.equal(part, want))
            checks[f"embedding[{str(ids_dtype).removeprefix('torch.')}]"] = ok
            assert ok, f"rank {rank}: all-reduced embedding != F.embedding ({ids_dtype})"

        # 2. Each rank writes its own heads' K/V into its own pool.
        want_k, want_v = k_cache.clone(), v_cache.clone()
        valid = (loc >= 0) & (loc < pool)
        want_k[loc[valid]] = k[valid]
        want_v[loc[valid]] = v[valid]
        assert not k.is_contiguous()
        ops.store_cache(k_cache, v_cache, loc, k, v)
        ok = bool(torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v))
        checks["store_cache"] = ok
        assert ok, f"rank {rank}: store_cache wrote different rows than torch indexing"
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t_ops = time.perf_counter() - t_start

        compiled = sorted(c["title"] for c in handler.compiled)
        # In a cold cache of its own run, everything published was needed by every rank.
        published = sorted(set(published_titles(cache))) if opts.cold_cache else []
        result = {
            "rank": rank,
            "world": world,
            "backend": opts.backend,
            "device": str(device),
            "host": socket.gethostname(),
            "cache_dir": cache,
            "shard": [start, length],
            "heads": [h0, h0 + hl],
            "checks": checks,
            "used": used,
            "compiled": compiled,
            "compile_messages": [c["message"] for c in handler.compiled],
            "loaded": sorted((set(used) | set(published)) - set(compiled)),
            "seconds_setup": round(t_start - t0, 3),
            "seconds_ops": round(t_ops, 3),
        }
        results = [None] * world
        dist.all_gather_object(results, result)

        if rank == 0 and opts.cold_cache:
            _check_compiled_once(results, used, cache)
        _barrier(dist, device)
        return {"rank": rank, "results": results}
    finally:
        jit_logger.removeHandler(handler)
        dist.destroy_process_group()


def _barrier(dist, device) -> None:
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def published_titles(cache: str) -> list[str]:
    """The title of every build published in the cache (one ``meta.json`` each)."""
    return [json.loads(p.read_text())["title"] for p in Path(cache).glob("v2/*/*/*/meta.json")]


def _check_compiled_once(results: list[dict], used: list[str], cache: str) -> None:
    dirs = {r["cache_dir"] for r in results}
    assert dirs == {cache}, f"ranks used different cache directories: {sorted(dirs)}"
    counts = collections.Counter(t for r in results for t in r["compiled"])
    missing = set(used) - set(counts)
    assert not missing, f"never compiled in the cold cache: {sorted(missing)} (compiled: {dict(counts)})"
    twice = {t: c for t, c in counts.items() if c != 1}
    assert not twice, f"compiled more than once over all ranks: {twice}"
    published = collections.Counter(published_titles(cache))
    assert published == counts, (
        f"published builds in {cache}: {dict(published)}; compiled over all ranks: {dict(counts)}")
    for r in results:
        assert set(r["used"]) == set(used), f"rank {r['rank']} needed {r['used']}, rank 0 {used}"
        assert set(r["compiled"]) | set(r["loaded"]) == set(counts), (
            f"rank {r['rank']}: compiled {r['compiled']} + loaded {r['loaded']} != {sorted(counts)}")


def _summary(r: dict) -> str:
    checks = " ".join(f"{k}={'ok' if v else 'FAIL'}" for k, v in r["checks"].items())
    return (f"[rank {r['rank']}/{r['world']}] {r['backend']} {r['device']} host={r['host']} "
            f"shard=[{r['shard'][0]}, +{r['shard'][1]}) heads=[{r['heads'][0]}, {r['heads'][1]}) {checks} "
            f"ops={r['seconds_ops']:.2f}s cache={r['cache_dir']} "
            f"compiled={r['compiled']} loaded={r['loaded']}")


def _print_report(results: list[dict], opts: argparse.Namespace) -> None:
    for r in results:
        print(_summary(r), flush=True)
    if opts.cold_cache:
        n = len({t for r in results for t in r["compiled"]})
        print(f"cold shared cache: {n} specializations, each compiled once over {len(results)} ranks "
              f"and loaded by the others: OK", flush=True)
    if opts.report:
        Path(opts.report).write_text(json.dumps(results, indent=2))


def _spawn_entry(rank: int, world: int, opts: argparse.Namespace) -> None:
    out = run_rank(rank, world, opts)
    if rank == 0:
        _print_report(out["results"], opts)


def prepare_env(opts: argparse.Namespace) -> None:
    """Environment every rank inherits (set before the ranks start, or first thing in each)."""
    if opts.backend == "nccl":
        for k, v in NCCL_ENV.items():
            os.environ.setdefault(k, v)
    if opts.cold_cache:
        os.environ["KERNKIT_CACHE_DIR"] = opts.cold_cache


def fresh_cache_dir(base: str) -> str:
    """``base`` itself when it is missing or empty, else a new directory inside it."""
    p = Path(base)
    if not p.exists() or (p.is_dir() and not any(p.iterdir())):
        p.mkdir(parents=True, exist_ok=True)
        return str(p.resolve())
    p.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix="kernkit-tp-cache-", dir=p)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument("--world-size", type=int, default=2, help="ranks to spawn when not under torchrun")
    ap.add_argument("--cold-cache", metavar="DIR", default=None,
                    help="one fresh kernkit cache for all ranks (DIR if empty, else a new directory in it); "
                         "checks one compile per specialization")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--vocab", type=int, default=1003)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--pool", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=float, default=300.0, help="process-group timeout, seconds")
    ap.add_argument("--report", default=None, help="rank 0 writes the per-rank results here (JSON)")
    opts = ap.parse_args(argv)
    if opts.tokens > opts.pool:
        ap.error("--tokens must not exceed --pool")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.cold_cache and "RANK" not in os.environ:
        opts.cold_cache = fresh_cache_dir(opts.cold_cache)
    prepare_env(opts)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        # Every rank must name the same fresh directory: pass an empty or new DIR under torchrun.
        if opts.cold_cache:
            Path(opts.cold_cache).mkdir(parents=True, exist_ok=True)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        try:
            out = run_rank(rank, world, opts)
        except BaseException:
            traceback.print_exc()
            return 1
        if rank == 0:
            _print_report(out["results"], opts)
        return 0

    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(free_port())
    if opts.backend == "nccl":
        import torch

        n = torch.cuda.device_count()
        if n < opts.world_size:
            print(f"--backend nccl needs {opts.world_size} GPUs, found {n}", file=sys.stderr)
            return 2
    print(f"kernkit tensor-parallel check: backend={opts.backend} world={opts.world_size} "
          f"dtype={opts.dtype} vocab={opts.vocab} hidden={opts.hidden} heads={opts.heads}x{opts.head_dim} "
          f"cache={os.environ.get('KERNKIT_CACHE_DIR', '(default)')} "
          f"date={datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}", flush=True)
    t = time.perf_counter()
    mp.spawn(_spawn_entry, args=(opts.world_size, opts), nprocs=opts.world_size, join=True)
    print(f"all {opts.world_size} ranks passed in {time.perf_counter() - t:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
