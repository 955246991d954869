"""The Laplace approximation's predicted error, from the posterior's skewness along the rows.

Where many rows per parameter make the posterior nearly Gaussian, its departure from the
Laplace approximation N(m, S) is carried by the third derivatives of the log-likelihood at
the mode. In coordinates whitened by S, ``z = S^{-1/2}(θ − m)``, the log-posterior is
``−|z|²/2 + T_abc z_a z_b z_c / 6 + Q_abcd z_a z_b z_c z_d / 24 + …`` with ``T = O(M^{-1/2})``
and ``Q = O(M^{-1})``; to leading order in 1/M the posterior mean is ``m + S g / 2`` with
``g = Σ_i s_i ℓ'''(t_i) v_i a_i`` (a_i the row's linear map, t_i its latent value at the
mode, v_i = a_iᵀ S a_i its latent variance), and the best Gaussian (the moment-matched one)
is farther from the Laplace one than that only by the covariance's correction, of relative
order p/M smaller. The excess KL of the Laplace approximation — ``KL(p||N(m, S)) −
KL(p||q*)`` = ``KL(q*||N(m, S))`` for the moment-matched q* — is then

    gᵀ S g / 8  (the mean)  +  ¼ tr((S A)²)  (the covariance),

with ``A = H/2 − g gᵀ/4`` and ``H = Σ_i s_i (ℓ''''(t_i) v_i + ℓ'''(t_i) a_iᵀ S g) a_i a_iᵀ`` the
parts of the covariance's correction that are weighted Gram matrices of the rows (the one
left out, ``T_acd T_bcd``, costs M² and is of the same order as those kept: the callers
multiply the prediction by a safety factor). The multinomial posterior's K latent scores
give the same mean term with ``ℓ'''`` the third cumulant of the categorical distribution
contracted with each row's latent covariance; its covariance term is not computed (callers
apply it only where it is the smaller, M ≫ p).

Cost: one pass over the rows for their latent variances (M p², as one Newton step) and one
weighted Gram matrix; no sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models import BinaryGLMPosterior, SoftmaxGLMPosterior
from ..models.latent import row_moments, row_variances

__all__ = ["SkewCorrection", "laplace_excess_kl", "skew_correction"]

# Step of the central differences of the link's second derivative: truncation h² ≈ 1e-6
# relative, round-off 1e-16 / h² ≈ 1e-10, both far below what a prediction needs.
_STEP = 1e-3


@dataclass(frozen=True)
class SkewCorrection:
    """The Laplace approximation's predicted error and its leading-order correction.

    Attributes
    ----------
    laplace_error : float
        Predicted excess KL (nats) of the Laplace approximation: the mean term plus, for a
        binary model, the covariance term.
    mean_shift : ndarray of shape (dim,)
        ``S g / 2``: the predicted posterior mean minus the mode.
    corrected_error : float
        Predicted excess KL of N(m + S g/2, S), the Laplace approximation with the mean
        moved: the covariance term plus the square of the mean term (the next order of the
        mean's expansion; measured at or above the error of the moved Gaussian on every
        problem of ``tests/test_strategy.py`` and ``benchmarks/data_rich.py``); for the
        multinomial posterior, whose covariance term is not computed, twice that square.
    mean_term : float
        ``gᵀ S g / 8``, the leading order of the Laplace approximation's error.
    """

    laplace_error: float
    mean_shift: np.ndarray
    corrected_error: float
    mean_term: float

    def corrected(self, laplace):
        """The Laplace approximation with its mean moved by :attr:`mean_shift`."""
        return laplace.with_moments(np.asarray(laplace.mean) + self.mean_shift, laplace.cov)


def laplace_excess_kl(model, laplace) -> float | None:
    """Predicted excess KL (nats) of ``laplace`` as the posterior of ``model`` (None for a
    model with its rows in dask chunks); see :func:`skew_correction`."""
    correction = skew_correction(model, laplace)
    return None if correction is None else correction.laplace_error


def skew_correction(model, laplace) -> SkewCorrection | None:
    """Predicted error of ``laplace`` as the posterior of ``model``, and its correction.

    Parameters
    ----------
    model : BinaryGLMPosterior or SoftmaxGLMPosterior
        The likelihood model (rows in memory).
    laplace : Gaussian
        Its Laplace approximation (mean at the mode, covariance the inverse Hessian).

    Returns
    -------
    SkewCorrection or None
        The leading-order excess KL of the Laplace approximation against the best Gaussian
        (normalized densities) and of its mean-corrected form, or None for a model it does
        not cover (rows in dask chunks).
    """
    if isinstance(model, BinaryGLMPosterior):
        return _binary(model, np.asarray(laplace.mean), np.asarray(laplace.cov))
    if isinstance(model, SoftmaxGLMPosterior):
        return _softmax(model, np.asarray(laplace.mean), np.asarray(laplace.cov))
    return None


def _link_derivatives(link, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Third and fourth derivatives of ``log F`` at ``t``, by central differences of the
    link's (negated) second derivative."""
    _, up = link.derivatives(t + _STEP)
    _, mid = link.derivatives(t)
    _, down = link.derivatives(t - _STEP)
    third = -(up - down) / (2.0 * _STEP)
    fourth = -(up - 2.0 * mid + down) / (_STEP * _STEP)
    return third, fourth


