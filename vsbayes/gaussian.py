"""Unnormalized Gaussian densities: the one home of vsbayes' Gaussian algebra.

An unnormalized Gaussian is ``q(x) = exp(log_Z) N(x; mean, cov)``. In natural parameters,
``log q(x) = c + eta @ x - x @ precision @ x / 2``. Every result of the engine (VS, IS, BMC,
Laplace) is a :class:`Gaussian`; the error measure of the paper, :func:`excess_kl`, compares
two of them.
"""

from __future__ import annotations

import copy
import math
import operator
from typing import NamedTuple

import numpy as np

from ._lapack import cho_solve, solve_triangular
from ._linalg import thin_qr
from ._memory import block_length, check_memory
from ._random import as_generator
from .exceptions import NotPositiveDefiniteError

__all__ = [
    "CentredStructuredCovariance",
    "Gaussian",
    "NaturalParameters",
    "StructuredCovariance",
    "StructuredCovariances",
    "StructuredGaussian",
    "excess_kl",
    "kl_divergence",
]

_LOG_2PI = math.log(2.0 * math.pi)


class NaturalParameters(NamedTuple):
    """Natural parameters of ``log q(x) = c + eta @ x - x @ precision @ x / 2``."""

    precision: np.ndarray
    eta: np.ndarray
    c: float


def lower_cholesky(matrix: np.ndarray, what: str) -> np.ndarray:
    """Lower Cholesky factor; NotPositiveDefiniteError naming `what` if there is none."""
    try:
        return np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        raise NotPositiveDefiniteError(
            f"The {what} matrix is not positive definite, so it does not define a Gaussian."
        ) from None


