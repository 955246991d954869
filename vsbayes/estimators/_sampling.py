"""Base of the estimators whose posterior is fitted to samples drawn around the Laplace one."""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from sklearn.utils import check_scalar

from ..engine import LaplaceResult, n_family_params
from ..exceptions import EstimationError, UnreliableFitWarning
from ._base import BayesianGLMClassifier

__all__ = ["SamplingGLMClassifier"]

_FAMILIES = ("gaussian", "diagonal")
_RULES = ("mc", "qmc")


def _check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}.")


class SamplingGLMClassifier(BayesianGLMClassifier):
    """Bayesian GLM classifier whose posterior method draws points from a Gaussian kernel.

    Subclasses set ``_engine``, a fitter with the signature of
    :func:`vsbayes.variational_sampling`. ``n_samples="auto"`` means
    ``max(_auto_factor · n, _auto_minimum)``.

    When the engine cannot return a valid Gaussian (an
    :class:`~vsbayes.exceptions.EstimationError`), the problem falls back to its Laplace
    approximation with an :class:`~vsbayes.exceptions.UnreliableFitWarning`, and
    ``laplace_fallback_`` records it.
    """

    _auto_factor = 8
    _auto_minimum = 256

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        n_samples="auto",
        family="gaussian",
        rule="mc",
        rounds=2,
        kernel_scale=1.5,
        max_iter=100,
        tol=1e-8,
        n_jobs=None,
        random_state=None,
        verbose=0,
    ):
        super().__init__(
            C,
            fit_intercept=fit_intercept,
            class_weight=class_weight,
            max_iter=max_iter,
            tol=tol,
            random_state=random_state,
            verbose=verbose,
        )
        self.n_samples = n_samples
        self.family = family
        self.rule = rule
        self.rounds = rounds
        self.kernel_scale = kernel_scale
        self.n_jobs = n_jobs

    def _check_params(self) -> None:
        super()._check_params()
        if not (isinstance(self.n_samples, str) and self.n_samples == "auto"):
            check_scalar(self.n_samples, "n_samples", numbers.Integral, min_val=1)
        _check_choice(self.family, "family", _FAMILIES)
        _check_choice(self.rule, "rule", _RULES)
        check_scalar(self.rounds, "rounds", numbers.Integral, min_val=1)
        check_scalar(
            self.kernel_scale, "kernel_scale", numbers.Real, min_val=0, include_boundaries="neither"
        )

    def _total_samples(self, dim: int) -> int:
        n = n_family_params(dim, self.family)
        if isinstance(self.n_samples, str):
            return max(self._auto_factor * n, self._auto_minimum)
        return int(self.n_samples)

    def _posterior(self, model, laplace, rng):
        try:
            return self._engine(
                model.log_density,
                laplace,
                self._total_samples(model.dim),
                family=self.family,
                rule=self.rule,
                rounds=self.rounds,
                kernel_scale=self.kernel_scale,
                max_iter=self.max_iter,
                random_state=rng,
            )
        except EstimationError as error:
            warnings.warn(
                f"{type(self).__name__}: {error} Falling back to the Laplace approximation "
                f"for this problem (recorded in laplace_fallback_).",
                UnreliableFitWarning,
                stacklevel=4,
            )
            return laplace

    def _n_iter(self, posterior) -> int:
        if isinstance(posterior, LaplaceResult):
            return posterior.n_iter
        return sum(r.n_iter for r in posterior.rounds)

    def _store(self, posteriors, n_features) -> None:
        super()._store(posteriors, n_features)
        self.laplace_fallback_ = np.array([isinstance(g, LaplaceResult) for g in posteriors])
