"""Base of the estimators whose posterior is estimated from points drawn around the Laplace one."""

from __future__ import annotations

import abc
import numbers

from sklearn.utils import check_scalar

from ..engine import n_family_params
from ._base import BayesianGLMClassifier

__all__ = ["SamplingGLMClassifier", "check_choice", "check_rounds"]


def check_choice(value, name, choices):
    """Raise a ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}.")


class SamplingGLMClassifier(BayesianGLMClassifier):
    """Bayesian GLM classifier whose posterior method draws points from a Gaussian kernel.

    Subclasses define ``__init__`` (with ``n_samples``, ``rule`` and ``n_jobs`` besides the
    base parameters), set ``_engine`` — a fitter called as
    ``engine(log_target, kernel, n_samples, rule=..., random_state=..., **options)`` — and
    implement ``_engine_options()``. ``n_samples="auto"`` means
    ``max(_auto_factor · n, _auto_minimum)`` with n the family's parameter count.
    """

    _auto_factor = 8
    _auto_minimum = 256
    _rules = ("mc", "qmc")

    @abc.abstractmethod
    def _engine_options(self) -> dict:
        """Keyword arguments of the engine specific to the method."""

    def _check_params(self) -> None:
        super()._check_params()
        if not (isinstance(self.n_samples, str) and self.n_samples == "auto"):
            check_scalar(self.n_samples, "n_samples", numbers.Integral, min_val=1)
        check_choice(self.rule, "rule", self._rules)

    def _total_samples(self, dim: int) -> int:
        if isinstance(self.n_samples, str):
            n = n_family_params(dim, getattr(self, "family", "gaussian"))
            return max(self._auto_factor * n, self._auto_minimum)
        return int(self.n_samples)

    def _posterior(self, model, laplace, rng):
        return self._engine(
            model.log_density,
            laplace,
            self._total_samples(model.dim),
            rule=self.rule,
            random_state=rng,
            **self._engine_options(),
        )


def check_rounds(estimator) -> None:
    """Validate ``rounds`` and ``kernel_scale`` of an adaptive sampling estimator."""
    check_scalar(estimator.rounds, "rounds", numbers.Integral, min_val=1)
    check_scalar(
        estimator.kernel_scale,
        "kernel_scale",
        numbers.Real,
        min_val=0,
        include_boundaries="neither",
    )
