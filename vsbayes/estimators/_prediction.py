"""Prediction from the fitted posterior: latent moments, predictive probabilities, draws.

A mixin of :class:`~vsbayes.estimators._base.BayesianGLMClassifier`, which fits the
posterior(s) these methods read (``coef_``, ``intercept_``, ``sigma_``, ``classes_``). The
methods validate X and ask the fitted predictive
(:func:`~vsbayes.models.fitted_predictive.fitted_predictive`: binary, one-vs-rest or
multinomial, one interface); a dask X is mapped over its row chunks.

Every read runs under :func:`~vsbayes._blas.one_blas_thread_below` with the estimate of its
work :func:`read_work`: on one BLAS thread when it is small (a few rows, a few draws, a
summary), where a second BLAS thread stalls the factorizations and solves under load.
``loo`` runs on one BLAS thread whatever its size, as a fit (its refits are EP's sweeps).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import scipy.sparse as sp
from scipy.special import expit
from sklearn.utils.validation import (
    check_is_fitted,
    validate_data,
)

from .._blas import one_blas_thread_below
from .._warnings import warn
from ..gaussian import StructuredCovariance, StructuredCovariances
from ..models.dask_chunks import is_dask, is_dask_frame
from ..models.fitted_predictive import FittedPredictive, fitted_predictive
from . import _arviz_export, _leave_one_out, _summaries
from ._dask_input import check_prediction_input, chunkwise_prediction

__all__ = ["PosteriorPrediction", "plain_rows", "read_work", "row_count"]


def read_work(estimator, n_rows: float = 0, n_draws: float = 0) -> float:
    """Multiply-adds of a read of the fitted posterior, an upper estimate for
    :func:`~vsbayes._blas.one_blas_thread_below`: factoring the covariance(s), each row's
    latent moments, each coefficient draw, and each draw's scores at the rows (0 before
    ``fit``: the method raises its NotFittedError)."""
    sigma = getattr(estimator, "sigma_", None)
    if sigma is None:
        return 0.0
    if isinstance(sigma, StructuredCovariance | StructuredCovariances):
        setup, per_row = 0.0, 0.0
        for covariance in [sigma] if isinstance(sigma, StructuredCovariance) else sigma:
            p, rank = covariance.factor.shape
            setup += p * rank * rank + rank**3
            per_row += p * (rank + 1)
    else:
        size = sigma.shape[-1]
        n_covariances = sigma.shape[0] if sigma.ndim == 3 else 1
        setup, per_row = n_covariances * size**3 / 3, n_covariances * size**2
    n_params = math.prod(estimator.coef_.shape) + np.size(estimator.intercept_)
    return setup + (n_rows + n_draws) * per_row + n_rows * n_draws * n_params


def row_count(X) -> int:
    """Rows of X before validation (an array's, a sparse matrix's, a frame's, a list's)."""
    shape = getattr(X, "shape", None)
    return int(shape[0]) if shape is not None else len(X)


def plain_rows(estimator, X, dtypes: tuple[np.dtype, ...]) -> bool:
    """Whether ``X`` is what scikit-learn's ``validate_data`` (``reset=False``) passes as it
    is, with no warning: a 2-D ndarray (not a subclass) of one of ``dtypes``, at least one
    row of the fitted width, finite, to an estimator fitted without feature names. A finite
    sum has finite terms (one that overflows leaves the check to ``validate_data``, with no
    RuntimeWarning of the sum's: the rows' finite terms are not the caller's error, D-275)."""
    if not (
        type(X) is np.ndarray
        and X.ndim == 2
        and X.shape[0] > 0
        and X.shape[1] == getattr(estimator, "n_features_in_", -1)
        and X.dtype in dtypes
        and not hasattr(estimator, "feature_names_in_")
    ):
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(X.sum()))


_FLOAT64 = (np.dtype(np.float64),)


def _check_fitted(estimator) -> None:
    """``check_is_fitted(estimator, "coef_")``: its tags and its scan of the attributes, a
    seventh of a one-draw ``sample_coef``, only before ``coef_`` is set (D-270). The
    posterior is what a read needs, so a fresh fit that failed after setting ``classes_``
    (one class in y) reads as unfitted, not as a missing attribute (D-278)."""
    if "coef_" not in vars(estimator):
        check_is_fitted(estimator, "coef_")


# The reads' BLAS policy, by the work their arguments ask for.
_rows_read = one_blas_thread_below(lambda self, X: read_work(self, row_count(X)))


