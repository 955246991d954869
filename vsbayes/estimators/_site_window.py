"""``partial_fit`` of one row, and the window of sites of a stream's last rows.

A mixin of :class:`~vsbayes.estimators._updating.BayesianUpdating` (the flow of
``partial_fit``, which calls these fits).

**One row** skips the general fit (``buffer_size`` ≤ 1, or where the window does not take
it; in the window, a new row's site is this update too, from its site of zeros, the
multinomial one in one pass where its site is of its cavity alone, else one pass of its
nodes' own moments on a kernel at its tilted mode, by the tilted moments at any cavity
width where this update takes VS fits for wide ones): prior × one factor differs from the
prior along the row only, so the posterior is a rank-one update of the prior by the row's
new latent marginal, O(p²). Laplace's comes from Newton's method in the row's latent (the
general solver's iterates, in the one dimension they move in), EP's from one tilted-moment
match (with one site EP's first update is its fixed point: assumed-density filtering),
VS's, IS's and BMC's from the same moments: they are the exact posterior's, which every VS
route and the sampling fits estimate. The multinomial row's likelihood sees its K − 1
contrasts only: EP, VS and IS take the multinomial EP's site of their (K − 1)-dimensional
tilted density (its tilted moments, or its VS fit where the row's cavity is wide) at EP's
fixed point (the general sweep's update of the one site, repeated until it settles),
Laplace Newton's method in the contrasts, each followed by a rank-(K − 1) update. VB's
(binary and one-vs-rest) is the Jaakkola–Jordan bound's optimum for the row: the bound of
one row is a Gaussian site in its latent, its optimal ξ the root of a scalar equation,
solved to round-off (the general fit's updates, on one row, iterate that equation and
converge slowly where the prior is vague along the row: thousands of updates under the
default intercept's N(0, 10⁶)); a window revisit re-optimizes a row's ξ under its cavity,
a coordinate ascent on the bound of the window's rows, whose fixed point is the batch VB
fit. The method's ``one_row`` says which; each is the general fit's posterior to its
tolerance (IS's and BMC's: to their sampling error; tests/test_updating.py). Small
batches favour the moments: Laplace's expansion of each batch at its own mode takes the
rows' curvature where the early estimates put them and accumulates too much precision
(docs/decisions.md, "Streaming by moments"), which its window corrects (below).

**The window.** A stream of one-row calls does not refit the buffer of batches (a fit of
W = ``buffer_size`` rows is many one-row updates' cost): each row's update is a Gaussian
site in its latent values — binary, its signed latent ``t = ±[x, 1]·θ``; multinomial, its
K − 1 contrasts ``Qᵀ(Θ x̃)`` (the multinomial EP's sites, binary the K = 2 case) — and the
window (:class:`SiteWindow`) keeps the last W rows with their sites; each call refits the
sites of ``REVISITS`` (4) rows of the window, those visited longest ago, under the
posterior without them (EP's update for EP and VS: binary, the tilted moments;
multinomial, the multinomial EP's site update, its tilted moments; for Laplace, the mode
and curvature of the same tilted density: Laplace propagation, whose fixed point is the
joint Laplace approximation; for VB, the bound's site at the row's optimal ξ under the
cavity), all in one step from the posterior before the row (multinomial: one Woodbury
update of rank (K − 1)(1 + REVISITS); the math: :mod:`vsbayes.approximations.window_sites`).
That is incremental EP over a sliding window: each row's site is refitted about 4 times
while in the window, once just before it leaves, under a cavity holding the W − 1 rows
after it; its cost is a few rank-(K − 1) updates, O(p² K), bounded whatever the stream.
The window starts at a stream's first row, the multinomial too: a multinomial row whose
cavity is wide (the first rows under a vague prior) takes the tilted moments' finer rule
levels, and where the factor narrows its cavity much or its tilted mass is deep in a wide
cavity's tail, the moments of the nodes on the mixture of its cavity and a kernel near its
tilted density (its posterior marginal; for a new row its Stein tilted Gaussian where
proper, else, and for a row in the tail, the tilted density's Laplace approximation), in
the same call. Forgetting (``decay``) scales the window's sites as the rest of the
posterior, and a revisit fits the row's likelihood to the power ``decay**k`` (power EP).
A larger batch freezes the window (its sites stay in the posterior) and starts the buffer
of batches, but for Laplace's and VB's binary and one-vs-rest streams, whose batches join
the window (below).

**Laplace's window.** A Laplace site is the Taylor expansion of the row's log-likelihood
at a mode: batch Laplace expands every row at the final mode, a stream where the mode was
when the row's site was last fitted. On nearly separated data the mode moves outward as
rows come, the rows' curvature falls, and a site frozen early carries too much precision
and pulls the coefficients back (breast cancer in batches of 100: KL 1.38 nats from the
batch fit, held-out log loss 5 % above its). So a Laplace batch of several rows (binary,
one-vs-rest) is fitted jointly with the window's rows under the posterior without their
sites (its frozen part: the prior and the sites of the rows that left), each row's site
then its expansion at the joint mode (the general fit, on W + n rows); and the rows that
leave the window, by one-row calls and batches alike, are not the oldest but those whose
sites are closest to their likelihood where the posterior may still move:
:func:`~vsbayes.approximations.window_sites.taylor_errors`, ``E|s log F(t) − q(t)|`` over
the row's latent marginal, ``q`` the expansion at its mean. A row far on its side (its
curvature died out) or pinned down by the posterior leaves; a row whose curvature a later
mode would change stays and is refitted (a one-row call's rows as of their last visit: the
new row's and the four revisited rows' errors are computed, the others kept). While every
row is in the window, the stream is the batch Laplace fit (its evidence too: a call's
evidence replaces the window rows' terms of the running evidence by the joint fit's; after
one-row calls, which credit ADF's terms, it starts from the frozen part's evidence as the
window recorded it, ``SiteWindow.frozen_evidence``, D-150).

**VB's window.** A Jaakkola–Jordan site is the bound at the row's ξ, tight at t = ±ξ, and
batch VB takes every row's ξ where the final posterior puts it (ξ² = E[t²]); a stream
froze each batch's ξ where the earlier batches' posterior put its rows, and the bound's
curvature 2λ(ξ) ≈ 1/|t| far from the boundary does not die out as the likelihood's does,
so every frozen site is off once the posterior moves (breast cancer's first ten features
in weighted batches of 100: coefficients 0.38 from the batch fit's, against 0.02-0.07 for
the other methods). So a VB batch of several rows (binary, one-vs-rest) is fitted as
Laplace's: jointly with the window's rows under the frozen part (the general VB fit, every
ξ re-optimized), each row's site then the bound at its ξ of the joint fit (whose
posterior is exactly the frozen part times those sites), and the rows that leave, by
one-row calls and batches alike, are those whose bound is closest to their likelihood
over the posterior (:func:`~vsbayes.approximations.window_sites.bound_gaps`). While every
row is in the window, the stream is the batch VB fit, its evidence (the bound) too; the
rows that left keep their last ξ, which no later batch can revise without them: the
floor of a stream whose memory does not grow (docs/decisions.md, D-238).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.sparse as sp

from .._memory import check_memory
from ..approximations._softmax_latent_modes import softmax_row_laplace
from ..approximations.expectation_propagation import EPResult, assumed_density_row
from ..approximations.newton_laplace import row_laplace
from ..approximations.softmax_ep import assumed_density_softmax_row
from ..approximations.variational_bayes import (
    VBResult,
    bound_curvature,
    jaakkola_jordan_latent,
    jaakkola_jordan_row,
)
from ..approximations.window_sites import (
    bound_gaps,
    contrast_basis,
    frozen_part,
    revisit_sites,
    revisit_softmax_sites,
    row_mode_result,
    softmax_design,
    softmax_row_mode_result,
    taylor_errors,
)
from ..exceptions import EstimationError, NotPositiveDefiniteError
from ..models.links import get_link
from ._methods import SOFTMAX_EP_MIN_TOL, MethodFit

__all__ = [
    "ONE_ROW_REASON",
    "ONE_SOFTMAX_ROW_REASON",
    "REVISITS",
    "WINDOW_ROW_REASON",
    "SiteWindow",
    "SiteWindowUpdates",
]

#: The route a one-row update records (``strategy_reason_``) where the method records one.
ONE_ROW_REASON = (
    "one row: its posterior's moments are those of its one-dimensional tilted density, "
    "computed to round-off (assumed-density filtering), which every route aims at"
)
#: The same for one row of a stream, whose update also revisits earlier rows' sites.
WINDOW_ROW_REASON = (
    "one row of a stream: its tilted density's moments and those of the earlier rows it "
    "revisits, each under the posterior without its site (expectation propagation's "
    "update, as assumed-density filtering with revisits)"
)
#: The same for one multinomial row, whose tilted density has K − 1 dimensions.
ONE_SOFTMAX_ROW_REASON = (
    "one row: its posterior's moments are those of its (K - 1)-dimensional tilted "
    "density at expectation propagation's fixed point (assumed-density filtering)"
)

#: Sites of a one-row stream's window revisited per call (the ones visited longest ago).
REVISITS = 4


@dataclasses.dataclass(frozen=True)
class SiteWindow:
    """The last ``buffer_size`` rows of a stream of one-row calls and their sites, as
    they stand in the posterior (forgetting included): each row's Gaussian factor in its
    r latent values, ``exp(νᵀt − tᵀτt / 2)`` — binary (r = 1, per problem): in its signed
    latent ``t = ±[x, 1]·θ``, τ and ν scalars; multinomial (one problem): in its K − 1
    contrasts ``t = Qᵀ(Θ x̃)``, τ of r × r. Frozen: a call that fails leaves the
    estimator's as it was."""

    rows: np.ndarray  #: (n, w): binary, the rows with the intercept's 1; else the features
    labels: np.ndarray  #: (problems, n): binary, each row's ±1 label per problem; else its class
    powers: np.ndarray  #: (n,): each row's weight × decay**(rows after it)
    tau: np.ndarray  #: (problems, n) binary; (1, n, r, r) multinomial
    nu: np.ndarray  #: (problems, n) binary; (1, n, r) multinomial
    visited: np.ndarray  #: (n,): the call that last fitted each row's site
    calls: int = 0  #: one-row calls so far
    #: Laplace's (n,): each row's :func:`~vsbayes.approximations.window_sites.taylor_errors`
    #: (VB's: ``bound_gaps``), summed over the problems, under the posterior of the call
    #: that last fitted its site; None for the other methods.
    errors: np.ndarray | None = None
    #: The running evidence less the window rows' terms: that of the frozen part (the
    #: prior and the sites of the rows that left), recorded when the window began or at
    #: the last batch call; None once the frozen part changed (a row left, forgetting).
    #: Per problem (a float for one problem).
    frozen_evidence: np.ndarray | float | None = None
    #: Whether one-row calls credited the running evidence since ``frozen_evidence`` was
    #: recorded. They credit each row ADF's evidence, not its share of the window's
    #: Laplace evidence under the frozen part, so a batch call then starts from
    #: ``frozen_evidence`` (a batch call that refits every row is the batch fit, evidence
    #: included); otherwise from the running evidence less that Laplace evidence, as
    #: found from the frozen part at the call (which follows the frozen part's round-off).
    credited: bool = False

    @property
    def n_rows(self) -> int:
        return self.rows.shape[0]

    @classmethod
    def empty(cls, width: int, n_problems: int, r: int | None = None) -> SiteWindow:
        """No rows yet, of ``width`` columns; sites of ``r`` dimensions (None: binary)."""
        site = () if r is None else (r,)
        return cls(
            np.empty((0, width)),
            np.empty((n_problems, 0), dtype=float if r is None else np.intp),
            np.empty(0),
            np.empty((n_problems, 0, *site, *site)),
            np.empty((n_problems, 0, *site)),
            np.empty(0, dtype=np.int64),
        )

    def fits(self, width: int, r: int | None) -> bool:
        """Whether this window's rows and sites have this shape (else a new one starts)."""
        return self.rows.shape[1] == width and self.nu.ndim == (2 if r is None else 3)

    def forgotten(self, keep: float) -> SiteWindow:
        """Forgetting scales every factor of the posterior, the sites' too (and the
        frozen part's evidence is no longer the running evidence's part)."""
        if keep == 1.0:
            return self
        errors = None if self.errors is None else keep * self.errors  # (as the powers)
        return dataclasses.replace(
            self,
            powers=keep * self.powers,
            tau=keep * self.tau,
            nu=keep * self.nu,
            errors=errors,
            frozen_evidence=None,
        )

    def least_recent(self, count: int) -> np.ndarray:
        """The ``count`` rows visited longest ago (the older first among equals)."""
        order = np.argsort(self.visited, kind="stable")
        return np.sort(order[:count])

    def stepped(
        self, chosen, revised, row, labels, weight: float, site, size: int, errors=None
    ) -> SiteWindow:
        """This window after a call: the ``chosen`` rows' sites ``revised`` = (τ, ν) (per
        problem, in ``chosen``'s order), then the new row (its site ``site[0]`` = τ,
        ``site[1]`` = ν per problem) appended and, beyond ``size`` rows, the oldest
        dropped: its site stays in the posterior as it is (revised, if it was chosen).
        With ``errors`` (Laplace: each row's, these rows' and the new one last), the row
        of the smallest leaves instead, the new row taking its place. Each array built
        once (a one-row call's fixed cost is mostly such small steps). The call credited
        a row (``credited``); a row that leaves changes the frozen part, whose evidence
        is then no longer known (``frozen_evidence`` None)."""
        if errors is not None:
            return self._replaced(chosen, revised, row, labels, weight, site, size, errors)
        start = max(self.n_rows + 1 - size, 0)
        calls = self.calls + 1
        tau = np.concatenate([self.tau[:, start:], site[0][:, None]], axis=1)
        nu = np.concatenate([self.nu[:, start:], site[1][:, None]], axis=1)
        visited = np.append(self.visited[start:], calls)
        kept = chosen >= start  # (a dropped row's revision is in the posterior only)
        at = chosen[kept] - start
        tau[:, at], nu[:, at], visited[at] = revised[0][:, kept], revised[1][:, kept], calls
        return SiteWindow(
            np.concatenate([self.rows[start:], row[None, :]]),
            np.concatenate([self.labels[:, start:], labels[:, None]], axis=1),
            np.append(self.powers[start:], weight),
            tau,
            nu,
            visited,
            calls,
            frozen_evidence=self.frozen_evidence if start == 0 else None,
            credited=True,
        )

    def _replaced(self, chosen, revised, row, labels, weight, site, size, errors) -> SiteWindow:
        """:meth:`stepped` of a Laplace or VB window: below ``size`` rows the new row appended;
        at ``size``, the row of the smallest of ``errors`` leaves, the new row (unless it
        is that row) taking its place (the rows' order is not their arrival's: the
        revisits go by ``visited``)."""
        calls = self.calls + 1
        n = self.n_rows
        if n + 1 <= size:
            grown = self.stepped(chosen, revised, row, labels, weight, site, size)
            return dataclasses.replace(grown, errors=np.asarray(errors, dtype=float))
        tau, nu, visited = self.tau.copy(), self.nu.copy(), self.visited.copy()
        tau[:, chosen], nu[:, chosen], visited[chosen] = revised[0], revised[1], calls
        drop = int(np.argmin(errors))
        rows, kept_labels, powers = self.rows, self.labels, self.powers
        kept_errors = np.array(errors[:n], dtype=float)
        if drop < n:  # (else the new row leaves at once: its site stays in the posterior)
            rows, kept_labels, powers = rows.copy(), kept_labels.copy(), powers.copy()
            rows[drop], kept_labels[:, drop], powers[drop] = row, labels, weight
            tau[:, drop], nu[:, drop], visited[drop] = site[0], site[1], calls
            kept_errors[drop] = errors[n]
        # (a row left: the frozen part changed)
        return SiteWindow(
            rows, kept_labels, powers, tau, nu, visited, calls, kept_errors, None, True
        )


