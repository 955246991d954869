"""Pareto-smoothed importance sampling (PSIS), many weight vectors at once.

Importance weights whose distribution has a heavy right tail give estimates dominated by a
few draws. PSIS (Vehtari, Simpson, Gelman, Yao & Gabry 2024, *JMLR* 25) replaces the
largest ``M = ⌈min(S/5, 3√S)⌉`` of S weights by the expected order statistics of a
generalized Pareto distribution fitted to them, and the fitted shape ``k̂`` says how far the
estimate can be trusted: below 0.7 the smoothed estimate is reliable for S in the
thousands; above, the variance of the raw weights is effectively infinite and the result
should not be relied on (the leave-one-out warning names those rows).

Every row of the ``(n, S)`` array of log weights is smoothed on its own, all rows at once:
the tail is the same length in every row, so the sort, the fit (Zhang & Stephens 2009,
*Technometrics* 51, with the weakly informative prior on k of the reference code) and the
replacement are array operations over the rows.
"""

from __future__ import annotations

import math

import numpy as np

from .._sums import logsumexp

__all__ = ["PARETO_K_THRESHOLD", "pareto_smoothed_log_weights"]

#: Above this Pareto shape the importance-sampling estimate is unreliable (Vehtari et al.
#: 2024, §3: the pre-asymptotic convergence rate collapses for k̂ > 0.7).
PARETO_K_THRESHOLD = 0.7

# Zhang & Stephens' prior on the profile grid and the shape's weakly informative prior
# (a pseudo-count of 10 at k = 0.5), as in the reference implementations.
_GRID_PRIOR = 3.0
_K_PRIOR_COUNT = 10.0


def pareto_smoothed_log_weights(log_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Smoothed, normalized log weights and the Pareto shape of each row.

    Parameters
    ----------
    log_weights : ndarray of shape (n, S)
        Unnormalized log importance weights, one row per estimate.

    Returns
    -------
    smoothed : ndarray of shape (n, S)
        Log weights with the tail replaced, truncated at the row's largest raw weight, and
        normalized (``logsumexp`` of each row is 0).
    pareto_k : ndarray of shape (n,)
        The fitted shape ``k̂`` of each row's tail; ``-inf`` where the tail is flat (all
        the largest weights equal: nothing to smooth, e.g. a row of weight zero); ``inf``
        where a quarter of the tail underflows beside its largest weight (no fit: the raw
        weights are kept).
    """
    log_weights = np.array(log_weights, dtype=float, ndmin=2)
    n, n_draws = log_weights.shape
    tail_length = math.ceil(min(0.2 * n_draws, 3.0 * math.sqrt(n_draws)))
    if tail_length < 5 or n_draws < tail_length + 1:
        raise ValueError(f"PSIS needs at least 21 draws per row; got {n_draws}.")
    log_weights -= log_weights.max(axis=1, keepdims=True)
    order = np.argsort(log_weights, axis=1)
    tail_index = order[:, -tail_length:]
    rows = np.arange(n)[:, None]
    log_cutoff = np.maximum(
        log_weights[rows[:, 0], order[:, -tail_length - 1]], np.log(np.finfo(float).tiny)
    )
    cutoff = np.exp(log_cutoff)[:, None]
    excess = np.exp(log_weights[rows, tail_index]) - cutoff  # ascending in each row
    pareto_k = np.full(n, -np.inf)
    flat = excess[:, -1] <= 0.0
    # A tail whose quarter or more underflows beside its largest weight (log weights
    # spread beyond exp's range, e.g. the prior as the proposal) has no Pareto fit: its
    # quartile excess is ≤ 0, where the fit's profile takes logs of negative numbers. Its
    # raw weights are kept, and k̂ = ∞ says that they cannot be trusted.
    degenerate = ~flat & (excess[:, int(tail_length / 4 + 0.5) - 1] <= 0.0)
    pareto_k[degenerate] = np.inf
    fit = np.flatnonzero(~flat & ~degenerate)
    if fit.size:
        k, sigma = _generalized_pareto_fit(excess[fit])
        pareto_k[fit] = k
        probabilities = (np.arange(tail_length) + 0.5) / tail_length
        quantiles = _generalized_pareto_quantiles(probabilities, k[:, None], sigma[:, None])
        smoothed_tail = np.log(quantiles + cutoff[fit])
        # Truncated at the largest raw weight (log 0 after the shift above).
        log_weights[rows[fit], tail_index[fit]] = np.minimum(smoothed_tail, 0.0)
    log_weights -= logsumexp(log_weights, axis=1, keepdims=True)
    return log_weights, pareto_k


def _generalized_pareto_fit(excess: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shape and scale of a generalized Pareto fit to each row of sorted positive excesses
    (Zhang & Stephens' profile posterior mean, with the shape's weak prior)."""
    m = excess.shape[1]
    grid_size = 30 + int(math.sqrt(m))
    grid = 1.0 - np.sqrt(grid_size / (np.arange(1, grid_size + 1) - 0.5))
    quartile = excess[:, int(m / 4 + 0.5) - 1]
    b = grid[None, :] / (_GRID_PRIOR * quartile[:, None]) + 1.0 / excess[:, -1:]  # (rows, g)
    # k of each grid point: the mean of log(1 − b x) over the excesses (chunked over rows
    # would only matter beyond ~10⁵ rows; the (rows, g, m) temporary is ~40 m doubles/row).
    k_grid = np.log1p(-b[:, :, None] * excess[:, None, :]).mean(axis=2)
    profile = m * (np.log(-b / k_grid) - k_grid - 1.0)
    weights = np.exp(profile - logsumexp(profile, axis=1, keepdims=True))
    b_mean = (b * weights).sum(axis=1)
    k = np.log1p(-b_mean[:, None] * excess).mean(axis=1)
    sigma = -k / b_mean
    k = (m * k + _K_PRIOR_COUNT * 0.5) / (m + _K_PRIOR_COUNT)
    return k, sigma


def _generalized_pareto_quantiles(probabilities, k, sigma) -> np.ndarray:
    """Quantiles of the generalized Pareto distribution of shape ``k`` and scale ``sigma``."""
    # (over: a shape far above 1, as k̂ ~ 170 on a one-sided posterior's draws, overflows
    # the top quantiles to inf, above every raw weight: the caller truncates them there.)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        general = sigma * np.expm1(-k * np.log1p(-probabilities)) / k
    exponential = -sigma * np.log1p(-probabilities)
    return np.where(np.abs(k) < 1e-12, exponential, general)
