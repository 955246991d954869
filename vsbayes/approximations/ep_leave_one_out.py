"""Expectation propagation refitted without one row, warm from the full fit's sites.

Leave-one-out needs, for a row i, the posterior of the data without it. EP's cavity — the
posterior with row i's site removed and every other site as it was — is the first guess;
an influential row also moved the other sites, and EP refitted without the row moves them
back. That refit need not start cold (a Laplace approximation, then 15-40 sweeps): its
fixed point is near the full fit's, so it starts from the full fit's sites with row i's
removed (the cavity), and only the sweeps that relax the other sites remain. It is the same
EP — the same site update (:class:`~vsbayes.approximations.expectation_propagation`'s
``_BinaryRows``), the same sweep loop (:func:`~vsbayes.approximations._damped_sweeps.
damped_sweeps`) — so it reaches the cold refit's fixed point, within ``tol``.

**Batched.** The refits of R rows are one fixed-point problem on R × M sites: each refit's
posterior precision ``Λ₀ + Aᵀ diag(τ_r) A`` is a slice of one (R, p, p) stack (batched
GEMMs and Cholesky factorizations), the site updates are one call over the R × M sites,
and Anderson's mixing runs on the stacked sites (the refits' Jacobians are alike: one
mixing serves all). The refits are done in blocks whose (R, p, M) temporaries fit the
memory of one block. The multinomial refits alike: R posteriors of the contrasts
(``D + Σ_j Λ_rj ⊗ x̃_j x̃_jᵀ``, one GEMM of the sites with the rows' outer products), and
the multinomial EP's own site update (its tilted moments, on the rules it takes for the
rows) over the R × M rows, in chunks whose quadrature stays in cache.

**Cheap site updates.** R refits update R × M sites a sweep, R times the fit's; with VS
site fits those took 70 % of the refits' time. The logistic's tilted moments come instead
in closed form from its mixture of nine probits (``site_fit="fast"``:
:func:`~vsbayes.models.tilted.mixture_tilted_moments`), within 3e-7 of the fit's and about
40 times cheaper — far inside the refits' tolerance, so the same fixed point.

**What it keeps.** The model's prior and weights as they are: with ``penalty=None`` (the
flat prior, scaled by the data's curvature) or ``class_weight="balanced"``, a cold refit
without the row would rescale them by a factor 1 ± 1/M; the warm refit leaves them, as a
leave-one-out posterior should (the prior is not data). Under a shrinkage prior EP's
coefficient sites are part of the prior the rows' sites were fitted under: the refits run
under the Gaussian base times those sites as the full fit left them (multinomial:
:func:`~vsbayes.approximations.softmax_prior_sites.under_prior_sites`; binary:
:func:`refit_without_rows`' ``prior_sites``), the approximation EP's leave-one-out makes
of the other sites (docs/decisions.md, D-156, D-158). Under a prior that is not
log-concave (Student-t, horseshoe) the binary refits relax them too (``relax_prior_sites``:
rounds of the rows' sweeps, then the coefficient sites'), and so do the cavities of the
rows of middling influence (:func:`relax_prior_sites_without_rows`): held, under the
horseshoe, they kept a left-out row's pull (D-184, D-194).
A heavy-tailed prior's binary sites may have negative precisions, so that this prior may
be improper on its own: each refit's posterior precision is then proper only if its
Cholesky factorization succeeds, which every sweep's checks (a refit that leaves the
positive-definite cone raises :class:`~vsbayes.exceptions.NotPositiveDefiniteError`).

Measured (``benchmarks/posterior_checks.py``): see D-060 in ``docs/decisions.md``.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
from scipy.linalg.lapack import dtrtri

from .._memory import block_length, check_memory
from ..exceptions import NotPositiveDefiniteError
from ..models.latent import untouched_columns
from ..models.softmax_predictive_rules import centred_basis
from ..sampling import SymmetricSobol
from ._damped_sweeps import ArraySites, damped_sweeps
from ._softmax_cavities import _cavity, _psd
from ._softmax_site_fits import _rules
from ._softmax_tilted_moments import _spread_levels
from ._threads import blas_policy
from .expectation_propagation import (
    _PROPER_HALVINGS,
    DEFAULT_DAMPING,
    EPSites,
    _BinaryRows,
    _split_weights,
    factor_is_log_concave,
)
from .softmax_ep import _Contrast
from .softmax_sites import MAX_FITTED_CLASSES, _OneRow, _RowState, _sites, _wide_rows

__all__ = [
    "LeftOutMarginals",
    "refit_softmax_without_rows",
    "refit_without_rows",
    "relax_prior_sites_without_rows",
]


class LeftOutMarginals(NamedTuple):
    """The latent marginal of each left-out row under EP refitted without it.

    Attributes
    ----------
    mean, var : ndarray of shape (R,)
        Mean and variance of the row's signed latent value ``t_i = y_i (x_i·w + b)``
        (binary); multinomial, of its K latent values ``f_i = W x_i + b``: shapes (R, K)
        and (R, K, K).
    n_iter : ndarray of shape (R,)
        The sweeps of the block of refits the row was in.
    """

    mean: np.ndarray
    var: np.ndarray
    n_iter: np.ndarray


def _inverse_factors(precision: np.ndarray) -> np.ndarray:
    """L⁻¹ of each stacked precision's Cholesky factor L (lower triangular), so that its
    covariance is L⁻ᵀL⁻¹. LAPACK's triangular inverse per refit: numpy's batched ``inv``
    is a general LU inverse, 4 × slower on 35 × 35."""
    try:
        lower = np.linalg.cholesky(precision)
    except np.linalg.LinAlgError as error:
        raise NotPositiveDefiniteError(
            "A leave-one-out refit's EP posterior precision is not positive definite."
        ) from error
    inverse = np.empty_like(lower)
    for k, factor in enumerate(lower):
        inverse[k] = dtrtri(factor, lower=1)[0]
    return inverse


class _StackedRefits:
    """R refits' moments, stacked along the first axis of each of ``FIELDS``."""

    FIELDS: tuple[str, ...] = ()

    def replace(self, which: np.ndarray, other: _StackedRefits) -> _StackedRefits:
        """These refits with those of ``which`` taken from ``other`` (a new object)."""
        out = copy.copy(self)
        for name in self.FIELDS:
            values = getattr(self, name).copy()
            values[which] = getattr(other, name)
            setattr(out, name, values)
        return out


class _BinaryPrior(NamedTuple):
    """The binary refits' Gaussian prior of θ, diagonal: its precisions and linear term
    (p,). Under a shrinkage prior, the Gaussian base times the fit's coefficient sites,
    whose precisions may be ≤ 0 (a heavy-tailed prior's): improper on its own."""

    precision: np.ndarray
    linear: np.ndarray

    @classmethod
    def of(cls, model, prior_sites) -> _BinaryPrior:
        """The model's Gaussian prior, times the coefficient sites ``prior_sites`` ``(τ,
        ν)`` (of the first ``n_features`` entries of θ) where given."""
        precision = 1.0 / model.prior_var
        linear = model.prior_mean / model.prior_var
        if prior_sites is not None:
            tau, nu = (np.asarray(values, dtype=float) for values in prior_sites)
            d = model.n_features
            if tau.shape != (d,) or nu.shape != (d,):
                raise ValueError(
                    f"prior_sites has sites of shapes {tau.shape} and {nu.shape}; the model "
                    f"has {d} coefficients."
                )
            precision[:d] += tau
            linear[:d] += nu
        return cls(precision, linear)

    @classmethod
    def stacked(cls, model, tau: np.ndarray, nu: np.ndarray) -> _BinaryPrior:
        """The model's Gaussian prior times each of R refits' own coefficient sites
        ``(τ, ν)`` (R, n_features): precisions and linear terms (R, p)."""
        d = model.n_features
        precision = np.tile(1.0 / model.prior_var, (len(tau), 1))
        linear = np.tile(model.prior_mean / model.prior_var, (len(tau), 1))
        precision[:, :d] += tau
        linear[:, :d] += nu
        return cls(precision, linear)

    def of_refits(self, which: np.ndarray) -> _BinaryPrior:
        """This prior for the refits ``which`` (the same for all where it is not stacked)."""
        if self.precision.ndim == 1:
            return self
        return _BinaryPrior(self.precision[which], self.linear[which])


