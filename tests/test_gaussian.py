import math
import warnings

import numpy as np
import pytest
from _helpers import random_gaussian, random_spd
from scipy import integrate, stats

from vsbayes import Gaussian, excess_kl, kl_divergence
from vsbayes.exceptions import NotPositiveDefiniteError
from vsbayes.gaussian import _symmetrize


def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        Gaussian([0.0, 1.0], np.eye(3))
    with pytest.raises(ValueError, match="finite"):
        Gaussian([0.0, np.nan], np.eye(2))
    with pytest.raises(NotPositiveDefiniteError, match="symmetric"):
        Gaussian([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]])
    with pytest.raises(NotPositiveDefiniteError, match="positive definite"):
        Gaussian([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]])


def test_a_covariance_off_by_round_off_is_symmetrized_and_one_far_off_is_refused(rng):
    spd = random_spd(rng, 3)
    noisy = spd + 1e-12 * rng.standard_normal((3, 3))
    g = Gaussian(np.zeros(3), noisy)
    np.testing.assert_array_equal(g.cov, g.cov.T)
    np.testing.assert_allclose(g.cov, 0.5 * (noisy + noisy.T), rtol=0, atol=1e-15)
    far = spd.copy()
    far[2, 0] += 1e-6
    with pytest.raises(NotPositiveDefiniteError, match="symmetric"):
        Gaussian(np.zeros(3), far)


@pytest.mark.parametrize("block_entries", [1, 7, 40, 10**6])  # 1-row blocks to one block
def test_symmetrize_in_blocks_equals_the_whole_matrix_formula(rng, block_entries):
    a = rng.standard_normal((9, 9))
    b = a.copy()
    assert _symmetrize(b, block_entries) == np.abs(a - a.T).max()
    np.testing.assert_array_equal(b, 0.5 * (a + a.T))


def test_arrays_are_read_only(rng):
    g = random_gaussian(rng, 3)
    with pytest.raises(ValueError):
        g.mean[0] = 1.0
    with pytest.raises(ValueError):
        g.cov[0, 0] = 1.0


def test_a_callable_covariance_is_formed_and_checked_on_first_use(rng):
    eager = random_gaussian(rng, 4)
    calls = []
    lazy = Gaussian(eager.mean, lambda: calls.append(1) or eager.cov, eager.log_Z)
    assert lazy.dim == 4 and lazy.log_Z == eager.log_Z and not calls  # mean only: no cov
    x = rng.standard_normal((5, 4))
    np.testing.assert_allclose(lazy.logpdf(x), eager.logpdf(x), rtol=1e-12)
    np.testing.assert_array_equal(lazy.chol, eager.chol)
    assert len(calls) == 1  # formed once
    broken = Gaussian(np.zeros(2), lambda: -np.eye(2))
    with pytest.raises(NotPositiveDefiniteError, match="covariance"):
        broken.sample(3, random_state=0)


def test_a_callable_covariance_is_factorized_only_when_its_factor_is_needed(rng):
    eager = random_gaussian(rng, 4)
    form = lambda: np.array(eager.cov)  # noqa: E731
    lazy = Gaussian(eager.mean, form, eager.log_Z)
    assert lazy.pending_cov is form
    moved = lazy.with_log_Z(1.5)  # a copy: the covariance still to be formed, shared
    assert moved.pending_cov is form and moved.log_Z == 1.5 and lazy.log_Z == eager.log_Z
    np.testing.assert_array_equal(lazy.cov, eager.cov)
    assert lazy.pending_cov is None and lazy._chol is None  # read, not factorized
    np.testing.assert_array_equal(lazy.chol, eager.chol)  # factorized on first use
    # An indefinite one is refused where its factor is first needed.
    broken = Gaussian(np.zeros(2), lambda: np.array([[1.0, 2.0], [2.0, 1.0]]))
    np.testing.assert_array_equal(broken.var, [1.0, 1.0])
    with pytest.raises(NotPositiveDefiniteError, match="covariance"):
        broken.log_det_cov


def test_logpdf_matches_scipy(rng):
    g = random_gaussian(rng, 4, log_Z=2.5)
    x = rng.standard_normal((7, 4))
    expected = stats.multivariate_normal(g.mean, g.cov).logpdf(x)
    np.testing.assert_allclose(g.logpdf(x), expected, rtol=1e-12)
    np.testing.assert_allclose(g.log_density(x), expected + 2.5, rtol=1e-12)
    assert np.isclose(g.logpdf(x[0]), expected[0], rtol=1e-12)


def test_natural_parameters_round_trip(rng):
    g = random_gaussian(rng, 5, log_Z=-3.0)
    nat = g.natural_parameters()
    x = rng.standard_normal((6, 5))
    quad = nat.c + x @ nat.eta - 0.5 * np.einsum("ij,jk,ik->i", x, nat.precision, x)
    np.testing.assert_allclose(quad, g.log_density(x), rtol=1e-12)
    back = Gaussian.from_natural(*nat)
    np.testing.assert_allclose(back.mean, g.mean, atol=1e-12)
    np.testing.assert_allclose(back.cov, g.cov, atol=1e-12)
    assert math.isclose(back.log_Z, g.log_Z, abs_tol=1e-12)


