"""The softmax predictive's node sets and deterministic rules.

What :mod:`vsbayes.models.softmax_predictive` places its nodes with, and the sums over
them whose error needs no replicates: the centred basis Q; the tensor trapezoid rules
(three classes), Stroud's degree-5 rule and the tensor Gauss–Hermite rules (narrow rows),
the sparse grids of degree 7 and 9 (rows just wider, five classes or more), with the
spreads up to which each is used; the anisotropic grid of 13 to 23 classes, with its
embedded rule (its estimate), and the turn of each row to its curvature directions that it
is placed in; the replicates' scrambled Sobol nodes of the adaptive QMC rule
(:mod:`vsbayes.models.softmax_predictive_qmc`) and of ``argmax_only``'s screen; the
weighted averages of the softmax over a deterministic rule's nodes (log sums, or linear
sums for signed weights); and the blocks of rows and the Cholesky factors that every rule
shares. The rules' sizes and measured errors are in
:mod:`vsbayes.models.softmax_predictive`'s docstring.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from ..sampling.rules import SOBOL_SEED, sobol_normal_points, symmetric_sobol_nodes

__all__ = [
    "N_NODES",
    "anisotropic_grid_nodes",
    "centred_basis",
    "gauss_hermite_nodes",
    "replicate_nodes",
    "screen_nodes",
    "sparse_grid_nodes",
    "stroud_nodes",
]

#: Nodes of the three-class trapezoid rule (64 × 64).
N_NODES = 4096
#: Independently scrambled replicates per level (the standard error's degrees of freedom + 1).
REPLICATES = 8
#: Nodes per replicate at the first level; 2048 at the second, then twice as many at each
#: level up to 32,768 (262,144 in all).
_FIRST_NODES = 512
_LEVELS = 6
#: Nodes per replicate of ``argmax_only``'s screen, before the first level.
_SCREEN_NODES = 64
_SEED = SOBOL_SEED  # fixed scrambling: the rule is deterministic
#: Dimensions (K − 1) up to which the tensor trapezoid rule is used.
TRAPEZOID_MAX_DIM = 2
#: (nodes per axis, largest variance of the centred latent in any direction, i.e. the
#: largest eigenvalue of Qᵀ S Q) of the trapezoid rules, narrowest first; wider rows take
#: the adaptive rule.
TRAPEZOID_LEVELS = ((20, 0.3), (32, 1.0), (48, 3.0), (64, 40.0))
TRAPEZOID_MAX_VAR = TRAPEZOID_LEVELS[-1][1]
_HALF_WIDTH = 7.0
#: Largest trace of a row's centred latent covariance that the degree-5 rule takes (its
#: error, ≤ 0.02 · trace³ measured, is below 1.1e-5 there).
STROUD_MAX_TRACE = 0.08
#: Dimensions (K − 1) up to which tensor Gauss–Hermite rules take the rows just wider.
GAUSS_HERMITE_MAX_DIM = 3
#: (nodes per axis, largest trace) of the tensor Gauss–Hermite rules, narrowest first.
GAUSS_HERMITE_LEVELS = ((6, 0.3), (8, 1.0), (16, 2.0))
#: (degree, largest trace, largest dimension K − 1) of the sparse-grid rules
#: (:func:`sparse_grid_nodes`) that take the rows of K ≥ 5 classes just wider than the
#: degree-5 rule's, cheapest first; a row goes to the first whose trace and dimension
#: cover it, the others to the adaptive rule. Each level's largest error measured on 600
#: random five-class rows is 1e-5 to 2e-5 at its largest trace (99th percentile ~4e-6; the
#: tail steepens beyond), and its nodes cost less than the adaptive rule's first 4096 up
#: to its largest dimension (D-195).
SPARSE_GRID_LEVELS = ((7, 0.3, 11), (9, 0.6, 7))
#: Dimensions (K − 1) of the anisotropic grid (:func:`anisotropic_grid_nodes`; D-204): from
#: where the sparse grids stop to where its nodes reach a quarter of the adaptive rule's
#: first 4096 (995 nodes at 22).
ANISOTROPIC_GRID_DIMS = (12, 22)
#: Largest trace of a row's centred latent covariance for which the anisotropic grid is
#: tried (a cost bound: wider rows seldom meet its estimate and take the adaptive rule).
ANISOTROPIC_GRID_MAX_TRACE = 1.5
#: Largest estimated error (the grid's value less its embedded rule's, on any class) at
#: which a row keeps the anisotropic grid's value. The estimate bounds the error on every
#: row measured (error / estimate ≤ 0.87 at errors of 2e-8, ≤ 0.08 where the estimate is
#: above 2e-5: D-204, D-226), so a kept row errs by less than 5e-5, half the predictive's
#: 1e-4 target: a factor 2 kept for an estimate below its error, never seen.
ANISOTROPIC_GRID_ESTIMATE = 5e-5
#: Leading directions of the anisotropic grid (degree 7 among them).
_GRID_LEADING = 3
# Largest latent value below which float64's exponentials of K ≤ 10^6 classes cannot
# overflow (e^709.8 is float64's largest); with a margin.
_NO_SHIFT_FLOAT64 = 600.0
# Smallest average kept in float64's linear domain; rows with a smaller one take log sums.
_FLOAT64_FLOOR = 1e-280
# Latent values (float32) per block at most, whatever the memory allows: the block stays
# near the processor's caches (digits, 4096 nodes: 2^18 to 2^22 within 15 % of each other).
_CACHE_ENTRIES = 2**20
# Latent values (float64) per block of the deterministic rules' linear sums, whose block
# holds 2K + 1 arrays of as many entries: 2^17 keeps them near the caches (three classes on
# 4096 nodes 1.5× faster than at 2^20, 3000 rows of 4 to 15 classes on the narrower rules
# 1.1-1.7×; the same bits, each row's sums being its own, D-212).
_RULE_ENTRIES = 2**17


@functools.lru_cache(maxsize=64)
def centred_basis(k: int) -> np.ndarray:
    """An orthonormal basis (K, K − 1) of the vectors whose entries sum to zero (read-only,
    cached: a multinomial fit or prediction asks for it several times, ~0.2 ms a QR)."""
    # Householder-free: QR of the first K − 1 columns of the centring matrix.
    centring = np.eye(k) - 1.0 / k
    q, _ = np.linalg.qr(centring[:, : k - 1])
    q.flags.writeable = False
    return q


def _half_nodes(dim: int, n_nodes: int, seed) -> np.ndarray:
    """The first half (n_nodes / 2, dim) of a replicate's ``n_nodes`` symmetric nodes:
    :func:`symmetric_sobol_nodes`' whitened ones where their n_nodes / 2 directions can
    span the dim dimensions, else the Sobol sequence's first n_nodes / 2 points as they
    are. Beyond n_nodes / 2 dimensions (the screen's 32: 34 classes or more; level 0's
    256) the mirrored points' second moment is singular and cannot be whitened; unwhitened,
    each replicate's average stays unbiased, and the replicates' spread still measures its
    error."""
    if dim <= n_nodes // 2:
        return symmetric_sobol_nodes(dim, n_nodes, seed)[: n_nodes // 2]
    return sobol_normal_points(dim, n_nodes // 2, seed)


@functools.lru_cache(maxsize=64)
def replicate_nodes(dim: int, level: int) -> np.ndarray:
    """The first halves of the nodes that ``level`` adds to each replicate, float32
    (dim, REPLICATES, n / 2): each replicate's new nodes are these and their negatives
    (read-only, cached).

    Level 0: the replicate's 512 nodes of :func:`symmetric_sobol_nodes` (whitened up to
    256 dimensions: :func:`_half_nodes`). Level 1: the first 1024 points of the
    replicate's Sobol sequence (:func:`~vsbayes.sampling.rules.sobol_normal_points`), not
    whitened; each level l ≥ 2 the next 1024 · 2^(l − 2), so that up to level l ≥ 1 the
    replicate's 1024 · 2^l nodes are the sequence's first points and their mirror images
    (see :mod:`vsbayes.models.softmax_predictive`).
    """
    if level == 0:
        halves = [_half_nodes(dim, _FIRST_NODES, (_SEED, 0, r)) for r in range(REPLICATES)]
    else:
        end = 2 * _FIRST_NODES * 2 ** (level - 1)
        first = 0 if level == 1 else end // 2
        halves = [sobol_normal_points(dim, end, (_SEED, 0, r))[first:] for r in range(REPLICATES)]
    z = np.ascontiguousarray(np.stack(halves, axis=1).transpose(2, 1, 0), dtype=np.float32)
    z.flags.writeable = False
    return z


@functools.lru_cache(maxsize=16)
def screen_nodes(dim: int) -> np.ndarray:
    """The first halves of the screen's nodes (dim, REPLICATES, 32), float32: each
    replicate's :func:`symmetric_sobol_nodes` of 64 (the first 32 points of the
    replicate's Sobol sequence, whitened up to 32 dimensions: :func:`_half_nodes`) for
    ``argmax_only`` (read-only, cached)."""
    halves = [_half_nodes(dim, _SCREEN_NODES, (_SEED, 0, r)) for r in range(REPLICATES)]
    z = np.ascontiguousarray(np.stack(halves, axis=1).transpose(2, 1, 0), dtype=np.float32)
    z.flags.writeable = False
    return z


@functools.lru_cache(maxsize=16)
def trapezoid_nodes(dim: int, n_nodes: int = N_NODES) -> tuple[np.ndarray, np.ndarray]:
    """Tensor trapezoid rule for N(0, I_dim): ``r = ⌊n_nodes^(1/dim)⌋`` equally spaced nodes
    per axis over ±7, weights ∝ the normal density, normalized; the nodes and the log
    weights (read-only, cached)."""
    t = _trapezoid_axis(dim, n_nodes)
    grids = np.meshgrid(*([t] * dim), indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=1)
    log_w = np.log(trapezoid_weights(dim, n_nodes))
    nodes.flags.writeable = log_w.flags.writeable = False
    return nodes, log_w


@functools.lru_cache(maxsize=16)
def trapezoid_weights(dim: int, n_nodes: int = N_NODES) -> np.ndarray:
    """The weights of :func:`trapezoid_nodes`' rule themselves, for the sums in the linear
    domain (read-only, cached)."""
    t = _trapezoid_axis(dim, n_nodes)
    w = np.exp(-0.5 * t * t)
    w /= w.sum()
    weights = np.prod(np.meshgrid(*([w] * dim), indexing="ij"), axis=0).ravel()
    weights.flags.writeable = False
    return weights


def _trapezoid_axis(dim: int, n_nodes: int) -> np.ndarray:
    """The trapezoid rule's ``⌊n_nodes^(1/dim)⌋`` nodes on each axis, over ±7."""
    return np.linspace(-_HALF_WIDTH, _HALF_WIDTH, math.floor(n_nodes ** (1.0 / dim) + 1e-9))


