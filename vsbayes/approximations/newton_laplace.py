"""Laplace approximation of a log-concave GLM posterior by damped Newton (IRLS).

The solver's steps are small named methods in the manner of scikit-learn's
``_glm._newton_solver.NewtonSolver``: setup, update_gradient_hessian, inner_solve,
line_search, check_convergence, finalize.
"""

from __future__ import annotations

import math

import numpy as np

from .._blas import single_blas_thread
from .._warnings import warn
from ..engine import LaplaceResult
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ..models import BinaryGLMPosterior
from ._design_forms import precision_diagonal
from ._glm_gaussian import GLMGaussian
from ._threads import blas_policy

__all__ = ["NewtonLaplaceSolver", "glm_laplace"]

_HESSIAN = "negative Hessian of the log-posterior"


class NewtonLaplaceSolver:
    """Newton's method with exact Hessian, Cholesky solves and Armijo backtracking.

    The Newton system is solved by :class:`GLMGaussian`, whose precision is the negative
    Hessian ``diag(1/prior_var) + Aᵀ diag(s_i h_i) A``: through the p × p Cholesky factor
    when p ≤ M, through the M × M dual (Woodbury) one when there are more coefficients
    than observations.

    Parameters
    ----------
    model : BinaryGLMPosterior
        Log-concave posterior with ``design``, ``link``, ``log_prior`` and ``log_density``.
    tol : float
        Stop when half the squared Newton decrement ``gᵀH⁻¹g / 2`` — the increase of
        ``log p`` one more Newton step would bring — is at most ``tol``.
    max_iter : int
        Maximum Newton iterations.
    verbose : int
        Print one line per iteration when > 1.
    form : {"auto", "primal", "dual"}, default="auto"
        Factorization of the negative Hessian (see :class:`GLMGaussian`).
    """

    def __init__(
        self,
        model: BinaryGLMPosterior,
        *,
        tol: float,
        max_iter: int,
        verbose: int = 0,
        form: str = "auto",
    ):
        self.model = model
        self.tol = tol
        self.max_iter = max_iter
        self.verbose = verbose
        self.form = form

    def setup(self, theta0: np.ndarray | None) -> None:
        self.theta = np.zeros(self.model.dim) if theta0 is None else np.array(theta0, dtype=float)
        self.n_iter = 0
        self.converged = False
        self.stalled = False

    def update_gradient_hessian(self) -> None:
        # The value and gradient of model.value_gradient_hessian, but the negative Hessian
        # only as its curvature weights s_i h_i: GLMGaussian factorizes it in primal or dual
        # form (the dual one never forms the p × p matrix). A model whose rows are not in
        # memory (dask chunks) gives all three in one pass over its chunks.
        model, theta = self.model, self.theta
        if not model.rows_in_memory:
            self.value, self.grad, precision = model.value_gradient_hessian(theta)
            self.weights = None
            try:
                self.gaussian = GLMGaussian(model, precision=precision, what=_HESSIAN)
            except NotPositiveDefiniteError:
                raise self._elongated(np.diag(precision)) from None
            return
        t = np.asarray(model.design @ theta).ravel()
        self.value = float(model.sample_weight @ model.link.log_cdf(t)) + float(
            model.log_prior(theta[None])[0]
        )
        slope, curvature = model.link.derivatives(t)
        self.grad = np.asarray(model.design.T @ (model.sample_weight * slope)).ravel()
        self.grad -= theta / model.prior_var
        self.weights = weights = model.sample_weight * curvature
        try:
            self.gaussian = GLMGaussian(model, weights, form=self.form, what=_HESSIAN)
        except NotPositiveDefiniteError:
            raise self._elongated(precision_diagonal(model, weights)) from None

    def _elongated(self, diagonal: np.ndarray) -> NotPositiveDefiniteError:
        """The error for a posterior too elongated for float64, with its remedy, given the
        diagonal of the negative Hessian."""
        return NotPositiveDefiniteError(
            f"The negative Hessian of the log-posterior is not numerically positive "
            f"definite: the posterior is too elongated for float64 (its curvature "
            f"ranges from {diagonal.min():.3g} to {diagonal.max():.3g} along the "
            f"coefficients). Typical cause: collinear or duplicated features on a large "
            f"scale with a vague prior. Standardize the features (StandardScaler), drop "
            f"duplicated columns, or use a smaller C."
        )

    def inner_solve(self) -> None:
        self.step = self.gaussian.solve(self.grad)
        self.half_decrement = 0.5 * float(self.grad @ self.step)

    def check_convergence(self) -> bool:
        self.converged = self.half_decrement <= self.tol
        return self.converged

    def line_search(self) -> None:
        """Backtrack from the full step until ``log p`` rises by the Armijo fraction."""
        slope = 2.0 * self.half_decrement  # directional derivative gᵀΔ
        t = 1.0
        for _ in range(40):
            trial = self.theta + t * self.step
            value = float(self.model.log_density(trial[None])[0])
            if value >= self.value + 1e-4 * t * slope:
                self.theta = trial
                return
            t *= 0.5
        # No increase is measurable: the iterate sits at round-off distance of the mode.
        self.stalled = True

    def finalize(self) -> LaplaceResult:
        if not (self.converged or self.stalled):
            warn(
                f"Newton's method for the posterior mode did not converge in "
                f"max_iter={self.max_iter} iterations (predicted gain "
                f"{self.half_decrement:.3g} in log-posterior, tol={self.tol:g}). Increase "
                f"max_iter or standardize the features.",
                ConvergenceWarning,
            )
        d = self.model.dim
        log_Z = self.value + 0.5 * d * math.log(2 * math.pi) - self.gaussian.half_log_det
        gaussian, weights, model = self.gaussian, self.weights, self.model

        def cov() -> np.ndarray:
            # The p × p inverse is formed on first use only: EP started from the mode, or
            # the site-fit route, may never need it (at p = 500 it is half of Laplace's time).
            try:
                with single_blas_thread():  # as the fit itself (blas_policy)
                    return gaussian.cov
            except NotPositiveDefiniteError:
                if weights is None:  # chunked rows: the factor exists, so does the inverse
                    raise
                raise self._elongated(precision_diagonal(model, weights)) from None

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

    def find_mode(self, theta0: np.ndarray | None = None) -> None:
        """Run Newton's method from ``theta0`` (default 0), without the covariance.

        Afterwards ``theta`` is the mode, ``value`` the log-density there and ``gaussian``
        the :class:`GLMGaussian` of the negative Hessian (its ``half_log_det``, ``t_var``
        and ``solve`` need no p × p matrix in dual form).
        """
        self.setup(theta0)
        while True:
            self.update_gradient_hessian()
            self.inner_solve()
            if self.verbose > 1:
                print(
                    f"Newton iter {self.n_iter}: log p = {self.value:.10g}, "
                    f"decrement = {self.half_decrement:.3g}"
                )
            if self.check_convergence() or self.stalled or self.n_iter >= self.max_iter:
                break
            self.line_search()
            self.n_iter += 1


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
    """
    solver = NewtonLaplaceSolver(model, tol=tol, max_iter=max_iter, verbose=verbose)
    return solver.solve(theta0)
