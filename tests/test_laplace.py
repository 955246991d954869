import numpy as np
import pytest
from _helpers import random_gaussian

from vsbayes import Gaussian, laplace
from vsbayes.exceptions import NotPositiveDefiniteError
from vsbayes.models import GaussianMixtureTarget


def _derivatives(g):
    prec = g.precision

    def grad(x):
        return -prec @ (x - g.mean)

    def hess(x):
        return -prec

    return grad, hess


@pytest.mark.parametrize("given", ["both", "grad", "none"])
def test_exact_on_gaussian_targets(rng, given):
    target = random_gaussian(rng, 4, log_Z=-1.5)
    grad, hess = _derivatives(target)
    kwargs = {"both": {"grad": grad, "hess": hess}, "grad": {"grad": grad}, "none": {}}[given]
    fit = laplace(target.log_density, np.zeros(4), **kwargs)
    tol = 1e-10 if given == "both" else 1e-6  # finite differences
    assert fit.converged
    np.testing.assert_allclose(fit.mean, target.mean, atol=tol)
    np.testing.assert_allclose(fit.cov, target.cov, atol=tol, rtol=tol)
    assert fit.log_Z == pytest.approx(target.log_Z, abs=tol)


def test_far_and_narrow_target_by_finite_differences():
    target = Gaussian([1e4, -2.0], [[1e-6, 0.0], [0.0, 4.0]])
    fit = laplace(target.log_density, [1e4 + 2e-3, 0.0])
    np.testing.assert_allclose(fit.mean, target.mean, rtol=1e-12, atol=1e-7)
    np.testing.assert_allclose(np.sqrt(np.diag(fit.cov)), [1e-3, 2.0], rtol=1e-5)


def test_mixture_mode_and_curvature():
    target = GaussianMixtureTarget.paper(5, 1.5, random_state=0)
    fit = laplace(target, target.means.mean(0), target.gradient, target.hessian)
    assert np.linalg.norm(target.gradient(fit.mean)) < 1e-8
    np.testing.assert_allclose(np.linalg.inv(fit.cov), -target.hessian(fit.mean), rtol=1e-8)
    expected = (
        target(fit.mean[None])[0]
        + 2.5 * np.log(2 * np.pi)
        - 0.5 * np.linalg.slogdet(-target.hessian(fit.mean))[1]
    )
    assert fit.log_Z == pytest.approx(expected, abs=1e-10)


def test_improper_target_raises():
    def flat_in_one_direction(x):
        return -0.5 * np.square(x[:, 0])

    with pytest.raises(NotPositiveDefiniteError, match="not negative definite"):
        laplace(flat_in_one_direction, np.zeros(2))


def test_zero_density_start_raises():
    def half_line(x):
        return np.where(x[:, 0] > 0, -x[:, 0], -np.inf)

    with pytest.raises(ValueError, match="x0"):
        laplace(half_line, [-1.0])
