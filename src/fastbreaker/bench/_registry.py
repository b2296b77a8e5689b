"""The report's sections, in the order they are measured and printed.

A new section is one module defining a ``SECTION`` (see ``_section.Section``) plus its line
here. The first section's results are the top level of the report's JSON (schema 1); every
further section's are under ``"sections"``, by key.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import _breakers, _bulkheads, _paths, _ratelimits
from ._section import Section

SECTIONS: list[Section] = [
    _breakers.SECTION,
    _bulkheads.SECTION,
    _paths.SECTION,
    _ratelimits.SECTION,
]


def section_results(result: Mapping[str, Any]) -> list[tuple[Section, Mapping[str, Any]]]:
    """Each registered section with its part of ``result`` (``rows``, ``skipped``, ...)."""
    first, *rest = SECTIONS
    more = result.get("sections", {})
    return [(first, result)] + [(s, more[s.key]) for s in rest if s.key in more]
