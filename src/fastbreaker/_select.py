"""The one place that chooses between the compiled core and the pure-Python twin.

The compiled core (``*_c`` extension modules) is used on CPython unless the environment variable
``FASTBREAKER_NO_EXTENSIONS`` is set to a non-empty value; the pure-Python twins (``*_py``) are
used otherwise, and always by type checkers (they are the typed specification). On CPython a
missing extension is an ImportError where it is imported, never a silent fallback to the twin:
the speed is the product. Every other module asks this one.
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

__all__ = ["COMPILED", "ENV_VAR", "compiled_available"]

#: Setting it (to any non-empty value) selects the pure-Python twins.
ENV_VAR = "FASTBREAKER_NO_EXTENSIONS"


def compiled_available() -> bool:
    """Whether this interpreter and environment use the compiled core."""
    return platform.python_implementation() == "CPython" and not os.environ.get(ENV_VAR)


#: True when ``import fastbreaker`` uses the compiled core (False for type checkers).
COMPILED: bool = False if TYPE_CHECKING else compiled_available()
