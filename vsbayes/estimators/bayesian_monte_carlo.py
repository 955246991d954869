"""Bayesian Monte Carlo estimators: posterior moments and evidence by GP quadrature."""

from __future__ import annotations

import numbers

from sklearn.utils import check_scalar

from ..engine import bayesian_monte_carlo, n_family_params
from ..engine.bayesian_monte_carlo import MAX_BMC_SAMPLES
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    ep_tol_note,
    estimator_docstring,
    fallback_note,
    sampling_parameters,
)
from ._sampling import SamplingGLMClassifier

__all__ = ["BMCLogisticRegression", "BMCProbitRegression"]


class BayesianMonteCarloClassifier(SamplingGLMClassifier):
    """Base of the BMC estimators: their parameters and engine options."""

    _method, _title = "bmc", "Bayesian Monte Carlo"

    _engine = staticmethod(bayesian_monte_carlo)

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        n_samples="auto",
        kernel="ep",
        rule="mc",
        length_scale=1.0,
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
        self.kernel = kernel
        self.rule = rule
        self.length_scale = length_scale
        self.n_jobs = n_jobs

    def _check_params(self) -> None:
        super()._check_params()
        check_scalar(
            self.length_scale,
            "length_scale",
            numbers.Real,
            min_val=0,
            include_boundaries="neither",
        )

    def _engine_options(self, dim: int, n_samples: int) -> dict:
        return {"length_scale": self.length_scale}

    def _planned_bytes(self, dim: int, n_samples: int) -> float:
        # The Gaussian-process solve holds a few N × N matrices.
        return super()._planned_bytes(dim, n_samples) + 24.0 * n_samples**2

    def _total_samples(self, dim: int) -> int:
        # The GP stores an N×N matrix: "auto" stops at the engine's limit.
        total = super()._total_samples(dim)
        if not isinstance(self.n_samples, str):
            return total
        n = n_family_params(dim)
        if n > MAX_BMC_SAMPLES:
            # Fewer points than a Gaussian over the coefficients has parameters: the GP's
            # moments cannot resolve it (measured: 5000 × 2000 sparse, 53 s and 5.8 GB for a
            # fit 800 standard errors off). Say so before drawing anything.
            raise ValueError(
                f"BMC can use at most {MAX_BMC_SAMPLES} points, fewer than the n = {n} "
                f"parameters of a Gaussian over {dim} coefficients: its estimate would not "
                f"resolve this posterior. Use VSLogisticRegression/VSProbitRegression or the "
                f"EP estimators, which hold for any number of features."
            )
        return min(total, MAX_BMC_SAMPLES)


def _bmc_doc(name: str, link: str, see_also: str) -> str:
    return estimator_docstring(
        summary=f"Bayesian {link} regression by Bayesian Monte Carlo.",
        description=(
            "A Gaussian process with a squared-exponential covariance interpolates the ratio\n"
            "posterior / kernel at points drawn through ``kernel`` (EP's posterior or Laplace's);\n"
            "its integral and moments against the kernel are the evidence, mean and covariance\n"
            "(:func:`vsbayes.bayesian_monte_carlo`; Rasmussen and Ghahramani 2003). The cost\n"
            "grows like N³: a baseline for small problems."
        ),
        params=COMMON_PARAMETERS.format(
            max_iter_extra="",
            tol_extra=ep_tol_note('the sampling kernel, with ``kernel="ep"``'),
            random_state="Seed of the sampling; an int makes ``fit`` reproducible.",
        )
        + sampling_parameters(
            "n_samples",
            "kernel",
            "rule",
            "length_scale",
            "n_jobs",
            limits_note="\n        At most 16384 (``auto`` stops there): BMC stores an N×N matrix.",
        ),
        attributes=ATTRIBUTES.format(
            n_iter="Newton iterations of the Laplace kernel.",
            diagnostics="``length_scale``, ``n_samples`` of :class:`vsbayes.BMCResult`",
            extra=FALLBACK_ATTRIBUTE,
        ),
        see_also=see_also,
        notes=fallback_note(
            "e.g. a non-positive evidence, or a mean far from the importance-sampling "
            "mean of the same points"
        ),
        name=name,
        example_args="random_state=0",
        example_prep=">>> X = X[:, :3]  # BMC is a method for few dimensions\n",
    )


class BMCLogisticRegression(BayesianMonteCarloClassifier):
    _link = "logistic"


class BMCProbitRegression(BayesianMonteCarloClassifier):
    _link = "probit"


BMCLogisticRegression.__doc__ = _bmc_doc(
    "BMCLogisticRegression",
    "logistic",
    "VSLogisticRegression : The same draws, fitted by variational sampling.",
)
BMCProbitRegression.__doc__ = _bmc_doc(
    "BMCProbitRegression",
    "probit",
    "VSProbitRegression : The same draws, fitted by variational sampling.",
)