class _Refits(_StackedRefits):
    """The Gaussians of prior × sites of R refits at once: each refit's coefficient means
    and variances (R, p), and every row's latent mean and variance under each (R, M)."""

    FIELDS = ("mean", "t_var", "t_mean", "var")

    def __init__(self, design, columns, outer, prior: _BinaryPrior, tau, nu):
        # ``columns``: the design's transpose, contiguous (a stacked product with the
        # transposed view took 200 × longer: numpy's own loop instead of BLAS's).
        # ``outer``: each row's a_j a_jᵀ flattened (M, p²), or None: then every precision
        # Σ_j τ_rj a_j a_jᵀ is one GEMM (R, M) × (M, p²) instead of R products (R, p, M) ×
        # (M, p) — 1.5-1.8 × faster on ionosphere's 44 refits.
        p = design.shape[1]
        if outer is not None:
            precision = (tau @ outer).reshape(-1, p, p)
        else:
            precision = np.matmul(columns[None] * tau[:, None, :], design)  # (R, p, p)
        diagonal = np.arange(p)
        precision[:, diagonal, diagonal] += prior.precision
        linear = nu @ design + prior.linear
        # L⁻¹: one GEMM gives every row's spread L⁻¹ a_j, whose squared norm is the row's
        # latent variance.
        inverse = _inverse_factors(precision)
        self.mean = np.einsum("rba,rb->ra", inverse, np.einsum("rab,rb->ra", inverse, linear))
        spread = inverse @ columns  # (R, p, M)
        self.t_var = np.einsum("rpm,rpm->rm", spread, spread)
        self.t_mean = self.mean @ columns
        self.var = np.einsum("rab,rab->rb", inverse, inverse)


@blas_policy
def refit_without_rows(
    model,
    sites: EPSites,
    rows,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-6,
    max_iter: int = 200,
    site_fit: str = "fast",
    memory: int = 5,
    prior_sites: tuple[np.ndarray, np.ndarray] | None = None,
    relax_prior_sites: bool = False,
    prior_nonnegative: bool = False,
) -> LeftOutMarginals:
    """EP of a binary GLM posterior refitted without each of ``rows``, warm-started.

    Parameters
    ----------
    model : BinaryGLMPosterior
        The posterior the full EP fitted (rows in memory; a Gaussian prior, or a shrinkage
        prior whose EP's coefficient sites are ``prior_sites``).
    sites : EPSites
        The full fit's sites (``EPResult.sites``), of the model's rows.
    rows : array-like of int
        The rows (of the model: those of positive weight) to leave out, one refit each.
    damping, tol, max_iter, memory
        As :func:`~vsbayes.approximations.expectation_propagation.expectation_propagation`.
    site_fit : str, default="fast"
        The tilted moments (``Link.tilted_moments``' ``method``): by default the
        logistic's from its mixture of probits, within 3e-7 of the fit's VS site fits
        (far inside the refits' tolerance) and about 40 times cheaper — the site updates
        of R refits are R times the fit's.
    prior_sites : tuple of ndarray of shape (n_features,), optional
        Under a shrinkage prior (the model's ``coefficient_prior``), the full fit's
        coefficient sites ``(τ, ν)`` (``EPResult.prior_sites``): the refits run under the
        Gaussian base times them, held fixed (not relaxed without the row, as the cavity
        holds every other site). Their precisions may be negative (Student-t, horseshoe):
        the refits' posteriors are then checked proper at every sweep.
    relax_prior_sites : bool, default=False
        With ``prior_sites``: relax them too, alternating with the rows' sweeps (each
        round the rows' sites under the coefficient sites as they are, then the
        coefficient sites under the rows' as they are, :class:`_PriorSiteRelaxation`),
        so that the refits reach EP without the row, prior sites and all.
    prior_nonnegative : bool, default=False
        Whether the fit kept its coefficient sites' precisions ≥ 0
        (``EPResult.prior_nonnegative``): the relaxed refits keep them so too.

    Returns
    -------
    LeftOutMarginals
        Each left-out row's latent mean and variance under its refit.

    Raises
    ------
    NotPositiveDefiniteError
        If a refit's posterior precision is not positive definite (under prior sites of
        negative precision, the cavity or a sweep without the row can leave the cone).
    """
    rows = np.asarray(rows, dtype=np.intp).ravel()
    if (getattr(model, "coefficient_prior", None) is None) != (prior_sites is None):
        raise ValueError(
            "Warm leave-one-out refits under a shrinkage prior need its EP's coefficient "
            "sites (prior_sites: EPResult.prior_sites); under a Gaussian prior, none."
        )
    design = model.design
    m, p = design.shape
    if len(sites.precision) != m:
        raise ValueError(f"sites has {len(sites.precision)} rows; the model has {m}.")
    options = {"damping": damping, "tol": tol, "max_iter": max_iter, "memory": memory}
    informative = model.informative_rows()
    if informative.constant.any():
        options.update(
            site_fit=site_fit,
            prior_sites=prior_sites,
            relax_prior_sites=relax_prior_sites,
            prior_nonnegative=prior_nonnegative,
        )
        return _informative_refits(refit_without_rows, informative, sites, rows, options)
    prior = _BinaryPrior.of(model, prior_sites)
    relaxation = None
    if relax_prior_sites and prior_sites is not None:
        relaxation = _PriorSiteRelaxation(model, prior_sites, prior_nonnegative, tol)
    if hasattr(design, "toarray"):
        check_memory(8.0 * m * p, f"the dense {m} × {p} design of the refits", "")
        design = design.toarray()
    # Per refit: the (p, M) scaled design and spread, three p × p, the M-long site arrays
    # (sites, sweeps and Anderson's history).
    per_refit = 8.0 * (2 * p * m + 3 * p * p + 40 * m)
    check_memory(per_refit, f"one leave-one-out refit ({p} parameters, {m} rows)", "")
    # One sweep loop over as many refits as memory allows: a loop's Python work per sweep
    # is the same for 4 refits or 44 (measured on ionosphere, blocks of 8, 16 and 44 refits
    # took 2.4, 2.0 and 1.6 × the fit; two loops side by side on two threads, no less).
    step = block_length(per_refit)
    mean, var, n_iter = np.empty(rows.size), np.empty(rows.size), np.empty(rows.size, int)
    for start in range(0, rows.size, step):
        part = slice(start, min(start + step, rows.size))
        if relaxation is not None:
            mean[part], var[part], n_iter[part] = relaxation.refits(
                design, sites, rows[part], damping, tol, max_iter, site_fit, memory
            )
            continue
        mean[part], var[part], n_iter[part] = _refit_block(
            model, prior, design, sites, rows[part], damping, tol, max_iter, site_fit, memory
        )[:3]
    return LeftOutMarginals(mean, var, n_iter)


