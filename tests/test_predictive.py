"""Posterior-predictive probabilities of the logistic and probit models, against quadrature,
and the estimators' prediction path (latent moments in chunks, then the predictive)."""

import math
import warnings
from functools import partial

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import expit, log_expit, log_ndtr, ndtr
from threadpoolctl import threadpool_limits

import vsbayes
from vsbayes._blas import blas_thread_count
from vsbayes.models import latent as latent_module
from vsbayes.models import predictive
from vsbayes.models.predictive import logistic_predictive_log_proba
from vsbayes.models.probit_predictive import probit_predictive_log_proba

# |mean| up to 60 and sd from 1e-3 to 1e4 (var from 1e-6 to 1e8), as the fast rule's targets.
MEANS = [-60.0, -50.0, -40.0, -10.0, -3.0, -0.5, 0.0, 0.7, 2.0, 8.0, 30.0, 60.0]
SDS = [0.0, 1e-4, 1e-3, 0.1, 0.5, 0.99, 1.01, 2.0, 5.0, 7.0, 30.0, 1e3, 1e4]
METHODS = ["auto", "quadrature"]
QUADRATURE = partial(logistic_predictive_log_proba, method="quadrature")
# The fast rule's design bound: relative error of min(p, 1 - p) below 1e-7, hence below
# 1.5e-7 on log p and 2e-7 on log(1 - p) (relative), 5e-8 on p; D-022 asks 1e-6 and 1e-7.
FAST_LOG_RTOL = 2e-7
FAST_P_ATOL = 5e-8
LOG_PHI_0 = -0.5 * math.log(2.0 * math.pi)


def quad_log_lower(m, s):
    """log ∫ σ(m + s z) φ(z) dz for m ≤ 0 by adaptive quadrature, to ~1e-14 relative.

    The integrand is log-concave with curvature ≥ 1, so dividing it by its peak value and
    integrating over mode ± 12 loses < e^-70; breakpoints resolve the logistic step at
    z = -m/s, whose width is 1/s.
    """
    if s == 0:
        return log_expit(m)
    mode = brentq(lambda z: s * expit(-(m + s * z)) - z, 0.0, s, xtol=1e-300)

    def log_f(z):
        return log_expit(m + s * z) - 0.5 * z * z

    peak = log_f(mode)
    lo, hi = mode - 12.0, mode + 12.0
    near_step = -m / s + np.array([-64, -16, -4, -1, 0, 1, 4, 16, 64]) / s
    points = [mode, *near_step[(near_step > lo) & (near_step < hi)]]
    value, _ = quad(
        lambda z: math.exp(log_f(z) - peak), lo, hi, points=points, epsabs=1e-13, limit=200
    )
    return math.log(value) + peak + LOG_PHI_0


def quad_reference(m, s):
    """(log p, log(1 - p)): the side m ≤ 0 by quadrature, the other by 1 - p (exact)."""
    log_lower = quad_log_lower(-abs(m), s)
    log_upper = math.log1p(-math.exp(log_lower))
    return (log_upper, log_lower) if m > 0 else (log_lower, log_upper)


@pytest.fixture(scope="module")
def grid():
    m, s = (a.ravel() for a in np.meshgrid(MEANS, SDS, indexing="ij"))
    reference = np.array([quad_reference(a, b) for a, b in zip(m, s, strict=True)])
    return m, s, reference[:, 0], reference[:, 1]


def test_logistic_against_quadrature(grid):
    m, s, ref_log_p, ref_log_1mp = grid
    log_p, log_1mp = QUADRATURE(m, s**2)
    # The hard requirement: absolute error of p.
    np.testing.assert_allclose(np.exp(log_p), np.exp(ref_log_p), rtol=0, atol=1e-6)
    # The rules' errors are below 1e-13 relative to p (geometric convergence; windows holding
    # all but ~e^-32 of the integrand), and quad's reference is good to ~1e-14. Relative to
    # |log p| ≥ log 2 on the side p ≤ 1/2 they stay there; on the side near 1,
    # log p ≈ -(1 - p) inherits the relative accuracy of 1 - p, the other side.
    for got, want in ((log_p, ref_log_p), (log_1mp, ref_log_1mp)):
        shown = np.exp(want) > 1e-300
        np.testing.assert_allclose(got[shown], want[shown], rtol=1e-12, atol=0)


