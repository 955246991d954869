"""Plausibility check shared by the fitters: is a mean consistent with importance sampling?

VS and BMC estimate the same mean as self-normalized importance sampling, from the same
points and the same values p/π. The IS mean's standard error is about the target
covariance divided by the effective sample size (ESS), so the squared Mahalanobis distance
``ESS · gapᵀ Σ⁻¹ gap`` between the two is roughly chi-square with d degrees of freedom when
the estimate is right. A fit that extrapolates far beyond the sampled points (a few points
carrying all the weight, a kernel far from the target) gives distances far beyond that.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import chi2

from ..exceptions import DegenerateEstimateError
from ._linalg import solve_psd

__all__ = ["DISAGREEMENT_P", "check_mean_against_is"]

# Tail probability of the chi-square beyond which the disagreement is an error. Far out in
# the tail: with ESS of a few dozen the distance is heavier-tailed than chi-square (the
# paper's datasets at N = 2n reach the 1e-6 quantile), while fits that extrapolate land
# several times beyond this one.
DISAGREEMENT_P = 1e-9


def check_mean_against_is(
    method: str,
    mean_z: np.ndarray,
    z: np.ndarray,
    weights: np.ndarray,
    remedy: str,
    cov_z: np.ndarray | None = None,
) -> None:
    """Raise :class:`DegenerateEstimateError` if ``mean_z`` is implausibly far from IS's.

    Parameters
    ----------
    method : str
        Name of the estimate in the message ("VS", "BMC").
    mean_z : ndarray of shape (d,)
        The estimate's mean, in the coordinates of ``z``.
    z : ndarray of shape (N, d)
        The points (in kernel coordinates, where the covariances are well conditioned).
    weights : ndarray of shape (N,)
        Their non-negative importance weights, in any scale.
    remedy : str
        What to change, appended to the message.
    cov_z : ndarray of shape (d, d), optional
        Covariance defining the distance: the estimate's own; default the IS weighted
        covariance (for estimates whose covariance is not known yet).
    """
    w = weights / weights.sum()
    ess = 1.0 / float(w @ w)
    is_mean = w @ z
    if cov_z is None:
        centered = z - is_mean
        cov_z = (centered * w[:, None]).T @ centered
    gap = mean_z - is_mean
    distance = ess * float(gap @ solve_psd(cov_z, gap))
    limit = chi2.isf(DISAGREEMENT_P, z.shape[1])
    if distance > limit:
        raise DegenerateEstimateError(
            f"The {method} mean is {math.sqrt(distance):.3g} standard errors from the "
            f"importance-sampling mean of the same points (limit {math.sqrt(limit):.3g}; "
            f"effective sample size {ess:.3g}): the estimate is unreliable. {remedy}"
        )
