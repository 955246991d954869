"""Layer 5 — approximations specific to the GLM posteriors (Laplace by Newton, EP, VB)."""

from .newton_laplace import NewtonLaplaceSolver, glm_laplace
from .variational_bayes import VBResult, jaakkola_jordan

__all__ = ["NewtonLaplaceSolver", "VBResult", "glm_laplace", "jaakkola_jordan"]
