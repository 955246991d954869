"""The mode and Laplace approximation of a binary GLM under a shrinkage prior on its coefficients.

The log-posterior is ``Σ_i s_i log F(a_iᵀθ) + Σ_j log p(θ_j) + log N(b; 0, V_b)`` with p a
:class:`~vsbayes.models.shrinkage_priors.CoefficientFactor`: a smooth part, and for the
Laplace prior (and the elastic net) the non-smooth ``-λ|θ_j|``. Its mode is found by
proximal Newton (Lee, Sun & Saunders 2014; glmnet's outer loop): at θ the smooth part is
expanded to second order (the likelihood's exact curvature, the prior's curvature or,
where ``-log p`` is not convex, its scale-mixture majorizer ``-p'(t) / (t p(t))``), and
the L1-penalized quadratic is minimized exactly — the intercept, unpenalized, eliminated in
closed form, the coefficients' lasso by scikit-learn's coordinate descent (``Lasso`` on the
Cholesky factor of the reduced quadratic) — then a backtracking line search on the true
objective. A smooth prior (no L1 part: Student-t, the horseshoe's stand-in) takes Newton's
step on the exact Hessian where it is positive definite, else on the majorizer's in the
prior's tail (the majorizer alone converged linearly, 77 steps at 2000 × 1000 rows ×
features), through :class:`GLMGaussian`: its Cholesky factor, or with more coefficients
than rows the dual form through the M × M matrix (docs/decisions.md D-235). The fixed
point (``0 ∈ ∇f(θ) - λ ∂|θ|``) is the same for any positive-definite expansion, so the
mode is exact: with a Laplace prior of scale C it is LogisticRegression's L1 solution.

The Laplace approximation at such a mode is degenerate where a coefficient sits at the
kink (the curvature of ``|θ|`` at 0 is undefined): there the prior's curvature is taken as
the inverse of the prior's own variance (``factor.mode_curvature``, docs/decisions.md).
The horseshoe has no mode (its density is infinite at 0): its stand-in, ``N(0, τ²)`` (the
local scales at their median), gives the starting Gaussian.
"""

from __future__ import annotations

import copy
import math

import numpy as np
from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning
from sklearn.linear_model import Lasso

from .._lapack import cho_solve
from .._warnings import catch, warn
from ..engine import LaplaceResult
from ..exceptions import ConvergenceWarning
from ..gaussian import lower_cholesky
from ..models.work import DUAL_MIN_DIM, takes_dual_form
from ._glm_gaussian import GLMGaussian, unit_columns_correction

__all__ = [
    "mode_prior_curvature",
    "shrinkage_laplace",
    "softmax_mode_prior_curvature",
    "softmax_shrinkage_laplace",
]

# A squared Cholesky pivot of the Laplace precision below this fraction of its diagonal entry
# (the share of that coordinate's curvature the earlier ones leave: invariant to the columns'
# scales) is taken as singular: the covariance's float64 inverse is then not kept positive
# definite at exact collinearity.
_SINGULAR_PIVOT = 1e-10

# A relative ridge on the reduced quadratic of each step, so that its Cholesky factor exists
# where the likelihood leaves a direction flat (more features than rows under a pure L1
# prior); it changes the steps' path, not the fixed point they converge to.
_RIDGE = 1e-10
_LASSO_TOL = 1e-12
# At most this share of a coefficient's own curvature in the ridge.
_RIDGE_SHARE = 1e-3
# A smooth prior's coefficient whose exact curvature is below this share of its majorizer's
# (a Student-t's beyond |t| = s√(ν/3)) is in the tail: its Newton system's precision takes
# the majorizer's, and the exact curvature enters by Woodbury's identity (_GLMNewton).
_TAIL_SHARE = 0.5


