"""The progress of a fit's iterative stages, for whoever observes it (scikit-learn's callbacks).

A fit with callbacks sets an *observer* for its duration (:func:`observed`); the solvers'
loops — Newton's method for the mode, EP's sweeps, the global VS fit — open a
:func:`stage` and report each of their iterations to it, with the state reached as a
function called only if an observer asks for it. Without an observer (every fit without
callbacks) a stage is one context-variable lookup and the loops' reports are skipped: the
solvers do not know who watches, and pay nothing when nobody does.

An observer has one method, ``stage(name, step_name, max_steps) -> context manager`` yielding
an object with ``begin(state)``, ``end(state)`` (one iteration's boundaries) and
``result(state)`` (the stage's outcome, reported once its last iteration has ended);
``state`` is None or a function returning the posterior reached there: a Gaussian whose
``log_Z`` is the log evidence, or a ``(mean, cov)`` pair (evidence unknown).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["mapped_states", "observed", "stage"]

# A context variable, not a module global: fits in other threads (joblib's threading
# backend, cross-validation) each see their own observer, or none.
_OBSERVER: ContextVar[Any] = ContextVar("vsbayes_fit_observer", default=None)


@contextmanager
def observed(observer) -> Iterator[None]:
    """Report the stages run inside the block to ``observer`` (None: to nobody)."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


@contextmanager
def stage(name: str, step_name: str, max_steps: int | None = None) -> Iterator[Any]:
    """An iterative stage (``name``; its iterations ``step_name``, at most ``max_steps``,
    None: unknown): yields the observer's stage object, or None when nobody observes (then
    report nothing)."""
    observer = _OBSERVER.get()
    if observer is None:
        yield None
        return
    with observer.stage(name, step_name, max_steps) as steps:
        yield steps


@contextmanager
def mapped_states(transform) -> Iterator[None]:
    """Report the states of the stages run inside the block through ``transform``: a state
    (a Gaussian or a ``(mean, cov)`` pair) in the coordinates the solver works in -> one in
    the coordinates the observer expects (the multinomial posterior's contrasts -> its
    coefficients)."""
    observer = _OBSERVER.get()
    if observer is None:
        yield
        return
    token = _OBSERVER.set(_MappedObserver(observer, transform))
    try:
        yield
    finally:
        _OBSERVER.reset(token)


class _MappedObserver:
    def __init__(self, observer, transform) -> None:
        self._observer, self._transform = observer, transform

    @contextmanager
    def stage(self, name: str, step_name: str, max_steps: int | None = None):
        with self._observer.stage(name, step_name, max_steps) as steps:
            yield _MappedSteps(steps, self._transform)


class _MappedSteps:
    def __init__(self, steps, transform) -> None:
        self._steps, self._transform = steps, transform

    def _mapped(self, state):
        if state is None:
            return None
        transform = self._transform

        def mapped():
            return transform(state())

        return mapped

    def begin(self, state=None):
        return self._steps.begin(self._mapped(state))

    def end(self, state=None):
        return self._steps.end(self._mapped(state))

    def result(self, state=None):
        return self._steps.result(self._mapped(state))
