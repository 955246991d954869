"""The Laplace approximation of the multinomial (softmax) posterior with a structured
covariance: many classes × many sparse features, never a (K(d + 1))² matrix.

The binary construction (:mod:`~vsbayes.approximations.structured_laplace`, "lowrank" with
estimated marginals) carries over unchanged once the softmax's data term is written as a
Gram matrix. The negative Hessian at the mode is ``H = D + Σ_i s_i C_i ⊗ x̃_i x̃_iᵀ``
(θ's layout ``[W.ravel(), b]``, ``D = diag(1/prior_var)``) with ``C_i = diag π_i − π_i π_iᵀ``.
Since ``Σ_k π_ik = 1``, ``u_i = √π_i`` is a unit vector and ``C_i = R_iᵀR_i`` with
``R_i = (I − u_i u_iᵀ) diag(u_i)``; in prior-whitened coordinates ``z = D^½ θ``,
``H_w = I + GᵀG`` where G's row block i is ``√s_i R_i ⊗ x̃_iᵀ`` times ``D^{-½}``. G is
never formed: a product with it is one product of the sparse rows with K columns per
vector, and ``O(M K)`` element-wise work (:class:`_SoftmaxDataTerm`).

* **The mode**: Newton's method with the Newton systems solved by conjugate gradients on
  Hessian-vector products, preconditioned by the Hessian's diagonal averaged over the
  classes of each column. That preconditioner commutes with the centring of the classes,
  as H does (``C_i 1 = 0`` and the prior is the same for every class of a column), so
  that the iterates stay in the centred subspace where H is well conditioned (along the
  shift of the intercepts it has the vague prior's 10⁻⁶ only).
* **The covariance** ("lowrank"): the r leading eigenpairs ``(λ_k, q_k)`` of ``GᵀG`` by a
  randomized subspace iteration (Halko et al. 2011) on those products, exact on their
  span; exact too on the shift directions ``n_j = 1_K ⊗ e_j / √K`` of each column j (a
  feature, or the intercept), the data term's null space (``C_i 1 = 0``), along which the
  posterior is the prior's, independent of the contrasts
  (:class:`~vsbayes.gaussian.CentredStructuredCovariance`). On the complement of both
  (``P = I − QQᵀ − NNᵀ``) ``S = diag(1 / (1 + e_j / ρ_j))`` with ``e_j`` the diagonal of
  ``P GᵀG P`` (from ``diag(GᵀG) = Σ_i s_i π_ik(1 − π_ik) x̃_ij²`` less the span's part)
  and ``ρ_j = P_jj = 1 − 1/K − |q_j|²``. (A diagonal S over ``I − QQᵀ`` spread a mean of
  the classes' S over each shift direction instead of its prior variance: marginal sds
  of the frequent features 13 % low at rank 4 + 19, 20 classes × 200 features.)
  **Stated error**, as the binary one's: the
  variance of any linear combination of θ (a marginal, a class's latent value, a contrast
  of two classes' latent values at a row) is within a factor ``1 + λ_{r+1}`` of the exact
  Laplace covariance's, λ_{r+1} the largest eigenvalue left out (recorded); the evidence's
  ``log det(I + E)`` estimated by ``Σ ρ_j log(1 + e_j/ρ_j)``. With intercepts, their
  vague prior makes the K − 1 intercept contrasts the leading directions of ``GᵀG``
  (eigenvalues ~ prior variance × rows): the rank is the configured one plus K − 1, so
  that they are exact and the bound speaks of the coefficients.
* **"diagonal"**: rank 0 (intercept contrasts included in the bound: its factor is then
  large, the marginals ``1/H_jj``-like).

The posterior is kept in θ's coordinates as fitted (the mode is centred, ``Σ_k w_k = 0``
and ``Σ_k b_k = 0``; the covariance along the shift directions is their prior's, as the
dense posterior's): predictions centre the latent values first and do not see it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, cg

from .._linalg import thin_qr
from .._memory import check_memory
from .._warnings import warn
from ..exceptions import UnreliableFitWarning
from ..gaussian import CentredStructuredCovariance
from .newton_laplace import SoftmaxCurvature
from .structured_laplace import (
    _OVERSAMPLES,
    _POWER_ITERATIONS,
    CovarianceChoice,
    StructuredLaplaceResult,
    StructuredNewtonSolver,
    complement_covariance,
    softmax_intercept_bytes,
    softmax_subspace_bytes,
)

__all__ = ["structured_softmax_laplace"]

_STRUCTURE_REMEDY = (
    "Use a smaller rank (vsbayes.config_context(covariance_rank=...)) or "
    "covariance='diagonal', fewer features (feature selection, hashing to fewer columns), "
    "or raise the memory_limit of vsbayes.config_context."
)
# The intercept contrasts' conjugate-gradient solves, preconditioned by the structure,
# take 12-40 iterations on well-scaled problems (81 by the diagonal alone, 20 classes ×
# 10,000 features) and ~500 at C = 1e12; at C = 1e30 they never converge, and the former
# cap of 10 × dim iterations ran for minutes (3 classes × 4000 sparse features).
_CG_MAX_ITER = 1000


class _SoftmaxDataTerm:
    """The softmax's data term ``Σ_i s_i C_i ⊗ x̃_i x̃_iᵀ`` at probabilities ``P`` (M, K), as
    products with vectors of θ's layout (never a matrix over θ).

    Parameters
    ----------
    model : SoftmaxGLMPosterior
    P : ndarray of shape (M, K)
        The rows' class probabilities.
    """

    def __init__(self, model, P: np.ndarray):
        self.model, self.P = model, P
        self.weights = model.sample_weight
        self.root = np.sqrt(P)  # u_i = √π_i, unit vectors

    def _latent(self, V: np.ndarray) -> np.ndarray:
        """``F[i, k, l] = x̃_iᵀ v_{l, k}`` for the columns l of V (dim, L): (M, K, L)."""
        model = self.model
        k, d, L = model.n_classes, model.n_features, V.shape[1]
        coef = V[: k * d].reshape(k, d, L).transpose(1, 0, 2).reshape(d, k * L)
        F = np.asarray(model.X @ coef).reshape(-1, k, L)
        if model.fit_intercept:
            F += V[k * d :][None]
        return F

    def _transpose(self, T: np.ndarray) -> np.ndarray:
        """``Σ_i T[i, k, l] x̃_i`` in θ's layout: (dim, L) for T (M, K, L)."""
        model = self.model
        k, d = model.n_classes, model.n_features
        L = T.shape[2]
        coef = np.asarray(model.X.T @ T.reshape(T.shape[0], k * L))  # (d, K L)
        out = np.empty((model.dim, L))
        out[: k * d] = coef.reshape(d, k, L).transpose(1, 0, 2).reshape(k * d, L)
        if model.fit_intercept:
            out[k * d :] = T.sum(axis=0)
        return out

    def product(self, V: np.ndarray) -> np.ndarray:
        """``Σ_i s_i (C_i ⊗ x̃_i x̃_iᵀ) V`` for V (dim, L)."""
        F = self._latent(V)
        P = self.P[:, :, None]
        F *= P
        F -= P * F.sum(axis=1, keepdims=True)  # (diag π − ππᵀ) f = π∘f − π (π·f)
        F *= self.weights[:, None, None]
        return self._transpose(F)

    def gram_product(self, V: np.ndarray) -> np.ndarray:
        """``(GᵀG) V`` in prior-whitened coordinates: ``D^{-½} (data term) D^{-½} V``."""
        scale = np.sqrt(self.model.prior_var)[:, None]
        return scale * self.product(scale * V)

    def diagonal(self) -> np.ndarray:
        """The data term's diagonal: ``Σ_i s_i π_ik (1 − π_ik) x̃_ij²`` (dim,)."""
        model = self.model
        X = model.X
        curvature = self.weights[:, None] * self.P * (1.0 - self.P)  # (M, K)
        squares = X.multiply(X).tocsr() if sp.issparse(X) else X * X
        out = np.empty(model.dim)
        k, d = model.n_classes, model.n_features
        out[: k * d] = np.asarray(squares.T @ curvature).T.ravel()
        if model.fit_intercept:
            out[k * d :] = curvature.sum(axis=0)
        return out


