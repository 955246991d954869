"""EP refitted without one row, warm from the full fit's sites: the cold refit's fixed point."""

import numpy as np
import pytest
import scipy.sparse as sp

from vsbayes.approximations import expectation_propagation, softmax_ep
from vsbayes.approximations.ep_leave_one_out import (
    refit_softmax_without_rows,
    refit_without_rows,
)
from vsbayes.models import BinaryGLMPosterior, SoftmaxGLMPosterior

TOL = 1e-10


def _model(X, labels, weights, link, sparse=False):
    X = sp.csr_matrix(X) if sparse else X
    return BinaryGLMPosterior(X, labels, weights, link, prior_var=4.0, intercept_prior_var=1e2)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((40, 2))
    labels = np.where(X @ [1.5, -1.0] + 0.5 * rng.standard_normal(40) > 0, 1.0, -1.0)
    labels[:3] *= -1.0  # misclassified rows: influential ones
    weights = np.ones(40)
    weights[[4, 7]] = [2.0, 0.5]  # copies of the factor and a fractional power
    return X, labels, weights


@pytest.mark.parametrize(("link", "sparse"), [("logistic", False), ("probit", True)])
def test_warm_refit_is_the_cold_refit(data, link, sparse):
    X, labels, weights = data
    model = _model(X, labels, weights, link, sparse)
    sites = expectation_propagation(model, tol=TOL).sites
    rows = np.array([0, 4, 7, 20])
    warm = refit_without_rows(model, sites, rows, tol=TOL)
    for j, i in enumerate(rows):
        keep = np.arange(len(labels)) != i
        cold = expectation_propagation(_model(X[keep], labels[keep], weights[keep], link), tol=TOL)
        a = model.design[i]
        a = a.toarray().ravel() if sparse else a
        # Both are EP's fixed point without the row, to within the sweeps' tolerance.
        assert warm.mean[j] == pytest.approx(a @ cold.mean, abs=1e-7)
        assert warm.var[j] == pytest.approx(a @ cold.cov @ a, rel=1e-7)
    # The cavity is the start, not the answer: the misclassified row's refit moved it.
    full = expectation_propagation(model, tol=TOL)
    design = model.design.toarray() if sparse else model.design
    t_mean, t_var = design @ full.mean, np.einsum("ij,jk,ik->i", design, full.cov, design)
    cavity_mean = (t_mean / t_var - sites.linear) / (1.0 / t_var - sites.precision)
    assert abs(warm.mean[0] - cavity_mean[0]) > 1e-3
    assert warm.n_iter.max() >= 2


def test_refit_needs_the_models_sites(data):
    X, labels, weights = data
    model = _model(X, labels, weights, "logistic")
    sites = expectation_propagation(model, tol=1e-6).sites
    smaller = _model(X[1:], labels[1:], weights[1:], "logistic")
    with pytest.raises(ValueError, match="sites has 40 rows"):
        refit_without_rows(smaller, sites, [0])


def test_warm_multinomial_refit_is_the_cold_refit():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, 30)
    X = rng.standard_normal((30, 2)) + np.eye(3)[y][:, :2]
    weights = np.ones(30)
    weights[5] = 2.0

    def model_of(keep):
        return SoftmaxGLMPosterior(
            X[keep], y[keep], weights[keep], 3, prior_var=1.0, intercept_prior_var=1e2
        )

    every = np.ones(30, dtype=bool)
    model = model_of(every)
    sites = softmax_ep(model, tol=TOL).sites
    rows = np.array([0, 5])
    warm = refit_softmax_without_rows(model, sites, rows, tol=TOL, linear_within=None)
    # The default: the sites that barely move, linear in their cavities (within the
    # refits' own tolerance of the exact ones here).
    linear = refit_softmax_without_rows(model, sites, rows, tol=TOL)
    np.testing.assert_allclose(linear.mean, warm.mean, atol=2e-3)
    np.testing.assert_allclose(linear.var, warm.var, atol=2e-3)
    for j, i in enumerate(rows):
        cold = softmax_ep(model_of(every & (np.arange(30) != i)), tol=TOL)
        # f_k = x·w_k + b_k of the left-out row, from θ = [W.ravel(), b].
        jacobian = np.zeros((3, model.dim))
        for k in range(3):
            jacobian[k, 2 * k : 2 * k + 2] = X[i]
            jacobian[k, 6 + k] = 1.0
        f_mean, f_cov = jacobian @ cold.mean, jacobian @ cold.cov @ jacobian.T
        centring = np.eye(3) - 1.0 / 3  # the softmax sees the centred values only
        np.testing.assert_allclose(centring @ warm.mean[j], centring @ f_mean, atol=1e-6)
        np.testing.assert_allclose(
            centring @ warm.var[j] @ centring, centring @ f_cov @ centring, atol=1e-6
        )


