"""Helpers shared by the tests (importable in any import mode: ``pythonpath`` in
pyproject.toml puts this directory on ``sys.path``; fixtures live in conftest.py)."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from vsbayes import Gaussian
from vsbayes.estimators import ESTIMATORS, INTERCEPT_PRIOR_VAR, METHODS
from vsbayes.models import BinaryGLMPosterior

# From the estimators' registry: a new estimator is tested without editing this file.
DETERMINISTIC = [c for m in METHODS.values() if not m.sampling for c in m.classes.values()]
SAMPLING = [c for m in METHODS.values() if m.sampling for c in m.classes.values()]
ALL = list(ESTIMATORS)


def make(cls, **params):
    if cls in SAMPLING:
        params.setdefault("random_state", 0)
    return cls(**params)


def assert_valid_fit(estimator, X) -> None:
    """What every successful fit guarantees: finite attributes, a symmetric positive-definite
    posterior covariance per problem, and predictive probabilities that are distributions."""
    for name in ("coef_", "intercept_", "sigma_", "log_marginal_likelihood_value_"):
        assert np.all(np.isfinite(getattr(estimator, name))), name
    covs = estimator.sigma_ if estimator.sigma_.ndim == 3 else estimator.sigma_[None]
    for cov in covs:
        np.testing.assert_array_equal(cov, cov.T)
        np.linalg.cholesky(cov)  # raises unless positive definite
    proba = estimator.predict_proba(X)
    assert np.all((proba >= 0) & (proba <= 1))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)


#: Prior variance of the small 2-D GLM problem (vague enough for a skewed posterior).
C_SMALL = 10.0


def random_spd(rng, d, low=0.5, high=2.0):
    """Random symmetric positive-definite matrix with eigenvalues in [low, high]."""
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * rng.uniform(low, high, d)) @ q.T


def random_gaussian(rng, d, log_Z=0.0, diagonal=False):
    cov = np.diag(rng.uniform(0.5, 2.0, d)) if diagonal else random_spd(rng, d)
    return Gaussian(rng.standard_normal(d), cov, log_Z)


def nearby_kernel(rng, target, offset=0.5, low=0.6, high=1.6):
    """A kernel whose mean is ``offset`` target sds away and whose covariance is the
    target's, distorted by factors in [low, high]: 'arbitrary but non-degenerate'."""
    d = target.dim
    half = target.chol @ random_spd(rng, d, np.sqrt(low), np.sqrt(high))
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    return Gaussian(target.mean + offset * target.chol @ direction, half @ half.T)


class Recorder:
    """Wraps a log-density and keeps every batch of points it was called with."""

    def __init__(self, log_target):
        self.log_target = log_target
        self.calls = []

    def __call__(self, x):
        self.calls.append(np.array(x, copy=True))
        return self.log_target(x)

    @property
    def points(self):
        return np.concatenate(self.calls)


def quadrature_posterior(X, y, link, C, around: Gaussian) -> Gaussian:
    """Evidence, mean and covariance of a 2-parameter GLM posterior by the trapezoid rule
    on ±12 sd of ``around``; the integrand is smooth and decays like a Gaussian, so the
    rule's error is far below the Monte Carlo errors it is compared with."""
    model = BinaryGLMPosterior(
        X, 2.0 * y - 1, np.ones(len(y)), link, prior_var=C, intercept_prior_var=INTERCEPT_PRIOR_VAR
    )
    grid = np.linspace(-12, 12, 601)
    sd = np.sqrt(np.diag(around.cov))
    a, b = np.meshgrid(around.mean[0] + grid * sd[0], around.mean[1] + grid * sd[1])
    points = np.column_stack([a.ravel(), b.ravel()])
    log_p = model.log_density(points)
    cell = (grid[1] - grid[0]) ** 2 * sd[0] * sd[1]
    weights = np.exp(log_p - logsumexp(log_p))
    mean = weights @ points
    centered = points - mean
    cov = (centered * weights[:, None]).T @ centered
    return Gaussian(mean, cov, logsumexp(log_p) + np.log(cell))
