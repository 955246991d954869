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
from ._glm_gaussian import GLMGaussian, RowLatent
from ._threads import blas_policy

__all__ = [
    "VBResult",
    "bound_constant",
    "bound_curvature",
    "bound_xi",
    "jaakkola_jordan",
    "jaakkola_jordan_latent",
    "jaakkola_jordan_row",
]


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


def bound_curvature(xi: np.ndarray) -> np.ndarray:
    """λ(ξ) = ``tanh(ξ/2) / (4ξ)``: a row's bound is the Gaussian site ``exp(c + s t/2 −
    s λ t²)`` in its latent t (precision τ = 2 s λ)."""
    return _lambda(np.asarray(xi, dtype=float))


def bound_constant(xi: np.ndarray) -> np.ndarray:
    """The bound's constant per unit weight, ``c(ξ) = log σ(ξ) − ξ/2 + λ(ξ) ξ²``."""
    xi = np.asarray(xi, dtype=float)
    return log_expit(xi) - 0.5 * xi + _lambda(xi) * xi * xi


def bound_xi(lam: np.ndarray) -> np.ndarray:
    """The ξ ≥ 0 whose λ(ξ) is ``lam`` (in (0, 1/8]; λ decreases from 1/8 at 0): the
    variational parameter of a site of precision ``2 s lam``. Bisection on [0, 1/(4λ)]
    (λ ≤ 1/(4ξ)), vectorized, to round-off of λ (120 halvings: below 1e-20 absolute for
    any ξ under 1e16)."""
    lam = np.minimum(np.asarray(lam, dtype=float), 0.125)
    low = np.zeros_like(lam)
    high = 1.0 / (4.0 * np.maximum(lam, 1e-300))
    for _ in range(120):  # (each halves the bracket: 2^-120 of 2^1000 at most)
        mid = 0.5 * (low + high)
        above = _lambda(mid) > lam
        low, high = np.where(above, mid, low), np.where(above, high, mid)
    return 0.5 * (low + high)


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


def jaakkola_jordan_latent(
    mean: float, var: float, weight: float
) -> tuple[float, float, float, float]:
    """The Jaakkola–Jordan bound of one row's factor ``σ(t)^s`` under ``t ~ N(m, v)``, at
    its optimal ξ: ``(log_bound, m̂, v̂, ξ)``.

    The bound is the Gaussian site ``exp(s t/2 − s λ(ξ) t²)`` (times a constant), so
    ``1/v̂ = 1/v + 2 s λ(ξ)`` and ``m̂ = v̂ (m/v + s/2)``, and the bound's optimum in ξ is
    the root of ``G(ξ) = v̂ + m̂² − ξ²`` (``ξ² = E[t²]``). :func:`jaakkola_jordan`'s
    updates iterate ``ξ ← (v̂ + m̂²)^½``, which converges linearly and slowly where v is
    large (thousands of updates at v = 10⁶, the default intercept's prior variance);
    here Newton's method on G, kept in a bracket (G(0) > 0, G(ξ_max) ≤ 0 with
    ``ξ_max = (v + (|m| + v s/2)²)^½``, as v̂ ≤ v), bisecting where a step would leave it.
    The root is unique (v̂ + m̂² increases with ξ slower than ξ² beyond it).
    ``log_bound = s (log σ(ξ) − ξ/2 + λ ξ²) + ½ (m̂²/v̂ − m²/v + log(v̂/v))``.
    """
    if not (weight > 0.0 and var > 0.0):
        raise ValueError(
            f"The bound of one row needs a positive weight and latent variance; got "
            f"weight {weight!r}, variance {var!r}."
        )
    slope = mean / var + 0.5 * weight

    def excess(xi: float) -> tuple[float, float]:
        # G(ξ) and G'(ξ): v̂' = −2 s λ'(ξ) v̂², m̂ = v̂ c, so G' = v̂' (1 + 2 c² v̂) − 2ξ.
        half = 0.5 * xi
        if xi < 1e-6:
            lam, dlam = 0.125, -xi / 96.0  # λ ≈ 1/8 − ξ²/192
        else:
            th = math.tanh(half)
            lam = th / (4.0 * xi)
            dlam = (half * (1.0 - th * th) - th) / (4.0 * xi * xi)
        new_var = var / (1.0 + 2.0 * weight * var * lam)
        d_var = -2.0 * weight * dlam * new_var * new_var
        g = new_var + (slope * new_var) ** 2 - xi * xi
        return g, d_var * (1.0 + 2.0 * slope * slope * new_var) - 2.0 * xi

    low, high = 0.0, math.sqrt(var + (abs(mean) + 0.5 * var * weight) ** 2)
    xi = high
    for _ in range(200):
        g, dg = excess(xi)
        if g > 0.0:
            low = xi
        elif g < 0.0:
            high = xi
        else:
            break
        step = g / dg if dg < 0.0 else math.inf
        candidate = xi - step
        if not low < candidate < high:
            candidate = 0.5 * (low + high)
        if abs(candidate - xi) <= 4e-16 * xi or high - low <= 4e-16 * high:
            xi = candidate
            break
        xi = candidate
    lam = 0.125 if xi < 1e-6 else math.tanh(0.5 * xi) / (4.0 * xi)
    new_var = var / (1.0 + 2.0 * weight * var * lam)
    new_mean = new_var * slope
    log_bound = weight * (float(log_expit(xi)) - 0.5 * xi + lam * xi * xi) + 0.5 * (
        new_mean * new_mean / new_var - mean * mean / var + math.log(new_var / var)
    )
    return log_bound, new_mean, new_var, xi


