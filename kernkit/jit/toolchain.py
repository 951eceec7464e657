"""Finding the compilers and fingerprinting them without running them on every process start.

A compiler's version is part of every cache key, but asking ``nvcc --version`` costs tens of
milliseconds. The version is therefore remembered, in memory and in ``toolchains.json`` under the
cache root, against the compiler binary's (path, size, mtime): a later process re-reads the
version only when that stat changes. A warm load thus starts no subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from .config import cache_dir


class ToolchainError(RuntimeError):
    """A compiler that a build needs cannot be found or run."""


@dataclass(frozen=True)
class Compiler:
    """A compiler binary and the first line of its ``--version``; ``stat`` is the (real path,
    size, mtime) of the binary the version belongs to."""

    path: str
    version: str
    stat: tuple = ()


@dataclass(frozen=True)
class Toolchain:
    """The compilers one build uses (``nvcc`` is None for host-only and CPU-emulation builds)."""

    cxx: Compiler
    nvcc: Compiler | None

    @property
    def cuda_home(self) -> Path | None:
        return Path(self.nvcc.path).parent.parent if self.nvcc else None

    def fingerprint(self) -> str:
        """A short hash of the compilers' identities, the second level of the cache layout."""
        text = f"{self.cxx.version}\n{self.nvcc.version if self.nvcc else '-'}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def find_cuda_home() -> Path | None:
    """``$CUDA_HOME`` (or ``$CUDA_PATH``), else the toolkit around ``nvcc`` on PATH, else
    ``/usr/local/cuda`` if it holds nvcc; None when there is no toolkit."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            return Path(home)
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = Path(nvcc).resolve().parent.parent
        # nvcc on PATH may be a wrapper script outside the toolkit: only trust a real layout.
        if (home / "include" / "cuda_runtime.h").is_file():
            return home
    default = Path("/usr/local/cuda")
    return default if (default / "bin" / "nvcc").exists() else None


def find_nvcc() -> str:
    """Path of nvcc, or a ``ToolchainError`` that says to set ``CUDA_HOME``."""
    home = find_cuda_home()
    if home is not None and (home / "bin" / "nvcc").is_file():
        return str(home / "bin" / "nvcc")
    where = f"CUDA_HOME={home}" if home else "CUDA_HOME is not set, nvcc is not on PATH"
    raise ToolchainError(
        f"nvcc not found ({where}); install the CUDA toolkit and set CUDA_HOME to its root "
        "(the folder that holds bin/nvcc), e.g. CUDA_HOME=/usr/local/cuda"
    )


def find_cxx() -> str:
    """The host C++ compiler: ``$CXX``, else ``c++``/``g++``/``clang++`` on PATH."""
    explicit = os.environ.get("CXX")
    candidates = [explicit] if explicit else ["c++", "g++", "clang++"]
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise ToolchainError(f"no host C++ compiler found (tried {', '.join(candidates)}); install one or set CXX")


_lock = threading.Lock()
_versions: dict[tuple, str] = {}
# The registry file as read once per process (per cache root); entries are still checked
# against the binary's stat before use.
_registry_cache: dict[str, dict] = {}


def _stat_key(path: str) -> tuple:
    real = os.path.realpath(path)
    st = os.stat(real)
    return (real, st.st_size, st.st_mtime_ns)


def _registry_path() -> Path:
    return cache_dir() / "toolchains.json"


def _read_registry() -> dict:
    try:
        return json.loads(_registry_path().read_text())
    except (OSError, ValueError):
        return {}


def compiler(path: str) -> Compiler:
    """The compiler at ``path`` with its version, probed at most once per binary."""
    key = _stat_key(path)
    with _lock:
        version = _versions.get(key)
        if version is None:
            reg_path = str(_registry_path())
            registry = _registry_cache.get(reg_path)
            if registry is None:
                registry = _registry_cache[reg_path] = _read_registry()
            entry = registry.get(key[0])
            if entry and entry.get("size") == key[1] and entry.get("mtime_ns") == key[2]:
                version = entry["version"]
            else:
                version = _probe(path)
                _remember(key, version)
                registry[key[0]] = {"size": key[1], "mtime_ns": key[2], "version": version}
            _versions[key] = version
    return Compiler(path=path, version=version, stat=key)


def _probe(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainError(f"cannot run '{path} --version': {e}") from e
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if not lines:
        return "unknown"
    # nvcc names its release on later lines ("Cuda compilation tools, release 13.0, ..." and
    # "Build cuda_13.0.r13.0/compiler..."); gcc and clang name theirs on the first.
    release = [line for line in lines if "release" in line or line.startswith("Build ")]
    return " | ".join(release) if release else lines[0]


def _remember(key: tuple, version: str) -> None:
    """Record a probed version; losing the race with another process only costs a re-probe."""
    path = _registry_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        registry = _read_registry()
        registry[key[0]] = {"size": key[1], "mtime_ns": key[2], "version": version}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(registry, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache still builds; the version is then probed once per process


_found: dict[tuple, str] = {}


def _find_cached(what: str, finder) -> str:
    """``finder()``, remembered per process against the environment variables it reads; the
    path is used only while it still names a file (a removed compiler is looked up again)."""
    env = os.environ
    key = (what, env.get("PATH"), env.get("CXX"), env.get("CUDA_HOME"), env.get("CUDA_PATH"))
    path = _found.get(key)
    if path is None or not os.path.isfile(path):
        path = _found[key] = finder()
    return path


def toolchain(with_nvcc: bool) -> Toolchain:
    """The toolchain of a build: the host compiler, plus nvcc for CUDA builds."""
    cxx = compiler(_find_cached("cxx", find_cxx))
    nvcc = compiler(_find_cached("nvcc", find_nvcc)) if with_nvcc else None
    return Toolchain(cxx=cxx, nvcc=nvcc)
