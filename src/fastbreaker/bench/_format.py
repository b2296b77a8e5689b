"""How a measured value is printed, shared by the sections' summaries and the renderer."""

from __future__ import annotations

from typing import Any, Optional

WIDTH = 80  # text and Markdown lines stay within this many columns (a terminal)


def fmt(key: str, value: Any) -> str:
    """A table cell: ``-`` when not applicable; ratios as ``1.50x``; ns with one decimal."""
    if value is None:
        return "-"
    if key == "threads_created":
        return str(value)
    if key.startswith("x_"):
        return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"
    if key == "bytes_per_host" or value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def ratio(value: Any, base: Any) -> Optional[float]:
    """``value / base``, or None when either is missing or not positive (a noisy tiny run)."""
    if value is None or base is None or value <= 0 or base <= 0:
        return None
    return float(value / base)


def times(r: Optional[float]) -> str:
    """A ratio as ``1.50x``, or ``n/a``."""
    return "n/a" if r is None else fmt("x_", r)
