"""The one base class of the Bayesian GLM classifiers.

A public estimator is a thin subclass that picks a link (``_link``) and a posterior method
(``_posterior``, and ``_multinomial_posterior`` where the method has a multinomial form);
everything else — validation, the multinomial or one-vs-rest fits, prediction — lives here.
"""

from __future__ import annotations

import abc
import numbers

import numpy as np
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_scalar
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    check_array,
    check_is_fitted,
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
from ..models import BinaryGLMPosterior, SoftmaxGLMPosterior, get_link
from ..models.softmax_predictive import softmax_predictive_log_proba
from ._latent import LatentMoments
from ._softmax_latent import SoftmaxLatent

__all__ = ["INTERCEPT_PRIOR_VAR", "BayesianGLMClassifier", "ep_posterior"]

#: Prior variance of the intercept: N(0, 10⁶), vague on the logit/probit scale (so the MAP
#: matches scikit-learn's unpenalized intercept) yet proper (so the evidence is finite).
INTERCEPT_PRIOR_VAR = 1e6


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


class BayesianGLMClassifier(ClassifierMixin, BaseEstimator, metaclass=abc.ABCMeta):
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
        X, y = _validate_training_data(self, X, y)
        check_classification_targets(y)
        self.classes_, y_index = np.unique(y, return_inverse=True)
        n_classes = len(self.classes_)
        if n_classes < 2:
            raise ValueError(
                f"This solver needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {self.classes_[0].tolist()!r}."
            )
        weights = _validate_sample_weight(sample_weight, X.shape[0])
        if self.class_weight is not None:
            per_class = compute_class_weight(self.class_weight, classes=self.classes_, y=y)
            weights = weights * per_class[y_index]
        weighted = np.bincount(y_index, weights, minlength=n_classes) > 0
        if weighted.sum() < 2:
            only = self.classes_[weighted][0].tolist()
            raise ValueError(
                f"Only one class has non-zero sample weight ({only!r}); "
                f"fitting needs samples of at least 2 classes with positive weight. Check "
                f"sample_weight and class_weight."
            )
        rng = as_generator(self.random_state)
        if n_classes > 2 and self._multinomial:
            self._store_multinomial(*self._fit_multinomial(X, y_index, weights, rng), X.shape[1])
            return self
        targets = [y_index == 1] if n_classes == 2 else [y_index == k for k in range(n_classes)]
        fits = [self._fit_binary(X, np.where(t, 1.0, -1.0), weights, rng) for t in targets]
        self._store([f[0] for f in fits], [f[1] for f in fits], X.shape[1])
        return self

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
        model = BinaryGLMPosterior(
            X,
            y_pm,
            weights,
            self._link,
            prior_var=float(self.C),
            intercept_prior_var=INTERCEPT_PRIOR_VAR if self.fit_intercept else None,
            n_jobs=self._n_jobs(),
        )
        laplace = glm_laplace(model, tol=self.tol, max_iter=self.max_iter, verbose=self.verbose)
        posterior = self._or_laplace(self._posterior, model, laplace, rng, "for this problem")
        return posterior, laplace

    def _fit_multinomial(self, X, y_index, weights, rng) -> tuple[Gaussian, LaplaceResult]:
        model = SoftmaxGLMPosterior(
            X,
            y_index,
            weights,
            len(self.classes_),
            prior_var=float(self.C),
            intercept_prior_var=INTERCEPT_PRIOR_VAR if self.fit_intercept else None,
            n_jobs=self._n_jobs(),
        )
        laplace = softmax_laplace(model, tol=self.tol, max_iter=self.max_iter, verbose=self.verbose)
        posterior = self._or_laplace(
            self._multinomial_posterior, model, laplace, rng, "of the multinomial posterior"
        )
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

    # --- prediction -------------------------------------------------------------------

    def latent_mean_and_variance(self, X):
        """Posterior mean and variance of the latent value ``f = x·w + b`` at each row of X.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        mean, var : ndarray of shape (n_samples,) for two classes, else (n_samples, n_classes)
            One column per one-vs-rest problem; for the multinomial posterior, one per class
            of the centred latent value ``f_k − mean_l f_l`` (the softmax is invariant to a
            common shift, along which the posterior is its prior).
        """
        X = self._validate_prediction_data(X)
        if self._is_multinomial():
            latent = SoftmaxLatent(X, self.coef_, self.intercept_, self.sigma_)
            mean = np.empty((X.shape[0], len(self.coef_)))
            var = np.empty_like(mean)
            for rows in latent.chunks:
                m, cov = latent(rows)
                mean[rows] = m - m.mean(axis=1, keepdims=True)
                var[rows] = np.einsum("nkk->nk", cov)
            return mean, var
        latent = self._latent(X)
        mean = np.empty((X.shape[0], len(self.coef_)))
        var = np.empty_like(mean)

        def work(rows):
            mean[rows], var[rows] = latent(rows)

        latent.run(work)
        if len(self.coef_) == 1:
            return mean[:, 0], var[:, 0]
        return mean, var

    def _validate_prediction_data(self, X):
        check_is_fitted(self)
        return validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)

    def _latent(self, X) -> LatentMoments:
        covs = self.sigma_[None] if self.sigma_.ndim == 2 else self.sigma_
        return LatentMoments(X, self.coef_, self.intercept_, covs)

    def _class_log_proba(self, X, combine, width):
        """``combine(log p, log(1-p))`` of the one-vs-rest problems, chunk by chunk of rows.

        The predictive runs on each chunk's latent moments, so that its temporaries stay
        within the chunks' memory bound (chunks run side by side on the threads BLAS may use;
        see :class:`LatentMoments`); ``combine`` maps the chunk's (rows, problems)
        log-probabilities to its rows of the (n_samples, width) result.
        """
        X = self._validate_prediction_data(X)
        latent = self._latent(X)
        predictive = get_link(self._link).predictive_log_proba
        out = np.empty((X.shape[0], width))

        def work(rows):
            result = combine(*predictive(*latent(rows)))
            if isinstance(result, tuple):  # columns
                for column, values in enumerate(result):
                    out[rows, column] = values[:, 0]
            else:
                out[rows] = result

        latent.run(work)
        return out

    def predict_log_proba(self, X):
        """Log of :meth:`predict_proba`, computed in the log domain.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        return self._log_proba(X, np.asarray)

    def _log_proba(self, X, transform):
        """``transform`` of the normalized log predictive probabilities, chunk by chunk."""
        check_is_fitted(self)
        if self._is_multinomial():
            return self._softmax_log_proba(X, transform)
        if len(self.coef_) == 1:
            # Two classes: log(1 - p) and log p, already complementary.
            return self._class_log_proba(
                X, lambda log_p, log_q: (transform(log_q), transform(log_p)), 2
            )
        return self._class_log_proba(
            X,
            lambda log_p, _: transform(log_p - logsumexp(log_p, axis=1, keepdims=True)),
            len(self.coef_),
        )

    def _softmax_log_proba(self, X, transform):
        """``transform`` of the multinomial posterior's log predictive, chunk by chunk."""
        X = self._validate_prediction_data(X)
        latent = SoftmaxLatent(X, self.coef_, self.intercept_, self.sigma_)
        out = np.empty((X.shape[0], len(self.coef_)))

        def work(rows):
            log_p = softmax_predictive_log_proba(*latent(rows), max_bytes=latent.budget)
            out[rows] = transform(log_p)

        latent.run(work)
        return out

    def predict_proba(self, X):
        """Posterior predictive class probabilities.

        For two classes, ``P(y = classes_[1] | x) = ∫ F(f) N(f; m(x), v(x)) df`` with the
        posterior mean ``m`` and variance ``v`` of the latent value: exactly
        ``Φ(m / √(1 + v))`` for probit; for logistic a few closed-form terms per row
        (Gauss–Hermite or a mixture of probits) with a relative error below 1e-7 on the
        smaller of the two probabilities (a quadrature for the rare rows where their bound
        does not give that; see
        :func:`~vsbayes.models.predictive.logistic_predictive_log_proba`). With more
        classes, for the multinomial posterior ``∫ softmax(f) N(f; m(x), S(x)) df`` over the
        K latent values, by a deterministic rule: a 64² trapezoid rule for three classes
        (absolute error ≤ 1e-5 where the centred latent's variance is ≤ 40 in every
        direction), and beyond, quasi-Monte Carlo refined row by row until three estimated
        standard errors are below 1e-3 (4096 to 65,536 nodes; see
        :mod:`vsbayes.models.softmax_predictive`); for one-vs-rest, the binary
        probabilities normalized.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Columns in the order of ``classes_``.
        """
        # exp of predict_log_proba, taken chunk by chunk.
        return self._log_proba(X, np.exp)

    def decision_function(self, X):
        """Logit of the predictive probability of each one-vs-rest problem.

        Monotone in :meth:`predict_proba` (positive means class ``classes_[1]`` for two
        classes). For the multinomial posterior, the centred log predictive probabilities
        ``log p_k − mean_l log p_l``, whose softmax is :meth:`predict_proba`.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) for two classes, else (n_samples, n_classes)
        """
        check_is_fitted(self)
        if self._is_multinomial():
            return self._softmax_log_proba(
                X, lambda log_p: log_p - log_p.mean(axis=1, keepdims=True)
            )
        scores = self._class_log_proba(X, np.subtract, len(self.coef_))
        return scores[:, 0] if len(self.coef_) == 1 else scores

    def predict(self, X):
        """Most probable class under the posterior predictive distribution.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        scores = self.decision_function(X)
        index = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[index]

    def sample_coef(self, n_draws: int, random_state=None):
        """Draw coefficients and intercepts from the (Gaussian) posterior.

        Parameters
        ----------
        n_draws : int
            Number of draws.
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.

        Returns
        -------
        coef : ndarray of shape (n_draws, *coef_.shape)
        intercept : ndarray of shape (n_draws, *intercept_.shape)
            Zeros when ``fit_intercept=False``.
        """
        check_is_fitted(self)
        n_draws = check_scalar(n_draws, "n_draws", numbers.Integral, min_val=1)
        rng = as_generator(random_state)
        if self._is_multinomial():
            # One joint posterior: [W.ravel(), b] per draw (the draws include the
            # prior-only shift common to all classes, to which predictions are invariant).
            k, d = self.coef_.shape
            draws = self.posteriors_[0].sample(n_draws, rng)
            coef = draws[:, : k * d].reshape(n_draws, k, d)
            intercept = draws[:, k * d :] if self.fit_intercept else np.zeros((n_draws, k))
            return coef, intercept
        draws = np.stack([g.sample(n_draws, rng) for g in self.posteriors_], axis=1)
        d = self.coef_.shape[1]
        intercept = draws[:, :, d] if self.fit_intercept else np.zeros(draws.shape[:2])
        return draws[:, :, :d], intercept

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
