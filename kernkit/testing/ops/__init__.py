"""Each op's test material, one module per op stem (``store_cache``, ``rmsnorm``, ...), named as
the op's module in ``kernkit.ops``:

- its torch reference, ``ref_<op>``: what the kernel must produce on valid arguments;
- ``hash_cases()``: its fixed inputs for the kernel-hash runner (``kernkit.testing.hashes``);
- its invalid calls (``<OP>_BAD``: ``kernkit.testing.invalid.Bad``, one per way to break an
  argument) and the strategies that draw its valid arguments.

Tests, benchmarks, the hash runner and the sanitizer driver import a module by name; the hash
runner finds them all with ``pkgutil``. A project's own op keeps such a module in its own
package. This package imports nothing itself.
"""
