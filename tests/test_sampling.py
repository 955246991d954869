import math
import warnings

import numpy as np
import pytest
from _helpers import random_gaussian
from scipy import stats
from scipy.linalg import solve_triangular

from vsbayes._random import as_generator
from vsbayes.engine.sample_pool import Frame, SamplePool
from vsbayes.sampling import MonteCarlo, ScrambledSobol, draw_from_kernel, get_rule


def test_get_rule():
    assert isinstance(get_rule("mc"), MonteCarlo)
    assert isinstance(get_rule("qmc"), ScrambledSobol)
    rule = ScrambledSobol()
    assert get_rule(rule) is rule
    with pytest.raises(ValueError, match="rule must be one of"):
        get_rule("sobol")


@pytest.mark.parametrize("rule", [MonteCarlo(), ScrambledSobol()])
def test_rules_give_points_and_normalized_weights(rule):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no balance warning for n not a power of two
        z, log_w = rule.standard_normal(100, 3, np.random.default_rng(0))
    assert z.shape == (100, 3) and log_w.shape == (100,)
    assert np.isfinite(z).all()
    assert math.isclose(np.exp(log_w).sum(), 1.0, rel_tol=1e-12)
    z2, _ = rule.standard_normal(100, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(z, z2)
    z3, _ = rule.standard_normal(100, 3, np.random.default_rng(1))
    assert not np.array_equal(z, z3)


def test_qmc_integrates_better_than_mc():
    # Mean of the squared norm (exactly d) estimated from 1024 points, over 20 seeds.
    d, n = 4, 1024
    errors = {}
    for rule in (MonteCarlo(), ScrambledSobol()):
        errs = []
        for seed in range(20):
            z, _ = rule.standard_normal(n, d, np.random.default_rng(seed))
            errs.append(abs(np.square(z).sum(axis=1).mean() - d))
        errors[rule.name] = np.median(errs)
    # MC error is about sqrt(2d/n) = 0.088; scrambled Sobol is much more accurate.
    assert errors["qmc"] < 0.2 * errors["mc"]


def test_draws_through_kernel(rng):
    kernel = random_gaussian(rng, 3)
    draws = draw_from_kernel(kernel, 20000, MonteCarlo(), np.random.default_rng(3))
    np.testing.assert_allclose(draws.x, kernel.mean + draws.z @ kernel.chol.T, atol=1e-12)
    sd_of_mean = np.sqrt(np.diag(kernel.cov) / 20000)
    assert np.all(np.abs(draws.x.mean(axis=0) - kernel.mean) < 5 * sd_of_mean)


def _mixture_log_pdf(x, components):
    """log Σ share × N(x; kernel) over ``(share, kernel)`` pairs, by scipy."""
    return np.log(
        sum(share * stats.multivariate_normal(k.mean, k.cov).pdf(x) for share, k in components)
    )


def test_pool_window_and_coordinates_from_the_stored_draws(rng):
    # The pool maps each round's whitened draws into other kernels' coordinates (never
    # solving against x): check both against scipy and a direct solve from x.
    a, b = random_gaussian(rng, 3), random_gaussian(rng, 3)
    pool = SamplePool()
    for kernel, n in ((a, 40), (b, 60)):
        draws = draw_from_kernel(kernel, n, MonteCarlo(), rng)
        pool.add(kernel, draws, np.zeros(n))
    x = pool.x
    np.testing.assert_allclose(
        pool.log_window(), _mixture_log_pdf(x, ((0.4, a), (0.6, b))), rtol=1e-12
    )
    for kernel in (a, b):
        direct = solve_triangular(kernel.chol, (x - kernel.mean).T, lower=True).T
        np.testing.assert_allclose(pool.coordinates(Frame(kernel)), direct, atol=1e-12)
        columns = pool.homogeneous_columns(Frame(kernel))  # the full family's layout
        np.testing.assert_allclose(columns[:-1], direct.T, atol=1e-12)
        np.testing.assert_array_equal(columns[-1], 1.0)
        # The norms homogeneous_columns keeps for the window are the squared norms.
        pool._norms.clear()
        pool.homogeneous_columns(Frame(kernel))
        np.testing.assert_allclose(
            pool.squared_norms(kernel), np.square(direct).sum(axis=1), rtol=1e-12
        )
    # A third round, folded into the window kept from the first two.
    c = random_gaussian(rng, 3)
    pool.add(c, draw_from_kernel(c, 100, MonteCarlo(), rng), np.zeros(100))
    np.testing.assert_allclose(
        pool.log_window(), _mixture_log_pdf(pool.x, ((0.2, a), (0.3, b), (0.5, c))), rtol=1e-12
    )
    # A round that reuses a kernel (after a failed fit) is one more component of it.
    pool.add(c, draw_from_kernel(c, 50, MonteCarlo(), rng), np.zeros(50))
    np.testing.assert_allclose(
        pool.log_window(), _mixture_log_pdf(pool.x, ((0.16, a), (0.24, b), (0.6, c))), rtol=1e-12
    )


def test_as_generator():
    assert as_generator(3).integers(1000) == np.random.default_rng(3).integers(1000)
    g = np.random.default_rng(0)
    assert as_generator(g) is g
    assert isinstance(as_generator(None), np.random.Generator)
    r1 = as_generator(np.random.RandomState(5)).integers(1000)
    r2 = as_generator(np.random.RandomState(5)).integers(1000)
    assert r1 == r2
    for bad in ("seed", -1):  # NumPy's own error for -1 names no parameter
        with pytest.raises(ValueError, match="random_state"):
            as_generator(bad)
