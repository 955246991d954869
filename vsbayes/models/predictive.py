"""Posterior-predictive class probabilities of binary GLMs whose latent is Gaussian."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_expit, log_ndtr

__all__ = ["logistic_predictive_log_proba", "probit_predictive_log_proba"]

# Nodes × points per block, so temporaries stay near 32 MB.
_BLOCK_ENTRIES = 2**22

# Gaussian-side rule: trapezoid in z (f = m + s z) on s + [-10, 10]. The integrand is
# log-concave with curvature ≥ 1 and its mode lies in (0, s), so the window holds all but
# e^-40 of it; σ(m + s z) has its poles at Im z = π/s ≥ π, where step 0.5 leaves a
# discretization error near 1e-14 (relative).
_Z_STEP = 0.5
_Z_NODES = np.arange(-20, 21) * _Z_STEP
_Z_LOG_WEIGHT = math.log(_Z_STEP) - 0.5 * math.log(2.0 * math.pi)

# Logistic-side rule: trapezoid in l, where p = E_L[Φ((m - l)/s)] with L standard logistic,
# on c + [-56, 40]. The poles of the logistic density σ'(l) are at Im l = ±π for every s,
# so step 0.5 keeps the error near 1e-14 however wide the Gaussian is. For m ≤ 0 the
# integrand is ≈ e^l Φ((m - l)/s), a Gaussian of sd s centered at m + s² (the saddle point)
# cut off at l ≈ 0 by σ': hence c = min(m + s², 0). The wider left half covers s up to
# √50, the widest such Gaussian when |m| ≤ 50.
_L_STEP = 0.5
_L_NODES = np.arange(-112, 81) * _L_STEP
_L_LOG_WEIGHT = math.log(_L_STEP)

# s > 1 still uses the Gaussian-side rule when the mass (near z = s) is this many sds below
# the logistic transition (z = -m/s): there the poles, now close to the real axis, lie
# where the integrand is below e^-32 of its peak. This keeps the relative accuracy for
# |m| ≫ 50 outside the band |m + s²| < 8 s.
_SEPARATION = 8.0


def _log_sum_exp_rows(terms: np.ndarray) -> np.ndarray:
    """Row-wise log Σ exp, shifted by the row maximum (terms are finite for finite input)."""
    top = terms.max(axis=1)
    return top + np.log(np.exp(terms - top[:, None]).sum(axis=1))


def _gaussian_side(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    z = s[:, None] + _Z_NODES
    terms = log_expit(m[:, None] + s[:, None] * z) - 0.5 * z * z
    return _log_sum_exp_rows(terms) + _Z_LOG_WEIGHT


def _logistic_side(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    # min(s, √-m)² keeps m + s² from overflowing; the clip removes a rounding ulp above 0.
    center = np.minimum(m + np.minimum(s, np.sqrt(-m)) ** 2, 0.0)
    threshold = center[:, None] + _L_NODES  # the nodes l of L
    a = -np.abs(threshold)
    log_density = a - 2.0 * np.log1p(np.exp(a))  # log σ'(l) = log σ(l) + log σ(-l)
    terms = log_density + log_ndtr((m[:, None] - threshold) / s[:, None])
    return _log_sum_exp_rows(terms) + _L_LOG_WEIGHT


def _logistic_log_lower(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """log p for 1-d arrays with m ≤ 0 and 0 < s < ∞, where p ≤ 1/2: the side computed with
    relative accuracy (the other is log1p(-p), which stays accurate as p → 0)."""
    out = np.empty_like(m)
    wide = np.maximum(s, 1.0)
    gaussian = (s <= 1.0) | (-m / wide - wide >= _SEPARATION)
    for rule, n_nodes, index in (
        (_gaussian_side, _Z_NODES.size, np.flatnonzero(gaussian)),
        (_logistic_side, _L_NODES.size, np.flatnonzero(~gaussian)),
    ):
        block = max(1, _BLOCK_ENTRIES // n_nodes)
        for start in range(0, index.size, block):
            rows = index[start : start + block]
            out[rows] = rule(m[rows], s[rows])
    return out


def _broadcast(mean, var) -> tuple[np.ndarray, np.ndarray]:
    mean, var = np.broadcast_arrays(np.asarray(mean, dtype=float), np.asarray(var, dtype=float))
    if np.any(var < 0):
        raise ValueError("var must be nonnegative: it is the variance of the latent f.")
    return mean, var


def logistic_predictive_log_proba(mean, var) -> tuple[np.ndarray, np.ndarray]:
    """Logarithms of the posterior-predictive probabilities of a logistic model.

    The class probability is ``p = ∫ σ(f) N(f; mean, var) df`` with ``σ`` the logistic
    sigmoid, the predictive of logistic regression when the latent ``f = w @ x`` has a
    Gaussian posterior.

    Parameters
    ----------
    mean : array-like
        Mean of the latent f.
    var : array-like
        Variance of the latent f, nonnegative; broadcast against ``mean``.

    Returns
    -------
    log_p : ndarray
        ``log p``, of the broadcast shape of ``mean`` and ``var``.
    log_1mp : ndarray
        ``log(1 - p)``, which equals ``log p`` at ``-mean`` since ``σ(-f) = 1 - σ(f)``.

    Raises
    ------
    ValueError
        If some variance is negative.

    Notes
    -----
    ``p`` is computed on the side ``mean ≤ 0``, where ``p ≤ 1/2``, and the other side is
    ``log1p(-p)``, so both logarithms keep their relative accuracy however close ``p`` is
    to 0 or 1. With ``s = √var``, a trapezoid rule sums in the log domain either over
    ``z = (f - mean)/s`` (41 nodes; for ``s ≤ 1``, where σ's poles are far from the real
    axis) or over ``l`` in ``p = E[Φ((mean - L)/s)]``, ``L`` standard logistic (193 nodes).
    Both converge geometrically. Against a brute-force reference, the relative error of
    ``log p`` is below 1e-13 for ``|mean| ≤ 60`` and any ``var`` (so the absolute error of
    ``p`` is far below 1e-6 everywhere); for larger ``|mean|`` it grows only near
    ``var ≈ |mean|``, to about 2e-4 at ``|mean| = 1e4``. ``var = 0`` gives
    ``log_expit(±mean)`` exactly.
    """
    mean, var = _broadcast(mean, var)
    shape = mean.shape
    m, v = mean.ravel(), var.ravel()
    lower = -np.abs(m)
    log_lower = np.full(m.shape, np.nan)
    inner = np.isfinite(m) & np.isfinite(v) & (v > 0)
    log_lower[inner] = _logistic_log_lower(lower[inner], np.sqrt(v[inner]))
    # Limits: an infinite mean decides the class; a zero mean or an infinite variance leaves
    # a fair coin (exactly, so that p(0) = 1 - p(0)).
    log_lower[np.isinf(m) & np.isfinite(v)] = -np.inf
    log_lower[((m == 0) & ~np.isnan(v)) | (np.isfinite(m) & np.isposinf(v))] = -math.log(2.0)
    log_upper = np.log1p(-np.exp(log_lower))
    positive = m > 0
    log_p = np.where(positive, log_upper, log_lower)
    log_1mp = np.where(positive, log_lower, log_upper)
    exact = v == 0
    log_p[exact] = log_expit(m[exact])
    log_1mp[exact] = log_expit(-m[exact])
    return log_p.reshape(shape), log_1mp.reshape(shape)


def probit_predictive_log_proba(mean, var) -> tuple[np.ndarray, np.ndarray]:
    """Logarithms of the posterior-predictive probabilities of a probit model.

    The class probability is ``p = ∫ Φ(f) N(f; mean, var) df = Φ(mean / √(1 + var))``,
    exactly, with ``Φ`` the standard normal cdf.

    Parameters
    ----------
    mean : array-like
        Mean of the latent f.
    var : array-like
        Variance of the latent f, nonnegative; broadcast against ``mean``.

    Returns
    -------
    log_p : ndarray
        ``log p``, of the broadcast shape of ``mean`` and ``var``.
    log_1mp : ndarray
        ``log(1 - p)``.

    Raises
    ------
    ValueError
        If some variance is negative.
    """
    mean, var = _broadcast(mean, var)
    # ∞/∞ (infinite mean and variance) has no limit: nan, as in the logistic case.
    with np.errstate(invalid="ignore"):
        t = mean / np.sqrt(1.0 + var)
    return np.asarray(log_ndtr(t)), np.asarray(log_ndtr(-t))  # 0-d arrays, not scalars
