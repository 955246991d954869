"""The latent value's posterior mean and variance at each row, in bounded row chunks.

For a Gaussian posterior N(μ, Σ) of ``w̃ = [w, b]``, the latent ``f = x̃·w̃`` (``x̃ = [x, 1]``
with an intercept) has mean ``x̃·μ`` and variance ``x̃ᵀ Σ x̃ = ‖Fᵀ x̃‖²`` for a factor
``Σ = F Fᵀ``. With the Cholesky factor of Σ ordered intercept first, ``F = [[r, 0], [c, W]]``,
``Fᵀ x̃ = [r + c·x, Wᵀ x]``: one product of a chunk of rows with W and one with ``[c, μ]``
give its variances ``‖Wᵀ x‖² + (r + c·x)²`` and its means. Sums of squares have no
cancellation (unlike ``x Σ x + 2 x·b + c`` for uncentred features) and are never negative.
A d × d Cholesky factorization per call is negligible next to the product's d² per row.

Sparse rows with few non-zeros among many features take ``Σ_ab x_a x_b Σ_ab`` over their
non-zero pairs instead: ``k(k + 1)/2`` terms for ``k`` non-zeros, against ``k d`` for the
product.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from .._blas import blas_thread_count, map_blocks, single_blas_thread
from .._memory import block_bytes

__all__ = ["LatentMoments"]

# Rows × features per chunk at most, whatever block_bytes allows: the chunk's arrays stay
# near the processor's caches (1e6 × 20 on 2 cores: 2^17 to 2^19 entries per chunk ran in
# 0.6× the time of one chunk of all rows; far smaller chunks pay Python's per-call cost).
_CACHE_ENTRIES = 2**19
# A gathered pair costs about this many multiply-adds of the product (random access into Σ).
_GATHER_COST = 8
# Bytes per pair of the pair gather's temporaries (a dozen index and value arrays).
_PAIR_BYTES = 96
# Pairs per chunk at most, whatever block_bytes allows (the cache bound of the gather).
_CACHE_PAIRS = 2**20


def _factor(cov: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(W, c, r)`` with ``x̃ᵀ cov x̃ = ‖Wᵀ x‖² + (r + c·x)²`` for every x, W (d, d) lower
    triangular.

    ``cov`` is (d, d) (then c = 0, r = 0) or, with an intercept last, (d + 1, d + 1):
    factored with the intercept first, its Cholesky factor [[r, 0], [c, W]] puts the
    intercept in one column, so the other d need no offset.
    """
    order = np.r_[d, :d] if cov.shape[0] > d else np.arange(d)
    ordered = cov[np.ix_(order, order)]
    try:
        lower = scipy.linalg.cholesky(ordered, lower=True, check_finite=False)
    except scipy.linalg.LinAlgError:
        # Positive semi-definite to round-off only: its clipped eigenvalues, plus a ridge
        # of 1e-13 of the largest (a change of v below round-off), make it definite.
        eigval, eigvec = np.linalg.eigh(ordered)
        clipped = np.maximum(eigval, 0.0)
        ordered = (eigvec * clipped) @ eigvec.T
        ordered[np.diag_indices_from(ordered)] += 1e-13 * max(clipped.max(), 1e-300)
        lower = scipy.linalg.cholesky(ordered, lower=True, check_finite=False)
    if cov.shape[0] == d:
        return lower, np.zeros(d), 0.0
    return np.ascontiguousarray(lower[1:, 1:]), lower[1:, 0].copy(), float(lower[0, 0])


