"""SciPy's Cholesky factorization and its solves, calling LAPACK directly on float64.

``scipy.linalg.cho_factor``, ``cho_solve`` and ``solve_triangular`` pass every call through
SciPy's array-API and batching wrappers and a LAPACK lookup: about 25 µs a call on this
machine, against 3-10 µs for the LAPACK routine on the matrices of a small fit (d ≤ 30),
and a small fit makes 13-85 such calls (D-212). These functions take the same
arguments and call the same LAPACK routines (``potrf``, ``potrs``, ``trtrs``) with the
same flags on the same arrays, so their results are SciPy's to the bit; anything else
(another dtype, a stack of matrices, an empty right-hand side) goes to SciPy itself.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.linalg import LinAlgError
from scipy.linalg.lapack import dpotrf, dpotrs, dtrtrs

__all__ = ["cho_factor", "cho_solve", "solve_triangular"]

_FLOAT = np.dtype(np.float64)


def _plain(a, check_finite: bool):
    """``a`` as an ndarray (checked finite if asked), and whether it is a new array."""
    array = np.asarray_chkfinite(a) if check_finite else np.asarray(a)
    # (as SciPy's ``_datacopied``: LAPACK may then overwrite it)
    if array is a or (not isinstance(a, np.ndarray) and hasattr(a, "__array__")):
        return array, False
    return array, array.base is None


def _lapack_shaped(matrix: np.ndarray, rhs: np.ndarray) -> bool:
    """Whether a solve takes the LAPACK call: a float64 matrix and a non-empty float64
    right-hand side of one or two dimensions (SciPy itself takes the rest)."""
    return (
        matrix.dtype == _FLOAT
        and rhs.dtype == _FLOAT
        and matrix.ndim == 2
        and rhs.ndim in (1, 2)
        and rhs.size > 0
    )


def cho_factor(a, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True):
    """``scipy.linalg.cho_factor``, the same bits."""
    a1, copied = _plain(a, check_finite)
    if a1.dtype != _FLOAT or a1.ndim != 2 or a1.shape[0] != a1.shape[1] or a1.size == 0:
        return scipy.linalg.cho_factor(a1, lower=lower, overwrite_a=overwrite_a)
    c, info = dpotrf(a1, lower=lower, overwrite_a=overwrite_a or copied, clean=False)
    if info > 0:
        raise LinAlgError(f"{info}-th leading minor of the array is not positive definite")
    if info < 0:
        raise ValueError(f'LAPACK reported an illegal value in {-info}-th argument of "POTRF".')
    return c, lower


def cho_solve(c_and_lower, b, overwrite_b: bool = False, check_finite: bool = True):
    """``scipy.linalg.cho_solve``, the same bits."""
    c, lower = c_and_lower
    c1, _ = _plain(c, check_finite)
    b1, copied = _plain(b, check_finite)
    if not _lapack_shaped(c1, b1):
        return scipy.linalg.cho_solve((c1, lower), b1, overwrite_b=overwrite_b)
    if c1.shape[0] != c1.shape[1]:
        raise ValueError("The factored matrix c is not square.")
    if c1.shape[1] != b1.shape[0]:
        raise ValueError(f"incompatible dimensions ({c1.shape} and {b1.shape})")
    x, info = dpotrs(c1, b1, lower=lower, overwrite_b=overwrite_b or copied)
    if info != 0:
        raise ValueError(f"illegal value in {-info}th argument of internal potrs")
    return x


def solve_triangular(
    a,
    b,
    trans=0,
    lower: bool = False,
    unit_diagonal: bool = False,
    overwrite_b: bool = False,
    check_finite: bool = True,
):
    """``scipy.linalg.solve_triangular``, the same bits."""
    a1, _ = _plain(a, check_finite)
    b1, copied = _plain(b, check_finite)
    trans = {"N": 0, "T": 1, "C": 2}.get(trans, trans)
    if not _lapack_shaped(a1, b1) or trans not in (0, 1):
        return scipy.linalg.solve_triangular(
            a1, b1, trans=trans, lower=lower, unit_diagonal=unit_diagonal, overwrite_b=overwrite_b
        )
    if a1.shape[0] != a1.shape[1]:
        raise ValueError("expected square matrix")
    if a1.shape[0] != b1.shape[0]:
        raise ValueError(f"shapes of a {a1.shape} and b {b1.shape} are incompatible")
    overwrite_b = overwrite_b or copied
    if a1.flags.f_contiguous:
        x, info = dtrtrs(
            a1, b1, overwrite_b=overwrite_b, lower=lower, trans=trans, unitdiag=unit_diagonal
        )
    else:  # (the transposed system: trtrs expects Fortran order, as SciPy does)
        x, info = dtrtrs(
            a1.T,
            b1,
            overwrite_b=overwrite_b,
            lower=not lower,
            trans=not trans,
            unitdiag=unit_diagonal,
        )
    if info > 0:
        raise LinAlgError(f"singular matrix: resolution failed at diagonal {info - 1}")
    if info < 0:
        raise ValueError(f"illegal value in {-info}-th argument of internal trtrs")
    return x
