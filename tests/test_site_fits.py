"""VS site fits (many small targets at once) and the tilted moments EP builds on them."""

import importlib
import itertools
import warnings

import numpy as np
import pytest

from vsbayes.approximations import expectation_propagation, glm_laplace
from vsbayes.engine.site_fits import fit_sites
from vsbayes.models import BinaryGLMPosterior, get_link
from vsbayes.models.tilted import (
    NARROW_MAX_VAR,
    _link_rule_covers,
    _mode,
    _psi,
    _rule,
    _rule_sizes,
    fractional_link_moments,
    link_variable_moments,
    narrow_tilted_moments,
    quadrature_tilted_moments,
    tilted_mode,
    vs_tilted_moments,
)
from vsbayes.sampling import GaussHermite, SymmetricSobol


def test_gauss_hermite_rule_integrates_polynomials_exactly():
    rule = GaussHermite(5)
    z, log_w = rule.standard_normal(rule.n_points(2), 2)
    w = np.exp(log_w)
    assert z.shape == (25, 2)
    # E z1⁴ z2² = 3 under N(0, I): degree ≤ 9 per axis is exact with 5 nodes.
    assert w.sum() == pytest.approx(1.0, abs=1e-14)
    assert w @ (z[:, 0] ** 4 * z[:, 1] ** 2) == pytest.approx(3.0, abs=1e-12)
    with pytest.raises(ValueError, match="25 points"):
        rule.standard_normal(24, 2)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_site_fits_are_exact_on_gaussian_targets(k, global_random_seed):
    rng = np.random.default_rng([k, global_random_seed])
    m = 50
    mean = rng.normal(size=(m, k))
    root = rng.normal(size=(m, k, k)) / np.sqrt(k) + 2.0 * np.eye(k)
    cov = root @ root.transpose(0, 2, 1)
    log_z = rng.normal(size=m) * 300  # far from 0: the per-site shift must handle it
    prec = np.linalg.inv(cov)
    log_det = np.linalg.slogdet(cov)[1]

    def log_target(t):
        gap = t - mean[:, None, :]
        quad = np.einsum("mpa,mab,mpb->mp", gap, prec, gap)
        return (log_z - 0.5 * log_det - 0.5 * k * np.log(2 * np.pi))[:, None] - 0.5 * quad

    # Kernels within 1.5 sds of the target and 0.6-1.7 times as wide.
    kernel_mean = mean + 0.5 * np.einsum(
        "mab,mb->ma", np.linalg.cholesky(cov), rng.normal(size=(m, k))
    )
    kernel_chol = np.linalg.cholesky(cov) * rng.uniform(0.6, 1.7, size=(m, 1, 1))
    fits = fit_sites(log_target, kernel_mean, kernel_chol, GaussHermite(6))
    assert fits.integrable.all()
    np.testing.assert_allclose(fits.log_Z, log_z, rtol=0, atol=1e-8)
    np.testing.assert_allclose(fits.mean, mean, rtol=0, atol=1e-8)
    np.testing.assert_allclose(fits.cov, cov, rtol=1e-8, atol=0)


