"""Per-row latent moments of a Gaussian posterior: the mean and covariance of ``f = Θ x̃``.

Under a Gaussian posterior N(μ, Σ) of the coefficients, a row's latent scores ``f = Θ x̃``
(``x̃ = [x, 1]`` with an intercept) are Gaussian: mean ``Θ̄ x̃`` and covariance ``J Σ Jᵀ``,
where J picks ``x̃`` for each score. One latent score (binary, or each problem of
one-vs-rest) is the one-row case: variance ``x̃ᵀ Σ x̃``. Every pass runs over row blocks
whose temporaries stay within :func:`~vsbayes._memory.block_bytes`; sparse rows are never
densified.

**From the covariance** (the fits' sweeps, whose covariance changes at every sweep):
:func:`row_variances` (one score) and :func:`row_moments` (r scores). A dense block of rows
costs one product with Σ (its r² blocks side by side for r scores) and a contraction with
the rows; or (``by_pairs``, the many-class fits) one product of the rows' w(w + 1)/2
distinct pairwise products with Σ's entries for the r(r + 1)/2 pairs of scores.

**For prediction** (one posterior serves any number of rows):
:class:`IndependentLatents` (one score per problem, binary and one-vs-rest) factors Σ once
and costs a block of rows one product with the factor; :class:`JointLatents` (the K scores
of the multinomial posterior) prepares the centred covariance's blocks once and costs a
block of rows one product with them (the quadratic forms: with K scores, a product with a
factor costs K times more, see its docstring). With one score the factor is the cheaper:
with the Cholesky factor of Σ ordered intercept first,
``F = [[r, 0], [c, W]]``, ``Fᵀ x̃ = [r + c·x, Wᵀ x]``, so that the intercept's column joins
the means' small product, and the variance ``‖Wᵀ x‖² + (r + c·x)²`` is a sum of squares:
no cancellation (unlike ``x Σ x + 2 x·b + c`` for uncentred features), never negative.
The factors (:class:`IndependentFactors`) and the blocks (:class:`JointForms`) depend on
the posterior alone: a fitted estimator computes them on its first read and keeps them (a
factorization per call was most of a predict_proba on a few rows of many features, D-259).

**From a structured covariance** ``Σ = diag(δ) + U K Uᵀ``
(:class:`~vsbayes.gaussian.StructuredCovariance`, text-scale posteriors):
:class:`StructuredLatents`, ``x̃ᵀΣx̃ = Σ δ_j x̃_j² + (Uᵀx̃)ᵀ K (Uᵀx̃)`` — one product of the
rows with the p × r factor, O(nnz · r) per chunk, sparse rows as such; one-vs-rest's
:class:`StructuredIndependentLatents`, each problem's side by side.

**Sparse rows** with few non-zeros among many features take ``Σ_ab x_a x_b Σ_ab`` over
each row's non-zero pairs instead (one gather for both uses): ``k(k + 1)/2`` terms for
``k`` non-zeros, against ``k d`` for a product.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from .._blas import blas_thread_count, block_slices, map_blocks, single_blas_thread
from .._indices import triu_indices
from .._linalg import class_congruence
from .._memory import block_bytes, block_length, check_memory

__all__ = [
    "IndependentFactors",
    "IndependentLatents",
    "InformativeRows",
    "JointForms",
    "JointLatents",
    "StructuredIndependentLatents",
    "StructuredJointLatents",
    "StructuredLatents",
    "constant_rows",
    "row_moments",
    "row_variances",
    "touched_columns",
    "untouched_columns",
]

# Rows × features per chunk at most, whatever block_bytes allows: the chunk's arrays stay
# near the processor's caches (1e6 × 20 on 2 cores: 2^17 to 2^19 entries per chunk ran in
# 0.6× the time of one chunk of all rows; far smaller chunks pay Python's per-call cost).
_CACHE_ENTRIES = 2**19
# Entries per row chunk of the temporaries of the multinomial latent forms' products of
# pairs (JointLatents): within a core's level-2 cache or two (30 classes × 21 parameters,
# 2·10⁴ rows, one thread, load 9: 64-128 rows a chunk 0.34-0.35 s, 512 rows 0.78 s; 65
# parameters, 10 classes: 32-64 rows 0.58-0.60 s, 16 rows 0.91, 1024 rows 1.22; D-239).
_FORM_ENTRIES = 2**18
# The blocks' form's batched contraction costs a call per row, about as long as passes over
# this many entries. Measured, one thread, 2·10⁴ random rows, time of the triangles' form
# over the blocks' (load 13-18; w parameters, K classes): w = 5, K = 3: 0.11; w = 9, K = 4:
# 0.48; w = 11, K = 6: 0.34; w = 14, K = 3: 1.28; w = 21, K = 3, 4, 6, 10, 30: 0.95, 0.90,
# 1.36-1.81, 0.63, 0.37; w = 31, K = 4, 6: 1.10, 1.16; w = 41, K = 6, 10: 1.60, 0.93;
# w = 65, K = 3, 6, 10: 2.78, 1.80, 0.93-1.03; w = 101, K = 10, 20: 1.30, 0.79. The count
# with this term takes the faster form in each but w = 21 with 3 and 4 classes (by 5-10 %).
_CONTRACTION_ROW_ENTRIES = 48
# A gathered pair costs about this many multiply-adds of the product (random access into Σ).
_GATHER_COST = 8
# Bytes per pair of the pair gather's temporaries (a dozen index and value arrays).
_PAIR_BYTES = 96
# Pairs per chunk at most, whatever the memory allows (the cache bound of the gather).
_CACHE_PAIRS = 2**20


# --- Rows whose latent values are 0 under every θ ------------------------------------------


def _pair_columns(x: np.ndarray) -> np.ndarray:
    """``x[:, j] * x[:, l]`` for j ≤ l (M, w(w + 1)/2), in the order of ``triu_indices``, by
    w column slices: the same products and layout as the gathered columns', without the
    gathers (a dense row block's pairs in half their time: 1797 × 65 columns, 12 → 7 ms)."""
    m, w = x.shape
    out = np.empty((m, w * (w + 1) // 2))
    at = 0
    for j in range(w):
        np.multiply(x[:, j : j + 1], x[:, j:], out=out[:, at : at + w - j])
        at += w - j
    return out


def constant_rows(design) -> np.ndarray:
    """Which rows of a design (dense, or sparse with its stored zeros counted as zeros) have
    no non-zero entry, shape (M,): their latent values are 0 under every θ (all-zero
    features without an intercept, e.g. empty documents), so their likelihood factor is a
    constant."""
    if sp.issparse(design):
        # (Duplicate entries summed first: a row of 1 and −1 at one feature is a zero row.)
        return _summed_duplicates(design.tocsr()).count_nonzero(axis=1) == 0
    design = np.asarray(design)
    out = np.empty(design.shape[0], dtype=bool)
    step = block_length(design.shape[1])  # a block's boolean temporary: one byte an entry
    for start in range(0, design.shape[0], step):
        block = design[start : start + step]
        out[start : start + step] = ~block.any(axis=1)
    return out


def touched_columns(design, rows: np.ndarray) -> np.ndarray:
    """Which columns of a design (dense, or sparse with its stored zeros counted as zeros)
    have a non-zero entry in one of the ``rows`` (a boolean mask), shape (p,): the others'
    coefficients no row of the mask informs (e.g. words absent from the training
    documents, or present only in rows of weight 0)."""
    rows = np.asarray(rows, dtype=bool)
    if sp.issparse(design):
        kept = _summed_duplicates(design.tocsr()[rows])
        kept.eliminate_zeros()
        return np.bincount(kept.indices, minlength=design.shape[1]) > 0
    design = np.asarray(design)
    out = np.zeros(design.shape[1], dtype=bool)
    step = block_length(design.shape[1])  # a block's boolean temporary: one byte an entry
    for start in range(0, design.shape[0], step):
        block = design[start : start + step][rows[start : start + step]]
        out |= block.any(axis=0)
    return out


def untouched_columns(design, weights: np.ndarray) -> np.ndarray:
    """Per column, whether it is zero on every row of positive weight: the coefficients
    no weighted row informs, whose posterior is their prior (:func:`touched_columns`)."""
    return ~touched_columns(design, np.asarray(weights) > 0)


class InformativeRows(NamedTuple):
    """A posterior's rows split by whether their likelihood factor depends on θ
    (``informative_rows()`` of :class:`~vsbayes.models.BinaryGLMPosterior` and
    :class:`~vsbayes.models.SoftmaxGLMPosterior`).

    A row whose latent values are 0 under every θ (:func:`constant_rows`) has the factor
    ``F(0)^{s_i}`` (binary; ``K^{−s_i}`` multinomial): it carries no information, and its
    variance-0 latent has no cavity for expectation propagation to divide by. The
    approximations fit ``model`` and multiply the evidence by that constant.

    Attributes
    ----------
    model : posterior
        The posterior of the other rows: the model itself where every row is informative.
    constant : ndarray of shape (M,)
        Which of the model's rows are constant.
    log_factors : ndarray of shape (number of constant rows,)
        Their ``s_i log F(0)`` (``−s_i log K``).
    """

    model: Any
    constant: np.ndarray
    log_factors: np.ndarray

    @property
    def log_likelihood(self) -> float:
        """``Σ_i s_i log F(0)`` over the constant rows."""
        return float(self.log_factors.sum())


# --- Sparse rows: the non-zero pairs ------------------------------------------------------


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


def _row_view(X, rows: slice):
    """Rows ``rows`` of a dense or CSR X without copying them: a CSR block shares X's
    ``data`` and ``indices`` (``X[rows]`` copies both, and so does scipy's constructor for
    a small view of a large array: for 10⁶ rows × 10 non-zeros, a third of a structured
    predict_proba's time); only its row pointers are new."""
    first, last, step = rows.indices(X.shape[0])
    if not sp.issparse(X) or step != 1:
        return X[rows]
    last = max(first, last)
    start, stop = int(X.indptr[first]), int(X.indptr[last])
    block = sp.csr_matrix((last - first, X.shape[1]), dtype=X.dtype)
    # Assigned, not passed to the constructor: scipy copies an array that is a small view.
    block.indptr = X.indptr[first : last + 1] - X.indptr.dtype.type(start)
    block.indices, block.data = X.indices[start:stop], X.data[start:stop]
    block.has_canonical_format = X.has_canonical_format  # (X's rows, as they are)
    return block


def _with_data(block: sp.csr_matrix, data: np.ndarray) -> sp.csr_matrix:
    """The CSR matrix of ``block``'s sparsity pattern with the values ``data``, sharing its
    index arrays (no copy)."""
    out = sp.csr_matrix(block.shape, dtype=data.dtype)
    out.indptr, out.indices, out.data = block.indptr, block.indices, data
    return out


def _summed_duplicates(X):
    """X, or a copy with its duplicate entries summed (a duplicate's square is not the
    square of the sum); a dense X as it is."""
    if sp.issparse(X) and not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def _row_counts(X: sp.csr_matrix) -> np.ndarray:
    return np.diff(X.indptr).astype(np.int64)


def _pair_quadratic_forms(X: sp.csr_matrix, covs: np.ndarray) -> np.ndarray:
    """``x̃ᵀ S x̃`` for each CSR row x and each symmetric S of ``covs``, from the non-zero pairs.

    Each unordered pair of a row's non-zeros is gathered once (doubled off the diagonal).
    The rows are taken whole: bound them with :func:`_pair_chunks`.

    Parameters
    ----------
    X : CSR matrix of shape (n_rows, d)
    covs : ndarray of shape (n_covs, d, d) or (n_covs, d + 1, d + 1)
        Symmetric matrices; with d + 1, the last entry is the intercept's (``x̃ = [x, 1]``).

    Returns
    -------
    ndarray of shape (n_rows, n_covs)
    """
    n_rows, d = X.shape
    counts = _row_counts(X)
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
    if covs.shape[-1] > d:  # the intercept: 2 x·S[:d, d] + S[d, d]
        out += 2.0 * np.asarray(X @ covs[:, :d, d].T) + covs[:, d, d]
    return out


def _gathers_pairs(X, width: int) -> bool:
    """Whether sparse X's non-zero pairs cost less than its product with ``width`` columns."""
    if not sp.issparse(X):
        return False
    counts = _row_counts(X)
    return float(counts @ (counts + 1)) / 2 * _GATHER_COST < X.nnz * width


# --- From the covariance: the fits' sweeps ------------------------------------------------


def row_variances(design, cov: np.ndarray, max_bytes: int | None = None) -> np.ndarray:
    """``a_iᵀ Σ a_i`` for every row ``a_i`` of a dense or CSR design: one latent score.

    The one-score case of :func:`row_moments` (the design holds any intercept column):
    dense, ``(A Σ ∘ A)`` summed over row blocks; CSR, :func:`_pair_quadratic_forms`.

    Parameters
    ----------
    design : ndarray or scipy.sparse CSR matrix of shape (M, p)
    cov : ndarray of shape (p, p)
        Symmetric matrix.
    max_bytes : int, optional
        Bound on the temporaries of one block (default
        :func:`~vsbayes._memory.block_bytes`).

    Returns
    -------
    ndarray of shape (M,)
    """
    m, p = design.shape
    if sp.issparse(design):
        budget = block_bytes() if max_bytes is None else max_bytes
        out = np.empty(m)
        for rows in _pair_chunks(_row_counts(design), budget):
            out[rows] = _pair_quadratic_forms(design[rows], cov[None])[:, 0]
        return out
    block = block_length(8 * p) if max_bytes is None else max(1, max_bytes // (8 * p))
    out = np.empty(m)
    for j in range(0, m, block):
        rows = design[j : j + block]
        out[j : j + block] = np.einsum("ij,ij->i", rows @ cov, rows)
    return out


def row_moments(
    X,
    coef: np.ndarray,
    cov: np.ndarray,
    *,
    by_pairs: bool = False,
    products: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of every row's r latent scores ``g = B x̃`` under N(vec B, Σ).

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (M, d)
    coef : ndarray of shape (r, w)
        Posterior mean of B: ``w = d``, or ``w = d + 1`` with an intercept (its last
        column, ``x̃ = [x, 1]``).
    cov : ndarray of shape (r·w, r·w)
        Posterior covariance of B's entries, row-major (score by score).
    by_pairs : bool, default=False
        Dense rows: the r(r + 1)/2 distinct covariances from the w(w + 1)/2 distinct
        products of each row's entries, one GEMM (a quarter of the product's multiply-adds;
        the same numbers to round-off, in another order of the sums).
    products : ndarray of shape (M, w(w + 1)/2), optional
        Those products of the dense rows ``x̃``, ``x̃_j x̃_l`` for j ≤ l in the order of
        ``np.triu_indices(w)``, if already formed (with ``by_pairs``; the same bits).

    Returns
    -------
    mean : ndarray of shape (M, r)
    cov : ndarray of shape (M, r, r)
        Symmetric.
    """
    r, w = coef.shape
    m, d = X.shape
    blocks = cov.reshape(r, w, r, w)
    # A row's r(r + 1)/2 forms per pair, against the product's r² w columns.
    if _gathers_pairs(X, 2 * r * w // (r + 1)):
        return _pair_row_moments(X, coef, blocks)
    if by_pairs and not sp.issparse(X):
        return _dense_pair_row_moments(X, coef, blocks, products)
    # (w, r·r·w): column j of x̃ against every block Σ[a, :, c, :].
    spread = np.ascontiguousarray(blocks.transpose(1, 0, 2, 3)).reshape(w, -1)
    out_mean, out_cov = np.empty((m, r)), np.empty((m, r, r))

    def block(rows: slice) -> None:
        x = X[rows]
        if w > d:
            ones = np.ones((x.shape[0], 1))
            x = sp.hstack([x, ones], format="csr") if sp.issparse(x) else np.hstack([x, ones])
        # A sparse block is multiplied as such; its contraction reads the product's entries
        # at its non-zeros only.
        out_mean[rows] = x @ coef.T
        y = np.asarray(x @ spread).reshape(x.shape[0], r, r, w)
        if sp.issparse(x):
            x = x.tocoo()
            cov_rows = np.zeros((x.shape[0], r, r))
            np.add.at(cov_rows, x.row, y[x.row, :, :, x.col] * x.data[:, None, None])
        else:
            cov_rows = np.einsum("iacj,ij->iac", y, x)
        # Symmetric to the bit, in the block (a pass over all rows' transposes at the end
        # cost a fifth of this function at 26 classes × 5000 rows).
        cov_rows += np.swapaxes(cov_rows, 1, 2)
        cov_rows *= 0.5
        out_cov[rows] = cov_rows

    # Blocks of 256 rows at least (memory allowing): each reads all of Σ (r²w² entries),
    # which a block of one row would do per row. 2000 rows × 2004 parameters: one pass
    # 2.5 s in one-row blocks (memory-bound matrix-vector products), 0.2 s in these.
    cap = block_length(8 * (r * r * w + w))
    work = r * r * w * w
    with single_blas_thread():
        map_blocks(block, block_slices(m, work, cap, max(2**22, 256 * work)))
    return out_mean, out_cov


def _dense_pair_row_moments(
    X: np.ndarray, coef: np.ndarray, blocks: np.ndarray, products: np.ndarray | None = None
):
    """:func:`row_moments` of dense rows as ``[x̃_j x̃_l]_{j ≤ l} @ S``, S (w(w + 1)/2,
    r(r + 1)/2) the blocks' entries ``Σ_ac[j, l] + Σ_ac[l, j]`` (halved on j = l): the
    quadratic forms of the pairs of scores a ≤ c, symmetric to the bit."""
    r, w = coef.shape
    m, d = X.shape
    score_a, score_c = triu_indices(r)
    col_j, col_l = triu_indices(w)
    pair_blocks = blocks[score_a, :, score_c, :]  # (r(r + 1)/2, w, w)
    forms = (pair_blocks + pair_blocks.transpose(0, 2, 1))[:, col_j, col_l]
    forms[:, col_j == col_l] *= 0.5
    forms = np.ascontiguousarray(forms.T)  # (w(w + 1)/2, r(r + 1)/2)
    # Each (a, c) entry of a row's r × r covariance: its pair's column in the forms.
    pair_of = np.empty((r, r), dtype=np.intp)
    pair_of[score_a, score_c] = np.arange(len(score_a))
    pair_of[score_c, score_a] = pair_of[score_a, score_c]
    pair_of = pair_of.ravel()
    out_mean, out_cov = np.empty((m, r)), np.empty((m, r, r))

    def block(rows: slice) -> None:
        x = X[rows]
        if w > d:
            x = np.hstack([x, np.ones((x.shape[0], 1))])
        out_mean[rows] = x @ coef.T
        pairs = _pair_columns(x) if products is None else products[rows]
        values = pairs @ forms
        out_cov[rows] = values[:, pair_of].reshape(-1, r, r)

    n_pairs = len(col_j) + len(score_a) + r * r
    cap = block_length(8 * n_pairs)
    work = len(col_j) * len(score_a)
    with single_blas_thread():
        map_blocks(block, block_slices(m, work, cap, max(2**22, 256 * work)))
    return out_mean, out_cov


def _pair_row_moments(X: sp.csr_matrix, coef: np.ndarray, blocks: np.ndarray):
    """:func:`row_moments` of sparse rows from their non-zero pairs, one symmetric block
    ``(Σ_ac + Σ_acᵀ)/2`` per pair of scores a ≤ c (a quadratic form sees only that)."""
    r = len(coef)
    m, d = X.shape
    upper_a, upper_c = triu_indices(r)
    pair_blocks = blocks[upper_a, :, upper_c, :]  # (r(r + 1)/2, w, w)
    sym = 0.5 * (pair_blocks + pair_blocks.swapaxes(1, 2))
    out_mean, out_cov = np.empty((m, r)), np.empty((m, r, r))
    for rows in _pair_chunks(_row_counts(X), block_bytes()):
        x = X[rows]
        out_mean[rows] = np.asarray(x @ coef[:, :d].T) + coef[:, d:].sum(axis=1)
        forms = _pair_quadratic_forms(x, sym)
        out_cov[rows, upper_a, upper_c] = forms
        out_cov[rows, upper_c, upper_a] = forms
    return out_mean, out_cov


# --- From a factor: prediction ------------------------------------------------------------


class _RowChunks:
    """Row chunks of X that :meth:`run` maps on the threads BLAS may use.

    Attributes
    ----------
    chunks : list of slice
        Consecutive row ranges covering X, whose temporaries stay within their thread's
        share of :func:`~vsbayes._memory.block_bytes`.
    threads : int
        Threads :meth:`run` uses: as many as BLAS may use now (at most one per chunk). The
        chunks' products would otherwise be BLAS's parallel work; run side by side on one
        BLAS thread each, they parallelize the element-wise passes too, and no idle BLAS
        pool spins between them.
    """

    chunks: list[slice]
    threads: int

    def run(self, work: Callable[[slice], None]) -> None:
        """``work(rows)`` for every chunk, on :attr:`threads` threads, BLAS on one each."""
        # One BLAS thread per product: between products, the idle threads of NumPy's and
        # SciPy's OpenBLAS pools would spin against the element-wise passes (predict_proba
        # on 1e6 × 20, 2 cores, same process: 1.0 s with BLAS's two threads per product,
        # 0.23 s with one; with the chunks on two threads, 0.061 s against 0.091 s on one).
        with single_blas_thread():
            map_blocks(work, self.chunks)


def _intercept_first_factor(cov: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(W, c, r)`` with ``x̃ᵀ cov x̃ = ‖Wᵀ x‖² + (r + c·x)²`` for every x, W (d, d) lower
    triangular.

    ``cov`` is (d, d) (then c = 0, r = 0) or, with an intercept last, (d + 1, d + 1):
    factored with the intercept first, its Cholesky factor [[r, 0], [c, W]] puts the
    intercept in one column, so the other d need no offset.
    """
    order = np.r_[d, :d] if cov.shape[0] > d else np.arange(d)
    ordered = cov[np.ix_(order, order)]
    # On one BLAS thread, as the fits' factorizations: under another process's load two
    # OpenBLAS threads took 1.65 s for an 805 × 805 Cholesky (one: 35 ms); idle, one
    # thread is as fast up to p = 2000 (805: 6 against 10 ms) and 1.5× slower at 4096.
    with single_blas_thread():
        try:
            lower = scipy.linalg.cholesky(ordered, lower=True, check_finite=False)
        except scipy.linalg.LinAlgError:
            # Positive semi-definite to round-off only: its clipped eigenvalues, plus a
            # ridge of 1e-13 of the largest (a change of v below round-off), make it
            # definite.
            eigval, eigvec = np.linalg.eigh(ordered)
            clipped = np.maximum(eigval, 0.0)
            ordered = (eigvec * clipped) @ eigvec.T
            ordered[np.diag_indices_from(ordered)] += 1e-13 * max(clipped.max(), 1e-300)
            lower = scipy.linalg.cholesky(ordered, lower=True, check_finite=False)
    if cov.shape[0] == d:
        return lower, np.zeros(d), 0.0
    return np.ascontiguousarray(lower[1:, 1:]), lower[1:, 0].copy(), float(lower[0, 0])


class IndependentFactors:
    """What :class:`IndependentLatents` needs of the covariances whatever the rows: each
    problem's Cholesky factor ordered intercept first (:func:`_intercept_first_factor`).

    One per posterior: a fitted estimator computes it on its first read and keeps it
    (:class:`~vsbayes.models.fitted_predictive.PredictiveSetup`); its arrays are read-only.

    Parameters
    ----------
    covs : ndarray of shape (n_problems, d, d) or (n_problems, d + 1, d + 1)
        Posterior covariances, intercept last when it is fitted.
    d : int
        Features.

    Attributes
    ----------
    weights : list of ndarray of shape (d, d)
        Each problem's W (lower triangular).
    columns : list of ndarray of shape (d,)
        Each problem's c, the intercept's column (empty without an intercept).
    roots : ndarray of shape (n_problems,)
        Each problem's r (zeros without an intercept).
    """

    def __init__(self, covs: np.ndarray, d: int):
        factors = [_intercept_first_factor(cov, d) for cov in covs]
        self.weights = [f[0] for f in factors]
        self.columns = [f[1] for f in factors] if covs.shape[-1] > d else []
        self.roots = np.array([f[2] for f in factors])
        for array in (*self.weights, *self.columns, self.roots):
            array.flags.writeable = False  # (shared by the reads of every thread)


class IndependentLatents(_RowChunks):
    """Mean and variance of each problem's one latent score at X's rows, chunk by chunk.

    Binary (one problem) and one-vs-rest (one per class): independent posteriors, hence
    one variance per problem and no covariance between them.

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
    factors : callable, optional
        Returns the covariances' :class:`IndependentFactors` (a kept one); called only
        where the rows take the factors (dense rows, or sparse rows with many non-zeros).
        By default they are computed here.
    """

    def __init__(
        self,
        X,
        coef: np.ndarray,
        intercept: np.ndarray,
        covs: np.ndarray,
        factors: Callable[[], IndependentFactors] | None = None,
    ):
        self.X, self.coef, self.intercept, self.covs = X, coef, intercept, covs
        n_rows, d = X.shape
        n_problems = len(coef)
        threads = blas_thread_count()
        self.pairs = _gathers_pairs(X, d)
        if self.pairs:
            self.chunks = list(_pair_chunks(_row_counts(X), block_bytes() / threads))
        else:
            made = IndependentFactors(covs, d) if factors is None else factors()
            self.weights, self.roots = made.weights, made.roots
            # One small product gives the intercepts' columns c·x and the means.
            self.intercept_fitted = covs.shape[-1] > d
            self.side = np.ascontiguousarray(np.column_stack([*made.columns, *coef]))
            # Per row: a problem's product (its factor's columns), the small product, the
            # means and variances, and the predictive's temporaries downstream (about 24
            # per problem).
            rows = block_length(8.0 * (d + 28 * n_problems) * threads)
            rows = min(rows, max(1, _CACHE_ENTRIES // d))
            self.chunks = [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
        self.threads = max(1, min(threads, len(self.chunks)))

    def __call__(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, var)`` of the rows, each of shape (n_rows_in_chunk, n_problems)."""
        block = self.X[rows]
        if self.pairs:
            mean = np.asarray(block @ self.coef.T) + self.intercept
            var = _pair_quadratic_forms(block, self.covs)
            np.maximum(var, 0.0, out=var)  # round-off only: the covariances are PD
            return mean, var
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


class JointForms:
    """What :class:`JointLatents` needs of the multinomial covariance whatever the rows: the
    centred covariance's symmetrized blocks of the pairs of classes a ≤ b, and the form the
    rows take them in (see :class:`JointLatents`).

    One per posterior: a fitted estimator computes it on its first read and keeps it
    (:class:`~vsbayes.models.fitted_predictive.PredictiveSetup`); its arrays are read-only.
    Its products run on one BLAS thread, as a read's covariance factor (D-256): under
    another process's load, BLAS's two threads took 2.6 to 6 times as long (D-260).

    Parameters
    ----------
    cov : ndarray of shape (p, p)
        Posterior covariance of θ = [W.ravel(), b] (p = K d without an intercept).
    k, d : int
        Classes and features.

    Attributes
    ----------
    basis : ndarray of shape (K, K − 1)
        The centred basis Q.
    fill : ndarray of shape ((K − 1)²,)
        Each entry of a row's (K − 1)² covariance: its pair's column among the forms.
    pairs_blocks : ndarray of shape (P, w, w)
        The P = (K − 1)K/2 pairs' symmetrized blocks (w = d, or d + 1 with intercepts).
    triangular : bool
        Whether the rows take the forms from their products ``x̃_i x̃_j``, i ≤ j
        (:attr:`triangle`, :attr:`triangles`), else from the blocks side by side
        (:attr:`spread`).
    width : int
        w.
    row_cost : int
        Entries of the forms' product a dense row takes.
    """

    def __init__(self, cov: np.ndarray, k: int, d: int):
        from .softmax_predictive_rules import centred_basis

        self.basis = centred_basis(k)
        # θ's layout to the class-major blocks (K, w, K, w) of [w_k, b_k].
        index = np.arange(k)[:, None] * d + np.arange(d)[None, :]
        if cov.shape[0] > k * d:
            index = np.hstack([index, k * d + np.arange(k)[:, None]])
        w = index.shape[1]
        n_pairs = k * (k - 1) // 2
        # Σ reordered, its basis change (two steps of K·w² · K w each), and the pairs' blocks
        # with their side-by-side copy.
        check_memory(
            8.0 * (3 * (k * w) ** 2 + 2 * n_pairs * w * w),
            f"the multinomial predictive's latent blocks ({k} classes × {w} parameters)",
            "Predict with fewer features or classes, or fit one-vs-rest posteriors.",
        )
        upper = np.triu_indices(k - 1)
        # Entry (a, b) of the (K − 1)² covariance is form P(min(a, b), max(a, b)): one
        # gather fills the chunk's covariances (two scatters into the triangles cost as
        # much as the forms' product at 30 classes).
        position = np.empty((k - 1, k - 1), dtype=np.intp)
        position[upper] = position[upper[::-1]] = np.arange(n_pairs)
        self.fill = position.ravel()
        # Two forms of the same sums, each bound by its passes over memory: the rows'
        # products x̃_i x̃_j (i ≤ j) against the (T, P) upper triangles, T = w(w + 1)/2,
        # doubled off the diagonal (half the multiply-adds, an inner dimension of T; the
        # products and their two gathered factors, 3T entries a row); or x̃ against the
        # (w, P·w) blocks side by side and that product contracted with x̃ (2·P·w entries
        # a row, and the contraction's call per row). The cheaper by that count (D-239).
        n_products = w * (w + 1) // 2
        self.triangular = 3 * n_products <= 2 * n_pairs * w + _CONTRACTION_ROW_ENTRIES
        self.width = w
        with single_blas_thread():
            blocks = cov[np.ix_(index.ravel(), index.ravel())].reshape(k, w, k, w)
            centred = class_congruence(self.basis.T, blocks)  # (K − 1, w, K − 1, w)
            del blocks
            pairs = centred[upper[0], :, upper[1], :]  # (P, w, w)
            del centred
            self.pairs_blocks = 0.5 * (pairs + np.swapaxes(pairs, 1, 2))
            del pairs
            if self.triangular:
                self.triangle = np.triu_indices(w)
                doubled = np.where(self.triangle[0] == self.triangle[1], 1.0, 2.0)
                self.triangles = np.ascontiguousarray(
                    (self.pairs_blocks[:, self.triangle[0], self.triangle[1]] * doubled).T
                )
                self.row_cost = self.triangles.shape[0]
                kept = [*self.triangle, self.triangles]
            else:
                # (w, P·w): column j of x̃ against every pair's block.
                spread = np.ascontiguousarray(self.pairs_blocks.transpose(1, 0, 2))
                self.spread = spread.reshape(w, -1)
                self.row_cost = w * w
                kept = [self.spread]
        for array in (self.fill, self.pairs_blocks, *kept):
            array.flags.writeable = False  # (shared by the reads of every thread)


class JointLatents(_RowChunks):
    """Mean and centred covariance of the K latent scores of a joint posterior at X's rows.

    The multinomial model's layout, θ = ``[W.ravel(), b]`` (:mod:`vsbayes.models.softmax`).
    The softmax is invariant to a common shift, so only the centred latent matters: in an
    orthonormal basis Q (K, K − 1) of the vectors summing to zero, ``g = Qᵀ f`` has the
    covariance ``Cov(g)_ab = x̃ᵀ Σ^Q_ab x̃`` with ``Σ^Q = (Qᵀ ⊗ I) Σ (Q ⊗ I)`` — centring
    first removes the posterior's prior-only directions (wide along the sum of the
    intercepts) before any product. The ``(K − 1)K/2`` forms of a ≤ b (the blocks
    symmetrized: a quadratic form sees only that) cost a chunk of rows one product: with
    at least as many pairs as w, of the rows' products ``x̃_i x̃_j``, i ≤ j, with the
    blocks' upper triangles side by side (off the diagonal doubled), per row
    ``(K − 1)K/2 · w(w + 1)/2`` multiply-adds; with fewer, of the rows with the
    (w, (K − 1)K/2 · w) blocks side by side, then a contraction with the rows, per row
    ``(K − 1)K/2 · w²``; against ``K w · K p`` for the product with a factor of Σ (digits,
    K = 10, w = 65: 1.9e5 against 4.2e6 — measured 5.5 times faster on 2·10⁴ rows, one
    thread). Sparse rows with few non-zeros take the forms from their non-zero pairs
    (:func:`_pair_quadratic_forms`), the others a dense copy of the chunk.
    The centred covariance returned is ``Q Cov(g) Qᵀ``.

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
    forms : JointForms, optional
        The covariance's :class:`JointForms` (a kept one); by default computed here.

    Attributes
    ----------
    budget : float
        Bytes of one thread's share, the bound the predictive rule's blocks keep within.
    """

    def __init__(
        self,
        X,
        coef: np.ndarray,
        intercept: np.ndarray,
        cov: np.ndarray,
        forms: JointForms | None = None,
    ):
        self.X, self.coef, self.intercept = X, coef, intercept
        k, d = coef.shape
        self.forms = JointForms(cov, k, d) if forms is None else forms
        self.basis, w = self.forms.basis, self.forms.width
        n_pairs = k * (k - 1) // 2
        row_cost = self.forms.row_cost
        # Per block: a gathered pair costs _GATHER_COST, a densified row its form's product.
        self.pairs = sp.issparse(X) and bool(
            _gathers_pairs(X, row_cost * X.shape[0] / max(X.nnz, 1))
        )
        threads = blas_thread_count()
        self.budget = block_bytes() / threads
        n_rows = X.shape[0]
        if self.pairs:
            self.chunks = list(_pair_chunks(_row_counts(X), self.budget))
        else:
            if self.forms.triangular:
                # Per row: the products and their two gathered factors (3 T), a dense copy
                # of the row, the forms (P), the covariances (K²).
                per_row = 3 * row_cost + w + n_pairs + k * k
                cached = _FORM_ENTRIES // per_row
            else:
                # Per row: the product (P w), a dense copy of the row, the covariances (K²).
                per_row = n_pairs * w + w + 2 * k * k
                cached = _CACHE_ENTRIES // (n_pairs * w)
            rows = block_length(8.0 * per_row * threads)
            rows = max(min(rows, max(1, cached), -(-n_rows // threads)), 1)
            self.chunks = [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
        self.threads = max(1, min(threads, len(self.chunks)))

    def __call__(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, cov)`` of the chunk's latent scores: (m, K) and centred (m, K, K)."""
        mean, reduced = self.centred(rows)
        return mean, self.basis @ reduced @ self.basis.T

    def centred(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, Cov(g))`` of the chunk: the latent means (m, K) and the covariance
        (m, K − 1, K − 1) of ``g = Qᵀ f`` in the centred basis: what the softmax's
        predictive rule takes,
        :func:`~vsbayes.models.softmax_predictive.centred_softmax_predictive_log_proba`."""
        x = self.X[rows]
        k, d = self.coef.shape
        m = x.shape[0]
        mean = np.asarray(x @ self.coef.T) + self.intercept
        setup = self.forms
        if self.pairs:
            forms = _pair_quadratic_forms(x, setup.pairs_blocks)
        else:
            dense = x.toarray() if sp.issparse(x) else np.asarray(x)
            if setup.width > d:
                dense = np.hstack([dense, np.ones((m, 1))])
            if setup.triangular:
                first, second = setup.triangle
                forms = (dense[:, first] * dense[:, second]) @ setup.triangles
            else:
                product = (dense @ setup.spread).reshape(m, -1, setup.width)
                forms = np.matmul(product, dense[:, :, None])[..., 0]
        return mean, forms[:, setup.fill].reshape(m, k - 1, k - 1)


class StructuredLatents(_RowChunks):
    """Mean and variance of one latent score at X's rows under a structured covariance
    ``Σ = diag(δ) + U K Uᵀ`` (:class:`~vsbayes.gaussian.StructuredCovariance`, intercept
    last when fitted), chunk by chunk: ``x̃ᵀΣx̃ = Σ_j δ_j x_j² + δ_b + (Uᵀx̃)ᵀ K (Uᵀx̃)``
    with ``Uᵀx̃ = U_xᵀ x + u_b``, so that ``x̃ = [x, 1]`` is never formed and sparse rows
    never densified.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_rows, d)
        Validated float64 rows.
    coef : ndarray of shape (1, d)
        Posterior mean of the coefficients.
    intercept : ndarray of shape (1,)
        Posterior mean of the intercept (zero without one).
    covariance : StructuredCovariance
        Of ``[w, b]`` (d + 1) or of ``w`` (d).
    """

    def __init__(self, X, coef: np.ndarray, intercept: np.ndarray, covariance):
        # Duplicates summed once here, not per chunk (their squares need it).
        self.X, self.coef, self.intercept = _summed_duplicates(X), coef, intercept
        n_rows, d = X.shape
        diagonal = covariance.diagonal_part
        # K = V diag(κ) Vᵀ folded into the factor (once per covariance, not per call).
        self.kappa, factor = covariance.eigen_factor()
        self.intercept_fitted = diagonal.shape[0] > d
        self.diagonal = diagonal[:d]
        # The means' column beside the factor's: one product per chunk gives both.
        self.side = np.ascontiguousarray(np.column_stack([factor[:d], coef[0]]))
        self.offset = factor[d] if self.intercept_fitted else np.zeros(factor.shape[1])
        self.base = float(diagonal[d]) if self.intercept_fitted else 0.0
        threads = blas_thread_count()
        # Per row: the product (r + 1), its core product, the squares' pass (≈ 8).
        rows = block_length(8.0 * (2 * factor.shape[1] + 12) * threads)
        rows = min(rows, max(1, _CACHE_ENTRIES // max(factor.shape[1] + 1, 1)))
        self.chunks = [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
        self.threads = max(1, min(threads, len(self.chunks)))

    def __call__(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, var)`` of the rows, each of shape (n_rows_in_chunk, 1)."""
        block = _row_view(self.X, rows)
        product = np.asarray(block @ self.side)
        mean = product[:, -1:] + self.intercept
        projected = product[:, :-1]
        projected += self.offset
        if sp.issparse(block):  # the squared rows share the block's index arrays
            squares = _with_data(block, np.square(block.data)) @ self.diagonal
        else:
            squares = (block * block) @ self.diagonal
        var = np.asarray(squares).ravel() + self.base
        projected *= projected
        var += projected @ self.kappa
        np.maximum(var, 0.0, out=var)  # round-off only: Σ is positive definite
        return mean, var[:, None]


class StructuredIndependentLatents(_RowChunks):
    """Mean and variance of each one-vs-rest problem's latent score at X's rows under its
    own structured covariance: each problem's :class:`StructuredLatents` (the binary
    case's, one home) on the same chunk, side by side.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_rows, d)
        Validated float64 rows.
    coef : ndarray of shape (n_problems, d)
        Posterior means of the coefficients.
    intercept : ndarray of shape (n_problems,)
        Posterior means of the intercepts (zeros without one).
    covariances : sequence of StructuredCovariance
        One per problem, of ``[w, b]`` (d + 1) or of ``w`` (d).
    """

    def __init__(self, X, coef: np.ndarray, intercept: np.ndarray, covariances):
        X = _summed_duplicates(X)  # (once for every problem)
        self.parts = [
            StructuredLatents(X, coef[k : k + 1], intercept[k : k + 1], covariance)
            for k, covariance in enumerate(covariances)
        ]
        n_rows = X.shape[0]
        threads = blas_thread_count()
        # Per row: each problem's product (r + 1), its core product, the squares' pass.
        width = sum(2 * part.kappa.size + 12 for part in self.parts)
        rows = block_length(8.0 * width * threads)
        rows = min(rows, max(1, _CACHE_ENTRIES // max(width // 2, 1)))
        self.chunks = [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
        self.threads = max(1, min(threads, len(self.chunks)))

    def __call__(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, var)`` of the rows, each of shape (n_rows_in_chunk, n_problems)."""
        moments = [part(rows) for part in self.parts]
        return np.hstack([m for m, _ in moments]), np.hstack([v for _, v in moments])


class StructuredJointLatents(_RowChunks):
    """Mean and centred covariance of the K latent scores of a multinomial posterior whose
    covariance is structured, ``Σ = diag(δ) + U K Uᵀ`` in θ's layout ``[W.ravel(), b]``
    (:class:`~vsbayes.gaussian.StructuredCovariance`), chunk by chunk: with ``Z`` (K × r)
    the rows ``x̃ᵀ U_k`` of each class's block of U, ``Cov(f) = diag(Σ_j δ_kj x̃_j²) +
    Z K Zᵀ``, then centred (only the centred part reaches the softmax). The sparse rows
    (never densified, never copied) times each class's block ``U_k`` (d × r, a contiguous
    slice of U: no copy of U), and ``Z K Zᵀ`` as two GEMMs per chunk.

    Why not fold K into U once (``U V``, ``K = V diag(κ) Vᵀ``, then ``Σ κ_r z_r z_rᵀ``): that
    is O(p r²) and two p × r copies at every call, whatever the rows — 5.6 s of a
    100-row call at 50 classes × 20,000 features (r = 156), against K r² more per row
    here (1.2·10⁶ multiply-adds at that size).

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_rows, d)
        Validated float64 rows.
    coef : ndarray of shape (K, d)
        Posterior mean of W.
    intercept : ndarray of shape (K,)
        Posterior mean of b (zeros without one).
    covariance : StructuredCovariance
        Of θ (K d, or K (d + 1) with intercepts); of a
        :class:`~vsbayes.gaussian.CentredStructuredCovariance`, its base, whose centred
        part is the whole covariance's.

    Attributes
    ----------
    budget : float
        Bytes of one thread's share, the bound the predictive rule's blocks keep within.
    """

    def __init__(self, X, coef: np.ndarray, intercept: np.ndarray, covariance):
        self.X, self.coef, self.intercept = _summed_duplicates(X), coef, intercept
        k, d = coef.shape
        n_rows = X.shape[0]
        self.core = covariance.core
        factor = covariance.factor
        rank = factor.shape[1]
        self.class_factors = [factor[c * d : (c + 1) * d] for c in range(k)]  # views
        diagonal = covariance.diagonal_part
        self.diagonal = np.ascontiguousarray(diagonal[: k * d].reshape(k, d).T)  # (d, K)
        fitted = diagonal.shape[0] > k * d
        self.base = diagonal[k * d :] if fitted else np.zeros(k)
        self.offset = factor[k * d :] if fitted else np.zeros((k, rank))  # (K, r)
        self.coef_columns = np.ascontiguousarray(coef.T)  # (d, K)
        self.rank = rank
        threads = blas_thread_count()
        self.budget = block_bytes() / threads
        # Per row: Z and Z K (K r each), the products' (r + 1 per class), the squares (K),
        # the covariances (K², twice), and the predictive's temporaries downstream in its
        # own budget.
        per_row = 8.0 * (3 * k * (rank + 1) + 3 * k * k + 2 * k)
        rows = min(block_length(per_row * threads), max(1, _CACHE_ENTRIES // (k * (rank + 1))))
        rows = max(1, min(rows, -(-n_rows // threads)))
        self.chunks = [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
        self.threads = max(1, min(threads, len(self.chunks)))

    def centred(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, Cov(g))`` of the chunk, as :meth:`JointLatents.centred`: the latent
        means (m, K) and the covariance (m, K − 1, K − 1) of ``g = Qᵀ f``."""
        from .softmax_predictive_rules import centred_basis

        mean, cov = self._scores(rows)
        q = centred_basis(self.coef.shape[0])
        reduced = q.T @ cov @ q
        return mean, 0.5 * (reduced + reduced.transpose(0, 2, 1))

    def __call__(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, cov)`` of the chunk's latent scores: (m, K) and centred (m, K, K)."""
        mean, cov = self._scores(rows)
        cov -= cov.mean(axis=1, keepdims=True)
        cov -= cov.mean(axis=2, keepdims=True)
        return mean, 0.5 * (cov + cov.transpose(0, 2, 1))

    def _scores(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """The chunk's latent means (m, K) and covariance (m, K, K), not yet centred."""
        block = _row_view(self.X, rows)
        k = self.coef.shape[0]
        m = block.shape[0]
        mean = np.asarray(block @ self.coef_columns) + self.intercept
        projected = np.empty((m, k, self.rank))  # Z of each row
        for c, class_factor in enumerate(self.class_factors):
            projected[:, c] = block @ class_factor
        projected += self.offset
        if sp.issparse(block):
            squares = np.asarray(_with_data(block, np.square(block.data)) @ self.diagonal)
        else:
            squares = (block * block) @ self.diagonal
        folded = (projected.reshape(m * k, self.rank) @ self.core).reshape(m, k, self.rank)
        cov = np.matmul(folded, projected.transpose(0, 2, 1))
        cov[:, np.arange(k), np.arange(k)] += squares + self.base
        return mean, cov
