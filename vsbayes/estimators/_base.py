"""The one base class of the Bayesian GLM classifiers.

A public estimator is a thin subclass that picks a link (``_link``) and a posterior method
(``_posterior``, and ``_multinomial_posterior`` where the method has a multinomial form);
everything else — validation, the multinomial or one-vs-rest fits — lives here, and
prediction in its mixin :class:`~vsbayes.estimators._prediction.PosteriorPrediction`.
"""

from __future__ import annotations

import abc
import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_scalar
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
from ..approximations import expectation_propagation, glm_laplace, softmax_laplace
from ..approximations.expectation_propagation import DEFAULT_DAMPING
from ..engine import LaplaceResult
from ..exceptions import EstimationError, UnreliableFitWarning
from ..gaussian import Gaussian
from ..models import (
    BinaryGLMPosterior,
    ChunkedPosterior,
    ChunkedSoftmaxPosterior,
    SoftmaxGLMPosterior,
)
from ..models.dask_chunks import is_dask, is_dask_array
from ._dask_input import balanced_class_weight, class_weighted, validate_dask_fit_data
from ._prediction import PosteriorPrediction

__all__ = ["INTERCEPT_PRIOR_VAR", "BayesianGLMClassifier", "ep_posterior", "rows_in_memory"]

#: Prior variance of the intercept: N(0, 10⁶), vague on the logit/probit scale (so the MAP
#: matches scikit-learn's unpenalized intercept) yet proper (so the evidence is finite).
INTERCEPT_PRIOR_VAR = 1e6


def rows_in_memory(model) -> bool:
    """Whether the model holds its rows (else they are in dask chunks, on the workers)."""
    return getattr(model, "rows_in_memory", True)


def ep_posterior(
    model, laplace, *, tol: float, damping: float = DEFAULT_DAMPING, max_iter: int = 200
):
    """EP posterior (VS site fits; probit in closed form) started from the Laplace sites.

    ``tol`` is the estimator's: damped sweeps stop about the last change away from the
    fixed point, and a hundredth of it keeps results reproducible to about ``tol`` (e.g.
    weights ≡ duplicated rows).
    """
    return expectation_propagation(
        model, damping=damping, tol=1e-2 * tol, max_iter=max_iter, start=laplace.mean
    )


