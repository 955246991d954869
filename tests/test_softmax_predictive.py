"""The softmax predictive's rules sized by each row's latent spread: accuracy against
references on far more nodes, normalization, determinism."""

import itertools

import numpy as np
import pytest
from _helpers import count_replicate_rows
from scipy.special import expit, log_softmax

from vsbayes.models import logistic_normal as ln_module
from vsbayes.models import softmax_predictive as sp_module
from vsbayes.models import softmax_predictive_qmc as qmc_module
from vsbayes.models import softmax_predictive_rules as rules_module
from vsbayes.models.gumbel_orthant import gumbel_orthant_proba
from vsbayes.models.softmax_predictive import (
    OWN_DIRECTIONS_TRACE,
    TOLERANCE,
    centred_softmax_predictive_log_proba,
    softmax_predictive_log_proba,
)
from vsbayes.models.softmax_predictive_rules import (
    ANISOTROPIC_GRID_DIMS,
    ANISOTROPIC_GRID_ESTIMATE,
    ANISOTROPIC_GRID_MAX_TRACE,
    GAUSS_HERMITE_LEVELS,
    SPARSE_GRID_LEVELS,
    STROUD_MAX_TRACE,
    TRAPEZOID_LEVELS,
    anisotropic_grid_nodes,
    centred_basis,
    gauss_hermite_nodes,
    sparse_grid_nodes,
    stroud_nodes,
)
from vsbayes.sampling.rules import sobol_normal_points, symmetric_sobol_nodes

# The narrow rules' error, measured ≤ 0.02 · trace³ (Stroud, ≤ 1.1e-5 at its largest trace)
# and ≤ 2e-5 for the Gauss–Hermite levels at theirs; this bound has a margin over both.
NARROW_ERROR = 3e-5
# The sparse grids' error at their largest traces (degree 7 at t = 0.3, degree 9 at 0.6),
# measured ≤ 2.1e-5 on 600 such rows against 2^17-node references (99th percentile 4e-6);
# with a margin for the 2^15-node reference below (~2e-6 on these rows).
SPARSE_GRID_ERROR = 3e-5


def _rows(k, traces, seed):
    """Rows whose centred covariances have the given traces, half of them with two tied
    classes (where the softmax curves most), random shapes (eigenvalues spread)."""
    rng = np.random.default_rng([k, seed])
    n = len(traces)
    q = centred_basis(k)
    a = rng.standard_normal((n, k - 1, k - 1)) * rng.exponential(1.0, (n, 1, k - 1))
    reduced = a @ np.swapaxes(a, 1, 2)
    reduced *= (np.asarray(traces) / np.einsum("nii->n", reduced))[:, None, None]
    cov = q @ reduced @ q.T + 3.0 * np.ones((k, k))  # a common shift changes nothing
    mean = rng.standard_normal((n, k)) * rng.exponential(1.5, (n, 1))
    mean[::2, 1] = mean[::2, 0]
    return mean, cov


def _reference(mean, cov, z, w):
    """``Σ_j w_j softmax(m + factor z_j)`` row by row, float64."""
    k = mean.shape[1]
    q = centred_basis(k)
    out = []
    for m, c in zip(mean, cov, strict=True):
        factor = q @ np.linalg.cholesky(q.T @ c @ q)
        out.append(w @ np.exp(log_softmax(m + z @ factor.T, axis=1)))
    return np.array(out)


def _sobol_reference(mean, cov, n_nodes):
    z = symmetric_sobol_nodes(mean.shape[1] - 1, n_nodes, seed=12345)
    return _reference(mean, cov, z, np.full(len(z), 1.0 / len(z)))


def test_stroud_rule_is_exact_to_degree_five():
    for dim in (1, 3, 9):
        z, w = stroud_nodes(dim)
        assert len(z) == 2 * dim * dim + 1
        assert w.sum() == pytest.approx(1.0, abs=1e-14)
        expected = {0: 1.0, 2: 1.0, 4: 3.0}
        for powers in itertools.product(range(6), repeat=min(dim, 2)):
            if sum(powers) > 5:
                continue
            value = w @ np.prod(z[:, : len(powers)] ** np.array(powers), axis=1)
            odd = any(p % 2 for p in powers)
            truth = 0.0 if odd else np.prod([expected[p] for p in powers])
            assert value == pytest.approx(truth, abs=1e-12), powers


def _normal_moment(power: int) -> float:
    return 0.0 if power % 2 else float(np.prod(np.arange(power - 1, 0, -2)))


@pytest.mark.parametrize(("dim", "degree"), [(4, 7), (7, 7), (4, 9), (6, 9)])
def test_sparse_grid_is_exact_to_its_degree_and_no_further(dim, degree):
    z, w = sparse_grid_nodes(dim, degree)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    # Fully symmetric: the monomials in four coordinates cover every pattern of even
    # exponents up to degree 9 (the odd ones vanish by symmetry).
    for powers in itertools.product(range(degree + 1), repeat=4):
        if sum(powers) > degree:
            continue
        value = w @ np.prod(z[:, :4] ** np.array(powers), axis=1)
        truth = np.prod([_normal_moment(p) for p in powers])
        assert value == pytest.approx(truth, rel=1e-10, abs=1e-10), powers
    # A monomial of degree + 1 that the grid misses: x²y²z²w² (degree 7: no node has four
    # nonzero coordinates), x⁶y²z² (degree 9: x⁶ needs the 9-point rule's level, 3, and
    # y², z² a level each beyond the largest sum, 4).
    powers = np.array([2, 2, 2, 2] if degree == 7 else [6, 2, 2])
    value = w @ np.prod(z[:, : len(powers)] ** powers, axis=1)
    truth = np.prod([_normal_moment(p) for p in powers])
    assert abs(value - truth) > 0.1


