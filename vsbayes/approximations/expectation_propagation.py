"""Expectation propagation for binary GLMs, in weight space, with damped parallel updates.

Each likelihood factor ``F(t_i)^{s_i}``, ``t_i = a_iᵀθ`` with the signed design rows
``a_i = y_i [x_i, 1]``, is approximated by a Gaussian site ``exp(-τ_i t_i²/2 + ν_i t_i)``,
so the posterior approximation has precision ``Σ0⁻¹ + Aᵀ diag(τ) A`` and linear term
``Aᵀν``. A weight ``s_i ≥ 1`` is handled as ``s_i`` copies of ``F`` (power EP): the cavity
removes one copy, the tilted density is ``F(t) × cavity``, and the site is ``s_i`` times the
copy's update — exactly EP on duplicated rows for integer weights. A weight ``s_i < 1`` is
one factor ``F^{s_i}`` (its cavity removes the whole site; removing a fraction more than
the site would leave an improper cavity).

All sites are updated at once from the current posterior (one O(M p² + p³) pass, no loop
over observations) and damped; the iterations stop when no site parameter moves by more
than ``tol`` (relative), or by more than the round-off of its update
(:func:`site_round_off`: on many rows, where that is above ``tol``). The damped sweep is
a fixed-point map converging linearly, often slowly (contraction 0.6-0.8 per sweep on
standardized data sets: its Jacobian has both a slow positive mode and, undamped, an
oscillating one); Anderson acceleration (Walker & Ni 2011) mixes the last few sweeps to
cancel both, dividing the sweeps by 2-3 (the loop, shared with the multinomial EP:
:mod:`~vsbayes.approximations._damped_sweeps`). The log evidence is EP's estimate at the
fixed point.

A row whose latent value is 0 under every θ (all zeros, no intercept: an empty document)
has the constant factor ``F(0)^s`` and a latent variance of 0, which no cavity can divide
by: EP runs on the other rows, and :func:`with_constant_rows` gives such a row the site
zero and multiplies the evidence by its factor (the models' ``informative_rows()``).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np

from .._warnings import warn
from ..engine import DiagnosedGaussian
from ..engine.site_fits import FIT_RELATIVE_ERROR
from ..exceptions import EstimationError, NotPositiveDefiniteError, UnreliableFitWarning
from ..models import BinaryGLMPosterior
from ..models.latent import InformativeRows, untouched_columns
from ..models.work import DUAL_MIN_DIM, takes_dual_form
from ._damped_sweeps import ArraySites, damped_sweeps
from ._glm_gaussian import GLMGaussian, NegativeSitesGaussian, RowLatent
from ._threads import blas_policy
from .chunked_ep import ChunkedSites
from .newton_laplace import glm_laplace
from .shrinkage_mode import mode_prior_curvature

__all__ = [
    "DEFAULT_DAMPING",
    "EPResult",
    "EPSites",
    "assumed_density_row",
    "expectation_propagation",
    "with_constant_rows",
]


#: Default damping of the sweeps. With Anderson's mixing, 0.85 took 10-33 % fewer sweeps
#: than 0.5 to a relative change of 1e-10 on 15 binary posteriors (the paper's four data
#: sets and up to 300 × 500, both links), to the same fixed point (log Z within 1e-10);
#: harder problems stall and halve it (see the sweep loop).
DEFAULT_DAMPING = 0.85
#: NumPy's floating-point errors ignored in the site updates' arithmetic. A diverging EP
#: (a heavy-tailed prior under weights 1e-9 and 1e3: cavity means to ~1e160) overflows
#: the tilted moments' and the normalizers' squares: each such site keeps its parameters
#: (its moments are not finite), a sum of normalizers that is not finite leaves the
#: evidence undefined, and the sweeps' stall, the unfitted prior sites and the final
#: posterior's check report EP's failure in its own words. NumPy's RuntimeWarnings
#: (some twenty of them) only came before that report.
_DIVERGING = {"over": "ignore", "invalid": "ignore", "divide": "ignore"}


class EPResult(DiagnosedGaussian):
    """Expectation-propagation posterior and evidence estimate.

    Attributes
    ----------
    n_iter : int
        Parallel sweeps over the sites.
    converged : bool
        Whether the last sweep moved no site parameter by more than ``tol``, or by more
        than the round-off of its update (:func:`site_round_off`).
    site_change : float
        Largest relative change of a site parameter in the sweep that gave the sites (the
        last one, or unconverged the one that moved least).
    """

    n_iter: int
    converged: bool
    site_change: float

    #: The sites the posterior is made of (:class:`EPSites`), kept for leave-one-out: the
    #: posterior without a site is the cavity, the posterior without that row. None where
    #: the sites stayed in dask chunks. (Not annotated: it is no diagnostic of the repr.)
    sites = None

    #: Under a shrinkage prior, the coefficient sites' cavities ``(mean, var)`` at the
    #: returned posterior (each coefficient's marginal without its prior site): the
    #: tilted densities whose departure from Gaussian the estimators' strategy weighs.
    prior_cavities = None

    #: Under a shrinkage prior, the coefficient sites ``(τ, ν)`` of the returned posterior:
    #: with the Gaussian base, the Gaussian prior that the rows' sites were fitted under
    #: (leave-one-out's warm refits keep it). A heavy-tailed prior's binary sites may have
    #: precisions below minus the base's, so that this prior alone may be improper.
    prior_sites = None

    #: Under a shrinkage prior, whether the coefficient sites' precisions were kept ≥ 0 (a
    #: heavy-tailed prior's EP rerun where its signed sites left no proper posterior):
    #: leave-one-out's relaxations of those sites keep them so too.
    prior_nonnegative = False

    def with_sites(
        self, sites: EPSites, prior_cavities=None, prior_sites=None, prior_nonnegative=False
    ) -> EPResult:
        """This result, keeping ``sites``, ``prior_cavities``, ``prior_sites`` and
        ``prior_nonnegative`` (set once, by the EP that made it)."""
        object.__setattr__(self, "sites", sites)
        object.__setattr__(self, "prior_cavities", prior_cavities)
        object.__setattr__(self, "prior_sites", prior_sites)
        object.__setattr__(self, "prior_nonnegative", prior_nonnegative)
        return self


@dataclasses.dataclass(frozen=True)
class EPSites:
    """EP's Gaussian sites of the rows of positive weight, in the model's row order.

    ``precision`` and ``linear`` are each row's whole site (all its copies):
    ``exp(−uᵀ precision u / 2 + linearᵀ u)`` in the row's latent coordinate ``u``:
    binary (``space="signed"``), ``u = t_i = y_i (x_i·w + b)``, shapes (M,) and (M,);
    multinomial (``space="contrast"``), ``u = g_i = Qᵀ f_i`` with Q the orthonormal
    contrast basis (:func:`~vsbayes.models.softmax_predictive_rules.centred_basis`), shapes
    (M, K−1, K−1) and (M, K−1). A constant row's (all zeros, no intercept) site is zero
    (:func:`with_constant_rows`).
    """

    precision: np.ndarray
    linear: np.ndarray
    space: str


def with_constant_rows(result: EPResult, informative: InformativeRows) -> EPResult:
    """EP's ``result`` on the informative rows of a posterior, as EP on all its rows: the
    constant rows' sites are fixed at zero (an all-zero row's latent is 0 under every
    Gaussian, its factor ``F(0)^s`` a constant: no site is ever updated there, no cavity
    formed), and the evidence is multiplied by their factors."""
    sites = result.sites
    if sites is not None:
        constant = informative.constant

        def spread(values: np.ndarray) -> np.ndarray:
            out = np.zeros((constant.size, *values.shape[1:]))
            out[~constant] = values
            return out

        sites = EPSites(spread(sites.precision), spread(sites.linear), sites.space)
    # (A copy: a covariance still to be formed stays so, D-202.)
    moved = result.with_log_Z(result.log_Z + informative.log_likelihood)
    return moved.with_sites(
        sites, result.prior_cavities, result.prior_sites, result.prior_nonnegative
    )


def _posterior(model: BinaryGLMPosterior, tau, nu) -> GLMGaussian:
    """The Gaussian of the prior times the sites, with the marginals of the sites' t_i."""
    linear = np.asarray(model.design.T @ nu).ravel() + model.prior_mean / model.prior_var
    return GLMGaussian(model, tau, linear, what="EP posterior precision")


