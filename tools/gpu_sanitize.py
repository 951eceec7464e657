#!/usr/bin/env python3
"""Runs every shipped CUDA kernel under ``compute-sanitizer`` (memcheck, racecheck, initcheck)
and writes a markdown summary.

    PYTHONPATH=$PWD python3 tools/gpu_sanitize.py --out benchmark/results/sanitize

From the repository root, on a machine with a GPU. Steps:

1. a plain run of ``tools/sanitize_driver.py`` builds every specialization (in parallel, into
   a private cache unless ``--cache-dir`` is given) and checks every case against the torch
   reference, so that nvcc never runs under a sanitizer;
2. one run of the driver per tool, as
   ``compute-sanitizer --tool <tool> --error-exitcode 1 python3 tools/sanitize_driver.py``,
   with ``KERNKIT_JIT=off`` (a build missing from the cache fails instead of compiling) and
   ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (every tensor is its own ``cudaMalloc``, so memcheck sees
   an access past its end).

Prints one line per tool (``memcheck: ERROR SUMMARY: 0 errors ...``), writes ``<tool>.log`` and
``sanitize.md`` to ``--out``, and exits non-zero if the driver failed, a tool reported an error,
or a summary line is missing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DRIVER = "tools/sanitize_driver.py"
TOOLS = ("memcheck", "racecheck", "initcheck")
OK_LINE = re.compile(r"^SANITIZE-DRIVER-OK (\d+) cases$", re.M)
# memcheck and initcheck: "========= ERROR SUMMARY: 0 errors"; racecheck:
# "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


@dataclass
class ToolRun:
    tool: str
    command: list[str]
    returncode: int
    seconds: float
    errors: int | None  # None: no summary line found
    summary: str
    cases: int | None
    log: str

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and self.errors == 0 and self.cases is not None


def find_sanitizer(given: str | None) -> str | None:
    if given:
        return given
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "compute-sanitizer").is_file():
            return str(Path(home) / "bin" / "compute-sanitizer")
    return None


def parse_summary(tool: str, output: str) -> tuple[int | None, str]:
    """The number of errors the tool reported and its summary line (without the ``=====``)."""
    if tool == "racecheck":
        m = list(RACE_SUMMARY.finditer(output))
        if m:
            _, errors, warnings = (int(x) for x in m[-1].groups())
            return errors + warnings, m[-1].group(0)
    m = list(ERROR_SUMMARY.finditer(output))
    if m:
        return int(m[-1].group(1)), m[-1].group(0)
    return None, "no summary line"


def run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=timeout)
        code, out = res.returncode, res.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, out = 124, out + f"\n[timed out after {timeout:.0f} s]\n"
    return code, out, time.perf_counter() - t0


def driver_command(python: str, device: str, only: str | None) -> list[str]:
    return [python, DRIVER, "--device", device] + (["--only", only] if only else [])


def tool_command(sanitizer: str, tool: str, driver: list[str]) -> list[str]:
    return [sanitizer, "--tool", tool, "--error-exitcode", "1", "--print-limit", "50", *driver]


def version_of(sanitizer: str) -> str:
    try:
        out = subprocess.run([sanitizer, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return next((line for line in lines if "Version" in line or "version" in line), lines[-1] if lines else "?")


def gpu_of(warm_output: str) -> str:
    m = re.search(r"^device: (.*)$", warm_output, re.M)
    return m.group(1) if m else "?"


def markdown(runs: list[ToolRun], warm: tuple[int, float, int | None], sanitizer: str, python: str, version: str,
             device: str, gpu: str, date: str) -> str:
    warm_code, warm_seconds, warm_cases = warm
    lines = [
        "# compute-sanitizer runs of kernkit's CUDA kernels",
        "",
        f"- date (UTC): {date}",
        f"- device: {gpu}",
        f"- compute-sanitizer: {version}",
        f"- driver: `{DRIVER} --device {device}` ({warm_cases if warm_cases is not None else '?'} cases: "
        "store_cache with negative, >= pool and int64 indices, strided and misaligned views; indexing with "
        "out-of-range ids, int32/int64 ids, a vocabulary shard, an out= view; scale with tails, a misaligned "
        "input and an out= view, fp16/bf16/fp32)",
        f"- plain run first (builds and checks against the torch reference): exit {warm_code}, "
        f"{warm_seconds:.0f} s",
        "- sanitized runs with `KERNKIT_JIT=off PYTORCH_NO_CUDA_MEMORY_CACHING=1`",
        "",
        "| tool | command | exit | summary | cases | seconds | result |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        shown = ["compute-sanitizer" if c == sanitizer else "python3" if c == python else c for c in r.command]
        cmd = " ".join(shlex.quote(c) for c in shown)
        lines.append(f"| {r.tool} | `{cmd}` | {r.returncode} | {r.summary} | "
                     f"{r.cases if r.cases is not None else '-'} | {r.seconds:.0f} | "
                     f"{'clean' if r.clean else '**FAILED**'} |")
    lines += ["", "racecheck looks for shared-memory hazards; these kernels use no shared memory, so a clean "
              "racecheck says only that. memcheck and initcheck cover the global-memory accesses.", "",
              "Full output of each tool: `<tool>.log` next to this file (`plain.log`: the run without a "
              "sanitizer).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for sanitize.md and the tools' logs")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)} (default: all)")
    p.add_argument("--device", default="cuda", help="passed to the driver (cpu: for testing this script only)")
    p.add_argument("--sanitizer", help="the compute-sanitizer executable (default: on PATH, else $CUDA_HOME/bin)")
    p.add_argument("--cache-dir", help="KERNKIT_CACHE_DIR for the builds (default: a fresh temporary directory)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    p.add_argument("--only", metavar="TEXT", help="only the driver's cases whose name contains TEXT")
    args = p.parse_args(argv)

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown or not tools:
        p.error(f"unknown tool(s) {unknown}; choose from {', '.join(TOOLS)}")
    sanitizer = find_sanitizer(args.sanitizer)
    if sanitizer is None:
        print("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="kernkit-sanitize-cache-")
    try:
        return sanitize(args, tools, sanitizer, cache)
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)


def sanitize(args: argparse.Namespace, tools: list[str], sanitizer: str, cache: str) -> int:
    python = sys.executable or "python3"

    env = dict(os.environ, KERNKIT_CACHE_DIR=str(cache), PYTORCH_NO_CUDA_MEMORY_CACHING="1",
               CUDA_MODULE_LOADING="LAZY")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)

    # 1. Build and check without a sanitizer.
    driver = driver_command(python, args.device, args.only)
    code, out, seconds = run(driver, env, args.timeout)
    (args.out / "plain.log").write_text(out)
    m = OK_LINE.search(out)
    warm_cases = int(m.group(1)) if m else None
    warm = (code, seconds, warm_cases)
    print(f"plain run: exit {code}, {warm_cases if warm_cases is not None else 'no'} cases, {seconds:.0f} s",
          flush=True)
    if code != 0 or warm_cases is None:
        print(out[-4000:], file=sys.stderr)
        print("the plain run failed; not sanitizing", file=sys.stderr)
        return 1

    # 2. Each tool, with everything already built.
    sanitized_env = dict(env, KERNKIT_JIT="off")
    runs = []
    for tool in tools:
        cmd = tool_command(sanitizer, tool, driver)
        code, out, seconds = run(cmd, sanitized_env, args.timeout)
        (args.out / f"{tool}.log").write_text(out)
        errors, summary = parse_summary(tool, out)
        m = OK_LINE.search(out)
        r = ToolRun(tool, cmd, code, seconds, errors, summary, int(m.group(1)) if m else None, f"{tool}.log")
        runs.append(r)
        note = "" if r.clean else "  <-- FAILED" + ("" if r.cases is not None else " (the driver did not finish)")
        print(f"{tool}: {summary} (exit {code}, {seconds:.0f} s){note}", flush=True)

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    text = markdown(runs, warm, sanitizer, python, version_of(sanitizer), args.device,
                    gpu_of((args.out / "plain.log").read_text()), date)
    (args.out / "sanitize.md").write_text(text)
    print(f"wrote {args.out / 'sanitize.md'}")
    return 0 if all(r.clean for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
