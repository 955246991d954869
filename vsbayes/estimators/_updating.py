"""Bayesian updating: a general Gaussian prior, ``partial_fit`` and Thompson draws.

A mixin of :class:`~vsbayes.estimators._base.BayesianGLMClassifier`.

**The prior.** ``prior`` is N(μ₀, Σ₀) on each problem's parameter vector (binary:
``[coef, intercept]``; multinomial: ``[W.ravel(), b]``, ``sigma_``'s layout). How each model
takes it (:func:`problem_model`):

- binary, diagonal Σ₀: the model's own prior ``N(μ₀, diag(prior_var))``: exact, no copy of
  the rows, sparse and dask designs kept as they are;
- binary, full Σ₀: whitened (:mod:`vsbayes.models.priors`), the model of the design
  ``[X, 1] L`` with the prior N(L⁻¹μ₀, I) and the posterior mapped back. Exact, for every
  method; the whitened design is dense, M × p floats (a sparse design is densified: its
  size is checked first, :class:`~vsbayes._memory.MemoryLimitError` if it does not fit; a
  dask design is whitened chunk by chunk, on the workers);
- multinomial: the model's full prior precision (the softmax's Kronecker structure does not
  survive whitening), exact for Laplace and the sampling fits.

**partial_fit** is assumed-density filtering (ADF): the posterior after a batch is the
prior of the next, fitted by the estimator's own method on that batch only, so its cost and
memory depend on the batch and the parameters, never on the rows seen before. ADF loses
most on small batches (each replaced by a Gaussian where the early estimates put it), so
small batches are also kept: a batch of fewer than ``buffer_size`` rows (W) updates the
posterior at once, as any batch, and joins a buffer together with the posterior from
before the buffer's first batch (the anchor) and the running evidence then; when the
buffer and a new batch reach W rows, the posterior is the method's fit of all of them
under the anchor, and the buffer empties. At each refit the posterior is therefore that of
ADF in batches of (at least) W rows, between refits that of W-ADF followed by the small
batches' ADF; memory: fewer than W rows; the call that refits costs a fit of its rows
(D-078). A stream of one-row calls does not refit (a fit of W rows is many one-row
updates' cost): each row's update is a Gaussian site in its latent values — binary, its
signed latent ``t = ±[x, 1]·θ``; multinomial, its K − 1 contrasts ``Qᵀ(Θ x̃)`` (the
multinomial EP's sites, binary the K = 2 case) — and the window keeps the last W rows
with their sites; each call refits the sites of ``REVISITS`` (4) rows of the window,
those visited longest ago, under the posterior without them (EP's update for EP and VS:
binary, the tilted moments; multinomial, the multinomial EP's site update, its tilted
moments; for Laplace, the mode and curvature of the same tilted density: Laplace
propagation, whose fixed point is the joint Laplace approximation; for VB, the bound's
site at the row's optimal ξ under the cavity), all in one step from
the posterior before the row (multinomial: one Woodbury update of rank (K − 1)(1 +
REVISITS)). That is incremental EP over a sliding window: each row's site is refitted
about 4 times while in the window, once just before it leaves, under a cavity holding
the W − 1 rows after it; its cost is a few rank-(K − 1) updates, O(p² K), bounded
whatever the stream. The window starts at a stream's first row, the multinomial too: a
multinomial row whose cavity is wide (the first rows under a vague prior) takes the
tilted moments' finer rule levels, and where the factor narrows its cavity much or its
tilted mass is deep in a wide cavity's tail, the moments of the nodes on the mixture of
its cavity and a kernel near its tilted density (its posterior marginal; for a new row its
Stein tilted Gaussian where proper, else, and for a row in the tail, the tilted density's
Laplace approximation), in the same call. A
larger batch freezes the window (its sites stay in the posterior) and starts the buffer
of batches, but for Laplace's binary and one-vs-rest streams, whose batches join the window
(below).

**Laplace's window.** A Laplace site is the Taylor expansion of the row's log-likelihood
at a mode: batch Laplace expands every row at the final mode, a stream where the mode was
when the row's site was last fitted. On nearly separated data the mode moves outward as
rows come, the rows' curvature falls, and a site frozen early carries too much precision
and pulls the coefficients back (breast cancer in batches of 100: KL 1.38 nats from the
batch fit, held-out log loss 5 % above its). So a Laplace batch of several rows (binary,
one-vs-rest) is fitted jointly with the window's rows under the posterior without their
sites (its frozen part: the prior and the sites of the rows that left), each row's site
then its expansion at the joint mode (the general fit, on W + n rows); and the rows that
leave the window, by one-row calls and batches alike, are not the oldest but those whose
sites are closest to their likelihood where the posterior may still move:
:func:`taylor_errors`, ``E|s log F(t) − q(t)|`` over the row's latent marginal, ``q`` the
expansion at its mean. A row far on its side (its curvature died out) or pinned down by
the posterior leaves; a row whose curvature a later mode would change stays and is
refitted (a one-row call's rows as of their last visit: the new row's and the four
revisited rows' errors are computed, the others kept). While every row is in the window,
the stream is the batch Laplace fit (its evidence too: a call's evidence replaces the
window rows' Laplace evidence under the frozen part by the joint fit's).

**Structured posteriors** (text scale: more coefficients than the dense p × p covariance
allows, :func:`~vsbayes.approximations.structured_laplace.choose_covariance`, binary):
a batch under a diagonal prior N(μ, diag(v)) is the model's own prior, which the
structured Laplace fit takes as ``fit`` does; the carried structured posterior is
projected onto the Gaussians whose coefficients are independent given the intercept (its
mean, marginal variances and the intercept's covariances: ADF's KL projection onto that
family; the correlations between coefficients dropped; without an intercept, the
diagonal), held in O(p), never p × p. Such a prior is diagonal in the coordinates
``(θ_rest − c θ_b, θ_b)``, whose design is ``[X, 1 + X c]`` (:func:`_hub_design`): the
batch's structured fit there, mapped back. One-row calls take the same structured fit
(its "dual" form over one row) and join the buffer, refitted every ``buffer_size`` rows:
the window's sites update a dense covariance. ``decay`` mixes natural parameters as for
any prior, in O(p) (docs/decisions.md, D-112).

``decay`` forgets: before a batch of n rows the carried posterior's natural parameters
(precision and precision × mean) are mixed with the original prior's with weight
``decay**n``, so a row seen k rows ago weighs ``decay**k`` and the effective memory is
``1 / (1 − decay)`` rows. A refit keeps that meaning: the anchor is forgotten by
``decay**m`` (m: the rows since it), and each buffered row's likelihood weighs
``decay**k``, k the rows after its batch — what batch by batch forgetting gives the
exact posterior (the rows of one batch weigh alike, as they do batch by batch). So does
the window: forgetting scales its sites as the rest of the posterior, and a revisit
fits the row's likelihood to the power ``decay**k`` (power EP). The running evidence
``log p(y_1..y_t)`` is the sum of each batch's evidence given the batches before; a
refit replaces its small batches' terms by the evidence of their rows given the anchor
(with ``decay`` < 1, of the rows' weighted likelihoods); revisits leave it ADF's.

**One row** skips the general fit (``buffer_size`` ≤ 1, or where the window does not take
it; in the window, a new row's site is this update too, from its site of zeros, the
multinomial one in one pass where its site is of its cavity alone, else one pass of its
nodes' own moments on a kernel at its tilted mode, by the tilted moments at any cavity
width where this update takes VS fits for wide ones): prior × one factor differs from the
prior along the row only, so the posterior is a rank-one update of the prior by the row's
new latent marginal, O(p²). Laplace's comes from Newton's method in the row's latent (the
general solver's iterates, in the one dimension they move in), EP's from one tilted-moment
match (with one site EP's first update is its fixed point: assumed-density filtering),
VS's, IS's and BMC's from the same moments: they are the exact posterior's, which every VS
route and the sampling fits estimate. The multinomial row's likelihood sees its K − 1
contrasts only: EP, VS and IS take the multinomial EP's site of their (K − 1)-dimensional
tilted density (its tilted moments, or its VS fit where the row's cavity is wide) at EP's
fixed point (the general sweep's update of the one site, repeated until it settles),
Laplace Newton's method in the contrasts, each followed by a rank-(K − 1) update. VB's
(binary and one-vs-rest) is the Jaakkola–Jordan bound's optimum for the row: the bound of
one row is a Gaussian site in its latent, its optimal ξ the root of a scalar equation,
solved to round-off (the general fit's updates, on one row, iterate that equation and
converge slowly where the prior is vague along the row: thousands of updates under the
default intercept's N(0, 10⁶)); a window revisit re-optimizes a row's ξ under its cavity,
a coordinate ascent on the bound of the window's rows, whose fixed point is the batch VB
fit. The method's ``one_row`` says which; each is the general fit's posterior to its
tolerance (IS's and BMC's: to their sampling error; tests/test_updating.py). Small
batches favour the moments: Laplace's expansion of each batch at its own mode takes the
rows' curvature where the early estimates put them and accumulates too much precision
(docs/decisions.md, "Streaming by moments"), which its window corrects (above).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_scalar
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import unique_labels
from sklearn.utils.validation import validate_data

from .._blas import one_blas_thread, one_blas_thread_below
from .._memory import check_memory, format_bytes, get_config
from .._random import as_generator
from ..approximations.expectation_propagation import EPResult, assumed_density_row
from ..approximations.newton_laplace import (
    row_laplace,
    softmax_mode_site_updates,
    softmax_row_laplace,
)
from ..approximations.softmax_ep import (
    assumed_density_softmax_row,
    softmax_site_updates,
)
from ..approximations.softmax_laplace import check_softmax_dims
from ..approximations.structured_laplace import StructuredLaplaceResult, choose_covariance
from ..approximations.variational_bayes import (
    VBResult,
    jaakkola_jordan_latent,
    jaakkola_jordan_row,
)
from ..engine import LaplaceResult
from ..exceptions import EstimationError, MemoryLimitError, NotPositiveDefiniteError
from ..gaussian import Gaussian, StructuredCovariance, StructuredGaussian
from ..models import (
    BinaryGLMPosterior,
    ChunkedPosterior,
    ChunkedSoftmaxPosterior,
    SoftmaxGLMPosterior,
)
from ..models.dask_chunks import is_dask, is_dask_array
from ..models.links import get_link
from ..models.priors import GaussianPrior
from ..models.shrinkage_priors import SHRINKAGE_PRIORS
from ..models.softmax_predictive import centred_basis
from ..models.tilted import NARROW_MAX_VAR, narrow_tilted_moments, tilted_mode
from ._methods import SOFTMAX_EP_MIN_TOL, MethodFit
from ._prediction import read_work, row_count

__all__ = [
    "ONE_ROW_REASON",
    "ONE_SOFTMAX_ROW_REASON",
    "BayesianUpdating",
    "ThompsonDraws",
    "problem_model",
]

#: The route a one-row update records (``strategy_reason_``) where the method records one.
ONE_ROW_REASON = (
    "one row: its posterior's moments are those of its one-dimensional tilted density, "
    "computed to round-off (assumed-density filtering), which every route aims at"
)
#: The same for one row of a stream, whose update also revisits earlier rows' sites.
WINDOW_ROW_REASON = (
    "one row of a stream: its tilted density's moments and those of the earlier rows it "
    "revisits, each under the posterior without its site (expectation propagation's "
    "update, as assumed-density filtering with revisits)"
)
#: The same for one multinomial row, whose tilted density has K − 1 dimensions.
ONE_SOFTMAX_ROW_REASON = (
    "one row: its posterior's moments are those of its (K - 1)-dimensional tilted "
    "density at expectation propagation's fixed point (assumed-density filtering)"
)


class ThompsonDraws(NamedTuple):
    """Posterior draws for Thompson sampling (:meth:`BayesianUpdating.thompson_sample`).

    Attributes
    ----------
    scores : ndarray of shape (n_draws, n_rows) or (n_draws, n_rows, n_classes)
        Latent scores ``x·w + b`` of each candidate row under each draw: one per row with
        two classes (the score of ``classes_[1]``), else one per class.
    coef : ndarray of shape (n_draws, *coef_.shape)
        The drawn coefficients.
    intercept : ndarray of shape (n_draws, *intercept_.shape)
        The drawn intercepts (zeros when ``fit_intercept=False``).
    """

    scores: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray


class BayesianUpdating:
    """``prior`` handling, ``partial_fit`` and Thompson draws (see the module docstring)."""

    # --- the prior ---------------------------------------------------------------------

    def _default_prior(
        self, n_features: int, n_classes: int | None, variances: dict
    ) -> GaussianPrior:
        """The prior without ``prior`` (``variances``: the models' ``prior_var`` and
        ``intercept_prior_var``, from ``C``), of one binary problem (``n_classes`` None) or
        the multinomial one."""
        k = 1 if n_classes is None else n_classes
        coef = np.broadcast_to(np.asarray(variances["prior_var"], dtype=float), (n_features,))
        parts = [np.tile(coef, k)]
        if self.fit_intercept:
            parts.append(np.full(k, float(variances["intercept_prior_var"])))
        diagonal = np.concatenate(parts)
        return GaussianPrior(np.zeros(diagonal.size), diagonal)

    def _problem_priors(
        self, n_features: int, problems: list, classes: np.ndarray
    ) -> list[GaussianPrior | None]:
        """The prior of each problem from the ``prior`` parameter (None: the default)."""
        if self.prior is None:
            return [None] * len(problems)
        n_classes = problems[0][1]
        width = n_features + int(self.fit_intercept)
        p = width if n_classes is None else n_classes * width
        specs = _prior_specs(self, self.prior, classes)
        if len(specs) == 1:
            specs = specs * len(problems)
        if len(specs) != len(problems):
            raise ValueError(
                f"prior holds {len(specs)} Gaussians; this fit has {len(problems)} "
                f"problem(s) (one per class one-vs-rest, else one). Pass one prior, or one "
                f"per problem."
            )
        priors = [_as_prior(spec) for spec in specs]
        for prior in priors:
            if prior.dim != p:
                layout = (
                    "[coef, intercept]"
                    if n_classes is None
                    else f"[W.ravel(), b] of {n_classes} classes"
                )
                raise ValueError(
                    f"prior has {prior.dim} parameters; this fit has {p}: {layout} with "
                    f"{n_features} features{' and an intercept' if self.fit_intercept else ''}."
                )
        return priors

    # --- partial_fit -------------------------------------------------------------------

    def _gaussian_prior_only(self) -> bool:
        """Whether ``partial_fit`` is available: a Gaussian prior. Hidden (an
        AttributeError, as scikit-learn's ``MLPClassifier`` hides it for lbfgs) under a
        shrinkage prior, whose posterior is not carried batch by batch; invalid
        parameters leave it to ``partial_fit``'s own check, which names them."""
        try:
            shrinkage = isinstance(self.prior, SHRINKAGE_PRIORS) or (
                self.prior is None and self._resolved_penalty() in ("l1", "elasticnet")
            )
        except (TypeError, ValueError):
            return True
        if shrinkage:
            raise AttributeError(
                "partial_fit updates a Gaussian posterior batch by batch; a shrinkage prior "
                "(penalty='l1' or 'elasticnet', or a Laplace, Student-t or horseshoe prior) "
                "is not Gaussian. Use fit on all the rows."
            )
        return True

    @available_if(_gaussian_prior_only)
    @one_blas_thread
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """Update the posterior with one batch of rows (assumed-density filtering).

        The posterior after the earlier batches (or ``prior``, or the default prior, at
        the first call) is the prior of this batch, fitted by the estimator's own method on
        its rows alone; ``decay`` first widens it toward the original prior (see the
        ``decay`` parameter). A batch of fewer than ``buffer_size`` rows also joins a
        buffer: when the buffer reaches ``buffer_size`` rows, this call refits them
        jointly under the posterior from before them (filtering loses most on small
        batches), and empties it. Memory and cost do not grow with the rows seen before. A
        batch of one row (every method; binary, one-vs-rest and multinomial) is a
        rank-(K − 1) update of the prior (rank one but for the multinomial posterior), and
        refits the sites of four of the last ``buffer_size`` rows under the posterior
        without them (incremental EP over a sliding window; see the module docstring): no
        one-row call refits the buffer, each costs about as much as
        ``SGDClassifier.partial_fit`` of that row, so that a decision loop's calls stay
        within a bound.

        The Laplace approximation expands each row's likelihood at a mode; a stream's
        early modes are not the final one, so Laplace's binary and one-vs-rest streams fit
        each batch jointly with the ``buffer_size`` rows kept and keep those whose
        expansions are least accurate over the posterior, the others' sites staying in it
        (the module docstring of ``vsbayes.estimators._updating``; without this, breast
        cancer's held-out log loss was 5 % above the batch fit's in batches of 100 rows).
        With the default buffer, the Laplace, EP and VS streams in batches of 1, 10 and 100
        rows were within 1 % of their batch fits' log loss on breast cancer, the paper's
        four data sets and a 4-class problem (``benchmarks/results/streaming.md``; VS
        without the buffer, up to 4 % worse).

        Where the dense posterior does not fit (text scale: see ``covariance_structure_``),
        a binary stream fits each batch, one row too, by the structured Laplace route under
        the projection of the posterior before it (mean, marginal variances and the
        intercept's covariances; the correlations between coefficients are dropped,
        ``covariance_reason_`` says so): memory O(p) between calls, never p × p
        (``benchmarks/results/sparse_streaming.md``). A multinomial
        posterior under a prior is dense: beyond its size, stream one-vs-rest
        (``sklearn.multiclass.OneVsRestClassifier(...).partial_fit``).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The batch (one row or more).
        y : array-like of shape (n_samples,)
            Its labels, all in ``classes`` (a batch may hold one class only).
        classes : array-like of shape (n_classes,), default=None
            Every class of the stream: required at the first call, and if given later, the
            same ones.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights (likelihood exponents). A later batch whose weights (times
            ``class_weight``) are all zero changes nothing.

        Returns
        -------
        self : object
            The updated estimator.

        Raises
        ------
        ValueError
            Naming what is wrong: no ``classes`` at the first call, other classes later,
            a label outside them, a changed number of features, a bad prior or ``decay``,
            ``prior`` or ``C`` (the default prior's) changed after the first batch with
            ``decay=1`` (it would be ignored) or ``fit_intercept`` changed after it,
            a structured covariance forced by ``vsbayes.config_context`` on a stream that
            keeps the dense one. The carried posterior is left as it was.
        """
        # Parameters of immutable scalar types, as they were when last found valid, are not
        # checked again (a stream's one-row calls, where the checks were ~3 % of a call).
        # The type is compared too (1 == 1.0 == True); others are checked every call.
        params = tuple((type(v), v) for v in map(self.__getattribute__, self._constraints))
        if not all(kind in _SCALAR_TYPES for kind, _ in params):
            params = None
        if params is None or params != vars(self).get("_checked_params"):
            self._check_params()
            self._checked_params = params
        first = not hasattr(self, "posteriors_")
        if self._flat_prior() and self.prior is None:
            if not first:
                raise ValueError(
                    f"penalty={self.penalty!r} with C={self.C!r} (a flat prior) was set after "
                    f"the stream's first batch: partial_fit continues from the posterior, and "
                    f"a flat prior has nothing for forgetting to near. Set it back, or call "
                    f"fit (sklearn.base.clone to start over)."
                )
            raise ValueError(
                "partial_fit needs a proper prior for its first batch, which may be one row: "
                "penalty=None (or C=np.inf) is flat. Use a finite C, or prior= an earlier fit."
            )
        fitted_prior = vars(self).get("_fitted_prior_", self.prior)
        if not first and self.decay == 1 and not _same_prior(self.prior, fitted_prior):
            raise ValueError(
                "prior was changed (set_params or assignment) after the posterior was fitted: "
                "partial_fit continues from the earlier batches' posterior and reads prior "
                "only at a stream's first batch (and with decay < 1, as what forgetting "
                "nears), so the new prior would be ignored. To start over under it, call fit "
                "or partial_fit a clone (sklearn.base.clone); to continue, set prior back."
            )
        fitted_intercept = vars(self).get("_fitted_intercept_", self.fit_intercept)
        if not first and self.fit_intercept != fitted_intercept:
            raise ValueError(
                f"fit_intercept was changed to {self.fit_intercept!r} after the posterior was "
                f"fitted with fit_intercept={fitted_intercept!r}: partial_fit continues from "
                f"that posterior, whose parameter vector has "
                f"{'an' if fitted_intercept else 'no'} intercept. To start over, call fit or "
                f"partial_fit a clone (sklearn.base.clone); to continue, set it back."
            )
        # C (and liblinear's intercept_scaling) set the default prior: read as prior is.
        fitted_scales = vars(self).get("_fitted_prior_scales_")
        read = self.decay == 1 and not first and self.prior is None
        if read and fitted_scales not in (None, self._priors(None, None, False)):
            raise ValueError(
                f"C={self.C!r} (or intercept_scaling) was changed after the stream's first "
                f"batch, whose default prior it sets: partial_fit continues from the "
                f"posterior and reads C only at a stream's first batch (and with decay < 1, "
                f"as what forgetting nears), so the change would be ignored. To start over "
                f"under it, call fit or partial_fit a clone (sklearn.base.clone); to "
                f"continue, set it back."
            )
        classes = self._partial_fit_classes(classes, first)
        if is_dask(X):
            raise ValueError(
                "partial_fit takes batches in memory; pass X.compute() (a dask array of "
                "many rows is one fit: use fit with prior=the earlier posterior)."
            )
        if first or not _plain_batch(self, X, y):
            X, y = validate_data(
                self, X, y, accept_sparse="csr", dtype=[np.float64, np.float32], reset=first
            )
        dtype = X.dtype  # the fitted coefficients keep it, as fit's
        X = X.astype(np.float64, copy=False)
        y_index = np.searchsorted(classes, y)
        known = classes[np.minimum(y_index, len(classes) - 1)] == y
        if not known.all():
            raise ValueError(
                f"y holds label(s) {np.unique(y[~known]).tolist()} outside classes "
                f"{classes.tolist()} given at the first call to partial_fit; all classes "
                f"must be declared then."
            )
        weights = self._checked_sample_weight(sample_weight, X.shape[0], allow_zero=True)
        if self.class_weight is not None:
            if isinstance(self.class_weight, str):
                raise ValueError(
                    "class_weight='balanced' needs every class's count, which a batch does "
                    "not have; pass a dict of class weights to partial_fit."
                )
            per_class = compute_class_weight(self.class_weight, classes=classes, y=y)
            weights = weights * self._checked_class_weights(per_class, self.class_weight)[y_index]
        if not weights.any():  # (sample_weight × class_weight) a batch without information
            if first:
                raise ValueError(
                    "The first batch's weights (sample_weight times class_weight) are all "
                    "zero: its posterior would be the prior alone. Start the stream with a "
                    "batch of positive weight."
                )
            return self  # its likelihood is 1: the posterior, buffer and evidence as they were
        problems = self._problems(y_index, len(classes))
        n_rows = X.shape[0]
        buffer = None if first else vars(self).get("_stream_buffer")
        # A window of one-row calls' sites is revised in the calls themselves; any other
        # call freezes it (its sites stay in the posterior as they are).
        window = buffer if isinstance(buffer, _SiteWindow) else None
        buffer = None if window is not None else buffer
        size = int(self.buffer_size)
        refit = buffer is not None and buffer.n_rows + n_rows >= size
        decay = float(self.decay)
        keep = 1.0 if first else decay ** (n_rows + (buffer.n_rows if refit else 0))
        if first or keep < 1.0:  # the original prior: the start, or what forgetting nears
            given = self._problem_priors(X.shape[1], problems, classes)
            variances = self._priors(X, weights, False)
            defaults = [self._default_prior(X.shape[1], k, variances) for _, k in problems]
            originals = [g if g is not None else d for g, d in zip(given, defaults, strict=True)]
        if first:
            before, evidence_before = originals, np.asarray(0.0)
        else:
            binary = problems[0][1] is None
            before = [_carried_prior(g, binary, self.fit_intercept) for g in self.posteriors_]
            evidence_before = np.asarray(self.log_marginal_likelihood_value_)
        batch = X, y_index, weights
        carried = before
        if refit:  # the buffer's rows and this batch, jointly, under the anchor
            X, y_index, weights = buffer.joined(X, y_index, weights, decay)
            problems = self._problems(y_index, len(classes))
            carried, evidence_before = list(buffer.anchor), buffer.anchor_evidence
        if keep < 1.0:
            carried = [c.forgotten(keep, o) for c, o in zip(carried, originals, strict=True)]
        fits = revised = None
        # A structured posterior (too many coefficients for the dense one) takes every
        # batch, one row too, by the structured fit: the one-row rules and the window's
        # sites update a dense p × p covariance.
        structured = _structured_stream(self, X, problems, weights, carried)
        if not structured and self.max_iter != 0:
            refuse_forced_structure(type(self).__name__, *_why_dense_stream(problems))
        # Laplace's batches of several rows (binary, one-vs-rest) join its window of sites:
        # refitted jointly with its rows, which leave it by how well their sites fit.
        mode_window = (
            not structured
            and n_rows > 1
            and buffer is None
            and size > 1
            and problems[0][1] is None
            and self.max_iter != 0
            and self._one_row_rule() == "mode"
        )
        if mode_window:
            method = self._new_posterior_method()
            fits, revised, window_evidence = self._window_batch_fits(
                method, X, problems, weights, carried, window, keep, self._random_generator()
            )
            # The running evidence: the window's rows' term under the frozen part is
            # replaced by the joint fit's evidence of them and the batch.
            evidence_before = evidence_before - (
                window_evidence[0] if len(problems) == 1 else window_evidence
            )
        elif not structured and n_rows == 1 and buffer is None and size > 1:
            fits, revised = self._window_row_fits(X, problems, weights, carried, window, keep)
            if fits is None and problems[0][1] is not None:  # its own row's update alone
                fits = self._one_row_fits(X, problems, weights, carried)
        elif not (structured or refit):
            fits = self._one_row_fits(X, problems, weights, carried)
        if mode_window:
            pass
        elif fits is not None:  # the method's class holds what _store asks of it
            method = self._posterior_method
        else:
            method = self._new_posterior_method()
            rng = self._random_generator()
            binary = len(classes) == 2  # (classes_ is set below, once all went well)
            fits = [
                self._fit_problem(
                    method, X, *problem, weights, rng, None, None, prior, binary=binary
                )
                for problem, prior in zip(problems, carried, strict=True)
            ]
            fits = [_carried_note(fit) for fit in fits]
        # A small batch joins the buffer (begun with the posterior before it as the anchor);
        # a refit, or a batch of buffer_size rows or more, leaves it empty.
        if revised is not None:
            buffer = revised
        elif refit or n_rows >= size:
            buffer = None
        else:
            buffer = (buffer or _StreamBuffer.start(before, evidence_before)).appended(*batch)
        # Nothing above changed the estimator but n_features_in_ at the first call: the
        # fitted state changes here, all at once.
        self.classes_ = classes
        self._store(method, fits, X.shape[1], dtype, evidence_defined=True)
        self._stream_buffer = buffer
        # log p(y_1..y_t) = Σ_batches log p(y_b | earlier): ADF's running evidence (a
        # refit's batch: the buffer's rows, after the anchor).
        total = np.asarray(self.log_marginal_likelihood_value_) + evidence_before
        self.log_marginal_likelihood_value_ = float(total) if total.ndim == 0 else total
        return self

    def _one_row_rule(self) -> str | None:
        """How a one-row batch updates the prior directly: the method's ``one_row``
        ("mode", "moments", "bound") or None (the general fit)."""
        return self._posterior_method.one_row

    def _one_row_fits(self, X, problems, weights, carried) -> list[MethodFit] | None:
        """The fits of a batch of one row by the direct update of each problem's prior
        (see the module docstring), or None where the general fit is needed: more rows,
        ``max_iter=0``, a method without a direct rule,
        a weight above 1 for the moments (power EP's copies), or a direct update that did
        not converge or failed (the general fit then warns or falls back as it does)."""
        rule = self._one_row_rule()
        if X.shape[0] != 1 or rule is None or self.max_iter == 0:
            return None
        weight = float(weights[0])
        if rule == "moments" and weight > 1.0:
            return None
        row = X.toarray()[0] if sp.issparse(X) else X[0]
        n_classes = problems[0][1]
        if n_classes is not None:
            return self._one_softmax_row(row, problems[0][0], n_classes, weight, rule, carried)
        row = self._binary_row(row)
        if rule != "bound" and not row.any():
            # An all-zero row (no intercept) has no latent variance for the direct
            # updates to divide by; its factor is constant, which the general fit takes.
            return None
        link = get_link(self._link)
        fits = []
        for (labels, _), prior in zip(problems, carried, strict=True):
            signed = labels[0] * row
            # An updated covariance that round-off left indefinite (a vague prior against
            # a decisive row) goes to the general fit too, which says what to change.
            if rule == "bound":  # (at the optimum: it cannot fail to converge)
                posterior = jaakkola_jordan_row(prior.mean, prior.cov, prior.lower, signed, weight)
                fits.append(MethodFit(posterior, posterior.n_iter))
                continue
            try:
                if rule == "mode":
                    posterior = row_laplace(
                        prior.mean,
                        prior.cov,
                        prior.lower,
                        signed,
                        weight,
                        link,
                        tol=self.tol,
                        max_iter=self.max_iter,
                    )
                else:
                    posterior = assumed_density_row(
                        prior.mean, prior.cov, prior.lower, signed, weight, link
                    )
            except (EstimationError, NotPositiveDefiniteError):
                return None
            if rule == "mode":
                if not posterior.converged:
                    return None
                fits.append(MethodFit(posterior, posterior.n_iter))
                continue
            fits.append(self._row_fit(posterior, ONE_ROW_REASON))
        self._report(fits)
        return fits

    def _binary_row(self, row: np.ndarray) -> np.ndarray:
        """A binary one-row call's row with the intercept's 1, once the updated posterior's
        memory is known to fit."""
        if self.fit_intercept:
            row = np.append(row, 1.0)
        p = row.size
        check_memory(
            8.0 * 3 * p * p,
            f"the updated posterior of {p} coefficients (three {p} × {p} matrices)",
            "Use fewer features: the posterior's memory grows with their square.",
        )
        return row

    def _row_fit(self, posterior, reason: str, n_iter: int = 1) -> MethodFit:
        """A one-row call's fit, with its route where the method records one."""
        route = {"strategy": "sites", "reason": reason}
        records = self._posterior_method.records_strategy
        return MethodFit(posterior, n_iter, **(route if records else {}))

    def _report(self, fits) -> None:
        if self.verbose:
            for fit in fits:
                print(f"{type(self).__name__}: {fit.posterior!r}")

    def _window_row_fits(self, X, problems, weights, carried, window, keep):
        """``(fits, window)`` of a one-row call in a stream (``buffer_size`` > 1): the
        row's site joins the window of the last ``buffer_size`` rows' sites and the
        ``REVISITS`` of them visited longest ago are refitted, all from the ``carried``
        prior, in one step (see the module docstring; multinomial:
        :meth:`_window_softmax_row_fits`); or ``(None, None)`` where the general fit (or,
        multinomial, the row's own update) is needed (as :meth:`_one_row_fits`)."""
        rule = self._one_row_rule()
        weight = float(weights[0])
        if rule is None or self.max_iter == 0 or (rule == "moments" and weight > 1.0):
            return None, None
        row = X.toarray()[0] if sp.issparse(X) else np.asarray(X[0])
        n_classes = problems[0][1]
        if n_classes is not None:
            if not (self.fit_intercept or row.any()):
                # An all-zero row without intercepts: its contrasts have variance 0 (no
                # cavity to update a site from) and its factor K^(−s) is constant, which
                # the general fit takes (as a binary one's, whose update is not usable).
                return None, None
            label = int(problems[0][0][0])
            return self._window_softmax_row_fits(
                row, label, n_classes, weight, rule, carried[0], window, keep
            )
        row = self._binary_row(row)
        p = row.size
        if window is None or not window.fits(p, None):
            window = _SiteWindow.empty(p, len(problems))
        window = window.forgotten(keep)
        chosen = window.least_recent(REVISITS)
        signs = np.array([labels[0] for labels, _ in problems])
        link = get_link(self._link)
        revised_tau = np.empty((len(problems), chosen.size))
        revised_nu = np.empty((len(problems), chosen.size))
        new_sites = np.zeros((2, len(problems)))
        fits = []
        for j, prior in enumerate(carried):
            # The new row (its site zero: its cavity is the carried prior) and the revisited
            # ones, in one step from the carried prior.
            signed = signs[j] * row
            rows = window.labels[j, chosen, None] * window.rows[chosen]
            mean, cov, new_tau, new_nu, log_z = _revisit(
                prior.mean,
                prior.cov,
                np.concatenate([signed[None, :], rows]),
                np.concatenate([[0.0], window.tau[j, chosen]]),
                np.concatenate([[0.0], window.nu[j, chosen]]),
                np.concatenate([[weight], window.powers[chosen]]),
                link,
                rule,
            )
            if not np.isfinite(log_z[0]):
                return None, None  # the row's own update was not usable: the general fit
            new_sites[:, j] = new_tau[0], new_nu[0]
            revised_tau[j], revised_nu[j] = new_tau[1:], new_nu[1:]
            if rule == "mode":
                posterior = _row_mode_result(
                    mean, cov, prior, signed, weight, new_sites[:, j], log_z[0], link
                )
            elif rule == "bound":  # the row's ξ, under the carried prior (its cavity)
                spread = prior.lower.T @ signed
                xi = jaakkola_jordan_latent(float(signed @ prior.mean), spread @ spread, weight)[3]
                posterior = VBResult(mean, cov, log_z[0], n_iter=1, converged=True, xi=np.r_[xi])
            else:
                posterior = EPResult(mean, cov, log_z[0], n_iter=1, converged=True, site_change=0.0)
            fits.append(self._row_fit(posterior, WINDOW_ROW_REASON))
        self._report(fits)
        errors = None
        if rule == "mode":
            # Laplace's sites are expansions at a mode: the row leaving a full window is
            # the one whose site is closest to its likelihood over the posterior
            # (taylor_errors), each row's as of its last visit: this call's rows', and
            # every row's where the window has none yet (a window begun by other calls).
            fresh = chosen if window.errors is not None else np.arange(window.n_rows)
            rows = np.concatenate([window.rows[fresh], row[None, :]])
            powers = np.append(window.powers[fresh], weight)
            computed = sum(
                taylor_errors(
                    np.append(window.labels[j, fresh], signs[j])[:, None] * rows,
                    powers,
                    fit.posterior.mean,
                    fit.posterior.cov,
                    link,
                )
                for j, fit in enumerate(fits)
            )
            errors = np.empty(window.n_rows + 1)
            if window.errors is not None:
                errors[: window.n_rows] = window.errors
            errors[fresh], errors[-1] = computed[:-1], computed[-1]
        window = window.stepped(
            chosen,
            (revised_tau, revised_nu),
            row,
            signs,
            weight,
            new_sites,
            int(self.buffer_size),
            errors,
        )
        return fits, window

    def _window_batch_fits(self, method, X, problems, weights, carried, window, keep, rng):
        """``(fits, window, evidence_window)`` of a Laplace batch of several rows in a
        binary (or one-vs-rest) stream: the joint Laplace fit of the window's rows and the
        batch under the posterior without the window's sites (its frozen part), each row's
        site then its Taylor expansion at the joint mode, and the window keeping the
        ``buffer_size`` rows whose sites are the least accurate (:func:`taylor_errors`);
        the others' sites stay in the posterior, expanded where the joint mode is now.
        ``evidence_window``: each problem's Laplace evidence of the window's rows under
        the frozen part before the call (the running evidence's term the fit replaces)."""
        size = int(self.buffer_size)
        p = X.shape[1] + int(self.fit_intercept)
        if window is None or not window.fits(p, None) or window.labels.shape[0] != len(problems):
            window = _SiteWindow.empty(p, len(problems))
        check_memory(  # (before a sparse batch is made dense)
            8.0 * (window.n_rows + X.shape[0]) * p * 3,
            f"the Laplace window's {window.n_rows} rows and this batch's {X.shape[0]}, "
            f"dense, with their latent moments",
            "Pass the stream in smaller batches, or lower buffer_size.",
        )
        window = window.forgotten(keep)
        rows = X.toarray() if sp.issparse(X) else np.asarray(X)
        if self.fit_intercept:
            rows = np.column_stack([rows, np.ones(rows.shape[0])])
        link = get_link(self._link)
        try:
            parts = [_frozen_part(prior, window, j, link) for j, prior in enumerate(carried)]
        except ValueError:
            # Round-off left a frozen part indefinite (a decisive site against a narrow
            # posterior): the window's sites stay in the posterior as they are, and the
            # batch is filtered on its own.
            window = _SiteWindow.empty(p, len(problems))
            parts = [(prior, 0.0) for prior in carried]
        joined = np.concatenate([window.rows, rows])
        design = joined[:, :-1] if self.fit_intercept else joined
        powers = np.concatenate([window.powers, weights])
        binary = len(problems) == 1
        fits, evidence_window, all_signs, tau, nu = [], [], [], [], []
        errors = np.zeros(joined.shape[0])
        for j, ((labels, _), (frozen, evidence)) in enumerate(zip(problems, parts, strict=True)):
            signs = np.concatenate([window.labels[j], labels])
            fit = self._fit_problem(
                method, design, signs, None, powers, rng, None, None, frozen, binary=binary
            )
            posterior = fit.posterior
            signed = signs[:, None] * joined
            latent = signed @ posterior.mean
            slope, curvature = link.derivatives(latent)
            tau.append(powers * curvature)
            nu.append(tau[-1] * latent + powers * slope)
            errors += taylor_errors(signed, powers, posterior.mean, posterior.cov, link)
            fits.append(fit)
            evidence_window.append(evidence)
            all_signs.append(signs)
        # The rows with the largest errors stay (among equals, the later ones).
        kept = np.sort(np.argsort(errors, kind="stable")[max(joined.shape[0] - size, 0) :])
        calls = window.calls + 1
        window = _SiteWindow(
            joined[kept],
            np.array(all_signs)[:, kept],
            powers[kept],
            np.array(tau)[:, kept],
            np.array(nu)[:, kept],
            np.full(kept.size, calls, dtype=np.int64),
            calls,
            errors[kept],
        )
        return fits, window, np.array(evidence_window)

    def _window_softmax_row_fits(self, row, label, n_classes, weight, rule, prior, window, keep):
        """:meth:`_window_row_fits` of a multinomial row: its (K − 1)-dimensional site and
        those of the ``REVISITS`` rows of the window visited longest ago, by the
        multinomial EP's site update (moments) or Laplace propagation in the contrasts
        (mode), all from the ``carried`` prior, then one rank-(K − 1)(1 + REVISITS)
        update of it (:func:`_softmax_revisit`)."""
        p = prior.dim
        check_memory(
            8.0 * 3 * p * p,
            f"the updated posterior of {p} coefficients (three {p} × {p} matrices)",
            "Use fewer features: the posterior's memory grows with their square.",
        )
        r = n_classes - 1
        if window is None or not window.fits(row.size, r):
            window = _SiteWindow.empty(row.size, 1, r)
        window = window.forgotten(keep)
        chosen = window.least_recent(REVISITS)
        q = _contrast_basis(n_classes)
        revised = _softmax_revisit(
            prior.mean,
            prior.cov,
            _softmax_design(np.vstack([row, window.rows[chosen]]), q, self.fit_intercept),
            np.concatenate([[label], window.labels[0, chosen]]),
            np.concatenate([np.zeros((1, r, r)), window.tau[0, chosen]]),
            np.concatenate([np.zeros((1, r)), window.nu[0, chosen]]),
            np.concatenate([[weight], window.powers[chosen]]),
            q,
            rule,
            lambda: assumed_density_softmax_row(
                prior.mean,
                prior.cov,
                row,
                label,
                n_classes,
                weight,
                fit_intercept=self.fit_intercept,
                tol=max(1e-2 * self.tol, SOFTMAX_EP_MIN_TOL),  # the general EP's
            ),
            self.tol,
        )
        if revised is None:
            return None, None  # the row's own update was not usable
        mean, cov, tau, nu, log_z, modes = revised
        try:  # (the covariance's factorization: its round-off checked)
            if rule == "mode":
                norm = math.sqrt(float(row @ row) + float(self.fit_intercept))
                posterior = _softmax_row_mode_result(mean, cov, prior, modes, log_z, norm)
            else:
                posterior = EPResult(mean, cov, log_z, n_iter=1, converged=True, site_change=0.0)
        except NotPositiveDefiniteError:
            return None, None
        fits = [self._row_fit(posterior, WINDOW_ROW_REASON)]
        self._report(fits)
        window = window.stepped(
            chosen,
            (tau[None, 1:], nu[None, 1:]),
            row,
            np.array([label]),
            weight,
            (tau[:1], nu[:1]),
            int(self.buffer_size),
        )
        return fits, window

    def _one_softmax_row(self, row, label, n_classes, weight, rule, carried):
        """The multinomial one-row fit, a rank-(K − 1) update of the prior: by moments (the
        multinomial EP's site of the row's (K − 1)-dimensional tilted density, tilted
        moments or VS fit as its sweeps would take, at EP's fixed point) or by the mode
        (Newton's method in the row's contrasts); or None where the general fit is needed:
        a fit that failed or did not converge."""
        prior = carried[0]
        p = prior.dim
        check_memory(
            8.0 * 3 * p * p,
            f"the updated posterior of {p} coefficients (three {p} × {p} matrices)",
            "Use fewer features: the posterior's memory grows with their square.",
        )
        if rule == "mode":
            try:
                laplace = softmax_row_laplace(
                    prior.mean,
                    prior.cov,
                    prior.lower,
                    row,
                    int(label[0]),
                    n_classes,
                    weight,
                    fit_intercept=self.fit_intercept,
                    tol=self.tol,
                    max_iter=self.max_iter,
                )
            except NotPositiveDefiniteError:
                return None
            return [MethodFit(laplace, laplace.n_iter)] if laplace.converged else None
        try:
            posterior = assumed_density_softmax_row(
                prior.mean,
                prior.cov,
                row,
                int(label[0]),
                n_classes,
                weight,
                fit_intercept=self.fit_intercept,
                tol=max(1e-2 * self.tol, SOFTMAX_EP_MIN_TOL),  # the general EP's
            )
        except (EstimationError, NotPositiveDefiniteError):
            return None
        fits = [self._row_fit(posterior, ONE_SOFTMAX_ROW_REASON, posterior.n_iter)]
        self._report(fits)
        return fits

    def _partial_fit_classes(self, classes, first: bool) -> np.ndarray:
        """The classes of the stream, checked as ``SGDClassifier.partial_fit`` does."""
        if first:
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            given = np.asarray(classes)
            if given.dtype.kind == "f" and not np.isfinite(given).all():
                raise ValueError(f"classes holds NaN or infinite labels: {given.tolist()!r}.")
            classes = unique_labels(classes)  # (its checks: an array-like, one kind of label)
            if len(classes) < 2:
                raise ValueError(f"classes must hold at least 2 classes; got {classes.tolist()!r}.")
            return classes
        if classes is not None and not np.array_equal(unique_labels(classes), self.classes_):
            raise ValueError(
                f"classes={np.asarray(classes).tolist()!r} is not the same as on the first "
                f"call to partial_fit, {self.classes_.tolist()!r}: a new class cannot join "
                f"after the first call (its coefficients had no prior). Refit with every "
                f"class declared."
            )
        return self.classes_

    # --- Thompson sampling -------------------------------------------------------------

    @one_blas_thread_below(
        lambda self, X, n_draws=1, random_state=None: read_work(self, row_count(X), n_draws)
    )
    def thompson_sample(self, X, n_draws: int = 1, random_state=None) -> ThompsonDraws:
        """Draw coefficients from the posterior and score candidate rows with them, in one
        call (Thompson sampling: act on the draw's best row or class).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_rows, n_features)
            The candidate rows.
        n_draws : int, default=1
            Number of posterior draws.
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws.

        Returns
        -------
        ThompsonDraws
            ``(scores, coef, intercept)``: the latent scores (n_draws, n_rows), or
            (n_draws, n_rows, n_classes) beyond two classes, and the draws.
        """
        X = self._in_memory(X, "thompson_sample")
        n_draws = check_scalar(n_draws, "n_draws", numbers.Integral, min_val=1)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        n_scores = len(self.coef_) if len(self.classes_) > 2 else 1
        check_memory(
            8.0 * X.shape[0] * n_draws * n_scores,
            f"the scores of {X.shape[0]} rows under {n_draws} draws",
            "Draw fewer at a time (n_draws), or score the candidate rows in batches.",
        )
        coef, intercept = self._predictive().sample(n_draws, as_generator(random_state))
        # One GEMM for every draw and class: X (n, d) against the (draws·classes, d) rows.
        flat = coef.reshape(-1, coef.shape[-1])
        scores = np.asarray(X @ flat.T).reshape(X.shape[0], *coef.shape[:-1])
        scores = np.moveaxis(scores, 0, 1) + intercept[:, None]
        if scores.shape[-1] == 1:
            scores = scores[..., 0]
        return ThompsonDraws(scores, coef, intercept)


def _same_prior(given, fitted) -> bool:
    """Whether ``prior`` is the one of the last fit: the same object, or equal values (a
    tuple of the same arrays given again)."""
    if given is fitted:
        return True
    if type(given) is not type(fitted):
        return False
    if isinstance(given, tuple | list):
        return len(given) == len(fitted) and all(map(_same_prior, given, fitted))
    if isinstance(given, np.ndarray):
        return given.shape == fitted.shape and np.array_equal(given, fitted)
    try:
        return bool(given == fitted)
    except (TypeError, ValueError):  # (an array's elementwise ==)
        return False


def _plain_batch(estimator, X, y) -> bool:
    """Whether a later call's ``(X, y)`` are arrays that ``validate_data`` would pass as
    they are: float64 or float32 rows of the fitted width, finite, without feature names
    to check, and as many labels, 1-D, finite. Its checks cost a one-row call a fifth of
    its time; anything else takes them (and their errors)."""
    return (
        type(X) is np.ndarray
        and type(y) is np.ndarray
        and X.ndim == 2
        and y.ndim == 1
        and 0 < X.shape[0] == y.shape[0]
        and X.shape[1] == estimator.n_features_in_
        and X.dtype in _PLAIN_DTYPES
        and y.dtype.kind in "biufU"
        and not hasattr(estimator, "feature_names_in_")
        and bool(np.isfinite(X).all())
        and (y.dtype.kind != "f" or bool(np.isfinite(y).all()))
    )


_PLAIN_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))
#: Parameter values whose check ``partial_fit`` remembers: immutable, compared by value.
_SCALAR_TYPES = frozenset({str, int, float, bool, type(None), np.float64, np.int64, np.bool_})