def test_multinomial_refits_bound_the_rows_outer_products():
    # The refits' precisions need each row's x̃ x̃ᵀ (M w² numbers, 19 MB here): made in
    # chunks of rows when they do not fit one block, never all at once.
    import tracemalloc
    import warnings

    from sklearn import config_context

    from vsbayes.approximations.expectation_propagation import EPSites
    from vsbayes.approximations.softmax_sites import _laplace_sites
    from vsbayes.models.softmax_predictive_rules import centred_basis

    rng = np.random.default_rng(5)
    m, d = 1500, 39
    X = rng.standard_normal((m, d))
    y = rng.integers(0, 3, m)
    model = SoftmaxGLMPosterior(X, y, np.ones(m), 3, prior_var=1.0, intercept_prior_var=1e2)
    lam, eta = _laplace_sites(model, centred_basis(3), np.zeros(model.dim))
    sites = EPSites(lam, eta, "contrast")
    outer_bytes = 8.0 * m * (d + 1) ** 2
    with config_context(working_memory=2), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (two sweeps: unconverged)
        tracemalloc.start()
        try:
            chunked = refit_softmax_without_rows(model, sites, [3], max_iter=2)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 0.5 * outer_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = refit_softmax_without_rows(model, sites, [3], max_iter=2)
    np.testing.assert_allclose(chunked.mean, whole.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(chunked.var, whole.var, rtol=1e-9, atol=1e-12)


def _constant_sites(value):
    """A stand-in for the multinomial EP's site update: every site ``value · I``, η = 0."""

    def sites(model, q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok):
        n, r = cav_lin.shape
        return np.zeros(n), np.broadcast_to(value * np.eye(r), (n, r, r)), 0 * cav_lin, ok.copy()

    return sites


def _softmax_model(m, k, seed):
    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((m, 2)), rng.integers(0, k, m)
    return SoftmaxGLMPosterior(X, y, np.ones(m), k, prior_var=1.0, intercept_prior_var=1e2)


def test_multinomial_refits_whose_sites_stop_moving_exactly(monkeypatch):
    # Sites at a fixed point to the bit (here: the update's constant sites, undamped) leave
    # no refit to refactor: the last posterior stands.
    from vsbayes.approximations import ep_leave_one_out
    from vsbayes.approximations.expectation_propagation import EPSites

    monkeypatch.setattr(ep_leave_one_out, "_sites", _constant_sites(0.5))
    model = _softmax_model(20, 3, seed=7)
    sites = EPSites(np.broadcast_to(0.5 * np.eye(2), (20, 2, 2)).copy(), np.zeros((20, 2)), "")
    refit = refit_softmax_without_rows(model, sites, [0, 1], damping=1.0, linear_within=None)
    assert np.all(np.isfinite(refit.var)) and refit.n_iter.max() <= 2


def test_multinomial_linear_sites_bound_their_jacobians():
    # The linear sites of R refits' M rows read the rows' Jacobians (P × P each): in
    # chunks of a block, not R M copies of them at once (8 MB here).
    import tracemalloc

    from sklearn import config_context

    from vsbayes.approximations.ep_leave_one_out import _SiteJacobians

    rng = np.random.default_rng(8)
    m, r = 40, 4
    n_params = r * (r + 3) // 2
    linear = object.__new__(_SiteJacobians)
    linear.upper = np.triu_indices(r)
    linear.jacobian = rng.standard_normal((m, n_params, n_params))
    linear.base, linear.site = rng.standard_normal((2, m, n_params))
    row = np.tile(np.arange(m), 500)  # 500 refits' rows
    cav_prec = np.broadcast_to(np.eye(r), (row.size, r, r))
    cav_lin = rng.standard_normal((row.size, r))
    base, site = linear.base[row], linear.site[row]
    whole = linear.sites(row, cav_prec, cav_lin, base, site)
    with config_context(working_memory=1):
        tracemalloc.start()
        try:
            chunked = linear.sites(row, cav_prec, cav_lin, base, site)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 0.5 * 8.0 * row.size * n_params**2
    for got, expected in zip(chunked, whole, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("prior", ["laplace", "student_t"])
def test_prior_site_relaxation_keeps_the_fits_fixed_point(data, prior):
    # Relaxing a shrinkage prior's coefficient sites under all the fit's rows (none left
    # out) stays at the fit's fixed point: the relaxations' tilted moments (method="fast")
    # are within 1e-6 of the fit's, so its sites move by about that, far below the
    # 1e-2 site change its stopping rule allows, and the rows' latent moments with them.
    from vsbayes import LaplacePrior, StudentTPrior
    from vsbayes.approximations.ep_leave_one_out import _PriorSiteRelaxation

    X, labels, _ = data
    shrinkage = LaplacePrior(0.5) if prior == "laplace" else StudentTPrior(3.0, 0.5)
    factor = shrinkage.coefficient_factor()
    model = BinaryGLMPosterior(
        X, labels, np.ones(len(labels)), "logistic", prior_var=factor.base_var,
        intercept_prior_var=1e2, coefficient_prior=factor,
    )  # fmt: skip
    fit = expectation_propagation(model, tol=TOL)
    tau_rows, nu_rows = fit.sites.precision, fit.sites.linear
    design = model.design
    precision = (design.T * tau_rows) @ design + np.diag(1.0 / model.prior_var)
    linear = design.T @ nu_rows + model.prior_mean / model.prior_var
    rows = np.array([0, 5, 20])
    relaxation = _PriorSiteRelaxation(model, fit.prior_sites, False, 1e-9)
    nonnegative = np.zeros(rows.size, dtype=bool)
    tau, nu = relaxation.start(rows.size, nonnegative)
    stack = np.broadcast_to(precision, (rows.size, *precision.shape)).copy()
    out_tau, out_nu, t_mean, t_var, converged = relaxation.relax(
        stack, np.tile(linear, (rows.size, 1)), tau, nu, nonnegative, design[rows]
    )
    assert converged.all()
    np.testing.assert_allclose(out_tau, tau, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out_nu, nu, rtol=1e-5, atol=1e-5)
    a = design[rows]
    np.testing.assert_allclose(t_mean, a @ fit.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t_var, np.einsum("ij,jk,ik->i", a, fit.cov, a), rtol=1e-5)
