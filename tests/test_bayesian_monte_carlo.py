import numpy as np
import pytest
from _helpers import random_gaussian

import vsbayes
from vsbayes import Gaussian, bayesian_monte_carlo, excess_kl
from vsbayes.engine.bayesian_monte_carlo import MAX_BMC_SAMPLES
from vsbayes.exceptions import TooFewSamplesError


def test_accurate_on_a_smooth_two_dimensional_target(rng):
    target = random_gaussian(rng, 2, log_Z=1.0)
    kernel = Gaussian(target.mean + 0.3, 1.3 * target.cov)
    fit = bayesian_monte_carlo(target.log_density, kernel, 300, random_state=0)
    assert excess_kl(target, fit) < 1e-3


def test_improves_with_n(rng):
    target = random_gaussian(rng, 2)
    kernel = Gaussian(target.mean + 0.5, 1.5 * target.cov)
    errors = {}
    for n in (20, 200):
        errors[n] = np.median(
            [
                excess_kl(
                    target,
                    bayesian_monte_carlo(
                        target.log_density, kernel, n, length_scale=1.0, random_state=s
                    ),
                )
                for s in range(10)
            ]
        )
    assert errors[200] < 0.1 * errors[20]


def test_length_scale_is_used(rng):
    target = random_gaussian(rng, 2)
    kernel = Gaussian(target.mean, 1.5 * target.cov)
    a = bayesian_monte_carlo(target.log_density, kernel, 100, length_scale=0.5, random_state=0)
    b = bayesian_monte_carlo(target.log_density, kernel, 100, length_scale=2.0, random_state=0)
    assert a.length_scale == 0.5 and not np.allclose(a.mean, b.mean)


def test_argument_errors(rng):
    target = random_gaussian(rng, 2)
    with pytest.raises(ValueError, match="too large"):
        bayesian_monte_carlo(target.log_density, target, MAX_BMC_SAMPLES + 1)
    with pytest.raises(ValueError, match="length_scale"):
        bayesian_monte_carlo(target.log_density, target, 50, length_scale=-1.0)


def test_fewer_points_than_the_gaussians_parameters_are_refused(rng):
    # Below n = (d+1)(d+2)/2 points the GP cannot resolve the Gaussian it fits: one point
    # gives the kernel's covariance times ℓ²/(1+ℓ²) whatever the target (0.71x its sds at
    # ℓ = 1). Refused before any draw, as variational sampling refuses it.
    target = random_gaussian(rng, 4)  # n = 15
    for n_samples in (1, 14):
        with pytest.raises(
            TooFewSamplesError, match=f"n_samples={n_samples} is fewer than"
        ) as error:
            bayesian_monte_carlo(target.log_density, target, n_samples)
        assert (error.value.n_samples, error.value.needed) == (n_samples, 15)
    assert bayesian_monte_carlo(target.log_density, target, 15, random_state=0).n_samples == 15


@pytest.mark.parametrize("n_samples", [1, 10])
def test_the_estimator_refuses_too_few_points(n_samples):
    # 4 features and the intercept: n = 21 parameters of the Gaussian over 5 dimensions.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    y = (X[:, 0] + rng.logistic(size=60) > 0).astype(int)
    estimator = vsbayes.BMCLogisticRegression(n_samples=n_samples, random_state=0)
    with pytest.raises(ValueError, match=r"n_samples >= 21"):
        estimator.fit(X, y)