def _symmetrize(matrix: np.ndarray, block_entries: int = 2**22) -> float:
    """Replace a square matrix by ``(A + Aᵀ)/2`` in place and return ``max |A - Aᵀ|``, in
    blocks of rows whose temporaries hold about ``block_entries`` (32 MiB) each: a
    5,000-dimensional covariance is 200 MB, and each whole-matrix temporary as much again."""
    d = matrix.shape[0]
    if _exactly_symmetric(matrix):  # (then (A + Aᵀ)/2 = A bitwise: nothing to change)
        return 0.0
    step = max(1, block_entries // max(d, 1))
    if d <= step:  # one block (most covariances): the loop's slicing is most of its cost
        # The transpose copied once: the difference and the sum then run on contiguous
        # operands (each strided pass over the transposed view cost as much as the copy).
        transposed = matrix.T.copy()
        difference = matrix - transposed
        np.abs(difference, out=difference)
        matrix += transposed
        matrix *= 0.5  # (exactly symmetric: a + b = b + a)
        return float(difference.max(initial=0.0))
    asymmetry = 0.0
    for start in range(0, d, step):
        rows = slice(start, min(start + step, d))
        upper, lower = matrix[rows, start:], matrix[start:, rows].T
        difference = upper - lower
        np.abs(difference, out=difference)
        asymmetry = max(asymmetry, float(difference.max(initial=0.0)))
        average = upper + lower
        average *= 0.5
        matrix[rows, start:] = average
        matrix[start:, rows] = average.T
    return asymmetry


def _exactly_symmetric(matrix: np.ndarray, tile: int = 256) -> bool:
    """Whether ``A = Aᵀ`` bitwise, by tiles that fit in cache (each compared with its
    mirror's transpose; the first difference stops it): a covariance formed symmetric
    (mirrored from one triangle, D-202) is checked in one pass, where the arithmetic of
    :func:`_symmetrize` took six and a transposed copy (2 s of a 4503² one's fit)."""
    d = matrix.shape[0]
    for start in range(0, d, tile):
        rows = slice(start, start + tile)
        for other in range(start, d, tile):
            columns = slice(other, other + tile)
            if not np.array_equal(matrix[rows, columns], matrix[columns, rows].T):
                return False
    return True


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


class Gaussian:
    """Unnormalized Gaussian density ``q(x) = exp(log_Z) N(x; mean, cov)``.

    Parameters
    ----------
    mean : array-like of shape (d,)
        Mean vector.
    cov : array-like of shape (d, d), or callable
        Symmetric positive-definite covariance matrix, or a function of no arguments
        returning it: then it is computed and checked (finite, symmetric) on first use, and
        factorized on first use of its factor (:attr:`chol`: draws, densities, the
        log-determinant, the precision) — for a covariance that is costly to form and
        often not needed, e.g. the inverse of a large Hessian whose mean alone is used, or
        whose factor a fit does not need (a dense multinomial posterior: its p³/3
        factorization was most of a wide fit, D-202). The function must return a positive
        definite matrix by its construction (the inverse of a factorized precision, or a
        Woodbury form of one): a failure shows as NotPositiveDefiniteError when the factor
        is first needed.
    log_Z : float, default=0.0
        Logarithm of the total mass ``Z = ∫ q(x) dx``; 0 gives a probability density.

    Raises
    ------
    ValueError
        If shapes disagree or values are not finite.
    NotPositiveDefiniteError
        If ``cov`` is not symmetric positive definite.

    Examples
    --------
    >>> import numpy as np
    >>> from vsbayes import Gaussian
    >>> g = Gaussian(mean=[0.0, 1.0], cov=np.eye(2), log_Z=2.0)
    >>> round(float(g.log_density(np.array([0.0, 1.0]))), 4)
    0.1621
    """

    def __init__(self, mean, cov, log_Z: float = 0.0):
        mean = np.array(mean, dtype=float, ndmin=1)
        if mean.ndim != 1:
            raise ValueError(f"mean must be a 1-D array, got shape {mean.shape}.")
        log_Z = float(log_Z)
        if not (np.isfinite(mean).all() and math.isfinite(log_Z)):
            raise ValueError("mean, cov and log_Z must be finite.")
        self._mean = _readonly(mean)
        self._log_Z = log_Z
        self._precision = None
        self._cov = self._chol = None
        if callable(cov):
            self._pending_cov = cov
        else:
            self._set_cov(cov)

    def _set_cov(self, cov, factorize: bool = True) -> None:
        """Check, symmetrize and (``factorize``) factorize the covariance."""
        cov = np.array(cov, dtype=float, ndmin=2)
        d = self.dim
        if cov.shape != (d, d):
            raise ValueError(f"cov must have shape ({d}, {d}) to match mean, got {cov.shape}.")
        # (Both extremes are finite exactly when every entry is: NaN propagates to them.)
        top, bottom = float(cov.max(initial=0.0)), float(cov.min(initial=0.0))
        if not (math.isfinite(top) and math.isfinite(bottom)):
            raise ValueError("mean, cov and log_Z must be finite.")
        largest = max(top, -bottom)
        asymmetry = _symmetrize(cov)
        if asymmetry > 1e-8 * largest:
            raise NotPositiveDefiniteError(
                f"cov is not symmetric (max |cov - cov.T| = {asymmetry:.3g})."
            )
        if factorize:
            self._chol = _readonly(lower_cholesky(cov, "covariance"))
        self._cov = _readonly(cov)
        self._pending_cov = None

    def _formed(self) -> None:
        """The covariance given as a function: computed and checked, not factorized."""
        if self._cov is None:
            self._set_cov(self._pending_cov(), factorize=False)

    def _factorized(self) -> None:
        if self._chol is None:
            self._formed()
            self._chol = _readonly(lower_cholesky(self._cov, "covariance"))

    # -- basic attributes --------------------------------------------------------------
    @property
    def mean(self) -> np.ndarray:
        """Mean vector, shape (d,)."""
        return self._mean

    @property
    def cov(self) -> np.ndarray:
        """Covariance matrix, shape (d, d)."""
        self._formed()
        return self._cov

    @property
    def var(self) -> np.ndarray:
        """The marginal variances, the covariance's diagonal, shape (d,)."""
        return np.diag(self.cov).copy()

    @property
    def pending_cov(self):
        """The function that forms the covariance (given as one), until it is formed; else
        None."""
        return self._pending_cov

    @property
    def log_Z(self) -> float:
        """Log of the total mass ``∫ q(x) dx``."""
        return self._log_Z

    @property
    def dim(self) -> int:
        """Dimension d."""
        return self._mean.shape[0]

    @property
    def chol(self) -> np.ndarray:
        """Lower Cholesky factor L of the covariance, ``cov = L @ L.T``."""
        self._factorized()
        return self._chol

    @property
    def precision(self) -> np.ndarray:
        """Inverse covariance, computed from the Cholesky factor."""
        if self._precision is None:
            identity = np.eye(self.dim)
            self._precision = _readonly(cho_solve((self.chol, True), identity, check_finite=False))
        return self._precision

    @property
    def log_det_cov(self) -> float:
        """Log-determinant of the covariance."""
        return 2.0 * float(np.log(np.diag(self.chol)).sum())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, log_Z={self.log_Z:.6g})"

    # -- coordinates and densities ---------------------------------------------------
    def whiten(self, x) -> np.ndarray:
        """Map points (rows) to coordinates in which this Gaussian is N(0, I)."""
        x = np.asarray(x, dtype=float)
        return solve_triangular(self.chol, (x - self._mean).T, lower=True).T

    def unwhiten(self, z) -> np.ndarray:
        """Inverse of :meth:`whiten`: ``mean + z @ chol.T``."""
        x = np.asarray(z, dtype=float) @ self.chol.T
        x += self._mean  # in place: a second (N, d) array costs as much as the product
        return x

    def logpdf(self, x) -> np.ndarray:
        """Log of the normalized density N(x; mean, cov) at points x of shape (N, d) or (d,)."""
        z = self.whiten(x)
        return -0.5 * np.square(z).sum(axis=-1) - 0.5 * (self.dim * _LOG_2PI + self.log_det_cov)

    def log_density(self, x) -> np.ndarray:
        """Log of the unnormalized density ``log_Z + logpdf(x)``."""
        return self._log_Z + self.logpdf(x)

    def sample(self, n_samples: int, random_state=None) -> np.ndarray:
        """Draw ``n_samples`` points (rows) from the normalized Gaussian, via the Cholesky factor.

        Parameters
        ----------
        n_samples : int
            Number of draws.
        random_state : int, RandomState, Generator or None
            Seed or generator.
        """
        rng = as_generator(random_state)
        return self.unwhiten(rng.standard_normal((int(n_samples), self.dim)))

    def with_moments(self, mean, cov) -> Gaussian:
        """A copy of the same class, ``log_Z`` and attributes (e.g. a result's diagnostics),
        with another mean and covariance (checked and factorized as in the constructor)."""
        changed = copy.copy(self)
        Gaussian.__init__(changed, mean, cov, self.log_Z)
        return changed

    def with_log_Z(self, log_Z: float) -> Gaussian:
        """A copy of the same class and attributes with another ``log_Z``: the covariance
        (formed, or still to be) and its factor shared, not formed here."""
        log_Z = float(log_Z)
        if not math.isfinite(log_Z):
            raise ValueError("mean, cov and log_Z must be finite.")
        changed = copy.copy(self)
        changed._log_Z = log_Z
        return changed

    def scale_cov(self, factor: float) -> Gaussian:
        """The same Gaussian with its covariance multiplied by ``factor`` (mass unchanged)."""
        return Gaussian(self._mean, float(factor) * self.cov, self._log_Z)

    # -- natural parameters ----------------------------------------------------------
    def natural_parameters(self) -> NaturalParameters:
        """Natural parameters such that ``log q(x) = c + eta @ x - x @ precision @ x / 2``."""
        eta = cho_solve((self.chol, True), self._mean, check_finite=False)
        c = self._log_Z - 0.5 * (self._mean @ eta) - 0.5 * (self.dim * _LOG_2PI + self.log_det_cov)
        return NaturalParameters(self.precision.copy(), eta, float(c))

    @classmethod
    def from_natural(cls, precision, eta, c: float) -> Gaussian:
        """Build the Gaussian ``exp(c + eta @ x - x @ precision @ x / 2)``.

        Raises
        ------
        NotPositiveDefiniteError
            If ``precision`` is not positive definite: the exponential quadratic then has
            no finite integral.
        """
        precision = np.asarray(precision, dtype=float)
        precision = 0.5 * (precision + precision.T)
        lower = lower_cholesky(precision, "precision")
        cov = cho_solve((lower, True), np.eye(precision.shape[0]), check_finite=False)
        mean = cho_solve((lower, True), np.asarray(eta, dtype=float), check_finite=False)
        d = mean.shape[0]
        log_Z = c + 0.5 * (eta @ mean) + 0.5 * d * _LOG_2PI - float(np.log(np.diag(lower)).sum())
        return cls(mean, cov, log_Z)

    def natural_differential(self, d_mass, d_first, d_second) -> NaturalParameters:
        """Change of natural parameters caused by a small change of the raw moments.

        The raw moments of q are ``Z``, ``∫ q x`` and ``∫ q x xᵀ``. Their perturbations are
        given *per unit mass* (divided by Z) so that no ``exp(log_Z)`` is ever formed. This
        is the inverse Fisher information applied to a moment-space vector, i.e. the
        natural gradient of the exponential family, in closed form and O(d³).

        Parameters
        ----------
        d_mass : float
            Change of Z, divided by Z.
        d_first : ndarray of shape (d,)
            Change of ``∫ q x``, divided by Z.
        d_second : ndarray of shape (d, d) or (d,)
            Change of ``∫ q x xᵀ`` divided by Z; a 1-D array means only the diagonal
            (the diagonal family, for which this Gaussian must have a diagonal covariance).

        Returns
        -------
        NaturalParameters
            ``(d_precision, d_eta, d_c)``; ``d_precision`` is 1-D in the diagonal case.
        """
        mu = self._mean
        d_mu = d_first - mu * d_mass
        if np.ndim(d_second) == 1:
            s = np.diag(self.cov)
            d_s = d_second - (s + mu * mu) * d_mass - 2.0 * mu * d_mu
            d_prec = -d_s / (s * s)
            d_eta = d_prec * mu + d_mu / s
            d_c = d_mass - d_mu @ (mu / s) - 0.5 * (d_prec @ (mu * mu)) - 0.5 * (d_s / s).sum()
            return NaturalParameters(d_prec, d_eta, float(d_c))
        prec = self.precision
        d_cov = d_second - (self.cov + np.outer(mu, mu)) * d_mass
        d_cov -= np.outer(d_mu, mu) + np.outer(mu, d_mu)
        d_prec = -prec @ d_cov @ prec
        eta = prec @ mu
        d_eta = d_prec @ mu + prec @ d_mu
        d_c = d_mass - d_mu @ eta - 0.5 * (mu @ d_prec @ mu) - 0.5 * np.sum(prec * d_cov)
        return NaturalParameters(0.5 * (d_prec + d_prec.T), d_eta, float(d_c))


