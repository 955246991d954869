"""EP's sites kept in the row chunks of a posterior whose rows are on dask workers.

The sites ``(τ_i, ν_i)`` are per row: each chunk keeps its own, flattened as ``[τ; ν]``, on
the worker that holds its rows (:class:`~vsbayes.models.ChunkedPosterior`).
:class:`ChunkedSites` is the site store of EP's sweep loop
(:func:`~vsbayes.approximations._damped_sweeps.damped_sweeps`), whose stall, damping and
convergence rules are those of the in-memory EP. A sweep is one map over the chunks — from
the posterior's mean and covariance, each chunk updates its sites (EP's row-wise update,
given by the caller), damps them and returns ``Aᵀ diag(τ) A``, ``Aᵀ ν`` and its largest
change — and a sum of those small results here. Anderson's mixing needs the whole site
vector, so the sweeps here are plainly damped (more of them); and the chunks give no
marginals to tell a settled posterior, so stalled sweeps halve the damping (down to 1/64,
while halving helps), then EP gives up.

The loop says which sites become the current, the candidate or the best ones; those
moves are recorded here and done on the workers at the start of the next pass over the
chunks, costing no round trip of their own.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..models.latent import row_variances
from ._damped_sweeps import Anderson, damped_step, within_round_off
from ._glm_gaussian import GLMGaussian

__all__ = ["ChunkedSites", "RowSites"]


class RowSites(Protocol):
    """EP's row-wise math on the sites ``[τ; ν]`` of a block of rows (picklable: it
    travels to the workers). ``link``, ``weights``: the block's link and sample weights;
    ``t_mean``, ``t_var``: the posterior's marginals of its ``t_i = a_iᵀθ``."""

    def start(self, link: Any, t: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The sites EP starts from, given ``t`` at the posterior mode."""

    def update(self, link, t_mean, t_var, sites, weights) -> tuple[np.ndarray, float]:
        """The undamped new sites, and ``Σ_i copies_i log Z̃_i`` of ``sites`` (NaN if a
        cavity is improper; the chunks do not use it)."""

    def normalizers(self, link, t_mean, t_var, sites, weights) -> tuple[float, int]:
        """``Σ_i copies_i log Z̃_i`` and the number of improper cavities."""

    def round_off(self, t_mean, t_var, sites, weights) -> np.ndarray:
        """The round-off of the undamped update of ``sites``, site by site (see
        :meth:`~vsbayes.approximations._damped_sweeps.SiteStore.at_round_off`)."""


class ChunkedSites:
    """EP's sites in the row chunks of ``model``, a site store (see the module docstring).

    Parameters
    ----------
    model : ChunkedPosterior
        The posterior; its chunks keep the sites.
    rows : RowSites
        EP's row-wise math.
    start : ndarray of shape (p,)
        The posterior mode, where the sites start.
    """

    def __init__(self, model, rows: RowSites, start: np.ndarray):
        self._model, self._rows = model, rows
        # The moves the workers make at the next pass, in order (see _move).
        self._moves: list[str] = []
        sums = model.chunks.sum(_start_sites, rows, np.asarray(start, dtype=float))
        # Each set of sites is known here by its sums (Aᵀ diag(τ) A, Aᵀ ν).
        self._current = self._candidate = self._best = sums
        self._within_round_off = False

    def posterior(self) -> GLMGaussian:
        gram, linear = self._current
        precision = gram.copy()
        precision[np.diag_indices(self._model.dim)] += 1.0 / self._model.prior_var
        linear = linear + self._model.prior_mean / self._model.prior_var
        return GLMGaussian(
            self._model, precision=precision, linear=linear, what="EP posterior precision"
        )

    def sweep(self, post: GLMGaussian, damping: float) -> float:
        results = self._map(_sweep_sites, post.mean, post.cov, damping)
        gram, linear = results[0][0], results[0][1]
        for g, h, _, _ in results[1:]:
            gram, linear = gram + g, linear + h
        self._candidate = gram, linear
        self._within_round_off = all(r[3] for r in results)
        return max(r[2] for r in results)

    def at_round_off(self) -> bool:
        return self._within_round_off

    def keep_best(self) -> None:
        self._best = self._candidate
        self._moves.append("keep")

    def restore_best(self) -> None:
        self._candidate = self._best
        self._moves.append("restore")

    def advance(self, mixing: Anderson, change: float) -> bool:
        if mixing.memory:
            raise ValueError("Sites in row chunks are plainly damped: mix none (memory=0).")
        self.accept()
        return False

    def accept(self) -> None:
        self._current = self._candidate
        self._moves.append("accept")

    def best_and_next_marginals(self) -> None:
        return None

    def site_normalizers(self, post: GLMGaussian) -> tuple[float, int]:
        """``Σ_i copies_i log Z̃_i`` of the current sites over all chunks, and the number of
        improper cavities (the sum is then meaningless)."""
        moves, self._moves = self._moves, []
        total, improper = self._model.chunks.sum(
            _site_normalizers, self._rows, moves, post.mean, post.cov
        )
        return total, int(improper)

    def _map(self, function, *args) -> list:
        moves, self._moves = self._moves, []
        return self._model.chunks.map(function, self._rows, moves, *args)


# --- on the workers: each chunk's sites, kept in its posterior object ------------------


def _start_sites(chunk, rows: RowSites, theta: np.ndarray):
    """The sites EP starts from (current, candidate and best), and their sums. They are
    the sites of the chunk's informative rows (``chunk.ep_rows``): a constant row (all
    zeros, no intercept) keeps a site of zeros, never updated, and only its factor in the
    evidence (:func:`~vsbayes.approximations.expectation_propagation.with_constant_rows`)."""
    chunk.ep_constant = chunk.informative_rows()
    informative = chunk.ep_rows = chunk.ep_constant.model
    t = np.asarray(informative.design @ theta).ravel()
    chunk.ep_sites = rows.start(informative.link, t, informative.sample_weight)
    chunk.ep_candidate = chunk.ep_best = chunk.ep_sites
    return _site_sums(informative, chunk.ep_sites)


def _move(chunk, moves: list[str]) -> None:
    """The loop's moves since the last pass. No site array is changed in place, so a move
    is an assignment."""
    for move in moves:
        if move == "keep":
            chunk.ep_best = chunk.ep_candidate
        elif move == "restore":
            chunk.ep_candidate = chunk.ep_best
        else:  # "accept"
            chunk.ep_sites = chunk.ep_candidate


def _marginals(chunk, mean: np.ndarray, cov: np.ndarray):
    t_mean = np.asarray(chunk.design @ mean).ravel()
    return t_mean, row_variances(chunk.design, cov, chunk.max_bytes)


def _sweep_sites(chunk, rows: RowSites, moves, mean, cov, damping: float):
    """The damped sweep from the current sites, kept as the candidate: its sums, its
    largest relative change and whether it moved no site by more than its round-off."""
    _move(chunk, moves)
    sites, informative = chunk.ep_sites, chunk.ep_rows
    t_mean, t_var = _marginals(informative, mean, cov)
    weights = informative.sample_weight
    new, _ = rows.update(informative.link, t_mean, t_var, sites, weights)
    chunk.ep_candidate, _, _, change = damped_step(sites, new, damping)
    within = within_round_off(new, sites, rows.round_off(t_mean, t_var, sites, weights))
    return (*_site_sums(informative, chunk.ep_candidate), change, within)


def _site_sums(chunk, sites: np.ndarray):
    m = sites.size // 2
    return chunk.weighted_gram(sites[:m]), np.asarray(chunk.design.T @ sites[m:]).ravel()


def _site_normalizers(chunk, rows: RowSites, moves, mean, cov):
    _move(chunk, moves)
    informative = chunk.ep_rows
    total, improper = rows.normalizers(
        informative.link,
        *_marginals(informative, mean, cov),
        chunk.ep_sites,
        informative.sample_weight,
    )
    if chunk.ep_constant.constant.any():  # (their factors; else the same bits as before)
        total += chunk.ep_constant.log_likelihood
    return total, improper