@dataclasses.dataclass(frozen=True)
class _StreamBuffer:
    """``partial_fit``'s recent small batches (fewer than ``buffer_size`` rows in all) and
    the anchor: the posterior of each problem from before them, unforgotten, with the
    running evidence then. Frozen: a call that fails leaves the estimator's as it was.
    The row count and whether a batch is sparse are kept as the batches join, so that a
    call reads them without a pass over up to ``buffer_size`` one-row batches."""

    anchor: tuple
    anchor_evidence: np.ndarray
    batches: tuple = ()
    n_rows: int = 0
    sparse: bool = False

    @classmethod
    def start(cls, anchor: list[GaussianPrior], evidence) -> _StreamBuffer:
        return cls(tuple(anchor), np.array(evidence, dtype=float))

    def appended(self, X, y_index: np.ndarray, weights: np.ndarray) -> _StreamBuffer:
        """This buffer and one more batch (copied: the caller's arrays may change)."""
        batch = (X.copy(), np.array(y_index), np.array(weights, dtype=float))
        return dataclasses.replace(
            self,
            batches=(*self.batches, batch),
            n_rows=self.n_rows + X.shape[0],
            sparse=self.sparse or sp.issparse(X),
        )

    def joined(self, X, y_index: np.ndarray, weights: np.ndarray, decay: float):
        """``(X, y_index, weights)`` of the buffer's rows and this batch, in their order; a
        row's weight times ``decay**k``, k the rows that came after its batch (what the
        batch by batch forgetting gives it)."""
        parts = (*self.batches, (X, y_index, weights))
        rows, labels, given = zip(*parts, strict=True)
        if self.sparse or sp.issparse(X):
            joined = sp.vstack([sp.csr_matrix(r) for r in rows], format="csr")
        else:
            joined = np.concatenate(rows)
        weighted = np.concatenate(given)
        if decay != 1.0:
            sizes = np.array([r.shape[0] for r in rows])
            after = np.cumsum(sizes[::-1])[::-1] - sizes  # the rows after each batch
            weighted = weighted * np.repeat([decay**k for k in after], sizes)
        return joined, np.concatenate(labels), weighted


