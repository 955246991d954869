"""Leave-one-out and WAIC of a fitted estimator on its training data.

The estimators reach these through :meth:`~vsbayes.estimators._prediction.PosteriorPrediction.loo`.

**Leave-one-out.** ``elpd_loo = Σ_i log p(y_i | y_−i)``, each term the predictive density
of row i's likelihood factor ``F^{s_i}`` under the posterior without that row:

- where expectation propagation ran, from its cavities: the posterior without a row's site
  *is* EP's leave-one-out posterior (Opper & Winther 2000), so each term is one
  one-dimensional (binary) or (K − 1)-dimensional (multinomial) integral against the cavity
  of the row's latent value; the influential rows' cavities overrate them (the other sites
  stay as the row left them), and those rows take EP refitted without them, warm from the
  fit's sites (:mod:`~vsbayes.approximations.ep_leave_one_out`; under a shrinkage prior
  the coefficient sites stay as the fit left them, part of the prior, but for the binary
  EP's under a prior that is not log-concave, relaxed without the row in the refits and
  in the cavities of the rows of middling share);
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

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.special import log_softmax
from sklearn.base import clone
from sklearn.utils.validation import check_array, check_is_fitted, column_or_1d

from .._blas import one_blas_thread
from .._memory import block_length, check_memory, memory_limit
from .._random import reproducible_generator
from .._sums import logsumexp
from .._warnings import catch, warn
from ..approximations.ep_leave_one_out import (
    refit_softmax_without_rows,
    refit_without_rows,
    relax_prior_sites_without_rows,
)
from ..approximations.expectation_propagation import (
    DEFAULT_DAMPING,
    factor_is_log_concave,
)
from ..approximations.softmax_prior_sites import under_prior_sites
from ..exceptions import EstimationError, NotPositiveDefiniteError, PSISWarning
from ..gaussian import StructuredCovariance, StructuredGaussian
from ..models.glm import BinaryGLMPosterior, fast_log_cdf_suffices
from ..models.latent import constant_rows
from ..models.links import get_link
from ..models.psis import PARETO_K_THRESHOLD, pareto_smoothed_log_weights
from ..models.softmax import SoftmaxGLMPosterior
from ..models.softmax_predictive import observed_class_log_predictive
from ..models.softmax_predictive_rules import centred_basis
from ..models.tilted import quadrature_tilted_moments
from ._class_weights import class_weights
from ._summaries import _latent_draws, _psd_root, check_n_draws

__all__ = ["LeaveOneOut", "PSISWarning", "leave_one_out"]

# Draws of a row's latent value for the weighted multinomial leave-one-out terms (quantile
# error ~ 1e-3 on the probability scale).
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
#: Under a binary shrinkage prior that is not log-concave (Student-t, horseshoe), the rows
#: not refitted whose own share of ``p_loo`` exceeds this take their term from the cavity
#: with the coefficient sites relaxed without the row (the rows' sites held;
#: ``relax_prior_sites_without_rows``). The cavity holds the coefficient sites as the row
#: left them: under the horseshoe on breast cancer that put the 566 rows not refitted 0.87
#: nats below brute force, spread over the rows of middling share (D-184). Relaxed above
#: 0.1 (22-36 rows on the six heavy-tailed cases of ``benchmarks/shrinkage_loo.py``) those
#: rows were −0.06 nats from brute force on breast cancer's horseshoe; above 0.05 (34-70
#: rows), +0.08, at about 0.1 × the fit more on ionosphere (D-194).
RELAX_P_LOO = 0.1
#: The multinomial refits' sites whose rows' latent marginals stay within this (in sds) of
#: the full fit's are linear in their cavities (``refit_softmax_without_rows``'s
#: ``linear_within``; with its re-anchoring, 0.2 left wine's refitted terms within 4e-3
#: nats of the exact sites' in sum, as 0.1 did without it).
REFIT_LINEAR_WITHIN = 0.2


# --- leave-one-out ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeaveOneOut:
    """Leave-one-out and WAIC estimates of the expected log predictive density.

    Attributes
    ----------
    elpd_loo : float
        ``Σ_i log p(y_i | y_−i)`` (each row's likelihood factor with its weight); -inf
        where a refitted row was the only one of its class (no other row gives that class
        any probability).
    se : float
        Its standard error, ``√(n Var_i(pointwise))`` (inf with a -inf term).
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
        WAIC's estimate, its standard error and its effective number of parameters, all
        from the ``n_draws`` draws reweighted to the exact posterior: ``elpd_waic`` is
        their in-sample log predictive density minus ``p_waic``. On the ``"ep-cavity"``
        route ``lppd`` is EP's own (its Gaussian's predictive, no draws), so ``lppd −
        p_waic`` differs from ``elpd_waic`` by the two in-sample densities' difference
        (a few hundredths of a nat on 150 rows).
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