def _cavity(t_mean, t_var, tau, nu, copies):
    """Cavity precision and linear term of one copy of each factor, from the marginal
    mean and variance of each ``t_i`` under the posterior."""
    return 1.0 / t_var - tau / copies, t_mean / t_var - nu / copies


def site_round_off(t_mean, t_var, tau, nu, copies) -> np.ndarray:
    """The round-off of one undamped update of the sites ``(τ, ν)`` (:func:`new_sites`),
    from the posterior's marginals of the ``t_i``: ``[b_τ; b_ν]``, the largest change of
    each site parameter that is not resolved by the arithmetic. (0 for a site whose
    cavity is improper: it keeps its parameters.)

    A copy's site is ``1/v̂ − λ`` and ``m̂/v̂ − η``, the tilted moments ``(m̂, v̂)`` less the
    cavity's natural parameters ``(λ, η) = (1/v, m/v)``: on many rows, differences of
    numbers ~``λ`` (growing like the rows) far larger than the site itself. The tilted
    variance is known to the relative precision ``ρ = ε (1 + |m| √λ) + δ``: its latent
    values carry a rounding of ``ε |m|``, ``|m| √λ`` ulps of a cavity's standard
    deviation, which moves the log-density at a node ``u`` standard deviations out by
    ``|u|`` times that (ε, machine epsilon); ``δ`` the VS site fits' own relative error
    (Newton's stop, :data:`~vsbayes.engine.site_fits.FIT_RELATIVE_ERROR`). So
    ``b_τ = copies λ ρ`` and ``b_ν = copies (λ + |η|) ρ``: a change within them moves each
    latent marginal's precision and linear term by about ``ρ`` relative, round-off of the
    posterior itself. Measured at EP's fixed point on 10⁵, 3·10⁵ and 10⁶ rows × 20
    features (logistic, VS site fits), where the changes are all round-off: every site's
    change at most 0.41, 0.44 and 0.58 of its bound (D-193 in docs/decisions.md). Not
    covered: the probit closed form's own cancellation on wide cavities in the far tail
    (λ ≈ 1, m/√(1 + v) ≈ −10: up to 5 times the bound), where the bound is far below any
    tol (~1e-14) and the sweeps' other rules apply.
    """
    cav_tau, cav_nu = _cavity(t_mean, t_var, tau, nu, copies)
    proper = cav_tau > 0
    cav_tau = np.where(proper, cav_tau, 0.0)
    rho = np.finfo(float).eps * (1.0 + np.abs(cav_nu) / np.sqrt(np.where(proper, cav_tau, 1.0)))
    rho += FIT_RELATIVE_ERROR
    rho *= copies
    return np.concatenate([cav_tau * rho, (cav_tau + np.where(proper, np.abs(cav_nu), 0.0)) * rho])


