"""A GLM posterior whose observations stay in the row chunks of dask arrays.

:class:`ChunkedPosterior` has the interface of the in-memory posterior the fitters call
(``log_density`` of many parameter vectors, ``value_gradient_hessian`` at one), but each
pass is a map over the chunks — each chunk holds the in-memory posterior of its own rows,
built where the chunk is (a ``distributed`` worker) — and a sum of their small results in
chunk order. Only θ, the N points and those results travel; the rows never leave the
workers.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .dask_chunks import DaskChunks
from .glm import BinaryGLMPosterior, add_prior
from .links import Link
from .softmax import SoftmaxGLMPosterior

__all__ = ["ChunkedPosterior", "ChunkedSoftmaxPosterior"]


class _Chunked:
    """What the chunked posteriors share: the passes over the chunks, and the template
    (the in-memory model of no rows) for the dimensions, the prior and ``log_prior``."""

    #: The fitters that need the rows themselves (EP's sites, VB's bounds) check this.
    rows_in_memory = False

    def _setup(self, template, build, arrays, names) -> None:
        self._template = template
        shared = ("fit_intercept", "n_features", "dim", "prior_var", "prior_mean", "max_bytes")
        for name in (*shared, *names):
            setattr(self, name, getattr(template, name))
        self.n_jobs = None
        self.chunks = DaskChunks(build, [a for a in arrays if a is not None])
        self.n_observations, self.n_design_entries = (int(v) for v in self.chunks.sum("sizes"))

    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """Normalized log prior density of the rows of ``theta`` (N, p)."""
        return self._template.log_prior(theta)

    def log_likelihood(self, theta: np.ndarray) -> np.ndarray:
        """The log-likelihood of each row of ``theta`` (N, p), summed over the chunks."""
        theta = np.atleast_2d(np.asarray(theta, dtype=float))
        return self.chunks.sum("log_likelihood", theta)

    def log_density(self, theta: np.ndarray) -> np.ndarray:
        """Unnormalized log-posterior ``log p(θ)`` of the rows of ``theta`` (N, p)."""
        theta = np.atleast_2d(np.asarray(theta, dtype=float))
        return self.log_likelihood(theta) + self.log_prior(theta)

    __call__ = log_density

    def value_gradient_hessian(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``log p(θ)``, its gradient and the negative Hessian (PD) at one point: one pass."""
        theta = np.asarray(theta, dtype=float)
        value, grad, hess = self.chunks.sum("likelihood_value_gradient_hessian", theta)
        return add_prior(self, theta, float(value), grad, hess)


class ChunkedPosterior(_Chunked):
    """Binary GLM posterior over the row chunks of dask arrays (see the module docstring).

    Parameters
    ----------
    X : dask array of shape (M, d)
        Design matrix, chunked by rows only (dense or scipy.sparse chunks).
    y : dask array of shape (M,)
        Labels in {-1, +1}, chunked as X.
    sample_weight : dask array of shape (M,) or None
        Non-negative weights, chunked as X; None for ones.
    link : {"logistic", "probit"} or Link
        The binary link.
    prior_var, intercept_prior_var, prior_mean : float, float or None, array or None
        As :class:`~vsbayes.models.BinaryGLMPosterior` (the prior stays here: the chunks
        hold the likelihood's rows only).

    Attributes
    ----------
    chunks : DaskChunks
        The chunks' posteriors and the traffic of their passes.
    n_observations : int
        Rows with positive weight, over all chunks.
    n_design_entries : int
        Entries (non-zeros if sparse) of the signed design, over all chunks.
    """

    def __init__(
        self,
        X,
        y,
        sample_weight,
        link: str | Link,
        *,
        prior_var: float | np.ndarray,
        intercept_prior_var: float | None,
        prior_mean: np.ndarray | None = None,
    ):
        priors = {"prior_var": prior_var, "intercept_prior_var": intercept_prior_var}
        template = BinaryGLMPosterior(
            _no_rows(X), np.zeros(0), np.zeros(0), link, prior_mean=prior_mean, **priors
        )
        build = _ChunkSpec(_Chunk, (template.link,), priors)
        self._setup(template, build, [X, y, sample_weight], ("link",))

    def log_density_at(self, theta: np.ndarray) -> float:
        """``log p(θ)`` at one point with the exact (float64) ``log F``, in one pass: what
        Newton's line search compares with :meth:`value_gradient_hessian`'s value (the
        float32 terms of :meth:`log_density` would decide it near the mode)."""
        theta = np.asarray(theta, dtype=float)
        value = self.chunks.sum("log_likelihood_at", theta)
        return float(value) + float(self.log_prior(theta[None])[0])


