"""What the backends share: the errors, how compilers are found and identified, and the build
itself, a ``build.ninja`` that compiles a specialization's units and links ``lib.so``.

The build is a ``build.ninja`` of kernkit's own rather than ``tvm_ffi.cpp.build``: that helper
takes the CUDA target from a process-wide variable or ``nvidia-smi`` and keeps the command line
to itself, while a kernkit build needs a per-build target, the emulator mode, a directory it
controls and the exact command for error reports. tvm-ffi still supplies the include and
library paths and the loader. Header dependencies come from the compilers themselves
(``-MMD``), collected by ninja (``deps = gcc``) and read back with ``ninja -t deps``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import tvm_ffi.libinfo

from .. import maker, prebuilt
from ..paths import EMU_INCLUDE_DIR, INCLUDE_DIR, KERNELS_DIR, LIB_NAME, PACKAGE_ROOT

#: Host C++ units (``cpp_files``).
CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-DNDEBUG")


class ToolchainError(RuntimeError):
    """A compiler or header set that a build needs cannot be found or run."""


class CompileError(RuntimeError):
    """A specialization failed to compile or link.

    Attributes: ``spec`` (its title), ``source`` (the generated unit that failed, in the build
    directory), ``command`` (the compiler command line), ``errors`` (the first error lines) and
    ``log`` (all output, decoded; the compilers' bytes are in ``build.log`` next to ``source``).
    """

    def __init__(self, spec: str, source: str, command: str, errors: list[str], log: str) -> None:
        self.spec, self.source, self.command, self.errors, self.log = spec, source, command, errors, log
        text = "\n".join(errors) if errors else log.strip()[-4000:]
        body = "\n".join("    " + line for line in text.splitlines())
        super().__init__(f"kernkit failed to build {spec}\n  source:  {source}\n  command: {command}\n"
                         f"  log:     {os.path.join(os.path.dirname(source), 'build.log')}\n  errors:\n{body}")


def find_cuda_home() -> Path | None:
    """``$CUDA_HOME`` (or ``$CUDA_PATH``), else the toolkit around ``nvcc`` on PATH, else
    ``/usr/local/cuda`` if it holds nvcc; None when there is no toolkit."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = shutil.which("nvcc")
    if nvcc:
        around = Path(nvcc).resolve().parent.parent
        if (around / "include" / "cuda_runtime.h").is_file():  # not a wrapper script elsewhere
            return around
    default = Path("/usr/local/cuda")
    return default if (default / "bin" / "nvcc").exists() else None


def find_cxx() -> str:
    """The host C++ compiler: ``$CXX``, else ``c++``/``g++``/``clang++`` on PATH."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise ToolchainError(f"no host C++ compiler found (tried {', '.join(candidates)}); install one or set CXX")


def need_cuda_home(what: str) -> Path:
    """The CUDA toolkit's root (``find_cuda_home``), which ``what`` needs: ``ToolchainError``
    saying how to install or name one when there is none."""
    home = find_cuda_home()
    if home is None or not (home / "include" / "cuda_runtime.h").is_file():
        where = f"CUDA_HOME={home}" if home else "CUDA_HOME is not set and nvcc is not on PATH"
        raise ToolchainError(f"{what} needs the CUDA toolkit ({where}); install it and set CUDA_HOME to its root "
                             "(the folder that holds bin/nvcc), e.g. CUDA_HOME=/usr/local/cuda")
    return home


def stamp(path: str) -> list:
    """``[real path, size, mtime_ns]`` of a compiler binary: the identity a build records, so that
    a later load can tell a changed compiler without running it."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return [real, st.st_size, st.st_mtime_ns]


def version(path: str) -> str:
    """The release line(s) of ``path --version``, for a build's record (never on a load); a
    compiler that is a library (NVRTC) by its file name."""
    if ".so" in os.path.basename(path):
        return os.path.basename(os.path.realpath(path))
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainError(f"cannot run '{path} --version': {e}") from e
    lines = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]
    # nvcc names its release on later lines; gcc and clang on the first.
    release = [line for line in lines if "release" in line or line.startswith("Build ")]
    return " | ".join(release) if release else (lines[0] if lines else "unknown")


def quote(args: list[str]) -> str:
    """``args`` as one line of a ``build.ninja`` command: shell-quoted, ``$`` escaped. A control
    character is refused (``ValueError``): a newline would end the line and start a statement."""
    for a in args:
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in a):
            raise ValueError(f"a build command cannot hold a control character: {a!r}")
    return " ".join(shlex.quote(a).replace("$", "$$") for a in args)


