"""Binary links F of the GLM likelihood ``P(y | f) = F(y f)``: logistic σ and probit Φ.

Each link gives, in the log domain, ``log F(t)``, the first two derivatives of ``log F`` (for
Newton's method) and the posterior predictive ``∫ F(f) N(f; m, v) df``.
"""

from __future__ import annotations

import abc
import math

import numpy as np
from scipy.special import expit, log_ndtr

from .predictive import logistic_predictive_log_proba
from .probit_predictive import probit_predictive_log_proba
from .tilted import (
    _mills,
    _mills_excess,
    mixture_tilted_moments,
    quadrature_tilted_moments,
    vs_tilted_moments,
)

__all__ = ["LINKS", "Link", "LogisticLink", "ProbitLink", "get_link"]


class Link(abc.ABC):
    """A binary link ``F``; subclasses implement the abstract methods below."""

    name = ""
    # The nearest complex singularity t₀ (upper half-plane) of F^p for 0 < p < 1, where
    # F(t) ≈ c (t - t₀)^{±1}, and log |c|: they size the quadrature of a fractional power
    # (:func:`~vsbayes.models.tilted.quadrature_tilted_moments`); None: the rule of power 1.
    singularity: complex | None = None
    singular_log_scale = 0.0
    # sup_t -d²/dt² log F(t): bounds the tilted density's curvature (its width from below);
    # and the curvature of |F(x + iy)|'s growth in y away from t₀ (Φ: like e^{y²/2}).
    max_curvature = math.inf
    growth_curvature = math.inf
    # Whether F(t) = e^t (1 + O(e^t)) as t → -∞ (σ): the link rule of a fractional power
    # (:func:`~vsbayes.models.tilted.fractional_link_moments`) takes F^p's left tail e^{pt}
    # in closed form.
    exponential_left_tail = False

    @staticmethod
    @abc.abstractmethod
    def log_cdf(t: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``log F(t)`` elementwise (into ``out`` when given)."""

    @classmethod
    def fast_log_cdf(
        cls, t: np.ndarray, out: np.ndarray | None = None, scratch: np.ndarray | None = None
    ) -> np.ndarray:
        """``log F(t)`` to about 1e-7 absolute, faster where the link allows: the
        likelihood of many parameter vectors, whose error is the sampling error's.
        ``scratch``: a float32 array of at least ``t.size`` entries the link may use as its
        temporary (so that a caller looping over blocks allocates nothing)."""
        return cls.log_cdf(t, out=out)

    @staticmethod
    @abc.abstractmethod
    def log_pdf(t: np.ndarray) -> np.ndarray:
        """``log F'(t)``: the log-density of the distribution whose CDF is F."""

    @staticmethod
    @abc.abstractmethod
    def derivatives(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(d/dt log F(t), -d²/dt² log F(t))``; the second is ≥ 0 (log-concave F)."""

    @staticmethod
    @abc.abstractmethod
    def predictive_log_proba(mean, var) -> tuple[np.ndarray, np.ndarray]:
        """``(log p, log(1 - p))`` with ``p = ∫ F(f) N(f; mean, var) df``."""

    def tilted_moments(
        self, mean, var, power=1.0, method: str = "auto"
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(log Z, mean, variance)`` of ``F(t)^power N(t; mean, var) / Z``, elementwise.

        Parameters
        ----------
        mean, var : array-like of shape (M,)
            Cavity means and positive variances.
        power : float or array-like of shape (M,), default=1.0
            Exponents of F, in (0, 1].
        method : {"auto", "closed", "vs", "quadrature", "fast"}, default="auto"
            ``"closed"``: the closed form, where the link has one (probit, power 1);
            ``"vs"``: variational-sampling site fits on Gauss–Hermite rules
            (:func:`~vsbayes.models.tilted.vs_tilted_moments`); ``"quadrature"``: the
            adaptive trapezoid rule (:func:`~vsbayes.models.tilted.quadrature_tilted_moments`).
            ``"auto"`` is the closed form where it exists, else VS. All are accurate to about
            1e-8. ``"fast"``: as ``"auto"``, but the logistic's sites of power 1 from its
            mixture of probits (:func:`~vsbayes.models.tilted.mixture_tilted_moments`,
            about 40 times cheaper than VS, within 3e-7).
        """
        if method == "fast" and self.name == "logistic":
            return mixture_tilted_moments(self, mean, var, power)
        if method == "closed" or (method in ("auto", "fast") and self.has_closed_form(power)):
            return self._closed_tilted_moments(mean, var, power)
        if method in ("auto", "vs", "fast"):
            return vs_tilted_moments(self, mean, var, power)
        if method == "quadrature":
            return quadrature_tilted_moments(self, mean, var, power)
        raise ValueError(
            f"method must be one of ['auto', 'closed', 'vs', 'quadrature', 'fast']; got {method!r}."
        )

    def has_closed_form(self, power) -> bool:
        """Whether :meth:`tilted_moments` has a closed form for these powers."""
        return False

    def _closed_tilted_moments(self, mean, var, power):
        raise ValueError(
            f"The {self.name} link has no closed-form tilted moments; use method='vs' or "
            f"'quadrature'."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LogisticLink(Link):
    """``F = σ``, the logistic sigmoid."""

    name = "logistic"
    # σ's poles at ±iπ, where σ(t) ≈ 1/(t ∓ iπ).
    singularity = complex(0.0, math.pi)
    max_curvature = 0.25
    growth_curvature = 0.0  # |σ(x + 2πik)| = σ(x): bounded between its poles
    exponential_left_tail = True

    @staticmethod
    def log_cdf(t, out=None):
        # log σ(t) = min(t, 0) - log1p(exp(-|t|)): exact in float64 and about three times
        # faster than scipy.special.log_expit, which dominates the likelihood's cost.
        lower = np.minimum(t, 0.0)
        out = np.abs(t, out=out)
        np.negative(out, out=out)
        np.exp(out, out=out)
        np.log1p(out, out=out)
        return np.subtract(lower, out, out=out)

    @classmethod
    def fast_log_cdf(cls, t, out=None, scratch=None):
        # The soft part log1p(exp(-|t|)), in (0, log 2], in float32: four times faster
        # than float64 (SIMD exp and log1p), to 1e-7 absolute; min(t, 0) stays float64.
        shape = np.shape(t)
        if scratch is None:
            scratch = np.empty(shape, dtype=np.float32)
        else:
            scratch = scratch[: int(np.prod(shape))].reshape(shape)
        with np.errstate(over="ignore"):  # |t| beyond float32: inf, and exp(-inf) = 0
            soft = np.abs(t, out=scratch)
        np.negative(soft, out=soft)
        np.exp(soft, out=soft)
        np.log1p(soft, out=soft)
        out = np.minimum(t, 0.0, out=out)
        return np.subtract(out, soft, out=out)

    @staticmethod
    def log_pdf(t):
        # σ'(t) = σ(t) σ(-t), symmetric: one log σ of -|t| and a log1p.
        return LogisticLink.log_cdf(-np.abs(t)) + LogisticLink.log_cdf(np.abs(t))

    @staticmethod
    def derivatives(t):
        upper = expit(-t)  # d/dt log σ(t) = σ(-t)
        return upper, upper * (1.0 - upper)

    predictive_log_proba = staticmethod(logistic_predictive_log_proba)


class ProbitLink(Link):
    """``F = Φ``, the standard normal CDF."""

    name = "probit"
    # Φ's zeros nearest the real axis, 1.916 ± 2.816i (the first zero of erfc, times -√2),
    # where Φ(t) ≈ φ(t₀)(t - t₀), |φ(t₀)| = exp(1.2115).
    singularity = complex(1.91599085761643, 2.8163594181520017)
    singular_log_scale = 1.2115
    max_curvature = 1.0
    growth_curvature = 1.0

    @staticmethod
    def log_cdf(t, out=None):
        return log_ndtr(t, out=out)

    @staticmethod
    def log_pdf(t):
        return -0.5 * np.square(t) - 0.5 * math.log(2.0 * math.pi)

    @staticmethod
    def derivatives(t):
        # Inverse Mills ratio φ(t)/Φ(t), through erfcx: accurate to round-off for any t
        # (≈ -t as t → -∞, 0 where erfcx overflows); t + ratio from its series far left,
        # where the sum cancels.
        ratio = _mills(t)
        return ratio, ratio * _mills_excess(t, ratio)

    predictive_log_proba = staticmethod(probit_predictive_log_proba)

    def has_closed_form(self, power) -> bool:
        return bool(np.all(np.asarray(power) == 1.0))

    def _closed_tilted_moments(self, mean, var, power):
        # Closed form for power 1 (Rasmussen and Williams 2006, eq. 3.58) with z = m/√(1+v)
        # and the Mills ratio r = φ(z)/Φ(z) through erfcx, accurate for any z.
        if not self.has_closed_form(power):
            raise ValueError("The probit tilted moments have a closed form for power 1 only.")
        mean, var = np.asarray(mean, dtype=float), np.asarray(var, dtype=float)
        root = np.sqrt(1.0 + var)
        z = mean / root
        ratio = _mills(z)
        tilted_mean = mean + var * ratio / root
        tilted_var = var - var * var * ratio * _mills_excess(z, ratio) / (1.0 + var)
        return log_ndtr(z), tilted_mean, tilted_var


LINKS = {"logistic": LogisticLink(), "probit": ProbitLink()}


def get_link(name: str) -> Link:
    """The link called ``name`` (``"logistic"`` or ``"probit"``)."""
    try:
        return LINKS[name]
    except KeyError:
        raise ValueError(f"link must be one of {sorted(LINKS)}; got {name!r}.") from None