@dataclasses.dataclass(frozen=True)
class TrainingFingerprint:
    """What ``fit`` saw, in O(1) numbers, so that leave-one-out can tell its training rows
    from others of the same count: a random projection of up to :data:`_FINGERPRINT_ROWS`
    rows drawn at fixed positions, and the labels and weights of every row, each summed
    with a random weight per position (so that a reordering shows). The rows' subsample
    keeps the fit's cost at O(n + 1024 d), not another pass over X (a tall X's pass was
    ~2 % of a Laplace fit): other data, or the same rows reordered, differ at nearly every
    position; a change to a few rows' features alone can go unseen."""

    n_rows: int
    design: float
    design_scale: float
    labels: float
    weights: float
    #: The weight (sample_weight × class weight) of each class's rows, summed.
    class_weights: tuple[float, ...] = ()

    #: The relative difference of the design's projections beyond which the rows differ:
    #: far above the round-off of the sums (≲ 1e-12 of the scale), and of the same data
    #: stored sparse, or in float32 after a float64 fit (~1e-8); far below what another
    #: row, order or value moves (the scale's order).
    TOLERANCE = 1e-6

    @classmethod
    def of(cls, X, y_index: np.ndarray, weights: np.ndarray) -> TrainingFingerprint:
        """The fingerprint of in-memory rows (dense or sparse), class indices and the
        fit's row weights (sample_weight times the class weights)."""
        n, d = X.shape
        rng = np.random.default_rng(_FINGERPRINT_SEED)
        direction = rng.standard_normal(d)
        position = rng.standard_normal(n)
        rows = rng.integers(0, n, _FINGERPRINT_ROWS) if n > _FINGERPRINT_ROWS else slice(None)
        sample = X[rows]
        sample = sample.astype(np.float64) if sample.dtype != np.float64 else sample
        projection = np.asarray(sample @ direction).ravel()
        if sp.issparse(sample):
            squares = float(sample.data @ sample.data)
        else:
            squares = float(np.einsum("ij,ij->", sample, sample))
        weight = position[rows]
        # |Σ_i c_i x_i·u| ≤ ‖c‖ ‖u‖ ‖X‖_F: the scale of the sum and of its round-off.
        scale = float(np.linalg.norm(weight) * np.linalg.norm(direction)) * math.sqrt(squares)
        return cls(
            n_rows=n,
            design=float(weight @ projection),
            design_scale=scale,
            labels=float(position @ (np.asarray(y_index, dtype=float) + 1.0)),
            weights=float(position @ np.asarray(weights, dtype=float)),
            class_weights=_class_totals(y_index, weights),
        )

    def differences(self, other: TrainingFingerprint) -> list[str]:
        """What of ``other`` is not this fit's: "rows", "X", "y", "sample_weight"."""
        if other.n_rows != self.n_rows:
            return ["rows"]
        out = []
        scale = max(self.design_scale, other.design_scale)
        if abs(other.design - self.design) > self.TOLERANCE * scale:
            out.append("X")
        if not math.isclose(other.labels, self.labels, rel_tol=1e-9, abs_tol=1e-9):
            out.append("y")
        if not math.isclose(other.weights, self.weights, rel_tol=1e-9, abs_tol=1e-12):
            out.append("sample_weight")
        return out


