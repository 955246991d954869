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

from .._memory import memory_limit
from .._sums import logsumexp
from ..exceptions import NotPositiveDefiniteError
from ..gaussian import Gaussian
from ._linalg import flushed_exp, solve_psd
from ._subspace import Subspace
from .families import QuadraticFamily

__all__ = ["Iterate", "VSSolution", "VSSolver"]

# exp() overflows above ~709.78; trial points beyond this are rejected by the line search.
_MAX_EXPONENT = 700.0
# Decrement per unit mass that counts as converged whatever tol (exactly Gaussian targets,
# whose predicted error is zero), and the one below which a step that cannot decrease the
# objective is put down to float64 round-off rather than to a failure. A decrement of 1e-20
# is an excess KL of 1e-20: moments within ~1e-10 of the optimum's, far inside the 1e-8 of
# exactness (1e-26, the old floor, took a third more iterations for nothing).
_ROUNDOFF_FLOOR = 1e-20
_STALL_FLOOR = 1e-16
# Predicted decrease (relative to the mass) below which objective differences are round-off:
# there, Newton steps are taken in full instead of being checked on the objective.
_TRUST_NEWTON = 1e-9
# The exact n×n Hessian costs O(N n²) per iteration against O(N d²) for a matrix-free one.
# It is used from the start when n is small (the full family up to d = 10), where it costs
# about as much and is immune to the ill-conditioning of near-interpolating samples; and
# as a fallback once the matrix-free iterations, at the rate of their last _RATE_WINDOW
# steps, would cost more to converge than _EXACT_STEPS exact ones (Newton's quadratic
# convergence), provided N n² stays below _EXACT_BUDGET multiply-adds. Spread importance
# weights make the matrix-free rate slow (a Gaussian target 1.2 times wider than the
# kernel at d = 30: a fifth of the decrement per step), but an exact step costs as much as
# (n / (d+1))² / 2 of them, 128 at d = 30.
EXACT_HESSIAN_MAX_PARAMS = 66
_RATE_WINDOW = 3
_EXACT_STEPS = 3
_EXACT_BUDGET = 5e9
# In the kernel's frame the window's precision is about 1, and a target flat along a
# direction (an improper one: a parameter the target does not depend on) makes the fitted
# precision there the difference of two such numbers, cancelled to round-off: measured
# 1.1e-16 to 2.7e-16 (flat and ridge targets, d = 1 to 5). A Gaussian target's precision
# λ is resolved while its quadratic term over the points (~λ |z|²/2) stands above the
# round-off of the values (~eps |log p|): exact to 1e-8 at 1e3 kernel sds (λ = 1e-6), not
# at 1e6 (λ = 1e-12). A precision eigenvalue below this bound does not determine even its
# own sign: the fit is refused as not integrable (D-188).
_ROUNDOFF_PRECISION = 256.0 * np.finfo(float).eps
# The in-sample correction (generalized cross-validation's (1 - n/ESS)⁻²) holds while the
# fit's n parameters are at most half its weights' ESS: over the paper's data at 2n-16n
# points its ratio to the measured error had a median of 0.95-1.13 up to n/ESS = 0.4,
# 1.2-1.4 at 0.4-0.5, 1.6-1.8 at 0.5-0.6, 4.6 at 0.7-0.85 and 14 at 0.85-1, then inf.
# Beyond, the points' own leverages correct each residual (D-237), times the random
# design's N/(N − n − 1) (D-254): 0.92-1.35 there (HC2 alone 0.46-0.92). They
# cost N n² multiply-adds (a rank-k update and a triangular solve over the points), as
# the exact Newton steps' Hessian does, so they share its budget: the paper's sets at
# 2n-16n (N n² ≤ 4e9) about double a fit's CPU there, 0.04 → 0.09 s; digits3 at 8n
# (n = 2211: 8.6e10) would take 11× its fit for a diagnostic and keeps GCV's factor (D-237).
# In a final round only.
_GCV_MOST_SHARE = 0.5
_LEVERAGE_BUDGET = _EXACT_BUDGET  # 5e9
# With fewer points than twice the parameters the pole is the points' own (a least-squares
# fit's excess risk grows as n/(N − n)), not the weights': HC2 there predicted 0.025 (1.2n)
# and 0.17 (1.5n) of the measured error in median (Student-t, d = 4 and 6, 10 seeds), 0.2-0.5
# from 2n, where D-237 measured it. Below, GCV's factor stays (D-245).
_LEVERAGE_MIN_POINTS = 2.0
# A point whose leverage is this close to 1 holds a direction of the fit by itself: its
# residual, zero, says nothing of the error along it.
_PINNED = 1.0 - 1e-6


