"""Variational sampling of many small targets at once: the site fits of expectation propagation.

Expectation propagation on a GLM needs, for every observation i, the Gaussian fitted to a
*tilted* density ``p_i(t) = F_i(t) × cavity_i(t)`` of dimension k (1 for a binary link, K
for softmax). Each is a variational-sampling fit (Roche 2013, eq. 5) — the same objective
and the same quadratic family (:class:`~vsbayes.engine.families.FullFamily`) as the global
fit — of its own target, on a rule mapped through its own Gaussian kernel
``π_i = N(μ_i, L_i L_iᵀ)``: points ``t_ij = μ_i + L_i z_j``. Since every site uses the same
standard nodes ``z_j``, the feature matrix Φ (P points × n parameters) is shared, and the
M Newton problems are solved together as BLAS products and batched n×n solves, with no
loop over sites. A site whose fit is within 10 % (``chord_spread``) of its kernel at every
point (at the start, and at every sweep near EP's fixed point) takes the rule's shared Gram
matrix as its Hessian (a chord step: exact Newton where the fit equals the kernel, linear
convergence at a rate below that spread otherwise), so that it needs no n × n matrix of
its own; a deterministic rule's nodes, features and Gram matrix are kept for its next
fits.

With a deterministic rule (e.g. :class:`~vsbayes.sampling.GaussHermite`), the fit of a
Gaussian target is exact (any rule with at least n points in general position), and the
error otherwise is that of the rule on the smooth ratio ``p_i/π_i``, which is small when
the kernel is near the tilted density.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._indices import triu_indices
from ..sampling import SamplingRule
from ._linalg import flushed_exp
from .families import FullFamily

__all__ = ["FIT_RELATIVE_ERROR", "SiteFits", "fit_sites"]

# Newton stops after the step whose decrement per unit of fitted mass is below this: the
# step is then ~1e-7 relative and, by quadratic convergence, leaves an error ~1e-14.
_TOL = 1e-14
#: The relative error Newton's stop leaves a fit's parameters with (``_TOL``): a fitted
#: variance is known to about this relative, whatever the arithmetic around it (binary EP's
#: round-off bound on its site changes, D-193).
FIT_RELATIVE_ERROR = _TOL
# Largest relative spread of q̄ over the points for which the shared Hessian is taken.
_CHORD = 0.1
# Decrement per unit of fitted mass of the kernel's Newton step above which a site's fit
# also starts from the Gaussian of its target's moments on the rule. On digits' EP sweeps
# (k = 9) the kernel's step was the better start on 99 % of the rows from the second sweep
# on, and on every row whose step's decrement was below 10⁻³ (2 % of the first sweep's
# rows, 27 % of the second's, 93 % of the twelfth's); in the quadratic region the Newton
# step leaves a decrement of the order of ¼ κ δ² (κ ≤ 81, D-203): ≤ 2·10⁻⁵ there. Which start
# a site takes moves its fit only within its stop (the optimum is the same).
_MOMENT_START = 1e-3


class SiteFits(NamedTuple):
    """Gaussians fitted to M targets of dimension k.

    Attributes
    ----------
    log_Z : ndarray of shape (M,)
        Log integrals of the fits (the targets' estimated log normalizing constants); NaN
        where not ``integrable``.
    mean : ndarray of shape (M, k)
        Means.
    cov : ndarray of shape (M, k, k)
        Covariances (finite only where ``integrable``).
    integrable : ndarray of shape (M,), bool
        Whether the fitted quadratic form is negative definite (a Gaussian exists).
    n_iter : int
        Newton iterations (the largest over sites).
    log_mass : ndarray of shape (M,)
        Log integrals of the targets by the rule itself (its zeroth moment of the target
        over the kernel, ``|det L| Σ_j w_j p̄_j``), fit or no fit: where a fit is not
        integrable (a near-step target over a wide kernel) the mass is still there.
    """

    log_Z: np.ndarray
    mean: np.ndarray
    cov: np.ndarray
    integrable: np.ndarray
    n_iter: int
    log_mass: np.ndarray


def fit_sites(
    log_target: Callable[[np.ndarray], np.ndarray],
    kernel_mean: np.ndarray,
    kernel_chol: np.ndarray,
    rule: SamplingRule,
    *,
    max_iter: int = 50,
    gaussian_factor: tuple[np.ndarray, np.ndarray] | None = None,
    chord_tol: float | None = None,
    chord_spread: float = _CHORD,
    affine: bool = False,
) -> SiteFits:
    """Fit an unnormalized Gaussian to each of M targets by variational sampling.

    Parameters
    ----------
    log_target : callable
        ``log_target(t)`` with ``t`` of shape (M, P, k) — P points per target, target i at
        ``t[i]`` — returns the (M, P) unnormalized log-densities.
    kernel_mean : ndarray of shape (M, k)
        Means of the kernels.
    kernel_chol : ndarray of shape (M, k, k)
        Lower Cholesky factors of the kernels' covariances.
    rule : SamplingRule
        The rule for N(0, I_k); a deterministic one needs ``n_points(k)``.
    max_iter : int, default=50
        Maximum Newton iterations.
    gaussian_factor : (ndarray of shape (M, k, k), ndarray of shape (M, k)), optional
        ``(P_i, h_i)``: each target also has the factor ``exp(−tᵀP_i t/2 + h_iᵀt)`` (EP's
        cavity), which ``log_target`` leaves out. It is a quadratic in the rule's frame
        too, evaluated at the nodes as one product with the features (and, on a mirrored
        rule, over half of them): a third of the cost of forming it at the points.
    chord_tol : float, optional
        Decrement per unit of fitted mass at which a site on chord steps stops. None: at
        ``1e-28 / spread²``, the chord steps' linear convergence (rate ``spread`` ≤ 0.1)
        taken to Newton's ~1e-14; a looser one stops where the last step is
        ~√chord_tol relative and leaves about ``spread`` times that (above ``1e-14``,
        that last step is taken without a line search, as Newton's last one is). The
        sites on Newton's steps then stop there too (at ``1e-14`` if that is looser):
        their last step leaves an error of the order of the decrement itself, below the
        chord steps' ``spread × √chord_tol``.
    chord_spread : float, default=0.1
        Largest relative spread of the fit over the kernel at the points (``q̄`` about its
        mean) at which a site takes a chord step (the rule's shared Gram matrix as its
        Hessian) instead of forming its own: the chord steps contract the error by at most
        that spread each (below 1: they converge, to the same optimum).
    affine : bool, default=False
        Call ``log_target(kernel_mean, kernel_chol, z, mirrored)`` instead, with the rule's
        standard nodes ``z`` (P, k) (``mirrored``: its second half is the first's
        negatives): the target then evaluates at the points ``t_ij = μ_i + L_i z_j`` itself,
        without forming them (e.g. a linear map of them as ``Aμ_i + (A L_i) z_j``).

    Returns
    -------
    SiteFits
    """
    kernel_mean = np.asarray(kernel_mean, dtype=float)
    kernel_chol = np.asarray(kernel_chol, dtype=float)
    m, k = kernel_mean.shape
    shared = _rule_arrays(rule, k)
    z, weights, phi, log_window = shared.z, shared.weights, shared.phi, shared.log_window
    family = FullFamily(z)
    if affine:
        log_p = log_target(kernel_mean, kernel_chol, z, shared.mirrored)
    else:
        t = np.matmul(kernel_chol, z.T).transpose(0, 2, 1)  # (M, P, k): L_i z_j
        t += kernel_mean[:, None, :]
        log_p = log_target(t)
    weighted = gaussian_factor is not None and shared.uniform
    if weighted:
        # log(w p̄) = log w − log π + the factor + log p, the first three one quadratic in
        # the frame (the factor's coordinates plus the window's, as weighted_fit takes
        # them): one product and one pass, where the window's subtraction and the weights'
        # product took a pass over the (M, P) values each.
        factor = _factor_in_frame(*gaussian_factor, kernel_mean, kernel_chol)
        log_ratio = shared.values(factor + shared._window_basis)
        np.add(log_ratio, log_p, out=log_ratio)
    else:
        # log p̄ = log p/π, in float64 whatever the target's dtype (one pass: the same bits
        # as converting first).
        log_ratio = np.subtract(log_p, log_window, dtype=float)
        if gaussian_factor is not None:
            log_ratio += shared.values(_factor_in_frame(*gaussian_factor, kernel_mean, kernel_chol))
    # One shift per site: the largest ratio is 1, so no overflow whatever the scale of p
    # (with the weights in it, w p̄ at most 1: the same shift of p̄, whose scale log Z adds).
    shift = np.max(log_ratio, axis=1)
    shift = np.where(np.isfinite(shift), shift, 0.0)
    log_ratio -= shift[:, None]
    wp = flushed_exp(log_ratio)
    if not weighted:
        wp *= weights  # (M, P)
    folded = shared.folded(wp)  # (the target's moments and the moment start share it)
    target_moments = shared.sums(wp, folded)  # (M, n): Σ_j w_j p̄_ij φ_j
    # The rule's own integral of each target (φ_0 = 1), over t: |det L| times that over z.
    log_det_chol = np.log(np.abs(np.diagonal(kernel_chol, axis1=1, axis2=2))).sum(axis=1)
    with np.errstate(divide="ignore"):
        log_mass = np.log(target_moments[:, 0]) + shift + log_det_chol

    def objective(sites, v):
        # Returns the weighted fit w q̄ too: the next Newton step needs it. A trial step far
        # too long overflows to an infinite objective, which the line search rejects.
        # (Its sum too: a finite fit of huge values can overflow there, and numpy's
        # RuntimeWarning reached the user's fit, on digits at C = 10⁴, D-273.)
        with np.errstate(over="ignore", invalid="ignore"):
            wq = shared.weighted_fit(v)
            total = wq.sum(axis=1)
        return total - np.einsum("mn,mn->m", target_moments[sites], v), wq

    everyone = np.arange(m)
    # Up to three starts, each site taking the one of smallest objective: the kernel (q̄ = 1)
    # scaled to the sampled mass; from k = 2 on, the kernel's Newton step, exact Newton
    # there (q̄ constant: the Hessian is the mass times the Gram matrix, the gradient the
    # target's moments against the Gram matrix's first row, no sums over the nodes); and
    # the Gaussian with the rule's moments of p̄, whose fit's moments on the rule equal
    # those, so that where the rule integrates q̄ well (a kernel near the target: EP's
    # sites) it is within the rule's error of the optimum and Newton needs one or two steps
    # instead of four or five. That third start costs k × k factorizations and inverses a
    # site (with its objective's evaluation, a tenth of a late EP sweep's fits at k = 9),
    # and the kernel's step is as close wherever that step is short: from k = 2 on it is
    # formed only for the sites whose kernel step's decrement exceeds _MOMENT_START
    # (D-213).
    v = _kernel_start(wp, k, family.n_params)
    # At the kernel q̄ is the sampled mass at every node: no exponentials.
    level = np.exp(v[:, 0] + 0.5 * k * math.log(2.0 * math.pi))
    starts = everyone
    if k > 1:
        # The kernel's objective from its mass alone; its weighted fit is formed only for
        # the few sites that stay there (the step's evaluation is every other site's).
        mass = level * weights.sum()
        value = mass - np.einsum("mn,mn->m", target_moments, v)
        grad = level[:, None] * shared.gram[0] - target_moments
        step = grad @ shared.gram_inverse()
        step /= -level[:, None]
        decrement = -np.einsum("mn,mn->m", grad, step) / mass  # per unit of mass
        stepped_value, wq_all = objective(everyone, v + step)
        better = stepped_value < value
        v[better] += step[better]
        value[better] = stepped_value[better]
        if not better.all():
            wq_all[~better] = weights * level[~better, None]
        starts = np.flatnonzero(~(decrement <= _MOMENT_START))
    else:
        wq_all = weights * level[:, None]
        value = wq_all.sum(axis=1) - np.einsum("mn,mn->m", target_moments, v)
    if starts.size:
        if starts is not everyone:
            wp = wp[starts]
            folded = None if folded is None else (folded[0][starts], folded[1][starts])
        matched = _moment_start(wp, shared, k, family.n_params, folded)
        if matched is not None:
            _take_better(v, value, wq_all, starts, matched, objective)
    del folded
    active = everyone  # sites still iterating
    # Their weighted fits, in the order of `active` (gathered only when sites leave it, and
    # replaced by the line search's evaluations where every site took its full step: each
    # pass over these (M, P) values costs as much as a fitted value's exponential).
    wq, wq_all = wq_all, None
    failed = np.zeros(m, dtype=bool)
    n_iter = 0
    while active.size and n_iter < max_iter:
        n_iter += 1
        # (At the first iteration every site: the arrays themselves, not gathered copies.)
        every = active is everyone
        mass = wq.sum(axis=1)
        folded = shared.folded(wq)  # (the gradient's and the full sites' Hessians' share it)
        grad = shared.sums(wq, folded) - (target_moments if every else target_moments[active])
        # Where q̄ is within chord_spread of its mean over the points (a kernel near the
        # fit: EP's sites near their fixed point), the Hessian Σ_j w_j q̄_j φ_j φ_jᵀ is
        # mass × gram to within that fraction: such a site takes that shared matrix (a chord
        # step, converging linearly at a rate below that spread, and exactly Newton's where
        # q̄ is constant, as at the start), and only the others form their own, n²/2
        # products per point. The optimum, where the gradient vanishes, is the same.
        # One-dimensional sites (binary EP) stay with Newton: their Hessians cost nothing,
        # and a chord step's slower convergence costs target evaluations (measured on
        # breast cancer: EP-logistic 34 → 48 ms with chord steps).
        if k > 1:
            with np.errstate(divide="ignore", invalid="ignore"):
                spread = shared.spread(wq, mass)
            chord = spread <= chord_spread
        else:
            spread, chord = np.ones_like(mass), np.zeros(mass.shape, dtype=bool)
        step = np.empty_like(grad)
        if chord.any():
            # The rule's inverse Gram matrix, formed once: one GEMM of the chord sites'
            # gradients instead of an LU factorization and its solves at every iteration.
            step[chord] = grad[chord] @ shared.gram_inverse()
            step[chord] /= -mass[chord, None]
        full = np.flatnonzero(~chord)
        if full.size:
            hess = shared.hessians(wq, full, folded)
            # A site whose fitted mass has underflowed at every node (a kernel far from its
            # target) has no Newton system: it stops, and is reported not integrable.
            lost = ~(mass[full] > 0)
            hess[lost] = np.eye(phi.shape[1])
            grad[full[lost]] = 0.0
            failed[active[full[lost]]] = True
            # A relative ridge of 1e-13 keeps a numerically rank-deficient system (mass on a
            # few nodes) solvable; it changes the step only, not the optimum the steps reach.
            diagonal = np.einsum("mii->mi", hess)
            diagonal += 1e-13 * diagonal.sum(axis=1, keepdims=True)
            step[full] = -np.linalg.solve(hess, grad[full][..., None])[..., 0]
        decrement = -np.einsum("mn,mn->m", grad, step)
        # Within the quadratic region Newton's full step leaves round-off only: those sites
        # stop. A chord step also converges linearly, leaving about spread × the step: it
        # stops once that is as small too, at a decrement of at most _TOL² / spread² (with
        # spread ≤ chord_spread, a few more of its cheap steps).
        with np.errstate(divide="ignore"):
            limit = np.where(chord, np.minimum(_TOL, _TOL**2 / spread**2), _TOL)
        if chord_tol is not None:
            # Newton's sites stop at the chord sites' stop too. A Newton step s (H s = −g)
            # leaves the gradient ∫₀¹ (H(v + ts) − H(v)) s dt, where H(v + ts) weighs node j
            # by w_j q̄_j e^{t a_j}, a_j = φ_j·s the step's change of the fit's log there:
            # by Cauchy–Schwarz over the weights w q̄, an error (in the objective's metric
            # per unit of mass) of about ½ √E[a⁴] = ½ √κ δ, with E the mean under the
            # fit's weights, δ = E[a²] the step's decrement per unit of mass and κ the
            # kurtosis of a (a quadratic in z: at most 81 under a Gaussian weighting, by
            # hypercontractivity). A chord step at the same δ leaves up to spread × √δ
            # (≤ ½ √δ, the bound _chord_tol of the multinomial EP is built on): Newton's
            # is about √(κδ) of that, 2·10⁻⁴ at δ = 4·10⁻¹⁰ (the loosest stop) and κ = 81.
            # So its last step, at δ up to chord_tol, is taken without a line search too.
            # Measured on digits' EP (D-203): each row's fit moved by ≤ 1.1·10⁻¹⁴ nats (KL).
            limit = np.where(chord, chord_tol, max(chord_tol, _TOL))
        # Below a decrement of _TOL the objective no longer resolves a step's decrease (its
        # round-off is larger): the step is taken as is, as Newton's last one. So is a chord
        # step below a looser chord_tol (a step ~√chord_tol relative, inside the region
        # where the chord steps contract): it is the site's last.
        resolved = decrement <= np.maximum(limit, _TOL) * mass
        v[active[resolved]] += step[resolved]
        again = active[resolved & (decrement > limit * mass)]  # chord sites not done
        if again.size:
            value[again], again_wq = objective(again, v[again])
        if resolved.any():
            kept = ~resolved
            active, step, decrement, wq = active[kept], step[kept], decrement[kept], wq[kept]
        # Backtracking on each site's convex objective; the sites whose full step is taken
        # (nearly all, from a kernel near the target) need one evaluation.
        pending = np.arange(active.size)
        scale = np.ones(active.size)
        stalled = np.zeros(active.size, dtype=bool)
        for _ in range(30):
            sites = active[pending]
            trial = v[sites] + scale[pending, None] * step[pending]
            trial_value, trial_wq = objective(sites, trial)
            ok = trial_value <= value[sites] - 1e-4 * scale[pending] * decrement[pending]
            v[sites[ok]], value[sites[ok]] = trial[ok], trial_value[ok]
            if ok.all() and len(pending) == len(active):
                wq = trial_wq
            else:
                wq[pending[ok]] = trial_wq[ok]
            pending = pending[~ok]
            if not pending.size:
                break
            scale[pending] *= 0.5
        else:
            # No decrease along a Newton step: the site sits at round-off from its optimum.
            stalled[pending] = True
        if stalled.any():
            active, wq = active[~stalled], wq[~stalled]
        if again.size:
            active, wq = np.concatenate([active, again]), np.concatenate([wq, again_wq])
    precision, eta, c = family.natural_from_theta(family.theta_from_basis(v))
    fits = _moments(precision, eta, c + shift, kernel_mean, kernel_chol, n_iter, failed)
    return fits._replace(log_mass=log_mass)


def _take_better(v, value, wq_all, sites, candidate, objective) -> None:
    """Move ``sites`` to their ``candidate`` coordinates where its objective is smaller
    (``v``, ``value`` and the weighted fits ``wq_all`` updated in place)."""
    candidate_value, candidate_wq = objective(sites, candidate)
    better = candidate_value < value[sites]
    at = sites[better]
    v[at], value[at], wq_all[at] = candidate[better], candidate_value[better], candidate_wq[better]


def _factor_in_frame(precision, linear, kernel_mean, kernel_chol) -> np.ndarray:
    """Basis coordinates (M, n) of ``−tᵀPt/2 + hᵀt`` at ``t = μ + L z`` as a function of
    z: ``c + aᵀz − zᵀBz/2`` with ``B = LᵀPL``, ``a = Lᵀ(h − Pμ)``, ``c = (h − Pμ/2)ᵀμ``."""
    k = kernel_mean.shape[1]
    chol_t = np.swapaxes(kernel_chol, 1, 2)
    quadratic = chol_t @ precision @ kernel_chol
    moved = linear - np.einsum("mab,mb->ma", precision, kernel_mean)
    i, j = triu_indices(k)
    v = np.empty((len(kernel_mean), 1 + k + len(i)))
    v[:, 0] = np.einsum("ma,ma->m", linear + moved, kernel_mean) * 0.5
    v[:, 1 : 1 + k] = np.einsum("mba,mb->ma", kernel_chol, moved)
    v[:, 1 + k :] = quadratic[:, i, j]
    return v


class _RuleArrays:
    """What the fits on one rule in dimension k share: the nodes z and weights, the
    features φ (P, n), ``log_window`` (log N(z; 0, I)), the Gram matrix Σ_j w_j φ_j φ_jᵀ
    (the Hessian per unit of mass wherever q̄ is constant over the points) and, formed on
    first need, the distinct monomials of the Hessian's entries (:meth:`hessians`)."""

    def __init__(self, rule: SamplingRule, k: int):
        self.z, log_w = rule.standard_normal(rule.n_points(k), k, None)
        self.weights = np.exp(log_w)
        self.phi = FullFamily(self.z).feature_rows(slice(None))
        self.log_window = -0.5 * np.einsum("pj,pj->p", self.z, self.z)
        self.log_window -= 0.5 * k * math.log(2.0 * math.pi)
        self.gram = (self.phi * self.weights[:, None]).T @ self.phi
        self._gram_inverse = None
        self._monomials = None
        self._squares = None  # the nodes and their outer products (moment_sums)
        # A mirrored rule (SymmetricSobol: nodes z and −z, equal weights) halves the
        # products over the nodes: a feature (or monomial) of even degree takes the same
        # value at z and −z, one of odd degree the opposite.
        half = len(self.z) // 2
        self.uniform = bool(np.all(self.weights == self.weights[0]))
        # log w − log_window = log w + |z|²/2 + (k/2) log 2π in the features' basis (1, z_a,
        # −z_a²/2, −z_a z_b): the constant, and −1 on each −z_a²/2.
        self._window_basis = np.zeros(self.phi.shape[1])
        self._window_basis[0] = math.log(self.weights[0]) + 0.5 * k * math.log(2.0 * math.pi)
        self._window_basis[1 + k :] = -_identity_basis(k)
        self.mirrored = (
            len(self.z) % 2 == 0
            and np.array_equal(self.z[half:], -self.z[:half])
            and np.array_equal(self.weights[half:], self.weights[:half])
        )
        self.odd = np.zeros(self.phi.shape[1], dtype=bool)
        self.odd[1 : 1 + k] = True  # the features 1, z_a, multiples of z_a z_b
        self._half_phi = (self.phi[:half, ~self.odd], self.phi[:half, self.odd])

    def gram_inverse(self) -> np.ndarray:
        """The Gram matrix's inverse (symmetric), formed on first use."""
        if self._gram_inverse is None:
            inverse = np.linalg.inv(self.gram)
            self._gram_inverse = 0.5 * (inverse + inverse.T)
        return self._gram_inverse

    def values(self, v: np.ndarray) -> np.ndarray:
        """``v @ φᵀ`` (m, P): the fitted log-densities' quadratic forms at the nodes."""
        if not self.mirrored:
            return v @ self.phi.T
        even, odd = self._half_phi
        at_even = v[:, ~self.odd] @ even.T
        at_odd = v[:, self.odd] @ odd.T
        half = at_even.shape[1]
        out = np.empty((len(v), 2 * half))
        np.add(at_even, at_odd, out=out[:, :half])
        np.subtract(at_even, at_odd, out=out[:, half:])
        return out

    def weighted_fit(self, v: np.ndarray) -> np.ndarray:
        """``w_j q̄_j`` (m, P): the weights times the fits ``q = exp(v · φ)`` over the
        kernel at the nodes. With equal weights, their log and ``−log_window`` (a quadratic
        in z) are added to the coordinates ``v``, so that the values come out of the
        features' product as ``log(w q̄)``: two passes over the (m, P) values fewer (the
        same numbers to round-off)."""
        if not self.uniform:
            return self.weights * flushed_exp(self.values(v) - self.log_window)
        return flushed_exp(self.values(v + self._window_basis))

    def spread(self, wq: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``max_j |wq_ij / w_j − mass_i| / mass_i`` (m,): the fits' largest relative
        departure from their mean over the nodes. With equal weights, from each row's
        largest and smallest ``wq`` alone (the division and the subtraction are monotone:
        the same bits), two reductions instead of three temporaries of the (m, P) values."""
        if not self.uniform:
            return np.abs(wq / self.weights - mass[:, None]).max(axis=1) / mass
        w = self.weights[0]
        above = wq.max(axis=1) / w - mass
        below = mass - wq.min(axis=1) / w
        return np.maximum(above, below) / mass

    def sums(self, weights: np.ndarray, folded: tuple | None = None) -> np.ndarray:
        """``weights @ φ`` (m, n) for weights (m, P) on the nodes (``folded``: their
        :meth:`folded` sums, if already formed)."""
        if not self.mirrored:
            return weights @ self.phi
        total, difference = self.folded(weights) if folded is None else folded
        even, odd = self._half_phi
        out = np.empty((len(weights), self.phi.shape[1]))
        out[:, ~self.odd] = total @ even
        out[:, self.odd] = difference @ odd
        return out

    def moment_sums(
        self, weights: np.ndarray, folded: tuple | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``weights @ z`` (m, k) and ``weights @ [z zᵀ]`` (m, k·k) for weights (m, P): on a
        mirrored rule, the folded weights (``folded``, if already formed) against the first
        half of the nodes (z odd, z zᵀ even), half the products."""
        if self._squares is None:
            nodes = self.z[: len(self.z) // 2] if self.mirrored else self.z
            k = nodes.shape[1]
            self._squares = (nodes, (nodes[:, :, None] * nodes[:, None, :]).reshape(-1, k * k))
        nodes, squares = self._squares
        if not self.mirrored:
            return weights @ nodes, weights @ squares
        total, difference = self.folded(weights) if folded is None else folded
        return difference @ nodes, total @ squares

    def folded(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The weights at z plus, and minus, those at −z, on the first half of the nodes
        (None on a rule that is not mirrored)."""
        if not self.mirrored:
            return None
        half = weights.shape[1] // 2
        front, back = weights[:, :half], weights[:, half:]
        return front + back, front - back

    def hessians(self, wq: np.ndarray, rows: np.ndarray, folded: tuple | None = None) -> np.ndarray:
        """The Hessians ``Σ_j wq_ij φ_j φ_jᵀ`` (len(rows), n, n) of the sites ``rows`` of
        ``wq`` (``folded``: ``wq``'s :meth:`folded` sums, if already formed).

        The features are 1, z_a and multiples of z_a z_b, so the n(n + 1)/2 distinct
        entries of φφᵀ are multiples (by powers of two) of the (k + 4)!/(k! 4!) monomials of
        degree at most 4 in z (715 against 1540 at k = 9): the product runs over those, and
        each entry is its monomial's sum scaled exactly; the same sums as the entries' own
        products' to round-off, in a half of the work (a quarter of the digits' EP sweeps).
        Both triangles come out of one gather of those sums (each entry its monomial's,
        scaled), not the upper triangle's scattered twice: their assembly 0.8 → 0.5 ms for 45
        of digits' sites (k = 9, 1024 nodes)."""
        monomials, column, scale = self._monomial_arrays()
        if self.mirrored:
            if folded is None:
                total, difference = self.folded(wq[rows])
            else:
                total, difference = folded[0][rows], folded[1][rows]
            even, odd = monomials
            sums = np.concatenate([total @ even, difference @ odd], axis=1)
        else:
            sums = wq[rows] @ monomials
        n = self.phi.shape[1]
        hess = np.take(sums, column, axis=1)
        hess *= scale
        return hess.reshape(len(rows), n, n)

    def _monomial_arrays(self):
        if self._monomials is not None:
            return self._monomials
        n, k = self.phi.shape[1], self.z.shape[1]
        # Each feature's exponents of z and coefficient (FullFamily: 1, z_a, −z_a²/2, −z_a z_b).
        exponents = np.zeros((n, k), dtype=int)
        exponents[1 : 1 + k] = np.eye(k, dtype=int)
        i, j = triu_indices(k)
        np.add.at(exponents, (1 + k + np.arange(len(i)), i), 1)
        np.add.at(exponents, (1 + k + np.arange(len(i)), j), 1)
        coefficient = np.ones(n)
        coefficient[1 + k :] = np.where(i == j, -0.5, -1.0)
        first, second = triu_indices(n)
        # A monomial's column is the product of the first pair of features that gives it.
        found: dict[tuple, int] = {}
        column = np.empty(len(first), dtype=int)
        leaders = []
        for at, key in enumerate(map(tuple, exponents[first] + exponents[second])):
            if key not in found:
                found[key] = len(leaders)
                leaders.append(at)
            column[at] = found[key]
        leaders = np.array(leaders)
        pair_coefficient = coefficient[first] * coefficient[second]
        scale = pair_coefficient / pair_coefficient[leaders][column]  # powers of two: exact
        # Each entry of the full n × n matrix (row-major) from its upper triangle's pair.
        pair = np.empty((n, n), dtype=int)
        pair[first, second] = pair[second, first] = np.arange(len(first))
        pair = pair.ravel()
        column, scale = column[pair], scale[pair]
        if self.mirrored:
            # Even monomials first, then odd, on the first half of the nodes.
            odd = (exponents[first[leaders]] + exponents[second[leaders]]).sum(axis=1) % 2 == 1
            order = np.concatenate([np.flatnonzero(~odd), np.flatnonzero(odd)])
            position = np.empty(len(order), dtype=int)
            position[order] = np.arange(len(order))
            column = position[column]
            half = len(self.z) // 2
            monomials = tuple(
                self.phi[:half, first[leaders[part]]] * self.phi[:half, second[leaders[part]]]
                for part in (~odd, odd)
            )
        else:
            monomials = self.phi[:, first[leaders]] * self.phi[:, second[leaders]]
        arrays = (monomials, column, scale)
        nbytes = sum(m.nbytes for m in monomials) if self.mirrored else monomials.nbytes
        if nbytes <= _MONOMIAL_BYTES:  # kept (digits' 1024 nodes in 9 dims: 5.9 MB)
            self._monomials = arrays
        return arrays


# A deterministic rule's arrays are kept for its next fits (EP refits every site at every
# sweep, in blocks): the few most recent (rule, dimension) pairs.
_SHARED: dict = {}
_SHARED_MAX = 4
_MONOMIAL_BYTES = 2**25


def _rule_arrays(rule: SamplingRule, k: int) -> _RuleArrays:
    if rule.random:
        return _RuleArrays(rule, k)
    key = (repr(rule), k)
    arrays = _SHARED.get(key)
    if arrays is None:
        arrays = _RuleArrays(rule, k)
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.pop(next(iter(_SHARED)))
        _SHARED[key] = arrays
    return arrays


def _kernel_start(wp: np.ndarray, k: int, n_params: int) -> np.ndarray:
    """Basis coordinates of the kernel N(0, I_k) scaled to each site's sampled mass."""
    v = np.zeros((wp.shape[0], n_params))
    v[:, 0] = np.log(np.maximum(wp.sum(axis=1), 1e-300)) - 0.5 * k * math.log(2.0 * math.pi)
    v[:, 1 + k :] = _identity_basis(k)
    return v


def _moment_start(
    wp: np.ndarray, shared: _RuleArrays, k: int, n_params: int, folded: tuple | None = None
) -> np.ndarray | None:
    """Basis coordinates of the Gaussian with each site's moments of p̄ on the rule (where
    they are a proper Gaussian's; the kernel's elsewhere), or None if none is (``folded``:
    ``wp``'s :meth:`_RuleArrays.folded` sums, if already formed)."""
    mass = wp.sum(axis=1)
    first, second = shared.moment_sums(wp, folded)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = first / mass[:, None]
        second = second / mass[:, None]
    cov = second.reshape(-1, k, k) - mean[:, :, None] * mean[:, None, :]
    proper = np.isfinite(cov).all(axis=(1, 2)) & np.isfinite(mean).all(axis=1) & (mass > 0)
    cov[~proper] = np.eye(k)
    mean[~proper] = 0.0
    precision, log_det_cov, definite = _inverse(cov, rcond=1e-12)
    proper &= definite
    if not proper.any():
        return None
    eta = np.einsum("mab,mb->ma", precision, mean)
    c = (
        np.log(np.where(proper, mass, 1.0))
        - 0.5 * log_det_cov
        - 0.5 * k * math.log(2.0 * math.pi)
        - 0.5 * np.einsum("ma,ma->m", eta, mean)
    )
    i, j = triu_indices(k)
    v = np.empty((wp.shape[0], n_params))
    v[:, 0], v[:, 1 : 1 + k], v[:, 1 + k :] = c, eta, precision[:, i, j]
    if not proper.all():
        v[~proper] = _kernel_start(wp[~proper], k, n_params)
    return v


def _identity_basis(k: int) -> np.ndarray:
    """Quadratic coefficients of the identity precision in the family's basis."""
    i, j = triu_indices(k)
    return (i == j).astype(float)


def _inverse(matrices: np.ndarray, rcond: float = 0.0):
    """Inverse and log-determinant of each symmetric k × k matrix, and whether it is
    positive definite (smallest eigenvalue above ``rcond`` times the largest); where it is
    not, those of the identity. One-dimensional ones (EP's binary sites) need no
    eigendecomposition."""
    if matrices.shape[1] > 1:
        # Every matrix positive definite (the fits' usual case): one batched Cholesky
        # factorization for the log-determinants and LU inverses, a third of the
        # eigendecompositions' time at k = 9. With rcond, a matrix is kept where
        # rcond |A|_F |A⁻¹|_F < 1 (λ_max ≤ |A|_F and λ_min ≥ 1 / |A⁻¹|_F: conditioned
        # well enough); the others are decomposed.
        try:
            lower = np.linalg.cholesky(matrices)
        except np.linalg.LinAlgError:
            pass
        else:
            log_det = 2.0 * np.log(np.diagonal(lower, axis1=1, axis2=2)).sum(axis=1)
            inverse = np.linalg.inv(matrices)
            definite = np.ones(len(matrices), dtype=bool)
            if rcond > 0.0:
                size = np.sqrt(np.einsum("mab,mab->m", matrices, matrices))
                inverse_size = np.sqrt(np.einsum("mab,mab->m", inverse, inverse))
                unsure = ~(rcond * size * inverse_size < 1.0)
                if unsure.any():
                    inverse[unsure], log_det[unsure], definite[unsure] = _eigen_inverse(
                        matrices[unsure], rcond
                    )
            return inverse, log_det, definite
    return _eigen_inverse(matrices, rcond)


def _eigen_inverse(matrices: np.ndarray, rcond: float):
    """:func:`_inverse` by eigendecompositions."""
    if matrices.shape[1] == 1:
        eigval, eigvec = matrices[:, 0], None
    else:
        eigval, eigvec = np.linalg.eigh(matrices)
    definite = eigval.min(axis=1) > rcond * np.maximum(eigval.max(axis=1), 0.0)
    definite &= eigval.min(axis=1) > 0
    eigval = np.where(definite[:, None], eigval, 1.0)
    if eigvec is None:
        inverse = (1.0 / eigval)[:, :, None]
    else:
        inverse = (eigvec / eigval[:, None, :]) @ np.swapaxes(eigvec, 1, 2)
    return inverse, np.log(eigval).sum(axis=1), definite


def _moments(precision, eta, c, kernel_mean, kernel_chol, n_iter, failed) -> SiteFits:
    """Moments of ``exp(c + ηᵀz - zᵀ Λ z / 2)`` (frame z) mapped to ``t = μ + L z``."""
    k = eta.shape[1]
    cov_z, log_det, definite = _inverse(precision)
    integrable = definite & ~failed
    mean_z = np.einsum("mab,mb->ma", cov_z, eta)
    log_Z = c + 0.5 * np.einsum("ma,ma->m", eta, mean_z) - 0.5 * log_det
    # q fits p(μ + L z) in z: its integral over t is |det L| times that over z.
    log_det_chol = np.log(np.abs(np.diagonal(kernel_chol, axis1=1, axis2=2))).sum(axis=1)
    log_Z = log_Z + 0.5 * k * math.log(2.0 * math.pi) + log_det_chol
    mean = kernel_mean + np.einsum("mab,mb->ma", kernel_chol, mean_z)
    cov = kernel_chol @ cov_z @ np.swapaxes(kernel_chol, 1, 2)  # (einsum's 3 operands: 20×)
    nan = ~integrable
    log_Z[nan] = np.nan
    mean[nan] = np.nan
    cov[nan] = np.nan
    return SiteFits(log_Z, mean, cov, integrable, n_iter, np.full_like(log_Z, np.nan))