def _pair_chunks(counts: np.ndarray, budget: float) -> Iterator[slice]:
    """Row slices whose non-zero pairs (``k(k + 1)/2`` for a row's k non-zeros) fit in
    ``budget`` bytes (at least one row each)."""
    pairs = np.cumsum(counts * (counts + 1) // 2)
    per_chunk = max(1, min(int(budget // _PAIR_BYTES), _CACHE_PAIRS))
    start = 0
    while start < counts.size:
        done = pairs[start - 1] if start else 0
        stop = int(np.searchsorted(pairs, done + per_chunk, side="right"))
        stop = max(stop, start + 1)
        yield slice(start, stop)
        start = stop


def _pair_quadratic_forms(X: sp.csr_matrix, covs: np.ndarray, d: int) -> np.ndarray:
    """``xᵀ A x`` with ``A = cov[:d, :d]`` for each row of X and each cov, over the non-zero
    pairs of each row (each unordered pair once, doubled off the diagonal):
    (n_rows, n_problems)."""
    n_rows = X.shape[0]
    counts = np.diff(X.indptr).astype(np.int64)
    row_of = np.repeat(np.arange(n_rows), counts)  # of each non-zero
    # Non-zero a (the i-th of its row's k) pairs with itself and the k - i - 1 after it.
    span = counts[row_of] - (np.arange(row_of.size) - X.indptr[:-1].astype(np.int64)[row_of])
    first = np.repeat(np.arange(row_of.size), span)
    within = np.arange(first.size) - np.repeat(np.cumsum(span) - span, span)
    second = first + within
    values = X.data[first] * X.data[second]
    values[within > 0] *= 2.0
    columns = X.indices.astype(np.int64)
    flat = columns[first] * covs.shape[-1] + columns[second]
    rows = row_of[first]
    out = np.empty((n_rows, len(covs)))
    for k, cov in enumerate(covs):
        out[:, k] = np.bincount(rows, values * cov.ravel()[flat], minlength=n_rows)
    return out


class LatentMoments:
    """Posterior mean and variance of the latent value at X's rows, chunk by chunk.

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

    Attributes
    ----------
    chunks : list of slice
        Consecutive row ranges covering X, whose temporaries stay within
        :func:`~vsbayes._memory.block_bytes` (from scikit-learn's ``working_memory``,
        shared by the threads) and the cache bound.
    threads : int
        Threads :meth:`run` uses: as many as BLAS may use now. The chunks' products would
        otherwise be BLAS's parallel work; run side by side on one BLAS thread each, they
        parallelize the element-wise passes too, and no idle BLAS pool spins between them.
    """

    def __init__(self, X, coef: np.ndarray, intercept: np.ndarray, covs: np.ndarray):
        self.X, self.coef, self.intercept, self.covs = X, coef, intercept, covs
        n_rows, d = X.shape
        n_problems = len(coef)
        self.threads = blas_thread_count()
        budget = block_bytes() / self.threads
        counts = np.diff(X.indptr).astype(np.int64) if sp.issparse(X) else None
        self.pairs = (
            counts is not None and float(counts @ (counts + 1)) / 2 * _GATHER_COST < X.nnz * d
        )
        if self.pairs:
            self.chunks = list(_pair_chunks(counts, budget))
        else:
            factors = [_factor(cov, d) for cov in covs]
            self.weights = [f[0] for f in factors]
            self.roots = np.array([f[2] for f in factors])
            # One small product gives the intercepts' columns c·x and the means.
            self.intercept_fitted = covs.shape[-1] > d
            side = [f[1] for f in factors] if self.intercept_fitted else []
            self.side = np.ascontiguousarray(np.column_stack([*side, *coef]))
            # Per row: a problem's product (its factor's columns), the small product, the
            # means and variances, and the predictive's temporaries downstream (about 24
            # per problem).
            rows = int(max(1, budget // (8.0 * (d + 28 * n_problems))))
            rows = min(rows, max(1, _CACHE_ENTRIES // d))
            self.chunks = [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
        self.threads = max(1, min(self.threads, len(self.chunks)))

    def __call__(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, var)`` of the rows, each of shape (n_rows_in_chunk, n_problems)."""
        block = self.X[rows]
        if self.pairs:
            return _pair_moments(block, self.coef, self.intercept, self.covs)
        small = np.asarray(block @ self.side)
        n_problems = len(self.coef)
        mean = small[:, -n_problems:] + self.intercept
        var = np.empty_like(mean)
        for k, weights in enumerate(self.weights):
            product = np.asarray(block @ weights)
            var[:, k] = np.einsum("ij,ij->i", product, product)
        if self.intercept_fitted:
            first = small[:, :n_problems] + self.roots
            first *= first
            var += first
        return mean, var

    def run(self, work: Callable[[slice], None]) -> None:
        """``work(rows)`` for every chunk, on :attr:`threads` threads, BLAS on one each."""
        # One BLAS thread per product: between products, the idle threads of NumPy's and
        # SciPy's OpenBLAS pools would spin against the element-wise passes (predict_proba
        # on 1e6 × 20, 2 cores, same process: 1.0 s with BLAS's two threads per product,
        # 0.23 s with one; with the chunks on two threads, 0.061 s against 0.091 s on one).
        with single_blas_thread():
            map_blocks(work, self.chunks)


def _pair_moments(block, coef, intercept, covs):
    d = block.shape[1]
    mean = np.asarray(block @ coef.T) + intercept
    var = _pair_quadratic_forms(block, covs, d)
    if covs.shape[-1] > d:  # intercept: 2 x·Σ[:d, d] + Σ[d, d]
        var += 2.0 * np.asarray(block @ covs[:, :d, d].T) + covs[:, d, d]
    np.maximum(var, 0.0, out=var)  # round-off only: the covariances are PD
    return mean, var
