"""Variational sampling as a method object: the global fit, EP's VS site fits, or the choice.

:class:`VSMethod` fits one problem by the route its ``strategy`` names; with "auto" it
chooses — the work limits, the data-rich shortcut, the comparison of the global fit with
EP's, the N of the multinomial global fit — and returns every choice (``strategy_``,
``strategy_reason_``) with the quantities that made it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import ClassVar

import numpy as np

from .._choices import VS_STRATEGIES
from .._memory import memory_limit
from .._warnings import catch, reemit, warn
from ..approximations.expectation_propagation import factor_is_log_concave
from ..approximations.laplace_error import SKEW_VALID, skew_correction
from ..engine import n_family_params, variational_sampling
from ..engine.sample_pool import grown_bytes_per_point
from ..engine.variational_sampling import UNRELIABLE_KL
from ..exceptions import (
    ConvergenceWarning,
    EstimationError,
    UnknownErrorWarning,
    UnreliableFitWarning,
)
from ..gaussian import excess_kl
from ..models.work import (
    LINK_COST,
    SITE_WORK,
    expected_ep_work,
    likelihood_point_work,
    sampled_dim,
)
from ._methods import (
    SOFTMAX_MODELS,
    MethodFit,
    ep_posterior,
    rows_in_memory,
    softmax_ep_kernel,
    softmax_ep_posterior,
)
from ._sampling import EP_WORK_RATIO, SamplingMethod

__all__ = ["DEFAULT_TARGET_KL", "STRATEGIES", "VSMethod"]

#: "global": one VS fit of the whole posterior; "sites": expectation propagation whose site
#: fits are VS fits of the one-dimensional tilted densities (for the multinomial posterior,
#: (K − 1)-dimensional sites from their tilted moments, or VS fits where the rows are wide);
#: "auto": chosen per problem.
#: (Listed in vsbayes._choices, which the command line reads without importing the library.)
STRATEGIES = VS_STRATEGIES

# "auto" runs the global fit only if it can have at least MIN_GLOBAL_FACTOR·n points (at
# most MAX_GLOBAL_FACTOR·n) within both work limits below: under 16n the global fit is
# measured less accurate than EP alone on the paper's data sets (32n is 2-3× better than
# 8n; benchmarks/results/strategy_choice.md). Work is counted in multiply-adds — a
# deterministic stand-in for time, so that the choice is the same on every machine: the
# global fit's likelihood pass costs N × M × (p + LINK_COST), an EP sweep
# M × (2p² + site cost) + p³/3 (the Gram matrix, the marginals, the site fits, the Cholesky
# factor), a site fit SITE_NODES link evaluations unless the link's tilted moments have a
# closed form. The limits keep a default fit within ~30 LogisticRegression fits and ~10 EP
# fits of the same data (measured: benchmarks/strategy_choice.py,
# benchmarks/high_dimension.py).
MIN_GLOBAL_FACTOR, MAX_GLOBAL_FACTOR = 16, 32
GLOBAL_WORK_LIMIT = 2e8  # (EP_WORK_RATIO: _sampling.py, which IS and BMC read too)
# The bound by EP's work is never below GLOBAL_WORK_FLOOR multiply-adds (tens of ms; 32n
# points on 1000 rows × 6 features are 4.3e7): where EP is cheap (closed-form probit sites,
# a few hundred rows) 8× its work refused global fits of a few ms, leaving EP's fixed point
# unchecked (kl_error_ NaN) where it is off. Measured against importance sampling on
# probit problems with 1 % positives (benchmarks/unseen_cases.py): EP 0.011-0.047 nats,
# the global fit then taken 0.003-0.009.
GLOBAL_WORK_FLOOR = 5e7
SITE_NODES = 40  # (LINK_COST: models/work.py, the one count of a point's work)
# Many rows per Gaussian parameter (M ≥ DATA_RICH · n) make the posterior nearly Gaussian:
# there "auto" first compares EP's expected work — EP_SWEEPS sweeps of M × (2p² +
# SITE_WORK) — with the global fit's at the estimator's own N from the Laplace kernel, and
# takes the cheaper. A site costs SITE_WORK multiply-adds in practice (measured: ~2.5 µs per
# site and sweep, 2·10⁵ rows × 20). Without it, 10⁶ × 20 took 94 s by EP against 21-24 s
# for the global fit at 8n. (EP_SWEEPS, SITE_WORK: models/work.py, expected_ep_work.)
DATA_RICH = 50
# "auto" keeps the global fit only where it departs from EP by more than this many times
# its own predicted error: the departure is about the sum of both errors, and kl_error is
# up to ~2× optimistic at 16-32n, so EP's error is then the larger.
DEPARTURE_FACTOR = 4.0
# The multinomial posterior (K > 2): the global fit samples only its (K − 1)(d + 1)
# contrasts (the shift directions' posterior is known: models/softmax_contrasts.py), so n
# counts the contrasts' family (wine: 435 parameters instead of θ's 946). "auto" runs it
# from the Laplace kernel with MULTINOMIAL_MAX_FACTOR·n points if the work of N × (M K (d +
# 1 + LINK_COST) + p (p − d − 1) + n²) multiply-adds (the likelihood pass, the map to θ,
# the solver's features) stays within MULTINOMIAL_WORK_LIMIT, else with as many as fit down
# to MULTINOMIAL_MIN_FACTOR·n; below that it takes expectation propagation of the
# (K − 1)-dimensional sites (strategy_ "sites", with the reason). The factors are twice the
# binary ones: n shrinks by 2.1-2.2× on iris and wine, and 64n contrast points are about as
# many as the 32n of θ's family were (0.92-0.94×); at 32n of the contrasts the error against
# the NUTS references was measured larger (KL over Laplace's, median of 10 seeds: iris 0.024
# against 0.017, wine 0.014 against 0.0096), at 64n no larger (iris 0.012 over 40 seeds,
# wine 0.0090; docs/decisions.md D-091). Measured before the reduction: wine (K = 3, d = 13,
# n = 946) at 32n, 2.8e10 multiply-adds: the whole default fit 0.23 s on 2 idle cores; iris
# (n = 136) 0.025 s (benchmarks/results/data_rich.md).
MULTINOMIAL_MIN_FACTOR, MULTINOMIAL_MAX_FACTOR = 32, 64
#: With a ``target_kl``, the global fit's added rounds stop at this many times its first
#: rounds' points (``n_samples``), or at what fits in memory.
TARGET_POINTS_FACTOR = 64
MULTINOMIAL_WORK_LIMIT = 5e10
# Where EP failed, the global fit is "auto"'s last route before the Laplace fallback, with
# no EP to compare it with. Below MIN_GLOBAL_FACTOR·n points it runs only where trying
# costs little: not below 2n points (the engine then warns that the fit nearly interpolates,
# and "auto" discards it; below n it is not determined), nor where its work, counted as the
# multinomial fit's (the likelihood pass and the solver's n² features per point), exceeds
# UNDERSIZED_WORK_LIMIT, the multinomial default's limit in that count. Measured
# (docs/decisions.md D-141): every such fit after a failed EP, 2.1-14n points, 5.3e10-1.8e13
# multiply-adds, was discarded after 0.5-18 s (the horseshoe at p = 60-200); a cheaper
# one (15.5n, 4.5e8, 0.06 s: extreme class weights) was kept.
UNDERSIZED_WORK_LIMIT = MULTINOMIAL_WORK_LIMIT
# A heavy-tailed shrinkage prior (Student-t, horseshoe: not log-concave) gives EP sites
# fitted to tilted densities that may be far from Gaussian (bimodal where the data pull a
# coefficient off the prior's spike), and EP's fixed point then has no error bound
# (docs/decisions.md). "auto" predicts EP's error there from what its coefficient sites
# drop: the sum over coefficients of KL(tilted ‖ its moment Gaussian), D. At most
# HEAVY_TAILED_SITE_KL, EP is kept (measured against NUTS, Student-t ν = 3: EP had every
# coefficient's mean and sd within 0.1 sd where D ≤ 0.17 and 98 % at D = 0.92 with d = 200;
# 87 % at D = 1.86, breast cancer's collinear features). Beyond, the global fit with the
# prior's exact log-density runs at up to 32n points within HEAVY_TAILED_WORK_LIMIT (its
# work is not measured against EP's, whose result is not trusted), unless it could not see
# the posterior's mass: for independent coefficients, the effective sample size of the
# weights p/π from the moment Gaussian is at most N·exp(-D) (1 + χ² ≥ exp(KL) per
# coordinate), and below d + 1 the fit would be discarded as unreliable (the horseshoe at
# τ = 0.1: D = 8-45 nats on the benchmark's data, against ESS 2-18 of 10⁵ importance draws).
# Where it runs and is reliable, the global fit is taken (EP's own error being the one
# predicted to exceed the target).
HEAVY_TAILED_SITE_KL = 0.5
HEAVY_TAILED_WORK_LIMIT = 1e9

# EP's error shrinks as the square of Laplace's as the rows grow (Dehaene & Barthelmé 2018:
# EP's mean error is O(M⁻²), Laplace's O(M⁻¹)): "auto" predicts the multinomial EP's error
# as EP_ERROR_FACTOR × (the Laplace approximation's predicted error)², and where that is
# within the target keeps EP instead of running the global fit from it. Measured against
# the NUTS references, EP's error / (Laplace's predicted error)² was 0.32 (iris), 0.0035
# (wine), 0.15 (20 classes); against 32n global fits on 2000 rows × 8 features, ≤ 0.09
# (3 classes) and ≤ 0.07 (5 classes). Those predictions were the mean term alone; with
# the covariance term (D-253) they are 1.1-1.7× higher near the thresholds (iris 0.32 →
# 0.45 nats: its ratio 0.16). Every ratio only shrank with them, so the largest is now
# iris's 0.16, where it was 0.32: the factor is halved, keeping the same margin above the
# largest measured ratio (1.56×; D-266). At 0.5 it handed 5 classes × 2000 rows × 8
# features (predicted 0.15 nats) to a global fit 8× EP's time and less accurate than EP
# (KL from a 400,000-point global fit 0.00062 against EP's 0.00046: ratio 0.02).
EP_ERROR_FACTOR = 0.25
# Where the Laplace approximation's predicted error is moderate (EP_ERROR_FACTOR × its
# square above the target, the error itself at most LAPLACE_KERNEL_ERROR nats), "auto"
# runs the multinomial global fit from the Laplace kernel with LAPLACE_KERNEL_FACTOR times
# the points (within the work limit) instead of running EP for its kernel: its two rounds
# adapt the kernel themselves. Measured (docs/decisions.md): iris (0.32 nats) against the
# NUTS reference, KL 0.00585 against 0.00584 from EP's kernel at 32n (10 seeds), in a
# third of the time (28 against 86 ms); five make_classification problems of 150-400 rows
# and 3-4 classes (0.28-0.59 nats) against 128n global fits, equal or smaller errors on
# four, 0.0050 against 0.0044 on one, in 0.5-1.1× the time. Wine (5.7 nats) from the
# Laplace kernel: 0.19 against 0.039.
LAPLACE_KERNEL_ERROR, LAPLACE_KERNEL_FACTOR = 0.6, 1.5


# The skewness shortcut: "auto" first predicts, from the third derivatives of the likelihood
# at the mode (approximations/laplace_error.py), the error of the Laplace approximation with
# its mean moved by the leading-order correction, and stops there when that prediction is
# within the target (the user's target_kl, DEFAULT_TARGET_KL for "auto"): no global fit or
# EP can then change the posterior by more than the accuracy asked for. The expansion is
# trusted only where its leading terms are at most SKEW_VALID nats (measured: see its
# definition in laplace_error.py).

#: The predicted error (excess KL, nats) ``target_kl="auto"`` asks of the global fits the
#: estimator takes by itself without comparing them with EP: the data-rich branch of
#: strategy="auto" and dask input. Those posteriors are nearly Gaussian and their fit at the
#: default 8n usually predicts far less, so the target only adds rounds where 8n falls short;
#: it is the accuracy the calibration of kl_error on the paper's data asked for (met in
#: ≥ 90 % of fits, benchmarks/results/kl_error_calibration.md).
DEFAULT_TARGET_KL = 0.01


@dataclass(frozen=True, kw_only=True)
class VSMethod(SamplingMethod):
    """Variational sampling of one problem by the route ``strategy`` names (see the
    module docstring); the clock of ``time_budget`` starts when the object is made."""

    strategy: str
    rounds: int
    kernel_scale: float
    target_kl: float | str | None
    time_budget: float | None
    max_iter: int
    started: float = field(default_factory=time.perf_counter, init=False, repr=False)

    records_strategy: ClassVar[bool] = True
    #: Under a shrinkage prior the multinomial posterior is EP's (its prior sites beside the
    #: rows'): the global fit draws only the contrasts (``_multinomial``).
    multinomial_shrinkage: ClassVar[bool] = True
    #: One row's posterior moments are its tilted density's, computed to round-off: what
    #: every route aims at, without sampling error (see _methods.LaplaceMethod's).
    one_row: ClassVar[str | None] = "moments"
    engine: ClassVar[Callable] = staticmethod(variational_sampling)
    # The contrasts' fit has N ≥ 32n points (MULTINOMIAL_MIN_FACTOR): matrix-free solver
    # steps from the start, as for n > 66 (iris's n = 66 contrasts: the exact steps made
    # the default fit 1.4× slower than the full-space fit it replaced).
    contrast_options: ClassVar[tuple[tuple[str, object], ...]] = (("hessian", "switch"),)
    # The global fit's points see the target to far coarser than float32's rounding of
    # its rows' terms (~10⁻⁷ of each): the likelihood pass in float32 (D-165). IS keeps
    # float64: its weights are the target as it is (scikit-learn's sample-weight checks).
    single_likelihood: ClassVar[bool] = True

    verbose: int = 0

    def fit(self, model, laplace, rng) -> MethodFit:
        fit = self._routed(model, laplace, rng)
        # Said once, for every route (verbose=1 had said some routes and not others, e.g.
        # not EP's site fits on breast cancer): which one ran, and why.
        self._say(f"route {fit.strategy!r}: {fit.reason}")
        return fit

    def _routed(self, model, laplace, rng) -> MethodFit:
        """The route's fit, checked against the target and the predictions."""
        stopped, note, laplace_error = self._gaussian_enough(model, laplace)
        if stopped is not None:
            return stopped
        if isinstance(model, SOFTMAX_MODELS):
            fit = self._multinomial(model, laplace, rng, laplace_error)
        elif not model.rows_in_memory:
            fit = self._chunked(model, laplace, rng)
        else:
            fit = self._binary(model, laplace, rng)
        self._check_target(fit)
        self._check_predicted(fit)
        if note and fit.reason:
            fit = dataclasses.replace(fit, reason=f"{note}; {fit.reason}")
        return fit

    # --- the skewness shortcut ----------------------------------------------------------

    def target(self) -> float | None:
        """The accuracy asked for (excess KL, nats): ``target_kl``, "auto" the default's."""
        if isinstance(self.target_kl, str):
            return DEFAULT_TARGET_KL
        return None if self.target_kl is None else float(self.target_kl)

    def _gaussian_enough(self, model, laplace) -> tuple[MethodFit | None, str, float | None]:
        """The Laplace approximation with its mean corrected, if its predicted error is
        within the target (see SKEW_VALID), else None and what was predicted; and the plain
        Laplace approximation's predicted error (None: not predicted)."""
        target = self.target()
        if (
            self.strategy != "auto"
            or target is None
            or not isinstance(self.n_samples, str)  # an N of one's own asks for sampling
            or self.family != "gaussian"
            or model.n_observations < model.dim  # far from Gaussian; and no p × p pass
            # The expansion is the likelihood's about a Gaussian prior's mode.
            or getattr(model, "coefficient_prior", None) is not None
        ):
            return None, "", None
        correction = skew_correction(model, laplace)
        if correction is None:
            return None, "", None
        predicted = correction.corrected_error
        if correction.in_range(SKEW_VALID) and predicted <= target:
            reason = (
                f"{model.n_observations} rows for {model.dim} parameters: the Laplace "
                f"approximation's predicted error {correction.laplace_error:.3g} nats (from "
                f"the likelihood's skewness at the mode), {predicted:.3g} with its mean moved "
                f"by the skewness correction, within target_kl={target:.3g}: a global fit or "
                f"EP cannot change the posterior beyond the target, and is not run"
            )
            fit = MethodFit(
                correction.corrected(laplace),
                laplace.n_iter,
                strategy="laplace",
                reason=reason,
                kl_error=predicted,
                stop_reason="target_kl",
            )
            return fit, "", correction.laplace_error
        if not correction.in_range(SKEW_VALID):
            term = max(correction.mean_term, correction.quartic_term or 0.0)
            why = f"beyond the expansion's range ({term:.3g} > {SKEW_VALID:g})"
        else:
            why = f"above target_kl={target:.3g}"
        note = (
            f"the Laplace approximation's predicted error {correction.laplace_error:.3g} "
            f"nats ({predicted:.3g} with its mean corrected) is {why}"
        )
        if correction.prior_bound == correction.laplace_error:
            # The likelihood's curvature against the prior's bounded it (laplace_error.py).
            note = (
                f"the Laplace approximation's predicted error from the likelihood's "
                f"skewness is {why}; bounded by the likelihood's curvature against the "
                f"prior's, it is {correction.laplace_error:.3g} nats"
            )
        self._say(note)
        return None, note, correction.laplace_error

    def _check_target(self, fit: MethodFit) -> None:
        """Warn where a global fit stopped short of the user's ``target_kl``."""
        if not isinstance(self.target_kl, Real) or fit.strategy != "global":
            return
        error, stopped = fit.posterior.kl_error, fit.posterior.stop_reason
        if stopped in ("max_samples", "time_budget", "stalled", "failed") and (
            error > self.target_kl
        ):
            # The remedy is the limit that stopped it: under a target the points stop at
            # TARGET_POINTS_FACTOR × n_samples (or memory), which more time does not lift.
            if stopped == "time_budget":
                remedy = "Allow more time (time_budget) or a larger target_kl."
            elif stopped == "stalled":
                # Silent before D-224, as "failed" was.
                remedy = (
                    "An added round raised no effective sample size: its kernel, the fit "
                    "widened by kernel_scale, sees less of the posterior than the earlier "
                    "ones, and more rounds drawn alike would not help. Ask for a larger "
                    "target_kl, or try a smaller kernel_scale."
                )
            elif stopped == "failed":
                remedy = "An added round's fit failed. Ask for a larger target_kl."
            else:
                remedy = (
                    f"Ask for a larger target_kl, or more points (the added rounds stop at "
                    f"{TARGET_POINTS_FACTOR} times the first ones, n_samples, or at what fits "
                    f"in memory)."
                )
            warn(
                f"{self.estimator_name}: the global fit stopped at {stopped} "
                f"({getattr(fit.posterior, 'n_samples', '?')} points) with a predicted error "
                f"of {error:.3g} nats, short of target_kl={self.target_kl:g}. {remedy}",
                ConvergenceWarning,
            )

    def _check_predicted(self, fit: MethodFit) -> None:
        """Warn where a route kept EP with a predicted error above UNRELIABLE_KL (its
        departure from the global fit plus that fit's error; a global fit's own, the
        engine warns of, as of an unknown one, inf, which this sum then is too)."""
        error = fit.kl_error
        if error is None or fit.stop_reason == "target_kl" or math.isinf(error):
            return
        if not error > UNRELIABLE_KL:
            return
        warn(
            f"{self.estimator_name}: the posterior kept (strategy_={fit.strategy!r}) has a "
            f"predicted error of {error:.3g} nats (kl_error_), above {UNRELIABLE_KL:g}: "
            f"{fit.reason}. Use more points (n_samples) for the global fit that measures "
            f"it, or compare with LaplaceLogisticRegression/EPLogisticRegression "
            f"(or the probit ones).",
            UnreliableFitWarning,
        )

    def _say_planned_work(self, model) -> None:
        """The binary routes' planned work, before any of it."""
        m, p = model.n_observations, model.dim
        sweep = m * (2.0 * p * p + SITE_WORK) + p**3 / 3.0
        if self.strategy == "sites":
            self._say(f"strategy='sites': EP, ~{sweep:.3g} multiply-adds per sweep")
            return
        pass_work = likelihood_point_work(model)
        if self.strategy == "auto":
            # The route, and with it the global fit's N, is chosen after this line: say
            # the unit costs the choice weighs, not an N it may not use.
            self._say(
                f"strategy='auto': EP ~{sweep:.3g} multiply-adds per sweep, "
                f"a global fit ~{pass_work:.3g} per point"
            )
            return
        n_samples = self.total_samples(p)
        self._say(
            f"strategy={self.strategy!r}: the global fit plans N={n_samples} points "
            f"({n_samples * pass_work:.3g} multiply-adds); EP ~{sweep:.3g} per sweep"
        )

    def _say(self, message: str) -> None:
        if self.verbose:
            print(f"{self.estimator_name or 'VSMethod'}: {message}", flush=True)

    # --- the routes -------------------------------------------------------------------

    def _binary(self, model, laplace, rng) -> MethodFit:
        """One binary problem with its rows in memory."""
        if self.verbose:
            self._say_planned_work(model)
        if self.strategy == "global":
            self.check_memory(model, self.total_samples(model.dim))
            if self.kernel == "laplace":
                fit = self._global_fit(model, laplace, rng)
                return _chose("global", "strategy='global'", fit)
        if self.strategy == "auto":
            cheaper = self._global_is_cheaper(model)
            if cheaper:
                # Big data: the global fit from the Laplace kernel, if it is reliable.
                fit, trouble = self._quiet_global(model, laplace, rng, default_target=True)
                if trouble is None:
                    return _chose("global", cheaper, fit)
        # EP is the kernel, the site-fit posterior, or both: one EP fit to fit tolerance.
        with catch(("always", ConvergenceWarning), record=True) as ep_warnings:
            try:
                ep, ep_trouble = ep_posterior(model, laplace, tol=self.tol), None
            except EstimationError as error:
                if self.strategy == "sites":
                    raise
                ep, ep_trouble = None, f"expectation propagation failed ({error})"
        if ep_warnings:
            ep_trouble = f"expectation propagation did not converge: {ep_warnings[0].message}"
        if self.strategy == "sites":
            return _chose("sites", self._unsampled("strategy='sites'"), ep, ep_warnings)
        # An unconverged EP can sit far from the posterior: not a kernel (see sampling_kernel).
        kernel = ep if ep_trouble is None and self.kernel == "ep" else laplace
        if self.strategy == "global":
            return _chose("global", "strategy='global'", self._global_fit(model, kernel, rng))
        return self._auto(model, laplace, kernel, rng, ep, ep_warnings, ep_trouble)

    def _chunked(self, model, laplace, rng) -> MethodFit:
        """Rows in dask chunks (big data): "auto" takes the global fit from the Laplace
        kernel where it is cheaper than EP's expected sweeps, as for data-rich problems in
        memory, without EP's fit to compare with (a dozen passes over the chunks), else EP
        over the chunks, as the rows in memory would; "sites" and "global" as in memory."""
        if self.verbose:
            self._say_planned_work(model)
        cheaper = self._global_is_cheaper(model) if self.strategy == "auto" else None
        if self.strategy == "sites" or (self.strategy == "auto" and cheaper is None):
            # The global fit's N ~ 8n points, n ~ p²/2, each a pass over the rows: at
            # 4000 × 300 hours where EP's sweeps take seconds.
            reason = (
                "strategy='sites'"
                if self.strategy == "sites"
                else "strategy='auto' with rows in dask chunks: EP over the chunks (the "
                "global fit from the Laplace kernel would cost more than EP's expected "
                "sweeps)"
            )
            return _chose("sites", reason, ep_posterior(model, laplace, tol=self.tol))
        self.check_memory(model, self.total_samples(model.dim))
        if self.strategy == "global":
            fit = self._global_fit(model, self.sampling_kernel(model, laplace), rng)
            return _chose("global", "strategy='global'", fit)
        reason = f"strategy='auto' with rows in dask chunks: the global fit ({cheaper})"
        return _chose("global", reason, self._global_fit(model, laplace, rng, default_target=True))

    def _multinomial(self, model, laplace, rng, laplace_error=None) -> MethodFit:
        """The multinomial posterior: the global fit (from the multinomial EP kernel, see
        ``sampling_kernel``; from the Laplace kernel with more points where its predicted
        error is moderate, ``_laplace_kernel_enough``) where affordable and EP's predicted
        error is not within the target (``_ep_enough``), else (and with
        ``strategy="sites"``) EP of the (K − 1)-dimensional sites."""
        chunked = not rows_in_memory(model)
        factor = getattr(model, "coefficient_prior", None)
        if factor is not None:
            # The global fit draws the contrasts alone (D-091), whose posterior under a
            # Gaussian prior is separate from the shift's; under a prior on each class's
            # coefficients it is not: EP with the prior's sites is the fit.
            if self.strategy == "global":
                raise ValueError(
                    f"strategy='global' with more than two classes draws the class "
                    f"contrasts alone, whose posterior is separate from the shift "
                    f"directions' under a Gaussian prior only; under the {factor!r} prior "
                    f"it is not. Use strategy='auto' or 'sites' (the multinomial EP with "
                    f"the prior's sites), or fit one-vs-rest, e.g. "
                    f"OneVsRestClassifier(VSLogisticRegression(strategy='global'))."
                )
            reason = (
                f"strategy='{self.strategy}' with the {factor!r} prior on each class's "
                f"coefficients: the multinomial EP with one site per coefficient (the "
                f"global fit draws only the contrasts, whose posterior is not separate from "
                f"the shift directions' under this prior)"
            )
            self._say(reason)
            return _chose(
                "sites",
                reason,
                softmax_ep_posterior(model, laplace, tol=self.tol, verbose=self.verbose),
            )
        if self.strategy == "sites":
            if chunked:
                raise ValueError(
                    "strategy='sites' with more than two classes needs the rows in memory: "
                    "the multinomial EP over dask chunks is not implemented. Use "
                    "strategy='auto' or 'global', or pass X.compute() if the data fit in "
                    "memory."
                )
            reason = "strategy='sites'"
        else:
            n_samples, reason = self._multinomial_samples(model)
            self._say(reason)
            if n_samples is not None:
                near = self._laplace_kernel_enough(model, laplace_error, n_samples)
                if near is not None:
                    n_near, why = near
                    fit = self._global_fit(model, laplace, rng, n_near)
                    return _chose("global", f"{reason}; {why}", fit)
                # EP to the fit's tolerance where it may be the result, else as a kernel.
                ep_fit = (
                    softmax_ep_posterior
                    if self._ep_predicted(laplace_error) is not None
                    else softmax_ep_kernel
                )
                kernel = self.sampling_kernel(model, laplace, ep_fit)
                stopped = self._ep_enough(kernel, laplace, laplace_error, n_samples)
                if stopped is not None:
                    return stopped
                return _chose("global", reason, self._global_fit(model, kernel, rng, n_samples))
            if chunked:  # a choice of "auto", recorded in strategy_ (no fallback)
                return _chose(
                    "laplace",
                    "the global fit of the multinomial posterior is beyond its work limit, "
                    "and the multinomial EP over dask chunks is not implemented: the Laplace "
                    "approximation is kept",
                    laplace.replace(),
                )
        return _chose(
            "sites",
            self._unsampled(reason),
            softmax_ep_posterior(model, laplace, tol=self.tol, verbose=self.verbose),
        )

    def _laplace_kernel_enough(self, model, laplace_error, n_samples) -> tuple[int, str] | None:
        """The N of the multinomial global fit from the Laplace kernel and why, where the
        Laplace approximation's predicted error ``laplace_error`` is moderate (see
        LAPLACE_KERNEL_ERROR) under "auto"; else None (EP's kernel, or EP itself)."""
        target = self.target()
        if (
            self.strategy != "auto"
            or self.kernel != "ep"
            or target is None
            or not isinstance(self.n_samples, str)
            or laplace_error is None
            or not rows_in_memory(model)
            or EP_ERROR_FACTOR * laplace_error**2 <= target  # EP itself is kept
            or laplace_error > LAPLACE_KERNEL_ERROR
        ):
            return None
        n = n_family_params(sampled_dim(model), self.family)
        per_point = _global_point_work(model, n)
        affordable = int(MULTINOMIAL_WORK_LIMIT // per_point)
        n_near = max(n_samples, min(int(LAPLACE_KERNEL_FACTOR * n_samples), affordable))
        return n_near, (
            f"the Laplace approximation's predicted error {laplace_error:.3g} nats is at most "
            f"{LAPLACE_KERNEL_ERROR:g}: the global fit from the Laplace kernel with "
            f"N={n_near} points, without EP's kernel"
        )

    def _ep_predicted(self, laplace_error) -> float | None:
        """EP's predicted error under "auto" (:data:`EP_ERROR_FACTOR` times the square of
        the Laplace approximation's predicted error ``laplace_error``) if within the
        target, else None."""
        target = self.target()
        if (
            self.strategy != "auto"
            or target is None
            or not isinstance(self.n_samples, str)
            or laplace_error is None
        ):
            return None
        predicted = EP_ERROR_FACTOR * laplace_error**2
        return predicted if predicted <= target else None

    def _ep_enough(self, ep, laplace, laplace_error, n_samples) -> MethodFit | None:
        """The multinomial EP ``ep`` itself (route "sites"), if its predicted error —
        :data:`EP_ERROR_FACTOR` times the square of the Laplace approximation's predicted
        error ``laplace_error`` — is within the target under "auto"; else None."""
        predicted = self._ep_predicted(laplace_error)
        if predicted is None or ep is laplace:  # EP failed or did not converge
            return None
        target = self.target()
        why = (
            f"EP's predicted error {predicted:.3g} nats ({EP_ERROR_FACTOR:g} × the square of "
            f"the Laplace approximation's {laplace_error:.3g}) is within target_kl="
            f"{target:.3g}: the global fit from it ({n_samples} points) is not run"
        )
        return _chose("sites", why, ep, kl_error=predicted, stop_reason="target_kl")

    def _auto(self, model, laplace, kernel, rng, ep, ep_warnings, ep_trouble) -> MethodFit:
        """strategy="auto": the global fit where affordable, reliable and measurably
        different from EP (see ``strategy`` in the estimator's docstring), else EP's; where
        EP failed, the global fit unless under-sized and costly (UNDERSIZED_WORK_LIMIT),
        else the Laplace approximation."""
        n_samples, why_not = self._global_samples(model, ep)
        asked = self._asks_accuracy()
        if _heavy_tailed(model) and not asked and ep is not None:
            return self._heavy_tailed_route(model, kernel, rng, ep, ep_warnings, n_samples, why_not)
        if why_not and asked:
            # The work limits are the default's: a target or a budget of one's own lifts them
            # (from the fewest points at which the global fit can beat EP's, or be kept
            # where EP failed).
            n_samples = max(n_samples, MIN_GLOBAL_FACTOR * n_family_params(model.dim, self.family))
            why_not = f"{why_not}; run anyway for {asked}, from N={n_samples}"
        elif why_not and ep is not None:
            return _chose("sites", why_not, ep, ep_warnings)
        elif why_not:
            not_run = self._undersized(model, n_samples)
            if not_run:
                return self._laplace_kept(laplace, f"{ep_trouble}; {why_not}; {not_run}")
        self._say(f"the global fit, N={n_samples} points" + (f" ({why_not})" if why_not else ""))
        fit, trouble = self._quiet_global(model, kernel, rng, n_samples)
        if trouble and ep is None:
            raise EstimationError(f"Both fits failed: {ep_trouble}; {trouble}")
        if trouble:
            if asked:
                # What was asked for is not met: say so, never return EP silently (D-224).
                target = self.target()
                missed = f"target_kl={target:g} is not met" if target is not None else ""
                warn(
                    f"{self.estimator_name}: the global fit run for {asked} is not kept: "
                    f"{trouble.rstrip('.')}. Expectation propagation's posterior is kept "
                    f"instead, its error unmeasured (kl_error_ is NaN)"
                    + (f": {missed}. Ask for a larger target_kl, or" if missed else ". Or")
                    + " compare with strategy='global' and more points (n_samples).",
                    ConvergenceWarning,
                )
            return _chose("sites", trouble, ep, ep_warnings)
        if ep_trouble:  # the global fit's N, where below the rule's, said too
            return _chose("global", f"{ep_trouble}; {why_not}" if why_not else ep_trouble, fit)
        departure = excess_kl(fit, ep)
        within = departure <= DEPARTURE_FACTOR * fit.kl_error
        reason = (
            f"the global fit departs from EP by {departure:.3g} nats, "
            f"{'within' if within else 'beyond'} {DEPARTURE_FACTOR:g}× its own predicted "
            f"error {fit.kl_error:.3g}"
        )
        if why_not:
            reason = f"{why_not}; {reason}"
        if not within:
            return _chose("global", reason, fit)
        # EP's error: at most about what separates it from the global fit plus that fit's own.
        predicted = departure + fit.kl_error
        target = self.target() if asked else None
        stop = None if target is None else ("target_kl" if predicted <= target else None)
        if target is not None and stop is None:
            warn(
                f"{self.estimator_name}: EP's predicted error {predicted:.3g} nats (its "
                f"departure from the global fit plus that fit's error) is short of "
                f"target_kl={target:g}. Allow more time (time_budget) or a larger target_kl.",
                ConvergenceWarning,
            )
        return _chose("sites", reason, ep, ep_warnings, kl_error=predicted, stop_reason=stop)

    def _heavy_tailed_route(self, model, kernel, rng, ep, ep_warnings, n_samples, why_not):
        """strategy="auto" under a heavy-tailed prior (see HEAVY_TAILED_SITE_KL): EP where
        its coefficient sites drop little, else the global fit where it can see the
        posterior's mass and is reliable."""
        dropped = _sites_departure(model, ep)
        prior = f"the {model.coefficient_prior!r} prior is not log-concave"
        if dropped <= HEAVY_TAILED_SITE_KL:
            reason = (
                f"{prior}, and EP's coefficient sites drop {dropped:.3g} nats of their tilted "
                f"densities (≤ {HEAVY_TAILED_SITE_KL:g}): EP is kept"
            )
            return _chose("sites", reason, ep, ep_warnings)
        prior = (
            f"{prior}, and EP's coefficient sites drop {dropped:.3g} nats of their tilted "
            f"densities (> {HEAVY_TAILED_SITE_KL:g}: EP's error beyond the target)"
            if math.isfinite(dropped)
            else f"{prior}, and an improper cavity leaves EP's error unknown"
        )
        if why_not:
            return _chose("sites", f"{prior}; {why_not}: EP is kept", ep, ep_warnings)
        seen = n_samples * math.exp(-min(dropped, 700.0))
        if math.isfinite(dropped) and seen < model.dim + 1:
            reason = (
                f"{prior}; the global fit's N={n_samples} points would have an effective "
                f"sample size of at most ~{seen:.3g} (N·exp(-{dropped:.3g})), below "
                f"d+1={model.dim + 1}: no Gaussian kernel sees this posterior's mass, and EP "
                f"is kept (its error unmeasured)"
            )
            return _chose("sites", reason, ep, ep_warnings)
        self._say(f"the global fit, N={n_samples} points ({prior})")
        fit, trouble = self._quiet_global(model, kernel, rng, n_samples)
        if trouble:
            return _chose("sites", f"{prior}; {trouble}: EP is kept", ep, ep_warnings)
        reason = f"{prior}; the global fit departs from EP by {excess_kl(fit, ep):.3g} nats"
        return _chose("global", reason, fit)

    def _undersized(self, model, n_samples: int) -> str | None:
        """Why the global fit of ``n_samples`` points, below MIN_GLOBAL_FACTOR·n, is not
        worth trying after EP failed (None: it is; see UNDERSIZED_WORK_LIMIT)."""
        n = n_family_params(model.dim, self.family)
        if n_samples < 2 * n:
            return (
                f"below 2n = {2 * n} points the fit nearly interpolates the target and is "
                f"discarded as unreliable (below n = {n} it is not determined), so it is not run"
            )
        per_point = _global_point_work(model, n)
        work = n_samples * per_point
        if work <= UNDERSIZED_WORK_LIMIT:
            return None
        return (
            f"its {work:.3g} multiply-adds ({per_point:.3g} per point: the likelihood pass "
            f"and the solver's n² features) exceed {UNDERSIZED_WORK_LIMIT:.3g} for a fit "
            f"below {MIN_GLOBAL_FACTOR}n, so it is not run"
        )

    def _laplace_kept(self, laplace, reason: str) -> MethodFit:
        """The Laplace approximation where no route is left to run, said in
        ``strategy_reason_`` and warned as a fallback (``laplace_fallback_``)."""
        reason = f"{reason}: the Laplace approximation is kept"
        warn(
            f"{self.estimator_name}: {reason} (recorded in laplace_fallback_).",
            UnreliableFitWarning,
        )
        return MethodFit.fallback(laplace, reason)

    def _unsampled(self, reason: str) -> str:
        """``reason``, saying (and warning) that a target or budget of one's own is not
        applied: EP's site fits alone have no sampling to extend nor a predicted error."""
        asked = self._asks_accuracy()
        if not asked:
            return reason
        warn(
            f"{self.estimator_name}: {asked} not applied: {reason}, and expectation "
            f"propagation's site fits have no sampling error to reduce (kl_error_ is NaN). "
            f"Use strategy='global' (or 'auto' on a problem whose global fit is affordable) "
            f"for a sampled fit that meets a target.",
            UserWarning,
        )
        return f"{reason}; {asked} not applied (EP's site fits are not sampled)"

    def _asks_accuracy(self) -> str:
        """What of the user's own asks for accuracy beyond the default's work limits."""
        asks = []
        if isinstance(self.target_kl, Real):
            asks.append(f"target_kl={self.target_kl:g}")
        if self.time_budget is not None:
            asks.append(f"time_budget={self.time_budget:g}")
        return " and ".join(asks)

    # --- the global fit ---------------------------------------------------------------

    def _global_fit(self, model, kernel, rng, n_samples=None, *, default_target=False):
        """The VS fit of the whole posterior from ``kernel`` (``n_samples`` points, default
        the estimator's); ``default_target``: ``target_kl="auto"`` asks for
        :data:`DEFAULT_TARGET_KL` (see its comment)."""
        n_samples = self.total_samples(model.dim) if n_samples is None else n_samples
        options = self.engine_options(model.dim, n_samples, default_target=default_target)
        return self.draw(model, kernel, rng, n_samples, **options)

    def engine_options(self, dim: int, n_samples: int, *, default_target=False) -> dict:
        options = {
            "family": self.family,
            "rounds": self.rounds,
            "kernel_scale": self.kernel_scale,
            "max_iter": self.max_iter,
        }
        if isinstance(self.target_kl, str):  # "auto"
            target_kl = DEFAULT_TARGET_KL if default_target else None
        else:
            target_kl = self.target_kl
        if target_kl is None and self.time_budget is None:
            return options
        # Added rounds: as many points as fit in memory, and with a target at most
        # TARGET_POINTS_FACTOR times n_samples (a budget alone is the user's own limit).
        affordable = int(memory_limit() // grown_bytes_per_point(dim))
        cap = affordable if target_kl is None else min(TARGET_POINTS_FACTOR * n_samples, affordable)
        options.update(target_kl=target_kl, max_samples=max(n_samples, cap))
        if self.time_budget is not None:  # what is left of it for this fit
            spent = time.perf_counter() - self.started
            options["time_budget"] = max(self.time_budget - spent, 1e-9)
        return options

    def _quiet_global(self, model, kernel, rng, n_samples=None, *, default_target=False):
        """The global fit and why it is not trusted (None: it is), its doubts unshown."""
        with catch(("always", Warning), record=True) as caught:
            try:
                fit = self._global_fit(model, kernel, rng, n_samples, default_target=default_target)
                trouble = None
            except EstimationError as error:
                fit, trouble = None, f"the global fit failed: {error}"
        doubts = [w for w in caught if _doubts(w.category)]
        reemit([w for w in caught if not _doubts(w.category)])
        if doubts and trouble is None:
            trouble = f"the global fit was unreliable: {doubts[0].message}"
        return fit, trouble

    # --- the work limits --------------------------------------------------------------

    def _multinomial_samples(self, model) -> tuple[int | None, str]:
        """N of the multinomial global fit and why (None: not affordable under "auto")."""
        if self.strategy == "global" or not isinstance(self.n_samples, str):
            n_samples = self.total_samples(model.dim)
            return n_samples, f"strategy={self.strategy!r} with N={n_samples}"
        n = n_family_params(sampled_dim(model), self.family)
        per_point = _global_point_work(model, n)
        n_samples = min(MULTINOMIAL_MAX_FACTOR * n, int(MULTINOMIAL_WORK_LIMIT // per_point))
        n_samples = max(n_samples, self.auto_minimum)
        if n_samples < MULTINOMIAL_MIN_FACTOR * n:
            return None, (
                f"the global fit of the multinomial posterior ({model.dim} parameters, "
                f"{sampled_dim(model)} contrasts: n = {n}) needs at least "
                f"{MULTINOMIAL_MIN_FACTOR}n = {MULTINOMIAL_MIN_FACTOR * n} points, and "
                f"{MULTINOMIAL_WORK_LIMIT:.3g} multiply-adds ({per_point:.3g} per point) "
                f"afford it N={n_samples}: expectation propagation of the (K − 1)-dimensional "
                f"sites instead"
            )
        return n_samples, (
            f"multinomial posterior: the global fit with N={n_samples} "
            f"points within {MULTINOMIAL_WORK_LIMIT:.3g} multiply-adds"
        )

    def _global_is_cheaper(self, model) -> str | None:
        """Why the global fit from the Laplace kernel goes first (None: it does not)."""
        n = n_family_params(model.dim, self.family)
        m = model.n_observations
        if m < DATA_RICH * n:
            return None
        global_work = self.total_samples(model.dim) * likelihood_point_work(model)
        ep_work = expected_ep_work(model)
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
        per_point = likelihood_point_work(model)
        limit, why = GLOBAL_WORK_LIMIT, f"the work limit {GLOBAL_WORK_LIMIT:.3g}"
        if _heavy_tailed(model):
            limit = HEAVY_TAILED_WORK_LIMIT
            why = f"the work limit {limit:.3g} of a heavy-tailed prior"
        elif ep is not None:
            closed = model.link.has_closed_form(np.minimum(model.sample_weight, 1.0))
            site_cost = LINK_COST * (1 if closed else SITE_NODES)
            ep_work = max(ep.n_iter, 1) * (m * (2.0 * p * p + site_cost) + p**3 / 3.0)
            bound = max(EP_WORK_RATIO * ep_work, GLOBAL_WORK_FLOOR)
            if bound < limit:
                limit = bound
                why = f"{EP_WORK_RATIO:g}× EP's work ({ep_work:.3g}, {ep.n_iter} sweeps)"
                if bound == GLOBAL_WORK_FLOOR:
                    why = f"the floor {GLOBAL_WORK_FLOOR:.3g} ({why} is less)"
        n_samples = max(min(MAX_GLOBAL_FACTOR * n, int(limit // per_point)), self.auto_minimum)
        if n_samples < MIN_GLOBAL_FACTOR * n:
            # (One N: the points it would get; the least worth drawing is a count of n's.)
            return n_samples, (
                f"the global fit needs at least {MIN_GLOBAL_FACTOR}n = "
                f"{MIN_GLOBAL_FACTOR * n} points, and {why} multiply-adds "
                f"({per_point:.3g} per point) afford it N={n_samples}"
            )
        return n_samples, None


def _chose(strategy: str, reason: str, posterior, pending_warnings=(), **prediction) -> MethodFit:
    """The record of the route taken; the chosen fit's warnings shown; ``prediction``: the
    ``kl_error`` and ``stop_reason`` of a posterior that does not carry them."""
    reemit(pending_warnings)
    return MethodFit(posterior, _n_iter(posterior), strategy=strategy, reason=reason, **prediction)


def _n_iter(posterior) -> int:
    """The solver's iterations over the rounds (global fit), else EP's sweeps (site fits)
    or Newton's (the Laplace approximation kept)."""
    rounds = getattr(posterior, "rounds", None)
    if rounds:
        return sum(r.n_iter for r in rounds)
    return posterior.n_iter


# Warnings that make "auto" distrust a global fit (it then takes the site fits instead).
_DOUBTS = (UnreliableFitWarning, ConvergenceWarning)


def _doubts(category: type) -> bool:
    """Whether a global fit's warning makes it unreliable. An unknown predicted error is
    not: the routes weigh ``kl_error`` (inf there) themselves, as before the engine
    warned of it (D-188); the warning reaches the user."""
    return issubclass(category, _DOUBTS) and not issubclass(category, UnknownErrorWarning)


def _heavy_tailed(model) -> bool:
    """Whether the model's coefficient prior is heavy-tailed (not log-concave)."""
    factor = getattr(model, "coefficient_prior", None)
    return factor is not None and not factor_is_log_concave(factor)


def _sites_departure(model, ep) -> float:
    """The sum over EP's coefficient sites of KL(tilted ‖ its moment Gaussian) (inf where
    a cavity is improper or EP kept none)."""
    cavities = getattr(ep, "prior_cavities", None)
    if cavities is None:
        return math.inf
    cav_mean, cav_var = cavities
    if not np.all(np.isfinite(cav_var)):
        return math.inf
    return float(np.sum(model.coefficient_prior.tilted_departure(cav_mean, cav_var)))


def _global_point_work(model, n: int) -> float:
    """Multiply-adds per point of a global fit of ``n`` family parameters: the likelihood
    pass (for the multinomial posterior with the map from the contrasts to θ), the
    solver's features."""
    return likelihood_point_work(model) + n * n
