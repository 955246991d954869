"""The Gaussian of prior × sites (layer 5): the dual (Woodbury) form equals the primal one."""

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from vsbayes.approximations import NewtonLaplaceSolver, glm_laplace
from vsbayes.approximations._design_forms import precision_diagonal
from vsbayes.approximations._glm_gaussian import GLMGaussian
from vsbayes.exceptions import NotPositiveDefiniteError
from vsbayes.models import BinaryGLMPosterior

INTERCEPTS = [None, 4.0, 1e6]  # 1e6: the estimators' intercept prior


def wide_model(rng, m, d, sparse, intercept, density=0.3, link="logistic"):
    X = rng.standard_normal((m, d)) * (rng.random((m, d)) < density)
    y = np.where(rng.random(m) < 0.5, 1.0, -1.0)
    X = sp.csr_matrix(X) if sparse else X
    return BinaryGLMPosterior(
        X, y, rng.uniform(0.5, 2.0, m), link, prior_var=2.0, intercept_prior_var=intercept
    )


def assert_close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("intercept", INTERCEPTS)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_dual_equals_primal(rng, sparse, intercept):
    model = wide_model(rng, m=15, d=40, sparse=sparse, intercept=intercept)
    tau = rng.uniform(0.01, 3.0, 15)
    linear = rng.standard_normal(model.dim)
    primal = GLMGaussian(model, tau, linear, form="primal")
    dual = GLMGaussian(model, tau, linear, form="dual")
    assert (primal.form, dual.form) == ("primal", "dual")
    assert_close(dual.var, primal.var)
    assert "cov" not in vars(dual)  # the dual's variances need no p × p covariance
    for name in ("mean", "cov", "t_mean", "t_var", "linear"):
        assert_close(getattr(dual, name), getattr(primal, name))
    assert dual.half_log_det == pytest.approx(primal.half_log_det, abs=1e-8)
    for v in (rng.standard_normal(model.dim), rng.standard_normal((model.dim, 3))):
        assert_close(dual.solve(v), primal.solve(v))
    assert np.array_equal(dual.cov, dual.cov.T)


def test_dual_t_var_keeps_its_digits_on_sites_of_any_weight(rng):
    # τ from 0 to 10: the shortcut τ t_var = 1 - (B⁻¹)_ii on the heavy sites, the direct
    # form on the light ones, where the shortcut would cancel.
    model = wide_model(rng, m=30, d=80, sparse=False, intercept=1e6, density=1.0)
    tau = np.r_[0.0, 10.0 ** rng.uniform(-12, 1, 29)]
    primal = GLMGaussian(model, tau, form="primal")
    dual = GLMGaussian(model, tau, form="dual")
    np.testing.assert_allclose(dual.t_var, primal.t_var, rtol=1e-10)
    weight = tau * dual.t_var
    assert weight.min() < 0.1 < weight.max()  # both branches ran


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_the_primal_form_equals_the_dense_formulas(rng, sparse):
    model = wide_model(rng, m=40, d=6, sparse=sparse, intercept=4.0)
    tau, nu = rng.uniform(0.01, 3.0, 40), rng.standard_normal(40)
    linear = np.asarray(model.design.T @ nu).ravel()
    ours = GLMGaussian(model, tau, linear, what="EP posterior precision")
    A = model.design.toarray() if sp.issparse(model.design) else model.design
    precision = np.diag(1.0 / model.prior_var) + A.T @ (A * tau[:, None])
    cov = np.linalg.inv(precision)
    assert ours.form == "primal"
    assert_close(ours.cov, cov)
    assert_close(ours.mean, cov @ linear)
    assert_close(ours.t_mean, A @ cov @ linear)
    assert_close(ours.t_var, np.einsum("ij,jk,ik->i", A, cov, A))
    assert ours.half_log_det == pytest.approx(0.5 * np.linalg.slogdet(precision)[1], rel=1e-12)


