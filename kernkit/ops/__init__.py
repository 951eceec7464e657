"""kernkit's ops: thin Python entry points that pick a cached specialization and call it.

Each op module also has ``specializations(...)``, the builds a model shape needs, for
ahead-of-time compilation (``python -m kernkit.jit warmup``).
"""

from .embedding import indexing
from .kvcache import store_cache
from .radix import compare_key

from .elementwise import scale

from . import library  # noqa: E402,F401  (registers the torch.library custom ops, torch.ops.kernkit.*)

__all__ = ["compare_key", "indexing", "scale", "store_cache"]
