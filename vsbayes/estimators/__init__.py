"""Layer 6 — scikit-learn estimators: one base class, thin classes choosing link and method."""

from ._base import INTERCEPT_PRIOR_VAR, BayesianGLMClassifier
from .laplace import LaplaceLogisticRegression, LaplaceProbitRegression
from .variational_sampling import VSLogisticRegression, VSProbitRegression

__all__ = [
    "INTERCEPT_PRIOR_VAR",
    "BayesianGLMClassifier",
    "LaplaceLogisticRegression",
    "LaplaceProbitRegression",
    "VSLogisticRegression",
    "VSProbitRegression",
]
