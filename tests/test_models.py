import numpy as np
from scipy import stats
from scipy.optimize import approx_fprime

from vsbayes.models import GaussianMixtureTarget


def test_mixture_log_density_against_scipy():
    target = GaussianMixtureTarget.paper(3, 2.0, n_components=7, random_state=0)
    x = np.random.default_rng(1).standard_normal((6, 3))
    expected = np.log(
        np.mean([stats.multivariate_normal(m, np.eye(3)).pdf(x) for m in target.means], axis=0)
    )
    np.testing.assert_allclose(target(x), expected, rtol=1e-12)


def test_mixture_derivatives_against_finite_differences():
    target = GaussianMixtureTarget.paper(3, 2.0, random_state=2)
    x = np.array([0.3, -0.2, 0.5])
    fd = approx_fprime(x, lambda v: target(v[None])[0], 1e-7)
    np.testing.assert_allclose(target.gradient(x), fd, atol=1e-6)
    fd_h = approx_fprime(x, target.gradient, 1e-7)
    np.testing.assert_allclose(target.hessian(x), fd_h, atol=1e-5)


def test_moment_matched_is_the_mixture_moments():
    target = GaussianMixtureTarget.paper(2, 2.0, random_state=3)
    rng = np.random.default_rng(4)
    n = 200_000
    x = target.means[rng.integers(len(target.means), size=n)] + rng.standard_normal((n, 2))
    q = target.moment_matched()
    assert q.log_Z == 0.0
    np.testing.assert_allclose(x.mean(axis=0), q.mean, atol=5 * np.sqrt(q.cov.max() / n))
    np.testing.assert_allclose(np.cov(x.T), q.cov, atol=0.03)
