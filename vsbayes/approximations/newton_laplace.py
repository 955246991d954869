"""Laplace approximation of a log-concave GLM posterior by damped Newton (IRLS).

The solver's steps are small named methods in the manner of scikit-learn's
``_glm._newton_solver.NewtonSolver``: setup, update_gradient_hessian, inner_solve,
line_search, check_convergence, finalize.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.linalg import cho_solve

from ..engine import LaplaceResult
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ..gaussian import lower_cholesky
from ..models import BinaryGLMPosterior

__all__ = ["NewtonLaplaceSolver", "glm_laplace"]


class NewtonLaplaceSolver:
    """Newton's method with exact Hessian, Cholesky solves and Armijo backtracking.

    Parameters
    ----------
    model : BinaryGLMPosterior
        Log-concave posterior with ``value_gradient_hessian`` and ``log_density``.
    tol : float
        Stop when half the squared Newton decrement ``gᵀH⁻¹g / 2`` — the increase of
        ``log p`` one more Newton step would bring — is at most ``tol``.
    max_iter : int
        Maximum Newton iterations.
    verbose : int
        Print one line per iteration when > 1.
    """

    def __init__(self, model: BinaryGLMPosterior, *, tol: float, max_iter: int, verbose: int = 0):
        self.model = model
        self.tol = tol
        self.max_iter = max_iter
        self.verbose = verbose

    def setup(self, theta0: np.ndarray | None) -> None:
        self.theta = np.zeros(self.model.dim) if theta0 is None else np.array(theta0, dtype=float)
        self.n_iter = 0
        self.converged = False
        self.stalled = False

    def update_gradient_hessian(self) -> None:
        self.value, self.grad, hess = self.model.value_gradient_hessian(self.theta)
        try:
            self.lower = lower_cholesky(hess, "negative Hessian of the log-posterior")
        except NotPositiveDefiniteError:
            diagonal = np.diag(hess)
            raise NotPositiveDefiniteError(
                f"The negative Hessian of the log-posterior is not numerically positive "
                f"definite: the posterior is too elongated for float64 (its curvature "
                f"ranges from {diagonal.min():.3g} to {diagonal.max():.3g} along the "
                f"coefficients). Typical cause: collinear or duplicated features on a large "
                f"scale with a vague prior. Standardize the features (StandardScaler), drop "
                f"duplicated columns, or use a smaller C."
            ) from None

    def inner_solve(self) -> None:
        self.step = cho_solve((self.lower, True), self.grad, check_finite=False)
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
            warnings.warn(
                f"Newton's method for the posterior mode did not converge in "
                f"max_iter={self.max_iter} iterations (predicted gain "
                f"{self.half_decrement:.3g} in log-posterior, tol={self.tol:g}). Increase "
                f"max_iter or standardize the features.",
                ConvergenceWarning,
                stacklevel=4,
            )
        d = self.model.dim
        cov = cho_solve((self.lower, True), np.eye(d), check_finite=False)
        log_det_half = float(np.log(np.diag(self.lower)).sum())
        log_Z = self.value + 0.5 * d * math.log(2 * math.pi) - log_det_half
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
        return self.finalize()


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