@dataclasses.dataclass(frozen=True)
class StreamRows:
    """What a stream (``partial_fit``) keeps of its rows for leave-one-out: their count,
    and the weight of each class's rows (sample_weight × class weight), summed.

    Its batches are not kept (memory does not grow with the rows seen), so leave-one-out
    cannot tell them from other rows of the same count and class weights; another count
    (the last batch alone, other data) is not the posterior's rows, which loo would score
    as if left out of a posterior that in fact saw them, or never did, and other weights
    (the stream's sample_weight left out) are not its likelihood."""

    n_rows: int
    class_weights: tuple[float, ...] = ()

    @classmethod
    def after(cls, previous, y_index: np.ndarray, weights: np.ndarray, n_classes: int):
        """The rows of a stream after a batch (class indices ``y_index``, row weights
        ``weights``) joins those of ``previous`` (a StreamRows, a fit's
        :class:`TrainingFingerprint`, or None at the stream's start)."""
        totals = np.zeros(n_classes)
        if previous is not None:
            seen = np.asarray(previous.class_weights, dtype=float)
            totals[: seen.size] = seen
        totals += np.bincount(y_index, weights, minlength=n_classes)[:n_classes]
        n_before = 0 if previous is None else previous.n_rows
        return cls(n_before + len(y_index), tuple(totals.tolist()))

    def differences(self, other: TrainingFingerprint) -> list[str]:
        if other.n_rows != self.n_rows:
            return ["rows"]
        size = max(len(self.class_weights), len(other.class_weights))
        mine, theirs = np.zeros(size), np.zeros(size)
        mine[: len(self.class_weights)] = self.class_weights
        theirs[: len(other.class_weights)] = other.class_weights
        # (The batches' sums against one sum of the same weights: round-off apart.)
        return [] if np.allclose(theirs, mine, rtol=1e-9, atol=1e-12) else ["class weights"]