@functools.lru_cache(maxsize=16)
def stroud_nodes(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Stroud's degree-5 rule for N(0, I_dim): nodes 0, ±√3 e_i and ±√3 e_i ± √3 e_j
    (``2 dim² + 1``), weights ``(dim² − 7 dim + 18)/18``, ``(4 − dim)/18`` and ``1/36``
    (signed: negative on the axes beyond four dimensions; read-only, cached)."""
    a = math.sqrt(3.0)
    axes = np.eye(dim)
    pairs = [
        a * (si * axes[i] + sj * axes[j])
        for i in range(dim)
        for j in range(i + 1, dim)
        for si in (1.0, -1.0)
        for sj in (1.0, -1.0)
    ]
    nodes = np.vstack(
        [np.zeros((1, dim)), a * axes, -a * axes, *([np.array(pairs)] if pairs else [])]
    )
    weights = np.concatenate(
        [
            [(dim * dim - 7 * dim + 18) / 18.0],
            np.full(2 * dim, (4 - dim) / 18.0),
            np.full(len(pairs), 1.0 / 36.0),
        ]
    )
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


@functools.lru_cache(maxsize=16)
def gauss_hermite_nodes(dim: int, per_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Tensor Gauss–Hermite rule for N(0, I_dim), ``per_axis^dim`` nodes, exact for
    polynomials of degree ≤ ``2 per_axis − 1`` in each variable (read-only, cached)."""
    t, w = np.polynomial.hermite_e.hermegauss(per_axis)
    w = w / w.sum()
    grids = np.meshgrid(*([t] * dim), indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=1)
    weights = np.prod(np.meshgrid(*([w] * dim), indexing="ij"), axis=0).ravel()
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


@functools.lru_cache(maxsize=4)
def _genz_keister_points() -> tuple[np.ndarray, np.ndarray]:
    """The nested Gauss–Hermite–Kronrod (Genz–Keister) rules for N(0, 1): the points (9,),
    0, ±√3 (the 1- and 3-point rules, nested) and the six of their 9-point extension, and
    the 9-point rule's weights (9,).

    The 9-point rule adds to the 3-point Gauss–Hermite rule the roots of the even sextic
    E orthogonal, with the weight ``x (x² − 3)``, to every polynomial of degree ≤ 5 (its
    three odd moments' conditions): exact to degree 15.
    """

    def moment(n: int) -> float:  # E[x^n] for x ~ N(0, 1)
        return 0.0 if n % 2 else float(math.prod(range(n - 1, 0, -2)))

    # E = x⁶ + e₄ x⁴ + e₂ x² + e₀ with E[x (x² − 3) E(x) x^j] = 0, j = 1, 3, 5.
    def product(j: int, power: int) -> float:
        return moment(3 + j + power) - 3.0 * moment(1 + j + power)

    lhs = np.array([[product(j, 4), product(j, 2), product(j, 0)] for j in (1, 3, 5)])
    rhs = -np.array([product(j, 6) for j in (1, 3, 5)])
    squares = np.sort(np.roots(np.concatenate([[1.0], np.linalg.solve(lhs, rhs)])).real)
    positive = np.concatenate([[math.sqrt(3.0)], np.sqrt(squares)])
    points = np.concatenate([[0.0], np.stack([positive, -positive], axis=1).ravel()])
    # Weights of 0 and of each ± pair from the even moments up to 8 (the odd ones vanish).
    distinct = np.concatenate([[0.0], positive])
    counts = np.where(distinct == 0.0, 1.0, 2.0)
    system = np.stack([counts * distinct ** (2 * j) for j in range(5)])
    half = np.linalg.solve(system, [moment(2 * j) for j in range(5)])
    weights = np.concatenate([[half[0]], np.repeat(half[1:], 2)])
    return points, weights


def _genz_keister_rule(level: int) -> tuple[np.ndarray, np.ndarray]:
    """The one-dimensional rule of Smolyak's level (ids into :func:`_genz_keister_points`
    and weights): level 0 the point 0, levels 1 and 2 the 3-point Gauss–Hermite rule
    (degree 5), levels 3 and 4 the 9-point rule (degree 15): level l exact to degree
    ≥ 2 l + 1, each nested in the next (the delayed sequence, which reuses a rule while its
    degree suffices)."""
    if level == 0:
        return np.array([0]), np.array([1.0])
    if level <= 2:
        return np.arange(3), np.array([2.0 / 3.0, 1.0 / 6.0, 1.0 / 6.0])
    weights = _genz_keister_points()[1]
    return np.arange(len(weights)), weights


@functools.lru_cache(maxsize=16)
def sparse_grid_nodes(dim: int, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Smolyak's sparse grid for N(0, I_dim) on the nested Genz–Keister rules, exact for
    polynomials of total degree ≤ ``degree`` (5, 7 or 9; read-only, cached): the nodes
    (n, dim) and signed weights (n,) summing to 1.

    Fully symmetric: the nodes have at most (degree − 1) / 2 nonzero coordinates, each
    a point of the 9-point rule. Combination technique: the sum over the multi-indices l
    (levels ≥ 0) with ``L − dim < |l| ≤ L``, ``L = (degree − 1) / 2``, of
    ``(−1)^(L − |l|) C(dim − 1, L − |l|)`` times the tensor product of the levels' rules,
    the weights of equal nodes added (degree 5 is Stroud's rule, :func:`stroud_nodes`).
    Node counts: degree 7, 89 (dim 4), 889 (9), 2121 (12), ~(4/3) dim³; degree 9, 225
    (4), 709 (6), 3769 (9).
    """
    if degree not in (5, 7, 9):
        raise ValueError(f"degree must be 5, 7 or 9; got {degree!r}.")
    top = (degree - 1) // 2
    summed: dict[tuple[tuple[int, int], ...], float] = {}

    def indices(start: int, left: int):
        """Nonzero entries ((axis, level), …) of the multi-indices summing to ``left``."""
        if left == 0:
            yield ()
            return
        for axis in range(start, dim):
            for level in range(1, left + 1):
                for rest in indices(axis + 1, left - level):
                    yield ((axis, level), *rest)

    for total in range(max(0, top - dim + 1), top + 1):
        coefficient = (-1) ** (top - total) * math.comb(dim - 1, top - total)
        for index in indices(0, total):
            _add_tensor_rule(summed, index, coefficient)
    kept = [(node, w) for node, w in summed.items() if abs(w) > 1e-13]
    nodes = _node_array([node for node, _ in kept], dim)
    weights = np.array([w for _, w in kept])
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


def _combination(costs: tuple[int, ...], budget: int) -> dict[tuple[tuple[int, int], ...], float]:
    """Smolyak's combination technique on the downward-closed set of multi-indices l with
    ``Σ costs[i] l_i ≤ budget`` over the nested Genz–Keister rules: the nodes (their nonzero
    (axis, point id) entries) and their summed weights."""
    dim = len(costs)
    summed: dict[tuple[tuple[int, int], ...], float] = {}

    def indices(start: int, left: int):
        """Nonzero entries ((axis, level), …) of the multi-indices within ``left``."""
        yield ()
        for axis in range(start, dim):
            for level in range(1, left // costs[axis] + 1):
                for rest in indices(axis + 1, left - level * costs[axis]):
                    yield ((axis, level), *rest)

    def alternating(steps: list[int], left: int) -> int:
        """``Σ (−1)^|E|`` over the subsets E of ``steps`` whose costs fit in ``left``."""
        total = 1
        for j, step in enumerate(steps):
            if step <= left:
                total -= alternating(steps[j + 1 :], left - step)
        return total

    for index in indices(0, budget):
        left = budget - sum(costs[axis] * level for axis, level in index)
        # The coefficient Σ_e (−1)^|e| [l + e in the set], e over {0, 1}^dim.
        coefficient = alternating([c for c in costs if c <= left], left)
        if coefficient == 0:
            continue
        _add_tensor_rule(summed, index, coefficient)
    return summed


def _add_tensor_rule(
    summed: dict[tuple[tuple[int, int], ...], float],
    index: tuple[tuple[int, int], ...],
    coefficient: float,
) -> None:
    """Add ``coefficient`` times the tensor product of the levels' Genz–Keister rules of
    the multi-index ``index`` (its nonzero (axis, level) entries) to ``summed``: each node
    keyed by its nonzero (axis, point id) entries, the weights of equal nodes added."""
    rules = [_genz_keister_rule(level) for _, level in index]
    for combination in itertools.product(*(range(len(r[0])) for r in rules)):
        node = tuple(
            (axis, int(rule[0][c]))
            for (axis, _), rule, c in zip(index, rules, combination, strict=True)
            if rule[0][c] != 0
        )
        weight = coefficient * math.prod(
            rule[1][c] for rule, c in zip(rules, combination, strict=True)
        )
        summed[node] = summed.get(node, 0.0) + weight


def _node_array(kept: list[tuple[tuple[int, int], ...]], dim: int) -> np.ndarray:
    """The nodes (n, dim) of the keys ``kept`` of :func:`_add_tensor_rule`'s sums."""
    points = _genz_keister_points()[0]
    nodes = np.zeros((len(kept), dim))
    for row, node in enumerate(kept):
        for axis, point in node:
            nodes[row, axis] = points[point]
    return nodes


@functools.lru_cache(maxsize=16)
def anisotropic_grid_nodes(dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An anisotropic sparse grid for N(0, I_dim) with an embedded rule (D-204): the nodes
    (n, dim), the grid's signed weights (n,) and the embedded rule's on the same nodes (n,),
    each summing to 1 (read-only, cached).

    Smolyak's combination technique (as :func:`sparse_grid_nodes`) on the multi-indices l
    with ``2 Σ_{i<3} l_i + 3 Σ_{i≥3} l_i ≤ 6``: exact for polynomials of total degree 7 in
    the first three coordinates (the row's leading directions), of degree 5 in all of them
    (products of two squares included); the embedded rule, the same with ``≤ 4``, to degree
    5 in the first three and 3 in all. Nodes: ``2 dim² + 27`` (315 for dim 12, 749 for
    19, 995 for 22), most of them the pairs of coordinates.
    """
    costs = tuple(2 if axis < _GRID_LEADING else 3 for axis in range(dim))
    high, low = _combination(costs, 6), _combination(costs, 4)
    kept = [
        node
        for node in dict.fromkeys([*high, *low])
        if abs(high.get(node, 0.0)) > 1e-13 or abs(low.get(node, 0.0)) > 1e-13
    ]
    nodes = _node_array(kept, dim)
    weights = np.array([high.get(node, 0.0) for node in kept])
    embedded = np.array([low.get(node, 0.0) for node in kept])
    nodes.flags.writeable = weights.flags.writeable = embedded.flags.writeable = False
    return nodes, weights, embedded


def _curvature_rotation(factor: np.ndarray, centred: np.ndarray) -> np.ndarray:
    """The factors (n, K, K − 1) turned to each row's curvature directions, most curved
    first: ``F U``, U the eigenvectors of ``Fᵀ H F`` by decreasing eigenvalue, H the
    softmax's Hessian ``diag(p) − p pᵀ`` at the row's mean (the directions of z along which
    the probabilities bend most; D-204). A rule placed in these coordinates integrates the
    same Gaussian."""
    shifted = centred - centred.max(axis=1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)
    weighted = factor * np.sqrt(p)[:, :, None]
    slope = np.einsum("nk,nka->na", p, factor)  # Fᵀ p
    curvature = np.swapaxes(weighted, 1, 2) @ weighted - slope[:, :, None] * slope[:, None, :]
    _, vectors = np.linalg.eigh(curvature)
    return factor @ vectors[:, :, ::-1]


def _roots(cov: np.ndarray) -> np.ndarray:
    """Lower Cholesky factors (n, r, r) of the stacked covariances, a ridge of 1e-12 of
    their largest variance added where round-off leaves one not positive definite."""
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        scale = np.maximum(np.einsum("nii->n", cov) / cov.shape[-1], 1e-300)
        eigval, eigvec = np.linalg.eigh(cov)
        eigval = np.maximum(eigval, 0.0) + 1e-12 * scale[:, None]
        return np.linalg.cholesky((eigvec * eigval[:, None, :]) @ np.swapaxes(eigvec, 1, 2))


def _log_sum_exp(a: np.ndarray, axis: int) -> np.ndarray:
    """``log Σ exp(a)`` along ``axis`` (kept), with the maximum factored out."""
    top = a.max(axis=axis, keepdims=True)
    return np.log(np.exp(a - top).sum(axis=axis, keepdims=True)) + top


def _row_blocks(
    n: int, bytes_per_row: float, entries_per_row: int, max_bytes: float, entries=_CACHE_ENTRIES
):
    rows = max(1, min(int(max_bytes // bytes_per_row), entries // entries_per_row))
    return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]


def _log_average(factor, centred, z, log_w, max_bytes) -> np.ndarray:
    """``log Σ_j w_j softmax(centred + factor z_j)`` per row, in float64 log sums."""
    n, k, dim = factor.shape
    out = np.empty((n, k))
    # Per row: the nodes' latent values, their exponentials and a log-softmax, K each.
    for rows in _row_blocks(n, 24.0 * len(z) * k, len(z) * k, max_bytes):
        block = factor[rows]
        f = (block.reshape(-1, dim) @ z.T).reshape(len(block), k, len(z))  # one GEMM
        f += centred[rows][:, :, None]
        f -= _log_sum_exp(f, axis=1)
        f += log_w
        out[rows] = _log_sum_exp(f, axis=2)[..., 0]
    return out


def _rule_log_average(factor, centred, z, w, max_bytes, embedded=None):
    """``log Σ_j w_j softmax(centred + factor z_j)`` per row for a rule of signed weights
    ``w`` summing to 1 (few nodes, or the three-class trapezoid's positive weights):
    float64 sums in the linear domain, log sums for the rows where some class's average is
    below ``_FLOAT64_FLOOR``; NaN where a sum is not positive (a rule with negative
    weights on a row too wide for it).

    With ``embedded`` weights (an embedded rule on the same nodes), also each row's largest
    difference over the classes between the two rules' averages (n,): the logs and it."""
    n, k, dim = factor.shape
    out = np.empty((n, k))
    difference = np.empty(n) if embedded is not None else None
    z_t = np.ascontiguousarray(z.T)
    # As in _replicate_averages: the largest latent value at a node is ≥ 0, so only a row
    # reaching beyond float64's exponent range needs the shift by the largest value.
    reach = np.abs(centred).max(axis=1) + np.linalg.norm(factor, axis=2).max(axis=1) * float(
        np.linalg.norm(z, axis=1).max()
    )
    # Per row: K float64 latent values per node, their exponentials, one sum per node (and
    # the embedded rule's weights over it).
    per_node = 2 * k + 1 + (embedded is not None)
    for rows in _row_blocks(n, 8.0 * len(z) * per_node, len(z) * k, max_bytes, _RULE_ENTRIES):
        m = rows.stop - rows.start
        f = (factor[rows].reshape(-1, dim) @ z_t).reshape(m, k, len(z))  # one GEMM
        f += centred[rows][:, :, None]
        if reach[rows].max() > _NO_SHIFT_FLOAT64:
            f -= f.max(axis=1, keepdims=True)
        e = np.exp(f)
        # Sums over a few classes as K − 1 additions of (rows, nodes) slices: a reduction
        # over a short middle axis costs several times more.
        total = e[:, 0].copy()
        for c in range(1, k):
            total += e[:, c]
        if embedded is not None:
            low = embedded / total
        np.divide(w, total, out=total)
        # Σ_j w_j e_kj / Σ_l e_lj (einsum: batched products of small matrices cost per row)
        average = np.einsum("nkj,nj->nk", e, total)
        if embedded is not None:
            difference[rows] = np.abs(average - np.einsum("nkj,nj->nk", e, low)).max(axis=1)
        tiny = average.min(axis=1) < _FLOAT64_FLOOR
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(average)
        if tiny.any():
            log_softmax = f[tiny] - np.log(e[tiny].sum(axis=1, keepdims=True))
            top = log_softmax.max(axis=2, keepdims=True)
            signed = np.exp(log_softmax - top) @ w
            with np.errstate(divide="ignore", invalid="ignore"):
                logs[tiny] = np.log(signed) + top[..., 0]
        if tiny.any() or not (average > 0).all():
            logs[~np.isfinite(logs).all(axis=1)] = np.nan
        out[rows] = logs
    return out if embedded is None else (out, difference)
