"""Environment variables that steer the JIT layer, read where they are used (so tests and
launchers may set them at run time)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

#: Root of the on-disk cache of built specializations.
CACHE_DIR_VAR = "KERNKIT_CACHE_DIR"
#: ``off`` forbids compiling: only specializations already in the cache load.
JIT_VAR = "KERNKIT_JIT"
#: CUDA architecture to build for when no GPU is visible, e.g. ``9.0``.
ARCH_VAR = "KERNKIT_CUDA_ARCH"
#: Extra flags for the CPU emulation backend: ``1``/``address,undefined`` enable sanitizers.
EMU_SANITIZE_VAR = "KERNKIT_EMU_SANITIZE"
#: How a CPU emulation build checks that its kernels also build for a GPU: ``auto`` (default),
#: ``nvrtc``, ``nvcc`` or ``off`` (``backends/emu.py``).
EMU_CHECK_VAR = "KERNKIT_EMU_CHECK"
#: The backend of CUDA builds that name none: ``nvcc`` or ``nvrtc`` (default: ``backends.default_backend``).
BACKEND_VAR = "KERNKIT_BACKEND"
#: Read-only caches searched before ``KERNKIT_CACHE_DIR`` (cache roots, ``os.pathsep``-separated):
#: a directory many machines mount, an image layer.
SHARED_VAR = "KERNKIT_CACHE_SHARED"
#: A manifest file: every specialization the process loads is recorded there (``manifest.py``).
RECORD_VAR = "KERNKIT_RECORD"
#: ``error`` or ``warn``: a compile is refused, or allowed and counted (``freeze``).
FREEZE_VAR = "KERNKIT_FREEZE"


def cache_dir() -> Path:
    """The cache root: ``$KERNKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kernkit``, else
    ``~/.cache/kernkit``."""
    explicit = os.environ.get(CACHE_DIR_VAR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kernkit"


#: The entries of ``KERNKIT_CACHE_SHARED`` that are not directories, warned about once each.
_not_shared: set[str] = set()


def shared_entries() -> list[Path]:
    """Every cache root ``KERNKIT_CACHE_SHARED`` names, in order, directory or not (``doctor``
    reports the ones that are not); an empty entry names none."""
    return [Path(d).expanduser() for d in os.environ.get(SHARED_VAR, "").split(os.pathsep) if d.strip()]


def shared_dirs() -> list[Path]:
    """The read-only cache roots of ``KERNKIT_CACHE_SHARED`` that are directories, in order; an
    entry that is not one (missing, a file) is left out with a warning, once per process."""
    out = []
    for path in shared_entries():
        if path.is_dir():
            out.append(path)
        elif str(path) not in _not_shared:
            _not_shared.add(str(path))
            warnings.warn(f"kernkit: {SHARED_VAR} names {str(path)!r}, which is "
                          f"{'not a directory' if path.exists() else 'missing'}; it is not searched",
                          RuntimeWarning, stacklevel=2)
    return out


def jit_enabled() -> bool:
    """False when ``KERNKIT_JIT`` is ``off``/``0``/``false``/``no``: nothing may be compiled."""
    return os.environ.get(JIT_VAR, "on").strip().lower() not in ("off", "0", "false", "no")


def emu_sanitizers() -> tuple[str, ...]:
    """Sanitizers for CPU-emulation builds (``KERNKIT_EMU_SANITIZE``): ``1`` means address and
    undefined; a comma list names them; empty or ``0`` means none."""
    value = os.environ.get(EMU_SANITIZE_VAR, "").strip().lower()
    if value in ("", "0", "off", "no", "false"):
        return ()
    if value in ("1", "on", "yes", "true"):
        return ("address", "undefined")
    return tuple(sorted(s.strip() for s in value.split(",") if s.strip()))


#: The values of ``KERNKIT_EMU_CHECK``; unset or empty is ``auto``.
EMU_CHECKS = ("auto", "nvrtc", "nvcc", "off")


def emu_check() -> str:
    """How a CPU emulation build checks its kernels for a GPU (``KERNKIT_EMU_CHECK``): one of
    ``EMU_CHECKS``. Any other value raises ``ValueError`` listing them: a misspelt value never
    turns the check off."""
    mode = os.environ.get(EMU_CHECK_VAR, "").strip().lower() or "auto"
    if mode not in EMU_CHECKS:
        raise ValueError(f"{EMU_CHECK_VAR} must be one of {', '.join(map(repr, EMU_CHECKS))} (or unset), "
                         f"got {os.environ[EMU_CHECK_VAR]!r}")
    return mode


#: The values of ``KERNKIT_FREEZE``; unset or empty is ``off``.
FREEZE_MODES = ("error", "warn", "off")


def frozen() -> str | None:
    """``error`` or ``warn`` when compiling is frozen (``KERNKIT_FREEZE``), None when it is
    ``off``, empty or unset. Any other value raises ``ValueError`` listing the accepted ones: a
    misspelt freeze (``1``, ``true``, ``errors``) never means off."""
    mode = os.environ.get(FREEZE_VAR, "").strip().lower()
    if mode in ("", "off"):
        return None
    if mode not in FREEZE_MODES:
        raise ValueError(f"{FREEZE_VAR} must be one of {', '.join(map(repr, FREEZE_MODES))} (or unset), "
                         f"got {os.environ[FREEZE_VAR]!r}")
    return mode


def freeze(mode: str = "error") -> None:
    """From now on (in this process and the processes it starts), a specialization that is not
    in the cache is not compiled silently: with ``mode="error"`` loading it raises
    ``FrozenCompileError``; with ``"warn"`` it compiles, with a warning, and is counted in
    ``<cache>/v2/frozen-compiles.jsonl`` (``doctor`` shows the count). Loading what is cached
    stays allowed. Call it once a server has warmed up.

    Parameters
    ----------
    mode
        ``"error"`` or ``"warn"``; ``"off"`` lifts the freeze.

    Example
    -------
    >>> kernkit.jit.freeze()  # doctest: +SKIP
    """
    if mode not in FREEZE_MODES:
        raise ValueError(f"freeze: mode must be 'error', 'warn' or 'off', got {mode!r}")
    os.environ[FREEZE_VAR] = mode
