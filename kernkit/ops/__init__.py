"""kernkit's ops, one module per op or family of ops that share a kernel, named as the op:
``store_cache``, ``indexing``, ``compare_key``, ``scale``, ``per_token_quant_fp8``,
``per_token_group_quant_fp8``, ``rotary_embedding``, ``rotary_embedding_store``, ``rmsnorm``
(with ``fused_add_rmsnorm``), ``qk_norm`` and ``act_and_mul`` (``silu_and_mul``,
``gelu_and_mul``). Modules whose name starts with ``_`` hold what several ops share.

Each module registers its ops with ``register_op`` when imported, which makes them
``torch.ops.kernkit.*`` custom ops and lists their specializations for ``warmup``; this package
imports every module in it, so a new op file needs no edit elsewhere. The package's attribute of
an op's name is the op, not its module: reach the module's other names with
``from kernkit.ops.store_cache import store_cache_spec``."""

import importlib
import pkgutil
from typing import TYPE_CHECKING

from .registry import available, register_op, registered_ops

if TYPE_CHECKING:  # the ops are set below, by name: a type checker takes each for a callable
    from collections.abc import Callable
    from typing import Any

    def __getattr__(name: str) -> Callable[..., Any]: ...

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

globals().update({op.name: op.fn for op in registered_ops() if op.qualname.startswith("kernkit::")})
__all__ = sorted(op.name for op in registered_ops() if op.qualname.startswith("kernkit::"))
__all__ += ["available", "register_op", "registered_ops"]
