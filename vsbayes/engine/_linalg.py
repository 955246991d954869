"""Small dense linear algebra shared by the engine."""

from __future__ import annotations

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve, eigh

__all__ = ["solve_psd"]


def solve_psd(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve ``matrix @ x = rhs`` for a symmetric positive semi-definite matrix.

    The matrix is first scaled to unit diagonal (Jacobi), then factored by Cholesky. If it
    is numerically singular, the least-norm solution on its well-determined eigenspace is
    returned instead.
    """
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