#: Sites of a one-row stream's window revisited per call (the ones visited longest ago).
REVISITS = 4


@dataclasses.dataclass(frozen=True)
class _SiteWindow:
    """The last ``buffer_size`` rows of a stream of one-row calls and their sites, as
    they stand in the posterior (forgetting included): each row's Gaussian factor in its
    r latent values, ``exp(νᵀt − tᵀτt / 2)`` — binary (r = 1, per problem): in its signed
    latent ``t = ±[x, 1]·θ``, τ and ν scalars; multinomial (one problem): in its K − 1
    contrasts ``t = Qᵀ(Θ x̃)``, τ of r × r. Frozen: a call that fails leaves the
    estimator's as it was."""

    rows: np.ndarray  #: (n, w): binary, the rows with the intercept's 1; else the features
    labels: np.ndarray  #: (problems, n): binary, each row's ±1 label per problem; else its class
    powers: np.ndarray  #: (n,): each row's weight × decay**(rows after it)
    tau: np.ndarray  #: (problems, n) binary; (1, n, r, r) multinomial
    nu: np.ndarray  #: (problems, n) binary; (1, n, r) multinomial
    visited: np.ndarray  #: (n,): the call that last fitted each row's site
    calls: int = 0  #: one-row calls so far
    #: Laplace's (n,): each row's :func:`taylor_errors` (summed over the problems) under
    #: the posterior of the call that last fitted its site; None for the other methods.
    errors: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return self.rows.shape[0]

    @classmethod
    def empty(cls, width: int, n_problems: int, r: int | None = None) -> _SiteWindow:
        """No rows yet, of ``width`` columns; sites of ``r`` dimensions (None: binary)."""
        site = () if r is None else (r,)
        return cls(
            np.empty((0, width)),
            np.empty((n_problems, 0), dtype=float if r is None else np.intp),
            np.empty(0),
            np.empty((n_problems, 0, *site, *site)),
            np.empty((n_problems, 0, *site)),
            np.empty(0, dtype=np.int64),
        )

    def fits(self, width: int, r: int | None) -> bool:
        """Whether this window's rows and sites have this shape (else a new one starts)."""
        return self.rows.shape[1] == width and self.nu.ndim == (2 if r is None else 3)

    def forgotten(self, keep: float) -> _SiteWindow:
        """Forgetting scales every factor of the posterior, the sites' too."""
        if keep == 1.0:
            return self
        errors = None if self.errors is None else keep * self.errors  # (as the powers)
        return dataclasses.replace(
            self, powers=keep * self.powers, tau=keep * self.tau, nu=keep * self.nu, errors=errors
        )

    def least_recent(self, count: int) -> np.ndarray:
        """The ``count`` rows visited longest ago (the older first among equals)."""
        order = np.argsort(self.visited, kind="stable")
        return np.sort(order[:count])

    def stepped(
        self, chosen, revised, row, labels, weight: float, site, size: int, errors=None
    ) -> _SiteWindow:
        """This window after a call: the ``chosen`` rows' sites ``revised`` = (τ, ν) (per
        problem, in ``chosen``'s order), then the new row (its site ``site[0]`` = τ,
        ``site[1]`` = ν per problem) appended and, beyond ``size`` rows, the oldest
        dropped: its site stays in the posterior as it is (revised, if it was chosen).
        With ``errors`` (Laplace: each row's, these rows' and the new one last), the row
        of the smallest leaves instead, the new row taking its place. Each array built
        once (a one-row call's fixed cost is mostly such small steps)."""
        if errors is not None:
            return self._replaced(chosen, revised, row, labels, weight, site, size, errors)
        start = max(self.n_rows + 1 - size, 0)
        calls = self.calls + 1
        tau = np.concatenate([self.tau[:, start:], site[0][:, None]], axis=1)
        nu = np.concatenate([self.nu[:, start:], site[1][:, None]], axis=1)
        visited = np.append(self.visited[start:], calls)
        kept = chosen >= start  # (a dropped row's revision is in the posterior only)
        at = chosen[kept] - start
        tau[:, at], nu[:, at], visited[at] = revised[0][:, kept], revised[1][:, kept], calls
        return _SiteWindow(
            np.concatenate([self.rows[start:], row[None, :]]),
            np.concatenate([self.labels[:, start:], labels[:, None]], axis=1),
            np.append(self.powers[start:], weight),
            tau,
            nu,
            visited,
            calls,
        )

    def _replaced(self, chosen, revised, row, labels, weight, site, size, errors) -> _SiteWindow:
        """:meth:`stepped` of a Laplace window: below ``size`` rows the new row appended;
        at ``size``, the row of the smallest of ``errors`` leaves, the new row (unless it
        is that row) taking its place (the rows' order is not their arrival's: the
        revisits go by ``visited``)."""
        calls = self.calls + 1
        n = self.n_rows
        if n + 1 <= size:
            grown = self.stepped(chosen, revised, row, labels, weight, site, size)
            return dataclasses.replace(grown, errors=np.asarray(errors, dtype=float))
        tau, nu, visited = self.tau.copy(), self.nu.copy(), self.visited.copy()
        tau[:, chosen], nu[:, chosen], visited[chosen] = revised[0], revised[1], calls
        drop = int(np.argmin(errors))
        rows, kept_labels, powers = self.rows, self.labels, self.powers
        kept_errors = np.array(errors[:n], dtype=float)
        if drop < n:  # (else the new row leaves at once: its site stays in the posterior)
            rows, kept_labels, powers = rows.copy(), kept_labels.copy(), powers.copy()
            rows[drop], kept_labels[:, drop], powers[drop] = row, labels, weight
            tau[:, drop], nu[:, drop], visited[drop] = site[0], site[1], calls
            kept_errors[drop] = errors[n]
        return _SiteWindow(rows, kept_labels, powers, tau, nu, visited, calls, kept_errors)


