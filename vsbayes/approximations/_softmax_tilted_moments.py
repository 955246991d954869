"""The multinomial EP's tilted moments by self-normalized quadrature: ``log E[F^s]`` over
each row's cavity and the tilted expectations of the softmax, on mirrored Sobol nodes.

A sweep's pass over all rows (:func:`_tilted_sites`) and a stream's few rows
(:func:`_few_tilted_sites`, with its direct pass :func:`_direct_pass`): each row's rule
level from its cavity's spread (:func:`_spread_levels`: wide rows finer, narrow ones on
the coarse level), the blocks of rows run side by side (:func:`_tilted_blocks`) on one
thread's buffers (:class:`_Workspace`), and one block's quadrature (:func:`_tilted_block`)
on the cavity's nodes or on the even mixture of it and a kernel near the tilted density
(:func:`_mixture_nodes`). The expectations become sites by
:mod:`~vsbayes.approximations._softmax_matching`; the rules' nodes and levels are
:mod:`~vsbayes.approximations._tilted_rule`'s. Moved out of
:mod:`~vsbayes.approximations.softmax_sites` unchanged (tests patch the constants here).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .._blas import block_slices, map_blocks, single_blas_thread
from .._memory import block_bytes
from ..sampling import SamplingRule
from ._softmax_cavities import (
    _cavity_moments,
    _natural,
    _row_positive_definite,
    _whitened_norms,
)
from ._softmax_matching import _direct, _matched, _row_matched
from ._threads import _by_rows
from ._three_class_sites import (
    _three_class_block,
    _three_class_cavities,
    _three_class_direct,
    _three_class_factors,
    _three_class_matched,
)
from ._tilted_rule import _many_classes, _n_levels, _rule_nodes, _rule_size

_LOG_2PI = math.log(2.0 * math.pi)

#: A row whose cavity's largest variance exceeds the first (second) of these starts the
#: tilted moments one (two) rule levels up. The factor varies on the scale of one unit of
#: the latent values; over a much wider cavity it is nearly a step, and the quadrature of
#: its moments needs more nodes (wine's cavities, variances 4-19: 128 nodes in 2 dimensions
#: left EP 0.012 nats from its fixed point on 8192, 512 nodes 0.0012; iris's, 0.8-5.4, 2e-4
#: on 128). Above 1 instead of 4, a quarter of the rows of 50 classes went to 2048 nodes.
_WIDE_CAVITY = (4.0, 16.0)


def _largest_variances(cav_cov: np.ndarray, exact_above: float) -> np.ndarray:
    """Each cavity's largest variance where it may exceed ``exact_above``, else an upper
    bound of it (at most ``exact_above``)."""
    # On row slices side by side (each row's own numbers: the same bits): one serial pass
    # over the (M, r, r) cavities was 3 % of a 26-class fit on two threads.
    r = cav_cov.shape[1]
    return _by_rows(lambda rows: _row_largest_variances(rows, exact_above), cav_cov, work=r**3)


def _row_largest_variances(cav_cov: np.ndarray, exact_above: float) -> np.ndarray:
    # Gershgorin's bound (the largest absolute row sum) clears the narrow rows without an
    # eigendecomposition (26 classes × 5000 rows: all of them, 0.2 s).
    top = np.abs(cav_cov).sum(axis=2).max(axis=1)
    wide = top > exact_above
    if wide.any():
        top[wide] = np.linalg.eigvalsh(cav_cov[wide])[:, -1]
    return top


def _spread_levels(cav_cov: np.ndarray, rule: SamplingRule | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's starting rule level from its cavity's largest variance, and whether its
    cavity is narrow enough for the default rule's coarse level (:data:`_NARROW_CAVITY`;
    from 17 classes on, :func:`_many_classes`), from one pass over the cavities: each
    computed alone read them twice, the second on a copy (26 classes × 5000 rows: a tenth
    of the first sweep outside its blocks)."""
    r = cav_cov.shape[1]
    coarse_level = rule is None and _many_classes(r)
    # Exact where a threshold needs it: above the narrow bound, or the first wide one.
    top = _largest_variances(cav_cov, _NARROW_CAVITY if coarse_level else _WIDE_CAVITY[0])
    level = np.zeros(len(cav_cov), dtype=int)
    for threshold in _WIDE_CAVITY:
        level += top > threshold
    narrow = top <= _NARROW_CAVITY if coarse_level else np.zeros(len(cav_cov), dtype=bool)
    return np.minimum(level, _n_levels(rule) - 1), narrow


