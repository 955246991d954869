"""The multinomial posterior in the contrasts' dual (row) form (D-197): the same posterior
as the dense form to round-off, for EP's contrast posterior and Newton's negative Hessian,
and the route each problem takes."""

import importlib

import numpy as np
import pytest
import scipy.sparse as sp

import vsbayes
from vsbayes._blas import single_blas_thread
from vsbayes.approximations._softmax_dual import DualContrast, row_kernel, takes_dual
from vsbayes.approximations.newton_laplace import (
    DualSoftmaxCurvature,
    NewtonLaplaceSolver,
    SoftmaxCurvature,
    softmax_curvature,
)
from vsbayes.exceptions import MemoryLimitError
from vsbayes.models.softmax import SoftmaxGLMPosterior

softmax_ep_module = importlib.import_module("vsbayes.approximations.softmax_ep")

EPS = np.finfo(float).eps


def _wide_model(rng, sparse: bool, intercept: bool, m: int = 12, d: int = 30, k: int = 4):
    X = rng.standard_normal((m, d))
    if sparse:
        X = sp.csr_matrix(X * (rng.random((m, d)) < 0.3))
    y = np.arange(m) % k
    weights = rng.uniform(0.5, 2.0, m)
    return SoftmaxGLMPosterior(
        X, y, weights, k, prior_var=2.0, intercept_prior_var=1e6 if intercept else None
    )


