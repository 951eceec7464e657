"""kernkit: CUDA C++ kernel templates, specialized and compiled on first use, called with torch
tensors through tvm-ffi."""

from ._version import __version__

__all__ = ["__version__"]
