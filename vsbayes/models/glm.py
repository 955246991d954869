"""Bayesian binary GLM: the log-posterior of many parameter vectors at once, in bounded chunks.

The parameter vector is ``θ = [w, b]`` (``b`` only with an intercept), the latent value of
observation i is ``f_i = x_i·w + b`` and the unnormalized posterior is

    p(θ) = Π_i F(y_i f_i)^{s_i} · N(θ; prior_mean, diag(prior_var))

with labels ``y_i = ±1`` and weights ``s_i ≥ 0``. Its integral is the model evidence.
"""

from __future__ import annotations

import copy
import math
import threading

import numpy as np
import scipy.sparse as sp
from joblib import Parallel, delayed, effective_n_jobs
from scipy.linalg.blas import dsyrk

from .._blas import block_slices, map_blocks, single_blas_thread, sum_blocks
from .._indices import triu_indices
from .._memory import block_bytes
from .._sums import CompensatedSum
from .latent import InformativeRows, constant_rows
from .links import Link, get_link

__all__ = [
    "BinaryGLMPosterior",
    "add_prior",
    "coefficient_prior_variances",
    "diagonal_log_prior",
    "fast_log_cdf_suffices",
    "prior_mean_vector",
]

_LOG_2PI = math.log(2.0 * math.pi)
# Entries of a likelihood block: the GEMM's output is still in cache for the link's pass.
_BLOCK_ENTRIES = 2**18
# The links' fast log F errs by up to this per row (the logistic's float32 soft part); a row
# of weight s by s times it. Where the rows' errors, in quadrature, could exceed
# _FAST_LIKELIHOOD_NOISE nats (weights of 10⁴ and more: counts as weights), log F is exact.
_FAST_LOG_CDF_ERROR = 1e-7
_FAST_LIKELIHOOD_NOISE = 1e-3


