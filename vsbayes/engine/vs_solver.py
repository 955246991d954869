"""Minimizer of the sampled variational-sampling objective.

With ``q̄_k = exp(o_k + θ·φ_k)`` (``o_k`` = log rule weight minus log window density) and
``p̄_k`` the weighted target values, the objective of the paper (eq. 5) is, up to a
constant, the smooth convex function

    F(θ) = Σ_k q̄_k - Σ_k p̄_k θ·φ_k,      ∇F = Σ_k (q̄_k - p̄_k) φ_k.

Each iteration costs two O(N d²) passes over the points: the gradient (a weighted moment)
and the values of one new search direction. The direction is the natural gradient — the
closed-form inverse Fisher information of the Gaussian whose moments are the *sampled*
moments of q̄, which matches the true Hessian in all blocks of order ≤ 2. The last
``memory`` directions span a small subspace in which F is minimized exactly by Newton's
method (O(N k²), no pass over the d-dimensional points), which both acts as the line search
and keeps the iterates conjugate, as in preconditioned conjugate gradients. Iterations stop
on the Newton decrement, measured in the natural metric, relative to the fit's own
predicted sampling error.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from ..exceptions import NotPositiveDefiniteError
from ..gaussian import Gaussian
from ._linalg import flushed_exp, solve_psd
from .features import QuadraticFamily

__all__ = ["VSSolution", "VSSolver"]

# exp() overflows above ~709.78; trial points beyond this are rejected by the line search.
_MAX_EXPONENT = 700.0
# Decrement per unit mass that counts as converged whatever tol (exactly Gaussian targets),
# and the one below which a step that cannot decrease the objective is put down to
# float64 round-off rather than to a failure.
_ROUNDOFF_FLOOR = 1e-26
_STALL_FLOOR = 1e-16
# Predicted decrease (relative to the mass) below which objective differences are round-off:
# there, Newton steps are taken in full instead of being checked on the objective.
_TRUST_NEWTON = 1e-9
# The exact n×n Hessian costs O(N n²) per iteration against O(N d²) for a matrix-free one.
# It is used from the start when n is small (the full family up to d = 10), where it costs
# about as much and is immune to the ill-conditioning of near-interpolating samples; and
# as a fallback when the matrix-free iterations have not converged after
# _SWITCH_AFTER iterations (targets with much heavier tails than the kernel), provided
# N n² stays below _EXACT_BUDGET multiply-adds.
EXACT_HESSIAN_MAX_PARAMS = 66
_SWITCH_AFTER = 12
_EXACT_BUDGET = 5e9


@dataclass
class VSSolution:
    """Raw output of :class:`VSSolver` in frame coordinates (shifted mass)."""

    n_iter: int
    converged: bool
    decrement: float
    kl_error: float
    objective: float
    ess: float
    gaussian: Gaussian | None


class VSSolver:
    """Subspace natural-gradient Newton solver for the sampled VS objective.

    Parameters
    ----------
    family : QuadraticFamily
        The exponential family, holding the points in frame coordinates.
    offsets : ndarray of shape (N,)
        ``o_k = log w_k - log π(z_k)``: log rule weight minus log window density.
    log_pbar : ndarray of shape (N,)
        ``log p̄_k = o_k + log p(z_k) - shift``, with ``max = 0``.
    tol : float
        Relative tolerance: stop once the predicted optimization error (half the squared
        Newton decrement per unit mass, an excess KL) is below ``tol * kl_error``.
    max_iter : int
        Maximum number of iterations.
    memory : int, default=10
        Number of past directions kept in the search subspace.
    hessian : {"auto", "exact", "natural"}, default="auto"
        ``"natural"``: matrix-free natural-gradient subspace iterations (O(N d²) each);
        ``"exact"``: Newton's method with the n×n sampled Hessian (O(N n²) each) and an
        exact line search; ``"auto"``: exact when ``n <= EXACT_HESSIAN_MAX_PARAMS``,
        otherwise natural with a switch to exact after ``_SWITCH_AFTER`` iterations when
        affordable.
    """

    def __init__(
        self,
        family: QuadraticFamily,
        offsets,
        log_pbar,
        *,
        tol,
        max_iter,
        memory=10,
        hessian="auto",
    ):
        if hessian not in ("auto", "exact", "natural"):
            raise ValueError(f"hessian must be 'auto', 'exact' or 'natural'; got {hessian!r}.")
        self.family = family
        self.offsets = offsets
        self.log_pbar = log_pbar
        self.tol = tol
        self.max_iter = max_iter
        self.memory = memory
        n, n_points = family.n_params, family.n_samples
        self.exact_hessian = hessian == "exact" or (
            hessian == "auto" and n <= EXACT_HESSIAN_MAX_PARAMS
        )
        self.may_switch = hessian == "auto" and n_points * n * n <= _EXACT_BUDGET

    # -- steps ---------------------------------------------------------------------------
    def setup(self, theta0: np.ndarray, values0: np.ndarray | None = None) -> None:
        """Store the target moments; start from θ0 with its best constant term."""
        fam = self.family
        self.pbar = flushed_exp(self.log_pbar)
        self.mass_p = float(self.pbar.sum())
        self.moments_p = fam.moments(self.pbar)
        self.theta = np.array(theta0, dtype=float)
        self.values = fam.values(self.theta) if values0 is None else np.array(values0, dtype=float)
        shift = math.log(self.mass_p) - logsumexp(self.offsets + self.values)
        self.theta += shift * fam.constant()
        self.values += shift
        self.qbar = flushed_exp(self.offsets + self.values)
        self._reset_subspace()
        self.reference = fam.gaussian_from_theta(self.theta)

    def _reset_subspace(self) -> None:
        size = 1 if self.exact_hessian else self.memory
        self.directions = [None] * size
        self.direction_values = np.empty((size, self.family.n_samples))
        self.n_directions = 0

    def update_gradient(self) -> None:
        """Weighted moments of q̄ and the gradient ``Σ (q̄ - p̄) φ``."""
        self.moments_q = self.family.moments(self.qbar)
        self.gradient = self.moments_q - self.moments_p

    def search_direction(self) -> None:
        """Natural gradient: the sampled-moment Gaussian's inverse Fisher times the gradient.

        With the exact Hessian, the Newton step ``H⁻¹ ∇F`` instead.
        """
        fam = self.family
        # Degenerate sampled moments: keep the previous reference.
        with contextlib.suppress(NotPositiveDefiniteError):
            self.reference = fam.reference(self.moments_q)
        self.delta = fam.natural_direction(self.reference, self.gradient)
        self.lam2 = max(fam.inner(self.gradient, self.delta), 0.0)
        if self.exact_hessian:
            # The stopping rule keeps the natural decrement too: a near-singular sampled
            # Hessian (few effective points) can hide part of the gradient from Newton's.
            newton = -fam.newton_direction(self.qbar, self.qbar - self.pbar)
            self.lam2 = max(self.lam2, fam.inner(self.gradient, newton))
            self.delta = newton

    def check_convergence(self) -> bool:
        """Decrement per unit mass against ``tol`` times the estimated sampling error."""
        self.decrement = 0.5 * self.lam2 / self.mass_p
        chris = self.family.christoffel(self.theta, self.values)
        self.integrable = chris is not None
        if self.integrable:
            self.kl_estimate = self._kl_error(chris)
        else:
            # No Gaussian to measure the sampling error with; the sampled KL times n/N is
            # its order of magnitude. (A non-integrable optimum is reported by the caller.)
            fam = self.family
            self.kl_estimate = self._sampled_kl() * fam.n_params / fam.n_samples
        return self.decrement <= max(_ROUNDOFF_FLOOR, self.tol * self.kl_estimate)

    def subspace_step(self) -> bool:
        """Add the new direction and minimize F exactly over the span of the last ones.

        Returns False when no decrease could be obtained (round-off level reached).
        """
        fam = self.family
        size = len(self.directions)
        slot = self.n_directions % size
        self.directions[slot] = -self.delta
        self.direction_values[slot] = fam.values(-self.delta)
        self.n_directions += 1
        k = min(self.n_directions, size)
        coef, moved = self._newton_in_span(self.direction_values[:k])
        if not moved:
            return False
        self.theta = self.theta + sum(c * d for c, d in zip(coef, self.directions[:k], strict=True))
        self.values = self.values + coef @ self.direction_values[:k]
        return True

    def _sampled_kl(self) -> float:
        """The objective as a divergence: ``Σ [p̄ log(p̄/q̄) - p̄ + q̄] / Σ p̄``."""
        log_qbar = self.offsets + self.values
        positive = self.pbar > 0
        kl_terms = self.pbar[positive] * (self.log_pbar[positive] - log_qbar[positive])
        return float((kl_terms.sum() - self.mass_p + self.qbar.sum()) / self.mass_p)

    def finalize(self, n_iter: int, converged: bool) -> VSSolution:
        """Diagnostics at the solution."""
        objective = self._sampled_kl()
        ess = self.mass_p**2 / float(np.square(self.pbar).sum())
        gaussian = self._current_gaussian() if self.integrable else None
        kl_error = self.kl_estimate if gaussian is not None else math.nan
        return VSSolution(
            n_iter=n_iter,
            converged=converged,
            decrement=self.decrement,
            kl_error=kl_error,
            objective=objective,
            ess=ess,
            gaussian=gaussian,
        )

    def solve(self, theta0: np.ndarray, values0: np.ndarray | None = None) -> VSSolution:
        """Run the iterations from θ0 (whose values may be given); see the class docstring."""
        self.setup(theta0, values0)
        n_iter, converged = 0, False
        while True:
            self.update_gradient()
            self.search_direction()
            if self.check_convergence():
                converged = True
                break
            if n_iter == self.max_iter:
                break
            if not self.subspace_step():
                converged = self.decrement <= _STALL_FLOOR
                break
            n_iter += 1
            if n_iter == _SWITCH_AFTER and self.may_switch and not self.exact_hessian:
                self.exact_hessian = True
                self._reset_subspace()
        return self.finalize(n_iter, converged)

    # -- helpers -------------------------------------------------------------------------
    def _current_gaussian(self) -> Gaussian | None:
        try:
            return self.family.gaussian_from_theta(self.theta)
        except NotPositiveDefiniteError:
            return None

    def _kl_error(self, chris: np.ndarray) -> float:
        """Predicted excess KL ``tr(Σ H⁻¹) / (2N)`` per unit mass (paper, Prop. 2)."""
        residual = self.qbar - self.pbar
        return 0.5 * float(np.square(residual) @ chris) / self.mass_p**2

    def _newton_in_span(self, basis_values: np.ndarray):
        """Minimize ``Σ exp(e + cᵀB) - p̄·(cᵀB)`` over c by damped Newton."""
        pbar = self.pbar
        e = self.offsets + self.values
        q = self.qbar
        coef = np.zeros(basis_values.shape[0])
        moved = False
        tol = _ROUNDOFF_FLOOR * self.mass_p
        for _ in range(20):
            grad = basis_values @ (q - pbar)
            hess = (basis_values * q) @ basis_values.T
            step = -solve_psd(hess, grad)
            dec = -float(grad @ step)
            if not dec > tol:
                break
            if not moved:
                # The outer iterations re-optimize this span anyway: 1e-2 of the first
                # Newton decrement is enough here.
                tol = max(tol, 1e-2 * dec)
            along = step @ basis_values
            t, q_sum = 1.0, float(q.sum())
            trust = dec <= _TRUST_NEWTON * self.mass_p
            while t > 1e-10:
                trial = e + t * along
                if trial.max() < _MAX_EXPONENT:
                    q_trial = flushed_exp(trial)
                    if trust:
                        break
                    change = float(q_trial.sum()) - q_sum - t * float(pbar @ along)
                    if change <= -0.25 * t * dec:
                        break
                t *= 0.5
            else:
                break
            coef += t * step
            e, q = trial, q_trial
            moved = True
        if moved:
            self.qbar = q
        return coef, moved
