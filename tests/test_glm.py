"""The binary GLM posterior (layer 4): values, chunking, parallelism, derivatives."""

import threading

import joblib
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import log_expit, log_ndtr

from vsbayes.models import BinaryGLMPosterior, get_link
from vsbayes.models import glm as glm_module

LOG_CDF = {"logistic": log_expit, "probit": log_ndtr}


def make_problem(rng, m=40, d=3, intercept=True, link="logistic", weights=None):
    X = rng.standard_normal((m, d))
    y = np.where(rng.random(m) < 0.5, 1.0, -1.0)
    s = rng.uniform(0.5, 2.0, m) if weights is None else weights
    model = BinaryGLMPosterior(
        X, y, s, link, prior_var=2.0, intercept_prior_var=5.0 if intercept else None
    )
    return X, y, s, model


def direct_log_density(X, y, s, theta, link, intercept):
    """Row-by-row reference: Σ_i s_i log F(y_i f_i) + log N(θ; 0, diag(prior))."""
    w, b = (theta[:-1], theta[-1]) if intercept else (theta, 0.0)
    prior = np.full(len(theta), 2.0)
    if intercept:
        prior[-1] = 5.0
    log_lik = sum(
        s_i * LOG_CDF[link](y_i * (x_i @ w + b)) for x_i, y_i, s_i in zip(X, y, s, strict=True)
    )
    log_prior = -0.5 * np.sum(theta**2 / prior + np.log(2 * np.pi * prior))
    return log_lik + log_prior


@pytest.mark.parametrize("link", ["logistic", "probit"])
@pytest.mark.parametrize("intercept, weight", [(True, 1.0), (False, 1.0), (True, 1e8)])
def test_log_density_matches_the_definition(rng, link, intercept, weight):
    X, y, s, model = make_problem(rng, link=link, intercept=intercept)
    if weight != 1.0:  # counts as weights: 1e-7 a row would be 10 nats
        s = s * weight
        model = BinaryGLMPosterior(
            X, y, s, link, prior_var=2.0, intercept_prior_var=5.0 if intercept else None
        )
    theta = rng.standard_normal((5, model.dim))
    expected = [direct_log_density(X, y, s, t, link, intercept) for t in theta]
    # The logistic likelihood of many points takes fast_log_cdf: 1e-7 per observation,
    # unless the weights would multiply that beyond 1e-3 nats.
    atol = 1e-7 * s.sum() if link == "logistic" and weight == 1.0 else 0.0
    np.testing.assert_allclose(model.log_density(theta), expected, rtol=1e-12, atol=atol)


def test_logistic_log_cdf_is_exact_over_the_float_range():
    t = np.concatenate([np.linspace(-50, 50, 1001), [-1e300, -800.0, 800.0, 1e300]])
    got = get_link("logistic").log_cdf(t.copy())
    np.testing.assert_allclose(got, log_expit(t), rtol=1e-15, atol=1e-300)


def test_fast_logistic_log_cdf_within_1e_7_over_the_float_range():
    # float32 soft part log1p(exp(-|t|)) ≤ log 2: a few float32 ulps (6e-8) at most.
    t = np.concatenate([np.linspace(-50, 50, 100_001), [-1e300, -800.0, 800.0, 1e300]])
    got = get_link("logistic").fast_log_cdf(t.copy())
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, log_expit(t), rtol=0.0, atol=1e-7)
    in_place = t.copy()
    get_link("logistic").fast_log_cdf(in_place, out=in_place)
    np.testing.assert_array_equal(in_place, got)


@pytest.mark.parametrize("max_bytes", [16 * 7, 16 * 100, 16 * 10**6])
def test_chunking_does_not_change_the_values(rng, max_bytes):
    _, _, _, model = make_problem(rng, m=57)
    theta = rng.standard_normal((1030, model.dim))
    reference = model.log_density(theta)
    model.max_bytes = max_bytes
    np.testing.assert_allclose(model.log_density(theta), reference, rtol=1e-13)


def test_parallel_chunks_give_bitwise_the_same_values(rng, monkeypatch):
    _, _, _, model = make_problem(rng, m=300)
    model.max_bytes = 16 * 20_000
    theta = rng.standard_normal((700, model.dim))
    reference = model.log_density(theta)
    model.n_jobs = 2
    np.testing.assert_array_equal(model.log_density(theta), reference)
    # A joblib backend set by the caller is used when n_jobs is None: joblib runs the
    # blocks (on its threads, or on the calling one: joblib 1.3 does), not vsbayes' own
    # pool (threads named "vsbayes…"). (Blocks in worker processes, pickled, are
    # test_dask.py's joblib test; loky's process start-up made this test 2.5 s.)
    model.n_jobs = None
    threads = set()

    def recorded_block(*args):
        threads.add(threading.current_thread().name)
        return block_log_likelihood(*args)

    block_log_likelihood = glm_module._block_log_likelihood
    monkeypatch.setattr(glm_module, "_block_log_likelihood", recorded_block)
    with joblib.parallel_config(backend="threading", n_jobs=2):
        np.testing.assert_array_equal(model.log_density(theta), reference)
    assert threads and not any(name.startswith("vsbayes") for name in threads)