def _row_mode_result(mean, cov, prior, row, weight, site, log_z, link) -> LaplaceResult:
    """A Laplace one-row call's posterior (after its revisits) with its own row's Laplace
    fit as diagnostics: the mode t* and curvature of ``F(t)^s N(t; m, v)`` in the row's
    latent under the carried ``prior`` (what :func:`row_laplace` solves), read off the
    row's site ``(τ, ν)``."""
    latent_mean, latent_var = float(row @ prior.mean), float(row @ (prior.cov @ row))
    var = 1.0 / (1.0 / latent_var + site[0])
    mode = var * (latent_mean / latent_var + site[1])
    slope = float(link.derivatives(np.array([mode]))[0][0])
    # ∇ log p(θ*) = a (s (log F)'(t*) − (t* − m) / v) at the row's mode.
    grad = weight * slope - (mode - latent_mean) / latent_var
    log_det = 2.0 * float(np.log(np.diag(prior.lower)).sum())
    at_mode = log_z - 0.5 * math.log(var / latent_var)
    at_mode -= 0.5 * (row.size * math.log(2.0 * math.pi) + log_det)
    return LaplaceResult(
        mean,
        cov,
        log_z,
        n_iter=1,
        converged=True,
        grad_norm=abs(grad) * float(np.linalg.norm(row)),
        log_density_at_mode=at_mode,
    )


