"""Variational sampling (Roche 2013, sections 2–3): fit a Gaussian to any log-density."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._blas import one_blas_thread
from .._warnings import warn
from ..exceptions import (
    ConvergenceWarning,
    NonIntegrableFitError,
    NotPositiveDefiniteError,
    UnknownErrorWarning,
    UnreliableFitWarning,
)
from ..gaussian import Gaussian
from ._agreement import check_mean_within_fit
from ._linalg import flushed_exp
from ._validation import check_enough_samples, check_kernel, check_positive, check_positive_int
from .families import FullFamily, family_class, make_family
from .results import VSResult
from .round_planning import extension_rule
from .rounds import run_rounds
from .sample_pool import Frame, SamplePool, isotropic_start
from .vs_solver import EXACT_HESSIAN_MAX_PARAMS, VSSolver

__all__ = ["UNRELIABLE_KL", "n_family_params", "variational_sampling"]

#: A fit whose predicted error ``kl_error`` (expected excess KL, nats) exceeds this warns
#: (UnreliableFitWarning), unless it met a ``target_kl`` asked for: the level at which
#: importance sampling's moments warn (effective sample size below 2n: n/(2·ESS) nats,
#: D-173), so that a sampled fit's own prediction is held to one standard. A Gaussian a
#: quarter of a nat away moves a mean by 0.7 sd along some direction; single fits'
#: errors reach 1.6-3× the prediction (its calibration). Default fits predict 0.003-0.06
#: (8n-64n points); iris's multinomial fit forced to family="diagonal" predicted 0.3-22,
#: one at training accuracy 0.65 against 0.97 (D-214).
UNRELIABLE_KL = 0.25

# An intermediate round only provides the next kernel: its fit stops once the optimization
# error is below this fraction of its own sampling error, without the exact-Hessian
# fallback, and its warnings are not shown (the final round reports on the result).
INTERMEDIATE_TOL = 0.1


def n_family_params(dim: int, family: str = "gaussian") -> int:
    """Number of parameters n of the family: ``(d+1)(d+2)/2`` (full) or ``2d+1`` (diagonal)."""
    return family_class(family).count_params(dim)


@one_blas_thread
def fit_vs_pool(
    pool: SamplePool,
    start: Gaussian | None,
    *,
    family: str,
    tol: float,
    max_iter: int,
    final: bool = True,
    hessian: str = "auto",
) -> VSResult:
    """Fit the VS Gaussian to the points of ``pool``, in the frame of its last kernel.

    Parameters
    ----------
    pool : SamplePool
        Points, weights, window and target values.
    start : Gaussian or None
        Starting point of the solver in x coordinates (default: the last kernel).
    family, tol, max_iter
        See :func:`variational_sampling`.
    final : bool, default=True
        False for an intermediate round (see ``INTERMEDIATE_TOL``).
    hessian : {"auto", "switch"}, default="auto"
        The solver's Hessian (:class:`~vsbayes.engine.vs_solver.VSSolver`).
    """
    frame = Frame(pool.kernels[-1], diagonal=(family == "diagonal"))
    if frame.diagonal:
        fam = make_family(family, pool.coordinates(frame))
    else:
        fam = FullFamily.from_columns(pool.homogeneous_columns(frame))
    log_w, log_window = pool.log_weights(), pool.log_window()
    log_iw = log_w + pool.log_p - log_window
    shift = float(log_iw.max())
    offsets = log_w - log_window - frame.log_det
    if start is None:
        start_z = Gaussian(np.zeros(pool.dim), np.eye(pool.dim))
    else:
        start_z = frame.gaussian_to_frame(start)
    start_values = None
    if not frame.diagonal:
        start_z, start_values = isotropic_start(start_z, pool.squared_norms(frame.kernel))
    if final:
        round_tol = tol
    else:
        large = fam.n_params > EXACT_HESSIAN_MAX_PARAMS
        round_tol, hessian = max(tol, INTERMEDIATE_TOL), "natural" if large else hessian
    solver = VSSolver(
        fam,
        offsets,
        log_iw - shift,
        tol=round_tol,
        max_iter=max_iter,
        hessian=hessian,
        leverages=final,
    )
    sol = solver.solve(fam.theta_from_gaussian(start_z), start_values)
    if sol.gaussian is None:
        raise NonIntegrableFitError(_not_integrable(sol, pool.n_samples, fam.n_params, pool.dim))
    check_mean_within_fit(
        "variational-sampling",
        sol.gaussian.mean,
        sol.gaussian.cov,
        fam,
        flushed_exp(log_iw - shift),
        "Increase n_samples or use a kernel closer to the target (rounds > 1 adapts it) or wider.",
    )
    mean, cov, log_Z = frame.gaussian_from_frame(sol.gaussian, shift)
    try:
        return VSResult(
            mean,
            cov,
            log_Z,
            n_iter=sol.n_iter,
            converged=sol.converged,
            kl_error=sol.kl_error,
            decrement=sol.decrement,
            objective=sol.objective,
            ess=sol.ess,
            n_samples=pool.n_samples,
            family=family,
            rounds=None,
            stop_reason=None,
        )
    except NotPositiveDefiniteError:
        raise NonIntegrableFitError(
            "The variational-sampling covariance lost positive definiteness in the map back "
            "from kernel coordinates (extremely ill-conditioned kernel). Rescale the "
            "problem or use a better-conditioned kernel."
        ) from None


def _not_integrable(sol, n_samples: int, n_params: int, dim: int) -> str:
    """The message of a fit with no Gaussian: what its numbers say went wrong, and the fix."""
    counts = f"N={n_samples} points for n={n_params} parameters, ESS={sol.ess:.3g}"
    if sol.flat:
        return (
            f"The variational-sampling fit is not integrable: its precision along some "
            f"direction is at round-off of the kernel's ({counts}), so log_target is flat "
            f"(improper) along it, or far wider there than the kernel can resolve. Give "
            f"the target a proper prior on every parameter, or use a kernel as wide as "
            f"the target."
        )
    if sol.ess < dim + 1:
        # The mass seen sits on a few points: the kernel misses the target (too wide, too
        # narrow or misplaced), and more points of the same kernel rarely help.
        return (
            f"The variational-sampling fit is not integrable: its quadratic form is not "
            f"negative definite ({counts}, below d+1={dim + 1}: the target's mass sits "
            f"on a few points). Use a kernel closer to the target: centred at its mode "
            f"with its curvature there (vsbayes.laplace), or rounds > 1 to adapt it."
        )
    return (
        f"The variational-sampling fit is not integrable: its quadratic form is not "
        f"negative definite ({counts}). Increase n_samples or widen the kernel (a larger "
        f"kernel covariance, or kernel_scale > 1 with rounds > 1); if log_target does not "
        f"fall in every direction (an improper target), no Gaussian fits it: give every "
        f"parameter a proper prior."
    )


def _warn_about(sol: VSResult, dim: int, n_params: int, max_iter: int, family: str) -> None:
    """Warn when the final fit's own diagnostics say it may be inaccurate."""
    if not sol.converged:
        warn(
            f"Variational sampling did not converge in max_iter={max_iter} iterations "
            f"(optimization error {sol.decrement:.3g} vs predicted sampling error "
            f"{sol.kl_error:.3g}). Increase max_iter; if the fit stays poor, increase "
            f"n_samples or use a kernel closer to the target.",
            ConvergenceWarning,
        )
    if sol.ess < dim + 1:
        warn(
            f"The importance weights p/π of the {sol.n_samples} points have an effective "
            f"sample size of {sol.ess:.3g}, below d+1={dim + 1}: the target mass seen "
            f"by the sample sits on a few points, so the fit may be far off. Use a kernel "
            f"closer to the target (rounds > 1 adapts it) or wider, or more samples.",
            UnreliableFitWarning,
        )
    elif sol.n_samples < 2 * n_params:
        warn(
            f"Variational sampling with N={sol.n_samples} points for n={n_params} "
            f"parameters (fewer than 2n): the fit nearly interpolates the target at the "
            f"points, so it is exact for Gaussian targets but kl_error "
            f"({sol.kl_error:.3g}) does not measure its error otherwise. Use n_samples >= "
            f"{2 * n_params}.",
            UnreliableFitWarning,
        )
    elif math.isinf(sol.kl_error):
        # The fit's own weights q/π sit on fewer than n points: a kernel narrower than the
        # fit in its tails, or one that differs from it a little along each of many
        # directions (digits3, d = 65: the fit within 0.46-0.9 of its kernel's variances,
        # yet 1695 effective points of 17688 for n = 2211; D-224), and the points'
        # leverages, which correct the error there, cost more than their budget (D-237).
        # The in-sample correction then predicts nothing of the error, which is not
        # infinite (there ~1 nat, from the spread of fits over seeds).
        warn(
            f"The fitted Gaussian's weights q/π at the {sol.n_samples} points have an "
            f"effective sample size below its n={n_params} parameters, so its error is "
            f"unknown (kl_error=inf): the kernel is narrower than the fit where its mass "
            f"is, or differs from it along many of its {dim} dimensions. Use more samples, "
            f"or a kernel closer to the target (a wider one where the fit is wider).",
            UnknownErrorWarning,
        )
    elif sol.kl_error > UNRELIABLE_KL and sol.stop_reason != "target_kl":
        # (A fit that met a target_kl asked for is what was asked, whatever its level.)
        warn(unreliable_message(sol, family), UnreliableFitWarning)


