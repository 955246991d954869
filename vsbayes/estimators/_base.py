"""The one base class of the Bayesian GLM classifiers, and its parameter checker.

``fit`` enters once and only moves down: the parameters (declared in ``_constraints``),
the data, then per problem the likelihood model, its Laplace approximation and the
estimator's method object (``_posterior_method``: ``_methods.py``, ``_sampling.py``,
``_strategy.py``), which returns the posterior with its record; the results are stored
last. A public estimator is a thin subclass that picks a link (``_link``) and a method;
prediction lives in the mixin :class:`~vsbayes.estimators._prediction.PosteriorPrediction`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import numbers
import sys
from contextlib import nullcontext
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, validate_data

from .._blas import one_blas_thread
from .._memory import MemoryLimitError, check_memory, config_context, format_bytes
from .._progress import observed
from .._random import DEFAULT_SEED, reproducible_generator
from .._warnings import catch, each_once, reemit, reemit_alike, warn
from ..approximations import glm_laplace, softmax_laplace
from ..approximations._glm_gaussian import check_posterior_memory, check_shrinkage_size
from ..approximations.laplace_error import skew_correction
from ..approximations.structured_laplace import (
    CovarianceChoice,
    choose_covariance,
    structured_glm_laplace,
)
from ..approximations.structured_softmax import structured_softmax_laplace
from ..exceptions import (
    ConvergenceWarning,
    EstimationError,
    NotPositiveDefiniteError,
    UnreliableFitWarning,
)
from ..gaussian import (
    Gaussian,
    StructuredCovariance,
    StructuredCovariances,
    StructuredGaussian,
)
from ..models import (
    BinaryGLMPosterior,
    ChunkedPosterior,
    ChunkedSoftmaxPosterior,
    SoftmaxGLMPosterior,
)
from ..models.dask_chunks import is_dask, is_dask_array
from ..models.fitted_predictive import PredictiveSetup
from ..models.latent import untouched_columns
from ..models.separation import check_flat_prior_is_proper, separates_at
from ..models.shrinkage_priors import SHRINKAGE_PRIORS, elastic_net_factor
from ..models.work import SHRINKAGE_STEPS
from . import _summaries
from ._callbacks import CallbackSupportMixin, FitObserver, prior_fit
from ._class_weights import checked_class_weights, class_weights
from ._dask_input import (
    NEGATIVE_SAMPLE_WEIGHT,
    OVERFLOWING_FEATURES,
    class_weighted,
    reindexed,
    validate_dask_fit_data,
)
from ._leave_one_out import TrainingFingerprint
from ._methods import LaplaceMethod, MethodFit
from ._prediction import PosteriorPrediction
from ._priors import problem_model
from ._updating import BayesianUpdating, refuse_forced_structure

__all__ = [
    "DEFAULT_SEED",
    "FLAT_PRIOR_FACTOR",
    "INTERCEPT_PRIOR_VAR",
    "SOLVERS",
    "BayesianGLMClassifier",
    "Interval",
    "InvalidParameterError",
]

#: Prior variance of the intercept: N(0, 10⁶), vague on the logit/probit scale (so the MAP
#: matches scikit-learn's unpenalized intercept) yet proper (so the evidence is finite).
INTERCEPT_PRIOR_VAR = 1e6

#: The remedy, in the warnings and errors of a prior too vague for the data, that chooses
#: C for them (the command line says it in its own terms: ``vsbayes.cli.methods``).
CHOOSE_C = "EmpiricalBayesClassifier chooses C by the evidence"

#: LogisticRegression's solver names (see ``solver`` in the estimators' docstrings: the mode
#: is Newton's whatever the name).
SOLVERS = ("lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga")

#: The flat prior (``penalty=None`` or ``C=np.inf``) as a prior every route can use: per
#: coefficient, this many times the variance that the likelihood alone determines at most
#: (``4 / Σ_i s_i x_ij²``, the logistic link's largest curvature 1/4). Its pull on the
#: posterior is then below 1e-8 of the data's in every direction — far below any method's
#: error — while the posterior stays proper and every factorization well defined
#: (docs/decisions.md, "The flat prior").
FLAT_PRIOR_FACTOR = 1e8

#: LogisticRegression's ConvergenceWarning for each solver name, so that code filtering its
#: warnings by message keeps working; vsbayes's Newton stands behind every name.
SOLVER_NOT_CONVERGED = {
    "lbfgs": "lbfgs failed to converge",
    "liblinear": "Liblinear failed to converge, increase the number of iterations.",
    "newton-cg": "newton-cg failed to converge. Increase the number of iterations.",
    "newton-cholesky": "Newton solver did not converge after {n_iter} iterations.",
    "sag": "The max_iter was reached which means the coef_ did not converge",
    "saga": "The max_iter was reached which means the coef_ did not converge",
}


class InvalidParameterError(ValueError, TypeError):
    """A constructor parameter outside its constraints (a ValueError, and a TypeError for
    those who catch a wrong type as one, as scikit-learn's own)."""


@dataclasses.dataclass(frozen=True)
class Interval:
    """The numbers of type ``kind`` (``numbers.Real`` or ``numbers.Integral``) from
    ``low`` to ``high`` (None: unbounded); ``closed`` names the ends included: "left",
    "right", "both" or "neither"; ``finite`` excludes ±inf. NaN is never inside."""

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "left"
    finite: bool = False

    def __contains__(self, value) -> bool:
        if not isinstance(value, self.kind):
            return False
        low_in = self.closed in ("left", "both")
        high_in = self.closed in ("right", "both")
        return (
            (self.low is None or (value >= self.low if low_in else value > self.low))
            and (self.high is None or (value <= self.high if high_in else value < self.high))
            and (not self.finite or bool(np.isfinite(value)))
            and value == value  # not NaN
        )

    def __str__(self) -> str:
        kind = "int" if self.kind is Integral else "float"
        kind = f"{'a finite' if self.finite else 'an' if kind == 'int' else 'a'} {kind}"
        if self.low is None and self.high is None:
            return kind
        if self.high is None:
            return f"{kind} {'>=' if self.closed in ('left', 'both') else '>'} {self.low}"
        if self.low is None:
            return f"{kind} {'<=' if self.closed in ('right', 'both') else '<'} {self.high}"
        left = "[" if self.closed in ("left", "both") else "("
        right = "]" if self.closed in ("right", "both") else ")"
        return f"{kind} in {left}{self.low}, {self.high}{right}"


def _allowed(value, options: tuple) -> bool:
    """Whether ``value`` is one that a parameter's ``options`` allow."""
    for option in options:
        if isinstance(option, Interval):
            if value in option:
                return True
        elif option is bool:
            if isinstance(value, bool | np.bool_):
                return True
        elif option is dict:
            if isinstance(value, dict):
                return True
        elif option is None:
            if value is None:
                return True
        elif isinstance(value, str) and value == option:
            return True
    return False


def _described(option) -> str:
    if option is bool:
        return "True or False"
    if option is dict:
        return "a dict"
    return str(option) if isinstance(option, Interval) else repr(option)


def _check_route_memory(model, method, estimator_name: str) -> None:
    """Raise MemoryLimitError before Newton's first step if the method's peak of p × p
    matrices (its ``peak_covariances``, measured per route) cannot fit in memory.

    ``check_posterior_memory`` counts the three copies every route holds at the end; the
    routes hold more on the way (the Laplace fit's covariance and factor beside the
    method's own, the skewness correction's Gram and products, EP's sites): under an
    address-space limit, a fit sized by the three copies alone ended in NumPy's
    MemoryError near the limit.
    """
    p = model.dim
    copies = float(getattr(method, "peak_covariances", 10.0))
    chunks, fewer_chunks = "", ""
    if getattr(model, "design", None) is None:  # rows in dask chunks
        # A pass gathers one p × p result per chunk before their (compensated) sum.
        n_chunks = model.chunks.n_chunks
        copies += n_chunks + 2
        chunks = f", {n_chunks + 2} of them the sum of a pass over {n_chunks} dask chunks"
        fewer_chunks = ", or fewer, larger dask chunks (X.rechunk), each of which sends one"
    check_memory(
        8.0 * copies * p * p,
        f"the {estimator_name} posterior of {p} coefficients (its method holds about "
        f"{copies:g} {p} × {p} matrices, {format_bytes(8.0 * p * p)} each, at its peak"
        f"{chunks})",
        "Use fewer features (feature selection, e.g. sklearn.feature_selection, or a "
        "TruncatedSVD / random projection of X), or LaplaceLogisticRegression, which holds "
        f"the fewest such matrices{fewer_chunks}: the posterior's memory grows with the "
        "square of the number of features.",
    )


def _separated_hint(model, laplace) -> str:
    """The likelier cause of a failed fit when the mode separates the training rows (a
    method's own message names its symptom, such as too few samples, which more would not
    cure)."""
    if not separates_at(model, laplace.mean):
        return ""
    held = _likelihood_held_hint(model, laplace)
    if held:
        return held
    return (
        " The mode classifies every training row right: the classes are linearly "
        "separable, so the posterior is one-sided along the separating directions and "
        "reaches as far as the prior lets it, where neither this fit nor the Laplace "
        "approximation's Gaussian about the mode holds it (its predictions can be nearly "
        f"uniform, or favour wrong classes). Use a smaller C or a narrower prior "
        f"({CHOOSE_C})."
    )


def _likelihood_held_hint(model, laplace) -> str:
    """Where the likelihood holds the posterior about a separating mode — the skewness
    expansion in its range, as under weights of 10⁶ at C = 1, whose mode is C = 10⁶'s and
    whose spread is 10⁶ times narrower — the posterior is nearly Gaussian and the Laplace
    fallback accurate: the prior-limited one-sided posterior of the separable hint is not
    what happened, the arithmetic of so narrow a posterior is (docs/decisions.md, D-229);
    else ""."""
    if getattr(model, "coefficient_prior", None) is not None or model.n_observations < model.dim:
        return ""
    correction = skew_correction(model, laplace)
    if correction is None or not correction.in_range():
        return ""
    weights = np.asarray(model.sample_weight)
    heavy = f" under sample weights up to {weights.max():.3g}" if weights.max() > 1 else ""
    spread = np.linalg.eigvalsh(np.asarray(laplace.cov))
    return (
        f" The mode classifies every training row right, but the likelihood{heavy}, not "
        f"the prior, holds the posterior about it: the Laplace approximation's predicted "
        f"error is {correction.laplace_error:.3g} nats (from the likelihood's skewness at "
        f"the mode), so the fallback is the posterior to about that accuracy. What failed "
        f"is the arithmetic: the posterior's variances span a ratio of "
        f"{spread[-1] / spread[0]:.2g}, whose round-off the method's updates could not get "
        f"below."
    )


def _unseen_directions_hint(model, C: float) -> str:
    """The likelier cause of a posterior float64 cannot hold when the rows cannot see every
    direction: there the prior alone sets the variance, C, against the data's curvature of
    order one along the others (``C=1e30`` on 10 rows of 20 features)."""
    if model.dim <= model.n_observations or C < 1e12:
        return ""
    return (
        f" Here the {model.n_observations} rows cannot span the {model.dim} parameters: "
        f"along the directions they do not see the posterior keeps the prior's variance "
        f"C = {C:g}, too far beyond the others' for float64. Use a smaller C "
        f"({CHOOSE_C}), or fewer features than rows."
    )


class BayesianGLMClassifier(
    CallbackSupportMixin, BayesianUpdating, PosteriorPrediction, ClassifierMixin, BaseEstimator
):
    """Base class: Bayesian binary GLM; multinomial or one-vs-rest beyond two classes.

    A subclass sets ``_link`` (``"logistic"`` or ``"probit"``), ``_method`` and ``_title``
    (the method's short and long names, which the registry ``vsbayes.estimators.METHODS``
    reads), ``_posterior_method`` and, for parameters of its own, ``_constraints``.

    ``_posterior_method`` is a frozen dataclass whose fields are named after the
    estimator's parameters; ``fit`` makes one from them (a fresh object per fit) and calls
    its ``fit(model, laplace, rng)`` on each problem's likelihood model and Laplace
    approximation: it returns a :class:`~vsbayes.estimators._methods.MethodFit`. When it
    raises an :class:`~vsbayes.exceptions.EstimationError` (no valid Gaussian), the problem
    falls back to its Laplace approximation with an
    :class:`~vsbayes.exceptions.UnreliableFitWarning`, and ``laplace_fallback_`` records it
    (if the method's ``falls_back``; with ``records_strategy``, ``strategy_`` and its
    companions record each problem's route).

    With more than two classes, a subclass with ``_multinomial = True`` (the logistic link)
    fits the joint multinomial (softmax) posterior of all classes, as scikit-learn's
    ``LogisticRegression`` does: the method object gets the
    :class:`~vsbayes.models.SoftmaxGLMPosterior`. The others fit one binary posterior per
    class (one-vs-rest) and normalize.
    """

    _link: str = ""
    _method: str = ""
    _title: str = ""
    #: Whether more than two classes get the multinomial posterior (else one-vs-rest).
    _multinomial: bool = False
    #: The method object's class (see the class docstring).
    _posterior_method: ClassVar[type]
    #: What each checked parameter may be: values (strings, None), ``bool`` (True or
    #: False), ``dict`` (any dict) or an :class:`Interval`. (Not scikit-learn's
    #: ``_parameter_constraints``, whose format is its private module's.)
    _constraints: ClassVar[dict[str, tuple]] = {
        "penalty": ("deprecated", "l2", "l1", "elasticnet", None),
        "C": (Interval(Real, 0, closed="neither"),),
        "l1_ratio": (Interval(Real, 0, 1, closed="both"), None),
        "dual": (bool,),
        "tol": (Interval(Real, 0),),
        "fit_intercept": (bool,),
        "intercept_scaling": (Interval(Real, 0, closed="neither", finite=True),),
        # (Checked here, not by compute_class_weight, whose error names itself.)
        "class_weight": (dict, "balanced", None),
        "solver": SOLVERS,
        "max_iter": (Interval(Integral, 0),),
        "verbose": (Interval(Integral, 0),),
        "warm_start": (bool,),
        # joblib's convention: -1 all cores, -2 all but one, ...; 0 means nothing.
        "n_jobs": (None, Interval(Integral, 1), Interval(Integral, None, -1, closed="right")),
        "decay": (Interval(Real, 0, 1, closed="right"),),
        "buffer_size": (Interval(Integral, 0),),
    }

    # scikit-learn 1.9's LogisticRegression signature, in its order (its tol default is
    # 1e-4 for its own solvers; ours is Newton's decrement, see the docstrings).
    def __init__(
        self,
        penalty="deprecated",
        *,
        C=1.0,
        l1_ratio=0.0,
        dual=False,
        tol=1e-8,
        fit_intercept=True,
        intercept_scaling=1,
        class_weight=None,
        random_state=None,
        solver="lbfgs",
        max_iter=100,
        verbose=0,
        warm_start=False,
        n_jobs=None,
        prior=None,
        decay=1.0,
        buffer_size=100,
    ):
        self.penalty = penalty
        self.C = C
        self.l1_ratio = l1_ratio
        self.dual = dual
        self.tol = tol
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.class_weight = class_weight
        self.random_state = random_state
        self.solver = solver
        self.max_iter = max_iter
        self.verbose = verbose
        self.warm_start = warm_start
        self.n_jobs = n_jobs
        self.prior = prior
        self.decay = decay
        self.buffer_size = buffer_size

    # Every BLAS call of the fit on one thread (vsbayes._blas): the same bits whatever
    # the threads, and alone or beside other fits.
    @one_blas_thread
    def fit(self, X, y, sample_weight=None):
        """Fit the posterior of the coefficients.

        Beyond two classes, the logistic estimators with a multinomial form (Laplace, VS,
        IS, EP) fit the joint multinomial posterior, the others one binary posterior per
        class (one-vs-rest).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data (dense, pandas DataFrame or scipy.sparse; float32 is upcast).
        y : array-like of shape (n_samples,)
            Class labels (numbers or strings).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights, used as likelihood exponents ``F^{s_i}``; multiplied by
            the class weights. A row of weight 0 is a row absent: a class all of whose
            rows have weight 0 is left out of ``classes_``.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        self._check_params()
        flat = self._flat_prior() and self.prior is None  # a given prior replaces C
        factor = self._shrinkage_factor()
        method = self._new_posterior_method()
        if is_dask(X):
            if flat:
                raise ValueError(
                    "penalty=None (or C=np.inf) needs the rows in memory: whether the flat "
                    "prior gives a proper posterior is checked on them. Use a finite C, or "
                    "pass X.compute() if the data fit in memory."
                )
            X, y_index, weights, dtype = self._dask_fit_data(X, y, sample_weight)
        else:
            X, y_index, weights, dtype = self._fit_data(X, y, sample_weight)
        if self.solver == "liblinear":  # as LogisticRegression: liblinear is float64
            dtype = np.dtype(np.float64)
        n_classes = len(self.classes_)
        if self.solver == "liblinear" and n_classes > 2:
            raise ValueError(
                "The 'liblinear' solver does not support multiclass classification "
                "(n_classes >= 3), as in LogisticRegression. Use another solver (the "
                "multinomial posterior), or wrap the estimator in a OneVsRestClassifier to "
                "keep applying a one-versus-rest scheme."
            )
        if flat:
            check_flat_prior_is_proper(X, y_index, weights, n_classes, self.fit_intercept)
        self._check_shrinkage_route(factor, X, n_classes)
        priors = self._priors(X, weights, flat)
        if factor is not None:
            priors["coefficient_prior"] = factor
        rng = self._random_generator()
        problems = self._problems(y_index, n_classes)
        given = [None] * len(problems)  # the prior N(0, C·I) of each problem
        if self.prior is not None and factor is None:  # (the default fit stays in this file)
            given = self._problem_priors(X.shape[1], problems, self.classes_)
        observer = None
        try:
            # (Asked here, not in _callbacks.py: a fit without callbacks stays in this file.)
            if getattr(self, "_skl_callbacks", None) or hasattr(self, "_parent_callback_ctx"):
                observer = FitObserver.start(
                    self,
                    X,
                    lambda: self.classes_[y_index],
                    sample_weight,
                    len(problems),
                    self.classes_,
                    lambda fits: self._attributes_of(method, fits, X.shape[1], dtype, not flat),
                )
            fits = self._fit_problems(method, X, problems, weights, rng, priors, given, observer)
            if self.max_iter == 0:
                warn(
                    f"{type(self).__name__}: max_iter=0, so no iteration was run: the "
                    f"posterior is the prior (coefficients at their start, 0, as "
                    f"LogisticRegression's).",
                    ConvergenceWarning,
                )
            self._store(method, fits, X.shape[1], dtype, evidence_defined=not flat)
            if isinstance(method, LaplaceMethod) and self._is_multinomial() and not is_dask(X):
                _warn_if_predictive_leaves_the_mode(self, X, y_index, weights)
            vars(self).pop("_stream_class_counts_", None)
            if not is_dask(X):  # (loo checks its rows are these; a dask X is not read twice)
                self._training_fingerprint_ = TrainingFingerprint.of(X, y_index, weights)
                # (a stream after the fit tests its batches' class shares against these)
                counts = np.bincount(y_index[weights > 0], minlength=len(self.classes_))
                self._stream_class_counts_ = counts.astype(float)
            vars(self).pop("_stream_buffer", None)  # partial_fit restarts from this posterior
            vars(self).pop("_unseen_classes_", None)  # (fit's classes_ all have rows)
            self._coefficient_factor_ = factor  # the summary's relevance of each coefficient
            # Features no weighted row touches: their relevance is 0 (no data, all prior).
            self._untouched_features_ = None if factor is None else untouched_columns(X, weights)
            if observer is not None:
                observer.end()
        finally:
            if "_callback_fit_ctx" in vars(self):  # the callbacks' teardown, however it ends
                FitObserver.teardown(self)
        return self

    def _problems(self, y_index: np.ndarray, n_classes: int) -> list[tuple]:
        """``(labels, n_classes or None)`` of each problem (fit's and partial_fit's): the
        joint multinomial one over the class indices, else ±1 labels of each binary
        (one-vs-rest) problem."""
        if n_classes > 2 and self._multinomial:
            return [(y_index, n_classes)]
        targets = [y_index == 1] if n_classes == 2 else [y_index == k for k in range(n_classes)]
        return [(np.where(t, 1.0, -1.0), None) for t in targets]

    def _fit_problems(
        self, method, X, problems, weights, rng, priors, given, observer
    ) -> list[MethodFit]:
        """Each problem's fit (:meth:`_fit_problem`), its stages reported to ``observer``
        (None: to nobody)."""
        starts = self._warm_starts(problems, X.shape[1])
        watch = {}
        if observer is not None:  # what a callback sees of each problem
            pending = self._pending_prior(X.shape[1], priors, given)
            watch = {"observer": observer, "pending": pending}
        # One-vs-rest's problems warn alike (a forced structure, a prior's parameter):
        # once per fit (D-209), and those alike but for their figures once, naming the
        # classes (D-248).
        fits = []
        with observed(observer), each_once(), self._problems_alike(len(problems)) as problem:
            for k, (labels_weights, start, prior) in enumerate(
                zip(problems, starts, given, strict=True)
            ):
                with problem():
                    fits.append(
                        self._fit_problem(
                            method,
                            X,
                            *labels_weights,
                            weights,
                            rng,
                            priors,
                            start,
                            prior,
                            index=k,
                            n_problems=len(problems),
                            **watch,
                        )
                    )
        return fits

    @contextlib.contextmanager
    def _problems_alike(self, n_problems: int):
        """A block over one-vs-rest's problems (or the one problem) that gives a block per
        problem (``with problem():``), whose warnings are recorded apart and shown at the
        end, those alike but for their figures once, naming the classes (D-248)."""
        records = []

        @contextlib.contextmanager
        def problem():
            with catch(("always", Warning), record=True) as caught:
                records.append(caught)
                yield

        try:
            yield problem
        finally:
            classes = getattr(self, "classes_", ())
            names = classes if n_problems == len(classes) > 2 else range(n_problems)
            reemit_alike(records, list(names)[: len(records)])

    def _attributes_of(self, method, fits, n_features, dtype, evidence_defined) -> dict:
        """The fitted attributes ``fits`` would give (a callback's ``fitted_estimator``),
        the estimator itself unchanged."""
        view = copy.copy(self)
        view._store(method, fits, n_features, dtype, evidence_defined)
        return {k: v for k, v in vars(view).items() if k.endswith("_") and not k.startswith("_")}

    @staticmethod
    def _pending_prior(n_features: int, priors: dict, given: list):
        """``(k, structured) -> `` the prior of one-vs-rest problem ``k``, as a fit (a
        callback's view of the problems not reached yet); ``structured``: beside
        structured fits, as a "diagonal" structure (the prior is diagonal there), never a
        p × p matrix."""

        def pending(k: int, structured: bool = False) -> MethodFit:
            prior = given[k]
            if prior is not None and not structured:
                return prior_fit(prior.mean, prior.cov)
            if prior is not None:  # (a structured fit's given prior is diagonal)
                mean, variances = np.asarray(prior.mean), np.asarray(prior.variances)
            else:
                variances = np.broadcast_to(priors["prior_var"], (n_features,))
                if priors["intercept_prior_var"] is not None:
                    variances = np.append(variances, priors["intercept_prior_var"])
                mean = np.zeros(variances.size)
            if not structured:
                return prior_fit(mean, np.diag(variances))
            empty = np.zeros((variances.size, 0))
            diagonal = StructuredCovariance(variances, empty, np.zeros((0, 0)), "diagonal")
            return MethodFit.prior(StructuredGaussian(mean, diagonal))

        return pending

    def _flat_prior(self) -> bool:
        """Whether the prior is flat (``penalty=None`` or ``C=np.inf``); refuses what the
        priors cannot mean, as LogisticRegression refuses its solvers' combinations."""
        penalty = self.penalty
        ratio = self.l1_ratio
        if penalty not in ("deprecated", "elasticnet") and ratio is not None and 0 < ratio < 1:
            warn(  # LogisticRegression's words, which code may filter on
                f"l1_ratio parameter is only used when penalty is 'elasticnet'. Got "
                f"(penalty={penalty})",
                UserWarning,
            )
        if (penalty == "l2" and self.l1_ratio not in (0, None)) or (
            penalty == "l1" and self.l1_ratio != 1
        ):
            warn(
                f"Inconsistent values: penalty={penalty} with l1_ratio={self.l1_ratio}; "
                f"penalty decides (l1_ratio alone says the same, as in LogisticRegression).",
                UserWarning,
            )
        if penalty is None and self.C != 1.0:
            warn(
                "Setting penalty=None will ignore the C and l1_ratio parameters: the prior "
                "is flat.",
                UserWarning,
            )
        if penalty == "deprecated":  # scikit-learn 1.9: l1_ratio and C decide
            ratio = self.l1_ratio
            penalty = "l2" if ratio in (0, None) else "l1" if ratio == 1 else "elasticnet"
            if np.isinf(self.C):
                penalty = None
        if self.dual and self.solver != "liblinear":
            raise ValueError(
                f"Solver {self.solver} supports only dual=False, got dual=True (as in "
                f"LogisticRegression; the factorization, primal or dual, is chosen by the "
                f"problem's shape whatever the solver)."
            )
        flat = penalty is None or bool(np.isinf(self.C))
        if flat and self.solver == "liblinear":
            raise ValueError(
                "penalty=None is not supported for the liblinear solver (it penalizes the "
                "intercept), as in LogisticRegression."
            )
        return flat

    def _resolved_penalty(self):
        """The penalty that decides the prior: ``penalty``, or with "deprecated" (scikit-learn
        1.9's default) the one ``l1_ratio`` and ``C`` say; None if flat."""
        penalty = self.penalty
        if penalty == "deprecated":
            ratio = self.l1_ratio
            penalty = "l2" if ratio in (0, None) else "l1" if ratio == 1 else "elasticnet"
        if penalty is None or bool(np.isinf(self.C)):
            return None
        return penalty

    def _shrinkage_factor(self):
        """The non-Gaussian prior on the coefficients (a
        :class:`~vsbayes.models.shrinkage_priors.CoefficientFactor`), or None: ``prior`` if
        it is a shrinkage prior, else that of ``penalty="l1"`` (Laplace, scale C) or
        ``"elasticnet"`` (``∝ exp(-r|θ|/C - (1 - r)θ²/(2C))``, r = ``l1_ratio``)."""
        if isinstance(self.prior, SHRINKAGE_PRIORS):
            return self.prior.coefficient_factor()
        if self.prior is not None:
            return None
        penalty = self._resolved_penalty()
        if penalty == "l1":
            return elastic_net_factor(float(self.C), 1.0)
        if penalty == "elasticnet":
            if self.l1_ratio is None:
                raise ValueError(
                    "l1_ratio must be specified when penalty is elasticnet: a number in "
                    "[0, 1], the prior's Laplace share."
                )
            return elastic_net_factor(float(self.C), float(self.l1_ratio))
        return None

    def _coefficient_columns(self) -> dict:
        """The summary's marks under a shrinkage prior (see
        ``_summaries.shrinkage_columns``); none under a Gaussian one."""
        factor = getattr(self, "_coefficient_factor_", None)
        return {} if factor is None else _summaries.shrinkage_columns(self, factor)

    def _check_shrinkage_route(self, factor, X, n_classes: int) -> None:
        """Refuse what a shrinkage prior does not support, saying what does."""
        if factor is None:
            return
        if is_dask(X):
            # Named as set: a penalty's factor is a LaplacePrior the user never wrote.
            setting = (
                f"prior={self.prior!r}"
                if self.prior is not None
                else f"penalty={self.penalty!r}, C={self.C!r}"
            )
            raise ValueError(
                f"A shrinkage prior ({setting}) needs the rows in memory; pass X.compute() "
                f"if the data fit in memory."
            )
        if n_classes > 2 and self._multinomial:
            name = type(self).__name__
            if not self._posterior_method.multinomial_shrinkage:
                raise ValueError(
                    f"{name} fits more than two classes by sampling the multinomial "
                    f"posterior's class contrasts, whose posterior is separate from the "
                    f"shift directions' under a Gaussian prior only; under a shrinkage "
                    f"prior ({factor!r}) on every class's coefficients it is not. Use "
                    f"VSLogisticRegression, EPLogisticRegression or "
                    f"LaplaceLogisticRegression, or fit one-vs-rest, e.g. "
                    f"OneVsRestClassifier({name}(...))."
                )
            # (The log-concave priors are those with an L1 part: Laplace, elastic net.)
            if factor.l1 == 0 and self._posterior_method is not LaplaceMethod:
                raise ValueError(
                    f"{name} fits more than two classes with the multinomial EP, whose "
                    f"coefficient sites under a shrinkage prior need a proper Gaussian "
                    f"prior on the coefficients at every step; the {factor!r} prior is "
                    f"not log-concave, and its sites' precisions may be negative (binary "
                    f"EP's remedy, rerunning with them kept non-negative, biases the fit). "
                    f"Use penalty='l1' or 'elasticnet' (LaplacePrior), "
                    f"LaplaceLogisticRegression (StudentTPrior), or fit one-vs-rest, e.g. "
                    f"OneVsRestClassifier({name}(...))."
                )

    def _priors(self, X, weights, flat: bool) -> dict:
        """The models' prior variances: ``C`` (or the flat prior's, per coefficient) and
        the intercept's (liblinear's penalized intercept: ``C · intercept_scaling²``)."""
        intercept = INTERCEPT_PRIOR_VAR
        if self.solver == "liblinear":
            intercept = float(self.C) * float(self.intercept_scaling) ** 2
        prior_var = float(self.C)
        if self.prior is not None and np.isinf(prior_var):
            prior_var = 1.0  # a given prior replaces C, which is then unused (even np.inf)
        if flat:
            squares = X.multiply(X) if sp.issparse(X) else X * X
            curvature = np.asarray(squares.T @ weights).ravel() / 4.0
            prior_var = FLAT_PRIOR_FACTOR / curvature
            intercept = FLAT_PRIOR_FACTOR / (weights.sum() / 4.0)
        return {
            "prior_var": prior_var,
            "intercept_prior_var": intercept if self.fit_intercept else None,
        }

    def _warm_starts(self, problems: list, n_features: int) -> list:
        """Newton's start of each problem: the previous fit's posterior means with
        ``warm_start=True`` where they fit this fit's problems (as many problems, each
        mean of the problem's dimension: the features, the classes and ``fit_intercept``
        may have changed since), else None (zeros).

        (``n_features_in_`` cannot tell: ``fit`` has already reset it to this X's.)"""
        previous = getattr(self, "posteriors_", None)
        if not self.warm_start or previous is None or len(previous) != len(problems):
            return [None] * len(problems)
        per_class = n_features + int(self.fit_intercept)
        dims = [per_class * (1 if k is None else k) for _, k in problems]
        if any(np.size(g.mean) != dim for g, dim in zip(previous, dims, strict=True)):
            return [None] * len(problems)
        return [np.array(g.mean) for g in previous]

    def _random_generator(self):
        """The fit's generator: ``random_state``'s, or the default seed's."""
        return reproducible_generator(self.random_state)

    #: The one check of sample and class weights, shared with partial_fit
    #: (estimators/_updating.py).
    _checked_sample_weight = staticmethod(
        lambda weights, n, allow_zero=False: _validate_sample_weight(weights, n, allow_zero)
    )
    _checked_class_weights = staticmethod(checked_class_weights)

    def _check_params(self) -> None:
        """Raise an InvalidParameterError naming the first parameter outside
        ``_constraints``, what it may be and what it is."""
        for name, options in self._constraints.items():
            value = getattr(self, name)
            if _allowed(value, options):
                continue
            if all(isinstance(option, str) for option in options):
                expected = f"one of {list(options)}"
            else:
                described = [_described(option) for option in options]
                expected = " or ".join(filter(None, [", ".join(described[:-1]), described[-1]]))
            raise InvalidParameterError(f"{name} must be {expected}; got {value!r}.")

    def _new_posterior_method(self):
        """The method object of this fit, its fields from the parameters of the same names
        (and ``estimator_name``, for its messages)."""
        values = {name: getattr(self, name) for name in _method_parameters(type(self))}
        if "estimator_name" in _method_fields(self._posterior_method):
            values["estimator_name"] = type(self).__name__
        return self._posterior_method(**values)

    def _refuse_unreadable_input(self, X, y) -> None:
        """Dates in X, missing labels in y: refused with the remedy before
        ``validate_data`` (which passes the first and fails the second unclearly), by
        ``fit`` (:func:`_validate_training_data`) and ``partial_fit``."""
        _refuse_dates(X)
        _refuse_missing_labels(y)

    def _fit_data(self, X, y, sample_weight):
        """Checked in-memory ``(X, y_index, weights, dtype)``, X in float64 and ``dtype``
        the input's (float32 or float64: the fitted coefficients keep it); sets
        ``classes_``."""
        X, y = _validate_training_data(self, X, y)
        dtype = X.dtype
        X = X.astype(np.float64, copy=False)
        _refuse_overflowing_features(X)
        check_classification_targets(y)
        self.classes_, y_index = np.unique(y, return_inverse=True)
        self._check_n_classes()
        weights = _validate_sample_weight(sample_weight, X.shape[0])
        k = len(self.classes_)
        if self.class_weight is not None:
            totals = np.bincount(y_index, weights, minlength=k)
            weights = weights * class_weights(self.class_weight, self.classes_, totals)[y_index]
        y_index = self._weighted_classes(np.bincount(y_index, weights, minlength=k), y_index)
        return X, y_index, weights, dtype

    def _dask_fit_data(self, X, y, sample_weight):
        """``(X, y_index, weights, dtype)`` of a dask X, the first three lazy and chunked
        alike (checked where the chunks are), ``dtype`` as :meth:`_fit_data`'s; sets
        ``classes_``."""
        X, self.classes_, y_index, weights, weighted, dtype = validate_dask_fit_data(
            self, X, y, sample_weight
        )
        self._check_n_classes()
        if self.class_weight is not None:
            per_class = class_weights(self.class_weight, self.classes_, weighted)
            weights = class_weighted(weights, y_index, per_class)
            weighted = weighted * per_class
        y_index = self._weighted_classes(weighted, y_index)
        return X, y_index, weights, dtype

    def _check_n_classes(self) -> None:
        if len(self.classes_) < 2:
            raise ValueError(
                f"This solver needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {self.classes_[0].tolist()!r}."
            )

    def _weighted_classes(self, class_totals: np.ndarray, y_index):
        """``y_index`` over the classes of positive weight, which ``classes_`` keeps: a row
        of weight 0 is a row absent (scikit-learn's sample-weight semantics), so a class
        all of whose rows have weight 0 (a bagging bootstrap that drew none of them,
        ``class_weight`` 0) is one the data do not have. Fitted, it was the intercept's
        vague prior's tail, a wide Gaussian whose predictive gave it ~0.5 (D-148). The
        rows of such a class keep weight 0 under index 0. Refuses fewer than two classes
        of positive weight."""
        weighted = class_totals > 0
        if weighted.sum() < 2:
            only = self.classes_[weighted][0].tolist()
            raise ValueError(
                f"Only one class has non-zero sample weight ({only!r}); "
                f"fitting needs samples of at least 2 classes with positive weight. Check "
                f"sample_weight and class_weight."
            )
        if weighted.all():
            return y_index
        # Said aloud: code that combines estimators' probabilities by the classes of y
        # (VotingClassifier, StackingClassifier, CalibratedClassifierCV) assumes every
        # member has every class, and one column fewer can mislead it silently.
        warn(
            f"Class(es) {self.classes_[~weighted].tolist()!r} of y have no row of positive "
            f"weight (sample_weight times class_weight): a row of weight 0 is a row absent, "
            f"so classes_ leaves them out and predict_proba has {int(weighted.sum())} "
            f"columns. Tools that combine estimators by the classes of y "
            f"(VotingClassifier, StackingClassifier, CalibratedClassifierCV) need every "
            f"class: give those rows positive weight, or drop them from X and y.",
            UserWarning,
        )
        self.classes_ = self.classes_[weighted]
        index = np.maximum(np.cumsum(weighted) - 1, 0)
        return reindexed(y_index, index) if is_dask(y_index) else index[y_index]

    def _fit_problem(
        self,
        method,
        X,
        labels,
        n_classes,
        weights,
        rng,
        priors,
        start,
        prior=None,
        *,
        index=0,
        observer=None,
        pending=None,
        n_problems: int = 1,
    ) -> MethodFit:
        """The posterior of one problem: binary with ±1 ``labels`` (``n_classes`` None),
        else the multinomial one of ``n_classes`` with class indices ``labels`` (in
        scikit-learn's representative, :meth:`~vsbayes.models.SoftmaxGLMPosterior.centred`);
        Newton starts from ``start`` (None: zeros), or under ``prior`` (a
        :class:`~vsbayes.models.priors.GaussianPrior` that replaces ``priors``) from its
        mean. An ``observer`` (:class:`~vsbayes.estimators._callbacks.FitObserver`) sees the
        problem (number ``index``; ``pending(k)``: problem ``k``'s prior fit) and its
        stages. ``n_problems``: the problems of the fit (one-vs-rest: one per class),
        each of which takes the covariance structure a binary fit takes, sized beside the
        others' posteriors."""
        chunked = is_dask_array(X)
        n_jobs = self.n_jobs
        if prior is not None:
            model, finish = problem_model(self, X, labels, n_classes, weights, prior)
            newton, what = (
                (glm_laplace, "for this problem")
                if n_classes is None
                else (softmax_laplace, "of the multinomial posterior")
            )
            start = model.prior_mean  # θ's warm start is not the whitened model's
        elif n_classes is None:
            newton, what = glm_laplace, "for this problem"
            if chunked:
                model = ChunkedPosterior(X, labels, weights, self._link, **priors)
            else:
                model = BinaryGLMPosterior(X, labels, weights, self._link, n_jobs=n_jobs, **priors)
        else:
            newton, what = softmax_laplace, "of the multinomial posterior"
            if chunked:
                model = ChunkedSoftmaxPosterior(X, labels, weights, n_classes, **priors)
            else:
                model = SoftmaxGLMPosterior(X, labels, weights, n_classes, n_jobs=n_jobs, **priors)

        choice = _DENSE  # the covariance's structure, chosen below

        def stored(fit: MethodFit) -> MethodFit:
            """A fit of this problem as stored: in θ's coordinates (whitened priors), the
            multinomial in scikit-learn's representative; a structured one (an observer's
            view of a Newton iterate) as the structured fit stores it: already centred,
            never densified, its structure recorded."""
            if prior is not None:
                fit = finish(fit)
            if not isinstance(fit.posterior, StructuredGaussian) and n_classes is not None:
                fit = dataclasses.replace(fit, posterior=model.centred(fit.posterior))
            # (the reason of a dense one too: covariance_reason_ says why, whichever it is)
            return dataclasses.replace(
                fit, covariance=choice.structure, covariance_reason=choice.reason
            )

        watch = nullcontext() if observer is None else observer.problem(index, stored, pending)
        structured = False
        try:
            with watch:
                if self.max_iter == 0:
                    fit = MethodFit.prior(self._prior_of(model, prior))
                else:
                    # A diagonal Gaussian prior (the default, or a given one of one binary
                    # problem: the model's own N(μ₀, diag(v₀)), which the structured
                    # covariance takes as it is; an arrowhead one is diagonal in the
                    # model's coordinates), rows in memory.
                    diagonal = prior is None or (
                        n_classes is None and (prior.diagonal or prior.hub is not None)
                    )
                    plain = (
                        not chunked
                        and diagonal
                        and getattr(model, "coefficient_prior", None) is None
                        and getattr(model, "prior_precision", None) is None
                    )
                    if plain:
                        # The covariance's structure, from the problem's size and the memory
                        # limit, before the first Newton step (it refuses what none fits);
                        # a one-vs-rest problem's beside the other problems' posteriors.
                        choice = choose_covariance(model, type(self).__name__, n_problems)
                    if choice is _DENSE:  # no structure was chosen: none is taken here
                        why = _why_dense(chunked, prior, n_classes)
                        reason = refuse_forced_structure(type(self).__name__, *why)
                        choice = CovarianceChoice("dense", reason)
                    structured = choice.structure != "dense"
                    if structured:
                        fit = self._structured_fit(method, model, choice, start)
                        if prior is not None:  # in θ's coordinates (an arrowhead prior's)
                            fit = finish(fit)
                    else:
                        # (A method that runs no EP counts Newton's steps alone.)
                        steps = getattr(method, "shrinkage_steps", SHRINKAGE_STEPS)
                        if n_classes is None:  # sized before the first Newton step
                            remedy = _shrinkage_memory_remedy(model, n_problems)
                            check_shrinkage_size(model, type(self).__name__, remedy, steps)
                            check_posterior_memory(
                                model,
                                type(self).__name__,
                                under_prior=prior is not None,
                                remedy=remedy,
                            )
                            _check_route_memory(model, method, type(self).__name__)
                        else:  # (its size and memory: softmax_laplace, before Newton)
                            check_shrinkage_size(model, type(self).__name__, steps=steps)
                        fit = stored(self._posterior_fit(method, model, newton, what, start, rng))
                if observer is not None:
                    observer.done(fit)
        finally:
            if chunked:
                model.chunks.release()  # the chunks' copies of the rows, on the workers
        if self.verbose and not structured:  # (a structured fit prints its own)
            print(f"{type(self).__name__}: {fit.posterior!r}")
        return fit

    @staticmethod
    def _prior_of(model, prior) -> Gaussian:
        """The prior as a Gaussian (a fit with ``max_iter=0``): the given one, or the
        model's, a shrinkage prior's coefficients at its own spread (its Gaussian base is
        broad)."""
        if prior is not None:
            return Gaussian(prior.mean, prior.cov)
        variances = model.prior_var.copy()
        factor = getattr(model, "coefficient_prior", None)
        if factor is not None:  # (the multinomial's K·d coefficients come first too)
            variances[: getattr(model, "n_classes", 1) * model.n_features] = factor.start_var
        return Gaussian(np.zeros(model.dim), np.diag(variances))

    def _structured_fit(self, method, model, choice: CovarianceChoice, start) -> MethodFit:
        """The Laplace approximation with a structured covariance (``choice``): the other
        methods' fits (EP, sampling) need the dense p × p covariance, so every method stops
        there at this size, and says so (``covariance_reason_``; VS's ``strategy_``)."""
        name = type(self).__name__
        laplace_of = (
            structured_glm_laplace
            if getattr(model, "n_classes", None) is None
            else structured_softmax_laplace
        )
        try:
            laplace = laplace_of(
                model,
                choice,
                tol=self.tol,
                max_iter=self.max_iter,
                theta0=start,
                verbose=self.verbose,
            )
        # (LAPACK's eigensolver fails without a NotPositiveDefiniteError on a low-rank
        # factor whose scales span 1e300: numpy's "Eigenvalues did not converge".)
        except (NotPositiveDefiniteError, np.linalg.LinAlgError) as error:
            raise ValueError(
                f"{name}(C={self.C:g}): the posterior cannot be represented in float64 "
                f"({model.dim} parameters, {model.n_observations} rows): {error}"
                f"{_unseen_directions_hint(model, self.C)}"
            ) from error
        reason = (
            f"{choice.structure} covariance ({choice.reason}): the Laplace approximation, as "
            f"the other fits need the dense covariance"
        )
        _warn_estimated_evidence(name, laplace, choice)
        # VS records its route; it warns only where a route was asked for by name.
        asked = getattr(method, "strategy", "auto") != "auto"
        if not isinstance(method, LaplaceMethod) and (asked or not method.records_strategy):
            warn(
                f"{name}: with {model.dim} coefficients the posterior is the Laplace "
                f"approximation with a {choice.structure} covariance (the method's own fit "
                f"needs the dense {model.dim} × {model.dim} covariance); see "
                f"covariance_reason_, or force covariance='dense' with "
                f"vsbayes.config_context if it fits.",
                UserWarning,
            )
        if self.verbose:
            print(f"{name}: {laplace!r}")
        return MethodFit(
            laplace,
            laplace.n_iter,
            strategy="laplace",
            reason=reason,
            stop_reason="structured_covariance",
            covariance=choice.structure,
            covariance_reason=choice.reason,
        )

    def _posterior_fit(self, method, model, newton, what: str, start, rng) -> MethodFit:
        """Newton's method for the mode of ``model`` from ``start``, then ``method``'s fit
        from its Laplace approximation (in the model's coordinates)."""
        with catch(("always", ConvergenceWarning), record=True) as caught:
            try:
                laplace = newton(
                    model,
                    tol=self.tol,
                    max_iter=self.max_iter,
                    theta0=start,
                    verbose=self.verbose,
                )
            except NotPositiveDefiniteError as error:
                raise ValueError(
                    f"{type(self).__name__}(C={self.C:g}): the posterior cannot be "
                    f"represented in float64 ({model.dim} parameters, "
                    f"{model.n_observations} rows with positive weight): {error}"
                    f"{_unseen_directions_hint(model, self.C)}"
                ) from error
        unconverged = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
        reemit([w for w in caught if not issubclass(w.category, ConvergenceWarning)])
        if not unconverged:
            return self._method_fit(method, model, laplace, rng, what)
        # An unconverged mode is no start for EP or sampling: the fit stops at the Laplace
        # approximation of the last iterate, as LogisticRegression's stops at its solver's
        # last iterate.
        warn(
            f"{SOLVER_NOT_CONVERGED[self.solver].format(n_iter=laplace.n_iter)} "
            f"({type(self).__name__} finds the mode by Newton's method whatever the "
            f"solver; the posterior is the Laplace approximation at its last iterate. "
            f"{unconverged[0].message})",
            ConvergenceWarning,
        )
        return MethodFit.unconverged(laplace)

    def _method_fit(self, method, model, laplace, rng, what: str) -> MethodFit:
        """``method.fit``, or the Laplace approximation with an UnreliableFitWarning where
        it raises an EstimationError (no valid Gaussian)."""
        try:
            return method.fit(model, laplace, rng)
        except EstimationError as error:
            warn(
                f"{type(self).__name__}: {error} Falling back to the Laplace approximation "
                f"{what} (recorded in laplace_fallback_).{_separated_hint(model, laplace)}",
                UnreliableFitWarning,
            )
            return MethodFit.fallback(laplace)

    def _store(
        self, method, fits: list[MethodFit], n_features: int, dtype, evidence_defined: bool
    ) -> None:
        """The fitted attributes, from each problem's fit (one for the multinomial
        posterior, else one per binary problem): ``coef_`` and ``intercept_`` in the
        input's ``dtype``, as scikit-learn's linear models; the evidence NaN where it is
        undefined (a flat prior's, or no iteration run)."""
        posteriors = [f.posterior for f in fits]
        if len(posteriors) == 1 and len(self.classes_) > 2:  # one joint problem
            k, posterior = len(self.classes_), posteriors[0]
            mean = posterior.mean
            self.coef_ = mean[: k * n_features].reshape(k, n_features).copy()
            self.intercept_ = mean[k * n_features :].copy() if self.fit_intercept else np.zeros(k)
            structured = isinstance(posterior, StructuredGaussian)
            self.sigma_ = posterior.covariance if structured else _read_only(posterior.cov)
            self.log_marginal_likelihood_value_ = float(posterior.log_Z)
        elif all(isinstance(g, StructuredGaussian) for g in posteriors):  # never dense here
            # Binary: its one structured covariance; one-vs-rest: one per class, together.
            means = np.array([g.mean for g in posteriors])
            self.coef_ = means[:, :n_features]
            k = len(posteriors)
            self.intercept_ = means[:, n_features] if self.fit_intercept else np.zeros(k)
            covariances = [g.covariance for g in posteriors]
            evidence = np.array([float(g.log_Z) for g in posteriors])
            binary = k == 1
            self.sigma_ = covariances[0] if binary else StructuredCovariances(covariances)
            self.log_marginal_likelihood_value_ = float(evidence[0]) if binary else evidence
        else:
            means = np.array([g.mean for g in posteriors])
            self.coef_ = means[:, :n_features]
            self.intercept_ = means[:, n_features] if self.fit_intercept else np.zeros(len(means))
            covs = _read_only([g.cov for g in posteriors])
            evidence = np.array([g.log_Z for g in posteriors])
            binary = len(posteriors) == 1
            self.sigma_ = covs[0] if binary else covs
            self.log_marginal_likelihood_value_ = float(evidence[0]) if binary else evidence
        self.coef_ = self.coef_.astype(dtype, copy=False)
        self.intercept_ = self.intercept_.astype(dtype, copy=False)
        if not evidence_defined or self.max_iter == 0:
            self.log_marginal_likelihood_value_ = np.full_like(
                self.log_marginal_likelihood_value_, np.nan
            )[()]
        binary = len(fits) == 1
        structures = [f.covariance for f in fits]
        reasons = [f.covariance_reason for f in fits]
        self.covariance_structure_ = structures[0] if binary else np.array(structures)
        self.covariance_reason_ = reasons[0] if binary else reasons
        self.n_iter_ = np.array([f.n_iter for f in fits], dtype=np.int32)
        self.posteriors_ = posteriors
        # The reads' set-ups of this fit's sigma_ (its factors), kept from the first read
        # that needs one: made afresh by every fit, so that no read sees an earlier fit's.
        self._predictive_setup_ = PredictiveSetup()
        self._fitted_prior_ = self.prior  # (partial_fit refuses a later change it would ignore)
        # The rows behind the posterior: fit's sets them after this; a stream's are many
        # batches, not kept: partial_fit sets their count (leave-one-out's check).
        self._training_fingerprint_ = None
        self._fitted_intercept_ = self.fit_intercept  # (partial_fit's parameter vector)
        self._fitted_prior_scales_ = self._priors(None, None, False)  # (C's, as prior's)
        if method.falls_back:
            self.laplace_fallback_ = np.array([f.fell_back for f in fits])
        if method.records_strategy:
            self.strategy_ = np.array([f.strategy for f in fits])
            self.strategy_reason_ = [f.reason for f in fits]
            # A route that stopped at Laplace or EP records them in its fit, a global fit in
            # its posterior.
            self.kl_error_ = np.array(
                [
                    getattr(f.posterior, "kl_error", np.nan) if f.kl_error is None else f.kl_error
                    for f in fits
                ]
            )
            self.stop_reason_ = np.array(
                [f.stop_reason or getattr(f.posterior, "stop_reason", None) for f in fits],
                dtype=object,
            )

    def _is_multinomial(self) -> bool:
        """Whether the fit is one joint multinomial posterior (else binary or one-vs-rest)."""
        return self.coef_.shape[0] > 1 and self.sigma_.ndim == 2  # (coef_ may be sparsified)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def __sklearn_clone__(self):
        """``sklearn.base.clone``, keeping ``prior`` when it is a fitted estimator.

        scikit-learn clones a parameter that is an estimator, which unfits it: an earlier
        fit given as ``prior`` would reach ``cross_val_score``'s, ``GridSearchCV``'s or any
        meta-estimator's fits as an unfitted estimator, and they would fail.
        Its posterior is data, not a setting: the clone refers to the same fitted
        estimator (read, never changed, by ``fit``), as ``sklearn.frozen.FrozenEstimator``
        is kept by ``clone``.
        """
        prior = self.prior
        if getattr(prior, "posteriors_", None) is None:
            return super().__sklearn_clone__()
        without_prior = copy.copy(self)  # shallow: clone reads the parameters only
        without_prior.prior = None
        twin = BaseEstimator.__sklearn_clone__(without_prior)
        twin.prior = prior
        return twin


#: The choice of the problems that keep the dense covariance without a size check here
#: (dask chunks, a correlated prior, a shrinkage prior): theirs is sized where it is formed.
_DENSE = CovarianceChoice("dense", "")

#: A structured posterior whose exact Laplace evidence may lie farther than this (nats)
#: from its estimate warns at fit: 1 nat, a Bayes factor of e, is the smallest difference
#: a comparison of models by their evidence reads as positive.
EVIDENCE_WARN_WIDTH = 1.0

#: The start of that warning's text (empirical_bayes.py filters it in its candidates'
#: fits, whose estimated evidences it reports once, D-107).
ESTIMATED_EVIDENCE = "the evidence (log_marginal_likelihood_value_) is an estimate"


# Training rows on which a multinomial Laplace fit compares its predictive with its mode:
# a few, spread over the rows the mode classifies confidently (their predictive is the
# cost), the mode's probability that makes a row confident, and how many of them the
# predictive must move (one may sit near a tie of its rule).
MODE_CHECK_ROWS = 8
CONFIDENT_MODE = 0.99
MOVED_ROWS_WARNED = 2
# The warning's opening words.
PREDICTIVE_LEAVES_MODE = "the Laplace approximation's predictive leaves its mode"
# False while EmpiricalBayesClassifier explores its grid (its own warning names separable
# classes, and the check's cost would be paid at every C).
check_predictive_against_mode = contextvars.ContextVar("check_predictive", default=True)


def _warn_if_predictive_leaves_the_mode(estimator, X, y_index, weights) -> None:
    """Warn when a multinomial Laplace approximation predicts, on training rows its mode
    classifies right and confidently, other classes than its mode.

    Where classes are separated (all, or one from the rest), the posterior is one-sided
    along the separating directions, and the Gaussian about the mode, symmetric, puts as
    much mass on the wrong side; along the directions the separated rows barely narrow
    (the prior's C, the intercepts') its latent spread can dwarf the mode's margins, and
    the predictive then favours other classes (standardized digits at C = 100: a quarter
    of the training rows, at 1e4 all; iris at C = 1e8: 65 %; docs/differences.md). So the
    check runs where the mode separates some class from the rest (its rows all right, no
    other row in it), on rows whose class a posterior the Gaussian describes moves only
    near a tie, which a probability of ``CONFIDENT_MODE`` is not. Two classes keep the
    mode's sign and are not checked.
    """
    if not check_predictive_against_mode.get():
        return
    log_p = np.asarray(X @ estimator.coef_.T, dtype=np.float64) + estimator.intercept_
    log_p -= logsumexp(log_p, axis=1, keepdims=True)
    kept = weights > 0
    mode, labels = log_p[kept].argmax(axis=1), y_index[kept]
    wrong_in = np.bincount(mode[mode != labels], minlength=log_p.shape[1])
    wrong_out = np.bincount(labels[mode != labels], minlength=log_p.shape[1])
    if np.all((wrong_in > 0) | (wrong_out > 0)):  # no class separated from the rest
        return
    confident = np.flatnonzero(
        kept & (log_p.argmax(axis=1) == y_index) & (log_p.max(axis=1) >= np.log(CONFIDENT_MODE))
    )
    n_rows = min(MODE_CHECK_ROWS, len(confident))
    if n_rows < MOVED_ROWS_WARNED:
        return
    rows = confident[np.linspace(0, len(confident) - 1, n_rows).round().astype(int)]
    predicted = estimator._predictive().predicted_index(X[rows])
    moved = int(np.count_nonzero(predicted != y_index[rows]))
    if moved < MOVED_ROWS_WARNED:
        return
    warn(
        f"{type(estimator).__name__}: {PREDICTIVE_LEAVES_MODE}. Of "
        f"{n_rows} training rows the mode classifies right with probability at least "
        f"{CONFIDENT_MODE:g}, the predictive gives {moved} another class: classes are "
        f"separated (all, or some from the rest), so the posterior is one-sided along the "
        f"separating directions, and the Gaussian about the mode puts as much mass on the "
        f"wrong side, more as C grows; predict_proba is not the posterior's there. Use "
        f"VSLogisticRegression or EPLogisticRegression, which fit the one-sided posterior, "
        f"or a smaller C or narrower prior ({CHOOSE_C}).",
        UnreliableFitWarning,
    )


def _read_only(array) -> np.ndarray:
    """A read-only copy of ``array`` (a dense ``sigma_``): the reads keep what they compute
    from it (its factors, D-259), which an in-place change would leave stale."""
    out = np.array(array)
    out.flags.writeable = False
    return out


def _warn_estimated_evidence(name: str, laplace, choice: CovarianceChoice) -> None:
    """Warn where a structure the user forced has an evidence with an estimated ``log det``
    whose bounds leave the exact Laplace evidence more than EVIDENCE_WARN_WIDTH nats apart
    (D-178). A structure the fit chose for the problem's size records its bounds without a
    warning, as VS records its route: every wide multinomial fit would warn, of a number
    most of them never read (EmpiricalBayesClassifier, which compares them, warns, D-107)."""
    low, high = laplace.evidence_bounds
    if laplace.evidence_exact or high - low <= EVIDENCE_WARN_WIDTH or not choice.forced:
        return
    warn(
        f"{name}: {ESTIMATED_EVIDENCE}: its {laplace.covariance.structure} covariance's "
        f"log-determinant is estimated, and the exact Laplace evidence lies anywhere in "
        f"[{low:.6g}, {high:.6g}] around its {float(laplace.log_Z):.6g} (measured low, by "
        f"more at a larger C; posteriors_[i].evidence_bounds). Do not compare models "
        f"or C values by it; force covariance='dense' with vsbayes.config_context where it "
        f"fits in memory (binary: exact up to 4096 rows), or compare by cross-validation.",
        UnreliableFitWarning,
    )


def _shrinkage_memory_remedy(model, n_problems: int) -> str:
    """What would fit instead of a shrinkage prior's dense covariance ("" without one): the
    structure the Gaussian prior's fit of the ``n_problems`` binary problems takes (a
    shrinkage prior's sites are one per coefficient, on the dense posterior)."""
    factor = getattr(model, "coefficient_prior", None)
    if factor is None:
        return ""
    dense = (
        f"A shrinkage prior ({factor!r}) keeps the dense covariance (its sites, one per "
        f"coefficient, are fitted on it)"
    )
    try:
        with config_context(covariance="auto"):
            choice = choose_covariance(model, "", n_problems)
    except MemoryLimitError:
        return f"{dense}; under the Gaussian prior no covariance structure fits either."
    return (
        f"{dense}; the Gaussian prior (penalty='l2' or l1_ratio=0, no shrinkage prior=) "
        f"takes the '{choice.structure}' covariance, which fits."
    )


def _why_dense(chunked: bool, prior, n_classes: int | None) -> tuple[str, str]:
    """``(what, remedy)`` of a fit that keeps the dense covariance (see
    :meth:`BayesianGLMClassifier._fit_problem`), for :func:`refuse_forced_structure`."""
    if chunked:
        return "fit over dask chunks", "Fit rows in memory to take it."
    if prior is not None and n_classes is not None:
        return (
            "multinomial fit under a prior (prior=, or partial_fit's carried posterior)",
            "Fit all the rows with fit and no prior=, or stream one-vs-rest binary "
            "posteriors (sklearn.multiclass.OneVsRestClassifier(...).partial_fit), which take it.",
        )
    if prior is not None:
        return (
            "fit under a prior with correlated coefficients (a full covariance matrix)",
            "Give the prior as (mean, variances) to take it.",
        )
    return (
        "fit under a shrinkage prior (penalty='l1' or 'elasticnet', or a Laplace, Student-t "
        "or horseshoe prior)",
        "Use the Gaussian prior (penalty='l2') to take it.",
    )


def _validate_sample_weight(sample_weight, n_samples: int, allow_zero: bool = False) -> np.ndarray:
    """One finite, non-negative float64 weight per row, not all zero unless
    ``allow_zero`` (``None`` → ones).

    scikit-learn has no public check for this: its ``_check_sample_weight`` is private and
    changed across the versions we support (keywords in 1.6; all-zero weights pass on 1.6,
    are rejected on 1.9), so these few lines stand on its public ``check_array``.
    """
    if sample_weight is None:
        return np.ones(n_samples)
    if isinstance(sample_weight, numbers.Number):
        sample_weight = np.full(n_samples, sample_weight, dtype=np.float64)
    weights = check_array(
        sample_weight, ensure_2d=False, dtype=np.float64, input_name="sample_weight"
    )
    if weights.shape != (n_samples,):
        raise ValueError(
            f"sample_weight has shape {weights.shape}; expected one weight per sample, "
            f"shape ({n_samples},)."
        )
    if np.any(weights < 0):
        raise ValueError(NEGATIVE_SAMPLE_WEIGHT)
    if not (allow_zero or np.any(weights > 0)):
        raise ValueError("sample_weight is all zero; at least one weight must be positive.")
    return weights


def _refuse_overflowing_features(X) -> None:
    """:data:`OVERFLOWING_FEATURES` where a value of X squared overflows float64."""
    values = X.data if sp.issparse(X) else X
    if values.size == 0:
        return
    largest = max(float(values.max()), -float(values.min()))  # (no |X| temporary)
    if not np.isfinite(largest * largest):
        raise ValueError(OVERFLOWING_FEATURES.format(largest=largest))


def _refuse_dates(X) -> None:
    """A ValueError with the remedy where X holds dates or durations (numpy's datetime64 or
    timedelta64, a DataFrame's datetime columns): an array of them became nanosecond
    counts (~1e18), whose fit ran to a meaningless posterior, and a DataFrame with one
    raised numpy's ``DTypePromotionError``."""
    dtypes = getattr(X, "dtypes", None)  # a DataFrame's, one per column
    if dtypes is not None and hasattr(dtypes, "items"):
        columns = [(f"column {name!r} of X", dtype) for name, dtype in dtypes.items()]
    else:
        columns = [("X", getattr(X, "dtype", None))]
    for where, dtype in columns:
        # pandas' periods (kind "O") are dates too: numpy's float() of one, a TypeError.
        period = str(dtype).startswith("period[")
        if getattr(dtype, "kind", None) in ("M", "m") or period:
            raise ValueError(
                f"{where} holds dates or times ({dtype}), not numbers. Convert them to "
                f"numeric features first, e.g. days since a reference date, or the year, "
                f"month and weekday as columns."
            )


def _refuse_missing_labels(y) -> None:
    """A ValueError with the remedy where y has missing labels: scikit-learn's check of a
    nullable pandas y (``"string"``, ``"Int64"``, ``"boolean"``) holding ``pd.NA`` raised
    ``TypeError: boolean value of NA is ambiguous``, and its sort of text labels with a
    None, ``TypeError: '<' not supported between instances of 'NoneType' and 'str'``."""
    pandas = type(y).__module__.startswith("pandas") and hasattr(y, "isna")
    if pandas:
        missing = np.flatnonzero(np.asarray(y.isna()).ravel())
    elif isinstance(y, (list, tuple, np.ndarray)):
        labels = np.asarray(y)
        if labels.dtype != object:
            return
        # None, or NaN (a float column's missing value; pandas' text labels turned into an
        # object array): NaN alone is unequal to itself. (pandas' NA, whose comparison has
        # no truth value, exists only with pandas loaded: its isna then.)
        pandas_module = sys.modules.get("pandas")
        if pandas_module is not None:
            absent = np.asarray(pandas_module.isna(labels), dtype=bool)
        else:
            absent = np.equal(labels, None) | np.not_equal(labels, labels)
        missing = np.flatnonzero(absent.ravel())
    else:
        return
    if missing.size:
        example = " (e.g. keep = y.notna(); X[keep], y[keep])" if pandas else ""
        raise ValueError(
            f"y has {missing.size} missing label{'s' if missing.size > 1 else ''} (the "
            f"first at position {missing[0]}); a classifier needs every row's label: drop "
            f"those rows{example}."
        )


def _validate_training_data(estimator, X, y):
    """``validate_data`` for fit, with a remedy when X holds text, dates or times, or y
    misses labels."""
    _refuse_dates(X)
    _refuse_missing_labels(y)
    try:
        return validate_data(estimator, X, y, accept_sparse="csr", dtype=[np.float64, np.float32])
    except ValueError as error:
        if "could not convert" not in str(error):
            raise
        raise ValueError(
            f"X must be numeric ({error}). Encode text or categorical columns first, e.g. "
            f"with sklearn.preprocessing.OneHotEncoder in a ColumnTransformer."
        ) from error


@functools.cache
def _method_fields(method: type) -> frozenset[str]:
    """The fields a method object's constructor takes."""
    return frozenset(f.name for f in dataclasses.fields(method) if f.init)


@functools.cache
def _method_parameters(cls: type) -> tuple[str, ...]:
    """The parameters of estimator class ``cls`` its method object takes (its fields of
    the same names), read once per class: ``get_params``' reading of the signature costs
    about a tenth of a millisecond, which ``partial_fit`` spends at each refit of its
    buffer."""
    fields = _method_fields(cls._posterior_method)
    return tuple(name for name in cls._get_param_names() if name in fields)
