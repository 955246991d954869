"""The multinomial posterior in its contrast coordinates: what a sampled fit needs to see.

The softmax likelihood depends on θ = ``[W.ravel(), b]`` only through the contrasts, the
part of each column's K class values orthogonal to ``1_K`` (see
:mod:`vsbayes.models.softmax`). With
Q = :func:`~vsbayes.models.softmax_predictive_rules.centred_basis`
(K × (K − 1), orthonormal) and ``u = 1_K / √K``, the orthonormal change of coordinates

    θ = B_c c + B_s s,   B_c = Q ⊗ I (per column block),   B_s = u ⊗ I,

splits θ into (K − 1)(d + 1) contrasts c and d + 1 shifts s. The likelihood is a function of
c alone, and a Gaussian prior N(m, Σ₀) on θ is, in (c, s), the contrasts' marginal
N(m_c, Σ_cc) times the shifts' conditional N(A c + a, R) (``A = Σ_sc Σ_cc⁻¹``). So

    ∫ p(θ) dθ = ∫ L(B_c c) N(c; m_c, Σ_cc) dc

(no Jacobian: B is orthonormal), and the posterior is the contrasts' posterior times the
shifts' prior conditional, exactly. A Gaussian fitted to the contrasts' posterior
N(μ_c, Σ_c) (with its log_Z: the evidence) therefore gives the whole posterior

    s = A c + a + e, e ~ N(0, R):   mean B_c μ_c + B_s (A μ_c + a),
    cov = B [[Σ_c, Σ_c Aᵀ], [A Σ_c, A Σ_c Aᵀ + R]] Bᵀ,

without sampling the shift directions (whose Monte Carlo noise would otherwise land in the
coefficients' class sums). Under the estimators' default prior — every class of a column
with the same variance, mean 0 — A = 0, a = 0 and R = diag(v_j): the shifts' prior, as
:meth:`~vsbayes.models.SoftmaxGLMPosterior.centred` imposes it.
"""

from __future__ import annotations

import math

import numpy as np

from .._lapack import cho_factor, cho_solve, solve_triangular
from ..gaussian import Gaussian, lower_cholesky
from .softmax_predictive_rules import centred_basis

__all__ = ["ContrastPosterior"]

_LOG_2PI = math.log(2.0 * math.pi)


