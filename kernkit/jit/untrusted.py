"""What kernkit reads from elsewhere: JSON files (build records, an archive's index, manifests),
read within a size and a nesting limit, and names, which hold no control character. A leaf:
the cache, the specs, the manifests and the tools read it.

Whoever writes a cache, an archive or a manifest chooses these bytes. Without limits a file of
zeros could be read into memory whole, and arrays nested 100,000 deep make ``json.loads``
raise ``RecursionError``, which no caller expects; a value nested a few hundred deep parses,
then breaks whatever compares or prints it later. kernkit's own files nest four deep and hold a
few kilobytes.
"""

from __future__ import annotations

import json
import os
import re
import stat

#: The most bytes a JSON file from elsewhere may hold: far above any record, index or manifest
#: kernkit writes, far below what a process can hold.
MAX_JSON_BYTES = 16 << 20

#: The deepest nesting of arrays and objects such a file may have.
MAX_JSON_DEPTH = 64

#: C0, DEL and C1: a newline ends a line of ``build.ninja``, an escape sequence rewrites a terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def control(text: str) -> bool:
    """Whether ``text`` holds a control character (C0, DEL or C1)."""
    return _CONTROL.search(text) is not None


def read_bytes(path: str | os.PathLike, limit: int = MAX_JSON_BYTES, regular: bool = False) -> bytes:
    """The content of the file at ``path``, at most ``limit`` bytes.

    Parameters
    ----------
    path
        The file; a pipe (``<(...)``, ``/dev/stdin``) is read up to the limit.
    limit
        The most bytes it may hold.
    regular
        Accept a regular file only (a build record): a FIFO is refused without waiting for a
        writer, a device without reading it.

    Returns
    -------
    The bytes. Raises ``ValueError`` for a file larger than ``limit`` or, with ``regular``, one
    that is not a regular file; ``OSError`` as ``open`` does.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular else 0))
    try:
        st = os.fstat(fd)
        if regular and not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        if st.st_size > limit:
            raise ValueError(_too_big(st.st_size, limit))
        chunks = [os.read(fd, st.st_size + 1)]  # the whole of a regular file in one read
        total = len(chunks[0])
        while chunks[-1] and total <= limit:  # a pipe, or a file that grows
            chunks.append(os.read(fd, min(1 << 20, limit + 1 - total)))
            total += len(chunks[-1])
    finally:
        os.close(fd)
    if total > limit:
        raise ValueError(_too_big(total, limit, "more than "))
    return b"".join(chunks)


def _too_big(size: int, limit: int, more: str = "") -> str:
    return f"it holds {more}{size} bytes, more than the {limit >> 20} MiB a kernkit JSON file may hold"


def parse_json(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> object:
    """``json.loads(data)`` for ``data`` nested at most ``max_depth`` arrays and objects deep
    (the size is the reader's to bound: ``read_bytes``, a member's size in an archive).

    Returns
    -------
    The value. Raises ``ValueError``: ``json.loads``'s for text that is not JSON, and one
    saying so for JSON nested deeper.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:  # so no deeper: the usual case, checked in C
        return json.loads(data)
    try:
        value = json.loads(data)
    except RecursionError:  # json's parser recurses once per level: nested beyond the interpreter's limit
        value = None
    else:
        level = [value] if type(value) in (dict, list) else []
        for _ in range(max_depth):  # the containers one level deeper each time
            level = [c for v in level for c in (v.values() if type(v) is dict else v) if type(c) in (dict, list)]
            if not level:
                return value
    raise ValueError(f"it nests arrays and objects more than {max_depth} deep")


def read_json(path: str | os.PathLike, regular: bool = False) -> object:
    """The JSON value of the file at ``path``, read by ``read_bytes`` (``MAX_JSON_BYTES``) and
    parsed by ``parse_json`` (``MAX_JSON_DEPTH``); raises ``ValueError`` or ``OSError``, which
    the caller names the file in."""
    return parse_json(read_bytes(path, MAX_JSON_BYTES, regular))
