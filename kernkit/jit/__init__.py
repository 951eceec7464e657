"""kernkit's JIT layer: describe a specialization of kernel templates (``JitSpec``), build it
once into an on-disk cache, and load it as a tvm-ffi module whose functions take torch tensors.

Modules, one job each, each importing only modules named before it: ``args`` (template
arguments), ``memo`` (``cache_once``), ``config`` (environment variables), ``arch`` (the
target), ``paths`` (where kernkit's files are), ``maker`` (detached makers of shared files),
``cache`` (the disk cache), ``pch`` and ``prebuilt`` (the files builds share), ``split`` (a
source's device and host halves), ``backends`` (compilers and builds, one module per backend),
``manifest`` (record the specializations a run loads), ``spec`` (``JitSpec``, ``load_jit``).
The developer tools (``python -m kernkit.jit``, which also replays manifests) live in
``kernkit.cli`` and use only the names below: besides what ops use, where kernkit's files are,
the toolchain and the backends, the settings, the cache's records and builds, and manifests
(some under a clearer name than in their module: ``cache_root`` is ``cache.root``).
"""

from .arch import ArchError, CudaArch, is_arch_support_pdl, target_arch
from .args import CppArgs, make_cpp_args
from .backends import BACKENDS, default_backend
from .backends.base import CompileError, ToolchainError, find_cuda_home, find_cxx
from .backends.base import version as compiler_version
from .backends.nvrtc import headers as cuda_headers
from .backends.nvrtc import toolkit as nvrtc_toolkit
from .cache import LAYOUT as CACHE_LAYOUT
from .cache import (
    CacheDirError,
    CorruptBuildError,
    check_record,
    file_record,
    frozen_compiles,
    local_path,
    read_build,
    staging_dir,
)
from .cache import discard as discard_build
from .cache import find as find_build
from .cache import publish as publish_build
from .cache import root as cache_root
from .cache import sha256 as file_sha256
from .config import ARCH_VAR, BACKEND_VAR, SHARED_VAR, freeze, frozen, jit_enabled, shared_entries
from .manifest import ManifestError
from .manifest import read as read_manifest
from .memo import cache_once
from .paths import EMU_INCLUDE_DIR, INCLUDE_DIR, KERNELS_DIR, LIB_NAME
from .spec import CaptureCompileError, FrozenCompileError, JitDisabledError, JitSpec, load_jit

__all__ = [
    "ARCH_VAR",
    "BACKENDS",
    "BACKEND_VAR",
    "CACHE_LAYOUT",
    "EMU_INCLUDE_DIR",
    "INCLUDE_DIR",
    "KERNELS_DIR",
    "LIB_NAME",
    "SHARED_VAR",
    "ArchError",
    "CacheDirError",
    "CaptureCompileError",
    "CompileError",
    "CorruptBuildError",
    "CppArgs",
    "CudaArch",
    "FrozenCompileError",
    "JitDisabledError",
    "JitSpec",
    "ManifestError",
    "ToolchainError",
    "cache_once",
    "cache_root",
    "check_record",
    "compiler_version",
    "cuda_headers",
    "default_backend",
    "discard_build",
    "file_record",
    "file_sha256",
    "find_build",
    "find_cuda_home",
    "find_cxx",
    "freeze",
    "frozen",
    "frozen_compiles",
    "is_arch_support_pdl",
    "jit_enabled",
    "load_jit",
    "local_path",
    "make_cpp_args",
    "nvrtc_toolkit",
    "publish_build",
    "read_build",
    "read_manifest",
    "shared_entries",
    "staging_dir",
    "target_arch",
]