def test_sparse_design_equals_dense(rng):
    X, y, s, dense = make_problem(rng)
    X[np.abs(X) < 0.8] = 0.0
    dense = BinaryGLMPosterior(X, y, s, "probit", prior_var=2.0, intercept_prior_var=5.0)
    sparse = BinaryGLMPosterior(
        sp.csr_matrix(X), y, s, "probit", prior_var=2.0, intercept_prior_var=5.0
    )
    theta = rng.standard_normal((4, dense.dim))
    np.testing.assert_allclose(sparse.log_density(theta), dense.log_density(theta), rtol=1e-13)
    for a, b in zip(
        sparse.value_gradient_hessian(theta[0]), dense.value_gradient_hessian(theta[0]), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_zero_weights_drop_observations(rng):
    X, y, s, _ = make_problem(rng)
    s[::3] = 0.0
    full = BinaryGLMPosterior(X, y, s, "logistic", prior_var=2.0, intercept_prior_var=5.0)
    keep = s > 0
    kept = BinaryGLMPosterior(
        X[keep], y[keep], s[keep], "logistic", prior_var=2.0, intercept_prior_var=5.0
    )
    assert full.n_observations == keep.sum()
    theta = rng.standard_normal((3, full.dim))
    np.testing.assert_allclose(full.log_density(theta), kept.log_density(theta), rtol=1e-14)


@pytest.mark.parametrize("link", ["logistic", "probit"])
def test_gradient_and_hessian_match_finite_differences(rng, link):
    _, _, _, model = make_problem(rng, link=link)
    theta = 0.5 * rng.standard_normal(model.dim)
    value, grad, neg_hess = model.value_gradient_hessian(theta)
    # log_density takes fast_log_cdf (1e-7 per observation); the value here is exact.
    assert value == pytest.approx(
        model.log_density(theta[None])[0], abs=1e-7 * model.n_observations
    )
    h = 1e-5
    eye = np.eye(model.dim) * h

    def exact(point):
        return model.value_gradient_hessian(point)[0]

    fd_grad = np.array([(exact(theta + e) - exact(theta - e)) / (2 * h) for e in eye])
    # Central differences: error O(h²·f''') ≈ 1e-10 relative, plus round-off ε|f|/h.
    np.testing.assert_allclose(grad, fd_grad, rtol=1e-6, atol=1e-6)
    fd_hess = np.array(
        [
            (
                model.value_gradient_hessian(theta + e)[1]
                - model.value_gradient_hessian(theta - e)[1]
            )
            / (2 * h)
            for e in eye
        ]
    )
    np.testing.assert_allclose(-neg_hess, fd_hess, rtol=1e-6, atol=1e-6)
    assert np.all(np.linalg.eigvalsh(neg_hess) > 0)


def test_probit_derivatives_stay_finite_in_the_tails():
    slope, curvature = get_link("probit").derivatives(np.array([-1e4, -40.0, 0.0, 40.0]))
    assert np.all(np.isfinite(slope)) and np.all(np.isfinite(curvature))
    # d/dt log Φ(t) → -t and -d² log Φ → 1 as t → -∞; both → 0 as t → +∞.
    np.testing.assert_allclose(slope[:2], [1e4, 40.0], rtol=1e-3)
    np.testing.assert_allclose(curvature[:2], [1.0, 1.0], rtol=2e-3)
    assert slope[3] < 1e-300 and curvature[3] < 1e-300


@pytest.mark.parametrize("sparse", [False, True])
def test_separates_at_is_every_row_strictly_right(sparse):
    # Binary: the signed rows' margins; multinomial: each row's own class strictly on top;
    # rows of weight 0 are not the model's, and a model it cannot read answers False.
    from vsbayes.models import SoftmaxGLMPosterior
    from vsbayes.models.separation import separates_at

    X = np.array([[-2.0], [-1.0], [1.0], [2.0], [0.5]])
    weights = np.array([1.0, 1.0, 1.0, 1.0, 0.0])  # the last row (class 0 at x > 0) is out
    X_in = sp.csr_matrix(X) if sparse else X
    y = np.array([-1.0, -1.0, 1.0, 1.0, -1.0])
    binary = BinaryGLMPosterior(
        X_in, y, weights, "logistic", prior_var=1.0, intercept_prior_var=1.0
    )
    assert separates_at(binary, np.array([1.0, 0.0]))
    assert not separates_at(binary, np.array([1.0, 1.5]))  # x = -1 now scores +0.5
    assert not separates_at(binary, np.zeros(2))  # ties are not strictly right
    labels = np.array([0, 0, 2, 2, 1])
    softmax = SoftmaxGLMPosterior(
        X_in, labels, np.r_[weights[:4], 1.0], 3, prior_var=1.0, intercept_prior_var=1.0
    )
    theta = np.array([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])  # W = (-1, 0, 1)ᵀ, b = 0
    assert not separates_at(softmax, theta)  # x = 0.5 of class 1 scores 0.5 for class 2
    theta[4] = 0.8  # class 1's intercept puts it on top at x = 0.5, below at |x| ≥ 1
    assert separates_at(softmax, theta)
    assert not separates_at(object(), theta)