def _dask_chunkwise(shape):
    """Decorate a prediction method so that a dask X gives a lazy dask array, the method
    mapped over X's row chunks; ``shape(estimator, X)`` gives ``(n_columns or None, dtype)``."""

    def decorate(method):
        @functools.wraps(method)
        def chunkwise(self, X):
            if not is_dask(X):
                return method(self, X)
            checked, names = _checked_dask_rows(self, X)
            # The output takes the dtype of X as given (a float32 fit read on float32 X).
            n_columns, dtype = shape(self, X)
            predict = functools.partial(_predict_block, self, method.__name__, names, dtype)
            return chunkwise_prediction(predict, checked, n_columns, dtype)

        return chunkwise

    return decorate


def _checked_dask_rows(estimator, X):
    """``(X, names)``: a dask X checked for prediction (as a dask array), and the fitted
    feature names its blocks get (None if the fit had none). A DataFrame's names are
    checked here, and named input to an unnamed fit (or the reverse) is warned of here,
    once, as scikit-learn does: not by every block."""
    check_is_fitted(estimator, "coef_")
    fitted = getattr(estimator, "feature_names_in_", None)
    columns = getattr(X, "columns", None) if is_dask_frame(X) else None
    named = columns is not None and all(isinstance(c, str) for c in columns)
    model = type(estimator).__name__
    if fitted is not None and not named:
        warn(
            f"X does not have valid feature names, but {model} was fitted with feature names",
            UserWarning,
        )
    elif fitted is None and named:
        warn(f"X has feature names, but {model} was fitted without feature names", UserWarning)
    return check_prediction_input(estimator, X), fitted


def _named_block(block, names):
    """A block of a dask DataFrame given back its fitted feature names (None: as is)."""
    if names is None:
        return block
    import pandas as pd  # a dask DataFrame's blocks were pandas frames

    return pd.DataFrame(block, columns=names, copy=False)


def _predict_block(estimator, name: str, names, dtype, block):
    return getattr(estimator, name)(_named_block(block, names)).astype(dtype, copy=False)


def _dask_latent_moments(estimator, X):
    """``latent_mean_and_variance`` of a dask X: two lazy dask arrays, from one map over
    its row chunks (each block's means and variances side by side)."""
    checked, names = _checked_dask_rows(estimator, X)
    n_classes = len(estimator.classes_)
    columns = 1 if n_classes == 2 else n_classes
    dtype = _output_dtype(estimator, X)
    block = functools.partial(_latent_block, estimator, names, dtype)
    both = chunkwise_prediction(block, checked, 2 * columns, dtype)
    if n_classes == 2:
        return both[:, 0], both[:, 1]
    return both[:, :columns], both[:, columns:]


def _latent_block(estimator, names, dtype, block):
    mean, var = estimator.latent_mean_and_variance(_named_block(block, names))
    both = np.hstack([mean.reshape(len(mean), -1), var.reshape(len(var), -1)])
    return both.astype(dtype, copy=False)


def _per_class(estimator, X):
    return len(estimator.classes_), _output_dtype(estimator, X)


def _decision_shape(estimator, X):
    n_classes = len(estimator.classes_)
    return (None if n_classes == 2 else n_classes), _output_dtype(estimator, X)


def _output_dtype(estimator, X) -> np.dtype:
    """float32 where the fit's X was float32 (``coef_`` keeps its dtype, as scikit-learn's
    linear models do) and so is this X, else float64: LogisticRegression's ``X @ coef_.T``
    promotes a float64 X. The computation itself is always in float64."""
    if estimator.coef_.dtype != np.float32:
        return np.dtype(np.float64)
    dtype = getattr(X, "dtype", None)
    if dtype is None and hasattr(X, "dtypes"):  # a DataFrame: one dtype for all its columns
        dtypes = set(X.dtypes)
        dtype = dtypes.pop() if len(dtypes) == 1 else None
    return np.dtype(np.float32) if dtype == np.float32 else np.dtype(np.float64)


def _label_shape(estimator, X):
    return None, estimator.classes_.dtype


def _draws_work(self, X, n_draws=1000, *, random_state=None) -> float:
    return read_work(self, row_count(X), n_draws)


def _interval_work(self, X, level=0.95, *, n_draws=4096, random_state=None) -> float:
    n_rows, n_classes = row_count(X), len(self.classes_)
    latent_draws = 0 if n_classes == 2 else n_rows * n_draws * n_classes**2
    return read_work(self, n_rows) + latent_draws


