"""C by the evidence (type-II maximum likelihood), not by cross-validation."""

from __future__ import annotations

import math
import numbers

import numpy as np
from scipy.optimize import minimize_scalar
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.utils import check_scalar
from sklearn.utils.validation import check_is_fitted

from .._warnings import warn
from ..exceptions import ConvergenceWarning
from ._registry import LINKS
from .laplace import LaplaceLogisticRegression, LaplaceProbitRegression
from .variational_sampling import VSLogisticRegression

__all__ = ["EmpiricalBayesClassifier"]

_LAPLACE = {"logistic": LaplaceLogisticRegression, "probit": LaplaceProbitRegression}
# The refinement stops when the bracket on log10 C is this narrow: C within 1 %.
_LOG10_TOL = 0.005


def _total_evidence(estimator) -> float:
    """The fitted model's log evidence: one number, summed over one-vs-rest problems."""
    return float(np.sum(estimator.log_marginal_likelihood_value_))


def _delegate(name: str, summary: str, returns: str):
    """A method calling the fitted estimator's ``name`` on X, with its numpydoc."""

    def method(self, X):
        check_is_fitted(self, "estimator_")
        return getattr(self.estimator_, name)(X)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"{summary}\n\nParameters\n----------\nX : {{array-like, sparse matrix}} of shape "
        f"(n_samples, n_features)\n    Data.\n\nReturns\n-------\n{returns}\n"
    )
    return method


