"""The ArviZ export of a fitted estimator: its posterior draws, their pointwise
log-likelihood and the fit's diagnostics as ArviZ's DataTree.

The estimators reach it through
:meth:`~vsbayes.estimators._prediction.PosteriorPrediction.to_inference_data`.

**Draws of the approximation.** The draws are the Gaussian approximation q's, not the exact
posterior's. With the training data the export carries, per draw, ``sample_stats.lp``
(``log p(y | θ) + log p(θ)``, the target up to a constant) and ``sample_stats.log_q`` (q's
log density), which is what ArviZ's leave-one-out of an approximate posterior needs
(``arviz_stats.loo_approximate_posterior``; Magnusson et al. 2019): it reweights the draws
to the posterior, as :func:`~vsbayes.estimators._leave_one_out.leave_one_out`'s PSIS route
does; a structured (text-scale) posterior's ``log_q`` from its factors, in O(p r) per draw
(:meth:`~vsbayes.gaussian.StructuredGaussian.logpdf`). ``arviz_stats.loo`` takes the
draws for exact posterior draws and smooths ``1 / p(y_i | θ)`` alone; on a row predicted
with near certainty those weights are equal to within ~1e-9 and ArviZ's Pareto fit, which
subtracts their exponentials, finds its tail flat in float64 and returns NaN for the row
(the exported log-likelihoods are exact).
"""

from __future__ import annotations

import numpy as np
from sklearn.utils.validation import check_is_fitted

from .._memory import block_length, check_memory, memory_limit
from .._random import reproducible_generator
from ..models.links import get_link
from ._leave_one_out import _log_prior, _PosteriorDraws, _training_data
from ._summaries import _feature_names, _summary_attrs, check_n_draws, identified_draws

__all__ = ["to_inference_data"]

# --- ArviZ --------------------------------------------------------------------------------


def to_inference_data(
    estimator, X, y, sample_weight, n_draws: int, random_state, feature_names=None, name=None
):
    """ArviZ's DataTree of a fitted estimator (see
    :meth:`~vsbayes.estimators._prediction.PosteriorPrediction.to_inference_data`);
    ``name``: the class the user called, if it delegated here (errors name it)."""
    n_draws = check_n_draws(n_draws)
    if (X is None) != (y is None) or (X is None and sample_weight is not None):
        given, missing = ("X", "y") if X is not None else ("y", "X")
        if X is None and y is None:
            given, missing = "sample_weight", "X and y"
        raise ValueError(
            f"to_inference_data got {given} without {missing}: the log_likelihood group "
            f"needs the training data X and y (with their sample_weight). Pass both, or "
            f"neither for the posterior alone."
        )
    check_is_fitted(estimator, "coef_")
    data = None  # (checked before ArviZ's import, which takes longer than the checks)
    if X is not None:
        data = _training_data(estimator, X, y, sample_weight, name)
        if len(estimator.classes_) > 2 and not estimator._is_multinomial():
            raise ValueError(
                "log_likelihood needs a joint model of the labels; a one-vs-rest fit has "
                "none. Pass X=None, y=None for the posterior alone."
            )
    try:
        import arviz_base
    except ImportError as error:
        raise ImportError(
            "to_inference_data needs ArviZ (arviz-base): pip install 'vsbayes[arviz]'."
        ) from error
    names = _feature_names(estimator, feature_names)
    # Held at once: the draws as drawn (and their spread's temporary), the exported
    # (centred) copy, and with the data each row's log-likelihood at each draw.
    p = int(np.prod(np.shape(estimator.coef_))) + np.size(estimator.intercept_)
    n_rows = 0 if data is None else X.shape[0]
    per_draw = 8.0 * (3 * p + n_rows)
    check_memory(
        n_draws * per_draw,
        f"{n_draws} posterior draws of {p} parameters"
        + (f" and their log-likelihoods at {n_rows} rows" if n_rows else ""),
        f"Pass a smaller n_draws (about {int(memory_limit() // per_draw)} fit).",
    )
    rng = reproducible_generator(random_state)
    coef, intercept = estimator._predictive().sample(n_draws, rng)
    raw = coef, intercept
    multiclass = len(estimator.classes_) > 2
    classes = [str(c) for c in estimator.classes_]
    # The identified coefficients, as summary() shows them (multinomial: centred).
    coef, intercept = identified_draws(estimator, coef, intercept)
    posterior = {"coef": coef[None], "intercept": intercept[None]}
    dims = {"coef": ["class", "feature"], "intercept": ["class"]}
    coords = {"feature": names, "class": classes if multiclass else [classes[1]]}
    if not estimator.fit_intercept:
        del posterior["intercept"], dims["intercept"]
    groups = {"posterior": posterior}
    attrs = {"inference_library": "vsbayes"}
    for key, value in _summary_attrs(estimator, 0.95).items():
        if key == "route" and value is not None:
            attrs[key] = ", ".join(value)
        elif isinstance(value, str | bool | float | int):
            attrs[key] = value
        elif value is not None and np.size(value) == 1:
            attrs[key] = np.ravel(value)[0].item()
    for name, value in getattr(estimator.posteriors_[0], "diagnostics", dict)().items():
        if isinstance(value, bool | int | float | str | np.generic):
            attrs[name] = value.item() if isinstance(value, np.generic) else value
    if data is not None:
        draws = _Draws(estimator, data, coef, intercept)
        # Filled block by block: a list of the blocks joined at the end held it twice.
        log_likelihood = np.empty((n_draws, n_rows))
        for rows in draws.blocks():
            log_likelihood[:, rows] = draws.row_log_likelihood(rows)
        groups["log_likelihood"] = {"y": log_likelihood[None]}
        groups["observed_data"] = {"y": np.asarray(y)}
        lp, log_q = _log_densities(estimator, data, *raw, log_likelihood.sum(axis=1))
        groups["sample_stats"] = {"lp": lp[None], "log_q": log_q[None]}
        dims["y"] = ["obs_id"]
        coords["obs_id"] = np.arange(len(data.weights))
    tree = arviz_base.from_dict(groups, coords=coords, dims=dims, attrs={"posterior": attrs})
    return tree


