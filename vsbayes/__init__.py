"""vsbayes — Bayesian inference by variational sampling."""

from .engine import (
    BMCResult,
    ISResult,
    LaplaceResult,
    VSResult,
    bayesian_monte_carlo,
    importance_sampling,
    laplace,
    n_family_params,
    variational_sampling,
)
from .gaussian import Gaussian, excess_kl, kl_divergence

__version__ = "0.1.0.dev0"

__all__ = [
    "BMCResult",
    "Gaussian",
    "ISResult",
    "LaplaceResult",
    "VSResult",
    "bayesian_monte_carlo",
    "excess_kl",
    "importance_sampling",
    "kl_divergence",
    "laplace",
    "n_family_params",
    "variational_sampling",
]