class _SoftmaxHessian:
    """The negative Hessian ``D + data term`` as products: :meth:`solve` by preconditioned
    conjugate gradients (module docstring)."""

    def __init__(self, model, P: np.ndarray):
        self.model = model
        self.data = _SoftmaxDataTerm(model, P)
        diagonal = self.data.diagonal() + 1.0 / model.prior_var
        # Averaged over the classes of each column: commutes with the centring.
        k, d = model.n_classes, model.n_features
        diagonal[: k * d] = np.tile(diagonal[: k * d].reshape(k, d).mean(axis=0), k)
        if model.fit_intercept:
            diagonal[k * d :] = diagonal[k * d :].mean()
        self.preconditioner = diagonal

    def product(self, v: np.ndarray) -> np.ndarray:
        return self.data.product(v[:, None])[:, 0] + v / self.model.prior_var

    def solve(self, g: np.ndarray) -> np.ndarray:
        p = g.shape[0]
        operator = LinearOperator((p, p), matvec=self.product, dtype=float)
        jacobi = LinearOperator((p, p), matvec=lambda r: r / self.preconditioner, dtype=float)
        x, _ = cg(operator, g, rtol=1e-10, maxiter=10 * p, M=jacobi)
        return x


class _IterativeSoftmaxCurvature(SoftmaxCurvature):
    """:class:`SoftmaxCurvature` with the Newton systems solved by conjugate gradients:
    value and gradient as the dense route's, the Hessian as products only."""

    final_step = False  # (its one more expansion is one more set of CG solves)

    def expand(self, theta: np.ndarray):
        model = self.model
        log_lik, P = model.probabilities(theta)
        grad = model.gradient(P)
        grad -= (theta - model.prior_mean) / model.prior_var
        value = log_lik + float(model.log_prior(theta[None])[0])
        self.P = P
        return value, grad, _SoftmaxHessian(model, P)


