"""Whether a ``partial_fit`` batch shows that its stream is ordered, and moved the
posterior as no batch of a shuffled stream would.

Assumed-density filtering carries the earlier batches as one Gaussian, fitted where their
posterior's mass is; a later batch that moves the posterior far into that Gaussian's tail
weighs the earlier rows by the Gaussian's extrapolation there, not by their likelihood. On
a stream sorted by class the first batches' posterior is skewed (a class with a few rows
bounds its intercept on one side only, nearly as D-172's class without rows) and the next
batch moves it by many of its sds: ``make_classification(1000)`` sorted by class, two
batches of 500, the first with 9 rows of class 1, ended at 2.2× the log loss of a fit of
the rows with EP, 2.8× with VS; even the exact moments of the first batch's posterior
(10⁵-draw importance sampling) carried as the prior gave the same collapse (D-215).

A call of more than one row warns where both tests reject: (1) its class counts against
the earlier rows' — under rows in random order, the batch's counts given both are
hypergeometric, whose tails are within the binomial's Chernoff bound
``exp(-n KL(share ‖ pooled share))`` (Hoeffding 1963), for the batch's rows and for the
earlier ones, with a union over the classes: below :data:`ORDER_LEVEL`; (2) the posterior's
move in the carried posterior's metric, ``δᵀ Σ₀⁻¹ δ``: under an exchangeable stream the
posterior mean is a martingale, its step of covariance ``Σ₀ − Σ₁``, so the statistic is
``Σ λᵢ χ²₁`` with ``λ`` the eigenvalues of ``I − Σ₀⁻¹ Σ₁`` (in [0, 1]), whose Chernoff
bound must be below :data:`MOVE_LEVEL`. (2) alone fired on shuffled streams' small early
batches (down to 3·10⁻⁶), whose posteriors are far from Gaussian; (1) alone on any change
of class shares, also one the carried posterior predicts from the batch's features (which
then moves it little). Neither measures the harm, which depends on how skewed the earlier
batches' posterior was, unknown without their rows: on the sorted stream above with 9 to
150 rows of class 1 in the first batch, both rejected from 9 to 100 rows (log loss 2.7 to
1.02 times the fit's) and mostly at 150 (1.00-1.01).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import linalg, optimize

__all__ = ["MOVE_LEVEL", "ORDER_LEVEL", "class_order_bound", "move_bound"]

#: A batch's class counts whose probability under rows in random order is bounded below
#: this reject the order (a stream of 10⁶ batches in random order warns with probability
#: below 10⁻³).
ORDER_LEVEL = 1e-9
#: The posterior's move whose probability under an exchangeable stream is bounded below
#: this is beyond a batch of its rows (asked only where the order was rejected).
MOVE_LEVEL = 1e-3


def _bernoulli_kl(share: np.ndarray, pooled: np.ndarray) -> np.ndarray:
    """KL(Bernoulli(share) ‖ Bernoulli(pooled)), pooled in (0, 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.where(share > 0, share * np.log(share / pooled), 0.0)
        other = np.where(share < 1, (1 - share) * np.log((1 - share) / (1 - pooled)), 0.0)
    return one + other


def class_order_bound(earlier: np.ndarray, batch: np.ndarray) -> float:
    """The log of a bound on the probability, under rows in random order, of class counts
    ``batch`` at least this far from ``earlier``'s shares (0: no evidence of order).

    ``earlier`` may be decayed (non-integer) counts: the rows the posterior still weighs.
    """
    n_earlier, n_batch = float(earlier.sum()), float(batch.sum())
    if n_earlier <= 0 or n_batch <= 0:
        return 0.0
    pooled = (earlier + batch) / (n_earlier + n_batch)
    inside = (pooled > 0) & (pooled < 1)
    if not inside.any():
        return 0.0
    pooled = pooled[inside]
    # The same event seen from the batch's rows and from the earlier ones: either bound.
    exponent = np.maximum(
        n_batch * _bernoulli_kl(batch[inside] / n_batch, pooled),
        n_earlier * _bernoulli_kl(earlier[inside] / n_earlier, pooled),
    )
    return min(0.0, math.log(2.0 * inside.sum()) - float(exponent.max()))


def move_bound(carried_mean, carried_lower, mean, cov) -> tuple[float, float, float]:
    """The posterior's move from ``N(carried_mean, L Lᵀ)`` to ``N(mean, cov)``: the
    statistic ``δᵀ Σ₀⁻¹ δ``, its expectation under an exchangeable stream (Σ λ), and the
    log of the Chernoff bound on its tail there (0: within it)."""
    z = linalg.solve_triangular(carried_lower, mean - carried_mean, lower=True)
    half = linalg.solve_triangular(carried_lower, cov, lower=True)
    whitened = linalg.solve_triangular(carried_lower, half.T, lower=True)
    lam = np.clip(1.0 - linalg.eigvalsh(0.5 * (whitened + whitened.T)), 0.0, 1.0)
    stat, expected = float(z @ z), float(lam.sum())
    if stat <= expected:
        return stat, expected, 0.0
    if lam.max() <= 0.0:  # no information gained, yet a move
        return stat, expected, -math.inf

    def log_mgf_bound(s: float) -> float:
        return -s * stat - 0.5 * float(np.sum(np.log1p(-2.0 * s * lam)))

    best = optimize.minimize_scalar(
        log_mgf_bound, bounds=(0.0, (1.0 - 1e-12) / (2.0 * lam.max())), method="bounded"
    )
    return stat, expected, min(0.0, float(best.fun))
