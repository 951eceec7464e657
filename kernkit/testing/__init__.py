"""What kernkit's tests, benchmarks and tools share, as a package of its own (as
``tvm_ffi.testing`` is). It needs the ``test`` extra (pytest and hypothesis).

``oracle`` (the torch references the kernels are checked against), ``hashes`` (the kernel-hash
runner, ``python -m kernkit.testing.hashes``) and ``invalid`` (the invalid-call generator).
Import the module you need; this package imports nothing itself.
"""