def jaakkola_jordan_row(
    prior_mean: np.ndarray,
    prior_cov: np.ndarray,
    prior_lower: np.ndarray,
    row: np.ndarray,
    weight: float,
) -> VBResult:
    """The Jaakkola–Jordan posterior of one row of weight ``s > 0`` under a Gaussian prior,
    at the bound's optimum in its ξ (to round-off).

    The bound of one row is a Gaussian site on its latent ``t = aᵀθ`` alone, so the
    posterior is the prior with t's marginal N(m, v) made the bound's N(m̂, v̂) at the
    optimal ξ (:func:`jaakkola_jordan_latent`; a rank-one update:
    :class:`~vsbayes.approximations._glm_gaussian.RowLatent`). It is the optimum that
    :func:`jaakkola_jordan`'s updates, on one row, approach.

    Parameters
    ----------
    prior_mean, prior_cov, prior_lower : ndarray of shapes (p,), (p, p), (p, p)
        The prior N(μ, Σ) and the Cholesky factor of Σ.
    row : ndarray of shape (p,)
        The signed row ``a = y [x, 1]``.
    weight : float
        Its weight s > 0 (likelihood exponent).

    Returns
    -------
    VBResult
        Gaussian posterior whose ``log_Z`` is the bound on the row's log evidence, with
        the row's ξ; one iteration, converged.
    """
    latent = RowLatent.of(prior_mean, prior_lower, row)
    if not latent.var > 0.0:
        # An all-zero row (no intercept): its factor σ(aᵀθ)^s = 2^(−s) does not depend on
        # θ, so the posterior is the prior and the bound, at ξ = 0, is exact.
        log_bound = weight * float(log_expit(latent.mean))
        xi = np.array([abs(latent.mean)])
        mean, cov = prior_mean.copy(), prior_cov.copy()
        return VBResult(mean, cov, log_bound, n_iter=1, converged=True, xi=xi)
    log_bound, new_mean, new_var, xi = jaakkola_jordan_latent(latent.mean, latent.var, weight)
    mean, cov = latent.conditioned(prior_mean, prior_cov, new_mean, new_var)
    return VBResult(mean, cov, log_bound, n_iter=1, converged=True, xi=np.array([xi]))


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