def test_degree_five_sparse_grid_is_strouds_rule():
    for dim in (4, 9):
        grid = np.column_stack(sparse_grid_nodes(dim, 5))
        stroud = np.column_stack(stroud_nodes(dim))
        stroud = stroud[stroud[:, -1] != 0]  # its axes' weight is 0 in four dimensions
        rows = [m[np.lexsort(np.round(m, 12).T)] for m in (grid, stroud)]
        np.testing.assert_allclose(rows[0], rows[1], atol=1e-12)


@pytest.mark.parametrize("k", [5, 8, 12])
def test_rows_just_wider_take_the_sparse_grids_within_their_bound(k, monkeypatch):
    covered = [widest for _, widest, dim in SPARSE_GRID_LEVELS if k - 1 <= dim]
    traces = np.linspace(STROUD_MAX_TRACE * 1.01, 0.99 * max(covered), 6)
    mean, cov = _rows(k, traces, seed=4)
    rows_per_level = count_replicate_rows(monkeypatch)
    log_p = softmax_predictive_log_proba(mean, cov)
    assert rows_per_level == []  # no row left for the adaptive rule
    reference = _sobol_reference(mean, cov, 2**15)
    np.testing.assert_allclose(np.exp(log_p), reference, atol=SPARSE_GRID_ERROR)


def test_anisotropic_grid_is_exact_to_its_degrees():
    dim = 13
    z, w, embedded = anisotropic_grid_nodes(dim)
    assert w.sum() == pytest.approx(1.0, abs=1e-10)
    assert embedded.sum() == pytest.approx(1.0, abs=1e-10)

    def error(weights, powers):  # powers: {axis: exponent}
        value = weights @ np.prod([z[:, a] ** p for a, p in powers.items()], axis=0)
        return abs(value - np.prod([_normal_moment(p) for p in powers.values()]))

    # The grid: degree 7 among the three leading coordinates, degree 5 (every product of
    # two squares) in all; odd monomials vanish by symmetry.
    exact = [{0: 6}, {0: 4, 1: 2}, {0: 2, 1: 2, 2: 2}, {5: 4}, {4: 2, 9: 2}, {1: 2, 12: 2}]
    exact += [{0: 3, 1: 1}, {3: 1, 4: 3}, {0: 5, 2: 1}]
    for powers in exact:
        assert error(w, powers) < 1e-9, powers
    # Not beyond: three squares unless all three lead, a sixth power outside them.
    for powers in ({0: 2, 3: 2, 4: 2}, {0: 2, 1: 2, 3: 2}, {5: 6}):
        assert error(w, powers) > 0.1, powers
    # The embedded rule: degree 5 among the leading ones, 3 in all, and not the products
    # of two squares outside them (what makes it differ from the grid on a row).
    for powers in ({0: 4}, {0: 2, 1: 2}, {3: 2}, {0: 2, 3: 1, 4: 1}):
        assert error(embedded, powers) < 1e-9, powers
    for powers in ({3: 2, 4: 2}, {0: 6}):
        assert error(embedded, powers) > 0.1, powers


