"""Bayesian multinomial logistic (softmax) regression: the log-posterior of many parameter
vectors at once, in bounded blocks.

With K classes, coefficients ``W`` (K × d) and intercepts ``b`` (K), the latent values of
observation i are ``f_i = W x_i + b`` (K of them) and the unnormalized posterior is

    p(θ) = Π_i softmax(f_i)[y_i]^{s_i} · N(θ; prior_mean, diag(prior_var))

with weights ``s_i ≥ 0``: scikit-learn's symmetric parameterization (one row of ``W`` and
one intercept per class), whose posterior mode with ``prior_var = C`` on ``W`` is the
solution of ``LogisticRegression(C=C)``. Its integral is the model evidence.

**Layout.** The parameter vector is ``θ = [W.ravel(), b]``: the K rows of ``W`` one after
the other (class-major, as ``coef_.ravel()``), then the K intercepts (absent without one).

**The shift direction.** The softmax is invariant to adding one vector to every class's
``(w_k, b_k)``, so along the d + 1 directions ``1_K ⊗ e_j`` the likelihood is flat and the
posterior is its prior: N(0, prior_var_j / K), independent of the rest and exactly Gaussian.
The prior on ``W`` makes these directions proper with variance C / K; the intercepts' vague
prior (10⁶ in the estimators, as in the binary model) makes the posterior wide, but proper,
along the sum of the intercepts. The mode has ``Σ_k w_k = 0`` and ``Σ_k b_k = 0`` exactly (the
prior is largest there, the likelihood indifferent), which is scikit-learn's representative
(it penalizes no intercept and centres them, ``Σ_k b_k = 0``). Predictions do not depend on
the shift: the predictive (:mod:`vsbayes.models.softmax_predictive`) removes it first.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import scipy.sparse as sp
from joblib import Parallel, delayed, effective_n_jobs

from .._blas import block_slices, map_blocks, single_blas_thread, sum_blocks
from .._indices import triu_indices
from .._memory import block_bytes, block_length
from ..gaussian import Gaussian, lower_cholesky
from .glm import add_prior, coefficient_prior_variances, diagonal_log_prior, prior_mean_vector
from .latent import InformativeRows, _pair_columns, constant_rows

__all__ = ["SoftmaxGLMPosterior"]

# The likelihood pass over many points is bound by memory, not by its one GEMM: its
# temporaries are written once and read a few times (the maximum, the exponentials, their
# sum). Blocks of at most this many bytes stay in cache; measured, one pass of wine's 15,136
# points (178 rows, 3 classes) took 85 ms in 4 MiB blocks against 190 ms in one 64 MiB block,
# iris's 2176 points 8 ms against 21 ms.
LIKELIHOOD_BLOCK_BYTES = 4 * 2**20

_LOG_2PI = math.log(2.0 * math.pi)


#: From this many classes on, the fits' passes over the rows take their many-class forms,
#: round-off apart from the general ones: the Gram products of Newton's Hessian on the
#: rows' distinct products of pairs of columns (:meth:`SoftmaxGLMPosterior.latent_gram`'s
#: ``distinct``: half the GEMM, 24 ms of a 48 ms Hessian at 26 classes × 5000 rows × 17
#: columns; the multinomial EP's posterior and latent covariances take those forms at
#: every K). Where the multinomial EP's rules are sized to the dimension (r = K − 1 ≥ 16);
#: fewer classes keep their bits.
MANY_CLASSES = 17
#: From this many classes on (below :data:`MANY_CLASSES`), Newton's Hessian also takes the
#: rows' distinct products of pairs of columns where :data:`_PRODUCT_COST` says they are
#: cheaper than the weighted copies of the rows (round-off apart): 6 classes on, the
#: curvatures' 21 pairs and more, where a Hessian is worth it; fewer keep their bits.
_DISTINCT_CLASSES = 6
#: The cost of forming one of the rows' products of pairs of columns (w(w + 1)/2 a row),
#: in the Gram GEMM's multiply-adds (a copy's entry, w per pair a row, costs about the
#: same): the distinct products' Gram (half the GEMM) is the cheaper where
#: ``pairs × (w + 2c) > c × w``. Measured on one thread: 10 classes × 65 columns (digits)
#: 0.47 → 0.35 s a Laplace fit, 6 × 31 0.070 → 0.039 s, and against it 6 × 101
#: (0.44 → 0.57 s), 5 × 41 (even) and 3 × 101 (0.11 → 0.33 s): c ≈ 40-60.
_PRODUCT_COST = 48.0
#: The share of a block's bytes up to which the rows' pair products are kept for the fit
#: (:meth:`SoftmaxGLMPosterior.pair_products`): half (32 MiB at scikit-learn's default
#: working memory), digits' 1797 rows × 2145 products (31 MB) among them, which a sixteenth
#: left to be formed anew by ~38 passes of its EP fit (a twentieth of its time); counted
#: in the multinomial EP's memory estimate (Laplace's counts a block of them). The same bits
#: either way.
_PRODUCTS_SHARE = 0.5


class SoftmaxGLMPosterior:
    """Unnormalized posterior of multinomial logistic regression with a Gaussian prior.

    Parameters
    ----------
    X : ndarray or scipy.sparse matrix of shape (M, d)
        Design matrix; kept as float64 or CSR.
    y : array-like of int, shape (M,)
        Class indices in ``0 … n_classes - 1``.
    sample_weight : array-like of shape (M,)
        Non-negative likelihood exponents ``s_i``. Rows with weight 0 are dropped.
    n_classes : int
        Number of classes K (at least 2).
    prior_var : float or array-like of shape (d,)
        Prior variance of each coefficient of ``W`` (``C`` of scikit-learn's
        ``LogisticRegression``), one for all or one per feature (the same for every class).
    intercept_prior_var : float or None
        Prior variance of each intercept; ``None`` fits no intercept.
    prior_mean : array-like of shape (dim,), optional
        Prior mean of θ (default 0).
    prior_precision : array-like of shape (dim, dim), optional
        A full prior precision (symmetric positive definite) in place of
        ``diag(1 / prior_var)``: a general Gaussian prior (e.g. an earlier fit's
        posterior). Then ``prior_var`` is the covariance's diagonal, and :meth:`centred`
        does not apply.
    n_jobs : int or None
        Workers for :meth:`log_density` (joblib; ``None`` means 1 unless inside a
        ``joblib.parallel_config`` context).
    max_bytes : int, optional
        Bound on the temporaries of one evaluation block; default
        :func:`vsbayes._memory.block_bytes`.

    Attributes
    ----------
    dim : int
        ``K (d + 1)`` with an intercept, else ``K d``: the length of θ.
    prior_var : ndarray of shape (dim,)
        Prior variance of each entry of θ.
    prior_mean : ndarray of shape (dim,)
        Prior mean of θ.
    prior_precision : ndarray of shape (dim, dim) or None
        The full prior precision, if given.
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
        coefficient_prior=None,
        n_jobs: int | None = None,
        max_bytes: int | None = None,
    ):
        s = np.asarray(sample_weight, dtype=float)
        y = np.asarray(y, dtype=np.intp)
        keep = s > 0
        if not keep.all():
            X, y, s = X[keep], y[keep], s[keep]
        self.n_classes = int(n_classes)
        if self.n_classes < 2 or y.min(initial=0) < 0 or y.max(initial=0) >= self.n_classes:
            raise ValueError(
                f"y must hold class indices in 0 … n_classes - 1 with n_classes ≥ 2; got "
                f"n_classes={n_classes} and indices from {y.min()} to {y.max()}."
            )
        self.X = sp.csr_matrix(X, dtype=float) if sp.issparse(X) else np.asarray(X, dtype=float)
        self.y = y
        self.sample_weight = s
        self.fit_intercept = intercept_prior_var is not None
        self.n_features = self.X.shape[1]
        k, d = self.n_classes, self.n_features
        self.dim = k * (d + int(self.fit_intercept))
        prior = np.empty(self.dim)
        prior[: k * d].reshape(k, d)[:] = coefficient_prior_variances(prior_var, d)
        if self.fit_intercept:
            prior[k * d :] = intercept_prior_var
        self.prior_var = prior
        self.prior_mean = prior_mean_vector(prior_mean, self.dim)
        self.prior_precision = None
        if prior_precision is not None:
            precision = np.asarray(prior_precision, dtype=float)
            if precision.shape != (self.dim, self.dim):
                raise ValueError(
                    f"prior_precision must be ({self.dim}, {self.dim}); got {precision.shape}."
                )
            lower = lower_cholesky(precision, "prior precision")
            self.prior_precision = precision
            inverse = np.linalg.inv(lower)
            self.prior_var = np.einsum("ij,ij->j", inverse, inverse)  # diag(Λ⁻¹)
            self._prior_half_log_det = float(np.log(np.diag(lower)).sum())
        self.coefficient_prior = coefficient_prior
        if coefficient_prior is not None:
            if self.prior_precision is not None or np.any(self.prior_mean != 0):
                raise ValueError(
                    "A shrinkage prior on the coefficients is centred at 0, with no "
                    "prior_precision."
                )
            prior[: k * d] = coefficient_prior.base_var
        self.n_jobs = n_jobs
        self.max_bytes = block_bytes() if max_bytes is None else int(max_bytes)
        self._products = None  # pair_products(), once formed

    @property
    def n_observations(self) -> int:
        """Number of observations with positive weight."""
        return self.X.shape[0]

    def informative_rows(self) -> InformativeRows:
        """The rows whose factor depends on θ, apart from the constant ones (all-zero rows
        without intercepts, whose factor is ``K^{−s_i}``): see
        :class:`~vsbayes.models.latent.InformativeRows`."""
        if self.fit_intercept:
            return InformativeRows(self, np.zeros(self.n_observations, dtype=bool), np.zeros(0))
        constant = constant_rows(self.X)
        if not constant.any():
            return InformativeRows(self, constant, np.zeros(0))
        informative = copy.copy(self)
        informative.X, informative.y = self.X[~constant], self.y[~constant]
        informative.sample_weight = self.sample_weight[~constant]
        informative._products = None
        log_factors = -math.log(self.n_classes) * self.sample_weight[constant]
        return InformativeRows(informative, constant, log_factors)

    def centred(self, posterior: Gaussian) -> Gaussian:
        """``posterior`` in scikit-learn's representative: ``Σ_k w_k = 0``, ``Σ_k b_k = 0``.

        The shift directions' posterior is known exactly (the module docstring): N(0, c_j)
        along each unit vector ``1_K ⊗ e_j / √K``, independent of the contrasts. A fit is
        replaced there by it: the mean and covariance are projected onto the contrasts
        (``Π μ``, ``Π Σ Π``) and the shift directions' prior added back (``c_j / K`` on each
        pair of classes of column j). Laplace's and EP's posteriors already hold it, and so
        do the sampled fits (which draw only the contrasts:
        :class:`~vsbayes.models.softmax_contrasts.ContrastPosterior`), up to round-off: this
        makes the representative exact. ``log_Z`` and the diagnostics are kept. A
        covariance still to be formed by a function marked ``in_representative`` (the dual
        form's, D-202) is already the representative: kept as it is, to be formed when
        first read and factorized when first needed. Under a
        general prior (``prior_precision`` or a non-zero ``prior_mean``) the posterior is
        returned as it is, and so under a shrinkage prior on the coefficients
        (``coefficient_prior``), whose per-coefficient factors see each class's coefficient
        apart: its mode is not centred (scikit-learn's L1 solution has each column's median
        over the classes at 0, not its mean), nor is the shift's posterior its prior.
        """
        if (
            self.prior_precision is not None
            or np.any(self.prior_mean)
            or self.coefficient_prior is not None
        ):
            # A general prior (correlations, or a mean) couples the shift directions to the
            # contrasts: their posterior is not the prior's N(0, c_j / K), nothing to impose.
            return posterior
        k = self.n_classes
        blocks = []
        for offset, width in self._class_blocks():
            prior = self.prior_var[offset : offset + k * width].reshape(k, width)
            if not np.all(prior == prior[0]):
                raise ValueError(
                    "The shift directions' posterior is the prior only when every class of "
                    "a column has the same prior variance."
                )
            blocks.append((offset, width, prior[0]))
        mean = self._centre_classes(np.array(posterior.mean)[:, None])[:, 0]
        form = posterior.pending_cov
        if getattr(form, "in_representative", False):
            # Formed in the representative already (the dual form's, D-202: the contrasts
            # rotated back by a basis orthogonal to 1, plus the shift's prior), to
            # round-off as this projection's own: not formed here, nor projected again.
            return posterior.with_moments(mean, form)

        cov = self._centre_classes(np.array(posterior.cov))
        cov = self._centre_classes(cov.T).T
        # Column j of class k of a block sits at offset + k * width + j.
        for offset, width, variance in blocks:
            index = offset + np.arange(k)[:, None] * width + np.arange(width)  # (k, width)
            cov[index[:, None, :], index[None, :, :]] += variance / k
        return posterior.with_moments(mean, cov)

    def _class_blocks(self):
        """``(offset, width)`` of θ's class-major blocks: W (K × d), then b (K × 1)."""
        k, d = self.n_classes, self.n_features
        yield 0, d
        if self.fit_intercept:
            yield k * d, 1

    def _centre_classes(self, rows: np.ndarray) -> np.ndarray:
        """Subtract, in place, each block's mean over the classes from the rows of ``rows``
        (dim, n): the projection Π onto the contrasts, applied to every column."""
        k = self.n_classes
        for offset, width in self._class_blocks():
            block = rows[offset : offset + k * width].reshape(k, width, -1)
            block -= block.mean(axis=0)
        return rows

    def split(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` of the rows of ``theta`` (..., dim): shapes (..., K, d) and (..., K)
        (zeros without an intercept)."""
        theta = np.asarray(theta, dtype=float)
        k, d = self.n_classes, self.n_features
        W = theta[..., : k * d].reshape(*theta.shape[:-1], k, d)
        b = theta[..., k * d :] if self.fit_intercept else np.zeros((*theta.shape[:-1], k))
        return W, b

    # --- many parameter vectors: the log-density the sampling fitters call -------------

    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """Normalized log prior density of the rows of ``theta`` (N, dim)."""
        if self.prior_precision is None:
            value = diagonal_log_prior(self, theta)
            factor = self.coefficient_prior
            if factor is not None:  # the Gaussian base times each coefficient's ratio
                coefficients = self.n_classes * self.n_features
                value = value + factor.log_ratio(theta[:, :coefficients]).sum(axis=1)
            return value
        centred = theta - self.prior_mean
        quad = np.einsum("ij,ij->i", centred @ self.prior_precision, centred)
        return -0.5 * (quad + self.dim * _LOG_2PI) + self._prior_half_log_det

    def log_likelihood(self, theta: np.ndarray, single: bool = False) -> np.ndarray:
        """``Σ_i s_i log softmax(f_i)[y_i]`` for each row of ``theta`` (N, dim).

        The (M, N, K) latent values are formed in blocks of rows and points whose
        temporaries stay within ``max_bytes`` and a cache-sized block (one GEMM per block);
        the blocks run through joblib when ``n_jobs`` asks for it, else on the fit's worker
        threads (``_blas.map_blocks``). The blocks depend on neither, so neither does the
        result, to the last bit.

        ``single``: the latent differences' GEMM, their exponentials and the rows' log
        totals in float32 (a block whose exponentials overflow float32 takes float64), the
        label term and the sum over the rows in float64: each row's term to ~10⁻⁷ of its
        size, the values ~1.7× faster (:func:`_block_log_likelihood`). For VS's global fit,
        whose points see the target to far coarser than that (D-165).
        """
        theta = np.atleast_2d(np.asarray(theta, dtype=float))
        n, m, k = theta.shape[0], self.n_observations, self.n_classes
        # Per (row, point): K latent values and K of their exponentials, 8 bytes each; the
        # block's temporaries stay cache-sized (see LIKELIHOOD_BLOCK_BYTES).
        entries = max(1, min(self.max_bytes, LIKELIHOOD_BLOCK_BYTES) // (16 * k))
        block_n = min(n, max(256, entries // max(m, 1)))
        block_m = max(1, min(m, entries // block_n))  # (a dask chunk may hold no rows)
        tasks = [
            (slice(i, min(i + block_n, n)), slice(j, min(j + block_m, m)))
            for i in range(0, n, block_n)
            for j in range(0, m, block_m)
        ]
        W, b = self.split(theta)
        # Each block of rows' weighted label sums (_label_sums), formed once for all its
        # blocks of points.
        sums = {}
        for _, cols in tasks:
            if cols.start not in sums:
                sums[cols.start] = _label_sums(
                    self.X[cols], self.y[cols], self.sample_weight[cols], k
                )
        args = [
            (self.X[cols], self.sample_weight[cols], sums[cols.start], W[rows], b[rows], single)
            for rows, cols in tasks
        ]
        if max(1, effective_n_jobs(self.n_jobs)) > 1 and len(tasks) > 1:
            parts = Parallel(n_jobs=self.n_jobs, prefer="threads")(
                delayed(_block_log_likelihood)(*a) for a in args
            )
        else:  # on the fit's worker threads (one BLAS thread each), if it has them
            parts = map_blocks(lambda a: _block_log_likelihood(*a), args)
        out = np.zeros(n)
        for (rows, _), part in zip(tasks, parts, strict=True):
            out[rows] += part
        return out

    def log_density(self, theta: np.ndarray) -> np.ndarray:
        """Unnormalized log-posterior ``log p(θ)`` of the rows of ``theta`` (N, dim)."""
        theta = np.atleast_2d(np.asarray(theta, dtype=float))
        return self.log_likelihood(theta) + self.log_prior(theta)

    __call__ = log_density

    # --- one parameter vector: what Newton's method needs -------------------------------

    def probabilities(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """``(Σ_i s_i log softmax(f_i)[y_i], P)`` at one θ, with P (M, K) the softmax of the
        latent values."""
        W, b = self.split(theta)
        f = np.asarray(self.X @ W.T) + b
        f -= f.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(f).sum(axis=1))
        log_lik = float(self.sample_weight @ (f[np.arange(len(f)), self.y] - log_norm))
        f -= log_norm[:, None]
        np.exp(f, out=f)
        return log_lik, f

    def value_gradient_hessian(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``log p(θ)``, its gradient and the negative Hessian (PD) at one point.

        The negative Hessian of the likelihood is ``Σ_i s_i (diag p_i − p_i p_iᵀ) ⊗ x̃_i x̃_iᵀ``
        (``x̃ = [x, 1]``), formed by :meth:`hessian` as K(K + 1)/2 weighted Gram matrices.
        """
        theta = np.asarray(theta, dtype=float)
        log_lik, P = self.probabilities(theta)
        return add_prior(self, theta, log_lik, self.gradient(P), self.hessian(P))

    def gradient(self, P: np.ndarray) -> np.ndarray:
        """Gradient of the log-likelihood given the probabilities ``P`` (M, K)."""
        residual = -P * self.sample_weight[:, None]
        residual[np.arange(len(P)), self.y] += self.sample_weight
        return self.to_vector(self.latent_transpose(residual))

    def hessian(self, P: np.ndarray) -> np.ndarray:
        """Negative Hessian of the log-likelihood (dim × dim) given ``P`` (M, K).

        Block (k, l) is ``X̃ᵀ diag(s (δ_kl p_k − p_k p_l)) X̃`` (:meth:`latent_gram`).
        """
        # The curvatures' K(K + 1)/2 distinct entries of each row, formed as such: the
        # (M, K, K) matrices and their gather cost three times the Gram products at 26
        # classes × 5000 rows. The same bits as the full matrices' entries.
        first, second = triu_indices(self.n_classes)
        s = self.sample_weight[:, None]
        on_diagonal = np.flatnonzero(first == second)

        def curvatures(rows: slice) -> np.ndarray:
            pairs = _outer_pairs(P[rows])
            pairs *= s[rows]
            np.negative(pairs, out=pairs)
            pairs[:, on_diagonal] += s[rows] * P[rows]
            return pairs

        distinct = self.n_classes >= MANY_CLASSES
        # Many classes: the curvatures formed in the Gram's own row blocks, side by side
        # (the same products of each row): formed whole first, a serial fifth of a
        # Hessian's time at 26 classes × 5000 rows.
        pairs = curvatures if distinct else curvatures(slice(None))
        by_pairs = distinct or self._distinct_cheaper(len(first))
        hess = self.to_layout(self._pair_gram(pairs, self.n_classes, by_pairs))
        hess += hess.T  # exactly symmetric (the products' round-off is not)
        hess *= 0.5
        return hess

    def _distinct_cheaper(self, n_pairs: int) -> bool:
        """Whether Newton's Hessian below :data:`MANY_CLASSES` takes the dense rows'
        distinct products (:data:`_DISTINCT_CLASSES`, :data:`_PRODUCT_COST`)."""
        if sp.issparse(self.X) or self.n_classes < _DISTINCT_CLASSES:
            return False
        width = self.n_features + int(self.fit_intercept)
        return n_pairs * (width + 2.0 * _PRODUCT_COST) > _PRODUCT_COST * width

    def pair_products(self) -> np.ndarray | None:
        """The distinct products ``x̃_j x̃_l`` (j ≤ l) of every dense row, (M, w(w + 1)/2),
        formed on first use and kept where they take at most :data:`_PRODUCTS_SHARE` of a
        block's bytes (:func:`~vsbayes._memory.block_bytes`); else None (sparse rows, or too
        many: the passes form them block by block).

        A multinomial fit reads them a dozen times and more (Newton's Hessians, EP's
        posteriors and the rows' latent moments, :func:`~vsbayes.models.latent.row_moments`
        by pairs): gathering them anew was a fifth of each of those products' time."""
        if self._products is None and self.kept_products_bytes():
            self._products = _pair_columns(self.design_rows(slice(None)))
        return self._products

    def kept_products_bytes(self) -> float:
        """Bytes of the rows' pair products that :meth:`pair_products` keeps (0: none)."""
        if sp.issparse(self.X):
            return 0.0
        width = self.n_features + int(self.fit_intercept)
        nbytes = 8.0 * self.n_observations * (width * (width + 1) // 2)
        return nbytes if nbytes <= _PRODUCTS_SHARE * block_bytes() else 0.0

    def latent_gram(self, weights: np.ndarray, *, distinct: bool | None = False) -> np.ndarray:
        """``Σ_i weights_i[a, c] x̃_i x̃_iᵀ`` for symmetric (M, r, r) weights: (r, r, w, w).

        ``x̃ = [x, 1]`` with an intercept (w = d + 1), else ``x``. With r = K and the
        softmax's curvature as weights, the blocks of the Hessian; with other r, the
        precision of any Gaussian factors on linear maps ``B x̃_i`` of the rows (expectation
        propagation's sites). Dense rows: one product per block of rows over the r(r + 1)/2
        pairs; rows are taken in blocks of :func:`~vsbayes._memory.block_length`.
        ``distinct``: dense rows' products over the w(w + 1)/2 distinct entries of their
        outer products (half the work; the same numbers to round-off, symmetric blocks);
        None: where they are the cheaper, as for Newton's Hessian (:meth:`hessian`).
        """
        weights = np.asarray(weights, dtype=float)
        r = weights.shape[1]
        first, second = triu_indices(r)
        if distinct is None:
            distinct = self._distinct_cheaper(len(first))
        if distinct and not sp.issparse(self.X):
            # The upper triangles gathered in the Gram's own row blocks, side by side (the
            # same values and layout a block's): gathered whole, a serial third of the
            # product's time at 26 classes.
            return self._pair_gram(weights, r, distinct)
        return self._pair_gram(weights[:, first, second], r, distinct)

    def _pair_gram(self, pairs, r: int, distinct: bool = False) -> np.ndarray:
        """:meth:`latent_gram` from the weights' upper triangles (M, r(r + 1)/2), row-major
        (or, for :meth:`_outer_gram` with ``distinct``, the weights (M, r, r) themselves, or
        a function of a slice of rows giving their upper triangles)."""
        width = self.n_features + int(self.fit_intercept)
        first, second = triu_indices(r)
        sparse = sp.issparse(self.X)
        # ``distinct``: the rows' distinct products halve the GEMM whatever the width (10
        # classes × 65 columns, EP's 45 pairs: 22 → 15 ms on one thread).
        outer = not sparse and (distinct or width < len(first))
        if callable(pairs) and not (outer and distinct):  # only those blocks take a function
            pairs = pairs(slice(None))
        if outer:
            grams = self._outer_gram(pairs, width, distinct, r)
        else:
            grams = self._copies_gram(pairs, width, sparse)
        blocks = np.empty((r, r, width, width))
        blocks[first, second] = grams
        blocks[second, first] = grams.transpose(0, 2, 1)
        return blocks

    def _outer_gram(self, pairs: np.ndarray, width: int, distinct: bool, r: int) -> np.ndarray:
        """The (pairs, w, w) Gram matrices as ``pairsᵀ @ [x̃_i x̃_iᵀ]``: one GEMM per block
        of rows on the rows' outer products (w² a row: fewer temporaries than the weighted
        copies' w per pair where the pairs outnumber the columns, i.e. many classes);
        ``distinct``: on their w(w + 1)/2 distinct entries, half the GEMM (the full one's
        (j, l) and (l, j) columns are the same products, which its round-off may sum
        apart)."""
        col_j, col_l = triu_indices(width)
        rows_per_block = block_length(8.0 * width * (width + 1))
        if not distinct:
            out = np.zeros((pairs.shape[1], width * width))
            for start in range(0, self.n_observations, rows_per_block):
                rows = slice(start, start + rows_per_block)
                x = self.design_rows(rows)
                outer = (x[:, :, None] * x[:, None, :]).reshape(x.shape[0], -1)
                out += pairs[rows].T @ outer
            return out.reshape(-1, width, width)

        products = self.pair_products()
        first, second = triu_indices(r)

        def block(rows: slice) -> np.ndarray:
            # Weights (M, r, r): their upper triangles, gathered here.
            if callable(pairs):
                weights = pairs(rows)
            else:
                weights = pairs[rows] if pairs.ndim == 2 else pairs[rows][:, first, second]
            if products is not None:  # the same products, formed once
                return weights.T @ products[rows]
            return weights.T @ _pair_columns(self.design_rows(rows))

        # Row blocks summed in order (sum_blocks: the same bits on any number of threads),
        # side by side: the fit runs BLAS on one thread, and this product was a serial
        # tenth of a 26-class fit. Blocks of 2²² multiply-adds at least, and of an eighth
        # of the product where that is more: a block's GEMM writes its whole output
        # (pairs × w(w + 1)/2), and at 26 classes × 5000 rows the 64 blocks of 2²² took as
        # long on two threads as on one (20 ms a Hessian), 8 blocks 10 ms.
        n_pairs = len(first)
        work = n_pairs * len(col_j)
        least = max(2.0**22, self.n_observations * work / _GRAM_BLOCKS)
        slices = block_slices(self.n_observations, work, rows_per_block, least)
        with single_blas_thread():
            out = sum_blocks(block, slices)
        grams = np.empty((n_pairs, width, width))
        grams[:, col_j, col_l] = out
        grams[:, col_l, col_j] = out
        return grams

    def _copies_gram(self, pairs: np.ndarray, width: int, sparse: bool) -> np.ndarray:
        """The (pairs, w, w) Gram matrices as ``X̃ᵀ [weighted copies of X̃]``."""
        n_pairs = pairs.shape[1]
        flat = np.zeros((width, width * n_pairs))
        # Per row: its weighted copies, one per pair, and the row itself.
        rows_per_block = block_length(8.0 * width * (n_pairs + 2))
        for start in range(0, self.n_observations, rows_per_block):
            rows = slice(start, start + rows_per_block)
            x = self.design_rows(rows)
            if sparse:
                for j in range(n_pairs):
                    gram = (x.T @ x.multiply(pairs[rows, j][:, None]).tocsr()).toarray()
                    flat[:, j * width : (j + 1) * width] += gram
            else:
                # Written row-major: the product's own layout follows the pairs' (column-
                # major from _outer_pairs), and its reshape then copied the copies once more
                # (as long as forming them). The same products, the same bits.
                copies = np.empty((x.shape[0], n_pairs, width))
                np.multiply(x[:, None, :], pairs[rows, :, None], out=copies)
                flat += x.T @ copies.reshape(x.shape[0], -1)  # one GEMM
        return flat.reshape(width, n_pairs, width).transpose(1, 0, 2)

    def latent_transpose(self, residual: np.ndarray) -> np.ndarray:
        """``Σ_i residual_i x̃_iᵀ`` for (M, r) residuals: (r, w), the linear term of factors
        on ``B x̃_i`` (with r = K and the softmax's residuals, the gradient)."""
        parts = [np.asarray(self.X.T @ residual).T]
        if self.fit_intercept:
            parts.append(residual.sum(axis=0)[:, None])
        return np.hstack(parts)

    def design_rows(self, rows: slice):
        """The rows ``x̃ = [x, 1]`` (or ``x`` without an intercept), dense or CSR."""
        x = self.X[rows]
        if not self.fit_intercept:
            return x
        ones = np.ones((x.shape[0], 1))
        return sp.hstack([x, ones], format="csr") if sp.issparse(x) else np.hstack([x, ones])

    def to_vector(self, matrix: np.ndarray) -> np.ndarray:
        """θ (dim,) from the (K, w) matrix whose rows are ``[w_k, b_k]`` (or ``w_k``)."""
        d = self.n_features
        parts = [matrix[:, :d].ravel()] + ([matrix[:, d]] if self.fit_intercept else [])
        return np.concatenate(parts)

    def to_layout(self, blocks: np.ndarray) -> np.ndarray:
        """The (K, K, w, w) blocks over ``[w_k, b_k]`` as a (dim, dim) matrix in θ's layout."""
        k, d = self.n_classes, self.n_features
        # Index in θ of (class, column): coefficients class-major, then the intercepts.
        index = np.arange(k)[:, None] * d + np.arange(d)[None, :]
        if self.fit_intercept:
            index = np.hstack([index, k * d + np.arange(k)[:, None]])
        flat = index.ravel()
        out = np.empty((self.dim, self.dim))
        out[np.ix_(flat, flat)] = blocks.transpose(0, 2, 1, 3).reshape(self.dim, self.dim)
        return out


#: Blocks of :meth:`SoftmaxGLMPosterior._outer_gram`'s product where each still has 2²²
#: multiply-adds: enough to keep two threads busy under another process's load, few enough
#: that each block's GEMM is not bound by writing its output.
_GRAM_BLOCKS = 8


def _outer_pairs(P: np.ndarray) -> np.ndarray:
    """``P[:, j] * P[:, l]`` for j ≤ l (M, K(K + 1)/2), in the order of ``triu_indices``,
    by K column slices (the same products as the gathered columns', without the gathers:
    a third of Newton's Hessian at 26 classes), column-major as theirs (the same bits)."""
    m, k = P.shape
    out = np.empty((m, k * (k + 1) // 2), order="F")
    at = 0
    for j in range(k):
        np.multiply(P[:, j : j + 1], P[:, j:], out=out[:, at : at + k - j])
        at += k - j
    return out


def _block_log_likelihood(X, weights, label_sums, W, b, single=False) -> np.ndarray:
    """``Σ_i s_i log softmax(W x_i + b)[y_i]`` over one block of rows, for each point.

    The softmax depends only on the latent values' differences: with the last class's as
    the reference, ``h_j = f_j − f_K`` (K − 1 classes, one GEMM) and
    ``log softmax(f)[y] = h_y − log(1 + Σ_j exp(h_j))`` (``h_K = 0``). That needs neither
    the running maximum nor the K-th class's exponentials of the max-shifted form (wine's
    pass 0.6× its time); where a sum of exponentials overflows (a difference beyond ~709),
    the block takes the max-shifted form. The values are laid out class-major, (rows,
    K − 1, points): the sums run over K − 1 contiguous (rows, points) slices, where a
    reduction over a short last axis would cost numpy several times more (wine: 3×).

    ``Σ_i s_i h_{y_i}`` is linear in the point: the rows' weighted sums per class
    (``label_sums``, :func:`_label_sums`) against each point's differences, not a gather
    of the (rows, points) values; and ``log`` of the total that holds the 1 (libm's
    ``log1p`` took 1.4× its time). Both differ from the per-row form by round-off; the
    max-shifted form (overflow) takes the labels from ``label_sums`` too.

    ``single``: the GEMM's inputs rounded to float32 and the values, their exponentials
    and logarithms in float32 (wine's block of 490 points: 0.50 → 0.30 ms); a block whose
    sums overflow float32 (a difference beyond ~88) is done again in float64."""
    h, relative = _latent_differences(X, W, b, np.float32 if single else np.float64)
    with np.errstate(over="ignore"):
        np.exp(h, out=h)
        total = h[:, 0, :] + 1.0
        for j in range(1, h.shape[1]):
            total += h[:, j, :]
    if not np.isfinite(total).all():
        if single:
            return _block_log_likelihood(X, weights, label_sums, W, b)
        h, _ = _latent_differences(X, W, b)
        return np.einsum("jc,jnc->n", label_sums, relative) - _shifted_log_totals(h, weights)
    np.log(total, out=total)
    return np.einsum("jc,jnc->n", label_sums, relative) - weights @ total


def _label_sums(X, y, weights, k) -> np.ndarray:
    """``Σ_{i: y_i = j} s_i x̃_i`` for the first K − 1 classes j, (K − 1, d + 1) with
    ``x̃ = [x, 1]``: the weighted rows of each class."""
    onehot = np.zeros((len(y), k - 1))
    labelled = y < k - 1
    onehot[np.flatnonzero(labelled), y[labelled]] = weights[labelled]
    sums = np.empty((k - 1, X.shape[1] + 1))
    sums[:, :-1] = np.asarray(X.T @ onehot).T
    sums[:, -1] = onehot.sum(axis=0)
    return sums


def _latent_differences(X, W, b, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """``f_j − f_K`` for the first K − 1 classes: (rows, K − 1, points), one GEMM in
    ``dtype``; and the points' differences ``[w_j − w_K, b_j − b_K]`` themselves, (K − 1,
    points, d + 1), in float64.

    A dense block's intercepts ride in the GEMM as a column of ones (their pass over the
    values cost wine's block 0.4× the GEMM's time); a sparse one adds them after."""
    n, k, d = W.shape
    relative = np.empty((k - 1, n, d + 1))
    np.subtract(W[:, :-1, :].transpose(1, 0, 2), W[:, -1, :], out=relative[..., :d])
    np.subtract(b[:, :-1].T, b[:, -1], out=relative[..., d])
    flat = relative.reshape((k - 1) * n, d + 1).astype(dtype, copy=False)
    if sp.issparse(X):
        h = np.asarray(X.astype(dtype, copy=False) @ flat[:, :d].T).reshape(-1, k - 1, n)
        h += relative[..., d].astype(dtype, copy=False)
        return h, relative
    m = X.shape[0]
    design = np.empty((m, d + 1), dtype)
    design[:, :d] = X
    design[:, d] = 1.0
    return (design @ flat.T).reshape(m, k - 1, n), relative


def _shifted_log_totals(h, weights) -> np.ndarray:
    """``Σ_i s_i log(1 + Σ_j exp(h_ij))`` for each point, from the differences ``h`` (rows,
    K − 1, points) by the max-shifted log-sum-exp: every exponential at most 1, for any
    ``h`` (the blocks where :func:`_block_log_likelihood`'s sums overflow)."""
    top = np.maximum(h.max(axis=1), 0.0)  # (rows, points), with h_K = 0
    h -= top[:, None, :]
    np.exp(h, out=h)
    total = np.exp(-top)
    for j in range(h.shape[1]):
        total += h[:, j, :]
    np.log(total, out=total)
    total += top
    return weights @ total
