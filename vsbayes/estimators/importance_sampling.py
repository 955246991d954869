"""Importance-sampling estimators: posterior moments and evidence by self-normalized IS."""

from __future__ import annotations

from typing import ClassVar

from ._base import BayesianGLMClassifier
from ._docstrings import (
    ATTRIBUTES,
    COMMON_PARAMETERS,
    FALLBACK_ATTRIBUTE,
    ep_tol_note,
    estimator_docstring,
    fallback_note,
    sampling_parameters,
)
from ._sampling import ROUNDS_CONSTRAINTS, SAMPLING_CONSTRAINTS, ISMethod

__all__ = ["ISLogisticRegression", "ISProbitRegression"]


class ImportanceSamplingClassifier(BayesianGLMClassifier):
    """Base of the IS estimators: their parameters; the method is ``_sampling.ISMethod``."""

    _method, _title = "is", "importance sampling"
    _posterior_method = ISMethod
    _constraints: ClassVar[dict[str, tuple]] = {
        **BayesianGLMClassifier._constraints,
        **SAMPLING_CONSTRAINTS,
        **ROUNDS_CONSTRAINTS,
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
        rounds=1,
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
        self.kernel = kernel
        self.rule = rule
        self.rounds = rounds
        self.kernel_scale = kernel_scale
        self.n_jobs = n_jobs


def _is_doc(name: str, link: str, see_also: str) -> str:
    return estimator_docstring(
        summary=f"Bayesian {link} regression by importance sampling.",
        description=(
            "The posterior mean and covariance are the self-normalized importance-sampling\n"
            "moments of points drawn through ``kernel`` (EP's posterior or Laplace's), and the\n"
            "evidence is the importance-sampling average of posterior / kernel\n"
            "(:func:`vsbayes.importance_sampling`).\n"
            "A baseline for :class:`VSLogisticRegression`: with one round, the same\n"
            "``n_samples`` and ``random_state``, both evaluate the posterior at the same points."
        ),
        params=COMMON_PARAMETERS.format(
            max_iter_extra="",
            tol_extra=ep_tol_note('the sampling kernel, with ``kernel="ep"``'),
            random_state="Seed of the sampling; an int makes ``fit`` reproducible.",
        )
        + sampling_parameters("n_samples", "kernel", "rule", "rounds", "n_jobs", rounds=1),
        attributes=ATTRIBUTES.format(
            n_iter="Newton iterations of the Laplace kernel.",
            diagnostics="``ess``, ``n_samples``, ``rounds`` of :class:`vsbayes.ISResult`",
            extra=FALLBACK_ATTRIBUTE,
        ),
        see_also=see_also,
        notes=fallback_note("e.g. a singular weighted covariance"),
        name=name,
        example_args="random_state=0",
    )


class ISLogisticRegression(ImportanceSamplingClassifier):
    _link = "logistic"
    _multinomial = True


class ISProbitRegression(ImportanceSamplingClassifier):
    _link = "probit"


ISLogisticRegression.__doc__ = _is_doc(
    "ISLogisticRegression",
    "logistic",
    "VSLogisticRegression : The same draws, fitted by variational sampling.",
)
ISProbitRegression.__doc__ = _is_doc(
    "ISProbitRegression",
    "probit",
    "VSProbitRegression : The same draws, fitted by variational sampling.",
)
