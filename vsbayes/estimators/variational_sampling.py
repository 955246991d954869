"""Variational-sampling estimators: the posterior Gaussian fitted by VS around the Laplace one."""

from __future__ import annotations

from numbers import Real
from typing import ClassVar

from ._base import BayesianGLMClassifier, Interval
from ._sampling import ROUNDS_CONSTRAINTS, SAMPLING_CONSTRAINTS
from ._strategy import STRATEGIES, VSMethod

__all__ = ["STRATEGIES", "VSLogisticRegression", "VSProbitRegression"]


class VariationalSamplingClassifier(BayesianGLMClassifier):
    """Base of the VS estimators: their parameters; the method is ``_strategy.VSMethod``."""

    _method, _title = "vs", "variational sampling"
    _posterior_method = VSMethod
    _constraints: ClassVar[dict[str, tuple]] = {
        **BayesianGLMClassifier._constraints,
        **SAMPLING_CONSTRAINTS,
        "family": ("gaussian", "diagonal"),
        "strategy": STRATEGIES,
        **ROUNDS_CONSTRAINTS,
        "target_kl": ("auto", None, Interval(Real, 0, closed="neither")),
        "time_budget": (None, Interval(Real, 0, closed="neither")),
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
        strategy="auto",
        family="gaussian",
        rule="mc",
        rounds=2,
        kernel_scale=1.5,
        target_kl="auto",
        time_budget=None,
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
        self.strategy = strategy
        self.family = family
        self.rule = rule
        self.rounds = rounds
        self.kernel_scale = kernel_scale
        self.target_kl = target_kl
        self.time_budget = time_budget

    def _one_row_rule(self) -> str | None:
        """A one-row batch takes its exact moments (``partial_fit``), except where a global
        fit was asked for by name or the family is not the full Gaussian."""
        if self.strategy == "global" or self.family != "gaussian":
            return None
        return super()._one_row_rule()


class VSLogisticRegression(VariationalSamplingClassifier):
    """Bayesian logistic regression by variational sampling.

    The posterior of the coefficients is a Gaussian fitted by variational sampling (Roche
    2013): either one fit of the whole posterior (:func:`vsbayes.variational_sampling`,
    points drawn through the expectation-propagation posterior), exact when the posterior is
    Gaussian, with an error decreasing like 1/N otherwise; or expectation propagation whose
    site fits are variational-sampling fits of the one-dimensional tilted densities (of the
    (K − 1)-dimensional ones for the multinomial posterior), which holds for any number of
    features (``strategy``). Use it where you would use scikit-learn's
    ``LogisticRegression(C=C)``: ``predict_proba`` returns the posterior predictive
    probabilities.

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
        Expectation propagation (the sampling kernel, and the posterior of the site fits)
        stops when no site parameter moves by more than ``tol / 100`` (relative) in a sweep,
        within 200 sweeps (``max_iter`` does not bound them); the multinomial EP at
        ``√tol``, or ``tol / 100`` where a sweep is cheap (e.g. iris and wine), within
        [1e-8, 1e-3] — except as the kernel of the multinomial global fit, where it stops at
        1e-3 whatever ``tol`` (integer weights then equal duplicated rows to ~3e-5 relative on
        wine instead of round-off: far inside the fit's Monte Carlo error).
        ``tol`` does not govern the variational-sampling solver, whose
        tolerance is fixed: it stops once its
        optimization error (half the squared Newton decrement per unit mass) is below 1e-2
        times its predicted sampling error ``kl_error`` (0.1 times in the intermediate
        rounds, whose fits only serve as kernels), as with
        :func:`vsbayes.variational_sampling`'s default ``tol=1e-2``, or after ``max_iter``
        iterations.
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
        Maximum iterations of Newton's method for the mode, and of the variational-sampling
        solver in each round.
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
        n the number of parameters of a full Gaussian over the p coefficients (and
        intercept): ``(p+1)(p+2)/2``. With the same ``n_samples`` and ``random_state`` and
        one round, all sampling estimators evaluate the posterior at exactly the same
        points, so comparisons between them are paired.
        Fewer than n raises a ValueError (the fit is not determined); fewer than 2n
        warns (UnreliableFitWarning). With ``strategy="auto"``, ``"auto"`` gives the
        global fit 16n to 32n points (see ``strategy``).
    kernel : {"ep", "laplace"}, default="ep"
        The Gaussian the points are drawn through (the first round's, with ``rounds``):
        the expectation-propagation posterior (nearly exact for binary regression, Chopin
        and Ridgway 2017, so the importance weights are benign) or the Laplace
        approximation. If EP fails or does not converge, the Laplace one is used. For the
        multinomial posterior (more than two classes, logistic link), the multinomial EP
        (:func:`vsbayes.approximations.softmax_ep`).
    strategy : {"auto", "global", "sites"}, default="auto"
        ``"global"``: one variational-sampling fit of the whole posterior (n parameters, N
        points in the p-dimensional space), which corrects EP's residual bias when N is
        large enough. ``"sites"``: expectation propagation whose site fits are
        variational-sampling fits of the one-dimensional tilted densities (cost O(M p²) per
        sweep; the probit sites have a closed form that those fits reproduce to 1e-7), for
        any p. ``"auto"`` runs the global fit from the EP kernel (Laplace's if EP fails) —
        with ``n_samples="auto"`` only if it can have at least 16n points (up to 32n) within
        2·10⁸ multiply-adds of likelihood passes and 8 times EP's own work or 5·10⁷, whichever
        is more (a deterministic
        count, so the choice is the same on every machine); with an int, at that N — and
        keeps it only if it is reliable (no warning) and departs from EP by more than 4
        times its own predicted error ``kl_error``; otherwise EP's posterior is the more
        accurate one (below 16n the global fit is measured less accurate than EP on the
        paper's data sets). With many rows per parameter (M ≥ 50n: a nearly Gaussian
        posterior) where the global fit at ``n_samples`` costs less than EP's expected work,
        ``"auto"`` first runs that fit from the Laplace kernel and keeps it if reliable.
        Under a heavy-tailed ``prior`` (``StudentTPrior``, ``HorseshoePrior``), ``"auto"``
        weighs instead what EP's coefficient sites drop of their tilted densities (the sum
        of their KL divergences from Gaussians, D): up to 0.5 nats EP is kept; beyond, the
        global fit with the exact prior runs (16n to 32n points within 10⁹ multiply-adds)
        unless N·exp(−D), a bound on its effective sample size, is below d + 1 (no
        Gaussian kernel's sample sees the posterior's mass: the horseshoe), and is kept if
        reliable. Where EP fails, the global fit is the last route before the Laplace
        approximation; below 16n points it runs only with at least 2n and within 5·10¹⁰
        multiply-adds counting the solver's n² per point, else the Laplace approximation is
        kept at once (``laplace_fallback_``, an UnreliableFitWarning, the reason in
        ``strategy_reason_``). Before all of these, ``"auto"`` predicts from the
        likelihood's skewness at the mode the error of the Laplace approximation with its
        mean moved by the leading-order correction, and stops there (``strategy_``
        "laplace") where that prediction is
        within ``target_kl`` (0.01 nats for ``"auto"``; not with ``target_kl=None`` or an
        int ``n_samples``): no other fit could change the posterior beyond the target.
        ``strategy_`` and ``strategy_reason_`` record the choice. Beyond two classes (the
        multinomial posterior), ``"sites"`` is expectation propagation of the
        (K − 1)-dimensional sites, from the softmax's tilted moments, or from
        variational-sampling fits of the tilted densities where the rows are very wide (as
        on digits; :func:`vsbayes.approximations.softmax_ep`), and ``"auto"`` runs the global fit
        (from that EP's kernel) with 32n to 64n points within 5·10¹⁰ multiply-adds (an int
        ``n_samples``: that N), else takes those sites (``strategy_`` "sites"); where the
        Laplace approximation's predicted error is at most 0.6 nats (and EP's, predicted
        from it, above the target), the global fit runs from the Laplace kernel with 1.5
        times the points instead, without EP. The multinomial global fit samples only the
        (K − 1)(d + 1) contrasts (n counts their Gaussian family) and adds the shift
        directions' posterior, their prior's conditional, exactly: ``coef_.sum(axis=0)``
        and ``intercept_.sum()`` are 0 to round-off.
    family : {"gaussian", "diagonal"}, default="gaussian"
        Full or diagonal posterior covariance ("diagonal": n = 2p+1 for "auto").
    rule : {"mc", "qmc"}, default="mc"
        iid Monte Carlo or scrambled Sobol points.
    rounds : int, default=2
        Rounds of kernel adaptation: round 1 draws from ``kernel``, round
        r+1 from the fit of round r with its covariance scaled by ``kernel_scale``, and the
        final fit pools all points.
    kernel_scale : float, default=1.5
        Covariance inflation of the adapted kernels.

        The defaults of ``n_samples``, ``rounds`` and ``kernel_scale`` were chosen on
        ``benchmarks/estimator_defaults.py`` (breast cancer and a synthetic problem, both
        links; global fits from EP's posterior): two rounds cut the error of one round by
        9–61 % from 8n up, in 5–10 % more time; a third round gains no consistent accuracy
        per second; N = 32n is 1.5–3.0× more accurate per second than 8n (two rounds) but
        1.3–2.5× slower per fit.
    target_kl : float, "auto" or None, default="auto"
        Ask for an accuracy instead of a sample size: the global variational-sampling fit
        adds pooled rounds after its ``n_samples`` points until its predicted error
        ``kl_error`` (excess KL, nats), times its 90 % quantile factor, is at most
        ``target_kl``, up to 64 times ``n_samples`` points, or as many as fit in memory,
        or until an added round raises no effective sample size (see
        :func:`vsbayes.variational_sampling`; ``stop_reason_`` says why it stopped; a
        target missed warns, ConvergenceWarning, also where EP is kept instead). Only
        the global fit samples: EP's site fits are unaffected. ``"auto"``: 0.01 nats for
        the global fits ``strategy="auto"`` takes by itself — data-rich problems (see
        ``strategy_reason_``, rows in memory or in dask chunks) — and no target
        (``n_samples`` points) for the others: ``strategy="global"``, and the global fit
        "auto" compares with EP's, whose N its work limit sets. ``None``: never a target.
    time_budget : float or None, default=None
        Seconds for the whole ``fit``: the global fit adds rounds, as for ``target_kl``
        (without it, each doubling the points, up to as many as fit in memory, the last
        one filling the budget), only while one is predicted to end within what is left
        of it; each draws its points in chunks and stops where its fit is predicted to
        end nearest the budget. How many points that is depends on the clock, so such a
        fit is not reproducible by ``random_state`` alone (``posteriors_[i].n_samples``
        records the points).
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
        On the route "laplace" (``strategy_``) it carries the Laplace evidence's
        skewness correction (binary and multinomial, up to 100 parameters; on four
        multinomial problems the corrected evidence was measured within 0.0001-0.012 nats
        of importance sampling, the plain Laplace one 0.017-0.093 off; D-177).
    n_iter_ : ndarray of shape (1,) or (n_classes,)
        Variational-sampling solver iterations, summed over the rounds (global fit), or
        expectation-propagation sweeps (site fits).
    posteriors_ : list of Gaussian
        The posterior of each binary problem, or the multinomial model's one joint
        posterior, with the method's diagnostics (a global fit's :class:`vsbayes.VSResult`:
        ``kl_error``, ``ess``, ``n_samples``, ``rounds``, …; site fits'
        :class:`vsbayes.approximations.EPResult`: ``n_iter``, ``converged``, ``site_change``).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.
    kl_error_ : ndarray of shape (1,), (n_classes,) for one-vs-rest
        The predicted error (excess KL, nats) of each posterior that is a global
        variational-sampling fit, or where ``strategy="auto"`` stopped at the corrected
        Laplace approximation (its skewness prediction) or kept EP after comparing it with
        a global fit (their departure plus that fit's error); NaN for the others. A global
        fit's is its expected Monte Carlo error (the multinomial fit's, of its contrasts),
        calibrated in median, not a bound: single fits measured up to 1.6 times it on the
        multinomial benchmarks, within a factor 3 in 99 % of the binary ones.
        It is the posterior's error, not the evidence's (``log_marginal_likelihood_value_``).
        Above 0.25 nats the fit warns (UnreliableFitWarning), unless it met a ``target_kl``
        asked for.
    stop_reason_ : ndarray of object, same shape
        Why each global fit stopped sampling (``"n_samples"``, ``"target_kl"``,
        ``"max_samples"``, ``"time_budget"``, ``"stalled"``, ``"failed"``; see
        ``target_kl``);
        ``"target_kl"`` too where ``strategy="auto"`` stopped at the corrected Laplace
        approximation or EP with a predicted error within the target; None for the others.
    strategy_ : ndarray of str, shape (1,) or (n_classes,)
        The strategy of each binary problem (or of the multinomial model): "global",
        "sites", or "laplace" where ``strategy="auto"`` stopped at the skewness-corrected
        Laplace approximation (see ``strategy``), the chosen fit failed or, after EP
        failed, the global fit was not worth running (see ``laplace_fallback_``), Newton's
        method for the mode did not converge within ``max_iter``, the posterior needs a
        structured covariance (see
        ``covariance_structure_``) or, over dask chunks, the multinomial global fit is
        beyond its work limit; "prior" with ``max_iter=0``. ``strategy_reason_`` says which.
    strategy_reason_ : list of str
        Why each strategy was taken (with ``strategy="auto"``, the measured quantities).
    laplace_fallback_ : ndarray of bool, shape (1,) or (n_classes,)
        True where the method failed and the Laplace approximation is used instead.

    See Also
    --------
    EPLogisticRegression : Expectation propagation alone (the sampling kernel).

    Notes
    -----
    If the method cannot return a valid Gaussian (e.g. a non-integrable fit, or a fit that
    extrapolates beyond the points carrying the weight), the Laplace approximation is used
    for that problem, with an :class:`~vsbayes.exceptions.UnreliableFitWarning`;
    ``laplace_fallback_`` records it.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import VSLogisticRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), VSLogisticRegression(random_state=0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _link = "logistic"
    _multinomial = True


class VSProbitRegression(VariationalSamplingClassifier):
    """Bayesian probit regression by variational sampling.

    The posterior of the coefficients is a Gaussian fitted by variational sampling (Roche
    2013): either one fit of the whole posterior (:func:`vsbayes.variational_sampling`,
    points drawn through the expectation-propagation posterior), exact when the posterior is
    Gaussian, with an error decreasing like 1/N otherwise; or expectation propagation whose
    site fits are variational-sampling fits of the one-dimensional tilted densities, which
    holds for any number of features (``strategy``). Use it where you would use
    scikit-learn's ``LogisticRegression(C=C)``: ``predict_proba`` returns the posterior
    predictive probabilities. Beyond two classes, one posterior per class (one-vs-rest): the
    probit has no multinomial form.

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
        Expectation propagation (the sampling kernel, and the posterior of the site fits)
        stops when no site parameter moves by more than ``tol / 100`` (relative) in a sweep,
        within 200 sweeps (``max_iter`` does not bound them). ``tol`` does not govern the
        variational-sampling solver, whose tolerance is fixed: it stops once its
        optimization error (half the squared Newton decrement per unit mass) is below 1e-2
        times its predicted sampling error ``kl_error`` (0.1 times in the intermediate
        rounds, whose fits only serve as kernels), as with
        :func:`vsbayes.variational_sampling`'s default ``tol=1e-2``, or after ``max_iter``
        iterations.
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
        Maximum iterations of Newton's method for the mode, and of the variational-sampling
        solver in each round.
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
        n the number of parameters of a full Gaussian over the p coefficients (and
        intercept): ``(p+1)(p+2)/2``. With the same ``n_samples`` and ``random_state`` and
        one round, all sampling estimators evaluate the posterior at exactly the same
        points, so comparisons between them are paired.
        Fewer than n raises a ValueError (the fit is not determined); fewer than 2n
        warns (UnreliableFitWarning). With ``strategy="auto"``, ``"auto"`` gives the
        global fit 16n to 32n points (see ``strategy``).
    kernel : {"ep", "laplace"}, default="ep"
        The Gaussian the points are drawn through (the first round's, with ``rounds``):
        the expectation-propagation posterior (nearly exact for binary regression, Chopin
        and Ridgway 2017, so the importance weights are benign) or the Laplace
        approximation. If EP fails or does not converge, the Laplace one is used.
    strategy : {"auto", "global", "sites"}, default="auto"
        ``"global"``: one variational-sampling fit of the whole posterior (n parameters, N
        points in the p-dimensional space), which corrects EP's residual bias when N is
        large enough. ``"sites"``: expectation propagation whose site fits are
        variational-sampling fits of the one-dimensional tilted densities (cost O(M p²) per
        sweep; the probit sites have a closed form that those fits reproduce to 1e-7), for
        any p. ``"auto"`` runs the global fit from the EP kernel (Laplace's if EP fails) —
        with ``n_samples="auto"`` only if it can have at least 16n points (up to 32n) within
        2·10⁸ multiply-adds of likelihood passes and 8 times EP's own work or 5·10⁷, whichever
        is more (a deterministic
        count, so the choice is the same on every machine); with an int, at that N — and
        keeps it only if it is reliable (no warning) and departs from EP by more than 4
        times its own predicted error ``kl_error``; otherwise EP's posterior is the more
        accurate one (below 16n the global fit is measured less accurate than EP on the
        paper's data sets). With many rows per parameter (M ≥ 50n: a nearly Gaussian
        posterior) where the global fit at ``n_samples`` costs less than EP's expected work,
        ``"auto"`` first runs that fit from the Laplace kernel and keeps it if reliable.
        Under a heavy-tailed ``prior`` (``StudentTPrior``, ``HorseshoePrior``), ``"auto"``
        weighs instead what EP's coefficient sites drop of their tilted densities (the sum
        of their KL divergences from Gaussians, D): up to 0.5 nats EP is kept; beyond, the
        global fit with the exact prior runs (16n to 32n points within 10⁹ multiply-adds)
        unless N·exp(−D), a bound on its effective sample size, is below d + 1 (no
        Gaussian kernel's sample sees the posterior's mass: the horseshoe), and is kept if
        reliable. Where EP fails, the global fit is the last route before the Laplace
        approximation; below 16n points it runs only with at least 2n and within 5·10¹⁰
        multiply-adds counting the solver's n² per point, else the Laplace approximation is
        kept at once (``laplace_fallback_``, an UnreliableFitWarning, the reason in
        ``strategy_reason_``). Before all of these, ``"auto"`` predicts from the
        likelihood's skewness at the mode the error of the Laplace approximation with its
        mean moved by the leading-order correction, and stops there (``strategy_``
        "laplace") where that prediction is
        within ``target_kl`` (0.01 nats for ``"auto"``; not with ``target_kl=None`` or an
        int ``n_samples``): no other fit could change the posterior beyond the target.
        ``strategy_`` and ``strategy_reason_`` record the choice. Beyond two classes, each
        one-vs-rest problem is chosen so (the probit has no multinomial form).
    family : {"gaussian", "diagonal"}, default="gaussian"
        Full or diagonal posterior covariance ("diagonal": n = 2p+1 for "auto").
    rule : {"mc", "qmc"}, default="mc"
        iid Monte Carlo or scrambled Sobol points.
    rounds : int, default=2
        Rounds of kernel adaptation: round 1 draws from ``kernel``, round
        r+1 from the fit of round r with its covariance scaled by ``kernel_scale``, and the
        final fit pools all points.
    kernel_scale : float, default=1.5
        Covariance inflation of the adapted kernels.

        The defaults of ``n_samples``, ``rounds`` and ``kernel_scale`` were chosen on
        ``benchmarks/estimator_defaults.py`` (breast cancer and a synthetic problem, both
        links; global fits from EP's posterior): two rounds cut the error of one round by
        9–61 % from 8n up, in 5–10 % more time; a third round gains no consistent accuracy
        per second; N = 32n is 1.5–3.0× more accurate per second than 8n (two rounds) but
        1.3–2.5× slower per fit.
    target_kl : float, "auto" or None, default="auto"
        Ask for an accuracy instead of a sample size: the global variational-sampling fit
        adds pooled rounds after its ``n_samples`` points until its predicted error
        ``kl_error`` (excess KL, nats), times its 90 % quantile factor, is at most
        ``target_kl``, up to 64 times ``n_samples`` points, or as many as fit in memory,
        or until an added round raises no effective sample size (see
        :func:`vsbayes.variational_sampling`; ``stop_reason_`` says why it stopped; a
        target missed warns, ConvergenceWarning, also where EP is kept instead). Only
        the global fit samples: EP's site fits are unaffected. ``"auto"``: 0.01 nats for
        the global fits ``strategy="auto"`` takes by itself — data-rich problems (see
        ``strategy_reason_``, rows in memory or in dask chunks) — and no target
        (``n_samples`` points) for the others: ``strategy="global"``, and the global fit
        "auto" compares with EP's, whose N its work limit sets. ``None``: never a target.
    time_budget : float or None, default=None
        Seconds for the whole ``fit``: the global fit adds rounds, as for ``target_kl``
        (without it, each doubling the points, up to as many as fit in memory, the last
        one filling the budget), only while one is predicted to end within what is left
        of it; each draws its points in chunks and stops where its fit is predicted to
        end nearest the budget. How many points that is depends on the clock, so such a
        fit is not reproducible by ``random_state`` alone (``posteriors_[i].n_samples``
        records the points).
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
        On the route "laplace" (``strategy_``) it carries the Laplace evidence's
        skewness correction (binary and multinomial, up to 100 parameters; on four
        multinomial problems the corrected evidence was measured within 0.0001-0.012 nats
        of importance sampling, the plain Laplace one 0.017-0.093 off; D-177).
    n_iter_ : ndarray of shape (1,) or (n_classes,)
        Variational-sampling solver iterations, summed over the rounds (global fit), or
        expectation-propagation sweeps (site fits).
    posteriors_ : list of Gaussian
        The posterior of each binary problem, with the method's diagnostics (a global fit's
        :class:`vsbayes.VSResult`: ``kl_error``, ``ess``, ``n_samples``, ``rounds``, …; site
        fits' :class:`vsbayes.approximations.EPResult`: ``n_iter``, ``converged``,
        ``site_change``).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.
    kl_error_ : ndarray of shape (1,), (n_classes,) for one-vs-rest
        The predicted error (excess KL, nats) of each posterior that is a global
        variational-sampling fit, or where ``strategy="auto"`` stopped at the corrected
        Laplace approximation (its skewness prediction) or kept EP after comparing it with
        a global fit (their departure plus that fit's error); NaN for the others. A global
        fit's is its expected Monte Carlo error (the multinomial fit's, of its contrasts),
        calibrated in median, not a bound: single fits measured up to 1.6 times it on the
        multinomial benchmarks, within a factor 3 in 99 % of the binary ones.
        It is the posterior's error, not the evidence's (``log_marginal_likelihood_value_``).
        Above 0.25 nats the fit warns (UnreliableFitWarning), unless it met a ``target_kl``
        asked for.
    stop_reason_ : ndarray of object, same shape
        Why each global fit stopped sampling (``"n_samples"``, ``"target_kl"``,
        ``"max_samples"``, ``"time_budget"``, ``"stalled"``, ``"failed"``; see
        ``target_kl``);
        ``"target_kl"`` too where ``strategy="auto"`` stopped at the corrected Laplace
        approximation or EP with a predicted error within the target; None for the others.
    strategy_ : ndarray of str, shape (1,) or (n_classes,)
        The strategy of each binary problem: "global", "sites", or "laplace" where
        ``strategy="auto"`` stopped at the skewness-corrected Laplace approximation (see
        ``strategy``), the chosen fit failed or, after EP failed, the global fit was not
        worth running (see ``laplace_fallback_``), Newton's method for the mode did not
        converge within ``max_iter`` or the posterior needs a structured covariance (see
        ``covariance_structure_``); "prior" with
        ``max_iter=0``. ``strategy_reason_`` says which.
    strategy_reason_ : list of str
        Why each strategy was taken (with ``strategy="auto"``, the measured quantities).
    laplace_fallback_ : ndarray of bool, shape (1,) or (n_classes,)
        True where the method failed and the Laplace approximation is used instead.

    See Also
    --------
    EPProbitRegression : Expectation propagation alone (the sampling kernel).

    Notes
    -----
    If the method cannot return a valid Gaussian (e.g. a non-integrable fit, or a fit that
    extrapolates beyond the points carrying the weight), the Laplace approximation is used
    for that problem, with an :class:`~vsbayes.exceptions.UnreliableFitWarning`;
    ``laplace_fallback_`` records it.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from vsbayes import VSProbitRegression
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), VSProbitRegression(random_state=0)).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _link = "probit"