def new_sites(link, t_mean, t_var, tau, nu, copies, power, site_fit, normalizers=True):
    """One undamped EP update of the sites ``(τ, ν)``, row by row, from the posterior's
    marginals ``t_mean``, ``t_var`` of the ``t_i`` (any block of rows: the update is
    local to each row); also ``Σ_i copies_i log Z̃_i`` of the sites ``(τ, ν)`` it started
    from (see :func:`site_log_normalizers`; NaN if a cavity is improper, or if not
    ``normalizers``: sweeps that need no evidence skip them)."""
    # A site whose cavity is not a proper Gaussian keeps its parameters this sweep.
    with np.errstate(**_DIVERGING):
        cav_tau, cav_nu = _cavity(t_mean, t_var, tau, nu, copies)
        ok = cav_tau > 0
        cav_var = 1.0 / np.where(ok, cav_tau, 1.0)
        cav_mean = cav_nu * cav_var
        log_z, m, v = link.tilted_moments(cav_mean, cav_var, power, method=site_fit)
        total = math.nan
        if normalizers and ok.all():
            total = _normalizer_sum(log_z, cav_mean, cav_var, tau, nu, copies)
    # So does a site whose tilted moments are not usable (a variance lost to round-off
    # on cavities of variance ~1e15; a diverging EP's, _DIVERGING).
    ok &= (v > 0) & np.isfinite(m) & np.isfinite(v)
    v = np.where(ok, v, 1.0)
    return (
        np.where(ok, copies * (1.0 / v - cav_tau), tau),
        np.where(ok, copies * (m / v - cav_nu), nu),
        total,
    )


@blas_policy
def expectation_propagation(
    model: BinaryGLMPosterior,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-8,
    max_iter: int = 200,
    start: np.ndarray | None = None,
    site_fit: str = "auto",
    memory: int = 5,
) -> EPResult:
    """Weight-space EP approximation of a binary GLM posterior.

    Parameters
    ----------
    model : BinaryGLMPosterior or ChunkedPosterior
        The posterior. With rows in dask chunks, the sites stay in the chunks and the
        sweeps are plainly damped (:mod:`~vsbayes.approximations.chunked_ep`).
    damping : float, default=0.85
        Fraction of the new site parameters taken at each sweep (1 = undamped); smaller
        values converge on harder problems (near-separable data), more slowly.
    tol : float, default=1e-8
        Stop when no site parameter changes by more than ``tol · (1 + |value|)``.
    max_iter : int, default=200
        Maximum sweeps; a ConvergenceWarning is emitted when reached, and the sites of the
        sweep that moved least are returned.
    start : ndarray of shape (p,), optional
        The posterior mode (default: found by :func:`glm_laplace`). The sites start as the
        second-order expansions of the factors there, so that the first posterior is the
        Laplace approximation and the first cavities are moderate. (From the prior, a
        vague prior gives cavities of variance ~C·|x|², on which parallel updates can
        oscillate without converging.)
    site_fit : {"auto", "closed", "vs", "quadrature"}, default="auto"
        How the moments of each tilted density ``F(t) × cavity`` are computed (the
        ``method`` of :meth:`~vsbayes.models.links.Link.tilted_moments`): ``"vs"`` fits the
        narrow ones by variational sampling on a Gauss–Hermite rule and integrates the
        others by one trapezoid rule on the link's scale, all sites at once
        (:func:`~vsbayes.models.tilted.vs_tilted_moments`); ``"closed"`` is the probit
        closed form; ``"quadrature"`` the adaptive trapezoid rule (the slow
        reference). ``"auto"``: closed form where there is one, else VS.

    Returns
    -------
    EPResult
        Its ``log_Z`` is EP's log evidence; after converged sweeps, that of the sites the
        last sweep started from, whose tilted normalizers the sweep computed: as EP's
        evidence is stationary at the fixed point, it differs from the returned sites' by
        about the square of their distance to it (measured on the paper's data: below
        1e-10 nats at ``tol=1e-10``, below 1e-2 nats at ``tol=1e-2``).

    Raises
    ------
    EstimationError
        If the sweeps stall short of ``tol`` at the smallest damping (1/64), or at a
        halved damping that took them no closer to a fixed point: EP has no fixed point
        within reach (e.g. sample or class weights spanning 1e-4 to 1e3),
        and the sites it holds are arbitrary. Reaching ``max_iter`` only warns.
    """
    if not 0 < damping <= 1:
        raise ValueError(f"damping must be in (0, 1]; got {damping!r}.")
    if model.rows_in_memory:  # (the chunks keep their constant rows apart themselves)
        informative = model.informative_rows()
        if informative.constant.any():
            options = {"damping": damping, "tol": tol, "max_iter": max_iter, "start": start}
            result = expectation_propagation(
                informative.model, site_fit=site_fit, memory=memory, **options
            )
            return with_constant_rows(result, informative)
    if start is None:
        start = glm_laplace(model).mean
    rows = _BinaryRows(site_fit)
    if getattr(model, "coefficient_prior", None) is not None:
        if not model.rows_in_memory:
            raise ValueError(
                "Expectation propagation with a shrinkage prior needs the rows in memory; "
                "pass X.compute() if the data fit in memory."
            )
        try:
            return _sweeps_with_prior_sites(model, rows, start, damping, tol, max_iter, memory)
        except EstimationError as error:
            if factor_is_log_concave(model.coefficient_prior):
                raise
            # A heavy-tailed prior's sites with negative precisions left EP without a
            # proper posterior: again with the prior sites' precisions kept ≥ 0. The
            # stalled sweeps' generic remedies (weights, C) do not apply here: the cause
            # and what to do are this message's own.
            stalled = str(error).split(" Typical cause:")[0]
            warn(
                f"Expectation propagation under the {model.coefficient_prior!r} prior failed "
                f"({stalled}); it was rerun with the prior sites' precisions kept "
                f"non-negative, which leaves coefficients in the prior's tails less shrunk "
                f"than the posterior's (biased). Under a prior that is not log-concave this "
                f"happens where correlated features compete for one effect: the posterior "
                f"then has a mode for each choice of the features that carry it, which no "
                f"Gaussian approximation represents closely. A global VS fit with the exact "
                f"prior corrects the bias where its sample can see the posterior's mass "
                f"(VSLogisticRegression's strategy_reason_ says whether it ran). To avoid "
                f"it, drop or combine the correlated features, or use a log-concave prior "
                f"(LaplacePrior, penalty='l1' or 'elasticnet').",
                UnreliableFitWarning,
            )
            # The rerun's bias is of the order of the coefficients' posterior sds: its
            # sites converged beyond √tol buy nothing (sites within δ of their fixed point
            # put the posterior about δ² in KL from it: measured 3e-9 nats between √tol =
            # 1e-5 and 1e-10 on breast cancer under the horseshoe, in 67 sweeps for 95).
            return _sweeps_with_prior_sites(
                model,
                rows,
                start,
                damping,
                max(tol, math.sqrt(tol)),
                max_iter,
                memory,
                nonnegative=True,
            )
    if model.rows_in_memory:
        return _sweeps_in_memory(model, rows, start, damping, tol, max_iter, memory)
    # Rows in dask chunks: the sites stay with them, plainly damped.
    store = ChunkedSites(model, rows, start)
    run = damped_sweeps(
        store, damping=damping, tol=tol, max_iter=max_iter, memory=0, as_gaussian=_moments
    )
    log_evidence = _log_evidence(model, run.posterior, *store.site_normalizers(run.posterior))
    return _result(run, log_evidence)


