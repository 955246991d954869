"""The Gaussian of a binary GLM's prior times Gaussian sites on ``t_i = a_iᵀθ``, primal or dual.

Newton-Laplace (sites = the second-order expansion of each factor) and EP (sites = the
moment-matched ones) both need the Gaussian with precision and linear term

    H = D + Aᵀ diag(τ) A,    h,    mean μ = H⁻¹ h,

where ``D = diag(1 / prior_var)`` and ``A`` (M × p) is the model's signed design, dense or
CSR. Two factorizations give it:

* **primal** (p ≤ M): the Cholesky factor of the p × p matrix H; O(M p² + p³).
* **dual** (p > M): Woodbury's identity around the M × M matrix
  ``B = I + T^½ A D⁻¹ Aᵀ T^½`` (``T = diag(τ)``), so that
  ``H⁻¹ = D⁻¹ - D⁻¹ Aᵀ T^½ B⁻¹ T^½ A D⁻¹`` and ``log det H = Σ log D + log det B``;
  O(M² p + M³), and no p × p matrix unless the covariance itself is asked for. B has all
  its eigenvalues ≥ 1, so its Cholesky factorization is stable (it is the symmetric form
  of Rasmussen and Williams 2006, Algorithm 3.5). A CSR design stays sparse: only
  products ``A @ dense`` and ``A.T @ dense`` are formed.
"""

from __future__ import annotations

import weakref
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_solve, solve_triangular
from scipy.linalg.lapack import dpotri, dtrtri

from .._blas import block_slices, map_blocks, single_blas_thread
from .._memory import check_memory
from ..exceptions import NotPositiveDefiniteError
from ..gaussian import lower_cholesky
from ..models import BinaryGLMPosterior

__all__ = ["GLMGaussian", "precision_diagonal", "row_variances"]

_FORMS = ("auto", "primal", "dual")
# "auto" takes the dual form only beyond this p: below, the primal factorization costs
# under 10⁷ flops, and it keeps the digits the dual loses when D⁻¹ - V Vᵀ cancels (a vague
# intercept prior, or features on a scale of 10⁷, made it lose all of them).
_DUAL_MIN_DIM = 256
# Dual t_var: below this τ_i t_var_i, the shortcut 1 - (B⁻¹)_ii would lose more than one
# digit to the subtraction, and the site takes the direct form.
_CANCELLATION = 0.1
_FEATURES_REMEDY = (
    "Reduce the number of features, e.g. by feature selection (sklearn.feature_selection): "
    "a full covariance over p coefficients takes 8·p² bytes per matrix."
)