class Backend:
    """How the CUDA unit of a spec is compiled and linked. Subclasses set ``name``, ``flags``
    (fixed flags, part of the cache key) and ``unit`` (the generated file's name), and say which
    compilers they need and which extra compile and link arguments they add."""

    name = ""
    flags: tuple[str, ...] = ()
    unit = ""
    #: Whether the CUDA unit links the shared helper object (``prebuilt.py``).
    prebuilt = False

    def compilers(self) -> list[str]:
        """Paths of the compilers a build needs (the host compiler first); found, never run.
        Raises ``ToolchainError``."""
        return [find_cxx()]

    def command(self, spec, compilers: list[str]) -> list[str]:
        """The CUDA unit's compile command, without ``-c $in -o $out`` and dependency flags."""
        raise NotImplementedError

    def link_flags(self, spec) -> list[str]:
        return []

    def unit_text(self, spec, text: str) -> str:
        """The CUDA unit as this backend compiles it (the key covers ``text``)."""
        return text

    def build(self, spec, compilers: list[str], build_dir: Path) -> list[Path]:
        """Compile and link ``lib.so`` in ``build_dir``; return the headers the units read.
        Raises ``CompileError``."""
        run_ninja(build_dir, spec.title, write_ninja(self, spec, compilers, build_dir))
        return ninja_deps(build_dir)


def own_headers() -> list[Path]:
    """kernkit's C++ headers (``INCLUDE_DIR``) and the emulator's (``EMU_INCLUDE_DIR``)."""
    return sorted(f for d in (INCLUDE_DIR, EMU_INCLUDE_DIR) for f in d.rglob("*") if f.suffix in (".h", ".cuh"))


def includes(cuda: bool) -> list[str]:
    """kernkit's directories (``-I``: their headers are tracked as dependencies) and the third
    party ones (``-isystem``: covered by the tvm-ffi version and the compiler's identity)."""
    args = [f"-I{INCLUDE_DIR}", f"-I{KERNELS_DIR}"]
    system = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
    if cuda:
        home = need_cuda_home("a CUDA unit")
        system += [str(home / "include"), str(home / "include" / "cccl")]
    for d in dict.fromkeys(system):
        args += ["-isystem", d]
    return args


def write_ninja(backend: Backend, spec, compilers: list[str], build_dir: Path, steps: Sequence[str] = (),
                objects: Sequence[str] = ()) -> str | None:
    """Write the units and a ``build.ninja`` that compiles them (with dependency output) and links
    ``lib.so``, with a backend's own ``steps`` (ninja lines) and the ``objects`` they make; ``ninja
    -C <dir>`` repeats the build by hand. Both are written with the file system's encoding, so
    paths that are not UTF-8 (``os.fsdecode``'s surrogates) stay the same bytes. Returns the key
    of the helper object the build compiles (``prebuilt.py``), for ``run_ninja`` to publish."""
    user = [f"-I{p}" for p in spec.extra_include_paths]
    rules = {"cxx": [compilers[0], *CXX_FLAGS, *includes(cuda=False), *user, *spec.extra_cflags]}
    if spec.cuda_files:
        rules["cuda"] = [*backend.command(spec, compilers), *user]
    # The shared host helpers: a copy of the prebuilt object, or compiled beside the unit (then
    # ``object_key`` names the object to compile and publish).
    helpers = bool(spec.cuda_files) and backend.prebuilt
    object_key = prebuilt.key(rules["cuda"], _helper_identity(rules["cuda"])) if helpers else None
    if object_key and prebuilt.stage(build_dir, object_key):
        object_key = None
    tvm_lib = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    link = [f"-L{tvm_lib}", "-ltvm_ffi", f"-Wl,-rpath,{tvm_lib}", *backend.link_flags(spec), *spec.extra_ldflags]
    out = ["ninja_required_version = 1.3", ""]
    for rule, cmd in rules.items():
        out += [f"rule {rule}", f"  command = {quote(cmd)} -MMD -MF $out.d -c $in -o $out", "  depfile = $out.d",
                "  deps = gcc", ""]
    out += ["rule link", f"  command = {quote(compilers[:1])} -shared $in {quote(link)} -o $out", ""]
    objs = []
    for name, text, rule in spec.units:
        if rule == "cuda":
            text = (prebuilt.USE if helpers else "") + backend.unit_text(spec, text)
        (build_dir / name).write_bytes(os.fsencode(text))
        out.append(f"build {name}.o: {rule} {name}")
        objs.append(f"{name}.o")
    if object_key:
        out.append(f"build {prebuilt.OBJECT}: cuda {prebuilt.UNIT}")
    out += steps
    objs += [*objects, *([prebuilt.OBJECT] if helpers else [])]
    out += [f"build {LIB_NAME}: link {' '.join(objs)}", f"default {LIB_NAME}", ""]
    (build_dir / "build.ninja").write_bytes(os.fsencode("\n".join(out)))
    return object_key


