"""How many rounds a VS fit adds, and how large: the ``extend`` rule of
:func:`~vsbayes.engine.rounds.run_rounds` for ``target_kl`` and ``time_budget``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from .._memory import memory_limit
from ._validation import check_positive_int
from .results import RoundInfo
from .rounds import Extension
from .sample_pool import grown_bytes_per_point

__all__ = ["extension_rule"]

# The 90 % quantile of a χ² with n degrees of freedom over its mean is about 1 + z √(2/n).
_QUANTILE_Z = 1.2816

# A budget's margin on the predicted time of a further round when choosing whether a round
# is the last.
_MARGIN = 1.15

# A fit's cost per point grows with the pool, like pool ** _FIT_GROWTH: its arrays outgrow
# the caches and touch fresh memory. Measured on Ionosphere-logistic (d = 34), 2 solver
# iterations: 0.52-0.54 ms per n points at 256n, 0.59-0.62 at 512n, 0.63-0.77 at 1024n.
_FIT_GROWTH = 0.15

# With a target, an added round at most multiplies the pool by this: the 1/N law that sizes
# it holds only while the added kernel (the latest fit, widened) sees the target as the
# pool's kernels did; the round's effective sample size checks that (run_rounds stops at
# "stalled"). digits3's probit (d = 65): one round of 32× the pool, planned by the law from
# 32n, lowered the effective sample size of p/π from 1733 to 1287 (most of 84 s). At 4×,
# heavy-tailed targets' noisy effective sample sizes stalled fits that met their target
# (29 of 72 met against 35); at 8× as many met as without a cap (D-224).
_MOST_GROWTH = 8.0

# A round under a budget alone may draw up to what this many times the rest of the budget
# seems to allow: its deadline (see _deadline) ends it, so a faster minute than the last
# round's, or a cost per point that falls with the round's size, can use the budget.
_ROOM = 2.0


def _round_cost(last: RoundInfo, pool: int) -> Callable[[int], float]:
    """Predicted seconds of a round adding s points to a pool of ``pool``: drawing and
    evaluating them, then fitting all ``pool + s``, at the cost per point of the ``last``
    round (whose fit saw the ``pool``)."""
    draw = last.draw_seconds / last.n_samples
    fit = last.fit_seconds / pool
    return lambda s: draw * s + fit * (pool + s)


def _largest_below(cost: Callable[[int], float], limit: float, most: int) -> int:
    """The largest ``s ≤ most`` with ``cost(s) ≤ limit`` (``cost`` increasing, ``cost(1) ≤
    limit``), by bisection."""
    low, high = 1, most
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if cost(middle) <= limit else (low, middle - 1)
    return low


def _deadline(last: RoundInfo, pool: int, started: float, budget: float, planned=None):
    """The ``enough(drawn, following, seconds)`` test of a round under a time budget,
    begun ``started`` seconds into the fit on a pool of ``pool`` points.

    The round's drawing stops where the fit's predicted end is nearest the budget: the
    drawing as it goes, then the fit of all points at the last round's cost per point,
    grown with the pool (_FIT_GROWTH). The drawing's own speed does not carry over to the
    fit: a slow drawing is mostly its fresh memory being touched, which the fit is not.

    With ``planned`` (a budget alone), the round also stops once it has ``planned``
    points if a further round (an eighth of the pool) is then predicted to fit after it,
    with a margin; if not, it is the last and goes on to fill the budget.
    """
    fit_rate = last.fit_seconds / pool

    def fit_seconds(points: int) -> float:
        return fit_rate * points * (points / pool) ** _FIT_GROWTH

    def enough(drawn: int, following: int, seconds: float) -> bool:
        rate = (seconds - started) / drawn
        end_now = seconds + fit_seconds(pool + drawn)
        end_after = seconds + rate * following + fit_seconds(pool + drawn + following)
        if end_after - budget > budget - end_now:
            return True
        if planned is None or drawn < planned:
            return False
        after = pool + drawn
        further = rate * (after // 8) + fit_seconds(after + after // 8)
        return end_now + _MARGIN * further <= budget

    return enough


def extension_rule(
    n_samples: int,
    n_params: int,
    target_kl: float | None,
    max_samples: int | None,
    time_budget: float | None,
    dim: int,
):
    """The ``extend`` rule of :func:`~vsbayes.engine.rounds.run_rounds` for ``target_kl``
    and ``time_budget`` (see :func:`~vsbayes.engine.variational_sampling.variational_sampling`),
    or None when neither is asked for; validates them. ``max_samples`` is capped at the
    points whose grown pool fits within the memory limit (at least ``n_samples``)."""
    if target_kl is None and time_budget is None:
        if max_samples is not None:
            raise ValueError("max_samples needs target_kl or time_budget.")
        return None
    if target_kl is not None and not (math.isfinite(target_kl) and target_kl > 0):
        raise ValueError(f"target_kl must be a positive number of nats; got {target_kl!r}.")
    if time_budget is not None and not (math.isfinite(time_budget) and time_budget > 0):
        raise ValueError(f"time_budget must be a positive number of seconds; got {time_budget!r}.")
    max_samples = (
        16 * n_samples if max_samples is None else check_positive_int(max_samples, "max_samples")
    )
    if max_samples < n_samples:
        raise ValueError(f"max_samples={max_samples} is below n_samples={n_samples}.")
    # Added rounds stop where their pool would outgrow memory, not at numpy's MemoryError.
    affordable = int(memory_limit() // grown_bytes_per_point(dim))
    max_samples = max(n_samples, min(max_samples, affordable))
    quantile = 1.0 + _QUANTILE_Z * math.sqrt(2.0 / n_params)

    def extend(fit, infos: list[RoundInfo], seconds: float) -> Extension:
        n_total = sum(info.n_samples for info in infos)
        if target_kl is not None:
            predicted = quantile * fit.kl_error
            if predicted <= target_kl:
                return Extension(0, "target_kl")
            # An infinite prediction (n ≥ the fit's ESS): double the points. The 1/N law
            # assumes the added points see the target as the pool's did; a round at most
            # _MOST_GROWTH times the pool checks it before the points are spent.
            growth = 1.1 * predicted / target_kl - 1.0 if math.isfinite(predicted) else 1.0
            size = math.ceil(n_total * min(growth, _MOST_GROWTH - 1.0))
        else:  # a budget alone: double the points while it allows
            size = n_total
        size = min(max(size, n_total // 2), max_samples - n_total)
        if size < max(1, n_total // 8):
            return Extension(0, "max_samples")
        if time_budget is None:
            return Extension(size)
        cost = _round_cost(infos[-1], n_total)
        remaining = time_budget - seconds
        if cost(max(1, n_total // 8)) > remaining:
            return Extension(0, "time_budget")
        deadline = functools.partial(_deadline, infos[-1], n_total, seconds, time_budget)
        largest = _largest_below(cost, remaining, max_samples - n_total)
        if target_kl is not None:
            return Extension(min(size, largest), None, deadline())
        # A budget alone: the round doubles the points if a further round can follow it,
        # else it is the last and fills the budget (its deadline decides which, as it
        # draws). Round times vary by tens of per cent: draw it with room to spare.
        roomy = _largest_below(cost, _ROOM * remaining, max_samples - n_total)
        return Extension(min(size, largest), None, deadline(min(size, roomy)), roomy)

    return extend
