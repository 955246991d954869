"""The multinomial EP's site updates: each row's Gaussian site on its K − 1 contrasts
``g_i = Qᵀ f_i`` from its cavity and tilted density, all rows at once.

What a sweep of :func:`~vsbayes.approximations.softmax_ep.softmax_ep` asks of the rows
(:func:`_new_sites`, :func:`_sites`; the method is described in
:mod:`~vsbayes.approximations.softmax_ep`, which holds the posterior of the contrasts, the
sweep loop, the one-row update, the sizing and the evidence): the cavities (their natural
parameters, or from 17 classes on their moments from one solve a row); the tilted moments,
by VS fits (:func:`_site_fits`) or by self-normalized quadrature on mirrored Sobol nodes
(:func:`_tilted_sites`), with the rules' node counts and the per-row levels
(:class:`_RowState`: wide, narrow and direct rows); the moment matching into new sites; the
Laplace sites the sweeps start from; and the checks and projections on the positive
(semi-)definite cone. Also used by the leave-one-out refits
(:mod:`~vsbayes.approximations.ep_leave_one_out`).
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

import numpy as np

from .._blas import block_slices, map_blocks, single_blas_thread
from .._memory import block_bytes
from ..engine.site_fits import fit_sites
from ..sampling import SamplingRule, SymmetricSobol
from ._three_class_sites import (
    _three_class_block,
    _three_class_cavities,
    _three_class_direct,
    _three_class_factors,
    _three_class_matched,
)
from ._tilted_rule import _DEFAULT_NODES, _DIRECT, _n_levels, _rule_nodes, _rule_size

__all__ = ["MAX_FITTED_CLASSES"]

_LOG_2PI = math.log(2.0 * math.pi)


def _by_rows(func, *arrays, work: float = 1.0, min_work: float = 2**23):
    """``func(*arrays)`` for functions of each row alone (batched small factorizations and
    products of (M, r, r) stacks), run on consecutive row slices by :func:`map_blocks`:
    outside the tilted moments' blocks these per-row steps were the sweep's serial part.
    The same bits as one call (each row's LAPACK call and products are the same);
    ``work`` is the multiply-adds per row, ``min_work`` a slice's least. Returns the
    slices' outputs concatenated (a tuple of arrays if ``func`` returns one)."""
    m = len(arrays[0])
    slices = block_slices(m, work, None, min_work)
    if len(slices) == 1:
        return func(*arrays)
    # The outputs' shapes from the function on no rows; each slice writes its part in its
    # own thread: concatenating the parts afterwards copied every (M, r, r) output once
    # more on one thread (8 % of the fit at 26 classes × 5000 rows).
    empty = func(*(a[:0] for a in arrays))
    single = not isinstance(empty, tuple)
    outputs = tuple(np.empty((m, *e.shape[1:]), e.dtype) for e in ((empty,) if single else empty))

    def run(rows: slice) -> None:
        parts = func(*(a[rows] for a in arrays))
        for out, part in zip(outputs, (parts,) if single else parts, strict=True):
            out[rows] = part

    with single_blas_thread():
        map_blocks(run, slices)
    return outputs[0] if single else outputs


class _RowState:
    """How the sites are found: ``rules`` for VS fits (None: tilted moments), and per row
    the rule level and whether it takes the nodes' own moments — raised, never lowered, so
    that the sweep stays one fixed map once the rows have settled."""

    def __init__(
        self,
        m: int,
        rules: list[SamplingRule] | None = None,
        pending: list[SamplingRule] | None = None,
    ):
        self.rules = rules
        # sites="auto": the VS fits' rules, taken at the first sweep if the rows are wide.
        self.pending = pending
        self.level = np.zeros(m, dtype=int)
        self.direct = np.zeros(m, dtype=bool)
        # Rows of level 0 on a quarter of its nodes (narrow cavities, _spread_levels); cleared,
        # never set again, where such a row's moments come out improper or it goes direct.
        self.coarse = np.zeros(m, dtype=bool)
        # The cavities' moments from one solve (_row_cavity_moments), without their natural
        # parameters: the tilted moments' sweeps with many classes (_many_classes; never the
        # VS fits, which read them).
        self.fused = False
        self.sized = False  # the tilted moments' levels not yet set from the rows' spread
        # Whether rows with wide cavities start finer (_WIDE_CAVITY); False (EP as the
        # kernel of VS's global fit): every row starts on level 0 and goes finer only as the
        # sweeps find it needs to (improper moments, a direct row).
        self.spread = True
        # The tilted blocks' values in float32 (_values_dtype): set by softmax_ep where its
        # tolerance is far above their rounding; never the leave-one-out refits' states.
        self.single = False
        # The VS fits' chord stop (_chord_tol): set by softmax_ep from its tolerance.
        self.chord_tol = _CHORD_TOL
        # The VS fits' targets in float32 (_FIT_SINGLE_TOL): set by softmax_ep.
        self.fit_single = False


#: A row whose cavity's largest variance exceeds the first (second) of these starts the
#: tilted moments one (two) rule levels up. The factor varies on the scale of one unit of
#: the latent values; over a much wider cavity it is nearly a step, and the quadrature of
#: its moments needs more nodes (wine's cavities, variances 4-19: 128 nodes in 2 dimensions
#: left EP 0.012 nats from its fixed point on 8192, 512 nodes 0.0012; iris's, 0.8-5.4, 2e-4
#: on 128). Above 1 instead of 4, a quarter of the rows of 50 classes went to 2048 nodes.
_WIDE_CAVITY = (4.0, 16.0)

#: Most classes for which ``sites="auto"`` takes VS fits where more than ``_WIDE_SHARE`` of
#: the rows' cavities are wider than the second of ``_WIDE_CAVITY`` (digits: the median
#: row's largest variance 22, up to 2·10³): there the factors are steps over the cavities'
#: nodes, whose weighted moments came out singular on a few rows even on 16 times the
#: nodes, where a quadratic fit on the VS rule stays proper.
MAX_FITTED_CLASSES = 10
_WIDE_SHARE = 0.1
#: The (K − 1)-dimensional site fits' chord steps stop where Newton's do, at a decrement of
#: 10⁻¹⁴ per unit of fitted mass (the last step ~10⁻⁷ relative, leaving at most a tenth of
#: it: ~10⁻⁸), instead of taking their linear convergence on to ~10⁻¹⁴ (decrements down to
#: ~10⁻²⁶, ~45 % of the chord steps on digits). The fits' own quadrature error on their
#: 16 nodes per parameter is orders above either (D-102). A sweep whose EP stops at a
#: looser site change takes :func:`_chord_tol` of it.
_CHORD_TOL = 1e-14
#: Least tolerance of the multinomial EP (relative site change) at which its VS site fits
#: take their targets' log-softmax at the nodes in float32: the latent values' rounding
#: there, ~6·10⁻⁸ of their size (up to tens on digits: ~3·10⁻⁶ in the log-target), moves
#: each fit by about as much relative, thirty times below that tolerance; the log-softmax
#: (its maximum, exponentials and sums over the classes at every node) was 28 % of the fits'
#: time and takes 40-50 % of it in float32. Below it (the small problems' sweeps to 10⁻⁸),
#: float64 as before. The fits' own Newton steps stay in float64.
_FIT_SINGLE_TOL = 1e-4
#: The share of EP's tolerance (relative site change) within which a chord-stopped site fit
#: is left from its optimum, at most (:func:`_chord_tol`).
_CHORD_SHARE = 0.1
#: The loosest chord stop, EP's at 10⁻⁴ (the estimators' default where a sweep is costly):
#: at 10⁻³ (VS's kernel, 4·10⁻⁸) the kernel's sweeps on iris at C ≈ 220 stopped a sweep
#: apart, and the empirical Bayes' C moved by 4 % (220 → 228; at 4·10⁻¹⁰, by 6·10⁻⁵).
_CHORD_MAX = 4e-10


def _chord_tol(tol: float) -> float:
    """The decrement per unit of fitted mass at which the VS site fits' chord steps stop
    in the sweeps of an EP that stops at relative site changes of ``tol``:
    ``(2 × _CHORD_SHARE × tol)²``, at least :data:`_CHORD_TOL` and at most
    :data:`_CHORD_MAX`.

    The last chord step, of relative size ~√decrement, is taken without a line search and
    leaves an error of at most the chord steps' contraction (below ``_CHORD_SPREAD`` = ½)
    times it: at most a tenth of ``tol``, so that the fits' stop moves no site by as much
    as the sweeps' own. Measured on digits (EP at 10⁻⁴, 12 sweeps either way): the fits'
    objective evaluated 5.2 → 3.9 times a row and sweep, each row's fit moved by at most
    ~10⁻¹¹ nats (KL), EP's posterior by 10⁻⁹ nats (D-144). At EP's tolerances of
    10⁻⁷ and below (the small problems' sweeps) it is :data:`_CHORD_TOL`, as before."""
    return min(max((2.0 * _CHORD_SHARE * tol) ** 2, _CHORD_TOL), _CHORD_MAX)


#: The (K − 1)-dimensional site fits take chord steps (the rule's shared Gram matrix as
#: their Hessian) wherever their fit is within this relative spread of the kernel at every
#: node, instead of the engine's 0.1: the chord steps then contract the error by at most a
#: half each (the Hessian lies within ±spread × mass × Gram), in practice far less (the
#: spread is a maximum over the tail nodes), and a site's own Hessian costs as much as
#: about six of the objective's evaluations (its 715 monomials per node at 10 classes,
#: against the 55 features). Measured on one digits sweep (1797 rows, 1024 nodes, one BLAS
#: thread): 0.34 → 0.27 s, the fits moved by 5·10⁻⁹ standard deviations (their own stop
#: leaves ~10⁻⁸); a spread of 1 took no less time and up to 12 iterations.
_CHORD_SPREAD = 0.5


def _wide_rows(widest: np.ndarray) -> bool:
    """Whether ``sites="auto"`` takes VS fits for rows whose cavities' largest variances
    are ``widest`` (up to :data:`MAX_FITTED_CLASSES` classes)."""
    return bool(widest.size) and float(np.mean(widest > _WIDE_CAVITY[-1])) > _WIDE_SHARE


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


def _sites(model, q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok, moments=None):
    """Every row's new site for one copy of its factor: ``(log Z, Λ, η, found)`` by the
    method of ``state`` (:func:`_vs_sites` or :func:`_tilted_sites`; with ``sites="auto"``
    chosen here, at the first sweep, once). ``moments``: the cavities' moments from
    :func:`_cavity_moments_of` (then ``cav_prec`` and ``cav_lin`` are None: tilted moments
    only)."""
    if state.pending is not None:
        if _wide_rows(1.0 / np.linalg.eigvalsh(cav_prec[ok])[:, 0]):
            state.rules = state.pending
        state.pending = None
    if state.rules is not None:
        return _vs_sites(
            model,
            q,
            v_mean,
            v_cov,
            cav_prec,
            cav_lin,
            power,
            state.rules,
            state.level,
            ok,
            state.chord_tol,
            state.fit_single,
        )
    return _tilted_sites(
        model, q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok, moments
    )


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
        # Class-major (b, K, nodes), as in _log_softmax_of: reductions over K contiguous slices.
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


def _cavity_moments(cav_prec, cav_lin, ok):
    """Covariance, mean, lower Cholesky factor and log |L| of each cavity (the identity's
    where the cavity is improper, ``ok`` False)."""
    r = cav_prec.shape[1]
    if ok.all():  # the usual case: no copies of the rows in and out
        cav_cov = np.linalg.inv(cav_prec)
    else:
        cav_cov = np.broadcast_to(np.eye(r), cav_prec.shape).copy()
        cav_cov[ok] = np.linalg.inv(cav_prec[ok])
    cav_cov = 0.5 * (cav_cov + np.swapaxes(cav_cov, 1, 2))
    cav_mean = np.einsum("mab,mb->ma", cav_cov, cav_lin)
    chol = np.linalg.cholesky(cav_cov)
    log_det_half = np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
    return cav_cov, cav_mean, chol, log_det_half


def _natural(cav_prec, cav_lin, cav_cov, cav_mean, rows):
    """The cavities' precisions and linear terms at ``rows``: given, or from their moments."""
    if cav_prec is not None:
        return cav_prec[rows], cav_lin[rows]
    precision = np.linalg.inv(cav_cov[rows])
    precision = 0.5 * (precision + np.swapaxes(precision, 1, 2))
    return precision, np.einsum("mab,mb->ma", precision, cav_mean[rows])


def _whitened_norms(chol: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``|L⁻¹ b|²`` of each row's vector b and lower triangular L: forward substitution
    over the r columns, each step on every row of a slice at once, the slices side by side
    (the same bits: a serial pass of r numpy steps over all rows was ~1 % of a 26-class
    fit, four times a fit)."""
    r = vectors.shape[1]
    return _by_rows(_row_whitened_norms, chol, vectors, work=float(r**3))


def _row_whitened_norms(chol: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    white = np.empty_like(vectors)
    for j in range(vectors.shape[1]):
        done = np.einsum("ma,ma->m", chol[:, j, :j], white[:, :j])
        white[:, j] = (vectors[:, j] - done) / chol[:, j, j]
    return np.einsum("ma,ma->m", white, white)


def _cavity_moments_of(v_mean, v_cov, lam, eta, copies):
    """:func:`_row_cavity_moments` on row slices run side by side."""
    r = v_mean.shape[1]
    return _by_rows(_row_cavity_moments, v_mean, v_cov, lam, eta, copies, work=4.0 * r**3)


def _row_cavity_moments(v_mean, v_cov, lam, eta, copies):
    """Covariance, mean, lower Cholesky factor and log |L| of each cavity, and whether it is
    proper (the identity's where not), from the latent moments (m, V) and the sites without
    the cavities' natural parameters: with ``P = V⁻¹ − Λ/c = V⁻¹(I − VΛ/c)``, the covariance
    ``(I − VΛ/c)⁻¹ V`` and the mean ``(I − VΛ/c)⁻¹ (m − Vη/c)``, one solve where
    :func:`_row_cavity` and :func:`_cavity_moments` take two inverses and a factorization
    more."""
    m, r = v_mean.shape
    shrink = np.matmul(v_cov, lam)  # VΛ/c: the site's share of the row's latent precision
    shrink /= copies[:, None, None]
    rhs = np.empty((m, r, r + 1))
    rhs[:, :, :r] = v_cov
    rhs[:, :, r] = v_mean - np.matmul(v_cov, eta[..., None])[..., 0] / copies[:, None]
    try:
        # VΛ/c is similar to the symmetric R ᵀΛR/c (V = RRᵀ): its spectral radius is at
        # most √tr((VΛ/c)²).
        bound = np.sqrt(np.einsum("mab,mba->m", shrink, shrink))
        solved = _near_identity_solve(shrink, rhs, bound)
    except np.linalg.LinAlgError:  # a singular system (an improper cavity): the two inverses
        cav_prec, cav_lin, ok = _row_cavity(v_mean, v_cov, lam, eta, copies)
        return (*_cavity_moments(cav_prec, cav_lin, ok), ok)
    cav_cov = solved[:, :, :r]
    cav_cov = 0.5 * (cav_cov + np.swapaxes(cav_cov, 1, 2))
    cav_mean = np.ascontiguousarray(solved[:, :, r])
    try:
        chol = np.linalg.cholesky(cav_cov)
        ok = np.ones(m, dtype=bool)
    except np.linalg.LinAlgError:
        finite = np.isfinite(cav_cov).all(axis=(1, 2))
        ok = finite.copy()
        ok[finite] = np.linalg.eigvalsh(cav_cov[finite])[:, 0] > 0
        cav_cov[~ok] = np.eye(r)
        cav_mean[~ok] = 0.0
        chol = np.linalg.cholesky(cav_cov)
    log_det_half = np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
    return cav_cov, cav_mean, chol, log_det_half, ok


#: Largest bound on the spectral radius of E for which :func:`_near_identity_solve` takes
#: the series (six factors at most); beyond it an LU solve, whose cost is about that of 14
#: batched products of the rows' r × r matrices.
_SERIES_BOUND = 0.5
#: Relative truncation error of the series: round-off (the unit round-off of float64).
_SERIES_EPS = 2.0**-52


def _series_factors(bound: np.ndarray) -> np.ndarray:
    """Factors k of :func:`_near_identity_solve`'s product for spectral radii at most
    ``bound`` (< :data:`_SERIES_BOUND`): the least with ``bound^(2^k) ≤ ε (1 − bound)``,
    the truncation's relative error."""
    b = np.clip(bound, 1e-300, _SERIES_BOUND)
    ratio = np.log(_SERIES_EPS * (1.0 - b)) / np.log(b)
    return np.maximum(np.ceil(np.log2(np.maximum(ratio, 1.0))), 1).astype(int)


def _near_identity_solve(e: np.ndarray, rhs: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """``(I − E)⁻¹ X`` for each row's E (M, r, r) and X (M, r, n), given a bound on E's
    spectral radius (M,): by the product ``(I + E)(I + E²)(I + E⁴)…`` of batched matrix
    products where the bound is below :data:`_SERIES_BOUND`, to the unit round-off; else
    by an LU solve (which raises ``LinAlgError`` where I − E is singular).

    The many-class sweeps' two solves a row (the cavity's, ``VΛ/c``, and the site's,
    ``HΣ``) are of this kind, with radii of 0.04 in the median and 0.2 at most at 20-26
    classes: numpy's batched LU solve of a 19 × 19 system with 19 right-hand sides costs
    as much as ~14 batched products of 19 × 19 matrices, the series 7-9 of them. Each
    row's series takes its own number of factors; its round-off is that of the products,
    which the LU solve's is not bitwise."""
    r = e.shape[1]
    series = bound < _SERIES_BOUND  # (NaN: the LU solve)
    if not series.any():
        return np.linalg.solve(np.eye(r) - e, rhs)
    if series.all():
        at, x, power = slice(None), rhs.copy(), e
        out = x
    else:
        out = np.empty_like(rhs)
        lu = np.flatnonzero(~series)
        out[lu] = np.linalg.solve(np.eye(r) - e[lu], rhs[lu])
        at = np.flatnonzero(series)
        x, power = rhs[at], e[at]
    need = _series_factors(bound[at])
    active = None  # positions in x of the rows that need the next factor (None: all)
    for factor in range(int(need.max())):
        if factor:
            keep = need > factor if active is None else need[active] > factor
            if not keep.all():
                active = np.flatnonzero(keep) if active is None else active[keep]
                power = power[keep]
            power = power @ power
        if active is None:
            x += power @ x
        else:
            x[active] += power @ x[active]
    if out is not x:
        out[at] = x
    return out


def _matched(q, y, expected, second, power, cav_cov, cav_mean, cav_prec, chol):
    """:func:`_row_matched` on row slices run side by side (``cav_prec`` None: the cavities'
    precisions are the inverses of ``cav_cov``, taken where needed)."""
    if cav_prec is None:
        return _by_rows(
            lambda *rows: _row_matched(q, *rows[:-1], None, rows[-1]),
            y,
            expected,
            second,
            power,
            cav_cov,
            cav_mean,
            chol,
            work=4.0 * q.shape[1] ** 3,
        )
    return _by_rows(
        lambda *rows: _row_matched(q, *rows),
        y,
        expected,
        second,
        power,
        cav_cov,
        cav_mean,
        cav_prec,
        chol,
        work=4.0 * q.shape[1] ** 3,
    )


def _row_matched(q, y, expected, second, power, cav_cov, cav_mean, cav_prec, chol):
    """The site (precision, linear term) whose product with the cavity has the tilted
    density's mean and covariance, from the tilted expectations of the softmax (Stein's
    identities, see the module docstring), whether the tilted covariance is proper, and
    whether the factor narrows the cavity by more than :data:`_DIRECT` of a variance in some
    direction (``chol``: the cavity covariance's lower Cholesky factor)."""
    m, k = expected.shape
    s = power[:, None]
    residual = -s * expected
    residual[np.arange(m), y] += power  # γ = E[∇ log F^s] in the latent values: s (e_y − E p)
    # E[∇∇ F^s / F^s] = s² E[(e_y − p)(e_y − p)ᵀ] − s E[diag p − p pᵀ], and the tilted
    # covariance is Σ − Σ H Σ with H = γγᵀ − that. The label's terms cancel between γγᵀ and
    # the first expectation: H = s diag(E p) − (s + s²) E[p pᵀ] + s² E p E pᵀ.
    h_latent = (-(s + s * s))[..., None] * second
    h_latent[:, np.arange(k), np.arange(k)] += s * expected
    scaled = s * expected
    h_latent += scaled[:, :, None] * scaled[:, None, :]
    grad = residual @ q  # (m, r)
    hess = q.T @ h_latent @ q
    hess = 0.5 * (hess + np.swapaxes(hess, 1, 2))
    # Where the factor narrows the cavity much (a step over a wide cavity), the Stein form's
    # covariance Σ − ΣHΣ is a difference of nearly equal terms. The factor's largest
    # reduction of a cavity variance is λ_max(Lᵀ H L), LLᵀ = Σ; below _DIRECT (_DIRECT·I −
    # Lᵀ H L positive definite) the tilted covariance Σ − ΣHΣ = L (I − LᵀHL) Lᵀ is proper too.
    eye = np.eye(q.shape[1])
    many = _many_classes(q.shape[1])
    if many:
        # |LᵀHL|²_F = tr((HΣ)²): from H Σ, which the site's series solve takes, without
        # LᵀHL on every row (round-off apart; fewer classes keep their bits).
        shrink = hess @ cav_cov
        norms = np.einsum("mab,mba->m", shrink, shrink)
    else:
        whitened = np.swapaxes(chol, 1, 2) @ hess @ chol
        norms = np.einsum("mab,mab->m", whitened, whitened)
    # λ_max ≤ the Frobenius norm: rows within _DIRECT by the norm are settled without a
    # factorization (every row at 20-26 classes, norms 0.04 in the median).
    settled = norms < _DIRECT**2
    if not settled.all():
        if many:
            lower = chol[~settled]
            whitened = np.swapaxes(lower, 1, 2) @ hess[~settled] @ lower
        else:
            whitened = whitened[~settled]
        settled[~settled] = _row_positive_definite(_DIRECT * eye - whitened)
    # Otherwise: proper tilted covariance ⇔ P − H positive definite.
    fine = settled.copy()
    if not settled.all():
        if cav_prec is None:
            precision, _ = _natural(None, None, cav_cov, cav_mean, ~settled)
        else:
            precision = cav_prec[~settled]
        fine[~settled] = _row_positive_definite(precision - hess[~settled])
    every = bool(fine.all())  # the usual case: no copies to zero the other rows
    if not every:
        hess = np.where(fine[:, None, None], hess, 0.0)
    # The site precision (H⁻¹ − Σ)⁻¹ = (I − H Σ)⁻¹ H, and its linear term γ + Λ μ_t with
    # the tilted mean μ_t = Σ (h + γ).
    if many:
        # H Σ is similar to Lᵀ H L: its spectral radius is at most the latter's Frobenius
        # norm (the zeroed rows' H Σ is 0).
        if every:
            bound = np.sqrt(norms)
        else:
            bound = np.where(fine, np.sqrt(norms), 0.0)
            shrink = np.where(fine[:, None, None], shrink, 0.0)
        lam = _near_identity_solve(shrink, hess, bound)
    else:
        lam = np.linalg.solve(eye - hess @ cav_cov, hess)
    lam += np.swapaxes(lam, 1, 2)  # (overlapping operands: NumPy buffers them)
    lam *= 0.5
    t_mean = cav_mean + np.einsum("mab,mb->ma", cav_cov, grad)
    eta = grad + np.einsum("mab,mb->ma", lam, t_mean)
    if not every:
        eta = np.where(fine[:, None], eta, 0.0)
    return lam, eta, fine, fine & ~settled


def _direct(t_mean, t_cov, cav_prec, cav_lin):
    """The site from the tilted mean and covariance of the nodes, and whether it is proper."""
    eigval, eigvec = np.linalg.eigh(t_cov)
    fine = eigval[:, 0] > 0
    eigval = np.where(fine[:, None], eigval, 1.0)
    t_prec = (eigvec / eigval[:, None, :]) @ np.swapaxes(eigvec, 1, 2)
    lam = t_prec - cav_prec
    eta = np.einsum("mab,mb->ma", t_prec, t_mean) - cav_lin
    return np.where(fine[:, None, None], lam, 0.0), np.where(fine[:, None], eta, 0.0), fine


def _site_fits(
    model, q, mean, cov, cav_prec, cav_lin, power, rules, level, ok, stop=_CHORD_TOL, single=False
):
    """VS fits of the tilted densities ``F^power × cavity`` of the rows ``ok``: (log Z, mean,
    cov, integrable) per row, NaN where not fitted.

    Row i is fitted on ``rules[level[i]]``. A fit that is not integrable (a quadratic form
    that is not negative definite, met on wide cavities where the factor is nearly a step
    over the kernel's nodes) is done again on the next rule, and the row keeps that rule in
    the later sweeps (``level`` is raised in place): the sweep stays one fixed map, which a
    rule chosen afresh at each sweep would not be. ``stop``: the chord steps' stop
    (:func:`_chord_tol`); ``single``: the targets' log-softmax in float32
    (:data:`_FIT_SINGLE_TOL`).
    """
    r = q.shape[1]
    dtype = np.float32 if single else np.float64
    log_z = np.full(len(mean), np.nan)
    fit_mean, fit_cov = np.full_like(mean, np.nan), np.full_like(cov, np.nan)
    good = np.zeros(len(mean), dtype=bool)
    for at, rule in enumerate(rules):
        rows = np.flatnonzero(ok & (level == at) & ~good)
        if not rows.size:
            continue
        n_points = rule.n_points(r)
        n_params = (r + 1) * (r + 2) // 2
        chol = np.linalg.cholesky(cov[rows])
        y = model.y[rows]

        def block(part: slice, rows=rows, chol=chol, y=y, rule=rule) -> None:
            sites = rows[part]
            prec, lin, pw, label = cav_prec[sites], cav_lin[sites], power[sites], y[part]

            def log_target(centre, chol, z, mirrored):
                values = _log_softmax_affine(centre, chol, z, mirrored, q, label, dtype)
                return pw[:, None] * values

            fits = fit_sites(
                log_target,
                mean[sites],
                chol[part],
                rule,
                gaussian_factor=(prec, lin),
                chord_tol=stop,
                chord_spread=_CHORD_SPREAD,
                affine=True,
            )
            log_z[sites], fit_mean[sites], fit_cov[sites] = fits.log_Z, fits.mean, fits.cov
            good[sites] = fits.integrable

        # Per site: the points' latent values and log-softmax (K each), their coordinates,
        # the fit's per-point arrays, and its Newton system (n² entries, thrice). Blocks of
        # 2²⁸ multiply-adds at least: each runs its own Newton iterations, whose per-call
        # overhead small blocks would repeat hundreds of times.
        per_site = 8.0 * (n_points * (2 * len(q) + 2 * r + 8) + 3 * n_params**2)
        cap = max(1, int(block_bytes() // per_site))
        with single_blas_thread():
            map_blocks(block, block_slices(len(rows), n_points * n_params**2, cap, 2**28))
        if at + 1 < len(rules):
            level[rows[~good[rows]]] = at + 1
    return log_z, fit_mean, fit_cov, good


def _log_softmax_affine(
    centre: np.ndarray,
    chol: np.ndarray,
    z: np.ndarray,
    mirrored: bool,
    q: np.ndarray,
    label: np.ndarray,
    dtype: type = np.float64,
) -> np.ndarray:
    """``log softmax(Q g)[y]`` of each row's label at its points ``g_j = μ + L z_j``: (m, P),
    computed in ``dtype`` (float32: see :data:`_FIT_SINGLE_TOL`).

    The latent values are ``Qμ + (QL) z_j``: one GEMM of the rows' (K × r) maps stacked
    against the nodes, and on a mirrored rule against its first half only (the second
    half's values are ``Qμ − (QL) z_j``). Forming the points and then ``Q`` at each, two
    batched products of small matrices, took twice the time of the log-sum-exp itself."""
    m, r = centre.shape
    k = q.shape[0]
    nodes = z[: len(z) // 2] if mirrored else z
    maps = np.matmul(q, chol).reshape(m * k, r).astype(dtype, copy=False)  # the rows' Q L_i
    spread = (maps @ nodes.T.astype(dtype, copy=False)).reshape(m, k, len(nodes))
    middle = (centre @ q.T)[:, :, None].astype(dtype, copy=False)
    f = np.empty((m, k, len(z)), dtype)  # (m, K, P)
    np.add(middle, spread, out=f[:, :, : len(nodes)])
    if mirrored:
        np.subtract(middle, spread, out=f[:, :, len(nodes) :])
    return _log_softmax_of(f, label)


def _log_softmax_of(f: np.ndarray, label: np.ndarray) -> np.ndarray:
    """``log softmax(f)[y]`` of latent values ``f`` (m, K, P) (overwritten): (m, P).

    The latent values are laid out (m, K, P): the log-sum-exp's maximum and sum run over K
    contiguous (m, P) slices, where reductions over a last axis of K entries cost numpy
    several times more (10× at K = 3)."""
    chosen = f[np.arange(len(f)), label, :]
    top = f[:, 0, :].copy()
    for j in range(1, f.shape[1]):
        np.maximum(top, f[:, j, :], out=top)
    f -= top[:, None, :]
    np.exp(f, out=f)
    total = f[:, 0, :].copy()
    for j in range(1, f.shape[1]):
        total += f[:, j, :]
    chosen -= np.log(total) + top
    return chosen


def _rules(rule: SamplingRule) -> list[SamplingRule]:
    """The rule, then (a :class:`SymmetricSobol`) the same with 4 and 16 times the nodes."""
    if not isinstance(rule, SymmetricSobol):
        return [rule]
    return [
        SymmetricSobol(f * rule.points_per_param, f * rule.min_points, rule.seed)
        for f in (1, 4, 16)
    ]


def _vs_sites(
    model,
    q,
    v_mean,
    v_cov,
    cav_prec,
    cav_lin,
    power,
    rules,
    level,
    ok,
    stop=_CHORD_TOL,
    single=False,
):
    """:func:`_tilted_sites` by VS fits of the tilted densities (their natural parameters
    minus the cavity's); ``stop`` and ``single`` as :func:`_site_fits`'."""
    r = q.shape[1]
    log_z, t_mean, t_cov, good = _site_fits(
        model, q, v_mean, v_cov, cav_prec, cav_lin, power, rules, level, ok, stop, single
    )
    t_prec = np.linalg.inv(np.where(good[:, None, None], t_cov, np.eye(r)))
    lam = np.where(good[:, None, None], t_prec - cav_prec, 0.0)
    t_lin = np.einsum("iab,ib->ia", t_prec, np.where(good[:, None], t_mean, 0.0))
    eta = np.where(good[:, None], t_lin - cav_lin, 0.0)
    return log_z, lam, eta, good


def _laplace_sites(model, q, start) -> tuple[np.ndarray, np.ndarray]:
    """The factors' second-order expansions at ``start`` in g = Qᵀf: (Λ, η) per row."""
    _, p = model.probabilities(np.asarray(start, dtype=float))
    s = model.sample_weight[:, None]
    residual = -s * p
    residual[np.arange(len(p)), model.y] += model.sample_weight

    def curvatures(p, s):
        # s (diag p − p pᵀ), the diagonal added to the outer products' negatives (the same
        # bits as the difference of the two matrices, without their einsum on the
        # identity), in the contrasts.
        curvature = s[..., None] * (p[:, :, None] * p[:, None, :])
        np.negative(curvature, out=curvature)
        diagonal = np.arange(p.shape[1])
        curvature[:, diagonal, diagonal] += s * p
        return q.T @ curvature @ q

    # On row slices side by side (the same bits): a serial pass of the (M, K, K)
    # curvatures cost the many-class fits as much as a tenth of a sweep.
    k = p.shape[1]
    lam = _by_rows(curvatures, p, s, work=2.0 * k**3)
    W, b = model.split(start)
    g = (np.asarray(model.X @ W.T) + b) @ q
    return lam, np.einsum("iab,ib->ia", lam, g) + residual @ q


def _new_sites(model, contrast, post, lam, eta, power, rule, state, record=None):
    """One undamped sweep: every site moment-matched to its tilted density (PSD-projected);
    a row whose cavity or tilted covariance is improper keeps its site.

    ``record`` (a dict), if given, receives what EP's evidence at the sites the sweep
    started from needs (``evidence``: :func:`_site_evidence`'s arguments), where that
    evidence is the one the final pass would compute at them: every row's cavity and tilted
    density proper, and no row's rule level or method moved by the sweep (else None)."""
    copies = np.maximum(model.sample_weight, 1.0)
    v_mean, v_cov = contrast.latent(post[0], post[1])
    cav_prec, cav_lin, ok, moments = _cavities(v_mean, v_cov, lam, eta, copies, state)
    before = (state.level.copy(), state.direct.copy(), state.rules, state.coarse.copy())
    log_z, site_lam, site_eta, good = _sites(
        model, contrast.q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok, moments
    )
    ok &= good
    if record is not None:
        settled = (
            bool(ok.all())
            and before[2] is state.rules
            and np.array_equal(before[0], state.level)
            and np.array_equal(before[1], state.direct)
            and np.array_equal(before[3], state.coarse)
        )
        record["evidence"] = (post, log_z, v_mean, v_cov) if settled else None
    if ok.all() and np.all(copies == 1.0):  # the usual case: the new sites themselves
        return _psd(site_lam), site_eta
    new_lam = np.where(ok[:, None, None], copies[:, None, None] * site_lam, lam)
    new_eta = np.where(ok[:, None], copies[:, None] * site_eta, eta)
    return _psd(new_lam), new_eta


def _cavities(v_mean, v_cov, lam, eta, copies, state):
    """``(cav_prec, cav_lin, ok, moments)`` for :func:`_sites`: the cavities' natural
    parameters, or (``state.fused``) their moments alone."""
    if state.fused:
        *moments, ok = _cavity_moments_of(v_mean, v_cov, lam, eta, copies)
        return None, None, ok, tuple(moments)
    return (*_cavity(v_mean, v_cov, lam, eta, copies), None)


def _cavity(v_mean, v_cov, lam, eta, copies):
    """Cavity natural parameters of one copy of each factor, and whether they are proper."""
    r = v_mean.shape[1]
    return _by_rows(_row_cavity, v_mean, v_cov, lam, eta, copies, work=4.0 * r**3)


def _row_cavity(v_mean, v_cov, lam, eta, copies):
    v_prec = np.linalg.inv(v_cov)
    v_prec = 0.5 * (v_prec + np.swapaxes(v_prec, 1, 2))
    c = copies[:, None, None]
    cav_prec = v_prec - lam / c
    cav_lin = np.einsum("iab,ib->ia", v_prec, v_mean) - eta / copies[:, None]
    ok = _positive_definite(cav_prec)
    return cav_prec, cav_lin, ok


def _positive_definite(matrices: np.ndarray) -> np.ndarray:
    """Whether each symmetric matrix (M, r, r) is positive definite.

    One batched Cholesky factorization where all are (the sweeps' usual case: ~20 times
    cheaper than eigenvalues, r = 19); the smallest eigenvalues only where some is not.
    """
    r = matrices.shape[1]
    return _by_rows(_row_positive_definite, matrices, work=r**3 / 3, min_work=_CHECK_WORK)


#: Least multiply-adds of a slice of the batched positive-definiteness checks: a Cholesky
#: factorization of 2000 matrices 19 × 19 (r³/3 ≈ 2300 multiply-adds each) took
#: 4.3 ms in one slice and 2.4 ms in four on the 2 cores, where _by_rows' usual floor kept
#: it in one.
_CHECK_WORK = 2**21


def _row_positive_definite(matrices: np.ndarray) -> np.ndarray:
    try:
        np.linalg.cholesky(matrices)
    except np.linalg.LinAlgError:
        return np.linalg.eigvalsh(matrices)[:, 0] > 0
    return np.ones(len(matrices), dtype=bool)


def _psd(lam: np.ndarray) -> np.ndarray:
    """Each symmetric matrix's projection on the positive semi-definite cone (``lam``
    itself where every matrix is positive definite)."""
    r = lam.shape[1]
    work = r**3 / 3
    if not _many_classes(r) and len(lam) * work <= _CHECK_WORK:
        # One slice's check, where the VS fits' sites fail it on nearly every row
        # (_row_psd): then the eigendecompositions are the work, and sized by it they run
        # on row slices side by side (each row's own decomposition: the same bits), where
        # the check's work kept digits' 1797 rows in one serial slice (12 ms, twice a sweep).
        if _symmetric_definite(lam):
            return lam
        return _by_rows(_decomposed_psd, lam, work=_EIGEN_WORK * r**3, min_work=_CHECK_WORK)
    return _by_rows(_row_psd, lam, work=work, min_work=_CHECK_WORK)


#: A batched symmetric eigendecomposition's work per matrix over r³, in the units of
#: :data:`_CHECK_WORK` (the 19 × 19 factorizations: ~1 ns a multiply-add): 6.7 µs a
#: 9 × 9 matrix, ~9 r³ (small matrices are mostly LAPACK's per-call overhead).
_EIGEN_WORK = 9.0


def _symmetric(lam: np.ndarray) -> np.ndarray:
    symmetric = lam + np.swapaxes(lam, 1, 2)
    symmetric *= 0.5
    return symmetric


def _symmetric_definite(lam: np.ndarray) -> bool:
    """Whether every matrix's symmetric part has a Cholesky factor (one batched call)."""
    try:
        np.linalg.cholesky(_symmetric(lam))
    except np.linalg.LinAlgError:
        return False
    return True


def _row_psd(lam: np.ndarray) -> np.ndarray:
    # One batched Cholesky factorization clears the usual case of the many-class sweeps.
    if _symmetric_definite(lam):
        return lam
    return _decomposed_psd(lam)


def _decomposed_psd(lam: np.ndarray) -> np.ndarray:
    # The rows with a negative eigenvalue are rebuilt from their eigendecompositions, and
    # the others keep their sites as they are (not their round-off reconstruction). From
    # 17 classes on a few rows fail the check: their eigenvalues find them, and they alone
    # are decomposed. With fewer, the VS fits' sites come out slightly indefinite on nearly
    # every row (digits): the slice's eigendecompositions at once, without the eigenvalues
    # first, which doubled the projection's cost.
    symmetric = _symmetric(lam)
    if _many_classes(lam.shape[1]):
        rows = np.flatnonzero(np.linalg.eigvalsh(symmetric)[:, 0] < 0)
        eigval, eigvec = np.linalg.eigh(symmetric[rows])
    else:
        eigval, eigvec = np.linalg.eigh(symmetric)
        rows = np.flatnonzero(eigval[:, 0] < 0)
        eigval, eigvec = eigval[rows], eigvec[rows]
    if not rows.size:
        return lam
    out = lam.copy()
    out[rows] = (eigvec * np.maximum(eigval, 0.0)[:, None, :]) @ np.swapaxes(eigvec, 1, 2)
    return out


class _OneRow(NamedTuple):
    """What :func:`_sites` reads of a model: the rows' labels."""

    y: np.ndarray
