"""Layer 6 — scikit-learn estimators: one base class, thin classes choosing link and method."""

from ._base import INTERCEPT_PRIOR_VAR, BayesianGLMClassifier
from .bayesian_monte_carlo import BMCLogisticRegression, BMCProbitRegression
from .expectation_propagation import EPLogisticRegression, EPProbitRegression
from .importance_sampling import ISLogisticRegression, ISProbitRegression
from .laplace import LaplaceLogisticRegression, LaplaceProbitRegression
from .variational_bayes import VBLogisticRegression
from .variational_sampling import VSLogisticRegression, VSProbitRegression

__all__ = [
    "INTERCEPT_PRIOR_VAR",
    "BMCLogisticRegression",
    "BMCProbitRegression",
    "BayesianGLMClassifier",
    "EPLogisticRegression",
    "EPProbitRegression",
    "ISLogisticRegression",
    "ISProbitRegression",
    "LaplaceLogisticRegression",
    "LaplaceProbitRegression",
    "VBLogisticRegression",
    "VSLogisticRegression",
    "VSProbitRegression",
]
