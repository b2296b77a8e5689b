"""Build fastbreaker's compiled core.

FASTBREAKER_NO_EXTENSIONS=1 builds a pure-Python package (the reference twin only).
FASTBREAKER_DEBUG=1 compiles with Cython's bounds checks and C asserts switched on.
"""

import os

from setuptools import Extension, setup

NO_EXTENSIONS = bool(os.environ.get("FASTBREAKER_NO_EXTENSIONS"))
DEBUG = bool(os.environ.get("FASTBREAKER_DEBUG"))

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

    exts = [
        Extension(
            f"fastbreaker.{name}",
            [f"src/fastbreaker/{name.replace('.', '/')}.pyx"],
            include_dirs=["src/fastbreaker"],
            extra_compile_args=[] if os.name == "nt" else ["-O2"],
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
