"""Bayesian Monte Carlo estimators: posterior moments and evidence by GP quadrature."""

from __future__ import annotations

from numbers import Real
from typing import ClassVar

from ._base import BayesianGLMClassifier, Interval
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    ep_tol_note,
    estimator_docstring,
    fallback_note,
    sampling_parameters,
)
from ._sampling import SAMPLING_CONSTRAINTS, BMCMethod

__all__ = ["BMCLogisticRegression", "BMCProbitRegression"]


class BayesianMonteCarloClassifier(BayesianGLMClassifier):
    """Base of the BMC estimators: their parameters; the method is ``_sampling.BMCMethod``."""

    _method, _title = "bmc", "Bayesian Monte Carlo"
    _posterior_method = BMCMethod
    _constraints: ClassVar[dict[str, tuple]] = {
        **BayesianGLMClassifier._constraints,
        **SAMPLING_CONSTRAINTS,
        "length_scale": (Interval(Real, 0, closed="neither"),),
    }

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
