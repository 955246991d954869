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
        max_iter=200,
        verbose=0,
        warm_start=False,
        n_jobs=None,
        damping=0.85,
        prior=None,
        decay=1.0,
        buffer_size=100,
    ):
        super().__init__(
            penalty,
            C=C,
            l1_ratio=l1_ratio,
            dual=dual,
            tol=tol,
            fit_intercept=fit_intercept,
            intercept_scaling=intercept_scaling,
            class_weight=class_weight,
            random_state=random_state,
            solver=solver,
            max_iter=max_iter,
            verbose=verbose,
            warm_start=warm_start,
            n_jobs=n_jobs,
            prior=prior,
            decay=decay,
            buffer_size=buffer_size,
        )
        self.damping = damping


class EPLogisticRegression(ExpectationPropagationClassifier):
    """Bayesian logistic regression by expectation propagation.

    Each logistic likelihood factor is replaced by a Gaussian site in the direction of its
    design row, fitted so that the posterior matches the moments of the exact factor times
    the rest (variational-sampling fits on a Gauss–Hermite rule where the cavity is narrow,
    a trapezoid rule on the link's scale where it is wide; accurate to about 1e-8); all
    sites are updated in parallel and damped until they stop moving, and EP's evidence
    estimate is returned (:func:`vsbayes.approximations.expectation_propagation`). Weights
    of at least 1 act as repeated factors (power EP), smaller ones as powers of the factor.
    Beyond two classes, the multinomial (softmax) posterior, whose sites are Gaussian
    factors on each row's K − 1 centred latent values, from the softmax's tilted moments
    (variational-sampling fits on a deterministic rule where the rows are very wide, as on
    digits; :func:`vsbayes.approximations.softmax_ep`).

    Parameters
    ----------
    penalty : {"l2", "l1", "elasticnet"} or None, default="deprecated"
        LogisticRegression's keyword, with its Bayesian meaning: ``"l2"`` is the Gaussian
        prior N(0, C·I) on the coefficients; None (or ``C=np.inf``) the flat prior, whose
        posterior is the normalized likelihood — proper when the classes are not
        (quasi-)separated and the design has full column rank, else a ValueError says
        which (the evidence under a flat prior is undefined:
        ``log_marginal_likelihood_value_`` is NaN). ``"l1"`` is the Laplace prior
        ``LaplacePrior(scale=C)``, ``Π exp(-|θ_j|/C) / 2C``, whose mode is
        LogisticRegression's L1 solution; ``"elasticnet"`` the prior
        ``∝ exp(-r|θ_j|/C - (1 - r)θ_j²/(2C))`` (r = ``l1_ratio``), whose mode is its
        elastic-net solution. The posterior is the Bayesian one: its mean (``coef_``) is
        not sparse (the user guide's "Shrinkage priors"). Beyond two classes the prior is on
        every class's coefficients, as scikit-learn's multinomial L1. The
        default, ``"deprecated"`` as in scikit-learn 1.9, lets ``l1_ratio`` and ``C`` decide.
    C : float, default=1.0
        Prior variance of each coefficient: the prior is N(0, C·I), so the posterior mode
        is the solution of scikit-learn's ``LogisticRegression(C=C)`` (logistic link; up to
        the intercept's vague prior). Smaller values mean stronger regularization.
        ``np.inf``: the flat prior (see ``penalty``).
    l1_ratio : float or None, default=0.0
        LogisticRegression's L1 share r of the penalty, in [0, 1]: 0 (or None) is the
        Gaussian prior N(0, C·I), 1 the Laplace prior of scale C, between them the
        elastic-net prior, Laplace(C/r) × N(0, C/(1 - r)) normalized (see ``penalty``).
    dual : bool, default=False
        LogisticRegression's keyword, with its rule (True only with
        ``solver="liblinear"``); no effect on the posterior: its factorization, primal
        (p × p) or dual (M × M), is chosen by the problem's shape.
    tol : float, default=1e-8
        Newton's method for the mode stops when half the squared Newton decrement (the gain
        in log-posterior one more step would bring) is at most ``tol``.
        EP stops when no site parameter moves by more than ``tol / 100`` (relative) in a
        sweep, or (two classes) by more than the round-off of its update, which on many
        rows is the larger (~1e-9 at 10⁶ rows); the multinomial EP at ``√tol``, or
        ``tol / 100`` where a sweep is cheap (e.g. iris and wine), within [1e-8, 1e-3].
    fit_intercept : bool, default=True
        Whether to fit an intercept ``b``; its prior is N(0, 10⁶) (vague but proper, so the
        evidence is finite).
    intercept_scaling : float, default=1
        With ``solver="liblinear"`` only, as in LogisticRegression: liblinear penalizes the
        intercept as the coefficient of a synthetic feature of this value, so its prior is
        N(0, C · intercept_scaling²); otherwise the intercept's prior is N(0, 10⁶).
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (likelihood exponents).
    random_state : int, RandomState instance, Generator or None, default=None
        Unused (no randomness); kept for API compatibility.
    solver : {"lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga"}, \
            default="lbfgs"
        LogisticRegression's optimizer names. The mode is found by Newton's method with the
        exact Hessian (Cholesky) whatever the name, since the posterior needs that Hessian
        at the mode anyway: the fit does not depend on ``solver``, except ``"liblinear"``,
        whose penalized intercept is mirrored (see ``intercept_scaling``) and which fits two
        classes only (use ``OneVsRestClassifier`` beyond, as LogisticRegression says).
    max_iter : int, default=200
        Maximum iterations of Newton's method for the mode, and of EP's sweeps over the
        sites.
        ``max_iter=0`` runs no iteration: the posterior is the prior, with a
        ConvergenceWarning (LogisticRegression's coefficients stay at their start).
    verbose : int, default=0
        Print a summary of each fit when ≥ 1, and Newton's iterations when ≥ 2.
    warm_start : bool, default=False
        Start the next ``fit``'s search for the mode from this fit's posterior mean (when the
        number of features and of problems agree), as LogisticRegression starts its solver
        from the previous coefficients.
    n_jobs : int or None, default=None
        Parallel workers (joblib) evaluating the likelihood in chunks; ``None`` means 1
        unless in a :func:`joblib.parallel_config` context, so a Dask or Ray backend
        spreads the evaluations over a cluster. Results do not depend on it.
    damping : float, default=0.85
        Fraction of the new site parameters taken at each sweep (1: undamped); lower
        it if EP does not converge (near-separable data).
    prior : estimator, Gaussian, tuple, dict, shrinkage prior or None, default=None
        A shrinkage prior on each coefficient — :class:`~vsbayes.LaplacePrior`,
        :class:`~vsbayes.StudentTPrior` or :class:`~vsbayes.HorseshoePrior` (beyond two
        classes the multinomial posterior takes ``LaplacePrior`` only; the intercept keeps
        N(0, 10⁶); checked at fit) — or a Gaussian prior
        N(μ₀, Σ₀) on the parameter vector, in ``sigma_``'s layout, in place of N(0, C·I) on
        the coefficients and N(0, 10⁶) on the intercepts (``C``, ``penalty`` and
        ``l1_ratio`` are then unused): an earlier fitted estimator (its
        posterior; the same classes, features and ``fit_intercept``), a
        :class:`~vsbayes.gaussian.Gaussian`, a pair ``(mean, cov)`` (``cov`` of shape
        (p, p), or (p,) variances) or a dict with ``"mean"`` and ``"cov"`` or
        ``"precision"``; beyond two classes one-vs-rest, a list of one per class or one for
        all. Checked at fit: shape, symmetry, positive definiteness. Exact for every method
        (a full covariance is whitened: see the user guide's "Bayesian updating").
    decay : float in (0, 1], default=1.0
        Forgetting in :meth:`partial_fit`: before a batch of n rows, the carried
        posterior's precision and precision × mean keep the weight ``decay**n`` and the
        original prior (``prior``, or the default) gets the rest, so a row seen k rows ago
        weighs ``decay**k``: an effective memory of ``1 / (1 - decay)`` rows (1000 for
        0.999). 1 forgets nothing.
    buffer_size : int, default=100
        Rows that :meth:`partial_fit` keeps to correct assumed-density filtering, which
        loses most on small batches. A batch of fewer rows updates the posterior at once
        and joins a buffer; when the buffer reaches ``buffer_size`` rows, they are refitted
        together by the estimator's method under the posterior from before them (that call
        costs a ``fit`` of them). One-row calls keep the sites of the last
        ``buffer_size`` rows instead, and each refits four of them, those visited longest
        ago, under the posterior without them: no call refits the buffer, each costs about
        ``SGDClassifier.partial_fit``'s. Memory: at most ``buffer_size`` rows. 0 or 1: each
        batch on its own (no buffer).

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
        With two classes and many features, a
        :class:`~vsbayes.gaussian.StructuredCovariance` (diagonal plus low rank,
        dense only on request; see ``covariance_structure_``); for a multinomial
        posterior beyond 10,000 parameters, its subclass
        :class:`~vsbayes.gaussian.CentredStructuredCovariance` (exact along each
        column's shift direction and on the intercepts' contrasts).
    covariance_structure_ : str or ndarray of str
        The posterior covariance's structure: "dense", or for a problem too large
        for it "dual" (binary), "lowrank" or "diagonal".
    covariance_reason_ : str or list of str
        Why that structure (the problem's size and the memory limit).
    log_marginal_likelihood_value_ : float or ndarray of shape (n_classes,)
        Estimated log evidence ``log ∫ Π_i F(y_i f_i)^{s_i} N(w; prior) dw`` (the
        multinomial model's: one float; one-vs-rest: one per class).
        A structured posterior's (``covariance_structure_`` "lowrank" or "diagonal"
        with estimated marginals) has an estimated log-determinant: the exact Laplace
        evidence lies within its ``evidence_bounds`` (``posteriors_``), and where they are
        more than 1 nat apart a structure forced by ``vsbayes.config_context`` warns
        (UnreliableFitWarning); one the fit chose for the problem's size records them.
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
    penalty : {"l2", "l1", "elasticnet"} or None, default="deprecated"
        LogisticRegression's keyword, with its Bayesian meaning: ``"l2"`` is the Gaussian
        prior N(0, C·I) on the coefficients; None (or ``C=np.inf``) the flat prior, whose
        posterior is the normalized likelihood — proper when the classes are not
        (quasi-)separated and the design has full column rank, else a ValueError says
        which (the evidence under a flat prior is undefined:
        ``log_marginal_likelihood_value_`` is NaN). ``"l1"`` is the Laplace prior
        ``LaplacePrior(scale=C)``, ``Π exp(-|θ_j|/C) / 2C``, whose mode is
        LogisticRegression's L1 solution; ``"elasticnet"`` the prior
        ``∝ exp(-r|θ_j|/C - (1 - r)θ_j²/(2C))`` (r = ``l1_ratio``), whose mode is its
        elastic-net solution. The posterior is the Bayesian one: its mean (``coef_``) is
        not sparse (the user guide's "Shrinkage priors"). Beyond two classes, on each
        one-vs-rest problem. The
        default, ``"deprecated"`` as in scikit-learn 1.9, lets ``l1_ratio`` and ``C`` decide.
    C : float, default=1.0
        Prior variance of each coefficient: the prior is N(0, C·I), so the posterior mode
        is the solution of scikit-learn's ``LogisticRegression(C=C)`` (logistic link; up to
        the intercept's vague prior). Smaller values mean stronger regularization.
        ``np.inf``: the flat prior (see ``penalty``).
    l1_ratio : float or None, default=0.0
        LogisticRegression's L1 share r of the penalty, in [0, 1]: 0 (or None) is the
        Gaussian prior N(0, C·I), 1 the Laplace prior of scale C, between them the
        elastic-net prior, Laplace(C/r) × N(0, C/(1 - r)) normalized (see ``penalty``).
    dual : bool, default=False
        LogisticRegression's keyword, with its rule (True only with
        ``solver="liblinear"``); no effect on the posterior: its factorization, primal
        (p × p) or dual (M × M), is chosen by the problem's shape.
    tol : float, default=1e-8
        Newton's method for the mode stops when half the squared Newton decrement (the gain
        in log-posterior one more step would bring) is at most ``tol``.
        EP stops when no site parameter moves by more than ``tol / 100`` (relative) in a
        sweep, or by more than the round-off of its update, which on many rows is the
        larger (~1e-9 at 10⁶ rows).
    fit_intercept : bool, default=True
        Whether to fit an intercept ``b``; its prior is N(0, 10⁶) (vague but proper, so the
        evidence is finite).
    intercept_scaling : float, default=1
        With ``solver="liblinear"`` only, as in LogisticRegression: liblinear penalizes the
        intercept as the coefficient of a synthetic feature of this value, so its prior is
        N(0, C · intercept_scaling²); otherwise the intercept's prior is N(0, 10⁶).
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (likelihood exponents).
    random_state : int, RandomState instance, Generator or None, default=None
        Unused (no randomness); kept for API compatibility.
    solver : {"lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga"}, \
            default="lbfgs"
        LogisticRegression's optimizer names. The mode is found by Newton's method with the
        exact Hessian (Cholesky) whatever the name, since the posterior needs that Hessian
        at the mode anyway: the fit does not depend on ``solver``, except ``"liblinear"``,
        whose penalized intercept is mirrored (see ``intercept_scaling``) and which fits two
        classes only (use ``OneVsRestClassifier`` beyond, as LogisticRegression says).
    max_iter : int, default=200
        Maximum iterations of Newton's method for the mode, and of EP's sweeps over the
        sites.
        ``max_iter=0`` runs no iteration: the posterior is the prior, with a
        ConvergenceWarning (LogisticRegression's coefficients stay at their start).
    verbose : int, default=0
        Print a summary of each fit when ≥ 1, and Newton's iterations when ≥ 2.
    warm_start : bool, default=False
        Start the next ``fit``'s search for the mode from this fit's posterior mean (when the
        number of features and of problems agree), as LogisticRegression starts its solver
        from the previous coefficients.
    n_jobs : int or None, default=None
        Parallel workers (joblib) evaluating the likelihood in chunks; ``None`` means 1
        unless in a :func:`joblib.parallel_config` context, so a Dask or Ray backend
        spreads the evaluations over a cluster. Results do not depend on it.
    damping : float, default=0.85
        Fraction of the new site parameters taken at each sweep (1: undamped); lower
        it if EP does not converge (near-separable data).
    prior : estimator, Gaussian, tuple, dict, shrinkage prior or None, default=None
        A shrinkage prior on each coefficient — :class:`~vsbayes.LaplacePrior`,
        :class:`~vsbayes.StudentTPrior` or :class:`~vsbayes.HorseshoePrior` (binary and
        one-vs-rest; the intercept keeps N(0, 10⁶); checked at fit) — or a Gaussian prior
        N(μ₀, Σ₀) on the parameter vector, in ``sigma_``'s layout, in place of N(0, C·I) on
        the coefficients and N(0, 10⁶) on the intercepts (``C``, ``penalty`` and
        ``l1_ratio`` are then unused): an earlier fitted estimator (its
        posterior; the same classes, features and ``fit_intercept``), a
        :class:`~vsbayes.gaussian.Gaussian`, a pair ``(mean, cov)`` (``cov`` of shape
        (p, p), or (p,) variances) or a dict with ``"mean"`` and ``"cov"`` or
        ``"precision"``; beyond two classes one-vs-rest, a list of one per class or one for
        all. Checked at fit: shape, symmetry, positive definiteness. Exact for every method
        (a full covariance is whitened: see the user guide's "Bayesian updating").
    decay : float in (0, 1], default=1.0
        Forgetting in :meth:`partial_fit`: before a batch of n rows, the carried
        posterior's precision and precision × mean keep the weight ``decay**n`` and the
        original prior (``prior``, or the default) gets the rest, so a row seen k rows ago
        weighs ``decay**k``: an effective memory of ``1 / (1 - decay)`` rows (1000 for
        0.999). 1 forgets nothing.
    buffer_size : int, default=100
        Rows that :meth:`partial_fit` keeps to correct assumed-density filtering, which
        loses most on small batches. A batch of fewer rows updates the posterior at once
        and joins a buffer; when the buffer reaches ``buffer_size`` rows, they are refitted
        together by the estimator's method under the posterior from before them (that call
        costs a ``fit`` of them). One-row calls keep the sites of the last
        ``buffer_size`` rows instead, and each refits four of them, those visited longest
        ago, under the posterior without them: no call refits the buffer, each costs about
        ``SGDClassifier.partial_fit``'s. Memory: at most ``buffer_size`` rows. 0 or 1: each
        batch on its own (no buffer).

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
        With many features, a :class:`~vsbayes.gaussian.StructuredCovariance`
        (diagonal plus low rank, dense only on request; see ``covariance_structure_``);
        beyond two classes, a :class:`~vsbayes.gaussian.StructuredCovariances` of one
        per one-vs-rest problem.
    covariance_structure_ : str or ndarray of str
        The posterior covariance's structure: "dense", or for a problem too large
        for it "dual", "lowrank" or "diagonal"; beyond two classes, one per one-vs-rest
        problem (an array), each chosen as a binary fit's, beside the others' posteriors.
    covariance_reason_ : str or list of str
        Why that structure (the problem's size and the memory limit).
    log_marginal_likelihood_value_ : float or ndarray of shape (n_classes,)
        Estimated log evidence ``log ∫ Π_i F(y_i f_i)^{s_i} N(w; prior) dw`` (beyond
        two classes, one per one-vs-rest problem).
        A structured posterior's (``covariance_structure_`` "lowrank" or "diagonal"
        with estimated marginals) has an estimated log-determinant: the exact Laplace
        evidence lies within its ``evidence_bounds`` (``posteriors_``), and where they are
        more than 1 nat apart a structure forced by ``vsbayes.config_context`` warns
        (UnreliableFitWarning); one the fit chose for the problem's size records them.
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
