"""The value checks every architecture's config applies to ``config.json`` numbers (one
function per kind of value, so a size or an epsilon is refused alike in every family)."""

from __future__ import annotations

import math

from trt_kv.errors import ConfigError, mismatch


def positive_int(name: str, value: object) -> None:
    """Raises ConfigError naming ``name`` unless ``value`` is an ``int`` > 0 (not a bool, a
    float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(mismatch(name, "an integer > 0", "", repr(value)))


def positive_number(name: str, value: object) -> None:
    """Raises ConfigError naming ``name`` unless ``value`` is a finite ``int`` or ``float``
    > 0 (NaN, infinities, zero, negatives, bools and strings such as ``"1e-5"`` refused)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ConfigError(mismatch(name, "a finite number > 0", "", repr(value)))
