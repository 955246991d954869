"""Base of the estimators whose posterior is estimated from points drawn through a Gaussian kernel.

The kernel is the expectation-propagation posterior (default) or the Laplace one.
"""

from __future__ import annotations

import abc
import numbers
import warnings

from sklearn.utils import check_scalar

from .._memory import check_memory, format_bytes
from ..engine import n_family_params
from ..exceptions import ConvergenceWarning, EstimationError
from ._base import BayesianGLMClassifier, ep_posterior, rows_in_memory
from .expectation_propagation import softmax_ep_posterior

__all__ = ["KERNELS", "SamplingGLMClassifier", "check_choice", "check_rounds"]

#: Sampling kernels: the expectation-propagation posterior or the Laplace approximation.
KERNELS = ("ep", "laplace")


def check_choice(value, name, choices):
    """Raise a ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}.")


class SamplingGLMClassifier(BayesianGLMClassifier):
    """Bayesian GLM classifier whose posterior method draws points from a Gaussian kernel.

    Subclasses define ``__init__`` (with ``n_samples``, ``rule`` and ``n_jobs`` besides the
    base parameters), set ``_engine`` — a fitter called as
    ``engine(log_target, kernel, n_samples, rule=..., random_state=..., **options)`` — and
    implement ``_engine_options(dim, n_samples)``. ``n_samples="auto"`` means
    ``max(_auto_factor · n, _auto_minimum)`` with n the family's parameter count.
    """

    _auto_factor = 8
    _auto_minimum = 256
    _rules = ("mc", "qmc")

    @abc.abstractmethod
    def _engine_options(self, dim: int, n_samples: int) -> dict:
        """Keyword arguments of the engine specific to the method, for a fit of ``dim``
        parameters from ``n_samples`` points."""

    def _check_params(self) -> None:
        super()._check_params()
        if not (isinstance(self.n_samples, str) and self.n_samples == "auto"):
            check_scalar(self.n_samples, "n_samples", numbers.Integral, min_val=1)
        check_choice(self.rule, "rule", self._rules)
        check_choice(self.kernel, "kernel", KERNELS)

    def _n_jobs(self) -> int | None:
        return self.n_jobs

    def _family(self) -> str:
        """The Gaussian family the points determine (``n_samples="auto"`` counts its
        parameters): full, unless the method has a ``family`` parameter."""
        return "gaussian"

    def _total_samples(self, dim: int) -> int:
        if isinstance(self.n_samples, str):
            n = n_family_params(dim, self._family())
            return max(self._auto_factor * n, self._auto_minimum)
        return int(self.n_samples)

    def _planned_bytes(self, dim: int, n_samples: int) -> float:
        """Bytes the sampling fit holds at once: the points in two coordinates, their
        homogeneous features and the solver's buffers (the likelihood runs in bounded
        blocks)."""
        return 8.0 * n_samples * (4 * dim + 8)

    def _sampling_kernel(self, model, laplace, ep_fit=None):
        """The kernel: EP's posterior (``ep_fit``: the binary EP, or the multinomial one;
        to the fit's tolerance, so that results are reproducible to it, e.g. weights ≡
        duplicated rows), or Laplace's if EP fails or does not converge (an unconverged EP
        can sit far from the posterior: sampling from it measured a prior-like fit with
        sample weights of 1e3 and 1e-4); Laplace's for the multinomial posterior of rows in
        dask chunks."""
        if self.kernel == "laplace" or (ep_fit is not None and not rows_in_memory(model)):
            return laplace  # the multinomial EP over dask chunks is not implemented
        ep_fit = ep_posterior if ep_fit is None else ep_fit
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                ep = ep_fit(model, laplace, tol=self.tol)
        except EstimationError:
            return laplace
        return ep if ep.converged else laplace

    def _posterior(self, model, laplace, rng):
        self._check_memory(model, self._total_samples(model.dim))
        return self._sample(model, self._sampling_kernel(model, laplace), rng)

    def _multinomial_posterior(self, model, laplace, rng):
        # The multinomial EP as the kernel (measured against NUTS at C = 1, VS's global fit:
        # KL over Laplace's 0.020-0.023 on iris from 0.022-0.030 with the Laplace kernel,
        # 0.014-0.016 on wine from 0.044-0.105; three seeds).
        self._check_memory(model, self._total_samples(model.dim))
        kernel = self._sampling_kernel(model, laplace, softmax_ep_posterior)
        return self._sample(model, kernel, rng)

    def _check_memory(self, model, n_samples: int) -> None:
        """Raise MemoryLimitError now, before any fit, if the points would not fit."""
        check_memory(
            self._planned_bytes(model.dim, n_samples),
            f"the {n_samples} sample points over {model.dim} parameters of {type(self).__name__}",
            f"Use fewer samples (n_samples; 'auto' is 8n with n = (p+1)(p+2)/2 for p "
            f"parameters), fewer features, or the expectation-propagation estimators, which "
            f"need no points in the parameter space ({format_bytes(8 * model.dim**2)} per "
            f"covariance).",
        )

    def _sample(self, model, kernel, rng, n_samples=None):
        """The engine's fit from ``kernel`` (``n_samples`` points, default the estimator's)."""
        n_samples = self._total_samples(model.dim) if n_samples is None else n_samples
        self._check_memory(model, n_samples)
        return self._engine(
            model.log_density,
            kernel,
            n_samples,
            rule=self.rule,
            random_state=rng,
            **self._engine_options(model.dim, n_samples),
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
