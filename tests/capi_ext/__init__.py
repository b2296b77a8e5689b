"""Build test-only Cython extensions against fastbreaker's C API, at test time, in a temp folder.

``build_client(dest)`` compiles ``fb_capi_client.pyx`` against the *installed* package the way a
downstream project would: ``cimport fastbreaker._breaker_c`` resolved through the package's shipped
``.pxd`` files, the C headers from the package folder.

``build_racy(dest)`` is the negative control of the stress tests: it copies the core's ``.pyx``
and ``.pxd`` sources under other module names (its ``.pxi`` include files under their own), compiles them with ``FB_RACY_FOR_TESTS`` (every
compare-and-swap becomes a plain load + compare + store), and builds the same client against
them. Nothing built here is ever part of the package.

Extra compiler and linker flags come from ``FB_TEST_CFLAGS`` / ``FB_TEST_LDFLAGS`` (the
ThreadSanitizer run sets them).

``cached()`` builds each kind once per source hash, not once per test run: the digest covers the
sources compiled, the installed package's ``.pxd``/``.h`` files, the interpreter, Cython and the
flags; the builds live under ``FB_TEST_BUILD_CACHE`` (default ``build/test-ext`` in the checkout,
else a temp folder) and a file lock lets one pytest-xdist worker build while the others wait.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pathlib
import re
import shutil
import sys
import sysconfig
import tempfile
import threading
import types
from typing import Callable

import fastbreaker

HERE = pathlib.Path(__file__).resolve().parent
CLIENT = HERE / "fb_capi_client.pyx"
BUILT = ".fb-built"  # written last by _compile: a folder holding it is a complete build
_lock = threading.RLock()


def package_dir() -> pathlib.Path:
    """The installed package's folder: its shipped .pxd and .h files live there."""
    get_include = getattr(fastbreaker, "get_include", None)
    if get_include is not None:
        return pathlib.Path(get_include())
    return pathlib.Path(fastbreaker.__file__).resolve().parent


def core_source_dir() -> pathlib.Path | None:
    """Where the core's .pyx sources are: beside the package (in-place or editable install),
    else in the source tree next to tests/ (a wheel ships no .pyx). None if neither has them."""
    for candidate in (package_dir(), HERE.parent.parent / "src" / "fastbreaker"):
        if (candidate / "_breaker_c.pyx").exists() and (candidate / "_budget_c.pyx").exists():
            return candidate
    return None


def _flags(name: str) -> list[str]:
    return os.environ.get(name, "").split()


def _compile(
    dest: pathlib.Path, modules: list[tuple[str, pathlib.Path, list[tuple[str, str]]]]
) -> None:
    if (dest / BUILT).exists():
        return  # a cached build of the same sources (see cached())
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    optimize = [] if os.name == "nt" else ["-O2"]
    exts = [
        Extension(
            name,
            [str(pyx)],
            include_dirs=[str(package_dir())],
            define_macros=macros,
            extra_compile_args=optimize + _flags("FB_TEST_CFLAGS"),
            extra_link_args=_flags("FB_TEST_LDFLAGS"),
        )
        for name, pyx, macros in modules
    ]
    exts = cythonize(
        exts,
        include_path=[str(package_dir().parent), str(dest)],
        build_dir=str(dest / "cython"),
        quiet=True,
        force=True,
    )
    dist = Distribution({"ext_modules": exts, "script_name": "setup.py"})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(dest)
    cmd.build_temp = str(dest / "tmp")
    cmd.ensure_finalized()
    cmd.run()
    (dest / BUILT).write_text("ok\n", encoding="utf-8")


def _import(dest: pathlib.Path, name: str) -> types.ModuleType:
    # Modules that cimport each other import one another by name at load time: put dest on the
    # path (test-only folder, unique names, so nothing else can be shadowed).
    if str(dest) not in sys.path:
        sys.path.insert(0, str(dest))
    return importlib.import_module(name)


def build_client(dest: pathlib.Path) -> types.ModuleType:
    """``fb_capi_client`` compiled against the installed package."""
    with _lock:
        dest.mkdir(parents=True, exist_ok=True)
        pyx = dest / "fb_capi_client.pyx"
        shutil.copyfile(CLIENT, pyx)
        _compile(dest, [("fb_capi_client", pyx, [])])
        return _import(dest, "fb_capi_client")


RACY_BREAKER = "_fb_racy_breaker"
RACY_BUDGET = "_fb_racy_budget"
RACY_CLIENT = "fb_capi_client_racy"
# Copies of the core, by kind: (module prefix, macros). "racy" is the negative control (its
# counters are striped too, so that a stripe's lost update can be caught); "striped" is the
# shipped core with the free-threaded build's striped counters forced on, for GIL builds.
COPIES = {
    "racy": ("racy", [("FB_RACY_FOR_TESTS", "1"), ("FB_STRIPED_FOR_TESTS", "1")]),
    "striped": ("striped", [("FB_STRIPED_FOR_TESTS", "1")]),
}


def _absolute_imports(text: str) -> str:
    # The copies are top-level modules: their relative imports must name the package.
    text = re.sub(r"^from \. import ", "from fastbreaker import ", text, flags=re.M)
    return re.sub(r"^from \.(\w+) (c?import) ", r"from fastbreaker.\1 \2 ", text, flags=re.M)


