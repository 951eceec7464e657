"""Precompiled headers for the host compiler, built after the builds that lack them, never in
their way.

The host-compiled units of the ``nvrtc`` and ``emu`` backends start with the same third-party
headers (tvm-ffi's, CUDA's, the standard library's); parsing them is about half of such a unit's
compile. ``header`` returns a header holding them whose ``.gch`` is made, or None: then the
caller compiles its unit without it, and a detached maker (``maker.py``) makes the ``.gch`` for
later builds, started once that build is done (``run_ninja``): on a machine of two cores, one
started beside the first build made it take 3.7 s instead of 1.7 in one run, even niced. So no
build waits for one, and the first call of a fresh install costs what a build without it costs.
GCC uses a ``.gch`` only where it was made with the same flags and parses the header otherwise,
so a stale or foreign one costs time, never correctness; a damaged one (cut short) it cannot
read, and fails on, so a ``.gch`` is offered only when it matches its record (``maker.intact``),
and one that does not is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

from . import cache, maker

#: The third-party headers of every host-compiled unit (tvm-ffi's, CUDA's in host mode, the
#: standard library's): parsing them is about half of an nvrtc host half's compile.
PRELUDE = "".join(f"#include <{h}>\n" for h in (
    "tvm/ffi/function.h", "tvm/ffi/container/array.h", "tvm/ffi/container/shape.h", "tvm/ffi/container/tensor.h",
    "tvm/ffi/error.h", "tvm/ffi/extra/c_env_api.h", "tvm/ffi/optional.h", "cuda_runtime.h", "cuda_bf16.h",
    "cuda_fp16.h", "cuda_fp8.h", "algorithm", "cstdint", "functional", "initializer_list", "mutex", "sstream",
    "string", "tuple", "type_traits", "utility"))

GCH = "prelude.h.gch"


def header(text: str, flags: list[str], identity: object) -> Path | None:
    """The ``prelude.h`` holding ``text`` whose ``.gch`` for ``flags`` (the compiler first) is
    made and whole (``maker.intact``), under ``<cache>/v2/pch/<key16>/``; else None, after
    asking for its maker (``maker.request``: it makes a missing or damaged one) if no attempt
    has failed. ``identity`` (JSON) is what else decides the ``.gch``: the identity of the
    compiler and of the headers it reads.

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
    key = hashlib.sha256(json.dumps([text, flags, identity]).encode()).hexdigest()[:16]
    folder = cache.root() / "pch" / key
    path = folder / "prelude.h"
    if maker.intact(folder, GCH):
        return path
    if not maker.may_ask(folder):  # asked for already in this process, or failed
        return None
    cache.ensure_dir(folder)
    if not path.is_file():
        tmp = folder / f".prelude.h.{uuid.uuid4().hex}"  # not the pid: builds run in threads too
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # a .gch made from it outlives a crash: so does the text
        os.replace(tmp, path)  # the same text under one key: any writer's file is the right one
    maker.request(folder, GCH, [*flags, "-x", "c++-header", "-c", path.name])
    return None
