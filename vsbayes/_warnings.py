"""Warnings that point at the user's line, not at the library's."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = ["reemit", "warn"]

_PACKAGE = str(Path(__file__).resolve().parent)


def _in_package(filename: str) -> bool:
    return filename.startswith(_PACKAGE)


def warn(message: str, category: type[Warning]) -> None:
    """Emit a warning attributed to the first calling frame outside vsbayes.

    A hard-coded ``stacklevel`` breaks whenever a call path changes, and on Python 3.12 a
    comprehension's frame is inlined (a warning once pointed at ``sys:1``). Walking the
    frames finds the user's line (or a third-party caller such as scikit-learn's
    ``cross_validate``) on every path and version; ``skip_file_prefixes`` (3.12+) would
    do the same but not on the older Pythons we support.
    """
    frame, level = sys._getframe(0), 1
    while frame is not None and _in_package(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def reemit(caught) -> None:
    """Emit again warnings recorded by ``warnings.catch_warnings(record=True)``, each at
    the place it was first attributed to."""
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