#: A row of level 0 whose cavity's largest variance is at most this takes a quarter of the
#: default rule's nodes (``coarse``): over a cavity narrower than the factor's own scale
#: (one unit of the latent values) the softmax is smooth, and the self-normalized
#: quadrature's error is small on few nodes. Measured on 20 classes × 8 features × 2000
#: rows (cavities' largest variances 0.09-2, median 0.36), EP's fixed point with every row
#: on 64 instead of 256 nodes moved from 2.1·10⁻⁴ to 5.6·10⁻⁴ nats of the one on 8192
#: nodes, against EP's own error of ~0.6 nats there (docs/decisions.md).
_NARROW_CAVITY = 1.0


def _node_bytes(k: int, r: int) -> float:
    """Bytes of the temporaries of one (row, node) pair of :func:`_tilted_block`."""
    return 8.0 * (3 * k + 3 * r + 6)


class _Workspace:
    """One thread's buffers for :func:`_tilted_block` on one rule's nodes ``z``: the nodes
    with a unit coordinate (r + 1, P), formed once, and two buffers of the (b, K, nodes)
    values, grown to the largest block and reused. Fresh arrays of a few MiB a block were
    mapped and faulted in anew until the allocator's threshold had adapted: at 50 classes
    on 8192 nodes a row, the first two sweeps' blocks took 0.64 s, the later ones 0.34 s.

    ``dtype``: that of the nodes' latent values and softmax terms (:func:`_values_dtype`)."""

    def __init__(self, z: np.ndarray, dtype: type = np.float64):
        self.z, self.dtype = z, np.dtype(dtype)
        self._lifted = None
        self._buffers = [np.empty(0, self.dtype), np.empty(0, self.dtype)]

    def lifted(self) -> np.ndarray:
        if self._lifted is None:
            lifted = np.empty((self.z.shape[1] + 1, len(self.z)), self.dtype)
            lifted[:-1] = self.z.T
            lifted[-1] = 1.0
            self._lifted = lifted
        return self._lifted

    def values(self, rows: int, which: int, columns: int | None = None) -> np.ndarray:
        """A (rows, nodes) buffer (``columns``: its width if not the nodes')."""
        width = len(self.z) if columns is None else columns
        if self._buffers[which].size < rows * width:
            self._buffers[which] = np.empty(rows * width, self.dtype)
        return self._buffers[which][: rows * width].reshape(rows, width)


#: Least tolerance of the multinomial EP (relative site change) at which its tilted blocks
#: take float32 values (:func:`_values_dtype`): their rounding makes the sweep map move
#: the sites by ~3·10⁻⁸ relative at a fixed point (20 classes × 80 rows: the sweeps to
#: 10⁻⁸ stalled at 3·10⁻⁸), thirty times below this. The estimators' default stop at many
#: classes is √tol = 10⁻⁴ (cheap sweeps: 10⁻⁸, float64).
_SINGLE_TOL = 1e-6


def _values_dtype(single: bool, n_kernels: int) -> type:
    """The floating type of the nodes' latent values and softmax terms in
    :func:`_tilted_block`: float32 where ``single`` (from :data:`MANY_CLASSES` classes on,
    at a tolerance of at least :data:`_SINGLE_TOL`) on the cavity's nodes alone, else
    float64 (the same bits as before).

    Those blocks are most of a sweep there (the GEMM of the latent values, their
    exponentials and the GEMM of E[p pᵀ], K(2K + r) operations a node), which float32 does
    in about 40 % of the time (one 50-class row on 8192 nodes: 3.4 → 1.4 ms); its
    rounding, ~10⁻⁷ relative, is far below the quadrature's own error (10⁻² relative on
    a few hundred to thousands of nodes): EP's fixed point moved by 10⁻¹³-10⁻¹⁰ nats
    (docs/decisions.md). The log-weights, their normalization and the mixture kernels'
    moments stay in float64."""
    return np.float32 if single and n_kernels == 1 else np.float64


#: The floor of the exponents in :func:`_tilted_block`: e^x for x near and below the
#: smallest normal's log (−708.4) takes libm's slow path, 30-250 times a normal one's
#: (20 480 values: 17 µs at −700, 4.4 ms at −708.5, 0.4 ms at −800), and the latent values
#: of a wide cavity's nodes reach there. The floored terms (≤ 10⁻³⁰⁴) enter only sums whose
#: largest term is 1 (the softmax's total, the weights' mass) or products with them.
_EXP_FLOOR = -700.0


def _floored_exp(x: np.ndarray) -> np.ndarray:
    """e^max(x, :data:`_EXP_FLOOR`), in place."""
    np.maximum(x, _EXP_FLOOR, out=x)
    return np.exp(x, out=x)