def _widest_variance(gaussian: Gaussian) -> float:
    """The largest eigenvalue of the covariance: 1 / the smallest of the precision."""
    return float(np.linalg.eigvalsh(gaussian.cov)[-1])


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
    #: True when the Gaussian was refused because a precision eigenvalue in the frame was
    #: at round-off (``_ROUNDOFF_PRECISION``): the target is flat along a direction.
    flat: bool = False


@dataclass(frozen=True)
class Iterate:
    """One iterate of :class:`VSSolver`: θ and what the passes over the points give of it.

    Attributes
    ----------
    theta : ndarray of shape (n,)
        Family parameters of the fit ``q̄ = exp(o + θ·φ)``.
    values : ndarray of shape (N,)
        ``θ·φ_k`` at the points.
    qbar : ndarray of shape (N,)
        ``q̄_k = exp(o_k + θ·φ_k)`` (flushed to zero below the smallest normal float).
    """

    theta: np.ndarray
    values: np.ndarray
    qbar: np.ndarray


class VSSolver:
    """Subspace natural-gradient Newton solver for the sampled VS objective.

    The iterations follow scikit-learn's ``NewtonSolver`` layout: :meth:`solve` calls
    :meth:`setup`, then per iteration :meth:`update_gradient`, :meth:`search_direction`,
    :meth:`check_convergence` and :meth:`subspace_step`, and at the end :meth:`finalize`.
    Each step's docstring says which attributes it sets; the iterate (θ, its values and
    q̄) is one :class:`Iterate`, replaced only by :meth:`setup` and :meth:`subspace_step`.

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
    hessian : {"auto", "exact", "natural", "switch"}, default="auto"
        ``"natural"``: matrix-free natural-gradient subspace iterations (O(N d²) each);
        ``"exact"``: Newton's method with the n×n sampled Hessian (O(N n²) each) and an
        exact line search; ``"switch"``: natural, switching to exact when that is
        affordable and the natural iterations' rate says it would converge sooner (see
        ``_EXACT_STEPS``); ``"auto"``: exact when ``n <= EXACT_HESSIAN_MAX_PARAMS``,
        otherwise ``"switch"``.
    leverages : bool, default=True
        Whether a predicted error near the in-sample correction's pole may be corrected
        by the points' leverages (O(N n²), see :meth:`_in_sample_corrected`); False for
        an intermediate round, whose error nothing reads.

    Attributes
    ----------
    family, offsets, log_pbar, tol, max_iter, memory, leverages
        The parameters.
    pbar : ndarray of shape (N,)
        ``p̄_k``, the weighted target values (set by ``__init__``, as are the next two).
    mass_p : float
        ``Σ p̄_k``.
    moments_p : ndarray of shape (n,)
        ``Σ p̄_k φ_k``.
    exact_hessian : bool
        Whether the directions are exact Newton steps; set by ``__init__``, turned on by
        :meth:`solve` at the switch.
    may_switch : bool
        Whether ``"auto"`` or ``"switch"`` may switch to the exact Hessian (``N n²``
        within budget).
    iterate : Iterate
        The current iterate (set by :meth:`setup`, replaced by :meth:`subspace_step`).
    reference : Gaussian
        Gaussian whose inverse Fisher information preconditions the gradient.
    moments_q, gradient, delta, lam2, decrement, kl_estimate, integrable
        The current iteration's measurements; see the step that sets each.
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
        leverages=True,
    ):
        if hessian not in ("auto", "exact", "natural", "switch"):
            raise ValueError(
                f"hessian must be 'auto', 'exact', 'natural' or 'switch'; got {hessian!r}."
            )
        self.family = family
        self.offsets = offsets
        self.log_pbar = log_pbar
        self.tol = tol
        self.max_iter = max_iter
        self.memory = memory
        self.leverages = leverages
        n, n_points = family.n_params, family.n_samples
        self.exact_hessian = hessian == "exact" or (
            hessian == "auto" and n <= EXACT_HESSIAN_MAX_PARAMS
        )
        self.may_switch = hessian in ("auto", "switch") and n_points * n * n <= _EXACT_BUDGET
        self.pbar = flushed_exp(log_pbar)
        self.mass_p = float(self.pbar.sum())
        self.moments_p = family.moments(self.pbar)

    # -- steps ---------------------------------------------------------------------------
    def setup(self, theta0: np.ndarray, values0: np.ndarray | None = None) -> None:
        """Start from θ0 (whose values at the points may be given) with its best constant.

        Sets: ``iterate``, ``reference`` (the Gaussian of θ0) and an empty subspace.
        """
        fam = self.family
        theta = np.array(theta0, dtype=float)
        values = fam.values(theta) if values0 is None else np.array(values0, dtype=float)
        shift = math.log(self.mass_p) - logsumexp(self.offsets + values)
        theta += shift * fam.constant()
        values += shift
        self.iterate = Iterate(theta, values, flushed_exp(self.offsets + values))
        self._reset_subspace()
        self.reference = fam.gaussian_from_theta(theta)

    def _reset_subspace(self) -> None:
        size = 1 if self.exact_hessian else self.memory
        self._subspace = Subspace(size, self.family.n_samples)

    def update_gradient(self) -> None:
        """Weighted moments of q̄ and the gradient ``Σ (q̄ - p̄) φ``.

        Sets: ``moments_q``, ``gradient``.
        """
        self.moments_q = self.family.moments(self.iterate.qbar)
        self.gradient = self.moments_q - self.moments_p

    def search_direction(self) -> None:
        """Natural gradient: the sampled-moment Gaussian's inverse Fisher times the gradient.

        With the exact Hessian, the Newton step ``H⁻¹ ∇F`` instead.

        Sets: ``reference`` (kept when the sampled moments are degenerate), ``delta`` (the
        direction is ``-delta``), ``lam2`` (the squared decrement it measures).
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
            qbar = self.iterate.qbar
            newton = -fam.newton_direction(qbar, qbar - self.pbar)
            self.lam2 = max(self.lam2, fam.inner(self.gradient, newton))
            self.delta = newton

    def check_convergence(self) -> bool:
        """Decrement per unit mass against ``tol`` times the estimated sampling error.

        Sets: ``decrement`` (half the squared decrement per unit mass), ``integrable``
        (whether the iterate is a Gaussian), ``kl_estimate`` (its predicted sampling error).
        """
        self.decrement = 0.5 * self.lam2 / self.mass_p
        chris = self.family.christoffel(self.iterate.theta, self.iterate.values)
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

        Sets: ``iterate`` (the only step that moves it). Returns False, leaving it, when no
        decrease could be obtained (round-off level reached).
        """
        self._subspace.add(-self.delta, self.family.values(-self.delta))
        directions, basis_values = self._subspace.directions, self._subspace.values
        coef, qbar = self._newton_in_span(basis_values)
        if qbar is None:
            return False
        old = self.iterate
        self.iterate = Iterate(
            theta=old.theta + sum(c * d for c, d in zip(coef, directions, strict=True)),
            values=old.values + coef @ basis_values,
            qbar=qbar,
        )
        return True

    def _sampled_kl(self) -> float:
        """The objective as a divergence: ``Σ [p̄ log(p̄/q̄) - p̄ + q̄] / Σ p̄``."""
        log_qbar = self.offsets + self.iterate.values
        positive = self.pbar > 0
        kl_terms = self.pbar[positive] * (self.log_pbar[positive] - log_qbar[positive])
        return float((kl_terms.sum() - self.mass_p + self.iterate.qbar.sum()) / self.mass_p)

    def finalize(self, n_iter: int, converged: bool) -> VSSolution:
        """Diagnostics at the solution (reads what :meth:`check_convergence` set)."""
        objective = self._sampled_kl()
        ess = self.mass_p**2 / float(np.square(self.pbar).sum())
        gaussian = self._current_gaussian() if self.integrable else None
        flat = gaussian is not None and _widest_variance(gaussian) * _ROUNDOFF_PRECISION >= 1.0
        if flat:
            gaussian = None
        kl_error = self._in_sample_corrected(self.kl_estimate) if gaussian is not None else math.nan
        return VSSolution(
            n_iter=n_iter,
            converged=converged,
            decrement=self.decrement,
            kl_error=kl_error,
            objective=objective,
            ess=ess,
            gaussian=gaussian,
            flat=flat,
        )

    def solve(self, theta0: np.ndarray, values0: np.ndarray | None = None) -> VSSolution:
        """Run the iterations from θ0 (whose values may be given); see the class docstring."""
        self.setup(theta0, values0)
        n_iter, converged, decrements = 0, False, []
        while True:
            self.update_gradient()
            self.search_direction()
            if self.check_convergence():
                converged = True
                break
            if n_iter == self.max_iter:
                break
            decrements.append(self.decrement)
            if self.may_switch and not self.exact_hessian and self._exact_is_cheaper(decrements):
                self.exact_hessian = True
                self._reset_subspace()
                self.search_direction()
            if not self.subspace_step():
                converged = self.decrement <= _STALL_FLOOR
                break
            n_iter += 1
        return self.finalize(n_iter, converged)

    def _exact_is_cheaper(self, decrements: list[float]) -> bool:
        """Whether exact Newton steps would now finish sooner than matrix-free ones, at the
        rate of the last ``_RATE_WINDOW`` steps (see ``_EXACT_STEPS``), or the latter not
        within ``max_iter``."""
        if len(decrements) <= _RATE_WINDOW:
            return False
        rate = (decrements[-1] / decrements[-1 - _RATE_WINDOW]) ** (1.0 / _RATE_WINDOW)
        if not rate < 1.0:
            return True
        goal = max(_ROUNDOFF_FLOOR, self.tol * self.kl_estimate)
        steps_left = math.log(goal / decrements[-1]) / math.log(rate)
        if steps_left > self.max_iter - len(decrements):
            return True
        fam = self.family
        natural_cost = 2.0 * fam.n_samples * fam.pass_work
        exact_cost = fam.n_samples * fam.n_params**2 + fam.n_params**3 / 3.0
        return steps_left * natural_cost > _EXACT_STEPS * exact_cost

    # -- helpers -------------------------------------------------------------------------
    def _current_gaussian(self) -> Gaussian | None:
        try:
            return self.family.gaussian_from_theta(self.iterate.theta)
        except NotPositiveDefiniteError:
            return None

    def _in_sample_corrected(self, kl: float) -> float:
        """The predicted error with the residuals' in-sample optimism removed.

        The residuals of a fit are smaller at its own points than at new ones, as the
        residual sum of squares of least squares is: by the factor ``(1 - n/N)²`` of
        generalized cross-validation, with N the effective number of points of the fit's
        weights q̄ (their ESS). Measured on the paper's data, the uncorrected estimate was
        optimistic by 1.6-1.8× at 8n points and 1.1× at 32n. Beyond n = ESS/2 that factor
        overshoots (and is infinite from n = ESS), so there each residual is corrected by
        its own point's leverage h (:meth:`_leverage_corrected`); where those cost more
        than ``_LEVERAGE_BUDGET`` multiply-adds or their n×n matrix more than the memory
        limit, or the points are fewer than ``_LEVERAGE_MIN_POINTS`` n, the factor stays,
        and with n ≥ ESS the error is unknown: infinite.
        """
        qbar = self.iterate.qbar
        ess = float(qbar.sum()) ** 2 / float(np.square(qbar).sum())
        fam = self.family
        n = fam.n_params
        share = n / ess
        if (
            share > _GCV_MOST_SHARE
            and self.leverages
            and fam.n_samples >= _LEVERAGE_MIN_POINTS * n
            and fam.n_samples * n * n <= _LEVERAGE_BUDGET
            and 16.0 * n * n <= memory_limit()  # H and its factor; block_length the rest
        ):
            return self._leverage_corrected()
        return kl / (1.0 - share) ** 2 if share < 1.0 else math.inf

    def _leverage_corrected(self) -> float:
        """``Σ r_k² c_k / (1 - h_k) / (2 M²) · N / (N − n − 1)``: each squared residual of
        :meth:`_kl_error` divided by ``1 - h_k``, with ``h_k = q̄_k φ_kᵀ H⁻¹ φ_k`` the
        leverage of point k in the fit's sampled Hessian ``H = Σ q̄ φ φᵀ`` (White's HC2
        sandwich), times the random design's factor of the N points.

        Linearized, the fit is a least-squares fit of the log target with weights q̄, whose
        residual at point k has ``1 - h_k`` of its noise's variance: dividing by it removes
        the optimism point by point, where GCV's first factor ``(1 − n/ESS)⁻¹`` assumes
        every leverage n/ESS. GCV's second factor is the error of a fit on random points
        against the sandwich's fixed ones: for N Gaussian rows in n dimensions
        ``E[(ΦᵀΦ)⁻¹] = F⁻¹ / (N − n − 1)``, against the ``F⁻¹ / N`` the sandwich takes.
        It stays finite while no point holds a direction by itself (``h < 1``); the
        leverages sum to n whatever the ESS. Infinite when one does (``_PINNED``) or H is
        singular.
        """
        fam, it = self.family, self.iterate
        try:
            leverage = fam.leverages(it.qbar)
        except NotPositiveDefiniteError:
            return math.inf
        if not leverage.max() < _PINNED:
            return math.inf
        chris = fam.christoffel(it.theta, it.values)
        terms = np.square(it.qbar - self.pbar) * chris
        hc2 = 0.5 * float(terms @ (1.0 / (1.0 - leverage))) / self.mass_p**2
        # HC2 is the first of GCV's two factors, point by point; the second, the error of
        # a fit on N random points against the sandwich's fixed ones, E[H⁻¹] = F⁻¹/(N − n
        # − 1) for Gaussian rows against F⁻¹/N, counts the points: finite from N = 2n
        # (_LEVERAGE_MIN_POINTS), where it doubles the estimate (D-254).
        n, points = fam.n_params, fam.n_samples
        return hc2 * points / (points - n - 1.0)

    def _kl_error(self, chris: np.ndarray) -> float:
        """Predicted excess KL ``tr(Σ H⁻¹) / (2N)`` per unit mass (paper, Prop. 2)."""
        residual = self.iterate.qbar - self.pbar
        return 0.5 * float(np.square(residual) @ chris) / self.mass_p**2

    def _newton_in_span(self, basis_values: np.ndarray):
        """Minimize ``Σ exp(e + cᵀB) - p̄·(cᵀB)`` over c by damped Newton, from the iterate.

        Returns the coefficients c and q̄ at the new point, or ``(0, None)`` when no step
        decreased the objective. Sets nothing: :meth:`subspace_step` moves the iterate.
        """
        pbar = self.pbar
        e = self.offsets + self.iterate.values
        q = self.iterate.qbar
        coef = np.zeros(basis_values.shape[0])
        moved = False
        tol = _ROUNDOFF_FLOOR * self.mass_p
        for _ in range(20):
            # Points whose weights q are near exp's range (a prior too vague for the
            # features' scale) overflow these sums: solve_psd refuses them with an
            # estimation error the estimators report, so NumPy's warnings are noise.
            with np.errstate(over="ignore", invalid="ignore"):
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
        return coef, (q if moved else None)
