"""Laplace-approximation estimators: the Gaussian at the posterior mode."""

from __future__ import annotations

from ._base import BayesianGLMClassifier
from ._methods import LaplaceMethod

__all__ = ["LaplaceLogisticRegression", "LaplaceProbitRegression"]


class LaplaceLogisticRegression(BayesianGLMClassifier):
    """Bayesian logistic regression by the Laplace approximation.

    The posterior of the coefficients is approximated by the Gaussian at its mode (found by
    Newton's method with the exact Hessian) with the inverse negative Hessian as covariance;
    the log evidence is the Laplace estimate. Its mode is the solution of scikit-learn's
    ``LogisticRegression(C=C)`` (up to the intercept's vague prior), so for two classes its
    point predictions are ``LogisticRegression``'s; its probabilities are the posterior
    predictive ones, which account for the uncertainty of the coefficients.

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
    max_iter : int, default=100
        Maximum iterations of Newton's method for the mode.
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
    prior : estimator, Gaussian, tuple, dict, shrinkage prior or None, default=None
        A shrinkage prior on each coefficient — :class:`~vsbayes.LaplacePrior`,
        :class:`~vsbayes.StudentTPrior` or :class:`~vsbayes.HorseshoePrior` (the horseshoe
        has no mode: refused; beyond two classes the multinomial posterior takes the
        other two; the intercept keeps N(0, 10⁶); checked at fit) — or a Gaussian prior
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
        Rows that :meth:`partial_fit` keeps with their sites (each row's Gaussian factor in
        the posterior) to correct assumed-density filtering, whose sites are expanded where
        the earlier modes were. Two classes or one-vs-rest: a batch of several rows is
        fitted jointly with the kept rows under the posterior without their sites (that
        call costs a ``fit`` of them and the batch), each row's site then its expansion at
        the joint mode; a one-row call refits four kept rows' sites, those visited longest
        ago (each call costs about ``SGDClassifier.partial_fit``'s). The rows kept are those
        whose sites are furthest from their likelihood over the posterior; the others leave,
        their sites staying in the posterior. Multinomial: a batch of fewer rows joins a
        buffer, refitted with it under the posterior from before them when it reaches
        ``buffer_size`` rows; one-row calls keep the last ``buffer_size`` rows' sites and
        refit four of them. Memory: at most ``buffer_size`` rows. 0 or 1: each batch on its
        own (no buffer).

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
        Newton iterations (gradient and Hessian evaluations).
    posteriors_ : list of Gaussian
        The posterior of each binary problem, or the multinomial model's one joint
        posterior, with the method's diagnostics (``n_iter``, ``converged``, ``grad_norm``,
        ``log_density_at_mode``).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.

    See Also
    --------
    VSLogisticRegression : The same model, posterior by variational sampling.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import LaplaceLogisticRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), LaplaceLogisticRegression(C=1.0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _method, _title = "laplace", "Laplace approximation"
    _link = "logistic"
    _multinomial = True
    _posterior_method = LaplaceMethod


class LaplaceProbitRegression(BayesianGLMClassifier):
    """Bayesian probit regression by the Laplace approximation.

    The posterior of the coefficients is approximated by the Gaussian at its mode (found by
    Newton's method with the exact Hessian) with the inverse negative Hessian as covariance;
    the log evidence is the Laplace estimate. Its mode is the penalized maximum-likelihood
    fit of the probit model, as ``LogisticRegression(C=C)``'s is of the logistic one; its
    probabilities are the posterior predictive ones, which account for the uncertainty of
    the coefficients.

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
    max_iter : int, default=100
        Maximum iterations of Newton's method for the mode.
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
    prior : estimator, Gaussian, tuple, dict, shrinkage prior or None, default=None
        A shrinkage prior on each coefficient — :class:`~vsbayes.LaplacePrior`,
        :class:`~vsbayes.StudentTPrior` or :class:`~vsbayes.HorseshoePrior` (the horseshoe
        has no mode: refused; the intercept keeps N(0, 10⁶); checked at fit) — or a Gaussian prior
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
        Rows that :meth:`partial_fit` keeps with their sites (each row's Gaussian factor in
        the posterior) to correct assumed-density filtering, whose sites are expanded where
        the earlier modes were. Two classes or one-vs-rest: a batch of several rows is
        fitted jointly with the kept rows under the posterior without their sites (that
        call costs a ``fit`` of them and the batch), each row's site then its expansion at
        the joint mode; a one-row call refits four kept rows' sites, those visited longest
        ago (each call costs about ``SGDClassifier.partial_fit``'s). The rows kept are those
        whose sites are furthest from their likelihood over the posterior; the others leave,
        their sites staying in the posterior. Multinomial: a batch of fewer rows joins a
        buffer, refitted with it under the posterior from before them when it reaches
        ``buffer_size`` rows; one-row calls keep the last ``buffer_size`` rows' sites and
        refit four of them. Memory: at most ``buffer_size`` rows. 0 or 1: each batch on its
        own (no buffer).

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
        Newton iterations (gradient and Hessian evaluations).
    posteriors_ : list of Gaussian
        The posterior of each binary problem, with the method's diagnostics (``n_iter``,
        ``converged``, ``grad_norm``, ``log_density_at_mode``).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.

    See Also
    --------
    VSProbitRegression : The same model, posterior by variational sampling.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import LaplaceProbitRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), LaplaceProbitRegression(C=1.0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _method, _title = "laplace", "Laplace approximation"
    _link = "probit"
    _posterior_method = LaplaceMethod