@blas_policy
def relax_prior_sites_without_rows(
    model, sites: EPSites, rows, prior_sites, *, prior_nonnegative: bool = False, tol: float = 1e-3
) -> LeftOutMarginals:
    """The latent marginal of each of ``rows`` under EP without it, the rows' sites held:
    its cavity with the shrinkage prior's coefficient sites relaxed
    (:class:`_PriorSiteRelaxation`).

    A cavity holds every other site as the row left it, the coefficient sites among them;
    an influential row also moved those, and under a heavy-tailed prior (the horseshoe's
    spike) far: relaxed without the row, they take back its pull, which the rows' sites
    (log-concave, moved little) barely share. Parameters as :func:`refit_without_rows`
    (``prior_sites``: the fit's coefficient sites, ``prior_nonnegative``: whether it kept
    their precisions ≥ 0); ``tol`` in nats of each row's term.

    Returns
    -------
    LeftOutMarginals
        ``mean`` and ``var`` NaN for a row whose relaxation did not converge (signed, then
        non-negative), or whose cavity is improper, and for a constant row (all zeros, no
        intercept: its cavity is the fit, nothing to relax); ``n_iter`` 0.
    """
    rows = np.asarray(rows, dtype=np.intp).ravel()
    design = model.design
    m, p = design.shape
    if len(sites.precision) != m:
        raise ValueError(f"sites has {len(sites.precision)} rows; the model has {m}.")
    informative = model.informative_rows()
    if informative.constant.any():
        options = {"prior_sites": prior_sites, "prior_nonnegative": prior_nonnegative, "tol": tol}
        inner = _informative_refits(
            relax_prior_sites_without_rows, informative, sites, rows, options
        )
        constant = informative.constant[rows]
        return LeftOutMarginals(
            np.where(constant, np.nan, inner.mean), np.where(constant, np.nan, inner.var),
            inner.n_iter,
        )  # fmt: skip
    if hasattr(design, "toarray"):
        check_memory(8.0 * m * p, f"the dense {m} × {p} design of the relaxations", "")
        design = design.toarray()
    relaxation = _PriorSiteRelaxation(model, prior_sites, prior_nonnegative, tol)
    mean, var = np.full(rows.size, np.nan), np.full(rows.size, np.nan)
    # Per relaxation: the cavity's precision and its factor's inverse, and the copies the
    # sweeps take of them.
    per_row = 8.0 * (4 * p * p + 4 * p)
    check_memory(per_row, f"one leave-one-out relaxation ({p} parameters)", "")
    step = block_length(per_row)
    for start in range(0, rows.size, step):
        part = slice(start, min(start + step, rows.size))
        nonnegative = np.full(rows[part].size, prior_nonnegative)
        try:
            t_mean, t_var, converged = relaxation.without_rows(
                design, sites, rows[part], nonnegative
            )
        except NotPositiveDefiniteError:
            continue  # (an improper cavity: the rows keep their cavities' terms)
        retry = np.flatnonzero(~converged & ~nonnegative & ~relaxation.log_concave)
        if retry.size:
            try:
                again = relaxation.without_rows(
                    design, sites, rows[part][retry], np.ones(retry.size, dtype=bool)
                )
            except NotPositiveDefiniteError:
                again = (np.nan, np.nan, False)
            t_mean[retry], t_var[retry], converged[retry] = again
        mean[part] = np.where(converged, t_mean, np.nan)
        var[part] = np.where(converged, t_var, np.nan)
    return LeftOutMarginals(mean, var, np.zeros(rows.size, dtype=int))


def _informative_refits(refit, informative, sites: EPSites, rows, options) -> LeftOutMarginals:
    """``refit`` of a model with constant rows (all zeros, no intercept), on its informative
    rows: a constant row's site is 0 (:func:`~vsbayes.approximations.expectation_propagation.
    with_constant_rows`), so that the refits' EP is that of the other rows alone, and
    leaving a constant row out leaves the fit as it was, its latent 0: mean and variance 0,
    no sweep."""
    kept = ~informative.constant
    index = np.cumsum(kept) - 1  # each row's place among the informative ones
    left_constant = informative.constant[rows]
    reduced = EPSites(sites.precision[kept], sites.linear[kept], sites.space)
    inner = refit(informative.model, reduced, index[rows[~left_constant]], **options)
    out = []
    for values in (inner.mean, inner.var, inner.n_iter):
        full = np.zeros((rows.size, *values.shape[1:]), dtype=values.dtype)
        full[~left_constant] = values
        out.append(full)
    return LeftOutMarginals(*out)


def _refit_block(
    model,
    prior,
    design,
    sites,
    rows,
    damping,
    tol,
    max_iter,
    site_fit,
    memory,
    start=None,
    outer=None,
):
    """:func:`refit_without_rows` of one block of rows: one sweep loop on R × M sites,
    from the cavities (or from ``start``, the refits' sites ``(τ, ν)``, each (R, M));
    the left-out rows' latent means, variances, the sweeps, and the refits' sites.
    ``outer``: the design's :class:`_RowOuter`, where the caller has it.

    A refit whose undamped sweep moved none of its sites by more than ``tol`` is settled:
    its sites stay, and the later sweeps neither update nor refactor it (the refits of
    rows that barely moved the others settle in a few sweeps; the loop runs until the last
    one does)."""
    r, m = rows.size, design.shape[0]
    left_out = np.arange(r) * m + rows  # each refit's own row, in the stacked sites
    if start is None:
        tau = np.tile(sites.precision, r)
        nu = np.tile(sites.linear, r)
    else:
        tau, nu = (np.array(values, dtype=float).ravel() for values in start)
    tau[left_out] = nu[left_out] = 0.0  # the cavity: the start
    weights = np.tile(model.sample_weight, r).reshape(r, m)
    update_rows = _BinaryRows(site_fit)
    n = r * m
    settled = np.zeros(r, dtype=bool)
    columns = np.ascontiguousarray(design.T)
    # None where the rows' a_j a_jᵀ do not fit a block
    outer = (outer if outer is not None else _RowOuter(design)).whole
    known = {}  # the last posteriors: their stacked sites (R, 2, M) and _Refits

    def by_refit(stacked):
        return stacked.reshape(2, r, m).transpose(1, 0, 2)  # (R, 2, M): τ then ν

    def posterior(stacked):
        parts = by_refit(stacked)
        # Only the refits whose sites differ from the last posterior's are refactored.
        stale = ~np.all(parts == known["sites"], axis=(1, 2)) if known else np.ones(r, bool)
        fresh = _Refits(
            design, columns, outer, prior.of_refits(stale), parts[stale, 0], parts[stale, 1]
        )
        post = fresh if stale.all() else known["post"].replace(stale, fresh)
        known.update(sites=parts.copy(), post=post)
        return post

    def update(post, stacked):
        parts = by_refit(stacked)
        new = parts.copy()
        active = np.flatnonzero(~settled)
        block, _ = update_rows.update(
            model.link,
            post.t_mean[active].ravel(),
            post.t_var[active].ravel(),
            parts[active].transpose(1, 0, 2).ravel(),
            weights[active].ravel(),
            normalizers=False,
        )
        new[active] = block.reshape(2, active.size, m).transpose(1, 0, 2)
        new[np.arange(r), :, rows] = 0.0  # the left-out rows stay out
        if stacked is store.sites:  # a sweep (not the stall test of the best sites)
            change = np.max(np.abs(new - parts) / (1.0 + np.abs(parts)), axis=(1, 2))
            settled[active] = change[active] <= tol
        return new.transpose(1, 0, 2).ravel()

    def project(stacked, extrapolated):
        np.maximum(stacked[:n], 0.0, out=stacked[:n])  # τ ≥ 0, as the full fit's
        stacked[left_out] = stacked[n + left_out] = 0.0
        return stacked

    store = ArraySites(
        np.concatenate([tau, nu]),
        update,
        posterior,
        project,
        marginals=lambda post: (post.mean.ravel(), post.var.ravel()),
    )
    run = damped_sweeps(store, damping=damping, tol=tol, max_iter=max_iter, memory=memory)
    post = run.posterior
    own = (np.arange(r), rows)
    final = by_refit(store.sites)
    return post.t_mean[own], post.t_var[own], run.n_iter, (final[:, 0], final[:, 1])


#: The relaxation of a shrinkage prior's coefficient sites without a row
#: (:class:`_PriorSiteRelaxation`): the damping of its sweeps (undamped, Laplace's took
#: 3-4 sweeps on breast cancer, 0.5 twice as many; 0.85 leaves room for the heavy-tailed
#: priors' oscillations); the sweeps after which a relaxation still moving is stopped,
#: non-negative and signed (then rerun non-negative). Measured on
#: ``benchmarks/shrinkage_loo.py``'s nine cases: 1-15 sweeps where they converged signed,
#: 30-40 non-negative under breast cancer's horseshoe; breast cancer's Student-t without
#: its rows 38, 297 or 81 has no signed fixed point (nor has the estimator's EP refit
#: without 38 or 297). The rounds of the refits' alternation (rows, then coefficient
#: sites): on breast cancer's horseshoe, the 22 rows of share above 0.15 were +0.615,
#: +0.133 and −0.050 nats from brute force after one, two and three (D-184).
_RELAX_DAMPING = 0.85
_RELAX_MAX_ITER = 40
_RELAX_SIGNED_MAX_ITER = 25
_RELAX_ROUNDS = 3
#: ... and the largest relative change of a site in the last sweep below which a
#: relaxation whose term has settled has converged: a signed relaxation without a fixed
#: point (breast cancer's Student-t without its row 38, as the estimator's EP refit
#: without it) wanders with changes of 0.03-0.3, its term now and then still for two
#: sweeps.
_RELAX_SITE_TOL = 1e-2
_RELAX_STALL = 5