def _mixture_nodes(kernels, workspace):
    """The nodes of :func:`_tilted_block`'s two kernels, coordinate-major (b, r, 2P): the
    first kernel's P nodes, then the second's; and at each node the log of the second
    kernel's density over the even mixture's (up to log 2).

    Each kernel's nodes ``m + L z`` and their whitening under the other kernel
    ``L'⁻¹(m + L z − m')`` are affine maps of the unit nodes, one GEMM each on the nodes
    with a unit coordinate (a kernel's own nodes whiten to ``z``): the batched products
    of (b, 2P, r) nodes with r × r matrices they replace were most of a two-kernel block
    at few dimensions (5 rows of 3 classes on 2 × 2048 nodes: 1.8 → 0.9 ms), the same
    moments to round-off."""
    lifted = workspace.lifted()
    r, n = lifted.shape[0] - 1, lifted.shape[1]
    b = kernels[0][0].shape[0]
    g = np.empty((b, r, 2 * n))
    half_norms = 0.5 * np.einsum("ap,ap->p", lifted[:r], lifted[:r])
    # d = log N₁ − log N₂ at each node (the kernels' log densities; the shared −(r/2) log 2π
    # cancels): at a kernel's own nodes, −|z|²/2 − log |L|; at the other's, minus half the
    # squared norm of the node whitened by it.
    d = np.empty((b, 2 * n))
    for j, (mean, chol, _, _) in enumerate(kernels):
        other_mean, _, other_inv, _ = kernels[1 - j]
        nodes = slice(j * n, (j + 1) * n)
        mapped = np.empty((b, r, r + 1))
        mapped[:, :, :r], mapped[:, :, r] = chol, mean
        g[:, :, nodes] = np.matmul(mapped.reshape(b * r, r + 1), lifted).reshape(b, r, n)
        mapped[:, :, :r] = np.matmul(other_inv, chol)
        mapped[:, :, r] = np.einsum("bij,bj->bi", other_inv, mean - other_mean)
        white = np.matmul(mapped.reshape(b * r, r + 1), lifted).reshape(b, r, n)
        # (own − other) at the first kernel's nodes, (other − own) at the second's
        sign = 1.0 if j == 0 else -1.0
        np.einsum("bip,bip->bp", white, white, out=d[:, nodes])
        d[:, nodes] -= 2.0 * half_norms
        d[:, nodes] *= 0.5 * sign
    d += (kernels[1][3] - kernels[0][3])[:, None]
    # log N₂ − log(N₁ + N₂) = −log(1 + e^d), without np.logaddexp (several times the time
    # of the exponential it takes).
    log_share = np.abs(d)
    np.negative(log_share, out=log_share)
    log_share = np.log1p(_floored_exp(log_share))
    log_share += np.maximum(d, 0.0)
    np.negative(log_share, out=log_share)
    return g, log_share


