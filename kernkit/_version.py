"""kernkit's version; part of every JIT cache key."""

__version__ = "0.2.0"
