"""The sweep loop of expectation propagation: damped parallel updates, Anderson-mixed.

EP's sites are a fixed point of the map "sites → posterior → new sites". The sweeps damp
that map and mix the last few with Anderson's acceleration (Walker & Ni 2011); the binary
and the multinomial EP share this loop, and differ only in the map, the posterior and the
projection of an extrapolation back to valid sites (:func:`damped_sweeps`).

Where the sweeps do not converge (e.g. weights spanning 1e-4 to 1e3), mixing can wander
off: after ``_STALL`` sweeps without a new smallest change, the plain damped sweeps go on
alone from the best of them; once they have cut the change tenfold, mixing resumes (once:
the plain sweeps converge linearly, often slowly). If the plain sweeps stall too, they
oscillate: the damping halves (down to ``_MIN_DAMPING``), again from the best sites.
Progress is measured undamped: halving the damping halves the change by itself. Stalled
sweeps may be near a fixed point they cannot approach further — their map's own noise
(the site fits' precision, amplified by wide latent marginals) is above ``tol``: measured
on digits' multinomial EP at C = 10, a floor of 1e-4. At every stall, sites that close
to a fixed point whose posterior has settled are kept with a warning (less damping would
not move them further); stalled at the smallest damping, sweeps that are not give up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._warnings import warn
from ..exceptions import ConvergenceWarning, EstimationError, NotPositiveDefiniteError

__all__ = ["Anderson", "SweepResult", "damped_sweeps", "stalled_error", "warn_unconverged"]

# Sweeps without progress after which Anderson's mixing is switched off, and then after
# which the damping is halved, down to _MIN_DAMPING.
_STALL = 10
_MIN_DAMPING = 1.0 / 64
# Stalled sweeps whose best undamped change is below this are accepted (see _floor), if
# their posterior has settled: an undamped sweep moves none of its marginals by more than
# _SETTLED nats of KL divergence (_settled) — a mean by 1 % of its standard deviation, or
# a variance by 1.4 %, far below EP's own error.
_FLOOR = 1e-3
_SETTLED = 5e-5
# Settled sites kept within this factor of tol are kept without a warning: the site fits'
# own precision is about there at the estimators' default tol (binary EP in its dual form
# on 2000 sparse rows × 5000 features: changes of 4-9e-10 against tol = 1e-10).
_QUIET = 10.0


class SweepResult(NamedTuple):
    """The sites the sweeps ended with, their posterior and how the sweeps went."""

    sites: np.ndarray
    posterior: Any
    n_iter: int
    converged: bool
    change: float


def damped_sweeps(
    sites: np.ndarray,
    update: Callable[[Any, np.ndarray], np.ndarray],
    posterior: Callable[[np.ndarray], Any],
    project: Callable[[np.ndarray, bool], np.ndarray],
    *,
    damping: float,
    tol: float,
    max_iter: int,
    memory: int,
    marginals: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None,
) -> SweepResult:
    """Run EP's sweeps from ``sites`` to a relative change of at most ``tol``.

    Parameters
    ----------
    sites : ndarray
        The starting sites, flattened.
    update : callable
        ``update(post, sites)``: the undamped new sites from the posterior of ``sites``.
    posterior : callable
        ``posterior(sites)``: the posterior of prior × sites; raises
        :class:`~vsbayes.exceptions.NotPositiveDefiniteError` if it is not proper.
    project : callable
        ``project(sites, extrapolated)``: the sites made valid (e.g. non-negative
        precisions); ``extrapolated`` is False for a plain damped sweep. It may work in
        place, and then returns its argument.
    damping, tol, max_iter, memory
        Fraction of the new sites taken per sweep; the largest relative change
        ``|Δ| / (1 + |site|)`` at which the sweeps stop; the most sweeps (then a
        ConvergenceWarning, and the sites of the sweep that moved least); the sweeps Anderson
        mixes (0: plain damped sweeps).
    marginals : callable, optional
        ``marginals(post)``: the posterior's means and variances. Stalled sweeps (10
        sweeps without progress) keep their best sites (with a ConvergenceWarning, unless
        within 10 × tol) when one more undamped sweep moves no marginal by more than 5e-5
        nats of KL divergence (a mean by 1 % of its standard deviation, a variance by
        1.4 %), and their change is below ``max(√tol, 1e-3)``; without ``marginals``,
        they go on to the smallest damping and raise there.

    Returns
    -------
    SweepResult

    Raises
    ------
    EstimationError
        If the sweeps stall even at the smallest damping, at a change above
        ``max(√tol, 1e-3)`` or whose posterior still moves (see ``marginals``).
    """
    anderson = Anderson(memory)
    post = posterior(sites)
    converged, at_floor, change, n_iter = False, False, math.inf, 0
    best, best_change, best_sites, stalled = math.inf, math.inf, sites, 0
    tested = math.inf  # the best change whose sites were last tested for _settled
    # The best undamped change when mixing was switched off (None while it is on), and
    # whether it has been switched on again.
    plain_from, remixed = None, False
    while n_iter < max_iter:
        n_iter += 1
        damped = (1.0 - damping) * sites + damping * update(post, sites)
        scale = 1.0 + np.abs(sites)
        residual = (damped - sites) / scale
        change = float(np.max(np.abs(residual), initial=0.0))
        if change <= tol:
            converged, sites = True, damped
        else:
            if change / damping < best:
                best, best_change = change / damping, change
                best_sites, stalled = damped.copy(), 0
            else:
                stalled += 1
            if stalled >= _STALL:
                if best <= _floor(tol) and best < tested:
                    tested = best
                    at_floor = _settled(best_sites, update, posterior, marginals)
                if at_floor:
                    # The sweeps stall this close to a fixed point: the map's own noise
                    # (its site fits' precision, amplified where latent variances are
                    # large) is above tol. The best sites are kept, with a warning: less
                    # damping cannot move a settled posterior further.
                    break
                if anderson.memory == 0 and damping <= _MIN_DAMPING:
                    # No progress at the smallest damping either, far from any fixed
                    # point: none is within reach. The best sites are then arbitrary:
                    # with class weights 1e3 and 1e-4, some predicted every point wrong.
                    raise stalled_error(n_iter, best_change, tol)
                if anderson.memory > 0:
                    anderson.memory, plain_from = 0, best
                else:
                    damping = max(0.5 * damping, _MIN_DAMPING)
                damped, stalled = best_sites, 0
            elif plain_from is not None and not remixed and best <= 0.1 * plain_from:
                # The plain sweeps converge (linearly, often slowly): mixing again, once.
                anderson.memory, plain_from, remixed = memory, None, True
                anderson.restart()
            sites = anderson.step(residual, damped, change, scale)
            sites = project(sites, sites is not damped)
        try:
            post = posterior(sites)
        except NotPositiveDefiniteError:
            if sites is damped:
                raise
            # The extrapolation left the positive-definite cone: take the damped sweep.
            anderson.restart()
            sites = damped
            post = posterior(sites)
        if converged:
            break
    if not converged and best_change < change:
        # Unconverged, the sites whose sweep moved least are the nearest to a fixed point.
        sites, change = best_sites, best_change
        post = posterior(sites)
    if at_floor and best > _QUIET * tol:
        warn(
            f"Expectation propagation stopped after {n_iter} sweeps at a relative site "
            f"change of {best:.3g} (tol={tol:.3g}): {_STALL} more sweeps (damping {damping:g}) "
            f"made no progress below it, the precision of its site fits here. The sites are "
            f"those of the sweep that moved least; one more sweep moves the posterior's means "
            f"and variances by less than {_SETTLED:g} nats of KL divergence in each marginal "
            f"(a mean by 1 % of its standard deviation).",
            ConvergenceWarning,
        )
    elif not (converged or at_floor):
        warn_unconverged(n_iter, max_iter, change, tol)
    return SweepResult(sites, post, n_iter, converged, change)


def _settled(sites, update, posterior, marginals) -> bool:
    """Whether one undamped sweep from ``sites`` leaves each of the posterior's marginals
    within ``_SETTLED`` nats of KL divergence of where it was."""
    if marginals is None:
        return False
    try:
        here = posterior(sites)
        there = posterior(update(here, sites))
    except NotPositiveDefiniteError:
        return False
    (m0, v0), (m1, v1) = marginals(here), marginals(there)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = v0 / v1
        kl = 0.5 * (ratio + (m1 - m0) ** 2 / v1 - 1.0 - np.log(ratio))
    return bool(np.all(kl <= _SETTLED))


def _floor(tol: float) -> float:
    """The undamped change below which stalled sweeps are accepted: √tol, and at least
    ``_FLOOR``. Such sites are within that (relative) of a fixed point: a posterior within
    about its square in KL, far inside EP's own error and its site fits' (the multinomial
    sites' quasi-Monte Carlo rules err by ~1e-4)."""
    return max(math.sqrt(tol), _FLOOR)


def stalled_error(n_iter: int, change: float, tol: float) -> EstimationError:
    """The error of sweeps that stalled even at the smallest damping."""
    return EstimationError(
        f"Expectation propagation cannot converge: its sweeps stalled at the smallest "
        f"damping ({_MIN_DAMPING:g}) after {n_iter} sweeps, the least site change "
        f"{change:.3g} against tol={tol:.3g}. Typical cause: extreme sample or class weights "
        f"(rescale them), or nearly separable data with a vague prior (use a smaller C)."
    )


def warn_unconverged(n_iter: int, max_iter: int, change: float, tol: float) -> None:
    """The ConvergenceWarning of sweeps that reached ``max_iter``."""
    warn(
        f"Expectation propagation did not converge in {n_iter} sweeps (max_iter={max_iter}; "
        f"largest site change {change:.3g}, tol={tol:.3g}). Increase max_iter or lower "
        f"damping; extreme sample or class weights can keep the sweeps from reaching tol.",
        ConvergenceWarning,
    )


class Anderson:
    """Anderson acceleration (type II) of a fixed-point map x ↦ g(x), from its last steps.

    The next point is ``g_k - ΔG γ`` with γ the least-squares fit of the residual ``f_k`` by
    the residuals' differences ``ΔF``: the combination of the last ``memory`` steps whose
    linearized residual is smallest. Far from a fixed point the linearization can fail;
    the memory restarts, and the plain step ``g_k`` is taken, when the residual more than
    doubles, and when the extrapolation is not finite or moves more than ten plain steps.
    """

    def __init__(self, memory: int):
        self.memory = int(memory)
        self.restart()

    def restart(self) -> None:
        self._last, self._d_res, self._d_img, self._change = None, [], [], math.inf

    def step(
        self, residual: np.ndarray, image: np.ndarray, change: float, scale: np.ndarray
    ) -> np.ndarray:
        """The next point, from the residual ``f_k = (g_k - x_k) / scale`` and ``g_k``."""
        if self.memory <= 0 or not np.isfinite(change):
            self.restart()
            return image
        if change > 2.0 * self._change:
            self.restart()
        self._change = change
        if self._last is not None:
            self._d_res.append(residual - self._last[0])
            self._d_img.append(image - self._last[1])
            if len(self._d_res) > self.memory:
                del self._d_res[0], self._d_img[0]
        self._last = residual, image
        if not self._d_res:
            return image
        gamma = np.linalg.lstsq(np.column_stack(self._d_res), residual, rcond=None)[0]
        mixed = image - np.column_stack(self._d_img) @ gamma
        # x_k = g_k - f_k · scale: the extrapolation's move against the plain step's.
        move = np.max(np.abs(mixed - image) / scale + np.abs(residual), initial=0.0)
        if not np.isfinite(move) or move > 10.0 * change:
            self.restart()
            return image
        return mixed
