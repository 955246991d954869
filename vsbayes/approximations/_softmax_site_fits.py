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