def _log_densities(estimator, data, coef, intercept, log_likelihood):
    """``(lp, log_q)`` at each draw: the target ``log p(y | θ) + log p(θ)`` and the
    approximation's log density, each up to a constant.

    A structured (text-scale) posterior's ``log_q`` comes from its factors in O(p r) per
    draw (:meth:`~vsbayes.gaussian.StructuredGaussian.logpdf`): the density of the Gaussian
    the draws come from — with estimated marginal variances, that Gaussian and not the
    exact Laplace approximation it stands for, which is what reweighting its draws needs.
    In blocks of draws: θ in the posterior's layout is a block's copy of the draws."""
    (posterior,) = estimator.posteriors_
    n_draws, n_problems, d = coef.shape
    log_prior_of = _log_prior(estimator, data, n_problems, d, posterior.dim)
    lp, log_q = np.empty(n_draws), np.empty(n_draws)
    # θ, its difference from the mean and the prior's squares: a few copies of a block.
    step = block_length(8.0 * 4 * (n_problems * (d + 1)))
    for start in range(0, n_draws, step):
        draws = slice(start, min(start + step, n_draws))
        # [w, b] of the binary problem, [W.ravel(), b] multinomial (the raw draws: the
        # prior is not invariant to the classes' common shift).
        parts = [coef[draws].reshape(-1, n_problems * d), intercept[draws]]
        theta = np.concatenate(parts, axis=1)[:, : posterior.dim]
        lp[draws] = log_likelihood[draws] + log_prior_of(theta)
        log_q[draws] = posterior.logpdf(theta)
    return lp, log_q


class _Draws(_PosteriorDraws):
    """Given draws of the coefficients: their rows' log-likelihoods (for the export)."""

    exact = True

    def __init__(self, estimator, data, coef, intercept):
        self.link = get_link(estimator._link)
        self.data, self.coef, self.intercept = data, coef, intercept
        self.multinomial = estimator._is_multinomial()
