"""Laplace approximation of a log-concave GLM posterior, binary or multinomial, by damped Newton.

One solver, :class:`NewtonLaplaceSolver`, whose steps are small named methods in the manner
of scikit-learn's ``_glm._newton_solver.NewtonSolver`` (setup, update_gradient_hessian,
inner_solve, check_convergence, line_search, finalize): its loop, Armijo line search,
stopping rule and Laplace Gaussian are the same for every posterior. What differs — how
the log-posterior's value, gradient and negative Hessian are formed and factorized — is a
:class:`Curvature` strategy the solver is given:

* :class:`GLMCurvature`: a binary posterior with its rows in memory. The negative Hessian
  is ``diag(1/prior_var) + Aᵀ diag(s_i h_i) A``, factorized by :class:`GLMGaussian` in
  primal (p × p) or dual (M × M, Woodbury) form.
* :class:`ChunkedGLMCurvature`: a binary posterior whose rows are in dask chunks; the
  model sums the value, gradient and negative Hessian over its chunks in one pass.
* :class:`SoftmaxCurvature`: the multinomial posterior, with its dense (K(d + 1))² Hessian
  (K(K + 1)/2 weighted Gram matrices, :class:`~vsbayes.models.SoftmaxGLMPosterior`), in
  memory or in chunks.
* :class:`RowCurvature`: one row under a Gaussian prior (``partial_fit`` of one row,
  :func:`row_laplace`): Newton's iterates from the prior mean stay on the line
  ``μ + Σa λ``, so they are the iterates of the one-dimensional problem in ``t = aᵀθ``.
"""

from __future__ import annotations

import abc
import math
from typing import NamedTuple

import numpy as np
from scipy.linalg import cho_solve

from .._blas import single_blas_thread
from .._progress import stage
from .._warnings import warn
from ..engine import LaplaceResult
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ..models import BinaryGLMPosterior, ChunkedSoftmaxPosterior, SoftmaxGLMPosterior
from ..models.softmax_predictive_rules import centred_basis
from ._design_forms import precision_diagonal
from ._glm_gaussian import BlockLatent, GLMGaussian, RowLatent
from ._threads import blas_policy
from .shrinkage_mode import shrinkage_laplace

__all__ = [
    "ChunkedGLMCurvature",
    "Curvature",
    "GLMCurvature",
    "ModeSites",
    "NewtonLaplaceSolver",
    "SoftmaxCurvature",
    "curvature_for",
    "glm_laplace",
    "latent_softmax_mode",
    "row_laplace",
    "softmax_mode_site_updates",
    "softmax_row_laplace",
]

_HESSIAN = "negative Hessian of the log-posterior"
# A predicted gain below this many units of round-off of log p's value cannot be measured
# (two evaluations of log p differ by about that much anyway): the iterate is at the mode
# to working precision, and has converged whatever smaller tol was asked for.
_ROUND_OFF_ULPS = 4.0
_EPS = float(np.finfo(float).eps)


class Curvature(abc.ABC):
    """How :class:`NewtonLaplaceSolver` forms and factorizes log p's second-order expansion.

    Parameters
    ----------
    model
        The posterior.

    Attributes
    ----------
    final_step : bool
        The default of the solver's ``final_step`` (see :class:`NewtonLaplaceSolver`).
    """

    final_step = False

    def __init__(self, model):
        self.model = model

    @abc.abstractmethod
    def expand(self, theta: np.ndarray) -> tuple[float, np.ndarray, GLMGaussian]:
        """``log p(θ)``, its gradient and the Gaussian whose precision is the negative
        Hessian at θ (its ``solve`` and ``half_log_det`` are what the solver uses)."""

    @abc.abstractmethod
    def log_density(self, theta: np.ndarray) -> float:
        """``log p(θ)`` at one point: the line search's trial values, which Armijo's test
        compares with :meth:`expand`'s."""

    def covariance(self, gaussian: GLMGaussian) -> np.ndarray:
        """The Laplace covariance, the inverse of the negative Hessian ``gaussian`` holds."""
        return gaussian.cov


def _elongated(diagonal: np.ndarray) -> NotPositiveDefiniteError:
    """The error for a binary posterior too elongated for float64, with its remedy, given
    the diagonal of the negative Hessian."""
    return NotPositiveDefiniteError(
        f"The negative Hessian of the log-posterior is not numerically positive "
        f"definite: the posterior is too elongated for float64 (its curvature "
        f"ranges from {diagonal.min():.3g} to {diagonal.max():.3g} along the "
        f"coefficients). Typical cause: collinear or duplicated features on a large "
        f"scale with a vague prior. Standardize the features (StandardScaler), drop "
        f"duplicated columns, or use a smaller C."
    )


class GLMCurvature(Curvature):
    """A binary posterior with its rows in memory: the negative Hessian only as its
    curvature weights ``s_i h_i``, factorized by :class:`GLMGaussian` in primal or dual
    form (the dual one never forms the p × p matrix).

    Parameters
    ----------
    model : BinaryGLMPosterior
        Log-concave posterior with ``design``, ``link``, ``log_prior`` and ``prior_var``.
    form : {"auto", "primal", "dual"}, default="auto"
        Factorization of the negative Hessian (see :class:`GLMGaussian`).
    """

    def __init__(self, model: BinaryGLMPosterior, form: str = "auto"):
        super().__init__(model)
        self.form = form
        self._weights = None

    def expand(self, theta: np.ndarray) -> tuple[float, np.ndarray, GLMGaussian]:
        model = self.model
        t = np.asarray(model.design @ theta).ravel()
        value = self._value(theta, t)
        slope, curvature = model.link.derivatives(t)
        grad = np.asarray(model.design.T @ (model.sample_weight * slope)).ravel()
        grad -= (theta - model.prior_mean) / model.prior_var
        self._weights = weights = model.sample_weight * curvature
        return value, grad, self._negative_hessian(weights)

    def _negative_hessian(self, weights: np.ndarray) -> GLMGaussian:
        """The negative Hessian at curvature weights ``weights``, factorized."""
        try:
            return GLMGaussian(self.model, weights, form=self.form, what=_HESSIAN)
        except NotPositiveDefiniteError:
            raise _elongated(precision_diagonal(self.model, weights)) from None

    def log_density(self, theta: np.ndarray) -> float:
        # Not model.log_density: its logistic terms are float32 (1e-7 each, fine for the
        # sampling fits), and near the mode that noise, not the gain, would decide Armijo's
        # test against expand's exact value (measured: a fit without intercept stalled
        # after 22 iterations; with the same exact value on both sides, 6).
        return self._value(theta, np.asarray(self.model.design @ theta).ravel())

    def _value(self, theta: np.ndarray, t: np.ndarray) -> float:
        """``log p(θ)`` up to its constant, exactly (float64), from the rows' ``t = Aθ``."""
        model = self.model
        return float(model.sample_weight @ model.link.log_cdf(t)) + float(
            model.log_prior(theta[None])[0]
        )

    def covariance(self, gaussian: GLMGaussian) -> np.ndarray:
        weights = self._weights  # the last expansion's: that of the mode
        try:
            return gaussian.cov
        except NotPositiveDefiniteError:
            raise _elongated(precision_diagonal(self.model, weights)) from None


