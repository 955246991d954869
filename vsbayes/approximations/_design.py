"""Marginals of ``a_iᵀθ`` over the signed design rows (dense or CSR), for EP and VB."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["row_moments"]


def row_moments(design, mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``a_iᵀμ`` and variance ``a_iᵀΣa_i`` of every ``a_iᵀθ`` under N(μ, Σ)."""
    spread = np.asarray(design @ cov)
    if sp.issparse(design):
        var = np.asarray(design.multiply(spread).sum(axis=1)).ravel()
    else:
        var = np.einsum("ij,ij->i", spread, design)
    return np.asarray(design @ mean).ravel(), var