def shrinkage_laplace(
    model, *, tol: float = 1e-8, max_iter: int = 100, theta0=None, verbose: int = 0
) -> LaplaceResult:
    """The mode of a binary GLM posterior with a ``coefficient_prior`` and the Laplace
    Gaussian there (see the module docstring).

    Parameters
    ----------
    model : BinaryGLMPosterior
        With ``coefficient_prior`` set, rows in memory.
    tol : float, default=1e-8
        Stop when the step's predicted gain in log-posterior is at most ``tol`` (nats).
    max_iter : int, default=100
        Maximum proximal Newton iterations (then a ConvergenceWarning).
    theta0 : array-like of shape (p,), optional
        Starting point (default 0).
    verbose : int, default=0
        Print the iterations when > 1.

    Returns
    -------
    LaplaceResult
    """
    factor = model.coefficient_prior
    d, p = model.n_features, model.dim
    theta = np.zeros(p) if theta0 is None else np.array(theta0, dtype=float)
    lam = factor.l1

    def objective(theta, t=None):
        t = np.asarray(model.design @ theta).ravel() if t is None else t
        value = float(model.sample_weight @ model.link.log_cdf(t))
        smooth, _, _ = factor.smooth_part(theta[:d])
        value += float(smooth.sum()) - lam * float(np.abs(theta[:d]).sum())
        if p > d:
            var = model.prior_var[d]
            value -= 0.5 * (theta[d] ** 2 / var + math.log(2.0 * math.pi * var))
        return value

    def expansion(theta):
        t = np.asarray(model.design @ theta).ravel()
        value = objective(theta, t)
        slope, curvature = model.link.derivatives(t)
        grad = np.asarray(model.design.T @ (model.sample_weight * slope)).ravel()
        _, prior_grad, prior_curv = factor.smooth_part(theta[:d])
        grad[:d] += prior_grad
        if p > d:
            grad[d] -= theta[d] / model.prior_var[d]
        if lam == 0.0:  # a smooth prior: Newton's step (module docstring), no p × p lasso
            exact = factor.exact_curvature(theta[:d])
            return value, grad, _GLMNewton(model, curvature, exact, prior_curv)
        hess = model.weighted_gram(model.sample_weight * curvature)
        hess[np.diag_indices(d)] += prior_curv
        if p > d:
            hess[d, d] += 1.0 / model.prior_var[d]
        return value, grad, hess

    theta, n_iter, converged = _proximal_newton(
        objective, expansion, theta, lam, d, tol, max_iter, verbose
    )
    # The Laplace Gaussian at the mode, with the prior's curvature there (module docstring).
    t = np.asarray(model.design @ theta).ravel()
    value = objective(theta, t)
    slope, curvature = model.link.derivatives(t)
    grad = np.asarray(model.design.T @ (model.sample_weight * slope)).ravel()
    _, prior_grad, _ = factor.smooth_part(theta[:d])
    grad[:d] += prior_grad - lam * np.sign(theta[:d])
    if _dual_at_mode(model):
        gaussian = _dual_mode_gaussian(model, theta, curvature)
        return LaplaceResult(
            theta,
            gaussian.cov,
            value + 0.5 * p * math.log(2.0 * math.pi) - gaussian.half_log_det,
            n_iter=n_iter,
            converged=converged,
            grad_norm=float(np.linalg.norm(grad)),
            log_density_at_mode=value,
        )
    precision = model.weighted_gram(model.sample_weight * curvature)
    if p > d:
        grad[d] -= theta[d] / model.prior_var[d]
        precision[d, d] += 1.0 / model.prior_var[d]
    return _laplace_at_mode(theta, value, grad, precision, factor, d, n_iter, converged)


