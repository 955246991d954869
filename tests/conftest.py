"""Fixtures of the test suite (helpers to import are in ``_helpers.py``)."""

from __future__ import annotations

import os

import numpy as np
import pytest


def _global_seeds() -> list[int]:
    """Seeds of ``global_random_seed``: ``VSBAYES_TESTS_GLOBAL_RANDOM_SEED`` is an int, a
    range ``a-b`` (inclusive) or ``all`` (0-99); unset, one seed (42) keeps the suite fast."""
    spec = os.environ.get("VSBAYES_TESTS_GLOBAL_RANDOM_SEED", "42")
    if spec == "all":
        return list(range(100))
    if "-" in spec:
        low, high = (int(s) for s in spec.split("-"))
        return list(range(low, high + 1))
    return [int(spec)]


@pytest.fixture(params=_global_seeds())
def global_random_seed(request):
    """A seed for tests whose assertion must hold for any seed (scikit-learn's practice):
    run them over many with ``VSBAYES_TESTS_GLOBAL_RANDOM_SEED=all``."""
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(20131007)


@pytest.fixture(scope="session")
def small_data():
    """30 observations, one feature: a skewed posterior over (slope, intercept)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(30)
    y = (rng.random(30) < 1 / (1 + np.exp(-(2.5 * x + 1)))).astype(int)
    return x[:, None], y
