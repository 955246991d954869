"""Posterior summaries as people use them: the one home of the coefficient table, prediction
intervals, posterior predictive draws, leave-one-out and the ArviZ export.

The estimators reach these through thin methods of
:class:`~vsbayes.estimators._prediction.PosteriorPrediction` (``summary``,
``predict_proba_interval``, ``sample_proba``, ``sample_y``, ``loo``,
``to_inference_data``); the command line prints the same table.

**Identified quantities.** The multinomial posterior is invariant to adding one vector to
every class's coefficients, and along that direction it is its prior (variance ``C``, or
10⁶ for the intercepts). The table shows the centred coefficients ``w_k − mean_l w_l``
(scikit-learn's representative, ``Σ_k w_k = 0``), whose posterior the data determine.

**Leave-one-out.** ``elpd_loo = Σ_i log p(y_i | y_−i)``, each term the predictive density
of row i's likelihood factor ``F^{s_i}`` under the posterior without that row:

- where expectation propagation ran, from its cavities: the posterior without a row's site
  *is* EP's leave-one-out posterior (Opper & Winther 2000), so each term is one
  one-dimensional (binary) or (K − 1)-dimensional (multinomial) integral against the cavity
  of the row's latent value; the influential rows' cavities overrate them (the other sites
  stay as the row left them), and those rows take EP refitted without them, warm from the
  fit's sites (:mod:`~vsbayes.approximations.ep_leave_one_out`);
- otherwise by Pareto-smoothed importance sampling (Vehtari, Gelman & Gabry 2017) of draws
  from the Gaussian approximation q, reweighted to the exact posterior
  (``p(θ | y) / q(θ)``, the approximation's own Pareto ``k̂`` reported as
  ``posterior_pareto_k``) and then to each row's leave-one-out posterior
  (``1 / p(y_i | θ)``), with a Pareto ``k̂`` per row.

WAIC (Watanabe 2010) is computed beside it from the same posterior draws.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.special import log_softmax, ndtr
from scipy.stats import norm
from sklearn.base import clone
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.validation import check_array, check_is_fitted, column_or_1d

from .._blas import one_blas_thread
from .._memory import block_length, check_memory, memory_limit
from .._random import as_generator, reproducible_generator
from .._sums import logsumexp
from .._warnings import warn
from ..approximations.ep_leave_one_out import refit_softmax_without_rows, refit_without_rows
from ..approximations.expectation_propagation import DEFAULT_DAMPING
from ..exceptions import EstimationError, NotPositiveDefiniteError, PSISWarning
from ..gaussian import CentredStructuredCovariance, StructuredCovariance
from ..models.glm import BinaryGLMPosterior
from ..models.links import get_link
from ..models.psis import PARETO_K_THRESHOLD, pareto_smoothed_log_weights
from ..models.softmax import SoftmaxGLMPosterior
from ..models.softmax_predictive import centred_basis, observed_class_log_predictive
from ..models.tilted import quadrature_tilted_moments

__all__ = [
    "INTERCEPT_LABEL",
    "LeaveOneOut",
    "PSISWarning",
    "check_level",
    "check_n_draws",
    "coefficient_columns",
    "coefficient_table",
    "gaussian_marginals",
    "leave_one_out",
    "marginals",
    "marginals_table",
    "proba_interval",
    "sample_proba",
    "to_inference_data",
]

#: The name of the intercept's row in the tables.
INTERCEPT_LABEL = "(intercept)"

_LOG_2PI = math.log(2.0 * math.pi)
# Draws of a row's latent value for the multinomial prediction intervals and the weighted
# multinomial leave-one-out terms (quantile error ~ 1e-3 on the probability scale).
_LATENT_DRAWS = 4096
# Default posterior draws of leave-one-out: where EP's cavities give the terms the draws
# serve WAIC only; Pareto smoothing fits the largest 3√S weights of each row, and on breast
# cancer 1000 draws left elpd_loo 0.9 nats above 4000 (its bias with heavy tails).
_EP_DRAWS = 1000
_PSIS_DRAWS = 4000
#: Where EP ran, the rows whose own share of ``p_loo`` (``lppd_i − loo_i``: how far leaving
#: the row out moves its predictive) exceeds this are refitted without the row (``loo``'s
#: ``refit_above``). EP's cavity is the posterior without the row's site but with every
#: other site as the row left it; an influential row also moves those, and the cavity then
#: overrates the row's predictive. Measured against n EP refits (the paper's data sets at
#: C = 1e5): the cavities alone were 0.9-1.9 % above on three of them; the error was
#: correlated with p_loo_i (0.88 on parkinsons, whose 12 largest errors, 0.03-0.34 nats,
#: all had p_loo_i > 0.15). Refitting the rows above 0.5 (parkinsons, ionosphere, wpbc:
#: 13, 37, 24 of 195, 351, 194; breast cancer 5, haberman 1) left -0.07 %, +0.08 %,
#: -0.01 %, -0.18 %, +0.02 %; above 0.3 (23, 44, 33, 9, 1 rows), -0.33 %, +0.05 %,
#: -0.13 %, -0.07 %, +0.02 %: the rows between 0.3 and 0.5 are as often below as above
#: (the milder rows' cavities underrate them slightly), and 0.5 keeps ionosphere's 37
#: refits within 2 × the fit where its 44 took 1.6-2.2 ×. Above 0.7: +0.23 % on
#: parkinsons, +0.14 % on wpbc.
REFIT_P_LOO = 0.5
#: The same for the multinomial EP (``refit_above="auto"`` with three classes or more). Its
#: cavities fall short of its refits on most rows, not only on the influential ones: on
#: wine (178 rows, C = 1) by 0.270 nats in all against warm refits of every row, the
#: largest 0.071, correlated −0.36 with p_loo_i; refitting the rows above 0.5, 0.1, 0.02,
#: 0.01 (1, 18, 34, 48 rows) left −1.8, −1.0, −0.43, −0.21 % from brute force.
REFIT_P_LOO_MULTINOMIAL = 0.01
#: The site change at which EP's warm leave-one-out refits stop (unless the estimator's
#: EP tolerance is looser): measured against refits to 1e-7 on the paper's data sets, at
#: 1e-3 each refitted row's term within 2e-3 nats (5-6 sweeps; 1e-4: 4e-4 nats, 7-8
#: sweeps), the sums within 0.02 % of the elpd — far below the leave-one-out's own
#: error, for 25-30 % less time.
REFIT_TOL = 1e-3
#: The multinomial refits' sites whose rows' latent marginals stay within this (in sds) of
#: the full fit's are linear in their cavities (``refit_softmax_without_rows``'s
#: ``linear_within``; with its re-anchoring, 0.2 left wine's refitted terms within 4e-3
#: nats of the exact sites' in sum, as 0.1 did without it).
REFIT_LINEAR_WITHIN = 0.2


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


def _percent(p: float) -> str:
    return f"{100.0 * p:.4g}%"


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
    posterior's centred (identified) coefficients."""
    check_is_fitted(estimator)
    coef = estimator.coef_.toarray() if sp.issparse(estimator.coef_) else estimator.coef_
    if isinstance(estimator.sigma_, StructuredCovariance):  # its diagonal only
        coef = np.asarray(coef, dtype=float)
        intercept = np.ravel(estimator.intercept_).astype(float)
        if len(coef) == 1:  # binary
            sd = np.sqrt(np.maximum(estimator.sigma_.diagonal(), 0.0))
            mean = np.concatenate([coef[0], intercept[:1]])
            return [(None, mean if estimator.fit_intercept else mean[:-1], sd)]
        # The multinomial θ = [W.ravel(), b], centred over the classes as the dense one's.
        means = np.column_stack([coef, intercept]) if estimator.fit_intercept else coef
        means = means - means.mean(axis=0, keepdims=True)
        sd = np.sqrt(np.maximum(_centred_variances(estimator.sigma_, *coef.shape), 0.0))
        return [(label, means[c], sd[:, c]) for c, label in enumerate(estimator.classes_)]
    per_problem = gaussian_marginals(
        np.asarray(coef, dtype=float),
        np.asarray(estimator.intercept_, dtype=float),
        np.asarray(estimator.sigma_, dtype=float),
        bool(estimator.fit_intercept),
    )
    classes = estimator.classes_
    if len(per_problem) == 1:
        return [(None, *per_problem[0])]
    return [(classes[k], *marginal) for k, marginal in enumerate(per_problem)]


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