def assumed_density_row(
    prior_mean: np.ndarray,
    prior_cov: np.ndarray,
    prior_lower: np.ndarray,
    row: np.ndarray,
    weight: float,
    link,
    site_fit: str = "auto",
) -> EPResult:
    """EP of one row of weight ``s ≤ 1`` under a Gaussian prior: assumed-density filtering.

    With one site, the cavity is the prior itself, so EP's first undamped update is its
    fixed point: the Gaussian whose marginal of ``t = aᵀθ`` has the moments of the tilted
    density ``F(t)^s N(t; m, v)`` (one :meth:`~vsbayes.models.links.Link.tilted_moments`
    call), and θ's conditional given t the prior's (a rank-one update:
    :class:`~vsbayes.approximations._glm_gaussian.RowLatent`). The log evidence is the
    tilted normalizer, EP's evidence of one site. (A weight above 1 is power EP's
    ``s`` copies, whose cavity keeps part of the site: that needs the sweeps.)

    Parameters
    ----------
    prior_mean, prior_cov, prior_lower : ndarray of shapes (p,), (p, p), (p, p)
        The prior N(μ, Σ) and the Cholesky factor of Σ.
    row : ndarray of shape (p,)
        The signed row ``a = y [x, 1]``.
    weight : float
        Its weight, in (0, 1].
    link : Link
        The link F.
    site_fit : str, default="auto"
        As :func:`expectation_propagation`'s.

    Returns
    -------
    EPResult
        With the row's site (``sites``), one iteration, converged.

    Raises
    ------
    EstimationError
        If the tilted moments are not usable (a non-positive or non-finite variance).
    """
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"assumed_density_row takes a weight in (0, 1]; got {weight!r}.")
    latent = RowLatent.of(prior_mean, prior_lower, row)
    log_z, t_mean, t_var = link.tilted_moments(
        np.array([latent.mean]), np.array([latent.var]), weight, method=site_fit
    )
    log_z, t_mean, t_var = float(log_z[0]), float(t_mean[0]), float(t_var[0])
    if not (0.0 < t_var < math.inf and math.isfinite(t_mean) and math.isfinite(log_z)):
        raise EstimationError(
            f"The tilted density of the row has no usable moments (mean {t_mean:.3g}, "
            f"variance {t_var:.3g} at a prior latent variance {latent.var:.3g})."
        )
    mean, cov = latent.conditioned(prior_mean, prior_cov, t_mean, t_var)
    tau, nu = latent.site(t_mean, t_var)
    result = EPResult(mean, cov, log_z, n_iter=1, converged=True, site_change=0.0)
    return result.with_sites(EPSites(np.array([tau]), np.array([nu]), "signed"))