class _DenseCurvature(Curvature):
    """A model that forms its dense negative Hessian itself (``value_gradient_hessian``),
    factorized by Cholesky (:class:`GLMGaussian`'s primal form from the precision)."""

    def expand(self, theta: np.ndarray) -> tuple[float, np.ndarray, GLMGaussian]:
        value, grad, precision = self.model.value_gradient_hessian(theta)
        try:
            return value, grad, GLMGaussian(self.model, precision=precision, what=_HESSIAN)
        except NotPositiveDefiniteError:
            raise self._not_positive_definite(precision) from None

    @abc.abstractmethod
    def _not_positive_definite(self, precision: np.ndarray) -> NotPositiveDefiniteError:
        """The error to raise when the negative Hessian has no Cholesky factor."""


class ChunkedGLMCurvature(_DenseCurvature):
    """A binary posterior whose rows are in dask chunks
    (:class:`~vsbayes.models.ChunkedPosterior`): the value, gradient and negative Hessian
    in one pass over the chunks, the Hessian factorized in primal form."""

    def log_density(self, theta: np.ndarray) -> float:
        # One pass over the chunks, exact as GLMCurvature's (float32 logistic terms stalled
        # the line search short of the mode: 1e-4 relative off the in-memory fit).
        return self.model.log_density_at(theta)

    def _not_positive_definite(self, precision: np.ndarray) -> NotPositiveDefiniteError:
        return _elongated(np.diag(precision))


class SoftmaxCurvature(_DenseCurvature):
    """The multinomial posterior (:class:`~vsbayes.models.SoftmaxGLMPosterior` or its
    chunked counterpart): the dense ``p × p`` negative Hessian (p = K(d + 1)) and its
    Cholesky factor. Its solver takes the final step by default."""

    final_step = True

    def log_density(self, theta: np.ndarray) -> float:
        log_lik, _ = self.model.probabilities(theta)
        return log_lik + float(self.model.log_prior(theta[None])[0])

    def _not_positive_definite(self, precision: np.ndarray) -> NotPositiveDefiniteError:
        return NotPositiveDefiniteError(
            "The negative Hessian of the multinomial log-posterior is not numerically "
            "positive definite: the posterior is too elongated for float64. Standardize "
            "the features (StandardScaler), drop duplicated columns, or use a smaller C."
        )

    def covariance(self, gaussian: GLMGaussian) -> np.ndarray:
        # Solves against the identity (GLMGaussian.cov's LAPACK inverse takes a third of
        # the flops, but changes the multinomial fits' covariances in their last digits).
        return gaussian.solve(np.eye(self.model.dim))


class _LatentRow(NamedTuple):
    """The posterior of one row's latent ``t = aᵀθ``: ``F(t)^weight N(t; mean, var)``."""

    link: object
    weight: float
    mean: float
    var: float
    dim: int = 1


class _ScalarHessian:
    """A 1 × 1 negative Hessian, as :class:`GLMGaussian` offers it to the solver."""

    def __init__(self, value: float):
        self.value = value
        self.half_log_det = 0.5 * math.log(value)

    def solve(self, v: np.ndarray) -> np.ndarray:
        return v / self.value

    @property
    def cov(self) -> np.ndarray:
        return np.array([[1.0 / self.value]])


class RowCurvature(Curvature):
    """One row's latent ``t`` under its Gaussian prior marginal N(m, v) (a
    :class:`_LatentRow`): ``log p(t) = s log F(t) + log N(t; m, v)``.

    From the prior mean, the p-dimensional Newton iterates of prior × one factor are
    ``μ + Σa (t − m) / v`` with ``t`` the iterates of this one-dimensional problem: the
    gradient is ``a g(t)``, the Newton step ``Σa g(t) / (1 + s h(t) v)``, and Armijo's
    test and the decrement are the same numbers (log p differs by a constant). So the
    solver run on it takes the same steps, and stops at the same iterate."""

    def expand(self, theta: np.ndarray) -> tuple[float, np.ndarray, _ScalarHessian]:
        row = self.model
        slope, curvature = row.link.derivatives(theta)
        grad = row.weight * slope - (theta - row.mean) / row.var
        hessian = _ScalarHessian(float(row.weight * curvature[0] + 1.0 / row.var))
        return self.log_density(theta), grad, hessian

    def log_density(self, theta: np.ndarray) -> float:
        row = self.model
        t = float(theta[0])
        return (
            row.weight * float(row.link.log_cdf(theta)[0])
            - 0.5 * (t - row.mean) ** 2 / row.var
            - 0.5 * math.log(2.0 * math.pi * row.var)
        )


