"""The multinomial EP's tilted moments by VS fits: each row's tilted density
``F^s × cavity`` fitted by a quadratic in its K − 1 contrasts on a sampling rule.

:func:`_vs_sites` (the sites from the fits' moments, as :func:`_tilted_sites` gives them
from quadrature) over :func:`_site_fits` (the engine's :func:`~vsbayes.engine.site_fits.fit_sites`
on each row's rule level, raised where a fit is not integrable), the targets' log-softmax
at the rule's nodes (:func:`_log_softmax_affine`), the rules' levels (:func:`_rules`), and
the chord steps' stop and spread (:func:`_chord_tol`, :data:`_CHORD_SPREAD`). Taken by
``sites="fits"``, and by ``sites="auto"`` where the cavities are wide
(:func:`~vsbayes.approximations.softmax_sites._wide_rows`). Moved out of
:mod:`~vsbayes.approximations.softmax_sites` unchanged.
"""

from __future__ import annotations

import numpy as np

from .._blas import block_slices, map_blocks, single_blas_thread
from .._memory import block_bytes
from ..engine.site_fits import fit_sites
from ..sampling import SamplingRule, SymmetricSobol

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


#: The share of the last sweep's undamped relative site change that a sweep's VS site fits
#: take for their tolerance (:func:`_sweep_chord_tol`): each fit is then left at most a
#: hundredth of that change from its optimum, while the sweeps are far from their tol.
_CHANGE_SHARE = 0.1
#: ... only while that change is above this many times EP's tol (the posterior stop's
#: own gate, ``_damped_sweeps._RELATIVE_GATE``): the sweeps that may end the fit run
#: the map they have always run.
_CHANGE_GATE = 100.0


def _sweep_chord_tol(tol: float, change: float | None) -> float:
    """The chord stop of a sweep's VS site fits in an EP that stops at relative site changes
    of ``tol``, after a sweep whose largest undamped relative change was ``change`` (None:
    the first sweep, taken as 1, the changes' scale): the larger of :func:`_chord_tol` of
    ``tol`` and ``(2 × _CHORD_SHARE × _CHANGE_SHARE × change)²`` (``change`` at most 1),
    which leaves each fit at most a hundredth of ``change`` from its optimum.

    An inexact fixed-point iteration (the "forcing terms" of inexact Newton methods): a
    site fit solved to far below what its sweep moves the site is work the next sweep
    discards. Far from the fixed point the fits stop early (digits' first sweep at a
    decrement of 4·10⁻⁴ per unit mass instead of 4·10⁻¹⁰, its second, after an undamped
    change of 0.66, at 1.7·10⁻⁴); as the change falls
    the stop tightens, and it is :func:`_chord_tol`'s once the change is within
    ``√_chord_tol(tol) / (2 × _CHORD_SHARE × _CHANGE_SHARE)`` (10⁻³ at EP's 10⁻⁴), so that
    the sweeps near their stop are the same map as before. Measured on digits (D-262): the
    fits' CPU −20 %, the same 12 sweeps, the posterior 1.8·10⁻⁵ nats (KL) from the one
    with every fit at the final stop."""
    fixed = _chord_tol(tol)
    if change is None or not np.isfinite(change):
        change = 1.0
    change = min(float(change), 1.0)
    if change <= _CHANGE_GATE * tol:
        return fixed
    return max(fixed, (2.0 * _CHORD_SHARE * _CHANGE_SHARE * change) ** 2)


