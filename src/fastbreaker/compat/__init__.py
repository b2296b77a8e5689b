"""Drop-in replacements for the most used Python circuit breakers, driven by fastbreaker's core.

Change one import line and keep the rest of the code:

    import fastbreaker.compat.pybreaker as pybreaker           # was: import pybreaker
    from fastbreaker.compat.circuitbreaker import circuit       # was: from circuitbreaker import circuit

Each module mirrors the documented API and behaviour of its peer (pybreaker 1.4, circuitbreaker
2.1) and states in its docstring where it differs on purpose, and why. Neither module is imported
here, so using one never imports the other.
"""

from __future__ import annotations

__all__: list[str] = []
