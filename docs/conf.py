"""Sphinx configuration: MyST Markdown pages, the furo theme, and an API reference generated
from the pure-Python twins' docstrings (the specification).

Build (strict, as ``.ci/run docs`` does)::

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Document the pure-Python twins: set before anything imports fastbreaker, so that
# ``fastbreaker.CircuitBreaker`` is ``fastbreaker._breaker_py.CircuitBreaker`` and friends.
os.environ["FASTBREAKER_NO_EXTENSIONS"] = "1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import fastbreaker  # noqa: E402

project = "fastbreaker"
author = "fastbreaker developers"
copyright = "fastbreaker developers, MIT licence"
release = fastbreaker.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: ``(label)=`` targets, ``{eval-rst}`` blocks, and anchors for every heading up to h3 so
# that ``[text](page.md#a-heading)`` links are checked by the build.
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3

# Every reference must resolve (-n / nitpicky). Names below are private modules' type aliases
# and typing constructs that autodoc writes into signatures; they have no page of their own.
nitpicky = True
# A name that a module imports only for type checkers stays a bare string in its signature
# ("CircuitBreaker"), which matches fastbreaker's class and the compat classes: the first
# match, fastbreaker's own, is the one meant.
suppress_warnings = ["ref.python"]
nitpick_ignore_regex = [
    (r"py:.*", r"fastbreaker\._.*"),
    (r"py:.*", r"fastbreaker\.contrib\._.*"),
    (r"py:.*", r"(typing|collections\.abc|types|contextlib|concurrent\.futures)\..*"),
    (r"py:.*", r"(P|T|R|K|V|E|F|Y|S|SendT|ReturnT|Seconds|Duration|ExcTypes|On|OnRetry|Budget)"),
    (r"py:.*", r"(httpx|redis|prometheus_client|opentelemetry|starlette)(\..*)?"),
    (r"py:.*", r"(pybreaker|circuitbreaker)(\..*)?"),
    # the standard library: the build reads no inventories (it must work offline)
    (r"py:.*", r"(datetime|enum|threading|asyncio|weakref|logging|collections|os|re)\..*"),
    (r"py:.*", r"Callable\[.*"),
    (r"py:.*", r"(FailurePredicate|Meter|ObservableCounter|ObservableGauge|Clock|RateSpec)"),
    (r"py:.*", r"(limits|flask|flask_limiter|slowapi)(\..*)?"),
    (r"py:.*", r"Limit"),  # limits.limits.RateLimitItem, as limits names it in its signatures
    (r"py:.*", r"fastbreaker\.(contrib|compat)\.\w+\.(T|_\w+)"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"fastbreaker {release}"
html_static_path: list[str] = []
# Unlabelled blocks are API summaries and tables, not code: no guessed highlighting.
highlight_language = "text"
pygments_style = "friendly"
pygments_dark_style = "monokai"
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

_SECTIONS = {"Args:", "Arguments:", "Returns:", "Raises:", "Yields:", "Example:", "Examples:"}
_UNDERLINE = set("-=~^")


def _rst_from_plain(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """Adapt docstrings written for ``help()`` to reStructuredText, in place, before napoleon:
    a section title inside a docstring becomes a rubric (sections cannot nest in an API entry),
    and a paragraph ending in ``:`` followed by an indented block introduces a literal block."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        under = nxt.strip()
        if (
            line.strip()
            and not line.startswith(" ")
            and len(under) >= 3
            and set(under) <= _UNDERLINE
            and len(under) >= len(line.strip())
        ):
            out += [f".. rubric:: {line.strip()}", ""]
            i += 2
            continue
        if (
            line.rstrip().endswith(":")
            and not line.rstrip().endswith("::")
            and line.strip() not in _SECTIONS
            and nxt.strip() == ""
            and i + 2 < len(lines)
            and len(lines[i + 2]) - len(lines[i + 2].lstrip()) > len(line) - len(line.lstrip())
        ):
            out.append(line.rstrip() + ":")
            i += 1
            continue
        out.append(line)
        i += 1
    lines[:] = out


def setup(app: object) -> None:
    from sphinx.ext import napoleon

    # napoleon reads a property's first line "Text: more" as "type: description"; the twins'
    # property docstrings are prose, so napoleon sees only functions, classes and modules.
    def google_sections(
        app: object, what: str, name: str, obj: object, options: object, lines: list[str]
    ) -> None:
        if what not in ("property", "attribute", "data"):
            napoleon._process_docstring(app, what, name, obj, options, lines)  # type: ignore[arg-type]

    listeners = app.events.listeners["autodoc-process-docstring"]  # type: ignore[attr-defined]
    for listener in list(listeners):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)  # type: ignore[attr-defined]
    app.connect("autodoc-process-docstring", _rst_from_plain, priority=400)  # type: ignore[attr-defined]
    app.connect("autodoc-process-docstring", google_sections, priority=500)  # type: ignore[attr-defined]
