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

__all__ = [
    "GaussHermite",
    "MonteCarlo",
    "SamplingRule",
    "ScrambledSobol",
    "SymmetricSobol",
    "get_rule",
    "sobol_normal_points",
    "symmetric_sobol_nodes",
]


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


#: Fixed scrambling of the deterministic Sobol rules (:func:`symmetric_sobol_nodes`).
SOBOL_SEED = 20130125


@functools.lru_cache(maxsize=64)
def symmetric_sobol_nodes(dim: int, n_nodes: int = 4096, seed=SOBOL_SEED) -> np.ndarray:
    """Equal-weight nodes (n_nodes, dim) for N(0, I_dim): scrambled Sobol points (scrambling
    from ``seed``) with their mirror images, whitened to mean 0 and second moment I exactly
    (read-only, cached).

    The rule integrates every polynomial of degree ≤ 3 exactly (odd ones by symmetry, the
    second moments by the whitening).
    """
    z = sobol_normal_points(dim, n_nodes // 2, seed)
    z = np.vstack([z, -z])
    second = z.T @ z / len(z)
    z = np.linalg.solve(np.linalg.cholesky(second), z.T).T
    z.flags.writeable = False
    return z


def sobol_normal_points(dim: int, n_points: int, seed=SOBOL_SEED) -> np.ndarray:
    """The normal quantiles (n_points, dim) of the first ``n_points`` points of the Sobol
    sequence scrambled from ``seed``: for every n, the first n of them are the same points
    (a rule refined by the next points keeps those it has summed), and
    :func:`symmetric_sobol_nodes` takes the first ``n_nodes / 2`` of them."""
    u = qmc.Sobol(dim, scramble=True, rng=np.random.default_rng(seed)).random_base2(
        max(0, math.ceil(math.log2(n_points)))
    )[:n_points]
    tiny = np.finfo(float).eps
    return ndtri(np.clip(u, tiny, 1.0 - tiny))


class SymmetricSobol(SamplingRule):
    """Deterministic quasi-Monte Carlo rule for N(0, I_d): :func:`symmetric_sobol_nodes`.

    A fixed scrambling (``seed``) makes the rule deterministic; the points come with their
    mirror images and are whitened, so that the rule is exact for polynomials of degree
    ≤ 3. Meant for the K-dimensional sites of the softmax (too many dimensions for a
    tensor Gauss–Hermite rule), where VS fits the quadratic family's ``(d + 1)(d + 2)/2``
    parameters on :meth:`n_points` nodes.

    Parameters
    ----------
    points_per_param : int, default=4
        Nodes per parameter of the full quadratic family in dimension d: ``n_points(d)`` is
        the power of two at or above ``points_per_param · (d + 1)(d + 2)/2`` and
        ``min_points``.
    min_points : int, default=256
        Fewest nodes in any dimension (small dimensions cost little, and fewer nodes fit a
        non-Gaussian tilted density coarsely: on 2-dimensional softmax sites, 32 nodes left
        EP's moments 3 times as far from exact EP's as 512).
    seed : int, default=SOBOL_SEED
        Scrambling of the Sobol sequence.
    """

    random = False
    name = "symmetric-sobol"

    def __init__(self, points_per_param: int = 4, min_points: int = 256, seed: int = SOBOL_SEED):
        for name, value in (("points_per_param", points_per_param), ("min_points", min_points)):
            if int(value) != value or value < 2:
                raise ValueError(f"{name} must be an integer ≥ 2; got {value!r}.")
        self.points_per_param = int(points_per_param)
        self.min_points = int(min_points)
        self.seed = seed

    def n_points(self, d: int) -> int:
        """Number of points of the rule in dimension ``d`` (a power of two)."""
        wanted = max(self.min_points, self.points_per_param * (d + 1) * (d + 2) // 2)
        return 1 << math.ceil(math.log2(wanted))

    def standard_normal(self, n, d, rng=None):
        """The ``n`` nodes (``n`` even) and equal log-weights; ``rng`` is ignored."""
        if n < 2 or n % 2:
            raise ValueError(f"A symmetric rule needs an even number of points; got n={n}.")
        return symmetric_sobol_nodes(d, n, self.seed), _uniform_log_weights(n)

    def __repr__(self) -> str:
        return (
            f"SymmetricSobol(points_per_param={self.points_per_param}, "
            f"min_points={self.min_points}, seed={self.seed!r})"
        )


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