@pytest.mark.parametrize("link", ["logistic", "probit"])
@pytest.mark.parametrize("power", [1.0, 0.4])
def test_vs_tilted_moments_match_quadrature(link, power):
    # Cavities from narrow to vague, means across the link's bend and in its tails: every
    # branch (Gauss-Hermite orders, link variable, quadrature) is taken.
    var = np.repeat(np.geomspace(1e-3, 1e6, 19), 9)
    mean = np.tile(np.array([-40.0, -4, -1, 0, 0.5, 2, 6, 40, -0.3]), 19) * np.sqrt(var)
    mean = np.clip(mean, -300, 300)
    f = get_link(link)
    # The quadrature itself loses digits for v ≳ 1e5 (node cap): compare below that, and
    # compute the reference only there (the vague cavities' many nodes, shared by the
    # sites of a block, were up to 3/4 of its cost; the reference moves by 4e-14).
    # Measured: at most 2e-10, 1.4e-9 and 4e-9.
    ok = var < 1e5
    ref_log_z, ref_mean, ref_var = quadrature_tilted_moments(f, mean[ok], var[ok], power)
    log_z, t_mean, t_var = (a[ok] for a in vs_tilted_moments(f, mean, var, power))
    assert np.abs(log_z - ref_log_z).max() < 3e-8
    assert (np.abs(t_mean - ref_mean) / np.sqrt(ref_var)).max() < 3e-8
    assert np.abs(t_var / ref_var - 1).max() < 3e-8
    # "fast": the logistic's mixture of probits where Z ≥ 1e-2 and the power is 1 (VS on
    # the others; probit: its closed form). Measured: 1.8e-8, 8e-10, 4e-9 (3e-7 bounds the
    # variance over v up to 1e4 at Z ≥ 1e-2: see tilted._MIXTURE_MIN_Z).
    fast = f.tilted_moments(mean, var, power, method="fast")
    log_z, t_mean, t_var = (a[ok] for a in fast)
    assert np.abs(log_z - ref_log_z).max() < 1e-7
    assert (np.abs(t_mean - ref_mean) / np.sqrt(ref_var)).max() < 1e-7
    assert np.abs(t_var / ref_var - 1).max() < 3e-7


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_tilted_mode_is_found_on_wide_cavities(link):
    # Cavities wide against the link's bend, means on the wrong side (a stream's first rows
    # under the vague intercept prior): Newton swung across the mode there, and within its
    # 80 iterations left the logistic's off by up to a gradient of 0.96 (98 of 20 000
    # random sites of variance 12-40).
    rng = np.random.default_rng(0)
    mean, var = rng.normal(0.0, 5.0, 2000), rng.uniform(0.1, 40.0, 2000)
    power = np.resize([1.0, 0.5], var.size)
    f = get_link(link)
    mode, width = tilted_mode(f, mean, var, power)
    slope, curvature = f.derivatives(mode)
    assert np.abs(power * slope - (mode - mean) / var).max() < 1e-12
    np.testing.assert_allclose(width, 1.0 / np.sqrt(power * curvature + 1.0 / var), rtol=1e-15)


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_narrow_tilted_moments_match_quadrature(link):
    # Narrow cavities (partial_fit's revisits), means across the bend and into the tails,
    # powers below 1 (forgotten sites). Bounds: tilted.NARROW_MAX_VAR's measurements.
    var = np.repeat(np.geomspace(1e-3, NARROW_MAX_VAR, 7), 8)
    mean = np.tile([-6.0, -3, -1, -0.2, 0, 1, 3, 6], 7) * np.sqrt(1.0 + var)
    power = np.resize([1.0, 0.9, 0.5, 0.3], var.size)
    f = get_link(link)
    log_z, t_mean, t_var = narrow_tilted_moments(f, mean, var, power)
    ref_log_z, ref_mean, ref_var = quadrature_tilted_moments(f, mean, var, power)
    assert np.abs(log_z - ref_log_z).max() < 3e-9
    assert (np.abs(t_mean - ref_mean) / np.sqrt(ref_var)).max() < 1e-8
    assert np.abs(t_var / ref_var - 1).max() < 1.5e-7  # measured 8e-11, 7.5e-8 (probit)


