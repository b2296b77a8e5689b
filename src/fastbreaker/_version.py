"""The version, read from the installed metadata: ``pyproject.toml`` holds the one version."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fastbreaker")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
