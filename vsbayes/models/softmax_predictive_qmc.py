"""The softmax predictive's adaptive replicate QMC average, for the rows too wide for the
deterministic rules.

8 replicates of scrambled Sobol nodes and their mirror images, on nested levels refined
row by row until three standard errors are below ``tol`` (:func:`_adaptive_average`); at
each node the softmax conditioned on the leading class's direction
(:func:`_leader_conditioning`, :func:`_replicate_averages`), float32 sums in the linear
domain; for ``argmax_only``, the rows whose leading class is settled stop early
(:func:`_settled`). The method, its integrand and its measured errors are described in
:mod:`vsbayes.models.softmax_predictive`'s docstring.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .logistic_normal import _LOGISTIC_VARIANCE, _logistic_normal_at, _table_coefficients
from .softmax_predictive_rules import (
    _LEVELS,
    _row_blocks,
    centred_basis,
    replicate_nodes,
    screen_nodes,
)

__all__: list[str] = []  # the entry points are vsbayes.models.softmax_predictive's

# Largest latent value below which float32's exponentials of K ≤ 10^6 classes cannot
# overflow (e^88.7 is float32's largest); with a margin.
_NO_SHIFT = 60.0
#: Latent values (float32) per chunk of a block's nodes at most.
_CHUNK_ENTRIES = 2**18


def _leader_conditioning(root: np.ndarray, centred: np.ndarray):
    """Per row, what the rule needs to integrate its leading class's direction exactly
    (:mod:`vsbayes.models.softmax_predictive`): the leading class t (largest centred
    mean), the coefficients ``v = s² L⁻¹ u_t`` (n, K − 1) of the independent part
    ``τ = v · z`` of the node's latent along ``u_t = Qᵀ e_t``, whose variance is
    ``s² = 1 / |L⁻¹ u_t|²``, and the logistic-normal table at s²: ``1 / σ_t`` (n,) and
    P's coefficients (n, 13)."""
    leader = centred.argmax(axis=1)
    u = centred_basis(centred.shape[1])[leader]  # (n, K − 1): Qᵀ e_t
    solved = np.linalg.solve(root, u[:, :, None])[..., 0]  # L⁻¹ u_t
    variance = 1.0 / np.einsum("na,na->n", solved, solved)
    total = variance + _LOGISTIC_VARIANCE
    coefficients = _table_coefficients(_LOGISTIC_VARIANCE / total)
    return leader, solved * variance[:, None], 1.0 / np.sqrt(total), coefficients


class _OwnDirections(NamedTuple):
    """Per row and class k, what the own-direction integrand needs (D-268): the
    coefficients ``v_k = s_k² L⁻¹ u_k`` (n, K, K − 1) of the independent part
    ``τ_k = v_k · z`` of the node's latent along ``u_k = Qᵀ e_k``, of variance
    ``s_k² = 1 / |L⁻¹ u_k|²``, and the logistic-normal table at s_k²: ``1 / σ_t`` (n, K)
    and P's coefficients (n, K, 13)."""

    v: np.ndarray
    inv_scale: np.ndarray
    coefficients: np.ndarray


def _own_conditioning(root: np.ndarray) -> _OwnDirections:
    """:class:`_OwnDirections` of rows with Cholesky factors ``root`` (n, K − 1, K − 1) of
    their centred latent covariances (float64)."""
    n, dim, _ = root.shape
    q = centred_basis(dim + 1)
    solved = np.linalg.solve(root, np.broadcast_to(q.T, (n, dim, dim + 1)))  # L⁻¹ u_k
    variance = 1.0 / np.einsum("nak,nak->nk", solved, solved)
    total = variance + _LOGISTIC_VARIANCE
    return _OwnDirections(
        np.swapaxes(solved * variance[:, None, :], 1, 2),
        1.0 / np.sqrt(total),
        _table_coefficients(_LOGISTIC_VARIANCE / total),
    )


