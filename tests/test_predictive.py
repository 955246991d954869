"""Posterior-predictive probabilities of the logistic and probit models, against quadrature."""

import math
import warnings

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import expit, log_expit, log_ndtr

from vsbayes.models import predictive
from vsbayes.models.predictive import logistic_predictive_log_proba, probit_predictive_log_proba

MEANS = [-50.0, -40.0, -10.0, -3.0, -0.5, 0.0, 0.7, 2.0, 8.0, 30.0]
SDS = [0.0, 1e-4, 0.1, 0.5, 0.99, 1.01, 2.0, 5.0, 7.0, 30.0, 1e3, 1e4]
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
    log_p, log_1mp = logistic_predictive_log_proba(m, s**2)
    # The hard requirement: absolute error of p.
    np.testing.assert_allclose(np.exp(log_p), np.exp(ref_log_p), rtol=0, atol=1e-6)
    # The rules' errors are below 1e-13 relative to p (geometric convergence; windows holding
    # all but ~e^-32 of the integrand), and quad's reference is good to ~1e-14. Relative to
    # |log p| ≥ log 2 on the side p ≤ 1/2 they stay there; on the side near 1,
    # log p ≈ -(1 - p) inherits the relative accuracy of 1 - p, the other side.
    for got, want in ((log_p, ref_log_p), (log_1mp, ref_log_1mp)):
        shown = np.exp(want) > 1e-300
        np.testing.assert_allclose(got[shown], want[shown], rtol=1e-12, atol=0)


def test_logistic_symmetry(grid):
    m, s, _, _ = grid
    log_p, log_1mp = logistic_predictive_log_proba(m, s**2)
    mirror_p, mirror_1mp = logistic_predictive_log_proba(-m, s**2)
    np.testing.assert_array_equal(log_1mp, mirror_p)
    np.testing.assert_array_equal(log_p, mirror_1mp)
    np.testing.assert_allclose(np.exp(log_p) + np.exp(mirror_p), 1.0, rtol=0, atol=1e-12)


def test_logistic_zero_variance_is_the_sigmoid():
    m = np.array([-800.0, -40.0, -3.0, -1e-8, 0.0, 0.5, 20.0, 40.0, 800.0])
    log_p, log_1mp = logistic_predictive_log_proba(m, 0.0)
    np.testing.assert_allclose(log_p, log_expit(m), rtol=1e-15, atol=0)
    np.testing.assert_allclose(log_1mp, log_expit(-m), rtol=1e-15, atol=0)
    # A tiny variance goes through the quadrature, whose weights must sum to 1.
    log_p, log_1mp = logistic_predictive_log_proba(m, 1e-300)
    np.testing.assert_allclose(log_p, log_expit(m), rtol=1e-14, atol=0)
    np.testing.assert_allclose(log_1mp, log_expit(-m), rtol=1e-14, atol=0)


def test_logistic_large_variance_is_the_probit_limit():
    # p = E[Φ((m - L)/s)] = Φ(m/s) + O(s^-3) for L standard logistic.
    m, s = np.array([-40.0, -3.0, 0.0, 3.0, 40.0]), 1e15
    log_p, log_1mp = logistic_predictive_log_proba(m, s**2)
    np.testing.assert_allclose(log_p, log_ndtr(m / s), rtol=1e-14, atol=0)
    np.testing.assert_allclose(log_1mp, log_ndtr(-m / s), rtol=1e-14, atol=0)
    log_p, log_1mp = logistic_predictive_log_proba(m, np.inf)
    np.testing.assert_array_equal(log_p, -math.log(2.0))
    np.testing.assert_array_equal(log_1mp, -math.log(2.0))


def test_logistic_far_tail_is_the_lognormal_mean():
    # σ(f) = e^f (1 - e^f + ...), so p = e^(m + s²/2) (1 - e^(m + 3s²/2) + ...): the
    # correction is below e^-400 here. Holds for s > 1 by the Gaussian-side rule.
    m = np.array([-1e3, -1e3, -1e3, -1e3, -1e6, -1e6, -1e6])[:, None]
    s = np.array([0.5, 2.0, 10.0, 20.0, 10.0, 100.0, 500.0])[:, None]
    log_p, _ = logistic_predictive_log_proba(m, s**2)
    np.testing.assert_allclose(log_p, m + s**2 / 2, rtol=1e-14)


def test_logistic_is_continuous_across_the_rules():
    # The rule changes after s = 1 and before -m/s - s = 8 (for s > 1); both sides agree.
    s = np.array([1.0, 1.0 + 1e-12, 2.0, 2.0, 4.0, 4.0])
    m = np.array([-3.0, -3.0, -20.0, -20.0 + 1e-12, -48.0, -48.0 + 1e-12])
    log_p, _ = logistic_predictive_log_proba(m, s**2)
    np.testing.assert_allclose(log_p[1::2], log_p[::2], rtol=1e-12)


def test_logistic_is_increasing_in_the_mean():
    m = np.linspace(-60.0, 60.0, 2001)[:, None]
    log_p, _ = logistic_predictive_log_proba(m, np.array([0.0, 0.25, 1.0, 4.0, 49.0, 1e4]))
    assert np.all(np.diff(log_p, axis=0) >= -1e-15 * np.abs(log_p[1:]))


def test_logistic_blocks_do_not_change_values(monkeypatch):
    rng = np.random.default_rng(0)
    m = rng.normal(0.0, 10.0, 3000)
    var = np.exp(rng.uniform(-10.0, 10.0, m.size))
    whole = logistic_predictive_log_proba(m, var)
    # Blocks of 24 (Gaussian side) and 5 (logistic side) points instead of ~10^5 and ~2·10^4.
    monkeypatch.setattr(predictive, "_BLOCK_ENTRIES", 1000)
    blocks = logistic_predictive_log_proba(m, var)
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
        for function in (logistic_predictive_log_proba, probit_predictive_log_proba):
            log_p, log_1mp = function(m, var)
            for value in (log_p, log_1mp):
                assert np.all(np.isfinite(value) | (value == -np.inf))
                assert np.all(value <= 0)
            np.testing.assert_allclose(np.exp(log_p) + np.exp(log_1mp), 1.0, atol=1e-12)
        # The logistic ones are all finite, as every true value here is representable.
        log_p, _ = logistic_predictive_log_proba(m, var)
        assert np.all(np.isfinite(log_p))


def test_infinite_and_nan_inputs():
    m = np.array([-np.inf, np.inf, 1.0, np.nan, 1.0, np.inf])
    var = np.array([1.0, 1.0, np.inf, 1.0, np.nan, np.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_p, log_1mp = logistic_predictive_log_proba(m, var)
    np.testing.assert_array_equal(log_p, [-np.inf, 0.0, -math.log(2.0), np.nan, np.nan, np.nan])
    np.testing.assert_array_equal(log_1mp, [0.0, -np.inf, -math.log(2.0), np.nan, np.nan, np.nan])


@pytest.mark.parametrize("function", [logistic_predictive_log_proba, probit_predictive_log_proba])
def test_negative_variance_is_rejected(function):
    with pytest.raises(ValueError, match="nonnegative"):
        function([0.0, 1.0], [1.0, -1e-3])


def test_probit_is_the_closed_form():
    m = np.array(MEANS)[:, None]
    var = np.array(SDS) ** 2
    log_p, log_1mp = probit_predictive_log_proba(m, var)
    np.testing.assert_array_equal(log_p, log_ndtr(m / np.sqrt(1.0 + var)))
    np.testing.assert_array_equal(log_1mp, log_ndtr(-m / np.sqrt(1.0 + var)))


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
