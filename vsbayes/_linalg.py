"""The thin QR of a tall matrix: CholeskyQR2, shifted CholeskyQR3 beyond it, then Householder.

NumPy's ``np.linalg.qr`` (LAPACK's Householder ``geqrf`` and ``orgqr``) of a tall,
skinny matrix runs at a small fraction of the speed of a matrix product: 3.8 s of CPU
for a 400,020 × 66 matrix on one core, against 0.07 s for its Gram matrix and 0.15 s for
a triangular solve with it. The subspace iteration and the square roots of the
structured posteriors take such QRs of bases over all the parameters (p × r, p up to
10⁶), and they were the largest part of a multinomial structured fit.

**CholeskyQR2** (Fukaya, Nakatsukasa, Yanagisawa & Yamamoto 2014; analysis in Yamamoto,
Nakatsukasa, Yanagisawa & Fukaya 2015, "Roundoff error analysis of the CholeskyQR2
algorithm", ETNA 44): ``G = AᵀA``, ``R₁ = chol(G)``, ``Q₁ = A R₁⁻¹``, and once more on
``Q₁``: ``Q = Q₁ R₂⁻¹``, ``R = R₂ R₁``. One pass loses orthogonality as ``κ(A)² u``
(u = 2⁻⁵³ the unit round-off); the second pass, on the nearly orthonormal ``Q₁``, brings
it to round-off, ``‖QᵀQ − I‖ = O(u)`` times a low power of the dimensions, with a
residual ``‖A − QR‖ = O(u ‖A‖)`` as Householder's — provided the first Cholesky
succeeds, i.e. ``κ(A) ≲ u^{-½} ≈ 10⁸`` (the proven sufficient condition,
``8 κ(A) √(n k u + k (k + 1) u) ≤ 1``, is a worst case far from the typical one).

The Gram matrix is equilibrated before its Cholesky (columns scaled to unit norm): the
errors of Cholesky and of the triangular solves do not grow with the columns' scaling
(van der Sluis; Higham 2002, §10.1 and §8.2), so the condition that matters is that of
the scaled matrix — the bases of a subspace iteration have columns of very different
norms but nearly orthogonal.

**Beyond CholeskyQR2's range**: where the first Cholesky fails, or the estimated
condition of the scaled ``R₁`` exceeds :data:`CONDITION_LIMIT` (10⁷, an order under
``u^{-½}``, so that ``Q₁``'s loss of orthogonality ``κ² u ≈ 10⁻²`` leaves the second pass
well inside its range), **shifted CholeskyQR3** (Fukaya, Kannan, Nakatsukasa, Zhang &
Yamamoto 2020, SIAM J. Sci. Comput. 42, A477): the first Cholesky of ``AᵀA + sI``,
``s = 11 (n k + k (k + 1)) u ‖A‖₂²``, gives a ``Q₁`` of condition ``O(u^{-½})`` for any
``κ(A) ≲ u⁻¹``, and CholeskyQR2 on it an orthonormal Q with a residual at round-off: one
pass more. Seen in the multinomial subspace iteration, whose first image of a random
block is dominated by the intercepts' contrasts (curvature ~10⁹ in prior-whitened units
against ~1 for the rest). **Householder fallback** (``np.linalg.qr``, n k² work and
LAPACK's copies): a zero column, a Cholesky that fails even shifted, or a ``Q`` still far
from orthonormal before the last pass (``‖QᵀQ − I‖_F > ½``, read from that pass's Gram
matrix at no cost; then ``Q`` is factored and ``R = R' R_j … R_1``) — seen only beyond
``κ(A) ≈ 10¹⁴``, where Householder's Q is orthonormal but spans A's columns to no better
than ``u κ(A)``.

Memory: the Gram matrices are k × k and the triangular solves run in place, in blocks of
rows, so that nothing beyond the matrix and k × k arrays is allocated (the Householder
fallback allocates LAPACK's copies). The blocks run on :func:`~vsbayes._blas.map_blocks`'s
threads, the Gram's summed in a fixed order: the same bits for any thread count; BLAS on
one thread as in the fits (a multi-threaded SciPy TRSM of a 2000 × 30 block took 8–12 ms
with the other core busy, against 0.3 ms on one thread).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.linalg.blas import dtrsm
from scipy.linalg.lapack import dtrcon

from ._blas import block_slices, map_blocks, one_blas_thread, sum_blocks

__all__ = ["CONDITION_LIMIT", "mirror_lower_to_upper", "thin_qr"]

#: Above this estimated condition number of the column-scaled first Cholesky factor,
#: :func:`thin_qr` leaves CholeskyQR2 for shifted CholeskyQR3 (module docstring).
CONDITION_LIMIT = 1e7
# Rows per block: enough multiply-adds that a block is worth a thread's hand-off and
# BLAS runs at speed on it (k² per row in both; OpenBLAS's TRSM on 3900 × 66 blocks took
# 3.4× the time of 20,000-row ones).
_MIN_BLOCK_WORK = 2**26
_UNIT_ROUNDOFF = np.finfo(float).eps / 2.0


@one_blas_thread
def thin_qr(a, *, overwrite_a: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The thin QR factorization ``A = Q R`` of a tall matrix, by CholeskyQR2.

    Q (n × k) has orthonormal columns and R (k × k) is upper triangular with a positive
    diagonal (the unique such factorization of a full-rank A; NumPy's Householder R may
    have either sign). Where A is too ill-conditioned for CholeskyQR2, by shifted
    CholeskyQR3; beyond that, or where A is not tall, by Householder (``np.linalg.qr``),
    its signs fixed the same way (module docstring).

    Parameters
    ----------
    a : array-like of shape (n, k)
        The matrix, n ≥ k for CholeskyQR2.
    overwrite_a : bool, default=False
        Whether ``a`` (if a C-ordered float64 array) may be overwritten by Q: then no
        n × k array is allocated.

    Returns
    -------
    q : ndarray of shape (n, min(n, k))
    r : ndarray of shape (min(n, k), k)
    """
    if overwrite_a:
        a = np.require(a, dtype=float, requirements=["C", "W"])
    else:
        a = np.array(a, dtype=float, order="C")
    n, k = a.shape
    if k == 0 or n < k:
        return _householder(a)
    first = _first_factor(a)
    if first is None:
        return _householder(a)
    factor, passes = first
    factors = [factor]
    _solve_in_place(a, factor)
    for remaining in range(passes - 1, 0, -1):
        gram = _gram(a)
        # Before the last pass Q must be nearly orthonormal already (module docstring).
        near = remaining > 1 or np.linalg.norm(gram - np.eye(k)) <= 0.5
        factor = _cholesky(gram) if near else None
        if factor is None:  # (not seen below the condition limits; kept for safety)
            q, r = _householder(a)
            return q, _product(r, factors)
        _solve_in_place(a, factor)
        factors.append(factor)
    return a, _product(factors.pop(), factors)


