"""Quadratic exponential families ``q(z) = exp(θ · φ(z))`` over sample points.

The engine works in a *frame*: kernel-whitened coordinates ``z`` in which the kernel is
N(0, I) (full family) or has unit marginal variances (diagonal family). A family object
holds the points and provides the few operations the VS solver needs, all O(N d²) or less:

* ``values(θ)``: the log-density ``θ · φ(z_k)`` at every point;
* ``moments(u)``: the weighted feature sum ``Σ_k u_k φ(z_k)``, which is the gradient
  ``Σ (q̄_k - p̄_k) φ_k`` when ``u = q̄ - p̄``;
* ``natural_direction``: the inverse Fisher information of a reference Gaussian applied
  to a moment vector, in closed form (no n×n matrix);
* conversions between θ and :class:`~vsbayes.gaussian.Gaussian`.

Two operations form the n×n sampled Hessian ``Σ w_k φ_k φ_kᵀ`` from row blocks of the
feature matrix, O(N n²): ``newton_direction`` (exact Newton steps, where n is small) and
``leverages`` (the in-sample correction of the predicted error near its pole, D-237).

The full family never forms the N×n feature matrix: with homogeneous coordinates
``y = (z, 1)`` its features are ``φ(z) = -y yᵀ / 2`` and θ is a symmetric
(d+1)×(d+1) matrix, so values and moments are single matrix products.
"""

from __future__ import annotations

import abc

import numpy as np
from scipy.linalg.blas import dsyrk, dtrmm

from .._blas import block_slices, map_blocks, sum_blocks
from .._indices import triu_indices
from .._lapack import cho_factor, cho_solve, solve_triangular
from .._memory import block_length
from ..exceptions import NotPositiveDefiniteError
from ..gaussian import Gaussian
from ._linalg import solve_psd

__all__ = ["DiagonalFamily", "FullFamily", "QuadraticFamily", "family_class", "make_family"]