def test_curvature_rotation_keeps_each_rows_gaussian():
    mean, cov = _rows(16, np.linspace(0.2, 1.5, 5), seed=2)
    q = centred_basis(16)
    factor = q @ np.linalg.cholesky(q.T @ cov @ q)
    centred = mean - mean.mean(axis=1, keepdims=True)
    turned = rules_module._curvature_rotation(factor, centred)
    # Only the basis of z turns: the latent covariance stays.
    np.testing.assert_allclose(
        turned @ np.swapaxes(turned, 1, 2), factor @ np.swapaxes(factor, 1, 2), atol=1e-12
    )
    # The first direction bends the probabilities most: the softmax's Hessian at the mean.
    p = np.exp(centred - centred.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    hessian = np.einsum("nk,kl->nkl", p, np.eye(16)) - p[:, :, None] * p[:, None, :]
    curvature = np.einsum("nka,nkl,nla->na", turned, hessian, turned)
    assert (np.diff(curvature, axis=1) <= 1e-12).all()


@pytest.mark.parametrize("k", [ANISOTROPIC_GRID_DIMS[0] + 1, ANISOTROPIC_GRID_DIMS[1] + 1])
def test_many_class_rows_keep_the_anisotropic_grid_only_within_its_estimate(k, monkeypatch):
    traces = np.linspace(STROUD_MAX_TRACE * 1.01, 0.99 * ANISOTROPIC_GRID_MAX_TRACE, 12)
    mean, cov = _rows(k, traces, seed=5)
    q = centred_basis(k)
    factor = q @ np.linalg.cholesky(q.T @ cov @ q)
    centred = mean - mean.mean(axis=1, keepdims=True)
    z, w, embedded = anisotropic_grid_nodes(k - 1)
    logs, estimated = rules_module._rule_log_average(
        rules_module._curvature_rotation(factor, centred), centred, z, w, 1e8, embedded=embedded
    )
    reference = _sobol_reference(mean, cov, 2**15)
    # The estimate (the embedded rule's difference) bounds the grid's error: measured 4 to
    # 25 times it (D-204); 2e-6 allows for the 2^15-node reference's own error.
    assert (np.abs(np.exp(logs) - reference).max(axis=1) <= estimated + 2e-6).all()
    kept = estimated <= ANISOTROPIC_GRID_ESTIMATE
    assert kept.sum() >= 6  # most of these rows keep it
    rows_per_level = count_replicate_rows(monkeypatch)
    log_p = softmax_predictive_log_proba(mean, cov)
    assert rows_per_level[:1] == ([(~kept).sum()] if (~kept).any() else [])
    # The rows kept have the grid's values (normalized), the others the adaptive rule's.
    normalized = logs - np.log(np.exp(logs).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(log_p[kept], normalized[kept], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(np.exp(log_p), reference, atol=SPARSE_GRID_ERROR)


def test_anisotropic_grid_estimate_bounds_the_error_up_to_its_threshold():
    # Rows near the grid's largest trace, whose estimates reach past the threshold: the
    # estimate bounds the error there too (measured ≤ 0.08 of it above 2e-5, D-226), so
    # the rows kept err by less than the threshold; 2e-6 allows for the reference's error.
    mean, cov = _rows(14, np.linspace(1.0, 0.99 * ANISOTROPIC_GRID_MAX_TRACE, 16), seed=7)
    q = centred_basis(14)
    factor = q @ np.linalg.cholesky(q.T @ cov @ q)
    centred = mean - mean.mean(axis=1, keepdims=True)
    z, w, embedded = anisotropic_grid_nodes(13)
    logs, estimated = rules_module._rule_log_average(
        rules_module._curvature_rotation(factor, centred), centred, z, w, 1e8, embedded=embedded
    )
    assert ((estimated > 2e-5) & (estimated <= ANISOTROPIC_GRID_ESTIMATE)).sum() >= 3
    reference = _sobol_reference(mean, cov, 2**15)
    assert (np.abs(np.exp(logs) - reference).max(axis=1) <= estimated + 2e-6).all()
    kept = estimated <= ANISOTROPIC_GRID_ESTIMATE
    log_p = softmax_predictive_log_proba(mean[kept], cov[kept])
    assert np.abs(np.exp(log_p) - reference[kept]).max() <= ANISOTROPIC_GRID_ESTIMATE + 2e-6


@pytest.mark.parametrize("k", [4, 10])
def test_narrow_rows_take_the_degree_five_rule_within_its_bound(k):
    mean, cov = _rows(k, np.linspace(0.005, STROUD_MAX_TRACE, 8), seed=0)
    log_p = softmax_predictive_log_proba(mean, cov)
    reference = _sobol_reference(mean, cov, 2**14)  # smooth integrand: error ≪ 1e-6
    np.testing.assert_allclose(np.exp(log_p), reference, atol=NARROW_ERROR)


def test_four_classes_just_wider_take_gauss_hermite_within_its_bound():
    traces = np.concatenate(
        [np.linspace(STROUD_MAX_TRACE * 1.01, level, 4) for _, level in GAUSS_HERMITE_LEVELS]
    )
    mean, cov = _rows(4, traces, seed=1)
    log_p = softmax_predictive_log_proba(mean, cov)
    reference = _reference(mean, cov, *gauss_hermite_nodes(3, 30))
    np.testing.assert_allclose(np.exp(log_p), reference, atol=NARROW_ERROR)


def test_three_classes_keep_the_trapezoids_accuracy():
    # Largest variances from 0.05 to 40: the narrower rows take fewer trapezoid nodes, at
    # the full rule's accuracy (1e-10 up to 3; its own ~1e-5 near 40).
    rng = np.random.default_rng(3)
    q = centred_basis(3)
    largest = np.array([0.05, 0.3, 0.9, 2.5, 8.0, 39.0])
    a = rng.standard_normal((6, 2, 2))
    reduced = a @ np.swapaxes(a, 1, 2)
    reduced *= (largest / np.linalg.eigvalsh(reduced)[:, -1])[:, None, None]
    cov = q @ reduced @ q.T
    mean = 2.0 * rng.standard_normal((6, 3))
    log_p = softmax_predictive_log_proba(mean, cov)
    t = np.linspace(-9.0, 9.0, 401)
    w1 = np.exp(-0.5 * t * t)
    z = np.stack([g.ravel() for g in np.meshgrid(t, t, indexing="ij")], axis=1)
    w = np.outer(w1, w1).ravel()
    reference = _reference(mean, cov, z, w / w.sum())
    error = np.abs(np.exp(log_p) - reference).max(axis=1)
    assert (error[:4] < 1e-10).all(), error
    assert (error < 2e-5).all(), error
    assert TRAPEZOID_LEVELS[-1][1] == 40.0


@pytest.mark.parametrize("per_axis", [row[0] for row in TRAPEZOID_LEVELS])
def test_three_class_trapezoids_linear_sums_are_its_log_sums(per_axis):
    # The trapezoid's weights are positive: the linear-domain sums equal the log sums to
    # round-off, on ordinary rows, on rows with a class 700 to 2000 nats down (the log
    # sums' rows) and on rows beyond the unshifted exponentials' reach.
    rng = np.random.default_rng(5)
    q = centred_basis(3)
    mean = 2.0 * rng.standard_normal((9, 3))
    mean[3:6, 2] -= [700.0, 1000.0, 2000.0]
    mean[6:] *= 400.0
    a = rng.standard_normal((9, 2, 2))
    root = np.linalg.cholesky(a @ np.swapaxes(a, 1, 2) + 0.1 * np.eye(2))
    factor, centred = q @ root, mean - mean.mean(axis=1, keepdims=True)
    z, log_w = rules_module.trapezoid_nodes(2, per_axis**2)
    w = rules_module.trapezoid_weights(2, per_axis**2)
    linear = rules_module._rule_log_average(factor, centred, z, w, 1e8)
    logs = rules_module._log_average(factor, centred, z, log_w, 1e8)
    assert np.isfinite(linear).all()
    # (log values up to ~3000 in size: round-off relative to each)
    np.testing.assert_allclose(linear, logs, rtol=1e-13, atol=1e-12)


def test_wide_ten_class_rows_meet_the_adaptive_tolerance():
    mean, cov = _rows(10, [5.0, 40.0], seed=2)
    log_p = softmax_predictive_log_proba(mean, cov)
    reference = _sobol_reference(mean, cov, 2**17)
    # Three estimated standard errors below TOLERANCE (with high probability), and the
    # reference's own QMC error (~1e-4 on such rows).
    np.testing.assert_allclose(np.exp(log_p), reference, atol=TOLERANCE + 3e-4)


def test_gumbel_orthant_rule_is_unbiased_within_its_stated_error():
    # softmax_k(f) = P(argmax(f + G) = k) for Gumbel G: given G, an orthant probability of
    # the Gaussian differences, so the rule has no error but its nodes'. Three classes up to
    # λ = 39, where the trapezoid rule is exact to ~1e-5 (the test above); four classes
    # against a 30³ Gauss–Hermite rule (exact to ~1e-5 at trace 2), narrow enough that the
    # Gumbel coordinates' steps show; ten wide classes against the QMC rule (its ``tol``).
    rng = np.random.default_rng(5)
    q = centred_basis(3)
    a = rng.standard_normal((4, 2, 2))
    reduced = a @ np.swapaxes(a, 1, 2)
    reduced *= (np.array([0.5, 4.0, 15.0, 39.0]) / np.linalg.eigvalsh(reduced)[:, -1])[
        :, None, None
    ]
    mean3, cov3 = 2.0 * rng.standard_normal((4, 3)), q @ reduced @ q.T
    mean4, cov4 = _rows(4, [1.0, 2.0], seed=4)
    mean10, cov10 = _rows(10, [40.0, 400.0], seed=6)
    # Wide in every direction as the digits rows are (centred eigenvalues ≥ 4 there): a
    # difference f_k − f_j of small variance makes the Gumbel coordinates' integrand a
    # step, and the rule needs more nodes.
    cov10 += 5.0 * (np.eye(10) - 0.1)
    cases = [
        (mean3, cov3, np.exp(softmax_predictive_log_proba(mean3, cov3)), 2e-5),
        (mean4, cov4, _reference(mean4, cov4, *gauss_hermite_nodes(3, 30)), NARROW_ERROR),
        (mean10, cov10, np.exp(softmax_predictive_log_proba(mean10, cov10)), TOLERANCE),
    ]
    for mean, cov, reference, reference_error in cases:
        proba, error, nodes = gumbel_orthant_proba(mean, cov, levels=2)
        assert (nodes == 16384).all()
        np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
        assert (np.abs(proba - reference).max(axis=1) <= error + reference_error).all()
    # Below ORTHANT_BELOW the wide rows whose own-direction average (D-268) is still above
    # tol at its last level take it, refined until their estimated error is below tol (or
    # they reach its last level): the same values on the nodes they took.
    mean, cov = _rows(4, [5.0, 20.0, 300.0, 3000.0], seed=7)
    cov += 2.0 * (np.eye(4) - 0.25)
    log_p = softmax_predictive_log_proba(mean, cov, tol=1e-5)
    q = centred_basis(4)
    root = np.linalg.cholesky(q.T @ cov @ q)
    centred = mean - mean.mean(axis=1, keepdims=True)
    own, estimated = qmc_module._adaptive_average(
        q @ root, root, centred, 1e-5, 2**24, own_directions=True
    )
    proba, error, nodes = gumbel_orthant_proba(mean, cov, tol=1e-5)
    rest = estimated > 1e-5
    assert rest.any() and not rest.all()
    np.testing.assert_allclose(np.exp(log_p[rest]), proba[rest], atol=1e-12)
    np.testing.assert_allclose(
        np.exp(log_p[~rest]), own[~rest] / own[~rest].sum(axis=1, keepdims=True), atol=1e-12
    )
    assert (nodes > 4096).any()


def test_logistic_normal_table_within_its_error():
    # E[σ(a + s Z)] against trapezoid sums on 4001 normal nodes, from the logistic alone
    # (s = 0) to wider than the table (s = 100, which takes s = 60's row); float64 and the
    # rule's float32 evaluation.
    z = np.linspace(-10.0, 10.0, 4001)
    w = np.exp(-0.5 * z * z)
    w /= w.sum()
    a = np.linspace(-60.0, 60.0, 241)
    for s in (0.0, 0.3, 1.0, 2.5, 7.0, 20.0, 60.0, 100.0):
        exact = expit(a[:, None] + s * z) @ w
        np.testing.assert_allclose(ln_module.logistic_normal_mean(a, s * s), exact, atol=1e-5)
        total = s * s + ln_module._LOGISTIC_VARIANCE
        single = ln_module._logistic_normal_at(
            a[None].astype(np.float32),
            np.array([total**-0.5], np.float32),
            ln_module._table_coefficients(np.array([ln_module._LOGISTIC_VARIANCE / total])).astype(
                np.float32
            ),
        )[0]
        np.testing.assert_allclose(single, exact, atol=1.2e-5)


def test_leader_conditioning_is_unbiased_and_spreads_less_on_wide_rows():
    # Ten classes, every direction wide (centred covariances near 50·I, as on digits): the
    # softmax conditioned on the leading class's direction and the softmax's own average on
    # the same nodes agree within their standard errors (both unbiased, up to the table's
    # 1e-5), the leading class's conditioned replicates spread less (its step across its
    # own direction is integrated exactly), and the conditioned values sum to 1.
    rng = np.random.default_rng(9)
    k, n = 10, 4
    a = rng.standard_normal((n, k - 1, k - 1))
    reduced = 50.0 * (np.eye(k - 1) + 0.05 * a @ np.swapaxes(a, 1, 2))
    root = np.linalg.cholesky(reduced)
    q = centred_basis(k)
    mean = rng.standard_normal((n, k))
    mean[:, 1] = mean[:, 0] - 0.5
    centred = mean - mean.mean(axis=1, keepdims=True)
    lead = qmc_module._leader_conditioning(root, centred)
    half = rules_module.replicate_nodes(k - 1, 1)
    conditioned = qmc_module._replicate_averages(
        *(x.astype(np.float32) for x in (q @ root, centred)),
        (lead[0], *(x.astype(np.float32) for x in lead[1:])),
        half,
        2**24,
    )
    plain = np.empty_like(conditioned)
    for r in range(rules_module.REPLICATES):
        z = half[:, r].T.astype(float)
        z = np.vstack([z, -z])
        plain[:, r] = _reference(mean, q @ reduced @ q.T, z, np.full(len(z), 1.0 / len(z)))
    spread, plain_spread = conditioned.std(axis=1, ddof=1), plain.std(axis=1, ddof=1)
    leader = np.arange(n), lead[0]
    assert (spread[leader] < 0.5 * plain_spread[leader]).all()  # 4 to 10 times less here
    standard_error = np.hypot(conditioned.std(axis=1, ddof=1), plain.std(axis=1, ddof=1))
    gap = np.abs(conditioned.mean(axis=1) - plain.mean(axis=1))
    assert (gap < 4 * standard_error / np.sqrt(rules_module.REPLICATES) + 2e-5).all()
    np.testing.assert_allclose(conditioned.sum(axis=2), 1.0, atol=1e-5)


def _wide_ten_class_rows(n, seed):
    """Ten-class rows wide in every direction, as digits' are (centred covariances near
    50·I), the first two classes near a tie: their Cholesky factors and centred means."""
    rng = np.random.default_rng(seed)
    k = 10
    a = rng.standard_normal((n, k - 1, k - 1))
    root = np.linalg.cholesky(50.0 * (np.eye(k - 1) + 0.05 * a @ np.swapaxes(a, 1, 2)))
    mean = 2.0 * rng.standard_normal((n, k))
    mean[:, 1] = mean[:, 0] - 0.5
    return root, mean - mean.mean(axis=1, keepdims=True)


def test_own_direction_conditioning_is_unbiased_and_beats_the_leaders_on_wide_rows():
    # Every class conditioned on its own direction (D-268): unbiased for the same integral
    # (against the Gumbel–orthant rule within the two rules' standard errors and the
    # table's 1e-5), and on wide rows its replicates spread far less than the leader's
    # integrand's on the same nodes, over the classes (the leader's removes the steps of
    # the leading class's boundaries only: 3 to 5 times more spread here).
    k, n = 10, 3
    root, centred = _wide_ten_class_rows(n, seed=11)
    q = centred_basis(k)
    factor, centred32 = (q @ root).astype(np.float32), centred.astype(np.float32)
    half = rules_module.replicate_nodes(k - 1, 1)
    own_directions = qmc_module._own_conditioning(root)
    own = qmc_module._replicate_averages(
        factor,
        centred32,
        qmc_module._OwnDirections(*(x.astype(np.float32) for x in own_directions)),
        half,
        2**24,
    )
    lead = qmc_module._leader_conditioning(root, centred)
    leader = qmc_module._replicate_averages(
        factor, centred32, (lead[0], *(x.astype(np.float32) for x in lead[1:])), half, 2**24
    )
    spread = own.std(axis=1, ddof=1).max(axis=1)
    assert (spread < 0.5 * leader.std(axis=1, ddof=1).max(axis=1)).all()
    reference, reference_error, _ = gumbel_orthant_proba(
        centred, q @ (root @ np.swapaxes(root, 1, 2)) @ q.T, levels=2
    )
    standard_error = 3.0 * spread / np.sqrt(rules_module.REPLICATES)
    gap = np.abs(own.mean(axis=1) - reference).max(axis=1)
    assert (gap < standard_error + reference_error + 2e-5).all()
    # Their sum is 1 within its own standard error (and the table's error per class).
    sums = own.sum(axis=2)
    sum_error = 4.0 * sums.std(axis=1, ddof=1) / np.sqrt(rules_module.REPLICATES) + k * 1e-5
    assert (np.abs(sums.mean(axis=1) - 1.0) <= sum_error).all()


def test_own_direction_averages_keep_tied_top_classes():
    # Two classes with the same latent values at every node tie for the largest at every
    # node where they lead: each one's others include the other's term (a node where they
    # lead gives each about 1/2), as after breaking the tie by 1e-4.
    k = 5
    root = np.linalg.cholesky(20.0 * np.eye(k - 1) + 2.0)[None]
    factor = (centred_basis(k) @ root)[0]
    factor[1] = factor[0]
    centred = np.array([[1.0, 1.0, -1.0, 0.5, -1.5]])
    own = qmc_module._OwnDirections(
        *(x.astype(np.float32) for x in qmc_module._own_conditioning(root))
    )
    half = rules_module.replicate_nodes(k - 1, 0)
    tied = qmc_module._replicate_averages(
        factor[None].astype(np.float32), centred.astype(np.float32), own, half, 2**24
    )
    broken = centred.copy()
    broken[0, 1] -= 1e-4
    apart = qmc_module._replicate_averages(
        factor[None].astype(np.float32), broken.astype(np.float32), own, half, 2**24
    )
    assert np.isfinite(tied).all()
    np.testing.assert_allclose(tied, apart, atol=1e-4)


def test_below_the_default_tol_wide_rows_condition_every_class_on_its_own_direction(
    monkeypatch,
):
    # Below TOLERANCE the wide rows (centred trace above OWN_DIRECTIONS_TRACE) take the
    # own-direction average, refined until three standard errors are below tol, normalized;
    # within tol of the Gumbel–orthant reference (its own error added), the same bits on a
    # second call; the narrower rows that the QMC rule takes, and every row at the default
    # tol, keep the leader's direction.
    k, n = 10, 3
    root, centred = _wide_ten_class_rows(n, seed=12)
    q = centred_basis(k)
    reduced = root @ np.swapaxes(root, 1, 2)
    tol = 3e-4
    log_p = centred_softmax_predictive_log_proba(centred, reduced, tol=tol)
    own, estimated = qmc_module._adaptive_average(
        q @ root, root, centred, tol, 2**24, own_directions=True
    )
    np.testing.assert_allclose(np.exp(log_p), own / own.sum(axis=1, keepdims=True), atol=1e-12)
    assert (estimated <= tol).all()
    reference, reference_error, _ = gumbel_orthant_proba(centred, q @ reduced @ q.T, levels=3)
    assert (np.abs(np.exp(log_p) - reference).max(axis=1) <= tol + reference_error).all()
    np.testing.assert_array_equal(
        centred_softmax_predictive_log_proba(centred, reduced, tol=tol), log_p
    )
    calls = []
    kernel = qmc_module._own_direction_averages
    monkeypatch.setattr(
        qmc_module,
        "_own_direction_averages",
        lambda factor, *args: calls.append(len(factor)) or kernel(factor, *args),
    )
    centred_softmax_predictive_log_proba(centred, reduced)
    assert not calls
    # Traces 1 to 4 (below OWN_DIRECTIONS_TRACE) take the QMC rule, with the leader.
    narrow = reduced * (np.array([1.0, 2.0, 4.0]) / np.einsum("nii->n", reduced))[:, None, None]
    centred_softmax_predictive_log_proba(centred, narrow, tol=tol)
    assert not calls
    centred_softmax_predictive_log_proba(centred, reduced, tol=tol)
    assert calls and set(calls) <= {n}


def test_own_directions_keep_the_log_of_a_class_far_behind():
    # The own-direction averages are the logistic-normal table's, accurate to ~1e-5
    # absolute only: a class far behind read the table's floor (e^-18 for e^-197 on four
    # classes, D-277). Below OWN_DIRECTIONS_FLOOR they take log sums on the first level's
    # nodes, as the leader's direction's do at the default tol (the same values here;
    # within 2.3 of a 2·10⁶-draw log-domain reference on such rows).
    k = 4
    a = np.random.default_rng(4).standard_normal((k, k))
    cov = a @ a.T
    q = centred_basis(k)
    for gap in (40.0, 200.0):
        mean = np.zeros((1, k))
        mean[0, 0] = gap
        reduced = (q.T @ cov @ q)[None]
        assert np.trace(reduced[0]) > OWN_DIRECTIONS_TRACE
        leader = centred_softmax_predictive_log_proba(mean, reduced)
        own = centred_softmax_predictive_log_proba(mean, reduced, tol=3e-4)
        assert (leader[0, 1:] < -gap + 10).all()
        np.testing.assert_allclose(own, leader, atol=1.5)


def test_refinement_levels_are_nested_and_pooled_as_one_rule():
    # Level 0: each replicate's whitened set; from level 1 on, the first points of the
    # replicate's Sobol sequence (and their mirror images), each level adding the next ones
    # and doubling the nodes. The rows refined to the last level get the plain average over
    # levels 1 to the last, not over the last level's nodes alone.
    dim, half = 9, rules_module._FIRST_NODES // 2
    levels = [rules_module.replicate_nodes(dim, level) for level in range(rules_module._LEVELS)]
    pooled = np.cumsum([level.shape[2] for level in levels[1:]])
    np.testing.assert_array_equal(pooled, 4 * half * 2 ** np.arange(rules_module._LEVELS - 1))
    for r in (0, rules_module.REPLICATES - 1):
        seed = (rules_module._SEED, 0, r)
        np.testing.assert_array_equal(
            levels[0][:, r].T, symmetric_sobol_nodes(dim, 2 * half, seed)[:half].astype(np.float32)
        )
        sequence = sobol_normal_points(dim, 4 * half * 2 ** (rules_module._LEVELS - 2), seed)
        np.testing.assert_array_equal(
            np.hstack([level[:, r] for level in levels[1:]]).T, sequence.astype(np.float32)
        )
    mean, cov = _rows(10, [30.0, 300.0], seed=7)
    q = centred_basis(10)
    root = np.linalg.cholesky(q.T @ cov @ q)
    centred = mean - mean.mean(axis=1, keepdims=True)
    # Every row to the last level (a tol that small takes another rule through the public
    # functions).
    average = qmc_module._adaptive_average(q @ root, root, centred, 1e-12, 2**24)[0]
    lead = qmc_module._leader_conditioning(root, centred)
    union = qmc_module._replicate_averages(
        *(x.astype(np.float32) for x in (q @ root, centred)),
        (lead[0], *(x.astype(np.float32) for x in lead[1:])),
        np.dstack(levels[1:]),
        2**24,
    )
    np.testing.assert_allclose(average, union.mean(axis=1), rtol=1e-6, atol=1e-9)


def test_replicate_averages_do_not_depend_on_the_chunks(monkeypatch):
    # The kernel takes a row's nodes in chunks and adds each replicate's float32 chunk sums
    # up in float64: chunks of 16 nodes a replicate (64 chunks) give the one-chunk values
    # to float32's rounding of sums of ≤ 2048 terms in [0, 1] (pairwise: a few 1e-7), for
    # every class (the leader, put last inside the kernel, back in its place).
    rng = np.random.default_rng(5)
    k, n = 7, 5
    a = rng.standard_normal((n, k - 1, k - 1))
    root = np.linalg.cholesky(20.0 * (np.eye(k - 1) + 0.1 * a @ np.swapaxes(a, 1, 2)))
    centred = rng.standard_normal((n, k))
    centred -= centred.mean(axis=1, keepdims=True)
    lead = qmc_module._leader_conditioning(root, centred)
    args = (
        *(x.astype(np.float32) for x in (centred_basis(k) @ root, centred)),
        (lead[0], *(x.astype(np.float32) for x in lead[1:])),
        rules_module.replicate_nodes(k - 1, 1),
        2**24,
    )
    whole = qmc_module._replicate_averages(*args)
    monkeypatch.setattr(qmc_module, "_CHUNK_ENTRIES", (k + 1) * rules_module.REPLICATES * 32)
    chunked = qmc_module._replicate_averages(*args)
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-6)
    np.testing.assert_allclose(whole.sum(axis=2), 1.0, atol=1e-5)


@pytest.mark.parametrize("k", [3, 4, 10, 16])
def test_probabilities_sum_to_one_and_repeat_exactly(k):
    mean, cov = _rows(k, np.geomspace(1e-4, 30.0, 12), seed=4)
    log_p = softmax_predictive_log_proba(mean, cov)
    np.testing.assert_allclose(np.exp(log_p).sum(axis=1), 1.0, rtol=1e-13)
    np.testing.assert_array_equal(softmax_predictive_log_proba(mean, cov), log_p)
    # Any block size gives the same values (to round-off: other GEMM shapes).
    small = softmax_predictive_log_proba(mean, cov, max_bytes=1.0)
    np.testing.assert_allclose(small, log_p, rtol=1e-12, atol=1e-12)
    # A row alone gets the value it gets among others: the rules are chosen row by row.
    np.testing.assert_allclose(
        softmax_predictive_log_proba(mean[3:4], cov[3:4]), log_p[3:4], rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("k", [3, 5])
def test_rows_of_huge_scale_take_the_limit_and_overflow_is_named(k):
    # Scaling a row's latent mean by s and covariance by s² converges to a limit as s
    # grows (the softmax's unit width vanishes beside them); at s = 1e20 and 1e40 (features
    # ~1e35 gave NaN) the predictive is that limit, as at s = 1e14 within the rule's error.
    mean, cov = _rows(k, [0.5, 5.0], seed=7)
    limit = np.exp(softmax_predictive_log_proba(1e14 * mean, 1e28 * cov))
    for scale in (1e20, 1e40):
        far = np.exp(softmax_predictive_log_proba(scale * mean, scale**2 * cov))
        np.testing.assert_allclose(far, limit, atol=TOLERANCE)
    overflowed = np.full((len(mean), k - 1, k - 1), np.inf)  # (latents of features ~1e160)
    with pytest.raises(ValueError, match=r"overflow float64.*Rescale X"):
        centred_softmax_predictive_log_proba(mean, overflowed)


def test_tiny_probabilities_of_the_narrow_rule_stay_finite():
    # A class 700 nats below the others underflows float64's linear sums: log sums.
    k = 6
    mean = np.zeros((2, k))
    mean[0, -1] = -700.0
    cov = np.broadcast_to(0.001 * np.eye(k), (2, k, k))
    log_p = softmax_predictive_log_proba(mean, cov)
    assert np.isfinite(log_p).all()
    assert log_p[0, -1] == pytest.approx(-700.0 - np.log(k - 1), abs=0.01)
    np.testing.assert_allclose(np.exp(log_p[1]), 1.0 / k, atol=1e-9)


def test_a_signed_rule_marks_the_rows_it_cannot_take():
    # Weights 2 and -1 on two nodes: a class more likely at the second node gets a negative
    # "average"; its row is NaN (handed on to the next rule), the other row is kept.
    z = np.array([[0.0], [1.0]])
    w = np.array([2.0, -1.0])
    factor = np.array([[[0.0], [0.0]], [[-10.0], [10.0]]])
    centred = np.array([[0.0, 0.0], [5.0, -5.0]])
    logs = rules_module._rule_log_average(factor, centred, z, w, 1e6)
    np.testing.assert_allclose(np.exp(logs[0]), 0.5, rtol=1e-14)
    assert np.isnan(logs[1]).all()


@pytest.mark.parametrize("k", [3, 4])
def test_observed_class_log_predictive_matches_the_full_rule(k):
    # One class's log predictive on the rule sized by each row's widest direction: within
    # its stated 1e-4 nats of every class's rule (1e-10) on rows of random shape, widths
    # across the levels (λ up to 30: the widest go to the full rule), means up to 3 sd and
    # random classes (improbable ones the hardest); four classes: the full rule's value (that
    # rule twice on 300 four-class rows was 1 s of the suite; 60 rows still span the widths,
    # means and labels).
    rng = np.random.default_rng(3)
    n = 300 if k == 3 else 60
    a = rng.standard_normal((n, k, k))
    cov = a @ np.swapaxes(a, 1, 2)
    q = rules_module.centred_basis(k)
    widest = np.linalg.eigvalsh(q.T @ cov @ q)[:, -1]
    cov *= (rng.uniform(0.05, 30.0, n) / widest)[:, None, None]
    mean = rng.standard_normal((n, k)) * rng.choice([0.0, 1.0, 3.0], size=(n, 1))
    label = rng.integers(0, k, n)
    got = sp_module.observed_class_log_predictive(mean, cov, label)
    full = sp_module.softmax_predictive_log_proba(mean, cov)[np.arange(n), label]
    if k == 3:
        np.testing.assert_allclose(got, full, rtol=0, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, full)


def _near_tie_rows(k, seed):
    """Wide rows (traces 20 to 2000, as on digits): the first 8 with classes 0 and 1
    exchangeable and leading (their predictive probabilities tie exactly), the next 4
    the same but for a mean 0.01 apart (a lead of the order of the rule's error), the
    others of random shape."""
    mean, cov = _rows(k, np.geomspace(20.0, 2000.0, 24), seed)
    swap = np.arange(k)
    swap[:2] = 1, 0
    cov[:12] = 0.5 * (cov[:12] + cov[:12][:, swap][:, :, swap])
    top = mean.max(axis=1) + 1.0
    mean[:12, 0], mean[:12, 1] = top[:12], top[:12]
    mean[8:12, 1] -= 0.01
    return mean, cov


@pytest.mark.parametrize("k", [4, 10])
def test_argmax_only_refines_only_unsettled_rows_and_keeps_the_argmax(k, monkeypatch):
    # Wide rows take the adaptive rule; with argmax_only a row stops on the screen or at
    # the first level where its leader leads by DECISION_MARGIN estimated errors (and
    # DECISION_MARGIN · TOLERANCE). The guarantee: the
    # argmax is the full values' wherever their lead exceeds twice the full rule's error
    # bound ε (≤ TOLERANCE where it converged). Rows not settled get the full values.
    rows_per_level = count_replicate_rows(monkeypatch)
    mean, cov = _near_tie_rows(k, seed=11)
    q = centred_basis(k)
    reduced = q.T @ cov @ q
    full = np.exp(centred_softmax_predictive_log_proba(mean, reduced))
    rows_per_level.clear()
    fast = np.exp(centred_softmax_predictive_log_proba(mean, reduced, argmax_only=True))
    n = len(mean)
    # Every row takes the screen; only a strict subset goes on (the near ties).
    assert rows_per_level[0] == n
    assert 0 < rows_per_level[1] < n
    root = np.linalg.cholesky(reduced)
    centred = mean - mean.mean(axis=1, keepdims=True)
    bound = qmc_module._adaptive_average(q @ root, root, centred, TOLERANCE, 2**24)[1]
    ordered = np.sort(full, axis=1)
    clear = ordered[:, -1] - ordered[:, -2] > 2 * bound
    assert clear.sum() >= n // 2  # the check has rows to bite on
    np.testing.assert_array_equal(fast[clear].argmax(axis=1), full[clear].argmax(axis=1))
    # A row whose lead is within DECISION_MARGIN · TOLERANCE cannot settle before its
    # error is below TOLERANCE, where predict_proba stops too: it gets the full values (to
    # round-off: other GEMM shapes once fewer rows go on).
    lead = np.sort(fast, axis=1)
    close = lead[:, -1] - lead[:, -2] <= sp_module.DECISION_MARGIN * TOLERANCE
    assert close.any()
    np.testing.assert_allclose(fast[close], full[close], rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [3, 4, 6])
def test_argmax_only_leaves_the_deterministic_rules_bitwise(k):
    # The rows of the trapezoid, degree-5, Gauss–Hermite and sparse-grid rules: no
    # refinement to skip, the same values.
    widest = {3: 30.0, 4: 0.95 * GAUSS_HERMITE_LEVELS[-1][1], 6: 0.95 * SPARSE_GRID_LEVELS[-1][1]}[
        k
    ]
    mean, cov = _rows(k, np.geomspace(1e-3, widest, 10), seed=5)
    q = centred_basis(k)
    reduced = q.T @ cov @ q
    np.testing.assert_array_equal(
        centred_softmax_predictive_log_proba(mean, reduced, argmax_only=True),
        centred_softmax_predictive_log_proba(mean, reduced),
    )


def test_rules_beyond_the_nodes_whitening_reach_still_run():
    # n mirrored nodes span at most n / 2 directions: the screen's 64 cannot be whitened
    # beyond 32 dimensions (34 classes), level 0's 512 beyond 256, where predict and
    # predict_proba raised numpy's "Matrix is not positive definite". Up to there the
    # nodes are the whitened ones as before; beyond, the Sobol points as they are.
    half = rules_module._SCREEN_NODES // 2
    within = rules_module.screen_nodes(half)
    z = within.astype(float).reshape(half, -1).T
    np.testing.assert_allclose(2 * z.T @ z / (2 * len(z)), np.eye(half), atol=1e-5)
    for dim, nodes in [
        (half + 1, rules_module.screen_nodes(half + 1)),
        (257, rules_module.replicate_nodes(257, 0)),
    ]:
        assert nodes.shape[:2] == (dim, rules_module.REPLICATES)
        assert np.isfinite(nodes).all()
        first = sobol_normal_points(dim, nodes.shape[2], (rules_module._SEED, 0, 0))
        np.testing.assert_array_equal(nodes[:, 0], first.T.astype(np.float32))


def test_argmax_only_runs_and_keeps_the_argmax_beyond_33_classes():
    k = 34  # the screen's nodes span 32 of the 33 dimensions
    mean, cov = _rows(k, [20.0, 40.0], seed=3)
    q = centred_basis(k)
    reduced = q.T @ cov @ q
    full = np.exp(centred_softmax_predictive_log_proba(mean, reduced))
    fast = np.exp(centred_softmax_predictive_log_proba(mean, reduced, argmax_only=True))
    np.testing.assert_allclose(fast.sum(axis=1), 1.0, rtol=1e-12)
    ordered = np.sort(full, axis=1)
    clear = ordered[:, -1] - ordered[:, -2] > 4 * sp_module.DECISION_MARGIN * TOLERANCE
    assert clear.any()
    np.testing.assert_array_equal(fast[clear].argmax(axis=1), full[clear].argmax(axis=1))


def test_the_estimators_read_predictive_tol_from_the_settings():
    # A five-class posterior whose rows are wide enough for the adaptive rule: under
    # config_context(predictive_tol=...) predict_proba is the rule at that accuracy on the
    # same latent moments, bitwise, and the setting is restored after the block.
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    import vsbayes

    X, y = load_digits(n_class=5, return_X_y=True)
    X, y = StandardScaler().fit_transform(X[:150, ::4]), y[:150]
    model = vsbayes.LaplaceLogisticRegression(C=10).fit(X, y)
    rows = X[:12]
    latent = model._predictive().latent(rows)
    moments = latent.centred(slice(0, len(rows)))
    assert np.trace(moments[1], axis1=1, axis2=2).min() > OWN_DIRECTIONS_TRACE  # wide rows
    tight = np.exp(centred_softmax_predictive_log_proba(*moments, tol=1e-4))
    default = model.predict_proba(rows)
    with vsbayes.config_context(predictive_tol=1e-4):
        np.testing.assert_array_equal(model.predict_proba(rows), tight)
    assert vsbayes.get_config()["predictive_tol"] == TOLERANCE
    np.testing.assert_array_equal(model.predict_proba(rows), default)
    assert np.abs(default - tight).max() > 1e-5  # the setting changes the values
    for bad in (0, 1, float("nan"), "1e-4"):  # a string too: ValueError, not TypeError
        with pytest.raises(ValueError, match="predictive_tol"):
            vsbayes.set_config(predictive_tol=bad)
