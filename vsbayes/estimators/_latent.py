"""The latent value's posterior mean and variance at each row, in bounded row chunks.

For a Gaussian posterior N(μ, Σ) of ``w̃ = [w, b]``, the latent ``f = x̃·w̃`` (``x̃ = [x, 1]``
with an intercept) has mean ``x̃·μ`` and variance ``x̃ᵀ Σ x̃ = ‖Fᵀ x̃‖²`` for a factor
``Σ = F Fᵀ``. With the Cholesky factor, ``Fᵀ x̃ = F[:d]ᵀ x + F[d]`` and the intercept's
diagonal entry stands alone, so one product of a chunk of rows with ``F[:d]`` gives its
variances (and one with μ its means): sums of squares, which have no cancellation (unlike
``x Σ x + 2 x·b + c`` for uncentred features) and are never negative. A d × d Cholesky
factorization per call is negligible next to the product's d² per row.

Sparse rows with few non-zeros among many features take ``Σ_ab x_a x_b Σ_ab`` over their
non-zero pairs instead: ``k²`` terms for ``k`` non-zeros, against ``k d`` for the product.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from sklearn import get_config

from .._blas import blas_threads_for

__all__ = ["latent_chunks"]

# Rows × features per chunk at most, whatever working_memory allows: the chunk's arrays stay
# near the processor's caches (1e6 × 20 on 2 cores: 2^17 to 2^19 entries per chunk ran in
# 0.6× the time of one chunk of all rows; far smaller chunks pay Python's per-call cost).
_CACHE_ENTRIES = 2**19
# A gathered pair costs about this many multiply-adds of the product (random access into Σ).
_GATHER_COST = 8
# Bytes per pair of the pair gather's temporaries (a dozen index and value arrays).
_PAIR_BYTES = 96
# Chunk products below this many multiply-adds run on one BLAS thread, i.e. all of them in
# practice: between products, the idle threads of NumPy's and SciPy's OpenBLAS pools spin
# against the predictive's element-wise passes (1e6 × 20 on 2 cores: 1.0 s on two threads,
# 0.23 s on one; 3e5 × 200: 1.03 s and 1.05 s).
_BLAS_SMALL = 2**31


def _chunk_rows(row_bytes: float, n_rows: int) -> int:
    """Rows per chunk within scikit-learn's ``working_memory`` (MiB)."""
    budget = get_config()["working_memory"] * 2**20
    return int(max(1, min(n_rows, budget // row_bytes)))


def _factor(cov: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(W, offset, const)`` with ``x̃ᵀ cov x̃ = ‖Wᵀ x + offset‖² + const`` for every x.

    ``cov`` is (d, d) or, with an intercept last, (d + 1, d + 1).
    """
    try:
        lower = scipy.linalg.cholesky(cov, lower=True, check_finite=False)
    except scipy.linalg.LinAlgError:
        # Positive semi-definite to round-off only: a symmetric square root of its clipped
        # eigenvalues (not triangular, so the intercept row keeps every column).
        eigval, eigvec = np.linalg.eigh(cov)
        root = eigvec * np.sqrt(np.maximum(eigval, 0.0))
        offset = root[d] if cov.shape[0] > d else np.zeros(root.shape[1])
        return np.ascontiguousarray(root[:d]), offset, 0.0
    if cov.shape[0] == d:
        return lower, np.zeros(d), 0.0
    return lower[:d, :d], lower[d, :d].copy(), float(lower[d, d] ** 2)


def _pair_chunks(X: sp.csr_matrix, budget: float) -> Iterator[slice]:
    """Row slices of X whose non-zero pairs (``Σ k_r²``) fit in ``budget`` bytes."""
    counts = np.diff(X.indptr).astype(np.int64)
    pairs = np.cumsum(counts * counts)
    per_chunk = max(1, int(budget // _PAIR_BYTES))
    start = 0
    while start < X.shape[0]:
        done = pairs[start - 1] if start else 0
        stop = int(np.searchsorted(pairs, done + per_chunk, side="right"))
        stop = max(stop, start + 1)
        yield slice(start, stop)
        start = stop


def _pair_quadratic_forms(X: sp.csr_matrix, covs: np.ndarray, d: int) -> np.ndarray:
    """``xᵀ A x`` with ``A = cov[:d, :d]`` for each row of X and each cov, over the non-zero
    pairs of each row: (n_rows, n_problems)."""
    n_rows = X.shape[0]
    counts = np.diff(X.indptr).astype(np.int64)
    per_nnz = np.repeat(counts, counts)  # each non-zero: its row's count
    n_pairs = int(per_nnz.sum())
    # Pair j of non-zero a pairs it with the non-zeros of a's row, in order.
    first = np.repeat(np.arange(per_nnz.size), per_nnz)
    row_start = np.repeat(X.indptr[:-1].astype(np.int64), counts)[first]
    within = np.arange(n_pairs) - np.repeat(np.cumsum(per_nnz) - per_nnz, per_nnz)
    second = row_start + within
    values = X.data[first] * X.data[second]
    rows = np.repeat(np.arange(n_rows), counts)[first]
    width = covs.shape[-1]
    flat = X.indices[first].astype(np.int64) * width + X.indices[second]
    out = np.empty((n_rows, len(covs)))
    for k, cov in enumerate(covs):
        out[:, k] = np.bincount(rows, values * cov.ravel()[flat], minlength=n_rows)
    return out


def latent_chunks(
    X, coef: np.ndarray, intercept: np.ndarray, covs: np.ndarray
) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """Posterior mean and variance of the latent value, chunk of rows by chunk of rows.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_rows, d)
        Validated float64 rows.
    coef : ndarray of shape (n_problems, d)
        Posterior means of the coefficients.
    intercept : ndarray of shape (n_problems,)
        Posterior means of the intercepts (zeros without one).
    covs : ndarray of shape (n_problems, d, d) or (n_problems, d + 1, d + 1)
        Posterior covariances, intercept last when it is fitted.

    Yields
    ------
    rows : slice
        The chunk's rows, consecutive and covering X in order.
    mean, var : ndarray of shape (chunk_rows, n_problems)
    """
    n_rows, d = X.shape
    n_problems = len(coef)
    sparse = sp.issparse(X)
    counts = np.diff(X.indptr) if sparse else None
    pair_work = float(np.dot(counts, counts)) * _GATHER_COST if sparse else np.inf
    if sparse and pair_work < X.nnz * d:
        yield from _latent_pair_chunks(X, coef, intercept, covs)
        return
    factors = [_factor(cov, d) for cov in covs]
    coef_t = np.ascontiguousarray(coef.T)
    # Per row: each problem's product (its factor's columns), mean and variance, and the
    # predictive's temporaries downstream (about 24 per problem).
    chunk = _chunk_rows(8.0 * n_problems * (d + 26), n_rows)
    chunk = min(chunk, max(1, _CACHE_ENTRIES // d))
    with blas_threads_for(chunk * d * d, small=_BLAS_SMALL):
        for start in range(0, n_rows, chunk):
            rows = slice(start, min(start + chunk, n_rows))
            block = X[rows]
            mean = np.asarray(block @ coef_t)
            mean += intercept
            var = np.empty_like(mean)
            for k, (weights, offset, const) in enumerate(factors):
                product = np.asarray(block @ weights)
                product += offset
                var[:, k] = np.einsum("ij,ij->i", product, product)
                var[:, k] += const
            yield rows, mean, var


def _latent_pair_chunks(X, coef, intercept, covs):
    d = X.shape[1]
    budget = get_config()["working_memory"] * 2**20
    for rows in _pair_chunks(X, budget):
        block = X[rows]
        mean = np.asarray(block @ coef.T) + intercept
        var = _pair_quadratic_forms(block, covs, d)
        if covs.shape[-1] > d:  # intercept: 2 x·Σ[:d, d] + Σ[d, d]
            var += 2.0 * np.asarray(block @ covs[:, :d, d].T) + covs[:, d, d]
        np.maximum(var, 0.0, out=var)  # round-off only: the covariances are PD
        yield rows, mean, var
