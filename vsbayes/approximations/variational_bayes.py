"""Variational Bayes for logistic regression: the Jaakkola–Jordan bound, one ξ per observation.

For ``t = y f``, ``σ(t) ≥ σ(ξ) exp((t - ξ)/2 - λ(ξ)(t² - ξ²))`` with
``λ(ξ) = tanh(ξ/2) / (4ξ)``, tight at ``t = ±ξ``. The bound is a Gaussian in θ, so the
posterior approximation is Gaussian with precision ``P = Σ0⁻¹ + 2 Aᵀ diag(s λ) A`` and mean
``P⁻¹ Aᵀ s / 2`` (rows ``a_i = y_i [x_i, 1]``), and the optimal ``ξ_i² = E[(a_iᵀθ)²]``. The
updates alternate in closed form and never decrease the bound on the log evidence,

    log Z ≥ Σ s_i [log σ(ξ_i) - ξ_i/2 + λ_i ξ_i²] + bᵀμ/2 - ½ log|Σ0| - ½ log|P|.

(Jaakkola and Jordan 2000; the 2013 experiments used a single shared ξ instead.)
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_expit

from .._warnings import warn
from ..engine import DiagnosedGaussian
from ..exceptions import ConvergenceWarning
from ..gaussian import Gaussian
from ..models import BinaryGLMPosterior
from ..models.latent import row_variances
from ._glm_gaussian import GLMGaussian
from ._threads import blas_policy

__all__ = ["VBResult", "jaakkola_jordan"]


class VBResult(DiagnosedGaussian):
    """Jaakkola–Jordan variational posterior; ``log_Z`` is the lower bound on the evidence.

    Attributes
    ----------
    n_iter : int
        Updates of (ξ, posterior).
    converged : bool
        Whether the bound's last rise was below the tolerance.
    xi : ndarray of shape (M,) or None
        The variational parameters, one per observation with positive weight (None for
        rows in dask chunks, where they stay).
    """

    n_iter: int
    converged: bool
    xi: np.ndarray


def _lambda(xi: np.ndarray) -> np.ndarray:
    """``tanh(ξ/2) / (4ξ)``, with its limit 1/8 at ξ = 0."""
    small = xi < 1e-6
    safe = np.where(small, 1.0, xi)
    return np.where(small, 0.125, np.tanh(0.5 * safe) / (4.0 * safe))


@blas_policy
def jaakkola_jordan(
    model: BinaryGLMPosterior,
    *,
    start: Gaussian | None = None,
    tol: float = 1e-8,
    max_iter: int = 100,
) -> VBResult:
    """Jaakkola–Jordan variational approximation of a logistic-regression posterior.

    Parameters
    ----------
    model : BinaryGLMPosterior or ChunkedPosterior
        The posterior; its link must be logistic. Rows in dask chunks keep their ξ.
    start : Gaussian, optional
        Initial posterior for the ξ (e.g. the Laplace approximation); default the prior.
    tol : float, default=1e-8
        Stop when the bound rises by at most ``tol · max(1, |bound|)`` nats in one update
        (the fixed-point updates converge linearly, sometimes slowly).
    max_iter : int, default=100
        Maximum updates; a ConvergenceWarning is emitted when reached.

    Returns
    -------
    VBResult
        Gaussian posterior approximation whose ``log_Z`` is the evidence lower bound.
    """
    if model.link.name != "logistic":
        raise ValueError(f"The Jaakkola-Jordan bound is for the logistic link, not {model.link}.")
    if not model.rows_in_memory:
        return _chunked_jaakkola_jordan(model, start=start, tol=tol, max_iter=max_iter)
    design, s, prior_var = model.design, model.sample_weight, model.prior_var
    # The likelihood bound's linear term plus the prior's Λ₀μ₀.
    b = np.asarray(design.T @ (0.5 * s)).ravel() + model.prior_mean / prior_var
    # The row marginals of the starting Gaussian (the prior by default) give the first ξ.
    if start is None:
        t_mean = np.asarray(design @ model.prior_mean).ravel()
        t_var = row_variances(design, np.diag(prior_var), model.max_bytes)
    else:
        t_mean = np.asarray(design @ start.mean).ravel()
        t_var = row_variances(design, start.cov, model.max_bytes)
    half_log_det_prior = _prior_constant(model)
    bound, converged, n_iter = -math.inf, False, 0
    while n_iter < max_iter:
        n_iter += 1
        xi = np.sqrt(t_var + t_mean * t_mean)
        lam = _lambda(xi)
        post = GLMGaussian(model, 2.0 * s * lam, b, what="variational precision")
        t_mean, t_var = post.t_mean, post.t_var
        new_bound = (
            float(s @ (log_expit(xi) - 0.5 * xi + lam * xi * xi))
            + 0.5 * float(b @ post.mean)
            - half_log_det_prior
            - post.half_log_det
        )
        gain, bound = new_bound - bound, new_bound
        if gain <= tol * max(1.0, abs(bound)):
            converged = True
            break
    _warn_unconverged(converged, max_iter, gain)
    return VBResult(post.mean, post.cov, bound, n_iter=n_iter, converged=converged, xi=xi)


def _prior_constant(model) -> float:
    """``½ log det Σ₀ + ½ μ₀ᵀΛ₀μ₀``: the prior's part of the bound beyond ``½ hᵀμ``."""
    prior_mean, prior_var = model.prior_mean, model.prior_var
    return 0.5 * float(np.log(prior_var).sum()) + 0.5 * float(prior_mean @ (prior_mean / prior_var))


