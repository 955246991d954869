"""Importance sampling on the same draws as variational sampling."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..exceptions import DegenerateEstimateError, NotPositiveDefiniteError
from ..gaussian import Gaussian
from ._linalg import flushed_exp
from ._validation import check_kernel, check_positive, check_positive_int
from .results import ISResult
from .rounds import run_rounds
from .sample_pool import Frame, SamplePool

__all__ = ["importance_sampling"]


def fit_is_pool(pool: SamplePool) -> ISResult:
    """Self-normalized importance-sampling moments of the pooled points.

    Normalized log-weights; the mean and the *centered* second moment are computed in the
    whitened frame of the last kernel, then mapped back.
    """
    log_iw = pool.log_importance_weights()
    shift = float(log_iw.max())
    w = flushed_exp(log_iw - shift)
    mass = float(w.sum())
    w /= mass
    ess = 1.0 / float(w @ w)
    if ess < pool.dim + 1:
        # Fewer effective points than a covariance in d dimensions needs: the weighted
        # covariance is rank-deficient up to round-off, whether or not Cholesky notices.
        raise DegenerateEstimateError(
            f"The importance-sampling covariance is singular: the weights have an effective "
            f"sample size of {ess:.3g}, below d+1 = {pool.dim + 1}. Increase n_samples or "
            f"use a kernel closer to the target."
        )
    frame = Frame(pool.kernels[-1])
    z = pool.coordinates(frame)
    mean_z = w @ z
    centered = z - mean_z
    cov_z = (centered * w[:, None]).T @ centered
    try:
        g = Gaussian(mean_z, cov_z, np.log(mass))
        mean, cov, log_Z = frame.gaussian_from_frame(g, shift)
        return ISResult(mean, cov, log_Z, ess=ess, n_samples=pool.n_samples, rounds=None)
    except NotPositiveDefiniteError:
        raise DegenerateEstimateError(
            f"The importance-sampling covariance is singular: the weights have an effective "
            f"sample size of {ess:.3g} for dimension {pool.dim}. Increase n_samples or use "
            f"a kernel closer to the target."
        ) from None


def importance_sampling(
    log_target: Callable,
    kernel: Gaussian,
    n_samples: int,
    *,
    rule="mc",
    rounds: int = 1,
    kernel_scale: float = 1.0,
    random_state=None,
) -> ISResult:
    """Importance-sampling estimate of the normalizing constant, mean and covariance.

    ``Z ≈ Σ_k w_k p(x_k)/π(x_k)``; mean and covariance are the self-normalized weighted
    moments. With the same ``random_state``, ``n_samples``, ``rule`` and ``rounds=1``, the
    points are exactly those of :func:`variational_sampling`, so comparisons are paired.

    Parameters
    ----------
    log_target : callable
        Vectorized log-density, (N, d) -> (N,).
    kernel : Gaussian
        Proposal π.
    n_samples : int
        Number of target evaluations (over all rounds).
    rule : {"mc", "qmc"} or SamplingRule, default="mc"
        Sampling rule.
    rounds : int, default=1
        Adaptive importance sampling: round r+1 draws from the round-r estimate with its
        covariance scaled by ``kernel_scale``; all rounds are pooled with the mixture of the
        proposals as the importance density (deterministic-mixture weights).
    kernel_scale : float, default=1.0
        Covariance inflation of the adapted proposals.
    random_state : int, RandomState, Generator or None
        Controls the draws.

    Returns
    -------
    ISResult
        Estimate with ``ess`` (effective sample size).

    Raises
    ------
    DegenerateEstimateError
        If the weighted covariance is singular: an effective sample size below d+1, or
        a covariance that is not numerically positive definite.
    """
    kernel = check_kernel(kernel)
    n_samples = check_positive_int(n_samples, "n_samples")
    rounds = check_positive_int(rounds, "rounds")
    kernel_scale = check_positive(kernel_scale, "kernel_scale")
    if n_samples // rounds < 1:
        raise ValueError(f"n_samples={n_samples} is smaller than rounds={rounds}.")
    return run_rounds(
        log_target,
        kernel,
        n_samples,
        rounds=rounds,
        kernel_scale=kernel_scale,
        rule=rule,
        random_state=random_state,
        estimate=lambda pool, _previous, _final: fit_is_pool(pool),
        name="importance sampling",
    )
