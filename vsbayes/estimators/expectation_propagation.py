"""Expectation-propagation estimators (weight space, damped parallel updates)."""

from __future__ import annotations

from numbers import Real
from typing import ClassVar

from ._base import BayesianGLMClassifier, Interval
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    continued,
    estimator_docstring,
    fallback_note,
)
from ._methods import EPMethod

__all__ = ["EPLogisticRegression", "EPProbitRegression"]


class ExpectationPropagationClassifier(BayesianGLMClassifier):
    """Base of the EP estimators: the damping parameter; the method is ``_methods.EPMethod``."""

    _method, _title = "ep", "expectation propagation"
    _posterior_method = EPMethod
    _constraints: ClassVar[dict[str, tuple]] = {
        **BayesianGLMClassifier._constraints,
        "damping": (Interval(Real, 0, 1, closed="right"),),
    }

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        damping=0.85,
        max_iter=200,
        tol=1e-8,
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
        self.damping = damping


class EPLogisticRegression(ExpectationPropagationClassifier):
    _link = "logistic"
    _multinomial = True


class EPProbitRegression(ExpectationPropagationClassifier):
    _link = "probit"


def _ep_doc(name: str, link: str, moments: str, see_also: str, multiclass: str) -> str:
    return estimator_docstring(
        summary=f"Bayesian {link} regression by expectation propagation.",
        description=(
            f"Each {link} likelihood factor is replaced by a Gaussian site in the direction\n"
            "of its design row, fitted so that the posterior matches the moments of the\n"
            f"exact factor times the rest ({moments}); all sites are updated in parallel and\n"
            "damped until they stop moving, and EP's evidence estimate is returned\n"
            "(:func:`vsbayes.approximations.expectation_propagation`). Weights of at least 1\n"
            "act as repeated factors (power EP), smaller ones as powers of the factor." + multiclass
        ),
        params=COMMON_PARAMETERS.format(
            max_iter_extra=", and of EP's sweeps over the\n    sites",
            tol_extra=continued(
                "EP stops when no site parameter moves by more than ``tol / 100`` "
                "(relative) in a sweep."
            ),
            random_state="Unused (no randomness); kept for API compatibility.",
        )
        .replace("max_iter : int, default=100", "max_iter : int, default=200")
        .replace(
            "random_state : ",
            "damping : float, default=0.85\n"
            "    Fraction of the new site parameters taken at each sweep (1: undamped); lower\n"
            "    it if EP does not converge (near-separable data).\n"
            "random_state : ",
        ),
        attributes=ATTRIBUTES.format(
            n_iter="EP sweeps over the sites.",
            diagnostics="``n_iter``, ``converged``, ``site_change`` of "
            ":class:`vsbayes.approximations.EPResult`",
            extra=FALLBACK_ATTRIBUTE,
        ),
        notes=fallback_note(
            "a site precision so large the posterior covariance is not numerically "
            "positive definite, or max_iter reached with improper cavities"
        ),
        see_also=see_also,
        name=name,
        example_args="C=1.0",
    )


EPLogisticRegression.__doc__ = _ep_doc(
    "EPLogisticRegression",
    "logistic",
    "by a trapezoid rule accurate to about 1e-8",
    "VSLogisticRegression : The posterior by variational sampling.",
    "\nBeyond two classes, the multinomial (softmax) posterior, whose sites are Gaussian\n"
    "factors on each row's K − 1 centred latent values, fitted by variational sampling\n"
    "on a deterministic rule (:func:`vsbayes.approximations.softmax_ep`).",
)
EPProbitRegression.__doc__ = _ep_doc(
    "EPProbitRegression",
    "probit",
    "closed form",
    "VSProbitRegression : The posterior by variational sampling.",
    "\nBeyond two classes, one posterior per class (one-vs-rest): the probit has no\n"
    "multinomial form.",
)
