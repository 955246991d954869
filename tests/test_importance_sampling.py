import math
import warnings

import numpy as np
import pytest
from _helpers import Recorder, nearby_kernel, random_gaussian

import vsbayes
from vsbayes import (
    Gaussian,
    bayesian_monte_carlo,
    importance_sampling,
    n_family_params,
    variational_sampling,
)
from vsbayes.exceptions import TooFewSamplesError, UnreliableFitWarning
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


def test_fewer_points_than_n_refused_before_drawing(rng):
    # Even the target's own points (ESS = N) give moments too narrow below n: refused, as
    # VS and BMC refuse, with nothing evaluated.
    target = random_gaussian(rng, 5)
    recorder = Recorder(target.log_density)
    n = n_family_params(5)
    with pytest.raises(TooFewSamplesError, match=f"n_samples={n - 1} is fewer than the n={n}"):
        importance_sampling(recorder, target, n - 1, random_state=0)
    assert recorder.calls == []


def _half_space(kernel):
    """The kernel's density on x_0 > 0, e^-50 times it elsewhere: the weights are 1 or
    e^-50, so the effective sample size is the number of points with x_0 > 0 (to 1e-20)."""

    def log_target(x):
        return kernel.log_density(x) - 50.0 * (x[:, 0] <= 0)

    return Recorder(log_target)


def test_effective_points_below_n_are_returned_warned(rng):
    # Between the covariance's rank (d + 1) and n the moments are noisy, not singular: they
    # are the weighted moments of the effective points, with the warning of below 2n.
    kernel = Gaussian(np.zeros(3), np.eye(3))
    n = n_family_params(3)  # 10
    target = _half_space(kernel)
    with pytest.warns(UnreliableFitWarning, match=f"below 2n = {2 * n}"):
        fit = importance_sampling(target, kernel, 16, random_state=0)
    inside = target.points[target.points[:, 0] > 0]
    assert 3 + 1 <= len(inside) < n  # between the singular covariance's floor and n
    assert fit.ess == pytest.approx(len(inside), rel=1e-12)
    # The other points' weights are e^-50 of these: their share is ~1e-21.
    np.testing.assert_allclose(fit.mean, inside.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(fit.cov, np.cov(inside.T, bias=True), rtol=0, atol=1e-12)


def test_effective_points_below_2n_warn(rng):
    kernel = Gaussian(np.zeros(3), np.eye(3))
    n = n_family_params(3)
    target = _half_space(kernel)
    with pytest.warns(UnreliableFitWarning, match=f"below 2n = {2 * n}"):
        fit = importance_sampling(target, kernel, 30, random_state=0)
    ess = int((target.points[:, 0] > 0).sum())
    assert n <= ess < 2 * n
    assert fit.ess == pytest.approx(ess, rel=1e-12)


def test_no_warning_from_2n_effective_points(rng):
    target = random_gaussian(rng, 3)
    n = n_family_params(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableFitWarning)
        fit = importance_sampling(target.log_density, target, 2 * n + 1, random_state=0)
    assert fit.ess == pytest.approx(2 * n + 1, rel=1e-12)  # the kernel is the target


def test_singular_intermediate_round_keeps_the_kernel(rng):
    # An intermediate round only proposes: its floor stays d+1 (a covariance), not n.
    kernel = Gaussian(np.zeros(3), np.eye(3))
    target = _half_space(kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreliableFitWarning)
        fit = importance_sampling(target, kernel, 64, rounds=4, kernel_scale=1.5, random_state=0)
    assert fit.rounds[0].fitted  # round 1: 16 points, ESS < n, still proposes round 2
    assert fit.rounds[1].kernel is not kernel


def _four_features():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    return X, (X[:, 0] + rng.logistic(size=60) > 0).astype(int)


@pytest.mark.parametrize("cls", [vsbayes.ISLogisticRegression, vsbayes.ISProbitRegression])
def test_the_estimators_refuse_fewer_points_than_n(cls):
    # 4 features and the intercept: n = 21. At 10 points the moments' sds were 0.51-0.83x
    # EP's, returned silently; now refused before drawing, as by VS and BMC.
    with pytest.raises(TooFewSamplesError, match=r"n_samples >= 21") as error:
        cls(n_samples=10, random_state=0).fit(*_four_features())
    assert (error.value.n_samples, error.value.needed) == (10, 21)


def test_the_estimator_keeps_its_moments_below_n_effective_points():
    # N = n: the effective sample size is below N unless all weights are equal, so below n;
    # the moments are kept (on the paper's data closer than Laplace's), with the warning.
    with pytest.warns(UnreliableFitWarning, match="below 2n = 42"):
        fit = vsbayes.ISLogisticRegression(n_samples=21, random_state=0).fit(*_four_features())
    assert fit.laplace_fallback_.tolist() == [False]
    assert 5 + 1 <= fit.posteriors_[0].ess < 21  # d = 5 with the intercept


def test_the_estimator_warns_below_2n_effective_points():
    with pytest.warns(UnreliableFitWarning, match="below 2n = 42"):
        fit = vsbayes.ISLogisticRegression(n_samples=42, random_state=0).fit(*_four_features())
    assert fit.laplace_fallback_.tolist() == [False]
    assert 21 <= fit.posteriors_[0].ess < 42
