"""The one base class of the Bayesian GLM classifiers, and its parameter checker.

``fit`` enters once and only moves down: the parameters (declared in ``_constraints``),
the data, then per problem the likelihood model, its Laplace approximation and the
estimator's method object (``_posterior_method``: ``_methods.py``, ``_sampling.py``,
``_strategy.py``), which returns the posterior with its record; the results are stored
last. A public estimator is a thin subclass that picks a link (``_link``) and a method;
prediction lives in the mixin :class:`~vsbayes.estimators._prediction.PosteriorPrediction`.
"""

from __future__ import annotations

import dataclasses
import numbers
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    check_array,
    check_non_negative,
    validate_data,
)

from .._blas import one_blas_thread
from .._random import as_generator
from .._warnings import warn
from ..approximations import glm_laplace, softmax_laplace
from ..approximations._glm_gaussian import check_posterior_memory
from ..exceptions import EstimationError, UnreliableFitWarning
from ..models import (
    BinaryGLMPosterior,
    ChunkedPosterior,
    ChunkedSoftmaxPosterior,
    SoftmaxGLMPosterior,
)
from ..models.dask_chunks import is_dask, is_dask_array
from ._dask_input import balanced_class_weight, class_weighted, validate_dask_fit_data
from ._methods import MethodFit
from ._prediction import PosteriorPrediction

__all__ = [
    "INTERCEPT_PRIOR_VAR",
    "BayesianGLMClassifier",
    "Interval",
    "InvalidParameterError",
]

#: Prior variance of the intercept: N(0, 10⁶), vague on the logit/probit scale (so the MAP
#: matches scikit-learn's unpenalized intercept) yet proper (so the evidence is finite).
INTERCEPT_PRIOR_VAR = 1e6


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
        elif option is None:
            if value is None:
                return True
        elif isinstance(value, str) and value == option:
            return True
    return False


def _described(option) -> str:
    if option is bool:
        return "True or False"
    return str(option) if isinstance(option, Interval) else repr(option)


