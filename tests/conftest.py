"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import numpy as np
import pytest

from vsbayes import Gaussian


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


@pytest.fixture
def rng():
    return np.random.default_rng(20131007)
