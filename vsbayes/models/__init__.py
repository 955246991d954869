"""Layer 4 — log-density models (the likelihoods of the estimators, and test targets)."""

from .gaussian_mixture import GaussianMixtureTarget

__all__ = ["GaussianMixtureTarget"]
