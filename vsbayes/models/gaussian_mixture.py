"""Mixtures of isotropic normals: the paper's simulated targets (section 4.1)."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import softmax

from .._memory import block_length
from .._random import as_generator
from .._sums import logsumexp
from ..gaussian import Gaussian

__all__ = ["GaussianMixtureTarget"]


class GaussianMixtureTarget:
    """Equal-weight mixture ``p(x) = (1/K) Σ_i N(x; μ_i, σ² I)``.

    Parameters
    ----------
    means : array-like of shape (K, d)
        Component centers μ_i.
    sd : float, default=1.0
        Common standard deviation σ of the components.

    Notes
    -----
    The mixture is a normalized density (``Z = 1``). Its moment-matched Gaussian
    :meth:`moment_matched` is the exact VS limit ``q*``, so the error of any estimate can be
    measured exactly with :func:`vsbayes.excess_kl`.
    """

    def __init__(self, means, sd: float = 1.0):
        self.means = np.array(means, dtype=float, ndmin=2)
        self.sd = float(sd)
        self._sq_means = np.square(self.means).sum(axis=1)

    @classmethod
    def paper(cls, dim: int, delta: float, n_components: int = 100, random_state=None):
        """The paper's target: centers drawn iid from ``N(0, δ²/d I)``, unit components.

        ``δ²`` is the mean squared distance of a center from the origin and controls how far
        the mixture is from Gaussian.
        """
        rng = as_generator(random_state)
        means = rng.normal(scale=delta / math.sqrt(dim), size=(n_components, dim))
        return cls(means, 1.0)

    @property
    def dim(self) -> int:
        """Dimension d."""
        return self.means.shape[1]

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Log-density at the rows of x, shape (N, d) -> (N,)."""
        x = np.atleast_2d(np.asarray(x, dtype=float))
        k, d = self.means.shape
        const = -math.log(k) - 0.5 * d * math.log(2 * math.pi * self.sd**2)
        out = np.empty(x.shape[0])
        block = block_length(16.0 * k)  # the distances and their exponentials
        for start in range(0, x.shape[0], block):
            xb = x[start : start + block]
            sq = np.square(xb).sum(axis=1)[:, None] - 2.0 * xb @ self.means.T + self._sq_means
            out[start : start + block] = logsumexp(-0.5 * sq / self.sd**2, axis=1) + const
        return out

    __call__ = log_density

    def _responsibilities(self, x):
        diff = self.means - x
        return softmax(-0.5 * np.square(diff).sum(axis=1) / self.sd**2), diff

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """Gradient of the log-density at one point x of shape (d,)."""
        r, diff = self._responsibilities(np.asarray(x, dtype=float))
        return (r @ diff) / self.sd**2

    def hessian(self, x: np.ndarray) -> np.ndarray:
        """Hessian of the log-density at one point x of shape (d,)."""
        r, diff = self._responsibilities(np.asarray(x, dtype=float))
        s2 = self.sd**2
        g = (r @ diff) / s2
        second = (diff * r[:, None]).T @ diff / (s2 * s2)
        return second - np.outer(g, g) - np.eye(self.dim) / s2

    def moment_matched(self) -> Gaussian:
        """The Gaussian with the mixture's mass (1), mean and covariance: the VS limit q*."""
        mean = self.means.mean(axis=0)
        centered = self.means - mean
        cov = self.sd**2 * np.eye(self.dim) + centered.T @ centered / self.means.shape[0]
        return Gaussian(mean, cov, 0.0)