def _sweeps_in_memory(model, rows, start, damping, tol, max_iter, memory) -> EPResult:
    """The sweeps on the sites of the rows in memory, flattened as ``[τ; ν]``, mixed."""
    t = np.asarray(model.design @ np.asarray(start, dtype=float)).ravel()
    m = t.size
    last = {}  # the posterior the last sweep started from, and its sites' normalizers

    def update(post, sites):
        with np.errstate(**_DIVERGING):  # a diverging posterior's mean: its sites are kept
            t_mean, t_var = post.t_mean, post.t_var
        new, normalizers = rows.update(model.link, t_mean, t_var, sites, model.sample_weight)
        last.update(post=post, normalizers=normalizers)
        return new

    def project(sites, extrapolated):
        # Log-concave factors give τ ≥ 0 at every EP update: an extrapolation below is
        # projected back (the dual form of the posterior needs τ ≥ 0).
        np.maximum(sites[:m], 0.0, out=sites[:m])
        return sites

    store = ArraySites(
        rows.start(model.link, t, model.sample_weight),
        update,
        lambda sites: _posterior(model, sites[:m], sites[m:]),
        project,
        marginals=lambda post: (post.mean, post.var),
        round_off=lambda post, sites: rows.round_off(
            post.t_mean, post.t_var, sites, model.sample_weight
        ),
    )
    run = damped_sweeps(
        store, damping=damping, tol=tol, max_iter=max_iter, memory=memory, as_gaussian=_moments
    )
    sites = EPSites(store.sites[:m].copy(), store.sites[m:].copy(), "signed")
    if run.converged and math.isfinite(last["normalizers"]):
        # The evidence of the sites the last sweep started from, whose normalizers it has
        # computed: within tol of the returned ones, and EP's evidence is stationary at its
        # fixed point (Rasmussen & Williams 2006, §3.6), so it differs by O(tol²).
        log_evidence = last["normalizers"] + gaussian_log_evidence(model, last["post"])
    else:
        post = run.posterior
        normalizers = rows.normalizers(
            model.link, post.t_mean, post.t_var, store.sites, model.sample_weight
        )
        log_evidence = _log_evidence(model, post, *normalizers)
    return _result(run, log_evidence).with_sites(sites)


#: Halvings of a heavy-tailed prior's sites' step while the posterior precision of the new
#: sites is not positive definite (see ``_sweeps_with_prior_sites``).
_PROPER_HALVINGS = 8


def _proper_precision(model, tau, prior_tau) -> bool:
    """Whether ``diag(1/prior_var) + Aᵀ diag(τ) A`` plus the prior sites' precisions on the
    coefficients is positive definite (at once where their diagonal is positive)."""
    d = model.n_features
    diagonal = 1.0 / model.prior_var[:d] + prior_tau
    if np.all(diagonal > 0):
        return True
    if _negative_sites_dual(model, diagonal):
        try:
            _negative_sites_gaussian(model, tau, None, diagonal)
        except NotPositiveDefiniteError:
            return False
        return True
    precision = model.weighted_gram(tau)
    precision[np.diag_indices(model.dim)] += 1.0 / model.prior_var
    precision[np.diag_indices(d)] += prior_tau
    try:
        np.linalg.cholesky(precision)
    except np.linalg.LinAlgError:
        return False
    return True


def _negative_sites_dual(model, diagonal: np.ndarray) -> bool:
    """Whether the posterior of prior sites with some diagonal precisions ``diagonal ≤ 0``
    takes :class:`NegativeSitesGaussian` (the dual form with a rank-k correction): more
    coefficients than rows, as GLMGaussian's dual form, and k at most ``max(M, 256)`` (its
    p × k solves at most the dual form's own p × M)."""
    bound = max(model.n_observations, DUAL_MIN_DIM)
    return takes_dual_form(model.n_observations, model.dim) and (
        int(np.count_nonzero(diagonal <= 0)) <= bound
    )


def _negative_sites_gaussian(model, tau, linear, diagonal) -> NegativeSitesGaussian:
    """The posterior of the likelihood's sites ``tau`` and the prior's diagonal precisions
    ``diagonal`` on the coefficients (the intercept keeps its prior) by
    :class:`NegativeSitesGaussian`, the coefficients' Gaussian base as its floor."""
    d = model.n_features
    full = 1.0 / model.prior_var
    full[:d] = diagonal
    return NegativeSitesGaussian(
        model, tau, linear, full, 1.0 / model.prior_var, what="EP posterior precision"
    )


def factor_is_log_concave(factor) -> bool:
    """Whether a coefficient factor's prior is log-concave (Laplace, elastic net): its EP
    sites then have precisions ≥ -1/base, and the posterior stays proper."""
    return factor.l1 > 0


