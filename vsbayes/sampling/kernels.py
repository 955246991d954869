"""Draws through Gaussian kernels."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..gaussian import Gaussian
from .rules import SamplingRule

__all__ = ["KernelDraws", "draw_from_kernel"]


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
