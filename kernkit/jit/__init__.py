"""kernkit's JIT layer: describe a specialization of kernel templates (``JitSpec``), build it
once into an on-disk cache, and load it as a tvm-ffi module whose functions take torch tensors.

Modules, one job each: ``args`` (template arguments), ``memo`` (``cache_once``), ``arch`` (the
target), ``backends`` (compilers and builds), ``cache`` (the disk cache), ``spec`` (``JitSpec``,
``load_jit``), ``manifest`` (record and replay the specializations a run loads). The developer tools (``python -m kernkit.jit``) live in ``kernkit.tools``.
"""

from .arch import ArchError, CudaArch, is_arch_support_pdl, target_arch
from .args import CppArgs, make_cpp_args
from .backends import CompileError, ToolchainError
from .cache import CacheDirError
from .config import freeze
from .memo import cache_once
from .spec import CaptureCompileError, FrozenCompileError, JitDisabledError, JitSpec, load_jit

__all__ = [
    "ArchError",
    "CacheDirError",
    "CaptureCompileError",
    "CompileError",
    "CppArgs",
    "CudaArch",
    "FrozenCompileError",
    "JitDisabledError",
    "JitSpec",
    "ToolchainError",
    "cache_once",
    "freeze",
    "is_arch_support_pdl",
    "load_jit",
    "make_cpp_args",
    "target_arch",
]