def _class_totals(y_index: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
    """The weight of each class index's rows, summed."""
    return tuple(np.bincount(y_index, np.asarray(weights, dtype=float)).tolist())


#: The seed of the fingerprint's projections (any fixed one: the same for fit and loo).
_FINGERPRINT_SEED = 20130501
#: The rows whose features the fingerprint projects (all of them up to this many).
_FINGERPRINT_ROWS = 1024


def _check_fitted_rows(estimator, data: _Training, name: str) -> None:
    """A ValueError naming what differs where ``data`` are not the rows ``fit`` saw (a
    stream's: their count alone; no check where the fit kept nothing: a dask fit's);
    ``name`` is the class the user called."""
    fitted = vars(estimator).get("_training_fingerprint_")
    if fitted is None:
        return
    given = TrainingFingerprint.of(data.X, data.index, data.weights)
    differences = fitted.differences(given)
    if not differences:
        return
    if differences == ["rows"]:
        had = "the stream's batches had" if isinstance(fitted, StreamRows) else "the fit had"
        what = f"X has {given.n_rows} rows; {had} {fitted.n_rows}"
    elif differences == ["class weights"]:
        what = (
            f"the weight of each class's rows (sample_weight × class_weight, summed) is "
            f"{list(given.class_weights)}; the stream's batches had "
            f"{list(fitted.class_weights)}"
        )
    else:
        verb = "differs" if len(differences) == 1 else "differ"
        what = f"{' and '.join(differences)} {verb} from the fit's (or its rows' order)"
    raise ValueError(
        f"X, y and sample_weight are not the data {name} was fitted on: "
        f"{what}. Leave-one-out scores the training rows, in the fit's order with its "
        f"sample_weight (each term leaves one of them out of the posterior). To score "
        f"held-out rows, use predict_proba (e.g. sklearn.metrics.log_loss)."
    )


def _training_data(estimator, X, y, sample_weight, name: str | None = None) -> _Training:
    """The training rows as leave-one-out and the ArviZ export read them, checked against
    the fit's; ``name``: the class the user called, where it delegated to ``estimator``
    (``EmpiricalBayesClassifier``'s ``estimator_``), so that errors name the fit they
    made."""
    check_is_fitted(estimator, "coef_")
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
            f"classes_ are {classes.tolist()!r}. Pass the training data (without the rows "
            f"of a class whose weights were all zero: fit leaves it out of classes_)."
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
        totals = np.bincount(index, weights, minlength=len(classes))
        weights = weights * class_weights(estimator.class_weight, classes, totals)[index]
    data = _Training(X, index, weights)
    _check_fitted_rows(estimator, data, name or type(estimator).__name__)
    return data


@one_blas_thread  # as the fits: a second BLAS thread stalls the small products under load
def _psis_remedy(estimator) -> str:
    """What gives leave-one-out terms without importance sampling, for an estimator whose
    terms came from it: EP's cavities, where EP can keep a site per row."""
    if isinstance(estimator.posteriors_[0], StructuredGaussian):
        return (
            "A structured (text-scale) posterior keeps no per-row sites, EP's neither: "
            "score held-out rows instead (sklearn.model_selection.cross_val_score with "
            "scoring='neg_log_loss')."
        )
    ep = "EPProbitRegression" if estimator._link == "probit" else "EPLogisticRegression"
    if type(estimator).__name__ == ep:  # no sites of these rows: a stream's, or other rows
        return f"Fit {ep} on these rows (fit, not partial_fit): its cavities give the terms."
    return f"Use {ep}, whose leave-one-out comes from its cavities."


# On one BLAS thread throughout, as the fits: its products are a block of rows' at a time
# and its refits a fit's sweeps (one thread already). Under load a second BLAS thread stalls
# them: on ionosphere under a Student-t prior (load 7 on 2 cores), loo took 1.5-1.8 × the
# fit's CPU time at BLAS's default threads, 0.81-0.83 × on one; a PSIS loo of 20,000 × 50
# rows 8.3-9.0 s of CPU on one thread against 10.2-11.4 s.
@one_blas_thread
def leave_one_out(
    estimator, X, y, sample_weight, n_draws: int, random_state, refit_above="auto", name=None
) -> LeaveOneOut:
    """:class:`LeaveOneOut` of a fitted estimator on its training data (see the module
    docstring); where EP ran, the rows whose ``p_loo`` share exceeds ``refit_above`` (None:
    none; "auto": :data:`REFIT_P_LOO`, multinomial :data:`REFIT_P_LOO_MULTINOMIAL`)
    refitted without the row. ``name``: the class the user called, if it delegated here
    (messages name it; default the estimator's class)."""
    name = name or type(estimator).__name__
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
    data = _training_data(estimator, X, y, sample_weight, name)
    multinomial = estimator._is_multinomial()
    if isinstance(refit_above, str):
        refit_above = REFIT_P_LOO_MULTINOMIAL if multinomial else REFIT_P_LOO
    if len(estimator.classes_) > 2 and not multinomial:
        raise ValueError(
            f"{name} fitted one binary posterior per class "
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
            share = lppd - pointwise
            refitted = positive & (share > refit_above)
            rows = np.flatnonzero(refitted)
            pointwise[rows] = _refit_terms(estimator, X, y, sample_weight, data, rows)
            middling = positive & ~refitted & ~improper & (share > RELAX_P_LOO)
            rows = np.flatnonzero(middling)
            relaxed = _relaxed_cavity_terms(estimator, data, rows)
            if relaxed is not None:
                pointwise[rows] = np.where(np.isfinite(relaxed), relaxed, pointwise[rows])
    else:
        pointwise, pareto_k = draws.psis_loo(np.arange(len(data.weights)))
        lppd = draws.lppd
        method = "psis"
        bad = np.flatnonzero(pareto_k > PARETO_K_THRESHOLD)
        if draws.posterior_pareto_k > PARETO_K_THRESHOLD:
            warn(
                f"The Gaussian approximation of {name} is too far from "
                f"the posterior for importance sampling to correct it (Pareto k̂ = "
                f"{draws.posterior_pareto_k:.2f} > {PARETO_K_THRESHOLD}): every "
                f"leave-one-out term is unreliable. {_psis_remedy(estimator)}",
                PSISWarning,
            )
        elif bad.size:
            shown = ", ".join(str(i) for i in bad[:10]) + (" …" if bad.size > 10 else "")
            warn(
                f"{bad.size} of {len(pareto_k)} leave-one-out terms have a Pareto k̂ above "
                f"{PARETO_K_THRESHOLD} (rows {shown}): their importance-sampling estimates "
                f"are unreliable. Refit without those rows for exact terms. "
                f"{_psis_remedy(estimator)}",
                PSISWarning,
            )
    waic = draws.lppd - draws.p_waic_terms
    return LeaveOneOut(
        elpd_loo=float(pointwise.sum()),
        se=_standard_error(pointwise),
        p_loo=float(lppd.sum() - pointwise.sum()),
        pointwise=pointwise,
        pareto_k=pareto_k,
        method=method,
        lppd=float(lppd.sum()),
        elpd_waic=float(waic.sum()),
        waic_se=_standard_error(waic),
        p_waic=float(draws.p_waic_terms.sum()),
        pointwise_waic=waic,
        posterior_pareto_k=draws.posterior_pareto_k,
        n_draws=n_draws,
        refitted=refitted,
    )


def _standard_error(pointwise: np.ndarray) -> float:
    """The standard error of a sum of ``pointwise`` terms; infinite where a term is -inf
    (a row whose class left with it), whose spread has no finite value."""
    if not np.all(np.isfinite(pointwise)):
        return math.inf
    return float(math.sqrt(len(pointwise) * pointwise.var()))


def _refit_terms(estimator, X, y, sample_weight, data: _Training, rows) -> np.ndarray:
    """``log p(y_i | y_−i)`` of each of ``rows`` under the posterior refitted without row
    i: EP's refits warm from the full fit's sites (EP on a Gaussian prior, or under a
    shrinkage prior with its prior sites held fixed), else a refit of the estimator (its
    parameters, so its route and seed), as brute force does."""
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
        if not np.any((data.index[kept] == data.index[i]) & (data.weights[kept] > 0)):
            # The row's class left with it: no refit (of one class, it would be refused)
            # gives that class any probability.
            keep[i] = True
            out[j] = -np.inf
            continue
        # The estimator's own warnings were shown by its fit; n refits repeat them.
        with catch(("ignore", Warning)):
            refit = clone(estimator).fit(
                X.iloc[kept] if hasattr(X, "iloc") else X[kept],  # (a DataFrame's names kept)
                y[kept],
                None if weights is None else weights[kept],
            )
        keep[i] = True
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
    Gaussian ``prior=``: its EP's sites are not this model's), or where a
    refit's posterior is not proper (a heavy-tailed prior's binary coefficient sites of
    negative precision, fixed, with the row left out). EP under a shrinkage prior keeps
    its coefficient sites: the refits run under the base times those sites, the Gaussian
    prior the rows' sites were fitted under, fixed (as EP's leave-one-out keeps the other
    sites of the cavity); binary under a prior that is not log-concave (Student-t,
    horseshoe), those sites are relaxed without the row too, alternating with the rows'
    (``refit_without_rows``' ``relax_prior_sites``)."""
    posterior = estimator.posteriors_[0]
    sites, prior_sites = posterior.sites, getattr(posterior, "prior_sites", None)
    factor = estimator._shrinkage_factor()
    shrinkage = factor is not None and prior_sites is not None
    if not shrinkage and (getattr(estimator, "prior", None) is not None or factor is not None):
        return None
    X, priors = _refit_model_inputs(estimator, data)
    options = {
        "damping": getattr(estimator, "damping", DEFAULT_DAMPING),
        "tol": max(1e-2 * estimator.tol, REFIT_TOL),
        "max_iter": getattr(estimator, "max_iter", 200),
    }
    model_rows = np.cumsum(data.weights > 0)[rows] - 1  # the models keep weight > 0 rows
    label, weight = data.index[rows], data.weights[rows]
    if shrinkage:
        priors["coefficient_prior"] = factor
    try:
        if sites.space == "contrast":
            k = len(estimator.classes_)
            model = SoftmaxGLMPosterior(X, data.index, data.weights, k, **priors)
            if shrinkage:
                model = under_prior_sites(model, *prior_sites)
            refits = refit_softmax_without_rows(
                model, sites, model_rows, linear_within=REFIT_LINEAR_WITHIN, **options
            )
            return _softmax_log_predictive(refits.mean, refits.var, label, weight)
        labels = np.where(data.index == 1, 1.0, -1.0)
        model = BinaryGLMPosterior(X, labels, data.weights, estimator._link, **priors)
        if shrinkage:
            options.update(
                prior_sites=prior_sites,
                relax_prior_sites=not factor_is_log_concave(factor),
                prior_nonnegative=getattr(posterior, "prior_nonnegative", False),
            )
        refits = refit_without_rows(model, sites, model_rows, **options)
    except (EstimationError, NotPositiveDefiniteError):
        # EP without a row found no fixed point from the cavity, or (prior sites of
        # negative precision held fixed) no proper posterior: the estimator's own refits,
        # which fall back as its fit does.
        return None
    return _binary_log_predictive(model.link, refits.mean, refits.var, weight)


def _refit_model_inputs(estimator, data: _Training) -> tuple[np.ndarray, dict]:
    """The training rows in float64 and the priors the fit's model was built under (the
    refits' models are built again from them)."""
    flat = estimator._resolved_penalty() is None  # (read, not checked: fit warned)
    X = data.X.astype(np.float64, copy=False)
    return X, estimator._priors(X, data.weights, flat)


def _relaxed_cavity_terms(estimator, data: _Training, rows) -> np.ndarray | None:
    """The terms of ``rows`` from their cavities with a binary shrinkage prior's coefficient
    sites relaxed without the row (:func:`~vsbayes.approximations.ep_leave_one_out.
    relax_prior_sites_without_rows`), NaN where a relaxation did not converge; None where
    the fit has no such sites (a Gaussian prior, the multinomial EP) or holds them (a
    log-concave prior's: Laplace, the elastic net)."""
    posterior = estimator.posteriors_[0]
    sites, prior_sites = posterior.sites, getattr(posterior, "prior_sites", None)
    factor = estimator._shrinkage_factor()
    if factor is None or prior_sites is None or sites.space != "signed" or not len(rows):
        return None
    if factor_is_log_concave(factor):  # (its sites move little: held, D-194)
        return None
    X, priors = _refit_model_inputs(estimator, data)
    labels = np.where(data.index == 1, 1.0, -1.0)
    model = BinaryGLMPosterior(
        X, labels, data.weights, estimator._link, coefficient_prior=factor, **priors
    )
    model_rows = np.cumsum(data.weights > 0)[rows] - 1  # the models keep weight > 0 rows
    relaxed = relax_prior_sites_without_rows(
        model,
        sites,
        model_rows,
        prior_sites,
        prior_nonnegative=getattr(posterior, "prior_nonnegative", False),
        tol=REFIT_TOL,
    )
    out = np.full(len(rows), np.nan)
    ok = np.isfinite(relaxed.mean)
    weight = data.weights[rows]
    out[ok] = _binary_log_predictive(model.link, relaxed.mean[ok], relaxed.var[ok], weight[ok])
    return out


def _ep_cavity_terms(estimator, data: _Training, sites, positive):
    """``log ∫ F^{s_i} × cavity_i`` and ``log ∫ F^{s_i} × posterior_i`` of each row, from
    EP's sites and the posterior's latent moments (rows of weight zero: 0)."""
    predictive = estimator._predictive()
    X, weights = data.X[positive], data.weights[positive]
    n = len(data.weights)
    loo, lppd = np.zeros(n), np.zeros(n)
    # An all-zero row without an intercept: its latent is 0 under every Gaussian and its
    # site 0 (with_constant_rows), so that its cavity is the posterior's point mass at 0
    # and both its terms are its constant factor's log (s log F(0); −s log K). Its
    # variance is set to 1 only to keep it out of the cavities' arithmetic.
    constant = np.zeros(X.shape[0], bool) if estimator.fit_intercept else constant_rows(X)
    if sites.space == "signed":  # binary: t_i = y_i f_i
        link = predictive.link
        sign = np.where(data.index[positive] == 1, 1.0, -1.0)
        f_mean, f_var = predictive.latent_mean_and_variance(X)
        t_mean = sign * f_mean
        if constant.any():
            f_var = np.where(constant, 1.0, f_var)
        cav_prec = 1.0 / f_var - sites.precision
        cav_lin = t_mean / f_var - sites.linear
        proper = cav_prec > 0
        cav_var = 1.0 / np.where(proper, cav_prec, 1.0)
        cav_mean = cav_lin * cav_var
        terms = np.where(proper, _binary_log_predictive(link, cav_mean, cav_var, weights), np.nan)
        fitted = _binary_log_predictive(link, t_mean, f_var, weights)
        if constant.any():
            factor = weights[constant] * float(link.log_cdf(np.zeros(1))[0])
            terms[constant], fitted[constant] = factor, factor
        loo[positive], lppd[positive] = terms, fitted
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
        fixed = constant[rows]
        if fixed.any():
            g_cov[fixed] = np.eye(k - 1)
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
    if constant.any():
        factor = -math.log(k) * weights[constant]
        out_loo[constant], out_lppd[constant] = factor, factor
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
    ``size`` entries): the prior the fit used — ``prior=`` a Gaussian, a shrinkage
    prior's on the coefficients (``penalty="l1"``/``"elasticnet"`` or a prior object;
    binary, or on every class's coefficients of the multinomial), else N(0, C) (the flat
    prior's, or liblinear's intercept) as ``fit`` made it."""
    factor = getattr(estimator, "_coefficient_factor_", None)
    given = getattr(estimator, "prior", None) is not None and factor is None
    if given:  # N(μ₀, Σ₀) in θ's layout: the fit's own (binary, or the multinomial's one)
        problem = (None, None if n_problems == 1 else n_problems)
        return estimator._problem_priors(d, [problem], estimator.classes_)[0].log_density
    flat = estimator._resolved_penalty() is None  # (not _flat_prior: fit warned already)
    priors = estimator._priors(data.X, data.weights, flat)
    prior_var = np.empty(size)  # θ: every problem's (or class's) d, then intercepts
    prior_var[: n_problems * d] = np.tile(np.broadcast_to(priors["prior_var"], (d,)), n_problems)
    prior_var[n_problems * d :] = priors["intercept_prior_var"] or 1.0
    if factor is None:
        return lambda theta: -0.5 * (theta * theta) @ (1.0 / prior_var)

    n_coef = n_problems * d  # (the multinomial's: every class's coefficients)

    def shrinkage_log_density(theta: np.ndarray) -> np.ndarray:
        # The coefficients' shrinkage prior, the intercepts' N(0, 10⁶) (or none).
        intercept = theta[:, n_coef:]
        return factor.log_density(theta[:, :n_coef]).sum(axis=1) - 0.5 * (intercept * intercept) @ (
            1.0 / prior_var[n_coef:]
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
            sigma = np.asarray(sigma, dtype=float)
            try:
                # Cholesky's factor is continuous in Σ, so posteriors equal to round-off
                # (fits on CSR and on dense X) get the same draws. eigh's vectors are each
                # fixed up to a sign, a repeated eigenvalue's (the multinomial shift
                # directions') up to a rotation: round-off flipped them, drawing another
                # sample (Pareto k̂ 0.28 apart on breast cancer, and other rows warned; D-221).
                lower = scipy.linalg.cholesky(sigma, lower=True)
                width = mean.size

                def spread(z: np.ndarray) -> np.ndarray:
                    return z @ lower.T

            except scipy.linalg.LinAlgError:  # semidefinite to round-off: its range only
                values, vectors = scipy.linalg.eigh(sigma)
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
            # log softmax(f)_y = g − log(e^g + r), with g = f_y − m ≤ 0 and r the other
            # classes' Σ exp(f_j − m) (m the largest f), taken as g − log1p(expm1(g) + r):
            # exact in relative terms where y is near certain (g = 0, a term of r's size),
            # where f_y − logsumexp(f) leaves round-off of f's size or exactly 0.
            columns = np.arange(len(index))
            f -= f.max(axis=1, keepdims=True)
            gap = f[:, index, columns]
            np.exp(f, out=f)
            f[:, index, columns] = 0.0
            log_p = gap - np.log1p(np.expm1(gap) + f.sum(axis=1))
        else:
            f = f[:, 0]
            f *= np.where(index == 1, 1.0, -1.0)
            # To 1e-7 per row (the logistic link's float32 soft part): far below the
            # sampling error of S draws; the export's values are exact in the log domain
            # (float32 rounds a near-certain row's to 0 in every draw, and ArviZ's own
            # smoothing then finds a flat tail).
            # (Exact too where the weights would multiply its error beyond that.)
            fast = not self.exact and fast_log_cdf_suffices(weights)
            log_cdf = self.link.fast_log_cdf if fast else self.link.log_cdf
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