def _watched_term(link, t_mean: np.ndarray, t_var: np.ndarray) -> np.ndarray:
    """A left-out row's term as the relaxations watch it settle: the probit's predictive in
    closed form, the logistic's by its probit approximation ``log σ(m / √(1 + πv/8))``
    (MacKay 1992; within a few hundredths of a nat of it, with its slopes in m and v, in
    closed form where the logistic's rule took a sixth of the relaxations' time): the
    stopping rule compares its changes, not its value."""
    if link.name == "logistic":
        return -np.logaddexp(0.0, -t_mean / np.sqrt(1.0 + (np.pi / 8.0) * t_var))
    return link.predictive_log_proba(t_mean, t_var)[0]


class _PriorSiteRelaxation:
    """EP's coefficient sites (a shrinkage prior's, binary) relaxed without a row, the
    rows' sites held: the sweeps of the fit's own prior-site update (cavity, the factor's
    tilted moments, new site) on the d sites of each of R posteriors at once, stacked.

    The posteriors are given without their coefficient sites, as a precision (R, p, p)
    and a linear term (R, p): a cavity's (the fit's rows less the left-out one), or a
    refit's rows. Each relaxation stops when its left-out row's term (the link's
    predictive of its latent value) is expected to move by less than ``tol`` nats more,
    its last change extrapolated by the rate of the last two (a geometric tail); the
    sites themselves need not settle further, as only the term is used. The tilted
    moments come from the factor's coarser rule (``method="fast"``, within 1e-6 of the
    fit's). A heavy-tailed prior's sites may have negative precisions: their step is
    halved while a posterior would be improper (as the fit's); where the fit kept them
    ≥ 0, so do the relaxations, and a signed relaxation that does not converge in
    :data:`_RELAX_MAX_ITER` sweeps is reported (its caller reruns it non-negative, as the
    estimator's fit reruns EP without a signed fixed point). A coefficient that no row
    touches keeps its site (its marginal is its prior's, whatever the rows)."""

    def __init__(self, model, prior_sites, nonnegative: bool, tol: float):
        self.model = model
        self.factor = model.coefficient_prior
        self.d = model.n_features
        self.base_precision = 1.0 / model.prior_var
        self.base_linear = model.prior_mean / model.prior_var
        self.sites = tuple(np.asarray(values, dtype=float) for values in prior_sites)
        self.nonnegative = bool(nonnegative)
        self.tol = tol
        self.held = np.zeros(self.d, dtype=bool)
        if self.factor.divides_base:
            self.held = untouched_columns(model.design, model.sample_weight)[: self.d]
        self.log_concave = factor_is_log_concave(self.factor)

    def start(self, r: int, nonnegative: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The fit's sites for R relaxations, their precisions clipped at 0 where
        ``nonnegative``."""
        tau = np.tile(self.sites[0], (r, 1))
        tau = np.where(nonnegative[:, None], np.maximum(tau, 0.0), tau)
        return tau, np.tile(self.sites[1], (r, 1))

    def _posterior(self, precision, linear, tau, nu, left):
        """The coefficients' means and variances (R, d) and the left-out rows' latent
        means and variances (R,) of the posteriors with coefficient sites ``(τ, ν)``."""
        d = self.d
        full = precision.copy()
        diagonal = np.arange(d)
        full[:, diagonal, diagonal] += tau
        h = linear.copy()
        h[:, :d] += nu
        inverse = _inverse_factors(full)
        mean = np.einsum("rba,rb->ra", inverse, np.einsum("rab,rb->ra", inverse, h))
        var = np.einsum("rab,rab->rb", inverse[:, :, :d], inverse[:, :, :d])
        spread = np.einsum("rab,rb->ra", inverse, left)
        return (
            mean[:, :d],
            var,
            np.einsum("rp,rp->r", left, mean),
            np.einsum("ra,ra->r", spread, spread),
        )

    def _proper(self, precision, tau) -> np.ndarray:
        """Whether each posterior with coefficient-site precisions ``tau`` is proper."""
        if np.all(self.base_precision[: self.d] + tau > 0):
            return np.ones(len(tau), dtype=bool)
        full = precision.copy()
        diagonal = np.arange(self.d)
        full[:, diagonal, diagonal] += tau
        try:
            np.linalg.cholesky(full)
            return np.ones(len(tau), dtype=bool)
        except np.linalg.LinAlgError:
            pass
        out = np.ones(len(tau), dtype=bool)
        for k, matrix in enumerate(full):  # (rare: which of them is not)
            try:
                np.linalg.cholesky(matrix)
            except np.linalg.LinAlgError:
                out[k] = False
        return out

    def relax(self, precision, linear, tau, nu, nonnegative, left):
        """The coefficient sites ``(τ, ν)`` (R, d) relaxed from those given, for the
        posteriors of ``precision`` (R, p, p) and ``linear`` (R, p) without them; the
        left-out rows (design rows ``left``, (R, p)) latent means and variances at the
        end, and whether each converged. Raises NotPositiveDefiniteError where a
        posterior is improper at the start."""
        r = len(tau)
        tau, nu = tau.copy(), nu.copy()
        t_mean, t_var = np.empty(r), np.empty(r)
        active = np.ones(r, dtype=bool)
        converged = np.zeros(r, dtype=bool)
        last_term, last_change = np.full(r, np.nan), np.full(r, np.nan)
        site_change = np.full(r, np.inf)
        damping = np.full(r, _RELAX_DAMPING)
        least, since = np.full(r, np.inf), np.zeros(r, dtype=int)
        calm = np.zeros(r, dtype=int)  # sweeps running whose term met the stopping rule
        for sweep in range(_RELAX_MAX_ITER + 1):
            idx = np.flatnonzero(active)
            if idx.size == 0:
                break
            mean, var, t_mean[idx], t_var[idx] = self._posterior(
                precision[idx], linear[idx], tau[idx], nu[idx], left[idx]
            )
            term = _watched_term(self.model.link, t_mean[idx], t_var[idx])
            change = np.abs(term - last_term[idx])
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = np.clip(change / last_change[idx], 0.0, 0.95)
            rate = np.where(np.isfinite(rate), rate, 0.95)  # (unknown: slow)
            quiet = change * rate / (1.0 - rate) <= self.tol
            calm[idx] = np.where(quiet, calm[idx] + 1, 0)
            # Signed, the sites must have settled too (else the relaxation may wander
            # without a fixed point: then it is rerun non-negative, as the estimator's EP
            # would be); non-negative, the last resort, a term still for two sweeps will
            # do (a horseshoe site at its spike can keep flipping between its tilted
            # density's modes, its damped steps too small to move the term).
            settled = quiet & (
                (site_change[idx] <= _RELAX_SITE_TOL) | (nonnegative[idx] & (calm[idx] >= 2))
            )
            last_term[idx], last_change[idx] = term, change
            converged[idx[settled]] = True
            active[idx[settled]] = False
            if sweep == _RELAX_MAX_ITER or settled.all():
                break
            if sweep == _RELAX_SIGNED_MAX_ITER:  # (signed: rerun non-negative)
                given_up = ~settled & ~nonnegative[idx]
                active[idx[given_up]] = False
                settled = settled | given_up
                if settled.all():
                    break
            keep = ~settled
            idx, mean, var = idx[keep], mean[keep], var[keep]
            old_tau, old_nu = tau[idx], nu[idx]
            cav_tau, cav_nu = 1.0 / var - old_tau, mean / var - old_nu
            ok = cav_tau > 0
            cav_var = 1.0 / np.where(ok, cav_tau, 1.0)
            _, m, v, fitted = self.factor.tilted_moments(
                (cav_nu * cav_var).ravel(), cav_var.ravel(), method="fast"
            )
            ok &= fitted.reshape(ok.shape) & ~self.held
            v = np.where(ok, v.reshape(ok.shape), 1.0)
            new_tau = np.where(ok, 1.0 / v - cav_tau, old_tau)
            new_nu = np.where(ok, m.reshape(ok.shape) / v - cav_nu, old_nu)
            new_tau = np.where(nonnegative[idx, None], np.maximum(new_tau, 0.0), new_tau)
            step = damping[idx].copy()
            if not self.log_concave:
                # As the fit's sweeps: the step halved while the new sites' posterior is
                # improper (a damped combination of two proper ones is then proper).
                for _ in range(_PROPER_HALVINGS):
                    proper = self._proper(
                        precision[idx], old_tau + step[:, None] * (new_tau - old_tau)
                    )
                    if proper.all():
                        break
                    step = np.where(proper, step, 0.5 * step)
            tau[idx] = old_tau + step[:, None] * (new_tau - old_tau)
            nu[idx] = old_nu + step[:, None] * (new_nu - old_nu)
            site_change[idx] = np.maximum(
                np.max(np.abs(new_tau - old_tau) / (1.0 + np.abs(old_tau)), axis=1),
                np.max(np.abs(new_nu - old_nu) / (1.0 + np.abs(old_nu)), axis=1),
            )
            # As the fit's sweeps: a relaxation that has not cut its change by a third in
            # _RELAX_STALL sweeps halves its damping (a spike's site flipping between its
            # tilted density's two modes, under the horseshoe, settles so).
            better = site_change[idx] < (2.0 / 3.0) * least[idx]
            least[idx] = np.where(better, site_change[idx], least[idx])
            since[idx] = np.where(better, 0, since[idx] + 1)
            stalled = idx[since[idx] >= _RELAX_STALL]
            damping[stalled] *= 0.5
            since[stalled], least[stalled] = 0, site_change[stalled]
        return tau, nu, t_mean, t_var, converged

    def without_rows(self, design, sites: EPSites, rows, nonnegative):
        """The left-out rows' latent means and variances with the coefficient sites relaxed
        in each row's cavity (the other rows' sites as the fit left them), and whether each
        converged."""
        tau_rows, nu_rows = sites.precision, sites.linear
        p = design.shape[1]
        precision = (design.T * tau_rows) @ design
        precision[np.diag_indices(p)] += self.base_precision
        linear = design.T @ nu_rows + self.base_linear
        left = design[rows]
        cavity = precision[None] - tau_rows[rows, None, None] * (
            left[:, :, None] * left[:, None, :]
        )
        tau, nu = self.start(rows.size, nonnegative)
        return self.relax(
            cavity, linear[None] - nu_rows[rows, None] * left, tau, nu, nonnegative, left
        )[2:]

    def refits(self, design, sites, rows, damping, tol, max_iter, site_fit, memory):
        """:func:`refit_without_rows` of one block of rows with the coefficient sites
        relaxed: rounds of the rows' sweeps under the refits' coefficient sites, then
        those sites relaxed under the rows', until a round moves no refit's term by more
        than ``tol`` nats (:data:`_RELAX_ROUNDS` at most). A signed relaxation that does not
        converge is redone non-negative; one that still does not (or whose rows' sweeps
        leave the positive-definite cone) keeps the refit under the fit's sites."""
        nonnegative = np.full(rows.size, self.nonnegative)
        outer = _RowOuter(design)  # (made once: M p² products, as much as a sweep's)
        options = (damping, tol, max_iter, site_fit, memory)
        prior = _BinaryPrior.of(self.model, self.sites)
        held = _refit_block(self.model, prior, design, sites, rows, *options, outer=outer)
        mean, var, n_iter = held[0].copy(), held[1].copy(), held[2]
        done = self._alternate(design, outer, sites, rows, nonnegative, held, options)
        retry = np.flatnonzero(~done[0] & ~nonnegative & ~self.log_concave)
        if retry.size:
            again = self._alternate(
                design, outer, sites, rows[retry], np.ones(retry.size, dtype=bool), None, options
            )
            done[0][retry], done[1][retry], done[2][retry] = again
        ok = done[0]
        mean[ok], var[ok] = done[1][ok], done[2][ok]
        return mean, var, np.full(rows.size, n_iter)

    def _alternate(self, design, outer, sites, rows, nonnegative, held, options):
        """The alternation's rounds for one block (``held``: the first rows' sweeps under
        the fit's coefficient sites, if done): whether each converged, and its left-out
        row's latent mean and variance."""
        r = rows.size
        left = design[rows]
        tau, nu = self.start(r, nonnegative)
        mean, var = np.zeros(r), np.ones(r)
        ok = np.zeros(r, dtype=bool)
        active = np.arange(r)
        previous = None
        try:
            for round_ in range(_RELAX_ROUNDS):
                if round_ == 0 and held is not None:
                    t_mean, t_var, _, (row_tau, row_nu) = held
                else:
                    prior = _BinaryPrior.stacked(self.model, tau[active], nu[active])
                    start = None if round_ == 0 else (row_tau, row_nu)
                    t_mean, t_var, _, (row_tau, row_nu) = _refit_block(
                        self.model, prior, design, sites, rows[active], *options,
                        start=start, outer=outer,
                    )  # fmt: skip
                if previous is None:
                    previous = _watched_term(self.model.link, t_mean, t_var)
                p = design.shape[1]
                precision = outer.weighted(row_tau).reshape(-1, p, p)
                precision[:, np.arange(p), np.arange(p)] += self.base_precision
                linear = row_nu @ design + self.base_linear
                new_tau, new_nu, t_mean, t_var, converged = self.relax(
                    precision, linear, tau[active], nu[active], nonnegative[active],
                    left[active],
                )  # fmt: skip
                tau[active], nu[active] = new_tau, new_nu
                mean[active], var[active] = t_mean, t_var
                term = _watched_term(self.model.link, t_mean, t_var)
                # The rounds contract about fourfold (0.615, 0.133, −0.050 nats above), so
                # that a round that moved a term by δ leaves about δ/3 to come.
                settled = converged & (np.abs(term - previous) <= 3.0 * self.tol)
                # Signed, a relaxation that did not converge fails (to be rerun
                # non-negative); non-negative, the last resort, it goes on from where it
                # stopped (the horseshoe's sites at their spikes crawl: breast cancer
                # without its row 38, 40 sweeps a round).
                failed = ~converged & ~nonnegative[active]
                ok[active[settled]] = True
                keep = ~settled & ~failed
                if round_ == _RELAX_ROUNDS - 1:
                    ok[active[keep]] = True  # (the last round's change was small)
                active, previous = active[keep], term[keep]
                row_tau, row_nu = row_tau[keep], row_nu[keep]
                if active.size == 0:
                    break
        except NotPositiveDefiniteError:
            pass  # the refits still running keep the fit's sites
        return ok, mean, var


