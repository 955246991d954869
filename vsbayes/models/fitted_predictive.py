"""The posterior predictive of a fitted classifier: latent moments, class log-probabilities
and coefficient draws at new rows, whatever the posterior's structure.

:func:`fitted_predictive` reads the structure from the fitted posterior's arrays
(``coef_``, ``intercept_``, ``sigma_``) and returns one of three kinds with one interface:

- :class:`BinaryPredictive`: one posterior, two classes; ``P(y = 1 | x)`` is the link's
  predictive on the latent score's moments
  (:meth:`~vsbayes.models.links.Link.predictive_log_proba`).
- :class:`OneVsRestPredictive`: one independent posterior per class; the binary
  probabilities normalized.
- :class:`MultinomialPredictive`: one joint posterior of the K classes' scores; the
  softmax's predictive on the centred latent moments
  (:func:`~vsbayes.models.softmax_predictive.centred_softmax_predictive_log_proba`).

Each has a structured form (``sigma_`` a :class:`~vsbayes.gaussian.StructuredCovariance`,
or one-vs-rest's :class:`~vsbayes.gaussian.StructuredCovariances`) whose latent moments
come from the covariances' factors, never a p × p matrix.

Every method runs chunk by chunk of rows (:mod:`vsbayes.models.latent`): the predictive
rule on each chunk's latent moments, so that its temporaries stay within the chunks'
memory bound, the chunks side by side on the threads BLAS may use. What the latent moments
need of a dense covariance whatever the rows (its factors, or the multinomial's blocks) is
kept in a :class:`PredictiveSetup` the fitted estimator holds, from one read to the next.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import numpy as np

from .._memory import get_config
from .._sums import logsumexp
from ..gaussian import Gaussian, StructuredCovariance, StructuredCovariances
from .latent import (
    IndependentFactors,
    IndependentLatents,
    JointForms,
    JointLatents,
    StructuredIndependentLatents,
    StructuredJointLatents,
    StructuredLatents,
)
from .links import Link, get_link
from .softmax_predictive import centred_softmax_predictive_log_proba

__all__ = [
    "BinaryPredictive",
    "FittedPredictive",
    "MultinomialPredictive",
    "OneVsRestPredictive",
    "PredictiveSetup",
    "StructuredBinaryPredictive",
    "StructuredMultinomialPredictive",
    "StructuredOneVsRestPredictive",
    "fitted_predictive",
]

Transform = Callable[[np.ndarray], np.ndarray]
T = TypeVar("T")


class PredictiveSetup:
    """What a fitted posterior's reads need of its covariance whatever the rows
    (:class:`~vsbayes.models.latent.IndependentFactors`,
    :class:`~vsbayes.models.latent.JointForms`), computed by the first read that needs it
    and kept for the next.

    A fitted estimator holds one, made afresh by every fit (``fit``, ``partial_fit``, a
    warm start or a refit after ``set_params``): a read never sees an earlier fit's. Each
    entry is kept with the covariance it was computed from and computed again for another
    (``sigma_`` replaced; ``sigma_`` is read-only, so it cannot change in place). Reads in
    several threads at once compute an entry once (the others wait for it) and share it
    (its arrays are read-only). Neither pickled nor copied (``copy``, ``deepcopy``): a
    loaded estimator computes its entries again on its first read.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict = {}

    def get(self, key: Hashable, source: object, compute: Callable[[], T]) -> T:
        """The entry ``key`` computed from ``source`` (a covariance): kept, or ``compute()``
        (then kept)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] is not source:
                entry = (source, compute())
                self._entries[key] = entry
            return entry[1]

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


class FittedPredictive(abc.ABC):
    """A fitted posterior's predictive at new rows (validated float64, dense or CSR).

    Parameters
    ----------
    coef : ndarray of shape (n_problems, d)
        Posterior mean of the coefficients.
    intercept : ndarray of shape (n_problems,)
        Posterior mean of the intercepts (zeros without one).
    sigma : ndarray
        Posterior covariance(s), intercept last when it is fitted.
    posteriors : sequence of Gaussian, optional
        The posteriors themselves, which :meth:`sample` draws from.
    setup : PredictiveSetup, optional
        Where the set-ups computed from ``sigma`` are kept between reads (by default
        computed by each read).
    """

    def __init__(
        self,
        coef: np.ndarray,
        intercept: np.ndarray,
        sigma: np.ndarray,
        posteriors: Sequence[Gaussian] | None = None,
        setup: PredictiveSetup | None = None,
    ):
        self.coef, self.intercept, self.sigma = coef, intercept, sigma
        self.posteriors = posteriors
        self.setup = setup

    def _kept(self, name: str, compute: Callable[[], T]) -> T:
        """``compute()`` of ``sigma``, kept in :attr:`setup` (if any) for the next read."""
        if self.setup is None:
            return compute()
        return self.setup.get((name, self.coef.shape), self.sigma, compute)

    @abc.abstractmethod
    def latent(self, X):
        """The rows' latent moments, chunk by chunk (:mod:`vsbayes.models.latent`)."""

    @abc.abstractmethod
    def latent_mean_and_variance(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of each row's latent score(s): (n,) for one, else (n, K)."""

    @abc.abstractmethod
    def log_proba(self, X, transform: Transform = np.asarray) -> np.ndarray:
        """``transform`` of the normalized log predictive probabilities, (n, n_classes),
        applied chunk by chunk."""

    @abc.abstractmethod
    def decision_function(self, X) -> np.ndarray:
        """Scores monotone in the probabilities: (n,) for two classes, else (n, K)."""

    def predicted_index(self, X, dtype=np.float64) -> np.ndarray:
        """Index (n,) of each row's most probable class: ``decision_function``'s sign for
        two classes, else its argmax, the scores taken in ``dtype`` (the estimator's
        output's)."""
        scores = self.decision_function(X).astype(dtype, copy=False)
        return (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)

    @abc.abstractmethod
    def sample(self, n_draws: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(coef, intercept)`` drawn from the posterior(s): (n_draws, *coef.shape) and
        (n_draws, *intercept.shape), intercepts zero when not fitted."""


class OneVsRestPredictive(FittedPredictive):
    """One independent binary posterior per class; the probabilities normalized.

    ``sigma`` is (n_problems, p, p). ``link`` is the binary link (a name or a
    :class:`~vsbayes.models.links.Link`).
    """

    def __init__(self, coef, intercept, sigma, link: str | Link, posteriors=None, setup=None):
        super().__init__(coef, intercept, sigma, posteriors, setup)
        self.link = get_link(link)

    def _covs(self) -> np.ndarray:
        return self.sigma

    def latent(self, X) -> IndependentLatents:
        covs, d = self._covs(), self.coef.shape[1]
        return IndependentLatents(
            X,
            self.coef,
            self.intercept,
            covs,
            lambda: self._kept("factors", lambda: IndependentFactors(covs, d)),
        )

    def latent_mean_and_variance(self, X):
        latent = self.latent(X)
        mean = np.empty((X.shape[0], len(self.coef)))
        var = np.empty_like(mean)

        def work(rows):
            mean[rows], var[rows] = latent(rows)

        latent.run(work)
        return mean, var

    def _class_log_proba(self, X, combine, width: int) -> np.ndarray:
        """``combine(log p, log(1-p))`` of the problems' predictives, chunk by chunk:
        ``combine`` maps a chunk's (rows, problems) log-probabilities to its rows of the
        (n_samples, width) result (an array, or a tuple of columns)."""
        latent = self.latent(X)
        predictive = self.link.predictive_log_proba
        out = np.empty((X.shape[0], width))

        def work(rows):
            with np.errstate(over="ignore"):  # refused below, with a remedy
                mean, var = latent(rows)
            overflowed = ~(np.isfinite(var) & np.isfinite(mean)).all(axis=1)
            if overflowed.any():
                # An infinite variance would give every such row probability 1/2.
                raise ValueError(
                    f"The latent values of {overflowed.sum()} row(s) overflow float64: "
                    f"their features are too large (~1e154 or more) for a predictive. "
                    f"Rescale X, e.g. with sklearn.preprocessing.StandardScaler in a pipeline."
                )
            result = combine(*predictive(mean, var))
            if isinstance(result, tuple):  # columns
                for column, values in enumerate(result):
                    out[rows, column] = values[:, 0]
            else:
                out[rows] = result

        latent.run(work)
        return out

    def log_proba(self, X, transform=np.asarray):
        return self._class_log_proba(
            X,
            lambda log_p, _: transform(log_p - logsumexp(log_p, axis=1, keepdims=True)),
            len(self.coef),
        )

    def decision_function(self, X):
        return self._class_log_proba(X, np.subtract, len(self.coef))

    def sample(self, n_draws, rng):
        draws = np.stack([g.sample(n_draws, rng) for g in self.posteriors], axis=1)
        d = self.coef.shape[1]
        intercept = draws[:, :, d] if draws.shape[2] > d else np.zeros(draws.shape[:2])
        return draws[:, :, :d], intercept


class BinaryPredictive(OneVsRestPredictive):
    """One binary posterior (two classes): the one-problem case of one-vs-rest, whose
    log-probabilities ``log(1 - p)`` and ``log p`` are already complementary.

    ``sigma`` is (p, p).
    """

    def _covs(self) -> np.ndarray:
        return self.sigma[None]

    def latent_mean_and_variance(self, X):
        mean, var = super().latent_mean_and_variance(X)
        return mean[:, 0], var[:, 0]

    def log_proba(self, X, transform=np.asarray):
        return self._class_log_proba(
            X, lambda log_p, log_q: (transform(log_q), transform(log_p)), 2
        )

    def decision_function(self, X):
        return super().decision_function(X)[:, 0]


class StructuredBinaryPredictive(BinaryPredictive):
    """One binary posterior whose covariance is a
    :class:`~vsbayes.gaussian.StructuredCovariance` (``sigma``): the latent variances from
    its factors (:class:`~vsbayes.models.latent.StructuredLatents`)."""

    def latent(self, X) -> StructuredLatents:
        return StructuredLatents(X, self.coef, self.intercept, self.sigma)


class StructuredOneVsRestPredictive(OneVsRestPredictive):
    """One-vs-rest posteriors whose covariances are structured (``sigma``, a
    :class:`~vsbayes.gaussian.StructuredCovariances`): each problem's latent variances from
    its factors (:class:`~vsbayes.models.latent.StructuredIndependentLatents`)."""

    def latent(self, X) -> StructuredIndependentLatents:
        return StructuredIndependentLatents(X, self.coef, self.intercept, self.sigma)


class MultinomialPredictive(FittedPredictive):
    """One joint posterior of the K classes' scores, in the multinomial model's layout
    θ = ``[W.ravel(), b]``: ``sigma`` is (p, p), p = K d (+ K with intercepts)."""

    def latent(self, X) -> JointLatents:
        k, d = self.coef.shape
        forms = self._kept("forms", lambda: JointForms(self.sigma, k, d))
        return JointLatents(X, self.coef, self.intercept, self.sigma, forms)

    def latent_mean_and_variance(self, X):
        latent = self.latent(X)
        mean = np.empty((X.shape[0], len(self.coef)))
        var = np.empty_like(mean)
        for rows in latent.chunks:
            m, cov = latent(rows)
            mean[rows] = m - m.mean(axis=1, keepdims=True)
            var[rows] = np.einsum("nkk->nk", cov)
        return mean, var

    def log_proba(self, X, transform=np.asarray, *, argmax_only: bool = False):
        """As :meth:`FittedPredictive.log_proba`, to :func:`vsbayes.set_config`'s
        ``predictive_tol``; ``argmax_only`` refines each wide row only until its leading
        class is settled (see
        :func:`~vsbayes.models.softmax_predictive.centred_softmax_predictive_log_proba`)."""
        latent = self.latent(X)
        out = np.empty((X.shape[0], len(self.coef)))
        tol = get_config()["predictive_tol"]  # once: every chunk of the call to one accuracy

        def work(rows):
            with np.errstate(over="ignore", invalid="ignore"):  # overflow: refused by the rule
                moments = latent.centred(rows)
            log_p = centred_softmax_predictive_log_proba(
                *moments, tol=tol, max_bytes=latent.budget, argmax_only=argmax_only
            )
            out[rows] = transform(log_p)

        latent.run(work)
        return out

    def predicted_index(self, X, dtype=np.float64):
        """The argmax of the predictive probabilities in ``dtype`` (ties to the first
        class, as ``predict_proba``'s argmax), each wide row refined only until its leading
        class is settled (the guarantee:
        :func:`~vsbayes.models.softmax_predictive.centred_softmax_predictive_log_proba`)."""
        proba = self.log_proba(X, lambda log_p: np.exp(log_p).astype(dtype), argmax_only=True)
        return proba.argmax(axis=1)

    def decision_function(self, X):
        return self.log_proba(X, lambda log_p: log_p - log_p.mean(axis=1, keepdims=True))

    def sample(self, n_draws, rng):
        # One joint posterior: [W.ravel(), b] per draw (the draws include the prior-only
        # shift common to all classes, to which predictions are invariant).
        k, d = self.coef.shape
        draws = self.posteriors[0].sample(n_draws, rng)
        coef = draws[:, : k * d].reshape(n_draws, k, d)
        intercept = draws[:, k * d :] if draws.shape[1] > k * d else np.zeros((n_draws, k))
        return coef, intercept


class StructuredMultinomialPredictive(MultinomialPredictive):
    """The multinomial posterior with a :class:`~vsbayes.gaussian.StructuredCovariance`
    (``sigma``): the rows' latent covariances from its factors
    (:class:`~vsbayes.models.latent.StructuredJointLatents`)."""

    def latent(self, X) -> StructuredJointLatents:
        return StructuredJointLatents(X, self.coef, self.intercept, self.sigma)


def fitted_predictive(
    coef: np.ndarray,
    intercept: np.ndarray,
    sigma: np.ndarray,
    link: str | Link,
    posteriors: Sequence[Gaussian] | None = None,
    setup: PredictiveSetup | None = None,
) -> FittedPredictive:
    """The predictive of a fitted posterior, its kind read from the arrays' shapes.

    Parameters
    ----------
    coef : ndarray of shape (n_problems, d)
    intercept : ndarray of shape (n_problems,)
    sigma : ndarray, StructuredCovariance or StructuredCovariances
        One covariance per problem (one-vs-rest: (n_problems, p, p), dense or
        structured), or one (p, p) covariance:
        of one binary problem's ``[w, b]`` when ``coef`` has one row (dense or
        structured), else of the multinomial θ.
    link : str or Link
        The binary link of binary and one-vs-rest posteriors (the multinomial's is the
        softmax).
    posteriors : sequence of Gaussian, optional
        The posteriors, for :meth:`FittedPredictive.sample`.
    setup : PredictiveSetup, optional
        Where the set-ups computed from ``sigma`` are kept between reads.

    Returns
    -------
    FittedPredictive
    """
    if isinstance(sigma, StructuredCovariances):
        return StructuredOneVsRestPredictive(coef, intercept, sigma, link, posteriors, setup)
    if isinstance(sigma, StructuredCovariance):
        if len(coef) > 1:
            return StructuredMultinomialPredictive(coef, intercept, sigma, posteriors, setup)
        return StructuredBinaryPredictive(coef, intercept, sigma, link, posteriors, setup)
    if sigma.ndim == 3:
        return OneVsRestPredictive(coef, intercept, sigma, link, posteriors, setup)
    if len(coef) == 1:
        return BinaryPredictive(coef, intercept, sigma, link, posteriors, setup)
    return MultinomialPredictive(coef, intercept, sigma, posteriors, setup)
