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
    :class:`VSLogisticRegression`. The bound's curvature at a row far in the logistic's
    tail is about ``1/(2|t|)`` against the likelihood's ``e^{-|t|}``, so the
    underestimate grows with such rows: measured against EP's posterior sds, median ratios
    0.99 on make_classification (500 × 5), 0.75 on breast cancer (smallest 0.37), and
    0.32, 0.11 and 0.09 with 1 %, 0.1 % and 0.01 % positives in 10,000 rows; the
    intervals and predictive probabilities are then too confident by as much.

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
        not sparse (the user guide's "Shrinkage priors"). The Jaakkola–Jordan bound needs a
        Gaussian prior: this estimator refuses ``"l1"`` and ``"elasticnet"`` (a ValueError
        naming ``EPLogisticRegression``). The
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
        The bound's updates stop when the bound rises by at most ``tol · max(1, |bound|)``
        nats in one update.
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
    max_iter : int, default=1000
        Maximum iterations of Newton's method for the mode, and of the bound's updates.
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
    prior : estimator, Gaussian, tuple, dict or None, default=None
        A Gaussian prior N(μ₀, Σ₀) on the parameter vector (the shrinkage priors
        :class:`~vsbayes.LaplacePrior`, :class:`~vsbayes.StudentTPrior` and
        :class:`~vsbayes.HorseshoePrior` raise a ValueError: the bound needs a Gaussian
        prior), in ``sigma_``'s layout, in place of N(0, C·I) on
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
        Rows that :meth:`partial_fit` keeps with their sites (each row's bound, a Gaussian
        factor in the posterior) to correct assumed-density filtering, whose sites keep the
        ξ where the earlier posteriors put their rows. A batch of several rows is fitted
        jointly with the kept rows under the posterior without their sites (that call
        costs a ``fit`` of them and the batch), each row's site then the bound at its ξ of
        the joint fit; a one-row call refits four kept rows' sites, those visited longest
        ago (each call costs about ``SGDClassifier.partial_fit``'s). The rows kept are
        those whose bound is furthest from their likelihood over the posterior; the others
        leave, their sites staying in the posterior. More rows kept bring a long stream
        nearer batch VB (see Notes). Memory: at most ``buffer_size`` rows. 0 or 1: each
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

    The bound's variance is too small, most along directions where the prior is vague and
    the data few: after one row under the default prior, VB's variance of the row's latent
    value is 0.4 % of the exact posterior's (the intercept's prior N(0, 10⁶)); after 100
    rows at 5 and 20 features the marginal standard deviations were 0.72-0.76 of the exact
    ones. :meth:`partial_fit` of one row takes the bound at its optimum for the row and
    revisits the last ``buffer_size`` rows' bounds; a batch of several rows is fitted
    jointly with the ``buffer_size`` rows kept (the stream is batch VB while every row is
    kept), and the rows whose bound fits their likelihood best leave with their ξ frozen.
    The bound's curvature depends on where the posterior puts every row, so a stream of
    more rows than the window stays farther from batch VB than the other methods' streams
    from their batch fits: breast cancer's first ten features in weighted batches of 100,
    coefficients 0.23 from the batch fit's (Laplace, EP, VS 0.02-0.07; 0.03 with
    ``buffer_size=400`` of 569 rows); held-out log loss 5-7 % above batch VB's on breast
    cancer, within 0.5 % on five other problems (the user guide's "Streaming"). For
    streams, prefer :class:`EPLogisticRegression` or :class:`VSLogisticRegression`.

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
        max_iter=1000,
        verbose=0,
        warm_start=False,
        n_jobs=None,
        prior=None,
        decay=1.0,
        buffer_size=100,
    ):
        # The bound's fixed-point updates converge linearly: a larger default max_iter
        # (breast cancer needs about 180 updates).
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