class _RowOuter:
    """Each design row's ``x̃_j x̃_jᵀ`` flattened (M, w²), for products ``weights @ outer``:
    all of them at once where they fit one block (:func:`~vsbayes._memory.block_bytes`),
    else made in chunks of rows as the product needs them (M w² grows past the refits' own
    memory on wide designs: 5000 rows of 100 features, 400 MB)."""

    def __init__(self, design: np.ndarray):
        self.design = design
        self.chunk = block_length(8.0 * design.shape[1] ** 2)
        self.whole = self._rows(slice(None)) if self.chunk >= len(design) else None

    def _rows(self, rows: slice) -> np.ndarray:
        part = self.design[rows]
        return (part[:, :, None] * part[:, None, :]).reshape(len(part), -1)

    def weighted(self, weights: np.ndarray) -> np.ndarray:
        """``weights @ outer`` for ``weights`` (..., M): (..., w²)."""
        if self.whole is not None:
            return weights @ self.whole
        m = len(self.design)
        out = np.zeros((*weights.shape[:-1], self.design.shape[1] ** 2))
        for start in range(0, m, self.chunk):
            rows = slice(start, min(start + self.chunk, m))
            out += weights[..., rows] @ self._rows(rows)
        return out


class _ContrastPrior(NamedTuple):
    """The Gaussian prior of B (the contrasts, r·w entries, class-major rows of w): its
    precision, diagonal (r·w,) for the default prior N(0, C) or (r·w, r·w), and its
    linear term (None: centred at 0)."""

    precision: np.ndarray
    linear: np.ndarray | None


