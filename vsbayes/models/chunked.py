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

__all__ = ["ChunkedPosterior"]


class ChunkedPosterior:
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
    prior_var, intercept_prior_var : float, float or None
        As :class:`~vsbayes.models.BinaryGLMPosterior`.

    Attributes
    ----------
    chunks : DaskChunks
        The chunks' posteriors and the traffic of their passes.
    n_observations : int
        Rows with positive weight, over all chunks.
    n_design_entries : int
        Entries (non-zeros if sparse) of the signed design, over all chunks.
    """

    #: The fitters that need the rows themselves (EP's sites, VB's bounds) check this.
    rows_in_memory = False

    def __init__(
        self,
        X,
        y,
        sample_weight,
        link: str | Link,
        *,
        prior_var: float,
        intercept_prior_var: float | None,
    ):
        sparse = sp.issparse(getattr(X, "_meta", None))
        empty = sp.csr_matrix((0, X.shape[1])) if sparse else np.zeros((0, X.shape[1]))
        # The chunk-free template: dimensions, prior and link, and log_prior.
        self._template = BinaryGLMPosterior(
            empty,
            np.zeros(0),
            np.zeros(0),
            link,
            prior_var=prior_var,
            intercept_prior_var=intercept_prior_var,
        )
        for name in ("link", "fit_intercept", "n_features", "dim", "prior_var", "max_bytes"):
            setattr(self, name, getattr(self._template, name))
        self.n_jobs = None
        spec = (self.link, float(prior_var), intercept_prior_var)
        arrays = [X, y] if sample_weight is None else [X, y, sample_weight]
        self.chunks = DaskChunks(_ChunkSpec(spec), arrays)
        self.n_observations, self.n_design_entries = (int(v) for v in self.chunks.sum("sizes"))

    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """Normalized log prior density of the rows of ``theta`` (N, p)."""
        return self._template.log_prior(theta)

    def log_likelihood(self, theta: np.ndarray) -> np.ndarray:
        """``Σ_i s_i log F(y_i f_i)`` for each row of ``theta`` (N, p), summed over chunks."""
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


class _ChunkSpec:
    """Builds a chunk's posterior from its blocks (picklable, for the workers)."""

    def __init__(self, spec):
        self.link, self.prior_var, self.intercept_prior_var = spec

    def __call__(self, X, y, sample_weight=None) -> _Chunk:
        return _Chunk(
            X,
            y,
            np.ones(X.shape[0]) if sample_weight is None else sample_weight,
            self.link,
            prior_var=self.prior_var,
            intercept_prior_var=self.intercept_prior_var,
        )


class _Chunk(BinaryGLMPosterior):
    """The posterior of one chunk's rows, with what the caller asks of a chunk."""

    def __sizeof__(self) -> int:
        # What dask's scheduler weighs (through sys.getsizeof) before moving a chunk.
        design = self.design
        rows = design.data.nbytes + design.indices.nbytes if sp.issparse(design) else design.nbytes
        return object.__sizeof__(self) + rows + self.sample_weight.nbytes

    def sizes(self) -> tuple[int, int]:
        return self.n_observations, self.n_design_entries
