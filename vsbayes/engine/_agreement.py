"""Plausibility checks shared by the fitters: is a fit consistent with importance sampling?

VS and BMC estimate the same moments as self-normalized importance sampling (IS), from the
same points and the same values p/π. The IS mean is a weighted average of the points, so it
lies where the sampled target mass is. Two checks compare it with a fit's mean:

* :func:`check_mean_within_fit` (VS): the IS mean must be a plausible draw from the fitted
  Gaussian — ``gapᵀ Σ⁻¹ gap`` within the chi-square quantile of tail ``DISAGREEMENT_P``
  for d degrees of freedom. A fit resting on a few points can extrapolate: its mass then
  sits many of its own standard deviations away from the sampled mass (the separable
  posteriors of the reliability tests gave 15 sds and more). The distance is *not* scaled
  by the effective sample size: with few effective points the IS mean is far noisier than
  Σ/ESS suggests, while VS is not — scaling rejected a third of good intermediate rounds on
  the paper's Ionosphere and Parkinsons data at N ≥ 128n.
* :func:`check_mean_against_is` (BMC): in IS standard errors, ``ESS · gapᵀ Σ_IS⁻¹ gap``; a
  GP interpolant biased by its length scale shifts the mean by many standard errors while
  staying within the sampled region.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.stats import chi2

from ..exceptions import DegenerateEstimateError
from ._linalg import solve_psd
from .families import QuadraticFamily

__all__ = ["DISAGREEMENT_P", "check_mean_against_is", "check_mean_within_fit"]

# Tail probability of the chi-square beyond which a distance is an error: far out, so that
# a correct estimate is essentially never rejected.
DISAGREEMENT_P = 1e-9


@functools.lru_cache(maxsize=64)
def _limit(dim: int) -> float:
    """The chi-square quantile of tail ``DISAGREEMENT_P`` for ``dim`` degrees of freedom
    (cached: SciPy's distribution call costs ~0.2 ms, a small fit's check twice)."""
    return float(chi2.isf(DISAGREEMENT_P, dim))


def _is_moments(z: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Normalized weights, IS mean and effective sample size."""
    w = weights / weights.sum()
    return w, w @ z, 1.0 / float(w @ w)


def check_mean_within_fit(
    method: str,
    mean_z: np.ndarray,
    cov_z: np.ndarray,
    points: QuadraticFamily,
    weights: np.ndarray,
    remedy: str,
) -> None:
    """Raise :class:`DegenerateEstimateError` if the IS mean is implausible under the fit.

    Parameters
    ----------
    method : str
        Name of the estimate in the message.
    mean_z, cov_z : ndarray of shape (d,) and (d, d)
        The fit's mean and covariance, in the coordinates of ``z``.
    points : QuadraticFamily
        The family on the points (in kernel coordinates, where the covariances are well
        conditioned), for their weighted mean.
    weights : ndarray of shape (N,)
        Their non-negative importance weights, in any scale.
    remedy : str
        What to change, appended to the message.
    """
    is_mean = points.weighted_mean(weights)
    ess = float(weights.sum()) ** 2 / float(weights @ weights)
    gap = mean_z - is_mean
    distance = float(gap @ solve_psd(cov_z, gap))
    limit = _limit(points.dim)
    if distance > limit:
        raise DegenerateEstimateError(
            f"The importance-sampling mean of the points lies {math.sqrt(distance):.3g} "
            f"standard deviations from the {method} mean (limit {math.sqrt(limit):.3g}; "
            f"effective sample size {ess:.3g}): the fit extrapolates beyond the points that "
            f"carry the weight. {remedy}"
        )


def check_mean_against_is(
    method: str,
    mean_z: np.ndarray,
    z: np.ndarray,
    weights: np.ndarray,
    remedy: str,
) -> None:
    """Raise :class:`DegenerateEstimateError` if ``mean_z`` is many IS standard errors off.

    Parameters
    ----------
    method : str
        Name of the estimate in the message.
    mean_z : ndarray of shape (d,)
        The estimate's mean, in the coordinates of ``z``.
    z : ndarray of shape (N, d)
        The points (in kernel coordinates).
    weights : ndarray of shape (N,)
        Their non-negative importance weights, in any scale.
    remedy : str
        What to change, appended to the message.
    """
    w, is_mean, ess = _is_moments(z, weights)
    centered = z - is_mean
    is_cov = (centered * w[:, None]).T @ centered
    gap = mean_z - is_mean
    distance = ess * float(gap @ solve_psd(is_cov, gap))
    limit = _limit(z.shape[1])
    if distance > limit:
        raise DegenerateEstimateError(
            f"The {method} mean is {math.sqrt(distance):.3g} standard errors from the "
            f"importance-sampling mean of the same points (limit {math.sqrt(limit):.3g}; "
            f"effective sample size {ess:.3g}): the estimate is unreliable. {remedy}"
        )
