"""Small dense linear algebra and safe exponentials shared by the engine."""

from __future__ import annotations

import numpy as np
from scipy.linalg import LinAlgError, eigh

from .._lapack import cho_factor, cho_solve
from ..exceptions import DegenerateEstimateError

__all__ = ["flushed_exp", "solve_psd"]

# exp(-300) = 5e-131: its square is still a normal float. Below it, values are set to 0, so
# that no subnormal numbers (100× slower on x86) enter the sums; relative to the largest
# weight (1 after the shifts used by the engine) they are far below round-off.
_FLUSH_BELOW = -300.0


def flushed_exp(x: np.ndarray) -> np.ndarray:
    """``exp(x)``, with exactly 0 where ``x < -300`` (never a subnormal or an underflow)."""
    return np.exp(x, where=x >= _FLUSH_BELOW, out=np.zeros_like(x))


def solve_psd(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve ``matrix @ x = rhs`` for a symmetric positive semi-definite matrix.

    The matrix is first scaled to unit diagonal (Jacobi), then factored by Cholesky. If it
    is numerically singular, the least-norm solution on its well-determined eigenspace is
    returned instead.

    Raises
    ------
    DegenerateEstimateError
        If the matrix or the right-hand side is not finite (a fit whose points overflowed,
        e.g. a kernel of variance 1e300 from a prior as vague): an estimation failure the
        estimators handle, not a linear-algebra one.
    """
    if not (np.isfinite(matrix).all() and np.isfinite(rhs).all()):
        raise DegenerateEstimateError(
            "The fit's curvature is not finite: its points overflowed (a prior too vague for "
            "the scale of the features?). Standardize the features or use a smaller C."
        )
    scale = np.sqrt(np.diag(matrix))
    scale[scale == 0.0] = 1.0
    scaled = matrix / np.outer(scale, scale)
    try:
        factor = cho_factor(scaled, check_finite=False)
        return cho_solve(factor, rhs / scale, check_finite=False) / scale
    except LinAlgError:
        w, v = eigh(scaled)
        keep = w > 1e-12 * w.max()
        return (v[:, keep] @ ((v[:, keep].T @ (rhs / scale)) / w[keep])) / scale