class BinaryGLMPosterior:
    """Unnormalized posterior of a binary GLM with a Gaussian prior.

    Parameters
    ----------
    X : ndarray or scipy.sparse matrix of shape (M, d)
        Design matrix. The model keeps its own copy of the rows, signed by the labels
        (with a column for the intercept), as float64 or CSR.
    y : array-like of shape (M,)
        Labels in {-1, +1}.
    sample_weight : array-like of shape (M,)
        Non-negative likelihood exponents ``s_i``. Rows with weight 0 are dropped.
    link : {"logistic", "probit"} or Link
        The binary link ``F``.
    prior_var : float or array-like of shape (d,)
        Prior variance of each coefficient of ``w`` (``C`` of scikit-learn's
        ``LogisticRegression``), one for all or one per feature.
    intercept_prior_var : float or None
        Prior variance of the intercept ``b``; ``None`` fits no intercept.
    prior_mean : array-like of shape (dim,), optional
        Prior mean of θ (default 0). A prior with a full covariance is this model on a
        whitened design (:mod:`vsbayes.models.priors`).
    coefficient_prior : CoefficientFactor, optional
        A non-Gaussian prior on each coefficient (:mod:`vsbayes.models.shrinkage_priors`):
        the prior of a coefficient is then ``N(0, prior_var) × r(θ_j)``, its Gaussian base
        times the factor's ratio, and :meth:`log_prior` is that prior exactly. The prior
        mean must be 0.
    n_jobs : int or None
        Workers for :meth:`log_density` (joblib; ``None`` means 1 unless inside a
        ``joblib.parallel_config`` context, where that backend is used).
    max_bytes : int, optional
        Bound on the temporaries of one evaluation block (one block per worker); default
        :func:`vsbayes._memory.block_bytes`, a quarter of scikit-learn's
        ``working_memory`` when the model is built.
    """

    #: The rows are here (``design``); see :class:`~vsbayes.models.ChunkedPosterior`.
    rows_in_memory = True

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
        coefficient_prior=None,
        n_jobs: int | None = None,
        max_bytes: int | None = None,
    ):
        self.link = get_link(link) if isinstance(link, str) else link
        s = np.asarray(sample_weight, dtype=float)
        y = np.asarray(y, dtype=float)
        keep = s > 0
        if not keep.all():
            X, y, s = X[keep], y[keep], s[keep]
        self.fit_intercept = intercept_prior_var is not None
        self.n_features = X.shape[1]
        self.dim = self.n_features + int(self.fit_intercept)
        # The signed design rows y_i [x_i, 1]: then y_i f_i = design @ θ is a single product
        # (no per-block intercept add or label multiply), and y_i² = 1 in the Hessian.
        signed = y[:, None]
        if sp.issparse(X):
            parts = [sp.csr_matrix(X).multiply(signed)]
            parts += [sp.csr_matrix(signed)] if self.fit_intercept else []
            self.design = sp.hstack(parts, format="csr")
        else:
            parts = [np.asarray(X, dtype=float) * signed]
            parts += [signed] if self.fit_intercept else []
            self.design = np.hstack(parts) if self.fit_intercept else parts[0]
        self.sample_weight = s
        prior = np.empty(self.dim)
        prior[: self.n_features] = coefficient_prior_variances(prior_var, self.n_features)
        if self.fit_intercept:
            prior[-1] = intercept_prior_var
        self.prior_var = prior
        self.prior_mean = prior_mean_vector(prior_mean, self.dim)
        self.coefficient_prior = coefficient_prior
        if coefficient_prior is not None:
            if np.any(self.prior_mean != 0):
                raise ValueError("A shrinkage prior on the coefficients is centred at 0.")
            prior[: self.n_features] = coefficient_prior.base_var
        self.n_jobs = n_jobs
        self.max_bytes = block_bytes() if max_bytes is None else int(max_bytes)

    @property
    def n_observations(self) -> int:
        """Number of observations with positive weight."""
        return self.design.shape[0]

    @property
    def n_design_entries(self) -> int:
        """Multiply-adds of one parameter vector's pass over the design (its non-zeros if
        sparse)."""
        design = self.design
        return int(design.nnz) if sp.issparse(design) else int(design.size)

    def informative_rows(self) -> InformativeRows:
        """The rows whose factor depends on θ, apart from the constant ones (all-zero rows
        without an intercept, whose factor is ``F(0)^{s_i}``): see
        :class:`~vsbayes.models.latent.InformativeRows`."""
        if self.fit_intercept:
            return InformativeRows(self, np.zeros(self.n_observations, dtype=bool), np.zeros(0))
        constant = constant_rows(self.design)
        if not constant.any():
            return InformativeRows(self, constant, np.zeros(0))
        log_factors = self.sample_weight[constant] * float(self.link.log_cdf(np.zeros(1))[0])
        informative = copy.copy(self)
        informative.design = self.design[~constant]
        informative.sample_weight = self.sample_weight[~constant]
        return InformativeRows(informative, constant, log_factors)

    # --- many parameter vectors: the log-density the sampling fitters call -------------

    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """Normalized log prior density of the rows of ``theta`` (N, p)."""
        value = diagonal_log_prior(self, theta)
        factor = self.coefficient_prior
        if factor is not None:  # the Gaussian base times each coefficient's ratio
            value = value + factor.log_ratio(theta[:, : self.n_features]).sum(axis=1)
        return value

    def log_likelihood(self, theta: np.ndarray) -> np.ndarray:
        """``Σ_i s_i log F(y_i f_i)`` for each row of ``theta`` (N, p).

        The (N, M) matrix of latent values is formed in blocks (one GEMM per block,
        ``log F`` in place), of at most ``max_bytes`` bytes and small enough to stay in
        cache. With ``n_jobs`` > 1 (or inside a ``joblib.parallel_config``) the blocks run
        through joblib, each worker holding one; otherwise side by side on the threads BLAS
        may use, on one BLAS thread each (:mod:`vsbayes._blas`). The blocks depend on
        neither, so the result is the same, to the last bit, for any ``n_jobs``. ``log F``
        is the link's ``fast_log_cdf``: to 1e-7 per observation for the logistic link
        (float32 where exactness buys nothing: the sampling fits' error is far larger),
        and its exact ``log_cdf`` where the weights would multiply that beyond 1e-3 nats
        (:func:`fast_log_cdf_suffices`).
        """
        theta = np.atleast_2d(np.asarray(theta, dtype=float))
        n, m = theta.shape[0], self.n_observations
        # Two float64 arrays per block: the latent values and one temporary of log F.
        entries = max(1, min(self.max_bytes // 16, _BLOCK_ENTRIES))
        block_n = min(n, max(512, entries // max(m, 1)))
        block_m = max(1, min(m, entries // block_n))  # (a dask chunk may hold no rows)
        tasks = [
            (slice(i, min(i + block_n, n)), slice(j, min(j + block_m, m)))
            for i in range(0, n, block_n)
            for j in range(0, m, block_m)
        ]
        # Each task gets only its slices, so that a distributed backend ships no more.
        exact = not fast_log_cdf_suffices(self.sample_weight)
        args = [
            (self.design[cols], self.sample_weight[cols], theta[rows], self.link, exact)
            for rows, cols in tasks
        ]
        if self._workers() > 1 and len(tasks) > 1:
            parts = Parallel(n_jobs=self.n_jobs, prefer="threads")(
                delayed(_block_log_likelihood)(*a) for a in args
            )
        else:
            with single_blas_thread():
                parts = map_blocks(lambda a: _block_log_likelihood(*a), args)
        # Compensated: the same total, to a few ulps, for any grouping of the rows into
        # blocks or dask chunks (vsbayes._sums).
        out = CompensatedSum(n)
        for (rows, _), part in zip(tasks, parts, strict=True):
            out.add(part, rows)
        return out.result()

    def _workers(self) -> int:
        # effective_n_jobs honours an enclosing joblib.parallel_config (n_jobs=None).
        return max(1, effective_n_jobs(self.n_jobs))

    def log_density(self, theta: np.ndarray) -> np.ndarray:
        """Unnormalized log-posterior ``log p(θ)`` of the rows of ``theta`` (N, p)."""
        theta = np.atleast_2d(np.asarray(theta, dtype=float))
        return self.log_likelihood(theta) + self.log_prior(theta)

    __call__ = log_density

    # --- one parameter vector: what Newton's method needs -------------------------------

    def weighted_gram(self, weights: np.ndarray) -> np.ndarray:
        """``Aᵀ diag(weights) A`` (A the signed design), dense, accumulated over row blocks so
        that no temporary exceeds ``max_bytes``."""
        p = self.dim
        # Non-negative weights (Newton's curvatures, EP's and VB's site precisions): the
        # symmetric rank-k update of √w A, half the multiply-adds of a general product.
        symmetric = not sp.issparse(self.design) and bool(np.all(weights >= 0))

        def block(rows: slice) -> np.ndarray:
            a, w = self.design[rows], weights[rows]
            if sp.issparse(a):
                return (a.T @ a.multiply(w[:, None]).tocsr()).toarray()
            if symmetric:
                # (√w a)ᵀ is Fortran-ordered: BLAS takes it without a copy.
                return dsyrk(1.0, (a * np.sqrt(w)[:, None]).T)
            return a.T @ (a * w[:, None])

        # Each block holds a weighted copy of its rows and its p × p product, whose sum
        # costs p² per block: a block does 256 times that work at least (dense: p² per
        # row, a rank-256 update at least; sparse: the pairs of each row's non-zeros, and
        # the product made dense), and 2²⁷ multiply-adds: below, one BLAS call beat blocks
        # on two threads (EP at 1000 × 200 on 2 cores).
        rows_cap = max(1, self.max_bytes // (8 * p) - p)
        if sp.issparse(self.design):
            per_row = max(1.0, self.design.nnz / max(self.n_observations, 1)) ** 2
        else:
            per_row = p * p
        blocks = block_slices(self.n_observations, per_row, rows_cap, max(2**27, 256 * p * p))
        with single_blas_thread():
            gram = sum_blocks(block, blocks)
        if symmetric:  # SYRK fills the upper triangle
            upper = triu_indices(self.dim, 1)
            gram[upper[::-1]] = gram[upper]
        return gram

    def likelihood_value_gradient_hessian(
        self, theta: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """The log-likelihood at one point, its gradient and its negative Hessian (PSD).

        The negative Hessian is ``Aᵀ diag(s_i h_i) A``, by :meth:`weighted_gram`. Sums over
        rows: a chunked model (:class:`~vsbayes.models.ChunkedPosterior`) adds those of its
        chunks.
        """
        theta = np.asarray(theta, dtype=float)
        t = np.asarray(self.design @ theta).ravel()
        value = float(self.sample_weight @ self.link.log_cdf(t))
        slope, curvature = self.link.derivatives(t)
        grad = np.asarray(self.design.T @ (self.sample_weight * slope)).ravel()
        return value, grad, self.weighted_gram(self.sample_weight * curvature)

    def value_gradient_hessian(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``log p(θ)``, its gradient and the negative Hessian (PD) at one point.

        The likelihood's terms (:meth:`likelihood_value_gradient_hessian`) plus the prior's.
        """
        theta = np.asarray(theta, dtype=float)
        value, grad, hess = self.likelihood_value_gradient_hessian(theta)
        return add_prior(self, theta, value, grad, hess)


def add_prior(model, theta: np.ndarray, value: float, grad: np.ndarray, hess: np.ndarray):
    """The log-posterior's value, gradient and negative Hessian from the likelihood's (in
    place), for a model with ``log_prior``, ``prior_var``, ``prior_mean`` and ``dim`` (and
    ``prior_precision``: a full precision in place of ``1 / prior_var``, if not None)."""
    value += float(model.log_prior(theta[None])[0])
    precision = getattr(model, "prior_precision", None)
    if precision is None:
        grad -= (theta - model.prior_mean) / model.prior_var
        hess[np.diag_indices(model.dim)] += 1.0 / model.prior_var
    else:
        grad -= precision @ (theta - model.prior_mean)
        hess += precision
    return value, grad, hess


def diagonal_log_prior(model, theta: np.ndarray) -> np.ndarray:
    """Normalized log density of N(prior_mean, diag(prior_var)) at the rows of ``theta``."""
    centred = theta - model.prior_mean
    quad = (centred * centred) @ (1.0 / model.prior_var)
    return -0.5 * (quad + model.dim * _LOG_2PI + np.log(model.prior_var).sum())


def prior_mean_vector(prior_mean, dim: int) -> np.ndarray:
    """The prior mean as a finite vector of length ``dim`` (zeros for None)."""
    if prior_mean is None:
        return np.zeros(dim)
    mean = np.asarray(prior_mean, dtype=float)
    if mean.shape != (dim,) or not np.isfinite(mean).all():
        raise ValueError(
            f"prior_mean must be a finite vector of the {dim} parameters; got shape {mean.shape}."
        )
    return mean


def fast_log_cdf_suffices(weights: np.ndarray) -> bool:
    """Whether the link's ``fast_log_cdf`` (1e-7 per row) is exact enough for rows of these
    ``weights``: its errors times the weights, in quadrature, within 1e-3 nats (far below a
    sampling fit's error). Weights of 10⁸ (counts as weights) made it 10 nats a row, and
    importance sampling's weights noise."""
    weights = np.asarray(weights, dtype=float)
    return _FAST_LOG_CDF_ERROR * math.sqrt(float(weights @ weights)) <= _FAST_LIKELIHOOD_NOISE


def _block_log_likelihood(design, weights, theta, link, exact=False) -> np.ndarray:
    """``Σ_i s_i log F(a_i·θ)`` over one block of rows ``a_i`` for each row of ``theta``
    (``exact``: the link's float64 ``log_cdf``, else its ``fast_log_cdf``)."""
    shape = (design.shape[0], theta.shape[0])
    latent, scratch = _block_buffers(shape[0] * shape[1])
    if sp.issparse(design):
        t = np.asarray(design @ theta.T)
    else:
        # y_i f_i, shape (m_block, n_block): one GEMM, into this thread's buffer.
        t = np.matmul(design, theta.T, out=latent[: shape[0] * shape[1]].reshape(shape))
    if exact:
        link.log_cdf(t, out=t)
    else:
        link.fast_log_cdf(t, out=t, scratch=scratch)
    return weights @ t


# One latent and one float32 buffer per thread, reused by every likelihood block: fresh
# temporaries of megabytes cost page faults per block, and three times the pass's time
# where malloc returns freed memory to the system at once (dask's workers set
# MALLOC_TRIM_THRESHOLD_, which turns off glibc's adaptive mmap threshold).
_THREAD_BUFFERS = threading.local()


def _block_buffers(entries: int) -> tuple[np.ndarray, np.ndarray]:
    buffers = getattr(_THREAD_BUFFERS, "pair", None)
    if buffers is None or buffers[0].size < entries:
        buffers = (np.empty(entries), np.empty(entries, dtype=np.float32))
        _THREAD_BUFFERS.pair = buffers
    return buffers


def coefficient_prior_variances(prior_var, n_features: int) -> np.ndarray:
    """The coefficients' prior variances: one for all features, or one per feature (d,);
    positive and finite (a flat prior is the estimators' business: they make it vague)."""
    variances = np.broadcast_to(np.asarray(prior_var, dtype=float), (n_features,))
    if not (np.isfinite(variances).all() and (variances > 0).all()):
        raise ValueError(
            "prior_var must be positive and finite, one value or one per feature; got "
            f"values from {variances.min(initial=np.inf):.3g} to "
            f"{variances.max(initial=-np.inf):.3g}."
        )
    return variances