def _tilted_block(q, y, kernels, power, z, log_w, workspace=None):
    """Tilted expectations of one block of rows on the nodes ``z``: ``log E[F^s]`` over the
    cavity, and under the tilted density ``F^s × cavity`` either (one kernel) E[p] (b, K)
    and E[p pᵀ] (b, K, K), ``p`` the softmax of the latent values, or (two kernels) the
    tilted mean and covariance of g: ``(log E[F^s], E[p], E[p pᵀ], mean, covariance)``, the
    ones not formed None.

    Self-normalized quadrature. ``kernels`` holds ``(mean, L, L⁻¹, log |L|)`` of the cavity
    alone, whose nodes' weights are ``F^s ≤ 1``; or of the posterior's latent marginal (near
    the tilted density) and the cavity, on their even mixture, whose weights ``F^s cavity /
    mixture`` are at most 2: never heavy-tailed, and the nodes still where the tilted mass
    is when the cavity is far wider (a factor that is nearly a step over it).

    ``workspace`` (a :class:`_Workspace` of the calling thread, or None): the nodes with a
    unit coordinate and the buffers of the (b, K, nodes) values, reused from block to block
    (the same bits as fresh arrays).
    """
    b, r = kernels[0][0].shape
    k = q.shape[0]
    if workspace is None:
        workspace = _Workspace(z)
    if len(kernels) == 1:
        # The latent values f = Q L z + Q m of every row and node as one GEMM, (b·K, r + 1)
        # × (r + 1, P) on the nodes with a unit coordinate, already class-major (b, K,
        # nodes): the nodes g themselves are not needed.
        mean, chol, _, _ = kernels[0]
        mapped = np.empty((b, k, r + 1))
        np.matmul(q, chol, out=mapped[:, :, :r])
        mapped[:, :, r] = mean @ q.T
        f = workspace.values(b * k, 0)
        mapped = mapped.reshape(b * k, r + 1).astype(workspace.dtype, copy=False)
        np.matmul(mapped, workspace.lifted(), out=f)
        f = f.reshape(b, k, len(z))
    else:
        g, log_mixed = _mixture_nodes(kernels, workspace)
        # Class-major (b, K, nodes): reductions over K contiguous (b, nodes) slices.
        f = np.matmul(q, g)
    # Reductions over the classes' axis of (b, K, nodes): contiguous (b, nodes) slices
    # accumulated in class order.
    top = f.max(axis=1)
    chosen = f[np.arange(b), y, :] - top
    f -= top[:, None, :]
    _floored_exp(f)
    total = f.sum(axis=1)
    log_ratio = power[:, None] * (chosen - np.log(total))  # s log F
    if len(kernels) > 1:
        log_ratio += log_mixed
        log_ratio += np.concatenate([log_w, log_w])
    else:
        log_ratio += log_w
    shift = log_ratio.max(axis=1)
    weight = _floored_exp(log_ratio - shift[:, None])
    mass = weight.sum(axis=1)
    weight /= mass[:, None]
    if len(kernels) > 1:
        # The mixture's rows take the nodes' own tilted moments (_direct), never Stein's
        # expectations of p: not formed (a sixth of the block at 3 classes).
        g_mean = np.matmul(g, weight[:, :, None])[..., 0]  # (b, r)
        g -= g_mean[:, :, None]
        # Over few dimensions the transposed view's product (no BLAS) beats copying it.
        g_t = np.swapaxes(g, 1, 2) if r <= 8 else np.ascontiguousarray(np.swapaxes(g, 1, 2))
        g_cov = np.matmul(g * weight[:, None, :], g_t)
        return shift + np.log(mass), None, None, g_mean, g_cov
    # p = f / total at each node: the division goes into the nodes' weights (b × nodes)
    # instead of the (b, K, nodes) values.
    # (In float32 values, the weights are rounded to them for the two products alone.)
    per_total = (weight / total).astype(f.dtype, copy=False)
    expected = np.matmul(f, per_total[:, :, None])[..., 0]  # E[p], (b, K)
    per_total /= total
    scaled = workspace.values(b * k, 1, f.shape[2]).reshape(f.shape)
    np.multiply(f, per_total[:, None, :], out=scaled)
    second = np.matmul(scaled, np.swapaxes(f, 1, 2))  # E[p pᵀ]
    expected, second = expected.astype(float, copy=False), second.astype(float, copy=False)
    return shift + np.log(mass), expected, second, None, None