def kl_divergence(p: Gaussian, q: Gaussian) -> float:
    """KL divergence between the *normalized* Gaussians, ``KL(N_p || N_q)``.

    Computed with Cholesky solves only.
    """
    if p.dim != q.dim:
        raise ValueError(f"Dimensions differ: {p.dim} and {q.dim}.")
    a = solve_triangular(q.chol, p.chol, lower=True)
    b = solve_triangular(q.chol, p.mean - q.mean, lower=True)
    return 0.5 * float(np.square(a).sum() + b @ b - p.dim + q.log_det_cov - p.log_det_cov)


def excess_kl(q_star: Gaussian, q_hat: Gaussian) -> float:
    """The paper's error measure: generalized KL ``D(q* || q̂)`` divided by ``Z*``.

    ``D(q*||q̂)/Z* = KL(N*||N̂) + r - 1 - log r`` with ``r = Ẑ/Z*``. It vanishes only when
    the normalizing constant, mean and covariance all agree. Computed in the log domain;
    returns ``inf`` (without a warning) when ``log r > 709``.

    Parameters
    ----------
    q_star : Gaussian
        The reference (e.g. the exact moment-matched Gaussian of the target).
    q_hat : Gaussian
        The estimate.

    Returns
    -------
    float
    """
    log_r = q_hat.log_Z - q_star.log_Z
    mass_term = math.inf if log_r > 709.0 else math.expm1(log_r) - log_r
    return kl_divergence(q_star, q_hat) + mass_term


# --- Structured covariances: diagonal plus low rank -----------------------------------------


