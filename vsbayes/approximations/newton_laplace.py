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

The modes of multinomial rows in their K − 1 contrasts are in
:mod:`~vsbayes.approximations._softmax_latent_modes`: one row's under a Gaussian prior (its
curvature for this solver, ``SoftmaxRowCurvature``, and ``softmax_row_laplace``) and
Laplace propagation's Newton over many rows at once (``softmax_mode_site_updates``), which
the multinomial EP and a stream's window take.
"""

from __future__ import annotations

import abc
import math
from typing import NamedTuple

import numpy as np

from .._blas import single_blas_thread
from .._progress import stage
from .._warnings import warn
from ..engine import LaplaceResult
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ..models import BinaryGLMPosterior, ChunkedSoftmaxPosterior, SoftmaxGLMPosterior
from ..models.softmax_predictive_rules import centred_basis
from ._design_forms import precision_diagonal
from ._glm_gaussian import GLMGaussian, RowLatent
from ._softmax_dual import DualSoftmaxHessian, column_variances, holds_dual, row_kernel
from ._threads import blas_policy
from .shrinkage_mode import shrinkage_laplace

__all__ = [
    "ChunkedGLMCurvature",
    "Curvature",
    "DualSoftmaxCurvature",
    "GLMCurvature",
    "NewtonLaplaceSolver",
    "SoftmaxCurvature",
    "curvature_for",
    "glm_laplace",
    "row_laplace",
    "softmax_curvature",
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

    def _not_positive_definite(self, precision: np.ndarray | None) -> NotPositiveDefiniteError:
        start = (
            "The negative Hessian of the multinomial log-posterior is not numerically "
            "positive definite: the posterior is too elongated for float64. "
        )
        cause = None if precision is None else _unresolved_shift(self.model, precision)
        return NotPositiveDefiniteError(
            start
            + (
                cause
                or "Standardize the features (StandardScaler), drop duplicated columns, "
                "or use a smaller C."
            )
        )

    def covariance(self, gaussian: GLMGaussian) -> np.ndarray:
        # Solves against the identity (GLMGaussian.cov's LAPACK inverse takes a third of
        # the flops, but changes the multinomial fits' covariances in their last digits).
        return gaussian.solve(np.eye(self.model.dim))


class DualSoftmaxCurvature(SoftmaxCurvature):
    """The multinomial posterior with more columns than rows (in memory, a prior that
    factorizes over the classes): the negative Hessian in the contrasts' dual form
    (:class:`~vsbayes.approximations._softmax_dual.DualSoftmaxHessian`), ``(M (K − 1))³/3``
    multiply-adds a step instead of ``(K w)³/3`` and the Gram blocks; the same Newton
    steps to round-off."""

    #: Its covariance (:meth:`DualContrast.theta_cov`) is in scikit-learn's representative.
    in_representative = True

    def __init__(self, model):
        super().__init__(model)
        d = model.n_features
        self._kernel = row_kernel(model.X, column_variances(model)[:d])
        self._q = centred_basis(model.n_classes)

    def expand(self, theta: np.ndarray) -> tuple[float, np.ndarray, DualSoftmaxHessian]:
        model = self.model
        theta = np.asarray(theta, dtype=float)
        log_lik, P = model.probabilities(theta)
        value = log_lik + float(model.log_prior(theta[None])[0])
        grad = model.gradient(P) - theta / model.prior_var  # a factorizing prior: no mean
        try:
            hessian = DualSoftmaxHessian(model, self._kernel, self._q, P)
        except NotPositiveDefiniteError:
            raise self._not_positive_definite(None) from None
        return value, grad, hessian

    def covariance(self, gaussian: DualSoftmaxHessian) -> np.ndarray:
        return gaussian.cov


#: The likelihood's curvature along a column, in units of its prior's, beyond which the
#: softmax's shift direction of that column (all classes' coefficients moved together,
#: which the likelihood does not see and the prior alone holds) is lost in the round-off of
#: the likelihood's curvature (~1e-16 of it; the Cholesky factor fails from ~1e15).
_UNRESOLVED_SHIFT = 1e12


def _unresolved_shift(model, precision: np.ndarray) -> str | None:
    """The cause and remedy of a multinomial negative Hessian without a Cholesky factor
    when a column's likelihood curvature dwarfs its prior's (a feature on a huge scale,
    or sample weights summing to ~1e10 beside the intercepts' vague prior), else None."""
    prior = getattr(model, "prior_precision", None)
    prior_diagonal = 1.0 / model.prior_var if prior is None else np.diag(prior)
    ratio = np.diag(precision) / prior_diagonal - 1.0  # the likelihood's, in the prior's units
    k, d = model.n_classes, model.n_features
    per_column = np.r_[ratio[: k * d].reshape(k, d).max(axis=0), ratio[k * d :].max(initial=0)]
    worst = int(np.argmax(per_column))
    if not per_column[worst] >= _UNRESOLVED_SHIFT:
        return None
    shift = (
        f"The direction that moves every class's {{what}} together is held by the prior "
        f"alone (the softmax does not see it), and the likelihood's curvature along "
        f"each class's is {per_column[worst]:.2g} times the prior's: beyond float64's "
        f"resolution. "
    )
    if worst < d:
        return shift.format(what=f"coefficient of feature {worst}") + (
            "The feature's scale is too large: standardize the features (StandardScaler)."
        )
    weights = getattr(model, "sample_weight", None)
    total = "" if weights is None else f" (they sum to {float(np.sum(weights)):.3g})"
    return shift.format(what="intercept") + (
        f"The sample weights are too large{total} for the intercepts' prior variance: "
        f"divide sample_weight by a constant if its scale is arbitrary, or fit the "
        f"intercept as a column of ones with fit_intercept=False (its prior variance is "
        f"then C's)."
    )


def softmax_curvature(model) -> SoftmaxCurvature:
    """The multinomial posterior's curvature: in the contrasts' dual form where the EP holds
    its posterior so too (:func:`~vsbayes.approximations._softmax_dual.holds_dual`), else
    dense."""
    return DualSoftmaxCurvature(model) if holds_dual(model) else SoftmaxCurvature(model)


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


def curvature_for(model, form: str = "auto") -> Curvature:
    """The :class:`Curvature` of a model: multinomial, binary in chunks or binary in memory
    (``form`` is the latter's factorization; the others have only the primal one)."""
    if isinstance(model, (SoftmaxGLMPosterior, ChunkedSoftmaxPosterior)):
        curvature = softmax_curvature(model) if form == "auto" else SoftmaxCurvature(model)
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

        # (The multinomial dual form's is in scikit-learn's representative already, D-202.)
        cov.in_representative = getattr(curvature, "in_representative", False)

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
