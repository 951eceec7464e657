"""The flags that the norm ops (``rmsnorm``, ``fused_add_rmsnorm``, ``qk_norm``) share: the
``cast_x_before_out_mul`` flag, as ``warmup`` passes it and as a call must pass it, and the
schedules of ``rmsnorm_row`` (``norm/rmsnorm.cuh``) that a tuning table may choose per size."""

from __future__ import annotations

from collections.abc import Mapping

from ..jit.tuning import EVERY_SIZE, Tunable

#: The schedules of ``rmsnorm_row`` a tuning table may choose per size, each giving the same
#: bits: the weight loaded after the reduction, and the PDL trigger after it.
SCHEDULES = {"late_weight": (False, True), "late_trigger": (False, True)}


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


def every_size(args: Mapping) -> tuple[int, int]:
    """The masks ``(late_weight, late_trigger)`` of the candidate ``args`` (``SCHEDULES``'
    names) at every size: the build ``tune`` times."""
    return EVERY_SIZE * bool(args["late_weight"]), EVERY_SIZE * bool(args["late_trigger"])


def schedule_masks(tunable: Tunable, is_cuda: bool, **key: object) -> tuple[int, int]:
    """The masks ``(late_weight, late_trigger)`` this device's tuning tables give ``tunable``
    for ``key``, over its ``elements`` (``Tunable.size_masks``): the launcher picks a call's
    variant by its size."""
    masks = tunable.size_masks(is_cuda, "elements", **key)
    return masks["late_weight"], masks["late_trigger"]


def template_tail(*args: bool | int) -> tuple[bool | int, ...]:
    """``args`` without the defaults (``False``, ``0``) at their end: a norm's template arguments
    after its fixed ones, so that an untuned build keeps the title it always had."""
    cut = len(args)
    while cut and not args[cut - 1]:
        cut -= 1
    return args[:cut]
