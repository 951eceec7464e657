"""Writing a file a command line names (``cache export FILE``, ``clangd -o FILE``), the way
what FILE is asks:

- a regular file, a name that does not exist yet, or a symbolic link to either: the content is
  written to a temporary file beside the file the name resolves to, which is then renamed onto
  it. A reader sees the old file or the new one, never half of one; a failed write leaves the
  old file as it was; a link stays a link, and its target is what is updated; the file keeps
  its permissions.
- a FIFO or a character device (a pipe, a terminal, ``/dev/null``), or the file this process's
  stdout or stderr is (``/dev/stdout`` of ``... > file``): written through, as a shell's ``>``
  writes to it. Nothing is created, renamed or replaced.
- anything else (a directory, a block device, a socket): refused, before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def streams(path: Path) -> bool:
    """Whether ``written`` writes ``path`` through: a FIFO, a character device, or the file
    of this process's stdout or stderr."""
    try:
        return _through(os.stat(path))
    except OSError:
        return False


def _through(st: os.stat_result) -> bool:
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return True
    for fd in (1, 2):
        try:
            if os.path.samestat(st, os.fstat(fd)):
                return True
        except OSError:  # closed
            continue
    return False


@contextlib.contextmanager
def written(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write the content of ``path`` to, in the block this opens; what it
    writes takes ``path``'s place when the block ends, as the module says for each kind of file.

    Parameters
    ----------
    path
        The file the user named.

    Returns
    -------
    A context manager giving the open file. An ``OSError`` (with ``path`` as its file name) for
    a ``path`` that is neither a regular file, a FIFO nor a character device, or that cannot be
    written; an exception in the block leaves nothing new behind (a reader of a FIFO has what
    was written until then).

    Example
    -------
    >>> with written(Path("kernels.tar.gz")) as f:  # doctest: +SKIP
    ...     f.write(data)
    """
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:  # a new name, or a link to one
        st = None
    if st is not None and _through(st):
        with open(path, "wb") as f:
            yield f
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file, a FIFO or a character device"
        raise OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL, f"it is {kind}", str(path))
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if st is not None:
                os.chmod(f.fileno(), stat.S_IMODE(st.st_mode))
            yield f
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
