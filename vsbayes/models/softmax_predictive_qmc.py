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


def _replicate_averages(factor, centred, lead, half, max_bytes) -> np.ndarray:
    """Each replicate's average over its nodes ±z of the softmax conditioned on the leading
    class's direction (:mod:`vsbayes.models.softmax_predictive`): (n, REPLICATES, K),
    float32 sums in the linear domain. ``lead`` is :func:`_leader_conditioning`'s tuple
    (in float32).

    The leader's latent value is set aside and the others' exponentials shifted by their
    largest value (so that their sum, ``Σ_{j≠t} e^{f_j}``, is ≥ 1), unless no latent value
    can overflow or all underflow (bounded by ``_NO_SHIFT`` over the level's nodes, by the
    triangle inequality); the leader's logit against the rest, ``f_t − log Σ_{j≠t} e^{f_j}``,
    is taken from its latent value, never from its exponential.
    """
    n, k, dim = factor.shape
    leader, v, inv_scale, coefficients = lead
    _, replicates, n_half = half.shape
    n_nodes = replicates * 2 * n_half
    reach = np.abs(centred).max(axis=1) + np.linalg.norm(factor, axis=2).max(axis=1) * float(
        np.sqrt((half.astype(float) ** 2).sum(axis=0)).max()
    )
    # Each node's latent values and τ in one product: τ's coefficients as a (K + 1)-th row.
    stacked = np.concatenate([factor, v[:, None, :]], axis=1)
    out = np.empty((n, replicates, k))
    # Per row: K float32 latent values per node, half of them (and τ) as the product, and
    # about a dozen per-node arrays (τ, the leader's value and probability, the table's
    # recurrence, the weights).
    for rows in _row_blocks(n, 4.0 * n_nodes * (1.5 * k + 12), n_nodes * k, max_bytes):
        m = rows.stop - rows.start
        product = (stacked[rows].reshape(-1, dim) @ half.reshape(dim, -1)).reshape(
            m, k + 1, replicates, 1, n_half
        )  # one GEMM for both signs
        f = np.empty((m, k, replicates, 2, n_half), dtype=np.float32)
        shift = centred[rows][:, :, None, None, None]
        np.add(shift, product[:, :k], out=f[:, :, :, :1])
        np.subtract(shift, product[:, :k], out=f[:, :, :, 1:])
        tau = np.concatenate([product[:, k], -product[:, k]], axis=2).reshape(m, replicates, -1)
        del product
        f = f.reshape(m, k, replicates, 2 * n_half)
        picked = np.arange(m), leader[rows]
        lead_value = f[picked]  # a copy (advanced indexing): the leader's latent values
        f[picked] = -np.inf
        if reach[rows].max() > _NO_SHIFT:
            top = f.max(axis=1)
            f -= top[:, None]
            lead_value -= top
        np.exp(f, out=f)  # the leader's exponentials are 0
        rest = f.sum(axis=1)
        # The leader's logit against the rest, less τ: the conditional mean given the rest.
        logit = np.log(rest)
        np.subtract(lead_value, logit, out=logit)
        logit -= tau
        lead_p = _logistic_normal_at(logit, inv_scale[rows], coefficients[rows])
        # Σ_j e_kj (1 − p_j) / rest_j per replicate for the other classes: one batched
        # matrix-vector product; the leader's own sum replaces its (zero) entry.
        np.divide(np.float32(1.0) - lead_p, rest, out=rest)
        sums = np.matmul(f.transpose(0, 2, 1, 3), rest[..., None])[..., 0]
        sums[picked[0], :, picked[1]] = lead_p.sum(axis=2)
        out[rows] = sums
    out /= 2 * n_half
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


def _adaptive_average(factor, root, centred, tol, max_bytes, levels=_LEVELS, margin=None):
    """The K ≥ 4 rule (:mod:`vsbayes.models.softmax_predictive`): (n, K) averages,
    refined row by row on nested nodes (each level's averages pooled with the levels'
    before it) up to ``levels`` levels, and each row's three estimated standard errors on
    its last level (n,).

    With a ``margin`` (:data:`~vsbayes.models.softmax_predictive.DECISION_MARGIN`), every
    row first takes the screen (:func:`screen_nodes`, 8 × 64 nodes), and a row also stops
    where its leading class is settled (:func:`_settled`), on the screen or after a level:
    its values are then good for the argmax only. The screen's averages are not pooled
    with the levels'; a row it does not settle takes the levels as without a margin."""
    n, k, dim = factor.shape
    factor32 = factor.astype(np.float32)
    centred32 = centred.astype(np.float32)
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
            lead if whole else tuple(x[todo] for x in lead),
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
