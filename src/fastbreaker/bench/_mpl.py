"""matplotlib, optional: imported by name when a plot is drawn, typed through a Protocol.

The report's typing must not depend on an optional package: ``mypy --strict`` and ``stubtest``
pass on an environment without matplotlib, because nothing here imports it statically.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional, Protocol, cast


class PyPlot(Protocol):
    """The part of ``matplotlib.pyplot`` the report uses."""

    def subplots(self, *args: Any, **kwargs: Any) -> Any: ...

    def close(self, fig: Any) -> None: ...


def pyplot() -> PyPlot:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (ImportError without it)."""
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    return cast(PyPlot, importlib.import_module("matplotlib.pyplot"))


def missing() -> Optional[str]:
    """Why a plot cannot be drawn here (matplotlib is not importable), or None."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None
