"""EP's sweep loop on maps whose behaviour is known (the EP fits themselves are tested in
test_expectation_propagation.py and test_softmax_ep.py)."""

import warnings

import numpy as np
import pytest

from vsbayes._blas import single_blas_thread
from vsbayes.approximations._damped_sweeps import (
    ArraySites,
    damped_step,
    damped_sweeps,
    relative_change,
)
from vsbayes.exceptions import ConvergenceWarning, EstimationError


def _noisy_map(fixed_point: np.ndarray, noise: float):
    """A map whose updates miss ``fixed_point`` by ±noise, alternately: no fixed point
    closer than the noise (as EP's site fits, deterministic but not smooth)."""
    calls = []

    def update(post, sites):
        calls.append(None)
        return fixed_point + noise * (-1.0) ** len(calls) * (1.0 + np.abs(fixed_point))

    return update


def _store(update, start, variance=1.0):
    # The "posterior" is the sites themselves, each with the same variance.
    return ArraySites(
        start,
        update,
        lambda sites: sites,
        lambda sites, extrapolated: sites,
        marginals=lambda post: (post, np.full_like(post, variance)),
    )


def _run(update, start, tol=1e-10, variance=1.0):
    store = _store(update, start, variance)
    run = damped_sweeps(store, damping=0.85, tol=tol, max_iter=1000, memory=5)
    return run, store.sites


def test_a_contraction_converges_to_its_fixed_point():
    target = np.array([1.0, -2.0, 30.0])
    run, sites = _run(lambda post, sites: target + 0.5 * (sites - target), np.zeros(3))
    assert run.converged
    np.testing.assert_allclose(sites, target, rtol=1e-9)


def test_a_posterior_stop_returns_the_first_candidate_within_it():
    """With posterior_tol, the sweeps stop at the first sweep within 10 × tol whose
    candidate moves the posterior by at most posterior_tol (divergence over damping²), and
    return that candidate and its posterior; without, they go on to tol."""
    target = np.array([1.0, -2.0, 30.0])
    seen = []

    def divergence(post, candidate):
        seen.append(float(np.sum((candidate - post) ** 2)))
        return seen[-1]

    def update(post, sites):
        return target + 0.5 * (sites - target)

    options = {"damping": 0.85, "tol": 1e-6, "max_iter": 1000, "memory": 0}
    plain = damped_sweeps(_store(update, np.zeros(3)), **options)
    store = _store(update, np.zeros(3))
    run = damped_sweeps(store, **options, posterior_tol=1e-8, divergence=divergence)
    assert run.converged and run.n_iter < plain.n_iter
    assert run.change > 1e-6  # stopped by the posterior, not by tol
    assert seen[-1] <= 1e-8 * 0.85**2 and all(value > 1e-8 * 0.85**2 for value in seen[:-1])
    np.testing.assert_array_equal(run.posterior, store.sites)  # the candidate's posterior


def test_a_relative_posterior_stop_scales_with_the_move_from_the_start():
    """With posterior_share, the stop is at the larger of posterior_tol and that share of
    the posterior's divergence from the start, tested from a site change of 100 × tol on:
    fewer sweeps than the absolute stop alone where the posterior moved far; the candidate
    returned."""
    target = np.array([1.0, -2.0, 30.0])
    calls = []

    def divergence(post, candidate):
        calls.append((post.copy(), candidate.copy()))
        return float(np.sum((candidate - post) ** 2))

    def update(post, sites):
        return target + 0.5 * (sites - target)

    options = {"damping": 0.85, "tol": 1e-6, "max_iter": 1000, "memory": 0}
    absolute = damped_sweeps(
        _store(update, np.zeros(3)), **options, posterior_tol=1e-8, divergence=divergence
    )
    calls.clear()
    store = _store(update, np.zeros(3))
    share = 1e-6  # of a move of ~905 from the start: ~9e-4, far above posterior_tol
    run = damped_sweeps(
        store,
        **options,
        posterior_tol=1e-8,
        divergence=divergence,
        posterior_share=share,
    )
    assert run.converged and run.n_iter < absolute.n_iter
    assert run.change > 10 * 1e-6  # stopped in the wider band, by the relative stop
    # The calls on (start, post) have the start, zeros, first; the rest test the steps.
    steps = [(post, candidate) for post, candidate in calls if post.any()]
    post, candidate = steps[-1]
    moved = float(np.sum(post**2))  # divergence(start = 0, post)
    assert np.sum((candidate - post) ** 2) <= share * moved * 0.85**2
    np.testing.assert_array_equal(run.posterior, store.sites)


