"""What kernkit's tests, benchmarks and tools share, as a package of its own (as
``tvm_ffi.testing`` is). It needs the ``test`` extra (pytest and hypothesis).

- ``ops``: each op's test material (reference, hash cases, invalid calls), one module per op;
- ``oracle``: the exact arithmetic the references share, and byte comparisons;
- ``hashes``: the kernel-hash runner, ``python -m kernkit.testing.hashes``;
- ``invalid``: the invalid-call generator;
- ``models``: transformers models of real shapes with random weights, for the GPU tests and
  ``benchmark/bench_model.py``.

Import the module you need; this package imports nothing itself.
"""