def structured_softmax_laplace(
    model,
    choice: CovarianceChoice,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    theta0=None,
    verbose: int = 0,
) -> StructuredLaplaceResult:
    """The Laplace approximation of a multinomial posterior with the structure ``choice``
    names ("lowrank" or "diagonal"; module docstring).

    Parameters
    ----------
    model : SoftmaxGLMPosterior
        The posterior, its rows in memory, a diagonal Gaussian prior.
    choice : CovarianceChoice
        From :func:`~vsbayes.approximations.structured_laplace.choose_covariance`.
    tol, max_iter, theta0, verbose
        As for :func:`~vsbayes.approximations.softmax_laplace`.

    Returns
    -------
    StructuredLaplaceResult
    """
    solver = _StructuredSoftmaxSolver(model, choice, tol=tol, max_iter=max_iter, verbose=verbose)
    return solver.laplace_at_mode(theta0, "the multinomial posterior mode")


class _StructuredSoftmaxSolver(StructuredNewtonSolver):
    """:class:`~vsbayes.approximations.structured_laplace.StructuredNewtonSolver` of the
    multinomial posterior: conjugate-gradient Newton steps, the "lowrank" or "diagonal"
    structure at the iterate's probabilities."""

    @staticmethod
    def _curvature_of(model):
        return _IterativeSoftmaxCurvature(model)

    def structure_here(self):
        model, choice = self.model, self.choice
        # The mode is centred (the prior is largest there, the likelihood indifferent): the
        # iterates are, up to the solves' round-off, which this removes.
        theta = model._centre_classes(np.array(self.theta)[:, None])[:, 0]
        data = _SoftmaxDataTerm(model, self._curvature.P)  # the current iterate's
        rank = choice.rank if choice.structure == "lowrank" else 0
        covariance, half_log_det, error, factor, bounds = _softmax_lowrank_structure(
            model, data, rank
        )
        if model.fit_intercept:
            covariance = _with_exact_intercepts(model, covariance, data, rank)
            error += "; the intercepts' contrasts exact (K conjugate-gradient solves)"
        return theta, covariance, half_log_det, error, factor, bounds


