"""Variational-sampling estimators: the posterior Gaussian fitted by VS around the Laplace one."""

from __future__ import annotations

from numbers import Real
from textwrap import dedent
from typing import ClassVar

from ._base import BayesianGLMClassifier, Interval
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    VS_DEFAULTS_NOTE,
    VS_TOL_NOTE,
    estimator_docstring,
    fallback_note,
    sampling_parameters,
)
from ._sampling import ROUNDS_CONSTRAINTS, SAMPLING_CONSTRAINTS
from ._strategy import STRATEGIES, VSMethod

__all__ = ["STRATEGIES", "VSLogisticRegression", "VSProbitRegression"]


STRATEGY_ATTRIBUTES = dedent("""\
    kl_error_ : ndarray of shape (1,), (n_classes,) for one-vs-rest
        The predicted error (excess KL, nats) of each posterior that is a global
        variational-sampling fit; NaN for the others (EP's site fits, Laplace).
    stop_reason_ : ndarray of object, same shape
        Why each global fit stopped sampling (``"n_samples"``, ``"target_kl"``,
        ``"max_samples"``, ``"time_budget"``, ``"failed"``; see ``target_kl``); None for
        the other posteriors.
    strategy_ : ndarray of str, shape (1,) or (n_classes,)
        The strategy of each binary problem: "global", "sites", or "laplace" where the
        chosen fit failed (see ``laplace_fallback_``).
    strategy_reason_ : list of str
        Why each strategy was taken (with ``strategy="auto"``, the measured quantities).
""")


class VariationalSamplingClassifier(BayesianGLMClassifier):
    """Base of the VS estimators: their parameters; the method is ``_strategy.VSMethod``."""

    _method, _title = "vs", "variational sampling"
    _posterior_method = VSMethod
    _constraints: ClassVar[dict[str, tuple]] = {
        **BayesianGLMClassifier._constraints,
        **SAMPLING_CONSTRAINTS,
        "family": ("gaussian", "diagonal"),
        "strategy": STRATEGIES,
        **ROUNDS_CONSTRAINTS,
        "target_kl": ("auto", None, Interval(Real, 0, closed="neither")),
        "time_budget": (None, Interval(Real, 0, closed="neither")),
    }

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        n_samples="auto",
        kernel="ep",
        strategy="auto",
        family="gaussian",
        rule="mc",
        rounds=2,
        kernel_scale=1.5,
        target_kl="auto",
        time_budget=None,
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
        self.strategy = strategy
        self.family = family
        self.rule = rule
        self.rounds = rounds
        self.kernel_scale = kernel_scale
        self.target_kl = target_kl
        self.time_budget = time_budget
        self.n_jobs = n_jobs


def _vs_doc(name: str, link: str, see_also: str) -> str:
    return estimator_docstring(
        summary=f"Bayesian {link} regression by variational sampling.",
        description=(
            "The posterior of the coefficients is a Gaussian fitted by variational sampling\n"
            "(Roche 2013): either one fit of the whole posterior\n"
            "(:func:`vsbayes.variational_sampling`, points drawn through the\n"
            "expectation-propagation posterior), exact when the posterior is Gaussian, with\n"
            "an error decreasing like 1/N otherwise; or expectation propagation whose site\n"
            "fits are "
            "variational-sampling fits of the one-dimensional tilted densities (of the\n"
            "(K − 1)-dimensional ones for the multinomial posterior), which holds\n"
            "for any number of features (``strategy``). Use it where you would use\n"
            "scikit-learn's ``LogisticRegression(C=C)``: ``predict_proba`` returns the\n"
            "posterior predictive probabilities."
        ),
        params=COMMON_PARAMETERS.format(
            max_iter_extra=", and of the variational-sampling\n    solver in each round",
            tol_extra=VS_TOL_NOTE,
            random_state="Seed of the sampling; an int makes ``fit`` reproducible.",
        )
        + sampling_parameters(
            "n_samples",
            "kernel",
            "strategy",
            "family",
            "rule",
            "rounds",
            "target_kl",
            "n_jobs",
            family_note="full ",
            limits_note=(
                "\n        Fewer than n raises a ValueError (the fit is not determined); fewer "
                'than 2n\n        warns (UnreliableFitWarning). With ``strategy="auto"``, '
                '``"auto"`` gives the\n        global fit 16n to 32n points (see '
                "``strategy``)."
            ),
            defaults_note=VS_DEFAULTS_NOTE,
        ),
        attributes=ATTRIBUTES.format(
            n_iter="Variational-sampling solver iterations, summed over the rounds (global "
            "fit), or expectation-propagation sweeps (site fits).",
            diagnostics="``kl_error``, ``ess``, ``n_samples``, ``rounds``, … of "
            ":class:`vsbayes.VSResult`",
            extra=STRATEGY_ATTRIBUTES + FALLBACK_ATTRIBUTE,
        ),
        see_also=see_also,
        notes=fallback_note(
            "e.g. a non-integrable fit, or a fit that extrapolates beyond the points "
            "carrying the weight"
        ),
        name=name,
        example_args="random_state=0",
    )


class VSLogisticRegression(VariationalSamplingClassifier):
    _link = "logistic"
    _multinomial = True


class VSProbitRegression(VariationalSamplingClassifier):
    _link = "probit"


VSLogisticRegression.__doc__ = _vs_doc(
    "VSLogisticRegression",
    "logistic",
    "EPLogisticRegression : Expectation propagation alone (the sampling kernel).",
)
VSProbitRegression.__doc__ = _vs_doc(
    "VSProbitRegression",
    "probit",
    "EPProbitRegression : Expectation propagation alone (the sampling kernel).",
)
