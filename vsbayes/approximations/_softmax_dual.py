"""The posterior of the multinomial EP's contrasts in the dual (row) form.

:class:`~vsbayes.approximations.softmax_ep._Contrast` holds B's posterior (r = K − 1
contrasts × w columns) with precision ``P = D + Σ_i Λ_i ⊗ x̃_i x̃_iᵀ`` (D the prior's
diagonal, the same variances ``d`` for every contrast of a column). Dense, a sweep forms the
r·w square precision, factors and inverts it: ``M (r w)² · 1.5 + (r w)³`` multiply-adds.
Where the rows are fewer than the columns the same posterior is exact in the rows' space,
as the binary posterior's dual form (D-016): with ``Λ_i = S_i²`` (``S_i`` its symmetric
root), ``Z`` the map of B's coefficients to the rows' contrasts and ``K = Z D⁻¹ Zᵀ =
G ⊗ I_r`` (``G = X diag(d_x) Xᵀ``, M × M, formed once), the coefficients' precision is
``P_xx⁻¹ = D⁻¹ − D⁻¹ Zᵀ S C⁻¹ S Z D⁻¹`` with ``C = I + S K S`` (M r square). The
intercepts (vague prior, variance ``v_b``: inside C it would cost the factorization about
eight digits, D-016) are bordered in closed form: their Schur complement is
``S_b = I/v_b + Fᵀ F``, ``F = L⁻¹ S E`` (L the factor of C, E the (M r) × r map of the
intercepts to the rows), and the rows' latent covariances are
``V_i = G_ii I − (Wᵀ W)_ii + N_i S_b⁻¹ N_iᵀ`` with ``W = L⁻¹ S K`` and ``N = Wᵀ F − E``.
A sweep then costs about ``(M r)³ · 4/3`` multiply-adds. B's covariance is held as two
factors, ``blockdiag(I ⊗ D_x − YᵀY, 0) + U Uᵀ`` (``Y = L⁻¹ S Z D_x``, M r × r d; U the
intercepts' r columns): a stalled sweep's marginals read their column norms, and θ's dense
covariance (the result, an observer) is formed from them rotated to θ by two symmetric rank
updates, directly in θ's layout and scikit-learn's representative (D-202), once.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.linalg.blas import dsyrk

from .._lapack import cho_solve, solve_triangular
from .._linalg import class_congruence, mirror_lower_to_upper
from .._memory import check_memory
from ..gaussian import lower_cholesky
from ..models import SoftmaxGLMPosterior

__all__ = [
    "DualContrast",
    "DualSoftmaxHessian",
    "column_variances",
    "dense_contrast_work",
    "dual_contrast_bytes",
    "dual_contrast_work",
    "factorizing_prior",
    "holds_dual",
    "row_kernel",
    "takes_dual",
    "theta_moments",
]

#: The fewest entries r·w of B that take the dual form (where it is also at most half the
#: dense form's work): below, the dense posterior is cheap, as the binary posterior's
#: primal form below 256 features (D-016).
DUAL_MIN_ENTRIES = 256


def dense_contrast_work(m: int, r: int, w: int) -> float:
    """Multiply-adds of one sweep's dense posterior: the Gram blocks (half the GEMM, plus
    the rows' latent covariances), the factorization and the inverse."""
    return m * (r * w) ** 2 * 1.5 + 2 * (r * w) ** 3 / 3


def takes_dual(m: int, r: int, w: int) -> bool:
    """Whether B's posterior is held in the dual form: at least :data:`DUAL_MIN_ENTRIES`
    entries and at most half the dense form's work."""
    return r * w >= DUAL_MIN_ENTRIES and 2 * dual_contrast_work(m, r, w) <= dense_contrast_work(
        m, r, w
    )


def holds_dual(model) -> bool:
    """Whether the multinomial posterior's contrasts are held in the dual form (by the EP's
    :class:`~vsbayes.approximations.softmax_ep._Contrast` and Newton's
    :class:`~vsbayes.approximations.newton_laplace.DualSoftmaxCurvature` alike): rows in
    memory (dask chunks keep the dense form), a prior that factorizes over the classes
    (:func:`factorizing_prior`) and a size that :func:`takes_dual`."""
    r, w = model.n_classes - 1, model.n_features + int(model.fit_intercept)
    return (
        isinstance(model, SoftmaxGLMPosterior)
        and factorizing_prior(model)
        and takes_dual(model.n_observations, r, w)
    )