def gaussian_marginals(coef, intercept, sigma, fit_intercept: bool):
    """``(mean, sd)`` of each problem's coefficients then intercept, from a fitted
    posterior's arrays (layouts as ``coef_``, ``intercept_``, ``sigma_``): binary
    ``sigma`` (p, p) with one row of ``coef``, one-vs-rest (K, p, p), multinomial (p, p) in
    the layout θ = ``[W.ravel(), b]``, whose coefficients are centred over the classes."""
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
    centring = np.eye(k) - 1.0 / k
    variances = np.einsum("ka,jab,kb->jk", centring, blocks, centring)  # (width, K)
    means = np.concatenate([coef, intercept[:, None]], axis=1) if fit_intercept else coef
    means = means - means.mean(axis=0, keepdims=True)
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
    """The marks of a fit under a shrinkage prior (binary: one problem): ``relevance``,
    each coefficient's posterior mean of one minus its shrinkage factor given the fitted
    marginal (:meth:`~vsbayes.models.shrinkage_priors.CoefficientFactor.relevance`), and
    under the horseshoe ``selected``, relevance above ½ (Carvalho, Polson & Scott 2010:
    the horseshoe's shrinkage factor has the symmetric prior Beta(½, ½), which gives ½ its
    meaning; the other priors' are not symmetric); the intercept's row NaN and True."""
    ((_, mean, sd),) = marginals(estimator)
    d = estimator.n_features_in_
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        relevance = factor.relevance(mean[:d], sd[:d] ** 2)
    tail = len(mean) - d
    columns = {"relevance": np.concatenate([relevance, [np.nan] * tail])}
    if factor.selects_at_half:
        columns["selected"] = np.concatenate([relevance > 0.5, [True] * tail]).astype(bool)
    return columns


def marginals_table(
    per_problem, names, level: float, attrs: dict, *, multiclass: bool, columns=None
):
    """The table of :func:`coefficient_table` from ``(class or None, mean, sd)`` per problem
    (:func:`marginals`' layout), the feature names, the attrs and the extra ``columns``
    (see :func:`coefficient_columns`)."""
    columns = {} if columns is None else columns
    z = _quantile_z(level)
    lower_name, upper_name = _percent(0.5 - 0.5 * level), _percent(0.5 + 0.5 * level)
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
    return {
        "level": level,
        "method": getattr(estimator, "_title", type(estimator).__name__),
        "estimator": type(estimator).__name__,
        "log_evidence": estimator.log_marginal_likelihood_value_,
        "route": None if strategy is None else [str(s) for s in strategy],
        "predicted_error": None if error is None else np.asarray(error, dtype=float),
        "laplace_fallback": None if fell_back is None else np.asarray(fell_back),
        "multinomial": bool(estimator._is_multinomial()),
    }


