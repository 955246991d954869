"""The tilted moments' rule of the multinomial EP's sites: the default rule's node count in
r = K − 1 dimensions (:func:`_DEFAULT_NODES`), its levels (:func:`_n_levels`,
:func:`_rule_size`) and their nodes and log-weights (:func:`_rule_nodes`), and the
narrowing beyond which a row takes its nodes' own moments (:data:`_DIRECT`), and the
number of classes from which the sweeps take the coarse level and the cavities' moments
from one solve (:func:`_many_classes`).

Read by the general site updates (:mod:`~vsbayes.approximations.softmax_sites` and the
modules it is made of), by their three-class closed forms
(:mod:`~vsbayes.approximations._three_class_sites`), which the general modules call and so
cannot import from, and by the one-row update's sizing
(:mod:`~vsbayes.approximations.softmax_ep`).
"""

from __future__ import annotations

import math

import numpy as np

from ..sampling import SamplingRule, SymmetricSobol
from ..sampling.rules import SOBOL_SEED, symmetric_sobol_nodes

#: Rows whose cavity the factor narrows by more than this fraction of a variance, in some
#: direction (the largest eigenvalue of Σ H), take the nodes' own tilted moments.
_DIRECT = 0.5


def _rule_size(rule: SamplingRule | None, r: int) -> int:
    """Nodes of the tilted moments' rule at level 0 in r dimensions."""
    return _DEFAULT_NODES(r) if rule is None else rule.n_points(r)


def _n_levels(rule: SamplingRule | None) -> int:
    return 3 if rule is None or isinstance(rule, SymmetricSobol) else 1


def _DEFAULT_NODES(r: int) -> int:
    """Nodes of the default rule of the tilted moments in r dimensions: 8 per dimension, at
    least 128, a power of two (the moments are expectations of the smooth softmax: they need
    no node per parameter of a quadratic fit)."""
    wanted = max(_MIN_NODES, 8 * (r + 1))
    return 1 << math.ceil(math.log2(wanted))


_MIN_NODES = 128


def _rule_nodes(
    rule: SamplingRule | None, r: int, level: int, coarse: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (P, r) and log-weights of the site rule at ``level`` (0, 1, 2: 1, 4, 16 times the
    nodes of level 0; a rule other than :class:`SymmetricSobol` has level 0 only); the
    default rule's ``coarse`` level 0 has a quarter of its nodes
    (:func:`~vsbayes.approximations._softmax_tilted_moments._spread_levels`)."""
    if rule is None:
        n = _DEFAULT_NODES(r) << (2 * level)
        if coarse:
            n >>= 2
        return symmetric_sobol_nodes(r, n, SOBOL_SEED), np.full(n, -math.log(n))
    if isinstance(rule, SymmetricSobol):
        n = rule.n_points(r) << (2 * level)
        return rule.standard_normal(n, r, None)
    return rule.standard_normal(rule.n_points(r), r, None)


#: The coarse level only where the default rule has at least this many nodes (r ≥ 16,
#: where it is sized to the dimension, 8 nodes per dimension): a quarter of it is then at
#: least 2(r + 1) nodes (:func:`_many_classes`).
_COARSE_MIN_NODES = 256


def _many_classes(r: int) -> bool:
    """Whether the sweeps in r = K − 1 dimensions take the coarse level (narrow rows) and
    the cavities' moments from one solve: where the default rule is sized to the dimension
    (see _COARSE_MIN_NODES), r ≥ 16, and the rows' (r × r) factorizations and nodes are most
    of a sweep. Below, the sweeps are cheap, and their numbers stay as they were."""
    return _DEFAULT_NODES(r) >= _COARSE_MIN_NODES
