"""kernkit's JIT layer: describe a specialization of kernel templates (``JitSpec``), build it
once into an on-disk cache, and load it as a tvm-ffi module whose functions take torch tensors.

Modules, one job each, each importing only modules named before it: ``args`` (template
arguments), ``memo`` (``cache_once``), ``config`` (environment variables), ``arch`` (the
target), ``paths`` (where kernkit's files are), ``untrusted`` (JSON and names from elsewhere),
``maker`` (detached makers of shared files), ``cache`` (the disk cache), ``pch`` and
``prebuilt`` (the files builds share), ``split`` (a source's device and host halves),
``backends`` (compilers and builds, one module per backend), ``manifest`` (record the
specializations a run loads), ``spec`` (``JitSpec``, ``load_jit``), ``tuning`` (the template
choices an op may vary, and the tables that pick them: ``docs/tuning.md``).
The names below are what an op's author uses: the spec and its loader, template arguments,
the target, the errors a load raises, the freeze, and where kernkit's files are. The
developer tools (``python -m kernkit.jit``, in ``kernkit.cli``) import the rest from the
module that defines it.
"""

from .arch import ArchError, CudaArch, is_arch_support_pdl, target_arch
from .args import CppArgs, make_cpp_args
from .backends.base import CompileError, ToolchainError
from .cache import CacheDirError
from .config import ConfigError, freeze, frozen
from .memo import cache_once
from .paths import INCLUDE_DIR, KERNELS_DIR
from .spec import CaptureCompileError, FrozenCompileError, JitDisabledError, JitSpec, load_jit

__all__ = [
    "INCLUDE_DIR",
    "KERNELS_DIR",
    "ArchError",
    "CacheDirError",
    "CaptureCompileError",
    "CompileError",
    "ConfigError",
    "CppArgs",
    "CudaArch",
    "FrozenCompileError",
    "JitDisabledError",
    "JitSpec",
    "ToolchainError",
    "cache_once",
    "freeze",
    "frozen",
    "is_arch_support_pdl",
    "load_jit",
    "make_cpp_args",
    "target_arch",
]