def _contrast_prior(model) -> _ContrastPrior:
    """B's marginal prior under the model's Gaussian prior on θ: the default's diagonal
    (the same variances for every class), or a general prior's (a full precision, a mean,
    or variances that differ between the classes: a shrinkage prior's sites, as
    :class:`~vsbayes.approximations.softmax_ep._Contrast` runs EP on B)."""
    contrast = _Contrast(model)
    if contrast.general:
        return _ContrastPrior(contrast.prior_precision_b, contrast.prior_linear_b)
    return _ContrastPrior(1.0 / contrast.prior_var, None)


class _SoftmaxRefits(_StackedRefits):
    """The Gaussians of prior × sites of R multinomial refits at once, on B (the contrasts,
    r·w entries, as :class:`~vsbayes.approximations.softmax_ep`'s ``_Contrast``): each
    refit's mean and variances of B's entries (R, r·w), and every row's latent moments of
    ``g = B x̃`` under each, (R, M, r) and (R, M, r, r)."""

    FIELDS = ("mean", "var", "g_mean", "g_cov")

    def __init__(self, design, outer, prior: _ContrastPrior, lam, eta):
        # ``design``: x̃ = [x, 1] (M, w); ``outer``: the rows' x̃ x̃ᵀ (a _RowOuter), so
        # that every refit's precision blocks Σ_j Λ_rj[a, b] x̃_j x̃_jᵀ are one GEMM
        # (R·r², M) × (M, w²).
        n, m, r, _ = lam.shape
        w = design.shape[1]
        blocks = outer.weighted(lam.reshape(n, m, r * r).transpose(0, 2, 1))
        blocks = blocks.reshape(n, r, r, w, w)
        precision = np.ascontiguousarray(blocks.transpose(0, 1, 3, 2, 4)).reshape(n, r * w, -1)
        precision = 0.5 * (precision + np.swapaxes(precision, 1, 2))
        if prior.precision.ndim == 1:
            diagonal = np.arange(r * w)
            precision[:, diagonal, diagonal] += prior.precision
        else:
            precision += prior.precision
        linear = (np.swapaxes(eta, 1, 2) @ design).reshape(n, r * w)  # Σ_j η_j x̃_jᵀ
        if prior.linear is not None:
            linear += prior.linear
        inverse = _inverse_factors(precision)
        self.mean = np.einsum("kba,kb->ka", inverse, np.einsum("kab,kb->ka", inverse, linear))
        self.var = np.einsum("kab,kab->kb", inverse, inverse)
        # Row j's g = (I_r ⊗ x̃_j) vec B: its spread L⁻¹ (I_r ⊗ x̃_j), (R, r·w, r) per row,
        # for all rows as one product (R, r·w, r, w) × (w, M).
        spread = inverse.reshape(n, r * w, r, w) @ np.ascontiguousarray(design.T)
        self.g_cov = np.einsum("kian,kibn->knab", spread, spread)
        self.g_mean = np.swapaxes(self.mean.reshape(n, r, w) @ design.T, 1, 2)


@blas_policy
def refit_softmax_without_rows(
    model,
    sites: EPSites,
    rows,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-6,
    max_iter: int = 200,
    memory: int = 5,
    linear_within: float | None = 0.1,
) -> LeftOutMarginals:
    """The multinomial EP refitted without each of ``rows``, warm from the full fit's sites.

    As :func:`refit_without_rows`: the R refits are one sweep loop on R × M sites of
    K − 1 dimensions, their posteriors of the contrasts B one (R, r·w, r·w) stack, the
    sites found by the multinomial EP's own site update (``softmax_ep``'s tilted moments
    or VS fits, on the rules it would take for the rows) over the refits' rows in chunks,
    and a refit whose sites stopped moving is settled.

    Parameters
    ----------
    model : SoftmaxGLMPosterior
        The posterior the full EP fitted (rows in memory, a Gaussian prior: under a
        shrinkage prior, the model under the fit's prior sites, which stay fixed).
    sites : EPSites
        The full fit's sites (``space="contrast"``), of the model's rows.
    rows : array-like of int
        The rows (of the model: those of positive weight) to leave out, one refit each.
    damping, tol, max_iter, memory
        As :func:`~vsbayes.approximations.softmax_ep.softmax_ep`.
    linear_within : float or None, default=0.1
        A refit's site whose row's latent marginal stays within this of the full fit's
        (its mean within 0.1 sd, its covariance within 0.1 of the products of its sds)
        is the full fit's site moved linearly with its cavity (Jacobians by differences
        of the site update, once per row); a row that moves further is found exactly
        there, and is linear about that site until it moves :data:`REANCHOR_WITHIN`
        times this from it. The sweeps start from every site linear, swept to its fixed
        point (no tilted moments), so that the rows moving far are found near where
        they end. None: every site exactly (R × M tilted moments a sweep).

    Returns
    -------
    LeftOutMarginals
        Each left-out row's K latent values' mean and covariance under its refit (centred:
        the softmax ignores their common shift).
    """
    rows = np.asarray(rows, dtype=np.intp).ravel()
    if getattr(model, "coefficient_prior", None) is not None:
        raise ValueError(
            "Warm leave-one-out refits need a Gaussian prior: pass the model under its "
            "prior sites (softmax_prior_sites.under_prior_sites)."
        )
    m, k, d = model.n_observations, model.n_classes, model.n_features
    if len(sites.precision) != m:
        raise ValueError(f"sites has {len(sites.precision)} rows; the model has {m}.")
    informative = model.informative_rows()
    if informative.constant.any():
        options = {"damping": damping, "tol": tol, "max_iter": max_iter, "memory": memory}
        options["linear_within"] = linear_within
        return _informative_refits(refit_softmax_without_rows, informative, sites, rows, options)
    design = model.X
    if hasattr(design, "toarray"):
        check_memory(8.0 * m * d, f"the dense {m} × {d} design of the refits", "")
        design = design.toarray()
    if model.fit_intercept:
        design = np.hstack([design, np.ones((m, 1))])
    r, w = k - 1, design.shape[1]
    # Per refit: the sites (current, candidate, best, the change's scale and residual,
    # Anderson's 2 · memory differences) and the rows' latent moments, about 20 (r² + r)
    # a row besides, and the linear sites' anchors (marginal, cavity, site: 2 (r² + r) + r);
    # the posterior's three (r·w)² and its spread (r·w · r · M).
    per_refit = 8.0 * (m * (r * r + r) * (33 + 2 * memory) + 3 * (r * w) ** 2 + r * r * w * m)
    check_memory(per_refit, f"one leave-one-out refit ({r * w} parameters, {m} rows)", "")
    step = block_length(per_refit)
    shared = _SoftmaxRefitsShared(model, design, sites, linear_within)
    mean, cov = np.empty((rows.size, k)), np.empty((rows.size, k, k))
    n_iter = np.empty(rows.size, int)
    for start in range(0, rows.size, step):
        part = slice(start, min(start + step, rows.size))
        mean[part], cov[part], n_iter[part] = _refit_softmax_block(
            shared, rows[part], damping, tol, max_iter, memory
        )
    return LeftOutMarginals(mean, cov, n_iter)


#: A refit's row whose site was found exactly (it had moved more than ``linear_within``
#: from the full fit) is found again where it moves more than this fraction of
#: ``linear_within`` from there; in between its site is linear about that exact one (with
#: the full fit's Jacobian). On wine's 48 refits, at ``linear_within`` = 0.2, the sum of
#: the terms against every site exact: fraction 0 (found exactly at every sweep) −2.1e-3
#: nats, 0.1 +3.6e-3, 0.25 +7.3e-3, 0.5 +0.015; at 0.1 the refits' exact site updates were
#: 415 (D-073's, found exactly at every sweep past 0.1 sd: 5300).
REANCHOR_WITHIN = 0.1

#: Rows of the refits whose sites are found in one call of the multinomial EP's site
#: update: its quadrature's temporaries (rows × classes × nodes) stay in cache. On wine's
#: refits (512 nodes a row), one call over 6000 rows took 3.4 s a refit loop, chunks of
#: 256 rows 1.4 s (100 rows: 25 µs a row against 134 µs in blocks of 500).
_SITE_CHUNK = 256


