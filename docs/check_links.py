"""Check the internal links of the built site: every ``href``/``src`` to a local page, file or
``#anchor`` must exist. External links (``http:``, ``https:``, ``mailto:``) are not fetched.

    python docs/check_links.py docs/_build/html

Exits 1 and prints each broken link (page, target) when one is found. Sphinx's own nitpicky
build (``-n -W``) already refuses unresolved cross-references and MyST heading links; this
catches what reaches the HTML by other ways (raw links, images, the theme's navigation).
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name"):
                self.ids.add(value)
            elif name in ("href", "src") and not (tag == "link" and "_static" in value):
                self.links.append(value)


def broken_links(root: Path) -> list[tuple[str, str]]:
    """``(page, link)`` for every internal link under ``root`` whose file or anchor is missing."""
    pages: dict[Path, _Page] = {}
    for path in sorted(root.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = page
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append((str(path.relative_to(root.resolve())), link))
                continue
            if parts.fragment and target.suffix == ".html":
                anchors = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in anchors:
                    broken.append((str(path.relative_to(root.resolve())), link))
    return broken


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    if not (root / "index.html").is_file():
        print(f"check_links: no built site at {root} (build it first)", file=sys.stderr)
        return 2
    broken = broken_links(root)
    for page, link in broken:
        print(f"{page}: broken link {link}", file=sys.stderr)
    count = sum(1 for _ in root.rglob("*.html"))
    print(f"check_links: {count} pages, {len(broken)} broken internal links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