def leading_eigenpairs(product, dim: int, count: int, seed: int = 0):
    """The ``count`` leading eigenpairs of a positive semi-definite operator given by its
    products with blocks of vectors (``product(V)`` for V (dim, L)): randomized subspace
    iteration with :data:`_OVERSAMPLES` extra vectors and :data:`_POWER_ITERATIONS`
    steps, the block re-orthonormalized at each (Halko et al. 2011, Alg. 4.4) by
    :func:`~vsbayes._linalg.thin_qr` (in place: no second dim × width array).

    Returns
    -------
    values : ndarray of shape (count,)
        Decreasing.
    vectors : ndarray of shape (dim, count)
        Orthonormal.
    """
    width = min(count + _OVERSAMPLES, dim)
    basis = np.random.default_rng(seed).standard_normal((dim, width))
    basis, _ = thin_qr(basis, overwrite_a=True)
    for _ in range(_POWER_ITERATIONS):
        basis, _ = thin_qr(product(basis), overwrite_a=True)
    image = product(basis)
    inner = basis.T @ image
    values, rotation = np.linalg.eigh(0.5 * (inner + inner.T))
    order = np.argsort(values)[::-1][:count]
    return np.maximum(values[order], 0.0), basis @ rotation[:, order]


def _softmax_lowrank_structure(model, data: _SoftmaxDataTerm, rank: int):
    """``(covariance, ½ log det H, error, factor, bounds)`` of the "lowrank" (rank ≥ 1) or
    "diagonal" (rank 0) structure of the multinomial posterior (module docstring);
    ``bounds`` those of the exact ``½ log det H``."""
    p = model.dim
    count = min(rank + 1, p)
    width = min(count + _OVERSAMPLES, p)
    check_memory(
        softmax_subspace_bytes(p, model.n_observations, model.n_classes, width),
        f"the subspace iteration's {p} × {width} bases of the "
        f"{'lowrank' if rank else 'diagonal'} multinomial posterior",
        _STRUCTURE_REMEDY,
    )
    column_norms = model.prior_var * data.diagonal()  # diag(GᵀG)
    values, vectors = leading_eigenpairs(data.gram_product, p, count)
    basis, lam = vectors[:, :rank], values[:rank]
    left_out = float(values[rank]) if values.size > rank else 0.0
    # The shift directions n_j (each column's classes summed) are the data term's null
    # space, the posterior along them the prior's: held exactly, the rest estimated on
    # the complement of them and of Q (module docstring).
    k = model.n_classes
    (diagonal, factor, core), log_det_whitened, log_det_bounds = complement_covariance(
        basis, lam, column_norms, np.sqrt(model.prior_var), null_share=1.0 / k
    )
    covariance = CentredStructuredCovariance(
        diagonal,
        factor,
        core,
        k,
        model.n_features,
        model.prior_var,
        "lowrank" if rank else "diagonal",
    )
    prior = float(np.log(model.prior_var).sum())
    half_log_det = 0.5 * (log_det_whitened - prior)
    bounds = tuple(0.5 * (value - prior) for value in log_det_bounds)
    error = (
        f"every variance (marginal, or of a row's latent value or contrast of two) within "
        f"a factor {1.0 + left_out:.4g} of the exact Laplace covariance's (1 + the largest "
        f"eigenvalue left out of the rank-{rank} part, {left_out:.4g}, in prior-whitened "
        f"units); the evidence's log det(I + E) estimated"
    )
    return covariance, half_log_det, error, 1.0 + left_out, bounds


def _block_solve(
    data: _SoftmaxDataTerm, rhs: np.ndarray, preconditioner, rtol: float = 1e-8
) -> np.ndarray | None:
    """``H⁻¹ B`` (H the prior's precision plus the data term ``data``) for the columns of
    ``rhs`` (dim, L), by conjugate gradients on all of them
    at once (one product with L columns per iteration), each column to ``rtol`` in
    residual norm; ``preconditioner`` maps blocks to blocks, an approximation of ``H⁻¹``.
    None if that takes more than ``_CG_MAX_ITER`` iterations."""
    model = data.model
    precision = 1.0 / model.prior_var[:, None]
    solution = np.zeros_like(rhs)
    residual = rhs.copy()
    targets = rtol * np.linalg.norm(rhs, axis=0)
    scaled = preconditioner(residual)
    direction = scaled.copy()
    inner = np.einsum("ij,ij->j", residual, scaled)
    for _ in range(min(10 * rhs.shape[0], _CG_MAX_ITER)):
        image = data.product(direction) + precision * direction
        curvature = np.einsum("ij,ij->j", direction, image)
        step = np.divide(inner, curvature, out=np.zeros_like(inner), where=curvature > 0)
        solution += step * direction
        residual -= step * image
        if np.all(np.linalg.norm(residual, axis=0) <= targets):
            return solution
        scaled = preconditioner(residual)
        updated = np.einsum("ij,ij->j", residual, scaled)
        ratio = np.divide(updated, inner, out=np.zeros_like(inner), where=inner > 0)
        direction = scaled + ratio * direction
        inner = updated
    return None


