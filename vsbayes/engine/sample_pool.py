"""Sample pools and coordinate frames shared by the fitters.

A :class:`SamplePool` holds the points of every round so far (see :mod:`.rounds`) with
their kernels, rule weights and target values, and weighs them against the mixture of the
round kernels (each with proportion ``N_r / N``), which is a valid window for VS and IS
alike. A :class:`Frame` gives the kernel-whitened coordinates the fits work in.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._blas import block_slices, map_blocks
from .._lapack import solve_triangular
from .._memory import check_memory
from .._sums import logsumexp
from ..exceptions import EstimationError
from ..gaussian import Gaussian

__all__ = [
    "Frame",
    "SamplePool",
    "check_pool_memory",
    "evaluate_log_target",
    "grown_bytes_per_point",
    "isotropic_start",
    "pool_bytes",
]

_LOG_2PI = math.log(2.0 * math.pi)


def pool_bytes(n_points: int, dim: int) -> float:
    """Bytes a sampling fit of ``n_points`` points in ``dim`` dimensions holds at once: the
    points in two coordinates, their homogeneous features and the solver's buffers (the
    target and the solver's feature products run in bounded blocks)."""
    return 8.0 * n_points * (4 * dim + 8)


def grown_bytes_per_point(dim: int) -> float:
    """Bytes per point of a fit that adds rounds (``target_kl``, ``time_budget``), at its
    peak: the pool of every round's points, the next round's arrays reserved whole for the
    most points it may draw, and the fits' buffers. Measured (traced peaks at the cap,
    10-600 rows): 1.41, 2.27 and 3.54 kB at 4, 11 and 31 parameters, 3.4-7.3 times
    :func:`pool_bytes` per point; this bounds them."""
    return 8.0 * (12 * dim + 160)


def check_pool_memory(n_points: int, dim: int, name: str) -> None:
    """Raise :class:`~vsbayes.exceptions.MemoryLimitError` before drawing if the pool of
    ``n_points`` points of the fitter ``name`` would not fit in memory (D-188)."""
    check_memory(
        pool_bytes(n_points, dim),
        f"the {name} fit's {n_points} points in {dim} dimensions",
        "Use fewer points (n_samples), or a smaller max_samples with target_kl or time_budget.",
    )


def evaluate_log_target(log_target: Callable, x: np.ndarray) -> np.ndarray:
    """Call ``log_target`` on the rows of ``x`` and check what it returns.

    ``-inf`` (zero density) is allowed; NaN and ``+inf`` are errors.
    """
    values = np.asarray(log_target(x))
    n = x.shape[0]
    if np.iscomplexobj(values):  # float() would drop the imaginary part with a warning
        raise ValueError(
            f"log_target returned complex values ({values.dtype}): return the real "
            f"log-densities, one float per row."
        )
    values = values.astype(float, copy=False)
    if values.shape != (n,):
        if values.size != n:
            raise ValueError(
                f"log_target must return one value per row: x has shape {x.shape}, "
                f"the result has shape {values.shape}."
            )
        values = values.reshape(n)
    bad = np.isnan(values) | (values == np.inf)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(
            f"log_target returned {values[k]} at {int(bad.sum())} of {n} points "
            f"(first at x={x[k]!r}). Return -inf where the density is zero."
        )
    if not np.isfinite(values).any():
        raise EstimationError(
            "log_target is -inf at every sampled point: the kernel does not reach the "
            "target's support. Move or widen the kernel."
        )
    return values


class Frame:
    """Affine coordinates ``z = T⁻¹ (x - m)`` of a kernel.

    ``T`` is the kernel's Cholesky factor (``diagonal=False``: the kernel becomes N(0, I))
    or the diagonal of its standard deviations (``diagonal=True``: unit marginal variances,
    so that diagonal Gaussians stay diagonal).
    """

    def __init__(self, kernel: Gaussian, diagonal: bool = False):
        self.kernel = kernel
        self.diagonal = diagonal
        self.mean = kernel.mean
        if diagonal:
            self.scale = np.sqrt(np.diag(kernel.cov))
            self.log_det = float(np.log(self.scale).sum())
        else:
            self.scale = kernel.chol
            self.log_det = 0.5 * kernel.log_det_cov

    def coordinates(self, x: np.ndarray) -> np.ndarray:
        """Frame coordinates of the rows of x."""
        if self.diagonal:
            return (x - self.mean) / self.scale
        return solve_triangular(self.scale, (x - self.mean).T, lower=True).T

    def gaussian_to_frame(self, g: Gaussian) -> Gaussian:
        """Express a Gaussian given in x coordinates in frame coordinates."""
        if self.diagonal:
            sd = self.scale
            return Gaussian((g.mean - self.mean) / sd, np.diag(np.diag(g.cov) / (sd * sd)), g.log_Z)
        half = solve_triangular(self.scale, g.chol, lower=True)
        return Gaussian(self.coordinates(g.mean[None])[0], half @ half.T, g.log_Z)

    def gaussian_from_frame(self, g: Gaussian, log_shift: float = 0.0):
        """Mean, covariance and log-mass in x coordinates of a frame-coordinate Gaussian."""
        if self.diagonal:
            mean = self.mean + self.scale * g.mean
            cov = g.cov * np.outer(self.scale, self.scale)
        else:
            mean = self.mean + self.scale @ g.mean
            half = self.scale @ g.chol
            cov = half @ half.T
        return mean, cov, g.log_Z + log_shift