def softmax_shrinkage_laplace(
    model, *, tol: float = 1e-8, max_iter: int = 100, theta0=None, verbose: int = 0
) -> LaplaceResult:
    """:func:`shrinkage_laplace` of a multinomial posterior
    (:class:`~vsbayes.models.SoftmaxGLMPosterior` with ``coefficient_prior``): the prior on
    each of the K·d coefficients of ``W`` (θ's first K·d entries, class-major), the K
    intercepts unpenalized under their Gaussian prior, as scikit-learn's multinomial L1 and
    elastic-net solutions penalize every class's coefficients. The softmax's flat shift
    directions are the lasso's to settle: the L1 mode has each column's median over the
    classes at 0, not its mean, so it is not centred; with an even number of classes
    the median is any point between the middle two, the mode not unique, and the Laplace
    precision's singular pivot takes the prior's variance (docs/decisions.md, D-123). The
    intercepts' block is eliminated from each step's quadratic in closed form."""
    factor = model.coefficient_prior
    k, d, p = model.n_classes, model.n_features, model.dim
    n_coef = k * d
    theta = np.zeros(p) if theta0 is None else np.array(theta0, dtype=float)
    lam = factor.l1
    intercept_var = model.prior_var[n_coef:]

    def prior_value(theta):
        smooth, _, _ = factor.smooth_part(theta[:n_coef])
        value = float(smooth.sum()) - lam * float(np.abs(theta[:n_coef]).sum())
        b = theta[n_coef:]
        log_norm = float(np.log(2.0 * math.pi * intercept_var).sum())
        return value - 0.5 * (float(b @ (b / intercept_var)) + log_norm)

    def objective(theta):
        return model.probabilities(theta)[0] + prior_value(theta)

    def expansion(theta):
        log_lik, P = model.probabilities(theta)
        grad, hess = model.gradient(P), model.hessian(P)
        _, prior_grad, prior_curv = factor.smooth_part(theta[:n_coef])
        grad[:n_coef] += prior_grad
        hess[np.diag_indices(n_coef)] += prior_curv
        grad[n_coef:] -= theta[n_coef:] / intercept_var
        hess[n_coef:, n_coef:][np.diag_indices(p - n_coef)] += 1.0 / intercept_var
        if lam == 0.0:  # a smooth prior: Newton's step (module docstring)
            exact = factor.exact_curvature(theta[:n_coef])
            hess = _DenseNewton(hess, exact - prior_curv)
        return log_lik + prior_value(theta), grad, hess

    theta, n_iter, converged = _proximal_newton(
        objective, expansion, theta, lam, n_coef, tol, max_iter, verbose
    )
    log_lik, P = model.probabilities(theta)
    value = log_lik + prior_value(theta)
    grad, precision = model.gradient(P), model.hessian(P)
    _, prior_grad, _ = factor.smooth_part(theta[:n_coef])
    grad[:n_coef] += prior_grad - lam * np.sign(theta[:n_coef])
    grad[n_coef:] -= theta[n_coef:] / intercept_var
    precision[n_coef:, n_coef:][np.diag_indices(p - n_coef)] += 1.0 / intercept_var
    return _laplace_at_mode(theta, value, grad, precision, factor, n_coef, n_iter, converged)


def _proximal_newton(objective, expansion, theta, lam, d, tol, max_iter, verbose):
    """``(mode, iterations, converged)``: proximal Newton from ``theta`` on ``objective``
    (the log-posterior, ``-λ|θ_w|₁`` included on the first ``d`` coordinates), whose smooth
    part ``expansion(θ)`` gives as ``(value, gradient, negative Hessian or majorizer)``."""
    converged, n_iter, gain = False, 0, math.inf
    while True:
        value, grad, hess = expansion(theta)
        target = _proximal_step(theta, grad, hess, lam, d)
        step = target - theta
        # The predicted gain of the step: the model's increase (Lee et al.'s Δ).
        gain = float(grad @ step) - lam * float(np.abs(target[:d]).sum() - np.abs(theta[:d]).sum())
        if verbose > 1:
            print(f"proximal Newton iter {n_iter}: log p = {value:.10g}, gain = {gain:.3g}")
        round_off = 4.0 * np.finfo(float).eps * abs(value)
        if gain <= max(tol, round_off):
            converged = True
            theta = target if lam > 0 else theta  # the exact zeros of the last step
            break
        if n_iter >= max_iter:
            break
        scale = 1.0
        for _ in range(40):
            trial = theta + scale * step
            if objective(trial) >= value + 1e-4 * scale * gain:
                break
            scale *= 0.5
        else:
            converged = True  # no measurable increase: at round-off from the mode
            break
        theta = trial
        n_iter += 1
    if not converged:
        warn(
            f"Proximal Newton for the posterior mode did not converge in max_iter={max_iter} "
            f"iterations (predicted gain {gain:.3g} in log-posterior, tol={tol:g}). Increase "
            f"max_iter or standardize the features.",
            ConvergenceWarning,
        )
    return theta, n_iter, converged