def test_anderson_on_long_vectors_mixes_as_the_svd_does(monkeypatch):
    """Anderson's least squares from the differences' Gram matrix (the long vectors' path,
    taken here from 2000 entries) give the SVD's mixed points where the differences are
    well conditioned: the normal equations lose cond² · eps, here ~1e-13."""
    from vsbayes.approximations import _damped_sweeps

    rng = np.random.default_rng(0)
    n = 2000
    target = rng.standard_normal(n)
    rates = rng.uniform(0.1, 0.9, n)  # a linear map with spread rates: no exact extrapolation

    def mixed_points(length):
        monkeypatch.setattr(_damped_sweeps, "_GRAM_LENGTH", length)
        mixing, x, points = _damped_sweeps.Anderson(5), np.zeros(n), []
        for _ in range(7):
            image = target + rates * (x - target)
            residual = image - x
            x = mixing.step(residual, image, float(np.abs(residual).max()), np.ones(n))
            points.append(x)
        return np.array(points)

    gram, svd = mixed_points(n), mixed_points(n + 1)
    np.testing.assert_allclose(gram, svd, rtol=0, atol=1e-10)
    plain = target - rates**7 * target  # seven plain steps from 0
    # It did mix: closer to the fixed point (in the least-squares sense it minimizes).
    assert np.linalg.norm(gram[-1] - target) < 0.5 * np.linalg.norm(plain - target)


def test_sweeps_stalled_near_a_fixed_point_keep_the_best_sites_with_a_warning():
    target = np.array([1.0, -2.0, 30.0])
    with pytest.warns(ConvergenceWarning, match="made no progress below it"):
        run, sites = _run(_noisy_map(target, 1e-5), np.zeros(3))
    assert not run.converged
    # Within the map's own noise of the fixed point (relative to 1 + |site|).
    assert np.all(np.abs(sites - target) <= 2e-5 * (1.0 + np.abs(target)))
    # Kept at the first stall (10 sweeps without progress, from the 2 or 3 that reach the
    # noise): halving the damping down to 1/64 would take 60 more sweeps and move nothing.
    assert run.n_iter <= 2 * 10 + 5


def test_sweeps_at_a_noise_floor_whose_records_keep_coming_stop_there():
    # Noise of varying size (as the multinomial EP's site fits at their floor): new
    # smallest changes a few percent below the last keep coming, each of which restarted
    # the count of 10 stalled sweeps (up to 61 sweeps on these 12 sequences). Sweeps that
    # have not halved their change in 10 sweeps, nor made a new smallest one in 5, are
    # tested as stalled ones: the settled sites are kept by sweep 32 on each.
    target = np.array([1.0, -2.0, 30.0])
    for seed in range(12):
        rng = np.random.default_rng(seed)
        sign = [1.0]

        def update(post, sites, rng=rng, sign=sign):
            sign[0] = -sign[0]
            return target + 1e-6 * sign[0] * rng.uniform(0.5, 1.0, 3) * (1.0 + np.abs(target))

        with pytest.warns(ConvergenceWarning, match="made no progress below it"):
            run, sites = _run(update, np.zeros(3))
        assert not run.converged and run.n_iter <= 32
        assert np.all(np.abs(sites - target) <= 2e-6 * (1.0 + np.abs(target)))


