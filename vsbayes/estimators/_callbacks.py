"""scikit-learn's callbacks (``sklearn.callback``, experimental in scikit-learn 1.9) on a fit.

``set_callbacks`` comes from scikit-learn's ``CallbackSupportMixin`` where scikit-learn has
it (1.9 on); with an older scikit-learn the estimators have no ``set_callbacks``, as
LogisticRegression has none there. A fit with callbacks (or inside a meta-estimator that
propagates its own) reports its task tree to them:

- the root task, ``fit``, as every scikit-learn estimator's;
- one task per one-vs-rest problem (``one-vs-rest problem: class <label>``) when there are
  several (a binary or a multinomial fit is one problem: its stages hang from the root);
- one task per iterative *stage* the method runs, in order: "Newton's method for the mode"
  (the Laplace approximation), "expectation propagation", "variational sampling",
  "importance sampling", "Bayesian Monte Carlo";
- one leaf per iteration of a stage: ``newton iteration``, ``EP sweep``, ``round``.

Each iteration's hooks get the ``fitted_estimator`` the fit would be had it stopped there
(the Laplace approximation at a Newton iterate — exactly what ``max_iter`` iterations give —,
the posterior of EP's sites after a sweep, a round's fit; the problems not yet reached at
their prior), and a stage's end hook the stage's result. The solvers report through
:mod:`vsbayes._progress`; without callbacks nothing is reported and nothing is computed.
A hook's request to stop is not acted on (as LogisticRegression's in scikit-learn 1.9).
"""

from __future__ import annotations

import builtins
from contextlib import contextmanager

import numpy as np

from ..gaussian import Gaussian, StructuredGaussian
from ._methods import MethodFit

try:  # scikit-learn >= 1.9
    from sklearn.callback import CallbackSupportMixin
except ImportError:  # older: no callback API, and no set_callbacks

    class CallbackSupportMixin:  # type: ignore[no-redef]
        """Nothing: this scikit-learn has no callback API."""


__all__ = ["CallbackSupportMixin", "FitObserver", "prior_fit"]