def _laplace_at_mode(theta, value, grad, precision, factor, d, n_iter, converged):
    """The Laplace Gaussian at the mode ``theta`` from the likelihood's (and unpenalized
    coordinates' prior) ``precision``, the prior's curvature added on the first ``d``."""
    p = theta.size
    lower, _ = _with_prior_curvature(precision, factor, theta[:d])
    inverse = np.linalg.inv(lower)
    cov = inverse.T @ inverse
    half_log_det = float(np.log(np.diag(lower)).sum())
    grad[:d][theta[:d] == 0] = 0.0  # a subgradient vanishes there
    return LaplaceResult(
        theta,
        0.5 * (cov + cov.T),
        value + 0.5 * p * math.log(2.0 * math.pi) - half_log_det,
        n_iter=n_iter,
        converged=converged,
        grad_norm=float(np.linalg.norm(grad)),
        log_density_at_mode=value,
    )


def mode_prior_curvature(model, theta: np.ndarray) -> np.ndarray:
    """The prior's curvature per coefficient in the Laplace approximation at the mode
    ``theta`` of ``model`` (its ``coefficient_prior``): what :func:`shrinkage_laplace`
    adds to the likelihood's, and EP's prior sites start from."""
    if _dual_at_mode(model):
        return model.coefficient_prior.mode_curvature(theta[: model.n_features])
    t = np.asarray(model.design @ theta).ravel()
    _, curvature = model.link.derivatives(t)
    precision = model.weighted_gram(model.sample_weight * curvature)
    d = model.n_features
    if theta.size > d:
        precision[d, d] += 1.0 / model.prior_var[d]
    return _with_prior_curvature(precision, model.coefficient_prior, theta[:d])[1]


def softmax_mode_prior_curvature(model, theta: np.ndarray) -> np.ndarray:
    """:func:`mode_prior_curvature` of a multinomial posterior: the prior's curvature on
    each of the K·d coefficients in :func:`softmax_shrinkage_laplace`'s Gaussian."""
    n_coef = model.n_classes * model.n_features
    _, P = model.probabilities(theta)
    precision = model.hessian(P)
    intercept = np.arange(n_coef, model.dim)
    precision[intercept, intercept] += 1.0 / model.prior_var[n_coef:]
    return _with_prior_curvature(precision, model.coefficient_prior, theta[:n_coef])[1]


def _dual_at_mode(model) -> bool:
    """Whether the Laplace Gaussian at a smooth prior's mode takes the dual form (more
    coefficients than rows, as :class:`GLMGaussian`'s ``form="auto"``): the prior's
    curvature there is positive (``mode_curvature``), so the precision is the dual form's,
    a diagonal plus the rows' Gram matrix, with no p × p factorization. (Under a Laplace
    prior or the elastic net the Gaussian at an L1 mode keeps the dense factor, whose
    pivots ``_with_prior_curvature`` checks at exact collinearity.)"""
    return model.coefficient_prior.l1 == 0.0 and takes_dual_form(model.n_observations, model.dim)


def _dual_mode_gaussian(model, theta: np.ndarray, curvature: np.ndarray) -> GLMGaussian:
    """The Laplace Gaussian at the mode ``theta`` in the dual form (``_dual_at_mode``),
    ``curvature`` the link's at the rows' latent values there."""
    d = model.n_features
    view = copy.copy(model)
    view.prior_var = model.prior_var.copy()  # the intercept's; the coefficients' is p's
    view.prior_var[:d] = 1.0 / model.coefficient_prior.mode_curvature(theta[:d])
    return GLMGaussian(
        view,
        model.sample_weight * curvature,
        form="dual",
        what="negative Hessian of the log-posterior at the mode",
    )