#: The probabilists' Gauss–Hermite rule of :func:`taylor_errors` (weights summing to 1).
#: The nodes with 0 last (log F at the mean, in the same call).
_ERROR_NODES, _ERROR_WEIGHTS = np.polynomial.hermite_e.hermegauss(16)
_ERROR_NODES, _ERROR_WEIGHTS = np.append(_ERROR_NODES, 0.0), np.append(_ERROR_WEIGHTS, 0.0)
_ERROR_WEIGHTS = _ERROR_WEIGHTS / _ERROR_WEIGHTS.sum()


def taylor_errors(signed_rows, powers, mean, cov, link) -> np.ndarray:
    """How far each row's Laplace site is from its likelihood where the posterior puts the
    row: ``E |s log F(t) − q(t)|`` over the latent's marginal ``t ~ N(m, v)`` under
    N(``mean``, ``cov``), ``q`` the quadratic Taylor expansion of ``s log F`` at ``m`` (the
    site a Laplace fit gives the row at that mode) and ``s`` its power (a 16-point
    Gauss–Hermite rule). A Laplace stream's window keeps the rows where this is largest:
    a row whose site is frozen is expanded where the posterior was then, and its error
    when the mode later moves within the posterior's spread is what this measures (the
    log-likelihood's third and higher derivatives over the latent's standard deviation;
    negligible for a row far from the boundary, whose curvature has died out, and for
    one the posterior pins down)."""
    latent_mean = signed_rows @ mean
    latent_var = np.einsum("ij,ij->i", signed_rows @ cov, signed_rows)
    steps = np.sqrt(np.maximum(latent_var, 0.0))[:, None] * _ERROR_NODES
    slope, curvature = link.derivatives(latent_mean)
    log_f = link.log_cdf(latent_mean[:, None] + steps)
    quadratic = steps * (slope[:, None] - 0.5 * curvature[:, None] * steps)
    quadratic += log_f[:, -1:]
    return powers * (np.abs(log_f - quadratic) @ _ERROR_WEIGHTS)