def _chord_tol(tol: float) -> float:
    """The decrement per unit of fitted mass at which the VS site fits' chord steps (and,
    leaving less, their Newton steps: :func:`~vsbayes.engine.site_fits.fit_sites`'s
    ``chord_tol``) stop in the sweeps of an EP that stops at relative site changes of ``tol``:
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


def _site_fits(
    model,
    q,
    mean,
    cov,
    cav_prec,
    cav_lin,
    power,
    rules,
    level,
    ok,
    stop=_CHORD_TOL,
    single=False,
    refine=True,
):
    """VS fits of the tilted densities ``F^power × cavity`` of the rows ``ok``: (log Z, mean,
    cov, integrable) per row, NaN where not fitted; where a fit is not integrable, its log Z
    is the rule's own integral of the target (``SiteFits.log_mass``), its moments NaN.

    Row i is fitted on ``rules[level[i]]``. A fit that is not integrable (a quadratic form
    that is not negative definite, met on wide cavities where the factor is nearly a step
    over the kernel's nodes) is done again on the next rule, and the row keeps that rule in
    the later sweeps (``level`` is raised in place): the sweep stays one fixed map, which a
    rule chosen afresh at each sweep would not be (the levels go back with the sites only
    where the sweeps go back to their best sites: ``_RowState.set_levels``). ``stop``: the
    chord steps' stop (:func:`_chord_tol`); ``single``: the targets' log-softmax in float32
    (:data:`_FIT_SINGLE_TOL`); ``refine`` False: each row on its own level only, none
    refitted nor raised (a sweep that may be discarded first looks at those fits:
    :func:`~vsbayes.approximations.softmax_sites._new_sites`).
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
            # A fit that is not integrable still has the rule's mass: EP's evidence takes
            # it for a row that keeps its last matched site (softmax_ep._log_evidence).
            improper = ~fits.integrable
            log_z[sites[improper]] = fits.log_mass[improper]
            good[sites] = fits.integrable

        # Per site: the points' latent values and log-softmax (K each), their coordinates,
        # the fit's per-point arrays, and its Newton system (n² entries, thrice). Blocks of
        # 2²⁸ multiply-adds at least: each runs its own Newton iterations, whose per-call
        # overhead small blocks would repeat hundreds of times.
        per_site = 8.0 * (n_points * (2 * len(q) + 2 * r + 8) + 3 * n_params**2)
        cap = max(1, int(block_bytes() // per_site))
        with single_blas_thread():
            map_blocks(block, block_slices(len(rows), n_points * n_params**2, cap, 2**28))
        if refine and at + 1 < len(rules):
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

    From the K − 1 differences ``d_c = f_c − f_y`` to the label's latent value:
    ``log softmax(f)[y] = −log(1 + Σ_c e^{d_c})``, with no maximum over the classes (a
    fifth of the log-sum-exp's time) and no gather of the label's values; the differences
    are ``D_y μ + (D_y L) z_j`` with ``D_y`` the rows ``Q_c − Q_y``, one row fewer than
    ``Q``'s: one GEMM of the rows' ((K − 1) × r) maps stacked against the nodes, and on a
    mirrored rule against its first half only (the second half's differences are
    ``D_y μ − (D_y L) z_j``). Forming the points and then ``Q`` at each, two batched
    products of small matrices, took twice the time of the log-sum-exp itself. Where the
    sum overflows (some ``d_c`` above ~88 in float32, ~709 in float64; a node deep on
    another class's side), those nodes are recomputed in float64 with the largest
    difference taken out (:func:`_log_softmax_shifted`; on digits, 2-3 nodes a sweep). Against
    the maximum-subtracted form over the K latent values, on digits' 12 sweeps (10 classes,
    1024 nodes): the site fits 8.9 % faster; float32's largest error against float64 over
    all rows 3.0·10⁻⁵, 1.6·10⁻⁵, 1.9·10⁻⁵ at sweeps 1, 8, 12 (that form's 2.5·10⁻⁵,
    1.6·10⁻⁵, 2.2·10⁻⁵), float64's 10⁻¹³ from that form's (D-203)."""
    m, r = centre.shape
    nodes = z[: len(z) // 2] if mirrored else z
    contrasts = _contrasts(q)[label]  # (m, K − 1, r): the rows' D_y
    middle = np.einsum("mca,ma->mc", contrasts, centre)  # (m, K − 1)
    maps = np.matmul(contrasts, chol)  # (m, K − 1, r): the rows' D_y L_i
    n_other = maps.shape[1]
    spread = maps.reshape(m * n_other, r).astype(dtype, copy=False) @ nodes.T.astype(
        dtype, copy=False
    )
    spread = spread.reshape(m, n_other, len(nodes))
    d = np.empty((m, n_other, len(z)), dtype)  # (m, K − 1, P)
    at_centre = middle[:, :, None].astype(dtype, copy=False)
    np.add(at_centre, spread, out=d[:, :, : len(nodes)])
    if mirrored:
        np.subtract(at_centre, spread, out=d[:, :, len(nodes) :])
    del spread
    # (m, K − 1, P): sums over K − 1 contiguous (m, P) slices, where reductions over a last
    # axis of K − 1 entries cost numpy several times more (10× at K = 3).
    with np.errstate(over="ignore"):
        np.exp(d, out=d)
        total = d[:, 0, :].copy()
        for c in range(1, n_other):
            total += d[:, c, :]
    out = np.log1p(total)
    np.negative(out, out=out)
    lost = np.isinf(total)
    if lost.any():
        # The rows with such nodes, at all their nodes in float64: within the block's
        # budget of K float64 latent values per node (_site_fits) whatever the number of
        # such nodes, where a gather of each node's map would take r times more.
        del d
        rows = np.flatnonzero(lost.any(axis=1))
        far = np.matmul(maps[rows], z.T)  # (n, K − 1, P)
        far += middle[rows][:, :, None]
        out[rows] = np.where(lost[rows], _log_softmax_shifted(far), out[rows])
    return out


def _contrasts(q: np.ndarray) -> np.ndarray:
    """``D_y`` (K, K − 1, r) for each label y: the rows ``Q_c − Q_y`` of the classes
    ``c ≠ y``, in class order."""
    k = q.shape[0]
    other = np.arange(k - 1)[None, :] + (np.arange(k - 1)[None, :] >= np.arange(k)[:, None])
    return q[other] - q[:, None, :]


def _log_softmax_shifted(d: np.ndarray) -> np.ndarray:
    """``−log(1 + Σ_c e^{d_c})`` of differences ``d`` (n, K − 1, P) (overwritten): (n, P),
    with the largest of 0 and the ``d_c`` taken out of the exponentials: finite wherever
    the differences are."""
    top = np.maximum(d.max(axis=1), 0.0)
    d -= top[:, None, :]
    np.exp(d, out=d)
    total = np.exp(-top)
    for c in range(d.shape[1]):
        total += d[:, c, :]
    return -(top + np.log(total))


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
    refine=True,
):
    """:func:`_tilted_sites` by VS fits of the tilted densities (their natural parameters
    minus the cavity's); ``stop``, ``single`` and ``refine`` as :func:`_site_fits`'."""
    r = q.shape[1]
    log_z, t_mean, t_cov, good = _site_fits(
        model, q, v_mean, v_cov, cav_prec, cav_lin, power, rules, level, ok, stop, single, refine
    )
    t_prec = np.linalg.inv(np.where(good[:, None, None], t_cov, np.eye(r)))
    lam = np.where(good[:, None, None], t_prec - cav_prec, 0.0)
    t_lin = np.einsum("iab,ib->ia", t_prec, np.where(good[:, None], t_mean, 0.0))
    eta = np.where(good[:, None], t_lin - cav_lin, 0.0)
    return log_z, lam, eta, good