def _with_prior_curvature(precision: np.ndarray, factor, coefficients: np.ndarray):
    """``(lower, prior_curvature)``: the Cholesky factor of ``precision`` (the likelihood's
    and the intercept prior's, updated in place) plus the prior's curvature at the mode's
    ``coefficients``, and that curvature (``factor.mode_curvature``).

    Exactly collinear columns whose coefficients are all non-zero at an L1 mode leave the
    likelihood and Σ|θ_j| both flat along their difference (the mode is not unique): the
    Hessian is singular although the posterior is proper, and its factorization fails or
    has a pivot at round-off, whose inverse no covariance in float64 holds. There, as at a
    kink, the prior's own variance stands in for its curvature (only there, so that every
    other fit is unchanged)."""
    d = coefficients.size
    prior_curvature = factor.mode_curvature(coefficients)
    diagonal = np.diag_indices(d)
    precision[diagonal] += prior_curvature
    try:
        lower = np.linalg.cholesky(precision)
        if np.min(np.diag(lower) ** 2 / np.diag(precision)) > _SINGULAR_PIVOT:
            return lower, prior_curvature
    except np.linalg.LinAlgError:
        pass
    stand_in = np.maximum(prior_curvature, 1.0 / factor.start_var)
    precision[diagonal] += stand_in - prior_curvature
    return lower_cholesky(precision, "negative Hessian of the log-posterior at the mode"), stand_in


def _proximal_step(theta, grad, hess, lam: float, d: int) -> np.ndarray:
    """The maximizer of ``gᵀ(z - θ) - (z - θ)ᵀH(z - θ)/2 - λ|z_w|₁`` (w the first d
    coordinates, an intercept beyond them unpenalized, or the multinomial's K: a block)."""
    if lam == 0.0:  # a smooth prior's Newton system (_GLMNewton, _DenseNewton)
        return theta + hess.solve(grad)
    p = theta.size
    h_ww, g_w = hess[:d, :d], grad[:d].copy()
    block = p > d + 1  # the multinomial's intercepts
    if block:  # they minimize the quadratic given w: a Schur complement
        h_wb = hess[:d, d:]
        factor_bb = (lower_cholesky(hess[d:, d:], "the intercepts' curvature"), True)
        solved = cho_solve(factor_bb, np.column_stack([h_wb.T, grad[d:]]), check_finite=False)
        h_ww = h_ww - h_wb @ solved[:, :d]
        h_ww = 0.5 * (h_ww + h_ww.T)
        g_w -= h_wb @ solved[:, d]
    elif p > d:  # the intercept minimizes the quadratic given w: a Schur complement
        h_wb, h_bb = hess[:d, d], hess[d, d]
        h_ww = h_ww - np.outer(h_wb, h_wb) / h_bb
        g_w -= h_wb * grad[d] / h_bb
    ridge = _RIDGE * max(float(np.trace(h_ww)) / max(d, 1), 1e-300)
    diagonal = np.diag(h_ww)
    if np.any(diagonal < ridge / _RIDGE_SHARE):
        # A column on a far smaller scale than the others (X's columns unscaled): the ridge
        # would dwarf its curvature, and the steps would crawl; there it is a share of its own.
        ridge = np.where(diagonal > 0, np.minimum(ridge, _RIDGE_SHARE * diagonal), ridge)
    h_ww = h_ww + np.diag(np.broadcast_to(ridge, (d,)))
    lower = lower_cholesky(h_ww, "the proximal Newton step's quadratic")
    # ½‖R z - y‖² = ½ zᵀH̃z - (g̃ + H̃θ)ᵀz + const with H̃ = RᵀR, R = Lᵀ.
    y = np.linalg.solve(lower, g_w + h_ww @ theta[:d])
    lasso = Lasso(
        alpha=lam / d,
        fit_intercept=False,
        tol=_LASSO_TOL,
        max_iter=100_000,
        warm_start=True,
        selection="cyclic",
    )
    lasso.coef_ = theta[:d].copy()
    with catch(("ignore", SklearnConvergenceWarning)):
        lasso.fit(lower.T, y)
    target = theta.copy()
    target[:d] = lasso.coef_
    if block:
        delta = target[:d] - theta[:d]
        target[d:] = theta[d:] + cho_solve(factor_bb, grad[d:] - h_wb.T @ delta, check_finite=False)
    elif p > d:
        delta = target[:d] - theta[:d]
        target[d] = theta[d] + (grad[d] - h_wb @ delta) / h_bb
    return target