# --- prediction intervals and posterior predictive draws ----------------------------------


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
        link = predictive.link
        # The link is increasing: the probability's quantiles are the link's of the latent's.
        low = np.exp(link.log_cdf(mean - z * sd))
        high = np.exp(link.log_cdf(mean + z * sd))
        return np.column_stack([1.0 - high, low]), np.column_stack([1.0 - low, high])
    rng = reproducible_generator(random_state)
    tails = [0.5 - 0.5 * level, 0.5 + 0.5 * level]
    lower = np.empty((X.shape[0], n_classes))
    upper = np.empty_like(lower)
    latent = predictive.latent(X)
    multinomial = estimator._is_multinomial()
    # Blocks of rows set by the memory alone, not the latent's chunks (which follow the BLAS
    # threads): each row gets the same draws whatever the threads. Per row: the draws'
    # temporaries, and at most a K² · p product of the latent moments.
    width = estimator.coef_.shape[1] + 1
    rows_per_block = block_length(8.0 * (3 * n_draws * n_classes + n_classes**2 * width))
    for start in range(0, X.shape[0], rows_per_block):
        rows = slice(start, min(start + rows_per_block, X.shape[0]))
        mean, second = latent(rows)
        draws = rng.standard_normal((n_draws, mean.shape[0], n_classes))
        if multinomial:  # one joint Gaussian of the K latent values per row
            factor = _psd_root(second)  # (r, K, K)
            f = mean + np.einsum("rab,srb->sra", factor, draws)
            proba = np.exp(log_softmax(f, axis=2))
        else:  # independent problems, probabilities normalized
            f = mean + np.sqrt(second) * draws
            proba = np.exp(predictive.link.log_cdf(f))
            proba /= proba.sum(axis=2, keepdims=True)
        lower[rows], upper[rows] = np.quantile(proba, tails, axis=0)
    return lower, upper


def _psd_root(cov: np.ndarray) -> np.ndarray:
    """``R`` with ``R Rᵀ = cov`` for each positive semi-definite matrix of a stack."""
    values, vectors = np.linalg.eigh(0.5 * (cov + np.swapaxes(cov, 1, 2)))
    return vectors * np.sqrt(np.maximum(values, 0.0))[:, None, :]


def sample_proba(estimator, X, n_draws: int, random_state) -> np.ndarray:
    """Class probabilities at X under coefficient draws: (n_draws, n, n_classes)."""
    n_draws = check_n_draws(n_draws)
    X = estimator._validate_prediction_data(X)
    n_classes = len(estimator.classes_)
    check_memory(
        8.0 * n_draws * X.shape[0] * n_classes,
        f"the {n_draws} × {X.shape[0]} × {n_classes} drawn probabilities",
        "Draw fewer (n_draws) or pass fewer rows at a time.",
    )
    coef, intercept = estimator._predictive().sample(n_draws, as_generator(random_state))
    out = np.empty((n_draws, X.shape[0], n_classes))
    link = get_link(estimator._link)
    multinomial = estimator._is_multinomial()
    for rows in _row_blocks(X.shape[0], 8.0 * 3 * n_draws * n_classes):
        f = np.swapaxes(_latent_draws(X[rows], coef, intercept), 1, 2)  # (S, r, problems)
        if n_classes == 2:
            log_p, log_q = link.log_cdf(f[..., 0]), link.log_cdf(-f[..., 0])
            out[:, rows, 0], out[:, rows, 1] = np.exp(log_q), np.exp(log_p)
        elif multinomial:
            out[:, rows] = np.exp(log_softmax(f, axis=2))
        else:
            proba = np.exp(link.log_cdf(f))
            out[:, rows] = proba / proba.sum(axis=2, keepdims=True)
    return out


def sample_labels(estimator, X, n_draws: int, random_state) -> np.ndarray:
    """Labels drawn from the posterior predictive: (n_draws, n)."""
    rng = as_generator(random_state)
    proba = sample_proba(estimator, X, n_draws, rng)
    cumulative = np.cumsum(proba, axis=2)
    uniform = rng.random(proba.shape[:2])[..., None] * cumulative[..., -1:]
    index = np.minimum((uniform >= cumulative).sum(axis=2), proba.shape[2] - 1)
    return estimator.classes_[index]


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


