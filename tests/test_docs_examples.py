"""Every Python code block of the documentation site (``docs/**/*.md``) and of README.md runs.

Each page is one test: its blocks run in order in one namespace, as a reader would run them,
with the core that ``import fastbreaker`` selects (the pure leg, ``FASTBREAKER_NO_EXTENSIONS=1``,
runs them on the twin). Blocks are found by sybil's MyST parser: fenced ```` ```python ````
blocks and ``{code-block} python`` directives; ``<!-- skip: next -->`` comments (none today)
would be visible in the page source. A page that needs a service gets it here, and says so in
its text: the fleet page a ``redis-server`` on a free port (``REDIS_URL``).

sybil is in the ``test`` extra: without it this module fails to import, loudly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sybil.document import Document
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts) + [ROOT / "README.md"]
#: pages whose examples talk to a Redis server (started for them)
NEEDS_REDIS = {"docs/patterns/fleet.md", "docs/integrations/redis.md"}

pytestmark = [
    pytest.mark.thread_unsafe(reason="examples start servers and share module state"),
    pytest.mark.skipif(not DOCS.is_dir(), reason="not a checkout: no docs/"),
]


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def examples(path: Path) -> Document:
    return Document.parse(str(path), PythonCodeBlockParser(), SkipParser())


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_page_examples_run(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = examples(path)
    found = list(document)
    if page_id(path) in NEEDS_REDIS:
        from fleet_support import RedisServer

        server = RedisServer().start()
        monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{server.port}/0")
    else:
        server = None
    monkeypatch.chdir(ROOT)
    try:
        for example in found:
            example.evaluate()
    finally:
        if server is not None:
            server.stop()


def test_the_pages_have_examples() -> None:
    # The collector must see the blocks (a parser that finds nothing would pass every page).
    counts = {page_id(p): len(list(examples(p))) for p in PAGES}
    assert counts["docs/tutorial.md"] >= 5
    assert counts["README.md"] >= 1
    assert sum(counts.values()) >= 40, counts