class FitObserver:
    """The task tree of one fit, for its callbacks; made by :meth:`start` (None: nobody
    watches). The estimator tells it each problem (:meth:`problem`) and each problem's fit
    (:meth:`done`); the solvers' stages come through :mod:`vsbayes._progress`."""

    def __init__(self, estimator, root, hook_data: dict, store):
        self._estimator = estimator
        self._root = root
        self._data = hook_data
        self._store = store
        self._problem_ctx = None
        self._stages: list = []  # the open stages' contexts, innermost last
        self._fits: list[MethodFit] = []  # the problems fitted so far
        self._finish = None  # the current problem's MethodFit -> the stored one
        self._pending = None  # k -> the prior fit of problem k (not reached yet)
        self._n_problems, self._labels = 1, None

    @classmethod
    def start(cls, estimator, X, y, sample_weight, n_problems: int, labels, store):
        """The observer of ``estimator``'s fit (which has callbacks, or a meta-estimator's
        context), its root task begun; None without scikit-learn's callback API.
        ``store(fits) -> dict`` makes the fitted attributes of a list of per-problem fits."""
        if not hasattr(estimator, "_init_callback_context"):  # scikit-learn < 1.9
            return None
        metadata = None if sample_weight is None else {"sample_weight": sample_weight}
        root = estimator._init_callback_context(max_subtasks=n_problems if n_problems > 1 else None)
        data = {"X": X, "y": y, "metadata": metadata}
        root.call_on_fit_task_begin(estimator=estimator, **data)
        observer = cls(estimator, root, data, store)
        observer._n_problems, observer._labels = n_problems, labels
        return observer

    # --- the estimator's side ----------------------------------------------------------

    @contextmanager
    def problem(self, index: int, finish, pending):
        """Problem ``index`` runs inside the block; ``finish(fit)`` turns its raw fits into
        stored ones (e.g. the multinomial's representative); ``pending(k)`` is problem
        ``k``'s prior fit, for the problems not reached yet."""
        self._finish, self._pending = finish, pending
        if self._n_problems == 1:
            yield
            return
        label = self._labels[index]
        self._problem_ctx = self._root.subcontext(
            task_name=f"one-vs-rest problem: class {label!r}", max_subtasks=None
        )
        self._problem_ctx.call_on_fit_task_begin(estimator=self._estimator, **self._data)
        yield
        fits = self._fits
        self._problem_ctx.call_on_fit_task_end(
            estimator=self._estimator,
            **self._data,
            reconstruction_attributes=lambda: self._attributes((fits[-1], True), done=True),
        )
        self._problem_ctx = None

    def done(self, fit: MethodFit) -> None:
        """Problem's stored fit (after ``finish``)."""
        self._fits.append(fit)

    def end(self) -> None:
        """The root task's end: the fitted estimator is the estimator itself."""
        self._root.call_on_fit_task_end(
            estimator=self._estimator, **self._data, reconstruction_attributes={}
        )

    @staticmethod
    def teardown(estimator) -> None:
        """The callbacks' ``teardown``, however the fit ended, and the fit's context
        removed: what scikit-learn's ``with_callbacks`` does, here so that the fit's
        frames stay the package's (its warnings point at the caller's line)."""
        context = estimator.__dict__.pop("_callback_fit_ctx", None)
        callbacks = estimator.__dict__.pop("_skl_callbacks_to_teardown", [])
        errors = []
        for callback in callbacks:
            try:
                callback.teardown(estimator=estimator, context=context)
            except Exception as error:  # every callback is torn down; then the errors
                errors.append(error)
        group = getattr(builtins, "ExceptionGroup", None)  # Python >= 3.11
        if len(errors) == 1 or (errors and group is None):
            raise errors[0]
        if errors:
            raise group("The following callback teardown errors occurred", errors)

    # --- the solvers' side (vsbayes._progress) -----------------------------------------

    @contextmanager
    def stage(self, name: str, step_name: str, max_steps: int | None):
        parent = self._stages[-1] if self._stages else self._problem_ctx or self._root
        # No bound on the subtasks: max_steps (max_iter) is rarely reached, and a progress
        # bar against it would mislead; a stage may also hold another (e.g. Newton in EP).
        context = parent.subcontext(task_name=name, max_subtasks=None)
        context.call_on_fit_task_begin(estimator=self._estimator, **self._data)
        steps = _Steps(self, context, name, step_name)
        self._stages.append(context)
        failed = True
        try:
            yield steps
            failed = False
        finally:
            # Every task begun ends, also when the stage raises (e.g. an EP that the
            # route catches and replaces): then without a fitted estimator.
            self._stages.pop()
            steps.end(None, only_if_open=True)
            outcome = None if failed else self._lazy(steps.outcome, name, None)
            context.call_on_fit_task_end(
                estimator=self._estimator, **self._data, reconstruction_attributes=outcome
            )

    def _lazy(self, state, stage: str, step: int | None):
        """The hook's ``reconstruction_attributes``: a function, called only if a callback
        asks for ``fitted_estimator``; None where there is no state."""
        if state is None:
            return None
        return lambda: self._attributes(self._state_fit(state(), stage, step), done=False)

    def _state_fit(self, state, stage: str, step: int | None) -> MethodFit:
        """A state reported by a solver as the current problem's stored fit."""
        if isinstance(state, tuple):  # (mean, cov): no evidence
            gaussian = Gaussian(state[0], state[1])
            evidence = False
        else:
            gaussian, evidence = state, True
        if step is not None and stage.startswith("Newton"):
            # The Laplace approximation at a Newton iterate: what max_iter=step gives.
            fit = MethodFit.unconverged(gaussian)
        else:
            n_iter = getattr(gaussian, "n_iter", step or 0)
            where = stage if step is None else f"{stage}, after {step} iterations"
            fit = MethodFit(gaussian, n_iter, strategy=stage, reason=f"stopped at {where}")
        return self._finish(fit), evidence

    def _attributes(self, fit: tuple[MethodFit, bool], *, done: bool) -> dict:
        """The fitted attributes of the fit stopped at ``fit`` (the current problem's, and
        whether its evidence is known; ``done``: that problem's final fit, already
        listed)."""
        fit, evidence = fit
        fits = list(self._fits if done else [*self._fits, fit])
        current = len(fits) - 1
        structured = isinstance(fits[0].posterior, StructuredGaussian)
        fits += [self._pending(k, structured) for k in range(len(fits), self._n_problems)]
        attributes = self._store(fits)
        if not evidence:  # (EP's sites between sweeps: their normalizers are not computed)
            value = np.array(attributes["log_marginal_likelihood_value_"], dtype=float)
            value[() if value.ndim == 0 else current] = np.nan
            attributes["log_marginal_likelihood_value_"] = value[()]
        return attributes


class _Steps:
    """One stage's iterations, as the solvers report them (see :mod:`vsbayes._progress`)."""

    def __init__(self, observer: FitObserver, context, stage: str, step_name: str):
        self._observer, self._context = observer, context
        self._stage, self._step_name = stage, step_name
        self._current = None
        self._count = 0
        self.outcome = None

    def begin(self, state) -> None:
        observer = self._observer
        self._current = self._context.subcontext(task_name=self._step_name)
        self._current.call_on_fit_task_begin(
            estimator=observer._estimator,
            **observer._data,
            reconstruction_attributes=observer._lazy(state, self._stage, self._count),
        )

    def end(self, state, only_if_open: bool = False) -> bool:
        observer = self._observer
        if self._current is None and only_if_open:
            return False
        self._count += 1
        current, self._current = self._current, None
        return current.call_on_fit_task_end(
            estimator=observer._estimator,
            **observer._data,
            reconstruction_attributes=observer._lazy(state, self._stage, self._count),
        )

    def result(self, state) -> None:
        self.outcome = state


def prior_fit(mean: np.ndarray, cov: np.ndarray) -> MethodFit:
    """A problem not reached yet: its prior."""
    return MethodFit.prior(Gaussian(mean, cov))