def _warn_unconverged(converged: bool, max_iter: int, gain: float) -> None:
    if not converged:
        warn(
            f"The variational bound did not converge in max_iter={max_iter} updates (last "
            f"gain {gain:.3g} nats). Increase max_iter.",
            ConvergenceWarning,
        )


def _chunked_jaakkola_jordan(model, *, start, tol, max_iter) -> VBResult:
    """The same updates over rows in dask chunks: the ξ of each chunk are computed on its
    worker from the posterior's mean and covariance, which give back ``Aᵀ diag(2 s λ) A``
    and the chunk's terms of the bound (one pass per update)."""
    chunks, prior_var = model.chunks, model.prior_var
    b = chunks.sum(_half_weighted_rows) + model.prior_mean / prior_var
    mean, cov = (model.prior_mean, np.diag(prior_var)) if start is None else (start.mean, start.cov)
    half_log_det_prior = _prior_constant(model)
    bound, converged, n_iter = -math.inf, False, 0
    while n_iter < max_iter:
        n_iter += 1
        gram, terms = chunks.sum(_bound_update, mean, cov)
        gram[np.diag_indices(model.dim)] += 1.0 / prior_var
        post = GLMGaussian(model, precision=gram, linear=b, what="variational precision")
        mean, cov = post.mean, post.cov
        new_bound = terms + 0.5 * float(b @ mean) - half_log_det_prior - post.half_log_det
        gain, bound = new_bound - bound, new_bound
        if gain <= tol * max(1.0, abs(bound)):
            converged = True
            break
    _warn_unconverged(converged, max_iter, gain)
    return VBResult(mean, cov, bound, n_iter=n_iter, converged=converged, xi=None)


# --- on the workers ---------------------------------------------------------------------


def _half_weighted_rows(chunk) -> np.ndarray:
    return np.asarray(chunk.design.T @ (0.5 * chunk.sample_weight)).ravel()


def _bound_update(chunk, mean: np.ndarray, cov: np.ndarray):
    """The chunk's ξ from the posterior's marginals: its ``Aᵀ diag(2 s λ) A`` and its terms
    ``Σ s (log σ(ξ) - ξ/2 + λ ξ²)`` of the bound."""
    design, s = chunk.design, chunk.sample_weight
    t_mean = np.asarray(design @ mean).ravel()
    xi = np.sqrt(row_variances(design, cov, chunk.max_bytes) + t_mean * t_mean)
    lam = _lambda(xi)
    terms = float(s @ (log_expit(xi) - 0.5 * xi + lam * xi * xi))
    return chunk.weighted_gram(2.0 * s * lam), terms
