"""kernkit's ops, one module per op file: ``store_cache`` (kvcache), ``indexing`` (embedding),
``compare_key`` (radix), ``scale`` (elementwise), ``per_token_quant_fp8`` (quant),
``per_token_group_quant_fp8`` (group_quant), ``rotary_embedding`` and ``rotary_embedding_store``
(rope), ``rmsnorm`` and ``fused_add_rmsnorm`` (norm), ``qk_norm``, ``silu_and_mul`` and
``gelu_and_mul`` (activation).

Each module registers its ops with ``register_op`` when imported, which makes them
``torch.ops.kernkit.*`` custom ops and lists their specializations for ``warmup``; this package
imports every module in it, so a new op file needs no edit elsewhere."""

import importlib
import pkgutil

from .registry import available, register_op, registered_ops

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

globals().update({op.name: op.fn for op in registered_ops() if op.qualname.startswith("kernkit::")})
__all__ = sorted(op.name for op in registered_ops() if op.qualname.startswith("kernkit::"))
__all__ += ["available", "register_op", "registered_ops"]