def _frozen_part(prior: GaussianPrior, window: _SiteWindow, problem: int, link):
    """``(frozen, evidence)``: the Gaussian ``prior`` (a stream's posterior) without the
    sites of ``window``'s rows for this ``problem`` (its natural parameters less theirs:
    the prior and the sites of the rows that left the window), and the Laplace evidence of
    the window's rows under it at ``prior``'s mean μ, ``Σ s log F(t(μ)) + log N_frozen(μ) −
    log N_prior(μ)`` (0 without rows)."""
    if window.n_rows == 0:
        return prior, 0.0
    signed = window.labels[problem][:, None] * window.rows
    tau, nu = window.tau[problem], window.nu[problem]
    precision = prior.precision - (signed.T * tau) @ signed
    linear = prior.precision @ prior.mean - signed.T @ nu
    frozen = GaussianPrior(np.zeros(prior.dim), precision=precision, name="frozen part")
    frozen.mean = frozen.cov @ linear
    shift = prior.mean - frozen.mean
    # log N_frozen(μ) − log N_prior(μ) = ½ log|Λ_f| − ½ log|Λ| − ½ (μ − μ_f)ᵀ Λ_f (μ − μ_f)
    log_det = 2.0 * float(np.log(np.diag(prior.lower)).sum() - np.log(np.diag(frozen.lower)).sum())
    evidence = float(window.powers @ link.log_cdf(signed @ prior.mean))
    evidence += 0.5 * log_det - 0.5 * float(shift @ precision @ shift)
    return frozen, evidence


def _revisit(mean, cov, rows, tau, nu, powers, link, rule: str):
    """The posterior N(mean, cov) with the sites ``(tau, nu)`` of the signed ``rows``
    refitted, all from it (a parallel EP step on these sites; a new row's site is zero):
    each row's cavity (the posterior without its site), then its tilted density's moments
    (``rule`` "moments": EP's update) or its mode and curvature ("mode": Laplace
    propagation, whose fixed point is the joint mode and curvature), then the rank-one
    changes one after the other. A row whose cavity is improper, or whose tilted density
    gives no usable moments, keeps its site. Returns ``(mean, cov, tau, nu, log_z)``,
    ``log_z`` the tilted normalizers ("mode": their Laplace approximations; NaN where a
    site was kept)."""
    gains = cov @ rows.T  # (p, r): Σa
    latent_mean = rows @ mean
    latent_var = np.einsum("rp,pr->r", rows, gains)
    with np.errstate(divide="ignore"):  # an all-zero row (no intercept): not usable below
        cavity_precision = 1.0 / latent_var - tau
    usable = (latent_var > 0.0) & (cavity_precision > 0.0)
    log_z = np.full(rows.shape[0], np.nan)
    new_tau, new_nu = tau.copy(), nu.copy()
    if not usable.any():
        return mean, cov, new_tau, new_nu, log_z
    cavity_var = 1.0 / cavity_precision[usable]
    cavity_mean = cavity_var * (latent_mean[usable] / latent_var[usable] - nu[usable])
    power = powers[usable]
    if rule == "bound":  # (the logistic link's; each row's at its optimal ξ)
        optima = map(jaakkola_jordan_latent, cavity_mean, cavity_var, power)
        normalizer, tilted_mean, tilted_var, _ = map(np.array, zip(*optima, strict=True))
    elif rule == "mode":
        tilted_mean, width = tilted_mode(link, cavity_mean, cavity_var, power)
        tilted_var = width * width
        # The Laplace evidence s log F(t*) − (t* − m)² / (2v) − ½ log(1 + s h(t*) v).
        normalizer = (
            power * link.log_cdf(tilted_mean)
            - 0.5 * (tilted_mean - cavity_mean) ** 2 / cavity_var
            + np.log(width / np.sqrt(cavity_var))
        )
    else:
        normalizer, tilted_mean, tilted_var = _tilted_moments(link, cavity_mean, cavity_var, power)
    index = np.flatnonzero(usable)
    fitted = (tilted_var > 0.0) & np.isfinite(tilted_var) & np.isfinite(tilted_mean)
    index, cavity_var, cavity_mean = index[fitted], cavity_var[fitted], cavity_mean[fitted]
    tilted_mean, tilted_var = tilted_mean[fitted], tilted_var[fitted]
    # Log-concave factors give τ ≥ 0, as EP's sweeps project it.
    new_tau[index] = np.maximum(1.0 / tilted_var - 1.0 / cavity_var, 0.0)
    new_nu[index] = tilted_mean / tilted_var - cavity_mean / cavity_var
    log_z[index] = normalizer[fitted]
    for k in index:
        row = rows[k]
        gain = cov @ row
        var, at = float(row @ gain), float(row @ mean)
        d_tau, d_nu = new_tau[k] - tau[k], new_nu[k] - nu[k]
        denominator = 1.0 + d_tau * var
        if not denominator > 0.0:  # round-off against a decisive site: kept as it was
            new_tau[k], new_nu[k], log_z[k] = tau[k], nu[k], np.nan
            continue
        # Sherman–Morrison: precision + Δτ aaᵀ, precision × mean + Δν a.
        mean = mean + gain * ((d_nu - d_tau * at) / denominator)
        cov = cov - (d_tau / denominator) * np.outer(gain, gain)
    return mean, cov, new_tau, new_nu, log_z


@functools.lru_cache(maxsize=16)
def _contrast_basis(n_classes: int) -> np.ndarray:
    """:func:`centred_basis` of K classes, computed once (read-only)."""
    q = centred_basis(n_classes)
    q.setflags(write=False)
    return q


def _softmax_design(rows: np.ndarray, q: np.ndarray, fit_intercept: bool) -> np.ndarray:
    """Each row's map A (r × p) of θ = ``[W.ravel(), b]`` to its contrasts ``Qᵀ(Θ x̃)``
    (:meth:`BlockLatent.of_softmax_row`'s): (m, r, p)."""
    m, d = rows.shape
    k, r = q.shape
    # The products written into place (one allocation: a one-row call's fixed cost is
    # mostly such small steps): A[i, a, (k, j)] = Q[k, a] x_ij, then the intercepts' Qᵀ.
    design = np.empty((m, r, k * d + (k if fit_intercept else 0)))
    products = design[:, :, : k * d].reshape(m, r, k, d)  # (a view: the last axis split)
    np.multiply(q.T[None, :, :, None], rows[:, None, None, :], out=products)
    if fit_intercept:
        design[:, :, k * d :] = q.T
    return design