class ContrastPosterior:
    """The unnormalized marginal posterior of a multinomial model's contrasts.

    Parameters
    ----------
    model : SoftmaxGLMPosterior or ChunkedSoftmaxPosterior
        The posterior in θ's coordinates; its ``log_likelihood`` is evaluated at the points
        mapped back (``θ = B_c c``).
    single : bool, default=False
        Whether :meth:`log_density` takes the in-memory model's float32 likelihood pass
        (:meth:`SoftmaxGLMPosterior.log_likelihood
        <vsbayes.models.SoftmaxGLMPosterior.log_likelihood>`'s ``single``).

    Attributes
    ----------
    dim : int
        ``(K − 1)(d + 1)`` with an intercept, else ``(K − 1) d``: the contrasts' count.
    basis : ndarray of shape (model.dim, dim)
        ``B_c``: orthonormal columns spanning the centred parameter vectors.
    shift_basis : ndarray of shape (model.dim, model.dim - dim)
        ``B_s``: the unit shift directions ``1_K ⊗ e_j / √K``.
    """

    def __init__(self, model, single: bool = False):
        self.model, self.single = model, single
        k = model.n_classes
        width = model.n_features + int(model.fit_intercept)
        q = centred_basis(k)
        # θ's layout is class-major per block (W: K × d, then b: K × 1); c and s follow the
        # same blocks: first the (K − 1) × d contrasts of W, then the K − 1 of b.
        blocks = [(0, model.n_features)]
        if model.fit_intercept:
            blocks.append((k * model.n_features, 1))
        p = model.dim
        basis = np.zeros((p, (k - 1) * width))
        shift = np.zeros((p, width))
        c_offset = s_offset = 0
        for offset, w in blocks:
            eye = np.eye(w)
            basis[offset : offset + k * w, c_offset : c_offset + (k - 1) * w] = np.kron(q, eye)
            shift[offset : offset + k * w, s_offset : s_offset + w] = np.kron(
                np.full((k, 1), 1.0 / math.sqrt(k)), eye
            )
            c_offset += (k - 1) * w
            s_offset += w
        self.basis, self.shift_basis = basis, shift
        self.dim = basis.shape[1]
        self._prior_parts()

    def _prior_parts(self) -> None:
        """The contrasts' prior marginal N(m_c, Σ_cc) and the shifts' conditional
        ``s | c ~ N(A c + a, R)``."""
        model, basis, shift = self.model, self.basis, self.shift_basis
        mean = np.asarray(model.prior_mean, dtype=float)
        self.prior_mean = basis.T @ mean
        shift_mean = shift.T @ mean
        variances = np.asarray(model.prior_var, dtype=float)
        k = model.n_classes
        per_class = np.concatenate(
            [block.reshape(k, -1) for block in self._theta_blocks(variances)], axis=1
        )
        if model.prior_precision is None and np.all(per_class == per_class[0]):
            # Every class of a column alike: Q ⊗ I and u ⊗ I commute with the prior
            # covariance, so the contrasts and shifts are a priori independent with the
            # column's variance on each (exactly, without products that leave round-off).
            column = per_class[0]
            self.prior_var = np.concatenate(
                [np.tile(block, k - 1) for block in self._column_blocks(column)]
            )
            self.prior_cov = None
            self.shift_gain = None
            self.shift_offset = shift_mean
            self.shift_cov = np.diag(column)
            return
        if model.prior_precision is None:
            cov = np.diag(variances)
        else:
            cov = cho_solve(cho_factor(model.prior_precision, lower=True), np.eye(model.dim))
            cov = 0.5 * (cov + cov.T)
        cc = basis.T @ cov @ basis
        sc = shift.T @ cov @ basis
        ss = shift.T @ cov @ shift
        gain = cho_solve(cho_factor(cc, lower=True), sc.T).T  # A = Σ_sc Σ_cc⁻¹
        self.prior_var = np.diag(cc).copy()
        self.prior_cov = cc
        self._prior_lower = lower_cholesky(cc, "contrasts' prior covariance")
        self.shift_gain = gain
        self.shift_offset = shift_mean - gain @ self.prior_mean
        residual = ss - gain @ sc.T
        self.shift_cov = 0.5 * (residual + residual.T)

    def _theta_blocks(self, vector):
        k, d = self.model.n_classes, self.model.n_features
        yield vector[: k * d]
        if self.model.fit_intercept:
            yield vector[k * d :]

    def _column_blocks(self, column):
        d = self.model.n_features
        yield column[:d]
        if self.model.fit_intercept:
            yield column[d:]

    # --- the log-density the sampling fitters call -------------------------------------

    def to_theta(self, contrasts: np.ndarray) -> np.ndarray:
        """θ = B_c c for the rows of ``contrasts`` (N, dim): centred parameter vectors."""
        return np.atleast_2d(np.asarray(contrasts, dtype=float)) @ self.basis.T

    def log_prior(self, contrasts: np.ndarray) -> np.ndarray:
        """Normalized log density of the contrasts' prior marginal at the rows (N, dim)."""
        centred = np.atleast_2d(np.asarray(contrasts, dtype=float)) - self.prior_mean
        if self.prior_cov is None:
            quad = (centred * centred) @ (1.0 / self.prior_var)
            half_log_det = 0.5 * float(np.log(self.prior_var).sum())
        else:
            white = solve_triangular(self._prior_lower, centred.T, lower=True)
            quad = np.einsum("ij,ij->j", white, white)
            half_log_det = float(np.log(np.diag(self._prior_lower)).sum())
        return -0.5 * (quad + self.dim * _LOG_2PI) - half_log_det

    def log_density(self, contrasts: np.ndarray) -> np.ndarray:
        """Unnormalized log marginal posterior of the contrasts at the rows (N, dim): its
        integral is the model evidence."""
        contrasts = np.atleast_2d(np.asarray(contrasts, dtype=float))
        options = {"single": True} if self.single else {}
        theta = self.to_theta(contrasts)
        return self.model.log_likelihood(theta, **options) + self.log_prior(contrasts)

    __call__ = log_density

    # --- Gaussians between the coordinates ---------------------------------------------

    def reduce(self, gaussian: Gaussian) -> Gaussian:
        """The marginal of ``gaussian`` (over θ) on the contrasts: a sampling kernel."""
        mean = self.basis.T @ np.asarray(gaussian.mean)
        cov = self.basis.T @ np.asarray(gaussian.cov) @ self.basis
        return Gaussian(mean, 0.5 * (cov + cov.T), gaussian.log_Z)

    def lift(self, fit: Gaussian) -> Gaussian:
        """The posterior over θ from a Gaussian ``fit`` of the contrasts' posterior: the
        shifts' prior conditional added (module docstring); ``log_Z`` and the fit's
        diagnostics kept (the map is orthonormal: no Jacobian)."""
        mean_c, cov_c = np.asarray(fit.mean), np.asarray(fit.cov)
        basis, shift = self.basis, self.shift_basis
        if self.shift_gain is None:
            mean_s = self.shift_offset
            cross = np.zeros((self.dim, shift.shape[1]))
            cov_s = self.shift_cov
        else:
            gain = self.shift_gain
            mean_s = gain @ mean_c + self.shift_offset
            cross = cov_c @ gain.T
            cov_s = gain @ cross + self.shift_cov
        mean = basis @ mean_c + shift @ mean_s
        half = basis @ cross @ shift.T
        cov = basis @ cov_c @ basis.T + shift @ cov_s @ shift.T + half + half.T
        return fit.with_moments(mean, 0.5 * (cov + cov.T))