def _relative(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("intercept", [True, False])
def test_dual_contrast_posterior_is_the_dense_one(sparse, intercept, global_random_seed):
    rng = np.random.default_rng(global_random_seed)
    model = _wide_model(rng, sparse, intercept)
    with single_blas_thread():
        _compare_contrast_posteriors(rng, model)


def _compare_contrast_posteriors(rng, model):
    contrast = softmax_ep_module._Contrast(model)
    m, r = model.n_observations, contrast.r
    roots = rng.standard_normal((m, r, r))
    lam = 0.3 * roots @ roots.transpose(0, 2, 1)
    lam[0] = 0.0  # a zero site: S_i = 0
    lam[1] = np.outer(roots[1, 0], roots[1, 0])  # a singular one
    eta = rng.standard_normal((m, r))
    contrast.dual = False
    dense = contrast.posterior(lam, eta)
    dense_latent = contrast.latent(dense[0], dense[1])
    contrast.dual = True
    dual = contrast.posterior(lam, eta)
    assert isinstance(dual[1], DualContrast)
    dual_latent = contrast.latent(dual[0], dual[1])
    # Both are backward stable solves of the same system: their difference is bounded by
    # the precision's condition number times round-off (a margin of 100 for the sums).
    bound = 100 * np.linalg.cond(dense[4]) * EPS
    assert _relative(dual[0], dense[0]) < bound
    # θ's covariance from the dual factor, rotated back to B's (Qᵀ annihilates the
    # shift's prior): B's dense one; its variances from the factors alone.
    theta_cov = dual[1].theta_cov(contrast.q)
    np.testing.assert_array_equal(theta_cov, theta_cov.T)
    # (The rotation back cancels the shift's prior, v_b/K on each pair of intercepts: its
    # round-off, relative to B's covariance, too.)
    cancelled = 100 * EPS * np.abs(theta_cov).max() / np.abs(dense[1]).max()
    assert _relative(_contrast_cov(contrast, theta_cov), dense[1]) < bound + cancelled
    assert _relative(theta_cov, contrast.to_theta(dense[0], dense[1])[1]) < bound
    assert _relative(dual[1].variances(), np.diag(dense[1])) < bound
    assert abs(dual[2] - dense[2]) < bound * abs(dense[2]) + 1e-12
    np.testing.assert_array_equal(dual[3], dense[3])
    assert _relative(dual_latent[0], dense_latent[0]) < bound
    assert _relative(dual_latent[1], dense_latent[1]) < bound
    # The KL divergence between two posteriors from the rows' latent moments alone.
    other_lam, other_eta = 1.1 * lam, eta + 0.1
    contrast.dual = False
    other_dense = contrast.posterior(other_lam, other_eta)
    contrast.dual = True
    other_dual = contrast.posterior(other_lam, other_eta)
    kl = softmax_ep_module._posterior_kl(dense, other_dense)
    assert kl > 0
    assert abs(softmax_ep_module._posterior_kl(dual, other_dual) - kl) < bound * kl


def _contrast_cov(contrast, theta_cov: np.ndarray) -> np.ndarray:
    """B's covariance from θ's: ``(Qᵀ ⊗ I) Σ (Q ⊗ I)`` in B's layout."""
    index = contrast._theta_index()  # (K, w)
    blocks = theta_cov[index[:, :, None, None], index[None, None]]
    n = contrast.r * contrast.width
    return np.einsum("ka,kjlm,lb->ajbm", contrast.q, blocks, contrast.q).reshape(n, n)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("intercept", [True, False])
def test_dual_newton_laplace_is_the_dense_one(sparse, intercept, global_random_seed):
    rng = np.random.default_rng(global_random_seed)
    model = _wide_model(rng, sparse, intercept, m=15, d=40)
    with single_blas_thread():  # as every fit (a busy machine stalls OpenBLAS's threads)
        dense, dual = (
            NewtonLaplaceSolver(model, tol=1e-12, max_iter=100, curvature=curvature).solve()
            for curvature in (SoftmaxCurvature(model), DualSoftmaxCurvature(model))
        )
        dense_cov, dual_cov = dense.cov, dual.cov
    # The same Newton steps to round-off, at the Hessian's condition number (~10⁶ and
    # 10 with and without the vague intercepts).
    bound = 100 * np.linalg.cond(dense_cov) * EPS
    assert dual.n_iter == dense.n_iter
    assert _relative(dual.mean, dense.mean) < bound
    assert _relative(dual_cov, dense_cov) < bound
    assert abs(float(dual.log_Z) - float(dense.log_Z)) < bound * abs(float(dense.log_Z))


def test_dual_ep_is_the_dense_ep(monkeypatch):
    """The whole EP (its sweeps, stops and evidence) on the dual posterior: the dense EP's
    to well within its stop (the same map of the sites, round-off apart)."""
    rng = np.random.default_rng(0)
    model = _wide_model(rng, sparse=True, intercept=True, m=20, d=60, k=3)
    fits = {}
    for dual in (True, False):
        monkeypatch.setattr(softmax_ep_module, "holds_dual", lambda model, dual=dual: dual)
        fits[dual] = softmax_ep_module.softmax_ep(model, tol=1e-8)
    dual, dense = fits[True], fits[False]
    assert dual.n_iter == dense.n_iter
    # Sites to 1e-8 of their fixed point (relative): the posteriors agree far closer.
    assert _relative(dual.mean, dense.mean) < 1e-7
    assert _relative(dual.cov, dense.cov) < 1e-7
    assert abs(dual.log_Z - dense.log_Z) < 1e-7 * abs(dense.log_Z)


def test_wide_problems_take_the_dual_form_and_small_ones_stay_dense():
    # 400 rows × 1501 columns × 2 contrasts: (800)³ against 400 · 3002² and 3002³.
    assert takes_dual(400, 2, 1501)
    assert not takes_dual(1000, 9, 501)  # more rows' contrasts than B's entries
    assert not takes_dual(20, 2, 100)  # small: the dense form is cheap
    rng = np.random.default_rng(0)
    X = sp.random(30, 520, density=0.05, format="csr", random_state=0)
    y = np.arange(30) % 3
    model = SoftmaxGLMPosterior(X, y, np.ones(30), 3, prior_var=1.0, intercept_prior_var=1e6)
    assert isinstance(softmax_curvature(model), DualSoftmaxCurvature)
    assert softmax_ep_module._Contrast(model).dual
    # A prior that does not factorize over the rotation (here a mean) stays dense.
    varied = SoftmaxGLMPosterior(
        X,
        y,
        np.ones(30),
        3,
        prior_var=1.0,
        intercept_prior_var=1e6,
        prior_mean=rng.standard_normal(3 * 521),
    )
    assert type(softmax_curvature(varied)) is SoftmaxCurvature
    assert not softmax_ep_module.holds_dual(varied)


def test_dual_form_is_sized_before_any_work():
    rng = np.random.default_rng(0)
    model = _wide_model(rng, sparse=False, intercept=True)
    kernel = row_kernel(model.X, np.full(model.n_features, 2.0))
    lam = np.broadcast_to(np.eye(3), (model.n_observations, 3, 3)).copy()
    with (
        vsbayes.config_context(memory_limit=1e4),
        pytest.raises(MemoryLimitError, match="dual form of the multinomial EP"),
    ):
        DualContrast(model.X, kernel, np.full(model.n_features + 1, 2.0), lam, True)


def test_a_wide_fit_forms_its_covariance_once_and_factorizes_it_on_first_draw(monkeypatch):
    """The dual form's covariance, formed in θ's representative from its factors (D-202):
    the dense route's ``sigma_`` to round-off, never factorized by the fit."""
    newton_module = importlib.import_module("vsbayes.approximations.newton_laplace")
    X = sp.random(30, 150, density=0.1, format="csr", random_state=1)
    y = np.arange(30) % 3
    fits = {}
    for dual in (True, False):
        for module in (softmax_ep_module, newton_module):
            monkeypatch.setattr(module, "holds_dual", lambda model, dual=dual: dual)
        fits[dual] = vsbayes.LaplaceLogisticRegression().fit(X, y)
    dual, dense = fits[True], fits[False]
    # The same Newton steps to round-off, at the Hessian's condition number.
    bound = 100 * np.linalg.cond(dense.sigma_) * EPS
    assert _relative(dual.sigma_, dense.sigma_) < bound
    assert _relative(dual.coef_, dense.coef_) < bound
    np.testing.assert_array_equal(dual.sigma_, dual.sigma_.T)
    assert "dual form" in dual.covariance_reason_
    posterior = dual.posteriors_[0]
    assert posterior._chol is None  # formed for sigma_, not factorized
    coef, _ = dual.sample_coef(2000, random_state=0)
    assert posterior._chol is not None  # factorized for the draws, kept
    # The draws' spread: each variance within 5 standard errors (2/n relative) of sigma_'s.
    spread = coef.reshape(2000, -1).var(axis=0) / np.diag(dual.sigma_)[: coef[0].size]
    assert np.abs(spread - 1).max() < 5 * np.sqrt(2 / 2000)