class _SoftmaxRefitsShared:
    """What every block of :func:`refit_softmax_without_rows`' refits reads, made once:
    B's prior variances, the rows' outer products, the full fit's rows and cavities, and
    the linear sites' Jacobians (at the first block that takes them)."""

    def __init__(self, model, design, sites, linear_within):
        k = model.n_classes
        self.model, self.design, self.sites = model, design, sites
        self.linear_within = linear_within
        self.q = centred_basis(k)
        self.prior = _contrast_prior(model)
        self.outer = _RowOuter(design)
        self.copies, self.power = _split_weights(model.sample_weight)
        self.full = _full_fit_cavities(design, self.outer, self.prior, sites, self.copies)
        self._jacobians = None

    def jacobians(self, state: _RowState) -> _SiteJacobians:
        """The linear sites' Jacobians, on the rules of ``state`` (a block's, before its
        sweeps: the full fit's, the same in every block)."""
        if self._jacobians is None:
            self._jacobians = _SiteJacobians(
                self.model, self.full, self.sites, state, self.q, self.linear_within
            )
        return self._jacobians


def _refit_softmax_block(shared: _SoftmaxRefitsShared, rows, damping, tol, max_iter, memory):
    """:func:`refit_softmax_without_rows` of one block of rows: one sweep loop on R × M
    sites (settled refits as :func:`_refit_block`'s)."""
    model, design, sites = shared.model, shared.design, shared.sites
    n, m, r = rows.size, model.n_observations, model.n_classes - 1
    q, prior, outer = shared.q, shared.prior, shared.outer
    copies, power = np.tile(shared.copies, n), np.tile(shared.power, n)
    labels = np.tile(model.y, n)
    own = (np.arange(n), rows)
    lam = np.broadcast_to(sites.precision, (n, m, r, r)).copy()
    eta = np.broadcast_to(sites.linear, (n, m, r)).copy()
    lam[own] = eta[own] = 0.0  # the cavity: the start
    n_lam = n * m * r * r
    state = _site_state(model, shared.full, n)
    settled = np.zeros(n, dtype=bool)
    known = {}  # the last posteriors: their sites and _SoftmaxRefits

    def split(stacked):
        return stacked[:n_lam].reshape(n, m, r, r), stacked[n_lam:].reshape(n, m, r)

    def posterior(stacked):
        lam, eta = split(stacked)
        # Only the refits whose sites differ from the last posterior's are refactored.
        stale = (
            ~(
                np.all(lam == known["lam"], axis=(1, 2, 3))
                & np.all(eta == known["eta"], axis=(1, 2))
            )
            if known
            else np.ones(n, bool)
        )
        if not stale.any():  # (no stack of no refits: the last posterior is this one)
            return known["post"]
        fresh = _SoftmaxRefits(design, outer, prior, lam[stale], eta[stale])
        post = fresh if stale.all() else known["post"].replace(stale, fresh)
        known.update(lam=lam.copy(), eta=eta.copy(), post=post)
        return post

    linear = None
    # The Jacobians cost P + 1 site updates a row, an exact sweep of the refits n: worth
    # it where the refits' 5-7 sweeps take more (P = r(r + 3)/2: 5 for three classes, 54
    # for ten). Made once, for every block that takes them.
    if shared.linear_within is not None and r * (r + 3) // 2 + 1 <= 5 * n:
        linear = shared.jacobians(state)
    exact = np.ones((n, m), dtype=bool) if linear is None else np.zeros((n, m), dtype=bool)
    if linear is not None:
        # Each refit's row's anchor: the marginal, cavity and site (one copy, natural
        # parameters) about which its site is linear — the full fit's, until the row moves
        # more than linear_within from it; then its exact site where it is now.
        anchor = {
            "mean": np.broadcast_to(linear.mean, (n, m, r)).copy(),
            "cov": np.broadcast_to(linear.cov, (n, m, r, r)).copy(),
            "base": np.broadcast_to(linear.base, (n, *linear.base.shape)).copy(),
            "site": np.broadcast_to(linear.site, (n, *linear.site.shape)).copy(),
            "moved": np.zeros((n, m), dtype=bool),
        }

    def exact_sites(post, lam, eta, new_lam, new_eta, ref, row):
        for start in range(0, ref.size, _SITE_CHUNK):
            at = (ref[start : start + _SITE_CHUNK], row[start : start + _SITE_CHUNK])
            flat = at[0] * m + at[1]
            v_mean, v_cov = post.g_mean[at], post.g_cov[at]
            cav_prec, cav_lin, ok = _cavity(v_mean, v_cov, lam[at], eta[at], copies[flat])
            part = _state_of_rows(state, flat)
            _, site_lam, site_eta, good = _sites(
                _OneRow(labels[flat]), q, v_mean, v_cov, cav_prec, cav_lin, power[flat],
                None, part, ok,
            )  # fmt: skip
            state.level[flat], state.direct[flat] = part.level, part.direct
            state.coarse[flat] = part.coarse
            ok &= good  # a row whose cavity or tilted moments are improper keeps its site
            if linear is not None:
                moved = (at[0][ok], at[1][ok])
                anchor["mean"][moved], anchor["cov"][moved] = v_mean[ok], v_cov[ok]
                anchor["moved"][moved] = True
                anchor["base"][moved] = linear.params(cav_prec[ok], cav_lin[ok])
                anchor["site"][moved] = linear.params(site_lam[ok], site_eta[ok])
            c = copies[flat]
            new_lam[at] = np.where(ok[:, None, None], c[:, None, None] * site_lam, lam[at])
            new_eta[at] = np.where(ok[:, None], c[:, None] * site_eta, eta[at])
            new_lam[at] = _psd_sites(new_lam[at])

    def update(post, stacked):
        lam, eta = split(stacked)
        new_lam, new_eta = lam.copy(), eta.copy()
        active = np.flatnonzero(~settled)
        if linear is not None:
            # A row that moved far from its anchor is found exactly once, where it is, and
            # is linear about that from then on: the sweeps' map stays continuous but for
            # the few re-anchorings (rows switching between the linear site about the full
            # fit and the exact one took 16-23 sweeps instead of 5-7).
            if phase["linear"]:
                exact[active] = linear.unfit
            else:
                exact[active] = linear.far(
                    post.g_mean[active],
                    post.g_cov[active],
                    anchor["mean"][active],
                    anchor["cov"][active],
                    np.where(anchor["moved"][active], REANCHOR_WITHIN, 1.0),
                )
            exact[own] = False  # (the left-out rows stay out)
            ref, row = np.nonzero(~exact[active])
            ref = active[ref]
            at, c = (ref, row), copies[ref * m + row]
            cav_prec, cav_lin, ok = _cavity(post.g_mean[at], post.g_cov[at], lam[at], eta[at], c)
            site_lam, site_eta = linear.sites(
                row, cav_prec, cav_lin, anchor["base"][at], anchor["site"][at]
            )
            new_lam[at] = _psd_sites(
                np.where(ok[:, None, None], c[:, None, None] * site_lam, lam[at])
            )
            new_eta[at] = np.where(ok[:, None], c[:, None] * site_eta, eta[at])
        ref, row = np.nonzero(exact[active])
        exact_sites(post, lam, eta, new_lam, new_eta, active[ref], row)
        new_lam[own] = new_eta[own] = 0.0  # the left-out rows stay out
        if stacked is store.sites:  # a sweep (not the stall test of the best sites)
            change = np.maximum(
                np.max(np.abs(new_lam - lam) / (1.0 + np.abs(lam)), axis=(1, 2, 3)),
                np.max(np.abs(new_eta - eta) / (1.0 + np.abs(eta)), axis=(1, 2)),
            )
            settled[active] = change[active] <= tol
        return np.concatenate([new_lam.ravel(), new_eta.ravel()])

    def project(stacked, extrapolated):
        if extrapolated:  # as softmax_ep: an extrapolation may leave the PSD cone
            stacked = stacked.copy()
            stacked[:n_lam] = _psd_sites(stacked[:n_lam].reshape(n * m, r, r)).ravel()
        lam, eta = split(stacked)
        lam[own] = eta[own] = 0.0
        return stacked

    start = np.concatenate([lam.ravel(), eta.ravel()])
    phase = {"linear": linear is not None}
    if phase["linear"]:
        # The start: every site linear in its cavity, swept to its fixed point (no tilted
        # moments), then the rows that moved far from the full fit found exactly from there.
        store = ArraySites(start, update, posterior, project)
        damped_sweeps(store, damping=damping, tol=tol, max_iter=max_iter, memory=memory)
        start, phase["linear"] = store.sites, False
        settled[:] = False
    store = ArraySites(
        start,
        update,
        posterior,
        project,
        marginals=lambda post: (post.mean.ravel(), post.var.ravel()),
    )
    run = damped_sweeps(store, damping=damping, tol=tol, max_iter=max_iter, memory=memory)
    post = run.posterior
    g_mean, g_cov = post.g_mean[own], post.g_cov[own]
    return g_mean @ q.T, q @ g_cov @ q.T, run.n_iter