def row_laplace(
    prior_mean: np.ndarray,
    prior_cov: np.ndarray,
    prior_lower: np.ndarray,
    row: np.ndarray,
    weight: float,
    link,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
) -> LaplaceResult:
    """Laplace approximation of ``F(aᵀθ)^weight N(θ; μ, Σ)``: one row under a Gaussian prior.

    The same Newton iterations as :func:`glm_laplace` from the prior mean (see
    :class:`RowCurvature`), in the one dimension they move in, then the rank-one update of
    the prior (:class:`~vsbayes.approximations._glm_gaussian.RowLatent`): O(p²) instead of
    a p × p factorization per iteration.

    Parameters
    ----------
    prior_mean, prior_cov, prior_lower : ndarray of shapes (p,), (p, p), (p, p)
        The prior N(μ, Σ) and the Cholesky factor of Σ.
    row : ndarray of shape (p,)
        The signed row ``a = y [x, 1]``.
    weight : float
        Its weight s > 0 (the likelihood ``F^s``).
    link : Link
        The link F.
    tol, max_iter
        As :func:`glm_laplace`'s.

    Returns
    -------
    LaplaceResult
        Its ``converged`` is False where ``max_iter`` was reached (no warning here: the
        caller decides), and ``log_Z`` the Laplace evidence
        ``s log F(t*) − (t* − m)² / (2v) − ½ log(1 + s h(t*) v)``.
    """
    latent = RowLatent.of(prior_mean, prior_lower, row)
    problem = _LatentRow(link, float(weight), latent.mean, latent.var)
    solver = NewtonLaplaceSolver(
        problem, tol=tol, max_iter=max_iter, curvature=RowCurvature(problem)
    )
    solver.find_mode(np.array([latent.mean]))
    t_mode, t_var = float(solver.theta[0]), 1.0 / solver.gaussian.value
    mean, cov = latent.conditioned(prior_mean, prior_cov, t_mode, t_var)
    return _row_update_result(
        solver,
        mean,
        cov,
        prior_lower,
        latent_log_norm=0.5 * math.log(2.0 * math.pi * latent.var),
        grad_norm=abs(float(solver.grad[0])) * float(np.linalg.norm(row)),
    )


def _row_update_result(
    solver, mean, cov, prior_lower, latent_log_norm: float, grad_norm: float
) -> LaplaceResult:
    """The Laplace fit of a row's update (:func:`row_laplace`, :func:`softmax_row_laplace`)
    from Newton's ``solver`` in the row's r latent values and θ's updated moments."""
    r = solver.theta.size
    value = solver.value + 0.5 * r * math.log(2.0 * math.pi) - solver.gaussian.half_log_det
    # log p(θ*) in θ's coordinates: the latent's log p plus log N(θ*) − log N(t*) of the
    # prior, i.e. the Gaussian normalizer of Σ in place of the latent's.
    log_det = 2.0 * float(np.log(np.diag(prior_lower)).sum())
    at_mode = solver.value + latent_log_norm
    at_mode -= 0.5 * (mean.size * math.log(2.0 * math.pi) + log_det)
    return LaplaceResult(
        mean,
        cov,
        value,
        n_iter=solver.n_iter,
        converged=solver.converged or solver.stalled,
        grad_norm=grad_norm,
        log_density_at_mode=at_mode,
    )


class _SoftmaxLatentRow(NamedTuple):
    """The posterior of one multinomial row's contrasts g (r = K − 1 values):
    ``softmax(Qg)[label]^weight N(g; mean, precision⁻¹)``."""

    q: np.ndarray
    label: int
    weight: float
    mean: np.ndarray
    precision: np.ndarray
    log_norm: float  #: ½ log det(2π V), V = precision⁻¹
    dim: int


class _SmallHessian:
    """An r × r negative Hessian (r small), as :class:`GLMGaussian` offers it to the
    solver."""

    def __init__(self, value: np.ndarray):
        self.lower = np.linalg.cholesky(value)
        self.half_log_det = float(np.log(np.diag(self.lower)).sum())

    def solve(self, v: np.ndarray) -> np.ndarray:
        return cho_solve((self.lower, True), v, check_finite=False)

    @property
    def cov(self) -> np.ndarray:
        cov = self.solve(np.eye(self.lower.shape[0]))
        return 0.5 * (cov + cov.T)


class SoftmaxRowCurvature(Curvature):
    """One multinomial row's contrasts ``g = Qᵀ(Θx̃)`` under their Gaussian prior marginal
    (a :class:`_SoftmaxLatentRow`): :class:`RowCurvature`'s argument in K − 1 dimensions.
    From the prior mean the p-dimensional iterates are ``μ + ΣAᵀV⁻¹(g − m)`` with g these
    iterates (the same decrements and Armijo tests), and as :class:`SoftmaxCurvature` the
    solver takes the final step."""

    final_step = True

    def _expansion(self, theta: np.ndarray):
        row = self.model
        return _softmax_expansion(
            row.q,
            np.array([row.label]),
            np.array([row.weight]),
            row.mean[None],
            row.precision[None],
            theta[None],
        )

    def expand(self, theta: np.ndarray) -> tuple[float, np.ndarray, _SmallHessian]:
        value, grad, curvature = self._expansion(theta)
        hessian = curvature[0] + self.model.precision
        return (
            float(value[0]) - self.model.log_norm,
            grad[0],
            _SmallHessian(0.5 * (hessian + hessian.T)),
        )

    def log_density(self, theta: np.ndarray) -> float:
        row = self.model
        log_softmax, _ = _log_softmax(row.q, np.array([row.label]), theta[None])
        centred = theta - row.mean
        return (
            row.weight * float(log_softmax[0])
            - 0.5 * float(centred @ row.precision @ centred)
            - row.log_norm
        )


def latent_softmax_mode(
    latent, q: np.ndarray, label: int, weight: float, *, tol: float, max_iter: int
) -> NewtonLaplaceSolver:
    """Newton's method on one multinomial row's contrasts from their prior mean
    (:class:`SoftmaxRowCurvature`): the solver, at the mode (``theta``, ``value``,
    ``gaussian``). ``latent`` is the row's
    :class:`~vsbayes.approximations._glm_gaussian.BlockLatent`."""
    precision = np.linalg.inv(latent.cov)
    _, log_det = np.linalg.slogdet(2.0 * math.pi * latent.cov)
    problem = _SoftmaxLatentRow(
        q,
        int(label),
        float(weight),
        latent.mean,
        0.5 * (precision + precision.T),
        0.5 * log_det,
        len(latent.mean),
    )
    solver = NewtonLaplaceSolver(
        problem, tol=tol, max_iter=max_iter, curvature=SoftmaxRowCurvature(problem)
    )
    solver.find_mode(latent.mean.copy())
    return solver


