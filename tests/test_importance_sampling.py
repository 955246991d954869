import math

import numpy as np
import pytest
from _helpers import Recorder, nearby_kernel, random_gaussian

from vsbayes import (
    Gaussian,
    bayesian_monte_carlo,
    importance_sampling,
    n_family_params,
    variational_sampling,
)
from vsbayes.exceptions import DegenerateEstimateError
from vsbayes.models import GaussianMixtureTarget


@pytest.mark.parametrize("rule", ["mc", "qmc"])
def test_vs_is_bmc_see_the_same_points(rng, rule):
    target = GaussianMixtureTarget.paper(3, 1.5, random_state=0)
    kernel = Gaussian(np.zeros(3), 1.5 * np.eye(3))
    recorders = [Recorder(target) for _ in range(3)]
    n = 4 * n_family_params(3)
    variational_sampling(recorders[0], kernel, n, rule=rule, rounds=1, random_state=11)
    importance_sampling(recorders[1], kernel, n, rule=rule, random_state=11)
    bayesian_monte_carlo(recorders[2], kernel, n, rule=rule, random_state=11)
    np.testing.assert_array_equal(recorders[0].points, recorders[1].points)
    np.testing.assert_array_equal(recorders[0].points, recorders[2].points)


def test_unbiased_within_monte_carlo_error(rng):
    target = random_gaussian(rng, 3, log_Z=0.5)
    kernel = Gaussian(target.mean, 2.0 * target.cov)  # p/π bounded: finite variance
    errors = []
    for seed in range(20):
        fit = importance_sampling(target.log_density, kernel, 2000, random_state=seed)
        errors.append(fit.log_Z - target.log_Z)
        # Error in units of the target sd: each is roughly N(0, 1/ESS); allow 5 sds.
        z_err = target.whiten(fit.mean[None])[0]
        assert np.all(np.abs(z_err) < 5 / math.sqrt(fit.ess))
    # Mean of 20 log_Z errors: sd about sqrt(Var(w)/N/20) < 0.01.
    assert abs(np.mean(errors)) < 0.01


def test_exact_when_kernel_is_target(rng):
    target = random_gaussian(rng, 2, log_Z=3.0)
    fit = importance_sampling(target.log_density, target, 500, random_state=0)
    assert fit.ess == pytest.approx(500, rel=1e-12)
    assert fit.log_Z == pytest.approx(3.0, abs=1e-12)


@pytest.mark.parametrize("log_Z", [5000.0, -5000.0])
def test_log_domain(rng, log_Z):
    target = random_gaussian(rng, 2, log_Z=log_Z)
    fit = importance_sampling(target.log_density, nearby_kernel(rng, target), 4000, random_state=0)
    assert abs(fit.log_Z - log_Z) < 5 / math.sqrt(fit.ess)


def test_adaptive_rounds_pool_draws(rng):
    target = GaussianMixtureTarget.paper(3, 2.0, random_state=3)
    kernel = Gaussian(target.moment_matched().mean, np.eye(3))
    fit = importance_sampling(target, kernel, 3000, rounds=3, kernel_scale=1.5, random_state=0)
    assert len(fit.rounds) == 3 and fit.n_samples == 3000
    assert fit.rounds[1].kernel is not kernel


def test_degenerate_weights_raise(rng):
    target = random_gaussian(rng, 5)
    with pytest.raises(DegenerateEstimateError, match="effective sample size"):
        importance_sampling(target.log_density, target, 3, random_state=0)