def _psd_sites(lam: np.ndarray) -> np.ndarray:
    """``_psd`` of the refits' site precisions but for the zero ones (each refit's left-out
    row): a zero matrix is no positive definite one, and would send every site of the
    stack through an eigendecomposition (a fifth of wine's refits' time)."""
    nonzero = np.any(lam != 0.0, axis=(1, 2))
    if nonzero.all():
        return _psd(lam)
    out = lam.copy()
    out[nonzero] = _psd(lam[nonzero])
    return out


class _SiteJacobians:
    """Each row's site (one copy) as a linear function of its cavity, about the full fit's:
    ``site(c) ≈ site_full + J (c − c_full)`` in the natural parameters (the precision's
    upper triangle, then the linear term), J by forward differences of the multinomial
    EP's own site update on its rules (deterministic nodes moved with the cavity: a smooth
    function), one step per parameter of every row — (P + 1) M tilted moments in all,
    P = r (r + 3) / 2, instead of the refits' R M a sweep. ``far`` says which rows of a
    refit have moved too far from the full fit for the linear site."""

    def __init__(self, model, full: _FullFit, sites, state, q, within: float):
        m, r = model.n_observations, model.n_classes - 1
        self.mean, self.cov, self.within = full.g_mean, full.g_cov, within
        copies, power = _split_weights(model.sample_weight)
        cav_prec, cav_lin, ok = full.cav_prec, full.cav_lin, full.ok
        self.upper = np.triu_indices(r)
        a, b = self.upper
        base = self.params(cav_prec, cav_lin)  # (M, P)
        n_params = base.shape[1]
        # Steps of 1e-4 of each parameter's scale (its cavity precision's diagonal).
        scale = np.sqrt(np.abs(np.diagonal(cav_prec, axis1=1, axis2=2)))
        step = np.empty_like(base)
        step[:, : a.size] = 1e-4 * scale[:, a] * scale[:, b]
        step[:, a.size :] = 1e-4 * np.maximum(scale, np.abs(cav_lin))
        points = np.repeat(base[None], n_params + 1, axis=0)  # (P + 1, M, P)
        for j in range(n_params):
            points[j + 1, :, j] += step[:, j]
        prec, lin = self.unpack(points.reshape(-1, n_params))
        count = n_params + 1
        values = np.empty((count * m, n_params))
        good = np.zeros(count * m, dtype=bool)
        every = np.tile(np.arange(m), count)
        for start in range(0, count * m, _SITE_CHUNK):
            part = slice(start, min(start + _SITE_CHUNK, count * m))
            row = every[part]
            # A throwaway state: the differences leave the refits' rules as they are.
            piece = _state_of_rows(state, row)
            _, site_lam, site_eta, good[part] = _sites(
                _OneRow(model.y[row]), q, self.mean[row], self.cov[row], prec[part], lin[part],
                power[row], None, piece, np.ones(row.size, dtype=bool),
            )  # fmt: skip
            values[part] = self.params(site_lam, site_eta)
        values = values.reshape(count, m, n_params)
        self.jacobian = np.stack(
            [(values[j + 1] - values[0]) / step[:, j : j + 1] for j in range(n_params)], axis=2
        )
        self.base = base
        self.site = self.params(
            sites.precision / copies[:, None, None], sites.linear / copies[:, None]
        )
        self.unfit = ~(ok & good.reshape(count, m).all(axis=0))  # these rows stay exact

    def params(self, prec: np.ndarray, lin: np.ndarray) -> np.ndarray:
        return np.concatenate([prec[:, self.upper[0], self.upper[1]], lin], axis=1)

    def unpack(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.upper
        r = len(values[0]) - a.size
        prec = np.zeros((len(values), r, r))
        prec[:, a, b] = prec[:, b, a] = values[:, : a.size]
        return prec, values[:, a.size :]

    def far(self, g_mean, g_cov, anchor_mean, anchor_cov, scale=1.0) -> np.ndarray:
        """Whether each row's latent marginal (R, M, r) moved from its anchor's by more
        than ``within`` (a mean in sds, a covariance entry in products of sds)."""
        sd = np.sqrt(np.diagonal(g_cov, axis1=2, axis2=3))
        spread = sd[..., :, None] * sd[..., None, :]
        move = np.maximum(
            np.max(np.abs(g_mean - anchor_mean) / sd, axis=2),
            np.max(np.abs(g_cov - anchor_cov) / spread, axis=(2, 3)),
        )
        return (move > scale * self.within) | self.unfit

    def sites(self, row, cav_prec, cav_lin, base, site) -> tuple[np.ndarray, np.ndarray]:
        """The sites (one copy) of rows ``row`` at the cavities given, linear about their
        anchors' cavities ``base`` and sites ``site`` (natural parameters, :meth:`params`)
        with the full fit's Jacobians."""
        delta = self.params(cav_prec, cav_lin) - base
        # The rows' Jacobians in chunks: the refits' rows at once are R copies of them
        # (R M P², past the refits' own block from 14 classes on).
        n_params = delta.shape[1]
        step = block_length(8.0 * n_params * n_params)
        moved = np.empty_like(delta)
        for start in range(0, len(row), step):
            part = slice(start, start + step)
            moved[part] = np.einsum("npq,nq->np", self.jacobian[row[part]], delta[part])
        return self.unpack(site + moved)


def _state_of_rows(state: _RowState, rows: np.ndarray) -> _RowState:
    """A copy of ``state`` at ``rows`` (sized: their rules as they are), for one call of the
    multinomial EP's site update on those rows."""
    part = _RowState(rows.size, state.rules)
    part.level, part.direct, part.sized = state.level[rows], state.direct[rows], True
    part.coarse = state.coarse[rows]
    return part


class _FullFit(NamedTuple):
    """The full fit's rows: their latent moments (M, r), (M, r, r) and cavities (one copy's
    natural parameters, and whether each is proper)."""

    g_mean: np.ndarray
    g_cov: np.ndarray
    cav_prec: np.ndarray
    cav_lin: np.ndarray
    ok: np.ndarray


def _full_fit_cavities(design, outer, prior: _ContrastPrior, sites, copies) -> _FullFit:
    """:class:`_FullFit` of the full fit's ``sites``: the refits' rules and the linear
    sites' Jacobians both start from it."""
    full = _SoftmaxRefits(design, outer, prior, sites.precision[None], sites.linear[None])
    g_mean, g_cov = full.g_mean[0], full.g_cov[0]
    return _FullFit(g_mean, g_cov, *_cavity(g_mean, g_cov, sites.precision, sites.linear, copies))


def _site_state(model, full: _FullFit, n_refits: int) -> _RowState:
    """How the refits' sites are found, as ``softmax_ep`` (``sites="auto"``) finds the
    full fit's: VS fits where the cavities are wide, else tilted moments on rules sized to
    each cavity's spread — chosen once from the full fit's cavities (a refit's are near
    them) and the same in every refit, so that the sites can be found in chunks of rows."""
    m, r = model.n_observations, model.n_classes - 1
    cav_prec, ok = full.cav_prec, full.ok
    state = _RowState(n_refits * m)
    spread = np.broadcast_to(np.eye(r), cav_prec.shape).copy()
    spread[ok] = np.linalg.inv(cav_prec[ok])
    if model.n_classes <= MAX_FITTED_CLASSES and _wide_rows(np.linalg.eigvalsh(spread[ok])[:, -1]):
        state.rules = _rules(SymmetricSobol(16))
    else:
        level, narrow = _spread_levels(spread, None)
        state.level = np.tile(level, n_refits)
        state.coarse = np.tile((level == 0) & ok & narrow, n_refits)
    return state
