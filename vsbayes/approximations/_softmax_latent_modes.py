"""The modes of multinomial rows' densities in their K − 1 contrasts, by Newton's method.

A row's factor ``softmax(Qg)[y]^s`` depends on θ only through its contrasts
``g = Qᵀ(Θx̃)`` (K − 1 values, Q the centred basis): under a Gaussian, the mode of one
row's density is a Newton problem in K − 1 dimensions, not in θ's. It takes two forms:

* one row under a Gaussian prior of θ: :class:`SoftmaxRowCurvature`, the strategy
  :class:`~vsbayes.approximations.newton_laplace.NewtonLaplaceSolver` runs in the row's
  contrasts (:func:`latent_softmax_mode`, also the first kernel of
  :func:`~vsbayes.approximations.softmax_ep.assumed_density_softmax_row`'s VS site fits),
  and :func:`softmax_row_laplace`, ``partial_fit``'s Laplace update of one row;
* Laplace propagation's site updates of many rows at once
  (:func:`softmax_mode_site_updates`, :class:`ModeSites`): Newton on all rows' tilted
  densities together, Armijo's halvings expanded at once (:func:`_halve_steps`), at three
  classes row by row on Python floats (:func:`_three_class_row_mode`, and
  :func:`_three_class_kernels`, the shortcut of the multinomial EP's Laplace kernels in
  :func:`~vsbayes.approximations.softmax_ep.softmax_site_updates`); EP's mode sites and a
  stream's window of rows (:mod:`~vsbayes.approximations.window_sites`) take them.

Both expand the same tilted log density (:func:`_softmax_expansion`, :func:`_log_softmax`).
They are apart from :mod:`~vsbayes.approximations.newton_laplace`, which keeps the solver
and the curvatures of whole posteriors and of one binary row (its latent a scalar): a
reader of the solver does not meet the batched Newton of EP's sites, and a reader of
those finds them without the solver. The docstrings here name :class:`RowCurvature`,
:func:`row_laplace`, :class:`SoftmaxCurvature`, :class:`NewtonLaplaceSolver` and
:class:`GLMGaussian` as that module does: they live there (``GLMGaussian`` in
:mod:`~vsbayes.approximations._glm_gaussian`), and :func:`softmax_laplace` in
:mod:`~vsbayes.approximations.softmax_laplace`. Moved out of ``newton_laplace`` unchanged
(docs/decisions.md, D-190).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._lapack import cho_solve
from ..engine import LaplaceResult
from ..models.softmax_predictive_rules import centred_basis
from ._glm_gaussian import BlockLatent
from .newton_laplace import (
    _EPS,
    _ROUND_OFF_ULPS,
    Curvature,
    NewtonLaplaceSolver,
    _row_update_result,
)

__all__ = [
    "ModeSites",
    "latent_softmax_mode",
    "softmax_mode_site_updates",
    "softmax_row_laplace",
]


class _SoftmaxLatentRow(NamedTuple):
    """The posterior of one multinomial row's contrasts g (r = K − 1 values):
    ``softmax(Qg)[label]^weight N(g; mean, precision⁻¹)``."""

    q: np.ndarray
    label: int
    weight: float
    mean: np.ndarray
    precision: np.ndarray
    log_norm: float  #: ½ log det(2π V), V = precision⁻¹
    dim: int


class _SmallHessian:
    """An r × r negative Hessian (r small), as :class:`GLMGaussian` offers it to the
    solver."""

    def __init__(self, value: np.ndarray):
        self.lower = np.linalg.cholesky(value)
        self.half_log_det = float(np.log(np.diag(self.lower)).sum())

    def solve(self, v: np.ndarray) -> np.ndarray:
        return cho_solve((self.lower, True), v, check_finite=False)

    @property
    def cov(self) -> np.ndarray:
        cov = self.solve(np.eye(self.lower.shape[0]))
        return 0.5 * (cov + cov.T)


class SoftmaxRowCurvature(Curvature):
    """One multinomial row's contrasts ``g = Qᵀ(Θx̃)`` under their Gaussian prior marginal
    (a :class:`_SoftmaxLatentRow`): :class:`RowCurvature`'s argument in K − 1 dimensions.
    From the prior mean the p-dimensional iterates are ``μ + ΣAᵀV⁻¹(g − m)`` with g these
    iterates (the same decrements and Armijo tests), and as :class:`SoftmaxCurvature` the
    solver takes the final step."""

    final_step = True

    def _expansion(self, theta: np.ndarray):
        row = self.model
        return _softmax_expansion(
            row.q,
            np.array([row.label]),
            np.array([row.weight]),
            row.mean[None],
            row.precision[None],
            theta[None],
        )

    def expand(self, theta: np.ndarray) -> tuple[float, np.ndarray, _SmallHessian]:
        value, grad, curvature = self._expansion(theta)
        hessian = curvature[0] + self.model.precision
        return (
            float(value[0]) - self.model.log_norm,
            grad[0],
            _SmallHessian(0.5 * (hessian + hessian.T)),
        )

    def log_density(self, theta: np.ndarray) -> float:
        row = self.model
        log_softmax, _ = _log_softmax(row.q, np.array([row.label]), theta[None])
        centred = theta - row.mean
        return (
            row.weight * float(log_softmax[0])
            - 0.5 * float(centred @ row.precision @ centred)
            - row.log_norm
        )


def latent_softmax_mode(
    latent, q: np.ndarray, label: int, weight: float, *, tol: float, max_iter: int
) -> NewtonLaplaceSolver:
    """Newton's method on one multinomial row's contrasts from their prior mean
    (:class:`SoftmaxRowCurvature`): the solver, at the mode (``theta``, ``value``,
    ``gaussian``). ``latent`` is the row's
    :class:`~vsbayes.approximations._glm_gaussian.BlockLatent`."""
    precision = np.linalg.inv(latent.cov)
    _, log_det = np.linalg.slogdet(2.0 * math.pi * latent.cov)
    problem = _SoftmaxLatentRow(
        q,
        int(label),
        float(weight),
        latent.mean,
        0.5 * (precision + precision.T),
        0.5 * log_det,
        len(latent.mean),
    )
    solver = NewtonLaplaceSolver(
        problem, tol=tol, max_iter=max_iter, curvature=SoftmaxRowCurvature(problem)
    )
    solver.find_mode(latent.mean.copy())
    return solver


def softmax_row_laplace(
    prior_mean: np.ndarray,
    prior_cov: np.ndarray,
    prior_lower: np.ndarray,
    row: np.ndarray,
    label: int,
    n_classes: int,
    weight: float,
    *,
    fit_intercept: bool = True,
    tol: float = 1e-8,
    max_iter: int = 100,
) -> LaplaceResult:
    """Laplace approximation of one multinomial row under a Gaussian prior of θ
    (``[W.ravel(), b]``): :func:`row_laplace` in the row's K − 1 contrasts
    (:func:`latent_softmax_mode`), then the rank-(K − 1) update of the prior
    (:class:`~vsbayes.approximations._glm_gaussian.BlockLatent`).

    Parameters
    ----------
    prior_mean, prior_cov, prior_lower : ndarray of shapes (p,), (p, p), (p, p)
        The prior N(μ, Σ) and the Cholesky factor of Σ.
    row : ndarray of shape (d,)
        The row's features.
    label : int
        Its class index.
    n_classes : int
        K.
    weight : float
        Its weight s > 0.
    fit_intercept : bool, default=True
        Whether θ ends with the K intercepts.
    tol, max_iter
        As :func:`softmax_laplace`'s.

    Returns
    -------
    LaplaceResult
        As :func:`row_laplace`'s.
    """
    q = centred_basis(n_classes)
    latent = BlockLatent.of_softmax_row(prior_mean, prior_cov, row, q, fit_intercept)
    solver = latent_softmax_mode(latent, q, label, weight, tol=tol, max_iter=max_iter)
    mean, cov = latent.conditioned(prior_mean, prior_cov, solver.theta, solver.gaussian.cov)
    return _row_update_result(
        solver,
        mean,
        cov,
        prior_lower,
        latent_log_norm=solver.model.log_norm,
        grad_norm=float(np.linalg.norm(latent.rows.T @ solver.grad)),
    )


def _log_softmax(q, labels, g) -> tuple[np.ndarray, np.ndarray]:
    """``log softmax(Qg)[y]`` of each row (g: (m, r)), and the class probabilities."""
    f = g @ q.T
    f -= f.max(axis=1)[:, None]
    p = np.exp(f)
    total = p.sum(axis=1)
    p /= total[:, None]
    return f[np.arange(len(f)), labels] - np.log(total), p


def _softmax_expansion(q, labels, power, cav_mean, cav_prec, g):
    """The value ``s log softmax(Qg)[y] − (g − m)ᵀP(g − m)/2``, the gradient (m, r) and the
    likelihood's negative Hessian ``s Qᵀ(diag p − ppᵀ)Q`` (m, r, r) of each row's tilted
    log density at g (as :class:`SoftmaxRowCurvature`'s)."""
    log_softmax, p = _log_softmax(q, labels, g)
    residual = -power[:, None] * p
    residual[np.arange(len(p)), labels] += power
    centred = g - cav_mean
    shift = (cav_prec @ centred[..., None])[..., 0]
    value = power * log_softmax - 0.5 * (centred * shift).sum(axis=1)
    curvature = -power[:, None, None] * (p[:, :, None] * p[:, None, :])
    diagonal = np.arange(p.shape[1])
    curvature[:, diagonal, diagonal] += power[:, None] * p
    return value, residual @ q - shift, q.T @ curvature @ q


#: Most halvings of a Newton step in :func:`softmax_mode_site_updates`.
_HALVINGS = 40


def _halve_steps(args, g, step, value, slope, short, trial, expansion) -> None:
    """A line search of the rows ``short`` over the halved steps ``2⁻ᵏ step`` (k = 1,
    ..., :data:`_HALVINGS`): each takes, of those that rise by at least 10⁻⁴ of their
    predicted rise (Armijo's test), the one of the highest log density, or the last,
    written into ``trial`` and ``expansion`` (their values, gradients and curvatures) at
    those rows.

    All halvings of all rows are expanded at once, (rows × 40) points of K − 1 dimensions:
    over a wide cavity the Newton step overshoots the tilted mode by orders of magnitude
    (the likelihood nearly linear there, the cavity's precision tiny) and took 10-20
    halvings in turn, each a round of numpy calls on a few points that cost about as much
    as all of them. Of the passing points, the first (Armijo's backtracking) landed as far
    beyond the mode again, the next Newton step halved that distance, and a stream's first
    rows under the vague intercept prior took 11-14 Newton steps; the best of them is
    within a factor 2 of the step to the mode along the line: 6-10 steps."""
    rows = np.flatnonzero(short)
    scales = 0.5 ** np.arange(1, _HALVINGS + 1)
    points = g[rows, None, :] + scales[None, :, None] * step[rows, None, :]
    n, r = len(rows), g.shape[1]
    repeated = [np.repeat(a[rows], _HALVINGS, axis=0) for a in args[1:]]
    values, grads, curvatures = _softmax_expansion(
        args[0], *repeated, points.reshape(n * _HALVINGS, r)
    )
    values = values.reshape(n, _HALVINGS)
    rises = values >= value[rows, None] + 1e-4 * scales[None, :] * slope[rows, None]
    best = np.where(rises, values, -np.inf).argmax(axis=1)
    first = np.where(rises.any(axis=1), best, _HALVINGS - 1)
    taken = np.arange(n) * _HALVINGS + first
    trial[rows] = points[np.arange(n), first]
    for whole, part in zip(expansion, (values.ravel(), grads, curvatures), strict=True):
        whole[rows] = part[taken]


class ModeSites(NamedTuple):
    """:func:`softmax_mode_site_updates`' sites, and each row's tilted mode."""

    lam: np.ndarray  #: (m, r, r): the new site precisions (the current where not found)
    eta: np.ndarray  #: (m, r): their linear terms
    log_z: np.ndarray  #: (m,): Laplace's log ∫ F^s × cavity, normalized cavity (NaN: not found)
    found: np.ndarray  #: (m,): the cavity proper and Newton converged
    mode: np.ndarray  #: (m, r): the tilted densities' modes g*
    gradient: np.ndarray  #: (m, r): their log densities' gradients at g* (round-off)
    log_density: np.ndarray  #: (m,): ``s log F(g*) − (g* − m_c)ᵀP(g* − m_c)/2``


def softmax_mode_site_updates(
    q: np.ndarray,
    labels: np.ndarray,
    latent_mean: np.ndarray,
    latent_cov: np.ndarray,
    lam: np.ndarray,
    eta: np.ndarray,
    power: np.ndarray,
    *,
    tol: float = 1e-10,
    max_iter: int = 50,
    start: np.ndarray | None = None,
    cavities: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> ModeSites:
    """Laplace propagation's update of some multinomial rows' sites, all from one
    posterior: each row's cavity (the posterior's marginal ``N(m_i, V_i)`` of its
    contrasts without its site ``(Λ_i, η_i)``), the mode g* of its tilted density
    ``softmax(Qg)[y]^s × cavity`` by Newton's method in the K − 1 contrasts (all rows at
    once, Armijo-halved steps: the density is log-concave), and the new site, the
    likelihood's curvature ``H = s Qᵀ(diag p − ppᵀ)Q`` at g* and ``(P + H) g* − h`` (the
    Gaussian of the tilted density's mode and curvature over the cavity's): with a site of
    zeros, :func:`softmax_row_laplace`'s update; at its fixed point over all sites, the
    joint Laplace approximation.

    Parameters
    ----------
    q, labels, latent_mean, latent_cov, lam, eta, power
        As :func:`~vsbayes.approximations.softmax_ep.softmax_site_updates`'s.
    tol : float, default=1e-10
        Stop where half the Newton decrement (the log density's predicted rise) is within
        ``tol`` or round-off, as :class:`NewtonLaplaceSolver`, after that final step.
    max_iter : int, default=50
        Most Newton steps.
    start : ndarray of shape (m, r), optional
        Newton's starting points (a row's with a non-finite entry, or all without it:
        the posterior's marginal mean). Any start reaches the same mode (the density is
        log-concave); one near it saves the steps from a wide cavity's mean, most of which
        Armijo's test halves.
    cavities : tuple of ndarray, optional
        The rows' cavities' precisions, linear terms and means, all proper, where the
        caller has them
        (:func:`~vsbayes.approximations._softmax_tilted_moments._few_tilted_sites`):
        not formed again from the latent moments and sites.

    At three classes (K − 1 = 2) and up to :data:`_SCALAR_ROWS` rows (a one-row call's
    window) each row's Newton runs on Python floats (:func:`_three_class_row_mode`: the
    same iteration to round-off, each row stopping at its own convergence).

    Returns
    -------
    ModeSites
        The new sites (the current ones where not found), the Laplace approximations of
        log ∫ F^s × cavity over the normalized cavities, whether each row's cavity was
        proper and Newton's method converged, and the modes with the gradients and log
        densities there.
    """
    m, r = latent_mean.shape
    if cavities is None:
        precision = np.linalg.inv(latent_cov)
        precision = 0.5 * (precision + np.swapaxes(precision, 1, 2))
        cav_prec = precision - lam
        cav_lin = np.einsum("mab,mb->ma", precision, latent_mean) - eta
        try:
            np.linalg.cholesky(cav_prec)
            ok = np.ones(m, dtype=bool)
        except np.linalg.LinAlgError:
            ok = np.linalg.eigvalsh(cav_prec)[:, 0] > 0
        cav_prec = np.where(ok[:, None, None], cav_prec, np.eye(r))
        cav_lin = np.where(ok[:, None], cav_lin, 0.0)
        cav_mean = np.linalg.solve(cav_prec, cav_lin[..., None])[..., 0]
    else:
        cav_prec, cav_lin, cav_mean = cavities
        ok = np.ones(m, dtype=bool)
    labels = np.asarray(labels)
    args = (q, labels, power, cav_mean, cav_prec)
    # From the posterior's marginal mean: the tilted mode of a row whose site is at Laplace
    # propagation's fixed point (a revisit's warm start), the cavity's of a new row.
    g = np.where(ok[:, None], latent_mean, cav_mean)
    if start is not None:
        given = ok & np.isfinite(start).all(axis=1)
        g = np.where(given[:, None], start, g)
    scalar = None
    if r == 2 and m <= _SCALAR_ROWS:
        try:
            scalar = _three_class_modes(args, g, tol, max_iter)
        except (ZeroDivisionError, OverflowError, ValueError):  # (a singular step: arrays')
            scalar = None
    if scalar is not None:
        g, value, grad, curvature, converged = scalar
    else:
        g, value, grad, curvature, converged = _array_modes(args, g, tol, max_iter)
    found = ok & converged
    hessian = curvature + cav_prec
    new_lam = np.where(found[:, None, None], 0.5 * (curvature + np.swapaxes(curvature, 1, 2)), lam)
    new_eta = np.where(found[:, None], np.einsum("mab,mb->ma", hessian, g) - cav_lin, eta)
    # Laplace's log ∫ F^s N(g; m_c, P⁻¹): s log F(g*) − (g* − m_c)ᵀP(g* − m_c)/2 −
    # log det(P⁻¹(P + H))/2.
    if r == 2:  # the 2 × 2 determinants written out (two LAPACK calls less)
        ratio = _det_2x2(hessian) / _det_2x2(cav_prec)
        log_z = value - 0.5 * np.log(np.abs(ratio))
    else:
        _, log_det_hessian = np.linalg.slogdet(hessian)
        _, log_det_prec = np.linalg.slogdet(cav_prec)
        log_z = value - 0.5 * (log_det_hessian - log_det_prec)
    return ModeSites(new_lam, new_eta, np.where(found, log_z, np.nan), found, g, grad, value)


def _det_2x2(matrices: np.ndarray) -> np.ndarray:
    """Determinants of (m, 2, 2) matrices."""
    return matrices[:, 0, 0] * matrices[:, 1, 1] - matrices[:, 0, 1] * matrices[:, 1, 0]


#: Most rows of :func:`softmax_mode_site_updates` whose Newton runs row by row on Python
#: floats at three classes (a one-row call's window: six rows at most).
_SCALAR_ROWS = 16


def _three_class_modes(args, g, tol, max_iter):
    """:func:`_array_modes` at three classes (K − 1 = 2 contrasts), each row's Newton on
    Python floats (:func:`_three_class_row_mode`). numpy's per-call cost (1-9 µs a step,
    the 2 × 2 solves ~7 µs) on (m, 2) and (m, 2, 2) arrays made an iteration ~40 µs, and
    the kernels' Newton most of a one-row call on a stream's first rows (0.2-1 ms, 6-10
    steps on a wide cavity); here a few µs. Returns None (the arrays' path) where a value
    is not finite."""
    q, labels, power, cav_mean, cav_prec = args
    basis = tuple(q.ravel().tolist())
    modes = [
        _three_class_row_mode(
            basis, label, s, mean, (p00, 0.5 * (p01 + p10), p11), start, tol, max_iter
        )
        for label, s, mean, ((p00, p01), (p10, p11)), start in zip(
            labels.tolist(),
            power.tolist(),
            cav_mean.tolist(),
            cav_prec.tolist(),
            g.tolist(),
            strict=True,
        )
    ]
    if not all(
        math.isfinite(sum(mode[0]) + mode[1] + sum(mode[2]) + sum(mode[3])) for mode in modes
    ):
        return None
    g, value, grad, curvature, converged = zip(*modes, strict=True)
    curvature = np.array([((c00, c01), (c01, c11)) for c00, c01, c11 in curvature])
    return np.array(g), np.array(value), np.array(grad), curvature, np.array(converged)


def _three_class_kernels(q, labels, power, cavities, latent_mean, start, tol, max_iter=50):
    """The Laplace approximations of some rows' tilted densities at three classes, as
    :func:`softmax_mode_site_updates` with ``cavities`` gives them to
    :func:`~vsbayes.approximations.softmax_ep.softmax_site_updates`' kernels, on Python
    floats: each row's mode by :func:`_three_class_row_mode` (from ``start`` where finite,
    else the posterior's marginal mean), and the covariance ``(P + H)⁻¹`` there by its
    adjugate (exactly symmetric) — without the arrays that function builds around its
    Newton (its sites, evidence and cavities' checks, ~50 µs on a few rows). Returns the
    modes (m, 2), covariances (m, 2, 2) and whether each row's Newton converged; None
    where a value is not finite or a step singular (the general function decides)."""
    cav_prec, _, cav_mean = cavities
    basis = tuple(q.ravel().tolist())
    modes, covs, found = [], [], []
    try:
        for label, s, mean, ((p00, p01), (p10, p11)), given, marginal in zip(
            labels.tolist(),
            power.tolist(),
            cav_mean.tolist(),
            cav_prec.tolist(),
            start.tolist(),
            latent_mean.tolist(),
            strict=True,
        ):
            pm = 0.5 * (p01 + p10)
            first = given if math.isfinite(given[0] + given[1]) else marginal
            g, value, grad, (c00, c01, c11), converged = _three_class_row_mode(
                basis, label, s, mean, (p00, pm, p11), first, tol, max_iter
            )
            h00, h01, h11 = p00 + c00, pm + c01, p11 + c11
            det = h00 * h11 - h01 * h01
            off = -h01 / det
            if not math.isfinite(value + g[0] + g[1] + grad[0] + grad[1] + det + off):
                return None
            modes.append(g)
            covs.append(((h11 / det, off), (off, h00 / det)))
            found.append(converged)
    except (ZeroDivisionError, OverflowError, ValueError):
        return None
    return np.array(modes), np.array(covs), np.array(found, dtype=bool)


def _three_class_row_mode(basis, label, s, mean, precision, start, tol, max_iter):
    """One row's Newton of :func:`_array_modes` at three classes on Python floats: the same
    iteration (the full step, else of Armijo's passing halvings the one of the highest log
    density, else the last; the same stop), its 2 × 2 solve and expansion written out.
    ``basis``: Q's entries by rows; ``precision``: the cavity's (P₀₀, P₀₁, P₁₁). The
    halvings' best is found by scanning them from the longest: the log density is strictly
    concave along the step, so its values at the halvings rise to one peak and then fall,
    and the scan stops once they fall below the best passing one. Round-off apart (and a
    row stopping at its own convergence, not at all rows'), the iterates are
    :func:`_array_modes`'. Returns the mode (g₀, g₁), the log density, its gradient, the
    likelihood's curvature (C₀₀, C₀₁, C₁₁) there and whether Newton converged."""
    q00, q01, q10, q11, q20, q21 = basis
    m0, m1 = mean
    p00, pm, p11 = precision

    def log_density(g0, g1):
        f0, f1, f2 = q00 * g0 + q01 * g1, q10 * g0 + q11 * g1, q20 * g0 + q21 * g1
        top = max(f0, f1, f2)
        total = math.exp(f0 - top) + math.exp(f1 - top) + math.exp(f2 - top)
        chosen = (f0, f1, f2)[label] - top - math.log(total)
        c0, c1 = g0 - m0, g1 - m1
        return s * chosen - 0.5 * (c0 * (p00 * c0 + pm * c1) + c1 * (pm * c0 + p11 * c1))

    def expansion(g0, g1):
        f0, f1, f2 = q00 * g0 + q01 * g1, q10 * g0 + q11 * g1, q20 * g0 + q21 * g1
        top = max(f0, f1, f2)
        e0, e1, e2 = math.exp(f0 - top), math.exp(f1 - top), math.exp(f2 - top)
        total = e0 + e1 + e2
        chosen = (f0, f1, f2)[label] - top - math.log(total)
        p0, p1, p2 = e0 / total, e1 / total, e2 / total
        r0, r1, r2 = -s * p0, -s * p1, -s * p2  # s (e_y − p)
        if label == 0:
            r0 += s
        elif label == 1:
            r1 += s
        else:
            r2 += s
        c0, c1 = g0 - m0, g1 - m1
        h0, h1 = p00 * c0 + pm * c1, pm * c0 + p11 * c1
        value = s * chosen - 0.5 * (c0 * h0 + c1 * h1)
        grad = (r0 * q00 + r1 * q10 + r2 * q20 - h0, r0 * q01 + r1 * q11 + r2 * q21 - h1)
        # s Qᵀ(diag p − p pᵀ)Q = s (Σ p_k q_k q_kᵀ − (Qᵀp)(Qᵀp)ᵀ), q_k the rows of Q
        v0, v1 = p0 * q00 + p1 * q10 + p2 * q20, p0 * q01 + p1 * q11 + p2 * q21
        curvature = (
            s * (p0 * q00 * q00 + p1 * q10 * q10 + p2 * q20 * q20 - v0 * v0),
            s * (p0 * q00 * q01 + p1 * q10 * q11 + p2 * q20 * q21 - v0 * v1),
            s * (p0 * q01 * q01 + p1 * q11 * q11 + p2 * q21 * q21 - v1 * v1),
        )
        return value, grad, curvature

    g0, g1 = start
    value, (grad0, grad1), (c00, c01, c11) = expansion(g0, g1)
    converged = False
    eps = _ROUND_OFF_ULPS * _EPS
    for _ in range(max_iter):
        h00, h01, h11 = c00 + p00, c01 + pm, c11 + p11
        det = h00 * h11 - h01 * h01
        step0 = (h11 * grad0 - h01 * grad1) / det
        step1 = (h00 * grad1 - h01 * grad0) / det
        slope = grad0 * step0 + grad1 * step1  # twice the Newton decrement
        converged = 0.5 * slope <= max(tol, eps * abs(value))
        scale = 1.0
        trial = expansion(g0 + step0, g1 + step1)
        if not converged and not trial[0] >= value + 1e-4 * slope:
            best, scale, previous, at_scale = -math.inf, 0.5**_HALVINGS, -math.inf, 1.0
            for _ in range(_HALVINGS):
                at_scale *= 0.5
                at = log_density(g0 + at_scale * step0, g1 + at_scale * step1)
                if at >= value + 1e-4 * at_scale * slope and at > best:
                    best, scale = at, at_scale
                if at < previous and best >= at:  # past the peak, below the best
                    break
                previous = at
            trial = expansion(g0 + scale * step0, g1 + scale * step1)
        g0, g1 = g0 + scale * step0, g1 + scale * step1
        value, (grad0, grad1), (c00, c01, c11) = trial
        if converged:
            break
    return (g0, g1), value, (grad0, grad1), (c00, c01, c11), converged


def _array_modes(args, g, tol, max_iter):
    """Newton's iterations of :func:`softmax_mode_site_updates`, all rows at once: the
    modes, the log densities, their gradients and the likelihood's curvatures there, and
    whether each row converged."""
    value, grad, curvature = _softmax_expansion(*args, g)
    converged = np.zeros(len(g), dtype=bool)
    for _ in range(max_iter):
        step = np.linalg.solve(curvature + args[4], grad[..., None])[..., 0]
        slope = np.einsum("ma,ma->m", grad, step)  # twice the Newton decrement
        # As the solver's stop: half the decrement within tol (or round-off); the final
        # step is taken whole.
        round_off = _ROUND_OFF_ULPS * np.finfo(float).eps * np.abs(value)
        converged = 0.5 * slope <= np.maximum(tol, round_off)
        # The expansion at the full step: Armijo's test, and the next iteration's (or, the
        # final step, the mode's value and curvature).
        trial = g + step
        expansion = _softmax_expansion(*args, trial)
        short = ~converged & ~(expansion[0] >= value + 1e-4 * slope)
        if short.any():  # Armijo: halve the steps that do not rise enough
            _halve_steps(args, g, step, value, slope, short, trial, expansion)
        g = trial
        value, grad, curvature = expansion
        if converged.all():
            break
    return g, value, grad, curvature, converged