def softmax_row_laplace(
    prior_mean: np.ndarray,
    prior_cov: np.ndarray,
    prior_lower: np.ndarray,
    row: np.ndarray,
    label: int,
    n_classes: int,
    weight: float,
    *,
    fit_intercept: bool = True,
    tol: float = 1e-8,
    max_iter: int = 100,
) -> LaplaceResult:
    """Laplace approximation of one multinomial row under a Gaussian prior of θ
    (``[W.ravel(), b]``): :func:`row_laplace` in the row's K − 1 contrasts
    (:func:`latent_softmax_mode`), then the rank-(K − 1) update of the prior
    (:class:`~vsbayes.approximations._glm_gaussian.BlockLatent`).

    Parameters
    ----------
    prior_mean, prior_cov, prior_lower : ndarray of shapes (p,), (p, p), (p, p)
        The prior N(μ, Σ) and the Cholesky factor of Σ.
    row : ndarray of shape (d,)
        The row's features.
    label : int
        Its class index.
    n_classes : int
        K.
    weight : float
        Its weight s > 0.
    fit_intercept : bool, default=True
        Whether θ ends with the K intercepts.
    tol, max_iter
        As :func:`softmax_laplace`'s.

    Returns
    -------
    LaplaceResult
        As :func:`row_laplace`'s.
    """
    q = centred_basis(n_classes)
    latent = BlockLatent.of_softmax_row(prior_mean, prior_cov, row, q, fit_intercept)
    solver = latent_softmax_mode(latent, q, label, weight, tol=tol, max_iter=max_iter)
    mean, cov = latent.conditioned(prior_mean, prior_cov, solver.theta, solver.gaussian.cov)
    return _row_update_result(
        solver,
        mean,
        cov,
        prior_lower,
        latent_log_norm=solver.model.log_norm,
        grad_norm=float(np.linalg.norm(latent.rows.T @ solver.grad)),
    )


def _log_softmax(q, labels, g) -> tuple[np.ndarray, np.ndarray]:
    """``log softmax(Qg)[y]`` of each row (g: (m, r)), and the class probabilities."""
    f = g @ q.T
    f -= f.max(axis=1)[:, None]
    p = np.exp(f)
    total = p.sum(axis=1)
    p /= total[:, None]
    return f[np.arange(len(f)), labels] - np.log(total), p


def _rows_of(args, rows):
    """``(q, labels, power, cav_mean, cav_prec)`` at some rows (q is shared)."""
    return (args[0], *(a[rows] for a in args[1:]))


def _softmax_expansion(q, labels, power, cav_mean, cav_prec, g):
    """The value ``s log softmax(Qg)[y] − (g − m)ᵀP(g − m)/2``, the gradient (m, r) and the
    likelihood's negative Hessian ``s Qᵀ(diag p − ppᵀ)Q`` (m, r, r) of each row's tilted
    log density at g (as :class:`SoftmaxRowCurvature`'s)."""
    log_softmax, p = _log_softmax(q, labels, g)
    residual = -power[:, None] * p
    residual[np.arange(len(p)), labels] += power
    centred = g - cav_mean
    shift = (cav_prec @ centred[..., None])[..., 0]
    value = power * log_softmax - 0.5 * (centred * shift).sum(axis=1)
    curvature = -power[:, None, None] * (p[:, :, None] * p[:, None, :])
    diagonal = np.arange(p.shape[1])
    curvature[:, diagonal, diagonal] += power[:, None] * p
    return value, residual @ q - shift, q.T @ curvature @ q


#: Most halvings of a Newton step in :func:`softmax_mode_site_updates`.
_HALVINGS = 40


def _halve_steps(args, g, step, value, slope, short, trial, expansion) -> None:
    """A line search of the rows ``short`` over the halved steps ``2⁻ᵏ step`` (k = 1,
    ..., :data:`_HALVINGS`): each takes, of those that rise by at least 10⁻⁴ of their
    predicted rise (Armijo's test), the one of the highest log density, or the last,
    written into ``trial`` and ``expansion`` (their values, gradients and curvatures) at
    those rows.

    All halvings of all rows are expanded at once, (rows × 40) points of K − 1 dimensions:
    over a wide cavity the Newton step overshoots the tilted mode by orders of magnitude
    (the likelihood nearly linear there, the cavity's precision tiny) and took 10-20
    halvings in turn, each a round of numpy calls on a few points that cost about as much
    as all of them. Of the passing points, the first (Armijo's backtracking) landed as far
    beyond the mode again, the next Newton step halved that distance, and a stream's first
    rows under the vague intercept prior took 11-14 Newton steps; the best of them is
    within a factor 2 of the step to the mode along the line: 6-10 steps."""
    rows = np.flatnonzero(short)
    scales = 0.5 ** np.arange(1, _HALVINGS + 1)
    points = g[rows, None, :] + scales[None, :, None] * step[rows, None, :]
    n, r = len(rows), g.shape[1]
    repeated = [np.repeat(a[rows], _HALVINGS, axis=0) for a in args[1:]]
    values, grads, curvatures = _softmax_expansion(
        args[0], *repeated, points.reshape(n * _HALVINGS, r)
    )
    values = values.reshape(n, _HALVINGS)
    rises = values >= value[rows, None] + 1e-4 * scales[None, :] * slope[rows, None]
    best = np.where(rises, values, -np.inf).argmax(axis=1)
    first = np.where(rises.any(axis=1), best, _HALVINGS - 1)
    taken = np.arange(n) * _HALVINGS + first
    trial[rows] = points[np.arange(n), first]
    for whole, part in zip(expansion, (values.ravel(), grads, curvatures), strict=True):
        whole[rows] = part[taken]


class ModeSites(NamedTuple):
    """:func:`softmax_mode_site_updates`' sites, and each row's tilted mode."""

    lam: np.ndarray  #: (m, r, r): the new site precisions (the current where not found)
    eta: np.ndarray  #: (m, r): their linear terms
    log_z: np.ndarray  #: (m,): Laplace's log ∫ F^s × cavity, normalized cavity (NaN: not found)
    found: np.ndarray  #: (m,): the cavity proper and Newton converged
    mode: np.ndarray  #: (m, r): the tilted densities' modes g*
    gradient: np.ndarray  #: (m, r): their log densities' gradients at g* (round-off)
    log_density: np.ndarray  #: (m,): ``s log F(g*) − (g* − m_c)ᵀP(g* − m_c)/2``


