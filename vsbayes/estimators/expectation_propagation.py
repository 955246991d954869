"""Expectation-propagation estimators (weight space, damped parallel updates)."""

from __future__ import annotations

from numbers import Real
from typing import ClassVar

from ._base import BayesianGLMClassifier, Interval
from ._methods import EPMethod

__all__ = ["EPLogisticRegression", "EPProbitRegression"]


class ExpectationPropagationClassifier(BayesianGLMClassifier):
    """Base of the EP estimators: the damping parameter; the method is ``_methods.EPMethod``."""

    _method, _title = "ep", "expectation propagation"
    _posterior_method = EPMethod
    _constraints: ClassVar[dict[str, tuple]] = {
        **BayesianGLMClassifier._constraints,
        "damping": (Interval(Real, 0, 1, closed="right"),),
    }

    def __init__(
        self,
        C=1.0,
        *,
        fit_intercept=True,
        class_weight=None,
        damping=0.85,
        max_iter=200,
        tol=1e-8,
        random_state=None,
        verbose=0,
        prior=None,
        decay=1.0,
    ):
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
        self.damping = damping


class EPLogisticRegression(ExpectationPropagationClassifier):
    """Bayesian logistic regression by expectation propagation.

    Each logistic likelihood factor is replaced by a Gaussian site in the direction of its
    design row, fitted so that the posterior matches the moments of the exact factor times
    the rest (by a trapezoid rule accurate to about 1e-8); all sites are updated in parallel
    and damped until they stop moving, and EP's evidence estimate is returned
    (:func:`vsbayes.approximations.expectation_propagation`). Weights of at least 1 act as
    repeated factors (power EP), smaller ones as powers of the factor. Beyond two classes,
    the multinomial (softmax) posterior, whose sites are Gaussian factors on each row's
    K − 1 centred latent values, fitted by variational sampling on a deterministic rule
    (:func:`vsbayes.approximations.softmax_ep`).

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
    damping : float, default=0.85
        Fraction of the new site parameters taken at each sweep (1: undamped); lower
        it if EP does not converge (near-separable data).
    max_iter : int, default=200
        Maximum iterations of Newton's method for the mode, and of EP's sweeps over the
        sites.
    tol : float, default=1e-8
        Newton's method for the mode stops when half the squared Newton decrement (the gain
        in log-posterior one more step would bring) is at most ``tol``.
        EP stops when no site parameter moves by more than ``tol / 100`` (relative) in a
        sweep (the multinomial EP's threshold: ``max(tol / 100, 1e-8)``).
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
        Posterior mean of the coefficients (beyond two classes, one row per class of the
        multinomial model, or per one-vs-rest problem).
    intercept_ : ndarray of shape (1,) or (n_classes,)
        Posterior mean of the intercept (zeros when ``fit_intercept=False``).
    sigma_ : ndarray of shape (p, p), (n_classes·p, n_classes·p) or (n_classes, p, p)
        Posterior covariance of the parameter vector ``[coef..., intercept]`` (p its
        length); of the multinomial model, of ``[coef_.ravel(), intercept_]`` (the rows of
        ``coef_`` one after the other, then the intercepts); one-vs-rest, one per class.
    log_marginal_likelihood_value_ : float or ndarray of shape (n_classes,)
        Estimated log evidence ``log ∫ Π_i F(y_i f_i)^{s_i} N(w; prior) dw`` (the
        multinomial model's: one float; one-vs-rest: one per class).
    n_iter_ : ndarray of shape (1,) or (n_classes,)
        EP sweeps over the sites.
    posteriors_ : list of Gaussian
        The posterior of each binary problem, or the multinomial model's one joint
        posterior, with the method's diagnostics (``n_iter``, ``converged``, ``site_change`` of
        :class:`vsbayes.approximations.EPResult`).
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
    If the method cannot return a valid Gaussian (a site precision so large the posterior
    covariance is not numerically positive definite, or max_iter reached with improper
    cavities), the Laplace approximation is used for that problem, with an
    :class:`~vsbayes.exceptions.UnreliableFitWarning`; ``laplace_fallback_`` records it.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import EPLogisticRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), EPLogisticRegression(C=1.0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _link = "logistic"
    _multinomial = True


class EPProbitRegression(ExpectationPropagationClassifier):
    """Bayesian probit regression by expectation propagation.

    Each probit likelihood factor is replaced by a Gaussian site in the direction of its
    design row, fitted so that the posterior matches the moments of the exact factor times
    the rest (closed form); all sites are updated in parallel and damped until they stop
    moving, and EP's evidence estimate is returned
    (:func:`vsbayes.approximations.expectation_propagation`). Weights of at least 1 act as
    repeated factors (power EP), smaller ones as powers of the factor. Beyond two classes,
    one posterior per class (one-vs-rest): the probit has no multinomial form.

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
    damping : float, default=0.85
        Fraction of the new site parameters taken at each sweep (1: undamped); lower
        it if EP does not converge (near-separable data).
    max_iter : int, default=200
        Maximum iterations of Newton's method for the mode, and of EP's sweeps over the
        sites.
    tol : float, default=1e-8
        Newton's method for the mode stops when half the squared Newton decrement (the gain
        in log-posterior one more step would bring) is at most ``tol``.
        EP stops when no site parameter moves by more than ``tol / 100`` (relative) in a
        sweep.
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
        EP sweeps over the sites.
    posteriors_ : list of Gaussian
        The posterior of each binary problem, with the method's diagnostics (``n_iter``,
        ``converged``, ``site_change`` of :class:`vsbayes.approximations.EPResult`).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.
    laplace_fallback_ : ndarray of bool, shape (1,) or (n_classes,)
        True where the method failed and the Laplace approximation is used instead.

    See Also
    --------
    VSProbitRegression : The posterior by variational sampling.

    Notes
    -----
    If the method cannot return a valid Gaussian (a site precision so large the posterior
    covariance is not numerically positive definite, or max_iter reached with improper
    cavities), the Laplace approximation is used for that problem, with an
    :class:`~vsbayes.exceptions.UnreliableFitWarning`; ``laplace_fallback_`` records it.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import EPProbitRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), EPProbitRegression(C=1.0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _link = "probit"