def _softmax_revisit(mean, cov, design, labels, lam, eta, powers, q, rule: str, own_update, tol):
    """The posterior N(mean, cov) with the multinomial rows' sites ``(lam, eta)`` (on their
    contrasts ``design @ θ``, (m, r, p)) refitted, all from it (a parallel EP step on these
    sites; a new row's site is zero, the first).

    Each row's cavity and the site of its tilted density: ``rule`` "moments",
    :func:`softmax_site_updates` (EP's; the new row's by ``own_update()``,
    :func:`assumed_density_softmax_row`, where its tilted moments are not proper);
    "mode", :func:`softmax_mode_site_updates` (Laplace propagation, Newton's stop at
    ``tol``). Then the posterior's precision and linear term change by ``Σ Aᵢᵀ ΔΛᵢ Aᵢ`` and
    ``Σ Aᵢᵀ Δηᵢ`` in one Woodbury update of rank r·m, ``Σ' = Σ − G (I + D V)⁻¹ D Gᵀ`` and
    ``μ' = μ + G (I + D V)⁻¹ (Δη − D m)``, with G = ΣAᵀ, V = AΣAᵀ, m = Aμ and D the block
    diagonal of the ΔΛᵢ: O(p² r m), no p × p factorization (the sites' precisions are
    PSD, so the updated precision is positive definite but for round-off, which the
    posterior's own factorization catches). A revisited row whose site is not found keeps
    it. Returns ``(mean, cov, lam, eta, log_z, modes)`` (``log_z``, the new row's tilted
    normalizer; ``modes``, mode: the :class:`ModeSites`, whose first row is the new row's
    fit, else None), or None where the new row's own site is not usable."""
    m, r, p = design.shape
    flat = design.reshape(m * r, p)
    spread = cov @ flat.T  # G, (p, r m)
    joint = flat @ spread  # V, (r m, r m)
    joint = 0.5 * (joint + joint.T)
    latent_mean = (flat @ mean).reshape(m, r)
    rows = np.arange(m)
    latent_cov = joint.reshape(m, r, m, r)[rows, :, rows, :]
    if rule == "moments":
        new_lam, new_eta, log_z, found = softmax_site_updates(
            q, labels, latent_mean, latent_cov, lam, eta, powers
        )
        if not found[0]:
            # Its tilted moments improper even on the finest rule (a factor nearly a step
            # over a wide cavity, many classes): its own update's site (VS fits there).
            try:
                alone = own_update()
            except (EstimationError, NotPositiveDefiniteError):
                return None
            new_lam[0], new_eta[0] = alone.sites.precision[0], alone.sites.linear[0]
            log_z[0], found[0] = alone.log_Z, True
        modes = None
    else:
        modes = softmax_mode_site_updates(
            q, labels, latent_mean, latent_cov, lam, eta, powers, tol=tol
        )
        new_lam, new_eta, log_z, found = modes[:4]
    if not found[0]:
        return None
    if not found.all():  # a revisited row whose site is not found keeps it
        new_lam = np.where(found[:, None, None], new_lam, lam)
        new_eta = np.where(found[:, None], new_eta, eta)
    blocks = np.zeros((m, r, m, r))
    blocks[rows, :, rows, :] = new_lam - lam
    blocks = blocks.reshape(m * r, m * r)
    system = np.eye(m * r) + blocks @ joint
    rhs = np.column_stack([blocks, (new_eta - eta).ravel() - blocks @ latent_mean.ravel()])
    try:
        solved = np.linalg.solve(system, rhs)
    except np.linalg.LinAlgError:  # round-off against a decisive site
        return None
    updated = cov - spread @ solved[:, :-1] @ spread.T
    return mean + spread @ solved[:, -1], updated, new_lam, new_eta, float(log_z[0]), modes


def _softmax_row_mode_result(mean, cov, prior, modes, log_z, norm):
    """A Laplace one-row call's posterior (after its revisits) with its own row's Laplace
    fit as diagnostics (as :func:`_row_mode_result`, in the row's K − 1 contrasts): its
    tilted density's mode under the carried prior's marginal (``modes``, the
    :class:`ModeSites` of the call, the row first); ``norm``: |x̃|, the row's with the
    intercept's 1."""
    log_det = 2.0 * float(np.log(np.diag(prior.lower)).sum())
    at_mode = float(modes.log_density[0]) - 0.5 * (mean.size * math.log(2.0 * math.pi) + log_det)
    return LaplaceResult(
        mean,
        cov,
        log_z,
        n_iter=1,
        converged=True,
        # |Aᵀ∇| with A = Qᵀ ⊗ x̃ᵀ (Q's columns orthonormal): |∇| |x̃|.
        grad_norm=float(np.linalg.norm(modes.gradient[0])) * norm,
        log_density_at_mode=at_mode,
    )


def _tilted_moments(link, mean, var, power):
    """The tilted moments of a window step's sites, cheaply: the link's closed form where it
    has one (the probit, power 1); on narrow cavities (the rows' latent variance at most
    ``NARROW_MAX_VAR``: all but the first rows of a stream) a Gauss–Hermite rule in the
    cavity's frame, any power (within 2e-10 of the quadrature for the logistic); the
    others as ``method="fast"`` takes them (the logistic's mixture of probits, or the VS
    site fits)."""
    narrow = var <= NARROW_MAX_VAR
    if link.has_closed_form(1.0):
        narrow &= power != 1.0
    if not narrow.any():
        return link.tilted_moments(mean, var, power, method="fast")
    moments = np.empty((3, mean.size))
    moments[:, narrow] = narrow_tilted_moments(link, mean[narrow], var[narrow], power[narrow])
    if not narrow.all():
        rest = ~narrow
        moments[:, rest] = link.tilted_moments(mean[rest], var[rest], power[rest], method="fast")
    return moments


#: What a structured posterior's ``covariance_reason_`` adds in a stream.
CARRIED_PROJECTION_NOTE = (
    "; partial_fit carries it to the next batch with the coefficients independent given "
    "the intercept (the mean, the marginal variances and the intercept's covariances: "
    "assumed-density filtering, the Kullback-Leibler projection onto that family; the "
    "correlations between coefficients are dropped)"
)


def _carried_prior(posterior: Gaussian, binary: bool, fit_intercept: bool) -> GaussianPrior:
    """The prior of the next batch from a problem's posterior: a dense one as it is; a
    ``binary`` structured one (its covariance never p × p) projected onto the Gaussians
    whose coefficients are independent given the intercept (an arrowhead precision; the
    diagonal ones without an intercept): its mean, marginal variances and the intercept's
    covariances with the coefficients — the moments that assumed-density filtering keeps
    under that family, its KL projection — held in O(p), which the next batch's structured
    fit takes as a diagonal prior in its own coordinates (:func:`_hub_design`;
    docs/decisions.md, D-112). The intercept, shared by every row, is correlated with
    every coefficient: a diagonal carried batch after batch over-counts it (its sd fell to
    0.35× the batch fit's). A multinomial fit under a prior has the dense covariance (its
    full prior precision): a structured multinomial posterior is made dense where that
    fits, else refused, naming what to do."""
    if binary and isinstance(posterior, StructuredGaussian):
        covariance = posterior.covariance
        variances = covariance.diagonal()
        if not fit_intercept:
            return GaussianPrior(posterior.mean, variances, name="carried posterior")
        unit = np.zeros(posterior.dim)
        unit[-1] = 1.0
        hub = covariance.dot(unit)[:-1]
        if not hub.any():  # the "diagonal" structure: no correlations to keep
            return GaussianPrior(posterior.mean, variances, name="carried posterior")
        return GaussianPrior.arrowhead(posterior.mean, variances, hub, name="carried posterior")
    return GaussianPrior.from_gaussian(posterior, name="carried posterior")


def _carried_note(fit: MethodFit) -> MethodFit:
    """A stream's fit with its structured covariance's carriage in its reason."""
    if fit.covariance in (None, "dense") or not isinstance(fit.posterior, StructuredGaussian):
        return fit
    return dataclasses.replace(
        fit, covariance_reason=f"{fit.covariance_reason}{CARRIED_PROJECTION_NOTE}"
    )


def refuse_forced_structure(estimator_name: str, what: str, remedy: str) -> None:
    """Raise a ValueError where ``vsbayes.config_context(covariance=...)`` asks for a
    structured covariance that ``what`` (a fit or stream that keeps the dense p × p
    covariance) does not take: an option that does not apply is refused, not ignored."""
    asked = get_config()["covariance"]
    if asked in ("auto", "dense"):
        return
    raise ValueError(
        f"vsbayes.config_context(covariance={asked!r}) asks for a structured covariance, "
        f"which {estimator_name}'s {what} does not take (it keeps the dense covariance). "
        f"{remedy} Or use covariance='auto' (or 'dense')."
    )


def _why_dense_stream(problems) -> tuple[str, str]:
    """``(what, remedy)`` of a stream that keeps the dense covariance, for
    :func:`refuse_forced_structure`."""
    if problems[0][1] is not None:
        return (
            "multinomial stream (its posterior under a prior is dense)",
            "Stream one-vs-rest binary posteriors "
            "(sklearn.multiclass.OneVsRestClassifier(...).partial_fit), which take it.",
        )
    if len(problems) > 1:
        return (
            f"one-vs-rest stream of {len(problems)} classes",
            "Stream sklearn.multiclass.OneVsRestClassifier(estimator), whose binary "
            "streams take it.",
        )
    return (
        "stream begun with the dense covariance (its carried posterior is dense)",
        "Start the stream (fit or its first partial_fit) under the structure.",
    )


def _structured_stream(estimator, X, problems, weights, carried) -> bool:
    """Whether a batch of one binary problem under the diagonal or arrowhead ``carried``
    prior takes a structured covariance (:func:`choose_covariance` of its model, which
    sizes it first: refused with a :class:`~vsbayes._memory.MemoryLimitError` where no
    structure fits)."""
    prior = carried[0]
    if len(problems) != 1 or problems[0][1] is not None:
        return False
    if not (prior.diagonal or prior.hub is not None):
        return False
    if estimator.max_iter == 0:
        return False
    labels = problems[0][0]
    model, _ = problem_model(estimator, X, labels, None, weights, carried[0])
    try:
        choice = choose_covariance(model, type(estimator).__name__)
    except MemoryLimitError as error:
        raise MemoryLimitError(
            f"{error} partial_fit: the batch's rows are part of it (its "
            f"{X.shape[0]} rows): smaller batches need less; the carried posterior is left "
            f"as it was."
        ) from None
    return choice.structure != "dense"