def test_auto_takes_the_dual_form_for_many_more_coefficients_than_rows(rng):
    # Dual only where it pays: p > M and p beyond 256 (the primal keeps more digits).
    assert GLMGaussian(wide_model(rng, 10, 300, False, 4.0), np.ones(10)).form == "dual"
    assert GLMGaussian(wide_model(rng, 10, 30, False, 4.0), np.ones(10)).form == "primal"
    assert GLMGaussian(wide_model(rng, 301, 300, False, 4.0), np.ones(301)).form == "primal"
    with pytest.raises(ValueError, match="form must be one of"):
        GLMGaussian(wide_model(rng, 10, 3, False, 4.0), np.ones(10), form="woodbury")


def test_negative_round_off_sites_are_clipped_in_the_dual(rng):
    model = wide_model(rng, m=10, d=30, sparse=False, intercept=None)
    tau = rng.uniform(0.1, 1.0, 10)
    clipped = tau.copy()
    tau[3], clipped[3] = -1e-17, 0.0
    assert_close(
        GLMGaussian(model, tau, form="dual").t_var, GLMGaussian(model, clipped, form="primal").t_var
    )


def test_precision_diagonal(rng):
    for sparse in (False, True):
        model = wide_model(rng, m=12, d=5, sparse=sparse, intercept=4.0)
        tau = rng.uniform(0.0, 2.0, 12)
        precision = model.weighted_gram(tau) + np.diag(1.0 / model.prior_var)
        assert_close(precision_diagonal(model, tau), np.diag(precision))


def test_not_positive_definite_is_named(rng):
    model = wide_model(rng, m=10, d=3, sparse=False, intercept=None)
    with pytest.raises(NotPositiveDefiniteError, match="The EP posterior precision matrix"):
        GLMGaussian(model, np.full(10, -1e3), what="EP posterior precision")


@pytest.mark.parametrize("link", ["logistic", "probit"])
@pytest.mark.parametrize("intercept", INTERCEPTS)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_laplace_in_dual_form_equals_primal(rng, sparse, intercept, link):
    model = wide_model(rng, m=20, d=60, sparse=sparse, intercept=intercept, link=link)
    # tol=1e-14 is reachable: the decrement gᵀH⁻¹g/2 falls to ~1e-30 (at the mode g is
    # round-off, H⁻¹ ≤ prior variance) and one Newton step from 1e-12 lands near 1e-24; a
    # line search on the exact log p takes that step (its gain is above log p's round-off,
    # eps·|log p| ≈ 2e-14). The forms agree to 1e-8 at the same, converged, mode.
    fits = {
        form: NewtonLaplaceSolver(model, tol=1e-14, max_iter=100, form=form).solve()
        for form in ("primal", "dual")
    }
    primal, dual = fits["primal"], fits["dual"]
    assert primal.converged and dual.converged
    assert_close(dual.mean, primal.mean)
    assert_close(dual.cov, primal.cov)
    assert dual.log_Z == pytest.approx(primal.log_Z, abs=1e-8)
    auto = glm_laplace(model, tol=1e-14)  # d > M: the dual form
    assert_close(auto.mean, primal.mean)


def test_a_wide_sparse_design_is_never_densified(rng):
    # 50 × 20000 at 0.1 %: A dense would take 8 MB, a p × p matrix 3.2 GB.
    m, d = 50, 20_000
    X = sp.random(m, d, density=0.001, format="csr", random_state=0, data_rvs=rng.standard_normal)
    y = np.where(rng.random(m) < 0.5, 1.0, -1.0)
    model = BinaryGLMPosterior(X, y, np.ones(m), "logistic", prior_var=1.0, intercept_prior_var=1e6)
    solver = NewtonLaplaceSolver(model, tol=1e-10, max_iter=100)
    tracemalloc.start()
    try:
        solver.find_mode()
        t_var = solver.gaussian.t_var
        half_log_det = solver.gaussian.half_log_det
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert solver.converged and solver.gaussian.form == "dual"
    assert np.all(t_var > 0) and np.isfinite(half_log_det)
    assert peak < 4 * 2**20, peak
