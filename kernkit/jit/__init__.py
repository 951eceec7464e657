"""kernkit's JIT layer: render a template specialization, compile it once, cache it on disk and
in memory, and load it as a tvm-ffi module whose functions take torch tensors.

The pieces, one job each: ``args`` (template arguments), ``memo`` (``cache_once``), ``arch``
(target selection), ``toolchain`` (compilers and their fingerprints), ``codegen`` (generated
units and header discovery), ``build`` (compiling), ``cache`` (the disk cache), ``core``
(``load_jit``).
"""

from .arch import ArchError, CudaArch, is_arch_support_pdl, target_arch
from .args import CppArgs, make_cpp_args
from .build import CompileError
from .cache import CacheDirError
from .core import CaptureCompileError, JitDisabledError, JitRequest, load_jit
from .memo import cache_once
from .toolchain import ToolchainError

__all__ = [
    "ArchError",
    "CacheDirError",
    "CaptureCompileError",
    "CompileError",
    "CppArgs",
    "CudaArch",
    "JitDisabledError",
    "JitRequest",
    "ToolchainError",
    "cache_once",
    "is_arch_support_pdl",
    "load_jit",
    "make_cpp_args",
    "target_arch",
]