def test_link_variable_moments_equal_the_probit_closed_form_for_any_width():
    f = get_link("probit")
    var = np.repeat(np.geomspace(2.0, 1e8, 8), 5)
    mean = np.tile([-3.0, -1, 0, 1, 3], 8) * np.sqrt(var)
    got = link_variable_moments(f, mean, var)
    closed = f.tilted_moments(mean, var, method="closed")
    np.testing.assert_allclose(got[0], closed[0], atol=1e-7)
    np.testing.assert_allclose((got[1] - closed[1]) / np.sqrt(closed[2]), 0, atol=1e-7)
    np.testing.assert_allclose(got[2], closed[2], rtol=1e-7)


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_link_variable_moments_match_quadrature_from_unit_variance(link):
    # The range where vs_tilted_moments uses them, tails included (measured: ≤ 1e-8).
    var = np.repeat(np.geomspace(1.0, 1e4, 13), 11)
    mean = np.tile([-30.0, -8, -3, -1, -0.3, 0, 0.5, 2, 5, 12, 30], 13) * np.sqrt(var)
    mean = np.clip(mean, -300, 300)
    keep = _link_rule_covers(mean, var)  # as in vs_tilted_moments
    assert keep.mean() > 0.8
    mean, var = mean[keep], var[keep]
    f = get_link(link)
    log_z, t_mean, t_var = link_variable_moments(f, mean, var)
    ref_log_z, ref_mean, ref_var = quadrature_tilted_moments(f, mean, var)
    assert np.abs(log_z - ref_log_z).max() < 3e-9
    assert (np.abs(t_mean - ref_mean) / np.sqrt(ref_var)).max() < 1e-8
    assert np.abs(t_var / ref_var - 1).max() < 3e-8


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_ep_fixed_point_is_the_same_with_vs_and_quadrature_site_fits(link):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((120, 4))
    y = np.where(X @ [1.0, -2, 0.5, 0] + rng.logistic(size=120) > 0, 1.0, -1.0)
    model = BinaryGLMPosterior(
        X, y, rng.uniform(0.2, 2.0, size=120), link, prior_var=4.0, intercept_prior_var=1e6
    )
    start = glm_laplace(model).mean
    fits = [
        expectation_propagation(model, start=start, site_fit=method, tol=1e-11)
        for method in ("vs", "quadrature")
    ]
    np.testing.assert_allclose(fits[0].mean, fits[1].mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(fits[0].cov, fits[1].cov, rtol=1e-6, atol=1e-10)
    assert fits[0].log_Z == pytest.approx(fits[1].log_Z, abs=1e-6)


def _fine_rule(link, mean, var, power):
    """The quadrature with a quarter of power 1's step (in u, and in t) on every site: a
    reference whose aliasing error is far below round-off (about e^{-4·49})."""
    mode, width = _mode(link, mean, var, power)
    peak = _psi(link, mode, mean, var, power)
    drops = [peak - _psi(link, mode + side * 12.0 * width, mean, var, power) for side in (-1, 1)]
    reach = 12.0 * np.maximum(1.0, 40.0 / np.maximum(np.minimum(*drops), 1e-3))
    step = np.minimum(0.25, 0.4 / width) / 4.0
    parts = []
    for i in range(mean.size):  # one site at a time: each its own node count
        k = int(np.ceil(reach[i] / step[i]))
        one = (a[i : i + 1] for a in (mean, var, power, mode, width, peak))
        parts.append(_rule(link, *one, np.array([reach[i] / k]), k))
    return [np.concatenate(a) for a in zip(*parts, strict=True)]


def _cavities(var_range, means):
    var = np.repeat(np.geomspace(*var_range), len(means))
    return np.tile(means, var_range[2]) * np.sqrt(1.0 + var), var


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_quadrature_of_a_fractional_power_takes_fewer_nodes(link, monkeypatch):
    # A weight below 1 is the power p of its factor F^p, nearer a constant the smaller p:
    # its rule never takes more nodes than the one sized as for p = 1 (the link without
    # its singularity), and on vague cavities fewer the smaller p (measured at p = 1e-8:
    # 3.1 to 98 times fewer, at 1e-3 1.0 to 4).
    mean, var = _cavities((1e-2, 1e6, 9), [-6.0, -1, 0, 1, 6])
    f = get_link(link)
    vague = var > 1e3
    fewest = []
    for p in (0.5, 1e-3, 1e-8):
        power = np.full(var.size, p)
        sized = _rule_sizes(f, mean, var, power)[-1]
        with monkeypatch.context() as patch:
            patch.setattr(type(f), "singularity", None)
            as_one = _rule_sizes(f, mean, var, power)[-1]
        assert (sized <= as_one).all()
        fewest.append((as_one[vague] / sized[vague]).min())
    assert fewest[-1] > 3.0


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_quadrature_of_a_fractional_power_is_within_its_bound(link):
    # tilted._fractional_step sizes the rule to an aliasing error of 1e-15 (relative: log Z,
    # the mean in sds, the variance); the sums' own round-off adds up to ~1e-13 (measured
    # 1.1e-13 over v in [1e-3, 3e4], p in [1e-12, 0.99]).
    mean, var = _cavities((1e-2, 1e4, 5), [-8.0, -1, 0, 2, 8])
    f = get_link(link)
    for p in (1e-8, 1e-3, 0.3, 0.9):
        power = np.full(var.size, p)
        log_z, t_mean, t_var = quadrature_tilted_moments(f, mean, var, power)
        ref_log_z, ref_mean, ref_var = _fine_rule(f, mean, var, power)
        assert np.abs(log_z - ref_log_z).max() < 1e-12
        assert (np.abs(t_mean - ref_mean) / np.sqrt(ref_var)).max() < 1e-12
        assert np.abs(t_var / ref_var - 1).max() < 1e-12


def _adaptive_reference(log_cdf, m, v, p):
    """``(log Z, mean, variance)`` of ``F(t)^p N(t; m, v)`` by SciPy's adaptive quadrature,
    split at the link's bend, F^p's decades on either side and the cavity's sds."""
    from scipy import integrate

    sd = np.sqrt(v)
    grid = np.linspace(m - 45 * sd, m + 45 * sd, 20001)

    def psi(t):
        return p * log_cdf(t) - 0.5 * (t - m) ** 2 / v

    centre = grid[np.argmax(psi(grid))]
    peak = psi(centre)
    decades = 10.0 ** np.arange(0, 10)
    points = np.concatenate([[-200.0, -60, -20, -5, 0, 5, 20, 60, 200], -decades, decades])
    points = np.concatenate([points, [centre], m + sd * np.arange(-10.0, 11.0)])
    points = np.unique(points[np.abs(points - m) <= 45 * sd])
    sums = np.zeros(3)
    for a, b in itertools.pairwise(points):
        for j in range(3):
            sums[j] += integrate.quad(
                lambda t, j=j: np.exp(psi(t) - peak) * ((t - centre) / sd) ** j,
                a,
                b,
                epsabs=1e-15 * sd,
                epsrel=2e-14,
                limit=500,
            )[0]
    shift = sums[1] / sums[0]
    return (
        np.log(sums[0]) + peak - 0.5 * np.log(2 * np.pi * v),
        centre + sd * shift,
        v * (sums[2] / sums[0] - shift**2),
    )


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_quadrature_of_a_cavity_far_wider_than_the_link(link):
    # A cavity of sd 10⁵: the uniform rule in the tilted density's frame would need ~10⁶
    # nodes per side to keep its step of 0.4 at the link's bend, and at its cap (2¹⁵) erred
    # by up to 2.5e-3; the sinh-mapped rule is within round-off (measured ≤ 7.1e-15 over
    # v in [3·10⁴, 10¹⁴], powers 1 to 1e-8, means within ±6 sds; D-241).
    from scipy.special import log_expit, log_ndtr

    f = get_link(link)
    log_cdf = log_expit if link == "logistic" else log_ndtr
    v = 1e10
    mean = np.array([-3.0, -0.3, 0.0, 1.0]) * np.sqrt(v)
    for p in (1.0, 1e-3):
        log_z, t_mean, t_var = quadrature_tilted_moments(f, mean, v, p)
        for i, m in enumerate(mean):
            ref_log_z, ref_mean, ref_var = _adaptive_reference(log_cdf, m, v, p)
            assert abs(log_z[i] - ref_log_z) < 1e-12
            assert abs(t_mean[i] - ref_mean) / np.sqrt(ref_var) < 1e-12
            assert abs(t_var[i] / ref_var - 1) < 1e-12


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_quadrature_of_cavities_of_any_width_in_one_call(link):
    # Sites of very different widths share a block's node count: each site's own nodes
    # only (the mapped rule's sinh would overflow on a wider site's count), as if alone.
    f = get_link(link)
    power = np.array([1.0, 1e-12, 0.5, 1.0, 1e-3])
    for var in (1e10, 1e15):
        mean = np.array([-1e4, 0.0, 3e3, -40.0 * np.sqrt(var), 40.0 * np.sqrt(var)])
        together = quadrature_tilted_moments(f, mean, var, power)
        assert np.isfinite(together).all() and (together[2] > 0).all()
        for i in range(mean.size):
            log_z, t_mean, t_var = (
                a[0] for a in quadrature_tilted_moments(f, mean[i], var, power[i])
            )
            assert abs(log_z - together[0][i]) < 1e-13
            assert abs(t_mean - together[1][i]) < 1e-13 * np.sqrt(t_var)
            assert abs(t_var / together[2][i] - 1) < 1e-13


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_quadrature_of_a_cavity_beyond_float_resolution_stays_finite(link):
    # A diverging EP's cavities (|m| ~ 10¹⁹, sd 141: the mean's round-off, 1.6e4, beyond
    # the width) make every drop of ψ round-off: the node count hits the cap and, before,
    # the sinh-mapped rule took them and returned -inf and NaN with RuntimeWarnings. The
    # logistic's log Z there is m + v/2 = m in float64 (F = e^t); the probit's finite.
    import warnings

    f = get_link(link)
    mean, var = np.array([-7.26e19, -1e19]), np.array([2e4, 2e4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        log_z, t_mean, t_var = quadrature_tilted_moments(f, mean, var)
    assert np.isfinite(log_z).all() and np.isfinite(t_mean).all() and np.isfinite(t_var).all()
    if link == "logistic":
        np.testing.assert_allclose(log_z, mean, rtol=1e-12)
        np.testing.assert_allclose(t_mean, mean, rtol=1e-12)


def test_quadrature_of_a_cavity_far_out_on_a_flank_is_its_tails():
    # A diverging EP's cavities far out on the logistic's flat left flank (a fit of 3 rows
    # at weights 1e6 and C = 1e6), whose rule's range ends 10⁶ widths short of the link's
    # bend: the sinh-mapped nodes, spread from the bend, were 10⁶ apart at the mode, and
    # the moments NaN (RuntimeWarnings) or a variance of 0 and 2e-6 for 4.6e7 and 1e8.
    # There F = e^t: the tilted density is N(m + v, v), log Z = m + v/2, to round-off.
    import warnings

    f = get_link("logistic")
    mean, var = np.array([-1.63933561e10, -3e10]), np.array([4.6e7, 1e8])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        log_z, t_mean, t_var = quadrature_tilted_moments(f, mean, var)
    np.testing.assert_allclose(log_z, mean + var / 2, rtol=1e-14)
    np.testing.assert_allclose(t_mean, mean + var, rtol=1e-14)
    np.testing.assert_allclose(t_var, var, rtol=1e-7)  # the sum's round-off: 1e-16 m² / v


def test_probit_curvature_far_left_keeps_its_digits():
    # -d² log Φ(t) = r (t + r), r = φ/Φ ≈ -t - 1/t: t + r cancels, and was round-off beyond
    # |t| ~ 10⁶ (228881 at t = -3e10 for 1 - 1/t², and a tilted mode at -7.6e9 for -300).
    # Against the series r² (1/u² - 3/u⁴ + 15/u⁶ - 105/u⁸ + 945/u¹⁰), u = -t, whose omitted
    # term is 10395/u¹⁰ of it: 1e-13 at u = 30; the direct sum errs by ~eps u² there.
    f = get_link("probit")
    t = -np.geomspace(30.0, 1e150, 40)
    ratio, curvature = f.derivatives(t)
    w = 1.0 / t**2
    series = ratio**2 * w * (1 - w * (3 - w * (15 - w * (105 - w * 945))))
    np.testing.assert_allclose(curvature, series, rtol=1e-10)
    _, t_mean, t_var = quadrature_tilted_moments(f, np.array([-3e10]), np.array([1e8]))
    # The tilted density Φ(t) N(t; m, v): its mode ≈ m / (1 + v) = -300, width ≈ 1.
    np.testing.assert_allclose(t_mean, -300.0, rtol=1e-4)
    np.testing.assert_allclose(t_var, 1.0, rtol=1e-3)


def test_fractional_link_moments_err_about_the_power_times_the_link_rule():
    # The logistic's rule on its own scale for F^p, p < 1: its error is the link rule's
    # (test_link_variable_moments_match_quadrature_from_unit_variance) times about p, F^p's
    # branch points being of strength p; the 1e-12: round-off of the closed-form parts.
    var = np.repeat(np.geomspace(1.0, 1e4, 9), 10)
    mean = np.tile([-300.0, -30, -3, -1, 0, 0.5, 2, 5, 30, 300], 9) * np.sqrt(var)
    mean = np.clip(mean, -3000, 3000)
    f = get_link("logistic")
    for p in (1e-8, 1e-3, 0.3, 0.9):
        power = np.full(var.size, p)
        log_z, t_mean, t_var = fractional_link_moments(f, mean, var, power)
        ref_log_z, ref_mean, ref_var = quadrature_tilted_moments(f, mean, var, power)
        assert np.abs(log_z - ref_log_z).max() < 3e-9 * p + 1e-12
        assert (np.abs(t_mean - ref_mean) / np.sqrt(ref_var)).max() < 1e-8 * p + 1e-12
        assert np.abs(t_var / ref_var - 1).max() < 3e-8 * p + 1e-12


@pytest.mark.parametrize("link", ["logistic", "probit"])
@pytest.mark.parametrize("weight", [1e-8, 1e-3])
def test_ep_fixed_point_of_small_weights_is_the_quadrature_one(link, weight):
    # Small weights: every site a fractional power, on cavities near the prior's (the
    # intercept's variance 1e4): the link-scale rule (logistic), the VS fits and the sized
    # quadrature against the quadrature alone.
    rng = np.random.default_rng(4)
    X = rng.standard_normal((60, 3))
    y = np.where(X @ [1.0, -2, 0.5] + rng.logistic(size=60) > 0, 1.0, -1.0)
    model = BinaryGLMPosterior(
        X, y, np.full(60, weight), link, prior_var=4.0, intercept_prior_var=1e4
    )
    fits = [expectation_propagation(model, site_fit=m, tol=1e-11) for m in ("auto", "quadrature")]
    sd = np.sqrt(np.diag(fits[1].cov))
    np.testing.assert_allclose((fits[0].mean - fits[1].mean) / sd, 0, atol=1e-7)
    np.testing.assert_allclose(fits[0].cov, fits[1].cov, rtol=1e-6, atol=0)
    assert fits[0].log_Z == pytest.approx(fits[1].log_Z, abs=1e-6)


def test_unknown_site_fit_is_an_error():
    with pytest.raises(ValueError, match="method must be one of"):
        get_link("logistic").tilted_moments([0.0], [1.0], method="magic")
    with pytest.raises(ValueError, match="no closed-form"):
        get_link("logistic").tilted_moments([0.0], [1.0], method="closed")


def test_rule_arrays_fast_forms_are_the_general_ones():
    """On an equal-weight rule the fits' weighted values take the weights and the window in
    their coordinates (round-off apart from the general form), their spread comes from each
    row's extremes (the same bits), and the chord steps take the Gram matrix's inverse."""
    from vsbayes.engine._linalg import flushed_exp
    from vsbayes.engine.site_fits import _identity_basis, _rule_arrays
    from vsbayes.sampling import SymmetricSobol

    k = 3
    shared = _rule_arrays(SymmetricSobol(16), k)
    assert shared.uniform and shared.mirrored
    rng = np.random.default_rng(0)
    v = 0.1 * rng.normal(size=(6, shared.phi.shape[1]))
    v[:, 1 + k :] += _identity_basis(k)  # near the kernel
    general = shared.weights * flushed_exp(shared.values(v) - shared.log_window)
    np.testing.assert_allclose(shared.weighted_fit(v), general, rtol=1e-12, atol=0)
    mass = general.sum(axis=1)
    direct = np.abs(general / shared.weights - mass[:, None]).max(axis=1) / mass
    np.testing.assert_array_equal(shared.spread(general, mass), direct)
    identity = shared.gram_inverse() @ shared.gram
    np.testing.assert_allclose(identity, np.eye(len(identity)), rtol=0, atol=1e-10)


def test_site_fits_on_unequal_weights_take_the_general_forms():
    from vsbayes.engine.site_fits import _identity_basis, _rule_arrays

    shared = _rule_arrays(GaussHermite(4), 2)
    assert not shared.uniform
    v = np.zeros((2, shared.phi.shape[1]))
    v[:, 0], v[:, 3:] = -np.log(2.0 * np.pi), _identity_basis(2)  # the kernel: q̄ = 1
    wq = shared.weighted_fit(v)
    np.testing.assert_allclose(wq, np.broadcast_to(shared.weights, wq.shape), rtol=1e-12)
    np.testing.assert_allclose(shared.spread(wq, wq.sum(axis=1)), 0.0, atol=1e-12)


def test_inverse_with_rcond_flags_the_ill_conditioned_matrices():
    """The batched Cholesky path keeps a matrix where rcond |A|_F |A⁻¹|_F < 1, which
    implies λ_min > rcond λ_max; the others take the eigendecomposition's test."""
    from vsbayes.engine.site_fits import _eigen_inverse, _inverse

    rng = np.random.default_rng(1)
    basis = np.linalg.qr(rng.normal(size=(5, 4, 4)))[0]
    spectra = np.array(
        [[1, 2, 3, 4], [1e-13, 1, 1, 1], [1e-11, 1, 2, 3], [0.5, 1, 1, 9], [1, 1, 1, 1.0]]
    )
    matrices = np.einsum("mab,mb,mcb->mac", basis, spectra, basis)
    inverse, log_det, definite = _inverse(matrices, rcond=1e-12)
    eigen = _eigen_inverse(matrices, 1e-12)
    np.testing.assert_array_equal(definite, [True, False, True, True, True])
    np.testing.assert_array_equal(definite, eigen[2])
    kept = [0, 3, 4]  # well conditioned: the LU inverses, round-off from the eigen ones
    np.testing.assert_allclose(inverse[kept], eigen[0][kept], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(log_det[kept], np.log(spectra[kept]).sum(axis=1), atol=1e-12)


def test_newton_sites_stopped_at_a_loose_chord_stop_are_left_within_its_square():
    """A Newton step taken at a decrement δ per unit of fitted mass leaves an error (in the
    objective's metric per unit of mass) of about ½ √κ δ, κ ≤ 81 the kurtosis of the step's
    change of the log-fit (a quadratic) under the fit's Gaussian weights: so the sites on
    Newton's steps stopped at ``chord_tol = δ`` are within KL ≲ κ δ² / 8 and log Z within
    ½ √κ δ of the fits run to Newton's own stop (the chord steps' bound: ½ √δ)."""
    from vsbayes.sampling import SymmetricSobol

    rng = np.random.default_rng(2)
    m, k = 40, 3
    slopes = 1.5 * rng.normal(size=(m, 4, k))
    offsets = rng.normal(size=(m, 4))

    def log_target(t):  # four logistic factors per site: far from Gaussian
        logits = np.einsum("mca,mpa->mpc", slopes, t) + offsets[:, None, :]
        return -np.logaddexp(0.0, -logits).sum(axis=2)

    mean = rng.normal(size=(m, k))
    chol = np.broadcast_to(np.sqrt(2.0) * np.eye(k), (m, k, k))
    cavity = (np.broadcast_to(0.5 * np.eye(k), (m, k, k)), 0.5 * mean)
    # A chord spread of 0: every site forms its own Hessian (Newton's steps).
    common = {"gaussian_factor": cavity, "chord_spread": 0.0}
    tight = fit_sites(log_target, mean, chol, SymmetricSobol(16), **common)
    stop = 1e-6
    loose = fit_sites(log_target, mean, chol, SymmetricSobol(16), chord_tol=stop, **common)
    assert tight.integrable.all() and loose.integrable.all()
    assert loose.n_iter < tight.n_iter  # the loose stop did stop earlier
    prec = np.linalg.inv(loose.cov)
    gap = loose.mean - tight.mean
    divergence = 0.5 * (
        np.einsum("mab,mba->m", prec, tight.cov)
        + np.einsum("ma,mab,mb->m", gap, prec, gap)
        - k
        + np.linalg.slogdet(loose.cov)[1]
        - np.linalg.slogdet(tight.cov)[1]
    )
    assert np.abs(divergence).max() <= 81 * stop**2 / 8
    np.testing.assert_allclose(loose.log_Z, tight.log_Z, rtol=0, atol=4.5 * stop)


def _gaussian_divergence(mean, cov, other_mean, other_cov):
    """KL(N(mean, cov) ‖ N(other_mean, other_cov)) per row."""
    k = mean.shape[1]
    prec = np.linalg.inv(other_cov)
    gap = other_mean - mean
    return 0.5 * (
        np.einsum("mab,mba->m", prec, cov)
        + np.einsum("ma,mab,mb->m", gap, prec, gap)
        - k
        + np.linalg.slogdet(other_cov)[1]
        - np.linalg.slogdet(cov)[1]
    )


def test_site_fits_from_the_kernels_newton_step_reach_the_moment_starts_optimum(monkeypatch):
    """The fits start from the kernel, its exact Newton step, and (only where that step's
    decrement exceeds ``_MOMENT_START``) the Gaussian of the target's moments on the rule:
    the objective is convex, so every start reaches the same optimum, each within its stop
    (a remaining decrement ≤ _TOL = 10⁻¹⁴ per unit of mass: two fits within KL ≤ 2 _TOL of
    each other, above the KL's own round-off of ~10⁻¹⁵ at k = 3). The kernel's step is
    Newton's (the Hessian there is the mass times the Gram matrix): where the kernel is
    near the optimum (KL₀ = δ/2 at a decrement δ), the step leaves a decrement of at most
    about κ δ² / 4 (κ ≤ 81, D-203), a KL of at most κ KL₀² / 2."""
    from vsbayes.engine import site_fits
    from vsbayes.sampling import SymmetricSobol

    rng = np.random.default_rng(3)
    m, k = 40, 3
    # Factors from nearly flat (short kernel steps) to sharp (long ones).
    slopes = np.geomspace(0.01, 3.0, m)[:, None, None] * rng.normal(size=(m, 4, k))
    offsets = rng.normal(size=(m, 4))

    def log_target(t):
        logits = np.einsum("mca,mpa->mpc", slopes, t) + offsets[:, None, :]
        return -np.logaddexp(0.0, -logits).sum(axis=2)

    mean = rng.normal(size=(m, k))
    chol = np.broadcast_to(np.sqrt(2.0) * np.eye(k), (m, k, k))
    cavity = (np.broadcast_to(0.5 * np.eye(k), (m, k, k)), 0.5 * mean)
    rule = SymmetricSobol(16)

    def fit(threshold, **options):
        monkeypatch.setattr(site_fits, "_MOMENT_START", threshold)
        return fit_sites(log_target, mean, chol, rule, gaussian_factor=cavity, **options)

    default = fit(site_fits._MOMENT_START)
    for threshold in (0.0, np.inf):  # every site also from its moments; none
        other = fit(threshold)
        assert other.integrable.all()
        divergence = _gaussian_divergence(other.mean, other.cov, default.mean, default.cov)
        assert np.abs(divergence).max() <= 2 * site_fits._TOL
    kernel_step = fit(np.inf, max_iter=0)
    kernel = fit_sites(lambda t: np.zeros(t.shape[:2]), mean, chol, rule, max_iter=0)
    step_gap = _gaussian_divergence(kernel_step.mean, kernel_step.cov, default.mean, default.cov)
    kernel_gap = _gaussian_divergence(kernel.mean, kernel.cov, default.mean, default.cov)
    near = kernel_gap <= 1e-2
    assert near.sum() >= 5
    assert (step_gap[near] <= 40.5 * kernel_gap[near] ** 2).all()


def test_a_trial_step_whose_fit_sums_past_the_largest_float_is_rejected_silently(monkeypatch):
    """A trial step far too long can leave every node's fit finite and their sum infinite:
    the line search rejects its infinite objective, and numpy's overflow warning stays
    inside (it reached the user's fit on digits at C = 10⁴, D-273; forced here on one
    trial)."""
    site_fits = importlib.import_module("vsbayes.engine.site_fits")
    rng = np.random.default_rng(0)
    m, k = 5, 2
    mean, chol = rng.normal(size=(m, k)), np.repeat(2.0 * np.eye(k)[None], m, axis=0)
    factor = (np.repeat(np.eye(k)[None] / 4.0, m, axis=0), np.zeros((m, k)))

    def fit():
        return fit_sites(
            lambda t: -np.logaddexp(0.0, -3.0 * t[..., 0]),
            mean,
            chol,
            SymmetricSobol(64),
            gaussian_factor=factor,
        )

    plain = fit()
    original, calls = site_fits._RuleArrays.weighted_fit, []

    def huge_once(self, v):
        calls.append(None)
        out = original(self, v)
        return np.full_like(out, 1e308) if len(calls) == 3 else out

    monkeypatch.setattr(site_fits._RuleArrays, "weighted_fit", huge_once)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        forced = fit()
    assert len(calls) > 3
    assert forced.integrable.all()
    np.testing.assert_allclose(forced.mean, plain.mean, rtol=1e-6, atol=1e-6)