def _sweeps_with_prior_sites(
    model, rows, start, damping, tol, max_iter, memory, nonnegative=False
) -> EPResult:
    """The sweeps on the likelihood's sites and, for a shrinkage prior, one site per
    coefficient: the factor's ratio ``r(θ_j)`` (its Gaussian base stays in the prior) as a
    Gaussian site on ``t = θ_j``, its tilted density ``r(t) × cavity`` fitted by the
    factor's :meth:`~vsbayes.models.shrinkage_priors.CoefficientFactor.tilted_moments`.
    The sites are flattened as ``[τ; ν; τ_prior; ν_prior]``; the evidence adds the prior
    sites' normalizers to the likelihood's. The prior sites start from the mode: there the
    prior's curvature (``factor.mode_curvature``: the inverse of the prior's variance at a
    kink or spike) and its gradient, so that the first posterior is the Laplace one."""
    factor = model.coefficient_prior
    start = np.asarray(start, dtype=float)
    t = np.asarray(model.design @ start).ravel()
    m, d = t.size, model.n_features
    base_precision = 1.0 / model.prior_var[:d]
    theta = start[:d]
    _, smooth_grad, _ = factor.smooth_part(theta)
    prior_tau = mode_prior_curvature(model, start) - base_precision
    if nonnegative:
        prior_tau = np.maximum(prior_tau, 0.0)
    # The expansion of log r = log p + θ²/(2 base) at θ: ν = (log r)' + τ θ.
    prior_nu = (prior_tau + base_precision) * theta + smooth_grad - factor.l1 * np.sign(theta)
    prior_nu = np.where(theta == 0.0, 0.0, prior_nu)
    # A coefficient whose column no weighted row touches (a word absent from the training
    # documents) has its prior as posterior, independent of the rest: its cavity is the
    # Gaussian base itself, whose division out of the ratio leaves no precision (0 up to
    # round-off, which made such sites improper). Its site is set once, exact: the
    # prior's moments as tilted ones (0 and its variance, ``start_var``; where that is
    # infinite, the horseshoe's and Student-t's with ν ≤ 2, the stand-in variance of the
    # mode's kink or spike), the tilted normalizer 1 (the prior integrates to one). (The
    # elastic net's base is its own Gaussian part, not divided out: its cavities are proper.)
    uninformed = np.zeros(d, dtype=bool)
    if factor.divides_base:
        uninformed = untouched_columns(model.design, model.sample_weight)[: model.n_features]
    if uninformed.any():
        prior_tau[uninformed] = 1.0 / factor.start_var - base_precision[uninformed]
        prior_nu[uninformed] = 0.0
    last = {}
    unfitted = {"count": 0}

    def posterior(sites):
        tau, nu = sites[:m], sites[m : 2 * m]
        p_tau, p_nu = sites[2 * m : 2 * m + d], sites[2 * m + d :]
        linear = np.asarray(model.design.T @ nu).ravel()
        linear[:d] += p_nu
        diagonal = base_precision + p_tau
        if np.all(diagonal > 0):
            # The prior sites fold into a diagonal prior: every form of GLMGaussian holds.
            view = copy.copy(model)
            view.prior_var = model.prior_var.copy()
            view.prior_var[:d] = 1.0 / diagonal
            return GLMGaussian(view, tau, linear, what="EP posterior precision")
        # Heavy-tailed priors' sites may have precisions below -1/base: with more
        # coefficients than rows a rank-k correction of the dual form, else the full matrix.
        if _negative_sites_dual(model, diagonal):
            return _negative_sites_gaussian(model, tau, linear, diagonal)
        precision = model.weighted_gram(tau)
        precision[np.diag_indices(model.dim)] += 1.0 / model.prior_var
        precision[np.diag_indices(d)] += p_tau
        return GLMGaussian(model, linear=linear, precision=precision, what="EP posterior precision")

    def prior_update(post, p_tau, p_nu):
        # (A diverging EP's cavities: _DIVERGING; such sites are not ``fitted``.)
        with np.errstate(**_DIVERGING):
            mean, var = post.mean[:d], post.var[:d]
            cav_tau, cav_nu = 1.0 / var - p_tau, mean / var - p_nu
            ok = cav_tau > 0
            cav_var = 1.0 / np.where(ok, cav_tau, 1.0)
            cav_mean = cav_nu * cav_var
            if uninformed.any():
                cav_mean, cav_var, ok = _base_cavities(cav_mean, cav_var, ok, uninformed, model)
            log_z, t_mean, t_var, fitted = factor.tilted_moments(cav_mean, cav_var, mean, var)
            if uninformed.any():
                log_z, t_mean = np.where(uninformed, 0.0, log_z), np.where(uninformed, 0.0, t_mean)
                t_var = np.where(uninformed, factor.start_var, t_var)
                fitted = fitted | uninformed
            normalizers = math.nan
            if ok.all() and fitted.all():
                normalizers = _normalizer_sum(log_z, cav_mean, cav_var, p_tau, p_nu, np.ones(d))
        ok &= fitted
        unfitted["count"] = int((~ok).sum())
        t_var = np.where(ok, t_var, 1.0)
        # A heavy-tailed prior's tilted density can be wider than its cavity (a negative
        # site precision); with ``nonnegative`` it is kept at 0 instead, so that the prior
        # sites never take precision from the likelihood's (which made the posterior
        # precision indefinite on collinear data: breast cancer, Student-t and horseshoe).
        new_tau = 1.0 / t_var - cav_tau
        if nonnegative:
            new_tau = np.maximum(new_tau, 0.0)
        new_tau = np.where(ok, new_tau, p_tau)
        new_nu = np.where(ok, t_mean / t_var - cav_nu, p_nu)
        return new_tau, new_nu, normalizers

    def update(post, sites):
        with np.errstate(**_DIVERGING):  # a diverging posterior's mean: its sites are kept
            t_mean, t_var = post.t_mean, post.t_var
        new, normalizers = rows.update(
            model.link, t_mean, t_var, sites[: 2 * m], model.sample_weight
        )
        old_tau, old_nu = sites[2 * m : 2 * m + d], sites[2 * m + d :]
        p_tau, p_nu, prior_normalizers = prior_update(post, old_tau, old_nu)
        if not factor_is_log_concave(factor):
            step = 1.0
            # A heavy-tailed prior's sites may have negative precisions: their step is
            # halved while the new sites' posterior would not be proper (on correlated
            # coefficients, breast cancer's, the first sweep's was not). The sweep's damped
            # combination of two proper posteriors' precisions is then proper too; the
            # fixed points are the same.
            for _ in range(_PROPER_HALVINGS):
                if _proper_precision(model, new[:m], old_tau + step * (p_tau - old_tau)):
                    break
                step *= 0.5
            p_tau = old_tau + step * (p_tau - old_tau)
            p_nu = old_nu + step * (p_nu - old_nu)
        last.update(post=post, normalizers=normalizers + prior_normalizers)
        return np.concatenate([new, p_tau, p_nu])

    def project(sites, extrapolated):
        # τ ≥ 0: the likelihood's factors are log-concave (the prior's with ``nonnegative``).
        np.maximum(sites[:m], 0.0, out=sites[:m])
        if nonnegative:
            np.maximum(sites[2 * m : 2 * m + d], 0.0, out=sites[2 * m : 2 * m + d])
        return sites

    store = ArraySites(
        np.concatenate([rows.start(model.link, t, model.sample_weight), prior_tau, prior_nu]),
        update,
        posterior,
        project,
        marginals=lambda post: (post.mean, post.var),
    )
    run = damped_sweeps(store, damping=damping, tol=tol, max_iter=max_iter, memory=memory)
    if unfitted["count"]:
        # Such sites were kept as they were: the sweeps' end is no fixed point of theirs,
        # and EP has no evidence (a heavy-tailed prior: a site's cavity made improper by
        # other sites' negative precisions).
        raise EstimationError(
            f"Expectation propagation under the {factor!r} prior ended with "
            f"{unfitted['count']} coefficient site(s) whose cavity was improper or whose "
            f"tilted density had no finite moments: EP has no proper fixed point here."
        )
    sites = EPSites(store.sites[:m].copy(), store.sites[m : 2 * m].copy(), "signed")
    if run.converged and math.isfinite(last["normalizers"]):
        log_evidence = last["normalizers"] + gaussian_log_evidence(model, last["post"])
    else:
        post = run.posterior
        normalizers, improper = rows.normalizers(
            model.link, post.t_mean, post.t_var, store.sites[: 2 * m], model.sample_weight
        )
        _, _, prior_normalizers = prior_update(
            post, store.sites[2 * m : 2 * m + d], store.sites[2 * m + d :]
        )
        check_cavities(improper)
        log_evidence = normalizers + prior_normalizers + gaussian_log_evidence(model, post)
    post = run.posterior
    mean, var = post.mean[:d], post.var[:d]
    cav_tau = 1.0 / var - store.sites[2 * m : 2 * m + d]
    cav_var = 1.0 / np.where(cav_tau > 0, cav_tau, np.nan)  # NaN: an improper cavity
    cav_mean = (mean / var - store.sites[2 * m + d :]) * cav_var
    if uninformed.any():
        cav_mean, cav_var, _ = _base_cavities(cav_mean, cav_var, cav_tau > 0, uninformed, model)
    prior_sites = (store.sites[2 * m : 2 * m + d].copy(), store.sites[2 * m + d :].copy())
    return _result(run, log_evidence).with_sites(
        sites, (cav_mean, cav_var), prior_sites, nonnegative
    )