def _replicate_averages(factor, centred, lead, half, max_bytes) -> np.ndarray:
    """Each replicate's average over its nodes ±z of the softmax conditioned on the leading
    class's direction (:mod:`vsbayes.models.softmax_predictive`): (n, REPLICATES, K),
    float32 sums in the linear domain. ``lead`` is :func:`_leader_conditioning`'s tuple
    (in float32).

    Each row's classes are put in an order where the leader comes last, so that one GEMM
    writes, per node, the other classes' latent values, the leader's and τ, contiguous
    (the nodes' mirror images and a row of ones, which adds the means, in its right-hand
    side); the nodes go through in chunks of :data:`_CHUNK_ENTRIES` latent values at most,
    whose passes stay near the processor's caches, each replicate's float32 sums added up
    over the chunks in float64. The others' exponentials are shifted by their largest value
    (so that their sum, ``Σ_{j≠t} e^{f_j}``, is ≥ 1), unless no latent value can overflow
    or all underflow (bounded by ``_NO_SHIFT`` over the level's nodes, by the triangle
    inequality); the leader's logit against the rest, ``f_t − log Σ_{j≠t} e^{f_j}``, is
    taken from its latent value, never from its exponential.

    With :class:`_OwnDirections` for ``lead``, each class conditioned on its own direction
    instead (:func:`_own_direction_averages`).
    """
    if isinstance(lead, _OwnDirections):
        return _own_direction_averages(factor, centred, lead, half, max_bytes)
    n, k, dim = factor.shape
    leader, v, inv_scale, coefficients = lead
    _, replicates, n_half = half.shape
    reach = np.abs(centred).max(axis=1) + np.linalg.norm(factor, axis=2).max(axis=1) * float(
        np.sqrt((half.astype(float) ** 2).sum(axis=0)).max()
    )
    shift = reach > _NO_SHIFT
    # Per row: the other classes, then the leader (a stable order), then τ; the means in
    # the last column.
    order = np.argsort(np.arange(k) == leader[:, None], axis=1, kind="stable")
    stacked = np.zeros((n, k + 1, dim + 1), dtype=np.float32)
    stacked[:, :k, :dim] = np.take_along_axis(factor, order[:, :, None], axis=1)
    stacked[:, :k, dim] = np.take_along_axis(centred, order, axis=1)
    stacked[:, k, :dim] = v
    per_replicate = max(1, _CHUNK_ENTRIES // ((k + 1) * replicates * 2))
    chunks = _mirrored_chunks(half, per_replicate)
    sums = np.zeros((n, replicates, k))
    # Per row: K + 1 float32 values per node of a chunk, and about a dozen per-node arrays
    # (the others' sum, the leader's logit and probability, the table's recurrence).
    width = chunks[0].shape[1]
    for rows in _row_blocks(n, 4.0 * width * (k + 13), width * (k + 1), max_bytes, _CHUNK_ENTRIES):
        m = rows.stop - rows.start
        block = stacked[rows].reshape(-1, dim + 1)
        for nodes in chunks:
            values = (block @ nodes).reshape(m, k + 1, replicates, -1)  # one GEMM
            others, lead_value, tau = values[:, : k - 1], values[:, k - 1], values[:, k]
            if shift[rows].any():
                top = others.max(axis=1)
                others -= top[:, None]
                lead_value -= top
            np.exp(others, out=others)
            rest = others.sum(axis=1)
            # The leader's logit against the rest, less τ: the conditional mean given the
            # rest.
            logit = np.log(rest)
            np.subtract(lead_value, logit, out=logit)
            logit -= tau
            lead_p = _logistic_normal_at(logit, inv_scale[rows], coefficients[rows])
            # Σ_j e_kj (1 − p_j) / rest_j per replicate for the other classes: one batched
            # matrix-vector product.
            np.subtract(np.float32(1.0), lead_p, out=tau)
            np.divide(tau, rest, out=rest)
            sums[rows, :, : k - 1] += np.matmul(others.transpose(0, 2, 1, 3), rest[..., None])[
                ..., 0
            ]
            sums[rows, :, k - 1] += lead_p.sum(axis=2)
    # Back to the classes' own order.
    out = np.empty_like(sums)
    np.put_along_axis(out, np.broadcast_to(order[:, None, :], sums.shape), sums, axis=2)
    out /= 2 * n_half
    return out


def _own_direction_averages(factor, centred, own, half, max_bytes) -> np.ndarray:
    """Each replicate's average over its nodes ±z of every class's softmax conditioned on
    the class's own direction (:mod:`vsbayes.models.softmax_predictive`, D-268):
    (n, REPLICATES, K), float32 sums in the linear domain; ``own`` is
    :class:`_OwnDirections` (in float32).

    At a node, class k's logit against the others, ``f_k − log Σ_{j≠k} e^{f_j}``, moves by
    exactly ``τ_k`` along ``u_k``, so its conditional expectation is ``LN(logit_k − τ_k,
    s_k²)``: K table look-ups a node. One GEMM writes the classes' latent values and the
    K values τ_k per node (the means in the right-hand side's row of ones). The
    exponentials are shifted by the node's largest latent value; the others' sum of a
    class is the whole sum less its own term (≥ 1, the top class's 1 being in it), and for
    the top class the other terms summed without it, so that no sum cancels. The K
    averages sum to 1 only to within their error (the caller normalizes).
    """
    n, k, dim = factor.shape
    _, replicates, n_half = half.shape
    stacked = np.zeros((n, 2 * k, dim + 1), dtype=np.float32)
    stacked[:, :k, :dim] = factor
    stacked[:, :k, dim] = centred
    stacked[:, k:, :dim] = own.v
    per_replicate = max(1, _CHUNK_ENTRIES // (2 * k * replicates * 2))
    chunks = _mirrored_chunks(half, per_replicate)
    sums = np.zeros((n, k, replicates))
    # Per row: 2K float32 values per node of a chunk, and about six more per class and node
    # (the exponentials, the others' sums, the table's recurrence).
    width = chunks[0].shape[1]
    one = np.float32(1.0)
    for rows in _row_blocks(n, 4.0 * width * 8 * k, width * 2 * k, max_bytes, _CHUNK_ENTRIES):
        m = rows.stop - rows.start
        block = stacked[rows].reshape(-1, dim + 1)
        for nodes in chunks:
            values = (block @ nodes).reshape(m, 2 * k, replicates, -1)  # one GEMM
            logit, tau = values[:, :k], values[:, k:]
            logit -= logit.max(axis=1)[:, None]
            e = np.exp(logit)
            top = e == one  # the node's largest latent value (ties: every one of them)
            rest = e.sum(axis=1)[:, None] - e
            # The top class's others: the other terms, and the tied top classes' ones.
            top_rest = np.where(top, np.float32(0.0), e).sum(axis=1) + (top.sum(axis=1) - 1)
            np.copyto(rest, np.broadcast_to(top_rest[:, None], rest.shape), where=top)
            with np.errstate(divide="ignore"):  # every other term underflowed: logit +inf
                np.log(rest, out=rest)
            logit -= rest
            logit -= tau
            p = _logistic_normal_at(logit, own.inv_scale[rows], own.coefficients[rows])
            sums[rows] += p.sum(axis=3)
    out = np.swapaxes(sums, 1, 2)
    out /= 2 * n_half
    return out


def _mirrored_chunks(half: np.ndarray, chunk: int) -> list[np.ndarray]:
    """``half``'s nodes and their mirror images with a row of ones appended (dim + 1,
    REPLICATES, 2 c) in chunks of c ≤ ``chunk`` nodes (and as many mirrors) per replicate,
    each contiguous: the GEMM's right-hand side, whose last row adds the latent means."""
    dim, replicates, n_half = half.shape
    out = []
    for start in range(0, n_half, chunk):
        part = half[:, :, start : start + chunk]
        nodes = np.empty((dim + 1, replicates, 2, part.shape[2]), dtype=np.float32)
        nodes[:dim, :, 0] = part
        np.negative(part, out=nodes[:dim, :, 1])
        nodes[dim] = 1.0
        out.append(nodes.reshape(dim + 1, -1))
    return out


def _settled(average: np.ndarray, error: np.ndarray, margin: float | None, tol: float):
    """Rows (n,) whose largest average leads the second by more than ``margin`` times
    their estimated error (three standard errors, the largest over the classes), and by
    more than ``margin · tol`` (an estimate on few nodes can miss a region of the latent
    space in every replicate, and the decision needs no more than the full rule's
    accuracy): False everywhere without a margin."""
    if margin is None:
        return np.zeros(len(average), dtype=bool)
    top_two = np.partition(average, -2, axis=1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0] > margin * np.maximum(error, tol)


def _estimated_error(replicates: np.ndarray) -> np.ndarray:
    """Three standard errors of the replicates' average (n, REPLICATES, K), the largest
    over the classes (n,)."""
    return 3.0 * replicates.std(axis=1, ddof=1).max(axis=1) / math.sqrt(replicates.shape[1])


def _rows_of(lead, rows):
    """The conditioning's arrays (:func:`_leader_conditioning`'s tuple or
    :class:`_OwnDirections`) of some rows."""
    taken = [x[rows] for x in lead]
    return lead._make(taken) if isinstance(lead, _OwnDirections) else tuple(taken)


def _adaptive_average(
    factor, root, centred, tol, max_bytes, levels=_LEVELS, margin=None, own_directions=False
):
    """The K ≥ 4 rule (:mod:`vsbayes.models.softmax_predictive`): (n, K) averages,
    refined row by row on nested nodes (each level's averages pooled with the levels'
    before it) up to ``levels`` levels, and each row's three estimated standard errors on
    its last level (n,). The integrand: the softmax conditioned on the leading class's
    direction, or with ``own_directions`` each class conditioned on its own (D-268).

    With a ``margin`` (:data:`~vsbayes.models.softmax_predictive.DECISION_MARGIN`), every
    row first takes the screen (:func:`screen_nodes`, 8 × 64 nodes), and a row also stops
    where its leading class is settled (:func:`_settled`), on the screen or after a level:
    its values are then good for the argmax only. The screen's averages are not pooled
    with the levels'; a row it does not settle takes the levels as without a margin."""
    n, k, dim = factor.shape
    factor32 = factor.astype(np.float32)
    centred32 = centred.astype(np.float32)
    if own_directions:
        lead = _OwnDirections(*(x.astype(np.float32) for x in _own_conditioning(root)))
    else:
        lead = tuple(
            x if x.dtype.kind == "i" else x.astype(np.float32)
            for x in _leader_conditioning(root, centred)
        )
    out = np.empty((n, k))
    estimated = np.empty(n)
    todo = np.arange(n)
    if margin is not None:
        screen = _replicate_averages(factor32, centred32, lead, screen_nodes(dim), max_bytes)
        out[:], estimated[:] = screen.mean(axis=1), _estimated_error(screen)
        todo = np.flatnonzero(~_settled(out, estimated, margin, tol))
        if not todo.size:
            return out, estimated
    replicates, summed = None, 0
    for level in range(levels):
        z = replicate_nodes(dim, level)
        whole = todo.size == n
        added = _replicate_averages(
            factor32 if whole else factor32[todo],
            centred32 if whole else centred32[todo],
            lead if whole else _rows_of(lead, todo),
            z,
            max_bytes,
        )
        new = 2 * z.shape[2]
        if level <= 1:
            replicates, summed = added, 0
        else:
            replicates = (summed * replicates + new * added) / (summed + new)
        summed += new
        out[todo] = replicates.mean(axis=1)
        error = _estimated_error(replicates)
        estimated[todo] = error
        if level + 1 == levels:
            break
        refined = (error > tol) & ~_settled(out[todo], error, margin, tol)
        todo, replicates = todo[refined], replicates[refined]
        if not todo.size:
            break
    return out, estimated
