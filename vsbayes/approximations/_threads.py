"""BLAS threads of the GLM approximations: one thread unless an iteration is large."""

from __future__ import annotations

import functools
from collections.abc import Callable

from .._blas import FACTORIZATION_PASS, blas_threads_for
from ..models import BinaryGLMPosterior

__all__ = ["blas_policy"]


def blas_policy(func: Callable) -> Callable:
    """Run ``func(model, ...)`` on one BLAS thread when its iterations are small.

    An iteration of Newton, EP or VB costs about ``M p² + p³`` (the Gram matrix or the
    marginals, and a factorization); see :data:`vsbayes._blas.FACTORIZATION_PASS`.
    """

    @functools.wraps(func)
    def wrapper(model: BinaryGLMPosterior, *args, **kwargs):
        m, p = model.n_observations, model.dim
        with blas_threads_for(m * p * p + p**3, FACTORIZATION_PASS):
            return func(model, *args, **kwargs)

    return wrapper
