"""Layer 5 — approximations specific to the GLM posteriors (Laplace by Newton, EP, VB)."""

from .newton_laplace import NewtonLaplaceSolver, glm_laplace

__all__ = ["NewtonLaplaceSolver", "glm_laplace"]
