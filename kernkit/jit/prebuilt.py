"""The prebuilt helper object: kernkit's shared host helpers compiled once per cache and
compiler setup, and linked into the libraries the ``nvrtc`` and ``emu`` backends build after.

The helpers (``KERNKIT_HOST_HELPER`` in ``host_helper.h``: ``TensorMatcher``'s checks,
``check_no_overlap``, the row checks, the device queries) are the same code in every
specialization, and compiling them is about 40% of a host unit's compile. ``stage`` gives a
build a verified copy of the cached object, and the build's unit starts with ``USE`` (defining
``KERNKIT_HOST_PREBUILT``: it then only declares them) and links the copy (hidden
symbols, linked statically: a library carries its own, and a deploy archive stays
self-contained). A build that finds none compiles its unit with the helpers inline, as nvcc builds
always do, and then starts a detached process that makes the object (this file run as a script,
under the key's lock, at a low priority) for the builds after, as ``pch.py`` does for the
precompiled header: no build waits for it. The object appears through one ``os.replace`` of a complete file,
then its SHA-256 beside it; a copy that does not match it is not used (and is made again). A
compile that fails leaves ``failed.log`` and no later build tries that key again (delete the
folder to retry).

The key covers the compile command (without its forced includes: a precompiled prelude or the
headers it holds give the same code) and what the caller names as the rest of the code's
identity (the compiler's, the headers'). Trusting a cache directory already means trusting the
libraries in it; this object is one more file of the same kind.

    v2/helpers/<key16>/helpers.o      the object
    v2/helpers/<key16>/helpers.json   {"sha256": ...} of the object
    v2/helpers/<key16>/helpers.cc     its unit, and host/ the nvrtc host halves it includes

    python prebuilt.py <lock file> <folder> <compiler and flags>...
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: What a unit that links the object starts with (a definition in the text, not a ``-D`` flag:
#: GCC refuses a precompiled header for a macro defined on the command line that it lacks).
USE = "#define KERNKIT_HOST_PREBUILT 1\n#line 1\n"
#: The unit that defines the helpers.
SOURCE = ("#define KERNKIT_HOST_PREBUILT 1\n#define KERNKIT_HOST_PREBUILT_IMPL 1\n#include <kernkit/tensor.h>\n"
          "#include <kernkit/rows.cuh>\n#include <kernkit/runtime.cuh>\n")
OBJECT = "helpers.o"

#: The folders whose maker this process has started (one attempt per folder and process).
_started: set[Path] = set()
#: The makers ``stage`` asked for, started by ``start_makers`` once the build is done.
_pending: list[list[str]] = []


def key(command: list[str], identity: object) -> str:
    """The object's key for units compiled with ``command`` (compiler first); ``identity`` (JSON)
    is what else decides its code: the compiler's and the headers' identity."""
    flags = list(command)
    for i in range(len(flags) - 1, 0, -1):  # a precompiled prelude or the headers it holds: the same code
        if flags[i - 1] == "-include":
            del flags[i - 1 : i + 1]
    return hashlib.sha256(json.dumps([SOURCE, flags, identity]).encode()).hexdigest()[:16]


def stage(build_dir: Path, object_key: str, command: list[str]) -> bool:
    """Copy the cached object into ``build_dir`` as ``OBJECT`` when it matches its record; else
    ask for its maker (once per process, never after a failed attempt; ``start_makers``) and
    return False.

    Parameters
    ----------
    build_dir
        The build's directory: a staging directory, ``<cache root>/.staging/<name>``
        (``cache.staging_dir``), so that the cache's folders are found from it. An nvrtc build's
        ``host/`` halves are there already: the maker compiles against a copy of them.
    object_key
        ``key(...)`` of the unit's command.
    command
        The unit's compile command without input, output and dependency flags (its include
        paths relative to ``build_dir``).

    Returns
    -------
    bool
        Whether ``OBJECT`` is in ``build_dir``, to be linked (the unit starting with ``USE``).
    """
    folder = build_dir.parent.parent / "helpers" / object_key
    if _verified(folder):
        shutil.copyfile(folder / OBJECT, build_dir / OBJECT)
        if _verified(folder, build_dir / OBJECT):
            return True
        (build_dir / OBJECT).unlink()
    if folder in _started or (folder / "failed.log").exists():
        return False
    _started.add(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if (build_dir / "host" / "kernkit").is_dir() and not (folder / "host").is_dir():
            tmp = folder / f".host.{os.getpid()}"
            shutil.copytree(build_dir / "host" / "kernkit", tmp / "kernkit")
            os.replace(tmp, folder / "host")
        (folder / "helpers.cc").write_text(SOURCE)  # the same text under one key
        (build_dir.parent.parent / ".locks").mkdir(exist_ok=True)
    except OSError:
        return False  # a cache that cannot be written: the builds keep the helpers inline
    lock = build_dir.parent.parent / ".locks" / f"helpers-{object_key}.lock"
    _pending.append([str(lock), str(folder), *command])
    return False


def start_makers() -> None:
    """Start the makers ``stage`` asked for, detached: after the build that asked, so that its
    own compile does not share the cores with them (their own session, no inherited
    descriptors: a caller reading our output to its end would wait for them)."""
    while _pending:
        subprocess.Popen([sys.executable, os.path.abspath(__file__), *_pending.pop()], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)


def _verified(folder: Path, copy: Path | None = None) -> bool:
    """Whether ``copy`` (default: the folder's object) has the SHA-256 the folder's record names."""
    try:
        want = json.loads((folder / "helpers.json").read_text())["sha256"]
        return hashlib.sha256((copy or folder / OBJECT).read_bytes()).hexdigest() == want
    except (OSError, ValueError, KeyError, TypeError):
        return False


def make(lock_file: str, folder: str, command: list[str]) -> int:
    """Compile ``folder/helpers.cc`` with ``command`` (in ``folder``) into ``OBJECT`` and its
    record, unless another process holds ``lock_file`` or a matching object is there. Returns 0
    when it is there or another maker works on it, 1 when the compile failed (its output kept in
    ``failed.log``; a killed compile leaves none, so a later build tries again)."""
    import filelock

    lock = filelock.FileLock(lock_file)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return 0
    try:
        path = Path(folder)
        if _verified(path):
            return 0
        tmp = path / f".{OBJECT}.{os.getpid()}"
        proc = subprocess.run([*command, "-c", "helpers.cc", "-o", tmp.name], cwd=path, capture_output=True)
        if proc.returncode:
            tmp.unlink(missing_ok=True)
            if proc.returncode > 0:
                (path / "failed.log").write_bytes(proc.stdout + proc.stderr)
            return 1
        record = path / f".helpers.json.{os.getpid()}"
        record.write_text(json.dumps({"sha256": hashlib.sha256(tmp.read_bytes()).hexdigest()}))
        os.replace(tmp, path / OBJECT)  # the object first: a record names only a whole object
        os.replace(record, path / "helpers.json")
        return 0
    finally:
        lock.release()


if __name__ == "__main__":
    os.nice(10)  # a build in the foreground goes first
    sys.exit(make(sys.argv[1], sys.argv[2], sys.argv[3:]))
