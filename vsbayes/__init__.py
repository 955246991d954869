"""vsbayes — Bayesian inference by variational sampling."""

from . import estimators as _estimators
from ._memory import config_context, get_config, set_config
from ._version import __version__
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
from .estimators import *  # noqa: F403 (the estimators and their registry)
from .gaussian import (
    CentredStructuredCovariance,
    Gaussian,
    StructuredCovariance,
    StructuredGaussian,
    excess_kl,
    kl_divergence,
)
from .models import HorseshoePrior, LaplacePrior, StudentTPrior

__all__ = [
    "BMCResult",
    "CentredStructuredCovariance",
    "Gaussian",
    "HorseshoePrior",
    "ISResult",
    "LaplacePrior",
    "LaplaceResult",
    "StructuredCovariance",
    "StructuredGaussian",
    "StudentTPrior",
    "VSResult",
    "__version__",
    "bayesian_monte_carlo",
    "config_context",
    "excess_kl",
    "get_config",
    "importance_sampling",
    "kl_divergence",
    "laplace",
    "n_family_params",
    "set_config",
    "variational_sampling",
]
__all__ += _estimators.__all__