class BayesianGLMClassifier(PosteriorPrediction, ClassifierMixin, BaseEstimator):
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
    #: False) or an :class:`Interval`. (Not scikit-learn's ``_parameter_constraints``,
    #: whose format is its private module's.)
    _constraints: ClassVar[dict[str, tuple]] = {
        "C": (Interval(Real, 0, closed="neither", finite=True),),
        "fit_intercept": (bool,),
        "max_iter": (Interval(Integral, 1),),
        "tol": (Interval(Real, 0),),
        "verbose": (Interval(Integral, 0),),
    }

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        max_iter=100,
        tol=1e-8,
        random_state=None,
        verbose=0,
    ):
        self.C = C
        self.fit_intercept = fit_intercept
        self.class_weight = class_weight
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.verbose = verbose

    # Every BLAS call of the fit on one thread (vsbayes._blas): the same bits whatever
    # the threads, and alone or beside other fits.
    @one_blas_thread
    def fit(self, X, y, sample_weight=None):
        """Fit the posterior of the coefficients.

        Beyond two classes, the logistic estimators with a multinomial form (Laplace, VS,
        IS, BMC) fit the joint multinomial posterior, the others one binary posterior per
        class (one-vs-rest).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data (dense, pandas DataFrame or scipy.sparse; float32 is upcast).
        y : array-like of shape (n_samples,)
            Class labels (numbers or strings).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights, used as likelihood exponents ``F^{s_i}``; multiplied by
            the class weights.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        self._check_params()
        method = self._new_posterior_method()
        if is_dask(X):
            X, y_index, weights = self._dask_fit_data(X, y, sample_weight)
        else:
            X, y_index, weights = self._fit_data(X, y, sample_weight)
        rng = as_generator(self.random_state)
        n_classes = len(self.classes_)
        if n_classes > 2 and self._multinomial:
            problems = [(y_index, n_classes)]  # one joint problem over the class indices
        else:  # ±1 labels of each binary problem
            targets = [y_index == 1] if n_classes == 2 else [y_index == k for k in range(n_classes)]
            problems = [(np.where(t, 1.0, -1.0), None) for t in targets]
        fits = [self._fit_problem(method, X, *problem, weights, rng) for problem in problems]
        self._store(method, fits, X.shape[1])
        return self

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
        values = {**self.get_params(deep=False), "estimator_name": type(self).__name__}
        fields = dataclasses.fields(self._posterior_method)
        return self._posterior_method(
            **{f.name: values[f.name] for f in fields if f.init and f.name in values}
        )

    def _fit_data(self, X, y, sample_weight):
        """Checked in-memory ``(X, y_index, weights)``; sets ``classes_``."""
        X, y = _validate_training_data(self, X, y)
        check_classification_targets(y)
        self.classes_, y_index = np.unique(y, return_inverse=True)
        self._check_n_classes()
        weights = _validate_sample_weight(sample_weight, X.shape[0])
        if self.class_weight is not None:
            per_class = compute_class_weight(self.class_weight, classes=self.classes_, y=y)
            weights = weights * per_class[y_index]
        self._check_weighted_classes(np.bincount(y_index, weights, minlength=len(self.classes_)))
        return X, y_index, weights

    def _dask_fit_data(self, X, y, sample_weight):
        """``(X, y_index, weights)`` of a dask X, all lazy and chunked alike (checked where
        the chunks are); sets ``classes_``."""
        X, self.classes_, y_index, weights, counts, weighted = validate_dask_fit_data(
            self, X, y, sample_weight
        )
        self._check_n_classes()
        if self.class_weight is not None:
            if isinstance(self.class_weight, str) and self.class_weight == "balanced":
                per_class = balanced_class_weight(counts)
            else:
                per_class = compute_class_weight(
                    self.class_weight, classes=self.classes_, y=self.classes_
                )
            weights = class_weighted(weights, y_index, per_class)
            weighted = weighted * per_class
        self._check_weighted_classes(weighted)
        return X, y_index, weights

    def _check_n_classes(self) -> None:
        if len(self.classes_) < 2:
            raise ValueError(
                f"This solver needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {self.classes_[0].tolist()!r}."
            )

    def _check_weighted_classes(self, class_totals: np.ndarray) -> None:
        weighted = class_totals > 0
        if weighted.sum() < 2:
            only = self.classes_[weighted][0].tolist()
            raise ValueError(
                f"Only one class has non-zero sample weight ({only!r}); "
                f"fitting needs samples of at least 2 classes with positive weight. Check "
                f"sample_weight and class_weight."
            )

    def _fit_problem(self, method, X, labels, n_classes, weights, rng) -> MethodFit:
        """The posterior of one problem: binary with ±1 ``labels`` (``n_classes`` None),
        else the multinomial one of ``n_classes`` with class indices ``labels``."""
        priors = {
            "prior_var": float(self.C),
            "intercept_prior_var": INTERCEPT_PRIOR_VAR if self.fit_intercept else None,
        }
        chunked = is_dask_array(X)
        n_jobs = getattr(self, "n_jobs", None)  # the sampling estimators' parameter
        if n_classes is None:
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
        try:
            if n_classes is None:  # sized before the first Newton step
                check_posterior_memory(model, type(self).__name__)
            laplace = newton(model, tol=self.tol, max_iter=self.max_iter, verbose=self.verbose)
            try:
                fit = method.fit(model, laplace, rng)
            except EstimationError as error:
                warn(
                    f"{type(self).__name__}: {error} Falling back to the Laplace "
                    f"approximation {what} (recorded in laplace_fallback_).",
                    UnreliableFitWarning,
                )
                fit = MethodFit.fallback(laplace)
        finally:
            if chunked:
                model.chunks.release()  # the chunks' copies of the rows, on the workers
        if self.verbose:
            print(f"{type(self).__name__}: {fit.posterior!r}")
        return fit

    def _store(self, method, fits: list[MethodFit], n_features: int) -> None:
        """The fitted attributes, from each problem's fit (one for the multinomial
        posterior, else one per binary problem)."""
        posteriors = [f.posterior for f in fits]
        if len(posteriors) == 1 and len(self.classes_) > 2:  # one joint problem
            k, posterior = len(self.classes_), posteriors[0]
            mean = posterior.mean
            self.coef_ = mean[: k * n_features].reshape(k, n_features).copy()
            self.intercept_ = mean[k * n_features :].copy() if self.fit_intercept else np.zeros(k)
            self.sigma_ = np.array(posterior.cov)
            self.log_marginal_likelihood_value_ = float(posterior.log_Z)
        else:
            means = np.array([g.mean for g in posteriors])
            self.coef_ = means[:, :n_features]
            self.intercept_ = means[:, n_features] if self.fit_intercept else np.zeros(len(means))
            covs = np.array([g.cov for g in posteriors])
            evidence = np.array([g.log_Z for g in posteriors])
            binary = len(posteriors) == 1
            self.sigma_ = covs[0] if binary else covs
            self.log_marginal_likelihood_value_ = float(evidence[0]) if binary else evidence
        self.n_iter_ = np.array([f.n_iter for f in fits], dtype=np.int32)
        self.posteriors_ = posteriors
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
        return len(self.coef_) > 1 and self.sigma_.ndim == 2

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


def _validate_sample_weight(sample_weight, n_samples: int) -> np.ndarray:
    """One finite, non-negative float64 weight per row, not all zero (``None`` → ones).

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
    check_non_negative(weights, "sample_weight")
    if not np.any(weights > 0):
        raise ValueError("sample_weight is all zero; at least one weight must be positive.")
    return weights


def _validate_training_data(estimator, X, y):
    """``validate_data`` for fit, with a remedy when X holds text."""
    try:
        return validate_data(estimator, X, y, accept_sparse="csr", dtype=np.float64)
    except ValueError as error:
        if "could not convert" not in str(error):
            raise
        raise ValueError(
            f"X must be numeric ({error}). Encode text or categorical columns first, e.g. "
            f"with sklearn.preprocessing.OneHotEncoder in a ColumnTransformer."
        ) from error
