"""Laplace-approximation estimators: the Gaussian at the posterior mode."""

from __future__ import annotations

from ._base import BayesianGLMClassifier
from ._docstrings import ATTRIBUTES, COMMON_PARAMETERS

__all__ = ["LaplaceLogisticRegression", "LaplaceProbitRegression"]

_DOC = """{title}

The posterior of the coefficients is approximated by the Gaussian at its mode (found by
Newton's method with the exact Hessian) with the inverse negative Hessian as covariance;
the log evidence is the Laplace estimate. Its point predictions equal those of
scikit-learn's ``LogisticRegression(C=C)``{probit_note}; its probabilities are the
posterior predictive ones, which account for the uncertainty of the coefficients.

Parameters
----------
{params}
Attributes
----------
{attributes}
See Also
--------
{see_also}

Examples
--------
>>> from sklearn.datasets import load_breast_cancer
>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> from vsbayes import {name}
>>> X, y = load_breast_cancer(return_X_y=True)
>>> model = make_pipeline(StandardScaler(), {name}(C=1.0)).fit(X, y)
>>> model.predict_proba(X[:2]).shape
(2, 2)
"""


def _laplace_doc(name: str, link: str, see_also: str) -> str:
    return _DOC.format(
        title=f"Bayesian {link} regression by the Laplace approximation.",
        probit_note="" if link == "logistic" else " for the logistic link; here the link is Φ",
        params=COMMON_PARAMETERS.format(
            max_iter_extra="", random_state="Unused (no randomness); kept for API compatibility."
        ),
        attributes=ATTRIBUTES.format(
            n_iter="Newton iterations (gradient and Hessian evaluations).",
            diagnostics="``n_iter``, ``converged``, ``grad_norm``, ``log_density_at_mode``",
            extra="",
        ),
        see_also=see_also,
        name=name,
    )


class LaplaceLogisticRegression(BayesianGLMClassifier):
    _link = "logistic"

    def _posterior(self, model, laplace, rng):
        return laplace


class LaplaceProbitRegression(BayesianGLMClassifier):
    _link = "probit"

    def _posterior(self, model, laplace, rng):
        return laplace


LaplaceLogisticRegression.__doc__ = _laplace_doc(
    "LaplaceLogisticRegression",
    "logistic",
    "VSLogisticRegression : The same model, posterior by variational sampling.",
)
LaplaceProbitRegression.__doc__ = _laplace_doc(
    "LaplaceProbitRegression",
    "probit",
    "VSProbitRegression : The same model, posterior by variational sampling.",
)
