"""Warnings that point at the user's line, not at the library's."""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings
from pathlib import Path

__all__ = ["each_once", "reemit", "warn"]

_PACKAGE = str(Path(__file__).resolve().parent)
# The directory with its separator: a bare prefix also matched a sibling such as a user's
# "vsbayes_study/", whose frames then counted as the package's (the whole-stack walk of
# warn would skip the user's line for the caller of theirs). The path as imported beside
# the resolved one: the frames' file names are the import's, which a symlink leaves
# unresolved.
_PREFIXES = tuple(
    dict.fromkeys(
        os.path.join(directory, "") for directory in (_PACKAGE, os.path.dirname(__file__))
    )
)


def _in_package(filename: str) -> bool:
    return filename.startswith(_PREFIXES)


def warn(message: str, category: type[Warning]) -> None:
    """Emit a warning attributed to the caller of the outermost vsbayes frame.

    A hard-coded ``stacklevel`` breaks whenever a call path changes, and on Python 3.12 a
    comprehension's frame is inlined (a warning once pointed at ``sys:1``). Walking the
    frames finds the user's line (or a third-party caller such as scikit-learn's
    ``cross_validate``) on every path and version; ``skip_file_prefixes`` (3.12+) would
    do the same but not on the older Pythons we support. The walk goes past third-party
    frames that vsbayes itself called back through (SciPy's ``minimize_scalar`` running
    ``EmpiricalBayesClassifier``'s objective): the first frame outside the package would
    be SciPy's, a line the user never wrote, and the ``"default"`` filter would show
    such a warning once per SciPy line, not once per call of the user's.
    """
    frame, level, outermost = sys._getframe(0), 1, 1
    while frame is not None:
        if _in_package(frame.f_code.co_filename):
            outermost = level
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=outermost + 1)


def reemit(caught, *, once: bool = False) -> None:
    """Emit again warnings recorded by ``warnings.catch_warnings(record=True)``, each at
    the place it was first attributed to.

    ``once`` drops repeats of a warning (the same category, text and place): a
    meta-estimator's many inner fits each warn alike, and the ``"default"`` filter cannot
    drop the repeats itself, because every ``catch_warnings`` inside a fit resets its
    record of what was shown.
    """
    shown = set()
    modules: dict = {}
    for w in caught:
        key = (w.category, str(w.message), w.filename, w.lineno)
        if once and key in shown:
            continue
        shown.add(key)
        if w.filename not in modules:
            modules[w.filename] = _module_of(w.filename)
        warnings.warn_explicit(
            w.message, w.category, w.filename, w.lineno, module=modules[w.filename]
        )


def _module_of(filename: str) -> str | None:
    """The name of the module whose file is ``filename``: what a filter's ``module``
    matches, as ``warnings.warn`` gives it (the frame's ``__name__``: ``"__main__"``
    for a script). The record keeps only the file, and ``warn_explicit`` without a
    module matches the filters against the file's path less ".py", so that a user's
    ``filterwarnings("ignore", module="__main__")`` let re-emitted warnings through
    (D-217). None where no imported module has that file (a notebook's cell): the path,
    as before."""
    for name, module in list(sys.modules.items()):
        # (not through a module's own attribute access: a lazily imported one, such as
        # importlib's LazyLoader makes, would be imported by the look)
        if (
            isinstance(module, types.ModuleType)
            and type(module).__getattribute__ is types.ModuleType.__getattribute__
            and module.__dict__.get("__file__") == filename
        ):
            return name
    return None


@contextlib.contextmanager
def each_once():
    """Show each distinct warning of the block once, at its end (also when it raises).

    For loops of fits that warn alike (one-vs-rest's problems, an evidence search's
    grid): one call of the user's is one warning. The block's warnings are recorded and
    re-emitted through the user's own filters, so an ``"error"`` filter still raises,
    after the block instead of inside it.
    """
    recorded: list = []
    try:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            yield
    finally:
        reemit(recorded, once=True)