def _tilted_sites(model, q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok, moments):
    """The moment-matched site of each row ``ok`` (see the module docstring): its precision
    and linear term for one copy of the factor, the log normalizer of its tilted density
    over the unnormalized cavity ``exp(−gᵀPg/2 + hᵀg)``, and whether it was found (a
    proper tilted Gaussian).

    Row i is integrated on the rule at ``state.level[i]``, on the cavity alone or (rows
    ``state.direct``) on the mixture of it and the posterior's marginal. A row whose tilted
    covariance comes out improper (too few nodes where the factor, over a wide cavity, is
    nearly a step) is done again on the next level, which it keeps in the later sweeps;
    a row that the factor narrows much is ``direct`` from the next sweep on: the sweep
    stays one fixed map once the rows have settled, which rules chosen afresh at each
    sweep would not give.
    """
    m, r = v_mean.shape
    k = q.shape[0]
    log_z = np.full(m, np.nan)
    # Read only at the rows a block has written (filling (M, K, K) with NaN cost a sweep
    # 1.5 % at 26 classes × 5000 rows).
    expected, second = np.empty((m, k)), np.empty((m, k, k))
    g_mean, g_cov = np.empty((m, r)), np.empty((m, r, r))
    new_lam, new_eta = np.zeros((m, r, r)), np.zeros((m, r))
    good = np.zeros(m, dtype=bool)
    if moments is None:
        cav_cov, cav_mean, chol, log_det_half = _by_rows(
            _cavity_moments, cav_prec, cav_lin, ok, work=4.0 * r**3
        )
        quad = np.einsum("ma,ma->m", cav_lin, cav_mean)
    else:  # hᵀμ = μᵀPμ = |L⁻¹μ|²
        cav_cov, cav_mean, chol, log_det_half = moments
        quad = _whitened_norms(chol, cav_mean)
    # log ∫ exp(−gᵀPg/2 + hᵀg) dg, to which E[F^s] over the normalized cavity is relative.
    log_norm = 0.5 * quad + log_det_half + 0.5 * r * _LOG_2PI
    if not state.sized:  # the first sweep: each row's rule sized to its cavity's spread
        level, narrow = _spread_levels(cav_cov if ok.all() else cav_cov[ok], rule)
        if state.spread:
            state.level[ok] = np.maximum(state.level[ok], level)
        state.coarse[ok] = (state.level[ok] == 0) & ~state.direct[ok] & narrow
        state.sized = True
    outputs = (log_z, expected, second, g_mean, g_cov)
    for at in range(_n_levels(rule)):
        for mixed in (False, True):
            rows = np.flatnonzero(ok & (state.level == at) & (state.direct == mixed) & ~good)
            # Twice at most: coarse rows whose moments come out improper are done again at
            # once on their level's own nodes.
            while rows.size:
                # All rows (the usual case at one level): views instead of copies of them.
                pick = slice(None) if rows.size == m else rows
                kernels = [(cav_mean[pick], chol[pick], None, log_det_half[pick])]
                if mixed:
                    root = np.linalg.cholesky(v_cov[pick])
                    kernels[0] = (*kernels[0][:2], np.linalg.inv(kernels[0][1]), kernels[0][3])
                    half = np.log(np.diagonal(root, axis1=1, axis2=2)).sum(axis=1)
                    kernels.insert(0, (v_mean[pick], root, np.linalg.inv(root), half))
                for coarse in (True, False):
                    where = np.flatnonzero(state.coarse[rows] == coarse)  # positions in rows
                    if where.size:
                        nodes = _rule_nodes(rule, r, at, coarse)
                        _tilted_blocks(
                            q, model.y, power, rows, where, kernels, nodes, outputs, state.single
                        )
                if mixed:
                    prec, lin = _natural(cav_prec, cav_lin, cav_cov, cav_mean, pick)
                    lam, eta, fine = _direct(g_mean[pick], g_cov[pick], prec, lin)
                else:
                    lam, eta, fine, narrowed = _matched(
                        q,
                        model.y[pick],
                        expected[pick],
                        second[pick],
                        power[pick],
                        cav_cov[pick],
                        cav_mean[pick],
                        None if cav_prec is None else cav_prec[pick],
                        chol[pick],
                    )
                    # Rows the factor narrows much take the nodes' own tilted moments from the
                    # next sweep on, whose moments need more nodes: one level up.
                    narrowed = rows[narrowed]
                    state.direct[narrowed], state.coarse[narrowed] = True, False
                    state.level[narrowed] = np.minimum(
                        state.level[narrowed] + 1, _n_levels(rule) - 1
                    )
                if rows.size == m:  # every row at once: the arrays themselves, not a copy
                    new_lam, new_eta, good = lam, eta, fine
                else:
                    new_lam[pick], new_eta[pick], good[pick] = lam, eta, fine
                failed = rows[~fine]
                again = state.coarse[failed]
                state.coarse[failed] = False
                if at + 1 < _n_levels(rule):
                    state.level[failed[~again]] = at + 1
                rows = failed[again]
    return log_z + log_norm, new_lam, new_eta, good


#: The finest rule level of :func:`_few_tilted_sites` (1: 4 times level 0's nodes, 512 in
#: 2 dimensions), below a sweep's (2: 16 times). Its rows' direct sites are on the even
#: mixture of a kernel near the tilted density and the cavity, whose weights are at most
#: 2 whatever the cavity's width, and the wide rows that Stein's match settles are
#: refitted by the later revisits under narrower cavities: a stream of 300 one-row calls
#: (20 features, 3 classes, from its first row under the default prior) ended 4·10⁻⁴
#: nats from the same stream on 2 × 32 768 nodes (level 2: 8·10⁻⁵; level 0 alone:
#: 7·10⁻³), against its own KL of 0.75 to the batch fit; the 4-class benchmark's stream
#: 2·10⁻⁸ (docs/decisions.md, D-110).
_FEW_ROWS_FINEST = 1
#: A row whose cavity is wide (a rule level above 0) and whose tilted mass there would hold
#: fewer than this many of the rule's nodes (log ∫ F^s × cavity below log(this / nodes):
#: a row deep in its cavity's tail) goes direct in :func:`_few_tilted_sites`: Stein's
#: expectations would be those of the few nodes nearest its class's region (on a stream's
#: first rows under the vague intercept prior, a revisit's site came out nearly zero, and
#: the posterior ran off by thousands of standard deviations).
_TAIL_NODES = 32


