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

  The intercept's vague prior (variance s = 10⁶ in the estimators) is kept out of B: in
  it, s·uuᵀ (u = T^½ a, a the intercept's column) would take B's condition number to
  ~10⁸ and its inverse's last digits with it — the EP sweeps stalled at site changes of
  1e-9 on a sparse 2000 × 5000 problem. B₀ is B without it, and the intercept enters in
  closed form: given b, the coefficients' posterior is the dual one of B₀ (covariance
  P₀), and b's posterior variance is ``γ = s / (1 + s uᵀB₀⁻¹u)``, so that, with
  ``g = D_w⁻¹ Xᵀ T^½ B₀⁻¹ u``, ``H⁻¹ = [[P₀ + γ g gᵀ, −γ g], [−γ gᵀ, γ]]`` and
  ``log det B = log det B₀ + log(1 + s uᵀB₀⁻¹u)``: sums of positive terms, no 10⁶ to
  cancel.
"""

from __future__ import annotations

import copy
import math
import weakref
from functools import cached_property
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.linalg.lapack import dpotri, dtrtri

from .._blas import block_slices, map_blocks, single_blas_thread
from .._indices import triu_indices
from .._lapack import cho_solve, solve_triangular
from .._memory import MAX_DENSE_PARAMS, check_memory, format_bytes
from .._warnings import warn
from ..exceptions import NotPositiveDefiniteError
from ..gaussian import lower_cholesky
from ..models import BinaryGLMPosterior, SoftmaxGLMPosterior
from ..models.latent import row_variances
from ..models.work import SHRINKAGE_STEPS, expected_shrinkage_work, takes_dual_form

__all__ = [
    "BlockLatent",
    "GLMGaussian",
    "NegativeSitesGaussian",
    "RowLatent",
    "check_posterior_memory",
    "check_shrinkage_size",
    "unit_columns_correction",
]

_FORMS = ("auto", "primal", "dual")
# Dual t_var: below this τ_i t_var_i, the shortcut 1 - (B⁻¹)_ii would lose more than one
# digit to the subtraction, and the site takes the direct form.
_CANCELLATION = 0.1
# A binary fit under a shrinkage prior expected to take more multiply-adds than this
# (``expected_shrinkage_work``) warns before its first step: at SHRINKAGE_RATE, measured
# on this machine's 2 loaded cores (Student-t, 2000 × 5000 sparse: 8.4·10¹¹ counted, 57 s
# of CPU), about half an hour.
MAX_SHRINKAGE_WORK, SHRINKAGE_RATE = 1e13, 5e9
_FEATURES_REMEDY = (
    "Reduce the number of features, e.g. by feature selection (sklearn.feature_selection): "
    "a full covariance over p coefficients takes 8·p² bytes per matrix."
)


class _SolvedMoments:
    """The mean and the rows' latent means of a Gaussian given by its ``solve`` (``H⁻¹ v``),
    ``linear`` (h) and signed ``_design`` (A): shared by the primal/dual and the
    negative-sites forms."""

    @cached_property
    def mean(self) -> np.ndarray:
        """``μ = H⁻¹ h``, shape (p,)."""
        return self.solve(self.linear)

    @cached_property
    def t_mean(self) -> np.ndarray:
        """Mean ``a_iᵀμ`` of each ``t_i = a_iᵀθ``, shape (M,)."""
        return np.asarray(self._design @ self.mean).ravel()


class GLMGaussian(_SolvedMoments):
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
        memory, which sums H over its chunks, or whose H has another form (the multinomial
        posterior's; only ``dim``, ``n_observations``, ``prior_var`` and ``max_bytes`` of
        the model are read then).

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
            form = "dual" if takes_dual_form(m, p) and precision is None else "primal"
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
            self._parts = _dual_parts(model)
            dual = self._parts.kernel * self._root[:, None]
            dual *= self._root
            dual[np.diag_indices(m)] += 1.0
            self._lower = lower_cholesky(dual, f"dual form (I + T^½ A D⁻¹ Aᵀ T^½) of the {what}")
            half_log_det = np.log(np.diag(self._lower)).sum() - 0.5 * np.log(self._prior_var).sum()
            self._intercept = None
            if self._parts.column is not None:  # b in closed form (module docstring)
                u = self._root * self._parts.column
                z = cho_solve((self._lower, True), u, check_finite=False)
                gain = self._prior_var[-1] * float(u @ z)  # s uᵀB₀⁻¹u
                rz = self._root * z
                g = self._parts.coef_var * np.asarray(self._design.T @ rz).ravel()
                g[-1] = -1.0  # ĝ = (g, -1)
                self._intercept = _Intercept(z, rz, g, self._prior_var[-1] / (1.0 + gain))
                half_log_det += 0.5 * math.log1p(gain)
            self.half_log_det = float(half_log_det)

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``H⁻¹ v`` for ``v`` of shape (p,) or (p, k)."""
        v = np.asarray(v, dtype=float)
        if self.form == "primal":
            return cho_solve((self._lower, True), v, check_finite=False)
        # P₀ v (the coefficients given b; 0 for b), then b's mean γ (v_b - gᵀv_w) and
        # μ_w = P₀ v_w - g μ_b: with ĝ = (g, -1), out = P₀ v - ĝ μ_b.
        prior_var, root = self._parts.coef_var, self._root
        if v.ndim == 2:
            prior_var, root = prior_var[:, None], root[:, None]
        scaled = prior_var * v  # D_w⁻¹ v
        inner = cho_solve((self._lower, True), root * (self._design @ scaled), check_finite=False)
        out = scaled - prior_var * (self._design.T @ (root * inner))
        if self._intercept is not None:
            g = self._intercept.g
            mean_b = -self._intercept.var * (g @ v)  # γ (v_b - gᵀv_w), as ĝ_b = -1
            out -= np.multiply.outer(g, mean_b)
        return out

    @cached_property
    def t_var(self) -> np.ndarray:
        """Variance ``a_iᵀ H⁻¹ a_i`` of each ``t_i = a_iᵀθ``, shape (M,), without the covariance.

        Primal: ``|L⁻¹ a_i|²`` over blocks of rows. Dual: the diagonal of
        ``A H⁻¹ Aᵀ = K - K T^½ B⁻¹ T^½ K`` with ``K = A D⁻¹ Aᵀ``, in O(M³) given K₀ (K
        without the intercept, which is added in closed form).
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
        # The intercept adds γ zᵢ² to 1 - (B⁻¹)_ii, and γ eᵢ² to the direct form, with
        # e = a - K₀ T^½ z (T^½ e = z): the latent values' covariance is M₀ + γ e eᵀ.
        kernel, root, lower = self._parts.kernel, self._root, self._lower
        inverse, info = dtrtri(lower, lower=1)
        if info != 0:
            raise NotPositiveDefiniteError("The dual factor is singular.")
        weight = 1.0 - np.einsum("ij,ij->j", inverse, inverse)
        if self._intercept is not None:
            weight += self._intercept.var * np.square(self._intercept.z)
        out = np.empty_like(weight)
        strong = weight >= _CANCELLATION
        out[strong] = weight[strong] / np.square(root[strong])
        weak = ~strong
        if weak.any():
            spread = solve_triangular(
                lower, kernel[:, weak] * root[:, None], lower=True, check_finite=False
            )
            out[weak] = np.diag(kernel)[weak] - np.einsum("ij,ij->j", spread, spread)
            if self._intercept is not None:
                e = self._parts.column[weak] - kernel[weak] @ self._intercept.rz
                out[weak] += self._intercept.var * np.square(e)
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
            upper = triu_indices(p, 1)
            inverse[upper] = inverse.T[upper]
            return inverse
        m = self._design.shape[0]
        check_memory(8.0 * (p * p + p * m + 2 * m * m), what, _FEATURES_REMEDY)
        spread = self._dual_spread()
        cov = spread @ spread.T  # a product with its own transpose: exactly symmetric (SYRK)
        np.negative(cov, out=cov)
        cov[np.diag_indices(p)] += self._parts.coef_var
        if self._intercept is not None:
            # + γ ĝ ĝᵀ, in row blocks; r_i r_j keeps it exactly symmetric.
            r = math.sqrt(self._intercept.var) * self._intercept.g
            for rows in block_slices(p, p, max(1, self._max_bytes // (8 * p))):
                cov[rows] += np.multiply.outer(r[rows], r)
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
        var = self._parts.coef_var - np.einsum("ij,ij->i", spread, spread)
        if self._intercept is not None:
            var += self._intercept.var * np.square(self._intercept.g)
        return var

    def _dual_spread(self) -> np.ndarray:
        # P₀ = D_w⁻¹ - V Vᵀ with V = D_w⁻¹ Aᵀ T^½ L⁻ᵀ (B₀ = L Lᵀ), shape (p, M), its
        # intercept row 0 (D_w⁻¹ has 0 there). The explicit L⁻¹ is stable: B₀ ⪰ I, so
        # |L⁻¹| ≤ 1. Aᵀ @ dense keeps a CSR design sparse.
        m = self._design.shape[0]
        inv_lower = solve_triangular(self._lower, np.eye(m), lower=True, check_finite=False)
        spread = np.asarray(self._design.T @ (self._root[:, None] * inv_lower.T))
        spread *= self._parts.coef_var[:, None]
        return spread


class NegativeSitesGaussian(_SolvedMoments):
    """:class:`GLMGaussian` whose diagonal prior precisions ``diagonal`` (length p, the
    prior's and any coefficient sites') are negative on a few coordinates S (a heavy-tailed
    prior's EP sites, where the tilted density is wider than its cavity), in the dual form.

    With ``D₊`` the diagonal made positive on S (``|diagonal|``, at least ``floor``), the
    precision is ``H = H₊ − U N Uᵀ``: ``H₊`` a :class:`GLMGaussian` (the dual form through
    the M × M matrix), U the columns of S, ``N = D₊ − D > 0``. By Woodbury's identity
    ``H⁻¹ = H₊⁻¹ + G C⁻¹ Gᵀ`` with ``G = H₊⁻¹ U`` (k solves) and the k × k capacitance
    ``C = N⁻¹ − Uᵀ H₊⁻¹ U``, positive definite exactly when H is, and
    ``det H = det H₊ det N det C``: no p × p matrix unless the covariance is asked for.
    The same attributes as :class:`GLMGaussian`'s (``mean``, ``var``, ``t_mean``, ``t_var``,
    ``cov``, ``half_log_det``, ``linear``, ``solve``).

    Raises
    ------
    NotPositiveDefiniteError
        If H is not positive definite (C has no Cholesky factor).
    """

    def __init__(self, model, tau, linear, diagonal, floor, *, what="posterior precision"):
        diagonal = np.asarray(diagonal, dtype=float)
        self.tail = np.flatnonzero(diagonal <= 0)
        positive = diagonal.copy()
        positive[self.tail] = np.maximum(-diagonal[self.tail], floor[self.tail])
        lack = positive[self.tail] - diagonal[self.tail]  # N
        view = copy.copy(model)
        view.prior_var = 1.0 / positive
        self._base = base = GLMGaussian(view, tau, linear, form="dual", what=what)
        self.form, self.linear, self._design = base.form, base.linear, base._design
        self._spread, capacitance = unit_columns_correction(base, self.tail, lack)
        self._lower = lower_cholesky(capacitance, what)
        self.half_log_det = float(
            base.half_log_det + 0.5 * np.log(lack).sum() + np.log(np.diag(self._lower)).sum()
        )

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``H⁻¹ v`` for ``v`` of shape (p,) or (p, k)."""
        solved = self._base.solve(v)
        inner = cho_solve((self._lower, True), solved[self.tail], check_finite=False)
        return solved + self._spread @ inner

    @cached_property
    def _whitened(self) -> np.ndarray:
        # L_C⁻¹ Gᵀ, (k, p): the correction G C⁻¹ Gᵀ is its Gram matrix.
        return solve_triangular(self._lower, self._spread.T, lower=True, check_finite=False)

    @cached_property
    def t_var(self) -> np.ndarray:
        """Variance ``a_iᵀ H⁻¹ a_i`` of each ``t_i``, shape (M,)."""
        rows = np.asarray(self._design @ self._whitened.T)  # A G L_C⁻ᵀ, (M, k)
        return self._base.t_var + np.einsum("ij,ij->i", rows, rows)

    @cached_property
    def var(self) -> np.ndarray:
        """The marginal variances, shape (p,), without the covariance."""
        return self._base.var + np.einsum("ij,ij->j", self._whitened, self._whitened)

    @cached_property
    def cov(self) -> np.ndarray:
        """The covariance ``H⁻¹``, shape (p, p), dense."""
        cov = self._base.cov
        del self._base.__dict__["cov"]  # taken over, changed in place: not copied (8·p² bytes)
        cov += self._whitened.T @ self._whitened  # (exactly symmetric: a Gram matrix)
        return cov