def _helper_identity(command: list[str]) -> list:
    """What decides the helper object's code besides ``command``: the compiler's identity, that
    of the header folders the command names, and the content of kernkit's headers and of the
    splitter that makes the nvrtc backend's host halves of them."""
    files = [*own_headers(), PACKAGE_ROOT / "jit" / "split.py"]
    return [stamp(command[0]), [dir_stamp(d) for d in command if os.path.isdir(d)],
            [[f.relative_to(PACKAGE_ROOT).as_posix(), hashlib.sha256(f.read_bytes()).hexdigest()] for f in files]]


def dir_stamp(d: str) -> list:
    """A header folder's identity: its headers' newest change time and their count."""
    files = list(Path(d).glob("*.h"))
    return [d, max((f.stat().st_mtime_ns for f in files), default=0), len(files)]


#: What ninja prints on stdout when SIGINT stops it; ninja 1.13 also exits with 130, an older one may not.
_INTERRUPTED = b"ninja: build stopped: interrupted by user."


def _ninja() -> str:
    import ninja  # a dependency: the PyPI package ships the binary

    return str(Path(ninja.BIN_DIR) / "ninja")


def run_ninja(build_dir: Path, title: str, object_key: str | None = None) -> None:
    """Run the build, keeping its output in ``build.log`` as the compilers wrote it (any
    encoding), and publish the helper object it compiled (``object_key``, from ``write_ninja``);
    raise ``CompileError`` naming the failed command. A build that Ctrl-C stopped (ninja
    interrupted by ``SIGINT``, which a terminal sends to the compilers too) raises
    ``KeyboardInterrupt``, also in a thread other than the main one: it is not a compile error,
    and the caller discards it rather than keep it as a failure."""
    proc = subprocess.run([_ninja(), "-C", str(build_dir), "-v"], capture_output=True)
    if proc.returncode in (130, -signal.SIGINT) or _INTERRUPTED in proc.stdout:
        raise KeyboardInterrupt(f"the build of {title} was interrupted")
    maker.start()  # the precompiled header the build lacked, for the builds after it
    raw = proc.stdout + proc.stderr
    (build_dir / "build.log").write_bytes(raw)
    if proc.returncode == 0:
        if object_key:
            prebuilt.publish(build_dir, object_key)
        return
    log = raw.decode(errors="replace")
    lines = [ln for ln in log.splitlines() if not ln.startswith("ninja: ")]
    at = next((i for i, ln in enumerate(lines) if ln.startswith("FAILED:")), None)
    if at is None:
        raise CompileError(title, str(build_dir / "build.ninja"), "", lines[:20], log)
    objects = [t for t in lines[at].split() if t.endswith(".o")]  # "FAILED: [code=1] kernel.cu.o"
    body = lines[at + 2:]
    errors = [ln for ln in body if re.search(r"\berror\b", ln, re.I) or ln.startswith("kernkit: ")][:20]
    source = str(build_dir / objects[0][:-2]) if objects else str(build_dir / "build.ninja")
    raise CompileError(title, source, lines[at + 1] if at + 1 < len(lines) else "", errors or body[:20], log)


def ninja_deps(build_dir: Path) -> list[Path]:
    """The headers the compilers reported reading (``ninja -t deps``), outside ``build_dir``."""
    out = subprocess.run([_ninja(), "-C", str(build_dir), "-t", "deps"], capture_output=True, check=True).stdout
    found = []
    for line in os.fsdecode(out).splitlines():  # paths: bytes that need not be UTF-8
        if line.startswith((" ", "\t")) and line.strip():
            path = Path(os.path.normpath(build_dir / line.strip()))
            if build_dir not in path.parents:
                found.append(path)
    return sorted(set(found))