def isotropic_start(start: Gaussian, norms: np.ndarray) -> tuple[Gaussian, np.ndarray | None]:
    """A VS solver's start with its log-density at the points, when that needs no pass.

    The start of every round, in its kernel's frame, is N(0, σ² I) up to round-off: the
    kernel itself, or the fit that the kernel inflates. Its log-density at the points is
    then a function of their squared norms, which the window needs anyway.

    Parameters
    ----------
    start : Gaussian
        The start in frame coordinates (its ``log_Z`` is kept).
    norms : ndarray of shape (N,)
        Squared norms of the points in frame coordinates.

    Returns
    -------
    start : Gaussian
        Exactly N(0, σ² I) with the start's ``log_Z`` if the start is that to 1e-9
        (relative), else the start unchanged.
    values : ndarray of shape (N,) or None
        The returned start's log-density at the points, or None if it is not isotropic.
    """
    d = start.dim
    var = float(np.trace(start.cov)) / d
    off = max(np.abs(start.mean).max() / math.sqrt(var), np.abs(start.cov / var - np.eye(d)).max())
    if not off <= 1e-9:
        return start, None
    values = norms * (-0.5 / var)
    values += start.log_Z - 0.5 * d * math.log(2.0 * math.pi * var)
    return Gaussian(np.zeros(d), var * np.eye(d), start.log_Z), values


