"""The prebuilt helper object: kernkit's shared host helpers compiled once per cache and
compiler setup, and linked into every library the ``nvrtc`` and ``emu`` backends build.

The helpers (``KERNKIT_HOST_HELPER`` in ``utils.h``: ``TensorMatcher``'s checks,
``check_no_overlap``, the row checks, the device queries) are the same code in every
specialization, and compiling them was about half of a host unit's compile. A unit compiled with
``-DKERNKIT_HOST_PREBUILT`` only declares them. ``stage`` puts the object into a build: a copy of
the cached one when its record matches, else a step that compiles it in that build's own ninja
graph, beside the unit; ``keep`` then publishes that one (a complete file under one
``os.replace``, with its sha256 beside it). So no build waits for another's, and a library
carries its own copy (hidden symbols, linked statically): a deploy archive stays self-contained.

The key covers the compile command (without its forced includes: a precompiled prelude or the
headers it holds give the same code), the
compiler's identity and the content of kernkit's headers and of the source splitter; a cached
object whose bytes do not match its record is not used. Trusting a cache directory already means
trusting the libraries in it; this object is one more file of the same kind.

    v2/helpers/<key16>/helpers.o      the object
    v2/helpers/<key16>/helpers.json   {"sha256": ...} of the object
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

#: The unit that defines the helpers.
SOURCE = "#include <kernkit/tensor.h>\n#include <kernkit/rows.cuh>\n#include <kernkit/runtime.cuh>\n"
#: What a unit that links the object is compiled with.
USE = "-DKERNKIT_HOST_PREBUILT"
#: What the object's own unit adds.
IMPL = "-DKERNKIT_HOST_PREBUILT_IMPL"
OBJECT = "helpers.o"


def key(command: list[str], identity: object) -> str:
    """The object's key for units compiled with ``command`` (compiler first); ``identity`` (JSON)
    is what else decides its code: the compiler's and the headers' identity."""
    flags = list(command)
    for i in range(len(flags) - 1, 0, -1):  # a precompiled prelude or the headers it holds: the same code
        if flags[i - 1] == "-include":
            del flags[i - 1 : i + 1]
    return hashlib.sha256(json.dumps([SOURCE, flags, identity]).encode()).hexdigest()[:16]


def stage(build_dir: Path, object_key: str, command: list[str]) -> list[str]:
    """Put the object into ``build_dir``: a verified copy of the cached one, or the source and a
    ninja rule that compiles it with ``command`` (the unit's, plus ``IMPL``). Returns the ninja
    lines to add (none for a copy); the object is ``OBJECT`` in ``build_dir`` either way.

    Parameters
    ----------
    build_dir
        The build's directory.
    object_key
        ``key(...)`` of the unit's command.
    command
        The unit's compile command, without input, output and dependency flags.

    Returns
    -------
    list[str]
        ``build.ninja`` lines.
    """
    from . import backends, cache

    folder = cache.root() / "helpers" / object_key
    (build_dir / "helpers.key").write_text(object_key)
    try:
        want = json.loads((folder / "helpers.json").read_text())["sha256"]
        shutil.copyfile(folder / OBJECT, build_dir / OBJECT)
        if cache.sha256(build_dir / OBJECT) == want:
            return []
        (build_dir / OBJECT).unlink()
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or not whole: built here
    (build_dir / "helpers.cc").write_text(SOURCE)
    rule = backends._quote([*command, IMPL])
    return ["rule helpers", f"  command = {rule} -MMD -MF $out.d -c $in -o $out", "  depfile = $out.d",
            "  deps = gcc", "", f"build {OBJECT}: helpers helpers.cc", ""]


def keep(build_dir: Path) -> None:
    """After a successful build that compiled the object, publish it under its key (a cache
    that cannot be written keeps none: later builds compile their own)."""
    from . import cache

    if not (build_dir / "helpers.cc").is_file():
        return
    folder = cache.root() / "helpers" / (build_dir / "helpers.key").read_text()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{OBJECT}.{os.getpid()}"
        shutil.copyfile(build_dir / OBJECT, tmp)
        record = folder / f".helpers.json.{os.getpid()}"
        record.write_text(json.dumps({"sha256": cache.sha256(tmp)}))
        os.replace(tmp, folder / OBJECT)  # the object first: a record names only a whole object
        os.replace(record, folder / "helpers.json")
    except OSError:
        return