class _GLMNewton:
    """The Newton system of a binary GLM posterior under a smooth prior at an iterate:
    ``H = Aᵀ diag(s h) A + D`` with D the prior's exact curvature (and the intercept's prior
    precision), solved through :class:`GLMGaussian` (its Cholesky factor,
    or with more coefficients than rows its dual form through the M × M matrix) where D is
    positive. Where the prior is not convex (a Student-t coefficient in its tail, exact
    curvature below ``_TAIL_SHARE`` of the majorizer's), D takes the majorizer's there,
    ``H₊``, and the exact ``H = H₊ − U N Uᵀ`` (U those coordinates, N the majorizer's
    excess) by Woodbury's identity through the k × k capacitance ``N⁻¹ − Uᵀ H₊⁻¹ U``,
    positive definite exactly when H is; where it is not (far from the mode, or beyond
    ``max(M, 256)`` such coordinates), the step is H₊'s, a positive definite expansion
    all the same (the line search keeps the ascent, the fixed point is the same)."""

    def __init__(self, model, curvature, exact, majorizer):
        d = exact.size
        self.tail = np.flatnonzero(exact < _TAIL_SHARE * majorizer)
        self.lack = (majorizer - exact)[self.tail]  # N > 0
        view = copy.copy(model)
        view.prior_var = model.prior_var.copy()  # the intercept's; the coefficients' is p's
        view.prior_var[:d] = 1.0 / np.where(exact < _TAIL_SHARE * majorizer, majorizer, exact)
        self.gaussian = GLMGaussian(
            view, model.sample_weight * curvature, what="proximal Newton step's quadratic"
        )
        self.max_tail = max(model.n_observations, DUAL_MIN_DIM)

    def solve(self, grad: np.ndarray) -> np.ndarray:
        """``H⁻¹ grad`` (or ``H₊⁻¹ grad``, class docstring)."""
        step = self.gaussian.solve(grad)
        k = self.tail.size
        if k == 0 or k > self.max_tail:
            return step
        spread, capacitance = unit_columns_correction(self.gaussian, self.tail, self.lack)
        try:
            lower = np.linalg.cholesky(capacitance)
        except np.linalg.LinAlgError:  # H is not positive definite here
            return step
        return step + spread @ cho_solve((lower, True), step[self.tail], check_finite=False)


class _DenseNewton:
    """:class:`_GLMNewton` of a dense negative Hessian (the multinomial's): ``hess`` with the
    majorizer's curvature, ``excess`` the exact curvature's difference on the first
    coordinates. The exact Hessian's Cholesky factor where it is positive definite, else
    the majorizer's."""

    def __init__(self, hess: np.ndarray, excess: np.ndarray):
        self.hess, self.excess = hess, excess

    def solve(self, grad: np.ndarray) -> np.ndarray:
        """``H⁻¹ grad``, H the exact Hessian if positive definite, else the majorizer's."""
        exact = self.hess.copy()
        exact[np.diag_indices(self.excess.size)] += self.excess
        try:
            lower = np.linalg.cholesky(exact)
        except np.linalg.LinAlgError:
            lower = lower_cholesky(self.hess, "proximal Newton step's quadratic")
        return cho_solve((lower, True), grad, check_finite=False)
