"""Build fastbreaker's compiled core.

FASTBREAKER_NO_EXTENSIONS=1 (or true, yes, on) builds a pure-Python package (the reference twin
only); 0, false, no, off or empty build the compiled core, anything else is an error.
FASTBREAKER_DEBUG=1 compiles with Cython's bounds checks and C asserts switched on.
A release build carries no debug information (-g0, and the linker drops any: -Wl,-S), unless
FASTBREAKER_DEBUG is set or CFLAGS asks for it (-g; the ThreadSanitizer leg does).
"""

import os

from setuptools import Extension, setup


# A copy of fastbreaker._select.no_extensions (setup.py cannot import the package it builds);
# tests/test_selector.py checks that the two are the same text.
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


NO_EXTENSIONS = no_extensions(os.environ.get("FASTBREAKER_NO_EXTENSIONS"))
DEBUG = bool(os.environ.get("FASTBREAKER_DEBUG"))
KEEP_DEBUG_INFO = DEBUG or any(f.startswith("-g") for f in os.environ.get("CFLAGS", "").split())

# Dotted names under fastbreaker; bench._floor_c is the benchmark floor (an empty method).
MODULES = [
    "_breaker_c",
    "_budget_c",
    "_map_c",
    "_bulkhead_c",
    "_retry_c",
    "_shed_c",
    "_ratelimit_c",
    "bench._floor_c",
]


def extensions():
    from Cython.Build import cythonize

    if os.name == "nt":
        compile_args, link_args = [], []  # MSVC writes debug information only when asked (/Zi)
    elif KEEP_DEBUG_INFO:
        compile_args, link_args = ["-O2"], []
    else:
        # 7.9 MB of .so files with the interpreter's default -g; about a fifth without.
        compile_args, link_args = ["-O2", "-g0"], ["-Wl,-S"]
    exts = [
        Extension(
            f"fastbreaker.{name}",
            [f"src/fastbreaker/{name.replace('.', '/')}.pyx"],
            include_dirs=["src/fastbreaker"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            undef_macros=["NDEBUG"] if DEBUG else [],
        )
        for name in MODULES
    ]
    # The speed directives live here, not in the .pyx headers (a header would override them), so
    # that FASTBREAKER_DEBUG=1 really switches the checks on in every module.
    directives = {
        "language_level": "3",
        "boundscheck": DEBUG,
        "wraparound": DEBUG,
        "initializedcheck": DEBUG,
        "cdivision": not DEBUG,
        # Signatures in the docstrings, for help() and inspect.signature() on compiled classes.
        "embedsignature": True,
        "embedsignature.format": "clinic",
    }
    return cythonize(exts, compiler_directives=directives)


setup(ext_modules=[] if NO_EXTENSIONS else extensions())
