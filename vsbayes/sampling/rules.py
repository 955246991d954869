"""Integration rules for the standard normal N(0, I_d).

A rule yields points and log-weights; :mod:`vsbayes.sampling.kernels` maps them through a
Gaussian kernel. Rules are small objects behind one method, so deterministic rules can be
added without touching the engine.
"""

from __future__ import annotations

import abc
import functools
import math

import numpy as np
from scipy.special import ndtri
from scipy.stats import qmc

__all__ = ["GaussHermite", "MonteCarlo", "SamplingRule", "ScrambledSobol", "get_rule"]


class SamplingRule(abc.ABC):
    """Interface of an integration rule for the standard normal distribution.

    Subclasses implement :meth:`standard_normal`. The class attribute ``random`` tells
    whether the points are random and independent, in which case Monte Carlo error
    formulas (such as the VS ``kl_error``) apply as stated.
    """

    random: bool = True
    name: str = "rule"

    @abc.abstractmethod
    def standard_normal(self, n: int, d: int, rng: np.random.Generator):
        """Points and log-weights of the rule.

        Parameters
        ----------
        n : int
            Number of points.
        d : int
            Dimension.
        rng : numpy.random.Generator
            Source of randomness (ignored by deterministic rules).

        Returns
        -------
        points : ndarray of shape (n, d)
            Points for integrating against N(0, I_d).
        log_weights : ndarray of shape (n,)
            Log-weights; ``exp(log_weights)`` sums to 1.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _uniform_log_weights(n: int) -> np.ndarray:
    return np.full(n, -math.log(n))


class MonteCarlo(SamplingRule):
    """Independent draws from N(0, I_d) with equal weights (plain Monte Carlo)."""

    random = True
    name = "mc"

    def standard_normal(self, n, d, rng):
        # Drawn coordinate-major: the engine reads the points one coordinate at a time.
        return rng.standard_normal((d, n)).T, _uniform_log_weights(n)


class ScrambledSobol(SamplingRule):
    """Randomized quasi-Monte Carlo: scrambled Sobol points mapped by the normal quantile.

    Uses :class:`scipy.stats.qmc.Sobol`. Powers of two give balanced point sets; for other
    ``n`` the first ``n`` points of the next power of two are used (still a valid,
    unbiased randomized rule, with slightly less uniformity).
    """

    random = False
    name = "qmc"

    def standard_normal(self, n, d, rng):
        m = max(0, math.ceil(math.log2(n)))
        u = qmc.Sobol(d, scramble=True, rng=rng).random_base2(m)[:n]
        # Scrambled points lie in [0, 1); keep the quantile transform finite.
        tiny = np.finfo(float).eps
        return ndtri(np.clip(u, tiny, 1.0 - tiny)), _uniform_log_weights(n)


@functools.lru_cache(maxsize=32)
def _gauss_hermite_1d(order: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and log-weights of the probabilists' rule (cached: EP asks on every sweep)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(order)
    log_w = np.log(weights) - 0.5 * math.log(2.0 * math.pi)
    nodes.flags.writeable = log_w.flags.writeable = False
    return nodes, log_w


class GaussHermite(SamplingRule):
    """Deterministic Gauss–Hermite rule for N(0, I_d): the tensor product of ``order`` nodes.

    The probabilists' rule with ``order`` nodes integrates ``P(z) N(z; 0, 1)`` exactly for
    polynomials of degree below ``2 · order``, and analytic integrands with geometric
    accuracy. It is meant for small ``d`` (``order**d`` points): the sites of expectation
    propagation, where the tilted distribution of one factor lives in 1 (binary) or K
    (softmax) dimensions.

    Parameters
    ----------
    order : int, default=20
        Nodes per dimension.
    """

    random = False
    name = "gauss-hermite"

    def __init__(self, order: int = 20):
        if int(order) != order or order < 1:
            raise ValueError(f"order must be a positive integer; got {order!r}.")
        self.order = int(order)

    def n_points(self, d: int) -> int:
        """Number of points of the rule in dimension ``d``: ``order**d``."""
        return self.order**d

    def standard_normal(self, n, d, rng=None):
        """The ``order**d`` nodes and log-weights (``n`` must equal :meth:`n_points`)."""
        if n != self.n_points(d):
            raise ValueError(
                f"A Gauss–Hermite rule of order {self.order} has {self.n_points(d)} points in "
                f"dimension {d}; got n={n}."
            )
        nodes, log_w = _gauss_hermite_1d(self.order)
        grids = np.meshgrid(*([nodes] * d), indexing="ij")
        log_grids = np.meshgrid(*([log_w] * d), indexing="ij")
        points = np.stack([g.ravel() for g in grids], axis=1)
        return points, np.sum([g.ravel() for g in log_grids], axis=0)

    def __repr__(self) -> str:
        return f"GaussHermite(order={self.order})"


_RULES = {"mc": MonteCarlo, "qmc": ScrambledSobol}


def get_rule(rule) -> SamplingRule:
    """Resolve ``"mc"``, ``"qmc"`` or a :class:`SamplingRule` instance."""
    if isinstance(rule, SamplingRule):
        return rule
    if isinstance(rule, str) and rule in _RULES:
        return _RULES[rule]()
    raise ValueError(
        f"rule must be one of {sorted(_RULES)} or a SamplingRule instance; got {rule!r}."
    )
