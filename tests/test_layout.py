"""The package's shape: compiled modules and their twins are siblings, never a chain.

A compiled module (``*_c.pyx``) imports no twin (``*_py.py``) and a twin imports no compiled
module; what both need lives in neutral modules (``_options``, ``_durations``, ``_calls``,
``_errors``, ...). The test reads the import statements of every module of the package.
"""

from __future__ import annotations

import ast
import os
import re

import fastbreaker

PKG = os.path.dirname(fastbreaker.__file__)
FROM_DOT = re.compile(r"^\s*from\s+\.([\w.]*)\s+c?import\s+(.+)$", re.M)


def local_imports(path: str) -> set[str]:
    """The fastbreaker modules that ``path`` imports (relative imports; names after 'from .')."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    found: set[str] = set()
    if path.endswith(".py"):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = node.module if isinstance(node, ast.ImportFrom) else None
                names = [mod] if mod else [a.name for a in node.names]  # type: ignore[union-attr]
                for name in names:
                    if name and name.startswith("fastbreaker."):
                        found.add(name.split(".")[1])
    else:  # .pyx / .pxd / .pxi
        for mod, names in FROM_DOT.findall(text):
            if mod:
                found.add(mod.split(".")[0])
            else:
                found.update(n.strip().split(" as ")[0] for n in names.strip("()").split(","))
    return found


def modules() -> dict[str, str]:
    out = {}
    for f in sorted(os.listdir(PKG)):
        if f.endswith((".py", ".pyx", ".pxd", ".pxi")):  # a .pxi: a compiled module's part
            out.setdefault(f.rsplit(".", 1)[0], os.path.join(PKG, f))
            if f.endswith(".pyx"):
                out[f.rsplit(".", 1)[0]] = os.path.join(PKG, f)
    return out


def test_compiled_modules_and_twins_do_not_import_each_other() -> None:
    chains = []
    for name, path in modules().items():
        for dep in local_imports(path):
            if name.endswith("_c") and dep.endswith("_py"):
                chains.append(f"{os.path.basename(path)} imports the twin {dep}")
            if name.endswith("_py") and dep.endswith("_c"):
                chains.append(f"{os.path.basename(path)} imports the compiled {dep}")
    assert not chains, chains


def test_the_import_reader_sees_imports() -> None:
    # the reader itself: it must find what these modules are known to import
    assert "_calls" in local_imports(os.path.join(PKG, "_breaker_c.pyx"))
    assert "_options" in local_imports(os.path.join(PKG, "_breaker_py.py"))
    assert "_select" in local_imports(os.path.join(PKG, "__init__.py"))


MAX_LINES = 1000


def source_files() -> list[str]:
    """Every source file of the package (the C that Cython generates is not source)."""
    out = []
    for folder, _dirs, files in os.walk(PKG):
        for f in files:
            if f.endswith((".py", ".pyx", ".pxd", ".pxi", ".pyi", ".h")):
                out.append(os.path.join(folder, f))
    return sorted(out)


def test_no_source_file_is_over_the_line_limit() -> None:
    long = {}
    for path in source_files():
        with open(path, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            long[os.path.relpath(path, PKG)] = n
    assert not long, f"over {MAX_LINES} lines: {long}"
    assert any(p.endswith("_breaker_state_c.pxi") for p in source_files())


def test_the_breaker_twin_state_machine_reads_in_one_short_module() -> None:
    with open(os.path.join(PKG, "_breaker_py.py"), encoding="utf-8") as fh:
        assert sum(1 for _ in fh) <= 800


PROTOCOL_PRIVATES = {"_permit_or_raise", "_finish", "_now", "_open_error", "_config", "_set_config"}


def private_uses(path: str) -> list[str]:
    """Private names of other fastbreaker modules that the module at ``path`` uses."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            for alias in node.names:
                if node.module is None:
                    modules.add(alias.asname or alias.name)  # from .. import _retry: a module
                elif alias.name.startswith("_"):
                    found.append(f"imports {alias.name} from {node.module}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                found.append(f"{node.value.id}.{node.attr}")
            elif node.attr in PROTOCOL_PRIVATES and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                found.append(f"<breaker>.{node.attr}")
    return found


def test_compat_and_contrib_use_no_private_name_of_another_module() -> None:
    bad = {}
    for sub in ("compat", "contrib"):
        folder = os.path.join(PKG, sub)
        for f in sorted(os.listdir(folder)):
            if f.endswith(".py"):
                uses = private_uses(os.path.join(folder, f))
                if uses:
                    bad[f"{sub}/{f}"] = sorted(set(uses))
    assert not bad, bad


def test_the_private_use_reader_sees_private_uses(tmp_path: object) -> None:
    import pathlib

    p = pathlib.Path(str(tmp_path)) / "m.py"
    p.write_text(
        "from .. import _retry\nfrom .._deadline import _current\n_retry._sleep(1)\nb._finish(1, 2)\n"
    )
    assert sorted(private_uses(str(p))) == [
        "<breaker>._finish",
        "_retry._sleep",
        "imports _current from _deadline",
    ]


def test_group_and_config_have_the_same_api_on_both_cores() -> None:
    impls = fastbreaker.testing.implementations()
    if "c" not in impls:
        import pytest

        pytest.skip("the compiled core is not in use")
    from fastbreaker import _breaker_c, _breaker_py

    def api(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    assert api(_breaker_c.Group) == api(_breaker_py.Group)
    g_c, g_py = _breaker_c.Group(0.5), _breaker_py.Group(0.5)
    for g in (g_c, g_py):
        g.add_size(4)
        assert (g.bound(), g.try_reserve(), g.try_reserve(), g.try_reserve()) == (
            2,
            True,
            True,
            False,
        )
        g.add_open(-1)
        assert (g.open, g.size, g.suppressed) == (1, 4, 1)
    assert api(_breaker_c.Config) == api(_breaker_py.Config)
