"""The Gumbel–orthant rule: the softmax predictive to ~1e-4 on wide rows.

:func:`gumbel_orthant_proba` takes the wide rows of the softmax predictive
(:mod:`vsbayes.models.softmax_predictive`) that the QMC rule leaves above ``tol`` when it
is below :data:`~vsbayes.models.softmax_predictive.ORTHANT_BELOW` (2e-4; D-268), and the
benchmarks take it as a reference. The softmax is the law of the argmax under Gumbel noise,
``softmax_k(f) = P(argmax_j (f_j + G_j) = k)`` for independent standard Gumbel G_j, so
``p_k = E_G[P(f_k − f_j > G_j − G_k for all j ≠ k)]`` with f Gaussian: given G, an orthant
probability of the K − 1 Gaussian differences ``d_j = f_k − f_j`` (mean ``m_k − m_j``,
covariance from S). Genz's sequential conditioning integrates it one difference at a time
(Cholesky factor of the differences' covariance, most constrained first): the product of
K − 1 normal probabilities ``Φ(c_i)``, each bound c_i depending on the earlier
differences drawn from their truncated normals, ``Φ⁻¹(u_i Φ(c_i))``. Per class a node is
2K − 2 uniforms (K Gumbel, K − 2 for the chain), 8 scrambled Sobol replicates, nested
levels of 512 · 4^l points each (8 × 512 to 8 × 131,072), a row stopping where three
standard errors are below ``tol``. The integrand is smooth in every coordinate where the
differences are wide against the Gumbel noise (standard deviation 1.28): no step is left
for QMC to resolve, and on digits its largest error falls as N^-0.9 (against references
on 2^24 nodes of the conditioned rule, which differ from each other by ≤ 3.8e-5): 8.6e-4,
1.8e-4 and 8.9e-5 on 4,096, 16,384 and 65,536 nodes (99 %: 7.2e-4, 1.7e-4, 8.6e-5), where
the conditioned QMC average errs by 4.2e-3, 1.4e-3 and 7.0e-4 (4.7e-4 on 262,144). It
costs K (K − 1) normal probabilities and K (K − 2) quantiles a node (scipy's, ~11 ns each,
float64): 100 to 250 times the QMC rule's node on ten classes, so that it is the cheaper of
the two only at tolerances the QMC rule cannot reach (1e-4 on every digits row would take
it 2e7 to 6e7 nodes, extrapolating its rate N^-0.3 to N^-0.37). Where a difference is narrow
(``Var(f_k − f_j)`` small against the Gumbel noise) the integrand is a step in the Gumbel
coordinates (a zero-variance row: 1.8e-3 on 16,384 nodes); such rows stop at the QMC rule's
first level, whose estimated error there is below ``tol``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import qmc

from .._memory import block_bytes
from .softmax_predictive_rules import (
    _FIRST_NODES,
    _SEED,
    REPLICATES,
    _roots,
    _row_blocks,
    centred_basis,
)

__all__ = ["gumbel_orthant_proba"]

#: Levels of the Gumbel–orthant rule: 8 replicates of 512 · 4^l scrambled Sobol points,
#: nested (each level's points are the same sequences' first points).
_ORTHANT_LEVELS = 4


@functools.lru_cache(maxsize=16)
def orthant_uniforms(k: int, level: int, seed=_SEED) -> np.ndarray:
    """The uniforms (REPLICATES, n, 2K − 2) that level ``level`` of the Gumbel–orthant rule
    adds to each replicate: points ``n_before`` to ``512 · 4^level`` of the replicate's
    scrambled Sobol sequence (K Gumbel coordinates, then K − 2 for the sequential
    conditioning), kept inside (0, 1) (read-only, cached)."""
    end = _FIRST_NODES * 4**level
    start = 0 if level == 0 else end // 4
    tiny = np.finfo(float).eps
    u = np.stack(
        [
            qmc.Sobol(
                2 * k - 2, scramble=True, rng=np.random.default_rng((seed, 2, r))
            ).random_base2(int(math.log2(end)))[start:end]
            for r in range(REPLICATES)
        ]
    )
    u = np.clip(u, tiny, 1.0 - tiny)
    u.flags.writeable = False
    return u


def _orthant_class_setup(centred, cov, k):
    """Per row, the sequential conditioning of class k's orthant (module docstring): the
    differences ``d_j = f_k − f_j`` (j ≠ k, most constrained first), their means ``μ`` (n,
    K − 1), the Cholesky factor of their covariance (n, K − 1, K − 1) and the classes j in
    that order (n, K − 1)."""
    others = np.array([j for j in range(centred.shape[1]) if j != k])
    mu = centred[:, [k]] - centred[:, others]
    cross = cov[:, k, others]  # Cov(f_k, f_j)
    c = cov[:, k, k][:, None, None] + cov[:, others][:, :, others]
    c -= cross[:, :, None] + cross[:, None, :]
    sd = np.sqrt(np.maximum(np.einsum("nii->ni", c), 1e-300))
    order = np.argsort(mu / sd, axis=1, kind="stable")
    c = np.take_along_axis(np.take_along_axis(c, order[:, :, None], 1), order[:, None, :], 2)
    return np.take_along_axis(mu, order, 1), _roots(c), others[order]


def _orthant_replicates(centred, cov, u, max_bytes) -> np.ndarray:
    """Each replicate's average over its uniforms u (REPLICATES, n_u, 2K − 2) of the
    Gumbel–orthant integrand of every class (module docstring): (n, REPLICATES, K)."""
    n, k = centred.shape
    replicates, n_u, _ = u.shape
    gumbel = -np.log(-np.log(u[:, :, :k]))  # (REPLICATES, n_u, K)
    out = np.empty((n, replicates, k))
    # Per row and node: the chain's K − 2 conditioned values, the bound, the product and
    # a temporary, float64, one replicate at a time; per row and class, its setup.
    for rows in _row_blocks(n, 8.0 * (n_u * (k + 2) + k * k), n_u * k, max_bytes):
        m = rows.stop - rows.start
        for c in range(k):
            mu, root, order = _orthant_class_setup(centred[rows], cov[rows], c)
            for r in range(replicates):
                # P(f_c − f_j > G_j − G_c for all j ≠ c | G): with the differences'
                # Cholesky factor, one conditioned standard normal at a time (Genz).
                y = np.empty((k - 2, m, n_u))
                product = np.ones((m, n_u))
                for i in range(k - 1):
                    bound = mu[:, i][:, None] + gumbel[r, :, c] - gumbel[r][:, order[:, i]].T
                    if i:
                        bound -= np.einsum("ml,lmn->mn", root[:, i, :i], y[:i])
                    bound /= root[:, i, i][:, None]
                    share = ndtr(bound)
                    product *= share
                    if i < k - 2:
                        share *= u[r, :, k + i]
                        np.clip(share, 1e-300, None, out=share)
                        y[i] = ndtri(share)
                out[rows, r, c] = product.mean(axis=1)
    return out


def gumbel_orthant_proba(
    mean: np.ndarray,
    cov: np.ndarray,
    *,
    levels: int = _ORTHANT_LEVELS,
    tol: float = 0.0,
    seed=_SEED,
    max_bytes: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``∫ softmax(f) N(f; mean_i, cov_i) df`` per row by the Gumbel–orthant rule (module
    docstring), refined row by row: every row starts on 8 × 512 nodes, and those whose
    three estimated standard errors exceed ``tol`` on some class take four times as many,
    up to ``levels`` levels (8 × 512 · 4^(levels − 1) nodes).

    Parameters
    ----------
    mean : ndarray of shape (n, K)
        Latent means.
    cov : ndarray of shape (n, K, K)
        Latent covariances (positive semi-definite; only their centred part matters).
    levels : int, default=4
        Largest number of levels (8 × 131,072 nodes at 4).
    tol : float, default=0.0
        Absolute accuracy (three standard errors) at which a row stops; 0 takes every row
        to the last level.
    seed : int or tuple, default=the rule's fixed scrambling
        Scrambling of the Sobol sequences (the rule is deterministic for a given seed).
    max_bytes : float, optional
        Bound on the temporaries of one block of rows; default
        :func:`~vsbayes._memory.block_bytes`.

    Returns
    -------
    proba : ndarray of shape (n, K)
        The estimates, normalized to sum to 1 (they sum to 1 within their error before).
    error : ndarray of shape (n,)
        Three standard errors of the replicates' average, the largest over the classes.
    nodes : ndarray of shape (n,)
        Nodes each row took (all replicates).
    """
    max_bytes = block_bytes() if max_bytes is None else max_bytes
    mean = np.asarray(mean, dtype=float)
    cov = np.asarray(cov, dtype=float)
    n, k = mean.shape
    centred = mean - mean.mean(axis=1, keepdims=True)
    q = centred_basis(k)
    cov = q @ (q.T @ (0.5 * (cov + np.swapaxes(cov, 1, 2))) @ q) @ q.T
    proba = np.empty((n, k))
    error = np.empty(n)
    nodes = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    replicates, summed = None, 0
    for level in range(levels):
        u = orthant_uniforms(k, level, seed)
        added = _orthant_replicates(centred[todo], cov[todo], u, max_bytes)
        new = u.shape[1]
        replicates = added if level == 0 else (summed * replicates + new * added) / (summed + new)
        summed += new
        nodes[todo] = REPLICATES * summed
        proba[todo] = replicates.mean(axis=1)
        error[todo] = 3.0 * replicates.std(axis=1, ddof=1).max(axis=1) / math.sqrt(REPLICATES)
        refined = error[todo] > tol
        todo, replicates = todo[refined], replicates[refined]
        if not todo.size:
            break
    proba /= proba.sum(axis=1, keepdims=True)
    return proba, error, nodes
