"""Variational-Bayes logistic regression: the Jaakkola–Jordan bound, one ξ per observation."""

from __future__ import annotations

from ._base import BayesianGLMClassifier
from ._methods import VBMethod

__all__ = ["VBLogisticRegression"]


class VBLogisticRegression(BayesianGLMClassifier):
    # The Jaakkola–Jordan bound exists for the logistic link only.
    """Bayesian logistic regression by the Jaakkola–Jordan variational bound.

    Each logistic likelihood factor is bounded below by a Gaussian-shaped function with its
    own variational parameter ξ_i; the bound, maximized by closed-form updates started from
    the Laplace approximation, gives a Gaussian posterior and a lower bound on the log
    evidence (:func:`vsbayes.approximations.jaakkola_jordan`). The approximation is known to
    underestimate the posterior variance; it is a baseline for
    :class:`VSLogisticRegression`.

    Parameters
    ----------
    C : float, default=1.0
        Prior variance of each coefficient: the prior is N(0, C·I), so the posterior mode
        is the solution of scikit-learn's ``LogisticRegression(C=C)`` (logistic link; up to
        the intercept's vague prior). Smaller values mean stronger regularization.
    fit_intercept : bool, default=True
        Whether to fit an intercept ``b``; its prior is N(0, 10⁶) (vague but proper, so the
        evidence is finite).
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (likelihood exponents).
    max_iter : int, default=1000
        Maximum iterations of Newton's method for the mode, and of the bound's updates.
    tol : float, default=1e-8
        Newton's method for the mode stops when half the squared Newton decrement (the gain
        in log-posterior one more step would bring) is at most ``tol``.
        The bound's updates stop when the bound rises by at most ``tol · max(1, |bound|)``
        nats in one update.
    random_state : int, RandomState instance, Generator or None, default=None
        Unused (no randomness); kept for API compatibility.
    verbose : int, default=0
        Print a summary of each fit when ≥ 1, and Newton's iterations when ≥ 2.
    prior : fitted estimator, Gaussian, (mean, cov), dict or None, default=None
        A Gaussian prior N(μ₀, Σ₀) on the parameter vector, in ``sigma_``'s layout, in
        place of N(0, C·I) on the coefficients and N(0, 10⁶) on the intercepts (``C`` is
        then unused): an earlier fitted estimator (its posterior; the same classes,
        features and ``fit_intercept``), a :class:`~vsbayes.gaussian.Gaussian`, a pair
        ``(mean, cov)`` (``cov`` of shape (p, p), or (p,) variances) or a dict with
        ``"mean"`` and ``"cov"`` or ``"precision"``; beyond two classes one-vs-rest, a
        list of one per class or one for all. Checked at fit: shape, symmetry, positive
        definiteness. Exact for every method (a full covariance is whitened: see the user
        guide's "Bayesian updating").
    decay : float in (0, 1], default=1.0
        Forgetting in :meth:`partial_fit`: before a batch of n rows, the carried
        posterior's precision and precision × mean keep the weight ``decay**n`` and the
        original prior (``prior``, or the default) gets the rest, so a row seen k rows ago
        weighs ``decay**k``: an effective memory of ``1 / (1 - decay)`` rows (1000 for
        0.999). 1 forgets nothing.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        Posterior mean of the coefficients (beyond two classes, one row per one-vs-rest
        problem).
    intercept_ : ndarray of shape (1,) or (n_classes,)
        Posterior mean of the intercept (zeros when ``fit_intercept=False``).
    sigma_ : ndarray of shape (p, p) or (n_classes, p, p)
        Posterior covariance of the parameter vector ``[coef..., intercept]`` (p its
        length); beyond two classes, one per one-vs-rest problem.
    log_marginal_likelihood_value_ : float or ndarray of shape (n_classes,)
        Estimated log evidence ``log ∫ Π_i F(y_i f_i)^{s_i} N(w; prior) dw`` (beyond
        two classes, one per one-vs-rest problem).
    n_iter_ : ndarray of shape (1,) or (n_classes,)
        Updates of the variational parameters.
    posteriors_ : list of Gaussian
        The posterior of each binary problem, with the method's diagnostics (``n_iter``,
        ``converged``, ``xi`` of :class:`vsbayes.approximations.VBResult`; ``log_Z`` is the
        evidence lower bound).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.
    laplace_fallback_ : ndarray of bool, shape (1,) or (n_classes,)
        True where the method failed and the Laplace approximation is used instead.

    See Also
    --------
    VSLogisticRegression : The posterior by variational sampling.

    Notes
    -----
    If the method cannot return a valid Gaussian (a posterior covariance that is not
    numerically positive definite), the Laplace approximation is used for that problem, with
    an :class:`~vsbayes.exceptions.UnreliableFitWarning`; ``laplace_fallback_`` records it.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import VBLogisticRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), VBLogisticRegression(C=1.0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _method, _title = "vb", "variational Bayes (Jaakkola–Jordan bound)"
    _link = "logistic"
    _posterior_method = VBMethod

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        max_iter=1000,
        tol=1e-8,
        random_state=None,
        verbose=0,
        prior=None,
        decay=1.0,
    ):
        # The bound's fixed-point updates converge linearly: a larger default max_iter
        # (breast cancer needs about 180 updates).
        super().__init__(
            C,
            fit_intercept=fit_intercept,
            class_weight=class_weight,
            max_iter=max_iter,
            tol=tol,
            random_state=random_state,
            verbose=verbose,
            prior=prior,
            decay=decay,
        )
