"""BLAS threads of the GLM approximations: one thread unless an iteration is large."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager

from .._blas import FACTORIZATION_PASS, blas_threads_for
from ..models import BinaryGLMPosterior

__all__ = ["blas_policy", "blas_threads_of"]


def blas_policy(func: Callable) -> Callable:
    """Run ``func(model, ...)`` on one BLAS thread when its iterations are small.

    An iteration of Newton, EP or VB costs about ``M p² + p³`` (the Gram matrix or the
    marginals, and a factorization); see :data:`vsbayes._blas.FACTORIZATION_PASS`.
    """

    @functools.wraps(func)
    def wrapper(model: BinaryGLMPosterior, *args, **kwargs):
        with blas_threads_of(model):
            return func(model, *args, **kwargs)

    return wrapper


def blas_threads_of(model: BinaryGLMPosterior) -> AbstractContextManager:
    """The BLAS threads of one iteration on ``model`` (``M p² + p³``), as a context."""
    m, p = model.n_observations, model.dim
    return blas_threads_for(m * p * p + p**3, FACTORIZATION_PASS)