def _with_exact_intercepts(model, covariance: CentredStructuredCovariance, data, rank: int):
    """``covariance`` with the intercepts' contrasts made exact: their K × K covariance
    ``C = Π H⁻¹ Π`` (Π centring the intercepts) by K conjugate-gradient solves, and the
    intercepts' rows and columns transformed by ``T = A + 11ᵀ/K``, ``A = C^½ C̃^{+½}`` (C̃
    the structure's block): ``T Σ Tᵀ`` is positive definite as Σ is, its intercept
    contrasts are ``A C̃ Aᵀ = C``, their correlations with the coefficients are carried
    along, and T commutes with the centring (the shift directions stay the prior's). In
    the base ``diag(δ) + U K Uᵀ``: U's intercept rows times T, and ``T diag(δ_b) Tᵀ −
    diag(δ_b)`` as K more columns.

    Why: the vague intercept prior makes the intercepts' whitened curvature ~10⁸, so their
    variance is carried by the small intercept components of the many directions outside
    the leading ones, which the estimated diagonal S gets wrong (20 classes × 200
    features: the intercept contrasts' sds 6–26 % low)."""
    k, d = model.n_classes, model.n_features
    p = model.dim
    check_memory(
        softmax_intercept_bytes(p, model.n_observations, k, rank),  # as choose_covariance's
        f"the exact intercept contrasts of the {covariance.structure} multinomial posterior "
        f"({k} conjugate-gradient solves over its {p} parameters)",
        _STRUCTURE_REMEDY + " Without intercepts (fit_intercept=False, on centred features) "
        "these solves are not needed.",
    )
    rows = k * d + np.arange(k)
    centring = np.eye(k) - 1.0 / k
    rhs = np.zeros((p, k))
    rhs[rows] = centring
    # Preconditioned by the structure itself, within its stated factor of H⁻¹ in every
    # direction: 12 iterations against the diagonal's 81 (20 classes × 10,000 features).
    solved = _block_solve(data, rhs, covariance.dot)
    if solved is None:
        warn(
            f"The exact intercept contrasts of the {covariance.structure} multinomial "
            f"posterior did not converge in {_CG_MAX_ITER} conjugate-gradient iterations "
            f"(its precision is too ill-conditioned: a C far beyond the data's scale, or "
            f"features on very different scales); the structure's own estimate of them is "
            f"kept. Use a smaller C, or standardize the features.",
            UnreliableFitWarning,
        )
        return covariance
    exact = rhs.T @ solved
    structured = centring @ covariance.dot(rhs)[rows] @ centring

    def root(matrix: np.ndarray, power: float) -> np.ndarray:
        """``matrix^power`` on the contrasts (the eigenvalues above round-off's)."""
        values, vectors = np.linalg.eigh(0.5 * (matrix + matrix.T))
        keep = values > 1e-12 * max(values.max(), 0.0)
        return (vectors[:, keep] * values[keep] ** power) @ vectors[:, keep].T

    transform = root(exact, 0.5) @ root(structured, -0.5) + 1.0 / k
    factor = np.array(covariance.factor)
    factor[rows] = transform @ factor[rows]
    delta = covariance.diagonal_part[rows]
    extra = np.zeros((model.dim, k))
    extra[rows] = np.eye(k)
    rank = covariance.rank
    core = np.zeros((rank + k, rank + k))
    core[:rank, :rank] = covariance.core
    core[rank:, rank:] = (transform * delta) @ transform.T - np.diag(delta)
    return CentredStructuredCovariance(
        covariance.diagonal_part,
        np.hstack([factor, extra]),
        core,
        k,
        d,
        covariance.shift_var,
        covariance.structure,
    )
