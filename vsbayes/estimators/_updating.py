"""Bayesian updating: a general Gaussian prior, ``partial_fit`` and Thompson draws.

A mixin of :class:`~vsbayes.estimators._base.BayesianGLMClassifier`: ``prior=`` read
(each model under it: :mod:`vsbayes.estimators._priors`), ``partial_fit``'s flow — its
checks, the buffer of batches, forgetting and the running evidence — and
``thompson_sample``. One-row calls and the window of sites, which ``partial_fit`` hands
rows to, are :mod:`vsbayes.estimators._site_window`.

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
updates' cost): each row's site joins a window of the last W rows' sites, some of which
each call refits (incremental EP over a sliding window); a larger batch freezes the
window (its sites stay in the posterior) and starts the buffer of batches, but for
Laplace's and VB's binary and one-vs-rest streams, whose batches join the window
(:mod:`vsbayes.estimators._site_window`).

**Structured posteriors** (text scale: more coefficients than the dense p × p covariance
allows, :func:`~vsbayes.approximations.structured_laplace.choose_covariance`, binary or
each one-vs-rest problem): a batch under a diagonal prior N(μ, diag(v)) is the model's
own prior, which the structured Laplace fit takes as ``fit`` does; the carried structured
posterior is projected onto the Gaussians whose coefficients are independent given the
intercept, held in O(p), never p × p, and fitted in the coordinates where it is diagonal
(:func:`~vsbayes.estimators._priors.carried_prior`). One-row calls take the same
structured fit (its "dual" form over one row) and join the buffer, refitted every
``buffer_size`` rows: the window's sites update a dense covariance. ``decay`` mixes
natural parameters as for any prior, in O(p) (docs/decisions.md, D-112).

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
"""

from __future__ import annotations

import dataclasses
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
from .._memory import check_memory, get_config
from .._random import as_generator
from .._warnings import warn
from ..approximations.structured_laplace import choose_covariance
from ..exceptions import MemoryLimitError, UnreliableFitWarning
from ..gaussian import StructuredGaussian
from ..models.dask_chunks import is_dask
from ..models.priors import GaussianPrior
from ..models.shrinkage_priors import SHRINKAGE_PRIORS
from ._leave_one_out import StreamRows
from ._prediction import plain_rows, read_work, row_count
from ._priors import as_prior, carried_note, carried_prior, prior_specs, problem_model
from ._site_window import SiteWindow, SiteWindowUpdates
from ._stream_order import MOVE_LEVEL, ORDER_LEVEL, class_order_bound, move_bound

__all__ = [
    "BayesianUpdating",
    "ThompsonDraws",
    "refuse_forced_structure",
]


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


