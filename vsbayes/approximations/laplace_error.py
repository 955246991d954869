"""The Laplace approximation's predicted error, from the posterior's skewness along the rows.

Where many rows per parameter make the posterior nearly Gaussian, its departure from the
Laplace approximation N(m, S) is carried by the third derivatives of the log-likelihood at
the mode. In coordinates whitened by S, ``z = S^{-1/2}(θ − m)``, the log-posterior is
``−|z|²/2 + T_abc z_a z_b z_c / 6 + Q_abcd z_a z_b z_c z_d / 24 + …`` with ``T = O(M^{-1/2})``
and ``Q = O(M^{-1})``; to leading order in 1/M the posterior mean is ``m + S g / 2`` with
``g = Σ_i s_i ℓ'''(t_i) v_i a_i`` (a_i the row's linear map, t_i its latent value at the
mode, v_i = a_iᵀ S a_i its latent variance), and the best Gaussian (the moment-matched one)
is farther from the Laplace one than that only by the covariance's correction, of relative
order p/M smaller; the evidence's leading correction is the expectation of the cubic and
quartic terms under the Laplace Gaussian (:attr:`SkewCorrection.log_z_shift`). The excess KL
of the Laplace approximation — ``KL(p||N(m, S)) −
KL(p||q*)`` = ``KL(q*||N(m, S))`` for the moment-matched q* — is then

    gᵀ S g / 8  (the mean)  +  ¼ tr((S A)²)  (the covariance),

with ``A = H/2 − g gᵀ/4`` and ``H = Σ_i s_i (ℓ''''(t_i) v_i + ℓ'''(t_i) a_iᵀ S g) a_i a_iᵀ`` the
parts of the covariance's correction that are weighted Gram matrices of the rows (the one
left out, ``T_acd T_bcd``, costs M² and is of the same order as those kept: the prediction
for the corrected Gaussian is doubled). The multinomial posterior's K latent scores
give the same two terms, each row's ``ℓ'''`` and ``ℓ''''`` minus the third and fourth
cumulants of its one-hot class: ``g`` from the third contracted with the row's latent
covariance, and ``H = Σ_i X̃_iᵀ B_i X̃_i`` with the K × K ``B_i`` the third contracted with
the row's latent move along ``S g`` plus the fourth with its latent covariance
(:func:`_softmax_row_curvature_change`; K = 2 is the binary logistic's). Its evidence
correction is the binary's:
minus the one-hot class's third cumulant, ``−Σ_r π_r d_r^{⊗3}`` (``d_r = e_r − π``), is a
tensor of K rows ``X̃_iᵀ d_r`` per row, and the fourth's contraction with the latent
covariance follows from the class's (:func:`_softmax_log_z_shift`); K = 2 with the one
contrast's row is the binary logistic one.

The expansion is in the rows' latent spreads against the link's own scale: where a row's
latent sd is far wider than that (weights far below 1 leave the prior's spread, e.g. an
intercept's sd of 1000), its cubic and quartic terms are taken where ``log F`` is linear,
and the prediction is as far above the truth (8·10⁸ nats on breast cancer at weights 10⁻⁸,
against 0.26). There the error is bounded by the likelihood's own size instead
(:func:`prior_curvature_bound`): a log-concave likelihood leaves the posterior's
covariance below the prior's (Brascamp–Lieb), and where the rows' latent spreads are wide
its curvature at the mode is the largest it has, so the posterior's covariance lies
between the Laplace one and the prior's; the excess KL of N(m, S) against a Gaussian of
mean m and covariance in that range is largest at the prior's,

    ½ Σ_j (μ_j − 1 − log μ_j),  μ_j the eigenvalues of Σ₀ S⁻¹ = I + Σ₀ K,

with K the likelihood's Hessian at the mode: ¼ Σ_j λ_j² for small eigenvalues λ_j of
Σ₀ K, which the weights scale. The prediction is the smaller of the two.

Cost: one pass over the rows for their latent variances (M p², as one Newton step), one
weighted Gram matrix (for the multinomial, of K × K weights per row: one Newton Hessian)
and, for the evidence, the p³ tensor from at most 2·10⁷ multiply-adds of rows; a
triangular inverse (p³/3) for the bound; no sampling.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .._lapack import solve_triangular
from .._memory import block_length
from ..gaussian import Gaussian
from ..models import (
    BinaryGLMPosterior,
    ChunkedPosterior,
    ChunkedSoftmaxPosterior,
    SoftmaxGLMPosterior,
)
from ..models.latent import row_moments, row_variances
from ..models.softmax import MANY_CLASSES

__all__ = [
    "SkewCorrection",
    "laplace_excess_kl",
    "prior_curvature_bound",
    "skew_correction",
    "softmax_row_skewness",
]

# The evidence's correction needs the p × p × p tensor of third derivatives: formed up to
# this p (8 MB), from at most _TENSOR_WORK multiply-adds of rows (every k-th row beyond:
# the whole tensor cost twice the Laplace fit at 2·10⁴ × 20).
_MAX_TENSOR_DIM = 100
_TENSOR_WORK = 2e7
# The multinomial tensor's K rows per row are formed at once: at most this many entries.
_VIRTUAL_ENTRIES = 1e6

# The expansion is trusted only where its leading terms — the plain Laplace approximation's
# mean error, and the quartic term's expectation — are at most SKEW_VALID nats: measured on
# 13 problems (binary logistic and probit, 300 to 2·10⁴ rows; multinomial 150 to 4000
# rows), the prediction of the Laplace error was within 0.96-1.03 of the error against a
# 64n global fit wherever the mean term was below 0.05 (benchmarks/data_rich.py; the
# quartic term was at most 0.016 on those of unit weights, and is 10⁴ on breast cancer,
# wine and iris at weights 10⁻⁸, whose latent spreads are the prior's).
SKEW_VALID = 0.05

# Step of the central differences of the link's second derivative: truncation h² ≈ 1e-6
# relative, round-off 1e-16 / h² ≈ 1e-10, both far below what a prediction needs.
_STEP = 1e-3


@dataclass(frozen=True)
class SkewCorrection:
    """The Laplace approximation's predicted error and its leading-order correction.

    Attributes
    ----------
    laplace_error : float
        Predicted excess KL (nats) of the Laplace approximation: the expansion's (the mean
        term plus the covariance term), or :attr:`prior_bound` where that is smaller.
    mean_shift : ndarray of shape (dim,)
        ``S g / 2``: the predicted posterior mean minus the mode.
    corrected_error : float
        Predicted excess KL of N(m + S g/2, S), the Laplace approximation with the mean
        moved (and its evidence by :attr:`log_z_shift`): twice the covariance term
        plus the square of the mean term (the next order of the mean's expansion; measured
        above the moved Gaussian's error, evidence included, on every problem of
        ``benchmarks/data_rich.py`` and D-046's).
    mean_term : float
        ``gᵀ S g / 8``, the leading order of the Laplace approximation's error.
    log_z_shift : float or None
        The leading-order correction of the Laplace evidence: ``Σ_i s_i ℓ⁽⁴⁾(t_i) v_i² / 8
        + ‖T‖²_F / 12 + gᵀ S g / 8``, the expectation of the cubic and quartic terms under
        the Laplace Gaussian (for the multinomial posterior, over the K latent scores of
        each row); None where it is not computed (more than ``_MAX_TENSOR_DIM`` parameters,
        whose p³ tensor is not formed, or a multinomial posterior's rows in dask chunks).
    quartic_term : float or None
        ``Σ_i s_i ℓ⁽⁴⁾(t_i) v_i² / 8``, the expectation of the quartic term of the
        log-likelihood's expansion under the Laplace Gaussian (for the multinomial
        posterior, over the K latent scores of each row; rows in memory or in dask
        chunks); None where not computed. With :attr:`mean_term` it says whether the
        expansion is in its range (:data:`SKEW_VALID`).
    prior_bound : float
        :func:`prior_curvature_bound`: the excess KL of the Laplace approximation against
        the Gaussian of its mean and the prior's covariance (inf: not computed).
    """

    laplace_error: float
    mean_shift: np.ndarray
    corrected_error: float
    mean_term: float
    log_z_shift: float | None = None
    quartic_term: float | None = None
    prior_bound: float = np.inf

    def in_range(self, limit: float | None = None) -> bool:
        """Whether the expansion's leading terms, :attr:`mean_term` and
        :attr:`quartic_term`, are at most ``limit`` nats (default :data:`SKEW_VALID`)."""
        limit = SKEW_VALID if limit is None else limit
        quartic = self.quartic_term
        return self.mean_term <= limit and (quartic is None or quartic <= limit)

    def corrected(self, laplace):
        """The Laplace approximation with its mean moved by :attr:`mean_shift`, and its
        evidence by :attr:`log_z_shift` where computed (a copy of the same class)."""
        log_z = float(laplace.log_Z) + (self.log_z_shift or 0.0)
        moved = copy.copy(laplace)
        Gaussian.__init__(moved, np.asarray(laplace.mean) + self.mean_shift, laplace.cov, log_z)
        return moved


def laplace_excess_kl(model, laplace) -> float | None:
    """Predicted excess KL (nats) of ``laplace`` as the posterior of ``model``; see
    :func:`skew_correction`."""
    correction = skew_correction(model, laplace)
    return None if correction is None else correction.laplace_error


def skew_correction(model, laplace) -> SkewCorrection | None:
    """Predicted error of ``laplace`` as the posterior of ``model``, and its correction.

    Parameters
    ----------
    model : BinaryGLMPosterior, SoftmaxGLMPosterior or their chunked forms
        The likelihood model (rows in memory, or in dask chunks: the passes are summed
        over the chunks, where they are).
    laplace : Gaussian
        Its Laplace approximation (mean at the mode, covariance the inverse Hessian).

    Returns
    -------
    SkewCorrection or None
        The leading-order excess KL of the Laplace approximation against the best Gaussian
        (normalized densities) and of its mean-corrected form, or None for another model.
    """
    mean, cov = np.asarray(laplace.mean), np.asarray(laplace.cov)
    if isinstance(model, BinaryGLMPosterior | ChunkedPosterior):
        correction = _binary(model, mean, cov)
    elif isinstance(model, SoftmaxGLMPosterior | ChunkedSoftmaxPosterior):
        correction = _softmax(model, mean, cov)
    else:
        return None
    # Beyond its range the expansion's error is not below its own largest term: its
    # quartic term's expectation, which the mean term does not see (balanced classes
    # leave g ≈ 0 however wide the rows' latent spreads).
    predicted = correction.laplace_error
    if not correction.in_range():
        predicted = max(predicted, correction.quartic_term or 0.0)
    bound = prior_curvature_bound(model, laplace)
    return dataclasses.replace(correction, laplace_error=min(predicted, bound), prior_bound=bound)


def prior_curvature_bound(model, laplace) -> float:
    """The excess KL (nats) of ``laplace``, N(m, S), against N(m, Σ₀), Σ₀ the covariance of
    ``model``'s Gaussian prior: ``½ (tr(Σ₀ S⁻¹) − p − log det(Σ₀ S⁻¹))``.

    It bounds the Laplace approximation's error where the posterior's covariance lies
    between S and Σ₀ (see the module docstring): where the rows' latent spreads are wide
    against the link's scale, as under weights far below 1. From ``R = chol(Σ₀⁻¹)`` and
    ``L = chol(S)``: ``tr(Σ₀ S⁻¹) = ‖(Rᵀ L)⁻¹‖²_F`` and ``det(Σ₀ S⁻¹) = det(Rᵀ L)⁻²``."""
    lower = np.asarray(laplace.chol)
    identity = np.eye(len(lower))
    precision = getattr(model, "prior_precision", None)
    if precision is None:  # R diagonal: Rᵀ L is lower triangular
        product = lower / np.sqrt(np.asarray(model.prior_var, dtype=float))[:, None]
        inverse = solve_triangular(product, identity, lower=True, check_finite=False)
        log_det = float(np.sum(np.log(np.diag(product))))
    else:  # (Rᵀ L)⁻¹ = L⁻¹ R⁻ᵀ, by two triangular solves
        factor = np.linalg.cholesky(precision)
        root = solve_triangular(factor, identity, lower=True, check_finite=False)
        inverse = solve_triangular(lower, root.T, lower=True, check_finite=False)
        log_det = float(np.sum(np.log(np.diag(factor))) + np.sum(np.log(np.diag(lower))))
    trace = float(np.sum(inverse * inverse))
    return max(0.5 * (trace - len(lower)) + log_det, 0.0)


def _link_derivatives(link, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Third and fourth derivatives of ``log F`` at ``t``, by central differences of the
    link's (negated) second derivative."""
    _, up = link.derivatives(t + _STEP)
    _, mid = link.derivatives(t)
    _, down = link.derivatives(t - _STEP)
    third = -(up - down) / (2.0 * _STEP)
    fourth = -(up - 2.0 * mid + down) / (_STEP * _STEP)
    return third, fourth


def _over_rows(model, function, *args):
    """``function(model, *args)`` over the rows in memory, or summed over a chunked model's
    chunks (each an in-memory model of its rows), where they are."""
    if getattr(model, "rows_in_memory", True):
        return function(model, *args)
    return model.chunks.sum(function, *args)


def _binary(model, mean: np.ndarray, cov: np.ndarray) -> SkewCorrection:
    with_evidence = model.dim <= _MAX_TENSOR_DIM
    # The rows' derivatives serve both passes where the rows are in memory (a chunked
    # model's passes recompute them in each chunk, where its rows are).
    derivatives = (
        _rows_derivatives(model, mean, cov) if getattr(model, "rows_in_memory", True) else None
    )
    g, quartic, diagonal = _over_rows(model, _first_pass, mean, cov, derivatives)
    shift = cov @ g  # twice the predicted mean shift
    lower = np.linalg.cholesky(cov) if with_evidence else None
    # Every step-th row of each block for the evidence's tensor (see _cubic_norm2).
    step = max(1, int(np.ceil(model.n_observations * model.dim**3 / _TENSOR_WORK)))
    gram, tensor, sub_diagonal, kept = _over_rows(
        model, _second_pass, mean, cov, shift, lower, step, derivatives
    )
    log_z_shift = None
    if with_evidence:
        # log ∫ exp(T z³/6 + Q z⁴/24) dN(z) ≈ E[Q z⁴]/24 + E[(T z³)²]/72.
        # (The rows' own pass returns ‖T‖²_F itself where it took the pairs' route.)
        square = float(tensor) if np.ndim(tensor) == 0 else float(np.sum(tensor * tensor))
        norm2 = _cubic_norm2(square, diagonal, sub_diagonal, model.n_observations, kept)
        log_z_shift = quartic / 8.0 + norm2 / 12.0 + float(g @ shift) / 8.0
    return _expansion(cov, g, shift, gram, log_z_shift, quartic)


def _expansion(cov, g, shift, gram, log_z_shift, quartic) -> SkewCorrection:
    """The expansion's terms (the module docstring's) from ``g``, ``shift = S g`` and the
    covariance correction's Gram matrix ``H`` (binary or multinomial rows alike)."""
    mean_term = float(g @ shift) / 8.0
    correction = 0.5 * gram - 0.25 * np.outer(g, g)
    product = cov @ correction
    cov_term = max(0.25 * float(np.einsum("ij,ji->", product, product)), 0.0)
    # Twice the next order's estimate: measured, the corrected Gaussian's error reached
    # 1.16 times the undoubled one (1000 × 5, within the reference's own error).
    corrected = 2.0 * (cov_term + mean_term**2)
    return SkewCorrection(
        mean_term + cov_term,
        0.5 * shift,
        corrected,
        mean_term,
        log_z_shift,
        quartic_term=quartic / 8.0,
    )


def _rows_derivatives(model, mean, cov):
    """The rows' latent variances and the third and fourth derivatives at the mode."""
    t = np.asarray(model.design @ mean).ravel()
    variance = row_variances(model.design, cov, model.max_bytes)
    third, fourth = _link_derivatives(model.link, t)
    return variance, third, fourth


def _first_pass(model: BinaryGLMPosterior, mean, cov, derivatives=None):
    """``g``, ``Σ_i s_i ℓ⁽⁴⁾ v_i²`` and ``Σ_i (s_i ℓ⁽³⁾)² v_i³`` of the rows (``derivatives``:
    their :func:`_rows_derivatives`, if already computed)."""
    variance, third, fourth = derivatives or _rows_derivatives(model, mean, cov)
    weight = model.sample_weight
    g = np.asarray(model.design.T @ (weight * third * variance)).ravel()
    quartic = float(weight @ (fourth * variance * variance))
    diagonal = float(np.sum((weight * third) ** 2 * variance**3))
    return g, quartic, diagonal


def _second_pass(model: BinaryGLMPosterior, mean, cov, shift, lower, step: int, derivatives=None):
    """The covariance correction's Gram matrix, and (``lower`` given) the whitened
    third-derivative tensor of every ``step``-th row with its diagonal part and row count
    (``derivatives`` as :func:`_first_pass`'). With all the rows here (``derivatives``
    given) and fewer kept than p², the tensor's ``‖T‖²_F`` in its place, from the pairs of
    rows: ``Σ_ij c_i c_j (u_i·u_j)³``, kept² p multiply-adds against kept p³ for T (a
    sum over chunks needs T itself, whose norm is not a sum over them)."""
    design, weight = model.design, model.sample_weight
    variance, third, fourth = derivatives or _rows_derivatives(model, mean, cov)
    along = np.asarray(design @ shift).ravel()
    gram = model.weighted_gram(weight * (fourth * variance + third * along))
    if lower is None:  # no evidence correction: no tensor (p³ entries: 60 GB at p = 2000)
        return gram, np.zeros(0), 0.0, 0
    coefficient = weight * third
    rows = np.arange(0, model.n_observations, step)
    sub_diagonal = float(np.sum(coefficient[rows] ** 2 * variance[rows] ** 3))
    kept = coefficient[rows]
    if derivatives is not None:  # all the rows here: the norm itself
        return gram, _tensor_square(design, rows, lower, kept), sub_diagonal, len(rows)
    # A sum over chunks needs T itself, whose norm is not a sum over them.
    return gram, _tensor(design, rows, lower, kept), sub_diagonal, len(rows)


def _cubic_norm2(square: float, diagonal: float, sub_diagonal: float, m: int, kept: int) -> float:
    """``‖T‖²_F`` of the whitened tensor ``T = Σ_i c_i u_i⊗u_i⊗u_i`` (``u_i = Lᵀ a_i``,
    ``S = L Lᵀ``) from ``square``, that of the tensor of ``kept`` of the ``m`` rows (all of
    them within :data:`_TENSOR_WORK` multiply-adds, M p³): its diagonal part
    ``Σ_i c_i² v_i³`` is exact over all rows, the cross part scaled by the ratio of the
    pairs."""
    cross = square - sub_diagonal
    if 1 < kept < m:
        cross *= (m * (m - 1.0)) / (kept * (kept - 1.0))
    return diagonal + cross


def _softmax(model, mean: np.ndarray, cov: np.ndarray) -> SkewCorrection:
    if not getattr(model, "rows_in_memory", True):
        # The quartic term too, a sum over the rows: without it balanced classes' g ≈ 0
        # kept the Laplace approximation at tiny weights on chunks (D-232, D-245).
        g, quartic = _over_rows(model, _softmax_pass, mean, cov)
        shift = cov @ g
        gram = _over_rows(model, _softmax_gram_pass, mean, cov, shift)
        return _expansion(cov, g, shift, gram, None, quartic)
    moments = _softmax_moments(model, mean, cov)
    g, quartic = _softmax_pass(model, mean, cov, moments)
    shift = cov @ g
    gram = _softmax_gram_pass(model, mean, cov, shift, moments)
    log_z_shift = None
    if model.dim <= _MAX_TENSOR_DIM:
        log_z_shift = _softmax_log_z_shift(model, cov, *moments, quartic, g, shift)
    return _expansion(cov, g, shift, gram, log_z_shift, quartic)


def _softmax_quartic(probabilities, latent_cov, weight) -> float:
    """``Σ_i s_i ℓ⁽⁴⁾ : V_i V_i`` of the rows (the binary ``Σ_i s_i ℓ⁽⁴⁾ v_i²``).

    The row's fourth derivatives are minus the fourth cumulant of its one-hot class Y
    (probabilities π); contracted twice with the latent covariance V they are
    ``−(Var(A) − 2 tr((V C)²))`` with ``A = (Y − π)ᵀ V (Y − π)`` (``q_r = d_rᵀ V d_r``
    for class r, ``d_r = e_r − π``) and C = diag(π) − ππᵀ the class's covariance (the
    fourth cumulant of linear forms of Y). With ``a = V π``, ``tr((V C)²) =
    Σ_kl π_k π_l V_kl² − 2 Σ_l π_l a_l² + (πᵀa)²``: no (M, K, K) temporary beside V."""
    pi, v = probabilities, latent_cov
    v_pi = np.einsum("ikl,il->ik", v, pi)
    pi_v_pi = np.einsum("ik,ik->i", pi, v_pi)
    q = np.einsum("ikk->ik", v) - 2.0 * v_pi + pi_v_pi[:, None]
    mean_a = np.einsum("ik,ik->i", pi, q)
    var_a = np.einsum("ik,ik->i", pi, q * q) - mean_a**2
    trace = (
        np.einsum("ik,ikl,ikl,il->i", pi, v, v, pi)
        - 2.0 * np.einsum("il,il,il->i", pi, v_pi, v_pi)
        + pi_v_pi**2
    )
    return -float(weight @ (var_a - 2.0 * trace))


def _softmax_log_z_shift(model, cov, probabilities, latent_cov, quartic, g, shift) -> float:
    """The binary evidence correction's three terms for the K latent scores of each row
    (``quartic``: :func:`_softmax_quartic`'s).

    The row's third derivatives are minus the third cumulant of its one-hot class Y,
    ``−Σ_r π_r d_r^{⊗3}`` with ``d_r = e_r − π``: the whitened tensor is the binary one of
    K "rows" ``X̃_iᵀ d_r`` per row, of coefficients ``−s_i π_r``."""
    weight = model.sample_weight
    pi, v = probabilities, latent_cov
    v_pi = np.einsum("ikl,il->ik", v, pi)
    pi_v_pi = np.einsum("ik,ik->i", pi, v_pi)
    # N_rs = d_rᵀ V d_s, the latent covariance along the classes' residuals.
    residual_cov = v - v_pi[:, :, None] - v_pi[:, None, :] + pi_v_pi[:, None, None]
    cubes = residual_cov**3
    both = weight[:, None] * pi
    per_row = np.einsum("ik,ikl,il->i", both, cubes, both)
    diagonal = float(np.sum(per_row))
    # The whitened virtual rows of every step-th row (class-major coordinates, as V's).
    m, k, p = model.n_observations, model.n_classes, model.dim
    # (and at most _VIRTUAL_ENTRIES entries of those rows, formed at once).
    step = max(1, int(np.ceil(m * k * max(p**3 / _TENSOR_WORK, p / _VIRTUAL_ENTRIES))))
    rows = np.arange(0, m, step)
    x = model.X[rows]
    x = x.toarray() if sp.issparse(x) else np.asarray(x)
    if model.fit_intercept:
        x = np.hstack([x, np.ones((len(rows), 1))])
    d = np.eye(k)[None, :, :] - pi[rows][:, None, :]  # (kept, r, class): d_r of each row
    virtual = np.einsum("irk,iw->irkw", d, x).reshape(len(rows) * k, p)
    lower = np.linalg.cholesky(_class_major(model, cov))
    square = _tensor_square(virtual, np.arange(len(virtual)), lower, -both[rows].ravel())
    norm2 = _cubic_norm2(square, diagonal, float(np.sum(per_row[rows])), m, len(rows))
    return quartic / 8.0 + norm2 / 12.0 + float(g @ shift) / 8.0


def _tensor_square(design, rows: np.ndarray, lower: np.ndarray, coefficient) -> float:
    """``‖T‖²_F`` of ``T = Σ_j c_j u_j⊗u_j⊗u_j``, ``u_j = Lᵀ a_j`` for the ``rows`` of
    ``design`` (dense or CSR) and their coefficients: from the pairs of rows,
    ``Σ_jk c_j c_k (u_j·u_k)³`` (n² p multiply-adds), where fewer than p², else from T
    itself (n p³)."""
    p = lower.shape[0]
    if len(rows) < p * p:
        # With n < p² and n p³ ≤ _TENSOR_WORK, at most 7·10⁵ pairs (6 MB, at p ≈ 29).
        a = design[rows]
        u = (a.toarray() if sp.issparse(a) else np.asarray(a)) @ lower
        pairs = u @ u.T
        cubes = pairs * pairs
        cubes *= pairs
        return float(coefficient @ (cubes @ coefficient))
    return float(np.sum(_tensor(design, rows, lower, coefficient) ** 2))


def _tensor(design, rows: np.ndarray, lower: np.ndarray, coefficient) -> np.ndarray:
    """``T`` of :func:`_tensor_square` as a (p², p) matrix, in blocks of rows."""
    p = lower.shape[0]
    block = max(1, block_length(8.0 * (p * p + p)))
    tensor = np.zeros((p * p, p))
    for start in range(0, len(rows), block):
        a = design[rows[start : start + block]]
        u = (a.toarray() if sp.issparse(a) else np.asarray(a)) @ lower
        pairs = (u[:, :, None] * u[:, None, :]).reshape(len(u), p * p)
        tensor += pairs.T @ (u * coefficient[start : start + block, None])
    return tensor


def _softmax_moments(model: SoftmaxGLMPosterior, mean, cov):
    """The class probabilities (M, K) at the mode and the rows' latent covariances
    (M, K, K) under N(mean, cov)."""
    W, b = model.split(mean)
    coef = np.column_stack([W, b]) if model.fit_intercept else W
    many = model.n_classes >= MANY_CLASSES  # the distinct covariances by one GEMM
    products = model.pair_products() if many else None
    _, latent_cov = row_moments(
        model.X, coef, _class_major(model, cov), by_pairs=many, products=products
    )
    _, probabilities = model.probabilities(mean)
    return probabilities, latent_cov


def _softmax_pass(model: SoftmaxGLMPosterior, mean, cov, moments=None):
    """``g`` of the rows, ``Σ_i s_i X̃_iᵀ h_i`` in θ's layout, and their
    :func:`_softmax_quartic` (``moments``: :func:`_softmax_moments`', if computed)."""
    probabilities, latent_cov = moments or _softmax_moments(model, mean, cov)
    weight = model.sample_weight
    weights = softmax_row_skewness(probabilities, latent_cov, weight)
    g = model.to_vector(model.latent_transpose(weights))
    return g, _softmax_quartic(probabilities, latent_cov, weight)


#: Bytes of one (rows, K, K) temporary of :func:`_softmax_row_curvature_change` a block.
_CURVATURE_BLOCK_BYTES = 2**20


def _softmax_gram_pass(model: SoftmaxGLMPosterior, mean, cov, shift, moments=None):
    """The covariance correction's Gram matrix ``H = Σ_i X̃_iᵀ B_i X̃_i`` in θ's layout:
    the binary's ``s_i (ℓ⁽⁴⁾ v_i + ℓ⁽³⁾ a_iᵀ S g) a_i a_iᵀ`` with each row's K × K
    :func:`_softmax_row_curvature_change` (``moments`` as :func:`_softmax_pass`')."""
    probabilities, latent_cov = moments or _softmax_moments(model, mean, cov)
    W, b = model.split(shift)
    along = np.asarray(model.X @ W.T)  # the latent scores' move along S g, (M, K)
    if model.fit_intercept:
        along = along + b
    weights = np.empty_like(latent_cov)
    # In blocks of rows: the contraction's (rows, K, K) temporaries, beside V and B, each
    # within _CURVATURE_BLOCK_BYTES, where its ten element-wise passes stay in cache (the
    # same bits: each row's its own): 42 → 27 ms at 40 classes × 2000 rows in one block
    # of the working memory, 87 → 46 ms at 50 (D-269).
    k = latent_cov.shape[1]
    block = min(block_length(8.0 * 4 * k * k), max(1, _CURVATURE_BLOCK_BYTES // (8 * k * k)))
    for start in range(0, len(weights), block):
        rows = slice(start, start + block)
        weights[rows] = _softmax_row_curvature_change(
            probabilities[rows], latent_cov[rows], along[rows], model.sample_weight[rows]
        )
    # The Hessian's own choice of product: on the rows' distinct products where Newton's
    # Hessian takes them (digits, 10 classes × 65 columns: 0.12 → 0.02 s; the weighted
    # copies' product was a twentieth of its default fit).
    gram = model.to_layout(model.latent_gram(weights, distinct=None))
    return 0.5 * (gram + gram.T)


def _softmax_row_curvature_change(probabilities, latent_cov, along, sample_weight):
    """Each row's ``B_i`` (M, K, K): its third derivatives contracted with the latent move
    ``u = X̃_i S g`` (``along``) plus its fourth contracted with the latent covariance V.

    They are minus the one-hot class's cumulants (π the probabilities, ``d_r = e_r − π``,
    C = diag(π) − ππᵀ): ``κ₃[u] = Σ_r π_r (d_r·u) d_r d_rᵀ`` and ``κ₄[V] = Σ_r π_r q_r
    d_r d_rᵀ − C tr(CV) − 2 CVC`` (``q_r = d_rᵀ V d_r``), with ``(CVC)_jk = π_j π_k
    N_jk``, ``N_jk = d_jᵀ V d_k``. K = 2 with the one contrast's row is the binary's
    ``ℓ⁽³⁾ u + ℓ⁽⁴⁾ v``."""
    pi, v = probabilities, latent_cov
    v_pi = np.einsum("ikl,il->ik", v, pi)
    pi_v_pi = np.einsum("ik,ik->i", pi, v_pi)
    residual_cov = v - v_pi[:, :, None] - v_pi[:, None, :] + pi_v_pi[:, None, None]  # N
    q = np.einsum("ikk->ik", residual_cov)
    trace = np.einsum("ik,ik->i", pi, q)  # tr(CV)
    scaled = pi * (q + along - np.einsum("ik,ik->i", pi, along)[:, None])  # π_r w_r
    total = scaled.sum(axis=1)
    # Σ_r π_r w_r d_r d_rᵀ = diag(πw) − (πw)πᵀ − π(πw)ᵀ + (Σ πw) ππᵀ
    out = -scaled[:, :, None] * pi[:, None, :]
    out -= pi[:, :, None] * scaled[:, None, :]
    # − C tr(CV), C = diag(π) − ππᵀ, with the ππᵀ terms of both
    out += ((total + trace)[:, None, None] * pi[:, :, None]) * pi[:, None, :]
    classes = np.arange(pi.shape[1])
    out[:, classes, classes] += scaled - trace[:, None] * pi
    # − 2 CVC
    out -= 2.0 * pi[:, :, None] * residual_cov * pi[:, None, :]
    out *= -sample_weight[:, None, None]
    return out


def softmax_row_skewness(
    probabilities: np.ndarray, latent_cov: np.ndarray, sample_weight: np.ndarray
) -> np.ndarray:
    """Each row's part ``h_i`` (M, K) of ``g = Σ_i X̃_iᵀ h_i``: the third derivatives of its
    weighted log-likelihood at the mode (class probabilities π, (M, K)) contracted with its
    latent covariance V (M, K, K). Its latent values' mean moves by about ``V h_i / 2``
    from the mode (the skewness correction of the module docstring, row by row)."""
    # q_r = (e_r − π)ᵀ V (e_r − π): the latent variance along each class's residual.
    v_pi = np.einsum("ikl,il->ik", latent_cov, probabilities)
    diag = np.einsum("ikk->ik", latent_cov)
    q = diag - 2.0 * v_pi + np.einsum("ik,ik->i", probabilities, v_pi)[:, None]
    # h_j = Σ_kl ℓ⁽³⁾_{jkl} V_kl with ℓ⁽³⁾ = −κ₃ of the one-hot class: −π_j (q_j − π·q).
    weights = -probabilities * (q - np.einsum("ik,ik->i", probabilities, q)[:, None])
    weights *= sample_weight[:, None]
    return weights


def _class_major(model: SoftmaxGLMPosterior, cov: np.ndarray) -> np.ndarray:
    """The covariance of θ reordered class-major ``[w_1, b_1, w_2, b_2, …]`` (row_moments'
    layout of ``vec B`` for B the (K, w) matrix of rows ``[w_k, b_k]``)."""
    k, d = model.n_classes, model.n_features
    index = np.arange(k)[:, None] * d + np.arange(d)[None, :]
    if model.fit_intercept:
        index = np.hstack([index, k * d + np.arange(k)[:, None]])
    flat = index.ravel()
    return cov[np.ix_(flat, flat)]
