"""Variational-Bayes logistic regression: the Jaakkola–Jordan bound, one ξ per observation."""

from __future__ import annotations

from ._base import BayesianGLMClassifier
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    continued,
    estimator_docstring,
    fallback_note,
)
from ._methods import VBMethod

__all__ = ["VBLogisticRegression"]


class VBLogisticRegression(BayesianGLMClassifier):
    # The Jaakkola–Jordan bound exists for the logistic link only.
    _method, _title = "vb", "variational Bayes (Jaakkola–Jordan bound)"
    _link = "logistic"
    _posterior_method = VBMethod

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        max_iter=1000,
        tol=1e-8,
        random_state=None,
        verbose=0,
    ):
        # The bound's fixed-point updates converge linearly: a larger default max_iter
        # (breast cancer needs about 180 updates).
        super().__init__(
            C,
            fit_intercept=fit_intercept,
            class_weight=class_weight,
            max_iter=max_iter,
            tol=tol,
            random_state=random_state,
            verbose=verbose,
        )


VBLogisticRegression.__doc__ = estimator_docstring(
    summary="Bayesian logistic regression by the Jaakkola–Jordan variational bound.",
    description=(
        "Each logistic likelihood factor is bounded below by a Gaussian-shaped function\n"
        "with its own variational parameter ξ_i; the bound, maximized by closed-form\n"
        "updates started from the Laplace approximation, gives a Gaussian posterior and a\n"
        "lower bound on the log evidence (:func:`vsbayes.approximations.jaakkola_jordan`).\n"
        "The approximation is known to underestimate the posterior variance; it is a\n"
        "baseline for :class:`VSLogisticRegression`."
    ),
    params=COMMON_PARAMETERS.format(
        max_iter_extra=", and of the bound's updates",
        tol_extra=continued(
            "The bound's updates stop when the bound rises by at most "
            "``tol · max(1, |bound|)`` nats in one update."
        ),
        random_state="Unused (no randomness); kept for API compatibility.",
    ).replace("max_iter : int, default=100", "max_iter : int, default=1000"),
    attributes=ATTRIBUTES.format(
        n_iter="Updates of the variational parameters.",
        diagnostics="``n_iter``, ``converged``, ``xi`` of "
        ":class:`vsbayes.approximations.VBResult`; ``log_Z`` is the evidence lower bound",
        extra=FALLBACK_ATTRIBUTE,
    ),
    notes=fallback_note("a posterior covariance that is not numerically positive definite"),
    see_also="VSLogisticRegression : The posterior by variational sampling.",
    name="VBLogisticRegression",
    example_args="C=1.0",
)
