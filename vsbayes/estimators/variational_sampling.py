"""Variational-sampling estimators: the posterior Gaussian fitted by VS around the Laplace one."""

from __future__ import annotations

from ..engine import variational_sampling
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    VS_DEFAULTS_NOTE,
    estimator_docstring,
    fallback_note,
    sampling_parameters,
)
from ._sampling import SamplingGLMClassifier, check_choice, check_rounds

__all__ = ["VSLogisticRegression", "VSProbitRegression"]


class VariationalSamplingClassifier(SamplingGLMClassifier):
    """Base of the VS estimators: their parameters and engine options."""

    _engine = staticmethod(variational_sampling)

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        n_samples="auto",
        family="gaussian",
        rule="mc",
        rounds=2,
        kernel_scale=1.5,
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
        self.family = family
        self.rule = rule
        self.rounds = rounds
        self.kernel_scale = kernel_scale
        self.n_jobs = n_jobs

    def _check_params(self) -> None:
        super()._check_params()
        check_choice(self.family, "family", ("gaussian", "diagonal"))
        check_rounds(self)

    def _engine_options(self) -> dict:
        return {
            "family": self.family,
            "rounds": self.rounds,
            "kernel_scale": self.kernel_scale,
            "max_iter": self.max_iter,
        }

    def _n_iter(self, posterior, laplace) -> int:
        rounds = getattr(posterior, "rounds", None)
        return sum(r.n_iter for r in rounds) if rounds else laplace.n_iter


def _vs_doc(name: str, link: str, see_also: str) -> str:
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
        + sampling_parameters(
            "n_samples",
            "family",
            "rule",
            "rounds",
            "n_jobs",
            family_note="full ",
            limits_note=(
                "\n        Fewer than n raises a ValueError (the fit is not determined); fewer "
                "than 2n\n        warns (UnreliableFitWarning)."
            ),
            defaults_note=VS_DEFAULTS_NOTE,
        ),
        attributes=ATTRIBUTES.format(
            n_iter="Variational-sampling solver iterations, summed over the rounds.",
            diagnostics="``kl_error``, ``ess``, ``n_samples``, ``rounds``, … of "
            ":class:`vsbayes.VSResult`",
            extra=FALLBACK_ATTRIBUTE,
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


class VSProbitRegression(VariationalSamplingClassifier):
    _link = "probit"


VSLogisticRegression.__doc__ = _vs_doc(
    "VSLogisticRegression",
    "logistic",
    "LaplaceLogisticRegression : The Laplace approximation alone (the sampling kernel).",
)
VSProbitRegression.__doc__ = _vs_doc(
    "VSProbitRegression",
    "probit",
    "LaplaceProbitRegression : The Laplace approximation alone (the sampling kernel).",
)