def test_fast_logistic_against_quadrature(grid):
    # D-022's requirement, against scipy's quad: 1e-7 absolute on p, 1e-6 relative on
    # log p and log(1 - p); the design bound is tighter.
    m, s, ref_log_p, ref_log_1mp = grid
    log_p, log_1mp = logistic_predictive_log_proba(m, s**2)
    np.testing.assert_allclose(np.exp(log_p), np.exp(ref_log_p), rtol=0, atol=FAST_P_ATOL)
    for got, want in ((log_p, ref_log_p), (log_1mp, ref_log_1mp)):
        shown = np.exp(want) > 1e-300
        np.testing.assert_allclose(got[shown], want[shown], rtol=FAST_LOG_RTOL, atol=0)


def test_fast_logistic_against_the_accurate_rule_on_a_fine_grid():
    # Every rule of the fast path (1 … 12 Gauss–Hermite nodes, the mixture, its quadrature
    # fallback) and the switches between them; the accurate rule is good to 1e-13 here.
    half = np.geomspace(1e-3, 60.0, 48)
    m = np.concatenate([-half[::-1], [0.0], half])[:, None]
    var = np.concatenate([np.geomspace(1e-6, 1e8, 57), predictive._GH_MAX_VAR])[None, :]
    log_p, log_1mp = logistic_predictive_log_proba(m, var)
    ref_log_p, ref_log_1mp = QUADRATURE(m, var)
    np.testing.assert_allclose(log_p, ref_log_p, rtol=FAST_LOG_RTOL, atol=0)
    np.testing.assert_allclose(log_1mp, ref_log_1mp, rtol=FAST_LOG_RTOL, atol=0)
    np.testing.assert_allclose(np.exp(log_p), np.exp(ref_log_p), rtol=0, atol=FAST_P_ATOL)


