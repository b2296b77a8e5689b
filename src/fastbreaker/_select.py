"""The one place that chooses between the compiled core and the pure-Python twin.

The compiled core (``*_c`` extension modules) is used on CPython unless the environment variable
``FASTBREAKER_NO_EXTENSIONS`` says yes (``no_extensions``); the twins (``*_py``) otherwise, and
always by type checkers (they are the typed specification). A missing extension on CPython is an
ImportError where it is imported, never a silent fallback to the twin. Every other module asks
this one; ``setup.py`` holds a copy of ``no_extensions`` (a test keeps the two identical).
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

__all__ = ["COMPILED", "ENV_VAR", "compiled_available", "no_extensions"]

#: 1, true, yes or on select the pure-Python twins; 0, false, no, off or empty the compiled core.
ENV_VAR = "FASTBREAKER_NO_EXTENSIONS"


def no_extensions(value: str | None) -> bool:
    """Whether ``value`` of FASTBREAKER_NO_EXTENSIONS selects the pure-Python twin.

    1, true, yes, on: the twin. 0, false, no, off, empty or unset: the compiled core. Any case,
    surrounding spaces ignored. Anything else is a ValueError: a typo must not pick a core that
    is 30-45x slower (or not the one being debugged) without a word.
    """
    text = (value or "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(
        f"FASTBREAKER_NO_EXTENSIONS must be 1, true, yes or on (the pure-Python twin) or 0, "
        f"false, no, off or empty (the compiled core), got {value!r}"
    )


def compiled_available() -> bool:
    """Whether this interpreter and environment use the compiled core."""
    return platform.python_implementation() == "CPython" and not no_extensions(
        os.environ.get(ENV_VAR)
    )


#: True when ``import fastbreaker`` uses the compiled core (False for type checkers).
COMPILED: bool = False if TYPE_CHECKING else compiled_available()
