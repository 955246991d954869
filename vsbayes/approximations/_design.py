"""Products with the signed design ``A`` (dense or CSR) shared by the approximations."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["row_moments", "weighted_gram"]


def weighted_gram(design, weights: np.ndarray) -> np.ndarray:
    """``Aᵀ diag(weights) A`` as a dense array."""
    if sp.issparse(design):
        return (design.T @ design.multiply(weights[:, None]).tocsr()).toarray()
    return design.T @ (design * weights[:, None])


def row_moments(design, mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``a_iᵀμ`` and variance ``a_iᵀΣa_i`` of every ``a_iᵀθ`` under N(μ, Σ)."""
    spread = np.asarray(design @ cov)
    if sp.issparse(design):
        var = np.asarray(design.multiply(spread).sum(axis=1)).ravel()
    else:
        var = np.einsum("ij,ij->i", spread, design)
    return np.asarray(design @ mean).ravel(), var
