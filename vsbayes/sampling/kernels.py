"""Draws through Gaussian kernels, and the density of the window they define."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import logsumexp

from ..gaussian import Gaussian
from .rules import SamplingRule

__all__ = ["KernelDraws", "draw_from_kernel", "mixture_log_density"]


class KernelDraws(NamedTuple):
    """Points drawn through a kernel.

    Attributes
    ----------
    x : ndarray of shape (n, d)
        Points in the target's coordinates.
    z : ndarray of shape (n, d)
        The same points in the kernel's whitened coordinates (``x = mean + z @ chol.T``).
    log_weights : ndarray of shape (n,)
        Log-weights of the rule (``exp`` sums to 1).
    """

    x: np.ndarray
    z: np.ndarray
    log_weights: np.ndarray


def draw_from_kernel(
    kernel: Gaussian, n: int, rule: SamplingRule, rng: np.random.Generator
) -> KernelDraws:
    """Draw ``n`` points of ``rule`` through the Gaussian ``kernel`` (affine map by Cholesky)."""
    z, log_w = rule.standard_normal(n, kernel.dim, rng)
    return KernelDraws(kernel.unwhiten(z), z, log_w)


def mixture_log_density(kernels, proportions, x: np.ndarray) -> np.ndarray:
    """Log-density at rows of ``x`` of the mixture ``Σ_r proportions[r] N(kernels[r])``.

    The kernels' ``log_Z`` is ignored: each component is a normalized density.
    """
    if len(kernels) == 1:
        return kernels[0].logpdf(x)
    terms = np.stack([k.logpdf(x) for k in kernels])
    return logsumexp(terms, axis=0, b=np.asarray(proportions, dtype=float)[:, None])