def build_racy(dest: pathlib.Path, kind: str = "racy") -> types.ModuleType:
    """A copy of the core, plus a client for it: by default the negative control (the core
    rebuilt with a non-atomic CAS and non-atomic stripe adds); ``kind="striped"`` is the core
    with striped counters on any build (see ``COPIES``).

    Returns a namespace with ``client`` (the client module), ``CircuitBreaker`` and
    ``RetryBudget`` (the copy's classes)."""
    prefix, macros = COPIES[kind]
    breaker_name = RACY_BREAKER.replace("racy", prefix)
    budget_name = RACY_BUDGET.replace("racy", prefix)
    client_name = RACY_CLIENT.replace("racy", prefix)
    src = core_source_dir()
    if src is None:
        raise FileNotFoundError("the core's .pyx sources are not available (wheel install?)")
    with _lock:
        dest.mkdir(parents=True, exist_ok=True)
        for core, copy in (("_breaker_c", breaker_name), ("_budget_c", budget_name)):
            for ext in (".pyx", ".pxd"):
                text = (src / (core + ext)).read_text(encoding="utf-8")
                (dest / (copy + ext)).write_text(_absolute_imports(text), encoding="utf-8")
        for part in src.glob("*.pxi"):  # the core's include files: found beside the copy
            text = part.read_text(encoding="utf-8")
            (dest / part.name).write_text(_absolute_imports(text), encoding="utf-8")
        client = CLIENT.read_text(encoding="utf-8")
        client = client.replace(
            "from fastbreaker._breaker_c cimport", f"from {breaker_name} cimport"
        )
        client = client.replace("from fastbreaker._budget_c cimport", f"from {budget_name} cimport")
        assert breaker_name in client and budget_name in client
        (dest / (client_name + ".pyx")).write_text(client, encoding="utf-8")
        _compile(
            dest,
            [
                (breaker_name, dest / (breaker_name + ".pyx"), macros),
                (budget_name, dest / (budget_name + ".pyx"), macros),
                (client_name, dest / (client_name + ".pyx"), []),
            ],
        )
        breaker_mod = _import(dest, breaker_name)
        budget_mod = _import(dest, budget_name)
        return types.SimpleNamespace(
            client=_import(dest, client_name),
            CircuitBreaker=breaker_mod.CircuitBreaker,
            breaker_module=breaker_mod,
            RetryBudget=budget_mod.RetryBudget,
        )


_built: dict[str, object] = {}


def cache_root() -> pathlib.Path:
    """Where cached test builds live: FB_TEST_BUILD_CACHE, else the checkout's build/ folder
    when it is writable, else a per-user temp folder."""
    env = os.environ.get("FB_TEST_BUILD_CACHE")
    if env:
        return pathlib.Path(env)
    checkout = HERE.parent.parent / "build"
    if os.access(checkout if checkout.exists() else checkout.parent, os.W_OK):
        return checkout / "test-ext"
    user = getattr(os, "getuid", lambda: 0)()
    return pathlib.Path(tempfile.gettempdir()) / f"fastbreaker-test-ext-{user}"


def source_digest(kind: str) -> str:
    """A hash of everything a build of ``kind`` depends on."""
    h = hashlib.sha256(kind.encode())
    # the test-time sources and build helpers; the package's C-level API and the core's
    # sources (not its .py files, nor the .c files its own build generates: they change nothing)
    folders = [(HERE, (".pyx", ".pxd", ".h", ".c", ".py")), (package_dir(), (".pxd", ".h"))]
    src = core_source_dir()
    if src is not None:
        folders.append((src, (".pyx", ".pxi", ".pxd", ".h")))
    for folder, suffixes in folders:
        for path in sorted(folder.iterdir()):
            if path.suffix in suffixes:
                h.update(path.name.encode() + b"\0" + path.read_bytes())
    import Cython

    for part in (
        sys.version,
        sys.executable,
        sysconfig.get_config_var("EXT_SUFFIX") or "",
        Cython.__version__,
        os.environ.get("FB_TEST_CFLAGS", ""),
        os.environ.get("FB_TEST_LDFLAGS", ""),
        os.environ.get("CC", ""),
    ):
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:16]


def cached_build(kind: str, build: Callable[[pathlib.Path], object]) -> object:
    """``build(dest)`` in the cache folder of ``kind``'s source digest, under a file lock: it
    compiles the first time and only imports afterwards (``_compile`` skips a complete build)."""
    from filelock import FileLock

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"{kind}-{source_digest(kind)}"
    with FileLock(str(dest) + ".lock"):
        if dest.exists() and not (dest / BUILT).exists():
            shutil.rmtree(dest)  # an interrupted build
        return build(dest)


def cached(kind: str, tmp_path_factory: object = None) -> types.ModuleType:
    """``build_client`` (``kind="client"``) or a copy of the core (``"racy"``, ``"striped"``)
    once per source hash (see ``cached_build``), imported once per process."""
    with _lock:
        if kind not in _built:
            try:
                _built[kind] = cached_build(
                    kind, build_client if kind == "client" else lambda d: build_racy(d, kind)
                )
            except BaseException as exc:  # remember the failure: later tests fail the same way
                _built[kind] = exc
        result = _built[kind]
    if isinstance(result, BaseException):
        raise result
    return result  # type: ignore[return-value]


def have_compiler() -> bool:
    """Cython and a C compiler are available (a downstream build is possible here)."""
    try:
        import Cython  # noqa: F401
        import setuptools  # noqa: F401
    except ImportError:
        return False
    if os.name == "nt":
        return True  # setuptools finds MSVC itself; a failure there is a real failure
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(os.environ.get("CC", cc).split()[0]) is not None
