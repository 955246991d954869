"""Warnings that point at the user's line, not at the library's; a fit's warnings
recorded in its own thread (:func:`catch`)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["carried", "catch", "each_once", "reemit", "reemit_alike", "warn"]

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


def warn(message: str, category: type[Warning], *, now: bool = False) -> None:
    """Emit a warning attributed to the caller of the outermost vsbayes frame.

    ``now``: shown as it is raised, past the fit's open :func:`catch` blocks, through the
    user's filters, rather than recorded for the block's end (:func:`each_once` shows a
    fit's warnings when it ends): for a warning that a long computation is about to start,
    which is worth nothing once it has ended. The fit's decisions do not see it.

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
    capture = _capture.get()
    if capture is None or now:
        # (outside every block: the _InBlock filter matches nothing, and _dispatch hands
        # what the user's filters let through to the hook it replaced)
        token = _capture.set(None)
        try:
            warnings.warn(message, category, stacklevel=outermost + 1)
        finally:
            _capture.reset(token)
        return
    # Inside a catch block: handed to it here, not through the process's filters (which
    # another library's catch_warnings in another thread may have swapped): a fit's
    # decisions read what its block recorded. (The frame warnings.warn would take.)
    try:
        frame = sys._getframe(outermost)
    except ValueError:  # no caller: warnings.warn's fallback
        _deliver(capture, category(message), "sys", 1, None)
    else:
        _deliver(capture, category(message), frame.f_code.co_filename, frame.f_lineno, frame)


def reemit(caught, *, once: bool = False) -> None:
    """Emit again warnings recorded by :func:`catch` (or ``warnings.catch_warnings``)
    with ``record=True``, each at the place it was first attributed to: into the
    enclosing block if one is open, else through the user's filters.

    ``once`` drops repeats of a warning (the same category, text and place): a
    meta-estimator's many inner fits each warn alike, and the ``"default"`` filter cannot
    drop the repeats itself, because every block inside a fit resets its record of what
    was shown. Without a registry of its own, the ``"default"`` filter shows a fit's
    warning again at the next fit from the same line, as scikit-learn's own fits'
    warnings show again (D-218).
    """
    shown = set()
    modules: dict = {}
    capture = _capture.get()
    for w in caught:
        key = (w.category, str(w.message), w.filename, w.lineno)
        if once and key in shown:
            continue
        shown.add(key)
        message = w.message if isinstance(w.message, Warning) else w.category(w.message)
        if capture is not None:  # into the enclosing block
            _deliver(capture, message, w.filename, w.lineno, None, w.source)
            continue
        if w.filename not in modules:
            modules[w.filename] = _module_of(w.filename)
        warnings.warn_explicit(
            message, w.category, w.filename, w.lineno, module=modules[w.filename]
        )


#: A number in a warning's text (an integer, a decimal, a float in exponent notation).
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def reemit_alike(records, names) -> None:
    """Re-emit the warnings recorded by several alike blocks (one-vs-rest's problems, the
    i-th block's ``records[i]`` about ``names[i]``), those whose texts differ only in
    their numbers once: the first block's, naming the blocks alike (D-248).

    One-vs-rest's problems warn alike with other figures (each Newton's predicted gain,
    each EP's last site change): ``each_once`` keeps distinct texts, so a fit of K classes
    showed K warnings that did not say which class each was about.
    """
    groups: dict = {}
    for name, caught in zip(names, records, strict=True):
        for w in caught:
            key = (w.category, _NUMBER.sub("#", str(w.message)), w.filename, w.lineno)
            groups.setdefault(key, []).append((name, w))
    merged = []
    for members in groups.values():
        first_name, first = members[0]
        others = list(dict.fromkeys(n for n, _ in members[1:] if n != first_name))
        if others:
            alike = ", ".join(map(str, others))
            text = (
                f"{first.message} (Class {first_name}'s problem of the one-vs-rest fit; "
                f"those of classes {alike} warned alike, with other figures.)"
            )
            first = warnings.WarningMessage(
                first.category(text),
                first.category,
                first.filename,
                first.lineno,
                source=first.source,
            )
        merged.append(first)
    reemit(merged, once=True)


def _module_of(filename: str) -> str:
    """The name of the module whose file is ``filename``: what a filter's ``module``
    matches, as ``warnings.warn`` gives it (the frame's ``__name__``: ``"__main__"``
    for a script). The record keeps only the file, and ``warn_explicit`` without a
    module matches the filters against the file's path less ".py", so that a user's
    ``filterwarnings("ignore", module="__main__")`` let re-emitted warnings through
    (D-217). Where no imported module has that file (a notebook's cell, ``python -c``'s
    ``"<string>"``, the REPL's ``"<stdin>"``): the ``__name__`` of a frame of that file on
    the stack (the user's call of the fit: ``"__main__"`` for a cell, as ``warnings.warn``
    gives the fit's own warnings there; D-231), else that path less ".py", as
    ``warn_explicit`` derives it. Never None: ``warn_explicit`` drops a warning whose
    module is None (CPython's guard for warnings during shutdown), which lost every
    re-emitted warning of a fit run from a notebook or ``python -c``."""
    for name, module in list(sys.modules.items()):
        # (not through a module's own attribute access: a lazily imported one, such as
        # importlib's LazyLoader makes, would be imported by the look)
        if (
            isinstance(module, types.ModuleType)
            and type(module).__getattribute__ is types.ModuleType.__getattribute__
            and module.__dict__.get("__file__") == filename
        ):
            return name
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == filename:
            return frame.f_globals.get("__name__", "<string>")  # (as warnings.warn's)
        frame = frame.f_back
    if not filename:
        return "<unknown>"
    return filename[:-3] if filename[-3:].lower() == ".py" else filename


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
        with catch(("always", Warning), record=True) as recorded:
            yield
    finally:
        reemit(recorded, once=True)


# --- catch: warnings.catch_warnings for one thread (D-218) ----------------------------------
#
# Before Python 3.14, catch_warnings replaces the process's warnings.filters and
# showwarning on entry and puts back what it found on exit: two fits in threads whose blocks
# do not nest (the first enters, the second, the first leaves, the second) leave the first's
# state installed for good, and every later warning of the process goes to its dead record.
# A fit's block also recorded the other threads' warnings, which its decisions then read
# (another fit's ConvergenceWarning taken as its own Newton's). catch installs instead, once
# while any block is open, two hooks that read the block of the current context: a filter
# first in warnings.filters whose message pattern matches only in a thread inside a block
# (its action "always" hands the warning on), and warnings._showwarnmsg (the hook
# catch_warnings never swaps), which gives the block's filters their say, then the user's,
# and records what passes. vsbayes's own warnings (warn, reemit) go to the block directly.

#: The innermost open block of this context (a thread's own: threads start without one).
_capture: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar(
    "vsbayes_warnings_capture", default=None
)
_local = threading.local()  # this thread's warning in flight: intercepted, or re-dispatched
_lock = threading.Lock()
_open = 0  # blocks open in the process
_shown_before: Callable | None = None  # warnings._showwarnmsg before _dispatch took its place
_holders: list[list] = []  # the filter lists the filter went into while blocks were open


class _Capture:
    """One block: its filters, first match first, then its parents'; its record, or its
    innermost recording parent's (None: warnings that pass are shown)."""

    __slots__ = ("filters", "log", "parent")

    def __init__(self, filters: tuple, parent: _Capture | None, log: list | None):
        self.filters = filters
        self.parent = parent
        self.log = log if log is not None or parent is None else parent.log

    def action(self, category: type[Warning], text: str) -> str | None:
        capture = self
        while capture is not None:
            for action, cls, message in capture.filters:
                if issubclass(category, cls) and (message is None or message.match(text)):
                    return action
            capture = capture.parent
        return None


class _InBlock:
    """The message pattern of the filter that hands a warning raised inside a block to
    :func:`_dispatch`: it matches only in such a thread (a filter's pattern is any object
    with ``match``)."""

    def match(self, text: str) -> bool:
        if (
            _capture.get() is None
            or getattr(_local, "redispatched", False)
            or warnings._showwarnmsg is not _dispatch
        ):
            return False
        _local.intercepted = text
        return True

    #: What code that rebuilds filters from their patterns (scikit-learn's Parallel hands
    #: the filters to its workers so) reads: a pattern that matches nothing, an inert filter.
    pattern = "(?!)"

    def __repr__(self) -> str:
        return "<a vsbayes fit's warnings, in its thread>"


_IN_BLOCK = ("always", _InBlock(), Warning, None, 0)


def _dispatch(msg: warnings.WarningMessage) -> None:
    """``warnings._showwarnmsg`` while a block is open, in every thread."""
    text, _local.intercepted = getattr(_local, "intercepted", None), None
    capture = _capture.get()
    if capture is not None and text is not None and text == str(msg.message):
        frame = _frame_at(msg.filename, msg.lineno)
        _deliver(capture, msg.message, msg.filename, msg.lineno, frame, msg.source)
    elif getattr(_local, "redispatched", False) and _local.log is not None:
        _local.log.append(msg)  # the user's filters let it through, into the block's record
    else:
        _shown_before(msg)


def _frame_at(filename: str, lineno: int) -> types.FrameType | None:
    """The frame a third party's warning is attributed to (its module's registry, for the
    user's "default" filter, as warnings.warn used it), if on this stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_lineno == lineno and frame.f_code.co_filename == filename:
            return frame
        frame = frame.f_back
    return None


def _deliver(capture: _Capture, message: Warning, filename: str, lineno: int, frame, source=None):
    """A warning raised inside ``capture``: its filters decide, else the user's, as
    catch_warnings's copy of them would have; what passes goes to its record."""
    category = type(message)
    action = capture.action(category, str(message))
    if action == "ignore":
        return
    if action == "always":
        shown = warnings.WarningMessage(message, category, filename, lineno, source=source)
        if capture.log is not None:
            capture.log.append(shown)
        else:
            _shown_before(shown)
        return
    if frame is None:
        module, registry, module_globals = _module_of(filename), None, None
    else:
        module_globals = frame.f_globals
        module = module_globals.get("__name__", "<string>")
        registry = module_globals.setdefault("__warningregistry__", {})
    before = getattr(_local, "redispatched", False), getattr(_local, "log", None)
    _local.redispatched, _local.log = True, capture.log
    try:  # (an "error" filter raises here, where the warning was raised)
        warnings.warn_explicit(
            message, category, filename, lineno, module, registry, module_globals, source=source
        )
    finally:
        _local.redispatched, _local.log = before


def _opened() -> None:
    global _open, _shown_before
    with _lock:
        if warnings._showwarnmsg is not _dispatch:
            _shown_before = warnings._showwarnmsg
            warnings._showwarnmsg = _dispatch
        # In place: whoever holds the list keeps it. (Another thread's catch_warnings may
        # have replaced it: each list it went into is kept, to take it out of.) By single
        # list operations, each atomic: another thread's filterwarnings between two of them
        # is kept; a list rebuilt from a copy lost it, or doubled a filter beside it.
        filters = warnings.filters
        if not filters or filters[0] is not _IN_BLOCK:
            _take_out(filters)
            filters.insert(0, _IN_BLOCK)
        if not any(held is filters for held in _holders):
            _holders.append(filters)
        _open += 1
        _mutated()


def _closed() -> None:
    global _open
    with _lock:
        _open -= 1
        if _open == 0:
            for filters in (*_holders, warnings.filters):
                _take_out(filters)
            _holders.clear()
            if warnings._showwarnmsg is _dispatch:
                warnings._showwarnmsg = _shown_before
        _mutated()


def _take_out(filters: list) -> None:
    # (list.remove compares by ==: no filter equals _IN_BLOCK but itself, its pattern being
    # an _InBlock, which equals only itself)
    while True:
        try:
            filters.remove(_IN_BLOCK)
        except ValueError:
            return


def _mutated() -> None:
    # As catch_warnings on entry and exit: the modules' records of the warnings the
    # "default" filter has shown start again (single-threaded fits show what they showed).
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()


@contextlib.contextmanager
def catch(*filters: tuple, record: bool = False) -> Iterator[list | None]:
    """``warnings.catch_warnings`` for the calling thread: ``with catch(("always",
    ConvergenceWarning), record=True) as caught`` as ``with
    warnings.catch_warnings(record=True) as caught: warnings.simplefilter("always",
    ConvergenceWarning)``, without replacing the process's filters and hooks, which
    threads share.

    Each filter is ``(action, category)`` or ``(action, category, message)``, ``action``
    "always" or "ignore", ``message`` a pattern the text must start with (any case), as
    :func:`warnings.filterwarnings`'s. Warnings the block's filters (then its enclosing
    blocks') do not match meet the user's, as inside catch_warnings's copy of them (an
    "error" filter raises where the warning is raised). The block covers its thread and
    the pool threads :func:`carried` functions run on, not the other threads of the
    process.
    """
    parsed = []
    for action, category, *message in filters:
        if action not in ("always", "ignore"):
            raise ValueError(f"catch's actions are 'always' and 'ignore'; got {action!r}.")
        parsed.append((action, category, re.compile(message[0], re.I) if message else None))
    log: list | None = [] if record else None
    _opened()
    token = _capture.set(_Capture(tuple(parsed), _capture.get(), log))
    try:
        yield log
    finally:
        try:
            _capture.reset(token)
        finally:  # (a block left in another context: reset raises; the hooks still go)
            _closed()


def carried(func: Callable) -> Callable:
    """``func``, run in any thread inside the calling thread's open blocks (the blocks of a
    fit's pool threads, as catch_warnings's process-wide record covered them)."""
    capture = _capture.get()
    if capture is None:
        return func

    def run(*args, **kwargs):
        token = _capture.set(capture)
        try:
            return func(*args, **kwargs)
        finally:
            _capture.reset(token)

    return run
