"""Expectation propagation over row chunks held by dask workers.

The sites ``(τ_i, ν_i)`` are per row: each chunk keeps its own on the worker that holds its
rows (:class:`~vsbayes.models.ChunkedPosterior`). A sweep is one map over the chunks — from
the posterior's mean and covariance, each chunk updates its sites (the same row-wise
update as in memory, :func:`~vsbayes.approximations.expectation_propagation.new_sites`),
damps them and returns ``Aᵀ diag(τ) A``, ``Aᵀ ν`` and its largest change — and a sum of
those small results here. Anderson's mixing of the in-memory EP needs the whole site
vector, so the sweeps here are plainly damped (more of them), and stall as in memory:
without progress for a while the damping halves, down to 1/64, then EP gives up.
"""

from __future__ import annotations

import math

import numpy as np

from ._damped_sweeps import _MIN_DAMPING, _STALL, stalled_error, warn_unconverged
from ._design_forms import row_variances
from ._glm_gaussian import GLMGaussian
from .expectation_propagation import (
    EPResult,
    _split_weights,
    check_cavities,
    gaussian_log_evidence,
    new_sites,
    site_log_normalizers,
)

__all__ = ["chunked_expectation_propagation"]


def chunked_expectation_propagation(
    model, *, damping: float, tol: float, max_iter: int, start: np.ndarray, site_fit: str
) -> EPResult:
    """EP on a :class:`~vsbayes.models.ChunkedPosterior` (see the module docstring), with
    the parameters of :func:`~vsbayes.approximations.expectation_propagation`."""
    chunks = model.chunks
    post = _posterior(model, chunks.sum(_start_sites, np.asarray(start, dtype=float)))
    converged, change, n_iter = False, math.inf, 0
    best, best_change, stalled = math.inf, math.inf, 0
    while n_iter < max_iter:
        n_iter += 1
        gram, linear, change = _sweep(chunks, post, damping, site_fit)
        post = _posterior(model, (gram, linear))
        if change <= tol:
            converged = True
            break
        # Progress is measured undamped: halving the damping halves the change by itself.
        if change / damping < best:
            best, best_change, stalled = change / damping, change, 0
        else:
            stalled += 1
            if stalled >= _STALL:
                if damping <= _MIN_DAMPING:
                    raise stalled_error(n_iter, best_change, tol)
                damping, stalled = max(0.5 * damping, _MIN_DAMPING), 0
    chunks.map(_commit_sites)
    if not converged:
        warn_unconverged(n_iter, max_iter, change, tol)
    sites, improper = chunks.sum(_site_evidence, post.mean, post.cov, site_fit)
    check_cavities(int(improper))
    return EPResult(
        post.mean,
        post.cov,
        sites + gaussian_log_evidence(model, post),
        n_iter=n_iter,
        converged=converged,
        site_change=change,
    )


def _posterior(model, sums) -> GLMGaussian:
    gram, linear = sums
    gram[np.diag_indices(model.dim)] += 1.0 / model.prior_var
    return GLMGaussian(model, precision=gram, linear=linear, what="EP posterior precision")


def _sweep(chunks, post: GLMGaussian, damping: float, site_fit: str):
    results = chunks.map(_update_sites, post.mean, post.cov, damping, site_fit)
    gram, linear = results[0][0], results[0][1]
    for g, h, _ in results[1:]:
        gram, linear = gram + g, linear + h
    return gram, linear, max(r[2] for r in results)


# --- on the workers: each chunk's sites, kept in its posterior object ------------------


def _start_sites(chunk, theta: np.ndarray):
    """The sites of the factors' second-order expansions at ``theta`` (the mode): the
    first posterior is then the Laplace approximation."""
    t = np.asarray(chunk.design @ theta).ravel()
    slope, curvature = chunk.link.derivatives(t)
    s = chunk.sample_weight
    chunk.ep_sites = s * curvature, s * (slope + curvature * t)
    chunk.ep_pending = None
    return _site_sums(chunk, *chunk.ep_sites)


def _update_sites(chunk, mean: np.ndarray, cov: np.ndarray, damping: float, site_fit: str):
    """Commit the previous sweep's sites, update them from the posterior's marginals and
    damp; return the new sites' ``Aᵀ diag(τ) A``, ``Aᵀ ν`` and the largest relative
    change (kept pending until the next call)."""
    _commit_sites(chunk)
    tau, nu = chunk.ep_sites
    t_mean = np.asarray(chunk.design @ mean).ravel()
    t_var = row_variances(chunk.design, cov, chunk.max_bytes)
    copies, power = _split_weights(chunk.sample_weight)
    new_tau, new_nu, _ = new_sites(chunk.link, t_mean, t_var, tau, nu, copies, power, site_fit)
    damped_tau = (1.0 - damping) * tau + damping * new_tau
    damped_nu = (1.0 - damping) * nu + damping * new_nu
    change = max(
        float(np.max(np.abs(damped_tau - tau) / (1.0 + np.abs(tau)), initial=0.0)),
        float(np.max(np.abs(damped_nu - nu) / (1.0 + np.abs(nu)), initial=0.0)),
    )
    chunk.ep_pending = damped_tau, damped_nu
    return (*_site_sums(chunk, damped_tau, damped_nu), change)


def _commit_sites(chunk) -> None:
    if chunk.ep_pending is not None:
        chunk.ep_sites, chunk.ep_pending = chunk.ep_pending, None


def _site_sums(chunk, tau, nu):
    return chunk.weighted_gram(tau), np.asarray(chunk.design.T @ nu).ravel()


def _site_evidence(chunk, mean: np.ndarray, cov: np.ndarray, site_fit: str):
    tau, nu = chunk.ep_sites
    t_mean = np.asarray(chunk.design @ mean).ravel()
    t_var = row_variances(chunk.design, cov, chunk.max_bytes)
    return site_log_normalizers(chunk.link, t_mean, t_var, tau, nu, chunk.sample_weight, site_fit)