def _product(last: np.ndarray, factors: list[np.ndarray]) -> np.ndarray:
    """``last R_j … R_1`` for ``factors`` ``[R_1, …, R_j]``."""
    for factor in reversed(factors):
        last = last @ factor
    return last


def _gram(a: np.ndarray) -> np.ndarray:
    """``AᵀA`` by blocks of rows (each a SYRK-shaped product), summed in their order."""
    n, k = a.shape
    blocks = block_slices(n, k * k, min_work=_MIN_BLOCK_WORK)
    return sum_blocks(lambda rows: a[rows].T @ a[rows], blocks)


def _cholesky(gram: np.ndarray) -> np.ndarray | None:
    """The upper Cholesky factor, or None if ``gram`` is not numerically definite."""
    try:
        return scipy.linalg.cholesky(gram, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        return None


def _first_factor(a: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``(R₁, passes)``: ``R₁`` with ``R₁ᵀR₁ = AᵀA`` from the equilibrated Gram matrix and
    2 passes in all (CholeskyQR2); where its Cholesky fails or its condition estimate
    exceeds :data:`CONDITION_LIMIT`, from the shifted Gram matrix and 3 passes (shifted
    CholeskyQR3); None where even that fails, or A has a zero column."""
    gram = _gram(a)
    norms = np.sqrt(np.diagonal(gram)).copy()
    if not np.all(np.isfinite(norms)) or not np.all(norms > 0.0):
        return None  # a zero column: rank-deficient
    gram /= norms[:, None]
    gram /= norms[None, :]
    factor, passes = _cholesky(gram), 2
    if factor is not None:
        rcond, info = dtrcon(factor, norm="1", uplo="U", diag="N")
        if info != 0 or not rcond * CONDITION_LIMIT >= 1.0:
            factor = None
    if factor is None:
        n, k = a.shape
        # Fukaya et al.'s shift 11 (n k + k (k + 1)) u ‖Â‖₂², with ‖Â‖₂² ≤ ‖Â‖_F² = k (a
        # larger shift is as valid up to ‖Â‖₂² / 100 ≥ 1/100: n k² ≲ 8·10¹²).
        shift = 11.0 * (n * k + k * (k + 1)) * _UNIT_ROUNDOFF * k
        gram[np.diag_indices(k)] += shift
        factor, passes = _cholesky(gram), 3
        if factor is None:
            return None
    factor *= norms[None, :]  # R₁ = R̂ D: the columns' norms back
    return factor, passes


def _solve_in_place(a: np.ndarray, upper: np.ndarray) -> None:
    """``A ← A R⁻¹`` by blocks of rows: each block's transpose (F-ordered, a view) solved
    by ``Rᵀ X = Aᵀ`` in place (BLAS's TRSM)."""
    n, k = a.shape
    upper = np.asfortranarray(upper)

    def solve(rows: slice) -> None:
        block = a[rows].T
        out = dtrsm(1.0, upper, block, side=0, lower=0, trans_a=1, overwrite_b=1)
        if not np.shares_memory(out, a):  # (f2py copied: never with these layouts)
            block[...] = out

    map_blocks(solve, block_slices(n, k * k, min_work=_MIN_BLOCK_WORK))


def _householder(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's Householder QR with R's diagonal made non-negative."""
    q, r = np.linalg.qr(a)
    signs = np.where(np.diagonal(r) < 0.0, -1.0, 1.0)
    q *= signs[: q.shape[1]]
    r *= signs[:, None]
    return q, r


def mirror_lower_to_upper(matrix: np.ndarray) -> None:
    """Copy a C-ordered square matrix's lower triangle onto its upper one, in place, in
    blocks of rows (no M × M temporary): after LAPACK's or BLAS's symmetric routines
    (``dpotri``, ``dsyrk``), which write one triangle."""
    m = matrix.shape[0]
    step = max(1, 2**22 // max(m, 1))
    for start in range(0, m, step):
        rows = slice(start, min(start + step, m))
        # Rows `rows`, columns after the block's diagonal, from the transposed lower part.
        block = matrix[rows.stop :, rows].T
        matrix[rows, rows.stop :] = block
        square = matrix[rows, rows]
        upper = np.triu_indices(square.shape[0], 1)
        square[upper] = square.T[upper]


def class_congruence(q: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """``out[k, i, l, j] = Σ_ab q[k, a] blocks[a, i, b, j] q[l, b]``: a covariance whose
    rows and columns are (class, parameter) pairs, its class index changed by ``q`` on
    both sides (a multinomial posterior's centred basis or its rotation).

    Two GEMMs by ``tensordot``: ``einsum(..., optimize=True)`` of the same contraction took
    1.1-3 × as long (3 classes × 805 parameters: 0.19 s against 0.06 s), the copies of its
    own transposes.
    """
    left = np.tensordot(q, blocks, axes=(1, 0))  # (k, i, b, j)
    return np.tensordot(left, q, axes=(2, 1)).transpose(0, 1, 3, 2)  # (k, i, j, l) → (k, i, l, j)
