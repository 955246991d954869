"""Posterior-predictive class probabilities of the probit model whose latent is Gaussian:
a closed form."""

from __future__ import annotations

import numpy as np
from scipy.special import log_ndtr, ndtr

from .predictive import _broadcast

__all__ = ["probit_predictive_log_proba"]

# Below this, ndtr is subnormal or zero (ndtr(-37.5) ≈ 5e-308): log_ndtr takes over.
_NDTR_FLOOR = -37.0


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
    mean, var, _ = _broadcast(mean, var)
    shape = mean.shape
    mean, var = mean.ravel(), var.ravel()
    # ∞/∞ (infinite mean and variance) has no limit: nan, as in the logistic case.
    scale = 1.0 + var
    np.sqrt(scale, out=scale)
    with np.errstate(invalid="ignore"):
        t = mean / scale
    # One Φ, on the side below 1/2: log Φ and log1p(-Φ), accurate as Φ → 0. log(ndtr)
    # costs half of log_ndtr and is as accurate until ndtr underflows.
    lower = np.abs(t)
    np.negative(lower, out=lower)
    p_lower = ndtr(lower)
    with np.errstate(divide="ignore"):
        log_lower = np.log(p_lower)
    if lower.size and not lower.min() >= _NDTR_FLOOR:  # also when some t is nan
        far = lower < _NDTR_FLOOR
        log_lower[far] = log_ndtr(lower[far])
    np.negative(p_lower, out=p_lower)
    log_upper = np.log1p(p_lower, out=p_lower)
    positive = t > 0
    log_p = np.where(positive, log_upper, log_lower)
    log_1mp = np.where(positive, log_lower, log_upper)
    return log_p.reshape(shape), log_1mp.reshape(shape)