def dual_contrast_work(m: int, r: int, w: int) -> float:
    """Multiply-adds of one sweep's posterior in the dual form: the factor of C (a third of
    (M r)³) and the triangular solve ``L⁻¹ S K`` for the rows' latent covariances."""
    n = m * r
    return n**3 * (1.0 / 3.0 + 1.0) + 2.0 * n * n * r + 4.0 * n * r * w


def dual_contrast_bytes(m: int, r: int) -> float:
    """Bytes held by one posterior in the dual form: C, its factor, ``L⁻¹ S K`` and the
    (M r)² products of the roots while C is formed; the kernel G."""
    n = m * r
    return 8.0 * (4 * n * n + m * m)


def row_kernel(X, column_var: np.ndarray) -> np.ndarray:
    """``G = X diag(column_var) Xᵀ`` (M × M, dense) for the coefficients' prior variances."""
    if sp.issparse(X):
        scaled = X @ sp.diags(column_var)
        return np.asarray((scaled @ X.T).toarray())
    X = np.asarray(X, dtype=float)
    return (X * column_var) @ X.T


class DualContrast:
    """The posterior of B given the rows' site precisions ``lam`` (M, r, r), in the dual form
    (module docstring): its factorization, solves, log-determinant and the rows' latent
    covariances, B's variances, and θ's dense covariance on request (:meth:`theta_cov`).

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (M, d)
        The rows (without the intercept's column).
    kernel : ndarray of shape (M, M)
        :func:`row_kernel` of X and the coefficients' prior variances.
    column_var : ndarray of shape (w,)
        Prior variance of each column of B (the intercept's last, if ``fit_intercept``).
    lam : ndarray of shape (M, r, r)
        The sites' precisions (symmetric positive semi-definite).
    fit_intercept : bool
    """

    def __init__(self, X, kernel, column_var, lam, fit_intercept: bool):
        m, r, _ = lam.shape
        self.X, self.kernel, self.lam = X, kernel, lam
        self.m, self.r = m, r
        self.fit_intercept = fit_intercept
        self.d = X.shape[1]
        self.column_var = np.asarray(column_var, dtype=float)
        self.coef_var = self.column_var[: self.d]
        n = m * r
        check_memory(
            dual_contrast_bytes(m, r),
            f"the {n} × {n} dual form of the multinomial EP posterior ({m} rows × {r} contrasts)",
            "Fit fewer rows, or use the Laplace approximation (LaplaceLogisticRegression).",
        )
        # Λ_i = S_i² with S_i symmetric: a PSD site's root (round-off negatives clipped).
        values, vectors = np.linalg.eigh(lam)
        root = np.sqrt(np.maximum(values, 0.0))
        self.root = np.einsum("iab,ib,icb->iac", vectors, root, vectors)
        # C = I + S K S: entry ((i, a), (k, b)) = G_ik (S_i S_k)[a, b].
        c = np.einsum("iac,kcb->iakb", self.root, self.root)
        c *= kernel[:, None, :, None]
        c = c.reshape(n, n)
        c = 0.5 * (c + c.T)
        c[np.diag_indices(n)] += 1.0
        self.lower = lower_cholesky(c, "dual form (I + S K S) of the softmax EP posterior")
        del c
        half = float(np.log(np.diag(self.lower)).sum())
        half -= 0.5 * r * float(np.log(self.coef_var).sum())
        self._w_matrix = None
        self._latent_cov = None
        if fit_intercept:
            # F = L⁻¹ S E: row block i of S E is S_i.
            self.f = solve_triangular(self.lower, self.root.reshape(n, r), lower=True)
            schur = self.f.T @ self.f
            schur[np.diag_indices(r)] += 1.0 / self.column_var[-1]
            self.schur_lower = lower_cholesky(
                0.5 * (schur + schur.T), "intercepts' Schur complement of the softmax EP"
            )
            half += float(np.log(np.diag(self.schur_lower)).sum())
        self.half_log_det = half

    # The maps between B's coefficients (r, d) and the rows' contrasts (M, r).
    def _z(self, coef: np.ndarray) -> np.ndarray:
        return np.asarray(self.X @ coef.T)

    def _zt(self, u: np.ndarray) -> np.ndarray:
        return np.asarray(self.X.T @ u).T

    def _s(self, u: np.ndarray) -> np.ndarray:
        return np.einsum("iab,ib->ia", self.root, u)

    def _coef_solve(self, h: np.ndarray) -> np.ndarray:
        """``P_xx⁻¹ h`` for the coefficients' part h (r, d)."""
        scaled = h * self.coef_var
        inner = cho_solve((self.lower, True), self._s(self._z(scaled)).ravel(), check_finite=False)
        return scaled - self.coef_var * self._zt(self._s(inner.reshape(self.m, self.r)))

    def solve(self, h: np.ndarray) -> np.ndarray:
        """``P⁻¹ h`` for h of shape (r·w,) (B row-major): the intercepts by their Schur
        complement."""
        r, d = self.r, self.d
        h = h.reshape(r, -1)
        t = self._coef_solve(h[:, :d])
        if not self.fit_intercept:
            return t.ravel()
        lam_z = np.einsum("iab,ib->a", self.lam, self._z(t))  # P_bx t
        u_b = cho_solve((self.schur_lower, True), h[:, d] - lam_z, check_finite=False)
        # P_xb u_b = Zᵀ (Λ_i u_b)_i
        cross = self._zt(np.einsum("iab,b->ia", self.lam, u_b))
        u_x = t - self._coef_solve(cross)
        return np.hstack([u_x, u_b[:, None]]).ravel()

    def _w(self) -> np.ndarray:
        """``W = L⁻¹ S K`` (M r square): column (i, a) of S K is ``S_k[:, a] G_ki`` over k."""
        if self._w_matrix is None:
            m, r = self.m, self.r
            sk = self.root[:, :, None, :] * self.kernel[:, None, :, None]  # (k, c, i, a)
            self._w_matrix = solve_triangular(
                self.lower, sk.reshape(m * r, m * r), lower=True, check_finite=False
            )
        return self._w_matrix

    def latent_cov(self) -> np.ndarray:
        """Every row's latent covariance ``V_i`` (M, r, r) of ``g_i = B x̃_i``."""
        if self._latent_cov is None:
            m, r = self.m, self.r
            w = self._w().reshape(m * r, m, r)
            cov = -np.einsum("nia,nib->iab", w, w)
            cov += np.diag(self.kernel)[:, None, None] * np.eye(r)
            if self.fit_intercept:
                n_mat = np.einsum("nia,nb->iab", w, self.f) - np.eye(r)  # Wᵀ F − E
                inv = cho_solve((self.schur_lower, True), np.eye(r), check_finite=False)
                cov += np.einsum("iab,bc,idc->iad", n_mat, inv, n_mat)
            self._latent_cov = 0.5 * (cov + np.swapaxes(cov, 1, 2))
            self._w_matrix = None  # (M r)² bytes, no longer needed
        return self._latent_cov

    # B's covariance is ``blockdiag(I_r ⊗ D_x − YᵀY, 0) + U Uᵀ`` (D_x the coefficients'
    # prior variances): P_xx⁻¹ = D_x − YᵀY by Woodbury, and the intercepts' bordering
    # ``V S_b⁻¹ Vᵀ`` (V = [T; −I], T = P_xx⁻¹ P_xb) written as U Uᵀ with U = V L_b⁻ᵀ. Its
    # variances and θ's dense covariance are read from these two factors, never from a
    # dense covariance of B.

    def _coef_root(self) -> np.ndarray:
        """``Y = L⁻¹ S Z D_x`` (M r × r d; B's coefficients (b, j) row-major): column
        (b, j) of ``S Z`` is ``S_i[:, b] x_ij`` over the rows i."""
        m, r, d = self.m, self.r, self.d
        check_memory(  # the rows' dense copy, S Z D_x and its solve
            8.0 * (m * d + 2 * m * r * r * d),
            f"the {m * r} × {r * d} factor of the multinomial posterior's covariance "
            f"(its dual form)",
            "Fit fewer features, or use the Laplace approximation (LaplaceLogisticRegression).",
        )
        x = self.X.toarray() if sp.issparse(self.X) else np.asarray(self.X, dtype=float)
        sz = self.root[:, :, :, None] * (x * self.coef_var)[:, None, None, :]  # (i, a, b, j)
        return solve_triangular(
            self.lower, sz.reshape(m * r, r * d), lower=True, check_finite=False, overwrite_b=True
        )

    def _intercept_root(self, y: np.ndarray) -> np.ndarray | None:
        """``U = V L_b⁻ᵀ`` (r w × r) of the intercepts' bordering, from ``Y``
        (:meth:`_coef_root`); None without intercepts."""
        if not self.fit_intercept:
            return None
        r, d = self.r, self.d
        # P_xb's column c is Zᵀ (Λ_i[:, c])_i; T = P_xx⁻¹ P_xb = D_x P_xb − Yᵀ (Y P_xb).
        cross = np.stack([self._zt(self.lam[:, :, c]).ravel() for c in range(r)], axis=1)
        t = np.tile(self.coef_var, r)[:, None] * cross - y.T @ (y @ cross)
        v = np.empty((r, d + 1, r))
        v[:, :d] = t.reshape(r, d, r)
        v[:, d] = -np.eye(r)
        lower_t = solve_triangular(
            self.schur_lower, v.reshape(-1, r).T, lower=True, check_finite=False
        )
        return lower_t.T

    def variances(self) -> np.ndarray:
        """The variances of B's entries (r·w,), from the two factors (no r·w square
        matrix)."""
        r, d = self.r, self.d
        y = self._coef_root()
        var = np.zeros((r, d + int(self.fit_intercept)))
        var[:, :d] = self.coef_var - np.einsum("nj,nj->j", y, y).reshape(r, d)
        u = self._intercept_root(y)
        if u is not None:
            var += np.einsum("na,na->n", u, u).reshape(r, d + 1)
        return var.ravel()

    def theta_cov(self, q: np.ndarray) -> np.ndarray:
        """θ's dense covariance (the model's layout ``[W.ravel(), b]``) for the contrast
        basis q (K × r): B's rotated back, plus the shift directions' prior.

        With Q's columns orthogonal to 1, the rotated ``I_r ⊗ D_x`` plus the shift's
        ``(11ᵀ/K) ⊗ D_x`` is ``I_K ⊗ D_x``, so Σ is the prior's diagonal (the intercepts'
        block ``v_b 11ᵀ / K``) less ``Y_θᵀ Y_θ`` plus ``U_θ U_θᵀ`` — Y and U rotated by Q
        (M r × K d and p × r): two symmetric rank updates (``dsyrk``, half a GEMM) into one
        p × p array, its lower triangle mirrored, formed once (D-202). Already in the
        centred representative, to round-off."""
        m, r, d = self.m, self.r, self.d
        k = q.shape[0]
        p = k * (d + int(self.fit_intercept))
        check_memory(
            8.0 * (p * p + m * r * (r * d + p) + m * d),
            f"the {p} × {p} covariance of the multinomial posterior from its dual form",
            "Fit fewer features, or use the Laplace approximation (LaplaceLogisticRegression).",
        )
        y = self._coef_root()
        u = self._intercept_root(y)
        rotated = np.zeros((m * r, p))  # Y_θ, zero in the intercepts' columns
        rotated[:, : k * d] = np.matmul(q, y.reshape(m * r, r, d)).reshape(m * r, k * d)
        del y
        cov = dsyrk(-1.0, rotated.T)  # F-ordered, its upper triangle: −Y_θᵀ Y_θ
        del rotated
        cov[np.diag_indices(k * d)] += np.tile(self.coef_var, k)
        if u is not None:
            by_column = u.reshape(r, d + 1, r)
            rotated_u = np.empty((p, r), order="F")
            rotated_u[: k * d] = (q @ by_column[:, :d].reshape(r, d * r)).reshape(k * d, r)
            rotated_u[k * d :] = q @ by_column[:, d]
            cov = dsyrk(1.0, rotated_u, beta=1.0, c=cov, overwrite_c=1)
            cov[k * d :, k * d :] += self.column_var[-1] / k
        cov = cov.T  # C-ordered, its lower triangle
        mirror_lower_to_upper(cov)
        return cov


