"""The site's link checker (``docs/check_links.py``, run by ``.ci/run docs`` on the built site)
finds a missing page, a missing anchor and a missing image, and passes a site without them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / "docs" / "check_links.py"

pytestmark = pytest.mark.skipif(not CHECKER.is_file(), reason="not a checkout: no docs/")


def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_links", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def site(tmp_path: Path, index: str) -> Path:
    (tmp_path / "patterns").mkdir()
    (tmp_path / "index.html").write_text(f"<html><body>{index}</body></html>")
    (tmp_path / "patterns" / "breaker.html").write_text(
        '<h1 id="circuit-breaker">x</h1><a href="../index.html#top">up</a>'
    )
    (tmp_path / "benchmark.png").write_bytes(b"png")
    return tmp_path


def test_a_good_site_passes(tmp_path: Path) -> None:
    root = site(
        tmp_path,
        '<a id="top" href="patterns/breaker.html#circuit-breaker">b</a><img src="benchmark.png">'
        '<a href="https://example.com/missing">external</a><a href="#top">self</a>',
    )
    assert checker().broken_links(root) == []
    assert checker().main(["check_links", str(root)]) == 0


@pytest.mark.parametrize(
    "link",
    [
        '<a href="patterns/missing.html">page</a>',
        '<a href="patterns/breaker.html#no-such-heading">anchor</a>',
        '<a href="#nowhere">own anchor</a>',
        '<img src="missing.png">',
    ],
)
def test_a_broken_link_is_found(tmp_path: Path, link: str) -> None:
    root = site(tmp_path, '<a id="top"></a>' + link)
    broken = checker().broken_links(root)
    assert len(broken) == 1 and broken[0][0] == "index.html"
    assert checker().main(["check_links", str(root)]) == 1