class SamplePool:
    """Points of all rounds so far, with kernels, rule weights and target values."""

    def __init__(self):
        self.kernels: list[Gaussian] = []
        self._x: list[np.ndarray] = []
        self._z: list[np.ndarray] = []
        self._log_w: list[np.ndarray] = []
        self._log_p: list[np.ndarray] = []
        # Squared norms of each round's points in a round kernel's coordinates, by the
        # kernel's id (log_window): a new round only needs its own points' norms under the
        # earlier kernels, and all norms under its kernel.
        self._norms: dict[int, list[np.ndarray]] = {}
        # log Σ_j N_j q_j(x) at each round's points over its first _folded[r] kernels
        # (log_window): a new round folds one kernel into each earlier round's sum.
        self._log_mix: list[np.ndarray] = []
        self._folded: list[int] = []

    def add(self, kernel: Gaussian, draws, log_p: np.ndarray) -> None:
        """Append one round: its kernel, draws (x, z, log-weights) and target values."""
        self.kernels.append(kernel)
        self._x.append(draws.x)
        self._z.append(draws.z)
        self._log_w.append(draws.log_weights)
        self._log_p.append(log_p)
        self._log_mix.append(None)
        self._folded.append(0)

    @property
    def sizes(self) -> list[int]:
        """Number of points of each round."""
        return [len(x) for x in self._x]

    @property
    def n_samples(self) -> int:
        """Total number of points."""
        return sum(self.sizes)

    @property
    def dim(self) -> int:
        """Dimension of the points."""
        return self.kernels[0].dim

    @property
    def x(self) -> np.ndarray:
        """All points, shape (N, d)."""
        return self._x[0] if len(self._x) == 1 else np.concatenate(self._x)

    @property
    def log_p(self) -> np.ndarray:
        """Target log-density at all points."""
        return self._log_p[0] if len(self._log_p) == 1 else np.concatenate(self._log_p)

    def log_weights(self) -> np.ndarray:
        """Log-weights of the pooled rule: ``log(N_r / N) + log w_rk``."""
        n = self.n_samples
        parts = [lw + math.log(len(lw) / n) for lw in self._log_w]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def log_window(self) -> np.ndarray:
        """Log-density of the window (mixture of round kernels, with proportions
        ``N_r / N``) at all points.

        Each round's points keep ``log Σ_j N_j q_j`` over the kernels folded in so far, so a
        new round costs one pass over the earlier points (its own kernel) and one per
        kernel over its own, not one per kernel over all points.
        """
        d, sizes, kernels = self.dim, self.sizes, self.kernels
        log_masses = [
            math.log(size) - 0.5 * (d * _LOG_2PI + kernel.log_det_cov)
            for size, kernel in zip(sizes, kernels, strict=True)
        ]
        for r, done in enumerate(self._folded):
            terms = []
            for j in range(done, len(kernels)):
                term = self._norm_parts(kernels[j])[r] * -0.5
                term += log_masses[j]
                terms.append(term)
            if done and len(terms) == 1:  # an earlier round: one kernel more
                np.logaddexp(self._log_mix[r], terms[0], out=self._log_mix[r])
            elif terms:
                if done:
                    terms.append(self._log_mix[r])
                self._log_mix[r] = terms[0] if len(terms) == 1 else logsumexp(terms, axis=0)
            self._folded[r] = len(kernels)
        mix = self._log_mix
        out = np.concatenate(mix) if len(mix) > 1 else mix[0].copy()
        out -= math.log(self.n_samples)
        return out

    def squared_norms(self, kernel: Gaussian) -> np.ndarray:
        """``|L⁻¹(x - m)|²`` at all points for a round's ``kernel`` (each round's part kept
        for the next rounds)."""
        parts = self._norm_parts(kernel)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _norm_parts(self, kernel: Gaussian) -> list[np.ndarray]:
        """Each round's part of :meth:`squared_norms`, computing the missing ones."""
        parts = self._norms.setdefault(id(kernel), [])
        for own, z in list(zip(self.kernels, self._z, strict=True))[len(parts) :]:
            if own is kernel:
                parts.append(np.einsum("ij,ij->i", z, z))
                continue
            a, b = self._transform(own, kernel)
            norms = np.empty(len(z))

            def block(rows, z=z, a=a, b=b, norms=norms):
                u = z[rows] @ a.T
                u += b
                norms[rows] = np.einsum("ij,ij->i", u, u)

            map_blocks(block, block_slices(len(z), self.dim**2))
            parts.append(norms)
        return parts

    def _keep_norms(self, kernel: Gaussian, norms: np.ndarray) -> None:
        """Keep the squared norms of all points under ``kernel`` if it is a round's kernel."""
        if any(k is kernel for k in self.kernels):
            bounds = np.cumsum(self.sizes)[:-1]
            self._norms[id(kernel)] = np.split(norms, bounds)

    def homogeneous_columns(self, frame: Frame) -> np.ndarray:
        """All points in the (full) frame's coordinates as the columns of a (d + 1, N) array
        whose last row is ones: the full family's layout (:meth:`FullFamily.from_columns
        <vsbayes.engine.families.FullFamily.from_columns>`), built in blocks side by side
        straight from each round's stored z, without an (N, d) intermediate."""
        d, kernel = self.dim, frame.kernel
        out = np.empty((d + 1, self.n_samples))
        out[d] = 1.0
        tasks, offset = [], 0
        for own, z in zip(self.kernels, self._z, strict=True):
            transform = None if own is kernel else self._transform(own, kernel)
            tasks += [(z, rows, offset, transform) for rows in block_slices(len(z), d * d)]
            offset += len(z)

        def block(task):
            z, rows, offset, transform = task
            cols = slice(offset + rows.start, offset + rows.stop)
            if transform is None:
                out[:d, cols] = z[rows].T
            else:  # (A z + b)ᵀ for the block, written in place by one product
                a, b = transform
                np.matmul(a, z[rows].T, out=out[:d, cols])
                out[:d, cols] += b[:, None]

        map_blocks(block, tasks)
        self._keep_norms(kernel, np.einsum("ij,ij->j", out[:d], out[:d]))
        return out

    @staticmethod
    def _transform(own: Gaussian, kernel: Gaussian) -> tuple[np.ndarray, np.ndarray]:
        """``(A, b)`` with ``L⁻¹(x - m) = A z + b`` for the points ``x = m_r + L_r z`` of a
        round kernel ``own``, in ``kernel``'s whitened coordinates: ``A = L⁻¹ L_r``,
        ``b = L⁻¹(m_r - m)``. A product of the stored z: half the multiply-adds of a
        triangular solve against x, and better shaped for BLAS."""
        a = solve_triangular(kernel.chol, own.chol, lower=True)
        b = solve_triangular(kernel.chol, own.mean - kernel.mean, lower=True)
        return a, b

    def _whitened_rounds(self, kernel: Gaussian) -> list[np.ndarray]:
        """Each round's points in the whitened coordinates of ``kernel``: ``A z_r + b``
        (:meth:`_transform`), in blocks side by side."""
        out = []
        for own, z in zip(self.kernels, self._z, strict=True):
            if own is kernel:
                out.append(z)
                continue
            a, b = self._transform(own, kernel)
            u = np.empty_like(z)

            def block(rows, z=z, a=a, b=b, u=u):
                np.matmul(z[rows], a.T, out=u[rows])
                u[rows] += b

            map_blocks(block, block_slices(len(z), self.dim**2))
            out.append(u)
        return out

    def log_importance_weights(self) -> np.ndarray:
        """``log w_k + log p(x_k) - log π(x_k)``: the log importance weights."""
        return self.log_weights() + self.log_p - self.log_window()

    def coordinates(self, frame: Frame) -> np.ndarray:
        """All points in ``frame`` coordinates (reusing the draws' own when possible)."""
        if frame.diagonal:
            return frame.coordinates(self.x)
        parts = self._whitened_rounds(frame.kernel)
        z = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._keep_norms(frame.kernel, np.einsum("ij,ij->i", z, z))
        return z