def _few_tilted_sites(
    q, labels, kernel_mean, kernel_cov, cav_prec, cav_lin, power, sites, laplace_kernels
):
    """:func:`_tilted_sites` on a few rows, whatever their cavities, without a sweep's
    bookkeeping of the rows' states (``partial_fit``'s window of one-row calls: a few rows
    a call, where that bookkeeping was most of the cost), the rows that go direct taken
    on their nodes' own moments at once.

    A sweep's rules on the default rule: each row's level from its cavity's largest
    variance (:data:`_WIDE_CAVITY`); the tilted expectations on the cavity's nodes and
    Stein's moment matching (:func:`_row_matched`); a row whose tilted covariance comes
    out improper done again a level up (on the finest level, it goes direct); a row the
    factor narrows by more than :data:`_DIRECT` of a variance, or (wide cavities) whose
    tilted mass is deep in its cavity's tail (:data:`_TAIL_NODES`), goes direct a level
    up: its tilted moments on the even mixture of its ``kernel`` (the posterior's marginal
    of its contrasts, as in a sweep) and its cavity (:func:`_direct`). A sweep takes such
    a row's Stein site and goes direct from the next sweep on; here the direct site comes
    in the same call. A new row (its site in ``sites`` = (Λ, η) of zeros: its posterior
    marginal is its cavity, no kernel near its tilted density) takes Stein's tilted
    Gaussian as its kernel where that is proper and not from the tail; it and a row deep
    in its cavity's tail otherwise take the Laplace approximation of their tilted density
    (``laplace_kernels(rows, start, cavities)``, the rows' cavities' precisions,
    linear terms and means given → their means, covariances and whether found,
    as :func:`~vsbayes.approximations.softmax_ep.assumed_density_softmax_row` starts its VS
    fits; Newton's method started at the rows' Stein tilted means, where a wide level
    computed them). A revisited row whose site already narrows its wide cavity by more
    than :data:`_DIRECT` goes direct at once, without the Stein pass. The finest level is
    :data:`_FEW_ROWS_FINEST`. No coarse level (many classes: level 0's own nodes). At three
    classes the rows' 2 × 2 algebra around the tilted blocks (the cavities' moments and
    factors, Stein's match, the direct sites) runs row by row on Python floats
    (:mod:`~vsbayes.approximations._three_class_sites`: the same math to round-off;
    numpy's per-call cost on a handful of 2 × 2 matrices was most of a call's site
    update), and falls back here where they return None.

    Returns ``(log Z over the normalized cavity, Λ, η, found)``, found where the cavity
    and the tilted covariance are proper (elsewhere NaN and zeros)."""
    m, r = kernel_mean.shape
    three = _three_class_cavities(cav_prec, cav_lin) if r == 2 else None
    if three is not None:  # (every cavity proper)
        cav_cov, chol, cav_mean, log_det_half, top = three
        ok = np.ones(m, dtype=bool)
    else:
        cav_cov = np.linalg.inv(cav_prec)
        cav_cov = 0.5 * (cav_cov + np.swapaxes(cav_cov, 1, 2))
        try:
            chol = np.linalg.cholesky(cav_cov)
            ok = np.ones(m, dtype=bool)
        except np.linalg.LinAlgError:
            eye = np.eye(r)
            ok = np.isfinite(cav_cov).all(axis=(1, 2))
            ok[ok] = np.linalg.eigvalsh(cav_cov[ok])[:, 0] > 0
            cav_cov = np.where(ok[:, None, None], cav_cov, eye)
            cav_prec = np.where(ok[:, None, None], cav_prec, eye)
            cav_lin = np.where(ok[:, None], cav_lin, 0.0)
            chol = np.linalg.cholesky(cav_cov)
        cav_mean = np.einsum("mab,mb->ma", cav_cov, cav_lin)
        log_det_half = np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
        # (levels from the largest variances; the exact ones of three classes above, the
        # same levels: a row's bound decides only where it is at most the first threshold)
        top = _row_largest_variances(cav_cov, _WIDE_CAVITY[0])

    def stein(pick, at):  # the tilted expectations on the cavities' nodes, Stein's match
        cavity = (cav_mean[pick], chol[pick], None, log_det_half[pick])
        if r == 2:
            row_z, expected, second, _, _ = _three_class_block(
                q, labels[pick], [cavity], power[pick], at
            )
        else:
            row_z, expected, second, _, _ = _tilted_block(
                q, labels[pick], [cavity], power[pick], *_rule_nodes(None, r, at)
            )
        matched = (_three_class_matched if r == 2 else _row_matched)(
            q,
            labels[pick],
            expected,
            second,
            power[pick],
            cav_cov[pick],
            cav_mean[pick],
            cav_prec[pick],
            chol[pick],
        )
        if not narrow:  # Stein's tilted mean: Newton's start for a Laplace kernel
            residual = -power[pick, None] * expected
            residual[np.arange(len(expected)), labels[pick]] += power[pick]
            gradient = residual @ q
            start[pick] = cav_mean[pick] + np.einsum("mab,mb->ma", cav_cov[pick], gradient)
        return row_z, *matched

    narrow = bool(ok.all()) and top.max() <= _WIDE_CAVITY[0]
    start = np.full((m, r), np.nan)
    if narrow:  # the usual case: every row on level 0, at once
        first = stein(slice(None), 0)
        if (first[3] & ~first[4]).all():
            return first[:4]
    # Rows without a kernel near their tilted density: their own (a site of zeros) or one
    # deep in a wide cavity's tail.
    laplace = ~(sites[0].any(axis=(1, 2)) | sites[1].any(axis=1))
    highest = _FEW_ROWS_FINEST
    level = np.minimum((top > _WIDE_CAVITY[0]).astype(int) + (top > _WIDE_CAVITY[1]), highest)
    # A revisited row whose site already narrows its wide cavity by more than _DIRECT (in
    # the cavity's whitened frame, an eigenvalue of LᵀΛL above 1: the posterior's variance
    # below half the cavity's) goes direct at once, without Stein's pass on its cavity's
    # nodes: the factor narrows the cavity about as much again (a stream's first rows,
    # where nearly every revisit went direct after its Stein pass).
    predicted = np.zeros(m, dtype=bool)
    wide = ok & ~laplace & (level > 0)
    if wide.any():
        lower = chol[wide]
        white = np.swapaxes(lower, 1, 2) @ sites[0][wide] @ lower
        if r == 2:  # its closed form (LAPACK's eigenvalues ~7 µs a call on a few rows)
            half = 0.5 * (white[:, 0, 0] - white[:, 1, 1])
            largest = 0.5 * (white[:, 0, 0] + white[:, 1, 1]) + np.hypot(half, white[:, 1, 0])
        else:
            largest = np.linalg.eigvalsh(white)[:, -1]
        predicted[wide] = largest > 1.0  # (most are: no Cholesky)
    log_z, lam, eta = np.full(m, np.nan), np.zeros((m, r, r)), np.zeros((m, r))
    found, direct, done = np.zeros(m, dtype=bool), np.zeros(m, dtype=bool), ~ok
    direct[predicted] = True
    level[predicted] = np.minimum(level[predicted] + 1, highest)
    kernel_mean, kernel_cov = kernel_mean.copy(), kernel_cov.copy()
    for at in range(highest + 1):
        rows = np.flatnonzero(~done & ~direct & (level == at))
        if rows.size:
            if narrow and at == 0:
                row_z, row_lam, row_eta, fine, narrowed = first
            else:  # (all rows: views of them, no copies)
                pick = slice(None) if rows.size == m else rows
                row_z, row_lam, row_eta, fine, narrowed = stein(pick, at)
            if at:
                nodes = _rule_size(None, r) << (2 * at)
                tail = row_z < math.log(_TAIL_NODES / nodes)
                laplace[rows[tail]] = True
                narrowed |= fine & tail
            settled = fine & ~narrowed
            # A new row that goes direct with a proper Stein site (not in the tail) takes
            # that tilted Gaussian as its kernel, without Newton's iterations to its mode.
            # (A kernel whose covariance round-off left indefinite takes Newton's instead.)
            own = rows[narrowed & ~tail] if at else rows[narrowed]
            own = own[laplace[own] & np.isfinite(start[own]).all(axis=1)]
            if own.size:
                cov = np.linalg.inv(cav_prec[own] + row_lam[np.searchsorted(rows, own)])
                cov = 0.5 * (cov + np.swapaxes(cov, 1, 2))
                proper = np.isfinite(cov).all(axis=(1, 2))
                proper[proper] = _row_positive_definite(cov[proper])
                own, cov = own[proper], cov[proper]
                kernel_mean[own], kernel_cov[own] = start[own], cov
                laplace[own] = False
            take = rows[settled]
            lam[take], eta[take], log_z[take] = row_lam[settled], row_eta[settled], row_z[settled]
            found[take] = done[take] = True
            direct[rows[narrowed]] = True
            if at == highest:  # improper on the finest level too: the nodes' own moments
                direct[rows[~fine]] = True
            level[rows[~settled]] = min(at + 1, highest)
        rows = np.flatnonzero(~done & direct & (level == at))
        if rows.size:
            near = rows[laplace[rows]]
            if near.size:  # the tilted density's Laplace approximation, where found
                mean, cov, fitted = laplace_kernels(
                    near, start[near], (cav_prec[near], cav_lin[near], cav_mean[near])
                )
                kernel_mean[near[fitted]], kernel_cov[near[fitted]] = mean[fitted], cov[fitted]
                laplace[near] = False
            cavities = (cav_prec, cav_lin, cav_mean, chol, log_det_half)
            out = (log_z, lam, eta, found)
            _direct_pass(q, labels, (kernel_mean, kernel_cov), cavities, power, rows, at, out)
            done[rows[found[rows]]] = True
            if at == highest:
                done[rows] = True
            level[rows[~found[rows]]] = min(at + 1, highest)
    return log_z, lam, eta, found


