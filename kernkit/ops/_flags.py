"""The ``cast_x_before_out_mul`` flag that the norm ops (``rmsnorm``, ``fused_add_rmsnorm``,
``qk_norm``) share: as ``warmup`` passes it, and as a call must pass it."""

from __future__ import annotations


def as_flag(value: object) -> bool:
    """A bool given to ``warmup`` or ``available`` as a bool or as ``0``/``1``/``true``/``false``
    (any case); anything else raises a ``TypeError`` naming ``cast_x_before_out_mul``."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text not in ("0", "1", "true", "false"):
        raise TypeError(f"'cast_x_before_out_mul': expected a bool (or 0/1/true/false), got {value!r}")
    return text in ("1", "true")


def check_cast_flag(cast_x_before_out_mul: object) -> None:
    """A ``TypeError`` unless ``cast_x_before_out_mul`` is a bool: checked per call (as rope's
    ``is_neox``), since the memo would take ``1`` for ``True``."""
    if type(cast_x_before_out_mul) is not bool:
        raise TypeError(f"'cast_x_before_out_mul': expected a bool, got {type(cast_x_before_out_mul).__name__}")
