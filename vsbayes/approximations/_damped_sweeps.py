"""The sweep loop of expectation propagation: damped parallel updates, Anderson-mixed.

EP's sites are a fixed point of the map "sites → posterior → new sites". The sweeps damp
that map and mix the last few with Anderson's acceleration (Walker & Ni 2011). The binary
and the multinomial EP share this loop, and differ only in the map, the posterior and the
projection of an extrapolation back to valid sites; all of these come with the *site
store* that holds the sites (:class:`SiteStore`): one array in this process
(:class:`ArraySites`), or the row chunks of dask workers
(:class:`~vsbayes.approximations.chunked_ep.ChunkedSites`, plainly damped). The rules
below are the same wherever the sites are (:func:`damped_sweeps`).

Where the sweeps do not converge (e.g. weights spanning 1e-4 to 1e3), mixing can wander
off: after ``_STALL`` sweeps without a new smallest change (at once where a sweep's change
is ``_DIVERGED`` times the smallest, above the floor, where diverged sweeps cost more than
others: the multinomial EP's), the plain damped sweeps go on
alone from the best of them; once they have cut the change tenfold, mixing resumes (once:
the plain sweeps converge linearly, often slowly). If the plain sweeps stall too, they may
oscillate: the damping halves (down to ``_MIN_DAMPING``), again from the best sites, as
long as halving takes the sweeps closer to a fixed point (else they drift or crawl, which
no smaller damping mends: :func:`_halving_helps`). Progress is measured undamped: halving
the damping halves the change by itself. A halving that does not help after one that did
finds sweeps that crawl: the oscillation is damped, and what is left is a slow mode, which
a smaller damping slows further (a one-sided posterior: one class's rows under a vague
intercept prior, whose fixed point lies hundreds of prior-scaled units from the Laplace
sites the sweeps start from, where the mixed sweeps' transients set records that a crawl
beats only after dozens of sweeps). The sweeps then go back to the damping that helped,
once, and go on from where they are as long as they make a new least change of their own
every ``_STALL`` sweeps. Stalled
sweeps may be near a fixed point they cannot approach further — their map's own noise
(the site fits' precision, amplified by wide latent marginals) is above ``tol``: measured
on digits' multinomial EP at C = 10, a floor of 1e-4, at C = 1000 of 4e-3. At every stall,
sites that close to a fixed point whose posterior has settled are kept with a warning (less
damping would not move them further), and so are sites whose posterior one sweep moves by
a thousandth of its move from the start, where the sweeps measure that (given a
divergence of posteriors); sweeps that are not give up at the smallest damping, or at the first
halving that did not help.

Two signs end stalled sweeps sooner. At a noise floor, new smallest changes keep coming,
each a record of the noise a few percent below the last, and each restarted the count of
``_STALL`` sweeps: near the floor, sweeps that have not halved their change in ``_STALL``
sweeps, nor made a new smallest one in the last half of them, are tested for a settled
posterior too (slow convergence makes a new smallest change every sweep or two). And
once a stall has made the sweeps plain, a damped step that grows the change faster than
any damping down to ``_MIN_DAMPING`` could contract (:func:`_grows_past_damping`)
raises at once: halving would wait for the next jump (with weights 1e3 and 1e-4, a
heavy row's tilted density meeting its cavity's tail again, after a geometric decrease
of the change).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from .._blas import block_slices, map_blocks
from .._progress import stage
from .._warnings import warn
from ..exceptions import ConvergenceWarning, EstimationError, NotPositiveDefiniteError

__all__ = [
    "Anderson",
    "ArraySites",
    "SiteStore",
    "SweepResult",
    "damped_step",
    "damped_sweeps",
    "relative_change",
    "within_round_off",
]

# Sweeps without progress after which Anderson's mixing is switched off, and then after
# which the damping is halved, down to _MIN_DAMPING (while halving helps: _halving_helps).
_STALL = 10
_MIN_DAMPING = 1.0 / 64
# Near the floor, a change at most this fraction of the one at the last progress is
# progress; _STALL sweeps without any, the last _STALL // 2 without a new smallest change,
# are tested as a stall is (the module's docstring).
_PROGRESS = 0.5
# The least growth of the change over one plain damped step that is taken as a mode no
# damping contracts (_grows_past_damping).
_JUMP = 10.0
# Sweeps whose undamped change exceeds the best one's this many times diverge: they are
# remedied as a stall at once (_sweeps). Converging sweeps' transients stay far below it
# (mixed or damped, 2-4-fold over the best on blobs at C = 10⁴, 25-fold on digits' EP at
# damping 0.3, which then converged).
_DIVERGED = 100.0
# Stalled sweeps whose best undamped change is below this are accepted (see _floor), if
# their posterior has settled: an undamped sweep moves none of its marginals by more than
# _SETTLED nats of KL divergence (_settled) — a mean by 1 % of its standard deviation, or
# a variance by 1.4 %, far below EP's own error.
_FLOOR = 1e-3
_SETTLED = 5e-5
# Settled sites kept within this factor of tol are kept without a warning: the site fits'
# own precision is about there at the estimators' default tol (binary EP in its dual form
# on 2000 sparse rows × 5000 features: changes of 4-9e-10 against tol = 1e-10).
_QUIET = 10.0
# Mixed vectors of at least this length (the multinomial EP's sites: M (r² + r), 3.3·10⁶
# at 26 classes × 5000 rows) take Anderson's least squares from the differences' Gram
# matrix, kept as they come (5 inner products a sweep), instead of an SVD of the stacked
# differences (0.3 s a sweep there, with two copies of them: 11 % of the fit). Shorter
# ones keep the SVD (bitwise as before), whose rank cut-off reaches further: singular values
# down to eps · length of the largest, against √_GRAM_RCOND = 10⁻⁶ from the Gram matrix.
_GRAM_LENGTH = 2**18
_GRAM_RCOND = 1e-12
# With a posterior stop (damped_sweeps' posterior_tol), the candidate's posterior is
# computed only for sweeps whose site change is within this factor of tol: farther from
# a fixed point the posterior moves by far more, and the extra factorization is wasted.
_POSTERIOR_GATE = 10.0
# With a relative posterior stop (damped_sweeps' posterior_share), the candidate is also
# tested where the site change is within this factor of tol, once the posterior has moved
# far enough from the start for that stop to be above posterior_tol: where the sites'
# quadrature noise keeps their changes up (the VS site fits of wide rows), the posterior
# settles sweeps before the sites do, and the one factorization a test costs is small
# against such a sweep.
_RELATIVE_GATE = 100.0
# Given a divergence of posteriors (damped_sweeps' divergence), stalled sweeps are also
# kept where one undamped sweep from their best sites moves the posterior by at most this
# share of its divergence from the start (_settled_share), ten times the share of EP's
# stop in the estimators: the sweeps have settled within the noise of their site fits, and
# that noise is three orders of magnitude below the distance the sweeps moved the
# posterior from where they started (the Laplace approximation's sites), which is what a
# stalled fit otherwise falls back to. Where the latent variances are large (vague priors
# on nearly separable classes) the VS site fits of a few rows deep in their cavities'
# tails keep the site changes from falling: digits' multinomial EP at C = 1000 stalled at
# site changes of 4e-3, its posterior moving by 0.13-0.3 nats a sweep against 925 nats
# from the Laplace approximation — whose predictive's held-out log loss was 2.45, worse
# than a uniform guess (log 10 = 2.30), where that of the stalled sites was 0.14.
_STALL_SHARE = 1e-3


class SweepResult(NamedTuple):
    """How the sweeps went, and the posterior of the sites they ended with (those stay in
    the store)."""

    posterior: Any
    n_iter: int
    converged: bool
    change: float


class SiteStore(Protocol):
    """Where the sweeps' sites are kept, with EP's map of them (:func:`damped_sweeps`).

    A store holds three sets of sites: the *current* ones, the *candidate* (the last
    damped sweep from them) and the *best* (the candidate of the sweep that moved least).
    :class:`ArraySites` keeps them in one array here; a store may keep them anywhere
    (e.g. :class:`~vsbayes.approximations.chunked_ep.ChunkedSites`, with the rows on
    dask workers), the loop only says which becomes which.
    """

    def posterior(self) -> Any:
        """The posterior of prior × current sites; raises
        :class:`~vsbayes.exceptions.NotPositiveDefiniteError` if it is not proper."""

    def sweep(self, post: Any, damping: float, bound: float = math.inf) -> float:
        """Make the damped sweep from the current sites, whose posterior is ``post``, the
        candidate; return its change (:func:`damped_step`). ``bound`` (asked only with
        ``damped_sweeps``' ``costly_divergence``): an undamped change above which the loop
        discards the sweep whatever its sites; a store may then skip work that could only
        add to a change already above it, and return that lower bound."""

    def candidate_posterior(self) -> Any:
        """The posterior of prior × the candidate sites (asked only with
        :func:`damped_sweeps`' ``posterior_tol``; :class:`ArraySites` has it)."""

    def at_round_off(self) -> bool:
        """Whether the last sweep moved every site by no more than the round-off of its
        update (False where the store has no such bound): the sweeps then stop, converged,
        whatever ``tol``."""

    def keep_best(self) -> None:
        """Remember the candidate as the best sites."""

    def restore_best(self) -> None:
        """Make the best sites the candidate."""

    def advance(self, mixing: Anderson, change: float) -> bool:
        """Make the candidate the current sites: mixed with the last sweeps by ``mixing``
        and made valid (e.g. non-negative precisions) where the store can mix (else
        ``mixing.memory`` is 0); return whether the sites are an extrapolation."""

    def accept(self) -> None:
        """Make the candidate the current sites, as it is."""

    def best_and_next_marginals(self) -> tuple[tuple, tuple] | None:
        """The means and variances of the posterior of the best sites and of one undamped
        sweep from them, or None if the store has no marginals (then stalled sweeps go on
        halving the damping, and raise where that stops helping)."""

    def best_and_next(self) -> tuple[Any, Any]:
        """The posterior of the best sites and that of one undamped sweep from them (asked
        only with :func:`damped_sweeps`' ``divergence``; :class:`ArraySites` has it)."""


def damped_step(
    sites: np.ndarray, new: np.ndarray, damping: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """One damped sweep ``(1 - damping) sites + damping new``, its scale ``1 + |sites|``,
    its residual ``Δ / scale`` and the largest ``|residual|``: the change the sweeps
    converge on, whichever store (or part of one) the sites are in."""
    damped, scale, residual = (np.empty_like(sites) for _ in range(3))

    def part(at: slice) -> tuple[float, float]:
        # In place (the same operations, the same bits as the expressions): a sweep of the
        # multinomial EP holds millions of sites, whose fresh temporaries cost more than
        # the arithmetic.
        here, base = damped[at], sites[at]
        np.multiply(base, 1.0 - damping, out=here)
        here += damping * new[at]
        np.abs(base, out=scale[at])
        scale[at] += 1.0
        np.subtract(here, base, out=residual[at])
        residual[at] /= scale[at]
        return (residual[at].max(), residual[at].min()) if here.size else (0.0, -0.0)

    if sites.size >= _SPLIT_SITES:
        # Millions of sites: element-wise, on slices side by side (the same bits whatever
        # the threads); this pass was a serial twentieth of a sweep at 20 classes.
        extremes = map_blocks(part, block_slices(sites.size, 1.0, None, _SPLIT_SITES // 2))
    else:
        extremes = [part(slice(None))]
    # The whole array's largest |residual| (NaN if any entry is, as its max and min are).
    high, low = np.max([e[0] for e in extremes]), np.min([e[1] for e in extremes])
    return damped, scale, residual, float(max(high, -low))


#: Sites from which :func:`damped_step` runs on slices side by side (half as many a slice).
_SPLIT_SITES = 2**19


def relative_change(new: np.ndarray, sites: np.ndarray) -> float:
    """The largest ``|new − sites| / (1 + |sites|)``: the undamped relative change of an
    update ``new`` of ``sites``, the same bits as the expression (NaN if any entry is).

    On slices in place, as :func:`damped_step`: on 3.1 million sites (40 classes × 2000
    rows) the expression's four temporaries of the whole array took 15 ms warm against 5
    on slices, and in a fit's sweeps under load 59 ms a fit against 17, their freed pages
    faulting again in the next sweep's writes (D-269).
    """

    def part(at: slice) -> float:
        moved = np.subtract(new[at], sites[at])
        np.abs(moved, out=moved)
        scale = np.abs(sites[at])
        scale += 1.0
        moved /= scale
        return moved.max() if moved.size else 0.0

    if sites.size >= _SPLIT_SITES:
        maxima = map_blocks(part, block_slices(sites.size, 1.0, None, _SPLIT_SITES // 2))
    else:
        maxima = [part(slice(None))]
    return float(np.max(maxima))


def within_round_off(new: np.ndarray, sites: np.ndarray, bound: np.ndarray) -> bool:
    """Whether the undamped update ``new`` of ``sites`` moves none by more than its
    round-off ``bound`` (a store's :meth:`~SiteStore.at_round_off`)."""
    return bool(np.all(np.abs(new - sites) <= bound))


def flat_concatenate(*arrays: np.ndarray) -> np.ndarray:
    """``np.concatenate([a.ravel() for a in arrays])``, millions of values copied on slices
    side by side (a copy: the same bits): the multinomial EP's sites, joined once a sweep,
    were a serial pass of it."""
    flats = [a.ravel() for a in arrays]
    total = sum(f.size for f in flats)
    if total < _SPLIT_SITES:
        return np.concatenate(flats)
    out = np.empty(total, dtype=np.result_type(*flats))
    pieces, at = [], 0
    for flat in flats:
        for part in block_slices(flat.size, 1.0, None, _SPLIT_SITES // 2):
            pieces.append((slice(at + part.start, at + part.stop), flat, part))
        at += flat.size
    map_blocks(lambda piece: out.__setitem__(piece[0], piece[1][piece[2]]), pieces)
    return out


def _difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a - b`` of two flat arrays, millions of values on slices side by side (the same
    bits): Anderson's newest differences were a serial pass of a sweep."""
    if a.size < _SPLIT_SITES:
        return a - b
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), dtype=np.result_type(a, b))
    parts = block_slices(a.size, 1.0, None, _SPLIT_SITES // 2)
    map_blocks(lambda at: np.subtract(a[at], b[at], out=out[at]), parts)
    return out


class ArraySites:
    """The sites in one flat array in this process: the store of the in-memory EPs.

    Parameters
    ----------
    sites : ndarray
        The starting sites, flattened.
    update : callable
        ``update(post, sites)``: the undamped new sites from the posterior of ``sites``.
    posterior : callable
        ``posterior(sites)``: the posterior of prior × sites; raises
        :class:`~vsbayes.exceptions.NotPositiveDefiniteError` if it is not proper.
    project : callable
        ``project(sites, extrapolated)``: the sites made valid (e.g. non-negative
        precisions); ``extrapolated`` is False for a plain damped sweep. It may work in
        place, and then returns its argument.
    marginals : callable, optional
        ``marginals(post)``: the posterior's means and variances (see
        :func:`damped_sweeps`).
    round_off : callable, optional
        ``round_off(post, sites)``: the round-off of the undamped update of ``sites``
        (whose posterior is ``post``), site by site: the largest change that the update's
        arithmetic does not resolve (:meth:`at_round_off`). None: no such bound.
    bounded : bool, default=False
        Whether ``update`` takes a third argument, the undamped change above which the
        sweep is discarded (:meth:`sweep`'s ``bound``; ``math.inf``: none).
    state : (callable, callable), optional
        ``(save, load)``: ``save()`` returns the state that ``update`` keeps between sweeps
        and raises as they go (the multinomial EP's rows' rule levels), ``load(saved)``
        puts a saved one back. It is saved with the best sites and loaded with them
        (:meth:`restore_best`), and :meth:`best_and_next`'s sweep runs at it: the map goes
        back with the sites it was at. None: no such state (the map is the same at every
        sweep).

    Attributes
    ----------
    sites : ndarray
        The current sites: after :func:`damped_sweeps`, those it ended with.
    """

    def __init__(
        self,
        sites: np.ndarray,
        update: Callable[[Any, np.ndarray], np.ndarray],
        posterior: Callable[[np.ndarray], Any],
        project: Callable[[np.ndarray, bool], np.ndarray],
        marginals: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None,
        round_off: Callable[[Any, np.ndarray], np.ndarray] | None = None,
        state: tuple[Callable[[], Any], Callable[[Any], None]] | None = None,
        bounded: bool = False,
    ):
        self.sites, self._best = sites, sites
        self._update, self._posterior, self._project = update, posterior, project
        self._marginals, self._round_off = marginals, round_off
        self._within_round_off = False
        self._state, self._bounded = state, bounded
        self._best_state = None if state is None else state[0]()

    def posterior(self) -> Any:
        return self._posterior(self.sites)

    def candidate_posterior(self) -> Any:
        """The posterior of prior × the candidate sites (the last damped sweep)."""
        return self._posterior(self._damped)

    def _new(self, post: Any, sites: np.ndarray, bound: float = math.inf) -> np.ndarray:
        """The undamped update of ``sites``, given ``bound`` where ``update`` takes one."""
        return self._update(post, sites, bound) if self._bounded else self._update(post, sites)

    def sweep(self, post: Any, damping: float, bound: float = math.inf) -> float:
        new = self._new(post, self.sites, bound)
        self._damped, self._scale, self._residual, change = damped_step(self.sites, new, damping)
        self._within_round_off = self._round_off is not None and within_round_off(
            new, self.sites, self._round_off(post, self.sites)
        )
        return change

    def at_round_off(self) -> bool:
        return self._within_round_off

    def keep_best(self) -> None:
        # A copy: ``project`` may change the candidate in place.
        self._best = flat_concatenate(self._damped).reshape(self._damped.shape)
        if self._state is not None:
            self._best_state = self._state[0]()

    def restore_best(self) -> None:
        self._damped = self._best
        if self._state is not None:
            # The map as it was at the best sites: what a diverged sweep after them raised
            # (the multinomial EP's rows on 16 times the nodes) would be kept by every
            # later sweep from them, at up to a hundred times a sweep's cost.
            self._state[1](self._best_state)

    def advance(self, mixing: Anderson, change: float) -> bool:
        sites = mixing.step(self._residual, self._damped, change, self._scale)
        self.sites = self._project(sites, sites is not self._damped)
        return self.sites is not self._damped

    def accept(self) -> None:
        self.sites = self._damped

    def best_and_next_marginals(self) -> tuple[tuple, tuple] | None:
        if self._marginals is None:
            return None
        here, there = self.best_and_next()
        return self._marginals(here), self._marginals(there)

    def best_and_next(self) -> tuple[Any, Any]:
        here = self._posterior(self._best)
        if self._state is None:
            return here, self._posterior(self._new(here, self._best))
        # At the best sites' state, which the sweep may raise (theirs from then on); the
        # current sites' is put back for the sweeps that go on from them.
        save, load = self._state
        current = save()
        load(self._best_state)
        try:
            new = self._new(here, self._best)
            self._best_state = save()
        finally:
            load(current)
        return here, self._posterior(new)


def damped_sweeps(
    store: SiteStore,
    *,
    damping: float,
    tol: float,
    max_iter: int,
    memory: int,
    as_gaussian: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None,
    posterior_tol: float | None = None,
    divergence: Callable[[Any, Any], float] | None = None,
    posterior_share: float | None = None,
    costly_divergence: bool = False,
) -> SweepResult:
    """Run EP's sweeps on the sites in ``store`` to a relative change of at most ``tol``,
    or (with ``posterior_tol``) until one sweep moves the posterior by at most
    ``posterior_tol`` nats, or until a sweep moves no site by more than the round-off of
    its update, where the store bounds that (``store.at_round_off()``).

    Parameters
    ----------
    store : SiteStore
        The sites, from where the sweeps start, and their map (e.g. :class:`ArraySites`);
        the sites the sweeps end with stay there.
    damping, tol, max_iter, memory
        Fraction of the new sites taken per sweep; the largest relative change
        ``|Δ| / (1 + |site|)`` at which the sweeps stop; the most sweeps (then a
        ConvergenceWarning, and the sites of the sweep that moved least); the sweeps Anderson
        mixes (0: plain damped sweeps; 0 for a store that cannot mix).
    as_gaussian : callable, optional
        ``as_gaussian(post)``: the mean and covariance of a posterior of the store, in the
        coefficients' coordinates, for an observer of the fit (:mod:`vsbayes._progress`),
        which sees each sweep; None: the sweeps are reported without their posterior.
    posterior_tol, divergence : float and callable, optional
        Also stop where a sweep whose site change is within 10 × ``tol`` moves the
        posterior by at most ``posterior_tol`` nats undamped:
        ``divergence(post, candidate) / damping²`` (a KL divergence between the
        posteriors of the current and the candidate sites, quadratic in the step near a
        fixed point), with the candidate's posterior from the store's
        ``candidate_posterior()`` (:class:`ArraySites`). The candidate is returned, as at
        ``tol``. ``divergence`` alone (``posterior_tol`` None): no such stop, but stalled
        sweeps are measured by it (below).
    posterior_share : float, optional
        With ``posterior_tol``: the stop is at ``max(posterior_tol, posterior_share ×
        divergence(start, post))`` nats instead, the posterior's move from the one the
        sweeps started from scaling it, and it is tested from a site change of
        100 × ``tol`` on where that share is above ``posterior_tol``.
    costly_divergence : bool, default=False
        Whether a sweep from sites far from a fixed point costs more than one near it (the
        multinomial EP's VS site fits of rows gone wide): then a sweep whose undamped
        change is over 100 times the least one, and above ``max(√tol, 1e-3)``, counts as a
        stall at once, instead of 10 more such sweeps before any remedy; once unmixed,
        such a stall halves the damping without asking whether the last halving helped
        (a diverged change measures no level that plain sweeps reach, and the store may
        return a lower bound of it: below). Each sweep is given the undamped change above
        which it is discarded whatever its sites (``store.sweep``'s ``bound``).

    Stalled sweeps (10 sweeps without progress) keep their best sites (with a
    ConvergenceWarning, unless within 10 × tol) when the store has marginals, one more
    undamped sweep moves no marginal by more than 5e-5 nats of KL divergence (a mean by 1 %
    of its standard deviation, a variance by 1.4 %), and their change is below
    ``max(√tol, 1e-3)``; given ``divergence``, also (with a ConvergenceWarning) where one
    undamped sweep from them moves the posterior by at most 1e-3 of its divergence from the
    start, whatever their change; else they go on unmixed, then with the damping halved
    (down to 1/64) while halving takes them closer to a fixed point, and raise where it
    does not (unless the halving before helped: then back to its damping, once, while
    they make a new least change of their own every 10 sweeps). Below
    ``max(√tol, 1e-3)``, 10 sweeps that have not halved the change, the
    last 5 without a new smallest one, are tested for a settled posterior as a stall is;
    after a stall, a plain damped step that grows the change more than
    ``max(2 d / (1/64) - 1, 10)``-fold at damping d, to above ``max(√tol, 1e-3)``, raises
    at once.

    Returns
    -------
    SweepResult

    Raises
    ------
    EstimationError
        If the sweeps stall at the smallest damping, or at one no better than twice it, at
        a change above ``max(√tol, 1e-3)`` or whose posterior still moves (by more than
        1e-3 of its move from the start, given ``divergence``); or if, stalled, their plain
        step grows the change past what any damping contracts.
    """
    with stage("expectation propagation", "EP sweep", max_iter) as steps:
        stop = None if divergence is None else (posterior_tol, divergence, posterior_share)
        run = _sweeps(
            store, damping, tol, max_iter, memory, steps, as_gaussian, stop, costly_divergence
        )
        if steps is not None:
            steps.result(_state(as_gaussian, run.posterior))
    return run


def _state(as_gaussian, post):
    """An observer's view of the posterior ``post``: a function, evaluated if asked."""
    return None if as_gaussian is None else (lambda: as_gaussian(post))


def _sweeps(
    store, damping, tol, max_iter, memory, steps, as_gaussian, stop, costly=False
) -> SweepResult:
    """:func:`damped_sweeps`, each sweep reported to ``steps`` (None: to nobody); ``stop``:
    ``(posterior_tol, divergence, posterior_share)`` (given a divergence) or None;
    ``costly``: its ``costly_divergence``."""
    anderson = Anderson(memory)
    post = store.posterior()
    start = None if stop is None else post
    converged, at_floor, change, n_iter = False, False, math.inf, 0
    best, best_change, stalled = math.inf, math.inf, 0
    tested = math.inf  # the best change whose sites were last tested for _settled
    share_tested = math.inf  # ... and for _settled_share
    kept = None  # (move, departure) of stalled sites kept by _settled_share
    # The best undamped change when mixing was switched off (None while it is on), and
    # whether it has been switched on again.
    plain_from, remixed = None, False
    # The least undamped change of the plain sweeps from the best sites at this damping,
    # and at the one before it (None: none to compare with), but for the first sweep from
    # them, whose change is the same at every damping (_halving_helps).
    level_least, last_level_least, from_best = math.inf, None, False
    # The undamped change when the sweeps last cut it to _PROGRESS of the one before, and
    # the sweeps since; whether a stall has switched mixing off or halved the damping;
    # the undamped change and damping of the sweep whose plain damped step the current
    # sites are (None: mixed) and the damping of the best sites' (_grows_past_damping).
    progress_from, idle, remedied, last_plain, best_damping = math.inf, 0, False, None, damping
    # Whether the level the last halving left had itself been reached by a halving that
    # helped, and whether the sweeps have gone back to its damping (a crawl).
    left_helped, crawling = False, False
    while n_iter < max_iter:
        if steps is not None:
            steps.begin(_state(as_gaussian, post))
        n_iter += 1
        if costly:
            change = store.sweep(post, damping, _discard_bound(best, tol, damping, stop))
        else:
            change = store.sweep(post, damping)
        diverged = False
        settled = None  # the candidate's posterior, where it moved the posterior little
        limit = _posterior_limit(stop, start, post, change, tol)
        if limit is not None:
            candidate = store.candidate_posterior()
            if stop[1](post, candidate) <= limit * damping**2:
                settled = candidate
            del candidate  # not held while the next posterior is formed
        if change <= tol or settled is not None or store.at_round_off():
            # (At round-off: on many rows a site is the difference of numbers that grow
            # with the rows, the tilted and the cavity precision, whose round-off can
            # stay above tol; no further sweep brings the sites nearer.)
            converged = True
            store.accept()
            post = store.posterior() if settled is None else settled
            if steps is not None:
                steps.end(_state(as_gaussian, post))
            break
        if (
            remedied
            and change / damping > _floor(tol)
            and _grows_past_damping(last_plain, change / damping)
        ):
            # Stalled sweeps whose change grew, over one plain damped step, faster than any
            # damping down to _MIN_DAMPING could contract, to where no floor is accepted
            # (with class weights 1e3 and 1e-4, a thousand-fold jump after a geometric
            # decrease: a heavy row's tilted density meeting the cavity's tail again):
            # halving would only wait for the next jump.
            raise _stalled_error(n_iter, last_plain[1], best_change, tol, grown=True)
        if change / damping <= _PROGRESS * progress_from:
            progress_from, idle = change / damping, 0
        else:
            idle += 1
        if change / damping < best:
            best, best_change, stalled = change / damping, change, 0
            best_damping = damping
            store.keep_best()
            level_least, last_level_least, from_best = math.inf, None, True
        else:
            stalled += 1
            if anderson.memory == 0 and not from_best:
                if crawling and change / damping < level_least:
                    # Gone back to a damping whose sweeps crawl to a fixed point: their
                    # own least change, not a record a transient set, is the progress.
                    stalled = 0
                level_least = min(level_least, change / damping)
            from_best = False
            if costly and change / damping > max(_DIVERGED * best, _floor(tol)):
                # Diverging, where diverged sweeps cost more (costly_divergence): the sites
                # have left the best ones hundreds of times farther than those moved, and
                # each such sweep can cost a hundred of theirs (wide
                # cavities take VS site fits on finer rules). The stall's remedies — from
                # the best sites, unmixed, then damped by half — start now, not _STALL
                # sweeps on: digits' multinomial EP at C = 10⁴ grew its change from 0.56
                # to 108 in two sweeps, at 20-60 s a sweep against 0.2 s near the start.
                # Not below the floor: there a lucky best far under the noise of the
                # site fits would make every sweep a divergence.
                stalled, diverged = _STALL, True
        noisy = idle >= _STALL and stalled >= _STALL // 2
        if (stalled >= _STALL or noisy) and best <= _floor(tol) and best < tested:
            # Within reach of the floor, sweeps that have not halved their change in _STALL
            # sweeps and made no new smallest one in the last half of them are tested too:
            # at a noise floor, records of the noise a few percent below the best kept
            # restarting the stall count (26 sweeps past the floor on a multinomial EP
            # with class weights 1e3 and 1e-4, against 15 now). Slow convergence, unlike
            # noise, makes a new smallest change every sweep or two.
            tested, idle = best, 0
            at_floor = _settled(store)
        if not at_floor and stalled >= _STALL and start is not None and best < share_tested:
            # Given a divergence, a stall whose posterior one more sweep moves by a
            # thousandth of its move from the start keeps its sites too (the noise of site
            # fits in wide cavities' tails, above any floor: digits at C = 1000).
            share_tested = best
            kept = _settled_share(store, stop[1], start)
            at_floor = kept is not None
        if at_floor:
            # The sweeps stall this close to a fixed point: the map's own noise (its site
            # fits' precision, amplified where latent variances are large) is above tol.
            # The best sites are kept, with a warning: less damping cannot move a settled
            # posterior further.
            if steps is not None:
                steps.end(_state(as_gaussian, post))
            break
        if stalled >= _STALL:
            # (A stall by divergence halves the damping whatever the last halving did: its
            # change, which the store may give as a lower bound (costly_divergence's
            # bound), measures no level the plain sweeps reach: on digits at C = 10⁴ the
            # test raised at 0.425 on a bounded 72 against 92 at 0.85 (D-257).)
            if anderson.memory == 0 and (
                damping <= _MIN_DAMPING
                or not (diverged or _halving_helps(last_level_least, level_least))
            ):
                # No progress at the smallest damping, or at a halved damping that took the
                # sweeps no closer to a fixed point than twice it (then no smaller one
                # will): far from any fixed point, none is within reach. The best sites are
                # then arbitrary: with class weights 1e3 and 1e-4, some predicted every
                # point wrong. Unless the halving before had helped: the sweeps crawl
                # (the module's docstring), and go on from here at that halving's damping.
                helped = _halving_helps(last_level_least, level_least)
                if helped or not left_helped or crawling:
                    raise _stalled_error(n_iter, damping, best_change, tol)
                last_plain = (change / damping, damping)  # this sweep's plain step
                damping, crawling = 2.0 * damping, True
                level_least, from_best, stalled, idle = math.inf, False, 0, 0
                store.advance(anderson, change)
                post = store.posterior()
                if steps is not None:
                    steps.end(_state(as_gaussian, post))
                continue
            remedied = True
            if anderson.memory > 0:
                anderson.memory, plain_from, last_level_least = 0, best, None
            else:
                damping = max(0.5 * damping, _MIN_DAMPING)
                left_helped = last_level_least is not None and level_least < last_level_least
                last_level_least = level_least
            level_least, from_best = math.inf, True
            store.restore_best()
            stalled, idle = 0, 0
            # The best sites are the plain damped step of the sweep that found them.
            last_plain = (best, best_damping)
        elif plain_from is not None and not remixed and best <= 0.1 * plain_from:
            # The plain sweeps converge (linearly, often slowly): mixing again, once.
            anderson.memory, plain_from, remixed = memory, None, True
            last_level_least, last_plain = None, None
            anderson.restart()
        else:
            # The next sites are this sweep's plain damped step, unless mixed.
            last_plain = (change / damping, damping) if anderson.memory == 0 else None
        extrapolated = store.advance(anderson, change)
        try:
            post = store.posterior()
        except NotPositiveDefiniteError:
            if not extrapolated:
                raise
            # The extrapolation left the positive-definite cone: take the damped sweep.
            anderson.restart()
            store.accept()
            post = store.posterior()
        if steps is not None:
            steps.end(_state(as_gaussian, post))
    if not converged and best_change < change:
        # Unconverged, the sites whose sweep moved least are the nearest to a fixed point.
        change = best_change
        store.restore_best()
        store.accept()
        post = store.posterior()
    if kept is not None:
        moved, departed = kept
        warn(
            f"Expectation propagation stopped after {n_iter} sweeps at a relative site "
            f"change of {best:.3g} (tol={tol:.3g}): {_STALL} more sweeps (damping {damping:g}) "
            f"made no progress below it, the noise of its site fits on wide latent "
            f"marginals. The sites are those of the sweep that moved least; one more sweep "
            f"moves the posterior by {moved:.3g} nats of KL divergence, {moved / departed:.2g} "
            f"of the {departed:.3g} nats it moved from where the sweeps started.",
            ConvergenceWarning,
        )
    elif at_floor and best > _QUIET * tol:
        warn(
            f"Expectation propagation stopped after {n_iter} sweeps at a relative site "
            f"change of {best:.3g} (tol={tol:.3g}): the sweeps after it (damping {damping:g}) "
            f"made no progress below it, the precision of its site fits here. The sites are "
            f"those of the sweep that moved least; one more sweep moves the posterior's means "
            f"and variances by less than {_SETTLED:g} nats of KL divergence in each marginal "
            f"(a mean by 1 % of its standard deviation).",
            ConvergenceWarning,
        )
    elif not (converged or at_floor):
        _warn_unconverged(n_iter, max_iter, change, tol)
    return SweepResult(post, n_iter, converged, change)


def _discard_bound(best: float, tol: float, damping: float, stop) -> float:
    """The undamped change above which a sweep at ``damping`` is discarded whatever its
    sites (``costly_divergence``): a divergence, over ``_DIVERGED`` times the ``best``
    undamped change and above the floor, and beyond the posterior stop's gate (whose
    test could keep the sweep), ``_RELATIVE_GATE × tol`` damped. Infinite before the
    first sweep."""
    if not math.isfinite(best):
        return math.inf
    gate = _RELATIVE_GATE * tol / damping if stop is not None and stop[0] is not None else 0.0
    return max(_DIVERGED * best, _floor(tol), gate)


def _posterior_limit(stop, start, post, change: float, tol: float) -> float | None:
    """The undamped posterior move (nats) at which this sweep stops, or None where the
    candidate is not tested: ``posterior_tol`` within 10 × tol, the larger
    ``posterior_share × divergence(start, post)`` within 100 × tol."""
    if stop is None or stop[0] is None or change <= tol or change > _RELATIVE_GATE * tol:
        return None
    posterior_tol, divergence, share = stop
    limit = posterior_tol
    if share is not None:
        limit = max(limit, share * divergence(start, post))
    if change > _POSTERIOR_GATE * tol and limit <= posterior_tol:
        return None
    return limit


def _settled(store: SiteStore) -> bool:
    """Whether one undamped sweep from the best sites leaves each of the posterior's
    marginals within ``_SETTLED`` nats of KL divergence of where it was."""
    try:
        pair = store.best_and_next_marginals()
    except NotPositiveDefiniteError:
        return False
    if pair is None:
        return False
    (m0, v0), (m1, v1) = pair
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = v0 / v1
        kl = 0.5 * (ratio + (m1 - m0) ** 2 / v1 - 1.0 - np.log(ratio))
    return bool(np.all(kl <= _SETTLED))


def _settled_share(store: SiteStore, divergence, start) -> tuple[float, float] | None:
    """``(move, departure)`` where one undamped sweep from the best sites moves their
    posterior by at most ``_STALL_SHARE`` of its divergence from the posterior ``start``
    the sweeps started from (``move = divergence(best, next)``, ``departure =
    divergence(start, best)``), else None."""
    try:
        here, there = store.best_and_next()
    except NotPositiveDefiniteError:
        return None
    moved, departed = divergence(here, there), divergence(start, here)
    return (moved, departed) if moved <= _STALL_SHARE * departed else None


def _halving_helps(before: float | None, after: float) -> bool:
    """Whether halving the damping took the plain sweeps from the best sites closer to a
    fixed point: their least undamped change after the first (which is the same at every
    damping) is smaller at the halved damping (``after``) than before (None: not tried).

    Near a fixed point a damped sweep multiplies each mode of the change by
    ``f = 1 - d (1 - λ)``, λ an eigenvalue of the undamped map; halving ``d`` takes ``f`` to
    ``(1 + f) / 2``, faster only where ``|1 + f| < 2 |f|``: outside the disc
    ``|f - 1/3| ≤ 2/3``, which the halving maps into itself. Once a halving is no faster
    for the slowest mode, no further one is: the sweeps drift or crawl, not oscillate.
    """
    return before is None or after < before


def _grows_past_damping(before: tuple[float, float] | None, after: float) -> bool:
    """Whether one plain damped step (``before``: the undamped change of the sweep that
    made it, and its damping) grew the undamped change to ``after`` by more than any
    damping down to ``_MIN_DAMPING`` could contract.

    Linearized, a plain sweep multiplies the change by ``1 + d μ`` along a mode of the
    residual map's Jacobian (eigenvalue μ). Growth by ``g`` at damping ``d`` along a real
    mode means ``|1 + d μ| ≥ g``: either μ > 0 (a drift, which no damping stops) or
    ``d μ ≤ -(1 + g)``, and then a damping ``d'`` contracts the mode only if
    ``d' < 2 d / (1 + g)``. Growth with ``2 d / (1 + g) < _MIN_DAMPING`` thus leaves no
    damping that halving could reach: a 108-fold growth in one sweep at d = 0.85. The
    growth must also be at least ``_JUMP``-fold: smaller ones can be transient (a
    non-normal Jacobian) or the site fits' noise, which the linearization does not see.
    """
    if before is None or not before[0] > 0.0:
        return False
    change, damping = before
    return after / change > max(2.0 * damping / _MIN_DAMPING - 1.0, _JUMP)


def _floor(tol: float) -> float:
    """The undamped change below which stalled sweeps are accepted: √tol, and at least
    ``_FLOOR``. Such sites are within that (relative) of a fixed point: a posterior within
    about its square in KL, far inside EP's own error and its site fits' (the multinomial
    sites' quasi-Monte Carlo rules err by ~1e-4)."""
    return max(math.sqrt(tol), _FLOOR)


def _stalled_error(
    n_iter: int, damping: float, change: float, tol: float, grown: bool = False
) -> EstimationError:
    """The error of sweeps that stalled at ``damping``, where no smaller one could help
    (``grown``: their plain sweeps' change grew past what any damping contracts)."""
    if grown:
        where = (
            f"damping {damping:g}, whose plain sweeps' change grew faster in one sweep than "
            f"any damping down to {_MIN_DAMPING:g} could contract"
        )
    elif damping <= _MIN_DAMPING:
        where = f"the smallest damping ({_MIN_DAMPING:g})"
    else:
        where = (
            f"damping {damping:g}, which brought them no closer to a fixed point than twice "
            f"that damping (no smaller damping can then)"
        )
    return EstimationError(
        f"Expectation propagation cannot converge: its sweeps stalled at {where} after "
        f"{n_iter} sweeps, the least site change {change:.3g} against tol={tol:.3g}. Typical "
        f"cause: extreme sample or class weights (rescale them), or nearly separable data "
        f"with a vague prior (use a smaller C)."
    )


def _warn_unconverged(n_iter: int, max_iter: int, change: float, tol: float) -> None:
    """The ConvergenceWarning of sweeps that reached ``max_iter``."""
    warn(
        f"Expectation propagation did not converge in {n_iter} sweeps (max_iter={max_iter}; "
        f"largest site change {change:.3g}, tol={tol:.3g}). Increase max_iter or lower "
        f"damping; extreme sample or class weights can keep the sweeps from reaching tol.",
        ConvergenceWarning,
    )


class Anderson:
    """Anderson acceleration (type II) of a fixed-point map x ↦ g(x), from its last steps.

    The next point is ``g_k - ΔG γ`` with γ the least-squares fit of the residual ``f_k`` by
    the residuals' differences ``ΔF``: the combination of the last ``memory`` steps whose
    linearized residual is smallest. Far from a fixed point the linearization can fail;
    the memory restarts, and the plain step ``g_k`` is taken, when the residual more than
    doubles, and when the extrapolation is not finite or moves more than ten plain steps.
    """

    def __init__(self, memory: int):
        self.memory = int(memory)
        self.restart()

    def restart(self) -> None:
        self._last, self._d_res, self._d_img, self._change = None, [], [], math.inf
        self._gram = np.empty((0, 0))  # the residual differences' inner products (long ones)

    def step(
        self, residual: np.ndarray, image: np.ndarray, change: float, scale: np.ndarray
    ) -> np.ndarray:
        """The next point, from the residual ``f_k = (g_k - x_k) / scale`` and ``g_k``."""
        if self.memory <= 0 or not np.isfinite(change):
            self.restart()
            return image
        if change > 2.0 * self._change:
            self.restart()
        self._change = change
        long = residual.size >= _GRAM_LENGTH
        if self._last is not None:
            self._d_res.append(_difference(residual, self._last[0]))
            self._d_img.append(_difference(image, self._last[1]))
            if long:
                self._extend_gram()
            if len(self._d_res) > self.memory:
                del self._d_res[0], self._d_img[0]
                self._gram = self._gram[1:, 1:]
        self._last = residual, image
        if not self._d_res:
            return image
        if long:
            gamma = self._gram_solution(residual)
            mixed, move = _long_mix(image, gamma, self._d_img, residual, scale)
        else:
            gamma = np.linalg.lstsq(np.column_stack(self._d_res), residual, rcond=None)[0]
            mixed = image - np.column_stack(self._d_img) @ gamma
            move = _move(mixed, image, residual, scale)
        if not np.isfinite(move) or move > 10.0 * change:
            self.restart()
            return image
        return mixed

    def _extend_gram(self) -> None:
        """The Gram matrix of the residual differences, with the newest one's products."""
        newest = self._d_res[-1]
        products = np.array([float(d @ newest) for d in self._d_res])
        k = len(products)
        gram = np.empty((k, k))
        gram[:-1, :-1] = self._gram
        gram[-1, :], gram[:, -1] = products, products
        self._gram = gram

    def _gram_solution(self, residual: np.ndarray) -> np.ndarray:
        """The least-squares γ of ``ΔF γ ≈ f`` from the normal equations ``ΔFᵀΔF γ = ΔFᵀf``,
        directions whose squared singular value is below ``_GRAM_RCOND`` of the largest
        dropped (minimum norm): the Gram matrix's round-off hides them, and a mixing that
        leaned on them would be noise."""
        rhs = np.array([float(d @ residual) for d in self._d_res])
        eigval, eigvec = np.linalg.eigh(self._gram)
        keep = eigval > _GRAM_RCOND * max(float(eigval[-1]), 0.0)
        if not keep.any():
            return np.zeros(len(rhs))
        inverse = np.where(keep, 1.0 / np.where(keep, eigval, 1.0), 0.0)
        return eigvec @ (inverse * (eigvec.T @ rhs))


def _move(mixed, image, residual, scale) -> float:
    """The extrapolation's largest move against the plain step's (x_k = g_k - f_k · scale):
    ``|mixed - image| / scale + |residual|``, in place (the same bits)."""
    move = mixed - image
    np.abs(move, out=move)
    move /= scale
    move += np.abs(residual)
    return np.max(move, initial=0.0)


def _long_mix(image, gamma, differences, residual, scale) -> tuple[np.ndarray, float]:
    """``image - Σ γ_j ΔG_j`` and its :func:`_move`, on slices side by side (the same
    operations, the same bits whatever the threads): the mixing of millions of sites was a
    serial pass of a sweep."""
    mixed = np.empty_like(image)

    def part(at: slice) -> float:
        here = mixed[at]
        here[...] = image[at]
        for weight, difference in zip(gamma, differences, strict=True):
            here -= weight * difference[at]
        return _move(here, image[at], residual[at], scale[at])

    moves = map_blocks(part, block_slices(image.size, 1.0, None, _SPLIT_SITES // 2))
    return mixed, np.max(moves)  # NaN if any entry is, as the whole array's
