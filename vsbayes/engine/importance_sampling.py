"""Importance sampling on the same draws as variational sampling."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._warnings import warn
from ..exceptions import DegenerateEstimateError, NotPositiveDefiniteError, UnreliableFitWarning
from ..gaussian import Gaussian
from ._linalg import flushed_exp
from ._validation import check_enough_samples, check_kernel, check_positive, check_positive_int
from .families import FullFamily
from .results import ISResult
from .rounds import run_rounds
from .sample_pool import Frame, SamplePool

__all__ = ["importance_sampling"]


def fit_is_pool(pool: SamplePool) -> ISResult:
    """Self-normalized importance-sampling moments of the pooled points.

    Normalized log-weights; the mean and the *centered* second moment are computed in the
    whitened frame of the last kernel, then mapped back. It needs an effective sample size
    above d (the covariance's rank); below 2n the caller warns.
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
    # Below n effective points (the Gaussian's parameters) the moments are noisy and the
    # covariance over-confident, but on the paper's data still closer to the posterior than
    # the Laplace approximation an estimator would fall back to: returned, with the warning
    # of below 2n (docs/decisions.md D-173; the floor here is the covariance's rank).
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
        Number of target evaluations (over all rounds); at least n = (d+1)(d+2)/2.
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
    TooFewSamplesError
        If ``n_samples`` is below n = (d+1)(d+2)/2, the parameters of the Gaussian the
        moments estimate (nothing is drawn).
    DegenerateEstimateError
        If the weights' effective sample size is below d + 1, or the weighted covariance
        is not numerically positive definite.

    Warns
    -----
    UnreliableFitWarning
        If the effective sample size is below 2n: the moments are valid but noisy (below
        n, the covariance over-confident).
    """
    kernel = check_kernel(kernel)
    n_samples = check_positive_int(n_samples, "n_samples")
    rounds = check_positive_int(rounds, "rounds")
    kernel_scale = check_positive(kernel_scale, "kernel_scale")
    if n_samples // rounds < 1:
        raise ValueError(f"n_samples={n_samples} is smaller than rounds={rounds}.")
    # Even points of the target itself (weights all equal, ESS = N) give moments too narrow
    # below n points: refused before drawing, as by variational sampling and BMC.
    n_params = FullFamily.count_params(kernel.dim)
    check_enough_samples(
        n_samples,
        n_params,
        kernel.dim,
        "gaussian",
        "the weighted moments of fewer points are over-confident even with ideal weights "
        "(a covariance too narrow)",
        "(8n is typical: the estimators' 'auto' takes max(8n, 256))",
    )
    result = run_rounds(
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
    _warn_about(result, n_params)
    return result


def _warn_about(fit: ISResult, n_params: int) -> None:
    """Warn when the effective sample size is below 2n: the moments are valid but noisy
    (about n/(2·ESS) nats of KL from the posterior, a quarter of a nat or more)."""
    if fit.ess < 2 * n_params:
        warn(
            f"Importance sampling's weights of the {fit.n_samples} points have an effective "
            f"sample size of {fit.ess:.3g}, below 2n = {2 * n_params} (n = {n_params}, the "
            f"parameters of the Gaussian they estimate): the moments are noisy, about "
            f"n/(2·ESS) = {n_params / (2 * fit.ess):.2g} nats of KL from the posterior, and "
            f"the covariance likely too narrow. Use more points (8n = {8 * n_params} is "
            f"typical; the ESS is below N unless the weights are equal) or a kernel closer "
            f"to the target.",
            UnreliableFitWarning,
        )
