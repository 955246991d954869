"""The layer-0 sums: compensated totals and ``log Σ exp``."""

import numpy as np
import pytest
from scipy import special

from vsbayes._sums import CompensatedSum, logsumexp


@pytest.mark.parametrize(
    ("shape", "axis", "keepdims"),
    [((7,), None, False), ((3, 7), 0, False), ((3, 7), 1, True), ((4, 5, 6), 1, False),
     ((4, 5), None, True)],
)  # fmt: skip
def test_logsumexp_matches_scipy(shape, axis, keepdims):
    a = 300.0 * np.random.default_rng(0).normal(size=shape)  # exp alone would overflow
    expected = special.logsumexp(a, axis=axis, keepdims=keepdims)
    result = logsumexp(a, axis=axis, keepdims=keepdims)
    assert np.shape(result) == np.shape(expected)
    np.testing.assert_allclose(result, expected, rtol=1e-13)


def test_logsumexp_infinite_and_nan_terms():
    a = np.array([[-np.inf, -np.inf], [-np.inf, 2.0], [np.inf, 1.0], [np.nan, 1.0]])
    np.testing.assert_array_equal(logsumexp(a, axis=1), [-np.inf, 2.0, np.inf, np.nan])


def test_compensated_sum_does_not_depend_on_grouping():
    parts = (
        np.random.default_rng(1).normal(size=(1000, 3))
        * 10.0 ** np.arange(-8, 8, 16 / 1000)[:, None]
    )
    forward, backward = CompensatedSum(3), CompensatedSum(3)
    for part in parts:
        forward.add(part)
    for part in parts[::-1]:
        backward.add(part)
    np.testing.assert_array_equal(forward.result(), backward.result())
