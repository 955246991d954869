"""Laplace approximation of the multinomial logistic posterior by Newton's method.

Newton's method on the K(d + 1) parameters with the exact Hessian (K(K + 1)/2 weighted
Gram matrices of the design, see :class:`~vsbayes.models.SoftmaxGLMPosterior`), Cholesky
solves and Armijo backtracking, as :class:`~vsbayes.approximations.NewtonLaplaceSolver`
for the binary model. An iteration costs about ``M K² (d + 1)² / 2 + (K(d + 1))³ / 3``
multiply-adds and holds two ``p × p`` matrices (p = K(d + 1)): the Hessian and its
factor; the covariance is a third, formed on first use. The memory guard
(:func:`~vsbayes._memory.check_memory`) refuses a p whose three matrices would not fit
(p ≈ 30,000 on 8 GiB: e.g. 10 classes of 3,000 features), with the remedy — fewer
features, or one-vs-rest (``OneVsRestClassifier``), whose binary problems need no
``p × p`` matrix beyond p = d + 1. Long before memory, time runs out: one factorization
takes ``p³/3`` multiply-adds (10 s at p = 10,000 on two cores at 30 GFlop/s), Newton
makes about ten and the multinomial EP one per sweep, so p above :data:`MAX_SOFTMAX_PARAMS`
is refused up front with the same remedies, rather than fitting for hours (5 classes of
5,000 sparse features: p = 25,005, 5·10¹² multiply-adds per factorization). There is no
matrix-free route for the multinomial posterior yet.

The posterior is proper but wide along the sum of the intercepts (its prior only, variance
``intercept_prior_var / K``: the likelihood does not see it), so the negative Hessian's
condition number is about ``M · intercept_prior_var``: ~10¹⁰ for 10⁴ rows and the
estimators' 10⁶, well within float64's Cholesky factorization. Newton's iterates started
from 0 stay in the centred subspace (``Σ_k w_k = 0``, ``Σ_k b_k = 0``), where the mode is.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import cho_solve

from .._memory import check_memory, format_bytes
from .._warnings import warn
from ..engine import LaplaceResult
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ..gaussian import lower_cholesky
from ..models.softmax import SoftmaxGLMPosterior
from ._threads import blas_policy

__all__ = ["MAX_SOFTMAX_PARAMS", "SoftmaxLaplaceSolver", "check_softmax_size", "softmax_laplace"]

#: The most parameters K(d + 1) of a dense multinomial posterior: a p × p factorization
#: then takes up to 3.3·10¹¹ multiply-adds, about 10 s on two cores; a fit makes tens.
MAX_SOFTMAX_PARAMS = 10_000


def check_softmax_size(model: SoftmaxGLMPosterior) -> None:
    """Raise before Newton's method if its p × p matrices would take hours to factorize
    (ValueError, p above :data:`MAX_SOFTMAX_PARAMS`) or would not fit (MemoryLimitError)."""
    p = model.dim
    if p > MAX_SOFTMAX_PARAMS:
        raise ValueError(
            f"The multinomial posterior has {p} parameters ({model.n_classes} classes × "
            f"{model.n_features + int(model.fit_intercept)}), above the {MAX_SOFTMAX_PARAMS} "
            f"its dense {p} × {p} Newton and expectation-propagation steps allow: each "
            f"factorization takes {p**3 / 3:.2g} multiply-adds, and a fit makes tens. Reduce "
            f"the number of features (e.g. sklearn.feature_selection.SelectKBest or "
            f"sklearn.decomposition.TruncatedSVD in the pipeline), or fit one-vs-rest binary "
            f"posteriors with sklearn.multiclass.OneVsRestClassifier, whose factorizations "
            f"are of min(features, rows) only."
        )
    check_memory(
        3 * 8.0 * p * p,
        f"the {p} × {p} Hessian, Cholesky factor and covariance of the multinomial posterior "
        f"({model.n_classes} classes × {model.n_features + int(model.fit_intercept)} "
        f"parameters)",
        f"Reduce the number of features (each {p} × {p} matrix takes "
        f"{format_bytes(8.0 * p * p)}), or fit one-vs-rest binary posteriors with "
        f"sklearn.multiclass.OneVsRestClassifier, which need matrices of the features' size "
        f"only.",
    )


class SoftmaxLaplaceSolver:
    """Newton's method with exact Hessian, Cholesky solves and Armijo backtracking.

    Parameters
    ----------
    model : SoftmaxGLMPosterior
        The posterior.
    tol : float
        Stop when half the squared Newton decrement ``gᵀH⁻¹g / 2`` is at most ``tol``; the
        step then computed is still taken (it costs nothing more), so the returned mode is
        one quadratically convergent step beyond that point.
    max_iter : int
        Maximum Newton iterations.
    verbose : int
        Print one line per iteration when > 1.
    """

    def __init__(self, model: SoftmaxGLMPosterior, *, tol: float, max_iter: int, verbose=0):
        self.model = model
        self.tol = tol
        self.max_iter = max_iter
        self.verbose = verbose

    def setup(self, theta0: np.ndarray | None) -> None:
        self.theta = np.zeros(self.model.dim) if theta0 is None else np.array(theta0, dtype=float)
        self.n_iter = 0
        self.converged = False
        self.stalled = False

    def _value(self, theta: np.ndarray) -> float:
        log_lik, _ = self.model.probabilities(theta)
        return log_lik + float(self.model.log_prior(theta[None])[0])

    def update_gradient_hessian(self) -> None:
        self.value, self.grad, hess = self.model.value_gradient_hessian(self.theta)
        try:
            self.chol = lower_cholesky(hess, "negative Hessian")
        except NotPositiveDefiniteError:
            raise NotPositiveDefiniteError(
                "The negative Hessian of the multinomial log-posterior is not numerically "
                "positive definite: the posterior is too elongated for float64. Standardize "
                "the features (StandardScaler), drop duplicated columns, or use a smaller C."
            ) from None

    def inner_solve(self) -> None:
        self.step = cho_solve((self.chol, True), self.grad, check_finite=False)
        self.half_decrement = 0.5 * float(self.grad @ self.step)

    def check_convergence(self) -> bool:
        self.converged = self.half_decrement <= self.tol
        return self.converged

    def line_search(self) -> None:
        """Backtrack from the full step until ``log p`` rises by the Armijo fraction."""
        slope = 2.0 * self.half_decrement
        t = 1.0
        for _ in range(40):
            trial = self.theta + t * self.step
            if self._value(trial) >= self.value + 1e-4 * t * slope:
                self.theta = trial
                return
            t *= 0.5
        self.stalled = True  # no measurable increase: at round-off distance of the mode

    def find_mode(self, theta0: np.ndarray | None = None) -> None:
        """Run Newton's method from ``theta0`` (default 0)."""
        self.setup(theta0)
        while True:
            self.update_gradient_hessian()
            self.inner_solve()
            if self.verbose > 1:
                print(
                    f"Newton iter {self.n_iter}: log p = {self.value:.10g}, "
                    f"decrement = {self.half_decrement:.3g}"
                )
            if self.check_convergence():
                # Within tol of the mode, the full step is safe and quadratically closer.
                self.theta = self.theta + self.step
                self.update_gradient_hessian()
                break
            if self.stalled or self.n_iter >= self.max_iter:
                break
            self.line_search()
            self.n_iter += 1

    def finalize(self) -> LaplaceResult:
        if not (self.converged or self.stalled):
            warn(
                f"Newton's method for the posterior mode did not converge in "
                f"max_iter={self.max_iter} iterations (predicted gain "
                f"{self.half_decrement:.3g} in log-posterior, tol={self.tol:g}). Increase "
                f"max_iter or standardize the features.",
                ConvergenceWarning,
            )
        p = self.model.dim
        half_log_det = float(np.log(np.diag(self.chol)).sum())
        log_Z = self.value + 0.5 * p * math.log(2 * math.pi) - half_log_det
        chol = self.chol

        def cov() -> np.ndarray:
            return cho_solve((chol, True), np.eye(p), check_finite=False)

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
def softmax_laplace(
    model: SoftmaxGLMPosterior,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    theta0=None,
    verbose: int = 0,
) -> LaplaceResult:
    """Laplace approximation of the multinomial logistic posterior.

    The mode (MAP) is found by Newton's method from ``theta0`` (default 0); the Gaussian has
    the inverse negative Hessian at the mode as covariance (layout of θ: ``[W.ravel(), b]``,
    see :mod:`vsbayes.models.softmax`), and ``log_Z = log p(mode) + p/2 log 2π −
    ½ log det(−H)`` estimates the log evidence.

    Parameters
    ----------
    model : SoftmaxGLMPosterior
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

    Raises
    ------
    ValueError
        If p is above :data:`MAX_SOFTMAX_PARAMS` (see the module docstring).
    MemoryLimitError
        If the p × p matrices would not fit in memory (see the module docstring).
    """
    check_softmax_size(model)
    solver = SoftmaxLaplaceSolver(model, tol=tol, max_iter=max_iter, verbose=verbose)
    return solver.solve(theta0)
