"""Prediction from the fitted posterior: latent moments, predictive probabilities, draws.

A mixin of :class:`~vsbayes.estimators._base.BayesianGLMClassifier`, which fits the
posterior(s) these methods read (``coef_``, ``intercept_``, ``sigma_``, ``classes_``). The
methods validate X and ask the fitted predictive
(:func:`~vsbayes.models.fitted_predictive.fitted_predictive`: binary, one-vs-rest or
multinomial, one interface); a dask X is mapped over its row chunks.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_scalar
from sklearn.utils.validation import (
    check_is_fitted,
    validate_data,
)

from .._random import as_generator
from ..models.dask_chunks import is_dask, is_dask_frame
from ..models.fitted_predictive import FittedPredictive, fitted_predictive
from ._dask_input import check_prediction_input, chunkwise_prediction

__all__ = ["PosteriorPrediction"]


def _dask_chunkwise(shape):
    """Decorate a prediction method so that a dask X gives a lazy dask array, the method
    mapped over X's row chunks; ``shape(estimator)`` gives ``(n_columns or None, dtype)``."""

    def decorate(method):
        @functools.wraps(method)
        def chunkwise(self, X):
            if not is_dask(X):
                return method(self, X)
            check_is_fitted(self)
            # A DataFrame's names are checked here; its blocks get them back (no warning).
            names = getattr(self, "feature_names_in_", None) if is_dask_frame(X) else None
            X = check_prediction_input(self, X)
            n_columns, dtype = shape(self)
            predict = functools.partial(_predict_block, self, method.__name__, names)
            return chunkwise_prediction(predict, X, n_columns, dtype)

        return chunkwise

    return decorate


def _predict_block(estimator, name: str, names, block):
    if names is not None:
        import pandas as pd  # a dask DataFrame's blocks were pandas frames

        block = pd.DataFrame(block, columns=names, copy=False)
    return getattr(estimator, name)(block)


def _per_class(estimator):
    return len(estimator.classes_), _output_dtype(estimator)


def _decision_shape(estimator):
    n_classes = len(estimator.classes_)
    return (None if n_classes == 2 else n_classes), _output_dtype(estimator)


def _output_dtype(estimator) -> np.dtype:
    """float32 where the fit's X was float32 (``coef_`` keeps its dtype, as scikit-learn's
    linear models do), else float64: the computation itself is always in float64."""
    return np.dtype(np.float32) if estimator.coef_.dtype == np.float32 else np.dtype(np.float64)


def _label_shape(estimator):
    return None, estimator.classes_.dtype


class PosteriorPrediction:
    """The prediction methods of the Bayesian GLM classifiers (see the module docstring)."""

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
        predictive = self._predictive()
        mean, var = predictive.latent_mean_and_variance(self._validate_prediction_data(X))
        dtype = _output_dtype(self)
        return mean.astype(dtype, copy=False), var.astype(dtype, copy=False)

    def _predictive(self) -> FittedPredictive:
        """The fitted posterior's predictive (its kind read from ``sigma_`` and ``coef_``),
        computed in float64 whatever the fitted attributes' dtype (and from a sparsified
        ``coef_`` too)."""
        check_is_fitted(self)
        posteriors = getattr(self, "posteriors_", None)  # needed by sample_coef only
        coef = self.coef_.toarray() if sp.issparse(self.coef_) else self.coef_
        return fitted_predictive(
            np.asarray(coef, dtype=np.float64),
            np.asarray(self.intercept_, dtype=np.float64),
            np.asarray(self.sigma_, dtype=np.float64),
            self._link,
            posteriors,
        )

    def sparsify(self):
        """Store ``coef_`` as a scipy.sparse CSR matrix, as ``LogisticRegression.sparsify``.

        The posterior means are rarely exactly zero, so this saves memory only where many
        are (features that never occur with a non-zero value, for instance); prediction is
        unchanged. :meth:`densify` converts back.

        Returns
        -------
        self : object
            The estimator, with a sparse ``coef_``.
        """
        check_is_fitted(self, "coef_")
        if not sp.issparse(self.coef_):
            self.coef_ = sp.csr_matrix(self.coef_)
        return self

    def densify(self):
        """Store ``coef_`` as a dense ndarray again (the default after ``fit``).

        Returns
        -------
        self : object
            The estimator, with a dense ``coef_``.
        """
        check_is_fitted(self, "coef_")
        if sp.issparse(self.coef_):
            self.coef_ = self.coef_.toarray()
        return self

    def _validate_prediction_data(self, X):
        return validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)

    @_dask_chunkwise(_per_class)
    def predict_log_proba(self, X):
        """Log of :meth:`predict_proba`, computed in the log domain.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            A dask array (chunked by rows) gives a lazy dask array, computed chunk by
            chunk where the chunks are.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        predictive = self._predictive()
        log_proba = predictive.log_proba(self._validate_prediction_data(X))
        return log_proba.astype(_output_dtype(self), copy=False)

    @_dask_chunkwise(_per_class)
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
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            A dask array (chunked by rows) gives a lazy dask array, computed chunk by
            chunk where the chunks are.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Columns in the order of ``classes_``.
        """
        # exp of predict_log_proba, taken chunk by chunk.
        predictive = self._predictive()
        proba = predictive.log_proba(self._validate_prediction_data(X), np.exp)
        return proba.astype(_output_dtype(self), copy=False)

    @_dask_chunkwise(_decision_shape)
    def decision_function(self, X):
        """Logit of the predictive probability of each one-vs-rest problem.

        Monotone in :meth:`predict_proba` (positive means class ``classes_[1]`` for two
        classes). For the multinomial posterior, the centred log predictive probabilities
        ``log p_k − mean_l log p_l``, whose softmax is :meth:`predict_proba`.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            A dask array (chunked by rows) gives a lazy dask array, computed chunk by
            chunk where the chunks are.

        Returns
        -------
        ndarray of shape (n_samples,) for two classes, else (n_samples, n_classes)
        """
        predictive = self._predictive()
        scores = predictive.decision_function(self._validate_prediction_data(X))
        return scores.astype(_output_dtype(self), copy=False)

    @_dask_chunkwise(_label_shape)
    def predict(self, X):
        """Most probable class under the posterior predictive distribution.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            A dask array (chunked by rows) gives a lazy dask array, computed chunk by
            chunk where the chunks are.

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
        predictive = self._predictive()
        n_draws = check_scalar(n_draws, "n_draws", numbers.Integral, min_val=1)
        return predictive.sample(n_draws, as_generator(random_state))