def _prior_specs(estimator, prior, classes: np.ndarray) -> list:
    """The list of per-problem prior specifications ``prior`` gives."""
    posteriors = getattr(prior, "posteriors_", None)
    if posteriors is not None:  # a fitted estimator: its posterior(s)
        if getattr(prior, "fit_intercept", estimator.fit_intercept) != estimator.fit_intercept:
            raise ValueError(
                f"prior is a fitted {type(prior).__name__} with fit_intercept="
                f"{prior.fit_intercept}; this estimator has fit_intercept="
                f"{estimator.fit_intercept}, so its parameters are not the same vector."
            )
        if not np.array_equal(prior.classes_, classes):
            raise ValueError(
                f"prior is a fitted {type(prior).__name__} of classes "
                f"{prior.classes_.tolist()!r}; this fit's classes are {classes.tolist()!r}."
            )
        # Its coefficients meet this X's columns by position: named columns must agree.
        fitted_names = getattr(prior, "feature_names_in_", None)
        names = getattr(estimator, "feature_names_in_", None)
        named = fitted_names is not None and names is not None
        if named and not np.array_equal(fitted_names, names):
            raise ValueError(
                f"prior is a fitted {type(prior).__name__} of the feature names "
                f"{list(map(str, fitted_names))!r}; this X's are {list(map(str, names))!r}. "
                f"Its coefficients are matched to X's columns by position: pass X's columns "
                f"in the prior's order (X[prior_names])."
            )
        return list(posteriors)
    if hasattr(prior, "fit") and not hasattr(prior, "mean"):
        if hasattr(prior, "classes_"):  # fitted, but holds no Gaussian posterior
            inner = getattr(prior, "estimator_", None)  # (a meta-estimator's fitted one)
            hint = ""
            if hasattr(inner, "posteriors_"):
                hint = (
                    f" Its estimator_ holds the posterior (under the chosen prior scales; "
                    f"{getattr(inner, 'n_features_in_', '?')} features): prior=it.estimator_."
                )
            raise ValueError(
                f"prior is a fitted {type(prior).__name__}, which holds no posterior: pass "
                f"a fitted vsbayes estimator (its posterior is the prior), a Gaussian, a "
                f"(mean, cov) pair or a dict.{hint}"
            )
        raise ValueError(
            f"prior is an unfitted {type(prior).__name__}: fit it first (its posterior is "
            f"the prior)."
        )
    if isinstance(prior, list) or (
        isinstance(prior, tuple)
        and all(isinstance(p, (Gaussian, GaussianPrior, dict)) for p in prior)
    ):
        return list(prior)
    return [prior]


def _as_prior(spec) -> GaussianPrior:
    """A :class:`GaussianPrior` from a Gaussian, a (mean, cov) pair or a dict."""
    if isinstance(spec, GaussianPrior):
        return spec
    if isinstance(spec, Gaussian):
        return GaussianPrior.from_gaussian(spec)
    if isinstance(spec, dict):
        unknown = set(spec) - {"mean", "cov", "precision"}
        if "mean" not in spec or unknown:
            raise ValueError(
                f"A prior dict has the keys 'mean' and 'cov' or 'precision'; got {sorted(spec)!r}."
            )
        return GaussianPrior(spec["mean"], spec.get("cov"), spec.get("precision"))
    if isinstance(spec, tuple) and len(spec) == 2:
        return GaussianPrior(*spec)
    raise ValueError(
        f"prior must be a fitted vsbayes estimator, a Gaussian, a (mean, cov) pair or a dict "
        f"with 'mean' and 'cov' or 'precision' (or a list of them, one per problem); got "
        f"{type(spec).__name__}."
    )


def problem_model(estimator, X, labels, n_classes, weights, prior: GaussianPrior):
    """``(model, finish)``: the likelihood model of one problem under ``prior``, and the
    map of its fit (a :class:`~vsbayes.estimators._methods.MethodFit`) to θ's coordinates
    (the identity but for a whitened prior). See the module docstring for the routes."""
    chunked = is_dask_array(X)
    n_jobs = getattr(estimator, "n_jobs", None)  # the sampling estimators' parameter
    in_memory = {} if chunked else {"n_jobs": n_jobs}
    d = X.shape[1]
    # An arrowhead prior (partial_fit's carried structured posterior) in its own
    # coordinates, rows in memory: θ' = (θ_rest − c θ_b, θ_b) has a diagonal prior.
    hub = n_classes is None and prior.hub is not None and not chunked
    whitened = n_classes is None and not prior.diagonal and not hub
    if n_classes is not None:  # multinomial: the model's full prior precision
        # Sized before the p × p precision is formed (numpy's MemoryError at 100,005
        # parameters): the structured covariance takes the default prior only.
        check_softmax_dims(
            n_classes, d + int(estimator.fit_intercept), X.shape[0], under_prior=True
        )
        priors = {
            "prior_var": 1.0,
            "intercept_prior_var": 1.0 if estimator.fit_intercept else None,
            "prior_mean": prior.mean,
            "prior_precision": prior.precision,
        }
    elif hub:
        X, priors = _hub_design(X, prior)
    elif not whitened:
        priors = {
            "prior_var": prior.variances[:d],
            "intercept_prior_var": prior.variances[d] if estimator.fit_intercept else None,
            "prior_mean": prior.mean,
        }
    else:
        X = _whitened_design(X, prior.lower, estimator.fit_intercept)
        priors = {
            "prior_var": 1.0,
            "intercept_prior_var": None,
            "prior_mean": prior.whitened_mean(),
        }
    if n_classes is None:
        if chunked:
            model = ChunkedPosterior(X, labels, weights, estimator._link, **priors)
        else:
            model = BinaryGLMPosterior(X, labels, weights, estimator._link, **in_memory, **priors)
    elif chunked:
        model = ChunkedSoftmaxPosterior(X, labels, weights, n_classes, **priors)
    else:
        model = SoftmaxGLMPosterior(X, labels, weights, n_classes, **in_memory, **priors)
    if hub:
        return model, functools.partial(_from_hub_coordinates, slope=prior.slope)
    if not whitened:
        return model, _identity
    return model, lambda fit: dataclasses.replace(fit, posterior=prior.unwhiten(fit.posterior))


def _identity(fit):
    return fit


def _hub_design(X, prior: GaussianPrior):
    """``(design, model priors)`` of a binary problem under an arrowhead ``prior`` in the
    coordinates ``θ' = (θ_rest − c θ_b, θ_b)`` (``c``: the prior's slope), where the prior
    is diagonal: the latent value ``x·θ_rest + θ_b = x·θ'_rest + (1 + x·c) θ_b``, so the
    design is ``[X, 1 + X c]`` without a separate intercept, and the prior N((μ_rest −
    c μ_b, μ_b), diag(conditional variances, s)). Sparse rows stay sparse (one dense
    column more)."""
    slope = prior.slope
    column = 1.0 + np.asarray(X @ slope, dtype=float).ravel()
    if sp.issparse(X):
        design = sp.hstack([X, sp.csr_matrix(column[:, None])], format="csr")
    else:
        design = np.column_stack([X, column])
    priors = {
        "prior_var": np.append(prior.conditional_variances, prior.variances[-1]),
        "intercept_prior_var": None,
        "prior_mean": np.append(prior.mean[:-1] - slope * prior.mean[-1], prior.mean[-1]),
    }
    return design, priors


def _from_hub_coordinates(fit, slope: np.ndarray):
    """A fit in the coordinates of :func:`_hub_design` mapped back to θ = T θ', ``T = I +
    g e_bᵀ`` (``g = (c, 0)``): the mean ``m + g m_b``; the covariance ``S + g S_bᵀ + S_b gᵀ
    + S_bb g gᵀ`` — for a structured ``diag(δ) + U K Uᵀ``, the factor ``[U + g U_b, g, e_b]``
    with the core ``K ⊕ δ_b [[1, 1], [1, 0]]`` (rank + 2, the diagonal unchanged). T's
    determinant is 1: the evidence is unchanged, and a structure's stated error (a bound on
    the variance of every linear combination) holds as it is."""
    posterior = fit.posterior
    g = np.append(slope, 0.0)
    mean = np.asarray(posterior.mean) + g * float(posterior.mean[-1])
    if not isinstance(posterior, StructuredGaussian):
        cov = np.asarray(posterior.cov)
        last = cov[-1]
        cov = cov + np.outer(g, last) + np.outer(last, g) + last[-1] * np.outer(g, g)
        return dataclasses.replace(fit, posterior=posterior.with_moments(mean, 0.5 * (cov + cov.T)))
    covariance = posterior.covariance
    factor = covariance.factor
    unit = np.zeros(g.size)
    unit[-1] = 1.0
    rank = covariance.rank
    core = np.zeros((rank + 2, rank + 2))
    core[:rank, :rank] = covariance.core
    core[rank:, rank:] = covariance.diagonal_part[-1] * np.array([[1.0, 1.0], [1.0, 0.0]])
    mapped = StructuredCovariance(
        covariance.diagonal_part,
        np.column_stack([factor + np.outer(g, factor[-1]), g, unit]),
        core,
        covariance.structure,
    )
    if isinstance(posterior, StructuredLaplaceResult):
        result = StructuredLaplaceResult(
            mean,
            mapped,
            posterior.log_Z,
            posterior.error,
            error_factor=posterior.error_factor,
            evidence_exact=posterior.evidence_exact,
            n_iter=posterior.n_iter,
            converged=posterior.converged,
            grad_norm=posterior.grad_norm,
            log_density_at_mode=posterior.log_density_at_mode,
        )
    else:
        result = StructuredGaussian(mean, mapped, posterior.log_Z, posterior.error)
    return dataclasses.replace(fit, posterior=result)


def _whitened_design(X, lower: np.ndarray, fit_intercept: bool):
    """``[X, 1] L`` (or ``X L``): dense; a dask array's chunks whitened where they are."""
    p = lower.shape[0]
    if is_dask_array(X):
        return X.map_blocks(
            _whiten_rows,
            lower,
            fit_intercept,
            dtype=float,
            chunks=(X.chunks[0], (p,)),
            meta=np.empty((0, 0)),
        )
    if sp.issparse(X):
        check_memory(
            8.0 * X.shape[0] * p,
            f"the whitened design ({X.shape[0]} × {p}, dense) of a prior with a full covariance",
            f"A sparse design stays sparse under a diagonal prior covariance; a full one "
            f"densifies it ({format_bytes(8.0 * X.shape[0] * p)}). Pass a diagonal prior "
            f"(variances), or fewer rows per fit (partial_fit in batches).",
        )
    return _whiten_rows(X, lower, fit_intercept)


def _whiten_rows(rows, lower: np.ndarray, fit_intercept: bool) -> np.ndarray:
    d = rows.shape[1]
    out = np.asarray(rows @ lower[:d])
    if fit_intercept:
        out = out + lower[d]
    return out