class ChunkedSoftmaxPosterior(_Chunked):
    """Multinomial logistic posterior over the row chunks of dask arrays.

    The counterpart of :class:`~vsbayes.models.SoftmaxGLMPosterior` (same parameters but
    ``n_jobs`` and ``max_bytes``, with
    ``X``, ``y`` and ``sample_weight`` dask arrays chunked alike by rows, ``sample_weight``
    None for ones), as :class:`ChunkedPosterior` is of the binary model.
    """

    def __init__(
        self,
        X,
        y,
        sample_weight,
        n_classes: int,
        *,
        prior_var: float | np.ndarray,
        intercept_prior_var: float | None,
        prior_mean: np.ndarray | None = None,
        prior_precision: np.ndarray | None = None,
    ):
        priors = {"prior_var": prior_var, "intercept_prior_var": intercept_prior_var}
        empty = np.zeros(0, dtype=np.intp)
        general = {"prior_mean": prior_mean, "prior_precision": prior_precision}
        template = _SoftmaxChunk(_no_rows(X), empty, np.zeros(0), n_classes, **priors, **general)
        build = _ChunkSpec(_SoftmaxChunk, (template.n_classes,), priors)
        self._setup(template, build, [X, y, sample_weight], ("n_classes", "prior_precision"))

    def split(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` of the rows of ``theta``, as the in-memory model's."""
        return self._template.split(theta)

    def centred(self, posterior):
        """``posterior`` in scikit-learn's representative, as the in-memory model's."""
        return self._template.centred(posterior)

    def probabilities(self, theta: np.ndarray) -> tuple[float, None]:
        """``(Σ_i s_i log softmax(f_i)[y_i], None)`` at one θ: the probabilities stay in the
        chunks."""
        return float(self.chunks.sum("log_likelihood_at", np.asarray(theta, dtype=float))), None


def _no_rows(X):
    """An empty design with X's columns and kind (dense or CSR)."""
    if sp.issparse(getattr(X, "_meta", None)):
        return sp.csr_matrix((0, X.shape[1]))
    return np.zeros((0, X.shape[1]))


class _ChunkSpec:
    """Builds a chunk's posterior from its blocks (picklable, for the workers)."""

    def __init__(self, model, args, priors):
        self.model, self.args, self.priors = model, args, priors

    def __call__(self, X, y, sample_weight=None):
        weights = np.ones(X.shape[0]) if sample_weight is None else sample_weight
        return self.model(X, y, weights, *self.args, **self.priors)


def _rows_bytes(design) -> int:
    if sp.issparse(design):
        return design.data.nbytes + design.indices.nbytes + design.indptr.nbytes
    return design.nbytes


class _Chunk(BinaryGLMPosterior):
    """The posterior of one chunk's rows, with what the caller asks of a chunk."""

    def sizes(self) -> tuple[int, int]:
        return self.n_observations, self.n_design_entries

    def log_likelihood_at(self, theta: np.ndarray) -> float:
        t = np.asarray(self.design @ theta).ravel()
        return float(self.sample_weight @ self.link.log_cdf(t))

    def __sizeof__(self) -> int:
        # What dask's scheduler weighs (through sys.getsizeof) before moving a chunk.
        return object.__sizeof__(self) + _rows_bytes(self.design) + self.sample_weight.nbytes


class _SoftmaxChunk(SoftmaxGLMPosterior):
    """The multinomial posterior of one chunk's rows, with what the caller asks of it."""

    def sizes(self) -> tuple[int, int]:
        entries = self.X.nnz if sp.issparse(self.X) else self.X.size
        return self.n_observations, int(entries)

    def likelihood_value_gradient_hessian(self, theta):
        log_lik, P = self.probabilities(np.asarray(theta, dtype=float))
        return log_lik, self.gradient(P), self.hessian(P)

    def log_likelihood_at(self, theta) -> float:
        return self.probabilities(theta)[0]

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + _rows_bytes(self.X) + self.sample_weight.nbytes