# --- leave-one-out ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeaveOneOut:
    """Leave-one-out and WAIC estimates of the expected log predictive density.

    Attributes
    ----------
    elpd_loo : float
        ``Σ_i log p(y_i | y_−i)`` (each row's likelihood factor with its weight).
    se : float
        Its standard error, ``√(n Var_i(pointwise))``.
    p_loo : float
        Effective number of parameters, ``lppd − elpd_loo``.
    pointwise : ndarray of shape (n_samples,)
        ``log p(y_i | y_−i)`` of each row (0 for a row of weight zero).
    pareto_k : ndarray of shape (n_samples,) or None
        The Pareto shape of each row's importance weights (PSIS); None for EP's cavities.
    method : str
        ``"ep-cavity"`` or ``"psis"``.
    lppd : float
        ``Σ_i log E_posterior p(y_i | θ)``, the in-sample log predictive density.
    elpd_waic, waic_se, p_waic : float
        WAIC's estimate, its standard error and its effective number of parameters.
    pointwise_waic : ndarray of shape (n_samples,)
    posterior_pareto_k : float
        Pareto shape of the importance weights from the Gaussian approximation to the
        exact posterior: below 0.7 the approximation is close enough to be corrected by
        reweighting; a direct check of how well it fits.
    n_draws : int
        Posterior draws behind the WAIC (and, for PSIS, the leave-one-out) terms.
    refitted : ndarray of shape (n_samples,) of bool
        The rows whose term comes from a refit without them (EP's influential rows).
    """

    elpd_loo: float
    se: float
    p_loo: float
    pointwise: np.ndarray
    pareto_k: np.ndarray | None
    method: str
    lppd: float
    elpd_waic: float
    waic_se: float
    p_waic: float
    pointwise_waic: np.ndarray
    posterior_pareto_k: float
    n_draws: int
    refitted: np.ndarray | None = None

    def __repr__(self) -> str:
        bad = "" if self.pareto_k is None else f", k̂ > 0.7: {self.n_bad}"
        return (
            f"LeaveOneOut(elpd_loo={self.elpd_loo:.3f} ± {self.se:.3f}, "
            f"p_loo={self.p_loo:.2f}, method={self.method!r}{bad}; "
            f"elpd_waic={self.elpd_waic:.3f}, p_waic={self.p_waic:.2f})"
        )

    @property
    def n_bad(self) -> int:
        """Rows whose Pareto k̂ exceeds 0.7 (0 for EP's cavities)."""
        return 0 if self.pareto_k is None else int((self.pareto_k > PARETO_K_THRESHOLD).sum())


@dataclasses.dataclass
class _Training:
    """The training data as the fit saw it: X, class indices, the fit's row weights."""

    X: np.ndarray
    index: np.ndarray
    weights: np.ndarray


def _training_data(estimator, X, y, sample_weight) -> _Training:
    check_is_fitted(estimator)
    X = estimator._validate_prediction_data(X)
    y = column_or_1d(y, warn=True)
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"y has {y.shape[0]} labels; X has {X.shape[0]} rows.")
    classes = estimator.classes_
    index = np.searchsorted(classes, y)
    index = np.minimum(index, len(classes) - 1)
    unknown = classes[index] != y
    if unknown.any():
        raise ValueError(
            f"y has labels the estimator was not fitted on, e.g. {y[unknown][0]!r}; "
            f"classes_ are {classes.tolist()!r}. Pass the training data."
        )
    if sample_weight is None:
        weights = np.ones(X.shape[0])
    else:
        weights = check_array(
            sample_weight, ensure_2d=False, dtype=np.float64, input_name="sample_weight"
        )
        if weights.shape != (X.shape[0],):
            raise ValueError(f"sample_weight has shape {weights.shape}; expected ({X.shape[0]},).")
    if estimator.class_weight is not None:  # as in fit
        per_class = compute_class_weight(estimator.class_weight, classes=classes, y=y)
        weights = weights * per_class[index]
    return _Training(X, index, weights)