class SiteWindowUpdates:
    """``partial_fit``'s one-row updates and window fits (see the module docstring)."""

    def _one_row_rule(self) -> str | None:
        """How a one-row batch updates the prior directly: the method's ``one_row``
        ("mode", "moments", "bound") or None (the general fit)."""
        return self._posterior_method.one_row

    def _one_row_fits(self, X, problems, weights, carried) -> list[MethodFit] | None:
        """The fits of a batch of one row by the direct update of each problem's prior
        (see the module docstring), or None where the general fit is needed: more rows,
        ``max_iter=0``, a method without a direct rule,
        a weight above 1 for the moments (power EP's copies), or a direct update that did
        not converge or failed (the general fit then warns or falls back as it does)."""
        rule = self._one_row_rule()
        if X.shape[0] != 1 or rule is None or self.max_iter == 0:
            return None
        weight = float(weights[0])
        if rule == "moments" and weight > 1.0:
            return None
        row = X.toarray()[0] if sp.issparse(X) else X[0]
        n_classes = problems[0][1]
        if n_classes is not None:
            return self._one_softmax_row(row, problems[0][0], n_classes, weight, rule, carried)
        row = self._binary_row(row)
        if rule != "bound" and not row.any():
            # An all-zero row (no intercept) has no latent variance for the direct
            # updates to divide by; its factor is constant, which the general fit takes.
            return None
        link = get_link(self._link)
        fits = []
        for (labels, _), prior in zip(problems, carried, strict=True):
            signed = labels[0] * row
            # An updated covariance that round-off left indefinite (a vague prior against
            # a decisive row) goes to the general fit too, which says what to change.
            if rule == "bound":  # (at the optimum: it cannot fail to converge)
                posterior = jaakkola_jordan_row(prior.mean, prior.cov, prior.lower, signed, weight)
                fits.append(MethodFit(posterior, posterior.n_iter))
                continue
            try:
                if rule == "mode":
                    posterior = row_laplace(
                        prior.mean,
                        prior.cov,
                        prior.lower,
                        signed,
                        weight,
                        link,
                        tol=self.tol,
                        max_iter=self.max_iter,
                    )
                else:
                    posterior = assumed_density_row(
                        prior.mean, prior.cov, prior.lower, signed, weight, link
                    )
            except (EstimationError, NotPositiveDefiniteError):
                return None
            if rule == "mode":
                if not posterior.converged:
                    return None
                fits.append(MethodFit(posterior, posterior.n_iter))
                continue
            fits.append(self._row_fit(posterior, ONE_ROW_REASON))
        self._report(fits)
        return fits

    def _binary_row(self, row: np.ndarray) -> np.ndarray:
        """A binary one-row call's row with the intercept's 1, once the updated posterior's
        memory is known to fit."""
        if self.fit_intercept:
            row = np.append(row, 1.0)
        p = row.size
        check_memory(
            8.0 * 3 * p * p,
            f"the updated posterior of {p} coefficients (three {p} × {p} matrices)",
            "Use fewer features: the posterior's memory grows with their square.",
        )
        return row

    def _row_fit(self, posterior, reason: str, n_iter: int = 1) -> MethodFit:
        """A one-row call's fit, with its route where the method records one."""
        route = {"strategy": "sites", "reason": reason}
        records = self._posterior_method.records_strategy
        return MethodFit(posterior, n_iter, **(route if records else {}))

    def _report(self, fits) -> None:
        if self.verbose:
            for fit in fits:
                print(f"{type(self).__name__}: {fit.posterior!r}")

    def _window_row_fits(self, X, problems, weights, carried, window, keep, evidence):
        """``(fits, window)`` of a one-row call in a stream (``buffer_size`` > 1): the
        row's site joins the window of the last ``buffer_size`` rows' sites and the
        ``REVISITS`` of them visited longest ago are refitted, all from the ``carried``
        prior, in one step (see the module docstring; multinomial:
        :meth:`_window_softmax_row_fits`); or ``(None, None)`` where the general fit (or,
        multinomial, the row's own update) is needed (as :meth:`_one_row_fits`).
        ``evidence``: the running evidence before the call (a new window's frozen part's)."""
        rule = self._one_row_rule()
        weight = float(weights[0])
        if rule is None or self.max_iter == 0 or (rule == "moments" and weight > 1.0):
            return None, None
        row = X.toarray()[0] if sp.issparse(X) else np.asarray(X[0])
        n_classes = problems[0][1]
        if n_classes is not None:
            if not (self.fit_intercept or row.any()):
                # An all-zero row without intercepts: its contrasts have variance 0 (no
                # cavity to update a site from) and its factor K^(−s) is constant, which
                # the general fit takes (as a binary one's, whose update is not usable).
                return None, None
            label = int(problems[0][0][0])
            return self._window_softmax_row_fits(
                row, label, n_classes, weight, rule, carried[0], window, keep
            )
        row = self._binary_row(row)
        p = row.size
        if window is None or not window.fits(p, None):
            window = dataclasses.replace(
                SiteWindow.empty(p, len(problems)), frozen_evidence=evidence
            )
        window = window.forgotten(keep)
        chosen = window.least_recent(REVISITS)
        signs = np.array([labels[0] for labels, _ in problems])
        link = get_link(self._link)
        revised_tau = np.empty((len(problems), chosen.size))
        revised_nu = np.empty((len(problems), chosen.size))
        new_sites = np.zeros((2, len(problems)))
        fits = []
        for j, prior in enumerate(carried):
            # The new row (its site zero: its cavity is the carried prior) and the revisited
            # ones, in one step from the carried prior.
            signed = signs[j] * row
            rows = window.labels[j, chosen, None] * window.rows[chosen]
            mean, cov, new_tau, new_nu, log_z = revisit_sites(
                prior.mean,
                prior.cov,
                np.concatenate([signed[None, :], rows]),
                np.concatenate([[0.0], window.tau[j, chosen]]),
                np.concatenate([[0.0], window.nu[j, chosen]]),
                np.concatenate([[weight], window.powers[chosen]]),
                link,
                rule,
            )
            if not np.isfinite(log_z[0]):
                return None, None  # the row's own update was not usable: the general fit
            new_sites[:, j] = new_tau[0], new_nu[0]
            revised_tau[j], revised_nu[j] = new_tau[1:], new_nu[1:]
            if rule == "mode":
                posterior = row_mode_result(
                    mean, cov, prior, signed, weight, new_sites[:, j], log_z[0], link
                )
            elif rule == "bound":  # the row's ξ, under the carried prior (its cavity)
                spread = prior.lower.T @ signed
                xi = jaakkola_jordan_latent(float(signed @ prior.mean), spread @ spread, weight)[3]
                posterior = VBResult(mean, cov, log_z[0], n_iter=1, converged=True, xi=np.r_[xi])
            else:
                posterior = EPResult(mean, cov, log_z[0], n_iter=1, converged=True, site_change=0.0)
            fits.append(self._row_fit(posterior, WINDOW_ROW_REASON))
        self._report(fits)
        errors = None
        if rule in ("mode", "bound"):
            # Laplace's sites are expansions at a mode, VB's the bound at a ξ: the row
            # leaving a full window is the one whose site is closest to its likelihood
            # over the posterior (taylor_errors, bound_gaps), each row's as of its last
            # visit: this call's rows', and every row's where the window has none yet (a
            # window begun by other calls).
            fresh = chosen if window.errors is not None else np.arange(window.n_rows)
            rows = np.concatenate([window.rows[fresh], row[None, :]])
            powers = np.append(window.powers[fresh], weight)
            computed = np.zeros(rows.shape[0])
            for j, fit in enumerate(fits):
                signed = np.append(window.labels[j, fresh], signs[j])[:, None] * rows
                mean, cov = fit.posterior.mean, fit.posterior.cov
                if rule == "mode":
                    computed += taylor_errors(signed, powers, mean, cov, link)
                else:
                    computed += bound_gaps(signed, powers, mean, cov)
            errors = np.empty(window.n_rows + 1)
            if window.errors is not None:
                errors[: window.n_rows] = window.errors
            errors[fresh], errors[-1] = computed[:-1], computed[-1]
        window = window.stepped(
            chosen,
            (revised_tau, revised_nu),
            row,
            signs,
            weight,
            new_sites,
            int(self.buffer_size),
            errors,
        )
        return fits, window

    def _window_batch_fits(
        self, method, X, problems, weights, carried, window, keep, rng, evidence
    ):
        """``(fits, window, frozen_evidence)`` of a Laplace or VB batch of several rows in
        a binary (or one-vs-rest) stream: the joint fit of the window's rows and the batch
        under the posterior without the window's sites (its frozen part), each row's site
        then its Taylor expansion at the joint mode (VB: the bound at its ξ of the joint
        fit), and the window keeping the ``buffer_size`` rows whose sites are the least
        accurate (``taylor_errors``, ``bound_gaps``); the others' sites stay in the
        posterior, expanded where the joint mode is now (at the joint fit's ξ).
        ``frozen_evidence``: the running evidence ``evidence`` (before the call) without
        the window's rows' terms, to which the joint fit's evidence is added: the
        window's record of it where one-row calls credited rows since and the frozen part
        is unchanged (``SiteWindow.credited``), else ``evidence`` less each problem's
        Laplace evidence (VB: bound) of the window's rows under the frozen part."""
        size = int(self.buffer_size)
        p = X.shape[1] + int(self.fit_intercept)
        if window is None or not window.fits(p, None) or window.labels.shape[0] != len(problems):
            window = SiteWindow.empty(p, len(problems))
        check_memory(  # (before a sparse batch is made dense)
            8.0 * (window.n_rows + X.shape[0]) * p * 3,
            f"the window's {window.n_rows} rows and this batch's {X.shape[0]}, "
            f"dense, with their latent moments",
            "Pass the stream in smaller batches, or lower buffer_size.",
        )
        window = window.forgotten(keep)
        rows = X.toarray() if sp.issparse(X) else np.asarray(X)
        if self.fit_intercept:
            rows = np.column_stack([rows, np.ones(rows.shape[0])])
        link = get_link(self._link)
        rule = self._one_row_rule()
        try:
            parts = [
                frozen_part(
                    prior,
                    window.labels[j][:, None] * window.rows,
                    window.tau[j],
                    window.nu[j],
                    window.powers,
                    link,
                    rule,
                )
                for j, prior in enumerate(carried)
            ]
        except ValueError:
            # Round-off left a frozen part indefinite (a decisive site against a narrow
            # posterior): the window's sites stay in the posterior as they are, and the
            # batch is filtered on its own.
            window = SiteWindow.empty(p, len(problems))
            parts = [(prior, 0.0) for prior in carried]
        if window.credited and window.frozen_evidence is not None:
            frozen_evidence = window.frozen_evidence
        else:
            terms = np.array([evidence for _, evidence in parts])
            frozen_evidence = evidence - (terms[0] if len(problems) == 1 else terms)
        joined = np.concatenate([window.rows, rows])
        design = joined[:, :-1] if self.fit_intercept else joined
        powers = np.concatenate([window.powers, weights])
        fits, all_signs, tau, nu = [], [], [], []
        errors = np.zeros(joined.shape[0])
        with self._problems_alike(len(problems)) as alike:  # (D-248)
            for j, ((labels, _), (frozen, _)) in enumerate(zip(problems, parts, strict=True)):
                signs = np.concatenate([window.labels[j], labels])
                with alike():
                    fit = self._fit_problem(
                        method,
                        design,
                        signs,
                        None,
                        powers,
                        rng,
                        None,
                        None,
                        frozen,
                        n_problems=len(problems),
                    )
                posterior = fit.posterior
                signed = signs[:, None] * joined
                if rule == "bound":
                    site_tau, errors_j = self._bound_sites(fit, frozen, signed, powers)
                    tau.append(site_tau)
                    nu.append(0.5 * powers)  # (the bound's linear term, whatever ξ)
                    errors += errors_j
                    fits.append(fit)
                    all_signs.append(signs)
                    continue
                latent = signed @ posterior.mean
                slope, curvature = link.derivatives(latent)
                tau.append(powers * curvature)
                nu.append(tau[-1] * latent + powers * slope)
                # Newton stops at an iterate m whose gradient g is within tol of zero, and
                # N(m, H⁻¹) is the frozen part times the sites expanded at m but for g: the
                # product's mean is m + H⁻¹g. The next call divides the sites out of the
                # posterior, so g would stay in the frozen part, one more each call (a stream
                # of 2-row batches at tol=1e-4 drifted 0.3 in the posterior's own norm from
                # the same stream at round-off, √(2 tol) = 0.014 for one fit). The posterior
                # kept is that product: Newton's final step, exactly what the sites say.
                gradient = signed.T @ (powers * slope) - frozen.precision @ (
                    posterior.mean - frozen.mean
                )
                fit = dataclasses.replace(
                    fit,
                    posterior=posterior.with_moments(
                        posterior.mean + posterior.cov @ gradient, posterior.cov
                    ),
                )
                posterior = fit.posterior
                errors += taylor_errors(signed, powers, posterior.mean, posterior.cov, link)
                fits.append(fit)
                all_signs.append(signs)
        # The rows with the largest errors stay (among equals, the later ones).
        kept = np.sort(np.argsort(errors, kind="stable")[max(joined.shape[0] - size, 0) :])
        calls = window.calls + 1
        window = SiteWindow(
            joined[kept],
            np.array(all_signs)[:, kept],
            powers[kept],
            np.array(tau)[:, kept],
            np.array(nu)[:, kept],
            np.full(kept.size, calls, dtype=np.int64),
            calls,
            errors[kept],
            # (the frozen part's as long as no row left it; forgetting: see forgotten)
            frozen_evidence if kept.size == joined.shape[0] and keep == 1.0 else None,
        )
        return fits, window, frozen_evidence

    @staticmethod
    def _bound_sites(fit, frozen, signed, powers):
        """``(tau, gaps)`` of a VB window's joint fit: each row's site precision
        ``2 s λ(ξ)`` at the ξ of the fit's last update, whose posterior is the frozen part
        times those sites exactly (so the next call divides them out exactly), and its
        :func:`bound_gaps` under that posterior. A fit that fell back to Laplace's
        posterior has no ξ: its rows take the ξ its marginals give (ξ² = m² + v)."""
        posterior = fit.posterior
        xi = getattr(posterior, "xi", None)
        positive = powers > 0.0  # (the model's rows: those of zero weight have no site)
        if xi is None or xi.size != np.count_nonzero(positive):
            latent = signed @ posterior.mean
            spread = np.einsum("ij,ij->i", signed @ posterior.cov, signed)
            xi = np.sqrt(np.maximum(spread, 0.0) + latent * latent)
        else:
            placed = np.zeros(powers.size)
            placed[positive] = xi
            xi = placed
        gaps = bound_gaps(signed, powers, posterior.mean, posterior.cov)
        return 2.0 * powers * bound_curvature(xi), gaps

    def _window_softmax_row_fits(self, row, label, n_classes, weight, rule, prior, window, keep):
        """:meth:`_window_row_fits` of a multinomial row: its (K − 1)-dimensional site and
        those of the ``REVISITS`` rows of the window visited longest ago, by the
        multinomial EP's site update (moments) or Laplace propagation in the contrasts
        (mode), all from the ``carried`` prior, then one rank-(K − 1)(1 + REVISITS)
        update of it (:func:`revisit_softmax_sites`)."""
        p = prior.dim
        check_memory(
            8.0 * 3 * p * p,
            f"the updated posterior of {p} coefficients (three {p} × {p} matrices)",
            "Use fewer features: the posterior's memory grows with their square.",
        )
        r = n_classes - 1
        if window is None or not window.fits(row.size, r):
            window = SiteWindow.empty(row.size, 1, r)
        window = window.forgotten(keep)
        chosen = window.least_recent(REVISITS)
        q = contrast_basis(n_classes)
        revised = revisit_softmax_sites(
            prior.mean,
            prior.cov,
            softmax_design(np.vstack([row, window.rows[chosen]]), q, self.fit_intercept),
            np.concatenate([[label], window.labels[0, chosen]]),
            np.concatenate([np.zeros((1, r, r)), window.tau[0, chosen]]),
            np.concatenate([np.zeros((1, r)), window.nu[0, chosen]]),
            np.concatenate([[weight], window.powers[chosen]]),
            q,
            rule,
            lambda: assumed_density_softmax_row(
                prior.mean,
                prior.cov,
                row,
                label,
                n_classes,
                weight,
                fit_intercept=self.fit_intercept,
                tol=max(1e-2 * self.tol, SOFTMAX_EP_MIN_TOL),  # the general EP's
            ),
            self.tol,
        )
        if revised is None:
            return None, None  # the row's own update was not usable
        mean, cov, tau, nu, log_z, modes = revised
        try:  # (the covariance's factorization: its round-off checked)
            if rule == "mode":
                norm = math.sqrt(float(row @ row) + float(self.fit_intercept))
                posterior = softmax_row_mode_result(mean, cov, prior, modes, log_z, norm)
            else:
                posterior = EPResult(mean, cov, log_z, n_iter=1, converged=True, site_change=0.0)
        except NotPositiveDefiniteError:
            return None, None
        fits = [self._row_fit(posterior, WINDOW_ROW_REASON)]
        self._report(fits)
        window = window.stepped(
            chosen,
            (tau[None, 1:], nu[None, 1:]),
            row,
            np.array([label]),
            weight,
            (tau[:1], nu[:1]),
            int(self.buffer_size),
        )
        return fits, window

    def _one_softmax_row(self, row, label, n_classes, weight, rule, carried):
        """The multinomial one-row fit, a rank-(K − 1) update of the prior: by moments (the
        multinomial EP's site of the row's (K − 1)-dimensional tilted density, tilted
        moments or VS fit as its sweeps would take, at EP's fixed point) or by the mode
        (Newton's method in the row's contrasts); or None where the general fit is needed:
        a fit that failed or did not converge."""
        prior = carried[0]
        p = prior.dim
        check_memory(
            8.0 * 3 * p * p,
            f"the updated posterior of {p} coefficients (three {p} × {p} matrices)",
            "Use fewer features: the posterior's memory grows with their square.",
        )
        if rule == "mode":
            try:
                laplace = softmax_row_laplace(
                    prior.mean,
                    prior.cov,
                    prior.lower,
                    row,
                    int(label[0]),
                    n_classes,
                    weight,
                    fit_intercept=self.fit_intercept,
                    tol=self.tol,
                    max_iter=self.max_iter,
                )
            except NotPositiveDefiniteError:
                return None
            return [MethodFit(laplace, laplace.n_iter)] if laplace.converged else None
        try:
            posterior = assumed_density_softmax_row(
                prior.mean,
                prior.cov,
                row,
                int(label[0]),
                n_classes,
                weight,
                fit_intercept=self.fit_intercept,
                tol=max(1e-2 * self.tol, SOFTMAX_EP_MIN_TOL),  # the general EP's
            )
        except (EstimationError, NotPositiveDefiniteError):
            return None
        fits = [self._row_fit(posterior, ONE_SOFTMAX_ROW_REASON, posterior.n_iter)]
        self._report(fits)
        return fits
