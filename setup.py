"""Build fastbreaker's compiled core.

FASTBREAKER_NO_EXTENSIONS=1 builds a pure-Python package (the reference twin only).
FASTBREAKER_DEBUG=1 compiles with Cython's bounds checks and C asserts switched on.
A release build carries no debug information (-g0, and the linker drops any: -Wl,-S), unless
FASTBREAKER_DEBUG is set or CFLAGS asks for it (-g; the ThreadSanitizer leg does).
"""

import os

from setuptools import Extension, setup

NO_EXTENSIONS = bool(os.environ.get("FASTBREAKER_NO_EXTENSIONS"))
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
