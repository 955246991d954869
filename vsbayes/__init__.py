"""vsbayes — Bayesian inference by variational sampling.

The public names are imported on first use (PEP 562): the package itself imports only its
version, so that ``vsbayes.cli`` (the ``vsbayes`` command) can answer ``--help``,
``--version`` and usage errors before numpy, SciPy and scikit-learn load, which takes over
a second. ``from vsbayes import VSLogisticRegression``, ``vsbayes.models`` and
``from vsbayes import *`` import what they name, as before.
"""

import importlib as _importlib
from typing import TYPE_CHECKING

from ._version import __version__

# Each public name -> the submodule that defines it (tests/test_registry.py checks that the
# estimators' names are vsbayes.estimators.__all__).
_SOURCES = {
    **dict.fromkeys(["config_context", "get_config", "set_config"], "_memory"),
    **dict.fromkeys(
        [
            "BMCResult",
            "ISResult",
            "LaplaceResult",
            "VSResult",
            "bayesian_monte_carlo",
            "importance_sampling",
            "laplace",
            "n_family_params",
            "variational_sampling",
        ],
        "engine",
    ),
    **dict.fromkeys(
        [
            "CentredStructuredCovariance",
            "Gaussian",
            "StructuredCovariance",
            "StructuredCovariances",
            "StructuredGaussian",
            "excess_kl",
            "kl_divergence",
        ],
        "gaussian",
    ),
    **dict.fromkeys(["HorseshoePrior", "LaplacePrior", "StudentTPrior"], "models"),
    # The estimators and their registry.
    **dict.fromkeys(
        [
            "ESTIMATORS",
            "INTERCEPT_PRIOR_VAR",
            "LINKS",
            "METHODS",
            "BMCLogisticRegression",
            "BMCProbitRegression",
            "BayesianGLMClassifier",
            "EPLogisticRegression",
            "EPProbitRegression",
            "EmpiricalBayesClassifier",
            "ISLogisticRegression",
            "ISProbitRegression",
            "LaplaceLogisticRegression",
            "LaplaceProbitRegression",
            "LeaveOneOut",
            "Method",
            "VBLogisticRegression",
            "VSLogisticRegression",
            "VSProbitRegression",
            "estimator_class",
        ],
        "estimators",
    ),
}

__all__ = ["__version__", *_SOURCES]

if TYPE_CHECKING:  # static tools (type checkers, editors) see the names; nothing runs
    # (tests/test_registry.py checks these imports are the table's)
    from ._memory import config_context, get_config, set_config
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
        ESTIMATORS,
        INTERCEPT_PRIOR_VAR,
        LINKS,
        METHODS,
        BayesianGLMClassifier,
        BMCLogisticRegression,
        BMCProbitRegression,
        EmpiricalBayesClassifier,
        EPLogisticRegression,
        EPProbitRegression,
        ISLogisticRegression,
        ISProbitRegression,
        LaplaceLogisticRegression,
        LaplaceProbitRegression,
        LeaveOneOut,
        Method,
        VBLogisticRegression,
        VSLogisticRegression,
        VSProbitRegression,
        estimator_class,
    )
    from .gaussian import (
        CentredStructuredCovariance,
        Gaussian,
        StructuredCovariance,
        StructuredCovariances,
        StructuredGaussian,
        excess_kl,
        kl_divergence,
    )
    from .models import HorseshoePrior, LaplacePrior, StudentTPrior


def __getattr__(name: str):
    """The public name ``name``, or the submodule ``vsbayes.name``, imported now."""
    if name in _SOURCES:
        value = getattr(_importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
    elif name.startswith("__") or not name.isidentifier():  # e.g. __wrapped__: no submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        # ``import vsbayes; vsbayes.models.…``: the submodules the eager package had loaded.
        try:
            value = _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value  # once: later reads find it without calling this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
