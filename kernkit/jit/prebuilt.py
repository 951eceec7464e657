"""The prebuilt helper object: kernkit's shared host helpers compiled once per cache and
compiler setup, and linked into the libraries the ``nvrtc`` and ``emu`` backends build.

The helpers (``KERNKIT_HOST_HELPER`` in ``host_helper.h``: ``TensorMatcher``'s checks,
``check_no_overlap``, the row checks, the device queries, the error's construction; for nvrtc
also the driver launch, for emu the emulator's runtime, ``KERNKIT_EMU_RUNTIME``) are the same
code in every specialization, and compiling them is a large part of an nvrtc or emu host unit's
compile (benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md).
Every such build's unit starts with ``USE`` (defining
``KERNKIT_HOST_PREBUILT``: it then only declares them) and links ``helpers.o`` (hidden symbols,
linked statically: a library carries its own, and a deploy archive stays self-contained).
``stage`` gives a build a verified copy of the cached object; a build that finds none compiles
the object itself, beside its unit and in parallel with it, and ``publish`` puts it in the cache
for the builds after it. A copy that does not match the SHA-256 of the object's record is not
used (and the build makes it again).

The key covers the compile command (without its forced includes: a precompiled prelude or the
headers it holds give the same code) and what the caller names as the rest of the code's
identity (the compiler's, the headers'). Trusting a cache directory already means trusting the
libraries in it; this object is one more file of the same kind.

    v2/helpers/<key16>/helpers.o      the object
    v2/helpers/<key16>/helpers.o.json {"sha256": ...} of the object
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from . import maker

#: What a unit that links the object starts with (a definition in the text, not a ``-D`` flag:
#: GCC refuses a precompiled header for a macro defined on the command line that it lacks).
USE = "#define KERNKIT_HOST_PREBUILT 1\n"
#: The unit that defines the helpers.
SOURCE = ("#define KERNKIT_HOST_PREBUILT 1\n#define KERNKIT_HOST_PREBUILT_IMPL 1\n#include <kernkit/export.h>\n"
          "#include <kernkit/tensor.h>\n#include <kernkit/rows.cuh>\n#include <kernkit/runtime.cuh>\n")
#: The object's name, in a build's directory and in the cache.
OBJECT = "helpers.o"
#: Its unit's name in a build's directory.
UNIT = "helpers.cc"


def key(command: list[str], identity: object) -> str:
    """The object's key for units compiled with ``command`` (compiler first); ``identity`` (JSON)
    is what else decides its code: the compiler's and the headers' identity."""
    flags = list(command)
    for i in range(len(flags) - 1, 0, -1):  # a precompiled prelude or the headers it holds: the same code
        if flags[i - 1] == "-include":
            del flags[i - 1 : i + 1]
    return hashlib.sha256(json.dumps([SOURCE, flags, identity]).encode()).hexdigest()[:16]


def _folder(build_dir: Path, object_key: str) -> Path:
    # A build's directory is <cache root>/.staging/<name> (cache.staging_dir).
    return build_dir.parent.parent / "helpers" / object_key


def stage(build_dir: Path, object_key: str) -> bool:
    """Copy the cached object into ``build_dir`` as ``OBJECT`` when it matches its record, else
    write ``UNIT`` there for the build to compile.

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
        Whether the copy is there; if not, the build compiles ``UNIT`` to ``OBJECT`` and calls
        ``publish`` once it is done.
    """
    folder = _folder(build_dir, object_key)
    if maker.verified(folder, OBJECT):
        shutil.copyfile(folder / OBJECT, build_dir / OBJECT)
        if maker.verified(folder, OBJECT, build_dir / OBJECT):
            return True
        (build_dir / OBJECT).unlink()
    (build_dir / UNIT).write_text(SOURCE)
    return False


def publish(build_dir: Path, object_key: str) -> None:
    """Put the ``OBJECT`` a finished build compiled into the cache for the builds after it
    (``maker.publish``), under the object's lock taken without waiting: a build that finds it
    held leaves the publishing to its holder. A cache that cannot be written keeps no object,
    and its builds go on compiling their own."""
    folder = _folder(build_dir, object_key)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with maker.holding(maker.lock_of(folder)) as held:
            if held and not maker.verified(folder, OBJECT):
                tmp = maker.scratch(folder, OBJECT)
                shutil.copyfile(build_dir / OBJECT, tmp)
                maker.publish(folder, OBJECT, tmp)
    except OSError:
        pass
