"""Layer 3 — engine fitters: functions of a vectorized log-density returning Gaussians."""

from .bayesian_monte_carlo import bayesian_monte_carlo
from .importance_sampling import importance_sampling
from .laplace import laplace
from .results import (
    BMCResult,
    DiagnosedGaussian,
    ISResult,
    LaplaceResult,
    RoundInfo,
    VSResult,
)
from .variational_sampling import n_family_params, variational_sampling

__all__ = [
    "BMCResult",
    "DiagnosedGaussian",
    "ISResult",
    "LaplaceResult",
    "RoundInfo",
    "VSResult",
    "bayesian_monte_carlo",
    "importance_sampling",
    "laplace",
    "n_family_params",
    "variational_sampling",
]
