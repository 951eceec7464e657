"""The prebuilt helper object: kernkit's shared host helpers compiled once per cache and
compiler setup, and linked into the libraries the ``nvrtc`` and ``emu`` backends build after.

The helpers (``KERNKIT_HOST_HELPER`` in ``host_helper.h``: ``TensorMatcher``'s checks,
``check_no_overlap``, the row checks, the device queries; for emu also the emulator's runtime,
``KERNKIT_EMU_RUNTIME``) are the same code in every specialization, and compiling them is about
40% of an nvrtc host unit's compile and half of an emu unit's. ``stage`` gives a
build a verified copy of the cached object, and the build's unit starts with ``USE`` (defining
``KERNKIT_HOST_PREBUILT``: it then only declares them) and links the copy (hidden
symbols, linked statically: a library carries its own, and a deploy archive stays
self-contained). A build that finds none compiles its unit with the helpers inline, as nvcc builds
always do, and once that build is done a detached maker (``maker.py``) makes the object for
the builds after it: no build waits for it, and the build that asked does not share its cores
with it. A copy that does not match the SHA-256 of the object's record is not used (and the
object is made again).

The key covers the compile command (without its forced includes: a precompiled prelude or the
headers it holds give the same code) and what the caller names as the rest of the code's
identity (the compiler's, the headers'). Trusting a cache directory already means trusting the
libraries in it; this object is one more file of the same kind.

    v2/helpers/<key16>/helpers.o      the object
    v2/helpers/<key16>/helpers.o.json {"sha256": ...} of the object
    v2/helpers/<key16>/helpers.cc     its unit, and host/ the nvrtc host halves it includes
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

from . import maker

#: What a unit that links the object starts with (a definition in the text, not a ``-D`` flag:
#: GCC refuses a precompiled header for a macro defined on the command line that it lacks).
USE = "#define KERNKIT_HOST_PREBUILT 1\n#line 1\n"
#: The unit that defines the helpers.
SOURCE = ("#define KERNKIT_HOST_PREBUILT 1\n#define KERNKIT_HOST_PREBUILT_IMPL 1\n#include <kernkit/export.h>\n"
          "#include <kernkit/tensor.h>\n#include <kernkit/rows.cuh>\n#include <kernkit/runtime.cuh>\n")
OBJECT = "helpers.o"


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
    ask for its maker (``maker.request``; ``run_ninja`` starts it after the build) and return
    False.

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
    if maker.verified(folder, OBJECT):
        shutil.copyfile(folder / OBJECT, build_dir / OBJECT)
        if maker.verified(folder, OBJECT, build_dir / OBJECT):
            return True
        (build_dir / OBJECT).unlink()
    if not maker.may_ask(folder):
        return False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if (build_dir / "host" / "kernkit").is_dir() and not (folder / "host").is_dir():
            tmp = folder / f".host.{uuid.uuid4().hex}"  # not the pid: builds run in threads too
            shutil.copytree(build_dir / "host" / "kernkit", tmp / "kernkit")
            try:
                os.replace(tmp, folder / "host")
            except OSError:  # another build's copy came first: the same files
                shutil.rmtree(tmp, ignore_errors=True)
        (folder / "helpers.cc").write_text(SOURCE)  # the same text under one key
        maker.request(folder, OBJECT, [*command, "-c", "helpers.cc"])
    except OSError:
        pass  # a cache that cannot be written: the builds keep the helpers inline
    return False