class BayesianUpdating(SiteWindowUpdates):
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
        specs = prior_specs(self, self.prior, classes)
        if len(specs) == 1:
            specs = specs * len(problems)
        if len(specs) != len(problems):
            raise ValueError(
                f"prior holds {len(specs)} Gaussians; this fit has {len(problems)} "
                f"problem(s) (one per class one-vs-rest, else one). Pass one prior, or one "
                f"per problem."
            )
        priors = [as_prior(spec) for spec in specs]
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
        without them (incremental EP over a sliding window; see the module docstring of
        ``vsbayes.estimators._site_window``): no one-row call refits the buffer, each costs
        about as much as ``SGDClassifier.partial_fit`` of that row, so that a decision
        loop's calls stay within a bound.

        The Laplace approximation expands each row's likelihood at a mode; a stream's
        early modes are not the final one, so Laplace's binary and one-vs-rest streams fit
        each batch jointly with the ``buffer_size`` rows kept and keep those whose
        expansions are least accurate over the posterior, the others' sites staying in it
        (the module docstring of ``vsbayes.estimators._site_window``; without this, breast
        cancer's held-out log loss was 5 % above the batch fit's in batches of 100 rows).
        VB's streams do the same, each row's site the bound at its ξ of the joint fit
        (``VBLogisticRegression``'s Notes say how far they stay). With the default
        buffer, the Laplace, EP and VS streams in batches of 1, 10 and 100 rows were within
        1 % of their batch fits' log loss on breast cancer, the paper's four data sets and
        a 4-class problem (``benchmarks/results/streaming.md``; VS without the buffer, up
        to 4 % worse).

        The order of the rows matters: a stream sorted by class ends far from a fit of its
        rows, since the Gaussian that carries the earlier batches stands for their rows
        poorly where a later batch moves the posterior. A call of more than one row warns
        (UnreliableFitWarning) where its class shares reject a random order and it moved
        the posterior beyond what a batch of a shuffled stream moves it; shuffle such a
        stream.

        Where the dense posterior does not fit (text scale: see ``covariance_structure_``),
        a binary or one-vs-rest stream fits each batch, one row too, by the structured
        Laplace route under the projection of the posterior before it (mean, marginal
        variances and the intercept's covariances; the correlations between coefficients
        are dropped, ``covariance_reason_`` says so): memory O(p) per problem between
        calls, never p × p (``benchmarks/results/sparse_streaming.md``). A multinomial
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
                # (after a stream's first batch, or after a fit under the flat prior: the
                # posterior is proper either way, but the stream's prior, which forgetting
                # nears, is not)
                raise ValueError(
                    f"penalty={self.penalty!r} with C={self.C!r} is a flat prior, which "
                    f"partial_fit does not continue under after the stream's first batch "
                    f"or a fit: a stream's prior is what forgetting (decay < 1) nears, and "
                    f"the flat prior is none. If it was changed, set it back; to update a "
                    f"posterior fitted under it with more rows, start a stream from it: "
                    f"{type(self).__name__}(prior=model).partial_fit(X, y, classes=...), "
                    f"or call fit on all the rows."
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
            self._refuse_unreadable_input(X, y)
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
        # The rows behind the posterior, for leave-one-out's check of the data it is given:
        # the stream's count and class weights (a fit's, then the batches after it;
        # unknown after a dask fit).
        previous = None if first else vars(self).get("_training_fingerprint_")
        rows_seen = (
            None
            if previous is None and not first
            else StreamRows.after(previous, y_index, weights, len(classes))
        )
        if not weights.any():  # (sample_weight × class_weight) a batch without information
            if first:
                raise ValueError(
                    "The first batch's weights (sample_weight times class_weight) are all "
                    "zero: its posterior would be the prior alone. Start the stream with a "
                    "batch of positive weight."
                )
            self._training_fingerprint_ = rows_seen  # (its rows are the data's all the same)
            return self  # its likelihood is 1: the posterior, buffer and evidence as they were
        problems = self._problems(y_index, len(classes))
        n_rows = X.shape[0]
        buffer = None if first else vars(self).get("_stream_buffer")
        # A window of one-row calls' sites is revised in the calls themselves; any other
        # call freezes it (its sites stay in the posterior as they are).
        window = buffer if isinstance(buffer, SiteWindow) else None
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
            before = [carried_prior(g, binary, self.fit_intercept) for g in self.posteriors_]
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
        structured, reason = _structured_stream(self, X, problems, weights, carried)
        if not structured and self.max_iter != 0:
            dense_reason = refuse_forced_structure(
                type(self).__name__, *_why_dense_stream(problems)
            )
            # (covariance_reason_ of the fits below that record none)
            reason = reason or dense_reason
        # Laplace's and VB's batches of several rows (binary, one-vs-rest) join the window
        # of sites: refitted jointly with its rows, which leave it by how well their sites
        # fit.
        mode_window = (
            not structured
            and n_rows > 1
            and buffer is None
            and size > 1
            and problems[0][1] is None
            and self.max_iter != 0
            and self._one_row_rule() in ("mode", "bound")
        )
        if mode_window:
            method = self._new_posterior_method()
            # The running evidence: the window's rows' terms are replaced by the joint
            # fit's evidence of them and the batch.
            fits, revised, evidence_before = self._window_batch_fits(
                method,
                X,
                problems,
                weights,
                carried,
                window,
                keep,
                self._random_generator(),
                evidence_before,
            )
        elif not structured and n_rows == 1 and buffer is None and size > 1:
            fits, revised = self._window_row_fits(
                X, problems, weights, carried, window, keep, evidence_before
            )
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
            fits = []
            with self._problems_alike(len(problems)) as alike:  # (D-248)
                for problem, prior in zip(problems, carried, strict=True):
                    with alike():
                        fits.append(
                            self._fit_problem(
                                method,
                                X,
                                *problem,
                                weights,
                                rng,
                                None,
                                None,
                                prior,
                                n_problems=len(problems),
                            )
                        )
            fits = [carried_note(fit) for fit in fits]
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
        # The declared classes no row of positive weight has shown yet (a fit saw all).
        seen = np.zeros(len(classes), dtype=bool)
        seen[batch[1][batch[2] > 0]] = True
        if first:
            unseen = np.flatnonzero(~seen)
        else:
            before_call = vars(self).get("_unseen_classes_", np.empty(0, dtype=int))
            unseen = np.setdiff1d(before_call, np.flatnonzero(seen))
        # Whether the stream is ordered and this batch moved the posterior beyond a
        # shuffled stream's batch (_stream_order.py); not a one-row call's: a bandit's rows
        # come one by one, chosen.
        counts = np.bincount(batch[1][batch[2] > 0], minlength=len(classes)).astype(float)
        earlier = None if first else vars(self).get("_stream_class_counts_")
        ordered = None
        if earlier is not None:
            earlier = earlier * decay**n_rows  # the rows the posterior still weighs
            if n_rows > 1:
                start = before  # the batch's prior: the posterior before it, forgotten
                if decay < 1:
                    pairs = zip(before, originals, strict=True)
                    start = [b.forgotten(decay**n_rows, o) for b, o in pairs]
                ordered = _ordered_batch(earlier, counts, start, fits)
        self.classes_ = classes
        if not structured and reason:  # the stream's, not its batch's under the carried
            fits = [dataclasses.replace(f, covariance_reason=reason) for f in fits]
        self._store(method, fits, X.shape[1], dtype, evidence_defined=True)
        self._stream_buffer = buffer
        self._training_fingerprint_ = rows_seen
        self._unseen_classes_ = unseen
        self._stream_class_counts_ = counts if earlier is None else earlier + counts
        if unseen.size and n_rows > 1:  # (a one-row call shows one class: a bandit's first)
            _warn_unseen(classes[unseen], self)
        if ordered is not None:
            _warn_ordered(ordered, classes, earlier, counts, self)
        # log p(y_1..y_t) = Σ_batches log p(y_b | earlier): ADF's running evidence (a
        # refit's batch: the buffer's rows, after the anchor).
        total = np.asarray(self.log_marginal_likelihood_value_) + evidence_before
        self.log_marginal_likelihood_value_ = float(total) if total.ndim == 0 else total
        return self

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
        X = self._validate_prediction_data(X)
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


def _warn_unseen(labels: np.ndarray, estimator) -> None:
    """Warn that declared classes have no row yet: their posterior is one-sided."""
    rows = "rows of this batch and the earlier ones"
    warn(
        f"{type(estimator).__name__}.partial_fit: class(es) {labels.tolist()} of classes have "
        f"had no row of positive weight yet. The {rows} bound such a class's intercept from "
        f"above only, against its vague prior N(0, 10⁶) (or prior's): a one-sided posterior, "
        f"which the Gaussian approximations represent poorly, so predict_proba gives the "
        f"class a probability set by the approximation, not by the data (a 2-class stream "
        f"declared with 3 classes: 0.48 in every row with Laplace's). Declare only the "
        f"classes the stream will show. Rows of the missing class(es) arriving later do not "
        f"undo this: the posterior carried from batches without them keeps little of what "
        f"their rows say about the coefficients, so a stream sorted by class ends far from a "
        f"fit of its rows (breast cancer's first six features sorted by label, two "
        f"batches: log loss 4.4 times the fit's with EP, 8 with VS, 9.5 with VB, 1.1 with "
        f"Laplace); shuffle such a stream.",
        UnreliableFitWarning,
    )


def _ordered_batch(earlier, counts, carried, fits) -> str | None:
    """What shows that this batch of an ordered stream moved the posterior as a shuffled
    stream's would not (None: nothing does; see :mod:`._stream_order`)."""
    order = class_order_bound(earlier, counts)
    if order >= math.log(ORDER_LEVEL):
        return None
    said = f"probability below {math.exp(order):.2g} in random order"
    moves = []
    for prior, fit in zip(carried, fits, strict=True):
        posterior = fit.posterior
        if prior.hub is not None or prior.diagonal or isinstance(posterior, StructuredGaussian):
            return f"{said}; the move of a structured posterior is not measured"
        moves.append(move_bound(prior.mean, prior.lower, posterior.mean, posterior.cov))
    stat, expected, bound = min(moves, key=lambda move: move[2])
    if bound >= math.log(MOVE_LEVEL):
        return None
    return (
        f"{said}; and it moved the posterior by {stat:.3g} (squared distance in the carried "
        f"posterior's metric) where a batch of a shuffled stream moves it by about "
        f"{expected:.3g} (probability below {math.exp(bound):.2g})"
    )


def _warn_ordered(evidence: str, classes, earlier, counts, estimator) -> None:
    """Warn that the stream is ordered and this batch moved the posterior into the tail
    of the Gaussian that carries the earlier batches."""

    def shares(c):
        pairs = zip(classes.tolist(), c, strict=True)
        return ", ".join(f"{label!r}: {v / c.sum():.2g}" for label, v in pairs)

    warn(
        f"{type(estimator).__name__}.partial_fit: this batch's class shares ({shares(counts)}) "
        f"are not the earlier rows' ({shares(earlier)}): {evidence}. A stream in this order "
        f"(e.g. sorted by class) is carried batch by batch as one Gaussian, accurate where "
        f"the earlier batches' posterior has its mass, and this batch moved it into that "
        f"Gaussian's tail, where it stands for the earlier rows poorly: the posterior can "
        f"end far from a fit of the same rows (make_classification(1000) sorted by class, "
        f"two batches of 500, the first with 9 rows of class 1: log loss 2.2 times the "
        f"fit's with EP, 2.8 with VS, 1.4 with Laplace). Shuffle the stream, or fit all "
        f"the rows at once.",
        UnreliableFitWarning,
    )


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
    they are: float64 or float32 rows (:func:`plain_rows`), and as many labels, 1-D,
    finite. Its checks cost a one-row call a fifth of its time; anything else takes them
    (and their errors)."""
    return (
        plain_rows(estimator, X, _PLAIN_DTYPES)
        and type(y) is np.ndarray
        and y.ndim == 1
        and X.shape[0] == y.shape[0]
        and y.dtype.kind in "biufU"
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


def refuse_forced_structure(estimator_name: str, what: str, remedy: str) -> str:
    """Raise a ValueError where ``vsbayes.config_context(covariance=...)`` asks for a
    structured covariance that ``what`` (a fit or stream that keeps the dense p × p
    covariance) does not take: an option that does not apply is refused, not ignored.
    Else the reason recorded for the dense covariance (``covariance_reason_``)."""
    asked = get_config()["covariance"]
    if asked in ("auto", "dense"):
        return (
            f"a {what} keeps the dense covariance (for a structured one: "
            f"{remedy[0].lower()}{remedy[1:-1]})"
        )
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
    return (
        "stream begun with the dense covariance (its carried posterior is dense)",
        "Start the stream (fit or its first partial_fit) under the structure.",
    )


def _structured_stream(estimator, X, problems, weights, carried) -> tuple[bool, str]:
    """Whether a batch of binary problems (one, or one per class for one-vs-rest) under the
    diagonal or arrowhead ``carried`` priors takes a structured covariance
    (:func:`choose_covariance` of its model, each problem's beside the others', which
    sizes it first: refused with a :class:`~vsbayes._memory.MemoryLimitError` where no
    structure fits), and the choice's reason ("" where none was made)."""
    if problems[0][1] is not None:
        return False, ""
    if not all(prior.diagonal or prior.hub is not None for prior in carried):
        return False, ""
    if estimator.max_iter == 0:
        return False, ""
    labels = problems[0][0]  # (the problems differ in their labels only: the same size)
    model, _ = problem_model(estimator, X, labels, None, weights, carried[0])
    try:
        choice = choose_covariance(model, type(estimator).__name__, len(problems))
    except MemoryLimitError as error:
        raise MemoryLimitError(
            f"{error} partial_fit: the batch's rows are part of it (its "
            f"{X.shape[0]} rows): smaller batches need less; the carried posterior is left "
            f"as it was."
        ) from None
    return choice.structure != "dense", choice.reason
