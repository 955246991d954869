"""The work a posterior's fits cost, counted before running them.

Work is counted in multiply-adds, a deterministic stand-in for time: VS's strategy
(``estimators/_strategy.py``) chooses its route by it, and importance sampling's and BMC's
``n_samples="auto"`` (``estimators/_sampling.py``) are sized by it, with the same counts.
"""

from __future__ import annotations

from .chunked import ChunkedSoftmaxPosterior
from .softmax import SoftmaxGLMPosterior

__all__ = [
    "EP_SWEEPS",
    "LINK_COST",
    "SITE_WORK",
    "expected_ep_work",
    "likelihood_point_work",
    "sampled_dim",
]

_SOFTMAX_MODELS = (SoftmaxGLMPosterior, ChunkedSoftmaxPosterior)

# The log-density at one point costs a pass over the design (its non-zeros if sparse) and
# LINK_COST per row for the link.
LINK_COST = 30
# EP's expected work (VS's strategy compares it with the global fit's where the rows are
# many, _strategy.DATA_RICH): EP_SWEEPS sweeps of M × (2p² + SITE_WORK), a site costing
# SITE_WORK multiply-adds in practice (measured: ~2.5 µs per site and sweep, 2·10⁵ rows ×
# 20). VS's strategy bounds its global fit by EP_WORK_RATIO (_sampling.py) times EP's work.
EP_SWEEPS, SITE_WORK = 20, 10_000


def likelihood_point_work(model) -> float:
    """Multiply-adds of the log-density at one point: a pass over the design and the link
    at each row; for the multinomial posterior, its K linear predictors per row and the
    map from the contrasts to θ (see LINK_COST)."""
    if isinstance(model, _SOFTMAX_MODELS):
        k, d, m = model.n_classes, model.n_features, model.n_observations
        return m * k * (d + 1 + LINK_COST) + model.dim * sampled_dim(model)
    return float(model.n_design_entries) + model.n_observations * LINK_COST


def expected_ep_work(model) -> float:
    """Multiply-adds of a binary EP fit of ``model``'s posterior, before running it (see
    EP_SWEEPS)."""
    m, p = model.n_observations, model.dim
    return EP_SWEEPS * m * (2.0 * p * p + SITE_WORK)


def sampled_dim(model) -> int:
    """The dimension of the points a sampled fit of ``model`` draws: the multinomial
    posterior's (K − 1)(d + 1) contrasts (its shift directions' posterior is the prior's
    conditional, known exactly, and is not sampled:
    :class:`~vsbayes.models.softmax_contrasts.ContrastPosterior`), else θ's."""
    if isinstance(model, _SOFTMAX_MODELS):
        return (model.n_classes - 1) * (model.n_features + int(model.fit_intercept))
    return model.dim
