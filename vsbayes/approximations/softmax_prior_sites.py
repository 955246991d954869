"""The multinomial EP under a shrinkage prior: one 1-D site per coefficient of ``W``.

A shrinkage prior (:mod:`vsbayes.models.shrinkage_priors`; ``penalty="l1"`` or
``"elasticnet"``) is on each of the K·d coefficients ``θ_kj`` of the over-parameterized
``W`` (scikit-learn penalizes every class's coefficients). As in the binary EP
(:func:`~vsbayes.approximations.expectation_propagation.expectation_propagation`), the
model holds it as a Gaussian base ``N(0, base_var)`` times a ratio ``r(θ_kj)``, and EP
approximates each ratio by a Gaussian site ``exp(−τ_kj θ²/2 + ν_kj θ)`` fitted to the tilted
density ``r(t) × cavity`` by the factor's scale-mixture rule
(:meth:`~vsbayes.models.shrinkage_priors.CoefficientFactor.tilted_moments`, exact to
round-off). The base times the sites is a diagonal Gaussian prior on θ with a mean,
``N(ν/(1/base + τ), 1/(1/base + τ))``, which differs between the classes of a column: the
multinomial EP (:func:`~vsbayes.approximations.softmax_ep.softmax_ep`) takes it as a general
prior, running on the class contrasts B under their marginal prior and carrying the shift
directions through the prior's conditional ``s | B`` (docs/decisions.md, D-042). The shift
directions are then no longer the prior's alone: the prior sites see each class's
coefficient, so the likelihood's information on the contrasts reaches the shift through
them, and the posterior is not centred (its mode is scikit-learn's L1 solution, each
column's median over the classes at 0).

**The schedule.** The rows' sites and the prior's alternate: the multinomial EP of the rows
to its tolerance under the prior sites' Gaussian (warm from the rows' sites of the last
round), then one damped update of all the prior sites at the marginals of that posterior;
until the prior sites change by at most ``tol``. A fixed point is EP's on all the sites
together (every site matches its tilted moments under the same posterior). The rows' EP is
warm after the first round: a round costs a few of its sweeps.

**The evidence** is EP's at the fixed point: the rows' EP's under the Gaussian prior, times
the Gaussian base's integral against the prior sites, times the prior sites' normalizers
at their cavities.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from .._warnings import catch, reemit, warn
from ..exceptions import ConvergenceWarning, EstimationError
from ..models.latent import untouched_columns
from ..models.softmax import SoftmaxGLMPosterior
from .expectation_propagation import DEFAULT_DAMPING, EPResult, _normalizer_sum
from .shrinkage_mode import softmax_mode_prior_curvature, softmax_shrinkage_laplace
from .softmax_ep import softmax_ep

__all__ = ["softmax_ep_with_prior_sites", "under_prior_sites"]

#: The most rounds of prior-site updates (each a warm multinomial EP of the rows).
MAX_ROUNDS = 100
#: The rows' EP's tolerance in a round: this share of the prior sites' last change, within
#: [tol, _INNER_MAX_TOL].
_INNER_SHARE = 0.1
_INNER_MAX_TOL = 1e-2
#: A coefficient's data information below this share of its posterior precision is taken
#: as none (its cavity the base): the round-off of a precision's inverse in a dense
#: posterior of hundreds of coefficients is far above float64's 2e-16 (1e-12 measured).
_WEAK_INFORMATION = 1e-9


def softmax_ep_with_prior_sites(
    model,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-4,
    max_iter: int = 200,
    start: np.ndarray | None = None,
    verbose: int = 0,
    posterior_tol: float | None = None,
    posterior_share: float | None = None,
) -> EPResult:
    """EP of a multinomial posterior with a ``coefficient_prior`` (see the module docstring).

    Parameters
    ----------
    model : SoftmaxGLMPosterior
        With ``coefficient_prior`` set (a log-concave one: Laplace or elastic net).
    damping : float, default=0.85
        Fraction of the new prior sites taken at each round, and the rows' EP's damping.
    tol : float, default=1e-4
        The rows' EP's site tolerance, and the rounds' stop: no prior site parameter changes
        by more than ``tol · (1 + |value|)``.
    max_iter : int, default=200
        The rows' EP's sweeps per round; the rounds stop after :data:`MAX_ROUNDS` with a
        ConvergenceWarning.
    start : ndarray of shape (dim,), optional
        The posterior mode (default: :func:`softmax_shrinkage_laplace`'s). The prior sites
        start as the prior's expansion there (its curvature at the mode: the prior's own
        variance at a kink), the rows' as the likelihood's: the first posterior is the
        Laplace approximation.
    verbose : int, default=0
        One line per round when ≥ 1 (and the rows' EP's own lines).
    posterior_tol, posterior_share : float, optional
        The rows' EP's posterior stops (:func:`~vsbayes.approximations.softmax_ep.softmax_ep`).

    Returns
    -------
    EPResult
        In the model's layout of θ (not centred); ``prior_cavities`` the coefficient sites'
        cavities at the returned posterior, ``prior_sites`` their sites ``(τ, ν)`` (the
        posterior is the rows' EP under :func:`under_prior_sites` of them), ``n_iter`` the
        rows' sweeps over all rounds.

    Raises
    ------
    EstimationError
        As the rows' EP, or where a prior site's cavity is improper at the end.
    """
    factor = model.coefficient_prior
    if factor.l1 == 0:
        raise ValueError(
            f"The multinomial EP's prior sites need a log-concave prior (Laplace, elastic "
            f"net): a Gaussian prior on the coefficients at every round; {factor!r} is not."
        )
    n = model.n_classes * model.n_features
    if start is None:
        start = softmax_shrinkage_laplace(model).mean
    start = np.asarray(start, dtype=float)
    base_var = model.prior_var[:n]
    base_precision = 1.0 / base_var
    theta = start[:n]
    _, smooth_grad, _ = factor.smooth_part(theta)
    tau = softmax_mode_prior_curvature(model, start) - base_precision
    # The expansion of log r = log p + θ²/(2 base) at θ: ν = (log r)' + τ θ (as binary EP's).
    nu = (tau + base_precision) * theta + smooth_grad - factor.l1 * np.sign(theta)
    nu = np.where(theta == 0.0, 0.0, nu)
    # A column no weighted row touches: its coefficients' posterior is their prior,
    # independent of the rest; each site is set once, exact (the prior's moments as tilted
    # ones, normalizer 1), as binary EP's (D-134).
    uninformed = np.zeros(n, dtype=bool)
    if factor.divides_base:
        columns = untouched_columns(model.X, model.sample_weight)
        uninformed = np.tile(columns, model.n_classes)
    tau[uninformed] = 1.0 / factor.start_var - base_precision[uninformed]
    nu[uninformed] = 0.0
    # The rows' EP takes the base times the prior sites as a proper Gaussian prior whose
    # contrasts' covariance it factorizes: the sites' precisions are kept ≥ 0. Laplace's
    # ratio to its base is log-convex by at most 1/base (the base divided out: 10⁻⁸ of
    # the prior's own precision), where a site's precision could fall to −1/base: kept at
    # 0 instead, the base's variance stands, which moves no variance by more than its
    # ratio to the base's (≤ 10⁻⁶ at a coefficient sd of 10 prior scales). At the
    # mode's start a non-zero coefficient's curvature is 0 (τ = −1/base): there too.
    floor = 0.0
    options = {
        "damping": damping,
        "tol": tol,
        "max_iter": max_iter,
        "verbose": verbose,
        "posterior_tol": posterior_tol,
        "posterior_share": posterior_share,
    }
    sites, sweeps, change, converged = None, 0, math.inf, False
    earlier: list = []  # the earlier rounds' other warnings
    last: list = []  # the last round's
    try:
        for round_ in range(MAX_ROUNDS):
            tau = np.maximum(tau, floor)
            view = under_prior_sites(model, tau, nu)
            # The rows' EP to a tenth of the prior sites' last change (an inexact inner solve:
            # its sweeps to ``tol`` under prior sites still far from theirs are wasted), to
            # ``tol`` once they are within it.
            inner = dict(options, tol=min(max(tol, _INNER_SHARE * change), _INNER_MAX_TOL))
            # Each round's rows' EP may stop short of its (inexact) tolerance and say so:
            # the warnings kept are the last round's, whose posterior is returned, not one
            # per round (59 ConvergenceWarnings in one fit on 100 × 10, 3 classes).
            with catch(("always", ConvergenceWarning), record=True) as caught:
                if sites is None:
                    result = softmax_ep(view, start=start, **inner)
                else:
                    result = softmax_ep(view, start_sites=sites, **inner)
            earlier += [w for w in last if not issubclass(w.category, ConvergenceWarning)]
            last = caught
            sites, sweeps = result.sites, sweeps + result.n_iter
            mean, var = result.mean[:n], np.diag(result.cov)[:n]
            # (``exact``: the coefficients whose data are none, or below round-off.)
            cav_mean, cav_var, ok, exact = _cavities(
                mean, var, tau, nu, uninformed, base_var, factor.divides_base
            )
            log_z, t_mean, t_var, fitted = factor.tilted_moments(cav_mean, cav_var)
            log_z = np.where(exact, 0.0, log_z)
            t_mean = np.where(exact, 0.0, t_mean)
            t_var = np.where(exact, factor.start_var, t_var)
            ok &= fitted | exact
            if not ok.all():
                raise EstimationError(
                    f"Expectation propagation under the {factor!r} prior met {int((~ok).sum())} "
                    f"coefficient site(s) whose cavity was improper or whose tilted density had "
                    f"no finite moments: EP has no proper fixed point here."
                )
            cav_tau, cav_nu = 1.0 / cav_var, cav_mean / cav_var
            new_tau = np.where(uninformed, tau, 1.0 / t_var - cav_tau)
            new_nu = np.where(uninformed, nu, t_mean / t_var - cav_nu)
            new_nu = np.where(exact, 0.0, new_nu)
            change = float(
                max(
                    np.max(np.abs(new_tau - tau) / (1.0 + np.abs(tau))),
                    np.max(np.abs(new_nu - nu) / (1.0 + np.abs(nu))),
                )
            )
            if verbose:
                print(
                    f"[softmax EP, prior sites] round {round_ + 1}: prior site change {change:.3g}"
                )
            used = (tau, nu)  # the sites of this round's posterior and cavities
            if change <= tol and inner["tol"] <= tol:
                converged = result.converged
                break
            tau = tau + damping * (new_tau - tau)
            nu = nu + damping * (new_nu - nu)
        else:
            warn(
                f"The multinomial EP's prior sites under the {factor!r} prior did not converge "
                f"in {MAX_ROUNDS} rounds (site change {change:.3g}, tol={tol:g}); the last "
                f"round's posterior is returned.",
                ConvergenceWarning,
            )
    finally:
        reemit(earlier + last, once=True)
    # EP's evidence at the sites of the last round's posterior (their cavities, above).
    tau, nu = used
    v0 = 1.0 / (base_precision + tau)
    base_log_z = 0.5 * float(np.sum(np.log(v0 / base_var) + nu * nu * v0))
    log_evidence = (
        result.log_Z + base_log_z + _normalizer_sum(log_z, cav_mean, cav_var, tau, nu, np.ones(n))
    )
    out = EPResult(
        result.mean,
        result.cov,
        log_evidence,
        n_iter=sweeps,
        converged=converged,
        site_change=max(change, result.site_change),
    )
    return out.with_sites(sites, (cav_mean, cav_var), (tau, nu))


def under_prior_sites(
    model: SoftmaxGLMPosterior, tau: np.ndarray, nu: np.ndarray
) -> SoftmaxGLMPosterior:
    """The model with the prior sites ``(τ, ν)`` (an ``EPResult``'s ``prior_sites``) and
    the Gaussian base as its diagonal Gaussian prior on θ (a mean, variances that differ
    between classes), without the shrinkage prior: the rows' EP runs on it."""
    n = tau.size
    view = copy.copy(model)
    view.coefficient_prior = None
    view.prior_var = model.prior_var.copy()
    view.prior_mean = np.zeros(model.dim)
    precision = 1.0 / model.prior_var[:n] + tau
    view.prior_var[:n] = 1.0 / precision
    view.prior_mean[:n] = nu / precision
    return view


def _cavities(mean, var, tau, nu, uninformed, base_var, divides_base: bool):
    """``(mean, var, proper, exact)`` of each coefficient's marginal without its prior
    site. ``exact``: the cavity is the Gaussian base itself — an ``uninformed``
    coefficient's exactly, and, where the factor divides the base out, one whose data
    information (its cavity's precision less the base's) is below round-off of its
    posterior precision (:data:`_WEAK_INFORMATION`): the likelihood's other sites only add
    precision, so the cavity's is at least the base's, and round-off had put a nearly
    untouched column's (a digit's corner pixel, non-zero in 2 of 599 rows) below it, an
    improper ratio's cavity."""
    precision = 1.0 / var
    cav_tau = precision - tau
    exact = uninformed
    if divides_base:
        exact = exact | (cav_tau - 1.0 / base_var <= _WEAK_INFORMATION * precision)
    ok = cav_tau > 0
    cav_var = 1.0 / np.where(ok, cav_tau, 1.0)
    cav_mean = (mean * precision - nu) * cav_var
    cav_mean = np.where(exact, 0.0, cav_mean)
    cav_var = np.where(exact, base_var, cav_var)
    return cav_mean, cav_var, ok | exact, exact