def factorizing_prior(model) -> bool:
    """Whether the prior factorizes over the rotation of θ to B and the shift (the same
    variances for every class of a column, no mean, no full precision): the dual form's
    (and the EP's rotation's) condition."""
    k, d = model.n_classes, model.n_features
    by_class = model.prior_var[: k * d].reshape(k, d)
    intercepts = model.prior_var[k * d :]
    return not (
        model.prior_precision is not None
        or bool(np.any(model.prior_mean))
        or not np.all(by_class == by_class[0])
        or not np.all(intercepts == intercepts[:1])
    )


def column_variances(model) -> np.ndarray:
    """The prior variance of each column of B (w,), the intercept's last."""
    k, d = model.n_classes, model.n_features
    columns = list(range(d)) + ([k * d] if model.fit_intercept else [])
    return model.prior_var[columns]


def theta_moments(model, q, column_var, mean, cov) -> tuple[np.ndarray, np.ndarray]:
    """θ's mean and covariance (model layout) from B's (r·w and r·w square) under a
    factorizing prior: B's rotated back by the basis q, plus the shift's prior."""
    k, r, w = model.n_classes, q.shape[1], len(column_var)
    theta = model.to_vector(q @ mean.reshape(r, w))
    blocks = class_congruence(q, cov.reshape(r, w, r, w)).transpose(0, 2, 1, 3)
    shift = np.diag(column_var) / k
    blocks += shift  # every (k, l) block: the prior of 1ᵀΘ/√K, spread over the classes
    full = model.to_layout(blocks)
    return theta, 0.5 * (full + full.T)