def unit_columns_correction(base, tail: np.ndarray, lack: np.ndarray):
    """Woodbury's parts for ``H = H₊ − U N Uᵀ``, ``base`` H₊ (anything with ``solve`` and
    ``linear``), U the unit columns ``tail``, ``N = diag(lack) > 0``: ``G = H₊⁻¹ U``, (p, k),
    and the capacitance ``C = N⁻¹ − Uᵀ G``, (k, k), symmetrized. ``H⁻¹ = H₊⁻¹ + G C⁻¹ Gᵀ``,
    and C is positive definite exactly when H is."""
    k = tail.size
    columns = np.zeros((base.linear.size, k))
    columns[tail, np.arange(k)] = 1.0
    spread = base.solve(columns)
    capacitance = -spread[tail]
    capacitance = 0.5 * (capacitance + capacitance.T)
    capacitance[np.diag_indices(k)] += 1.0 / lack
    return spread, capacitance


class _Intercept(NamedTuple):
    """The intercept in closed form (module docstring): ``z = B₀⁻¹u``, ``T^½ z``,
    ``ĝ = (g, -1)`` and ``γ`` (b's posterior variance)."""

    z: np.ndarray
    rz: np.ndarray
    g: np.ndarray
    var: float


class _DualParts(NamedTuple):
    """What the dual form needs of a model besides the sites: the coefficients' prior
    variances ``D_w⁻¹`` (0 for the intercept), their kernel ``K₀ = A D_w⁻¹ Aᵀ`` (M × M,
    read-only) and the intercept's column ``a`` of A (dense; None without an intercept)."""

    coef_var: np.ndarray
    kernel: np.ndarray
    column: np.ndarray | None