class GLMGaussian:
    """N(H⁻¹h, H⁻¹) with ``H = diag(1/prior_var) + Aᵀ diag(τ) A``, in primal or dual form.

    Parameters
    ----------
    model : BinaryGLMPosterior
        Gives the signed design ``A`` (``model.design``), ``prior_var`` and ``max_bytes``.
    tau : ndarray of shape (M,), optional
        Site precisions, one per row of ``A``; ≥ 0 for log-concave factors.
    linear : ndarray of shape (p,), optional
        The linear term ``h`` (default 0, e.g. when only :meth:`solve` is needed).
    form : {"auto", "primal", "dual"}, default="auto"
        Factorization; "auto" takes the primal one when p ≤ M (then the p × p Cholesky
        factor is the smaller matrix), the dual one otherwise.
    what : str, default="posterior precision"
        Name of H in the error raised when it is not positive definite.
    precision : ndarray of shape (p, p), optional
        H itself, instead of ``tau`` (primal form): for a model whose rows are not in
        memory, which sums H over its chunks.

    Attributes
    ----------
    form : str
        "primal" or "dual".
    linear : ndarray of shape (p,)
        The linear term ``h``.
    half_log_det : float
        ``½ log det H``.

    Raises
    ------
    NotPositiveDefiniteError
        If the matrix to factorize is not numerically positive definite.
    MemoryLimitError
        If the dense matrices of the factorization would not fit in memory.
    """

    def __init__(
        self,
        model: BinaryGLMPosterior,
        tau: np.ndarray | None = None,
        linear: np.ndarray | None = None,
        *,
        form: str = "auto",
        what: str = "posterior precision",
        precision: np.ndarray | None = None,
    ):
        if form not in _FORMS:
            raise ValueError(f"form must be one of {_FORMS}; got {form!r}.")
        if (tau is None) == (precision is None):
            raise ValueError("Give either the site precisions tau or the precision H.")
        p, m = model.dim, model.n_observations
        if form == "auto":
            form = "dual" if p > max(m, _DUAL_MIN_DIM) and precision is None else "primal"
        self.form = form
        self.linear = np.zeros(p) if linear is None else np.asarray(linear, dtype=float)
        # None for a model whose rows are in dask chunks: then H is given, and only the
        # rows' own quantities (t_mean, t_var) are unavailable.
        self._design = getattr(model, "design", None)
        self._prior_var = model.prior_var
        self._max_bytes = model.max_bytes
        if form == "primal":
            # weighted_gram's sum and its block product, then the Cholesky factor.
            check_memory(3 * 8.0 * p * p, f"the {p} × {p} {what}", _FEATURES_REMEDY)
            if precision is None:
                precision = model.weighted_gram(np.asarray(tau, dtype=float))
                precision[np.diag_indices(p)] += 1.0 / model.prior_var
            self._lower = lower_cholesky(precision, what)
            self.half_log_det = float(np.log(np.diag(self._lower)).sum())
        else:
            # The kernel, B, its factor and t_var's solve: four M × M matrices at most.
            check_memory(
                4 * 8.0 * m * m,
                f"the {m} × {m} dual form of the {what} ({m} observations)",
                "Reduce the number of observations (subsample) or of features.",
            )
            # Log-concave factors give τ ≥ 0 (EP's and Newton's sites alike); a negative τ can
            # only be round-off, and T^½ needs τ ≥ 0.
            self._root = np.sqrt(np.maximum(np.asarray(tau, dtype=float), 0.0))
            self._kernel = _prior_kernel(model)
            dual = self._kernel * self._root[:, None]
            dual *= self._root
            dual[np.diag_indices(m)] += 1.0
            self._lower = lower_cholesky(dual, f"dual form (I + T^½ A D⁻¹ Aᵀ T^½) of the {what}")
            self.half_log_det = float(
                np.log(np.diag(self._lower)).sum() - 0.5 * np.log(self._prior_var).sum()
            )

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``H⁻¹ v`` for ``v`` of shape (p,) or (p, k)."""
        v = np.asarray(v, dtype=float)
        if self.form == "primal":
            return cho_solve((self._lower, True), v, check_finite=False)
        prior_var, root = self._prior_var, self._root
        if v.ndim == 2:
            prior_var, root = prior_var[:, None], root[:, None]
        scaled = prior_var * v  # D⁻¹ v
        inner = cho_solve((self._lower, True), root * (self._design @ scaled), check_finite=False)
        return scaled - prior_var * (self._design.T @ (root * inner))

    @cached_property
    def mean(self) -> np.ndarray:
        """``μ = H⁻¹ h``, shape (p,)."""
        return self.solve(self.linear)

    @cached_property
    def t_mean(self) -> np.ndarray:
        """Mean ``a_iᵀμ`` of each ``t_i = a_iᵀθ``, shape (M,)."""
        return np.asarray(self._design @ self.mean).ravel()

    @cached_property
    def t_var(self) -> np.ndarray:
        """Variance ``a_iᵀ H⁻¹ a_i`` of each ``t_i = a_iᵀθ``, shape (M,), without the covariance.

        Primal: ``|L⁻¹ a_i|²`` over blocks of rows. Dual: the diagonal of
        ``A H⁻¹ Aᵀ = K - K T^½ B⁻¹ T^½ K`` with ``K = A D⁻¹ Aᵀ``, in O(M³) given K.
        """
        if self.form == "dual":
            return self._dual_t_var()
        design, lower = self._design, self._lower
        m, p = design.shape
        if sp.issparse(design):
            pairs = np.square(np.diff(design.indptr).astype(float)).sum()
            if pairs + p**3 < m * p * p:
                # One covariance (p³, kept for later) and the pairs of non-zeros of each
                # row (Σ nnz_i²) beat the M triangular solves (M p²).
                return row_variances(design, self.cov, self._max_bytes)
        out = np.empty(m)

        def block(rows: slice) -> None:
            a = design[rows]
            a = a.toarray() if sp.issparse(a) else a
            spread = solve_triangular(lower, a.T, lower=True, check_finite=False)
            out[rows] = np.einsum("ij,ij->j", spread, spread)

        # Each block holds its rows as a dense (p, block) array and the solve's result; 256
        # rows at least, so that each solve is a matrix one (TRSM), not row by row, and 2²⁷
        # multiply-adds (as weighted_gram's blocks).
        cap = max(1, self._max_bytes // (16 * p))
        blocks = block_slices(m, p * p, cap, max(2**27, 256 * p * p))
        with single_blas_thread():
            map_blocks(block, blocks)
        return out

    def _dual_t_var(self) -> np.ndarray:
        # With C = T^½ K T^½ and B = I + C: T^½ (K - K T^½ B⁻¹ T^½ K) T^½ = C (I + C)⁻¹
        # = I - B⁻¹, so τ_i t_var_i = 1 - (B⁻¹)_ii, and diag(B⁻¹) needs only L⁻¹ (a third
        # of the flops of L⁻¹ T^½ K). The subtraction loses digits where 1 - (B⁻¹)_ii is
        # small (sites of little weight): those columns take the direct form.
        kernel, root, lower = self._kernel, self._root, self._lower
        inverse, info = dtrtri(lower, lower=1)
        if info != 0:
            raise NotPositiveDefiniteError("The dual factor is singular.")
        weight = 1.0 - np.einsum("ij,ij->j", inverse, inverse)
        out = np.empty_like(weight)
        strong = weight >= _CANCELLATION
        out[strong] = weight[strong] / np.square(root[strong])
        weak = ~strong
        if weak.any():
            spread = solve_triangular(
                lower, kernel[:, weak] * root[:, None], lower=True, check_finite=False
            )
            out[weak] = np.diag(kernel)[weak] - np.einsum("ij,ij->j", spread, spread)
        return out

    @cached_property
    def cov(self) -> np.ndarray:
        """The covariance ``H⁻¹``, shape (p, p), dense; computed on first access.

        Raises
        ------
        MemoryLimitError
            If the p × p matrices would not fit in memory.
        """
        p = self._prior_var.shape[0]
        what = f"the {p} × {p} posterior covariance (sigma_ of the estimators)"
        if self.form == "primal":
            # The Cholesky factor, the identity and the solution.
            check_memory(3 * 8.0 * p * p, what, _FEATURES_REMEDY)
            # LAPACK's inverse from the Cholesky factor: a third of the flops of solving
            # against the identity. It fills one triangle.
            inverse, info = dpotri(self._lower, lower=1)
            if info != 0:
                raise NotPositiveDefiniteError(f"The {what} could not be inverted.")
            upper = np.triu_indices(p, 1)
            inverse[upper] = inverse.T[upper]
            return inverse
        m = self._design.shape[0]
        check_memory(8.0 * (p * p + p * m + 2 * m * m), what, _FEATURES_REMEDY)
        spread = self._dual_spread()
        cov = spread @ spread.T  # a product with its own transpose: exactly symmetric (SYRK)
        np.negative(cov, out=cov)
        cov[np.diag_indices(p)] += self._prior_var
        return cov

    @cached_property
    def var(self) -> np.ndarray:
        """The marginal variances, the diagonal of ``H⁻¹``, shape (p,): in the dual form
        without the p × p covariance (O(M² p) instead of O(M p²))."""
        if self.form == "primal" or "cov" in self.__dict__:
            return np.diag(self.cov).copy()
        p, m = self._design.shape[1], self._design.shape[0]
        check_memory(
            8.0 * (p * m + 2 * m * m),
            f"the posterior variances of {p} coefficients",
            "Reduce the number of observations (subsample) or of features.",
        )
        spread = self._dual_spread()
        return self._prior_var - np.einsum("ij,ij->i", spread, spread)

    def _dual_spread(self) -> np.ndarray:
        # H⁻¹ = D⁻¹ - V Vᵀ with V = D⁻¹ Aᵀ T^½ L⁻ᵀ (B = L Lᵀ), shape (p, M). The explicit
        # L⁻¹ is stable: B ⪰ I, so |L⁻¹| ≤ 1. Aᵀ @ dense keeps a CSR design sparse.
        m = self._design.shape[0]
        inv_lower = solve_triangular(self._lower, np.eye(m), lower=True, check_finite=False)
        spread = np.asarray(self._design.T @ (self._root[:, None] * inv_lower.T))
        spread *= self._prior_var[:, None]
        return spread


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


# K depends on the model only, not on the sites: Newton's iterations and EP's sweeps over
# one model reuse it (O(M² p) each time otherwise). Weak keys: it goes with the model.
_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _prior_kernel(model: BinaryGLMPosterior) -> np.ndarray:
    """``K = A D⁻¹ Aᵀ`` (M × M, dense, read-only), the prior covariance of the ``t_i``."""
    kernel = _KERNELS.get(model)
    if kernel is None:
        kernel = _compute_prior_kernel(model)
        kernel.flags.writeable = False
        _KERNELS[model] = kernel
    return kernel


def _compute_prior_kernel(model: BinaryGLMPosterior) -> np.ndarray:
    design, scale = model.design, np.sqrt(model.prior_var)
    if sp.issparse(design):
        scaled = design @ sp.diags(scale)  # CSR with A's sparsity
        return np.asarray((scaled @ scaled.T).toarray())
    m, p = design.shape
    kernel = np.zeros((m, m))
    # Blocks of columns, so that the scaled copy stays within max_bytes; each block's
    # product with its own transpose is exactly symmetric.
    block = max(1, model.max_bytes // (8 * max(m, 1)))
    for j in range(0, p, block):
        part = design[:, j : j + block] * scale[j : j + block]
        kernel += part @ part.T
    return kernel