class DualSoftmaxHessian:
    """The multinomial log-posterior's negative Hessian at θ (probabilities ``P``), held in
    the contrasts' dual form, for Newton's method: ``H = Σ_i s_i C_i ⊗ x̃_i x̃_iᵀ + D`` with
    ``C_i = diag p_i − p_i p_iᵀ``. Since ``C_i 1 = 0`` and the prior factorizes, H is
    block-diagonal in the rotated coordinates (B, the shift ``1ᵀΘ/√K``): B's block is the
    contrast precision of the sites ``Λ_i = s_i Qᵀ C_i Q`` (:class:`DualContrast`), the
    shift's is its prior precision alone.

    Offers what :class:`~vsbayes.approximations.NewtonLaplaceSolver` uses: ``solve`` and
    ``half_log_det``, and the dense covariance through :meth:`cov`.
    """

    def __init__(self, model, kernel: np.ndarray, q: np.ndarray, P: np.ndarray):
        self.model, self.q = model, q
        self.column_var = column_variances(model)
        s = model.sample_weight
        qp = P @ q  # Qᵀ p_i
        lam = np.einsum("ka,ik,kb->iab", q, P, q) - qp[:, :, None] * qp[:, None, :]
        lam *= s[:, None, None]
        self.contrast = DualContrast(model.X, kernel, self.column_var, lam, model.fit_intercept)
        self.half_log_det = self.contrast.half_log_det - 0.5 * float(np.log(self.column_var).sum())

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``H⁻¹ v`` for v of shape (dim,)."""
        model, q, k = self.model, self.q, self.model.n_classes
        W, b = model.split(v)
        matrix = np.hstack([W, b[:, None]]) if model.fit_intercept else W  # (K, w)
        contrasts = self.contrast.solve((q.T @ matrix).ravel()).reshape(q.shape[1], -1)
        shift = matrix.sum(axis=0) * self.column_var / k  # (1/√K)(1/√K) 1ᵀ V D_s⁻¹
        return model.to_vector(q @ contrasts + shift)

    @property
    def cov(self) -> np.ndarray:
        """``H⁻¹`` (dim × dim), from the dual factor (:meth:`DualContrast.theta_cov`)."""
        return self.contrast.theta_cov(self.q)
