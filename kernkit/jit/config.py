"""Environment variables that steer the JIT layer, read where they are used (so tests and
launchers may set them at run time)."""

from __future__ import annotations

import os
import re
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

#: The spellings of on and off that every on/off variable takes, in any case (``flag``).
TRUE_WORDS = ("on", "1", "true", "yes")
FALSE_WORDS = ("off", "0", "false", "no")
_ON_OFF = TRUE_WORDS + FALSE_WORDS


class ConfigError(ValueError):
    """A ``KERNKIT_*`` variable holds a value kernkit cannot use; the message names the variable,
    its value and what it takes."""


def choice(var: str, accepted: tuple[str, ...], default: str) -> str:
    """The value of the variable ``var``, stripped and in lower case, when it is one of
    ``accepted``; ``default`` when it is unset or empty. Any other value raises ``ConfigError``
    listing ``accepted``: a misspelt value never means the default, whatever the default is.

    Parameters
    ----------
    var
        The variable's name, e.g. ``KERNKIT_FREEZE``.
    accepted
        Its values, in lower case.
    default
        What unset or empty means.

    Returns
    -------
    One of ``accepted``, or ``default``.
    """
    value = os.environ.get(var, "").strip().lower()
    if not value:
        return default
    if value not in accepted:
        raise ConfigError(f"{var} must be one of {', '.join(map(repr, accepted))} (or unset), "
                          f"got {os.environ[var]!r}")
    return value


def flag(var: str, default: bool) -> bool:
    """The on/off variable ``var``: True for ``TRUE_WORDS``, False for ``FALSE_WORDS`` (any
    case), ``default`` when unset or empty; ``ConfigError`` naming the variable and those
    spellings for anything else (``disabled``, ``none``, ``0ff``).

    Parameters
    ----------
    var
        The variable's name, e.g. ``KERNKIT_JIT``.
    default
        What unset or empty means.

    Returns
    -------
    Whether it is on.
    """
    return choice(var, _ON_OFF, "on" if default else "off") in TRUE_WORDS


def user_path(var: str, text: str) -> Path:
    """The path ``text`` that the variable ``var`` gives, with a leading ``~`` or ``~user``
    expanded; ``ConfigError`` naming the variable when it cannot be (no such user, or no home
    directory known for ``~``)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:  # pathlib's "Could not determine home directory."
        raise ConfigError(f"{var}={text!r}: {text.split('/', 1)[0]!r} names no home directory known here "
                          f"(no such user, or HOME unset); give {var} an absolute path") from None


def cache_dir() -> Path:
    """The cache root: ``$KERNKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kernkit``, else
    ``~/.cache/kernkit``."""
    explicit = os.environ.get(CACHE_DIR_VAR)
    if explicit:
        return user_path(CACHE_DIR_VAR, explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "kernkit"
    try:
        return Path.home() / ".cache" / "kernkit"
    except RuntimeError:  # no HOME and no entry of this user in the password database
        raise ConfigError(f"kernkit finds no home directory for its cache (HOME is unset and this user has no "
                          f"entry in the password database): set {CACHE_DIR_VAR} to a directory") from None


#: The entries of ``KERNKIT_CACHE_SHARED`` that are not directories, warned about once each.
_not_shared: set[str] = set()


def shared_entries() -> list[Path]:
    """Every cache root ``KERNKIT_CACHE_SHARED`` names, in order, directory or not (``doctor``
    reports the ones that are not); an empty entry names none. An entry whose ``~`` cannot be
    expanded raises ``ConfigError``."""
    return [user_path(SHARED_VAR, d) for d in os.environ.get(SHARED_VAR, "").split(os.pathsep) if d.strip()]


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
    """False when ``KERNKIT_JIT`` is off (``FALSE_WORDS``): nothing may be compiled. Unset or
    on (``TRUE_WORDS``) is True; any other value raises ``ConfigError`` (``flag``), so a
    misspelt off never compiles."""
    return flag(JIT_VAR, True)


def emu_sanitizers() -> tuple[str, ...]:
    """Sanitizers for CPU-emulation builds (``KERNKIT_EMU_SANITIZE``): on (``TRUE_WORDS``) means
    address and undefined; off (``FALSE_WORDS``), empty or unset means none; anything else is a
    comma list of names for ``-fsanitize=`` (``address,undefined``, ``thread``); a name that is
    not a word of letters, digits and dashes raises ``ConfigError``: the value never reaches a
    command line as anything but one sanitizer's name."""
    value = os.environ.get(EMU_SANITIZE_VAR, "").strip().lower()
    if value in ("", *FALSE_WORDS):
        return ()
    if value in TRUE_WORDS:
        return ("address", "undefined")
    names = tuple(sorted(s.strip() for s in value.split(",") if s.strip()))
    bad = [n for n in names if not re.fullmatch(r"[a-z][a-z0-9-]*", n)]
    if bad or not names:
        raise ConfigError(f"{EMU_SANITIZE_VAR} must be on/off ({', '.join(_ON_OFF)}) or a comma list of sanitizer "
                          f"names such as address,undefined; got {value!r}")
    return names


#: The values of ``KERNKIT_EMU_CHECK``; unset or empty is ``auto``.
EMU_CHECKS = ("auto", "nvrtc", "nvcc", "off")


def emu_check() -> str:
    """How a CPU emulation build checks its kernels for a GPU (``KERNKIT_EMU_CHECK``): one of
    ``EMU_CHECKS``. Any other value raises ``ConfigError`` listing them: a misspelt value never
    turns the check off."""
    return choice(EMU_CHECK_VAR, EMU_CHECKS, "auto")


#: The values of ``KERNKIT_FREEZE``; unset or empty is ``off``.
FREEZE_MODES = ("error", "warn", "off")


def frozen() -> str | None:
    """``error`` or ``warn`` when compiling is frozen (``KERNKIT_FREEZE``), None when it is
    ``off``, empty or unset. Any other value raises ``ConfigError`` listing the accepted ones: a
    misspelt freeze (``1``, ``true``, ``errors``) never means off."""
    mode = choice(FREEZE_VAR, FREEZE_MODES, "off")
    return None if mode == "off" else mode


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
