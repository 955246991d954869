"""The adaptive-rounds driver of the sampling fitters (VS, IS and BMC).

A *round* draws points through a Gaussian kernel and evaluates the target there. With
several rounds, each kernel is the previous round's fit with its covariance scaled by
``kernel_scale``; every fit pools the points of all rounds so far (a
:class:`~vsbayes.engine.sample_pool.SamplePool`), weighted against the mixture of the
round kernels (each with proportion ``N_r / N``), which is a valid window for VS and IS
alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._blas import one_blas_thread
from .._progress import stage
from .._random import as_generator
from ..exceptions import EstimationError
from ..gaussian import Gaussian
from ..sampling import KernelDraws, draw_from_kernel, get_rule
from .results import RoundInfo
from .sample_pool import SamplePool, check_pool_memory, evaluate_log_target

__all__ = ["Extension", "run_rounds"]

# A round with a deadline draws its points in this many chunks, testing it after each.
_CHUNKS = 8


class Extension(NamedTuple):
    """What the ``extend`` rule of :func:`run_rounds` asks for.

    Attributes
    ----------
    size : int
        Points of the round to add; 0 stops.
    reason : str or None
        Why it stops (recorded as the result's ``stop_reason``).
    enough : callable or None
        ``enough(drawn, following, seconds) -> bool``: the round's deadline. With a random
        rule the round is drawn in chunks (an eighth of ``size``), up to ``most`` points,
        and after each chunk (``drawn`` points so far, ``following`` in the next chunk,
        ``seconds`` since the start) a true answer ends the drawing: the round is the
        points drawn so far. Other rules draw ``size`` points.
    most : int
        Most points of a round drawn against ``enough`` (default: ``size``).
    """

    size: int
    reason: str | None = None
    enough: Callable[[int, int, float], bool] | None = None
    most: int = 0


def _round_sizes(n_samples: int, rounds: int) -> list[int]:
    base = n_samples // rounds
    return [base] * (rounds - 1) + [n_samples - base * (rounds - 1)]


@one_blas_thread
def run_rounds(
    log_target: Callable,
    kernel: Gaussian,
    n_samples: int,
    *,
    rounds: int,
    kernel_scale: float,
    rule,
    random_state,
    estimate: Callable,
    extend: Callable | None = None,
    name: str = "sampling",
):
    """Draw, evaluate and fit over ``rounds`` rounds of kernel adaptation.

    Parameters
    ----------
    estimate : callable
        ``estimate(pool, previous_fit, final) -> result``, with ``final`` true in the
        last round (earlier fits only serve as kernels); it may raise
        :class:`~vsbayes.exceptions.EstimationError`. A failure in an intermediate round
        is recorded and the next round reuses the same kernel; in the last round it
        propagates.
    extend : callable, optional
        ``extend(result, infos, seconds) -> (size, reason)``, asked after the last planned
        round and after every added one, with the :class:`~vsbayes.engine.RoundInfo` records
        so far and the seconds since the start: ``size > 0`` adds a round of that many points
        (drawn from the latest fit, ``kernel_scale`` times wider, and fitted as a last
        round with all points so far); ``size == 0`` stops with ``reason``, recorded as
        the result's ``stop_reason`` when it has one. A failed added round stops with
        ``"failed"`` and keeps the previous fit; one whose fit has no larger effective
        sample size (``ess``) than the fit before it stops with ``"stalled"`` and keeps
        whichever of the two predicts the smaller error (``kl_error``).
    name : str, default="sampling"
        The method, as an observer of the fit (:mod:`vsbayes._progress`) sees it; each
        round is one of its iterations, with the fit it ends with.

    Returns
    -------
    result
        The last round's estimate with its ``rounds`` diagnostic replaced by the list of
        :class:`~vsbayes.engine.RoundInfo` (the estimates are built with ``rounds=None``).
    """
    check_pool_memory(n_samples, kernel.dim, name)
    with stage(name, "round") as steps:
        result = _rounds(
            log_target,
            kernel,
            n_samples,
            rounds,
            kernel_scale,
            rule,
            random_state,
            estimate,
            extend,
            steps,
        )
        if steps is not None:
            steps.result(lambda: result)
    return result


def _rounds(
    log_target,
    kernel,
    n_samples,
    rounds,
    kernel_scale,
    rule,
    random_state,
    estimate,
    extend,
    steps,
):
    """:func:`run_rounds`, each round reported to ``steps`` (None: to nobody)."""
    started = time.perf_counter()
    rng = as_generator(random_state)
    rule = get_rule(rule)
    pool = SamplePool()
    current, fit, infos = kernel, None, []

    def run_round(size, final, enough=None, most=0):
        """Draw ``size`` points through ``current`` (up to ``most`` against ``enough``, see
        :class:`Extension`), pool them and fit: the round's record and its fit (None when
        an intermediate fit failed)."""
        if steps is not None:
            steps.begin(None if fit is None else (lambda: fit))
        clock = time.perf_counter()
        if enough is None or not rule.random:
            draws = draw_from_kernel(current, size, rule, rng)
            pool.add(current, draws, evaluate_log_target(log_target, draws.x))
        else:
            most = max(size, most)
            draws = _draw_until(log_target, current, size, most, rule, rng, enough, started)
            pool.add(current, *draws)
        size = pool.sizes[-1]
        drawn = time.perf_counter()
        try:
            new_fit = estimate(pool, fit, final)
        except EstimationError:
            if final:
                if steps is not None:
                    steps.end(None)  # the round ended, without a fit
                raise
            new_fit = None
        n_iter = 0 if new_fit is None else getattr(new_fit, "n_iter", 0)
        timing = {"draw_seconds": drawn - clock, "fit_seconds": time.perf_counter() - drawn}
        if steps is not None:
            steps.end(None if new_fit is None else (lambda: new_fit))
        return RoundInfo(current, size, n_iter, new_fit is not None, **timing), new_fit

    sizes = _round_sizes(n_samples, rounds)
    for r, size in enumerate(sizes):
        last = r == len(sizes) - 1
        info, new_fit = run_round(size, last)
        infos.append(info)
        if new_fit is None:  # the next round reuses the kernel
            continue
        fit = new_fit
        if not last:
            current = Gaussian(fit.mean, kernel_scale * fit.cov)
    if extend is None:
        return fit.replace(rounds=infos)
    while True:
        size, reason, enough, most = extend(fit, infos, time.perf_counter() - started)
        if size <= 0:
            break
        current = Gaussian(fit.mean, kernel_scale * fit.cov)
        try:
            info, new_fit = run_round(size, True, enough, most)
        except EstimationError:
            infos.append(RoundInfo(current, size, 0, False))
            reason = "failed"
            break
        infos.append(info)
        if not new_fit.ess > fit.ess:
            # The added points raised no effective sample size of the target's weights:
            # their kernel (the latest fit, widened) sees less of the target than the pool
            # did, and further rounds drawn from such kernels would too (D-224). The fit
            # with the smaller predicted error is kept.
            fit = new_fit if new_fit.kl_error <= fit.kl_error else fit
            reason = "stalled"
            break
        fit = new_fit
    return fit.replace(rounds=infos, stop_reason=reason)


def _draw_until(log_target, kernel, size, most, rule, rng, enough, started):
    """Up to ``most`` points of a random rule through ``kernel`` with their target values,
    drawn in chunks of an eighth of ``size`` until ``enough`` (see :class:`Extension`)
    ends it. Independent chunks of a random rule, each weighted by its share of the
    points, are one valid rule.

    The chunks are written into arrays for all ``most`` points, so that their memory is
    first touched (slow on a virtual machine) while the deadline is being watched, and
    the round is their first rows: no copy after the last test.
    """
    d = kernel.dim
    x, z = np.empty((most, d)), np.empty((d, most)).T  # z coordinate-major, as the rules'
    log_w, values = np.empty(most), np.empty(most)
    chunk = max(1, math.ceil(size / _CHUNKS))
    shares, drawn = [], 0
    while drawn < most:
        rows = slice(drawn, min(drawn + chunk, most))
        draws = draw_from_kernel(kernel, rows.stop - rows.start, rule, rng)
        x[rows], z[rows], log_w[rows] = draws
        values[rows] = evaluate_log_target(log_target, draws.x)
        shares.append(rows)
        drawn = rows.stop
        following = min(chunk, most - drawn)
        if following and enough(drawn, following, time.perf_counter() - started):
            break
    for rows in shares:
        log_w[rows] += math.log((rows.stop - rows.start) / drawn)
    return KernelDraws(x[:drawn], z[:drawn], log_w[:drawn]), values[:drawn]
