"""Quadratic forms of a binary GLM's signed design ``A`` (dense or CSR), without densifying it:
the rows' ``a_iᵀ Σ a_i`` and the diagonal of ``Aᵀ diag(τ) A``."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..models import BinaryGLMPosterior

__all__ = ["precision_diagonal", "row_variances"]


def row_variances(design, cov: np.ndarray, max_bytes: int) -> np.ndarray:
    """``a_iᵀ Σ a_i`` for every row ``a_i`` of a dense or CSR design, in bounded blocks.

    Dense: ``(A Σ ∘ A)`` summed over row blocks of at most ``max_bytes``. CSR: a sum over
    the pairs of each row's non-zeros, gathered from Σ (no dense row is formed).

    Parameters
    ----------
    design : ndarray or scipy.sparse CSR matrix of shape (M, p)
    cov : ndarray of shape (p, p)
        Symmetric matrix.
    max_bytes : int
        Bound on the temporaries of one block.

    Returns
    -------
    ndarray of shape (M,)
    """
    if not sp.issparse(design):
        m, p = design.shape
        block = max(1, max_bytes // (8 * p))
        out = np.empty(m)
        for j in range(0, m, block):
            rows = design[j : j + block]
            out[j : j + block] = np.einsum("ij,ij->i", rows @ cov, rows)
        return out
    return _sparse_quadratic_forms(design, cov, max_bytes)


def _sparse_quadratic_forms(design: sp.csr_matrix, cov: np.ndarray, max_bytes: int) -> np.ndarray:
    """CSR rows: pairs of non-zeros in row blocks of bounded size (six 8-byte arrays per
    pair)."""
    m = design.shape[0]
    counts = np.diff(design.indptr)
    out = np.zeros(m)
    cost = np.cumsum(np.square(counts.astype(np.int64)))
    start = 0
    while start < m:
        budget = (cost[start - 1] if start else 0) + max(1, max_bytes // 48)
        stop = max(start + 1, int(np.searchsorted(cost, budget, side="right")))
        block = design[start:stop]
        rows = np.repeat(np.arange(stop - start), np.diff(block.indptr))
        partners = np.diff(block.indptr)[rows]  # each non-zero pairs with its row's
        first = np.repeat(np.arange(block.nnz), partners)
        offsets = np.arange(first.size) - np.repeat(np.cumsum(partners) - partners, partners)
        second = block.indptr[rows[first]] + offsets
        values = block.data[first] * block.data[second]
        values *= cov[block.indices[first], block.indices[second]]
        out[start:stop] = np.bincount(rows[first], weights=values, minlength=stop - start)
        start = stop
    return out


def precision_diagonal(model: BinaryGLMPosterior, tau: np.ndarray) -> np.ndarray:
    """The diagonal of ``H = diag(1/prior_var) + Aᵀ diag(τ) A``, without forming H.

    Parameters
    ----------
    model : BinaryGLMPosterior
        The model giving ``A`` and ``prior_var``.
    tau : ndarray of shape (M,)
        Site precisions.

    Returns
    -------
    ndarray of shape (p,)
    """
    design = model.design
    if sp.issparse(design):
        squares = np.asarray(design.multiply(design).T @ tau).ravel()
    else:
        squares = np.einsum("ij,ij,i->j", design, design, tau)  # no (M, p) temporary
    return squares + 1.0 / model.prior_var
