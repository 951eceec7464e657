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


def stage(build_dir: Path, object_key: str) -> bool:
    """Put a verified copy of the cached object into ``build_dir`` as ``OBJECT``; else write the
    unit that defines the helpers there (``helpers.cc``), for the build to compile with its unit's
    command plus ``IMPL``.

    Parameters
    ----------
    build_dir
        The build's directory: a staging directory, ``<cache root>/.staging/<name>``
        (``cache.staging_dir``), so that the cache's folders are found from it.
    object_key
        ``key(...)`` of the unit's command.

    Returns
    -------
    bool
        Whether the object was copied (else the build compiles ``helpers.cc``).
    """
    folder = _folder(build_dir, object_key)
    (build_dir / "helpers.key").write_text(object_key)
    try:
        want = json.loads((folder / "helpers.json").read_text())["sha256"]
        shutil.copyfile(folder / OBJECT, build_dir / OBJECT)
        if _sha256(build_dir / OBJECT) == want:
            return True
        (build_dir / OBJECT).unlink()
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or not whole: built here
    (build_dir / "helpers.cc").write_text(SOURCE)
    return False


def keep(build_dir: Path) -> None:
    """After a successful build that compiled the object, publish it under its key (a cache
    that cannot be written keeps none: later builds compile their own)."""
    if not (build_dir / "helpers.cc").is_file():
        return
    folder = _folder(build_dir, (build_dir / "helpers.key").read_text())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{OBJECT}.{os.getpid()}"
        shutil.copyfile(build_dir / OBJECT, tmp)
        record = folder / f".helpers.json.{os.getpid()}"
        record.write_text(json.dumps({"sha256": _sha256(tmp)}))
        os.replace(tmp, folder / OBJECT)  # the object first: a record names only a whole object
        os.replace(record, folder / "helpers.json")
    except OSError:
        return


def _folder(build_dir: Path, object_key: str) -> Path:
    return build_dir.parent.parent / "helpers" / object_key


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