@one_blas_thread  # as the fits: a second BLAS thread stalls the small products under load
def leave_one_out(
    estimator, X, y, sample_weight, n_draws: int, random_state, refit_above="auto"
) -> LeaveOneOut:
    """:class:`LeaveOneOut` of a fitted estimator on its training data (see the module
    docstring); where EP ran, the rows whose ``p_loo`` share exceeds ``refit_above`` (None:
    none; "auto": :data:`REFIT_P_LOO`, multinomial :data:`REFIT_P_LOO_MULTINOMIAL`)
    refitted without the row."""
    if not (isinstance(refit_above, str) and refit_above == "auto") and (
        refit_above is not None
        and (
            isinstance(refit_above, bool)
            or not (isinstance(refit_above, numbers.Real) and refit_above >= 0)
        )
    ):
        raise ValueError(f"refit_above must be a number >= 0, 'auto' or None; got {refit_above!r}.")
    sites = getattr(estimator.posteriors_[0], "sites", None)
    if n_draws is None:
        n_draws = _EP_DRAWS if sites is not None else _PSIS_DRAWS
    n_draws = check_n_draws(n_draws)
    if n_draws < 100:
        raise ValueError(
            f"n_draws must be at least 100 for leave-one-out (Pareto smoothing fits the "
            f"largest of the weights); got {n_draws}."
        )
    data = _training_data(estimator, X, y, sample_weight)
    multinomial = estimator._is_multinomial()
    if isinstance(refit_above, str):
        refit_above = REFIT_P_LOO_MULTINOMIAL if multinomial else REFIT_P_LOO
    if len(estimator.classes_) > 2 and not multinomial:
        raise ValueError(
            f"{type(estimator).__name__} fitted one binary posterior per class "
            f"(one-vs-rest), which is no joint model of the labels, so leave-one-out has "
            f"no predictive density to score. Use an estimator with a multinomial posterior "
            f"(LaplaceLogisticRegression, EPLogisticRegression, VSLogisticRegression)."
        )
    rng = reproducible_generator(random_state)
    draws = _PosteriorDraws(estimator, data, n_draws, rng)
    positive = data.weights > 0
    ep_rows = sites is not None and len(sites.linear) == int(positive.sum())
    refitted = np.zeros(len(data.weights), dtype=bool)
    if ep_rows:
        pointwise, lppd = _ep_cavity_terms(estimator, data, sites, positive)
        pareto_k, method = None, "ep-cavity"
        improper = ~np.isfinite(pointwise)
        if improper.any():  # a cavity that is no proper Gaussian: that row by PSIS
            pointwise[improper] = draws.psis_loo(np.flatnonzero(improper))[0]
        if refit_above is not None:
            refitted = positive & (lppd - pointwise > refit_above)
            rows = np.flatnonzero(refitted)
            pointwise[rows] = _refit_terms(estimator, X, y, sample_weight, data, rows)
    else:
        pointwise, pareto_k = draws.psis_loo(np.arange(len(data.weights)))
        lppd = draws.lppd
        method = "psis"
        bad = np.flatnonzero(pareto_k > PARETO_K_THRESHOLD)
        if draws.posterior_pareto_k > PARETO_K_THRESHOLD:
            warn(
                f"The Gaussian approximation of {type(estimator).__name__} is too far from "
                f"the posterior for importance sampling to correct it (Pareto k̂ = "
                f"{draws.posterior_pareto_k:.2f} > {PARETO_K_THRESHOLD}): every "
                f"leave-one-out term is unreliable. Use EPLogisticRegression, whose "
                f"leave-one-out comes from its cavities.",
                PSISWarning,
            )
        elif bad.size:
            shown = ", ".join(str(i) for i in bad[:10]) + (" …" if bad.size > 10 else "")
            warn(
                f"{bad.size} of {len(pareto_k)} leave-one-out terms have a Pareto k̂ above "
                f"{PARETO_K_THRESHOLD} (rows {shown}): their importance-sampling estimates "
                f"are unreliable. Refit without those rows for exact terms, or use "
                f"EPLogisticRegression, whose leave-one-out needs no importance sampling.",
                PSISWarning,
            )
    n = len(pointwise)
    waic = draws.lppd - draws.p_waic_terms
    return LeaveOneOut(
        elpd_loo=float(pointwise.sum()),
        se=float(math.sqrt(n * pointwise.var())),
        p_loo=float(lppd.sum() - pointwise.sum()),
        pointwise=pointwise,
        pareto_k=pareto_k,
        method=method,
        lppd=float(lppd.sum()),
        elpd_waic=float(waic.sum()),
        waic_se=float(math.sqrt(n * waic.var())),
        p_waic=float(draws.p_waic_terms.sum()),
        pointwise_waic=waic,
        posterior_pareto_k=draws.posterior_pareto_k,
        n_draws=n_draws,
        refitted=refitted,
    )


def _refit_terms(estimator, X, y, sample_weight, data: _Training, rows) -> np.ndarray:
    """``log p(y_i | y_−i)`` of each of ``rows`` under the posterior refitted without row
    i: EP's refits warm from the full fit's sites (binary EP on a Gaussian prior), else a
    refit of the estimator (its parameters, so its route and seed), as brute force does."""
    warm = _warm_refit_terms(estimator, data, rows)
    if warm is not None:
        return warm
    out = np.empty(len(rows))
    keep = np.ones(X.shape[0], dtype=bool)
    y = np.asarray(y)
    weights = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
    for j, i in enumerate(rows):
        keep[i] = False
        kept = np.flatnonzero(keep)
        with warnings.catch_warnings():
            # The estimator's own warnings were shown by its fit; n refits repeat them.
            warnings.simplefilter("ignore")
            refit = clone(estimator).fit(
                X.iloc[kept] if hasattr(X, "iloc") else X[kept],  # (a DataFrame's names kept)
                y[kept],
                None if weights is None else weights[kept],
            )
        keep[i] = True
        if len(refit.classes_) != len(estimator.classes_):  # the row's class left with it
            out[j] = -np.inf
            continue
        predictive, x = refit._predictive(), data.X[i : i + 1]
        label, weight = data.index[i : i + 1], data.weights[i : i + 1]
        if refit._is_multinomial():
            latent = predictive.latent(x)
            f_mean, f_cov = latent(next(iter(latent.chunks)))
            out[j] = _softmax_log_predictive(f_mean, f_cov, label, weight)[0]
        else:
            f_mean, f_var = predictive.latent_mean_and_variance(x)
            t_mean = np.where(label == 1, 1.0, -1.0) * f_mean
            out[j] = _binary_log_predictive(predictive.link, t_mean, f_var, weight)[0]
    return out