class BayesianGLMClassifier(
    PosteriorPrediction, ClassifierMixin, BaseEstimator, metaclass=abc.ABCMeta
):
    """Base class: Bayesian binary GLM; multinomial or one-vs-rest beyond two classes.

    Subclasses set ``_link`` (``"logistic"`` or ``"probit"``), ``_method`` and ``_title``
    (the method's short and long names, which the registry ``vsbayes.estimators.METHODS``
    reads) and implement
    ``_posterior(model, laplace, rng)``, which returns the posterior Gaussian (with
    diagnostics) of one binary problem given its Laplace approximation. When it raises an
    :class:`~vsbayes.exceptions.EstimationError` (no valid Gaussian), the problem falls back
    to its Laplace approximation with an :class:`~vsbayes.exceptions.UnreliableFitWarning`,
    and ``laplace_fallback_`` records it.

    With more than two classes, a subclass with ``_multinomial = True`` (the logistic link)
    fits the joint multinomial (softmax) posterior of all classes, as scikit-learn's
    ``LogisticRegression`` does: ``_multinomial_posterior(model, laplace, rng)`` returns it
    from the Laplace approximation of the :class:`~vsbayes.models.SoftmaxGLMPosterior`
    (default: that approximation itself), with the same fallback. The others fit one
    binary posterior per class (one-vs-rest) and normalize.
    """

    _link: str = ""
    _method: str = ""
    _title: str = ""
    #: Whether the method can fail and fall back to Laplace (``laplace_fallback_``).
    _falls_back: bool = True
    #: Whether more than two classes get the multinomial posterior (else one-vs-rest).
    _multinomial: bool = False

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

    # --- hooks of the subclasses ------------------------------------------------------

    @abc.abstractmethod
    def _posterior(self, model: BinaryGLMPosterior, laplace: LaplaceResult, rng) -> Gaussian:
        """The posterior Gaussian of one binary problem, given its Laplace approximation."""

    def _multinomial_posterior(
        self, model: SoftmaxGLMPosterior, laplace: LaplaceResult, rng
    ) -> Gaussian:
        """The joint posterior Gaussian of the multinomial model, given its Laplace one."""
        return laplace

    def _n_iter(self, posterior: Gaussian, laplace: LaplaceResult) -> int:
        """Iterations reported in ``n_iter_``: the method's own, else Newton's."""
        return getattr(posterior, "n_iter", laplace.n_iter)

    def _check_params(self) -> None:
        check_scalar(self.C, "C", numbers.Real, min_val=0, include_boundaries="neither")
        if not np.isfinite(self.C):
            raise ValueError(f"C must be finite; got {self.C!r}.")
        check_scalar(self.max_iter, "max_iter", numbers.Integral, min_val=1)
        check_scalar(self.tol, "tol", numbers.Real, min_val=0)
        check_scalar(self.verbose, "verbose", numbers.Integral, min_val=0)
        if not isinstance(self.fit_intercept, bool | np.bool_):
            raise ValueError(f"fit_intercept must be True or False; got {self.fit_intercept!r}.")

    def _n_jobs(self) -> int | None:
        """Workers of the likelihood's passes: the sampling estimators' ``n_jobs``."""
        return None

    # --- fitting ----------------------------------------------------------------------

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
        if is_dask(X):
            X, y_index, weights = self._dask_fit_data(X, y, sample_weight)
        else:
            X, y_index, weights = self._fit_data(X, y, sample_weight)
        rng = as_generator(self.random_state)
        n_classes = len(self.classes_)
        if n_classes > 2 and self._multinomial:
            self._store_multinomial(*self._fit_multinomial(X, y_index, weights, rng), X.shape[1])
            return self
        targets = [y_index == 1] if n_classes == 2 else [y_index == k for k in range(n_classes)]
        fits = [self._fit_binary(X, np.where(t, 1.0, -1.0), weights, rng) for t in targets]
        self._store([f[0] for f in fits], [f[1] for f in fits], X.shape[1])
        return self

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

    def _or_laplace(self, posterior_of, model, laplace, rng, what: str):
        """``posterior_of(model, laplace, rng)``, or the Laplace approximation with an
        UnreliableFitWarning when that raises an EstimationError."""
        try:
            posterior = posterior_of(model, laplace, rng)
        except EstimationError as error:
            warn(
                f"{type(self).__name__}: {error} Falling back to the Laplace approximation "
                f"{what} (recorded in laplace_fallback_).",
                UnreliableFitWarning,
            )
            posterior = laplace
        if self.verbose:
            print(f"{type(self).__name__}: {posterior!r}")
        return posterior

    def _fit_binary(self, X, y_pm, weights, rng) -> tuple[Gaussian, LaplaceResult]:
        priors = {
            "prior_var": float(self.C),
            "intercept_prior_var": INTERCEPT_PRIOR_VAR if self.fit_intercept else None,
        }
        if is_dask_array(X):
            model = ChunkedPosterior(X, y_pm, weights, self._link, **priors)
        else:
            model = BinaryGLMPosterior(
                X, y_pm, weights, self._link, n_jobs=self._n_jobs(), **priors
            )
        try:
            laplace = glm_laplace(model, tol=self.tol, max_iter=self.max_iter, verbose=self.verbose)
            posterior = self._or_laplace(self._posterior, model, laplace, rng, "for this problem")
        finally:
            if is_dask_array(X):
                model.chunks.release()  # the chunks' copies of the rows, on the workers
        return posterior, laplace

    def _fit_multinomial(self, X, y_index, weights, rng) -> tuple[Gaussian, LaplaceResult]:
        k = len(self.classes_)
        priors = {
            "prior_var": float(self.C),
            "intercept_prior_var": INTERCEPT_PRIOR_VAR if self.fit_intercept else None,
        }
        if is_dask_array(X):
            model = ChunkedSoftmaxPosterior(X, y_index, weights, k, **priors)
        else:
            model = SoftmaxGLMPosterior(X, y_index, weights, k, n_jobs=self._n_jobs(), **priors)
        try:
            laplace = softmax_laplace(
                model, tol=self.tol, max_iter=self.max_iter, verbose=self.verbose
            )
            posterior = self._or_laplace(
                self._multinomial_posterior, model, laplace, rng, "of the multinomial posterior"
            )
        finally:
            if is_dask_array(X):
                model.chunks.release()
        return posterior, laplace

    def _store_multinomial(self, posterior: Gaussian, laplace: LaplaceResult, n_features):
        k = len(self.classes_)
        mean = posterior.mean
        self.coef_ = mean[: k * n_features].reshape(k, n_features).copy()
        self.intercept_ = mean[k * n_features :].copy() if self.fit_intercept else np.zeros(k)
        self.sigma_ = np.array(posterior.cov)
        self.log_marginal_likelihood_value_ = float(posterior.log_Z)
        self.n_iter_ = np.array([self._n_iter(posterior, laplace)], dtype=np.int32)
        self.posteriors_ = [posterior]
        if self._falls_back:
            self.laplace_fallback_ = np.array([posterior is laplace])

    def _is_multinomial(self) -> bool:
        """Whether the fit is one joint multinomial posterior (else binary or one-vs-rest)."""
        return len(self.coef_) > 1 and self.sigma_.ndim == 2

    def _store(self, posteriors: list[Gaussian], laplaces: list[LaplaceResult], n_features):
        means = np.array([g.mean for g in posteriors])
        self.coef_ = means[:, :n_features]
        self.intercept_ = means[:, n_features] if self.fit_intercept else np.zeros(len(means))
        covs = np.array([g.cov for g in posteriors])
        evidence = np.array([g.log_Z for g in posteriors])
        binary = len(posteriors) == 1
        self.sigma_ = covs[0] if binary else covs
        self.log_marginal_likelihood_value_ = float(evidence[0]) if binary else evidence
        self.n_iter_ = np.array(
            [self._n_iter(g, lap) for g, lap in zip(posteriors, laplaces, strict=True)],
            dtype=np.int32,
        )
        self.posteriors_ = posteriors
        if self._falls_back:
            self.laplace_fallback_ = np.array(
                [g is lap for g, lap in zip(posteriors, laplaces, strict=True)]
            )

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
