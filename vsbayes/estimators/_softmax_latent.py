"""The K latent values' posterior mean and centred covariance at each row, in row chunks.

Under a Gaussian posterior N(μ, Σ) of ``θ = [W.ravel(), b]`` (the multinomial model's
layout, :mod:`vsbayes.models.softmax`), the latent values ``f = W x + b`` of a row are
Gaussian with mean ``W̄ x + b̄`` and covariance ``J Σ Jᵀ`` (J picks ``[x, 1]`` for each
class). With a factor ``Σ = R Rᵀ`` whose class axis is centred (each parameter's K entries
minus their mean), ``J R`` is the centred latent's factor: the softmax is invariant to a
common shift, and centring first removes the posterior's prior-only directions (wide along
the sum of the intercepts) before any product. A chunk of rows costs one product with the
(d, K·p) coefficient part of R.

The chunks run side by side (:meth:`SoftmaxLatent.run`), BLAS on one thread each, and the
predictive rule blocks each chunk's rows again within its share of the memory.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._blas import blas_thread_count, map_blocks, single_blas_thread
from .._memory import block_bytes

__all__ = ["SoftmaxLatent"]


def _root(cov: np.ndarray) -> np.ndarray:
    """A factor R with ``R Rᵀ = cov`` (Cholesky, or the eigen-root if only semi-definite)."""
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        eigval, eigvec = np.linalg.eigh(cov)
        return eigvec * np.sqrt(np.maximum(eigval, 0.0))


class SoftmaxLatent:
    """Posterior mean and centred covariance of the K latent values at X's rows.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_rows, d)
        Validated float64 rows.
    coef : ndarray of shape (K, d)
        Posterior mean of W.
    intercept : ndarray of shape (K,)
        Posterior mean of b (zeros without one).
    cov : ndarray of shape (p, p)
        Posterior covariance of θ = [W.ravel(), b] (p = K d without an intercept).

    Attributes
    ----------
    chunks : list of slice
        Row ranges whose temporaries stay within their thread's share of
        :func:`~vsbayes._memory.block_bytes`, at least one per thread.
    threads : int
        Threads :meth:`run` uses: as many as BLAS may use now.
    budget : float
        Bytes of one thread's share, the bound the predictive rule's blocks keep within.
    """

    def __init__(self, X, coef: np.ndarray, intercept: np.ndarray, cov: np.ndarray):
        self.X, self.coef, self.intercept = X, coef, intercept
        k, d = coef.shape
        root = _root(cov)
        r = root.shape[1]
        w_root = root[: k * d].reshape(k, d, r)
        w_root = w_root - w_root.mean(axis=0)
        # (d, K·r): one product per chunk gives every class's rows of J R.
        self.w_root = np.ascontiguousarray(w_root.transpose(1, 0, 2).reshape(d, k * r))
        b_root = root[k * d :] if cov.shape[0] > k * d else np.zeros((k, r))
        self.b_root = b_root - b_root.mean(axis=0)
        threads = blas_thread_count()
        self.budget = block_bytes() / threads
        # Per row: the latent factor (K r), its product's copy, and the covariance (K²).
        rows = max(1, int(self.budget // (8.0 * (2 * k * r + k * k))))
        n_rows = X.shape[0]
        rows = min(rows, max(1, -(-n_rows // threads)))
        self.chunks = [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
        self.threads = max(1, min(threads, len(self.chunks)))

    def __call__(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, cov)`` of the chunk's latent values: (m, K) and centred (m, K, K)."""
        x = self.X[rows]
        k = len(self.coef)
        mean = np.asarray(x @ self.coef.T) + self.intercept
        factor = np.asarray(x @ self.w_root).reshape(x.shape[0], k, -1) + self.b_root
        return mean, factor @ np.swapaxes(factor, 1, 2)

    def run(self, work: Callable[[slice], None]) -> None:
        """``work(rows)`` for every chunk, on :attr:`threads` threads, BLAS on one each."""
        with single_blas_thread():
            map_blocks(work, self.chunks)
