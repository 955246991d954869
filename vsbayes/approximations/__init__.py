"""Layer 5 — approximations specific to the GLM posteriors (Laplace by Newton, EP, VB)."""

from .expectation_propagation import EPResult, expectation_propagation
from .newton_laplace import NewtonLaplaceSolver, glm_laplace
from .softmax_ep import softmax_ep
from .softmax_laplace import softmax_laplace
from .variational_bayes import VBResult, jaakkola_jordan, jaakkola_jordan_row

__all__ = [
    "EPResult",
    "NewtonLaplaceSolver",
    "VBResult",
    "expectation_propagation",
    "glm_laplace",
    "jaakkola_jordan",
    "jaakkola_jordan_row",
    "softmax_ep",
    "softmax_laplace",
]
