"""Layer 4 — log-density models (the likelihoods of the estimators, and test targets)."""

from .chunked import ChunkedPosterior, ChunkedSoftmaxPosterior
from .gaussian_mixture import GaussianMixtureTarget
from .glm import BinaryGLMPosterior
from .links import LogisticLink, ProbitLink, get_link
from .predictive import logistic_predictive_log_proba
from .probit_predictive import probit_predictive_log_proba
from .shrinkage_priors import HorseshoePrior, LaplacePrior, StudentTPrior
from .softmax import SoftmaxGLMPosterior
from .softmax_predictive import softmax_predictive_log_proba

__all__ = [
    "BinaryGLMPosterior",
    "ChunkedPosterior",
    "ChunkedSoftmaxPosterior",
    "GaussianMixtureTarget",
    "HorseshoePrior",
    "LaplacePrior",
    "LogisticLink",
    "ProbitLink",
    "SoftmaxGLMPosterior",
    "StudentTPrior",
    "get_link",
    "logistic_predictive_log_proba",
    "probit_predictive_log_proba",
    "softmax_predictive_log_proba",
]
