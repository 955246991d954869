"""BLAS threads of the GLM approximations (Newton, EP, VB): one, as every fit."""

from __future__ import annotations

from .._blas import one_blas_thread

__all__ = ["blas_policy"]

#: Run ``func(model, ...)`` on one BLAS thread, its blocks side by side (see
#: :mod:`vsbayes._blas`).
blas_policy = one_blas_thread
