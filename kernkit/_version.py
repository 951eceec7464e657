"""kernkit's version; part of every JIT cache key."""

__version__ = "0.1.0"
