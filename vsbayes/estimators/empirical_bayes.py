"""Prior scales by the evidence (type-II maximum likelihood), not by cross-validation: one C
shared by every feature, or one per feature (automatic relevance determination).

**ARD.** Each feature j gets its own prior variance ``1/α_j``. At the Laplace posterior
``N(m, Σ)`` under the current ``α``, the data's precision and natural mean of coefficient
j with its own prior left out are ``s_j = 1/Σ_jj − α_j`` and ``q_j = m_j/Σ_jj``; the log
evidence as a function of ``α_j`` alone is then
``ℓ(α_j) = ½[log α_j − log(α_j + s_j) + q_j²/(α_j + s_j)]`` (Tipping & Faul 2003), maximized
at ``α_j = s_j²/(q_j² − s_j)`` when ``q_j² > s_j`` and at ``α_j = ∞`` (the feature out)
otherwise, with the gain ``G_j = ½(r − 1 − log r)``, ``r = q_j²/s_j``. This is the fixed
point of MacKay's update ``α_j = γ_j/m_j²``, ``γ_j = 1 − α_j Σ_jj`` (the relevance vector
machine's), reached in one jump per Laplace fit instead of geometrically. With several
classes the K coefficients of feature j share ``α_j``; the evidence in ``α_j`` is then a sum
``Σ_k ℓ_k(α_j)`` over the K one-dimensional factors of the data's K × K factor in its
eigenbasis (one per problem, one-vs-rest), maximized numerically (:func:`_data_factors`,
:func:`_evidence_optimum`).

**Pruning and inclusion.** Type-II maximum likelihood alone keeps every feature with
``r > 1`` — under no signal ``r`` is about χ²₁, so a third of the irrelevant features.
Each feature is therefore also in the model or out of it, in with prior probability π:
its posterior inclusion probability (given the others) is ``expit(G_j + logit π)``,
``relevance_``, and it is kept while that exceeds ½ (the median probability model). π is
fixed (½: the plain ARD rule, ``G_j > 0``) or chosen by the evidence too
(``inclusion_prior="evidence"``: ``(k + 1)/(d + 2)`` for k features kept, the posterior
mean under a uniform prior on π, which cannot collapse to 0; it starts at ½). A feature
whose evidence is largest at ``α_j = ∞`` is out whatever π (its slab is the spike), and so
is one whose ``α_j`` exceeds ``threshold_lambda``. A pruned feature leaves the model for
good (as in ``ARDRegression``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import NamedTuple

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.feature_selection import SelectorMixin
from sklearn.utils import check_scalar
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data

from .._warnings import catch, each_once, reemit, warn
from ..approximations import structured_laplace
from ..approximations.softmax_laplace import MAX_SOFTMAX_PARAMS, check_softmax_dims
from ..exceptions import ConvergenceWarning, UnreliableFitWarning
from ..models.dask_chunks import is_dask
from ..models.shrinkage_priors import HorseshoePrior, LaplacePrior, StudentTPrior
from . import _arviz_export, _leave_one_out, _summaries
from ._base import (
    ESTIMATED_EVIDENCE,
    INTERCEPT_PRIOR_VAR,
    _validate_training_data,
    check_predictive_against_mode,
)
from ._dask_input import check_prediction_input
from ._registry import LINKS
from .laplace import LaplaceLogisticRegression, LaplaceProbitRegression
from .variational_sampling import VSLogisticRegression

__all__ = ["EmpiricalBayesClassifier"]

_LAPLACE = {"logistic": LaplaceLogisticRegression, "probit": LaplaceProbitRegression}
# scikit-learn's feature-names warnings, which this class's check of X has given when the
# fitted estimator repeats them (naming itself, a class the user did not call).
_REPEATED_NAMES_WARNING = ("ignore", UserWarning, "X (has|does not have valid) feature names")
# The refinement stops when the bracket on log10 C is this narrow: C within 1 %.
_LOG10_TOL = 0.005
# ARD stops when no feature is pruned and every kept α_j moved by less than this, relatively.
_ARD_TOL = 1e-3
# A step of ARD that prunes among several changes and lowers its objective (the log
# evidence less the inclusion prior's price of the features kept) by more than this is
# taken back (beyond the round-off of the Laplace evidence at Newton's tolerance below).
_ARD_DROP = 1e-6
# Newton's tolerance of ARD's Laplace fits: the mode to round-off, so that ARD's steps (and
# where they stop) do not depend on where a looser stopping rule happened to fall.
_ARD_NEWTON_TOL = 1e-14
# A shared α_j over the K classes, per ARD step (s and q held fixed: cheap, vectorized over
# the features): the best of a log grid of α_j / mean_k s_kj, refined by Newton's steps.
_SHARED_ALPHA_GRID = np.linspace(-20.0, 20.0, 161)
_SHARED_ALPHA_NEWTON_STEPS = 8


#: The scale a shrinkage prior's grid moves, by prior class (the others are kept).
_SCALE_FIELD = {LaplacePrior: "scale", StudentTPrior: "scale", HorseshoePrior: "global_scale"}


def _separates(fit, X, y, sample_weight) -> bool:
    """Whether ``fit``'s linear scores ``X coef_ᵀ + intercept_`` (the mode, for Laplace;
    not ``decision_function``, its predictive's) classify every training row of positive
    weight right: a hyperplane separates the classes, and the evidence has no maximum in
    C."""
    scores = np.asarray(X @ fit.coef_.T + fit.intercept_)
    scores = scores[:, 0] if scores.shape[1] == 1 else scores
    index = (scores > 0).astype(int) if scores.ndim == 1 else np.argmax(scores, axis=1)
    right = fit.classes_[index] == np.asarray(y)
    if sample_weight is not None:
        right |= np.asarray(sample_weight) <= 0
    return bool(np.all(right))


def _shrinkage_prior(estimator):
    """The estimator's shrinkage prior object (its ``prior`` parameter), or None."""
    prior = estimator.get_params().get("prior")
    return prior if type(prior) in _SCALE_FIELD else None


def _prior_variance(prior, C: float) -> float:
    """A coefficient's prior variance: C, or the shrinkage prior's (∞ for the horseshoe, and
    for a Student t with at most 2 degrees of freedom)."""
    if prior is None:
        return float(C)
    if isinstance(prior, LaplacePrior):
        return 2.0 * prior.scale**2
    if isinstance(prior, StudentTPrior) and prior.df > 2:
        return prior.scale**2 * prior.df / (prior.df - 2.0)
    return math.inf


