"""The work a posterior's fits cost, counted before running them.

Work is counted in multiply-adds, a deterministic stand-in for time: VS's strategy
(``estimators/_strategy.py``) chooses its route by it, and importance sampling's and BMC's
``n_samples="auto"`` (``estimators/_sampling.py``) are sized by it, with the same counts.
"""

from __future__ import annotations

import numpy as np

from .chunked import ChunkedSoftmaxPosterior
from .softmax import SoftmaxGLMPosterior

__all__ = [
    "DUAL_MIN_DIM",
    "EP_SWEEPS",
    "LAPLACE_SHRINKAGE_STEPS",
    "LINK_COST",
    "SHRINKAGE_STEPS",
    "SITE_WORK",
    "expected_ep_work",
    "expected_shrinkage_work",
    "likelihood_point_work",
    "sampled_dim",
    "takes_dual_form",
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


# A binary fit under a shrinkage prior keeps the dense posterior (no structured covariance):
# its mode's Newton steps and EP's sweeps each factor its precision, p × p, or with more
# coefficients than rows the dual M × M form (docs/decisions.md D-235), and EP's sweeps
# read the marginal variances from it; SHRINKAGE_STEPS such steps in all (measured: 8
# Newton steps and 41 sweeps, two factorizations each, under the Student-t at 2000 × 5000
# sparse; the L1 mode's steps add a p × p factorization and the lasso on it, counted as
# p³ each, at most L1_MODE_STEPS of them: 14 there).
SHRINKAGE_STEPS, L1_MODE_STEPS = 100, 20
# A fit that runs no EP (the Laplace approximation) makes Newton's steps alone, and one
# factorization for the covariance: 5-10 steps measured (Student-t and Laplace priors on
# breast cancer, wine, iris and random 200 × 300 and 50 × 600 rows, 2 and 3 classes), a
# margin of two.
LAPLACE_SHRINKAGE_STEPS = 20
#: The Gaussian posteriors (``approximations._glm_gaussian``) take the dual form through
#: the M × M matrix only beyond this p: below, the primal factorization costs under 10⁷
#: flops, and it keeps the digits the dual loses when D⁻¹ - V Vᵀ cancels (a vague intercept
#: prior, or features on a scale of 10⁷, made it lose all of them).
DUAL_MIN_DIM = 256


def takes_dual_form(n_rows: int, dim: int) -> bool:
    """Whether a posterior of ``dim`` coefficients over ``n_rows`` rows takes the dual
    M × M form: more coefficients than rows, and than :data:`DUAL_MIN_DIM`."""
    return dim > max(n_rows, DUAL_MIN_DIM)


def expected_shrinkage_work(model, steps: int = SHRINKAGE_STEPS) -> float:
    """Multiply-adds of a fit of ``model``'s posterior under its shrinkage prior
    (``coefficient_prior``, rows in memory), before running it: ``steps`` steps
    (SHRINKAGE_STEPS with EP's sweeps, LAPLACE_SHRINKAGE_STEPS without) of
    the primal form (the Gram matrix, its factor and inverse, ``M p² + p³``; a sparse
    design's Gram matrix the pairs of each row's non-zeros) or of the dual form (``M³``
    for the M × M factor, its inverse and the variances' solves, and twice M times the
    design's entries for the kernel and the p × M spread), and for a prior with an L1
    part its mode's dense steps (L1_MODE_STEPS × p³).

    A multinomial posterior (p = K(d + 1)) takes the primal form: its Hessian is the
    K(K + 1)/2 class pairs' Gram matrices of the rows (``SoftmaxGLMPosterior.hessian``),
    ``M (d + 1)²`` each, and the dual form needs a prior alike for every class, which a
    shrinkage prior's sites are not (``_softmax_dual.factorizing_prior``)."""
    m, p = model.n_observations, model.dim
    if isinstance(model, _SOFTMAX_MODELS):
        k, intercept = model.n_classes, int(model.fit_intercept)
        width = model.n_features + intercept
        if hasattr(model.X, "indptr"):
            row_entries = np.diff(model.X.indptr).astype(float) + intercept
            gram = float(np.square(row_entries).sum())
        else:
            gram = float(m) * width * width
        step = float(p) ** 3 + 0.5 * k * (k + 1) * gram
    elif takes_dual_form(m, p):
        step = float(m) ** 3 + 2.0 * m * float(model.n_design_entries)
    else:
        design = model.design
        if hasattr(design, "indptr"):
            gram = float(np.square(np.diff(design.indptr).astype(float)).sum())
        else:
            gram = float(m) * p * p
        step = float(p) ** 3 + gram
    work = steps * step
    if model.coefficient_prior.l1 > 0:
        work += L1_MODE_STEPS * float(p) ** 3
    return work


def sampled_dim(model) -> int:
    """The dimension of the points a sampled fit of ``model`` draws: the multinomial
    posterior's (K − 1)(d + 1) contrasts (its shift directions' posterior is the prior's
    conditional, known exactly, and is not sampled:
    :class:`~vsbayes.models.softmax_contrasts.ContrastPosterior`), else θ's."""
    if isinstance(model, _SOFTMAX_MODELS):
        return (model.n_classes - 1) * (model.n_features + int(model.fit_intercept))
    return model.dim
