"""Human-readable units for CLI reports."""

from __future__ import annotations

import math


def gib(nbytes: float) -> str:
    """Bytes as GiB with two decimals (``inf`` stays readable)."""
    if math.isinf(nbytes):
        return "unlimited"
    return f"{nbytes / 2**30:.2f} GiB"


def seconds(value: float) -> str:
    """A duration with a unit that keeps 3-4 significant digits."""
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.1f} us"


def percent(fraction: float) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{fraction * 100:.1f}%"
