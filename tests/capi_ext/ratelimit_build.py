"""Build the RateLimiter C API client (``fb_capi_ratelimit.pyx``) at test time, against the
installed package and against a racy copy of ``_ratelimit_c`` (compiled with ``FB_RACY_FOR_TESTS``:
every compare-and-swap becomes a load + compare + store). Reuses the helpers of ``capi_ext``."""

from __future__ import annotations

import pathlib
import shutil
import types

from . import HERE, _absolute_imports, _compile, _import, _lock, core_source_dir

CLIENT = HERE / "fb_capi_ratelimit.pyx"
RACY_CORE = "_fb_racy_ratelimit"
RACY_CLIENT = "fb_capi_ratelimit_racy"


def build_client(dest: pathlib.Path) -> types.ModuleType:
    with _lock:
        dest.mkdir(parents=True, exist_ok=True)
        pyx = dest / "fb_capi_ratelimit.pyx"
        shutil.copyfile(CLIENT, pyx)
        _compile(dest, [("fb_capi_ratelimit", pyx, [])])
        return _import(dest, "fb_capi_ratelimit")


def build_racy(dest: pathlib.Path) -> types.SimpleNamespace:
    src = core_source_dir()
    if src is None or not (src / "_ratelimit_c.pyx").exists():
        raise FileNotFoundError("the core's .pyx sources are not available (wheel install?)")
    with _lock:
        dest.mkdir(parents=True, exist_ok=True)
        for ext in (".pyx", ".pxd"):
            text = (src / ("_ratelimit_c" + ext)).read_text(encoding="utf-8")
            (dest / (RACY_CORE + ext)).write_text(_absolute_imports(text), encoding="utf-8")
        client = CLIENT.read_text(encoding="utf-8")
        client = client.replace(
            "from fastbreaker._ratelimit_c cimport", f"from {RACY_CORE} cimport"
        )
        assert RACY_CORE in client
        (dest / (RACY_CLIENT + ".pyx")).write_text(client, encoding="utf-8")
        _compile(
            dest,
            [
                (RACY_CORE, dest / (RACY_CORE + ".pyx"), [("FB_RACY_FOR_TESTS", "1")]),
                (RACY_CLIENT, dest / (RACY_CLIENT + ".pyx"), []),
            ],
        )
        core = _import(dest, RACY_CORE)
        return types.SimpleNamespace(
            client=_import(dest, RACY_CLIENT), RateLimiter=core.RateLimiter
        )
