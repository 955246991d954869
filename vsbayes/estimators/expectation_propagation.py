"""Expectation-propagation estimators (weight space, damped parallel updates)."""

from __future__ import annotations

import numbers

from sklearn.utils import check_scalar

from ..approximations import softmax_ep
from ..approximations.expectation_propagation import DEFAULT_DAMPING
from ._base import BayesianGLMClassifier, ep_posterior, rows_in_memory
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    continued,
    estimator_docstring,
    fallback_note,
)

__all__ = ["EPLogisticRegression", "EPProbitRegression", "softmax_ep_posterior"]


#: Smallest site change at which the multinomial EP stops. Below it the sweep's own
#: round-off moves the sites: a site is the difference of the inverses of a tilted fit's
#: and a latent marginal's covariances, whose variances reach 2·10³ on digits, so the
#: fits' round-off is amplified to ~1e-9; there, mixed sweeps wandered (5.8e-10 after 43
#: sweeps, 2e-6 at 61) until damping was halved twice (5e-11 at 76 sweeps; 1e-8 at 37).
SOFTMAX_EP_MIN_TOL = 1e-8


def softmax_ep_posterior(
    model, laplace, *, tol: float, damping: float = DEFAULT_DAMPING, max_iter: int = 200
):
    """Multinomial EP (VS fits of the (K − 1)-dimensional sites) from the Laplace sites.

    ``tol`` is the estimator's; the sweeps stop at site changes of ``tol / 100``, as the
    binary :func:`~vsbayes.estimators._base.ep_posterior`, but not below
    :data:`SOFTMAX_EP_MIN_TOL`.
    """
    return softmax_ep(
        model,
        damping=damping,
        tol=max(1e-2 * tol, SOFTMAX_EP_MIN_TOL),
        max_iter=max_iter,
        start=laplace.mean,
    )


class ExpectationPropagationClassifier(BayesianGLMClassifier):
    """Base of the EP estimators: the damping parameter and the EP fit."""

    _method, _title = "ep", "expectation propagation"

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

    def _check_params(self) -> None:
        super()._check_params()
        check_scalar(
            self.damping, "damping", numbers.Real, min_val=0, max_val=1, include_boundaries="right"
        )

    def _posterior(self, model, laplace, rng):
        return ep_posterior(
            model, laplace, tol=self.tol, damping=self.damping, max_iter=self.max_iter
        )

    def _multinomial_posterior(self, model, laplace, rng):
        if not rows_in_memory(model):
            raise ValueError(
                f"{type(self).__name__} fits more than two classes with the multinomial EP, "
                f"which needs the rows in memory (over dask chunks it is not implemented). "
                f"Pass X.compute() if the data fit in memory, or fit one-vs-rest posteriors, "
                f"e.g. OneVsRestClassifier({type(self).__name__}()), or use "
                f"VSLogisticRegression or LaplaceLogisticRegression."
            )
        return softmax_ep_posterior(
            model, laplace, tol=self.tol, damping=self.damping, max_iter=self.max_iter
        )


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
