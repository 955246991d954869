"""A general Gaussian prior N(μ₀, Σ₀) on a GLM's parameter vector, checked once.

The models' own prior is N(μ₀, diag(prior_var)) (binary) or N(μ₀, Λ₀⁻¹) (multinomial);
:class:`GaussianPrior` is what the estimators hand them: the mean, the covariance, its
Cholesky factor, whether it is diagonal, and the exponential forgetting of
:meth:`GaussianPrior.forgotten`.

**Whitening.** With ``Σ₀ = L Lᵀ`` and ``θ = L z``, the prior of z is N(L⁻¹μ₀, I) and the
latent value of a row is ``x̃·θ = (x̃ L)·z``: a model of the design ``X̃ L`` with a diagonal
prior, which every method of the binary model handles as it is. The posterior of θ is then
``N(L m, L S Lᵀ)`` from z's ``N(m, S)``, and the evidence is the same integral (the prior
density of z is the prior density of θ times ``|det L|``, the change of variables'
Jacobian), so ``log_Z`` is unchanged.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import scipy.sparse as sp

from .._lapack import solve_triangular
from .._memory import check_memory
from ..gaussian import Gaussian, StructuredGaussian

__all__ = ["GaussianPrior"]

#: Relative asymmetry of a covariance (``max |Σ − Σᵀ| / max |Σ|``) accepted as round-off:
#: a covariance computed as ``L S Lᵀ`` or inverted from a precision carries ~1e-15 of it.
SYMMETRY_TOLERANCE = 1e-8


class GaussianPrior:
    """A checked Gaussian prior ``N(mean, cov)``.

    Besides a diagonal or a full covariance, it may be an *arrowhead* one
    (:meth:`arrowhead`, arrowhead precision): the other parameters independent given the
    last one (the intercept), each with its own covariance with it — what ``partial_fit``
    carries of a structured binary posterior, held in O(p).

    Parameters
    ----------
    mean : array-like of shape (p,)
        Prior mean.
    cov : array-like of shape (p, p) or (p,), optional
        Prior covariance, or the variances of a diagonal one.
    precision : array-like of shape (p, p), optional
        Prior precision (inverse covariance), in place of ``cov``.
    name : str, default="prior"
        What the error messages call it.

    Raises
    ------
    ValueError
        Naming the problem: a mean that is not a finite vector, a covariance of the wrong
        shape, not symmetric, or not positive definite; both or neither of ``cov`` and
        ``precision``.
    """

    #: The covariances of the other parameters with the last one (the intercept) of an
    #: arrowhead prior (:meth:`arrowhead`); None otherwise.
    hub = None

    def __init__(self, mean, cov=None, precision=None, *, name: str = "prior"):
        self.name = name
        mean = np.asarray(mean, dtype=float)
        if mean.ndim != 1 or not np.isfinite(mean).all():
            raise ValueError(
                f"The {name}'s mean must be a finite vector; got an array of shape {mean.shape}"
                f"{'' if np.isfinite(mean).all() else ' with non-finite values'}."
            )
        if (cov is None) == (precision is None):
            raise ValueError(f"Give the {name} exactly one of a covariance and a precision.")
        p = mean.shape[0]
        what = "covariance" if precision is None else "precision"
        given = cov if precision is None else precision
        if sp.issparse(given):  # a diagonal one as its variances, else dense (as held)
            given, cov, precision = _densified(given, p, what, name)
        given = np.asarray(given, dtype=float)
        if given.ndim == 1 and precision is None and given.shape == (p,):
            if not (np.isfinite(given).all() and (given > 0).all()):
                raise ValueError(
                    f"The {name}'s variances must be positive and finite; got values from "
                    f"{given.min(initial=np.inf):.3g} to {given.max(initial=-np.inf):.3g}."
                )
            self.mean, self.variances, self._cov = mean, given.copy(), None
            return
        if given.shape != (p, p):
            raise ValueError(
                f"The {name}'s {what} has shape {given.shape}; its mean has {p} entries, so "
                f"it must be ({p}, {p}) (or ({p},) variances of a diagonal covariance)."
            )
        if not np.isfinite(given).all():
            raise ValueError(f"The {name}'s {what} has non-finite entries.")
        scale = float(np.abs(given).max(initial=0.0))
        asymmetry = float(np.abs(given - given.T).max(initial=0.0))
        if asymmetry > SYMMETRY_TOLERANCE * scale:
            raise ValueError(
                f"The {name}'s {what} is not symmetric: max |A − Aᵀ| = {asymmetry:.3g} for "
                f"entries up to {scale:.3g}."
            )
        given = 0.5 * (given + given.T)
        lower = _cholesky(given, f"The {name}'s {what}")
        if precision is not None:
            inverse = np.linalg.inv(lower)  # Σ = L⁻ᵀ L⁻¹
            given = inverse.T @ inverse
            given = 0.5 * (given + given.T)
            lower = _cholesky(given, f"The {name}'s covariance (the precision's inverse)")
        self.mean = mean
        if np.count_nonzero(given - np.diag(np.diag(given))) == 0:
            self.variances, self._cov = np.diag(given).copy(), None
        else:
            self.variances, self._cov = np.diag(given).copy(), given
            self.__dict__["lower"] = lower

    @classmethod
    def from_gaussian(cls, gaussian: Gaussian, *, name: str = "prior") -> GaussianPrior:
        """The prior N(mean, cov) of a Gaussian (e.g. an earlier fit's posterior).

        A :class:`~vsbayes.gaussian.Gaussian` is checked (finite, symmetric, positive
        definite) and factorized already: its covariance and Cholesky factor are taken as
        they are (the cost of each ``partial_fit`` of a few rows is mostly such overhead).

        A :class:`~vsbayes.gaussian.StructuredGaussian` (a fit with a structured covariance)
        with the "diagonal" structure is the diagonal prior of its marginal variances (the
        binary posterior's exactly; the multinomial's correlations among a column's classes,
        its shift direction's and its intercepts', are dropped); with another structure it
        is made dense, where that fits the memory limit.

        Raises
        ------
        MemoryLimitError
            If ``gaussian``'s covariance is structured (not diagonal) and its dense
            p × p matrix and Cholesky factor would not fit the memory limit: a fit under a
            correlated prior (``partial_fit``, ``prior=``) holds them.
        """
        prior = cls.__new__(cls)
        prior.name, prior.mean = name, np.array(gaussian.mean)
        if isinstance(gaussian, StructuredGaussian):
            covariance = gaussian.covariance
            if covariance.structure == "diagonal":  # the model's own diagonal prior, no p × p
                prior.variances, prior._cov = covariance.diagonal(), None
                return prior
            p = gaussian.dim
            check_memory(
                # The dense matrix with its conversion's temporaries, its copy, its factor.
                covariance.dense_bytes() + 16.0 * p * p,
                f"the dense {p} × {p} covariance of the {name} and its Cholesky factor, "
                f"which a fit under a correlated prior (partial_fit, prior=) holds (the "
                f"posterior's sigma_ is a {covariance.structure} structured covariance)",
                "A correlated structured posterior is carried into another fit only where "
                "its dense covariance fits: fit all the rows at once with fit instead, "
                "pass a binary one's diagonal (prior=(mean, marginal variances)), stream "
                "with partial_fit (which carries it in O(p)), or raise the memory_limit "
                "of vsbayes.config_context.",
            )
        prior._cov = np.array(gaussian.cov)
        prior.variances = np.diag(prior._cov).copy()
        prior.__dict__["lower"] = np.array(gaussian.chol)
        return prior

    @classmethod
    def arrowhead(cls, mean, variances, hub, *, name: str = "prior") -> GaussianPrior:
        """The prior of marginal ``variances`` and covariances ``hub`` of the other
        parameters with the last one, under which the others are independent given the
        last (its precision is an arrowhead matrix): ``θ_j = c_j θ_b + u_j`` with ``c =
        hub / variances[-1]`` and ``u`` independent of ``θ_b``, of the conditional
        variances ``variances[:-1] − hub · c`` (floored at 1e-12 of the marginal ones:
        round-off where the last parameter determines one nearly). Held in O(p)."""
        prior = cls(mean, variances, name=name)
        hub = np.asarray(hub, dtype=float)
        if hub.shape != (prior.dim - 1,) or not np.isfinite(hub).all():
            raise ValueError(
                f"The {name}'s covariances with its last parameter must be a finite vector "
                f"of {prior.dim - 1}; got shape {hub.shape}."
            )
        prior.hub = hub
        return prior

    @property
    def slope(self) -> np.ndarray:
        """An arrowhead prior's ``c``: the regression of the other parameters on the last."""
        return self.hub / self.variances[-1]

    @property
    def conditional_variances(self) -> np.ndarray:
        """An arrowhead prior's variances of the other parameters given the last."""
        marginal = self.variances[:-1]
        return np.maximum(marginal - self.hub * self.slope, 1e-12 * marginal)

    @property
    def dim(self) -> int:
        """Length p of the parameter vector."""
        return self.mean.shape[0]

    @property
    def diagonal(self) -> bool:
        """Whether the covariance is diagonal (then no whitening is needed)."""
        return self._cov is None and self.hub is None

    @property
    def cov(self) -> np.ndarray:
        """The covariance (p, p)."""
        if self.hub is not None:  # diag(v) + c cᵀ s among the others, c s with the last
            cov = np.diag(np.append(self.conditional_variances, 0.0))
            cov[:-1, :-1] += np.outer(self.slope, self.hub)
            cov[:-1, -1] = cov[-1, :-1] = self.hub
            cov[-1, -1] = self.variances[-1]
            return cov
        return np.diag(self.variances) if self._cov is None else self._cov

    @cached_property
    def lower(self) -> np.ndarray:
        """Lower Cholesky factor L of the covariance, ``Σ₀ = L Lᵀ``."""
        return np.diag(np.sqrt(self.variances)) if self.diagonal else np.linalg.cholesky(self.cov)

    @cached_property
    def precision(self) -> np.ndarray:
        """The inverse covariance (p, p)."""
        if self.diagonal:
            return np.diag(1.0 / self.variances)
        inverse = np.linalg.inv(self.lower)
        out = inverse.T @ inverse
        return 0.5 * (out + out.T)

    def whitened_mean(self) -> np.ndarray:
        """``L⁻¹ μ₀``: the prior mean of the whitened parameters z (``θ = L z``)."""
        return solve_triangular(self.lower, self.mean, lower=True, check_finite=False)

    def log_density(self, theta: np.ndarray) -> np.ndarray:
        """``log N(θ; μ₀, Σ₀)`` up to a constant (``−½ (θ − μ₀)ᵀ Σ₀⁻¹ (θ − μ₀)``) at each
        of the rows θ (n, p): a diagonal or arrowhead prior's in O(n p), never a p × p
        matrix (an arrowhead's: the last parameter's marginal density times the others'
        given it, ``θ_j − μ_j − c_j (θ_b − μ_b)`` of the conditional variances); a full
        one's by its Cholesky factor."""
        centred = np.asarray(theta, dtype=float) - self.mean
        if self.diagonal:
            return -0.5 * (centred * centred) @ (1.0 / self.variances)
        if self.hub is not None:
            last = centred[:, -1]
            rest = centred[:, :-1] - last[:, None] * self.slope
            return -0.5 * ((rest * rest) @ (1.0 / self.conditional_variances)) - 0.5 * (
                last * last / self.variances[-1]
            )
        white = solve_triangular(self.lower, centred.T, lower=True, check_finite=False)
        return -0.5 * (white * white).sum(axis=0)

    def unwhiten(self, posterior: Gaussian) -> Gaussian:
        """The posterior of θ = L z from that of z: ``N(L m, L S Lᵀ)``, ``log_Z`` and the
        diagnostics kept (the evidence does not change; see the module docstring)."""
        lower = self.lower
        mean = lower @ np.asarray(posterior.mean)
        cov = lower @ np.asarray(posterior.cov) @ lower.T
        return posterior.with_moments(mean, 0.5 * (cov + cov.T))

    def forgotten(self, keep: float, original: GaussianPrior) -> GaussianPrior:
        """Exponential forgetting: the natural parameters ``keep·(Λ, Λμ) + (1 − keep)·(Λ₀,
        Λ₀μ₀)`` of this prior and the ``original`` one.

        With ``keep = 1`` this prior itself; as ``keep → 0`` the original. The precision
        that data brought decays by ``keep``: a likelihood term seen n updates ago weighs
        ``keep**n``.
        """
        if keep >= 1.0:
            return self
        if self.diagonal and original.diagonal:  # elementwise: never a p × p matrix
            precision = keep / self.variances + (1.0 - keep) / original.variances
            linear = keep * (self.mean / self.variances)
            linear += (1.0 - keep) * (original.mean / original.variances)
            return GaussianPrior(linear / precision, 1.0 / precision, name=self.name)
        if self.hub is not None and original.diagonal:
            return self._arrowhead_forgotten(keep, original)
        precision = keep * self.precision + (1.0 - keep) * original.precision
        linear = keep * (self.precision @ self.mean)
        linear += (1.0 - keep) * (original.precision @ original.mean)
        lower = _cholesky(0.5 * (precision + precision.T), f"The forgotten {self.name}'s precision")
        mean = np.linalg.solve(lower.T, np.linalg.solve(lower, linear))
        return GaussianPrior(mean, precision=precision, name=self.name)

    def _arrowhead_forgotten(self, keep: float, original: GaussianPrior) -> GaussianPrior:
        """:meth:`forgotten` of an arrowhead prior toward a diagonal one, in O(p): the
        precision of an arrowhead covariance is an arrowhead matrix, ``[[diag(1/v), −c/v],
        [−(c/v)ᵀ, 1/s + Σ c²/v]]`` (v the conditional variances, s the last parameter's
        variance), and so is its mixture with a diagonal one; its inverse's moments come
        back by the same formulas."""
        v, c, s = self.conditional_variances, self.slope, self.variances[-1]
        mean_rest, mean_last = self.mean[:-1], self.mean[-1]
        lam0, mean0 = 1.0 / original.variances, original.mean
        # The mixed natural parameters: the diagonal a, the last row h, its corner q, and
        # the linear term (Λμ: of this prior, (μ_rest − c μ_last)/v and its last entry).
        a = keep / v + (1.0 - keep) * lam0[:-1]
        h = -keep * c / v
        q = keep * (1.0 / s + float(c @ (c / v))) + (1.0 - keep) * lam0[-1]
        residual = (mean_rest - c * mean_last) / v
        linear_rest = keep * residual + (1.0 - keep) * lam0[:-1] * mean0[:-1]
        linear_last = keep * (mean_last / s - float(c @ residual)) + (1.0 - keep) * (
            lam0[-1] * mean0[-1]
        )
        # Inverted: the last parameter's marginal precision q − Σ h²/a, the others given it.
        var_last = 1.0 / (q - float(h @ (h / a)))
        mean_last = var_last * (linear_last - float(h @ (linear_rest / a)))
        slope = -h / a
        mean = np.append((linear_rest - h * mean_last) / a, mean_last)
        variances = np.append(1.0 / a + slope**2 * var_last, var_last)
        return GaussianPrior.arrowhead(mean, variances, slope * var_last, name=self.name)

    def __repr__(self) -> str:
        kind = "diagonal" if self.diagonal else "arrowhead" if self.hub is not None else "full"
        return f"GaussianPrior(dim={self.dim}, {kind} covariance)"


def _densified(matrix, p: int, what: str, name: str):
    """``(given, cov, precision)`` of a scipy.sparse covariance or precision: a diagonal
    one as the variances of a diagonal covariance (a precision's inverted, its entries
    checked there), another as the dense matrix it is held as (sized first)."""
    if matrix.shape == (p, p):
        off_diagonal = matrix - sp.diags(matrix.diagonal())
        if off_diagonal.count_nonzero() == 0:
            diagonal = np.asarray(matrix.diagonal(), dtype=float)
            if what == "precision":  # (a zero precision: an infinite variance, refused)
                with np.errstate(divide="ignore"):
                    diagonal = 1.0 / diagonal
            return diagonal, diagonal, None
    check_memory(
        8.0 * 3 * p * p,
        f"the {name}'s dense {p} × {p} {what} (a sparse one is held dense unless diagonal)",
        "Pass a diagonal covariance (its variances), or fewer parameters.",
    )
    dense = matrix.toarray()
    return (dense, dense, None) if what == "covariance" else (dense, None, dense)


def _cholesky(matrix: np.ndarray, what: str) -> np.ndarray:
    try:
        return np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        eigenvalue = float(np.linalg.eigvalsh(matrix).min())
        raise ValueError(
            f"{what} is not positive definite (smallest eigenvalue {eigenvalue:.3g})."
        ) from None
