"""``cache_once``: the in-memory memoizer for module factories."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class KeyedLocks:
    """One lock per key, created on demand, so that work on different keys runs in parallel
    while two threads asking for the same key do the work once."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, threading.Lock] = {}

    def __call__(self, key: Hashable) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock


def cache_once(fn: F) -> F:
    """Memoize ``fn`` on its arguments, computing each key at most once per process.

    The hit path is one dict lookup, which ``torch.compile`` traces as plain Python (unlike
    ``functools.lru_cache``, which Dynamo cannot look into). A miss takes a per-key lock and
    checks again, so two threads asking for one cold key run ``fn`` once; an exception is not
    cached. Arguments must be hashable; keyword arguments are part of the key.
    """
    cache: dict[Hashable, Any] = {}
    locks = KeyedLocks()

    def compute(key: Hashable, args: tuple, kwargs: dict) -> Any:
        with locks(key):
            if key in cache:
                return cache[key]
            value = fn(*args, **kwargs)
            cache[key] = value
            return value

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        try:
            return cache[key]
        except KeyError:
            return compute(key, args, kwargs)

    wrapper.cache = cache  # type: ignore[attr-defined]
    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
