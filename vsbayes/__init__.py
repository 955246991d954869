"""vsbayes — Bayesian inference by variational sampling."""

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
from .estimators import (
    BMCLogisticRegression,
    BMCProbitRegression,
    EPLogisticRegression,
    EPProbitRegression,
    ISLogisticRegression,
    ISProbitRegression,
    LaplaceLogisticRegression,
    LaplaceProbitRegression,
    VBLogisticRegression,
    VSLogisticRegression,
    VSProbitRegression,
)
from .gaussian import Gaussian, excess_kl, kl_divergence

__all__ = [
    "BMCLogisticRegression",
    "BMCProbitRegression",
    "BMCResult",
    "EPLogisticRegression",
    "EPProbitRegression",
    "Gaussian",
    "ISLogisticRegression",
    "ISProbitRegression",
    "ISResult",
    "LaplaceLogisticRegression",
    "LaplaceProbitRegression",
    "LaplaceResult",
    "VBLogisticRegression",
    "VSLogisticRegression",
    "VSProbitRegression",
    "VSResult",
    "__version__",
    "bayesian_monte_carlo",
    "excess_kl",
    "importance_sampling",
    "kl_divergence",
    "laplace",
    "n_family_params",
    "variational_sampling",
]