def _total_evidence(estimator) -> float:
    """The fitted model's log evidence: one number, summed over one-vs-rest problems."""
    return float(np.sum(estimator.log_marginal_likelihood_value_))


def _evidence_is_estimate(estimator) -> bool:
    """Whether the fitted model's log evidence is an estimate: a structured posterior's
    with estimated marginals, whose ``log det`` term is biased low by an amount growing
    with C (the dense, "dual" and exact-marginal structures' evidences are exact)."""
    return any(not getattr(g, "evidence_exact", True) for g in estimator.posteriors_)


def _delegate(name: str, summary: str, returns: str):
    """A method calling the fitted estimator's ``name`` on X, with its numpydoc."""

    def method(self, X):
        check_is_fitted(self, "estimator_")
        X = self._estimator_input(X)
        with catch(_REPEATED_NAMES_WARNING):
            return getattr(self.estimator_, name)(X)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"{summary}\n\nParameters\n----------\nX : {{array-like, sparse matrix}} of shape "
        f"(n_samples, n_features)\n    Data.\n\nReturns\n-------\n{returns}\n"
    )
    return method


class EmpiricalBayesClassifier(ClassifierMixin, SelectorMixin, BaseEstimator):
    """A vsbayes classifier whose prior scales maximize the evidence: one C, or one per feature.

    scikit-learn users choose ``C`` by cross-validation (``GridSearchCV``,
    ``LogisticRegressionCV``: folds × a grid of fits). The Bayesian answer is one curve: the
    log evidence ``log p(y | X, C)`` as a function of C, maximized (type-II maximum
    likelihood), as ``BayesianRidge`` and ``GaussianProcessClassifier`` learn their
    hyperparameters inside ``fit``. The Laplace approximation's evidence over ``Cs``
    (cheap: a Newton fit each) brackets the maximum; the estimator's own evidence then
    refines it (bounded scalar search on log C, within the bracket, with the estimator's
    ``random_state`` for every fit so that the curve is smooth); the estimator is fitted
    at the chosen ``C_``.

    With ``scales="ard"`` each feature gets its own prior variance, as ``ARDRegression``
    (automatic relevance determination; see the module docstring): from the grid's best C,
    Laplace's evidence is maximized over the per-feature variances, features that do not
    earn their place are pruned, and the estimator is fitted on the features kept under the
    chosen diagonal Gaussian prior (its ``prior`` parameter). As a feature selector it has
    ``get_support()`` and ``transform`` (scikit-learn's ``SelectorMixin``).

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
        grid's best C (Laplace's evidence). Not used with ``scales="ard"``, whose
        variances are Laplace's.
    scales : {"shared", "ard"}, default="shared"
        One prior variance ``C`` for every coefficient, or one per feature (automatic
        relevance determination, with pruning). With several classes a feature's
        variance is shared by its coefficients of every class, so that a feature is kept
        or pruned as a whole. The intercepts keep their broad prior either way.
    inclusion_prior : "evidence" or float, default="evidence"
        With ``scales="ard"``: the prior probability π that a feature is in the model. A
        feature is kept while its posterior inclusion probability ``relevance_`` exceeds
        ½. ``"evidence"`` chooses π by the evidence as well (the fraction of features
        kept, under a uniform prior on π, from ½), which helps where there are many
        features and few relevant; 0.5 is the plain ARD rule (kept whenever including it
        raises the evidence), which keeps about a third of the irrelevant features. A
        small value (the expected fraction of relevant features) is stricter.
    threshold_lambda : float, default=1e4
        With ``scales="ard"``: a feature whose prior precision ``1/variance`` exceeds this
        is pruned (``ARDRegression``'s parameter). Set it for the scale of the features:
        1e4 is a prior standard deviation of 0.01 per unit of the feature.
    max_iter : int, default=100
        With ``scales="ard"``: the most Laplace fits of the per-feature variances; a
        ``ConvergenceWarning`` if they have not settled.

    Attributes
    ----------
    C_ : float
        The chosen prior scale (with ``scales="ard"``: the grid's best, where ARD starts).
        With a shrinkage prior as the estimator's ``prior`` (:class:`~vsbayes.LaplacePrior`,
        :class:`~vsbayes.StudentTPrior`, :class:`~vsbayes.HorseshoePrior`), the grid is
        over that prior's ``scale`` (the horseshoe's ``global_scale``), the other
        parameters kept, and ``C_`` is the chosen one.
    prior_ : shrinkage prior or None
        The estimator's shrinkage prior at the chosen scale (None without one).
    Cs_ : ndarray of shape (n_Cs,)
        The grid.
    log_evidence_ : ndarray of shape (n_Cs,)
        The Laplace approximation's log evidence on the grid (under the estimator's
        ``penalty``; with a shrinkage ``prior``, which may have no mode, the estimator's
        own evidence).
    refined_Cs_ : ndarray of shape (n_refined,)
        The C values at which the estimator's own evidence was computed (increasing;
        empty with ``scales="ard"``).
    refined_log_evidence_ : ndarray of shape (n_refined,)
        The estimator's log evidence at ``refined_Cs_``.
    prior_variances_ : ndarray of shape (n_features,)
        The prior variance of each feature's coefficients: ``C_`` for all, or ARD's (0 for
        a pruned feature).
    relevance_ : ndarray of shape (n_features,)
        Each feature's posterior probability of being in the model, given the others
        (ARD, with the final π; a pruned feature's from its evidence when it left); all
        ones with ``scales="shared"``. A feature is kept while it exceeds ½, its evidence
        is largest at a positive variance, and its precision is below
        ``threshold_lambda``.
    support_ : ndarray of bool of shape (n_features,)
        The features in the model (all with ``scales="shared"``).
    n_features_selected_ : int
        How many.
    evidence_is_estimate_ : bool
        Whether some of the evidences compared were estimates, not the exact Laplace
        evidence: those of a structured posterior with estimated marginal variances
        (binary problems over 4096 rows, or over the memory limit; multinomial ones whose
        dense covariance is not formed; see ``estimator_.covariance_reason_``). Their
        error grows with C and biases the choice toward small C; an
        :class:`~vsbayes.exceptions.UnreliableFitWarning` says so.
    ard_log_evidence_ : ndarray of shape (n_steps,)
        With ``scales="ard"``: Laplace's log evidence at each step (empty otherwise).
    n_iter_ : int
        ARD's steps (Laplace fits); with ``scales="shared"``, the estimator's fits.
    estimator_ : estimator
        The estimator fitted at ``C_``, or under ARD's prior on the selected features.
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    coef_, intercept_ : ndarray
        The fitted estimator's posterior means (0 for a pruned feature).
    n_features_in_ : int
        Number of features seen during ``fit``.
    feature_names_in_ : ndarray of str
        Names of the features, when ``X`` has string column names.

    See Also
    --------
    sklearn.linear_model.LogisticRegressionCV : C by cross-validation.
    sklearn.linear_model.ARDRegression : ARD for linear regression.

    Notes
    -----
    ARD is the relevance vector machine's classification scheme (Tipping 2001) on the
    features, with the fast marginal-likelihood updates of Tipping & Faul (2003) and an
    inclusion prior whose median probability model (Barbieri & Berger 2004) decides the
    pruning.

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
    >>> ard = EmpiricalBayesClassifier(EPLogisticRegression(), scales="ard")
    >>> ard = make_pipeline(StandardScaler(), ard).fit(X, y)
    >>> bool(ard[-1].n_features_selected_ < X.shape[1])
    True
    """

    def __init__(
        self,
        estimator=None,
        *,
        Cs=13,
        refine=True,
        scales="shared",
        inclusion_prior="evidence",
        threshold_lambda=1e4,
        max_iter=100,
    ):
        self.estimator = estimator
        self.Cs = Cs
        self.refine = refine
        self.scales = scales
        self.inclusion_prior = inclusion_prior
        self.threshold_lambda = threshold_lambda
        self.max_iter = max_iter

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

    def _check_ard_params(self, base) -> None:
        if self.scales not in ("shared", "ard"):
            raise ValueError(
                f"scales must be 'shared' (one C for every feature) or 'ard' (one prior "
                f"variance per feature); got {self.scales!r}."
            )
        if self.scales == "shared":
            return
        if not (
            isinstance(self.inclusion_prior, str) and self.inclusion_prior == "evidence"
        ) and not (
            isinstance(self.inclusion_prior, numbers.Real)
            and not isinstance(self.inclusion_prior, bool)
            and 0.0 < float(self.inclusion_prior) < 1.0
        ):
            raise ValueError(
                f"inclusion_prior must be 'evidence' or a probability strictly between 0 and "
                f"1 (0.5: plain ARD); got {self.inclusion_prior!r}."
            )
        check_scalar(
            self.threshold_lambda, "threshold_lambda", numbers.Real, min_val=0.0,
            include_boundaries="neither",
        )  # fmt: skip
        check_scalar(self.max_iter, "max_iter", numbers.Integral, min_val=1)
        if base.get_params().get("prior") is not None:
            raise ValueError(
                "With scales='ard' the prior is ARD's (a diagonal Gaussian, passed to the "
                "estimator's prior parameter): the estimator's own prior must be None."
            )

    def fit(self, X, y, sample_weight=None):
        """Choose the prior scale(s) by the evidence and fit the estimator there.

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
        # The grid's fits warn alike (a forced covariance structure, say, at every C), and
        # the "default" filter cannot drop the repeats (each fit's own warning blocks
        # resets its record): each distinct warning is shown once per search (D-209).
        # Its fits' estimated evidences are reported once, by evidence_is_estimate_ and
        # its own warning (D-107), not by each candidate's (D-178).
        estimated = ("ignore", UnreliableFitWarning, f".*{re.escape(ESTIMATED_EVIDENCE)}")
        with each_once(), catch(estimated):
            # Nor does each fit compare its Laplace predictive with its mode: the cost
            # would be paid at every C, and separable classes get this class's own warning.
            unchecked = check_predictive_against_mode.set(False)
            try:
                self._fit(X, y, sample_weight)
            finally:
                check_predictive_against_mode.reset(unchecked)
        return self

    def _fit(self, X, y, sample_weight):
        base = VSLogisticRegression() if self.estimator is None else self.estimator
        link = getattr(base, "_link", None)
        if link not in LINKS or "C" not in base.get_params():
            raise ValueError(
                f"estimator must be a vsbayes classifier with a C parameter (e.g. "
                f"VSLogisticRegression()); got {base!r}."
            )
        if not is_dask(y) and len(getattr(y, "shape", ())) == 2:  # warned here, not by each fit
            y = column_or_1d(y, warn=True)
        grid = self._grid()
        check_scalar(self.refine, "refine", (bool, np.bool_))
        self._check_ard_params(base)
        ard = self.scales == "ard"
        params = base.get_params()
        shared = {k: v for k, v in params.items() if k in ("fit_intercept", "class_weight")}
        if ard:
            if is_dask(X):
                raise ValueError(
                    "scales='ard' selects columns of X in memory; a dask collection is not "
                    "supported (use scales='shared', or compute X first)."
                )
            X, y = _validate_training_data(self, X, y)  # (the estimators' check and remedies)
            check_classification_targets(y)
            n_classes = _check_ard_size(link, shared, X, y, sample_weight)
        elif not is_dask(X):
            # Checked here as the estimators check their data (NaN, no rows, a wrong
            # shape; dates, text, missing or continuous labels, overflowing values, one
            # class, the weights: with their remedies), so that an error names this class
            # and the data, not the Laplace fit at the grid's first C, which the user did
            # not call ("its fit at 0.0001 failed", or numpy's DTypePromotionError for
            # dates); X goes on as given (the estimator keeps its feature names).
            checked, labels = _validate_training_data(self, X, y)
            check_classification_targets(labels)
            _LAPLACE[link](**shared)._fit_data(checked, labels, sample_weight)
        shrinkage = _shrinkage_prior(base)
        if is_dask(X) and not ard:
            # Refused here, naming what was set: each grid fit would name its own prior
            # (the first grid value's scale), which the user never wrote.
            setting = (
                f"prior={shrinkage!r}"
                if shrinkage is not None
                else f"penalty={params.get('penalty')!r}"
                if params.get("penalty") in ("l1", "elasticnet")
                else None
            )
            if setting is not None:
                raise ValueError(
                    f"The estimator's {setting} (a shrinkage prior) needs the rows in "
                    f"memory; pass X.compute() if the data fit in memory, or choose C under "
                    f"the default penalty='l2'."
                )
        if not ard and shrinkage is None and params.get("prior") is not None:
            # A Gaussian prior (or an earlier fit) replaces N(0, C·I): the estimator would
            # ignore the C chosen here, and C_ would describe no fit.
            raise ValueError(
                f"The estimator's prior ({type(params['prior']).__name__}) replaces C, so "
                f"there is no C to choose by the evidence. Fit the estimator directly, or "
                f"leave its prior None (a LaplacePrior, StudentTPrior or HorseshoePrior "
                f"as prior gets its scale chosen)."
            )
        if not ard and shrinkage is None and "penalty" in params and params["penalty"] is None:
            raise ValueError(
                "The estimator's penalty=None makes its prior flat whatever C: there is no C "
                "to choose, and a flat prior's evidence is undefined. Leave penalty at its "
                "default."
            )
        if params.get("max_iter") == 0:
            raise ValueError(
                "The estimator's max_iter=0 runs no iteration: its posterior is the prior and "
                "its evidence is undefined at every C. Use max_iter >= 1."
            )
        # The bracket's Laplace fits carry the estimator's penalty (an L1 or elastic-net
        # prior has a mode, at LogisticRegression's solution); ARD's are Gaussian.
        bracket = dict(shared)
        if not ard and params.get("penalty") in ("l1", "elasticnet"):
            bracket.update(penalty=params["penalty"], l1_ratio=params.get("l1_ratio"))
        fits = {}
        # Each fit's own warnings: the search's fits at the C values it does not keep are
        # exploratory (their evidences are compared, their posteriors dropped), so only the
        # kept fit's are shown, at the end. Shown all, a refined search on iris gave nine
        # UnreliableFitWarnings, one per C tried, each with its own numbers (D-219).
        fit_warnings = {}
        estimated = []  # the C values whose evidence was an estimate

        def fit_at(c):
            if c not in fits:
                if shrinkage is None:
                    estimator = clone(base).set_params(C=c)
                else:
                    scaled = dataclasses.replace(
                        shrinkage, **{_SCALE_FIELD[type(shrinkage)]: float(c)}
                    )
                    estimator = clone(base).set_params(prior=scaled)
                caught: list = []
                try:
                    with catch(("always", Warning), record=True) as caught:
                        fits[c] = estimator.fit(X, y, sample_weight)
                except Exception:
                    reemit(caught)  # what led to the error
                    raise
                fit_warnings[c] = caught
                if _evidence_is_estimate(fits[c]):
                    estimated.append(c)
            return fits[c]

        largest = {}  # the grid's fit at its largest C (the upper edge's warning)

        def grid_evidence(c):
            try:
                if shrinkage is not None:  # a horseshoe has no mode: the estimator's own
                    fit = fit_at(c)
                else:
                    fit = _LAPLACE[link](C=c, **bracket).fit(X, y, sample_weight)
            except ValueError as error:
                # A refusal (a size, a memory limit) names the grid's estimator and the
                # scale it tried, neither of which the user wrote: say whose search it is.
                raise type(error)(
                    f"{type(self).__name__}'s evidence search fits at each value of Cs, "
                    f"and its fit at {c:.3g} failed: {error}"
                ) from error
            if shrinkage is None and _evidence_is_estimate(fit):
                estimated.append(c)
            if c == grid[-1]:
                largest["fit"] = fit
            return _total_evidence(fit)

        self.Cs_ = grid
        self.log_evidence_ = np.array([grid_evidence(c) for c in grid])
        best = int(np.argmax(self.log_evidence_))
        if best == len(grid) - 1 and _separates(largest["fit"], X, y, sample_weight):
            warn(
                f"The evidence is largest at the edge of Cs (C = {grid[best]:.3g}), where "
                f"the fit classifies every training row right: the classes are linearly "
                f"separable, and the evidence then grows with C toward a limit (the prior "
                f"mass of the separating directions), with no maximum that a wider Cs "
                f"would find. The posterior at such a C is very wide, and the Laplace "
                f"approximation's predictions there can be nearly uniform. Choose C "
                f"another way (a smaller Cs range, or cross-validated log loss); EP's and "
                f"VS's posteriors predict better at large C than Laplace's.",
                ConvergenceWarning,
            )
        elif best in (0, len(grid) - 1):
            warn(
                f"The evidence is largest at the edge of Cs (C = {grid[best]:.3g}): the "
                f"maximum may lie beyond it. Widen Cs.",
                ConvergenceWarning,
            )
        if ard:
            self.C_ = float(grid[best])
            steps_estimated = self._fit_ard(base, link, shared, X, y, sample_weight, n_classes)
            self._record_estimated_evidence(estimated, steps_estimated)
            self.refined_Cs_ = np.empty(0)
            self.refined_log_evidence_ = np.empty(0)
            self.classes_ = self.estimator_.classes_
            return self
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
        reemit(fit_warnings[self.C_])
        refined = sorted(fits)
        self.refined_Cs_ = np.array(refined)
        self.refined_log_evidence_ = np.array([_total_evidence(fits[c]) for c in refined])
        self.classes_ = self.estimator_.classes_
        self.n_features_in_ = self.estimator_.n_features_in_
        if hasattr(self.estimator_, "feature_names_in_"):
            self.feature_names_in_ = self.estimator_.feature_names_in_
        d = self.n_features_in_
        self.prior_ = self.estimator_.get_params().get("prior") if shrinkage else None
        self.prior_variances_ = np.full(d, _prior_variance(self.prior_, self.C_))
        self.relevance_ = np.ones(d)
        self.support_ = np.ones(d, dtype=bool)
        self.n_features_selected_ = d
        self.ard_log_evidence_ = np.empty(0)
        self.n_iter_ = len(refined)
        self._record_estimated_evidence(estimated)
        return self

    def _record_estimated_evidence(self, estimated: list, ard_steps: bool = False) -> None:
        """``evidence_is_estimate_``, and a warning where C was chosen among estimated
        evidences: their log-determinant estimate is low by an error that grows with C
        (measured in docs/decisions.md: from 0.3 nats at C = 0.01 to 220 at C = 100), so
        that the maximum moves toward small C; or (``ard_steps``) where ARD's steps read
        estimated marginal variances and evidences."""
        self.evidence_is_estimate_ = bool(estimated) or ard_steps
        exact_rows = structured_laplace.EXACT_DIAGONAL_MAX_ROWS
        if ard_steps:
            warn(
                f"ARD's per-feature variances were set from estimated marginal variances: "
                f"its Laplace fits on many features took a structured covariance without "
                f"exact marginals (more than {exact_rows} rows, or over the memory "
                f"limit; each variance within the fit's error_factor of the exact one), "
                f"and the evidences its steps compared are estimates. Run ARD on at most "
                f"{exact_rows} rows (a subsample), where they are exact.",
                UnreliableFitWarning,
            )
        if not estimated:
            return
        values = ", ".join(f"{c:.3g}" for c in sorted(set(estimated)))
        warn(
            f"C_ = {self.C_:.4g} was chosen among estimated log evidences (at C = "
            f"{values}): the posterior's covariance is structured with estimated marginal "
            f"variances (see estimator_.covariance_reason_), whose evidence is biased low "
            f"by an error that grows with C, so that the choice leans toward small C. "
            f"Choose C by cross-validation (GridSearchCV, LogisticRegressionCV) instead, "
            f"or by the evidence on a subsample where it is exact (binary: at most "
            f"{exact_rows} rows).",
            UnreliableFitWarning,
        )

    # --- automatic relevance determination ------------------------------------------------

    def _fit_ard(self, base, link, shared, X, y, sample_weight, n_classes: int) -> bool:
        """ARD's per-feature variances from Laplace fits (module docstring), then the
        estimator on the features kept, under them; ``n_classes`` those the fits take.
        Returns whether a step's fit had estimated marginal variances (a structured
        covariance beyond the exact marginals' rows)."""
        d = X.shape[1]
        fit_intercept = bool(shared.get("fit_intercept", True))
        by_evidence = isinstance(self.inclusion_prior, str)
        inclusion = 0.5 if by_evidence else float(self.inclusion_prior)
        alpha = np.full(d, 1.0 / self.C_)
        gain = np.zeros(d)  # of each feature's log evidence, at its last step in the model
        keep = np.ones(d, dtype=bool)
        evidence, converged, steps_estimated = [], False, False
        laplace_blocks = n_classes if n_classes > 2 and _LAPLACE[link]._multinomial else 1
        step = None  # where the last step started, if it pruned among several changes
        for _ in range(self.max_iter):
            kept = np.flatnonzero(keep)
            prior = _diagonal_prior(1.0 / alpha[kept], laplace_blocks, fit_intercept)
            fit = _LAPLACE[link](prior=prior, tol=_ARD_NEWTON_TOL, **shared)
            fit = fit.fit(X[:, kept], y, sample_weight)
            value = _total_evidence(fit)
            # Each step moves every feature to its optimum given the others' posterior as
            # it was (s and q held). Where features are correlated or the data nearly
            # separated, prunes together can lower ARD's objective (the evidence less the
            # inclusion prior's price of each feature kept) a lot, and a pruned feature is
            # out for good: on wine (3 classes) the first step took the evidence from -34.3
            # to -210.9 and kept one feature of 13. Such a step is taken back and its change
            # of largest predicted gain made alone (Tipping & Faul's sequential step), then
            # the steps go on. (A single change, and steps that only move variances, which
            # the fixed point settles, are kept as they come.)
            if step is not None and value - kept.size * step.price < step.objective - _ARD_DROP:
                alpha, keep, inclusion = step.alpha, step.keep, step.inclusion
                feature, precision = step.retry
                alpha[feature], keep[feature] = precision, np.isfinite(precision)
                step = None
                continue
            evidence.append(value)
            steps_estimated = steps_estimated or _evidence_is_estimate(fit)
            s, q = _data_factors(fit, alpha[kept])
            new_alpha, gain[kept] = _evidence_optimum(s, q, alpha[kept])
            # In while the posterior inclusion probability expit(G + logit π) exceeds ½, and
            # the evidence is largest at a finite α_j (at α_j = ∞ the slab is the spike).
            price = max(-logit(inclusion), 0.0)
            stays = (gain[kept] > price) & (new_alpha < self.threshold_lambda)
            if not stays.any():  # an intercept-only model is not fitted: keep the best one
                stays[np.argmax(gain[kept])] = True
                new_alpha = np.minimum(new_alpha, self.threshold_lambda)
                warn(
                    "No feature is relevant by the evidence; the most relevant one is kept "
                    "(the estimator needs one). Its prior variance is at most "
                    "1/threshold_lambda.",
                    ConvergenceWarning,
                )
            proposed = np.where(stays, new_alpha, np.inf)
            # The predicted gain of each change alone (s, q held): the evidence in α_j, and
            # the price of the feature's inclusion where it leaves.
            now = _shared_gain(s, q, alpha[kept][None, :])[0]
            after = _shared_gain(s, q, np.where(stays, new_alpha, 1.0)[None, :])[0]
            predicted = np.where(stays, after - now, price - now)
            changed = np.flatnonzero(proposed != alpha[kept])
            step = None
            if changed.size > 1 and not stays.all():  # prunes among its changes: checked next
                j = changed[np.argmax(predicted[changed])]
                objective = value - kept.size * price
                retry = (kept[j], proposed[j])
                step = _PruningStep(alpha.copy(), keep.copy(), inclusion, price, objective, retry)
            moved = np.abs(np.log(new_alpha[stays] / alpha[kept][stays]))
            alpha[kept] = proposed
            keep[kept] = stays
            if by_evidence:  # π's posterior mean under a uniform prior, k of d kept
                inclusion = (keep.sum() + 1.0) / (d + 2.0)
            if stays.all() and moved.max(initial=0.0) < _ARD_TOL:
                converged = True
                break
        if not converged:
            warn(
                f"ARD's per-feature variances did not settle in max_iter={self.max_iter} "
                f"Laplace fits. Increase max_iter, or standardize the features.",
                ConvergenceWarning,
            )
        kept = np.flatnonzero(keep)
        multinomial = n_classes > 2 and getattr(base, "_multinomial", False)
        prior = _diagonal_prior(1.0 / alpha[kept], n_classes if multinomial else 1, fit_intercept)
        self.estimator_ = clone(base).set_params(prior=prior).fit(X[:, kept], y, sample_weight)
        self.prior_ = None
        self.prior_variances_ = np.where(keep, 1.0 / alpha, 0.0)
        # With the final π, from each feature's last gain. A feature the data say nothing
        # about (gain 0: its evidence is largest at variance 0) has π, the prior's.
        self.relevance_ = expit(gain + logit(inclusion))
        self.support_ = keep
        self.n_features_selected_ = int(kept.size)
        self.ard_log_evidence_ = np.array(evidence)
        self.n_iter_ = len(evidence)
        return steps_estimated

    def _get_support_mask(self) -> np.ndarray:
        check_is_fitted(self, "support_")
        return self.support_

    def _estimator_input(self, X):
        """X as the fitted estimator takes it: as given (one C), or its selected columns;
        checked against the fit here, so that an error names this class, not the inner
        estimator the user did not call."""
        if self.ard_log_evidence_.size == 0:  # fitted with one C: the estimator saw X
            # Checked (NaN and infinities too: their error named the estimator), then
            # passed as given: the estimator's own checks see what it was fitted on, and
            # the callers drop its repeat of a feature-names warning given here.
            if is_dask(X):
                check_prediction_input(self, X)
            else:
                validate_data(self, X, accept_sparse=True, dtype=None, reset=False)
            return X
        if is_dask(X):  # its columns selected lazily: the estimator maps over its chunks
            return check_prediction_input(self, X)[:, self.support_]
        X = validate_data(
            self, X, accept_sparse=["csr", "csc"], dtype=[np.float64, np.float32], reset=False
        )
        return X[:, self.support_]

    @property
    def coef_(self) -> np.ndarray:
        """Posterior mean of the coefficients of the fitted estimator (0 where pruned)."""
        check_is_fitted(self, "estimator_")
        inner = self.estimator_.coef_
        if self.support_.all():
            return inner
        coef = np.zeros((inner.shape[0], self.n_features_in_), dtype=inner.dtype)
        coef[:, self.support_] = inner.toarray() if hasattr(inner, "toarray") else inner
        return coef

    @property
    def intercept_(self) -> np.ndarray:
        """Posterior mean of the intercepts of the fitted estimator."""
        check_is_fitted(self, "estimator_")
        return self.estimator_.intercept_

    def summary(self, level=0.95):
        """The fitted estimator's posterior of every coefficient, one row each, with the
        features' relevance and which are in the model.

        A pruned feature's row has mean and sd 0 (its prior is a point mass at 0).

        Parameters
        ----------
        level : float, default=0.95
            Probability of the credible intervals, in (0, 1).

        Returns
        -------
        pandas.DataFrame or numpy structured array
            The columns of the estimator's ``summary()`` and ``relevance`` (the feature's
            posterior inclusion probability, ``relevance_``; NaN for the intercept) and
            ``selected`` (``support_``). Its ``attrs`` are the estimator's, with
            ``estimator`` this class and ``pruned`` the names of the pruned features.
        """
        check_is_fitted(self, "estimator_")
        level = _summaries.check_level(level)
        names = self._feature_names()
        inner = self.estimator_
        per_problem = []
        for label, mean, sd in _summaries.marginals(inner):
            full_mean, full_sd = _widened(mean, self.support_), _widened(sd, self.support_)
            per_problem.append((label, full_mean, full_sd))
        attrs = _summaries._summary_attrs(inner, level)
        attrs["estimator"] = type(self).__name__
        attrs["pruned"] = [n for n, kept in zip(names, self.support_, strict=True) if not kept]
        return _summaries.marginals_table(
            per_problem,
            names,
            level,
            attrs,
            multiclass=len(self.classes_) > 2,
            columns=self._coefficient_columns(),
        )

    def _feature_names(self) -> list[str]:
        """The names of X's columns: ``feature_names_in_``, else ``x0, x1, …``."""
        names = getattr(self, "feature_names_in_", None)
        if names is None:
            return [f"x{j}" for j in range(self.n_features_in_)]
        return [str(n) for n in names]

    # --- the posterior in use: the fitted estimator's, on its columns ------------------
    # (Conditional on the chosen scales: the evidence's choice of C, or of the kept
    # features, is not averaged over.)

    def predict_proba_interval(self, X, level=0.95, *, n_draws=4096, random_state=None):
        """Equal-tailed credible interval of each row's class probabilities: the fitted
        estimator's ``predict_proba_interval`` (under the chosen prior scales).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Data.
        level : float, default=0.95
            Probability of the intervals, in (0, 1).
        n_draws : int, default=4096
            Latent draws per row beyond two classes (unused for two).
        random_state : int, RandomState, Generator or None, default=None
            Seed of those draws; None: a fixed seed.

        Returns
        -------
        lower, upper : ndarray of shape (n_samples, n_classes)
        """
        check_is_fitted(self, "estimator_")
        X = self._estimator_input(X)
        with catch(_REPEATED_NAMES_WARNING):
            return self.estimator_.predict_proba_interval(
                X, level, n_draws=n_draws, random_state=random_state
            )

    def sample_proba(self, X, n_draws=1000, *, random_state=None):
        """Class probabilities of X under posterior draws of the fitted estimator.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Data.
        n_draws : int, default=1000
            Number of draws.
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.

        Returns
        -------
        ndarray of shape (n_draws, n_samples, n_classes)
        """
        check_is_fitted(self, "estimator_")
        X = self._estimator_input(X)
        with catch(_REPEATED_NAMES_WARNING):
            return self.estimator_.sample_proba(X, n_draws, random_state=random_state)

    def sample_coef(self, n_draws: int, random_state=None):
        """Draw coefficients and intercepts from the fitted estimator's posterior (under
        the chosen prior scales), in X's columns: a pruned feature's coefficient is 0 in
        every draw (its prior is a point mass at 0), as in :attr:`coef_`.

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
        check_is_fitted(self, "estimator_")
        inner = self.estimator_
        if self.support_.all():
            return inner.sample_coef(n_draws, random_state)
        n_draws = _summaries.check_n_draws(n_draws)
        n_problems = np.shape(inner.coef_)[0]
        # The draws of the kept coefficients, sized with the copy in X's columns beside them.
        coef, intercept = _summaries.sample_coef(
            inner,
            n_draws,
            random_state,
            8.0 * n_draws * n_problems * self.n_features_in_,
            f" and their copy in the {self.n_features_in_} columns of X",
        )
        full = np.zeros((n_draws, n_problems, self.n_features_in_), dtype=coef.dtype)
        full[:, :, self.support_] = coef
        dtype = inner.coef_.dtype  # the fitted coefficients' (float32 on float32 X)
        return full.astype(dtype, copy=False), intercept.astype(dtype, copy=False)

    def sample_y(self, X, n_draws=1000, *, random_state=None):
        """Labels of X drawn from the fitted estimator's posterior predictive.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Data.
        n_draws : int, default=1000
            Number of draws.
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.

        Returns
        -------
        ndarray of shape (n_draws, n_samples)
        """
        check_is_fitted(self, "estimator_")
        X = self._estimator_input(X)
        with catch(_REPEATED_NAMES_WARNING):
            return self.estimator_.sample_y(X, n_draws, random_state=random_state)

    def loo(self, X, y, sample_weight=None, *, n_draws=None, random_state=None, refit_above="auto"):
        """Leave-one-out of the fitted estimator (its ``loo``) on the training data.

        Each term leaves its row out of the posterior under the chosen prior scales (C, or
        ARD's variances and kept features), not out of their choice: on the scales' own
        data, the estimate is slightly optimistic.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The training data.
        y : array-like of shape (n_samples,)
            Its labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Its weights, as passed to ``fit``.
        n_draws : int, default=None
            Posterior draws (see the estimator's ``loo``).
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.
        refit_above : float, "auto" or None, default="auto"
            See the estimator's ``loo``.

        Returns
        -------
        LeaveOneOut
        """
        check_is_fitted(self, "estimator_")
        inner = self.estimator_
        X = inner._in_memory(self._estimator_input(X), "loo")
        with catch(_REPEATED_NAMES_WARNING):
            return _leave_one_out.leave_one_out(
                inner,
                X,
                y,
                sample_weight,
                n_draws,
                random_state,
                refit_above,
                name=type(self).__name__,  # (the fit the user made, not its estimator_)
            )

    def to_inference_data(
        self, X=None, y=None, sample_weight=None, *, n_draws=1000, random_state=None
    ):
        """The fitted estimator's posterior as ArviZ data (its ``to_inference_data``), its
        features named as X's columns (under ARD the kept ones only: a pruned feature's
        coefficient is 0 in every draw).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features), default=None
            The training data (with ``y``: the ``log_likelihood`` group).
        y : array-like of shape (n_samples,), default=None
            Its labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Its weights.
        n_draws : int, default=1000
            Posterior draws (one chain).
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.

        Returns
        -------
        xarray.DataTree
        """
        check_is_fitted(self, "estimator_")
        inner = self.estimator_
        if X is not None:
            X = inner._in_memory(self._estimator_input(X), "to_inference_data")
        names = [n for n, kept in zip(self._feature_names(), self.support_, strict=True) if kept]
        with catch(_REPEATED_NAMES_WARNING):
            return _arviz_export.to_inference_data(
                inner, X, y, sample_weight, n_draws, random_state, names, type(self).__name__
            )

    def _coefficient_columns(self) -> dict:
        """The marks of the summary's rows (see ``_summaries.coefficient_columns``)."""
        tail = [bool(self.estimator_.fit_intercept)]
        relevance = np.concatenate([self.relevance_, [np.nan] * tail[0]])
        selected = np.concatenate([self.support_, [True] * tail[0]]).astype(bool)
        return {"relevance": relevance, "selected": selected}

    predict_proba = _delegate(
        "predict_proba",
        "Posterior predictive probabilities of the fitted estimator.",
        "ndarray of shape (n_samples, n_classes)",
    )
    predict_log_proba = _delegate(
        "predict_log_proba",
        "Log of :meth:`predict_proba`.",
        "ndarray of shape (n_samples, n_classes)",
    )
    decision_function = _delegate(
        "decision_function",
        "Decision function of the fitted estimator.",
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


class _PruningStep(NamedTuple):
    """Where an ARD step of several changes, prunes among them, started, to take it back:
    the precisions, the kept features, π, the price of a feature kept
    (``max(-logit π, 0)``), the objective there (the log evidence less that price per
    feature kept), and the step's change of largest predicted gain, to make alone
    (``(feature, precision)``)."""

    alpha: np.ndarray
    keep: np.ndarray
    inclusion: float
    price: float
    objective: float
    retry: tuple


def _check_ard_size(link: str, shared: dict, X, y, sample_weight) -> int:
    """The number of classes ARD's Laplace fits take (those of positive weight, D-148: one
    prior block each), after refusing, before the grid's fits, a multinomial problem whose
    first ARD step cannot be fitted: ARD's per-feature prior on the multinomial posterior
    is a prior ``prior=``, which keeps the dense (K·p)² covariance (the structured
    multinomial covariance takes the default prior only), and the step reads each
    feature's K × K block of it. Binary problems (and one-vs-rest ones) take their
    structured covariance under ARD's diagonal prior, and ARD reads its marginal variances
    only."""
    probe = _LAPLACE[link](**shared)
    probe._fit_data(X, y, sample_weight)
    n_classes = len(probe.classes_)
    if n_classes > 2 and _LAPLACE[link]._multinomial:
        per_class = X.shape[1] + int(shared.get("fit_intercept", True))
        try:
            check_softmax_dims(n_classes, per_class, X.shape[0], under_prior=True)
        except ValueError as error:  # (MemoryLimitError is one: its sizes in the cause)
            p = n_classes * per_class
            raise type(error)(
                f"scales='ard' on {n_classes} classes fits the multinomial posterior of "
                f"{p} parameters ({n_classes} classes × {per_class}) under ARD's "
                f"per-feature prior, which keeps its dense {p} × {p} covariance (the "
                f"structured one takes a shared C only): beyond {MAX_SOFTMAX_PARAMS} "
                f"parameters, or the memory limit, its steps cannot run, so it is refused "
                f"before the search. Select features first (e.g. "
                f"sklearn.feature_selection.SelectKBest in a pipeline, to at most "
                f"{_most_ard_features(n_classes, X.shape[0])} features here), or use "
                f"scales='shared' (one C, whose fits take the structured covariance)."
            ) from error
    return n_classes


def _most_ard_features(n_classes: int, n_rows: int) -> int:
    """The most features (with an intercept) whose multinomial posterior under a prior
    passes :func:`check_softmax_dims` (0 if none)."""
    low, high = 0, MAX_SOFTMAX_PARAMS // n_classes
    while low < high:  # (the count grows with the features: bisection)
        middle = (low + high + 1) // 2
        try:
            check_softmax_dims(n_classes, middle + 1, n_rows, under_prior=True)
        except ValueError:
            high = middle - 1
        else:
            low = middle
    return low


def _diagonal_prior(variances: np.ndarray, n_blocks: int, fit_intercept: bool):
    """``(mean, variances)`` of the estimator's ``prior``: the features' variances (one
    block, or one per class of the multinomial layout ``[W.ravel(), b]``), then the
    intercepts' broad one."""
    parts = [np.tile(variances, n_blocks)]
    if fit_intercept:
        parts.append(np.full(n_blocks, INTERCEPT_PRIOR_VAR))
    diagonal = np.concatenate(parts)
    return np.zeros(diagonal.size), diagonal


def _data_factors(fit, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(s, q)``, (K, n) each: the precisions and natural means of the data's Gaussian
    factor on each feature's coefficients, their own prior ``N(0, 1/α_j)`` left out, in
    coordinates where that factor is separable.

    The prior is diagonal, so the posterior marginal of feature j's block of coefficients
    (one per problem or class) is its prior times that factor: precision
    ``S_j = Σ_j⁻¹ − α_j I``, natural mean ``h_j = Σ_j⁻¹ m_j``. Binary and one-vs-rest
    problems are independent, so the block is diagonal and ``s = 1/Σ_jj − α_j``,
    ``q = m_j/Σ_jj``. The multinomial block is a full K × K (the classes' coefficients are
    correlated; along their common shift the data say nothing): in the eigenbasis of
    ``S_j = U diag(λ) Uᵀ`` the evidence in α_j is a sum of one-dimensional terms with
    ``s = λ``, ``q = Uᵀ h_j``.
    """
    posteriors = fit.posteriors_
    n = alpha.size
    tiny = np.finfo(float).tiny
    if not fit._is_multinomial():
        mean = np.stack([np.asarray(g.mean)[:n] for g in posteriors])
        # The marginal variances only: a structured posterior's (text scale: p beyond
        # 4096) in O(p r²), never its p × p covariance (6.2 GiB at 5000 × 20,000).
        var = np.stack([np.asarray(g.var)[:n] for g in posteriors])
        # A feature the data say nothing about has s ≤ 0 up to round-off: no gain, out.
        return np.maximum(1.0 / var - alpha, tiny), mean / var
    posterior = posteriors[0]
    k = len(fit.classes_)
    index = np.arange(k)[None, :] * n + np.arange(n)[:, None]  # (n, K): w_kj's position
    cov = np.asarray(posterior.cov)[index[:, :, None], index[:, None, :]]  # (n, K, K)
    mean = np.asarray(posterior.mean)[index]  # (n, K)
    precision = np.linalg.inv(cov)
    data_precision = precision - alpha[:, None, None] * np.eye(k)
    natural_mean = np.einsum("jab,jb->ja", precision, mean)
    values, vectors = np.linalg.eigh(0.5 * (data_precision + np.swapaxes(data_precision, 1, 2)))
    rotated = np.einsum("jab,ja->jb", vectors, natural_mean)
    return np.maximum(values, tiny).T, rotated.T


def _evidence_optimum(s, q, alpha) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's evidence-maximizing precision α_j (inf: the feature out) and the log
    evidence it gains over α_j = ∞, from its data factors ``s``, ``q`` (K, n)
    (:func:`_data_factors`), starting the shared case's iterations at ``alpha`` (n,): see
    the module docstring."""
    if s.shape[0] == 1:
        ratio = (q[0] ** 2) / s[0]
        relevant = ratio > 1.0
        optimum = np.full(ratio.shape, np.inf)
        optimum[relevant] = s[0][relevant] ** 2 / (q[0][relevant] ** 2 - s[0][relevant])
        gain = np.where(relevant, 0.5 * (ratio - 1.0 - np.log(np.where(relevant, ratio, 1.0))), 0)
        return optimum, gain
    # Several classes share α_j: Σ_k ℓ_k(α) has no closed-form maximum. A log grid around
    # each feature's scale brackets it (the maximum may be α = ∞, or beyond the grid's end,
    # which the gain's sign and threshold_lambda then settle); Newton's steps in log α,
    # each within one grid step and only where the curve is concave, refine it.
    scale = s.mean(axis=0)
    grid = scale[None, :] * np.exp(_SHARED_ALPHA_GRID)[:, None]  # (G, n)
    log_alpha = np.log(grid[np.argmax(_shared_gain(s, q, grid), axis=0), np.arange(scale.size)])
    spacing = _SHARED_ALPHA_GRID[1] - _SHARED_ALPHA_GRID[0]
    for _ in range(_SHARED_ALPHA_NEWTON_STEPS):
        a = np.exp(log_alpha)
        total = a + s
        first = 0.5 * (1.0 / a - 1.0 / total - q**2 / total**2).sum(axis=0)
        second = 0.5 * (-1.0 / a**2 + 1.0 / total**2 + 2.0 * q**2 / total**3).sum(axis=0)
        slope, curvature = a * first, a * first + a**2 * second  # in t = log α
        concave = curvature < 0.0
        step = np.where(concave, -slope / np.where(concave, curvature, -1.0), 0.0)
        log_alpha = log_alpha + np.clip(step, -spacing, spacing)
    optimum = np.exp(log_alpha)
    gain = _shared_gain(s, q, optimum[None, :])[0]
    optimum = np.where(gain > 0.0, optimum, np.inf)
    return optimum, np.maximum(gain, 0.0)


def _shared_gain(s, q, alpha) -> np.ndarray:
    """``Σ_k ℓ_k(α) − Σ_k ℓ_k(∞)`` for each row of ``alpha`` (G, n); ``s``, ``q`` (K, n)."""
    s, q, alpha = s[None], q[None], alpha[:, None, :]
    return 0.5 * (-np.log1p(s / alpha) + q**2 / (alpha + s)).sum(axis=1)


def _widened(values: np.ndarray, support: np.ndarray) -> np.ndarray:
    """A problem's (coefficients, then intercept) with zeros at the pruned features."""
    d = support.size
    out = np.zeros(d + values.size - int(support.sum()))
    out[np.flatnonzero(support)] = values[: support.sum()]
    out[d:] = values[support.sum() :]
    return out
