"""Precompiled headers for the host compiler, built beside the builds that use them, never in
their way.

The host-compiled units of the ``nvrtc`` and ``emu`` backends start with the same third-party
headers (tvm-ffi's, CUDA's, the standard library's); parsing them is about half of such a unit's
compile. ``header`` returns a header holding them whose ``.gch`` is ready, or None: then the
caller compiles its unit without it, and a detached process (this file run as a script, under
the key's lock, at a low priority) makes the ``.gch`` for later builds. So no build waits for
one, and the first call of a fresh install costs what a build without it costs.

A ``.gch`` appears through one ``os.replace`` of a complete file, so a compile sees none or a
whole one; GCC uses a ``.gch`` only where it was made with the same flags and parses the header
otherwise, so a stale or foreign one costs time, never correctness. A compile that fails leaves
``failed.log`` beside the header, and no later build tries again with that key (delete the
folder to retry).

    python pch.py <lock file> <header> <compiler and flags>...
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The third-party headers of every host-compiled unit (tvm-ffi's, CUDA's in host mode, the
#: standard library's): parsing them is about half of an nvrtc host half's compile.
PRELUDE = "".join(f"#include <{h}>\n" for h in (
    "tvm/ffi/function.h", "tvm/ffi/container/array.h", "tvm/ffi/container/shape.h", "tvm/ffi/container/tensor.h",
    "tvm/ffi/error.h", "tvm/ffi/extra/c_env_api.h", "tvm/ffi/optional.h", "cuda_runtime.h", "cuda_bf16.h",
    "cuda_fp16.h", "cuda_fp8.h", "algorithm", "cstdint", "functional", "initializer_list", "mutex", "sstream",
    "string", "tuple", "type_traits", "utility"))

#: The folders whose maker this process has started (one attempt per folder and process).
_started: set[Path] = set()


def header(text: str, flags: list[str], identity: object) -> Path | None:
    """The ``prelude.h`` holding ``text`` whose ``.gch`` for ``flags`` (the compiler first) is
    ready, under ``<cache>/v2/pch/<key16>/``; else None, after starting its maker if no attempt
    has failed. ``identity`` (JSON) is what else decides the ``.gch``: the identity of the
    compiler and of the headers it reads. Starting the maker waits for nothing.

    Parameters
    ----------
    text
        The header's text (``#include`` lines).
    flags
        The compile command without input, output and dependency flags.
    identity
        JSON-serializable material of the key besides ``text`` and ``flags``.

    Returns
    -------
    pathlib.Path or None
        The header to ``-include``, or None while there is no ``.gch``.

    Example
    -------
    >>> header("#include <string>\\n", ["g++", "-std=c++17", "-O2"], [])  # doctest: +SKIP
    """
    import hashlib
    import json

    from . import cache

    key = hashlib.sha256(json.dumps([text, flags, identity]).encode()).hexdigest()[:16]
    folder = cache.root() / "pch" / key
    path = folder / "prelude.h"
    if (folder / "prelude.h.gch").is_file():
        return path
    if folder in _started or (folder / "failed.log").exists():
        return None
    _started.add(folder)
    cache.ensure_dir(folder)
    cache.ensure_dir(cache.root() / ".locks")
    if not path.is_file():
        tmp = folder / f".prelude.h.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, path)  # the same text under one key: any writer's file is the right one
    _start_maker([str(cache.root() / ".locks" / f"{key}.lock"), str(path), *flags])
    return None


def _start_maker(args: list[str]) -> None:
    """Run this file with ``args`` detached: its own session, no inherited descriptors (a caller
    that reads our output to its end, a test runner or a benchmark, would wait for it)."""
    subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)


def make(lock_file: str, header_file: str, flags: list[str]) -> int:
    """Make ``<header>.gch`` unless another process holds ``lock_file`` or it exists: compile to
    a private name, then rename. Returns 0 when the ``.gch`` is there or another maker works on
    it, 1 when the compile failed (its output kept in ``failed.log``)."""
    import filelock

    folder = os.path.dirname(header_file)
    gch = header_file + ".gch"
    lock = filelock.FileLock(lock_file)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return 0
    try:
        if os.path.isfile(gch):
            return 0
        for name in os.listdir(folder):  # left by a maker that was killed: only the holder writes
            if name.startswith(".prelude.h.gch."):
                os.unlink(os.path.join(folder, name))
        tmp = os.path.join(folder, f".prelude.h.gch.{os.getpid()}")
        proc = subprocess.run([*flags, "-x", "c++-header", "-c", header_file, "-o", tmp], capture_output=True)
        if proc.returncode:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if proc.returncode < 0:  # killed (out of memory, a signal): a later build tries again
                return 1
            with open(os.path.join(folder, "failed.log"), "wb") as f:
                f.write(proc.stdout + proc.stderr)
            return 1
        os.replace(tmp, gch)
        return 0
    finally:
        lock.release()


if __name__ == "__main__":
    os.nice(10)  # a build in the foreground goes first
    sys.exit(make(sys.argv[1], sys.argv[2], sys.argv[3:]))
