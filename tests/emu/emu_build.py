"""Builds standalone emulator test programs with the CPU backend's compile flags."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import tvm_ffi.libinfo

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
CXX = os.environ.get("CXX", "g++")

#: Sanitizer flags of the emulator's sanitizer build (the same set the JIT layer uses).
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]


def have_cuda_headers() -> bool:
    return (CUDA_HOME / "include" / "cuda_fp16.h").is_file() and shutil.which(CXX) is not None


def compile_flags() -> list[str]:
    """The flags ``load_jit(..., backend="emu")`` compiles with (plus a ``main``)."""
    tvm_inc = tvm_ffi.libinfo.find_include_path()
    dlpack_inc = tvm_ffi.libinfo.find_dlpack_include_path()
    return [
        "-x", "c++", "-std=c++17", "-O2", "-fPIC", "-ffp-contract=off", "-pthread", "-DKERNKIT_EMU=1",
        "-include", "kernkit/emu/runtime.h",
        f"-I{REPO / 'kernkit' / 'emu' / 'include'}", f"-I{REPO / 'kernkit' / 'include'}",
        f"-I{CUDA_HOME / 'include'}", f"-I{CUDA_HOME / 'include' / 'cccl'}",
        f"-I{tvm_inc}", f"-I{dlpack_inc}",
    ]


def build(src: str, out_dir: Path, name: str, extra: list[str] | None = None) -> Path:
    """Compile ``tests/emu/<src>`` into ``out_dir/name`` and return the executable's path."""
    lib = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    exe = out_dir / name
    cmd = [CXX, *compile_flags(), *(extra or []), str(HERE / src), "-o", str(exe), "-x", "none",
           f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}", "-rdynamic"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"compile failed: {' '.join(cmd)}\n{res.stderr[-4000:]}")
    return exe


def run(exe: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=full_env, timeout=timeout)