def softmax_mode_site_updates(
    q: np.ndarray,
    labels: np.ndarray,
    latent_mean: np.ndarray,
    latent_cov: np.ndarray,
    lam: np.ndarray,
    eta: np.ndarray,
    power: np.ndarray,
    *,
    tol: float = 1e-10,
    max_iter: int = 50,
    start: np.ndarray | None = None,
    cavities: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> ModeSites:
    """Laplace propagation's update of some multinomial rows' sites, all from one
    posterior: each row's cavity (the posterior's marginal ``N(m_i, V_i)`` of its
    contrasts without its site ``(Λ_i, η_i)``), the mode g* of its tilted density
    ``softmax(Qg)[y]^s × cavity`` by Newton's method in the K − 1 contrasts (all rows at
    once, Armijo-halved steps: the density is log-concave), and the new site, the
    likelihood's curvature ``H = s Qᵀ(diag p − ppᵀ)Q`` at g* and ``(P + H) g* − h`` (the
    Gaussian of the tilted density's mode and curvature over the cavity's): with a site of
    zeros, :func:`softmax_row_laplace`'s update; at its fixed point over all sites, the
    joint Laplace approximation.

    Parameters
    ----------
    q, labels, latent_mean, latent_cov, lam, eta, power
        As :func:`~vsbayes.approximations.softmax_ep.softmax_site_updates`'s.
    tol : float, default=1e-10
        Stop where half the Newton decrement (the log density's predicted rise) is within
        ``tol`` or round-off, as :class:`NewtonLaplaceSolver`, after that final step.
    max_iter : int, default=50
        Most Newton steps.
    start : ndarray of shape (m, r), optional
        Newton's starting points (a row's with a non-finite entry, or all without it:
        the posterior's marginal mean). Any start reaches the same mode (the density is
        log-concave); one near it saves the steps from a wide cavity's mean, most of which
        Armijo's test halves.
    cavities : tuple of ndarray, optional
        The rows' cavities' precisions, linear terms and means, all proper, where the
        caller has them
        (:func:`~vsbayes.approximations._softmax_tilted_moments._few_tilted_sites`):
        not formed again from the latent moments and sites.

    At three classes (K − 1 = 2) and up to :data:`_SCALAR_ROWS` rows (a one-row call's
    window) each row's Newton runs on Python floats (:func:`_three_class_row_mode`: the
    same iteration to round-off, each row stopping at its own convergence).

    Returns
    -------
    ModeSites
        The new sites (the current ones where not found), the Laplace approximations of
        log ∫ F^s × cavity over the normalized cavities, whether each row's cavity was
        proper and Newton's method converged, and the modes with the gradients and log
        densities there.
    """
    m, r = latent_mean.shape
    if cavities is None:
        precision = np.linalg.inv(latent_cov)
        precision = 0.5 * (precision + np.swapaxes(precision, 1, 2))
        cav_prec = precision - lam
        cav_lin = np.einsum("mab,mb->ma", precision, latent_mean) - eta
        try:
            np.linalg.cholesky(cav_prec)
            ok = np.ones(m, dtype=bool)
        except np.linalg.LinAlgError:
            ok = np.linalg.eigvalsh(cav_prec)[:, 0] > 0
        cav_prec = np.where(ok[:, None, None], cav_prec, np.eye(r))
        cav_lin = np.where(ok[:, None], cav_lin, 0.0)
        cav_mean = np.linalg.solve(cav_prec, cav_lin[..., None])[..., 0]
    else:
        cav_prec, cav_lin, cav_mean = cavities
        ok = np.ones(m, dtype=bool)
    labels = np.asarray(labels)
    args = (q, labels, power, cav_mean, cav_prec)
    # From the posterior's marginal mean: the tilted mode of a row whose site is at Laplace
    # propagation's fixed point (a revisit's warm start), the cavity's of a new row.
    g = np.where(ok[:, None], latent_mean, cav_mean)
    if start is not None:
        given = ok & np.isfinite(start).all(axis=1)
        g = np.where(given[:, None], start, g)
    scalar = None
    if r == 2 and m <= _SCALAR_ROWS:
        try:
            scalar = _three_class_modes(args, g, tol, max_iter)
        except (ZeroDivisionError, OverflowError, ValueError):  # (a singular step: arrays')
            scalar = None
    if scalar is not None:
        g, value, grad, curvature, converged = scalar
    else:
        g, value, grad, curvature, converged = _array_modes(args, g, tol, max_iter)
    found = ok & converged
    hessian = curvature + cav_prec
    new_lam = np.where(found[:, None, None], 0.5 * (curvature + np.swapaxes(curvature, 1, 2)), lam)
    new_eta = np.where(found[:, None], np.einsum("mab,mb->ma", hessian, g) - cav_lin, eta)
    # Laplace's log ∫ F^s N(g; m_c, P⁻¹): s log F(g*) − (g* − m_c)ᵀP(g* − m_c)/2 −
    # log det(P⁻¹(P + H))/2.
    if r == 2:  # the 2 × 2 determinants written out (two LAPACK calls less)
        ratio = _det_2x2(hessian) / _det_2x2(cav_prec)
        log_z = value - 0.5 * np.log(np.abs(ratio))
    else:
        _, log_det_hessian = np.linalg.slogdet(hessian)
        _, log_det_prec = np.linalg.slogdet(cav_prec)
        log_z = value - 0.5 * (log_det_hessian - log_det_prec)
    return ModeSites(new_lam, new_eta, np.where(found, log_z, np.nan), found, g, grad, value)


def _det_2x2(matrices: np.ndarray) -> np.ndarray:
    """Determinants of (m, 2, 2) matrices."""
    return matrices[:, 0, 0] * matrices[:, 1, 1] - matrices[:, 0, 1] * matrices[:, 1, 0]


#: Most rows of :func:`softmax_mode_site_updates` whose Newton runs row by row on Python
#: floats at three classes (a one-row call's window: six rows at most).
_SCALAR_ROWS = 16


def _three_class_modes(args, g, tol, max_iter):
    """:func:`_array_modes` at three classes (K − 1 = 2 contrasts), each row's Newton on
    Python floats (:func:`_three_class_row_mode`). numpy's per-call cost (1-9 µs a step,
    the 2 × 2 solves ~7 µs) on (m, 2) and (m, 2, 2) arrays made an iteration ~40 µs, and
    the kernels' Newton most of a one-row call on a stream's first rows (0.2-1 ms, 6-10
    steps on a wide cavity); here a few µs. Returns None (the arrays' path) where a value
    is not finite."""
    q, labels, power, cav_mean, cav_prec = args
    basis = tuple(q.ravel().tolist())
    modes = [
        _three_class_row_mode(
            basis, label, s, mean, (p00, 0.5 * (p01 + p10), p11), start, tol, max_iter
        )
        for label, s, mean, ((p00, p01), (p10, p11)), start in zip(
            labels.tolist(),
            power.tolist(),
            cav_mean.tolist(),
            cav_prec.tolist(),
            g.tolist(),
            strict=True,
        )
    ]
    if not all(
        math.isfinite(sum(mode[0]) + mode[1] + sum(mode[2]) + sum(mode[3])) for mode in modes
    ):
        return None
    g, value, grad, curvature, converged = zip(*modes, strict=True)
    curvature = np.array([((c00, c01), (c01, c11)) for c00, c01, c11 in curvature])
    return np.array(g), np.array(value), np.array(grad), curvature, np.array(converged)


def _three_class_kernels(q, labels, power, cavities, latent_mean, start, tol, max_iter=50):
    """The Laplace approximations of some rows' tilted densities at three classes, as
    :func:`softmax_mode_site_updates` with ``cavities`` gives them to
    :func:`~vsbayes.approximations.softmax_ep.softmax_site_updates`' kernels, on Python
    floats: each row's mode by :func:`_three_class_row_mode` (from ``start`` where finite,
    else the posterior's marginal mean), and the covariance ``(P + H)⁻¹`` there by its
    adjugate (exactly symmetric) — without the arrays that function builds around its
    Newton (its sites, evidence and cavities' checks, ~50 µs on a few rows). Returns the
    modes (m, 2), covariances (m, 2, 2) and whether each row's Newton converged; None
    where a value is not finite or a step singular (the general function decides)."""
    cav_prec, _, cav_mean = cavities
    basis = tuple(q.ravel().tolist())
    modes, covs, found = [], [], []
    try:
        for label, s, mean, ((p00, p01), (p10, p11)), given, marginal in zip(
            labels.tolist(),
            power.tolist(),
            cav_mean.tolist(),
            cav_prec.tolist(),
            start.tolist(),
            latent_mean.tolist(),
            strict=True,
        ):
            pm = 0.5 * (p01 + p10)
            first = given if math.isfinite(given[0] + given[1]) else marginal
            g, value, grad, (c00, c01, c11), converged = _three_class_row_mode(
                basis, label, s, mean, (p00, pm, p11), first, tol, max_iter
            )
            h00, h01, h11 = p00 + c00, pm + c01, p11 + c11
            det = h00 * h11 - h01 * h01
            off = -h01 / det
            if not math.isfinite(value + g[0] + g[1] + grad[0] + grad[1] + det + off):
                return None
            modes.append(g)
            covs.append(((h11 / det, off), (off, h00 / det)))
            found.append(converged)
    except (ZeroDivisionError, OverflowError, ValueError):
        return None
    return np.array(modes), np.array(covs), np.array(found, dtype=bool)


def _three_class_row_mode(basis, label, s, mean, precision, start, tol, max_iter):
    """One row's Newton of :func:`_array_modes` at three classes on Python floats: the same
    iteration (the full step, else of Armijo's passing halvings the one of the highest log
    density, else the last; the same stop), its 2 × 2 solve and expansion written out.
    ``basis``: Q's entries by rows; ``precision``: the cavity's (P₀₀, P₀₁, P₁₁). The
    halvings' best is found by scanning them from the longest: the log density is strictly
    concave along the step, so its values at the halvings rise to one peak and then fall,
    and the scan stops once they fall below the best passing one. Round-off apart (and a
    row stopping at its own convergence, not at all rows'), the iterates are
    :func:`_array_modes`'. Returns the mode (g₀, g₁), the log density, its gradient, the
    likelihood's curvature (C₀₀, C₀₁, C₁₁) there and whether Newton converged."""
    q00, q01, q10, q11, q20, q21 = basis
    m0, m1 = mean
    p00, pm, p11 = precision

    def log_density(g0, g1):
        f0, f1, f2 = q00 * g0 + q01 * g1, q10 * g0 + q11 * g1, q20 * g0 + q21 * g1
        top = max(f0, f1, f2)
        total = math.exp(f0 - top) + math.exp(f1 - top) + math.exp(f2 - top)
        chosen = (f0, f1, f2)[label] - top - math.log(total)
        c0, c1 = g0 - m0, g1 - m1
        return s * chosen - 0.5 * (c0 * (p00 * c0 + pm * c1) + c1 * (pm * c0 + p11 * c1))

    def expansion(g0, g1):
        f0, f1, f2 = q00 * g0 + q01 * g1, q10 * g0 + q11 * g1, q20 * g0 + q21 * g1
        top = max(f0, f1, f2)
        e0, e1, e2 = math.exp(f0 - top), math.exp(f1 - top), math.exp(f2 - top)
        total = e0 + e1 + e2
        chosen = (f0, f1, f2)[label] - top - math.log(total)
        p0, p1, p2 = e0 / total, e1 / total, e2 / total
        r0, r1, r2 = -s * p0, -s * p1, -s * p2  # s (e_y − p)
        if label == 0:
            r0 += s
        elif label == 1:
            r1 += s
        else:
            r2 += s
        c0, c1 = g0 - m0, g1 - m1
        h0, h1 = p00 * c0 + pm * c1, pm * c0 + p11 * c1
        value = s * chosen - 0.5 * (c0 * h0 + c1 * h1)
        grad = (r0 * q00 + r1 * q10 + r2 * q20 - h0, r0 * q01 + r1 * q11 + r2 * q21 - h1)
        # s Qᵀ(diag p − p pᵀ)Q = s (Σ p_k q_k q_kᵀ − (Qᵀp)(Qᵀp)ᵀ), q_k the rows of Q
        v0, v1 = p0 * q00 + p1 * q10 + p2 * q20, p0 * q01 + p1 * q11 + p2 * q21
        curvature = (
            s * (p0 * q00 * q00 + p1 * q10 * q10 + p2 * q20 * q20 - v0 * v0),
            s * (p0 * q00 * q01 + p1 * q10 * q11 + p2 * q20 * q21 - v0 * v1),
            s * (p0 * q01 * q01 + p1 * q11 * q11 + p2 * q21 * q21 - v1 * v1),
        )
        return value, grad, curvature

    g0, g1 = start
    value, (grad0, grad1), (c00, c01, c11) = expansion(g0, g1)
    converged = False
    eps = _ROUND_OFF_ULPS * _EPS
    for _ in range(max_iter):
        h00, h01, h11 = c00 + p00, c01 + pm, c11 + p11
        det = h00 * h11 - h01 * h01
        step0 = (h11 * grad0 - h01 * grad1) / det
        step1 = (h00 * grad1 - h01 * grad0) / det
        slope = grad0 * step0 + grad1 * step1  # twice the Newton decrement
        converged = 0.5 * slope <= max(tol, eps * abs(value))
        scale = 1.0
        trial = expansion(g0 + step0, g1 + step1)
        if not converged and not trial[0] >= value + 1e-4 * slope:
            best, scale, previous, at_scale = -math.inf, 0.5**_HALVINGS, -math.inf, 1.0
            for _ in range(_HALVINGS):
                at_scale *= 0.5
                at = log_density(g0 + at_scale * step0, g1 + at_scale * step1)
                if at >= value + 1e-4 * at_scale * slope and at > best:
                    best, scale = at, at_scale
                if at < previous and best >= at:  # past the peak, below the best
                    break
                previous = at
            trial = expansion(g0 + scale * step0, g1 + scale * step1)
        g0, g1 = g0 + scale * step0, g1 + scale * step1
        value, (grad0, grad1), (c00, c01, c11) = trial
        if converged:
            break
    return (g0, g1), value, (grad0, grad1), (c00, c01, c11), converged


def _array_modes(args, g, tol, max_iter):
    """Newton's iterations of :func:`softmax_mode_site_updates`, all rows at once: the
    modes, the log densities, their gradients and the likelihood's curvatures there, and
    whether each row converged."""
    value, grad, curvature = _softmax_expansion(*args, g)
    converged = np.zeros(len(g), dtype=bool)
    for _ in range(max_iter):
        step = np.linalg.solve(curvature + args[4], grad[..., None])[..., 0]
        slope = np.einsum("ma,ma->m", grad, step)  # twice the Newton decrement
        # As the solver's stop: half the decrement within tol (or round-off); the final
        # step is taken whole.
        round_off = _ROUND_OFF_ULPS * np.finfo(float).eps * np.abs(value)
        converged = 0.5 * slope <= np.maximum(tol, round_off)
        # The expansion at the full step: Armijo's test, and the next iteration's (or, the
        # final step, the mode's value and curvature).
        trial = g + step
        expansion = _softmax_expansion(*args, trial)
        short = ~converged & ~(expansion[0] >= value + 1e-4 * slope)
        if short.any():  # Armijo: halve the steps that do not rise enough
            _halve_steps(args, g, step, value, slope, short, trial, expansion)
        g = trial
        value, grad, curvature = expansion
        if converged.all():
            break
    return g, value, grad, curvature, converged


def curvature_for(model, form: str = "auto") -> Curvature:
    """The :class:`Curvature` of a model: multinomial, binary in chunks or binary in memory
    (``form`` is the latter's factorization; the others have only the primal one)."""
    if isinstance(model, (SoftmaxGLMPosterior, ChunkedSoftmaxPosterior)):
        curvature = SoftmaxCurvature(model)
    elif not model.rows_in_memory:
        curvature = ChunkedGLMCurvature(model)
    else:
        return GLMCurvature(model, form)
    if form not in ("auto", "primal"):
        raise ValueError(f"The {type(model).__name__}'s negative Hessian has no {form} form.")
    return curvature


class NewtonLaplaceSolver:
    """Newton's method with exact Hessian, Cholesky solves and Armijo backtracking.

    The Newton system is solved through the factorization ``curvature`` gives (see the
    module docstring): for a binary posterior in memory, :class:`GLMGaussian`'s p × p
    Cholesky factor when p ≤ M, the M × M dual (Woodbury) one when there are more
    coefficients than observations.

    Parameters
    ----------
    model : BinaryGLMPosterior, SoftmaxGLMPosterior or their chunked counterparts
        Log-concave posterior.
    tol : float
        Stop when half the squared Newton decrement ``gᵀH⁻¹g / 2`` — the increase of
        ``log p`` one more Newton step would bring — is at most ``tol``. A decrement below
        the round-off of ``log p``'s value (a few ``eps·|log p|``), which no step can
        measurably increase, also stops it, as converged: a smaller ``tol`` asks for
        digits float64 does not hold.
    max_iter : int
        Maximum Newton iterations.
    verbose : int
        Print one line per iteration when > 1.
    form : {"auto", "primal", "dual"}, default="auto"
        Factorization of the negative Hessian of a binary posterior in memory (see
        :class:`GLMGaussian`); the others have only the primal one. Used when
        ``curvature`` is None.
    curvature : Curvature, optional
        How the value, gradient and negative Hessian are formed and factorized; default
        :func:`curvature_for(model, form) <curvature_for>`.
    final_step : bool, optional
        Whether, once converged, to take the Newton step computed there: within ``tol`` of
        the mode the full step is safe, and the returned mode is one quadratically
        convergent step beyond the stopping point. It costs one more evaluation and
        factorization of the Hessian, at the new mode, which the Laplace Gaussian needs
        (the old one with the new mode would be inconsistent to the step's size). The
        math is the same for every posterior: it trades that cost for accuracy. Default:
        the curvature's ``final_step`` — True for the multinomial posterior, False for the
        binary ones, as each solver did before they were one (so each keeps its results).
    """

    def __init__(
        self,
        model,
        *,
        tol: float,
        max_iter: int,
        verbose: int = 0,
        form: str = "auto",
        curvature: Curvature | None = None,
        final_step: bool | None = None,
    ):
        self.model = model
        self.tol = tol
        self.max_iter = max_iter
        self.verbose = verbose
        self.form = form
        self.curvature = curvature
        self.final_step = final_step

    def setup(self, theta0: np.ndarray | None) -> None:
        curvature = self.curvature
        self._curvature = curvature_for(self.model, self.form) if curvature is None else curvature
        final_step = self.final_step
        self._final_step = self._curvature.final_step if final_step is None else final_step
        self.theta = np.zeros(self.model.dim) if theta0 is None else np.array(theta0, dtype=float)
        self.n_iter = 0
        self.converged = False
        self.stalled = False

    def update_gradient_hessian(self) -> None:
        self.value, self.grad, self.gaussian = self._curvature.expand(self.theta)

    def inner_solve(self) -> None:
        self.step = self.gaussian.solve(self.grad)
        self.half_decrement = 0.5 * float(self.grad @ self.step)

    def check_convergence(self) -> bool:
        round_off = _ROUND_OFF_ULPS * np.finfo(float).eps * abs(self.value)
        self.converged = self.half_decrement <= max(self.tol, round_off)
        return self.converged

    def line_search(self) -> None:
        """Backtrack from the full step until ``log p`` rises by the Armijo fraction."""
        slope = 2.0 * self.half_decrement  # directional derivative gᵀΔ
        t = 1.0
        for _ in range(40):
            trial = self.theta + t * self.step
            if self._curvature.log_density(trial) >= self.value + 1e-4 * t * slope:
                self.theta = trial
                return
            t *= 0.5
        # No increase is measurable: the iterate sits at round-off distance of the mode.
        self.stalled = True

    def find_mode(self, theta0: np.ndarray | None = None) -> None:
        """Run Newton's method from ``theta0`` (default 0), without the covariance.

        Afterwards ``theta`` is the mode, ``value`` the log-density there and ``gaussian``
        the :class:`GLMGaussian` of the negative Hessian (its ``half_log_det``, ``t_var``
        and ``solve`` need no p × p matrix in dual form). An observer of the fit
        (:mod:`vsbayes._progress`) sees each iteration, with the Laplace approximation at
        its iterates (what ``max_iter`` iterations would give).
        """
        self.setup(theta0)
        with stage("Newton's method for the mode", "newton iteration", self.max_iter) as steps:
            while True:
                self.update_gradient_hessian()
                if steps is not None and self.n_iter > 0:
                    steps.end(self.laplace_here)  # the iteration's end: its iterate expanded
                self.inner_solve()
                if self.verbose > 1:
                    print(
                        f"Newton iter {self.n_iter}: log p = {self.value:.10g}, "
                        f"decrement = {self.half_decrement:.3g}"
                    )
                if self.check_convergence():
                    if self._final_step:
                        # Within tol of the mode, the full step is safe and quadratically
                        # closer.
                        self.theta = self.theta + self.step
                        self.update_gradient_hessian()
                    break
                if self.stalled or self.n_iter >= self.max_iter:
                    break
                if steps is not None:
                    steps.begin(self.laplace_here)
                self.line_search()
                self.n_iter += 1
            if steps is not None:
                steps.result(self.laplace_here)

    def finalize(self) -> LaplaceResult:
        if not (self.converged or self.stalled):
            warn(
                f"Newton's method for the posterior mode did not converge in "
                f"max_iter={self.max_iter} iterations (predicted gain "
                f"{self.half_decrement:.3g} in log-posterior, tol={self.tol:g}). Increase "
                f"max_iter or standardize the features.",
                ConvergenceWarning,
            )
        return self.laplace_here()

    def laplace_here(self) -> LaplaceResult:
        """The Laplace approximation at the current iterate (its expansion there)."""
        d = self.model.dim
        log_Z = self.value + 0.5 * d * math.log(2 * math.pi) - self.gaussian.half_log_det
        curvature, gaussian = self._curvature, self.gaussian

        def cov() -> np.ndarray:
            # The p × p inverse is formed on first use only: EP started from the mode, or
            # the site-fit route, may never need it (at p = 500 it is half of Laplace's time).
            with single_blas_thread():  # as the fit itself (blas_policy)
                return curvature.covariance(gaussian)

        return LaplaceResult(
            self.theta,
            cov,
            log_Z,
            n_iter=self.n_iter,
            converged=self.converged or self.stalled,
            grad_norm=float(np.linalg.norm(self.grad)),
            log_density_at_mode=self.value,
        )

    def solve(self, theta0: np.ndarray | None = None) -> LaplaceResult:
        """Run Newton's method from ``theta0`` (default 0) and return the Laplace Gaussian."""
        self.find_mode(theta0)
        return self.finalize()


@blas_policy
def glm_laplace(
    model: BinaryGLMPosterior,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    theta0=None,
    verbose: int = 0,
) -> LaplaceResult:
    """Laplace approximation of a binary GLM posterior.

    The mode (MAP) is found by Newton's method (IRLS with the prior) from ``theta0``
    (default 0); the Gaussian has the negative inverse Hessian at the mode as covariance,
    and ``log_Z = log p(mode) + p/2 log 2π - ½ log det(-H)`` estimates the log evidence.

    Parameters
    ----------
    model : BinaryGLMPosterior
        The posterior.
    tol : float, default=1e-8
        Stop when half the squared Newton decrement is at most ``tol`` (nats).
    max_iter : int, default=100
        Maximum Newton iterations; a ConvergenceWarning is emitted when reached.
    theta0 : array-like of shape (p,), optional
        Starting point.
    verbose : int, default=0
        Print the iterations when > 1.

    Returns
    -------
    LaplaceResult
        Under a shrinkage prior on the coefficients (``model.coefficient_prior``), that of
        :func:`~vsbayes.approximations.shrinkage_mode.shrinkage_laplace` (proximal Newton:
        the prior may be non-smooth or not log-concave).
    """
    if getattr(model, "coefficient_prior", None) is not None:
        return shrinkage_laplace(model, tol=tol, max_iter=max_iter, theta0=theta0, verbose=verbose)
    solver = NewtonLaplaceSolver(model, tol=tol, max_iter=max_iter, verbose=verbose)
    return solver.solve(theta0)
