"""vsbayes._lapack: SciPy's Cholesky factorization and solves, the same bits."""

import numpy as np
import pytest
import scipy.linalg

from vsbayes import _lapack


@pytest.mark.parametrize("d", [1, 6, 40])
def test_the_factor_and_the_solves_are_scipys_to_the_bit(rng, d):
    a = rng.standard_normal((d, d + 3))
    spd = a @ a.T + 0.1 * np.eye(d)
    rhs = [
        rng.standard_normal(d),
        rng.standard_normal((d, 5)),
        np.asfortranarray(rng.standard_normal((d, 3))),
        list(rng.standard_normal(d)),
    ]
    for lower in (True, False):
        ours, theirs = (
            _lapack.cho_factor(spd, lower=lower),
            scipy.linalg.cho_factor(spd, lower=lower),
        )
        np.testing.assert_array_equal(ours[0], theirs[0])
        assert ours[1] == theirs[1]
        for b in rhs:
            np.testing.assert_array_equal(
                _lapack.cho_solve(ours, b), scipy.linalg.cho_solve(theirs, b)
            )
    factor = np.linalg.cholesky(spd)
    for triangle, lower in [
        (factor, True),
        (factor.T, False),
        (np.asfortranarray(factor), True),
        (np.asfortranarray(factor.T), False),
    ]:
        for trans in (0, 1, "T"):
            for b in rhs:
                np.testing.assert_array_equal(
                    _lapack.solve_triangular(triangle, b, trans=trans, lower=lower),
                    scipy.linalg.solve_triangular(triangle, b, trans=trans, lower=lower),
                )


def test_inputs_are_left_alone_and_errors_are_scipys(rng):
    spd = np.array([[2.0, 0.5], [0.5, 1.0]])
    b = rng.standard_normal(2)
    kept = b.copy()
    _lapack.cho_solve(_lapack.cho_factor(spd), b)
    _lapack.solve_triangular(np.linalg.cholesky(spd), b, lower=True)
    np.testing.assert_array_equal(b, kept)
    with pytest.raises(scipy.linalg.LinAlgError, match="not positive definite"):
        _lapack.cho_factor(-spd)
    with pytest.raises(scipy.linalg.LinAlgError, match="singular"):
        _lapack.solve_triangular(np.zeros((2, 2)), b)
    with pytest.raises(ValueError, match="infs or NaNs"):
        _lapack.cho_solve((spd, True), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="incompatible"):
        _lapack.cho_solve((spd, True), np.ones(3))
    # (other dtypes go to SciPy itself)
    np.testing.assert_array_equal(
        _lapack.cho_solve((spd.astype(np.float32), True), np.ones(2, np.float32)),
        scipy.linalg.cho_solve((spd.astype(np.float32), True), np.ones(2, np.float32)),
    )