def _export_work(self, X=None, y=None, sample_weight=None, *, n_draws=1000, random_state=None):
    return read_work(self, 0 if X is None else row_count(X), n_draws)


class PosteriorPrediction:
    """The prediction methods of the Bayesian GLM classifiers (see the module docstring)."""

    def latent_mean_and_variance(self, X):
        """Posterior mean and variance of the latent value ``f = x·w + b`` at each row of X.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            A dask array (chunked by rows) gives two lazy dask arrays, computed chunk by
            chunk.

        Returns
        -------
        mean, var : ndarray of shape (n_samples,) for two classes, else (n_samples, n_classes)
            One column per one-vs-rest problem; for the multinomial posterior, one per class
            of the centred latent value ``f_k − mean_l f_l`` (the softmax is invariant to a
            common shift, along which the posterior is its prior).
        """
        if is_dask(X):
            return _dask_latent_moments(self, X)
        return self._latent_mean_and_variance(X)

    @_rows_read
    def _latent_mean_and_variance(self, X):
        predictive = self._predictive()
        dtype = _output_dtype(self, X)
        mean, var = predictive.latent_mean_and_variance(self._validate_prediction_data(X))
        return mean.astype(dtype, copy=False), var.astype(dtype, copy=False)

    def _predictive(self) -> FittedPredictive:
        """The fitted posterior's predictive (its kind read from ``sigma_`` and ``coef_``),
        computed in float64 whatever the fitted attributes' dtype (and from a sparsified
        ``coef_`` too)."""
        _check_fitted(self)
        posteriors = getattr(self, "posteriors_", None)  # needed by sample_coef only
        coef = self.coef_.toarray() if sp.issparse(self.coef_) else self.coef_
        return fitted_predictive(
            np.asarray(coef, dtype=np.float64),
            np.asarray(self.intercept_, dtype=np.float64),
            _covariance(self.sigma_),
            self._link,
            posteriors,
            # (None for an estimator fitted before it was kept: then computed each read)
            getattr(self, "_predictive_setup_", None),
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
        # Plain float64 rows are what validate_data would return as they are, after ~0.1 ms
        # of checks for frames, names and dtypes: two thirds of a ten-row thompson_sample
        # (D-271).
        if plain_rows(self, X, _FLOAT64):
            return X
        return validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)

    def _in_memory(self, X, method: str):
        """X for a method reading the fitted posterior: NotFittedError before ``fit``,
        refused with a remedy when it is a dask collection."""
        _check_fitted(self)
        if is_dask(X):
            raise ValueError(
                f"{method} needs X in memory; got a dask collection. Pass X.compute() (or "
                f"map the method over the chunks with dask.array.map_blocks)."
            )
        return X

    @_dask_chunkwise(_per_class)
    @_rows_read
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
        predictive, dtype = self._predictive(), _output_dtype(self, X)
        log_proba = predictive.log_proba(self._validate_prediction_data(X))
        return log_proba.astype(dtype, copy=False)

    @_dask_chunkwise(_per_class)
    @_rows_read
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
        standard errors are below 5e-4 (4096 to 262,144 nodes; see
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
        predictive, dtype = self._predictive(), _output_dtype(self, X)
        proba = predictive.log_proba(self._validate_prediction_data(X), np.exp)
        return proba.astype(dtype, copy=False)

    @_dask_chunkwise(_decision_shape)
    @_rows_read
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
        predictive, dtype = self._predictive(), _output_dtype(self, X)
        scores = predictive.decision_function(self._validate_prediction_data(X))
        return scores.astype(dtype, copy=False)

    def _predict_proba_lr(self, X):
        """The logistic of :meth:`decision_function`, normalized over the classes.

        scikit-learn's linear classifiers' one-vs-rest probabilities
        (``LinearClassifierMixin._predict_proba_lr``, which code written for
        ``LogisticRegression`` may call), with the same formula: not the posterior
        predictive (:meth:`predict_proba` is), and for two classes equal to it.
        """
        # expit, as there: 1 / (1 + exp(-s)) overflows (a RuntimeWarning) at s < -709.
        prob = expit(np.asarray(self.decision_function(X)))
        if prob.ndim == 1:
            return np.stack([1 - prob, prob], axis=1)
        # A row whose every logistic underflows to 0 gets uniform probabilities, as there.
        total = prob.sum(axis=1, keepdims=True)
        all_zero = total[:, 0] == 0
        prob[all_zero] = 1
        total[all_zero] = prob.shape[1]
        return prob / total

    @_dask_chunkwise(_label_shape)
    @_rows_read
    def predict(self, X):
        """Most probable class under the posterior predictive distribution.

        For two classes and one-vs-rest, the sign or argmax of :meth:`decision_function`.
        For the multinomial posterior, the argmax of :meth:`predict_proba` computed only as
        precisely as the decision needs: a row whose probabilities take the adaptive
        quasi-Monte Carlo rule starts on an eighth of its first level's nodes and stops
        refining once its most probable class leads the second by four times the rule's
        estimated error (and by at least 2e-3). It equals
        ``predict_proba(X).argmax(axis=1)`` (ties to the first class) except possibly on
        rows where ``predict_proba``'s two largest probabilities are within twice its error
        bound of each other (within 1e-3 on the rows where the rule met its tolerance),
        with the confidence of that bound (see
        :func:`~vsbayes.models.softmax_predictive.centred_softmax_predictive_log_proba`).

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            A dask array (chunked by rows) gives a lazy dask array, computed chunk by
            chunk where the chunks are.

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        predictive, dtype = self._predictive(), _output_dtype(self, X)
        index = predictive.predicted_index(self._validate_prediction_data(X), dtype)
        return self.classes_[index]

    @one_blas_thread_below(lambda self, n_draws, random_state=None: read_work(self, 0, n_draws))
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
            In ``coef_``'s dtype (float32 after a fit on float32 X).
        intercept : ndarray of shape (n_draws, *intercept_.shape)
            Zeros when ``fit_intercept=False``.
        """
        coef, intercept = _summaries.sample_coef(self, n_draws, random_state)
        dtype = self.coef_.dtype  # (as sample_proba takes predict_proba's)
        return coef.astype(dtype, copy=False), intercept.astype(dtype, copy=False)

    # --- the posterior as people use it (estimators._summaries, _leave_one_out, _arviz_export)

    @one_blas_thread_below(lambda self, level=0.95: read_work(self))
    def summary(self, level=0.95):
        """The posterior of every coefficient and intercept, one row each.

        For two classes one row per feature, then the intercept; beyond, one row per class
        and feature (one-vs-rest: each class's own problem; multinomial: the centred
        coefficients ``w_k − mean_l w_l``, which the data identify, rather than the raw
        ones, whose common shift keeps its prior; under a shrinkage prior, which acts on
        each class's coefficient and identifies them, the coefficients as fitted and the
        intercepts centred). The intervals are the Gaussian posterior's equal-tailed
        quantiles.

        Parameters
        ----------
        level : float, default=0.95
            Probability of the credible intervals, in (0, 1).

        Returns
        -------
        pandas.DataFrame or numpy structured array
            A DataFrame when pandas is installed (indexed by coefficient, or by class and
            coefficient), else a structured array with the same columns: ``mean``, ``sd``,
            the interval's ends (``"2.5%"``, ``"97.5%"`` at 0.95), ``P(sign)`` (the
            posterior probability that the coefficient has the sign of its mean); under a
            shrinkage prior (``prior=`` a prior object, ``penalty="l1"`` or
            ``"elasticnet"``) also ``relevance`` (the posterior mean of one minus each
            coefficient's shrinkage factor: near 1 the data overrule the prior, near 0 it
            shrinks the coefficient away; NaN for the intercept) and, under the horseshoe,
            ``selected`` (relevance above ½, Carvalho, Polson & Scott 2010). Its
            ``attrs`` hold ``level``, ``method``, ``estimator``, ``log_evidence``,
            ``route`` (``strategy_``, or None), ``predicted_error`` (``kl_error_``, or
            None), ``laplace_fallback``, ``multinomial``, ``covariance``
            (``covariance_structure_``) and ``variance_error_factor``: every variance in
            the table is within this factor of the one the approximation's dense
            covariance would give (1: exact; a forced or text-scale structure records its
            bound in ``posteriors_[0].error_factor``).
        """
        check_is_fitted(self, "coef_")
        return _summaries.coefficient_table(self, level)

    @one_blas_thread_below(_interval_work)
    def predict_proba_interval(self, X, level=0.95, *, n_draws=4096, random_state=None):
        """Equal-tailed credible interval of each row's class probabilities.

        For two classes exact: ``P(y = 1 | x, w) = F(f)`` is increasing in the latent
        value ``f``, whose posterior is Gaussian, so its quantiles are the link's of
        ``f``'s quantiles. Beyond, the quantiles of ``n_draws`` draws of each row's
        latent values (jointly Gaussian for the multinomial posterior, independent for
        one-vs-rest), through the softmax or the normalized links. One-vs-rest normalizes
        each draw's K probabilities, whereas :meth:`predict_proba` normalizes their K
        posterior means, so a row's ``predict_proba`` can fall just outside a narrow
        interval (by up to 0.0023 at ``level=0.9`` on iris with the probit link).

        (An interval per row and class, beside :meth:`predict_proba`, rather than a keyword
        of it: ``predict_proba`` keeps the one return type scikit-learn's meta-estimators
        and scorers expect.)

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        level : float, default=0.95
            Probability of the intervals, in (0, 1).
        n_draws : int, default=4096
            Latent draws per row beyond two classes (unused for two).
        random_state : int, RandomState, Generator or None, default=None
            Seed of those draws (the same standard normal draws for every row, so that a
            row's interval does not depend on the rows passed with it); None: a fixed
            seed, so that the same call gives the same intervals.

        Returns
        -------
        lower, upper : ndarray of shape (n_samples, n_classes)
            Columns in the order of ``classes_``.
        """
        X = self._in_memory(X, "predict_proba_interval")
        dtype = _output_dtype(self, X)  # predict_proba's
        bounds = _summaries.proba_interval(self, X, level, n_draws, random_state)
        return tuple(bound.astype(dtype, copy=False) for bound in bounds)

    @one_blas_thread_below(_draws_work)
    def sample_proba(self, X, n_draws=1000, *, random_state=None):
        """Class probabilities of X under draws of the coefficients from the posterior.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        n_draws : int, default=1000
            Number of draws.
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.

        Returns
        -------
        ndarray of shape (n_draws, n_samples, n_classes)
            Each draw's probabilities (columns in the order of ``classes_``); their mean
            over the draws estimates :meth:`predict_proba` for two classes and the
            multinomial posterior. One-vs-rest normalizes each draw's K probabilities,
            whereas :meth:`predict_proba` normalizes their K posterior means: the two
            differ (by about 0.01 on 30 rows of 3 classes).
        """
        X = self._in_memory(X, "sample_proba")
        draws = _summaries.sample_proba(self, X, n_draws, random_state)
        return draws.astype(_output_dtype(self, X), copy=False)  # predict_proba's

    @one_blas_thread_below(_draws_work)
    def sample_y(self, X, n_draws=1000, *, random_state=None):
        """Labels of X drawn from the posterior predictive distribution.

        Each draw takes coefficients from the posterior, then a label from the class
        probabilities they give.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        n_draws : int, default=1000
            Number of draws.
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.

        Returns
        -------
        ndarray of shape (n_draws, n_samples)
            Labels from ``classes_``.
        """
        X = self._in_memory(X, "sample_y")
        return _summaries.sample_labels(self, X, n_draws, random_state)

    def loo(self, X, y, sample_weight=None, *, n_draws=None, random_state=None, refit_above="auto"):
        """Leave-one-out estimate of the expected log predictive density, and WAIC.

        Pass the training data (with the same ``sample_weight``). Where expectation
        propagation ran (``EPLogisticRegression``, ``EPProbitRegression``, and the
        ``"sites"`` route of the VS estimators), each row's term comes from EP's cavity,
        the posterior without that row's site: no sampling; the few influential rows,
        whose absence would also move the other sites (``lppd_i − loo_i`` above
        ``refit_above``), are refitted without the row: EP again, started from the fit's
        sites without the row's (its cavity), a few sweeps instead of a fit. Otherwise by
        Pareto-smoothed importance sampling of ``n_draws`` posterior draws (corrected for
        the Gaussian approximation), with a Pareto k̂ per row and a warning naming the
        rows whose k̂ exceeds 0.7. Not defined for one-vs-rest fits (no joint model).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The training data.
        y : array-like of shape (n_samples,)
            Its labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Its weights, as passed to ``fit`` (class weights are applied as in ``fit``).
        n_draws : int, default=None
            Posterior draws for WAIC and the importance-sampling terms (at least 100);
            None: 1000 where EP's cavities give the terms (the draws serve WAIC only), else
            4000 (Pareto smoothing fits the largest fifth of a row's weights at most).
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws; None: a fixed seed, so that the same call gives the same
            estimates.
        refit_above : float, "auto" or None, default="auto"
            Where EP's cavities give the terms: the rows whose own share of ``p_loo``
            exceeds this (nats) get their term from EP refitted without them, warm from
            the fit's sites (``refitted`` in the result says which; under a shrinkage
            prior EP's coefficient sites are held fixed, part of the prior, but for the
            binary EP's under the Student-t and horseshoe priors, relaxed without the row
            too, as in the cavities of the rows whose share exceeds 0.1; with a Gaussian
            ``prior=``, or where a refit's posterior is improper, a refit of the
            estimator); "auto": 0.5 for a binary
            posterior, 0.01 for the multinomial one (whose cavities fall short of its
            refits on most rows, not only the influential ones: more refits, about 3 ×
            the fit on wine); None: no refit, the cavities only (leave-one-out in about the
            time of the fit).

        Returns
        -------
        LeaveOneOut
            ``elpd_loo``, ``se``, ``p_loo``, ``pointwise``, ``pareto_k``, ``method``,
            ``elpd_waic``, ``waic_se``, ``p_waic``, ``posterior_pareto_k`` and more (its
            docstring lists them all).
        """
        X = self._in_memory(X, "loo")
        return _leave_one_out.leave_one_out(
            self, X, y, sample_weight, n_draws, random_state, refit_above
        )

    @one_blas_thread_below(_export_work)
    def to_inference_data(
        self, X=None, y=None, sample_weight=None, *, n_draws=1000, random_state=None
    ):
        """The posterior as ArviZ data (``arviz_base``'s DataTree), for ``az.summary``,
        ``az.plot_forest``, leave-one-out and ``az.compare``.

        The draws are the Gaussian approximation's: ArviZ's leave-one-out for them is
        ``arviz_stats.loo_approximate_posterior(tree, log_p=tree["sample_stats"]["lp"],
        log_q=tree["sample_stats"]["log_q"])``, which reweights them to the posterior as
        :meth:`loo` does. ``arviz_stats.loo`` takes them for exact posterior draws, and
        returns NaN for a row predicted with near certainty (its Pareto fit loses the
        row's weights, equal to within ~1e-9, to round-off).

        Needs the optional extra: ``pip install 'vsbayes[arviz]'``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features), default=None
            The training data: with ``y``, adds the ``log_likelihood`` and
            ``observed_data`` groups (which ``az.loo`` reads).
        y : array-like of shape (n_samples,), default=None
            Its labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Its weights (each row's log-likelihood is ``s_i log p(y_i | θ)``).
        n_draws : int, default=1000
            Posterior draws (one chain).
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws; None: a fixed seed, so that the same call exports the same
            draws.

        Returns
        -------
        xarray.DataTree
            Group ``posterior`` with ``coef`` (dims ``class``, ``feature``) and
            ``intercept`` (``class``; for two classes the one class ``classes_[1]``;
            multinomial: centred, or under a shrinkage prior the coefficients as fitted
            and the intercepts centred, as :meth:`summary` shows them), and the fit's
            method, evidence and route as attributes;
            with ``X`` and ``y``, ``log_likelihood`` (float64, exact in the log domain),
            ``observed_data`` and ``sample_stats`` with ``lp`` (``log p(y | θ) + log p(θ)``)
            and ``log_q`` (the approximation's log density), each up to a constant, per
            draw. A structured (text-scale) posterior's ``log_q`` comes from its factors,
            never a p × p matrix: it is the density of the Gaussian the draws come from
            (with estimated marginal variances, that Gaussian's, within its stated error
            of the exact Laplace approximation), which is what reweighting them needs.

        Raises
        ------
        ImportError
            Without ArviZ (the ``arviz`` extra).
        MemoryLimitError
            If the draws (and their log-likelihoods at the rows) would not fit the memory
            limit; the message says how many would.
        """
        if X is not None:
            X = self._in_memory(X, "to_inference_data")
        return _arviz_export.to_inference_data(self, X, y, sample_weight, n_draws, random_state)


def _covariance(sigma):
    """``sigma_`` as float64: structured covariances as such (never made dense here)."""
    if isinstance(sigma, StructuredCovariance | StructuredCovariances):
        return sigma
    return np.asarray(sigma, np.float64)
