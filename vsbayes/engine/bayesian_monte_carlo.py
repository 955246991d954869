"""Bayesian Monte Carlo (Rasmussen & Ghahramani 2003), as used in the paper.

The ratio ``f = p/π`` is interpolated by a Gaussian process with an isotropic Gaussian
correlation ``exp(-|z - z'|² / 2ℓ²)`` in the kernel-whitened coordinates z, where π is
N(0, I). The posterior-mean interpolant ``f̂(z) = k(z)ᵀ K⁻¹ f`` is integrated against π
times 1, z and z zᵀ in closed form: ``k(z, z_i) N(z; 0, I) = c_i N(z; m_i, s² I)`` with
``s² = ℓ²/(1+ℓ²)``, ``m_i = z_i/(1+ℓ²)`` and
``c_i = (ℓ²/(1+ℓ²))^{d/2} exp(-|z_i|²/(2(1+ℓ²)))``. O(N³) time, O(N²) memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.linalg import LinAlgError

from .._lapack import cho_factor, cho_solve
from ..exceptions import DegenerateEstimateError, NotPositiveDefiniteError
from ..gaussian import Gaussian
from ._agreement import check_mean_against_is
from ._linalg import flushed_exp
from ._validation import check_enough_samples, check_kernel, check_positive, check_positive_int
from .families import FullFamily
from .results import BMCResult
from .rounds import run_rounds
from .sample_pool import Frame, SamplePool

__all__ = ["bayesian_monte_carlo"]

# The N×N Gram matrix of 16384 points takes 2 GB.
MAX_BMC_SAMPLES = 16384


def fit_bmc_pool(pool: SamplePool, length_scale: float, nugget: float) -> BMCResult:
    """BMC moments from the points of a single-kernel pool."""
    frame = Frame(pool.kernels[-1])
    z = pool.coordinates(frame)
    d = pool.dim
    log_ratio = pool.log_p - pool.log_window()
    shift = float(log_ratio.max())
    f = flushed_exp(log_ratio - shift)
    sq = np.square(z).sum(axis=1)
    gram = np.empty((len(z), len(z)))
    # z zᵀ in row blocks: one product of 16384 × 2001 points with their transpose crashed
    # OpenBLAS 0.3.31 on two threads (segmentation fault); blocks of 2^25 entries do not.
    block = max(1, 2**25 // len(z))
    for start in range(0, len(z), block):
        np.matmul(z[start : start + block], z.T, out=gram[start : start + block])
    gram *= 2.0
    gram -= sq[:, None]
    gram -= sq[None, :]
    np.minimum(gram, 0.0, out=gram)  # -|z_i - z_j|², clipped against round-off
    gram *= 1.0 / (2.0 * length_scale**2)
    np.maximum(gram, -300.0, out=gram)  # no subnormal correlations (exp(-300) ~ 5e-131)
    np.exp(gram, out=gram)
    gram[np.diag_indices_from(gram)] += nugget
    try:
        factor = cho_factor(gram, lower=True, overwrite_a=True, check_finite=False)
        alpha = cho_solve(factor, f, check_finite=False)
    except LinAlgError:
        raise DegenerateEstimateError(
            f"The BMC Gram matrix is numerically singular (length_scale={length_scale}, "
            f"nugget={nugget}). Increase the nugget or decrease length_scale."
        ) from None
    ell2 = length_scale**2
    weights = alpha * np.exp(-0.5 * sq / (1.0 + ell2))
    mass = float(weights.sum())
    if not mass > 0:
        raise DegenerateEstimateError(
            "The BMC estimate of the normalizing constant is not positive: the GP "
            "interpolant of p/π is poor. Increase n_samples or tune length_scale."
        )
    centers = z / (1.0 + ell2)
    mean_z = (weights @ centers) / mass
    check_mean_against_is(
        "BMC",
        mean_z,
        z,
        f,
        "The GP interpolant of p/π is poor here: use a kernel closer to the target, another "
        "length_scale, or variational sampling.",
    )
    spread = centers - mean_z
    cov_z = (spread * weights[:, None]).T @ spread / mass + (ell2 / (1.0 + ell2)) * np.eye(d)
    log_c0 = 0.5 * d * math.log(ell2 / (1.0 + ell2))
    try:
        g = Gaussian(mean_z, cov_z, math.log(mass) + log_c0)
        mean, cov, log_Z = frame.gaussian_from_frame(g, shift)
        return BMCResult(
            mean, cov, log_Z, length_scale=length_scale, n_samples=pool.n_samples, rounds=None
        )
    except NotPositiveDefiniteError:
        raise DegenerateEstimateError(
            "The BMC covariance estimate is not positive definite (negative interpolation "
            "weights). Increase n_samples or tune length_scale."
        ) from None


def bayesian_monte_carlo(
    log_target: Callable,
    kernel: Gaussian,
    n_samples: int,
    *,
    length_scale: float = 1.0,
    nugget: float = 1e-8,
    rule="mc",
    random_state=None,
) -> BMCResult:
    """Bayesian Monte Carlo estimate of the normalizing constant, mean and covariance.

    Parameters
    ----------
    log_target : callable
        Vectorized log-density, (N, d) -> (N,).
    kernel : Gaussian
        Sampling kernel π; the GP models ``p/π`` in its whitened coordinates.
    n_samples : int
        Number of target evaluations: at least n = (d+1)(d+2)/2, the parameters of the
        Gaussian the interpolant resolves, and at most ``MAX_BMC_SAMPLES`` = 16384 (the
        method stores an N×N matrix and costs O(N³)).
    length_scale : float, default=1.0
        Correlation length ℓ of the isotropic Gaussian covariance, in kernel standard
        deviations (the paper fixed ℓ rather than fitting it by marginal likelihood).
    nugget : float, default=1e-8
        Jitter added to the Gram matrix diagonal (the interpolant is then a slightly
        smoothed one), keeping its Cholesky factorization stable.
    rule : {"mc", "qmc"} or SamplingRule, default="mc"
        Sampling rule; with the same ``random_state`` and ``n_samples`` the points are those
        of :func:`variational_sampling` and :func:`importance_sampling`.
    random_state : int, RandomState, Generator or None
        Controls the draws.

    Returns
    -------
    BMCResult

    Raises
    ------
    TooFewSamplesError
        If ``n_samples`` is below n (nothing is drawn).
    DegenerateEstimateError
        If the estimated mass is not positive, the covariance is not positive definite, or
        the mean is implausibly far (chi-square tail probability below 1e-9) from the
        importance-sampling mean of the same points, i.e. the interpolant is unreliable.
    """
    kernel = check_kernel(kernel)
    n_samples = check_positive_int(n_samples, "n_samples")
    if n_samples > MAX_BMC_SAMPLES:
        raise ValueError(
            f"n_samples={n_samples} is too large for Bayesian Monte Carlo (O(N²) memory, "
            f"O(N³) time); use at most {MAX_BMC_SAMPLES}."
        )
    # The interpolant fits a full Gaussian: fewer points than its parameters cannot resolve
    # it, and its covariance comes out narrow (one point gives the kernel's times
    # ℓ²/(1+ℓ²) whatever the target). Refused, as by variational sampling.
    check_enough_samples(
        n_samples,
        FullFamily.count_params(kernel.dim),
        kernel.dim,
        "gaussian",
        "the Gaussian process cannot resolve the Gaussian it fits from fewer points (its "
        "covariance comes out too narrow)",
        "(the estimators' 'auto' takes max(8n, 256), at most 16384)",
    )
    length_scale = check_positive(length_scale, "length_scale")
    nugget = check_positive(nugget, "nugget")
    return run_rounds(
        log_target,
        kernel,
        n_samples,
        rounds=1,
        kernel_scale=1.0,
        rule=rule,
        random_state=random_state,
        estimate=lambda pool, _previous, _final: fit_bmc_pool(pool, length_scale, nugget),
        name="Bayesian Monte Carlo",
    )