@pytest.mark.parametrize("method", METHODS)
def test_logistic_symmetry(grid, method):
    m, s, _, _ = grid
    log_p, log_1mp = logistic_predictive_log_proba(m, s**2, method=method)
    mirror_p, mirror_1mp = logistic_predictive_log_proba(-m, s**2, method=method)
    np.testing.assert_array_equal(log_1mp, mirror_p)
    np.testing.assert_array_equal(log_p, mirror_1mp)
    np.testing.assert_allclose(np.exp(log_p) + np.exp(mirror_p), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_logistic_zero_variance_is_the_sigmoid(method):
    m = np.array([-800.0, -40.0, -3.0, -1e-8, 0.0, 0.5, 20.0, 40.0, 800.0])
    log_p, log_1mp = logistic_predictive_log_proba(m, 0.0, method=method)
    np.testing.assert_allclose(log_p, log_expit(m), rtol=1e-15, atol=0)
    np.testing.assert_allclose(log_1mp, log_expit(-m), rtol=1e-15, atol=0)
    # A tiny variance goes through the rules, whose weights must sum to 1.
    log_p, log_1mp = logistic_predictive_log_proba(m, 1e-300, method=method)
    np.testing.assert_allclose(log_p, log_expit(m), rtol=1e-14, atol=0)
    np.testing.assert_allclose(log_1mp, log_expit(-m), rtol=1e-14, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_logistic_large_variance_is_the_probit_limit(method):
    # p = E[Φ((m - L)/s)] = Φ(m/s) + O(s^-3) for L standard logistic.
    m, s = np.array([-40.0, -3.0, 0.0, 3.0, 40.0]), 1e15
    log_p, log_1mp = logistic_predictive_log_proba(m, s**2, method=method)
    np.testing.assert_allclose(log_p, log_ndtr(m / s), rtol=1e-14, atol=0)
    np.testing.assert_allclose(log_1mp, log_ndtr(-m / s), rtol=1e-14, atol=0)
    log_p, log_1mp = logistic_predictive_log_proba(m, np.inf, method=method)
    np.testing.assert_array_equal(log_p, -math.log(2.0))
    np.testing.assert_array_equal(log_1mp, -math.log(2.0))


@pytest.mark.parametrize("method", METHODS)
def test_logistic_far_tail_is_the_lognormal_mean(method):
    # σ(f) = e^f (1 - e^f + ...), so p = e^(m + s²/2) (1 - e^(m + 3s²/2) + ...): the
    # correction is below e^-400 here. The quadrature holds for s > 1 by the Gaussian-side
    # rule; the fast rule's shifted form p = e^(m + v/2) P(-(m + v), v) is exact there.
    m = np.array([-1e3, -1e3, -1e3, -1e3, -1e6, -1e6, -1e6])[:, None]
    s = np.array([0.5, 2.0, 10.0, 20.0, 10.0, 100.0, 500.0])[:, None]
    log_p, _ = logistic_predictive_log_proba(m, s**2, method=method)
    np.testing.assert_allclose(log_p, m + s**2 / 2, rtol=1e-14)


def test_logistic_is_continuous_across_the_rules():
    # The rule changes after s = 1 and before -m/s - s = 8 (for s > 1); both sides agree.
    s = np.array([1.0, 1.0 + 1e-12, 2.0, 2.0, 4.0, 4.0])
    m = np.array([-3.0, -3.0, -20.0, -20.0 + 1e-12, -48.0, -48.0 + 1e-12])
    log_p, _ = QUADRATURE(m, s**2)
    np.testing.assert_allclose(log_p[1::2], log_p[::2], rtol=1e-12)


@pytest.mark.parametrize(("method", "rtol"), [("quadrature", 1e-15), ("auto", 2 * FAST_LOG_RTOL)])
def test_logistic_is_increasing_in_the_mean(method, rtol):
    # The fast rule is increasing within each rule and may step back by its error bound
    # where the rule changes.
    m = np.linspace(-60.0, 60.0, 2001)[:, None]
    var = np.array([0.0, 0.01, 0.25, 1.0, 4.0, 49.0, 1e4])
    log_p, _ = logistic_predictive_log_proba(m, var, method=method)
    assert np.all(np.diff(log_p, axis=0) >= -rtol * np.abs(log_p[1:]))


def test_logistic_blocks_do_not_change_values():
    rng = np.random.default_rng(0)
    m = rng.normal(0.0, 10.0, 3000)
    var = np.exp(rng.uniform(-10.0, 10.0, m.size))
    whole = QUADRATURE(m, var)
    # A working memory of 0.25 MiB: blocks of ~6 (Gaussian side) and ~1 (logistic side)
    # points instead of ~10^5 and ~2·10^4.
    with sklearn.config_context(working_memory=0.25):
        blocks = QUADRATURE(m, var)
    np.testing.assert_array_equal(blocks, whole)


def test_shapes_broadcast():
    log_p, log_1mp = logistic_predictive_log_proba(np.zeros((3, 1)), [0.0, 1.0, 2.0, 50.0])
    assert log_p.shape == log_1mp.shape == (3, 4)
    log_p, log_1mp = probit_predictive_log_proba(np.zeros((3, 1)), [0.0, 1.0, 2.0, 50.0])
    assert log_p.shape == log_1mp.shape == (3, 4)
    for function in (logistic_predictive_log_proba, probit_predictive_log_proba):
        log_p, log_1mp = function(0.3, 2.0)
        assert isinstance(log_p, np.ndarray) and log_p.shape == log_1mp.shape == ()


def test_absurd_inputs_stay_finite_and_silent():
    m = np.array([1e3, 1e6, 1e150, 1e300, 1.7e308])
    m = np.concatenate([m, -m])[:, None]
    var = np.array([0.0, 1e-300, 1.0, 1e6, 1e12, 1e300, 1.7e308])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for function in (logistic_predictive_log_proba, QUADRATURE, probit_predictive_log_proba):
            log_p, log_1mp = function(m, var)
            for value in (log_p, log_1mp):
                assert np.all(np.isfinite(value) | (value == -np.inf))
                assert np.all(value <= 0)
            np.testing.assert_allclose(np.exp(log_p) + np.exp(log_1mp), 1.0, atol=1e-12)
        # The logistic ones are all finite, as every true value here is representable.
        for function in (logistic_predictive_log_proba, QUADRATURE):
            log_p, _ = function(m, var)
            assert np.all(np.isfinite(log_p))


@pytest.mark.parametrize("method", METHODS)
def test_infinite_and_nan_inputs(method):
    m = np.array([-np.inf, np.inf, 1.0, np.nan, 1.0, np.inf])
    var = np.array([1.0, 1.0, np.inf, 1.0, np.nan, np.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_p, log_1mp = logistic_predictive_log_proba(m, var, method=method)
    np.testing.assert_array_equal(log_p, [-np.inf, 0.0, -math.log(2.0), np.nan, np.nan, np.nan])
    np.testing.assert_array_equal(log_1mp, [0.0, -np.inf, -math.log(2.0), np.nan, np.nan, np.nan])


@pytest.mark.parametrize(
    "function", [logistic_predictive_log_proba, QUADRATURE, probit_predictive_log_proba]
)
def test_negative_variance_is_rejected(function):
    with pytest.raises(ValueError, match="nonnegative"):
        function([0.0, 1.0], [1.0, -1e-3])
    with pytest.raises(ValueError, match="nonnegative"):
        function([0.0, 1.0], [np.nan, -1e-3])


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="'auto' or 'quadrature'"):
        logistic_predictive_log_proba(0.0, 1.0, method="mixture")


def test_probit_is_the_closed_form():
    m = np.array([*MEANS, -1e3, 1e3])[:, None]  # ±1e3: beyond ndtr's range
    var = np.array(SDS) ** 2
    log_p, log_1mp = probit_predictive_log_proba(m, var)
    # log(ndtr) on the side below 1/2 and log1p(-exp) on the other: to round-off.
    np.testing.assert_allclose(log_p, log_ndtr(m / np.sqrt(1.0 + var)), rtol=1e-14, atol=0)
    np.testing.assert_allclose(log_1mp, log_ndtr(-m / np.sqrt(1.0 + var)), rtol=1e-14, atol=0)


@pytest.mark.parametrize("m", [-30.0, -3.0, 0.0, 2.0])
@pytest.mark.parametrize("s", [0.5, 3.0, 100.0])
def test_probit_against_quadrature(m, s):
    def log_f(z):
        return log_ndtr(m + s * z) - 0.5 * z * z

    def slope(z):  # of log_f: s φ(u)/Φ(u) - z, decreasing, positive at -1 and negative at top
        u = m + s * z
        return s * math.exp(LOG_PHI_0 - 0.5 * u * u - log_ndtr(u)) - z

    # Log-concave integrand again: divide by its peak, integrate over mode ± 12.
    mode = brentq(slope, -1.0, s * (abs(m) + 2.0) + 1.0, xtol=1e-300)
    peak = log_f(mode)
    value, _ = quad(lambda z: math.exp(log_f(z) - peak), mode - 12, mode + 12, epsabs=1e-13)
    log_p, log_1mp = probit_predictive_log_proba(m, s**2)
    np.testing.assert_allclose(log_p, math.log(value) + peak + LOG_PHI_0, rtol=1e-10)
    np.testing.assert_allclose(np.exp(log_p) + np.exp(log_1mp), 1.0, atol=1e-15)


# --- The fast rule's pieces ------------------------------------------------------------


def test_sigmoid_derivative_bounds():
    # Each bound is at least the derivative's largest value on a fine grid of t, and exceeds
    # it by at most the bound's own grid slack: σ'' = σ(1-σ)(1-2σ), whose sup is 1/(6√3) at
    # σ = (3 - √3)/6, and σ⁽⁴⁾ = σ(1-σ)(1 - 14σ + 36σ² - 24σ³), largest in the middle.
    x = np.linspace(-10.0, 10.0, 200_001)
    s = expit(x)
    second = s * (1 - s) * (1 - 2 * s)
    fourth = s * (1 - s) * (1 - 14 * s + 36 * s**2 - 24 * s**3)
    for order, values in ((2, second), (4, fourth)):
        sup = predictive._sigmoid_derivative_sup(order)
        assert np.abs(values).max() <= sup <= 1.01 * np.abs(values).max()
    assert np.abs(second).max() == pytest.approx(1 / (6 * math.sqrt(3)), rel=1e-6)


@pytest.mark.parametrize("n", range(1, predictive._GH_MAX_NODES + 1))
def test_gauss_hermite_rules_meet_their_bound(n):
    # At the largest variance given to the n-point rule, its error on P(μ, v) over μ stays
    # below the proven bound _GH_ERROR (the accurate rule, good to ~1e-14 absolute on P
    # here, is the reference).
    v = predictive._GH_MAX_VAR[n - 1]
    mu = np.linspace(-12.0, 12.0, 241)
    got = predictive._gauss_hermite(mu, np.full_like(mu, v), n)
    ref = np.exp(QUADRATURE(mu, v)[0])
    assert np.abs(got - ref).max() <= predictive._GH_ERROR


def test_probit_mixture_is_within_its_error():
    # sup_f |σ(f) - Σ a_k Φ(s_k f)| ≤ _MIXTURE_ERROR, f ≥ 0 (the error is odd). Between grid
    # points of step h, |e| exceeds its grid maximum by at most h²/8 · sup|e''| (at an
    # extremum e' = 0), and sup|e''| ≤ its grid maximum + h/2 · sup|e'''| with
    # |e'''| ≤ Σ a_k s_k³ ‖φ''‖∞ + ‖σ'''‖∞ = Σ a_k s_k³ φ(0) + 1/8. Beyond f = 45 both terms
    # are below 1e-18.
    s, a = predictive._MIXTURE_SCALES, predictive._MIXTURE_WEIGHTS
    assert np.all(a > 0) and abs(a.sum() - 1.0) < 1e-15
    h = 1e-3
    f = np.arange(0.0, 45.0 + h, h)
    x = np.outer(f, s)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    e = ndtr(x) @ a - expit(f)
    sig = expit(f)
    e2 = (-x * phi) @ (a * s**2) - sig * (1 - sig) * (1 - 2 * sig)
    e3_bound = a @ s**3 / math.sqrt(2 * math.pi) + 0.125
    bound = np.abs(e).max() + h**2 / 8 * (np.abs(e2).max() + h / 2 * e3_bound)
    assert bound <= predictive._MIXTURE_ERROR
    assert expit(-45.0) + ndtr(-45.0 * s.min()) < 1e-18


def test_fast_rule_takes_the_quadrature_where_neither_side_is_large_enough():
    # v = 100, m = -50: P(m, v) ≈ Φ(-50/10.2) ≈ 5e-7 and P(-(m + v), v) ≈ Φ(-4.9) are both
    # below the mixture's floor: the accurate rule, unchanged.
    m = np.array([-50.0, -40.0, 50.0])
    log_p, log_1mp = logistic_predictive_log_proba(m, 100.0)
    ref_p, ref_1mp = QUADRATURE(m, 100.0)
    np.testing.assert_array_equal(log_p, ref_p)
    np.testing.assert_array_equal(log_1mp, ref_1mp)


def test_fast_rule_does_not_depend_on_its_batch():
    # Each row takes its own rule whatever rows come with it (the batch's most common rule
    # runs on all rows, the others are redone): alone or in a batch, the same value.
    rng = np.random.default_rng(0)
    m = rng.normal(0.0, 5.0, 400)
    var = np.exp(rng.uniform(np.log(1e-6), np.log(1e4), m.size))
    var[:300] = rng.uniform(0.0, 0.02, 300)  # mostly the 3-node rule, some need more
    batch, _ = logistic_predictive_log_proba(m, var)
    alone = np.array([logistic_predictive_log_proba(a, b)[0] for a, b in zip(m, var, strict=True)])
    np.testing.assert_allclose(batch, alone, rtol=1e-14, atol=0)
    np.testing.assert_allclose(batch, QUADRATURE(m, var)[0], rtol=FAST_LOG_RTOL, atol=0)


# --- The estimators' prediction path ---------------------------------------------------


def posterior_estimator(cls, coef, intercept, sigma, fit_intercept=True):
    """An estimator with a given posterior (prediction depends on nothing else)."""
    est = cls(fit_intercept=fit_intercept)
    n_problems, d = coef.shape
    est.classes_ = np.arange(max(2, n_problems))
    est.coef_, est.intercept_, est.sigma_ = coef, intercept, sigma
    est.n_features_in_ = d
    return est


def random_posterior(rng, n_problems, d, fit_intercept=True, scale=0.3):
    p = d + fit_intercept
    root = rng.normal(0.0, scale / math.sqrt(p), (n_problems, p, p))
    sigma = root @ root.transpose(0, 2, 1) + 1e-4 * np.eye(p)
    coef = rng.normal(0.0, 1.0, (n_problems, d))
    intercept = rng.normal(0.0, 1.0, n_problems) if fit_intercept else np.zeros(n_problems)
    return coef, intercept, sigma[0] if n_problems == 1 else sigma


def direct_moments(X, coef, intercept, sigma, fit_intercept):
    X = X.toarray() if sp.issparse(X) else X
    design = np.column_stack([X, np.ones(len(X))]) if fit_intercept else X
    covs = sigma[None] if sigma.ndim == 2 else sigma
    mean = X @ coef.T + intercept
    var = np.stack([np.einsum("ij,jk,ik->i", design, c, design) for c in covs], axis=1)
    return mean, var


@pytest.mark.parametrize("n_problems", [1, 3])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("kind", ["dense", "sparse_product", "sparse_pairs"])
def test_latent_moments_in_chunks(n_problems, fit_intercept, kind, monkeypatch):
    # ‖Lᵀx̃‖² by chunks of rows (dense or sparse products), or the sparse rows' non-zero
    # pairs, equal x̃ᵀΣx̃; chunks of a few rows (working_memory of 0.001 MiB) change nothing.
    rng = np.random.default_rng([n_problems, fit_intercept])
    d = 40
    X = sp.random(300, d, density=0.1, format="csr", rng=rng, data_rvs=rng.standard_normal)
    if kind == "dense":
        X = X.toarray()
    coef, intercept, sigma = random_posterior(rng, n_problems, d, fit_intercept)
    est = posterior_estimator(vsbayes.VSLogisticRegression, coef, intercept, sigma, fit_intercept)
    pairs = kind == "sparse_pairs"
    monkeypatch.setattr(latent_module, "_GATHER_COST", 1e-9 if pairs else 1e9)
    want_mean, want_var = direct_moments(X, coef, intercept, sigma, fit_intercept)
    if n_problems == 1:
        want_mean, want_var = want_mean[:, 0], want_var[:, 0]
    mean, var = est.latent_mean_and_variance(X)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, want_var, rtol=1e-10)
    with sklearn.config_context(working_memory=0.001):
        small_mean, small_var = est.latent_mean_and_variance(X)
        proba = est.predict_proba(X)
    np.testing.assert_allclose(small_mean, mean, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(small_var, var, rtol=1e-13)
    np.testing.assert_allclose(proba, est.predict_proba(X), rtol=1e-13)


def test_latent_variance_of_a_singular_covariance():
    # A covariance singular to round-off (Cholesky fails): a clipped eigen-square-root.
    rng = np.random.default_rng(0)
    d = 5
    root = rng.normal(size=(d + 1, 2))
    sigma = root @ root.T  # rank 2
    coef, intercept = rng.normal(size=(1, d)), np.array([0.3])
    est = posterior_estimator(vsbayes.VSProbitRegression, coef, intercept, sigma)
    X = rng.normal(size=(50, d))
    _, var = est.latent_mean_and_variance(X)
    _, want = direct_moments(X, coef, intercept, sigma, True)
    np.testing.assert_allclose(var, want[:, 0], rtol=1e-9, atol=1e-12)
    assert np.all(var >= 0)


def test_latent_variance_has_no_cancellation():
    # Uncentred features: x̃ᵀΣx̃ ≪ ‖x‖² ‖Σ‖ (the intercept cancels the coefficients). The
    # factor's sum of squares keeps its relative accuracy; x Σ x + 2 x·b + c loses digits.
    d, shift = 3, 1e4
    L = np.tril(np.full((d + 1, d + 1), 0.1)) + np.eye(d + 1)
    L[d, :d] = -shift * L[:d, :d].sum(axis=0)  # f = x·w + b with x ≈ shift: w and b cancel
    sigma = L @ L.T
    est = posterior_estimator(vsbayes.VSLogisticRegression, np.zeros((1, d)), np.zeros(1), sigma)
    X = np.full((4, d), shift) + np.arange(4)[:, None] * 1e-3
    _, var = est.latent_mean_and_variance(X)
    want = np.sum((np.column_stack([X, np.ones(4)]) @ L) ** 2, axis=1)
    np.testing.assert_allclose(var, want, rtol=1e-6)


@pytest.mark.parametrize("cls", [vsbayes.VSLogisticRegression, vsbayes.VSProbitRegression])
def test_prediction_methods_share_one_path(cls):
    # predict_log_proba, predict_proba, decision_function and predict agree with the link's
    # predictive on the latent moments, for two classes and one-vs-rest.
    rng = np.random.default_rng(1)
    d = 6
    X = rng.normal(size=(200, d))
    link = vsbayes.models.get_link(cls._link)
    for n_problems in (1, 3):
        coef, intercept, sigma = random_posterior(rng, n_problems, d, scale=2.0)
        est = posterior_estimator(cls, coef, intercept, sigma)
        mean, var = est.latent_mean_and_variance(X)
        log_p, log_q = link.predictive_log_proba(mean, var)
        log_proba = est.predict_log_proba(X)
        if n_problems == 1:
            np.testing.assert_array_equal(log_proba, np.column_stack([log_q, log_p]))
        else:
            normalizer = np.log(np.exp(log_p).sum(axis=1, keepdims=True))
            np.testing.assert_allclose(log_proba, log_p - normalizer, rtol=1e-12)
        np.testing.assert_allclose(np.exp(log_proba).sum(axis=1), 1.0, rtol=1e-12)
        np.testing.assert_array_equal(est.predict_proba(X), np.exp(log_proba))
        np.testing.assert_array_equal(est.decision_function(X), log_p - log_q)
        scores = log_p - log_q
        index = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        np.testing.assert_array_equal(est.predict(X), est.classes_[index])


def test_chunks_on_threads_give_the_same_values(monkeypatch):
    # Chunks run side by side on as many threads as BLAS may use; each chunk's values do
    # not depend on the thread that computed them.
    rng = np.random.default_rng(2)
    d = 8
    X = rng.normal(size=(3000, d))
    coef, intercept, sigma = random_posterior(rng, 3, d)
    est = posterior_estimator(vsbayes.VSLogisticRegression, coef, intercept, sigma)
    with sklearn.config_context(working_memory=0.05):  # ~20 chunks
        monkeypatch.setattr(latent_module, "blas_thread_count", lambda: 1)
        one = est.predict_log_proba(X), est.latent_mean_and_variance(X)
        monkeypatch.setattr(latent_module, "blas_thread_count", lambda: 3)
        latent = est._predictive().latent(X)
        assert len(latent.chunks) > 3 and latent.threads == 3
        three = est.predict_log_proba(X), est.latent_mean_and_variance(X)
    # Equal to round-off: the threads share working_memory, so the chunks' sizes (and the
    # BLAS blocking of their products) differ; NumPy 1.23 then differs in the last bit.
    np.testing.assert_allclose(one[0], three[0], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(one[1][1], three[1][1], rtol=1e-13, atol=1e-15)


def test_prediction_follows_the_blas_thread_limit():
    with threadpool_limits(1, user_api="blas"):
        assert blas_thread_count() == 1
        rng = np.random.default_rng(3)
        coef, intercept, sigma = random_posterior(rng, 1, 4)
        est = posterior_estimator(vsbayes.VSProbitRegression, coef, intercept, sigma)
        assert est._predictive().latent(rng.normal(size=(10, 4))).threads == 1


@pytest.fixture(scope="module")
def small_fits():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 3))
    binary = vsbayes.LaplaceLogisticRegression().fit(X, (X[:, 0] > 0).astype(int))
    three = vsbayes.LaplaceLogisticRegression().fit(X, np.digitize(X[:, 1], [-0.4, 0.4]))
    return X[:10], [binary, three]


def small_reads(est, X):
    """Every read of a fitted posterior, small, with fixed seeds."""
    return {
        "predict_proba": est.predict_proba(X),
        "predict_log_proba": est.predict_log_proba(X),
        "decision_function": est.decision_function(X),
        "latent_mean_and_variance": est.latent_mean_and_variance(X),
        "sample_coef": est.sample_coef(3, random_state=0),
        "thompson_sample": tuple(est.thompson_sample(X, 2, random_state=0)),
        "predict_proba_interval": est.predict_proba_interval(X, n_draws=64, random_state=0),
        "sample_proba": est.sample_proba(X, 5, random_state=0),
        "sample_y": est.sample_y(X, 5, random_state=0),
        "summary": np.asarray(est.summary()[["mean", "sd"]]),
    }


def test_small_reads_run_on_one_blas_thread(small_fits, monkeypatch):
    # Out of a fit, a small read runs on one BLAS thread (a second one stalls its
    # factorizations under load), with the same numbers; a large one keeps BLAS's threads.
    # The same to round-off, not bitwise: an OpenBLAS build may block a product's sums
    # differently on one thread and on two (numpy 1.23's did, in predict_proba_interval).
    from vsbayes import _blas
    from vsbayes.estimators import _prediction, _summaries

    X, fits = small_fits
    with threadpool_limits(2, user_api="blas"):
        if blas_thread_count() < 2:
            pytest.skip("BLAS runs one thread here")
        seen = []

        def spy(function):
            def wrapper(*args, **kwargs):
                seen.append(blas_thread_count())
                return function(*args, **kwargs)

            return wrapper

        monkeypatch.setattr(_prediction, "fitted_predictive", spy(_prediction.fitted_predictive))
        monkeypatch.setattr(_summaries, "coefficient_table", spy(_summaries.coefficient_table))
        small = _blas.SMALL_WORK
        for est in fits:
            monkeypatch.setattr(_blas, "SMALL_WORK", small)
            seen.clear()
            with_policy = small_reads(est, X)
            assert len(seen) >= len(with_policy) and set(seen) == {1}
            monkeypatch.setattr(_blas, "SMALL_WORK", 0.0)  # every read "large"
            seen.clear()
            without = small_reads(est, X)
            assert len(seen) >= len(without) and set(seen) == {2}
            for name, value in with_policy.items():
                if isinstance(value, tuple):
                    pairs = zip(value, without[name], strict=True)
                else:
                    pairs = [(value, without[name])]
                for a, b in pairs:
                    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-300, err_msg=name)