def test_sweeps_stalled_within_ten_times_tol_keep_their_sites_silently():
    # The site fits' own precision just above tol (the binary EP's dual form at the
    # estimators' tol = 1e-10): no warning for what no sweep can improve.
    target = np.array([1.0, -2.0, 30.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run, sites = _run(_noisy_map(target, 3e-10), np.zeros(3))
    assert not run.converged
    assert np.all(np.abs(sites - target) <= 6e-10 * (1.0 + np.abs(target)))
    with pytest.warns(ConvergenceWarning, match="made no progress below it"):
        _run(_noisy_map(target, 3e-10), np.zeros(3), tol=1e-11)


@pytest.mark.parametrize("bound", [2e-6, 0.5e-6])
def test_sweeps_within_the_round_off_of_their_update_stop_converged(bound):
    # A map whose updates miss its fixed point by ±1e-6 (relative), far above tol: where
    # the store bounds the round-off of an update above that, the first sweep whose every
    # site moves within it ends the sweeps, converged and silent, with that sweep's damped
    # sites; below it, they stall at the noise as before (with a warning).
    target = np.array([1.0, -2.0, 30.0])
    store = ArraySites(
        np.zeros(3),
        _noisy_map(target, 1e-6),
        lambda sites: sites,
        lambda sites, extrapolated: sites,
        marginals=lambda post: (post, np.ones_like(post)),
        round_off=lambda post, sites: bound * (1.0 + np.abs(target)),
    )
    options = {"damping": 0.85, "tol": 1e-10, "max_iter": 1000, "memory": 5}
    if bound < 1e-6:
        with pytest.warns(ConvergenceWarning, match="made no progress below it"):
            run = damped_sweeps(store, **options)
        assert not run.converged
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = damped_sweeps(store, **options)
    # Measured: 8 sweeps, against 18 to the stall (which waits 10 without progress).
    assert run.converged and run.change > 1e-10 and run.n_iter <= 10
    assert np.all(np.abs(store.sites - target) <= 2e-6 * (1.0 + np.abs(target)))


def test_sweeps_stalled_far_from_any_fixed_point_raise():
    # Sweeps that oscillate: each halving takes them closer, down to the smallest damping.
    with pytest.raises(EstimationError, match="stalled at the smallest damping"):
        _run(_noisy_map(np.array([1.0, -2.0, 30.0]), 0.05), np.zeros(3))


def test_sweeps_stalled_near_sites_whose_posterior_still_moves_raise():
    # Small relative site changes (1e-5), but a posterior with standard deviations of 1e-4,
    # which one sweep moves by a tenth of one and more: not settled.
    target = np.array([1.0, -2.0, 30.0])
    with pytest.raises(EstimationError, match="stalled at the smallest damping"):
        _run(_noisy_map(target, 1e-5), np.zeros(3), variance=1e-8)


def _crawl_after(first_step: float):
    """A map that crawls to its fixed point (each sweep 0.1 % of the way: undamped changes
    of ~1e-3), after a first sweep that moved ``first_step``: a best no later sweep beats."""
    target = np.array([1.0, -2.0, 30.0])
    first = []

    def update(post, sites):
        if not first:
            first.append(None)
            return sites + first_step
        return target + 0.999 * (sites - target)

    return update


def test_stalled_sweeps_that_halving_the_damping_does_not_help_raise_at_once():
    # At damping 0.425 the sweeps crawl slower than at 0.85, and would slower still at each
    # halving down to 1/64 (70 sweeps in all): they raise after the first halving, at
    # sweep 21. (The first step, 5e-4, is within tenfold of the crawl's changes.)
    store = _store(_crawl_after(5e-4), np.zeros(3))
    with pytest.raises(EstimationError, match=r"damping 0\.425, which .* after 21 sweeps"):
        damped_sweeps(store, damping=0.85, tol=1e-10, max_iter=1000, memory=0)


def test_stalled_sweeps_whose_change_jumps_past_any_damping_raise_at_once():
    # The same crawl after a first step of 1e-6: from the best sites, the first plain
    # sweep after the stall grows the change ~30000-fold, past the 108-fold that damping
    # 0.85 down to 1/64 could contract: raised there, at sweep 12, not after halving.
    store = _store(_crawl_after(1e-6), np.zeros(3))
    with pytest.raises(EstimationError, match=r"grew faster .* after 12 sweeps"):
        damped_sweeps(store, damping=0.85, tol=1e-10, max_iter=1000, memory=0)


@pytest.mark.parametrize("memory", [0, 5])
def test_sweeps_that_oscillate_halve_the_damping_until_they_converge(memory):
    # Each sweep overshoots the fixed point fivefold: damped by 0.85 or 0.425 the sweeps
    # diverge, by 0.2125 they converge. Halving helps at each step (the least change from
    # the best sites shrinks), though the first halving is no better than the sweeps from
    # the start were.
    target = np.array([1.0, -2.0, 30.0])
    store = _store(lambda post, sites: target - 5.0 * (sites - target), np.zeros(3))
    run = damped_sweeps(store, damping=0.85, tol=1e-10, max_iter=1000, memory=memory)
    assert run.converged
    np.testing.assert_allclose(store.sites, target, rtol=1e-9)


@pytest.mark.parametrize(
    ("mean_shift", "variance_factor", "settled"),
    [(0.0099, 1.0, True), (0.0101, 1.0, False), (0.0, 1.014, True), (0.0, 1.0145, False)],
)
def test_settled_bounds_each_marginals_kl_divergence(mean_shift, variance_factor, settled):
    # One sweep takes the posterior from "0" to "1": a marginal N(0, 1) to
    # N(mean_shift, variance_factor); settled below 5e-5 nats of KL divergence.
    from vsbayes.approximations._damped_sweeps import _settled

    def marginals(post):
        return np.array([post * mean_shift]), np.array([1.0 + post * (variance_factor - 1.0)])

    store = ArraySites(
        0.0, lambda post, sites: 1.0, lambda sites: sites, lambda sites, e: sites, marginals
    )
    assert _settled(store) is settled


@pytest.mark.parametrize("class_weights", [(1.0, 1.0), (1e3, 1e-4)], ids=["plain", "stalling"])
def test_sites_in_row_chunks_take_the_same_sweeps_as_in_memory(class_weights):
    # The chunked store is a backend of the same loop: unmixed, its sweeps are those of the
    # sites in memory, to the round-off of the sums over chunks — also where extreme class
    # weights stall them (back to the best sites, after sweeps 14 and 32, damping halved).
    da = pytest.importorskip("dask.array", reason="the dask extra is not installed")
    from vsbayes.approximations import expectation_propagation
    from vsbayes.models import BinaryGLMPosterior, ChunkedPosterior

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = np.where(X @ np.array([1.0, -0.5, 0.25]) + rng.logistic(size=600) > 0, 1.0, -1.0)
    weights = np.where(y > 0, *class_weights)
    priors = {"prior_var": 4.0, "intercept_prior_var": 100.0}
    in_memory = BinaryGLMPosterior(X, y, weights, "logistic", **priors)
    chunks = [
        da.from_array(X, chunks=(150, -1)),
        *(da.from_array(v, chunks=150) for v in (y, weights)),
    ]
    chunked = ChunkedPosterior(*chunks, "logistic", **priors)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        here = expectation_propagation(in_memory, tol=1e-10, max_iter=40, memory=0)
        there = expectation_propagation(chunked, tol=1e-10, max_iter=40)
    assert (there.n_iter, there.converged) == (here.n_iter, here.converged)
    assert len(caught) == (0 if here.converged else 2)
    np.testing.assert_allclose(there.site_change, here.site_change, rtol=1e-3)
    np.testing.assert_allclose(there.mean, here.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(there.cov, here.cov, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(there.log_Z, here.log_Z, rtol=1e-10)


def test_sites_in_row_chunks_stop_at_the_round_off_of_their_updates_as_in_memory():
    # A tol no sweep reaches: the chunks tell whether their sites moved within the
    # round-off of their updates, and the sweeps stop there, converged and silent, at the
    # sweep where the sites in memory do.
    da = pytest.importorskip("dask.array", reason="the dask extra is not installed")
    from vsbayes.approximations import expectation_propagation
    from vsbayes.models import BinaryGLMPosterior, ChunkedPosterior

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = np.where(X @ np.array([1.0, -0.5, 0.25]) + rng.logistic(size=600) > 0, 1.0, -1.0)
    priors = {"prior_var": 4.0, "intercept_prior_var": 100.0}
    in_memory = BinaryGLMPosterior(X, y, np.ones(600), "logistic", **priors)
    chunks = [
        da.from_array(X, chunks=(150, -1)),
        *(da.from_array(v, chunks=150) for v in (y, np.ones(600))),
    ]
    chunked = ChunkedPosterior(*chunks, "logistic", **priors)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        here = expectation_propagation(in_memory, tol=1e-17, max_iter=200, memory=0)
        there = expectation_propagation(chunked, tol=1e-17, max_iter=200)
    assert here.converged and there.converged and there.n_iter == here.n_iter < 200
    np.testing.assert_allclose(there.mean, here.mean, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("size", [0, 7, 2**20 + 3])  # one pass; slices side by side
def test_damped_step_is_its_formula(size):
    rng = np.random.default_rng(size)
    sites, new = rng.normal(size=size), rng.normal(size=size)
    damped = (1.0 - 0.85) * sites + 0.85 * new
    scale = 1.0 + np.abs(sites)
    residual = (damped - sites) / scale
    with single_blas_thread():  # the fits' context: the slices on the threads BLAS may use
        out = damped_step(sites, new, 0.85)
    for got, want in zip(out[:3], (damped, scale, residual), strict=True):
        np.testing.assert_array_equal(got, want)
    assert out[3] == (np.abs(residual).max() if size else 0.0)
    if size:
        new[size // 2] = np.nan
        assert np.isnan(damped_step(sites, new, 0.85)[3])


@pytest.mark.parametrize("size", [0, 7, 2**19 + 5])
def test_relative_change_is_its_formula(size):
    """The multinomial EP's undamped change (its next sweep's fit stop), on slices in place:
    the whole array's expression, bitwise, NaN included (D-269)."""
    rng = np.random.default_rng(size)
    sites, new = rng.normal(size=size), rng.normal(size=size)
    with single_blas_thread():
        got = relative_change(new, sites)
        assert got == (np.max(np.abs(new - sites) / (1.0 + np.abs(sites))) if size else 0.0)
        if size:
            new[size // 2] = np.nan
            assert np.isnan(relative_change(new, sites))


def test_long_mixing_on_slices_is_its_formula():
    from vsbayes.approximations._damped_sweeps import _long_mix

    rng = np.random.default_rng(1)
    n = 2**19 + 5  # slices side by side
    image, residual, scale = rng.normal(size=n), rng.normal(size=n), 1.0 + rng.random(n)
    differences, gamma = [rng.normal(size=n) for _ in range(2)], [0.3, -1.2]
    want = image.copy()
    for weight, difference in zip(gamma, differences, strict=True):
        want -= weight * difference
    want_move = np.max(np.abs(want - image) / scale + np.abs(residual))
    with single_blas_thread():
        mixed, move = _long_mix(image, gamma, differences, residual, scale)
    np.testing.assert_array_equal(mixed, want)
    assert move == want_move
    residual[n - 1] = np.nan
    assert np.isnan(_long_mix(image, gamma, differences, residual, scale)[1])


def _squared_distance(post, other):
    return float(np.sum((other - post) ** 2))


def test_stalled_sweeps_whose_posterior_settled_against_its_move_keep_the_best_sites():
    """Given a divergence of posteriors, sweeps stalled by their map's noise (here 1e-2,
    far above any change floor) keep their best sites at the first stall, with a warning,
    where one undamped sweep moves the posterior by at most 1e-3 of its divergence from
    the start; without the divergence they go on halving the damping and raise. A move
    of several percent of it is not settled: they raise as before."""
    target = np.array([1.0, -2.0, 30.0])  # squared distance 905 from the start, 0
    options = {"damping": 0.85, "tol": 1e-10, "max_iter": 1000, "memory": 5}
    with pytest.warns(ConvergenceWarning, match=r"moves the posterior by .* of the 9[0-9]{2} nats"):
        run = damped_sweeps(
            _store(_noisy_map(target, 0.01), np.zeros(3)),
            **options,
            divergence=_squared_distance,
        )
    # Kept at the first stall: 10 sweeps without progress after the few that reach the noise.
    assert not run.converged and run.n_iter <= 2 * 10 + 10
    np.testing.assert_allclose(run.posterior, target, rtol=0.03)
    with pytest.raises(EstimationError, match="stalled at the smallest damping"):
        damped_sweeps(_store(_noisy_map(target, 0.01), np.zeros(3)), **options)
    rng = np.random.default_rng(0)

    def noisier(post, sites):  # independent noise of 0.2: a sweep moves ~8 % of 905
        return target + 0.2 * rng.standard_normal(3) * (1.0 + np.abs(target))

    with pytest.raises(EstimationError, match="stalled at"):
        damped_sweeps(_store(noisier, np.zeros(3)), **options, divergence=_squared_distance)


@pytest.mark.parametrize("memory", [0, 5])
def test_sweeps_whose_change_grows_a_hundredfold_are_remedied_at_once(memory):
    # Each sweep overshoots threefold: damped by 0.85 the distance to the fixed point
    # grows 2.4-fold a sweep (as the multinomial EP's sites on nearly separable digits at
    # C = 1e4, whose sweeps cost the more the farther they went), by 0.425 it shrinks. From
    # 1e-3 away the undamped change is 0.0036 · 2.4^(k-1) at sweep k: past 100 × the best at
    # sweep 7, where the sweeps go back to the best sites, unmixed (memory 5), and halve
    # the damping when those grow a hundredfold again — not 10 sweeps after the best
    # (11 sweeps at 0.85 with memory 0, 21 with memory 5, without this rule, as where
    # diverged sweeps cost no more than others).
    target = np.array([0.1, -0.2, 0.3])
    dampings = []

    def update(post, sites):
        return target - 3.0 * (sites - target)

    store = _store(update, target + 1e-3)
    sweep = store.sweep
    store.sweep = lambda post, damping, *bound: (
        dampings.append(damping) or sweep(post, damping, *bound)
    )
    run = damped_sweeps(
        store, damping=0.85, tol=1e-10, max_iter=1000, memory=memory, costly_divergence=True
    )
    assert run.converged
    np.testing.assert_allclose(store.sites, target, rtol=1e-9)
    assert dampings.count(0.85) == (7 if memory == 0 else 13)


def test_sweeps_whose_change_grows_a_hundredfold_wait_for_a_stall_unless_costly():
    # The same map, without costly_divergence (binary EP's sweeps, whose cost does not
    # grow with the sites' distance): the remedies wait for 10 sweeps without progress.
    target = np.array([0.1, -0.2, 0.3])
    dampings = []
    store = _store(lambda post, sites: target - 3.0 * (sites - target), target + 1e-3)
    sweep = store.sweep
    store.sweep = lambda post, damping, *bound: (
        dampings.append(damping) or sweep(post, damping, *bound)
    )
    assert damped_sweeps(store, damping=0.85, tol=1e-10, max_iter=1000, memory=0).converged
    assert dampings.count(0.85) == 11


def test_a_discarded_sweeps_state_goes_back_with_the_best_sites():
    # The diverging map of the test above, with a state as the multinomial EP's rule
    # levels: a sweep from sites 5e-3 or more from the fixed point raises it (rows gone
    # wide refitted on finer rules), and a sweep keeps what the sweeps before raised. The
    # sweeps that diverged are discarded, back to the best sites: the map goes back with
    # them, to the state it had there, so that the sweeps from the best sites run at it,
    # not at the level the discarded sweeps raised (where every later sweep would pay
    # for those finer rules).
    target = np.array([0.1, -0.2, 0.3])
    level = np.zeros(1, dtype=int)
    seen = []  # (the state each sweep ran at, its distance from the fixed point)

    def update(post, sites):
        distance = float(np.max(np.abs(sites - target)))
        seen.append((int(level[0]), distance))
        if distance > 5e-3:
            level[0] += 1
        return target - 3.0 * (sites - target)

    def load(saved):
        level[...] = saved

    store = ArraySites(
        target + 1e-3,
        update,
        lambda sites: sites,
        lambda sites, extrapolated: sites,
        marginals=lambda post: (post, np.ones_like(post)),
        state=(level.copy, load),
    )
    run = damped_sweeps(
        store, damping=0.85, tol=1e-10, max_iter=1000, memory=0, costly_divergence=True
    )
    assert run.converged
    np.testing.assert_allclose(store.sites, target, rtol=1e-9)
    # The best sites are sweep 1's; sweeps 3-7 start 5e-3 or more away and raise the
    # level, sweep 7 diverges (its change 190 times sweep 1's): the sweeps go back to
    # sweep 1's sites, and at the level 0 they had there, never raised again.
    assert [at for at, _ in seen] == [0, 0, 0, 1, 2, 3, 4] + [0] * (len(seen) - 7)


def test_a_diverged_stall_halves_the_damping_whatever_the_diverged_changes():
    # Each sweep overshoots sevenfold: damped by 0.85 or 0.425 the distance to the fixed
    # point grows (5.8- and 2.4-fold a sweep), by 0.2125 it shrinks; and from 0.1 away
    # the map explodes (as the multinomial EP's site fits on cavities gone wide). The
    # store gives up a sweep once its change is past the bound at which the loop discards
    # it, and returns that lower bound (as the multinomial EP skips its refits on finer
    # rules there): the diverged sweeps at 0.85 and at 0.425 then measure the same change,
    # which says nothing of whether halving helped. A stall by divergence halves the
    # damping without that test (which raised at 0.425), down to 0.2125, where the sweeps
    # converge.
    target = np.array([0.1, -0.2, 0.3])
    dampings = []

    def update(post, sites, bound):
        far = np.max(np.abs(sites - target)) > 0.1
        new = target - (1e3 if far else 7.0) * (sites - target)
        change = float(np.max(np.abs(new - sites) / (1.0 + np.abs(sites))))
        if change > bound:  # the lower bound, just past the bound
            new = sites + (new - sites) * (1.0 + 1e-9) * bound / change
        return new

    store = ArraySites(
        target + 1e-2,
        update,
        lambda sites: sites,
        lambda sites, extrapolated: sites,
        marginals=lambda post: (post, np.ones_like(post)),
        bounded=True,
    )
    sweep = store.sweep
    store.sweep = lambda post, damping, *bound: (
        dampings.append(damping) or sweep(post, damping, *bound)
    )
    run = damped_sweeps(
        store, damping=0.85, tol=1e-10, max_iter=1000, memory=0, costly_divergence=True
    )
    assert run.converged
    np.testing.assert_allclose(store.sites, target, rtol=1e-9)
    assert dampings[:5] == [0.85, 0.85, 0.85, 0.425, 0.425]
    assert set(dampings[5:]) == {0.2125}
