"""Variational-Bayes logistic regression: the Jaakkola–Jordan bound, one ξ per observation."""

from __future__ import annotations

from ..approximations import jaakkola_jordan
from ._base import BayesianGLMClassifier
from ._docstrings import ATTRIBUTES, COMMON_PARAMETERS, estimator_docstring

__all__ = ["VBLogisticRegression"]


class VBLogisticRegression(BayesianGLMClassifier):
    _link = "logistic"

    def _posterior(self, model, laplace, rng):
        return jaakkola_jordan(model, start=laplace, tol=self.tol, max_iter=self.max_iter)


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
        random_state="Unused (no randomness); kept for API compatibility.",
    ),
    attributes=ATTRIBUTES.format(
        n_iter="Updates of the variational parameters.",
        diagnostics="``n_iter``, ``converged``, ``xi`` of "
        ":class:`vsbayes.approximations.VBResult`; ``log_Z`` is the evidence lower bound",
        extra="",
    ),
    see_also="VSLogisticRegression : The posterior by variational sampling.",
    name="VBLogisticRegression",
    example_args="C=1.0",
)
