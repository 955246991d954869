"""Laplace-approximation estimators: the Gaussian at the posterior mode."""

from __future__ import annotations

from ._base import BayesianGLMClassifier
from ._docstrings import ATTRIBUTES, COMMON_PARAMETERS, estimator_docstring
from ._methods import LaplaceMethod

__all__ = ["LaplaceLogisticRegression", "LaplaceProbitRegression"]


def _laplace_doc(name: str, link: str, see_also: str) -> str:
    probit_note = "" if link == "logistic" else " for the logistic link; here the link is Φ"
    return estimator_docstring(
        summary=f"Bayesian {link} regression by the Laplace approximation.",
        description=(
            "The posterior of the coefficients is approximated by the Gaussian at its mode\n"
            "(found by Newton's method with the exact Hessian) with the inverse negative\n"
            "Hessian as covariance; the log evidence is the Laplace estimate. Its point\n"
            f"predictions equal those of scikit-learn's ``LogisticRegression(C=C)``{probit_note};\n"
            "its probabilities are the posterior predictive ones, which account for the\n"
            "uncertainty of the coefficients."
        ),
        params=COMMON_PARAMETERS.format(
            max_iter_extra="",
            tol_extra="",
            random_state="Unused (no randomness); kept for API compatibility.",
        ),
        attributes=ATTRIBUTES.format(
            n_iter="Newton iterations (gradient and Hessian evaluations).",
            diagnostics="``n_iter``, ``converged``, ``grad_norm``, ``log_density_at_mode``",
            extra="",
        ),
        see_also=see_also,
        name=name,
        example_args="C=1.0",
    )


class LaplaceLogisticRegression(BayesianGLMClassifier):
    _method, _title = "laplace", "Laplace approximation"
    _link = "logistic"
    _multinomial = True
    _posterior_method = LaplaceMethod


class LaplaceProbitRegression(BayesianGLMClassifier):
    _method, _title = "laplace", "Laplace approximation"
    _link = "probit"
    _posterior_method = LaplaceMethod


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
