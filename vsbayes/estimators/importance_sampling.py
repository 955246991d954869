"""Importance-sampling estimators: posterior moments and evidence by self-normalized IS."""

from __future__ import annotations

from typing import ClassVar

from ._base import BayesianGLMClassifier
from ._sampling import ROUNDS_CONSTRAINTS, SAMPLING_CONSTRAINTS, ISMethod

__all__ = ["ISLogisticRegression", "ISProbitRegression"]


class ImportanceSamplingClassifier(BayesianGLMClassifier):
    """Base of the IS estimators: their parameters; the method is ``_sampling.ISMethod``."""

    _method, _title = "is", "importance sampling"
    _posterior_method = ISMethod
    _constraints: ClassVar[dict[str, tuple]] = {
        **BayesianGLMClassifier._constraints,
        **SAMPLING_CONSTRAINTS,
        **ROUNDS_CONSTRAINTS,
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
        max_iter=100,
        verbose=0,
        warm_start=False,
        n_jobs=None,
        n_samples="auto",
        kernel="ep",
        rule="mc",
        rounds=1,
        kernel_scale=1.5,
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
        self.n_samples = n_samples
        self.kernel = kernel
        self.rule = rule
        self.rounds = rounds
        self.kernel_scale = kernel_scale


class ISLogisticRegression(ImportanceSamplingClassifier):
    """Bayesian logistic regression by importance sampling.

    The posterior mean and covariance are the self-normalized importance-sampling moments of
    points drawn through ``kernel`` (EP's posterior or Laplace's), and the evidence is the
    importance-sampling average of posterior / kernel (:func:`vsbayes.importance_sampling`).
    A baseline for :class:`VSLogisticRegression`: with one round, the same ``n_samples`` and
    ``random_state``, both evaluate the posterior at the same points.

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
        not sparse (the user guide's "Shrinkage priors"). Two classes only: the multinomial
        posterior (more than two) refuses it. The
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
        Expectation propagation (the sampling kernel, with ``kernel="ep"``) stops when no
        site parameter moves by more than ``tol / 100`` (relative) in a sweep, within 200
        sweeps (``max_iter`` does not bound them); the multinomial EP at ``√tol``, or
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
        Seed of the sampling; an int makes ``fit`` reproducible.
        None means a fixed seed, so that ``fit`` is deterministic by default, as
        LogisticRegression's.
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
    n_samples : "auto" or int, default="auto"
        Number of posterior evaluations N in total. ``"auto"`` uses ``max(8n, 256)`` with
        n the number of parameters of a Gaussian over the p coefficients (and
        intercept): ``(p+1)(p+2)/2``. With the same ``n_samples`` and ``random_state`` and
        one round, all sampling estimators evaluate the posterior at exactly the same
        points, so comparisons between them are paired. ``"auto"`` is sized before any
        work: where that N would exceed its work limit (6e10 multiply-adds, or 8 times
        EP's expected work where that is more) or the memory limit, it takes as many
        points as fit, and where fewer than n fit it raises ValueError (MemoryLimitError
        where memory binds) before drawing, naming the remedies. An integer is used as
        given (checked against memory), and must be at least n: the weighted moments of
        fewer points are over-confident even with ideal weights
        (:class:`~vsbayes.exceptions.TooFewSamplesError`, a ValueError, before drawing).
        Weights whose effective sample size is below 2n warn (``UnreliableFitWarning``:
        the moments are noisy, below n their covariance likely too narrow); below d + 1
        (a singular covariance) the fit falls back to Laplace (see Notes).
    kernel : {"ep", "laplace"}, default="ep"
        The Gaussian the points are drawn through (the first round's, with ``rounds``):
        the expectation-propagation posterior (nearly exact for binary regression, Chopin
        and Ridgway 2017, so the importance weights are benign) or the Laplace
        approximation. If EP fails or does not converge, the Laplace one is used. For the
        multinomial posterior (more than two classes, logistic link), the multinomial EP
        (:func:`vsbayes.approximations.softmax_ep`).
    rule : {"mc", "qmc"}, default="mc"
        iid Monte Carlo or scrambled Sobol points.
    rounds : int, default=1
        Rounds of kernel adaptation: round 1 draws from ``kernel``, round
        r+1 from the fit of round r with its covariance scaled by ``kernel_scale``, and the
        final fit pools all points.
    kernel_scale : float, default=1.5
        Covariance inflation of the adapted kernels.
    prior : estimator, Gaussian, tuple, dict, shrinkage prior or None, default=None
        A shrinkage prior on each coefficient — :class:`~vsbayes.LaplacePrior`,
        :class:`~vsbayes.StudentTPrior` or :class:`~vsbayes.HorseshoePrior` (two classes
        only; the intercept keeps N(0, 10⁶); checked at fit) — or a Gaussian prior
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
        Newton iterations of the Laplace kernel.
    posteriors_ : list of Gaussian
        The posterior of each binary problem, or the multinomial model's one joint
        posterior, with the method's diagnostics (``ess``, ``n_samples``, ``rounds`` of
        :class:`vsbayes.ISResult`).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.
    laplace_fallback_ : ndarray of bool, shape (1,) or (n_classes,)
        True where the method failed and the Laplace approximation is used instead.

    See Also
    --------
    VSLogisticRegression : The same draws, fitted by variational sampling.

    Notes
    -----
    If the method cannot return a valid Gaussian (a weighted covariance singular or not
    numerically positive definite: an effective sample size below d + 1), the Laplace
    approximation is used for that problem, with an
    :class:`~vsbayes.exceptions.UnreliableFitWarning`; ``laplace_fallback_`` records it.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import ISLogisticRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), ISLogisticRegression(random_state=0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _link = "logistic"
    _multinomial = True


class ISProbitRegression(ImportanceSamplingClassifier):
    """Bayesian probit regression by importance sampling.

    The posterior mean and covariance are the self-normalized importance-sampling moments of
    points drawn through ``kernel`` (EP's posterior or Laplace's), and the evidence is the
    importance-sampling average of posterior / kernel (:func:`vsbayes.importance_sampling`).
    A baseline for :class:`VSLogisticRegression`: with one round, the same ``n_samples`` and
    ``random_state``, both evaluate the posterior at the same points.

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
        Expectation propagation (the sampling kernel, with ``kernel="ep"``) stops when no
        site parameter moves by more than ``tol / 100`` (relative) in a sweep, within 200
        sweeps (``max_iter`` does not bound them).
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
        Seed of the sampling; an int makes ``fit`` reproducible.
        None means a fixed seed, so that ``fit`` is deterministic by default, as
        LogisticRegression's.
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
    n_samples : "auto" or int, default="auto"
        Number of posterior evaluations N in total. ``"auto"`` uses ``max(8n, 256)`` with
        n the number of parameters of a Gaussian over the p coefficients (and
        intercept): ``(p+1)(p+2)/2``. With the same ``n_samples`` and ``random_state`` and
        one round, all sampling estimators evaluate the posterior at exactly the same
        points, so comparisons between them are paired. ``"auto"`` is sized before any
        work: where that N would exceed its work limit (6e10 multiply-adds, or 8 times
        EP's expected work where that is more) or the memory limit, it takes as many
        points as fit, and where fewer than n fit it raises ValueError (MemoryLimitError
        where memory binds) before drawing, naming the remedies. An integer is used as
        given (checked against memory), and must be at least n: the weighted moments of
        fewer points are over-confident even with ideal weights
        (:class:`~vsbayes.exceptions.TooFewSamplesError`, a ValueError, before drawing).
        Weights whose effective sample size is below 2n warn (``UnreliableFitWarning``:
        the moments are noisy, below n their covariance likely too narrow); below d + 1
        (a singular covariance) the fit falls back to Laplace (see Notes).
    kernel : {"ep", "laplace"}, default="ep"
        The Gaussian the points are drawn through (the first round's, with ``rounds``):
        the expectation-propagation posterior (nearly exact for binary regression, Chopin
        and Ridgway 2017, so the importance weights are benign) or the Laplace
        approximation. If EP fails or does not converge, the Laplace one is used.
    rule : {"mc", "qmc"}, default="mc"
        iid Monte Carlo or scrambled Sobol points.
    rounds : int, default=1
        Rounds of kernel adaptation: round 1 draws from ``kernel``, round
        r+1 from the fit of round r with its covariance scaled by ``kernel_scale``, and the
        final fit pools all points.
    kernel_scale : float, default=1.5
        Covariance inflation of the adapted kernels.
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
        Newton iterations of the Laplace kernel.
    posteriors_ : list of Gaussian
        The posterior of each binary problem, with the method's diagnostics (``ess``,
        ``n_samples``, ``rounds`` of :class:`vsbayes.ISResult`).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.
    laplace_fallback_ : ndarray of bool, shape (1,) or (n_classes,)
        True where the method failed and the Laplace approximation is used instead.

    See Also
    --------
    VSProbitRegression : The same draws, fitted by variational sampling.

    Notes
    -----
    If the method cannot return a valid Gaussian (a weighted covariance singular or not
    numerically positive definite: an effective sample size below d + 1), the Laplace
    approximation is used for that problem, with an
    :class:`~vsbayes.exceptions.UnreliableFitWarning`; ``laplace_fallback_`` records it.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import ISProbitRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), ISProbitRegression(random_state=0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _link = "probit"