def _direct_pass(q, labels, kernels, cavities, power, rows, level, out) -> None:
    """:func:`_few_tilted_sites`' direct pass on ``rows`` at rule ``level``: the tilted
    moments on the even mixture of each row's kernel (``kernels``: the means and
    covariances of all rows) and cavity (``cavities``: precisions, linear terms, means,
    lower Cholesky factors and log |L| of all rows), written into ``out`` =
    ``(log Z, Λ, η, found)`` at the rows whose site is proper."""
    log_z, lam, eta, found = out
    cav_prec, cav_lin, cav_mean, chol, log_det_half = (x[rows] for x in cavities)
    mean, cov = (x[rows] for x in kernels)
    r = q.shape[1]
    three = _three_class_factors(cov) if r == 2 else None
    if three is not None:
        root, root_inv, root_log_det = three
        cavity_inv = np.array(
            [
                ((1.0 / l00, 0.0), (-l10 / (l00 * l11), 1.0 / l11))
                for (l00, _), (l10, l11) in chol.tolist()
            ]
        ).reshape(-1, 2, 2)
    else:
        root = np.linalg.cholesky(cov)  # (posterior marginals, proper tilted Gaussians)
        root_inv = np.linalg.inv(root)
        root_log_det = np.log(np.diagonal(root, axis1=1, axis2=2)).sum(1)
        cavity_inv = np.linalg.inv(chol)
    kernel = (mean, root, root_inv, root_log_det)
    cavity = (cav_mean, chol, cavity_inv, log_det_half)
    if r == 2:
        row_z, _, _, t_mean, t_cov = _three_class_block(
            q, labels[rows], [kernel, cavity], power[rows], level
        )
    else:
        row_z, _, _, t_mean, t_cov = _tilted_block(
            q, labels[rows], [kernel, cavity], power[rows], *_rule_nodes(None, r, level)
        )
    direct = _three_class_direct if r == 2 else _direct
    row_lam, row_eta, fine = direct(t_mean, t_cov, cav_prec, cav_lin)
    at = rows[fine]
    lam[at], eta[at], log_z[at], found[at] = row_lam[fine], row_eta[fine], row_z[fine], True