class StructuredCovariance:
    """A covariance ``Σ = diag(diagonal) + U K Uᵀ`` that is never a dense p × p matrix
    unless asked for (``U`` p × r, ``K`` symmetric r × r, r ≪ p).

    It is the ``sigma_`` of a posterior fitted with a structured covariance: it has the
    operations users read from a covariance — :meth:`diagonal` (marginal variances),
    :meth:`dot`, the factors that the rows' latent variances ``xᵀΣx`` are computed from
    (sparse rows never densified: :class:`vsbayes.models.latent.StructuredLatents`) — and
    converts to a dense array (``np.asarray(sigma_)``, :meth:`toarray`) only when the
    p × p matrix fits the memory limit (:func:`vsbayes.config_context`); otherwise a
    :class:`~vsbayes.exceptions.MemoryLimitError` says what to use instead.

    Parameters
    ----------
    diagonal : ndarray of shape (p,)
        The diagonal part (> 0).
    factor : ndarray of shape (p, r)
        ``U``.
    core : ndarray of shape (r, r)
        ``K``, symmetric (not necessarily definite: ``Σ`` is).
    structure : str, default="lowrank"
        Its name ("dual": exact; "lowrank", "diagonal": approximate), for the messages.
    """

    def __init__(self, diagonal, factor, core, structure: str = "lowrank"):
        self.diagonal_part = _readonly(np.asarray(diagonal, dtype=float))
        self.factor = _readonly(np.asarray(factor, dtype=float).reshape(len(diagonal), -1))
        rank = self.factor.shape[1]
        core = np.asarray(core, dtype=float).reshape(rank, rank)
        self.core = _readonly(0.5 * (core + core.T))
        self.structure = structure

    @property
    def shape(self) -> tuple[int, int]:
        """``(p, p)``, as a dense covariance's."""
        p = self.diagonal_part.shape[0]
        return (p, p)

    ndim = 2
    dtype = np.dtype(np.float64)

    @property
    def rank(self) -> int:
        """Columns of ``U``."""
        return self.factor.shape[1]

    def diagonal(self) -> np.ndarray:
        """The marginal variances ``diag(Σ)``, shape (p,), in O(p r²) on the first call (a
        new array each call)."""
        return self._once(
            "diagonal", lambda: self.diagonal_part + _quadratic_rows(self.factor, self.core)
        ).copy()

    # What every read of the posterior needs (the marginal variances, the square root's
    # orthonormal basis) is computed once per covariance, on first use: the covariance is
    # immutable (its arrays read-only), and a basis is a QR of a p × r matrix, as costly
    # as a large share of the fit at text scale. Not pickled: recomputed after loading.

    def _once(self, name: str, compute):
        """``compute()``, computed on the first call for ``name`` and kept."""
        reads = self.__dict__.setdefault("_reads", {})
        if name not in reads:
            value = compute()
            for array in value if isinstance(value, tuple) else (value,):
                if isinstance(array, np.ndarray):
                    _readonly(array)
            reads[name] = value
        return reads[name]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_reads", None)
        return state

    def eigen_factor(self) -> tuple[np.ndarray, np.ndarray]:
        """``(κ, U V)`` with ``K = V diag(κ) Vᵀ`` (κ of either sign: ``K`` is indefinite),
        so that ``vᵀ U K Uᵀ v = Σ_k κ_k ((U V)ᵀ v)_k²``: r products per row instead of r²
        (the rows' latent variances). O(p r²) on the first call, then kept: a "dual"
        posterior's r is its rows, and each prediction paid it again."""

        def compute():
            kappa, rotation = np.linalg.eigh(self.core)
            return kappa, self.factor @ rotation

        return self._once("eigen_factor", compute)

    def dot(self, v) -> np.ndarray:
        """``Σ v`` for ``v`` of shape (p,) or (p, k)."""
        v = np.asarray(v, dtype=float)
        diagonal = self.diagonal_part if v.ndim == 1 else self.diagonal_part[:, None]
        return diagonal * v + self.factor @ (self.core @ (self.factor.T @ v))

    def dense_bytes(self) -> float:
        """Bytes of the dense p × p matrix and its conversion's temporaries."""
        p = self.shape[0]
        return 8.0 * (p * p + 2 * p * self.rank)

    def toarray(self) -> np.ndarray:
        """The dense p × p matrix (a new array).

        Raises
        ------
        MemoryLimitError
            If it does not fit the memory limit; the message names what to use instead.
        """
        p = self.shape[0]
        check_memory(
            self.dense_bytes(),
            f"the dense {p} × {p} posterior covariance (sigma_ is a {self.structure} "
            f"structured covariance, diagonal plus rank {self.rank})",
            "Use what reads the structure instead: sigma_.diagonal() for the marginal "
            "variances, latent_mean_and_variance(X) for the rows' latent variances, "
            "sample_coef for draws, summary() for the intervals — or "
            "raise the memory_limit of vsbayes.config_context.",
        )
        dense = (self.factor @ self.core) @ self.factor.T
        dense[np.diag_indices(p)] += self.diagonal_part
        _symmetrize(dense)
        return dense

    def __array__(self, dtype=None, copy=None):
        dense = self.toarray()
        return dense if dtype is None else dense.astype(dtype, copy=False)

    def scaled(self, factor: float) -> StructuredCovariance:
        """``factor · Σ``, with the same structure."""
        return StructuredCovariance(
            factor * self.diagonal_part, self.factor, factor * self.core, self.structure
        )

    def _unit_root(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(δ^½, Q, M)`` with ``Σ = δ^½ (I + Q M Qᵀ) δ^½``, Q orthonormal (p × q) and M
        diagonal (as a vector) > −1: the thin QR of ``δ^{-½}U`` and the eigenvalues of
        ``R K Rᵀ``. Then ``Σ^½ = δ^½ (I + Q (√(1+M) − 1) Qᵀ)`` and
        ``log det Σ = Σ log δ + Σ log(1 + M)``, in O(p r²) on the first call (kept)."""
        return self._once("unit_root", self._compute_unit_root)

    def _compute_unit_root(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        root = np.sqrt(self.diagonal_part)
        if self.rank == 0:
            return root, np.zeros((root.size, 0)), np.zeros(0)
        # δ^{-½}U, factored in place into Q, and the kept basis Q V: two p × r arrays.
        self._check_basis_memory(2.0 * 8.0 * self.factor.size, f"{root.size} × {self.rank}")
        ortho, upper = thin_qr(self.factor / root[:, None], overwrite_a=True)
        inner = upper @ self.core @ upper.T
        values, vectors = np.linalg.eigh(0.5 * (inner + inner.T))
        # Σ is positive definite, so 1 + M > 0; round-off only can take it below.
        values = np.maximum(values, -1.0 + 1e-15)
        return root, ortho @ vectors, values

    def _check_basis_memory(self, nbytes: float, shape: str, which: str = "") -> None:
        """:func:`~vsbayes._memory.check_memory` for an orthonormal basis that the draws
        and ``log det Σ`` read (computed once and kept beside the factor)."""
        part = f"{which} part of " if which else ""
        check_memory(
            nbytes,
            f"the {shape} orthonormal basis of the {part}the {self.structure} structured "
            f"posterior covariance (diagonal plus rank {self.rank}), for its draws and "
            f"log-determinant",
            "The marginal variances (sigma_.diagonal()), the rows' latent variances and "
            "predict_proba do not need it. Refit with a smaller rank "
            "(vsbayes.config_context(covariance_rank=...), or covariance='diagonal'), or "
            "raise the memory_limit of vsbayes.config_context.",
        )

    def log_det(self) -> float:
        """``log det Σ`` in O(p r²)."""
        root, _, values = self._unit_root()
        return self._root_log_det(root, values)

    @staticmethod
    def _root_log_det(root: np.ndarray, values: np.ndarray) -> float:
        """``log det`` of ``δ^½ (I + Q M Qᵀ) δ^½`` from :meth:`_unit_root`'s δ^½ and M."""
        return 2.0 * float(np.log(root).sum()) + float(np.log1p(values).sum())

    def sample_normal(self, z: np.ndarray) -> np.ndarray:
        """``Σ^½ z`` for standard normal rows z (n, p): draws of N(0, Σ), in O(n p r)."""
        root, basis, values = self._unit_root()
        spread = z + ((z @ basis) * (np.sqrt(1.0 + values) - 1.0)) @ basis.T
        return spread * root

    def inverse_quadratic(self, rows) -> np.ndarray:
        """``xᵀ Σ⁻¹ x`` for each of ``rows`` x (n, p), in O(n p r), never a p × p matrix.

        From the square root of :meth:`sample_normal`, ``Σ = δ^½ (I + Q M Qᵀ) δ^½``:
        ``Σ⁻¹ = δ^{-½} (I − Q diag(M / (1 + M)) Qᵀ) δ^{-½}`` (Woodbury's identity), so
        ``xᵀ Σ⁻¹ x = |y|² − Σ_k M_k / (1 + M_k) (Qᵀ y)_k²`` with ``y = δ^{-½} x``. For a
        draw ``x = Σ^½ z`` it is ``|z|²``. In blocks of rows (a block's ``y``)."""
        rows = np.asarray(rows, dtype=float)
        root, basis, values = self._unit_root()
        shrink = values / (1.0 + values)
        out = np.empty(rows.shape[0])
        step = block_length(8.0 * (rows.shape[1] + basis.shape[1]))
        for start in range(0, rows.shape[0], step):
            white = rows[start : start + step] / root
            projected = white @ basis
            out[start : start + step] = (
                np.einsum("ij,ij->i", white, white) - (projected * projected) @ shrink
            )
        return out


class StructuredCovariances:
    """The covariances of one-vs-rest problems fitted with a structured covariance: one
    :class:`StructuredCovariance` per problem (class), never a dense (K, p, p) array unless
    asked for.

    It is the ``sigma_`` of a one-vs-rest fit beyond the dense size, as a
    :class:`StructuredCovariance` is a binary one's: ``sigma_[k]`` is class k's (its
    :meth:`~StructuredCovariance.diagonal`, :meth:`~StructuredCovariance.dot`, its
    factors), :meth:`diagonal` every class's marginal variances, and ``np.asarray(sigma_)``
    (:meth:`toarray`) the dense stack of a dense one-vs-rest fit's shape, only where it
    fits the memory limit; otherwise a :class:`~vsbayes.exceptions.MemoryLimitError` says
    what to use instead.

    Parameters
    ----------
    covariances : sequence of StructuredCovariance
        One per problem, of the same dimension.
    """

    ndim = 3
    dtype = np.dtype(np.float64)

    def __init__(self, covariances):
        self.covariances = tuple(covariances)
        sizes = {c.shape[0] for c in self.covariances}
        if len(sizes) != 1:
            raise ValueError(f"The covariances differ in dimension: {sorted(sizes)}.")

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(K, p, p)``, as a dense one-vs-rest fit's ``sigma_``."""
        return (len(self.covariances), *self.covariances[0].shape)

    def __len__(self) -> int:
        return len(self.covariances)

    def __getitem__(self, index):
        """Problem ``index``'s :class:`StructuredCovariance` (a slice, a sequence of
        problems' positions or a boolean mask over them: those problems')."""
        if isinstance(index, slice):
            return StructuredCovariances(self.covariances[index])
        try:
            return self.covariances[operator.index(index)]
        except TypeError:
            pass
        positions = np.asarray(index) if not isinstance(index, tuple) else None
        if positions is not None and positions.ndim == 1 and positions.dtype.kind == "b":
            if len(positions) != len(self):
                raise IndexError(
                    f"A boolean index of sigma_ needs one entry per class ({len(self)}), "
                    f"got {len(positions)}."
                )
            positions = np.flatnonzero(positions)
        if positions is not None and positions.ndim == 1 and positions.dtype.kind in "iu":
            return StructuredCovariances(self.covariances[int(k)] for k in positions)
        # A dense stack's sigma_[k, i, j] or sigma_[:, i, i] would need the p × p matrices
        # the structures avoid: say what reads them (Python's own message named a tuple).
        raise TypeError(
            f"sigma_ holds {len(self)} structured covariances, not a dense array: index it "
            "by class only (sigma_[k], a slice, a list of classes' positions or a mask). For "
            "entries use sigma_[k].toarray()[i, j] (or np.asarray(sigma_) for the dense "
            "stack, where it fits the memory limit); sigma_.diagonal() gives the marginal "
            "variances, sigma_[k].dot(v) products."
        )

    def __iter__(self):
        return iter(self.covariances)

    @property
    def structure(self) -> str:
        """The problems' structure ("dual", "lowrank" or "diagonal"), or their structures
        joined by commas where they differ."""
        names = dict.fromkeys(c.structure for c in self.covariances)
        return ", ".join(names)

    def diagonal(self) -> np.ndarray:
        """Every problem's marginal variances, shape (K, p)."""
        return np.array([c.diagonal() for c in self.covariances])

    def dense_bytes(self) -> float:
        """Bytes of the dense (K, p, p) stack and its conversion's temporaries."""
        k, p, _ = self.shape
        return 8.0 * k * p * p + max(c.dense_bytes() for c in self.covariances)

    def toarray(self) -> np.ndarray:
        """The dense (K, p, p) stack (a new array).

        Raises
        ------
        MemoryLimitError
            If it does not fit the memory limit; the message names what to use instead.
        """
        k, p, _ = self.shape
        check_memory(
            self.dense_bytes(),
            f"the dense {k} × {p} × {p} posterior covariances (sigma_ holds {k} "
            f"one-vs-rest {self.structure} structured covariances, diagonal plus low rank)",
            "Use what reads the structures instead: sigma_.diagonal() for the marginal "
            "variances (one row per class), sigma_[k] for class k's covariance, "
            "latent_mean_and_variance(X) for the rows' latent variances, sample_coef for "
            "draws, summary() for the intervals — or raise the memory_limit of "
            "vsbayes.config_context.",
        )
        out = np.empty((k, p, p))
        for index, covariance in enumerate(self.covariances):
            out[index] = covariance.toarray()
        return out

    def __array__(self, dtype=None, copy=None):
        dense = self.toarray()
        return dense if dtype is None else dense.astype(dtype, copy=False)


class CentredStructuredCovariance(StructuredCovariance):
    """A multinomial posterior's structured covariance: the classes' contrasts from a
    diagonal plus low rank, the shift directions from the prior,
    ``Σ = Π (diag(δ) + U K Uᵀ) Π + Σ_j c_j n_j n_jᵀ``.

    θ's layout is ``[W.ravel(), b]`` (W: K × d, class-major; b: K, when fitted); column j
    (a feature, or the intercept) holds the K classes' entries. Π centres each column over
    its classes (``I − 11ᵀ/K``), and ``n_j = 1_K ⊗ e_j / √K`` is column j's shift
    direction, which the softmax's likelihood does not see: the posterior along it is the
    prior's ``N(0, c_j)``, independent of the contrasts, as the dense multinomial
    posterior holds it. A diagonal cannot hold the K × K blocks ``c_j 11ᵀ / K`` this adds
    (a diagonal plus low rank's marginal variances missed up to a quarter of theirs).

    The attributes of :class:`StructuredCovariance` are the base ``diag(δ) + U K Uᵀ``: its
    centred part is what the rows' latent covariances (centred before the softmax) and the
    centred coefficients' variances read. The methods are the whole Σ's; draws and
    ``log det Σ`` from the base's square root and the shift directions' precision
    ``Nᵀ Σ_base⁻¹ N`` (diagonal plus low rank), in O(p r²).

    Parameters
    ----------
    diagonal, factor, core, structure
        The base, as :class:`StructuredCovariance`'s.
    n_classes : int
        K.
    n_features : int
        d: θ holds K d coefficients, then K intercepts if it has K (d + 1) entries.
    shift_var : ndarray of shape (p,)
        Each entry's column's shift variance ``c_j`` (the column's prior variance), the same
        for the K classes of a column.
    """

    def __init__(
        self,
        diagonal,
        factor,
        core,
        n_classes: int,
        n_features: int,
        shift_var,
        structure: str = "lowrank",
    ):
        super().__init__(diagonal, factor, core, structure)
        self.n_classes, self.n_features = int(n_classes), int(n_features)
        p, k = self.shape[0], self.n_classes
        if p not in (k * self.n_features, k * (self.n_features + 1)):
            raise ValueError(f"{p} entries are not {k} classes × {self.n_features} columns.")
        shift = np.asarray(shift_var, dtype=float).reshape(-1)
        if shift.shape != (p,) or not np.all(shift > 0):
            raise ValueError(f"shift_var must hold {p} positive variances.")
        columns = np.concatenate([block[0, 0] for block in self._blocks(shift[None])])
        if not np.array_equal(self._spread(columns[None])[0], shift):
            raise ValueError("shift_var must be the same for the classes of a column.")
        self.shift_var = _readonly(shift)
        self._column_shift = columns  # c_j, (width,)

    # --- θ's columns -----------------------------------------------------------------------

    def _blocks(self, rows: np.ndarray) -> list[np.ndarray]:
        """Views (n, K, width) of the coefficients' and the intercepts' blocks of
        C-ordered ``rows`` (n, p)."""
        k, d = self.n_classes, self.n_features
        blocks = [rows[:, : k * d].reshape(rows.shape[0], k, d)]
        if rows.shape[1] > k * d:
            blocks.append(rows[:, k * d :].reshape(rows.shape[0], k, 1))
        return blocks

    def _centre(self, rows: np.ndarray) -> np.ndarray:
        """``Π x`` for each of the C-ordered ``rows`` (n, p), in place."""
        for block in self._blocks(rows):
            block -= block.mean(axis=1, keepdims=True)
        return rows

    def _columns(self, rows: np.ndarray) -> np.ndarray:
        """``Nᵀ x`` for each of ``rows`` (n, p): (n, width), the classes' sums over √K."""
        sums = [block.sum(axis=1) for block in self._blocks(np.ascontiguousarray(rows))]
        return np.concatenate(sums, axis=1) / math.sqrt(self.n_classes)

    def _spread(self, columns: np.ndarray) -> np.ndarray:
        """``√K N u`` for each of ``columns`` (n, width): (n, p), u_j on every class of
        column j."""
        rows = np.empty((columns.shape[0], self.shape[0]))
        d = self.n_features
        for block, part in zip(self._blocks(rows), (columns[:, :d], columns[:, d:]), strict=False):
            block[...] = part[:, None, :]
        return rows

    # --- what users read ---------------------------------------------------------------------

    def contrast_variances(self) -> np.ndarray:
        """The centred coefficients' variances ``diag(Π Σ Π)`` (p,), in O(p r²) on the first
        call (a new array each call): per column ``δ_k (1 − 2/K) + Σ_l δ_l / K²`` plus U's
        centred rows through K."""
        return self._once("contrast_variances", self._compute_contrast_variances).copy()

    def _compute_contrast_variances(self) -> np.ndarray:
        k = self.n_classes
        out = np.empty((1, self.shape[0]))
        rank = self.rank
        parts = zip(
            self._blocks(out),
            self._blocks(self.diagonal_part[None]),
            self._blocks(self.factor.T),  # (r, K, width) views
            strict=True,
        )
        # Blocks of columns: U's K rows of each, centred, through K by one GEMM.
        step = block_length(8.0 * 3 * k * max(rank, 1))
        for target, delta, rows in parts:
            delta = delta[0]
            target[0] = delta * (1.0 - 2.0 / k) + delta.sum(axis=0) / k**2
            for start in range(0, rows.shape[2], step):
                columns = slice(start, start + step)
                # A copy always (a whole block's view is contiguous: U itself).
                block = np.array(rows[:, :, columns].transpose(1, 2, 0), order="C")
                block -= block.mean(axis=0)  # (K, b, r): the classes centred
                width = block.shape[1]
                quadratic = _quadratic_rows(block.reshape(k * width, rank), self.core)
                target[0][:, columns] += quadratic.reshape(k, width)
        return out[0]

    def diagonal(self) -> np.ndarray:
        """The marginal variances: the contrasts' plus the shift's ``c_j / K`` (a new array
        each call)."""
        return self._once(
            "diagonal", lambda: self.contrast_variances() + self.shift_var / self.n_classes
        ).copy()

    def dot(self, v) -> np.ndarray:
        """``Σ v`` for ``v`` of shape (p,) or (p, n)."""
        v = np.asarray(v, dtype=float)
        rows = np.array(v.reshape(v.shape[0], -1).T, order="C")  # (n, p)
        shift = self._spread(self._columns(rows) * self._column_shift)
        shift /= math.sqrt(self.n_classes)  # N diag(c) Nᵀ v
        out = np.ascontiguousarray(super().dot(self._centre(rows).T).T)
        out = self._centre(out) + shift
        return out[0] if v.ndim == 1 else out.T

    def toarray(self) -> np.ndarray:
        """The dense p × p matrix (a new array), where it fits the memory limit."""
        dense = super().toarray()
        self._centre(dense)  # Σ Π: each row centred; then Π Σ Π: each column, in place
        k, d = self.n_classes, self.n_features
        for block in (
            dense[: k * d].reshape(k, d, -1),
            dense[k * d :].reshape(k, -1, dense.shape[1]),
        ):
            block -= block.mean(axis=0)
        offsets = [(0, d)] + ([(k * d, 1)] if self.shape[0] > k * d else [])
        for (offset, width), shift in zip(offsets, np.split(self._column_shift, [d]), strict=False):
            index = offset + np.arange(k)[:, None] * width + np.arange(width)  # (K, width)
            dense[index[:, None, :], index[None, :, :]] += shift / k
        _symmetrize(dense)
        return dense

    def scaled(self, factor: float) -> CentredStructuredCovariance:
        """``factor · Σ``, with the same structure."""
        return CentredStructuredCovariance(
            factor * self.diagonal_part,
            self.factor,
            factor * self.core,
            self.n_classes,
            self.n_features,
            factor * self.shift_var,
            self.structure,
        )

    def _shift_precision(self):
        """``(a, O, μ)`` with ``Nᵀ Σ_base⁻¹ N = a^½ (I + O diag(μ) Oᵀ) a^½`` (O orthonormal,
        μ > −1), from the base's ``Σ_base = δ^½ (I + Q M Qᵀ) δ^½``: its inverse is
        ``δ^{-½} (I − Q diag(M / (1 + M)) Qᵀ) δ^{-½}``, and N's columns have disjoint
        supports, so ``Nᵀ δ⁻¹ N = diag(a)`` (a_j the classes' mean of 1/δ). Computed on the
        first call (kept)."""
        return self._once("shift_precision", self._compute_shift_precision)

    def _compute_shift_precision(self):
        root, basis, values = self._unit_root()
        a = self._columns((1.0 / root**2)[None])[0] / math.sqrt(self.n_classes)
        if basis.shape[1] == 0:
            return a, np.zeros((a.size, 0)), np.zeros(0)
        # δ^{-½}Q and its transposed copy (p × r each), then the columns' sums, their
        # basis and its rotation (width × r each).
        nbytes = 8.0 * basis.shape[1] * (2 * root.size + 3 * a.size)
        self._check_basis_memory(nbytes, f"{a.size} × {basis.shape[1]}", "shift directions'")
        spread = self._columns(np.ascontiguousarray((basis / root[:, None]).T)).T  # Nᵀ δ^{-½} Q
        ortho, upper = thin_qr(spread / np.sqrt(a)[:, None], overwrite_a=True)
        inner = -(upper * (values / (1.0 + values))) @ upper.T
        mu, rotation = np.linalg.eigh(0.5 * (inner + inner.T))
        return a, ortho @ rotation, np.maximum(mu, -1.0 + 1e-15)

    def log_det(self) -> float:
        """``log det Σ = log det Σ_base + log det(Nᵀ Σ_base⁻¹ N) + Σ_j log c_j`` (the
        contrasts' block is ``Π Σ_base Π``, of determinant ``det Σ_base det(Nᵀ Σ_base⁻¹ N)``
        on their subspace), in O(p r²)."""
        root, _, values = self._unit_root()
        a, _, mu = self._shift_precision()
        shift = float(np.log(a).sum() + np.log1p(mu).sum() + np.log(self._column_shift).sum())
        return self._root_log_det(root, values) + shift

    def sample_normal(self, z: np.ndarray) -> np.ndarray:
        """``L z`` for standard normal rows z (n, p), ``L Lᵀ = Σ``, L square (``log q`` of a
        draw is ``−½|z|²`` up to a constant): ``Π R z + N diag(√c) Bᵀ z`` with R the base's
        root ``δ^½ (I + Q (√(1+M) − 1) Qᵀ)``; ``B = R⁻¹ N G``, ``G Gᵀ = (Nᵀ Σ_base⁻¹ N)⁻¹``,
        is orthonormal and ``Π R B = 0``, so the two parts are independent."""
        root, basis, values = self._unit_root()
        z = np.asarray(z, dtype=float)
        projected = z @ basis
        draws = (z + (projected * (np.sqrt(1.0 + values) - 1.0)) @ basis.T) * root
        self._centre(draws)
        a, rotation, mu = self._shift_precision()
        # Bᵀ z = Gᵀ Nᵀ R⁻ᵀ z, with R⁻ᵀ = δ^{-½} (I + Q ((1+M)^{-½} − 1) Qᵀ) and
        # Gᵀ = (I + O ((1+μ)^{-½} − 1) Oᵀ) a^{-½}.
        inverse = (z + (projected * (1.0 / np.sqrt(1.0 + values) - 1.0)) @ basis.T) / root
        shift = self._columns(inverse) / np.sqrt(a)
        shift += ((shift @ rotation) * (1.0 / np.sqrt(1.0 + mu) - 1.0)) @ rotation.T
        draws += self._spread(shift * np.sqrt(self._column_shift)) / math.sqrt(self.n_classes)
        return draws

    def inverse_quadratic(self, rows) -> np.ndarray:
        """``xᵀ Σ⁻¹ x`` for each of ``rows`` x (n, p), in O(n p r), never a p × p matrix.

        Σ is ``Π Σ_base Π`` on the contrasts plus ``N diag(c) Nᵀ`` on the shift directions
        (N's columns orthonormal, ``Π = I − N Nᵀ``), so ``xᵀ Σ⁻¹ x = uᵀ G u + Σ_j
        (Nᵀx)_j² / c_j`` with ``u = Π x`` and G the inverse of ``Π Σ_base Π`` on the
        contrasts, ``G = Σ_base⁻¹ − Σ_base⁻¹ N A⁻¹ Nᵀ Σ_base⁻¹`` (``A = Nᵀ Σ_base⁻¹ N``: G
        annihilates N and ``G Σ_base Π = Π``); Σ_base⁻¹ by Woodbury's identity from the
        base's square root, A⁻¹ from :meth:`_shift_precision`'s. For a draw ``x = L z``
        (:meth:`sample_normal`) it is ``|z|²``. In blocks of rows (a block's three p-wide
        temporaries)."""
        rows = np.asarray(rows, dtype=float)
        root, basis, values = self._unit_root()
        a, rotation, mu = self._shift_precision()
        shrink, shift_shrink = values / (1.0 + values), mu / (1.0 + mu)
        out = np.empty(rows.shape[0])
        step = block_length(8.0 * 3 * (rows.shape[1] + basis.shape[1]))
        for start in range(0, rows.shape[0], step):
            block = rows[start : start + step]
            shift = self._columns(block)  # Nᵀ x
            white = self._centre(np.array(block, order="C"))
            white /= root  # δ^{-½} u
            projected = white @ basis
            quadratic = np.einsum("ij,ij->i", white, white) - (projected * projected) @ shrink
            # Σ_base⁻¹ u = δ^{-½} (y − Q diag(M / (1 + M)) Qᵀ y), then a^{-½} Nᵀ of it.
            white -= (projected * shrink) @ basis.T
            white /= root
            solved = self._columns(white) / np.sqrt(a)
            turned = solved @ rotation
            quadratic -= np.einsum("ij,ij->i", solved, solved) - (turned * turned) @ shift_shrink
            quadratic += (shift * shift) @ (1.0 / self._column_shift)
            out[start : start + step] = quadratic
        return out


def _quadratic_rows(rows: np.ndarray, core: np.ndarray) -> np.ndarray:
    """``diag(A K Aᵀ)`` for A (n, r) and K (r, r): blocks of rows, each one GEMM, so that the
    temporaries stay within the block size."""
    n, rank = rows.shape
    out = np.empty(n)
    if rank == 0:
        out[:] = 0.0
        return out
    step = block_length(8.0 * 2 * rank)
    for start in range(0, n, step):
        block = rows[start : start + step]
        product = block @ core
        product *= block
        out[start : start + step] = product.sum(axis=1)
    return out


class StructuredGaussian(Gaussian):
    """``q(x) = exp(log_Z) N(x; mean, Σ)`` with a :class:`StructuredCovariance` Σ.

    The same interface as :class:`Gaussian` for what users read — ``mean``, ``log_Z``,
    ``var``, ``log_det_cov``, :meth:`sample` — without a p × p
    matrix; ``cov``, ``chol``, ``precision`` and the methods built on them form the dense
    matrix on first use, only where it fits the memory limit.

    Parameters
    ----------
    mean : array-like of shape (p,)
        Mean vector.
    covariance : StructuredCovariance
        The covariance.
    log_Z : float, default=0.0
        Log of the total mass.
    error : str, default=""
        The structure's stated error (what the approximation may differ from the exact
        Laplace covariance by; "" when exact).
    """

    def __init__(self, mean, covariance: StructuredCovariance, log_Z: float = 0.0, error: str = ""):
        super().__init__(mean, covariance.toarray, log_Z)
        if covariance.shape[0] != self.dim:
            raise ValueError(
                f"The covariance is {covariance.shape[0]}-dimensional, the mean {self.dim}."
            )
        self.covariance = covariance
        self.error = error

    @property
    def var(self) -> np.ndarray:
        """The marginal variances, shape (p,)."""
        return self.covariance.diagonal()

    @property
    def log_det_cov(self) -> float:
        return self.covariance.log_det()

    def sample(self, n_samples: int, random_state=None) -> np.ndarray:
        """Draw ``n_samples`` points from the normalized Gaussian, in O(n p r)."""
        rng = as_generator(random_state)
        z = rng.standard_normal((int(n_samples), self.dim))
        return self.mean + self.covariance.sample_normal(z)

    def logpdf(self, x) -> np.ndarray:
        """Log of the normalized density N(x; mean, Σ) at points x of shape (N, p) or (p,),
        in O(N p r) from the structure (:meth:`StructuredCovariance.inverse_quadratic`,
        :meth:`StructuredCovariance.log_det`), never a p × p matrix.

        It is the density of the Gaussian that :meth:`sample` draws from. Where the
        structure's marginal variances are estimates ("lowrank" and "diagonal" on many
        rows), that Gaussian is not the exact Laplace approximation (its variances are
        within the stated ``error``): this is its density, which is what reweighting its
        draws to another distribution (importance sampling) needs.
        """
        x = np.asarray(x, dtype=float)
        rows = x.reshape(-1, self.dim)
        quadratic = np.empty(rows.shape[0])
        step = block_length(8.0 * self.dim)  # each block's difference from the mean
        for start in range(0, rows.shape[0], step):
            difference = rows[start : start + step] - self.mean
            quadratic[start : start + step] = self.covariance.inverse_quadratic(difference)
        out = -0.5 * quadratic - 0.5 * (self.dim * _LOG_2PI + self.log_det_cov)
        return out.reshape(x.shape[:-1])[()]  # (a scalar for one point, as Gaussian's)

    def scale_cov(self, factor: float) -> StructuredGaussian:
        return StructuredGaussian(self.mean, self.covariance.scaled(factor), self.log_Z, self.error)

    def with_moments(self, mean, cov) -> Gaussian:
        """A dense :class:`Gaussian` with another mean and covariance, this ``log_Z``."""
        return Gaussian(mean, cov, self.log_Z)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dim={self.dim}, log_Z={self.log_Z:.6g}, "
            f"structure={self.covariance.structure!r}, rank={self.covariance.rank})"
        )
