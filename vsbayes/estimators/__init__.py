"""Layer 6 — scikit-learn estimators: one base class, thin classes choosing link and method.

The classes imported here are the package's estimators: :data:`ESTIMATORS` and the
registry :data:`METHODS` (method → traits and class per link) are derived from them.
"""

from ._base import INTERCEPT_PRIOR_VAR, BayesianGLMClassifier
from ._leave_one_out import LeaveOneOut
from ._registry import LINKS, Method, methods_of
from .bayesian_monte_carlo import BMCLogisticRegression, BMCProbitRegression
from .empirical_bayes import EmpiricalBayesClassifier
from .expectation_propagation import EPLogisticRegression, EPProbitRegression
from .importance_sampling import ISLogisticRegression, ISProbitRegression
from .laplace import LaplaceLogisticRegression, LaplaceProbitRegression
from .variational_bayes import VBLogisticRegression
from .variational_sampling import VSLogisticRegression, VSProbitRegression

#: Every method, by short name.
METHODS: dict[str, Method] = methods_of(globals().values())
#: Every public estimator class.
ESTIMATORS: tuple[type[BayesianGLMClassifier], ...] = tuple(
    cls for method in METHODS.values() for cls in method.classes.values()
)


def estimator_class(method: str, link: str) -> type[BayesianGLMClassifier]:
    """The estimator class of ``method`` (a key of :data:`METHODS`) with ``link``.

    Raises
    ------
    ValueError
        For an unknown method or link, or a method without that link (VB is logistic only).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}.")
    return METHODS[method].estimator_class(link)


__all__ = [
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
]
