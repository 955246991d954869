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
memory of one block.

**Cheap site updates.** R refits update R × M sites a sweep, R times the fit's; with VS
site fits those took 70 % of the refits' time. The logistic's tilted moments come instead
in closed form from its mixture of nine probits (``site_fit="fast"``:
:func:`~vsbayes.models.tilted.mixture_tilted_moments`), within 3e-7 of the fit's and about
40 times cheaper — far inside the refits' tolerance, so the same fixed point.

**What it keeps.** The model's prior and weights as they are: with ``penalty=None`` (the
flat prior, scaled by the data's curvature) or ``class_weight="balanced"``, a cold refit
without the row would rescale them by a factor 1 ± 1/M; the warm refit leaves them, as a
leave-one-out posterior should (the prior is not data).

Measured (``benchmarks/posterior_checks.py``): see D-060 in ``docs/decisions.md``.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
from scipy.linalg.lapack import dtrtri

from .._memory import block_bytes, block_length, check_memory
from ..exceptions import NotPositiveDefiniteError
from ..models.latent import row_moments
from ._damped_sweeps import ArraySites, damped_sweeps
from ._threads import blas_policy
from .expectation_propagation import DEFAULT_DAMPING, EPSites, _BinaryRows
from .softmax_ep import softmax_ep

__all__ = ["LeftOutMarginals", "refit_softmax_without_rows", "refit_without_rows"]


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


class _Refits:
    """The Gaussians of prior × sites of R refits at once: each refit's coefficient means
    and variances (R, p), and every row's latent mean and variance under each (R, M)."""

    def __init__(self, design, columns, outer, prior_var, prior_mean, tau, nu):
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
        precision[:, diagonal, diagonal] += 1.0 / prior_var
        linear = nu @ design + prior_mean / prior_var
        try:
            lower = np.linalg.cholesky(precision)
        except np.linalg.LinAlgError as error:
            raise NotPositiveDefiniteError(
                "A leave-one-out refit's EP posterior precision is not positive definite."
            ) from error
        # L⁻¹ (lower triangular): then H⁻¹ = L⁻ᵀL⁻¹, and one GEMM gives every row's spread
        # L⁻¹ a_j, whose squared norm is the row's latent variance.
        # (LAPACK's triangular inverse per refit: numpy's batched inv is a general LU
        # inverse, 4 × slower on 35 × 35.)
        inverse = np.empty_like(lower)
        for r, factor in enumerate(lower):
            inverse[r] = dtrtri(factor, lower=1)[0]
        self.mean = np.einsum("rba,rb->ra", inverse, np.einsum("rab,rb->ra", inverse, linear))
        spread = inverse @ columns  # (R, p, M)
        self.t_var = np.einsum("rpm,rpm->rm", spread, spread)
        self.t_mean = self.mean @ columns
        self.var = np.einsum("rab,rab->rb", inverse, inverse)

    def replace(self, which: np.ndarray, other: _Refits) -> _Refits:
        """These refits with those of ``which`` taken from ``other`` (a new object)."""
        out = copy.copy(self)
        for name in ("mean", "t_var", "t_mean", "var"):
            values = getattr(self, name).copy()
            values[which] = getattr(other, name)
            setattr(out, name, values)
        return out


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
) -> LeftOutMarginals:
    """EP of a binary GLM posterior refitted without each of ``rows``, warm-started.

    Parameters
    ----------
    model : BinaryGLMPosterior
        The posterior the full EP fitted (rows in memory, a Gaussian prior).
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

    Returns
    -------
    LeftOutMarginals
        Each left-out row's latent mean and variance under its refit.
    """
    rows = np.asarray(rows, dtype=np.intp).ravel()
    if getattr(model, "coefficient_prior", None) is not None:
        raise ValueError("Warm leave-one-out refits need a Gaussian prior (no prior sites).")
    design = model.design
    m, p = design.shape
    if len(sites.precision) != m:
        raise ValueError(f"sites has {len(sites.precision)} rows; the model has {m}.")
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
        mean[part], var[part], n_iter[part] = _refit_block(
            model, design, sites, rows[part], damping, tol, max_iter, site_fit, memory
        )
    return LeftOutMarginals(mean, var, n_iter)


