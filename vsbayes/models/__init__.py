"""Layer 4 — log-density models (the likelihoods of the estimators, and test targets)."""

from .gaussian_mixture import GaussianMixtureTarget
from .glm import BinaryGLMPosterior
from .links import LogisticLink, ProbitLink, get_link
from .predictive import logistic_predictive_log_proba, probit_predictive_log_proba

__all__ = [
    "BinaryGLMPosterior",
    "GaussianMixtureTarget",
    "LogisticLink",
    "ProbitLink",
    "get_link",
    "logistic_predictive_log_proba",
    "probit_predictive_log_proba",
]