def _binary(model: BinaryGLMPosterior, mean: np.ndarray, cov: np.ndarray) -> SkewCorrection:
    design, weight = model.design, model.sample_weight
    t = np.asarray(design @ mean).ravel()
    variance = row_variances(design, cov, model.max_bytes)
    third, fourth = _link_derivatives(model.link, t)
    g = np.asarray(design.T @ (weight * third * variance)).ravel()
    shift = cov @ g  # twice the predicted mean shift
    mean_term = float(g @ shift) / 8.0
    along = np.asarray(design @ shift).ravel()
    gram = model.weighted_gram(weight * (fourth * variance + third * along))
    correction = 0.5 * gram - 0.25 * np.outer(g, g)
    product = cov @ correction
    cov_term = 0.25 * float(np.einsum("ij,ji->", product, product))
    cov_term = max(cov_term, 0.0)
    return SkewCorrection(mean_term + cov_term, 0.5 * shift, cov_term + mean_term**2, mean_term)


def _softmax(model: SoftmaxGLMPosterior, mean: np.ndarray, cov: np.ndarray) -> SkewCorrection:
    W, b = model.split(mean)
    coef = np.column_stack([W, b]) if model.fit_intercept else W
    _, latent_cov = row_moments(model.X, coef, _class_major(model, cov))
    _, probabilities = model.probabilities(mean)
    # q_r = (e_r − π)ᵀ V (e_r − π): the latent variance along each class's residual.
    v_pi = np.einsum("ikl,il->ik", latent_cov, probabilities)
    diag = np.einsum("ikk->ik", latent_cov)
    q = diag - 2.0 * v_pi + np.einsum("ik,ik->i", probabilities, v_pi)[:, None]
    # h_j = Σ_kl ℓ'''_{jkl} V_kl with ℓ''' = −κ₃ of the one-hot class: −π_j (q_j − π·q).
    weights = -probabilities * (q - np.einsum("ik,ik->i", probabilities, q)[:, None])
    weights *= model.sample_weight[:, None]
    g = model.to_vector(model.latent_transpose(weights))
    shift = cov @ g
    mean_term = float(g @ shift) / 8.0
    return SkewCorrection(mean_term, 0.5 * shift, 2.0 * mean_term**2, mean_term)


def _class_major(model: SoftmaxGLMPosterior, cov: np.ndarray) -> np.ndarray:
    """The covariance of θ reordered class-major ``[w_1, b_1, w_2, b_2, …]`` (row_moments'
    layout of ``vec B`` for B the (K, w) matrix of rows ``[w_k, b_k]``)."""
    k, d = model.n_classes, model.n_features
    index = np.arange(k)[:, None] * d + np.arange(d)[None, :]
    if model.fit_intercept:
        index = np.hstack([index, k * d + np.arange(k)[:, None]])
    flat = index.ravel()
    return cov[np.ix_(flat, flat)]
