"""``cache_once``: the in-memory memoizer for module factories."""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

#: The factory call being computed (``mypkg.ops._module(torch.bfloat16, 128)``): what the JIT
#: layer names as the cause of a build that is frozen (``freeze``).
requester: contextvars.ContextVar[str | None] = contextvars.ContextVar("kernkit_requester", default=None)


def cache_once(fn: F) -> F:
    """Memoize ``fn`` on its arguments, computing each key at most once per process.

    The hit path is one dict lookup, which ``torch.compile`` traces as plain Python (unlike
    ``functools.lru_cache``, which Dynamo cannot look into). A miss takes a lock of that key
    only, so two threads asking for one cold key run ``fn`` once while other keys proceed. When
    Dynamo is loaded a miss runs outside the graph it may be tracing (``torch.compiler.disable``:
    a cold load inside ``torch.compile`` is a graph break, never a tracing error); without it
    nothing imports Dynamo, which costs a second of process start. An exception is not cached.
    Arguments must be hashable (an unhashable one is a ``TypeError`` naming the parameter it was
    passed as, which ops name after their own arguments); keyword arguments are part of the key.

    Example
    -------
    >>> @cache_once
    ... def _module(dtype):
    ...     return load_jit("scale", *make_cpp_args(dtype, False), ...)  # doctest: +SKIP
    """
    cache: dict[Hashable, Any] = {}
    locks: dict[Hashable, threading.Lock] = {}
    guard = threading.Lock()

    def compute(key: Hashable, args: tuple, kwargs: dict) -> Any:
        with guard:
            lock = locks.setdefault(key, threading.Lock())
        with lock:
            if key not in cache:
                call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
                token = requester.set(f"{fn.__module__}.{fn.__qualname__}({call})")
                try:
                    cache[key] = fn(*args, **kwargs)
                finally:
                    requester.reset(token)
            return cache[key]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        try:
            return cache[key]
        except KeyError:
            pass  # computed below, outside the handler: its errors are not chained to this miss
        except TypeError:  # an unhashable argument: name it, not just its type
            raise _unhashable(fn, args, kwargs) from None
        if "torch._dynamo" in sys.modules:  # perhaps tracing: keep the load out of the graph
            return torch.compiler.disable(compute)(key, args, kwargs)
        return compute(key, args, kwargs)

    wrapper.cache = cache  # type: ignore[attr-defined]
    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def _unhashable(fn: Callable, args: tuple, kwargs: dict) -> TypeError:
    """The error for a call of ``fn`` with an argument that cannot be a key."""
    bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    for name, value in bound.items():
        try:
            hash(value)
        except TypeError:
            return TypeError(f"'{name}': expected a hashable value ({fn.__module__}.{fn.__qualname__} caches on it), "
                             f"got {type(value).__name__}")
    return TypeError(f"{fn.__module__}.{fn.__qualname__}: an argument is not hashable")