# They depend on the model only, not on the sites: Newton's iterations and EP's sweeps over
# one model reuse them (O(M² p) each time otherwise). Weak keys: they go with the model.
_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _dual_parts(model: BinaryGLMPosterior) -> _DualParts:
    parts = _PARTS.get(model)
    if parts is None:
        design, coef_var, column = model.design, model.prior_var.copy(), None
        if model.fit_intercept:
            coef_var[-1] = 0.0
            column = design[:, -1]
            column = np.asarray(column.toarray() if sp.issparse(column) else column).ravel()
        kernel = _prior_kernel(design, coef_var, model.max_bytes)
        for array in (coef_var, kernel):
            array.flags.writeable = False
        parts = _PARTS[model] = _DualParts(coef_var, kernel, column)
    return parts


def _prior_kernel(design, prior_var: np.ndarray, max_bytes: int) -> np.ndarray:
    """``X D⁻¹ Xᵀ`` (M × M, dense), the prior covariance of the latent values ``Xθ``."""
    scale = np.sqrt(prior_var)
    if sp.issparse(design):
        scaled = design @ sp.diags(scale)  # CSR with X's sparsity
        return np.asarray((scaled @ scaled.T).toarray())
    m, p = design.shape
    kernel = np.zeros((m, m))
    # Blocks of columns, so that the scaled copy stays within max_bytes; each block's
    # product with its own transpose is exactly symmetric.
    block = max(1, max_bytes // (8 * max(m, 1)))
    for j in range(0, p, block):
        part = design[:, j : j + block] * scale[j : j + block]
        kernel += part @ part.T
    return kernel


def check_posterior_memory(
    model, estimator_name: str = "", *, under_prior: bool = False, remedy: str = ""
) -> None:
    """Raise MemoryLimitError before any work if an estimator's fit cannot fit in memory
    (``under_prior``: a fit under a general prior, ``prior=`` or ``partial_fit``, which has
    no structured covariance to suggest; ``remedy``, if given, says what would fit instead
    of the structured covariance).

    Every route of a binary problem ends with the p × p posterior covariance, held three
    times at its peak: the approximation's own (cached), its inverse's factor or workspace,
    and the estimator's ``sigma_``; with more parameters than rows (the dual form), also
    the M × M kernel, its factor and the M × p spread. The model's own copy of the rows is
    counted too, as the margin for the rest of the process: checking the covariance alone,
    at the end, let a 300 × 50,000 fit allocate 18.6 GiB on a 23.5 GiB machine, and refused
    a 20,000 × 50,000 one after 17 minutes of Newton steps.
    """
    design = getattr(model, "design", None)
    if design is None:  # rows in dask chunks: a p × p Hessian per step, checked there
        return
    p, m = model.dim, model.n_observations
    dense = 3.0 * p * p
    if p > m:  # the dual form's kernel, factor and solves, and the spread
        dense += 4.0 * m * m + p * m
    held = float(design.data.nbytes + design.indices.nbytes) if hasattr(design, "nnz") else 0.0
    held = held or float(getattr(design, "nbytes", 0))
    name = f"{estimator_name} " if estimator_name else ""
    structured = remedy or (
        "A fit under a correlated prior (prior= a full covariance or a dense posterior) has "
        "the dense covariance; a diagonal prior (variances) of a binary or one-vs-rest "
        "problem takes the structured one, as partial_fit's carried structured "
        "posterior does: pass prior=(mean, variances), stream with partial_fit, or fit "
        "all the rows at once."
        if under_prior
        else "A structured covariance avoids it (binary and one-vs-rest problems): "
        "vsbayes.config_context(covariance='auto') (the default) or 'lowrank'."
    )
    check_memory(
        8.0 * dense + held,
        f"the {name}posterior of {p} coefficients from {m} rows (its {p} × {p} covariance, "
        f"{format_bytes(8.0 * p * p)}, held three times at the peak, and the fit's other "
        f"dense matrices and rows)",
        "Use fewer features (feature selection, e.g. sklearn.feature_selection, or a "
        "TruncatedSVD / random projection of X): the posterior's memory grows with the "
        f"square of the number of features. {structured}",
    )


def check_shrinkage_size(
    model, estimator_name: str = "", remedy: str = "", steps: int = SHRINKAGE_STEPS
) -> None:
    """Before any work, for a posterior under a shrinkage prior (``model.coefficient_prior``):
    warn where its fit is expected to take more than ``MAX_SHRINKAGE_WORK`` multiply-adds
    (:func:`~vsbayes.models.work.expected_shrinkage_work` of ``steps``, binary or
    multinomial), and raise
    ValueError where a binary one has more than ``MAX_DENSE_PARAMS`` coefficients (a
    multinomial one is refused there by ``softmax_laplace.check_softmax_size``, in its own
    terms).

    Such a fit keeps the dense covariance whatever p (the proximal Newton steps of its mode
    factor the p × p Hessian, its EP sites are fitted on the dense posterior); where that
    fits in memory beyond this size, it ran for hours (LaplaceLogisticRegression with
    penalty='l1' on 5000 × 20,000 sparse rows passed the memory check, 6 covariances of
    3 GiB under a limit of 18.8 GiB, and had not ended after 200 s, its first Cholesky
    factorization of 2.7·10¹² multiply-adds among tens). ``remedy``: what would fit instead
    (the covariance structure the Gaussian prior takes)."""
    factor = getattr(model, "coefficient_prior", None)
    p = model.dim
    if factor is None:
        return
    name = f"{estimator_name} " if estimator_name else ""
    multinomial = isinstance(model, SoftmaxGLMPosterior)
    if p <= MAX_DENSE_PARAMS:
        work = expected_shrinkage_work(model, steps)
        if work > MAX_SHRINKAGE_WORK:
            m = model.n_observations
            stepping = "its mode's steps and EP's sweeps"
            if steps < SHRINKAGE_STEPS:
                stepping = "its mode's Newton steps"
            shape = f"{p} coefficients, {m} rows"
            form = f"the dense {p} × {p} precision"
            if multinomial:
                shape = f"{p} coefficients of {model.n_classes} classes, {m} rows"
            elif takes_dual_form(m, p):
                form = f"the {m} × {m} dual form of the precision"
            warn(
                f"The {name}posterior under the shrinkage prior {factor!r} ({shape}) will "
                f"take about {work:.1g} multiply-adds ({work / SHRINKAGE_RATE / 60:.0f} "
                f"minutes or more at {SHRINKAGE_RATE:.0g} a second): {stepping} each "
                f"factor {form}, and no structured covariance takes a "
                f"shrinkage prior. {remedy + ' ' if remedy else ''}Or subsample the rows, "
                f"or select features first (e.g. sklearn.feature_selection.SelectKBest in "
                f"a pipeline).",
                UserWarning,
                now=True,  # before the hours of work, not after them
            )
        return
    if multinomial:
        return
    raise ValueError(
        f"The {name}posterior under the shrinkage prior {factor!r} has {p} coefficients, "
        f"above the {MAX_DENSE_PARAMS} its dense {p} × {p} steps allow: each "
        f"factorization takes {p**3 / 3:.2g} multiply-adds, and a fit makes tens. {remedy} "
        f"Or select features first (e.g. sklearn.feature_selection.SelectKBest, or "
        f"SelectFromModel(LogisticRegression(penalty='l1', solver='liblinear')) in a "
        f"pipeline) to at most {MAX_DENSE_PARAMS - (p - model.n_features)} features."
    )


class RowLatent(NamedTuple):
    """One row's latent value ``t = aᵀθ`` under a Gaussian N(μ, Σ) of θ, and the rank-one
    map to the Gaussian whose marginal of t is another: the one-row updates of
    ``partial_fit`` (Laplace: the mode's expansion; EP: the tilted moments).

    With one row, prior × site differs from the prior along ``a`` only: the conditional of
    θ given t is unchanged, so fixing t's new marginal N(m̂, v̂) fixes the Gaussian,
    ``μ' = μ + Σa (m̂ − m) / v`` and ``Σ' = Σ − Σa aᵀΣ (v − v̂) / v²`` (the site
    ``τ = 1/v̂ − 1/v``, ``ν = m̂/v̂ − m/v`` by Sherman–Morrison): O(p²), no factorization.
    """

    mean: float  #: m = aᵀμ
    var: float  #: v = aᵀΣa, as ‖Lᵀa‖² (never negative)
    gain: np.ndarray  #: Σa, shape (p,)

    @classmethod
    def of(cls, mean: np.ndarray, lower: np.ndarray, row: np.ndarray) -> RowLatent:
        """The latent of ``row`` (shape (p,)) under N(mean, L Lᵀ), ``lower`` = L."""
        spread = lower.T @ row
        return cls(float(row @ mean), float(spread @ spread), lower @ spread)

    def conditioned(
        self, mean: np.ndarray, cov: np.ndarray, new_mean: float, new_var: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The mean and covariance of the Gaussian N(mean, cov) with t's marginal made
        N(new_mean, new_var), 0 < new_var."""
        gain = self.gain
        shrink = (self.var - new_var) / (self.var * self.var)
        return mean + gain * ((new_mean - self.mean) / self.var), cov - shrink * np.outer(
            gain, gain
        )

    def site(self, new_mean: float, new_var: float) -> tuple[float, float]:
        """The Gaussian site ``(τ, ν)`` on t that takes t's marginal to N(new_mean,
        new_var)."""
        return 1.0 / new_var - 1.0 / self.var, new_mean / new_var - self.mean / self.var


class BlockLatent(NamedTuple):
    """One row's latent vector ``g = Aθ`` (r values: the multinomial row's K − 1 contrasts)
    under a Gaussian N(μ, Σ) of θ, and the rank-r map to the Gaussian whose marginal of g
    is another: :class:`RowLatent` with r ≥ 1 (kept apart, as the binary one is scalar).

    The conditional of θ given g is unchanged, so ``μ' = μ + K (m̂ − m)`` and
    ``Σ' = Σ − K (V − V̂) Kᵀ`` with the gain ``K = ΣAᵀV⁻¹``: O(p² r), no p × p
    factorization.
    """

    mean: np.ndarray  #: m = Aμ, shape (r,)
    cov: np.ndarray  #: V = AΣAᵀ, shape (r, r)
    gain: np.ndarray  #: ΣAᵀV⁻¹, shape (p, r)
    rows: np.ndarray  #: A, shape (r, p)

    @classmethod
    def of_softmax_row(
        cls, mean: np.ndarray, cov: np.ndarray, row: np.ndarray, q: np.ndarray, fit_intercept: bool
    ) -> BlockLatent:
        """The contrasts ``g = Qᵀ(Θ x̃)`` of one multinomial row (features ``row``, shape
        (d,); Q of shape (K, K − 1)) under N(mean, cov) of θ = ``[W.ravel(), b]``."""
        # A (r × p): g_a = Σ_k q_ka (w_k · x + b_k) in θ's class-major layout.
        blocks = [np.kron(q.T, np.asarray(row, dtype=float)[None, :])]
        if fit_intercept:
            blocks.append(q.T)
        return cls.of(mean, cov, np.hstack(blocks))

    @classmethod
    def of(cls, mean: np.ndarray, cov: np.ndarray, rows: np.ndarray) -> BlockLatent:
        """The latent ``rows @ θ`` (``rows`` of shape (r, p)) under N(mean, cov)."""
        spread = cov @ rows.T  # ΣAᵀ, (p, r)
        latent_cov = rows @ spread
        latent_cov = 0.5 * (latent_cov + latent_cov.T)
        lower = lower_cholesky(latent_cov, "covariance of the row's latent values")
        gain = cho_solve((lower, True), spread.T, check_finite=False).T
        return cls(rows @ mean, latent_cov, gain, rows)

    def conditioned(
        self, mean: np.ndarray, cov: np.ndarray, new_mean: np.ndarray, new_cov: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The mean and covariance of N(mean, cov) with g's marginal made N(new_mean,
        new_cov)."""
        gain = self.gain
        updated = cov - gain @ (self.cov - new_cov) @ gain.T
        return mean + gain @ (new_mean - self.mean), 0.5 * (updated + updated.T)
