"""Posterior summaries as people use them: the one home of the coefficient table,
prediction intervals and posterior predictive draws.

The estimators reach these through thin methods of
:class:`~vsbayes.estimators._prediction.PosteriorPrediction` (``summary``,
``predict_proba_interval``, ``sample_proba``, ``sample_y``); the command line prints the
same table. Leave-one-out and WAIC live in :mod:`~vsbayes.estimators._leave_one_out`, the
ArviZ export in :mod:`~vsbayes.estimators._arviz_export`.

**Identified quantities.** The multinomial posterior is invariant to adding one vector to
every class's coefficients, and along that direction it is its prior (variance ``C``, or
10⁶ for the intercepts). The table shows the centred coefficients ``w_k − mean_l w_l``
(scikit-learn's representative, ``Σ_k w_k = 0``), whose posterior the data determine.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from scipy.special import log_softmax, ndtr
from scipy.stats import norm
from sklearn.utils.validation import check_is_fitted

from .._memory import block_length, check_memory
from .._random import as_generator, reproducible_generator
from ..gaussian import CentredStructuredCovariance, StructuredCovariance, StructuredCovariances
from ..models.links import get_link

__all__ = [
    "INTERCEPT_LABEL",
    "check_level",
    "check_n_draws",
    "coefficient_columns",
    "coefficient_table",
    "gaussian_marginals",
    "identified_draws",
    "marginals",
    "marginals_table",
    "proba_interval",
    "sample_coef",
    "sample_proba",
    "variance_error_factor",
]

#: The name of the intercept's row in the tables.
INTERCEPT_LABEL = "(intercept)"


# --- argument checks ----------------------------------------------------------------------


def check_level(level) -> float:
    """``level`` as a float strictly inside (0, 1), else a ValueError naming it."""
    if (
        isinstance(level, bool)
        or not isinstance(level, numbers.Real)
        or not 0.0 < float(level) < 1.0
    ):
        raise ValueError(
            f"level must be a probability strictly between 0 and 1 (e.g. 0.95 for a 95 % "
            f"interval); got {level!r}."
        )
    return float(level)


def check_n_draws(n_draws) -> int:
    """``n_draws`` as a positive int, else a ValueError naming it."""
    if isinstance(n_draws, bool) or not isinstance(n_draws, numbers.Integral) or n_draws < 1:
        raise ValueError(f"n_draws must be an integer >= 1; got {n_draws!r}.")
    return int(n_draws)


def _quantile_z(level: float) -> float:
    """The standard normal quantile of the upper end of the equal-tailed interval."""
    return float(norm.ppf(0.5 + 0.5 * level))


def _interval_names(level: float) -> tuple[str, str]:
    """The columns of the interval's ends, ``"2.5%"`` and ``"97.5%"`` at 0.95: four
    significant digits, more where a narrow interval's ends would round to the median's
    name (or to each other's)."""
    tails = 100.0 * (0.5 - 0.5 * level), 100.0 * (0.5 + 0.5 * level)
    for digits in range(4, 18):
        lower, upper = (f"{tail:.{digits}g}" for tail in tails)
        if float(lower) < 50.0 < float(upper):
            return f"{lower}%", f"{upper}%"
    raise ValueError(
        f"level={level!r} is too small for the interval's ends to differ in float64 (both "
        f"are the median); pass a level of at least 1e-15."
    )


# --- the coefficient table ----------------------------------------------------------------


def _feature_names(estimator, feature_names=None) -> list[str]:
    d = np.shape(estimator.coef_)[1]
    if feature_names is None:
        names = getattr(estimator, "feature_names_in_", None)
        feature_names = list(names) if names is not None else [f"x{j}" for j in range(d)]
    feature_names = [str(name) for name in feature_names]
    if len(feature_names) != d:
        raise ValueError(f"feature_names has {len(feature_names)} names; expected {d}.")
    return feature_names


def marginals(estimator) -> list[tuple[object, np.ndarray, np.ndarray]]:
    """``(class or None, mean, sd)`` of each problem's coefficients then intercept (when
    fitted): one problem for two classes, one per class otherwise; the multinomial
    posterior's centred (identified) coefficients, or under a shrinkage prior the fitted
    ones (the prior identifies them)."""
    check_is_fitted(estimator, "coef_")
    coef = estimator.coef_.toarray() if sp.issparse(estimator.coef_) else estimator.coef_
    coef = np.asarray(coef, dtype=float)
    intercept = np.ravel(estimator.intercept_).astype(float)
    sigma = estimator.sigma_
    binary_structured = isinstance(sigma, StructuredCovariance) and len(coef) == 1
    if binary_structured or isinstance(sigma, StructuredCovariances):
        # Binary, or one-vs-rest's problem by problem: each structure's diagonal only.
        means = np.column_stack([coef, intercept]) if estimator.fit_intercept else coef
        sd = np.sqrt(np.maximum(np.atleast_2d(sigma.diagonal()), 0.0))
        labels = [None] if binary_structured else estimator.classes_
        return [(label, means[k], sd[k]) for k, label in enumerate(labels)]
    if isinstance(sigma, StructuredCovariance):  # the multinomial's: its diagonal only
        # The multinomial θ = [W.ravel(), b], centred over the classes as the dense one's.
        means = np.column_stack([coef, intercept]) if estimator.fit_intercept else coef
        means = means - means.mean(axis=0, keepdims=True)
        sd = np.sqrt(np.maximum(_centred_variances(sigma, *coef.shape), 0.0))
        return [(label, means[c], sd[:, c]) for c, label in enumerate(estimator.classes_)]
    per_problem = gaussian_marginals(
        coef,
        np.asarray(estimator.intercept_, dtype=float),
        np.asarray(sigma, dtype=float),
        bool(estimator.fit_intercept),
        centred=not _prior_identifies_classes(estimator),
    )
    classes = estimator.classes_
    if len(per_problem) == 1:
        return [(None, *per_problem[0])]
    return [(classes[k], *marginal) for k, marginal in enumerate(per_problem)]


def _prior_identifies_classes(estimator) -> bool:
    """Whether a multinomial fit's prior identifies each class's coefficients: a shrinkage
    prior does (its mode is not centred: scikit-learn's L1 zeros), and it is on them that
    it acts; a Gaussian one leaves the common shift to its prior, so the centred ones are
    shown."""
    return getattr(estimator, "_coefficient_factor_", None) is not None


def identified_draws(estimator, coef: np.ndarray, intercept: np.ndarray):
    """Draws of the coefficients and intercepts (layouts of :meth:`sample_coef`'s) as the
    table shows them: a multinomial posterior's centred over the classes, or under a
    shrinkage prior the coefficients as drawn and the intercepts centred (:func:`marginals`'
    rule, so that the ArviZ export summarizes to :func:`coefficient_table`)."""
    if not estimator._is_multinomial():
        return coef, intercept
    if not _prior_identifies_classes(estimator):
        coef = coef - coef.mean(axis=1, keepdims=True)
    return coef, intercept - intercept.mean(axis=1, keepdims=True)


def _centred_variances(sigma: CentredStructuredCovariance, k: int, d: int) -> np.ndarray:
    """(width, K): the variances of each column's K classes centred by ``I − 11ᵀ/K``
    under a structured multinomial covariance (θ = [W.ravel(), b])."""
    variances = sigma.contrast_variances()
    width = variances.size // k
    out = np.empty((width, k))
    out[:d] = variances[: k * d].reshape(k, d).T
    if width > d:
        out[d] = variances[k * d :]
    return out


def gaussian_marginals(coef, intercept, sigma, fit_intercept: bool, *, centred: bool = True):
    """``(mean, sd)`` of each problem's coefficients then intercept, from a fitted
    posterior's arrays (layouts as ``coef_``, ``intercept_``, ``sigma_``): binary
    ``sigma`` (p, p) with one row of ``coef``, one-vs-rest (K, p, p), multinomial (p, p) in
    the layout θ = ``[W.ravel(), b]``, whose coefficients are centred over the classes
    (``centred``; else as they are)."""
    k, d = coef.shape
    if k == 1:  # binary
        mean = np.concatenate([coef[0], intercept[:1]]) if fit_intercept else coef[0]
        return [(mean, np.sqrt(np.maximum(np.diag(sigma), 0.0)))]
    if sigma.ndim == 3:  # one-vs-rest
        out = []
        for c in range(k):
            mean = np.concatenate([coef[c], intercept[c : c + 1]]) if fit_intercept else coef[c]
            out.append((mean, np.sqrt(np.maximum(np.diag(sigma[c]), 0.0))))
        return out
    # Multinomial θ = [W.ravel(), b]: per column j (feature or intercept) the K × K block
    # of the classes, centred by P = I − 11ᵀ/K.
    width = d + int(fit_intercept)
    index = np.empty((width, k), dtype=np.intp)
    index[:d] = (np.arange(k)[None, :] * d) + np.arange(d)[:, None]
    if fit_intercept:
        index[d] = k * d + np.arange(k)
    blocks = sigma[index[:, :, None], index[:, None, :]]  # (width, K, K)
    means = np.concatenate([coef, intercept[:, None]], axis=1) if fit_intercept else coef
    centring = np.eye(k) - 1.0 / k
    variances = np.einsum("ka,jab,kb->jk", centring, blocks, centring)  # (width, K)
    if centred:
        means = means - means.mean(axis=0, keepdims=True)
    else:  # the coefficients as fitted; the unpenalized intercepts centred as usual
        variances[:d] = np.einsum("jkk->jk", blocks[:d])
        means = means.copy()
        means[:, d:] -= means[:, d:].mean(axis=0, keepdims=True)
    sd = np.sqrt(np.maximum(variances, 0.0))
    return [(means[c], sd[:, c]) for c in range(k)]


def coefficient_table(estimator, level: float = 0.95, feature_names=None):
    """The posterior summary of every coefficient and intercept of a fitted estimator.

    Parameters
    ----------
    estimator : BayesianGLMClassifier
        Fitted.
    level : float, default=0.95
        Probability of the equal-tailed credible intervals, in (0, 1).
    feature_names : sequence of str, optional
        Names of the features (default: ``feature_names_in_`` or ``x0, x1, …``).

    Returns
    -------
    pandas.DataFrame or numpy structured array
        See :meth:`~vsbayes.estimators._prediction.PosteriorPrediction.summary`.
    """
    level = check_level(level)
    names = _feature_names(estimator, feature_names)
    return marginals_table(
        marginals(estimator),
        names,
        level,
        _summary_attrs(estimator, level),
        multiclass=len(estimator.classes_) > 2,
        columns=coefficient_columns(estimator),
    )


def coefficient_columns(estimator) -> dict[str, np.ndarray]:
    """The estimator's own per-coefficient columns of the table (the marks), or none.

    An estimator whose prior says something per coefficient — which features automatic
    relevance determination kept, a shrinkage prior's relevance of each coefficient —
    defines ``_coefficient_columns()``: a dict of column name to an array of shape
    ``(n_rows,)`` or ``(n_problems, n_rows)``, one value per row of each problem's block in
    the table (its features, then its intercept when fitted; NaN or True where the column
    does not apply). The table appends them after ``P(sign)``, in the dict's order.
    """
    hook = getattr(estimator, "_coefficient_columns", None)
    return {} if hook is None else dict(hook())


def shrinkage_columns(estimator, factor) -> dict[str, np.ndarray]:
    """The marks of a fit under a shrinkage prior (binary: one problem; multinomial: one
    row of marks per class, the prior being on each class's coefficients): ``relevance``,
    each coefficient's posterior mean of one minus its shrinkage factor given the fitted
    marginal (:meth:`~vsbayes.models.shrinkage_priors.CoefficientFactor.relevance`), and
    under the horseshoe ``selected``, relevance above ½ (Carvalho, Polson & Scott 2010:
    the horseshoe's shrinkage factor has the symmetric prior Beta(½, ½), which gives ½ its
    meaning; the other priors' are not symmetric); the intercept's row NaN and True."""
    d = estimator.n_features_in_
    untouched = getattr(estimator, "_untouched_features_", None)
    relevance, selected = [], []
    for _, mean, sd in marginals(estimator):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            values = factor.relevance(mean[:d], sd[:d] ** 2)
        # A feature no training row touches: its cavity's variance is infinite (no data),
        # its shrinkage factor 1, whatever the marginal's stand-in variance would give.
        if untouched is not None:
            values = np.where(untouched, 0.0, values)
        tail = len(mean) - d
        relevance.append(np.concatenate([values, [np.nan] * tail]))
        selected.append(np.concatenate([values > 0.5, [True] * tail]).astype(bool))
    one = len(relevance) == 1
    columns = {"relevance": relevance[0] if one else np.array(relevance)}
    if factor.selects_at_half:
        columns["selected"] = selected[0] if one else np.array(selected)
    return columns


def marginals_table(
    per_problem, names, level: float, attrs: dict, *, multiclass: bool, columns=None
):
    """The table of :func:`coefficient_table` from ``(class or None, mean, sd)`` per problem
    (:func:`marginals`' layout), the feature names, the attrs and the extra ``columns``
    (see :func:`coefficient_columns`)."""
    columns = {} if columns is None else columns
    z = _quantile_z(level)
    lower_name, upper_name = _interval_names(level)
    blocks = {
        name: np.broadcast_to(np.asarray(values), (len(per_problem), len(per_problem[0][1])))
        for name, values in columns.items()
    }
    # Whole columns at once (a text-scale table has 10⁵–10⁶ rows): arrays, not records.
    labels, row_names = [], []
    for label, mean, _ in per_problem:
        labels += [label] * len(mean)
        row_names += [*names, INTERCEPT_LABEL][: len(mean)]
    mean = np.concatenate([m for _, m, _ in per_problem])
    sd = np.concatenate([spread for _, _, spread in per_problem])
    with np.errstate(divide="ignore", invalid="ignore"):
        # A coefficient fixed at 0 (a pruned feature's point-mass prior) has no sign.
        sign = np.where(sd > 0, ndtr(np.abs(mean) / sd), np.where(mean == 0, np.nan, 1.0))
    values = [mean, sd, mean - z * sd, mean + z * sd, sign]
    values += [
        np.concatenate([block[k, : len(m)] for k, (_, m, _) in enumerate(per_problem)])
        for block in blocks.values()
    ]
    names_of_columns = ["class", "coefficient", "mean", "sd", lower_name, upper_name, "P(sign)"]
    names_of_columns += list(blocks)
    try:
        import pandas as pd
    except ImportError:
        records = list(zip(labels, row_names, *(v.tolist() for v in values), strict=True))
        kinds = ["f8"] * 5 + [block.dtype.str for block in blocks.values()]
        return _structured_table(records, names_of_columns, multiclass, attrs, kinds)
    frame = pd.DataFrame(dict(zip(names_of_columns, [labels, row_names, *values], strict=True)))
    frame = frame.set_index(["class", "coefficient"] if multiclass else "coefficient")
    if not multiclass:
        frame = frame.drop(columns="class")
    frame.attrs.update(attrs)
    return frame


class SummaryArray(np.ndarray):
    """A structured array with the summary's ``attrs`` (used without pandas)."""

    attrs: dict

    def __array_finalize__(self, obj):
        self.attrs = getattr(obj, "attrs", {})


def _structured_table(records, columns, multiclass, attrs, kinds):
    label_width = max((len(str(r[0])) for r in records), default=1)
    name_width = max(len(r[1]) for r in records)
    fields = [("class", f"U{label_width}")] if multiclass else []
    fields += [("coefficient", f"U{name_width}")]
    fields += [(c, kind) for c, kind in zip(columns[2:], kinds, strict=True)]
    rows = [tuple(r if multiclass else r[1:]) for r in records]
    if multiclass:
        rows = [(str(r[0]), *r[1:]) for r in rows]
    table = np.array(rows, dtype=fields).view(SummaryArray)
    table.attrs = dict(attrs)
    return table


def _summary_attrs(estimator, level: float) -> dict:
    """What the table's numbers rest on: the method, its route, its accuracy."""
    strategy = getattr(estimator, "strategy_", None)
    error = getattr(estimator, "kl_error_", None)
    fell_back = getattr(estimator, "laplace_fallback_", None)
    structure = getattr(estimator, "covariance_structure_", None)
    if structure is not None and not isinstance(structure, str):  # one per problem
        structure = [str(each) for each in structure]
    return {
        "level": level,
        "method": getattr(estimator, "_title", type(estimator).__name__),
        "estimator": type(estimator).__name__,
        "log_evidence": estimator.log_marginal_likelihood_value_,
        "route": None if strategy is None else [str(s) for s in strategy],
        "predicted_error": None if error is None else np.asarray(error, dtype=float),
        "laplace_fallback": None if fell_back is None else np.asarray(fell_back),
        "multinomial": bool(estimator._is_multinomial()),
        "covariance": structure,
        "variance_error_factor": variance_error_factor(estimator),
    }


def variance_error_factor(estimator) -> float:
    """The factor within which every variance of the table is the one the dense covariance
    of the same approximation would give: 1 where they are exact (a dense or "dual"
    covariance, the exact marginals of a binary "lowrank" one, whose recorded factor is NaN
    for that reason), else the largest a structured posterior records (``error_factor``:
    an estimated diagonal, the multinomial low-rank structure), which bounds the variance
    of every direction, the centred coefficients' too."""
    factors = [getattr(posterior, "error_factor", 1.0) for posterior in estimator.posteriors_]
    return float(max(1.0 if np.isnan(factor) else factor for factor in factors))


# --- prediction intervals and posterior predictive draws ----------------------------------

#: Arrays of n_classes per row and draw that a block of drawn latent values holds at its
#: peak: the latent values, the softmax's or the links' temporaries, the probabilities, and
#: the labels' cumulative sums or the quantiles' sorted copy. Counted as 3, the blocks of
#: the intervals and the draws took up to 2.2 × their share of the working memory
#: (tracemalloc, 3 and 10 classes); as 7, at most 0.86 ×.
_DRAWN_ARRAYS = 7


def proba_interval(estimator, X, level: float, n_draws: int, random_state):
    """``(lower, upper)`` of each row's class probabilities, (n, n_classes) each: exact
    quantiles through the link for two classes, else quantiles of latent draws."""
    level = check_level(level)
    n_draws = check_n_draws(n_draws)
    predictive = estimator._predictive()
    X = estimator._validate_prediction_data(X)
    z = _quantile_z(level)
    n_classes = len(estimator.classes_)
    if n_classes == 2:
        mean, var = predictive.latent_mean_and_variance(X)
        sd = np.sqrt(var)
        log_cdf = predictive.link.log_cdf
        # The link is increasing: the probability's quantiles are the link's of the latent's.
        # The first class's are P(y = -1 | f) = F(-f) of the same quantiles, in the log
        # domain: 1 - F(f) rounds a probability below 1e-16 to 0, and the interval then
        # left out its own median (and predict_proba's value).
        low, high = mean - z * sd, mean + z * sd
        lower = np.exp(np.column_stack([log_cdf(-high), log_cdf(low)]))
        upper = np.exp(np.column_stack([log_cdf(-low), log_cdf(high)]))
        return lower, upper
    rng = reproducible_generator(random_state)
    tails = [0.5 - 0.5 * level, 0.5 + 0.5 * level]
    lower = np.empty((X.shape[0], n_classes))
    upper = np.empty_like(lower)
    latent = predictive.latent(X)
    multinomial = estimator._is_multinomial()
    # Blocks of rows set by the memory alone, not the latent's chunks (which follow the BLAS
    # threads): each row gets the same draws whatever the threads. Per row: the draws'
    # temporaries (_DRAWN_ARRAYS), and at most a K² · p product of the latent moments.
    width = estimator.coef_.shape[1] + 1
    row_bytes = 8.0 * (_DRAWN_ARRAYS * n_draws * n_classes + n_classes**2 * width)
    check_memory(  # (block_length gives a row at least, whatever its bytes)
        row_bytes,
        f"{n_draws} draws of a row's {n_classes} latent values",
        "Pass a smaller n_draws.",
    )
    rows_per_block = block_length(row_bytes)
    # One set of standard normal draws for every row: a row's interval is then the same
    # whatever rows come with it (each row's draws are still independent of each other).
    draws = rng.standard_normal((n_draws, n_classes))
    for start in range(0, X.shape[0], rows_per_block):
        rows = slice(start, min(start + rows_per_block, X.shape[0]))
        mean, second = latent(rows)
        if multinomial:  # one joint Gaussian of the K latent values per row
            factor = _psd_root(second)  # (r, K, K)
            f = mean + np.einsum("rab,sb->sra", factor, draws)
            proba = np.exp(log_softmax(f, axis=2))
        else:  # independent problems, probabilities normalized
            f = mean + np.sqrt(second) * draws[:, None, :]
            proba = _normalized_links(predictive.link, f)
        lower[rows], upper[rows] = np.quantile(proba, tails, axis=0)
    return lower, upper


def _psd_root(cov: np.ndarray) -> np.ndarray:
    """``R`` with ``R Rᵀ = cov`` for each positive semi-definite matrix of a stack."""
    values, vectors = np.linalg.eigh(0.5 * (cov + np.swapaxes(cov, 1, 2)))
    return vectors * np.sqrt(np.maximum(values, 0.0))[:, None, :]


def sample_coef(estimator, n_draws: int, random_state, held: float = 0.0, what: str = ""):
    """``(coef, intercept)`` drawn from the posterior (see ``sample_coef``), the draws and
    their temporaries (a standard normal and a product per parameter and draw: 3 copies)
    sized first, beside ``held`` bytes of the caller's (``what``)."""
    # The predictive first: its fitted check is this read's one (a second cost as much as
    # the draw's product, D-270); it holds the fitted arrays (a float64 copy of a float32
    # or sparse coef_), no draw.
    predictive = estimator._predictive()
    n_draws = check_n_draws(n_draws)
    n_params = predictive.coef.size + predictive.intercept.size
    check_memory(
        held + 8.0 * 3 * n_draws * n_params,
        f"{n_draws} posterior draws of {n_params} parameters{what}",
        "Draw fewer (n_draws), or draw in batches.",
    )
    return predictive.sample(n_draws, as_generator(random_state))


def sample_proba(estimator, X, n_draws: int, random_state) -> np.ndarray:
    """Class probabilities at X under coefficient draws: (n_draws, n, n_classes)."""
    n_draws = check_n_draws(n_draws)
    X = estimator._validate_prediction_data(X)
    n_classes = len(estimator.classes_)
    coef, intercept = sample_coef(
        estimator,
        n_draws,
        random_state,
        8.0 * n_draws * X.shape[0] * n_classes,
        f" and the {n_draws} × {X.shape[0]} × {n_classes} drawn probabilities (pass fewer "
        f"rows at a time)",
    )
    out = np.empty((n_draws, X.shape[0], n_classes))
    for rows, proba in _drawn_probabilities(estimator, X, coef, intercept):
        out[:, rows] = proba
    return out


def sample_labels(estimator, X, n_draws: int, random_state) -> np.ndarray:
    """Labels drawn from the posterior predictive: (n_draws, n).

    Each draw's label is read from its probabilities block by block of rows: only the
    labels (with their uniform draws and class indices) are held whole, never the
    n_draws × n × n_classes probabilities and their cumulative sums.
    """
    n_draws = check_n_draws(n_draws)
    X = estimator._validate_prediction_data(X)
    rng = as_generator(random_state)
    n = X.shape[0]
    # Per label: its uniform draw, its class index and the label itself.
    label_bytes = 16.0 + estimator.classes_.dtype.itemsize
    coef, intercept = sample_coef(
        estimator,
        n_draws,
        rng,
        label_bytes * n_draws * n,
        f" and the {n_draws} × {n} drawn labels (pass fewer rows at a time)",
    )
    uniform = rng.random((n_draws, n))  # (after the coefficients': the draws' order)
    index = np.empty((n_draws, n), dtype=np.intp)
    for rows, proba in _drawn_probabilities(estimator, X, coef, intercept):
        cumulative = np.cumsum(proba, axis=2)
        scaled = uniform[:, rows, None] * cumulative[..., -1:]
        index[:, rows] = np.minimum((scaled >= cumulative).sum(axis=2), proba.shape[2] - 1)
    return estimator.classes_[index]


def _drawn_probabilities(estimator, X, coef: np.ndarray, intercept: np.ndarray):
    """``(rows, probabilities)`` of each block of X's rows under the coefficient draws
    (layouts of :meth:`sample_coef`'s): (n_draws, rows, n_classes) each, the blocks sized by
    the memory alone."""
    n_draws, n_classes = coef.shape[0], len(estimator.classes_)
    link = get_link(estimator._link)
    multinomial = estimator._is_multinomial()
    for rows in _row_blocks(X.shape[0], 8.0 * _DRAWN_ARRAYS * n_draws * n_classes):
        f = np.swapaxes(_latent_draws(X[rows], coef, intercept), 1, 2)  # (S, r, problems)
        if n_classes == 2:  # P(y = -1 | f) = F(-f), each in the log domain
            proba = np.exp(np.stack([link.log_cdf(-f[..., 0]), link.log_cdf(f[..., 0])], axis=2))
        elif multinomial:
            proba = np.exp(log_softmax(f, axis=2))
        else:
            proba = _normalized_links(link, f)
        yield rows, proba


def _normalized_links(link, f: np.ndarray) -> np.ndarray:
    """One-vs-rest probabilities ``F(f_k) / Σ_l F(f_l)`` over the last axis, normalized in
    the log domain: a row far out (a probit latent below -38 for every class) underflows
    every ``F`` to 0, and the linear sums gave 0/0, NaN probabilities and, in ``sample_y``,
    the first class silently."""
    return np.exp(log_softmax(link.log_cdf(f), axis=-1))


def _row_blocks(n: int, bytes_per_row: float):
    step = block_length(bytes_per_row)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _latent_draws(X, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """``f[s, k, i] = x_i · coef[s, k] + intercept[s, k]`` for a block of rows (one GEMM,
    the rows last so that nothing is transposed)."""
    S, k, d = coef.shape
    product = X @ coef.reshape(S * k, d).T if sp.issparse(X) else None
    if product is None:
        product = coef.reshape(S * k, d) @ X.T  # (S k, rows)
    else:
        product = np.ascontiguousarray(np.asarray(product).T)
    product = product.reshape(S, k, X.shape[0])
    product += intercept[:, :, None]
    return product