def _base_cavities(cav_mean, cav_var, ok, uninformed, model):
    """The cavities with those of the ``uninformed`` coefficients set to what they are
    exactly, the prior's Gaussian base N(0, base variance), and marked proper."""
    base_var = model.prior_var[: model.n_features]
    return (
        np.where(uninformed, 0.0, cav_mean),
        np.where(uninformed, base_var, cav_var),
        ok | uninformed,
    )


class _BinaryRows:
    """EP's row-wise math on the sites ``[τ; ν]`` of a block of binary GLM rows, the same
    for the rows in memory and for each chunk's (a
    :class:`~vsbayes.approximations.chunked_ep.RowSites`; picklable, it travels to the
    workers)."""

    def __init__(self, site_fit: str):
        self.site_fit = site_fit

    def start(self, link, t, weights) -> np.ndarray:
        """The second-order expansions of the factors at ``t``."""
        slope, curvature = link.derivatives(t)
        return np.concatenate([weights * curvature, weights * (slope + curvature * t)])

    def update(
        self, link, t_mean, t_var, sites, weights, normalizers=True
    ) -> tuple[np.ndarray, float]:
        """:func:`new_sites`, flattened."""
        m = weights.size
        copies, power = _split_weights(weights)
        new_tau, new_nu, normalizers = new_sites(
            link, t_mean, t_var, sites[:m], sites[m:], copies, power, self.site_fit, normalizers
        )
        return np.concatenate([new_tau, new_nu]), normalizers

    def round_off(self, t_mean, t_var, sites, weights) -> np.ndarray:
        """:func:`site_round_off`, flattened as the sites."""
        m = weights.size
        return site_round_off(t_mean, t_var, sites[:m], sites[m:], _split_weights(weights)[0])

    def normalizers(self, link, t_mean, t_var, sites, weights) -> tuple[float, int]:
        """:func:`site_log_normalizers`."""
        m = weights.size
        return site_log_normalizers(
            link, t_mean, t_var, sites[:m], sites[m:], weights, self.site_fit
        )