def _tilted_blocks(q, labels, power, rows, where, kernels, nodes, out, single=False) -> None:
    """:func:`_tilted_block` on the rows ``rows[where]`` (``kernels``: of all of ``rows``)
    and the rule ``nodes`` (nodes, log-weights), in blocks run side by side, written into
    ``out`` = ``(log_z, E[p], E[p pᵀ], tilted mean, tilted covariance)`` at those rows;
    ``single``: the values in float32 where :func:`_values_dtype` allows."""
    z, log_w = nodes
    log_z, expected, second, g_mean, g_cov = out
    k, r = q.shape
    whole = where.size == rows.size  # then views of the kernels, not copies
    local = threading.local()  # each thread's _Workspace
    dtype = _values_dtype(single, len(kernels))

    def block(part: slice) -> None:
        index = part if whole else where[part]
        sites = rows[index]
        if not hasattr(local, "workspace"):
            local.workspace = _Workspace(z, dtype)
        result = _tilted_block(
            q,
            labels[sites],
            [tuple(None if x is None else x[index] for x in kernel) for kernel in kernels],
            power[sites],
            z,
            log_w,
            local.workspace,
        )
        log_z[sites] = result[0]
        if result[3] is None:
            expected[sites], second[sites] = result[1:3]
        else:
            g_mean[sites], g_cov[sites] = result[3:]

    n_nodes = len(z) * len(kernels)
    cap = max(1, int(block_bytes() // (n_nodes * _node_bytes(k, r))))
    # Blocks of at least 2²⁴ counted multiply-adds: smaller ones (2¹⁹) let wine's 178 rows
    # use both threads (its EP 76 → 70 ms, idle) but cut 20 classes' rows into blocks of
    # 2-3, whose per-block overhead doubled their fit (0.9 → 1.75 s).
    with single_blas_thread():
        map_blocks(block, block_slices(where.size, n_nodes * k * (k + r), cap, 2**24))
