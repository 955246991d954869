"""Variational-sampling estimators: the posterior Gaussian fitted by VS around the Laplace one."""

from __future__ import annotations

from ..engine import variational_sampling
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    SAMPLING_PARAMETERS,
    estimator_docstring,
)
from ._sampling import SamplingGLMClassifier

__all__ = ["VSLogisticRegression", "VSProbitRegression"]


def _vs_doc(name: str, link: str, see_also: str, auto: int) -> str:
    return estimator_docstring(
        summary=f"Bayesian {link} regression by variational sampling.",
        description=(
            "The posterior of the coefficients is the Gaussian fitted by variational sampling\n"
            "(:func:`vsbayes.variational_sampling`) to the exact posterior, with points drawn\n"
            "around its Laplace approximation: the posterior mean, covariance and log evidence\n"
            "are exact when the posterior is Gaussian and their error decreases like 1/N\n"
            "otherwise. Use it where you would use scikit-learn's ``LogisticRegression(C=C)``:\n"
            "``predict_proba`` returns the posterior predictive probabilities."
        ),
        params=COMMON_PARAMETERS.format(
            max_iter_extra=", and of the variational-sampling solver in each round",
            random_state="Seed of the sampling; an int makes ``fit`` reproducible.",
        )
        + SAMPLING_PARAMETERS.format(auto=auto),
        attributes=ATTRIBUTES.format(
            n_iter="Variational-sampling solver iterations, summed over the rounds.",
            diagnostics="``kl_error``, ``ess``, ``n_samples``, ``rounds``, … of "
            ":class:`vsbayes.VSResult`",
            extra=FALLBACK_ATTRIBUTE,
        ),
        see_also=see_also,
        name=name,
        example_args="random_state=0",
    )


class VSLogisticRegression(SamplingGLMClassifier):
    _link = "logistic"
    _engine = staticmethod(variational_sampling)


class VSProbitRegression(SamplingGLMClassifier):
    _link = "probit"
    _engine = staticmethod(variational_sampling)


VSLogisticRegression.__doc__ = _vs_doc(
    "VSLogisticRegression",
    "logistic",
    "LaplaceLogisticRegression : The Laplace approximation alone (the sampling kernel).",
    SamplingGLMClassifier._auto_factor,
)
VSProbitRegression.__doc__ = _vs_doc(
    "VSProbitRegression",
    "probit",
    "LaplaceProbitRegression : The Laplace approximation alone (the sampling kernel).",
    SamplingGLMClassifier._auto_factor,
)