def _moments(post: GLMGaussian) -> tuple[np.ndarray, np.ndarray]:
    """The mean and covariance of a posterior of the sites (for an observer of the fit)."""
    return post.mean, post.cov


def _result(run, log_evidence: float) -> EPResult:
    post = run.posterior
    with np.errstate(**_DIVERGING):  # (what this check is for)
        finite = np.isfinite(post.mean).all()
    if not (math.isfinite(log_evidence) and finite):
        # A vague prior (C = 1e300) on unscaled features: the sites' Gaussian overflows. An
        # EstimationError, so that the estimators fall back or choose another route.
        raise EstimationError(
            f"Expectation propagation gave a non-finite posterior (log evidence "
            f"{log_evidence:.3g}): the prior is too vague for the scale of the features. "
            f"Standardize the features (StandardScaler) or use a smaller C."
        )
    return EPResult(
        post.mean,
        post.cov,
        log_evidence,
        n_iter=run.n_iter,
        converged=run.converged,
        site_change=run.change,
    )


def _log_evidence(model, post: GLMGaussian, normalizers: float, improper: int) -> float:
    """EP's log evidence: the sites' normalizers (``improper``: the number of improper
    cavities, which leave it undefined) and the Gaussian integral of prior × sites."""
    check_cavities(improper)
    return normalizers + gaussian_log_evidence(model, post)


def site_log_normalizers(link, t_mean, t_var, tau, nu, weights, site_fit) -> tuple[float, int]:
    """``Σ_i copies_i log Z̃_i`` over a block of rows, and its number of improper cavities
    (the sum is then meaningless).

    A copy's site ``exp(-τ t²/2 + ν t)`` with normalizer ``Z_i / ∫ site × cavity`` and
    ``∫ exp(-τ t²/2 + ν t) N(t; m, v) dt = (1 + τ v)^(-1/2)
    exp((ν² v + 2 ν m - τ m²) / (2 (1 + τ v)))``.
    """
    copies, power = _split_weights(weights)
    with np.errstate(**_DIVERGING):  # (a sum that is not finite: the caller's check)
        cav_tau, cav_nu = _cavity(t_mean, t_var, tau, nu, copies)
        ok = cav_tau > 0
        if not ok.all():
            return math.nan, int((~ok).sum())
        cav_var = 1.0 / cav_tau
        cav_mean = cav_nu * cav_var
        log_z, _, _ = link.tilted_moments(cav_mean, cav_var, power, method=site_fit)
        return _normalizer_sum(log_z, cav_mean, cav_var, tau, nu, copies), 0


def _normalizer_sum(log_z, cav_mean, cav_var, tau, nu, copies) -> float:
    """``Σ_i copies_i log Z̃_i`` from the tilted normalizers ``log_z`` at the cavities."""
    copy_tau, copy_nu = tau / copies, nu / copies
    denom = 1.0 + copy_tau * cav_var
    site_log_norm = (
        log_z
        + 0.5 * np.log(denom)
        - (copy_nu**2 * cav_var + 2.0 * copy_nu * cav_mean - copy_tau * cav_mean**2) / (2.0 * denom)
    )
    return float(copies @ site_log_norm)


def check_cavities(improper: int) -> None:
    """Raise EstimationError if some final cavities are improper (no evidence then)."""
    if improper:
        raise EstimationError(
            f"{improper} of the final expectation-propagation cavities are improper "
            f"(EP stopped short of a fixed point, or round-off in an ill-conditioned "
            f"posterior), so EP has no evidence estimate. Increase max_iter or lower damping; "
            f"standardize the features if their scales differ widely."
        )


def gaussian_log_evidence(model, post: GLMGaussian) -> float:
    """The log integral of the prior times the Gaussian sites (EP's evidence without the
    sites' normalizers): ``post.linear`` holds the prior's ``Λ₀μ₀``, whose constant
    ``μ₀ᵀΛ₀μ₀ / 2`` is subtracted."""
    prior_mean = model.prior_mean
    return (
        0.5 * float(post.linear @ post.mean)
        - post.half_log_det
        - 0.5 * float(np.log(model.prior_var).sum())
        - 0.5 * float(prior_mean @ (prior_mean / model.prior_var))
    )


def _split_weights(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights as (number of copies, power of F): (s, 1) for s ≥ 1, (1, s) below."""
    return np.maximum(weights, 1.0), np.minimum(weights, 1.0)
