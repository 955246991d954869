"""Laplace approximation: a Gaussian at the mode with the curvature of the log-density."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import minimize

from .._lapack import cho_solve
from .._warnings import warn
from ..exceptions import ConvergenceWarning, NotPositiveDefiniteError
from ..gaussian import lower_cholesky
from .results import LaplaceResult

__all__ = ["laplace"]

_EPS = np.finfo(float).eps


class _FiniteDifferences:
    """Central differences of a vectorized log-density, one call per derivative.

    Steps are relative to a per-coordinate length scale, taken from the curvature of the
    last Hessian (``1 / sqrt|H_ii|``); they are rounded to representable increments.
    """

    def __init__(self, log_target: Callable, dim: int):
        self.log_target = log_target
        self.scale = np.ones(dim)

    def _steps(self, x, power):
        h = _EPS**power * self.scale
        return (x + h) - x

    def _values(self, points):
        values = np.asarray(self.log_target(points), dtype=float).reshape(len(points))
        if not np.isfinite(values).all():
            raise ValueError(
                "log_target is not finite near the current point, so finite differences "
                "fail; pass analytic grad and hess to laplace()."
            )
        return values

    def gradient(self, x):
        h = self._steps(x, 1 / 3)
        eye = np.diag(h)
        v = self._values(np.vstack([x + eye, x - eye]))
        d = len(x)
        return (v[:d] - v[d:]) / (2 * h)

    def hessian(self, x):
        d = len(x)
        h = self._steps(x, 1 / 4)
        i, j = np.triu_indices(d, 1)
        eye = np.diag(h)
        pp = x + eye[i] + eye[j]
        pm = x + eye[i] - eye[j]
        mp = x - eye[i] + eye[j]
        mm = x - eye[i] - eye[j]
        v = self._values(np.vstack([x[None], x + eye, x - eye, pp, pm, mp, mm]))
        f0, plus, minus = v[0], v[1 : d + 1], v[d + 1 : 2 * d + 1]
        m = len(i)
        cross = v[2 * d + 1 :].reshape(4, m)
        hess = np.empty((d, d))
        hess[np.diag_indices(d)] = (plus - 2 * f0 + minus) / (h * h)
        off = (cross[0] - cross[1] - cross[2] + cross[3]) / (4 * h[i] * h[j])
        hess[i, j] = hess[j, i] = off
        self._update_scale(hess)
        return hess

    def hessian_from_gradient(self, grad: Callable, x):
        h = self._steps(x, 1 / 3)
        steps = np.diag(h)
        cols = [(grad(x + s) - grad(x - s)) / (2 * hk) for hk, s in zip(h, steps, strict=True)]
        hess = np.column_stack(cols)
        hess = 0.5 * (hess + hess.T)
        self._update_scale(hess)
        return hess

    def _update_scale(self, hess):
        curvature = np.abs(np.diag(hess))
        ok = np.isfinite(curvature) & (curvature > 0)
        self.scale[ok] = 1.0 / np.sqrt(curvature[ok])


def laplace(
    log_target: Callable,
    x0,
    grad: Callable | None = None,
    hess: Callable | None = None,
    *,
    tol: float = 1e-10,
    max_iter: int = 200,
) -> LaplaceResult:
    """Laplace approximation of ``exp(log_target)``.

    The mode is found by a trust-region Newton method (``scipy.optimize.minimize`` with
    ``method="trust-exact"``); the covariance is the inverse of the negative Hessian at the
    mode, by Cholesky; ``log_Z = log p(mode) + d/2 log 2π - ½ log det(-H)``.

    Parameters
    ----------
    log_target : callable
        Vectorized log-density: ``log_target(x)`` for ``x`` of shape (N, d) returns (N,).
    x0 : array-like of shape (d,)
        Starting point.
    grad : callable, optional
        ``grad(x)`` -> (d,) gradient of the log-density at one point. Default: central
        finite differences (one vectorized call of ``log_target`` with 2d points).
    hess : callable, optional
        ``hess(x)`` -> (d, d) Hessian of the log-density. Default: finite differences of
        ``grad`` if given, else of ``log_target`` (one call with 2d² + 1 points).
    tol : float, default=1e-10
        Convergence when half the squared Newton decrement ``gᵀ(-H)⁻¹g / 2`` — the gain in
        log p that one more Newton step would bring — is below ``tol``.
    max_iter : int, default=200
        Maximum optimizer iterations.

    Returns
    -------
    LaplaceResult
        Gaussian at the mode with diagnostics ``n_iter``, ``converged``, ``grad_norm``,
        ``log_density_at_mode``.

    Raises
    ------
    NotPositiveDefiniteError
        If the negative Hessian at the returned point is not positive definite.
    """
    x0 = np.array(x0, dtype=float).ravel()
    d = x0.shape[0]
    fd = _FiniteDifferences(log_target, d)

    def value(x):
        return float(np.asarray(log_target(x[None, :]), dtype=float).reshape(-1)[0])

    grad_fn = grad if grad is not None else fd.gradient
    if hess is not None:
        hess_fn = hess
    elif grad is not None:

        def hess_fn(x):
            return fd.hessian_from_gradient(grad, x)
    else:
        hess_fn = fd.hessian

    if not math.isfinite(value(x0)):
        raise ValueError("log_target(x0) is not finite; start from a point of positive density.")

    def objective(x):
        v = value(x)
        # Outside the support the trust region shrinks instead of failing.
        return -v if math.isfinite(v) else math.inf

    res = minimize(
        objective,
        x0,
        jac=lambda x: -np.asarray(grad_fn(x), dtype=float),
        hess=lambda x: -np.asarray(hess_fn(x), dtype=float),
        method="trust-exact",
        options={"gtol": 1e-12, "maxiter": max_iter},
    )
    mode = res.x
    n_iter = int(res.nit)
    # Converged when the Newton decrement predicts a gain below tol in log p; a few pure
    # Newton steps polish what the trust region left at round-off level.
    for polish in range(4):
        g = np.asarray(grad_fn(mode), dtype=float)
        neg_hess = -np.asarray(hess_fn(mode), dtype=float)
        neg_hess = 0.5 * (neg_hess + neg_hess.T)
        try:
            lower = lower_cholesky(neg_hess, "negative Hessian")
        except NotPositiveDefiniteError:
            raise NotPositiveDefiniteError(
                "The Hessian of log_target at the point found is not negative definite: "
                "this is not a strict local maximum (flat or improper target, or a saddle "
                "point). Use a proper prior or a better starting point x0."
            ) from None
        step = cho_solve((lower, True), g, check_finite=False)
        half_decrement = 0.5 * float(g @ step)
        if half_decrement <= tol or polish == 3:
            break
        mode = mode + step
        n_iter += 1
    converged = half_decrement <= tol
    if not converged:
        warn(
            f"The Laplace mode search did not converge in max_iter={max_iter} iterations "
            f"(predicted gain {half_decrement:.3g} in log p). Increase max_iter or give a "
            f"better x0.",
            ConvergenceWarning,
        )
    cov = cho_solve((lower, True), np.eye(d), check_finite=False)
    log_p_mode = value(mode)
    log_Z = log_p_mode + 0.5 * d * math.log(2 * math.pi) - float(np.log(np.diag(lower)).sum())
    return LaplaceResult(
        mode,
        cov,
        log_Z,
        n_iter=n_iter,
        converged=converged,
        grad_norm=float(np.linalg.norm(g)),
        log_density_at_mode=log_p_mode,
    )