def _warm_refit_terms(estimator, data: _Training, rows) -> np.ndarray | None:
    """The terms of ``rows`` from EP refitted without each, warm from the fit's sites
    (:mod:`~vsbayes.approximations.ep_leave_one_out`); None where that does not apply (a
    ``prior=`` or a shrinkage prior: their EP has sites this fit did not keep)."""
    sites = estimator.posteriors_[0].sites
    if getattr(estimator, "prior", None) is not None or estimator._shrinkage_factor() is not None:
        return None
    positive = data.weights > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (fit showed the flat prior's warnings)
        flat = estimator._flat_prior()
    X = data.X.astype(np.float64, copy=False)
    priors = estimator._priors(X, data.weights, flat)
    options = {
        "damping": getattr(estimator, "damping", DEFAULT_DAMPING),
        "tol": max(1e-2 * estimator.tol, REFIT_TOL),
        "max_iter": getattr(estimator, "max_iter", 200),
    }
    model_rows = np.cumsum(positive)[rows] - 1  # the models keep the rows of weight > 0
    label, weight = data.index[rows], data.weights[rows]
    try:
        if sites.space == "contrast":
            k = len(estimator.classes_)
            model = SoftmaxGLMPosterior(X, data.index, data.weights, k, **priors)
            refits = refit_softmax_without_rows(
                model, sites, model_rows, linear_within=REFIT_LINEAR_WITHIN, **options
            )
            return _softmax_log_predictive(refits.mean, refits.var, label, weight)
        labels = np.where(data.index == 1, 1.0, -1.0)
        model = BinaryGLMPosterior(X, labels, data.weights, estimator._link, **priors)
        refits = refit_without_rows(model, sites, model_rows, **options)
    except (EstimationError, NotPositiveDefiniteError):
        # EP without a row found no fixed point from the cavity: the estimator's own
        # refits, which fall back as its fit does.
        return None
    return _binary_log_predictive(model.link, refits.mean, refits.var, weight)


def _ep_cavity_terms(estimator, data: _Training, sites, positive):
    """``log ∫ F^{s_i} × cavity_i`` and ``log ∫ F^{s_i} × posterior_i`` of each row, from
    EP's sites and the posterior's latent moments (rows of weight zero: 0)."""
    predictive = estimator._predictive()
    X, weights = data.X[positive], data.weights[positive]
    n = len(data.weights)
    loo, lppd = np.zeros(n), np.zeros(n)
    if sites.space == "signed":  # binary: t_i = y_i f_i
        link = predictive.link
        sign = np.where(data.index[positive] == 1, 1.0, -1.0)
        f_mean, f_var = predictive.latent_mean_and_variance(X)
        t_mean = sign * f_mean
        cav_prec = 1.0 / f_var - sites.precision
        cav_lin = t_mean / f_var - sites.linear
        proper = cav_prec > 0
        cav_var = 1.0 / np.where(proper, cav_prec, 1.0)
        cav_mean = cav_lin * cav_var
        terms = _binary_log_predictive(link, cav_mean, cav_var, weights)
        loo[positive] = np.where(proper, terms, np.nan)
        lppd[positive] = _binary_log_predictive(link, t_mean, f_var, weights)
        return loo, lppd
    # Multinomial: sites on g_i = Qᵀ f_i; the cavity's f = Q g (centred: softmax ignores
    # the common shift).
    k = len(estimator.classes_)
    q = centred_basis(k)
    latent = predictive.latent(X)
    label = data.index[positive]
    out_loo, out_lppd = np.empty(X.shape[0]), np.empty(X.shape[0])
    for rows in latent.chunks:
        f_mean, f_cov = latent(rows)
        g_mean = f_mean @ q
        g_cov = np.einsum("ka,rkl,lb->rab", q, f_cov, q)
        g_prec = np.linalg.inv(g_cov)
        cav_prec = g_prec - sites.precision[rows]
        cav_lin = np.einsum("rab,rb->ra", g_prec, g_mean) - sites.linear[rows]
        proper = np.linalg.eigvalsh(0.5 * (cav_prec + np.swapaxes(cav_prec, 1, 2)))[:, 0] > 0
        safe = np.where(proper[:, None, None], cav_prec, np.eye(k - 1))
        cav_cov = np.linalg.inv(safe)
        cav_mean = np.einsum("rab,rb->ra", cav_cov, cav_lin)
        term = _softmax_log_predictive(
            cav_mean @ q.T, q @ cav_cov @ q.T, label[rows], weights[rows]
        )
        out_loo[rows] = np.where(proper, term, np.nan)
        out_lppd[rows] = _softmax_log_predictive(f_mean, f_cov, label[rows], weights[rows])
    loo[positive], lppd[positive] = out_loo, out_lppd
    return loo, lppd


def _binary_log_predictive(link, t_mean, t_var, weights) -> np.ndarray:
    """``log ∫ F(t)^{s} N(t; t_mean, t_var) dt`` per row: the link's predictive for s = 1,
    an adaptive quadrature for other weights."""
    out = link.predictive_log_proba(t_mean, t_var)[0]
    other = np.flatnonzero(weights != 1.0)
    if other.size:
        out[other] = quadrature_tilted_moments(link, t_mean[other], t_var[other], weights[other])[0]
    return out


def _softmax_log_predictive(mean, cov, label, weights) -> np.ndarray:
    """``log ∫ softmax(f)_y^{s} N(f; mean, cov) df`` per row: the observed class's rule for
    s = 1 (to ~1e-4 nats, not every class to 1e-10), a seeded Monte Carlo average of the
    latent's draws for other weights."""
    out = observed_class_log_predictive(mean, cov, label)
    other = np.flatnonzero(weights != 1.0)
    if other.size:
        rng = np.random.default_rng(0)  # deterministic: the same terms at every call
        root = _psd_root(cov[other])
        z = rng.standard_normal((_LATENT_DRAWS, other.size, mean.shape[1]))
        f = mean[other] + np.einsum("rab,srb->sra", root, z)
        log_p = log_softmax(f, axis=2)[:, np.arange(other.size), label[other]]
        out[other] = logsumexp(weights[other] * log_p, axis=0) - math.log(_LATENT_DRAWS)
    return out


def _log_prior(estimator, data: _Training, n_problems: int, d: int, size: int):
    """``log p(θ)`` up to a constant, as a function of a block of draws (rows of θ, each of
    ``size`` entries): the prior the fit used — ``prior=`` a Gaussian (binary), a shrinkage
    prior's on the coefficients (``penalty="l1"``/``"elasticnet"`` or a prior object;
    binary), else N(0, C) (the flat prior's, or liblinear's intercept) as ``fit`` made it."""
    factor = getattr(estimator, "_coefficient_factor_", None)
    given = getattr(estimator, "prior", None) is not None and factor is None
    if (given or factor is not None) and n_problems != 1:
        raise ValueError(
            "Leave-one-out and WAIC of the multinomial posterior are implemented under its "
            "default prior N(0, C) only, not under a prior=: fit with C instead."
        )
    if given:  # N(μ₀, Σ₀) in θ's layout: the fit's own (one binary problem)
        prior = estimator._problem_priors(d, [(None, None)], estimator.classes_)[0]

        def log_density(theta: np.ndarray) -> np.ndarray:
            white = scipy.linalg.solve_triangular(
                prior.lower, (theta - prior.mean).T, lower=True, check_finite=False
            )
            return -0.5 * (white * white).sum(axis=0)

        return log_density
    priors = estimator._priors(data.X, data.weights, estimator._flat_prior())
    prior_var = np.empty(size)  # θ: every problem's (or class's) d, then intercepts
    prior_var[: n_problems * d] = np.tile(np.broadcast_to(priors["prior_var"], (d,)), n_problems)
    prior_var[n_problems * d :] = priors["intercept_prior_var"] or 1.0
    if factor is None:
        return lambda theta: -0.5 * (theta * theta) @ (1.0 / prior_var)

    def shrinkage_log_density(theta: np.ndarray) -> np.ndarray:
        # The coefficients' shrinkage prior, the intercept's N(0, 10⁶) (or none).
        intercept = theta[:, d:]
        return factor.log_density(theta[:, :d]).sum(axis=1) - 0.5 * (intercept * intercept) @ (
            1.0 / prior_var[d:]
        )

    return shrinkage_log_density


class _PosteriorDraws:
    """Draws θ_s of the Gaussian approximation q, each row's log-likelihood at them, and
    the importance weights ``p(θ | y) / q(θ)`` that make them draws of the posterior."""

    exact = False

    def __init__(self, estimator, data: _Training, n_draws: int, rng):
        # θ in the fit's layout: [w, b] of the binary problem, [W.ravel(), b] multinomial.
        coef = estimator.coef_.toarray() if sp.issparse(estimator.coef_) else estimator.coef_
        parts = [np.ravel(coef)]
        if estimator.fit_intercept:
            parts.append(np.ravel(estimator.intercept_))
        mean = np.concatenate(parts).astype(float)
        n_problems, d = np.shape(estimator.coef_)
        n = len(data.weights)
        # Held at once: the draws θ (S × p), the coefficients' copy that each block of
        # rows' product takes (sparse rows, or several classes: a BLAS operand of the
        # strided draws' coefficients), and a block of rows' log-likelihoods (S × 8 rows
        # at most); each block of draws' own temporaries (the structure's products, the
        # prior's squares) within one block's memory.
        per_draw = 8.0 * (2 * mean.size + 8 * min(n, block_length(8.0 * n_draws)))
        fits = max(int(memory_limit() // per_draw), 0)
        check_memory(
            n_draws * per_draw,
            f"{n_draws} posterior draws of {mean.size} parameters and their log-likelihoods",
            f"Pass a smaller n_draws (at most about {fits} fit)."
            if fits >= 100
            else "Use fewer features: even the 100 draws leave-one-out needs do not fit.",
        )
        sigma = estimator.sigma_
        if isinstance(sigma, StructuredCovariance):  # θ = μ + Σ^½ z, no p × p matrix
            width, spread = mean.size, sigma.sample_normal
        else:
            values, vectors = scipy.linalg.eigh(np.asarray(sigma, dtype=float))
            keep = values > values.max() * 1e-14
            root, basis = np.sqrt(values[keep]), vectors[:, keep].T
            width = int(keep.sum())

            def spread(z: np.ndarray) -> np.ndarray:
                return (z * root) @ basis

        log_prior_of = _log_prior(estimator, data, n_problems, d, mean.size)
        theta = np.empty((n_draws, mean.size))
        # Both maps are linear in z with a fixed Jacobian: log q up to a constant (the
        # weights are normalized).
        log_q, log_prior = np.empty(n_draws), np.empty(n_draws)
        # In blocks of draws, so that z and the products stay within one block beside θ
        # (the whole z and its products at once took four copies of θ: NumPy's
        # MemoryError at 4000 draws of 100,001 parameters); the generator fills row
        # after row, so the draws do not depend on the blocks.
        step = block_length(8.0 * 4 * (mean.size + width))
        for start in range(0, n_draws, step):
            stop = min(start + step, n_draws)
            z = rng.standard_normal((stop - start, width))
            block = theta[start:stop]
            np.add(mean, spread(z), out=block)
            log_q[start:stop] = -0.5 * (z * z).sum(axis=1)
            log_prior[start:stop] = log_prior_of(block)
        self.coef = theta[:, : n_problems * d].reshape(n_draws, n_problems, d)
        self.intercept = (
            theta[:, n_problems * d :]
            if estimator.fit_intercept
            else np.zeros((n_draws, n_problems))
        )
        self.link = get_link(estimator._link)
        self.data = data
        self.multinomial = estimator._is_multinomial()
        log_likelihood = np.zeros(n_draws)
        blocks = self.blocks()
        # Kept between the two passes when they fit in one block's memory (else recomputed).
        kept = [] if len(blocks) == 1 else None
        for rows in blocks:  # first pass: the joint density at each draw
            ll = self.row_log_likelihood(rows)
            log_likelihood += ll.sum(axis=1)
            if kept is not None:
                kept.append(ll)
        self.log_ratio = log_likelihood + log_prior - log_q
        smoothed, k = pareto_smoothed_log_weights(self.log_ratio[None, :])
        self.log_weights = smoothed[0]
        self.posterior_pareto_k = float(k[0])
        weights = np.exp(self.log_weights)
        self.lppd = np.zeros(n)
        self.p_waic_terms = np.zeros(n)
        for j, rows in enumerate(blocks):  # second pass: WAIC's terms, reweighted draws
            ll = kept[j] if kept is not None else self.row_log_likelihood(rows)  # (S, rows)
            self.lppd[rows] = logsumexp(self.log_weights[:, None] + ll, axis=0)
            centred = ll - weights @ ll
            self.p_waic_terms[rows] = weights @ (centred * centred)

    def blocks(self) -> list[np.ndarray]:
        """Row indices in blocks whose (draws × rows × classes) temporaries fit."""
        n, width = len(self.data.weights), self.coef.shape[1] + 1
        step = block_length(8.0 * 3 * len(self.coef) * width)
        return [np.arange(i, min(i + step, n)) for i in range(0, n, step)]

    def row_log_likelihood(self, rows: np.ndarray) -> np.ndarray:
        """``s_i log p(y_i | θ_s)`` of the rows ``rows``: (S, rows)."""
        f = _latent_draws(self.data.X[rows], self.coef, self.intercept)  # (S, K or 1, r)
        index, weights = self.data.index[rows], self.data.weights[rows]
        if self.multinomial:
            chosen = f[:, index, np.arange(len(index))]
            log_p = chosen - logsumexp(f, axis=1)
        else:
            f = f[:, 0]
            f *= np.where(index == 1, 1.0, -1.0)
            # To 1e-7 per row (the logistic link's float32 soft part): far below the
            # sampling error of S draws; the export's values are exact (ArviZ's own
            # smoothing divides by their spread, which float32 rounds to 0 on easy rows).
            log_cdf = self.link.log_cdf if self.exact else self.link.fast_log_cdf
            log_p = log_cdf(f, out=f)
        return np.where(weights > 0, weights * log_p, 0.0)

    def psis_loo(self, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """PSIS leave-one-out terms and Pareto k̂ of the rows ``which``."""
        out, k_out = np.zeros(which.size), np.full(which.size, -np.inf)
        step = block_length(8.0 * 8 * len(self.coef) * (self.coef.shape[1] + 1))
        for start in range(0, which.size, step):
            part = which[start : start + step]
            ll = self.row_log_likelihood(part).T  # (rows, S)
            log_w, k = pareto_smoothed_log_weights(self.log_ratio[None, :] - ll)
            out[start : start + part.size] = logsumexp(log_w + ll, axis=1)
            k_out[start : start + part.size] = k
        zero = self.data.weights[which] == 0  # no likelihood factor: nothing left out
        out[zero], k_out[zero] = 0.0, -np.inf
        return out, k_out


# --- ArviZ --------------------------------------------------------------------------------


def to_inference_data(
    estimator, X, y, sample_weight, n_draws: int, random_state, feature_names=None
):
    """ArviZ's DataTree of a fitted estimator (see
    :meth:`~vsbayes.estimators._prediction.PosteriorPrediction.to_inference_data`)."""
    n_draws = check_n_draws(n_draws)
    try:
        import arviz_base
    except ImportError as error:
        raise ImportError(
            "to_inference_data needs ArviZ (arviz-base): pip install 'vsbayes[arviz]'."
        ) from error
    check_is_fitted(estimator)
    names = _feature_names(estimator, feature_names)
    rng = reproducible_generator(random_state)
    coef, intercept = estimator._predictive().sample(n_draws, rng)
    multiclass = len(estimator.classes_) > 2
    classes = [str(c) for c in estimator.classes_]
    if estimator._is_multinomial():  # the identified (centred) coefficients
        coef = coef - coef.mean(axis=1, keepdims=True)
        intercept = intercept - intercept.mean(axis=1, keepdims=True)
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
    if X is not None and y is not None:
        data = _training_data(estimator, X, y, sample_weight)
        if len(estimator.classes_) > 2 and not estimator._is_multinomial():
            raise ValueError(
                "log_likelihood needs a joint model of the labels; a one-vs-rest fit has "
                "none. Pass X=None, y=None for the posterior alone."
            )
        draws = _Draws(estimator, data, coef, intercept)
        log_likelihood = [draws.row_log_likelihood(rows) for rows in draws.blocks()]
        groups["log_likelihood"] = {"y": np.concatenate(log_likelihood, axis=1)[None]}
        groups["observed_data"] = {"y": np.asarray(y)}
        dims["y"] = ["obs_id"]
        coords["obs_id"] = np.arange(len(data.weights))
    tree = arviz_base.from_dict(groups, coords=coords, dims=dims, attrs={"posterior": attrs})
    return tree


class _Draws(_PosteriorDraws):
    """Given draws of the coefficients: their rows' log-likelihoods (for the export)."""

    exact = True

    def __init__(self, estimator, data, coef, intercept):
        self.link = get_link(estimator._link)
        self.data, self.coef, self.intercept = data, coef, intercept
        self.multinomial = estimator._is_multinomial()
