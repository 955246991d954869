"""How ``strategy="auto"`` chooses between the global VS fit and EP's site fits.

A mixin of :class:`~vsbayes.estimators.variational_sampling.VariationalSamplingClassifier`:
the work limits, the data-rich shortcut, the comparison of the global fit with EP's, and the
N of the multinomial global fit. Every choice is recorded (``strategy_``,
``strategy_reason_``) with the quantities that made it.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..engine import n_family_params
from ..exceptions import ConvergenceWarning, EstimationError, UnreliableFitWarning
from ..gaussian import excess_kl

__all__ = ["STRATEGIES", "StrategyChoice"]

#: "global": one VS fit of the whole posterior; "sites": expectation propagation whose site
#: fits are VS fits of the one-dimensional tilted densities ((K − 1)-dimensional for the
#: multinomial posterior); "auto": chosen per problem.
STRATEGIES = ("auto", "global", "sites")

# "auto" runs the global fit only if it can have at least MIN_GLOBAL_FACTOR·n points (at
# most MAX_GLOBAL_FACTOR·n) within both work limits below: under 16n the global fit is
# measured less accurate than EP alone on the paper's data sets (issue 12's table; 32n is
# 2-3× better than 8n). Work is counted in multiply-adds — a deterministic stand-in for time,
# so that the choice is the same on every machine: the global fit's likelihood pass costs
# N × M × (p + LINK_COST), an EP sweep M × (2p² + site cost) + p³/3 (the Gram matrix, the
# marginals, the site fits, the Cholesky factor), a site fit SITE_NODES link evaluations
# unless the link's tilted moments have a closed form. The limits keep a default fit within
# ~30 LogisticRegression fits and ~10 EP fits of the same data (measured:
# benchmarks/strategy_choice.py, benchmarks/high_dimension.py).
MIN_GLOBAL_FACTOR, MAX_GLOBAL_FACTOR = 16, 32
GLOBAL_WORK_LIMIT = 2e8
EP_WORK_RATIO = 8.0
LINK_COST, SITE_NODES = 30, 40
# Many rows per Gaussian parameter (M ≥ DATA_RICH · n) make the posterior nearly Gaussian:
# there "auto" first compares EP's expected work — EP_SWEEPS sweeps of M × (2p² +
# SITE_WORK) — with the global fit's at the estimator's own N from the Laplace kernel, and
# takes the cheaper. A site costs SITE_WORK multiply-adds in practice (measured: ~2.5 µs per
# site and sweep, 2·10⁵ rows × 20). Without it, 10⁶ × 20 took 94 s by EP against 21-24 s
# for the global fit at 8n.
DATA_RICH, EP_SWEEPS, SITE_WORK = 50, 20, 10_000
# "auto" keeps the global fit only where it departs from EP by more than this many times
# its own predicted error: the departure is about the sum of both errors, and kl_error is
# up to ~2× optimistic at 16-32n, so EP's error is then the larger.
DEPARTURE_FACTOR = 4.0
# The multinomial posterior (K > 2): "auto" runs the global fit from the Laplace kernel
# with 32n points if the work of N × (M K (d + 1 + LINK_COST) + n²) multiply-adds (the
# likelihood pass and the solver's features) stays within this limit, else with as many
# as fit down to 16n; below 16n it takes expectation propagation with VS fits of the
# (K − 1)-dimensional sites (strategy_ "sites", with the reason). Measured: wine (K = 3,
# d = 13, n = 946) at 32n, 2.8e10 multiply-adds, ~1 s on 2 cores; iris (n = 136) 0.13 s.
MULTINOMIAL_WORK_LIMIT = 5e10


class StrategyChoice:
    """The choices of ``strategy="auto"`` (see the module docstring)."""

    def _auto(self, model, kernel, rng, ep, ep_warnings, ep_trouble):
        """strategy="auto": the global fit where affordable, reliable and measurably
        different from EP (see ``strategy`` in the class docstring), else EP's."""
        n_samples, why_not = self._global_samples(model, ep)
        if why_not and ep is not None:
            return self._chose("sites", why_not, ep, ep_warnings)
        fit, trouble = self._quiet_global(model, kernel, rng, n_samples)
        if trouble and ep is None:
            raise EstimationError(f"Both fits failed: {ep_trouble}; {trouble}")
        if trouble:
            return self._chose("sites", trouble, ep, ep_warnings)
        if ep_trouble:
            return self._chose("global", ep_trouble, fit)
        departure = excess_kl(fit, ep)
        within = departure <= DEPARTURE_FACTOR * fit.kl_error
        reason = (
            f"the global fit departs from EP by {departure:.3g} nats, "
            f"{'within' if within else 'beyond'} {DEPARTURE_FACTOR:g}× its own predicted "
            f"error {fit.kl_error:.3g}"
        )
        return (
            self._chose("sites", reason, ep, ep_warnings)
            if within
            else self._chose("global", reason, fit)
        )

    def _multinomial_samples(self, model) -> tuple[int | None, str]:
        """N of the multinomial global fit and why (None: not affordable under "auto")."""
        if self.strategy == "global" or not isinstance(self.n_samples, str):
            n_samples = self._total_samples(model.dim)
            return n_samples, f"strategy={self.strategy!r} with N={n_samples}"
        n = n_family_params(model.dim, self.family)
        k, d, m = model.n_classes, model.n_features, model.n_observations
        per_point = m * k * (d + 1 + LINK_COST) + n * n
        n_samples = min(MAX_GLOBAL_FACTOR * n, int(MULTINOMIAL_WORK_LIMIT // per_point))
        n_samples = max(n_samples, self._auto_minimum)
        if n_samples < MIN_GLOBAL_FACTOR * n:
            return None, (
                f"the global fit of the multinomial posterior ({model.dim} parameters, n = "
                f"{n}) would get N={n_samples} points (< {MIN_GLOBAL_FACTOR}n) within "
                f"{MULTINOMIAL_WORK_LIMIT:.3g} multiply-adds ({per_point:.3g} per point): "
                f"expectation propagation with VS fits of the (K − 1)-dimensional sites instead"
            )
        return n_samples, (
            f"multinomial posterior: the global fit with N={n_samples} "
            f"points within {MULTINOMIAL_WORK_LIMIT:.3g} multiply-adds"
        )

    def _quiet_global(self, model, kernel, rng, n_samples=None):
        """The global fit and why it is not trusted (None: it is), its doubts unshown."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fit, trouble = self._sample(model, kernel, rng, n_samples), None
            except EstimationError as error:
                fit, trouble = None, f"the global fit failed: {error}"
        doubts = [w for w in caught if issubclass(w.category, _DOUBTS)]
        _reemit([w for w in caught if not issubclass(w.category, _DOUBTS)])
        if doubts and trouble is None:
            trouble = f"the global fit was unreliable: {doubts[0].message}"
        return fit, trouble

    def _global_is_cheaper(self, model) -> str | None:
        """Why the global fit from the Laplace kernel goes first (None: it does not)."""
        n = n_family_params(model.dim, self.family)
        m, p = model.n_observations, model.dim
        if m < DATA_RICH * n:
            return None
        global_work = self._total_samples(model.dim) * (_design_entries(model) + m * LINK_COST)
        ep_work = EP_SWEEPS * m * (2.0 * p * p + SITE_WORK)
        if global_work >= ep_work:
            return None
        return (
            f"{m} rows for n = {n} Gaussian parameters (≥ {DATA_RICH}n: a nearly Gaussian "
            f"posterior), and the global fit's {global_work:.3g} multiply-adds are fewer than "
            f"EP's expected {ep_work:.3g}"
        )

    def _global_samples(self, model, ep) -> tuple[int, str | None]:
        """N of the global fit under "auto", and why it is not run (None: it is)."""
        if not isinstance(self.n_samples, str):
            return int(self.n_samples), None
        n = n_family_params(model.dim, self.family)
        m, p = model.n_observations, model.dim
        per_point = _design_entries(model) + m * LINK_COST
        limit, why = GLOBAL_WORK_LIMIT, f"the work limit {GLOBAL_WORK_LIMIT:.3g}"
        if ep is not None:
            closed = model.link.has_closed_form(np.minimum(model.sample_weight, 1.0))
            site_cost = LINK_COST * (1 if closed else SITE_NODES)
            ep_work = max(ep.n_iter, 1) * (m * (2.0 * p * p + site_cost) + p**3 / 3.0)
            if EP_WORK_RATIO * ep_work < limit:
                limit = EP_WORK_RATIO * ep_work
                why = f"{EP_WORK_RATIO:g}× EP's work ({ep_work:.3g}, {ep.n_iter} sweeps)"
        n_samples = max(min(MAX_GLOBAL_FACTOR * n, int(limit // per_point)), self._auto_minimum)
        if n_samples < MIN_GLOBAL_FACTOR * n:
            return n_samples, (
                f"the global fit would get N={n_samples} points (< {MIN_GLOBAL_FACTOR}n = "
                f"{MIN_GLOBAL_FACTOR * n}) within {why} multiply-adds ({per_point:.3g} per "
                f"point)"
            )
        return n_samples, None

    def _chose(self, strategy, reason, posterior, pending_warnings=()):
        """Record the strategy of this binary problem; show the chosen fit's warnings."""
        _reemit(pending_warnings)
        self._choices.append((strategy, reason))
        return posterior


# Warnings that make "auto" distrust a global fit (it then takes the site fits instead).
_DOUBTS = (UnreliableFitWarning, ConvergenceWarning)


def _reemit(caught) -> None:
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _design_entries(model) -> float:
    """Multiply-adds of one parameter vector's pass over the design (non-zeros if sparse)."""
    return float(model.n_design_entries)