def unreliable_message(sol: VSResult, family: str) -> str:
    """The warning of a fit whose predicted error is above :data:`UNRELIABLE_KL`: what
    was measured and what lowers it."""
    remedies = [
        f"more points (n_samples; the error falls like 1/N, so about "
        f"{math.ceil(sol.kl_error / UNRELIABLE_KL * sol.n_samples)} for {UNRELIABLE_KL:g} nats)"
    ]
    if family == "diagonal":
        remedies.insert(
            0,
            "family='gaussian' (a diagonal fit's adapted kernels ignore the target's "
            "correlations, which scatters the weights)",
        )
    remedies.append(
        "or an approximation that does not sample (expectation propagation, the Laplace "
        "approximation)"
    )
    return (
        f"Variational sampling's predicted error is {sol.kl_error:.3g} nats (excess KL, "
        f"N={sol.n_samples} points, effective sample size {sol.ess:.3g}), above "
        f"{UNRELIABLE_KL:g}: the fitted Gaussian may be far from the target (its mean off "
        f"by about sqrt(2·{sol.kl_error:.3g}) = {math.sqrt(2 * sol.kl_error):.2g} sd along "
        f"some direction). Use {', '.join(remedies)}."
    )


def variational_sampling(
    log_target: Callable,
    kernel: Gaussian,
    n_samples: int | None = None,
    *,
    family: str = "gaussian",
    rule="mc",
    rounds: int = 2,
    kernel_scale: float = 1.5,
    tol: float = 1e-2,
    max_iter: int = 100,
    target_kl: float | None = None,
    max_samples: int | None = None,
    time_budget: float | None = None,
    random_state=None,
    hessian: str = "auto",
) -> VSResult:
    """Fit an unnormalized Gaussian to ``exp(log_target)`` by variational sampling.

    Points are drawn through ``kernel`` (the window π, usually a Laplace approximation);
    the fit ``q = exp(θ·φ)`` minimizes the sampled generalized KL divergence
    ``Σ_k w_k [p̄ log(p̄/q̄) - p̄ + q̄]`` with ``p̄ = p/π``, ``q̄ = q/π`` (paper, eq. 5). The
    estimate is exact when the target is Gaussian (with at least n distinct points) and
    its error decreases like 1/N.

    Parameters
    ----------
    log_target : callable
        ``log_target(x)`` with ``x`` of shape (N, d) returns the N unnormalized
        log-densities (``-inf`` where the density is zero).
    kernel : Gaussian
        Sampling kernel π. Its ``log_Z`` is ignored.
    n_samples : int, optional
        Total number of target evaluations over all rounds, at least n, the number of
        family parameters. Default: 32 n.
    family : {"gaussian", "diagonal"}, default="gaussian"
        Full Gaussian fit (n = (d+1)(d+2)/2 parameters) or diagonal covariance (2d+1).
    rule : {"mc", "qmc"} or SamplingRule, default="mc"
        iid Monte Carlo or scrambled Sobol points mapped through the kernel.
    rounds : int, default=2
        Rounds of kernel adaptation; ``n_samples`` is split evenly between them, and only
        as many rounds run as get at least 2n points each (``result.rounds`` records
        them). Round r+1 draws from the fit of round r with its covariance multiplied by
        ``kernel_scale``; every fit pools all points drawn so far, weighted against the
        mixture of the round kernels. ``rounds=1`` is the paper's method. The default
        (2 rounds, scale 1.5) was chosen on the mixture benchmark
        (``benchmarks/kernel_adaptation.py``): at equal N it lowers the median excess KL
        to 0.70 of the single round's (geometric mean over d = 5, 30, δ = 1.5, 3 and
        N = 8n, 32n), for about 1.3× the time.
    kernel_scale : float, default=1.5
        Covariance inflation of the adapted kernels (rounds ≥ 2).
    tol : float, default=1e-2
        Stop when the optimization error (half the squared Newton decrement per unit mass,
        an excess KL) is below ``tol`` times the predicted sampling error ``kl_error``, or at
        float64 round-off for exactly Gaussian targets. At 1e-2 the solver adds about 1 %
        to the sampling error at most; the mixture benchmark finds no measurable change of
        the median error between 1e-2 and 1e-6.
    max_iter : int, default=100
        Maximum solver iterations per round; a :class:`~vsbayes.exceptions.ConvergenceWarning`
        is emitted when reached.
    target_kl : float, optional
        Ask for an accuracy instead of a sample size: after the ``n_samples`` points, add
        rounds (each drawn from the latest fit, ``kernel_scale`` times wider, and pooled
        with all earlier points) until the predicted error ``kl_error`` times its 90 %
        quantile factor ``1 + 1.28 √(2/n)`` (the excess KL of an n-parameter fit spreads
        like a χ² with n degrees of freedom) is at most ``target_kl`` nats, or
        ``max_samples`` or ``time_budget`` is reached. Each round adds the points that the
        ``1/N`` law of the error says are missing, plus 10 %, and at least half the pool,
        at most 7 times the pool (the law holds only while the added kernel sees the
        target as the pool's did); an added round that raises no effective sample size
        ``ess`` stops the rounds (``"stalled"``: further kernels drawn alike would not
        either), keeping the fit of the two with the smaller ``kl_error``.
        ``result.stop_reason`` says which limit ended it. Measured on the paper's eight
        cells, the median of ``kl_error`` over the measured error is 0.72–1.24 per cell
        and N from 8n to 256n, and asked for 0.01 nats the measured error met it in
        90–100 % of the seeds (``benchmarks/kl_error_calibration.py``).
    max_samples : int, optional
        Most points drawn in all with ``target_kl`` or ``time_budget``; default
        ``16 * n_samples``. Capped at the points that fit within the memory limit
        (:func:`vsbayes.config_context`).
    time_budget : float, optional
        Seconds: add rounds, as for ``target_kl``, only while the smallest one is predicted
        to end within the budget (from the last round's time per point drawn and per point
        fitted). With a random rule, an added round draws in chunks and stops where its
        fit's predicted end is nearest the budget. Without ``target_kl``, each added round
        doubles the points if a further round can follow it, and otherwise is the last and
        fills what is left of the budget. The points drawn then depend on the clock: the
        same ``random_state`` gives the same fit only where the rounds end at the same
        sizes.
    random_state : int, RandomState, Generator or None
        Controls the draws. With ``rounds=1`` and the same ``n_samples`` and ``rule``,
        :func:`importance_sampling` and :func:`bayesian_monte_carlo` (whose default is one
        round) evaluate the target at exactly the same points, for paired comparisons.
    hessian : {"auto", "switch"}, default="auto"
        The solver's steps: ``"auto"`` exact Newton steps (O(N n²) each) from the start
        where n ≤ 66 (the full family up to d = 10; immune to the ill-conditioning of
        near-interpolating samples), else matrix-free ones (O(N d²)), switching to exact
        steps where their rate says those would converge sooner; ``"switch"``: matrix-free
        from the start at any n. With many points per parameter (N ≥ 32n) the matrix-free
        steps converge in a few iterations: measured on iris's multinomial contrasts (d = 10,
        N = 96n), the whole fit took 0.52× the time with ``"switch"``, to the same optimum.

    Returns
    -------
    VSResult
        The fitted Gaussian with diagnostics ``n_iter``, ``converged``, ``kl_error``,
        ``decrement``, ``objective``, ``ess``, ``rounds``, ``stop_reason``.

    Raises
    ------
    MemoryLimitError
        Before any draw, if ``n_samples`` points would not fit within the memory limit.
    NonIntegrableFitError
        If the final fit has no finite integral (the remedy is in the message).
    DegenerateEstimateError
        If the importance-sampling mean of the final round's points is implausible under
        the fit (chi-square tail probability below 1e-9 in the fit's own metric): the fit
        extrapolates beyond the few points that carry the weight.

    Warns
    -----
    UnreliableFitWarning
        If the fit has fewer than 2n points, an effective sample size below d + 1, an
        unknown predicted error (:class:`~vsbayes.exceptions.UnknownErrorWarning`), or a
        predicted error ``kl_error`` above :data:`UNRELIABLE_KL` (0.25 nats) without
        meeting a ``target_kl`` asked for.
    ConvergenceWarning
        If the solver reached ``max_iter``.

    Examples
    --------
    >>> import numpy as np
    >>> import vsbayes
    >>> target = vsbayes.Gaussian(mean=[1.0, -1.0], cov=[[2.0, 0.3], [0.3, 0.5]], log_Z=3.0)
    >>> kernel = vsbayes.Gaussian(mean=[0.0, 0.0], cov=np.eye(2))
    >>> fit = vsbayes.variational_sampling(target.log_density, kernel, n_samples=100,
    ...                                    random_state=0)
    >>> bool(np.allclose(fit.mean, target.mean) and np.isclose(fit.log_Z, 3.0))
    True
    """
    kernel = check_kernel(kernel)
    n_params = n_family_params(kernel.dim, family)
    rounds = check_positive_int(rounds, "rounds")
    max_iter = check_positive_int(max_iter, "max_iter")
    if n_samples is None:
        n_samples = 32 * n_params
    n_samples = check_positive_int(n_samples, "n_samples")
    check_enough_samples(
        n_samples,
        n_params,
        kernel.dim,
        family,
        "the fit is not determined",
        "(16–64 n is typical)" + ("" if family == "diagonal" else " or family='diagonal'"),
    )
    # A round with fewer than 2n points nearly interpolates the target: a poor kernel for
    # the next round. Use only as many rounds as get 2n points each.
    rounds = max(1, min(rounds, n_samples // (2 * n_params)))
    kernel_scale = check_positive(kernel_scale, "kernel_scale")
    if hessian not in ("auto", "switch"):
        raise ValueError(f"hessian must be 'auto' or 'switch'; got {hessian!r}.")
    if not 0 <= tol < float("inf"):
        # An infinite tol would stop at the start (the kernel) and call it converged.
        raise ValueError(f"tol must be a finite non-negative number; got {tol!r}.")

    extend = extension_rule(n_samples, n_params, target_kl, max_samples, time_budget, kernel.dim)

    def estimate(pool, previous, final):
        return fit_vs_pool(
            pool,
            previous,
            family=family,
            tol=tol,
            max_iter=max_iter,
            final=final,
            hessian=hessian,
        )

    result = run_rounds(
        log_target,
        kernel,
        n_samples,
        rounds=rounds,
        kernel_scale=kernel_scale,
        rule=rule,
        random_state=random_state,
        estimate=estimate,
        extend=extend,
        name="variational sampling",
    )
    if extend is None:
        result = result.replace(stop_reason="n_samples")
    _warn_about(result, kernel.dim, n_params, max_iter, family)
    return result