class QuadraticFamily(abc.ABC):
    """Common interface of the quadratic exponential families (see module docstring)."""

    name: str
    n_params: int

    def __init__(self, z: np.ndarray):
        self.n_samples, self.dim = z.shape
        self.n_params = self.count_params(self.dim)
        self._all_features = None

    @staticmethod
    @abc.abstractmethod
    def count_params(dim: int) -> int:
        """Number of parameters n of the family in dimension ``dim``."""

    @property
    @abc.abstractmethod
    def pass_work(self) -> int:
        """Multiply-adds per point of :meth:`values` or :meth:`moments`."""

    @staticmethod
    def _precision_matrix(precision: np.ndarray) -> np.ndarray:
        """The family's precision parameter as a d×d matrix."""
        return precision

    @staticmethod
    def _precision_parameter(matrix: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`_precision_matrix`."""
        return matrix

    @abc.abstractmethod
    def values(self, theta: np.ndarray) -> np.ndarray:
        """``θ · φ(z_k)`` for every point, shape (N,)."""

    @abc.abstractmethod
    def moments(self, u: np.ndarray) -> np.ndarray:
        """``Σ_k u_k φ(z_k)``, shaped like θ."""

    @abc.abstractmethod
    def raw_moments(self, m: np.ndarray):
        """Split a feature-moment array into (mass, first, second) raw moments."""

    @abc.abstractmethod
    def theta_from_natural(self, precision, eta, c) -> np.ndarray:
        """Parameter array of ``exp(c + eta·z - zᵀ precision z / 2)``."""

    @abc.abstractmethod
    def natural_from_theta(self, theta):
        """Inverse of :meth:`theta_from_natural`: ``(precision, eta, c)``."""

    @abc.abstractmethod
    def reference(self, m: np.ndarray) -> Gaussian:
        """The Gaussian whose raw moments are those of the feature-moment array ``m``.

        Raises :class:`~vsbayes.exceptions.NotPositiveDefiniteError` when they are not the
        moments of any Gaussian.
        """

    @abc.abstractmethod
    def christoffel(self, theta, values: np.ndarray) -> np.ndarray | None:
        """``Z φ(z_k)ᵀ H⁻¹ φ(z_k)`` with ``H = ∫ q φ φᵀ`` for the Gaussian ``q`` of θ.

        ``values`` are θ's values at the points. Returns None when θ is not integrable.
        """

    @abc.abstractmethod
    def weighted_mean(self, weights: np.ndarray) -> np.ndarray:
        """``Σ_k w_k z_k / Σ_k w_k``: the points' mean under non-negative ``weights``."""

    @abc.abstractmethod
    def constant(self) -> np.ndarray:
        """The parameter array whose values are 1 at every point."""

    @abc.abstractmethod
    def feature_rows(self, rows: slice) -> np.ndarray:
        """Features of the points ``rows`` in a basis without repeats, shape (rows, n)."""

    @abc.abstractmethod
    def theta_from_basis(self, v: np.ndarray) -> np.ndarray:
        """Parameter array of the coefficient vector ``v`` of :meth:`feature_rows`."""

    def newton_direction(self, weights: np.ndarray, residual: np.ndarray) -> np.ndarray:
        """Exact Newton direction ``-(Φᵀ diag(w) Φ)⁻¹ Φᵀ r`` as a parameter array.

        Forms the n×n Hessian from row blocks of the feature matrix, each within
        :func:`~vsbayes._memory.block_bytes` (kept between calls when one block holds all
        rows): O(N n²), used only when n is small or as a fallback.
        """
        n_rows = self.n_samples
        # The block of features and its weighted copy.
        block = block_length(16.0 * self.n_params)
        hess = np.zeros((self.n_params, self.n_params))
        grad = np.zeros(self.n_params)
        for start in range(0, n_rows, block):
            rows = slice(start, min(start + block, n_rows))
            phi = self._block_features(rows, whole=block >= n_rows)
            hess += (phi.T * weights[rows]) @ phi
            grad += residual[rows] @ phi
        return self.theta_from_basis(-solve_psd(hess, grad))

    def leverages(self, weights: np.ndarray) -> np.ndarray:
        """The points' leverages ``h_k = w_k φ_kᵀ H⁻¹ φ_k`` with ``H = Σ_k w_k φ_k φ_kᵀ``.

        The diagonal of the weighted fit's hat matrix: each in [0, 1], summing to n. Two
        passes over row blocks of the feature matrix (a symmetric rank-k update, then a
        triangular solve), each O(N n²) within :func:`~vsbayes._memory.block_bytes`.
        Raises :class:`~vsbayes.exceptions.NotPositiveDefiniteError` when H is singular.
        """
        n_rows = self.n_samples
        root = np.sqrt(weights)
        # The block of features, its scaled copy (never in place: the diagonal family's
        # rows are a view of its features) and its solved copy.
        block = block_length(24.0 * self.n_params)
        slices = [slice(a, min(a + block, n_rows)) for a in range(0, n_rows, block)]
        hess = np.zeros((self.n_params, self.n_params), order="F")
        for rows in slices:
            scaled = self.feature_rows(rows) * root[rows, None]
            hess = dsyrk(1.0, scaled.T, beta=1.0, c=hess, overwrite_c=1)
        try:
            upper, _ = cho_factor(hess, overwrite_a=True, check_finite=False)
        except np.linalg.LinAlgError as exc:
            raise NotPositiveDefiniteError("The sampled Hessian is singular.") from exc
        out = np.empty(n_rows)
        for rows in slices:
            scaled = self.feature_rows(rows) * root[rows, None]
            # U⁻ᵀ (√w φ)ᵀ: its columns' squared norms are the leverages.
            solved = solve_triangular(upper, scaled.T, trans=1, check_finite=False)
            np.einsum("ij,ij->j", solved, solved, out=out[rows])
        return out

    def _block_features(self, rows: slice, whole: bool) -> np.ndarray:
        if not whole:
            return self.feature_rows(rows)
        if self._all_features is None:
            self._all_features = self.feature_rows(rows)
        return self._all_features

    def inner(self, a: np.ndarray, b: np.ndarray) -> float:
        """Euclidean pairing of a moment-shaped array and a parameter-shaped array."""
        return float(np.vdot(a, b))

    def theta_from_gaussian(self, gaussian: Gaussian) -> np.ndarray:
        """Parameter array of a Gaussian given in frame coordinates."""
        nat = gaussian.natural_parameters()
        return self.theta_from_natural(self._precision_parameter(nat.precision), nat.eta, nat.c)

    def gaussian_from_theta(self, theta) -> Gaussian:
        """Gaussian (frame coordinates) of θ; raises NotPositiveDefiniteError if none."""
        precision, eta, c = self.natural_from_theta(theta)
        return Gaussian.from_natural(self._precision_matrix(precision), eta, c)

    def natural_direction(self, reference: Gaussian, m: np.ndarray) -> np.ndarray:
        """Inverse Fisher information of ``reference`` applied to the moment array ``m``.

        This is the parameter change that changes the moments of ``reference`` by ``m``.
        """
        mass = np.exp(reference.log_Z)
        d_mass, d_first, d_second = self.raw_moments(m)
        dnat = reference.natural_differential(d_mass / mass, d_first / mass, d_second / mass)
        return self.theta_from_natural(dnat.precision, dnat.eta, dnat.c)


class FullFamily(QuadraticFamily):
    """All Gaussians: ``n = (d+1)(d+2)/2`` parameters, θ a symmetric (d+1)×(d+1) matrix.

    ``log q(z) = -yᵀ Θ y / 2`` with ``y = (z, 1)`` and
    ``Θ = [[precision, -eta], [-etaᵀ, -2c]]``.
    """

    name = "gaussian"

    @staticmethod
    def count_params(dim):
        return (dim + 1) * (dim + 2) // 2

    def __init__(self, z: np.ndarray):
        # Homogeneous coordinates, one row per coordinate: contiguous for the BLAS calls.
        yt = np.ones((z.shape[1] + 1, len(z)))
        yt[:-1] = z.T
        self._adopt(yt)

    @classmethod
    def from_columns(cls, yt: np.ndarray) -> FullFamily:
        """The family on homogeneous coordinates ``(z, 1)`` given as columns (kept, no copy)."""
        family = cls.__new__(cls)
        family._adopt(yt)
        return family

    def _adopt(self, yt: np.ndarray) -> None:
        super().__init__(yt[:-1].T)  # the shape of the points
        self._yt = yt
        # Column blocks of the passes (values, moments), side by side, each with a buffer.
        self._blocks = block_slices(self.n_samples, self.pass_work)
        self._buffers = [np.empty((self.dim + 1, b.stop - b.start)) for b in self._blocks]

    @property
    def pass_work(self):
        return (self.dim + 1) ** 2

    def values(self, theta):
        # yᵀΘy = yᵀUy with U the upper triangle of Θ, off-diagonal doubled: a triangular
        # product, half the multiply-adds of Θ y.
        upper = np.triu(theta, 1)
        upper *= 2.0
        upper[np.diag_indices_from(upper)] = np.diagonal(theta)
        upper = np.asfortranarray(upper)
        out = np.empty(self.n_samples)

        def block(k):
            cols, buffer = self._blocks[k], self._buffers[k]
            y = self._yt[:, cols]
            buffer[...] = y
            # (U y)ᵀ = yᵀ Uᵀ, in place in the buffer's transpose (Fortran-ordered).
            product = dtrmm(1.0, upper, buffer.T, side=1, lower=0, trans_a=1, overwrite_b=1).T
            np.multiply(product, y, out=buffer)
            np.add.reduce(buffer, axis=0, out=out[cols])

        map_blocks(block, range(len(self._blocks)))
        out *= -0.5
        return out

    def moments(self, u):
        # Non-negative weights (q̄, p̄): Σ u y yᵀ = (y√u)(y√u)ᵀ, a symmetric rank-k update
        # (half the multiply-adds of a general product).
        u = np.asarray(u, dtype=float)
        symmetric = bool(u.min(initial=0.0) >= 0.0)
        root = np.sqrt(u) if symmetric else u

        def block(k):
            cols, buffer = self._blocks[k], self._buffers[k]
            y = self._yt[:, cols]
            np.multiply(y, root[cols], out=buffer)
            if symmetric:
                return dsyrk(1.0, buffer.T, trans=1)
            return buffer @ y.T

        total = sum_blocks(block, range(len(self._blocks)))
        if symmetric:  # SYRK fills the upper triangle
            upper = triu_indices(len(total), 1)
            total[upper[::-1]] = total[upper]
        return -0.5 * total

    def weighted_mean(self, weights):
        return self._yt[: self.dim] @ weights / weights.sum()

    def raw_moments(self, m):
        d = self.dim
        raw = -2.0 * m
        return raw[d, d], raw[:d, d], raw[:d, :d]

    # The conversions below also take stacks of parameters (leading batch axes), as the
    # batched site fits do.
    def theta_from_natural(self, precision, eta, c):
        d = self.dim
        eta, c = np.asarray(eta), np.asarray(c)
        theta = np.empty((*c.shape, d + 1, d + 1))
        theta[..., :d, :d] = precision
        theta[..., :d, d] = theta[..., d, :d] = -eta
        theta[..., d, d] = -2.0 * c
        return theta

    def natural_from_theta(self, theta):
        d = self.dim
        return theta[..., :d, :d], -theta[..., :d, d], -0.5 * theta[..., d, d]

    def constant(self):
        return self.theta_from_natural(np.zeros((self.dim, self.dim)), np.zeros(self.dim), 1.0)

    def reference(self, m):
        mass, first, second = self.raw_moments(m)
        mean = first / mass
        return Gaussian(mean, second / mass - np.outer(mean, mean), np.log(mass))

    def feature_rows(self, rows):
        z = self._yt[: self.dim, rows].T
        i, j = triu_indices(self.dim)
        quad = z[:, i] * z[:, j]
        quad *= np.where(i == j, -0.5, -1.0)
        return np.hstack([np.ones((z.shape[0], 1)), z, quad])

    def theta_from_basis(self, v):
        d = self.dim
        i, j = triu_indices(d)
        precision = np.zeros((*v.shape[:-1], d, d))
        precision[..., i, j] = v[..., 1 + d :]
        precision[..., j, i] = v[..., 1 + d :]
        return self.theta_from_natural(precision, v[..., 1 : 1 + d], v[..., 0])

    def christoffel(self, theta, values):
        # For the full family this is 1 + d/2 + |u|⁴/2 with u the point in q's whitened
        # coordinates; |u|² = (z-μ)ᵀΛ(z-μ) = 2 (c - θ·φ(z)) + μᵀη needs no pass over z.
        precision, eta, c = self.natural_from_theta(theta)
        try:
            lower = np.linalg.cholesky(precision)
        except np.linalg.LinAlgError:
            return None
        mean = cho_solve((lower, True), eta, check_finite=False)
        r2 = 2.0 * (c - values) + mean @ eta
        return 1.0 + 0.5 * self.dim + 0.5 * r2 * r2


class DiagonalFamily(QuadraticFamily):
    """Gaussians with diagonal covariance in the frame: ``n = 2d + 1`` parameters.

    θ is the vector ``(precision_diag, eta, c)`` and ``φ(z) = (-z²/2, z, 1)``. The N×n
    feature matrix is small here and is stored.
    """

    name = "diagonal"

    @staticmethod
    def count_params(dim):
        return 2 * dim + 1

    _precision_matrix = staticmethod(np.diag)
    _precision_parameter = staticmethod(np.diag)

    def __init__(self, z: np.ndarray):
        super().__init__(z)
        d = self.dim
        self._z = z
        self._phi = np.empty((2 * d + 1, self.n_samples))
        self._phi[:d] = -0.5 * np.square(z.T)
        self._phi[d : 2 * d] = z.T
        self._phi[2 * d] = 1.0
        self._blocks = block_slices(self.n_samples, self.pass_work)

    @property
    def pass_work(self):
        return self.n_params

    def values(self, theta):
        out = np.empty(self.n_samples)

        def block(cols):
            np.matmul(theta, self._phi[:, cols], out=out[cols])

        map_blocks(block, self._blocks)
        return out

    def moments(self, u):
        return sum_blocks(lambda cols: self._phi[:, cols] @ u[cols], self._blocks)

    def weighted_mean(self, weights):
        return weights @ self._z / weights.sum()

    def raw_moments(self, m):
        d = self.dim
        return m[2 * d], m[d : 2 * d], -2.0 * m[:d]

    def theta_from_natural(self, precision, eta, c):
        return np.concatenate([precision, eta, [c]])

    def natural_from_theta(self, theta):
        d = self.dim
        return theta[:d], theta[d : 2 * d], float(theta[2 * d])

    def constant(self):
        return self.theta_from_natural(np.zeros(self.dim), np.zeros(self.dim), 1.0)

    def reference(self, m):
        mass, first, second = self.raw_moments(m)
        mean = first / mass
        return Gaussian(mean, np.diag(second / mass - mean * mean), np.log(mass))

    def feature_rows(self, rows):
        return self._phi[:, rows].T

    def theta_from_basis(self, v):
        return np.asarray(v, dtype=float)

    def christoffel(self, theta, values):
        # 1 + d/2 + Σ u_i⁴/2 with u the point in q's whitened coordinates.
        precision, eta, _ = self.natural_from_theta(theta)
        if not (precision > 0).all():
            return None
        u2 = np.square(self._z - eta / precision) * precision
        return 1.0 + 0.5 * self.dim + 0.5 * np.square(u2).sum(axis=1)


_FAMILIES = {"gaussian": FullFamily, "diagonal": DiagonalFamily}


def family_class(family: str) -> type[QuadraticFamily]:
    """The family class named ``"gaussian"`` (full) or ``"diagonal"``."""
    try:
        return _FAMILIES[family]
    except KeyError:
        raise ValueError(f"family must be one of {sorted(_FAMILIES)}; got {family!r}.") from None


def make_family(family: str, z: np.ndarray) -> QuadraticFamily:
    """Instantiate the family named ``family`` on the points z (rows)."""
    return family_class(family)(z)