def _refit_block(model, design, sites, rows, damping, tol, max_iter, site_fit, memory):
    """:func:`refit_without_rows` of one block of rows: one sweep loop on R × M sites.

    A refit whose undamped sweep moved none of its sites by more than ``tol`` is settled:
    its sites stay, and the later sweeps neither update nor refactor it (the refits of
    rows that barely moved the others settle in a few sweeps; the loop runs until the last
    one does)."""
    r, m = rows.size, design.shape[0]
    left_out = np.arange(r) * m + rows  # each refit's own row, in the stacked sites
    tau = np.tile(sites.precision, r)
    nu = np.tile(sites.linear, r)
    tau[left_out] = nu[left_out] = 0.0  # the cavity: the start
    weights = np.tile(model.sample_weight, r).reshape(r, m)
    update_rows = _BinaryRows(site_fit)
    n = r * m
    settled = np.zeros(r, dtype=bool)
    columns = np.ascontiguousarray(design.T)
    p = design.shape[1]
    outer = None
    if 8.0 * m * p * p <= block_bytes():
        outer = (design[:, :, None] * design[:, None, :]).reshape(m, p * p)
    known = {}  # the last posteriors: their stacked sites (R, 2, M) and _Refits

    def by_refit(stacked):
        return stacked.reshape(2, r, m).transpose(1, 0, 2)  # (R, 2, M): τ then ν

    def posterior(stacked):
        parts = by_refit(stacked)
        # Only the refits whose sites differ from the last posterior's are refactored.
        stale = ~np.all(parts == known["sites"], axis=(1, 2)) if known else np.ones(r, bool)
        fresh = _Refits(
            design,
            columns,
            outer,
            model.prior_var,
            model.prior_mean,
            parts[stale, 0],
            parts[stale, 1],
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
    return post.t_mean[own], post.t_var[own], run.n_iter


def refit_softmax_without_rows(
    model,
    sites: EPSites,
    rows,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-6,
    max_iter: int = 200,
) -> LeftOutMarginals:
    """The multinomial EP refitted without each of ``rows``, warm from the full fit's sites
    (one :func:`~vsbayes.approximations.softmax_ep.softmax_ep` per row, from the sites
    without the row's, instead of a Laplace approximation and its sites).

    Parameters
    ----------
    model : SoftmaxGLMPosterior
        The posterior the full EP fitted (rows in memory, a diagonal prior centred at 0).
    sites : EPSites
        The full fit's sites (``space="contrast"``), of the model's rows.
    rows : array-like of int
        The rows (of the model: those of positive weight) to leave out, one refit each.
    damping, tol, max_iter
        As :func:`~vsbayes.approximations.softmax_ep.softmax_ep`.

    Returns
    -------
    LeftOutMarginals
        Each left-out row's K latent values' mean and covariance under its refit.
    """
    rows = np.asarray(rows, dtype=np.intp).ravel()
    if model.prior_precision is not None or np.any(model.prior_mean):
        raise ValueError("Warm leave-one-out refits need the diagonal prior centred at 0.")
    m, k, d = model.n_observations, model.n_classes, model.n_features
    if len(sites.precision) != m:
        raise ValueError(f"sites has {len(sites.precision)} rows; the model has {m}.")
    w = d + int(model.fit_intercept)
    # θ = [W.ravel(), b]: the index of each class's [w_k, b_k], as row_moments reads B.
    index = np.arange(k)[:, None] * d + np.arange(d)[None, :]
    if model.fit_intercept:
        index = np.hstack([index, k * d + np.arange(k)[:, None]])
    index = index.ravel()
    mean, cov, n_iter = np.empty((rows.size, k)), np.empty((rows.size, k, k)), []
    for j, i in enumerate(rows):
        keep = np.arange(m) != i
        without = type(model)(
            model.X[keep],
            model.y[keep],
            model.sample_weight[keep],
            k,
            prior_var=model.prior_var[:d],
            intercept_prior_var=model.prior_var[-1] if model.fit_intercept else None,
            n_jobs=model.n_jobs,
            max_bytes=model.max_bytes,
        )
        start = EPSites(sites.precision[keep], sites.linear[keep], sites.space)
        refit = softmax_ep(without, damping=damping, tol=tol, max_iter=max_iter, start_sites=start)
        theta_mean, theta_cov = refit.mean[index], refit.cov[np.ix_(index, index)]
        f_mean, f_cov = row_moments(model.X[i : i + 1], theta_mean.reshape(k, w), theta_cov)
        mean[j], cov[j] = f_mean[0], f_cov[0]
        n_iter.append(refit.n_iter)
    return LeftOutMarginals(mean, cov, np.asarray(n_iter, dtype=int))