def test_from_natural_rejects_non_integrable():
    with pytest.raises(NotPositiveDefiniteError, match="precision"):
        Gaussian.from_natural(np.diag([1.0, -0.1]), np.zeros(2), 0.0)


def _raw_moments(g):
    mass = math.exp(g.log_Z)
    return mass, mass * g.mean, mass * (g.cov + np.outer(g.mean, g.mean))


@pytest.mark.parametrize("diagonal", [False, True])
def test_natural_differential_is_derivative_of_inverse_moment_map(rng, diagonal):
    # Perturbing the natural parameters by the returned differential changes the raw
    # moments by the requested amount, to first order: it is the inverse Fisher information.
    d = 4
    g = random_gaussian(rng, d, log_Z=0.3, diagonal=diagonal)
    d_mass = rng.standard_normal()
    d_first = rng.standard_normal(d)
    sym = random_spd(rng, d) - np.eye(d)
    d_second = np.diag(np.diag(sym)) if diagonal else sym
    arg_second = np.diag(d_second) if diagonal else d_second
    mass = math.exp(g.log_Z)
    dnat = g.natural_differential(d_mass / mass, d_first / mass, arg_second / mass)
    nat = g.natural_parameters()
    d_prec = np.diag(dnat.precision) if diagonal else dnat.precision
    eps = 1e-5

    def moments_at(t):
        moved = Gaussian.from_natural(
            nat.precision + t * d_prec, nat.eta + t * dnat.eta, nat.c + t * dnat.c
        )
        return _raw_moments(moved)

    (m_hi, f_hi, s_hi), (m_lo, f_lo, s_lo) = moments_at(eps), moments_at(-eps)
    np.testing.assert_allclose((m_hi - m_lo) / (2 * eps), d_mass, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose((f_hi - f_lo) / (2 * eps), d_first, rtol=1e-6, atol=1e-8)
    change = (s_hi - s_lo) / (2 * eps)
    if diagonal:  # the diagonal family only has the squares as features
        change, d_second = np.diag(change), np.diag(d_second)
    np.testing.assert_allclose(change, d_second, rtol=1e-6, atol=1e-8)


def test_sample_moments_within_monte_carlo_error(rng):
    g = random_gaussian(rng, 3)
    n = 20000
    x = g.sample(n, random_state=1)
    # Each coordinate of the sample mean has sd sqrt(var/n): allow 5 sds.
    assert np.all(np.abs(x.mean(axis=0) - g.mean) < 5 * np.sqrt(np.diag(g.cov) / n))
    np.testing.assert_array_equal(x, g.sample(n, random_state=1))


def test_whiten_round_trip(rng):
    g = random_gaussian(rng, 3)
    x = rng.standard_normal((5, 3))
    np.testing.assert_allclose(g.unwhiten(g.whiten(x)), x, atol=1e-12)
    np.testing.assert_allclose(np.cov(g.whiten(g.sample(50000, 0)).T), np.eye(3), atol=0.03)


def test_kl_divergence_closed_form(rng):
    p, q = random_gaussian(rng, 3), random_gaussian(rng, 3)
    inv_q = np.linalg.inv(q.cov)  # fine in a test: an independent formula
    diff = q.mean - p.mean
    expected = 0.5 * (
        np.trace(inv_q @ p.cov)
        + diff @ inv_q @ diff
        - 3
        + np.linalg.slogdet(q.cov)[1]
        - np.linalg.slogdet(p.cov)[1]
    )
    assert math.isclose(kl_divergence(p, q), expected, rel_tol=1e-10)
    assert kl_divergence(p, p) == pytest.approx(0.0, abs=1e-12)


def test_excess_kl_is_the_generalized_kl_by_quadrature():
    # D(q*||q) = ∫ q* log(q*/q) - q* + q, divided by Z*, in one dimension.
    star = Gaussian([0.3], [[1.7]], log_Z=0.4)
    hat = Gaussian([-0.2], [[1.1]], log_Z=0.1)

    def integrand(x):
        a = star.log_density(np.array([[x]]))[0]
        b = hat.log_density(np.array([[x]]))[0]
        return math.exp(a) * (a - b) - math.exp(a) + math.exp(b)

    value, _ = integrate.quad(integrand, -30, 30, epsabs=1e-12)
    assert math.isclose(excess_kl(star, hat), value / math.exp(star.log_Z), rel_tol=1e-8)
    assert excess_kl(star, star) == pytest.approx(0.0, abs=1e-14)


def test_excess_kl_in_log_domain():
    a = Gaussian([0.0], [[1.0]], log_Z=5000.0)
    b = Gaussian([0.0], [[1.0]], log_Z=5000.0 + 1e-3)
    # r - 1 - log r for log r = 1e-3 is 5e-7 to first order.
    assert excess_kl(a, b) == pytest.approx(0.5e-6, rel=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert excess_kl(a, Gaussian([0.0], [[1.0]], log_Z=6000.0)) == math.inf
        assert math.isfinite(excess_kl(a, Gaussian([0.0], [[1.0]], log_Z=-5000.0)))


# --- thin QR (CholeskyQR2, Householder fallback) ----------------------------------------------


def _matrix_of_condition(rng, n, k, condition):
    """An n × k matrix with singular values log-spaced from 1 to 1/condition and random
    singular vectors (column scaling cannot improve it)."""
    left, _ = np.linalg.qr(rng.standard_normal((n, k)))
    right, _ = np.linalg.qr(rng.standard_normal((k, k)))
    return (left * np.logspace(0.0, -np.log10(condition), k)) @ right.T


def _householder_calls(monkeypatch):
    calls = []
    qr = np.linalg.qr
    monkeypatch.setattr(np.linalg, "qr", lambda a, *args: calls.append(a.shape) or qr(a, *args))
    return calls


# Round-off of a length-n inner product grows as √n u (u = 1.1e-16): ~6e-15 at n = 3000 for
# the orthogonality and the reconstruction, either method; 1e-12 leaves a factor ~150.
_QR_TOL = 1e-12


@pytest.mark.parametrize(
    "case, householder",
    [
        ("columns scaled 1 to 1e6", False),  # CholeskyQR2
        ("condition 1e10", False),  # shifted CholeskyQR3
        ("condition 1e18", True),
        ("a zero column", True),
    ],
)
def test_thin_qr_is_orthonormal_and_reconstructs(rng, monkeypatch, case, householder):
    from vsbayes._linalg import thin_qr

    n, k = 3000, 20
    if case == "columns scaled 1 to 1e6":  # well conditioned once equilibrated
        a = rng.standard_normal((n, k)) * np.logspace(0.0, 6.0, k)
    elif case.startswith("condition"):  # beyond CholeskyQR2's κ ≲ u^{-1/2}
        a = _matrix_of_condition(rng, n, k, float(case.split()[1]))
    else:
        a = rng.standard_normal((n, k))
        a[:, 3] = 0.0
    original = a.copy()
    calls = _householder_calls(monkeypatch)
    q, r = thin_qr(a)
    assert (len(calls) == 1) is householder
    np.testing.assert_array_equal(a, original)  # not overwritten unless asked
    assert q.shape == (n, k) and r.shape == (k, k)
    np.testing.assert_array_equal(r, np.triu(r))
    assert np.all(np.diagonal(r) >= 0.0)
    assert np.abs(q.T @ q - np.eye(k)).max() < _QR_TOL
    assert np.abs(q @ r - a).max() < _QR_TOL * np.abs(a).max()
    if case == "columns scaled 1 to 1e6":  # Householder's, its signs fixed, to round-off
        q_ref, r_ref = np.linalg.qr(a)
        signs = np.sign(np.diagonal(r_ref))
        np.testing.assert_allclose(q, q_ref * signs, rtol=0, atol=_QR_TOL)
        # R's entries relative to their column's norm (the columns span 1 to 1e6).
        column_norms = np.linalg.norm(a, axis=0)
        assert np.abs((r - r_ref * signs[:, None]) / column_norms).max() < _QR_TOL


def test_thin_qr_in_place_and_by_blocks_on_any_threads(rng, monkeypatch):
    from threadpoolctl import threadpool_limits

    import vsbayes._linalg as linalg

    a = rng.standard_normal((400, 6))
    q, r = linalg.thin_qr(a)
    b = a.copy()
    q_in_place, r_in_place = linalg.thin_qr(b, overwrite_a=True)
    assert np.shares_memory(q_in_place, b)
    np.testing.assert_array_equal(q_in_place, q)
    np.testing.assert_array_equal(r_in_place, r)
    # Blocks of 36-row work: 11 blocks, the same bits on one thread or two.
    monkeypatch.setattr(linalg, "_MIN_BLOCK_WORK", 36 * 36)
    results = []
    for threads in (1, 2):
        with threadpool_limits(threads):
            results.append(linalg.thin_qr(a))
    for one, two in zip(*results, strict=True):
        np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(results[0][0], q, rtol=0, atol=_QR_TOL)


@pytest.mark.parametrize("k, r, w", [(3, 2, 7), (10, 9, 4), (2, 5, 1)])
def test_class_congruence_is_the_contraction_on_both_class_indices(k, r, w):
    # out[k, i, l, j] = Σ_ab q[k, a] blocks[a, i, b, j] q[l, b], against einsum's own sum.
    from vsbayes._linalg import class_congruence

    rng = np.random.default_rng(k + r + w)
    q, blocks = rng.standard_normal((k, r)), rng.standard_normal((r, w, r, w))
    expected = np.einsum("ka,aibj,lb->kilj", q, blocks, q)
    np.testing.assert_allclose(class_congruence(q, blocks), expected, rtol=1e-12, atol=1e-12)