class EmpiricalBayesClassifier(ClassifierMixin, BaseEstimator):
    """A vsbayes classifier whose prior scale C maximizes the evidence.

    scikit-learn users choose ``C`` by cross-validation (``GridSearchCV``,
    ``LogisticRegressionCV``: folds × a grid of fits). The Bayesian answer is one curve: the
    log evidence ``log p(y | X, C)`` as a function of C, maximized (type-II maximum
    likelihood), as ``BayesianRidge`` and ``GaussianProcessClassifier`` learn their
    hyperparameters inside ``fit``. The Laplace approximation's evidence over ``Cs``
    (cheap: a Newton fit each) brackets the maximum; the estimator's own evidence then
    refines it (bounded scalar search on log C, within the bracket, with the estimator's
    ``random_state`` for every fit so that the curve is smooth); the estimator is fitted
    at the chosen ``C_``.

    Parameters
    ----------
    estimator : vsbayes classifier, default=None
        The classifier whose ``C`` is chosen (cloned); default
        ``VSLogisticRegression()``. Its link picks the Laplace approximation of the
        bracket (logistic or probit).
    Cs : int or array-like of float, default=13
        The grid of the bracket: an int gives that many values log-spaced over
        [1e-4, 1e4] (``LogisticRegressionCV``'s convention).
    refine : bool, default=True
        Refine the bracket's maximum with the estimator's own evidence. False keeps the
        grid's best C (Laplace's evidence).

    Attributes
    ----------
    C_ : float
        The chosen prior scale.
    Cs_ : ndarray of shape (n_Cs,)
        The grid.
    log_evidence_ : ndarray of shape (n_Cs,)
        The Laplace approximation's log evidence on the grid.
    refined_Cs_ : ndarray of shape (n_refined,)
        The C values at which the estimator's own evidence was computed (increasing).
    refined_log_evidence_ : ndarray of shape (n_refined,)
        The estimator's log evidence at ``refined_Cs_``.
    estimator_ : estimator
        The estimator fitted at ``C_``.
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    coef_, intercept_ : ndarray
        The fitted estimator's posterior means.
    n_features_in_ : int
        Number of features seen during ``fit``.
    feature_names_in_ : ndarray of str
        Names of the features, when ``X`` has string column names.

    See Also
    --------
    sklearn.linear_model.LogisticRegressionCV : C by cross-validation.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import EmpiricalBayesClassifier, EPLogisticRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(
    ...     StandardScaler(), EmpiricalBayesClassifier(EPLogisticRegression())
    ... ).fit(X, y)
    >>> bool(0.01 < model[-1].C_ < 100)
    True
    """

    def __init__(self, estimator=None, *, Cs=13, refine=True):
        self.estimator = estimator
        self.Cs = Cs
        self.refine = refine

    def _grid(self) -> np.ndarray:
        if isinstance(self.Cs, numbers.Integral) and not isinstance(self.Cs, bool):
            check_scalar(self.Cs, "Cs", numbers.Integral, min_val=2)
            return np.logspace(-4, 4, int(self.Cs))
        grid = np.sort(np.asarray(self.Cs, dtype=float).ravel())
        if grid.size < 2 or not np.all(np.isfinite(grid) & (grid > 0)):
            raise ValueError(
                f"Cs must be an int ≥ 2 or at least two positive finite values; got {self.Cs!r}."
            )
        return grid

    def fit(self, X, y, sample_weight=None):
        """Choose C by the evidence and fit the estimator there.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights, passed to every fit.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        base = VSLogisticRegression() if self.estimator is None else self.estimator
        link = getattr(base, "_link", None)
        if link not in LINKS or "C" not in base.get_params():
            raise ValueError(
                f"estimator must be a vsbayes classifier with a C parameter (e.g. "
                f"VSLogisticRegression()); got {base!r}."
            )
        grid = self._grid()
        check_scalar(self.refine, "refine", (bool, np.bool_))
        shared = {
            k: v for k, v in base.get_params().items() if k in ("fit_intercept", "class_weight")
        }

        def laplace_evidence(c):
            fit = _LAPLACE[link](C=c, **shared).fit(X, y, sample_weight)
            return _total_evidence(fit)

        self.Cs_ = grid
        self.log_evidence_ = np.array([laplace_evidence(c) for c in grid])
        best = int(np.argmax(self.log_evidence_))
        if best in (0, len(grid) - 1):
            warn(
                f"The evidence is largest at the edge of Cs (C = {grid[best]:.3g}): the "
                f"maximum may lie beyond it. Widen Cs.",
                ConvergenceWarning,
            )
        fits = {}

        def fit_at(c):
            if c not in fits:
                fits[c] = clone(base).set_params(C=c).fit(X, y, sample_weight)
            return fits[c]

        if self.refine:
            low = math.log10(grid[max(best - 1, 0)])
            high = math.log10(grid[min(best + 1, len(grid) - 1)])
            result = minimize_scalar(
                lambda t: -_total_evidence(fit_at(10.0**t)),
                bounds=(low, high),
                method="bounded",
                options={"xatol": _LOG10_TOL},
            )
            candidates = [10.0**result.x, grid[best]]
            self.C_ = max(candidates, key=lambda c: _total_evidence(fit_at(c)))
        else:
            self.C_ = float(grid[best])
        self.estimator_ = fit_at(self.C_)
        refined = sorted(fits)
        self.refined_Cs_ = np.array(refined)
        self.refined_log_evidence_ = np.array([_total_evidence(fits[c]) for c in refined])
        self.classes_ = self.estimator_.classes_
        self.n_features_in_ = self.estimator_.n_features_in_
        if hasattr(self.estimator_, "feature_names_in_"):
            self.feature_names_in_ = self.estimator_.feature_names_in_
        return self

    @property
    def coef_(self) -> np.ndarray:
        """Posterior mean of the coefficients of the fitted estimator."""
        check_is_fitted(self, "estimator_")
        return self.estimator_.coef_

    @property
    def intercept_(self) -> np.ndarray:
        """Posterior mean of the intercepts of the fitted estimator."""
        check_is_fitted(self, "estimator_")
        return self.estimator_.intercept_

    predict_proba = _delegate(
        "predict_proba",
        "Posterior predictive probabilities of the estimator fitted at ``C_``.",
        "ndarray of shape (n_samples, n_classes)",
    )
    predict_log_proba = _delegate(
        "predict_log_proba",
        "Log of :meth:`predict_proba`.",
        "ndarray of shape (n_samples, n_classes)",
    )
    decision_function = _delegate(
        "decision_function",
        "Decision function of the estimator fitted at ``C_``.",
        "ndarray of shape (n_samples,) or (n_samples, n_classes)",
    )
    predict = _delegate(
        "predict",
        "Most probable class under the posterior predictive.",
        "ndarray of shape (n_samples,)",
    )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        base = VSLogisticRegression() if self.estimator is None else self.estimator
        inner = base.__sklearn_tags__()
        tags.input_tags.sparse = inner.input_tags.sparse
        tags.classifier_tags = inner.classifier_tags
        return tags
