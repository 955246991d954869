"""Shrinkage priors on the coefficients: Laplace (the Bayesian L1), Student-t and horseshoe.

Each is an independent prior ``Π_j p(θ_j)`` on the coefficients (the intercept keeps the
estimators' vague N(0, 10⁶)). The user-facing classes (:class:`LaplacePrior`,
:class:`StudentTPrior`, :class:`HorseshoePrior`) are estimator parameters: plain frozen
dataclasses (``repr``, ``==``, copied by ``sklearn.clone``), checked in ``fit``
(:meth:`check`). What a model needs of one is its :class:`CoefficientFactor`:

- a **Gaussian base** ``N(0, base_var)`` kept in the model's diagonal prior (the Gaussian
  part of an elastic-net prior, else a broad one that keeps every Gaussian proper), and
- the **non-Gaussian ratio** ``r(t) = p(t) / N(t; 0, base_var)``, so that base × ratio is
  the prior exactly: the models' ``log_prior`` (hence every sampling fit) uses it as it
  is, and expectation propagation approximates each coefficient's ratio by a Gaussian
  site, moment-matched to its one-dimensional tilted density
  (:meth:`CoefficientFactor.tilted_moments`: through the prior's scale-mixture form,
  exact to round-off; the VS fit on a Gauss–Hermite rule,
  :func:`vsbayes.engine.site_fits.fit_sites`, errs at the Laplace kink and the
  horseshoe's spike, docs/decisions.md D-053).

The horseshoe's marginal density is the closed form of Carvalho, Polson & Scott (2010):
with ``u = θ² / (2τ²)``, ``p(θ) = exp(u) E₁(u) / (τ √(2π³))``, evaluated in the log domain
(``exp(u) E₁(u)`` by its asymptotic series for large u). It is unbounded at θ = 0.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from numbers import Real

import numpy as np
from scipy.special import erfcx, exp1, gammaln

from ..engine.site_fits import fit_sites
from ..sampling import GaussHermite

__all__ = [
    "SHRINKAGE_PRIORS",
    "CoefficientFactor",
    "HorseshoePrior",
    "LaplacePrior",
    "StudentTPrior",
    "elastic_net_factor",
]

_LOG_2PI = math.log(2.0 * math.pi)
# The broad Gaussian base of a prior without a Gaussian part: this many times the prior's
# own variance (or its scale's square). Its pull, exactly cancelled in the ratio, only
# keeps the Gaussians of EP proper: a tilted density cavity × ratio is integrable while the
# cavity's variance stays below the base's (any cavity informed by data is far below).
_BASE_FACTOR = 1e8
# Gauss–Hermite order of the prior sites' VS fits (method="vs"): d sites per sweep (not
# M), so the rule's cost is nothing beside the likelihood's.
_SITE_ORDER = 64
# The kernel of a prior site's fit: the posterior marginal of the coefficient (EP's current
# estimate of the tilted density) widened by this factor, so that the rule reaches the
# tilted density's heavier tails (Student-t, horseshoe) beyond the Gaussian's.
_KERNEL_WIDTH = 1.5
# The scale-mixture rule: trapezoid in s = log σ², step 0.3, from 75 below the lower of the
# prior's and the cavity's log-variance (the slowest left tail, the horseshoe's e^{s/2}
# times its cavity's flat N(m; 0, σ² + v), is below e^-37 there) to 45 above the higher
# (the slowest right tail, e^{-s} up to the cavity's Gaussian, below e^-45).
_MIXTURE_STEP, _MIXTURE_BELOW, _MIXTURE_ABOVE = 0.3, 75.0, 45.0
# The rule of method="fast" (leave-one-out's relaxations of the coefficient sites, whose
# sweeps stop at a site change of 1e-3): the step × _FAST_STEP of each prior, and its
# range cut to where that prior's tails still weigh (``fast_below``; 45 above, or 20 for
# the Laplace prior, whose mixing density's right tail is e^{-e^s}). Measured against the
# default rule on cavities of means within ±8 prior scales and variances 1e-4 to 1e2 times
# the prior's (Laplace, Student-t ν = 1, 3, 30, horseshoe τ = 0.001, 0.1, 1): tilted means
# within 7e-7 of a tilted sd, variances within 8e-7 (relative), at 2-3 × fewer nodes.
_FAST_ABOVE = 45.0
# The Student-t's mixing density in s is InvGamma's, of width √(2/ν): the step 0.3 resolves
# it to round-off up to ν = 10 (measured: 4e-10 of an sd against quadrature; 1 % of an sd
# and 0.6 nats a site at ν = 300 on that step), and is narrowed as √(10/ν) beyond, the
# same nodes per width.
_SMOOTH_MIXING_DF = 10.0
# The mixture rule's (coefficients × nodes) arrays at most this many elements at once.
_MIXTURE_BLOCK = 1 << 22
# The parameters' ranges: a scale (or a variance's square root) within 1e±100 keeps every
# variance, its inverse and the mixture rule's e^s inside float64 (the Laplace factor's
# base is 2·10⁸ b²; beyond ~1e143 the rule's e^s overflowed); ν from 10⁻³ (the mixture
# rule is checked against quadrature there) to 10³ (t₁₀₀₀ is the Gaussian N(0, s²) to
# 0.1 % in its variance; the rule's nodes grow as √ν).
_SCALE_RANGE = (1e-100, 1e100)
_DF_RANGE = (1e-3, 1e3)
# tilted_departure's nodes: the tilted density's mean ± 12 sds, 801 even nodes (beyond, at
# most 1/144 of the mass by Chebyshev's inequality, far less for a unimodal density), and
# 200 about 0 at 1e-6 to 1e2 times the prior's scale (√start_var), geometrically spaced.
_DEPARTURE_HALF_WIDTH, _DEPARTURE_NODES = 12.0, 801
_DEPARTURE_SPIKE = (1e-6, 1e2, 100)
# relevance's cavity: its variance within 1e-5 to at most 1e3 times the marginal's (beyond,
# the prior alone decides), found to a tilted variance within 1e-8 (relative) of the
# marginal's in at most 40 steps; its mean by 12 Newton steps each, to 1e-8 sd.
_RELEVANCE_RANGE = (1e-5, 1e3, 1e2, 1e1, 1.0)
_RELEVANCE_TOL, _RELEVANCE_STEPS, _RELEVANCE_NEWTON = 1e-8, 40, 12
# exp(u) E₁(u) directly below this u; its asymptotic series Σ (-1)^k k! / u^(k+1) above
# (10 terms: relative error below 10! / u¹¹ ~ 1e-24 at u = 100).
_SERIES_FROM = 100.0


_SCALE_REASON = "beyond, the prior's variances leave float64's range"
_DF_REASON = "the mixture rule is checked there; t with ν > 1000 is Gaussian to 0.1 %"


def _positive_finite(
    value, name: str, owner: str, bounds=_SCALE_RANGE, reason: str = _SCALE_REASON
) -> float:
    if isinstance(value, bool) or not isinstance(value, Real | np.floating | np.integer):
        raise ValueError(f"{owner}: {name} must be a positive finite number; got {value!r}.")
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"{owner}: {name} must be a positive finite number; got {value!r}.")
    low, high = bounds
    if not low <= float(value) <= high:
        raise ValueError(
            f"{owner}: {name} must be within [{low:g}, {high:g}] ({reason}); got {value!r}."
        )
    return float(value)


@dataclasses.dataclass(frozen=True)
class LaplacePrior:
    """Independent Laplace (double-exponential) prior on each coefficient: the Bayesian L1.

    The density is ``Π_j exp(-|θ_j| / scale) / (2 scale)``. Its mode is the L1-penalized
    solution: ``LaplacePrior(scale=C)`` is the prior of ``penalty="l1"`` with that ``C``
    (the negative log posterior is LogisticRegression's objective ``C Σ loss + ||w||₁``
    divided by C).

    Parameters
    ----------
    scale : float, default=1.0
        Scale b of the Laplace density (its variance is 2b²); positive and finite.
    """

    scale: float = 1.0

    def check(self) -> None:
        """Raise a ValueError naming an invalid parameter."""
        _positive_finite(self.scale, "scale", type(self).__name__)

    def coefficient_factor(self) -> CoefficientFactor:
        """The factor a model takes (see the module docstring)."""
        self.check()
        return _LaplaceFactor(float(self.scale))


@dataclasses.dataclass(frozen=True)
class StudentTPrior:
    """Independent Student-t prior ``t_df(0, scale)`` on each coefficient.

    Parameters
    ----------
    df : float, default=3.0
        Degrees of freedom ν; positive and finite (ν = 1: Cauchy).
    scale : float, default=1.0
        Scale s; positive and finite.
    """

    df: float = 3.0
    scale: float = 1.0

    def check(self) -> None:
        """Raise a ValueError naming an invalid parameter."""
        _positive_finite(self.df, "df", type(self).__name__, _DF_RANGE, _DF_REASON)
        _positive_finite(self.scale, "scale", type(self).__name__)

    def coefficient_factor(self) -> CoefficientFactor:
        """The factor a model takes (see the module docstring)."""
        self.check()
        return _StudentTFactor(float(self.df), float(self.scale))


@dataclasses.dataclass(frozen=True)
class HorseshoePrior:
    """Independent horseshoe prior: ``θ_j | λ_j ~ N(0, λ_j² τ²)``, ``λ_j ~ half-Cauchy(0, 1)``.

    The local scales λ_j are integrated out: each coefficient has the 1-D marginal density
    ``exp(u) E₁(u) / (τ √(2π³))``, ``u = θ² / (2τ²)`` (infinite at 0, Cauchy-like tails).

    Parameters
    ----------
    global_scale : float, default=0.1
        The global scale τ, fixed; positive and finite.
    """

    global_scale: float = 0.1

    def check(self) -> None:
        """Raise a ValueError naming an invalid parameter."""
        _positive_finite(self.global_scale, "global_scale", type(self).__name__)

    def coefficient_factor(self) -> CoefficientFactor:
        """The factor a model takes (see the module docstring)."""
        self.check()
        return _HorseshoeFactor(float(self.global_scale))


#: The user-facing shrinkage prior classes (the estimators' ``prior=`` accepts them).
SHRINKAGE_PRIORS = (LaplacePrior, StudentTPrior, HorseshoePrior)


class CoefficientFactor(abc.ABC):
    """One prior ``p`` on every coefficient, as a model and EP take it.

    Attributes
    ----------
    base_var : float
        Variance of the Gaussian base kept in the model's diagonal prior.
    start_var : float
        Variance of the Gaussian that stands for the prior where its curvature is undefined
        or unbounded (a Laplace kink, the horseshoe's spike): the precision of EP's first
        site there (docs/decisions.md).
    l1 : float
        Weight λ of ``-λ|θ|`` in ``log p`` (0: the prior is smooth), for the mode.
    exact_mode : bool
        Whether :meth:`smooth_part` is the prior's (else a Gaussian stand-in: the horseshoe
        has no finite mode).
    selects_at_half : bool
        Whether :meth:`relevance` above ½ selects a coefficient (the horseshoe's rule).
    """

    base_var: float
    start_var: float
    l1: float = 0.0
    exact_mode: bool = True
    name: str = "prior"
    selects_at_half: bool = False

    @abc.abstractmethod
    def log_density(self, t: np.ndarray) -> np.ndarray:
        """Normalized ``log p(t)``, elementwise."""

    def log_ratio(self, t: np.ndarray) -> np.ndarray:
        """``log p(t) - log N(t; 0, base_var)``, elementwise."""
        return self.log_density(t) + 0.5 * (
            t * t / self.base_var + _LOG_2PI + math.log(self.base_var)
        )

    @abc.abstractmethod
    def smooth_part(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Value, gradient and a curvature ≥ 0 (the negative second derivative, or a
        majorizer's) of ``log p(t) + λ|t|``, elementwise: what the mode's proximal Newton
        method expands."""

    def exact_curvature(self, t: np.ndarray) -> np.ndarray:
        """The negative second derivative of ``log p(t) + λ|t|``, elementwise (negative in a
        heavy tail, where ``-log p`` is not convex); :meth:`smooth_part`'s curvature where
        that is exact already (as here: every prior but the Student-t's)."""
        return self.smooth_part(t)[2]

    @abc.abstractmethod
    def mode_curvature(self, t: np.ndarray) -> np.ndarray:
        """The prior's curvature in the Laplace approximation at the mode ``t``: the negative
        second derivative of ``log p`` where it is defined and positive, else ``1/start_var``."""

    @abc.abstractmethod
    def log_mixing(self, s: np.ndarray) -> np.ndarray:
        """Log density of ``s = log σ²`` where ``p(t) = ∫ N(t; 0, σ²) dG(σ²)`` (each prior
        here is a scale mixture of Gaussians), up to the constant ``mixture_shift``."""

    #: ``log r(t) - log p_mix(t)`` beyond the base's Gaussian: the ratio is
    #: ``exp(mixture_shift) × p(t) / N(t; 0, base_var)`` (0 but for the elastic net).
    mixture_shift = 0.0
    #: The mixture rule's step in ``s = log σ²``.
    mixture_step = _MIXTURE_STEP
    #: Whether the base N(0, base_var) is divided out of the ratio (else the base is the
    #: prior's own Gaussian part, and the ratio is the mixture times exp(mixture_shift)).
    divides_base = True
    #: ``method="fast"``'s rule: the step's factor over ``mixture_step``, and the range
    #: below and above the cavity's and the prior's log-variances (the default rule's
    #: 75 and 45 hold the slowest tail of any prior here; each prior's own is shorter).
    fast_step = 1.0
    fast_below = _MIXTURE_BELOW
    fast_above = _FAST_ABOVE

    def tilted_moments(
        self,
        cav_mean: np.ndarray,
        cav_var: np.ndarray,
        kernel_mean=None,
        kernel_var=None,
        *,
        method: str = "mixture",
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(log Z, mean, variance, fitted)`` of ``r(t) N(t; cav_mean, cav_var) / Z`` per
        coefficient (``fitted``: where the moments are a proper Gaussian's).

        ``method="mixture"`` (the default): the prior as the scale mixture it is,
        ``∫ N(t; 0, σ²) dG(σ²)``, so that each tilted moment is a 1-D integral over
        ``log σ²`` of Gaussian closed forms, analytic in ``log σ²``: a trapezoid rule of
        step 0.3 is exact to round-off (its error ~exp(-2π²/0.3)). ``method="vs"``: the VS
        fit (:func:`~vsbayes.engine.site_fits.fit_sites`) of each tilted density on a
        64-node Gauss–Hermite rule in the frame of ``N(kernel_mean, kernel_var)`` widened
        by 1.5; measured against quadrature it errs by up to 2 % of a standard deviation
        at a Laplace kink and by 50 % at the horseshoe's spike (a Gaussian frame's rule
        does not resolve them), which is why it is not the default. ``method="fast"``:
        the mixture rule on a coarser step and over each prior's own tails (``fast_step``,
        ``fast_below``, ``fast_above``): within 1e-6 of the default (means in tilted sds,
        variances relative) at 2-3 × fewer nodes, for leave-one-out's relaxations, which
        stop at a site change of 1e-3.
        """
        cav_mean = np.asarray(cav_mean, dtype=float)
        cav_var = np.asarray(cav_var, dtype=float)
        if method == "vs":
            return self._vs_tilted_moments(cav_mean, cav_var, kernel_mean, kernel_var)
        if method not in ("mixture", "fast"):
            raise ValueError(f"method must be 'mixture', 'fast' or 'vs'; got {method!r}.")
        return self._mixture_moments(cav_mean, cav_var, fast=method == "fast")[:4]

    def _mixture_moments(self, cav_mean, cav_var, fast=False):
        """:meth:`tilted_moments` by the scale mixture, and the tilted mean of
        ``σ² / (σ² + v)`` (v the cavity's variance, the base divided out): one minus the
        shrinkage factor, given the cavity."""
        log_c = np.full_like(cav_mean, self.mixture_shift)
        mean, var = cav_mean, cav_var
        if self.divides_base:
            # N(t; m, v) / N(t; 0, B) = exp(log_c) N(t; m', v'), 1/v' = 1/v - 1/B.
            precision = 1.0 / cav_var - 1.0 / self.base_var
            proper = precision > 0
            var = 1.0 / np.where(proper, precision, 1.0)
            mean = cav_mean / cav_var * var
            log_c = log_c + 0.5 * (
                _LOG_2PI
                + np.log(self.base_var)
                + np.log(var)
                - np.log(cav_var)
                - cav_mean**2 / cav_var
                + mean**2 / var
            )
        else:
            proper = np.ones(cav_mean.shape, dtype=bool)
        below, above = _MIXTURE_BELOW, _MIXTURE_ABOVE
        if fast:
            below, above = self.fast_below, self.fast_above
        step = self.mixture_step * (self.fast_step if fast else 1.0)
        low = np.minimum(math.log(self.start_var), np.log(var)) - below
        high = np.maximum(math.log(self.start_var), np.log(var)) + above
        n = math.ceil(float(np.max(high - low, initial=0.0)) / step) + 1
        rows = max(1, _MIXTURE_BLOCK // n)
        if mean.size <= rows:
            peak, mass, tilted_mean, tilted_var, first = self._mixture_block(
                mean, var, low, n, step
            )
        else:  # blocks of coefficients, each row's nodes as in one block
            parts = [
                self._mixture_block(
                    mean[i : i + rows], var[i : i + rows], low[i : i + rows], n, step
                )
                for i in range(0, mean.size, rows)
            ]
            peak, mass, tilted_mean, tilted_var, first = (
                np.concatenate(p) for p in zip(*parts, strict=True)
            )
        log_z = log_c + peak + np.log(mass) + math.log(step)
        fitted = proper & np.isfinite(log_z) & (tilted_var > 0)
        return log_z, tilted_mean, tilted_var, fitted, first

    def _mixture_block(self, mean, var, low, n, step):
        """The rule's sums for the cavities ``N(mean, var)`` (the base divided out) on ``n``
        nodes ``step`` apart from ``low``: the log weights' peak and their sum relative to
        it (log Z less the base's constant and the step), the tilted mean and variance, and
        ``first``."""
        s = low[:, None] + step * np.arange(n)  # (d, n) nodes in log σ²
        sigma2 = np.exp(s)
        total = sigma2 + var[:, None]
        # log of w(s) N(m'; 0, σ² + v'): the weight of each scale given the cavity.
        log_w = self.log_mixing(s) - 0.5 * (_LOG_2PI + np.log(total) + mean[:, None] ** 2 / total)
        peak = np.max(log_w, axis=1, keepdims=True)
        w = np.exp(log_w - peak)
        mass = w.sum(axis=1)
        shrink = sigma2 / total  # E[t | σ²] = m' σ² / (σ² + v'), Var[t | σ²] = v' σ² / (σ² + v')
        first = (w * shrink).sum(axis=1) / mass
        second = (w * shrink * shrink).sum(axis=1) / mass
        tilted_mean = mean * first
        tilted_var = var * first + mean * mean * (second - first * first)
        return peak[:, 0], mass, tilted_mean, tilted_var, first

    def relevance(self, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
        """Each coefficient's relevance: the posterior mean of ``1 − κ_j`` where
        ``κ_j = v_j / (v_j + σ_j²)`` is the shrinkage factor of its local variance σ_j²
        against the data's information ``N(m_j, v_j)`` (the prior's scale mixture given a
        Gaussian likelihood shrinks m_j by κ_j: Carvalho, Polson & Scott 2010, whose
        horseshoe selects a coefficient while 1 − κ_j > ½). Near 1: the data overrule the
        prior; near 0: the prior shrinks the coefficient away.

        The data's information is the *cavity*: the Gaussian whose product with the prior
        has the fitted marginal ``N(mean, var)`` as its moments (EP's fixed point per
        coefficient: for an EP fit, its own cavity). Its variance by regula falsi in its log
        (the tilted variance grows with it), its mean by Newton's method (the tilted mean
        is increasing in it, with slope tilted variance ÷ cavity variance); NaN where no
        cavity within 10⁻⁵ to 10³ times the marginal's variance reproduces the marginal.
        """
        mean = np.asarray(mean, dtype=float)
        var = np.asarray(var, dtype=float)

        def matched(cav_var):
            """The tilted variance with the cavity mean that matches ``mean`` (NaN where
            Newton's method does not: a far, wide cavity's bimodal tilted density), and the
            tilted mean of one minus the shrinkage factor."""
            cav_mean = mean.copy()
            for _ in range(_RELEVANCE_NEWTON):
                _, t_mean, t_var, fitted, first = self._mixture_moments(cav_mean, cav_var)
                t_var = np.where(fitted, t_var, cav_var)
                cav_mean = cav_mean + (mean - t_mean) * cav_var / t_var
            _, t_mean, t_var, fitted, first = self._mixture_moments(cav_mean, cav_var)
            ok = fitted & (np.abs(t_mean - mean) <= _RELEVANCE_TOL * np.sqrt(var))
            return np.where(ok, t_var, np.nan), first

        def gap(log_cav_var):
            t_var, first = matched(np.exp(log_cav_var))
            return np.log(t_var / var), first

        # The bracket: the cavity's variance from 1e-5 times the marginal's to the widest of
        # 1e3, 1e2, … 1 times it where the cavity mean is matched and the tilted density is
        # wider than the marginal.
        low = np.log(var) + math.log(_RELEVANCE_RANGE[0])
        g_low = gap(low)[0]
        high, g_high = np.full_like(var, np.nan), np.full_like(var, np.nan)
        for ratio in _RELEVANCE_RANGE[1:]:
            candidate = np.log(var) + math.log(ratio)
            g_candidate = gap(candidate)[0]
            take = np.isnan(g_high) & (g_candidate > 0)
            high, g_high = np.where(take, candidate, high), np.where(take, g_candidate, g_high)
        # The Illinois variant of regula falsi on log(tilted var ÷ var) in log cav_var.
        bracketed = (g_low < 0) & (g_high > 0)
        low, high = np.where(bracketed, low, 0.0), np.where(bracketed, high, 1.0)
        g_low, g_high = np.where(bracketed, g_low, -1.0), np.where(bracketed, g_high, 1.0)
        for _ in range(_RELEVANCE_STEPS):
            middle = high - g_high * (high - low) / (g_high - g_low)
            g_middle, first = gap(middle)
            g_middle = np.where(bracketed & np.isfinite(g_middle), g_middle, 0.0)
            if np.all(np.abs(g_middle) <= _RELEVANCE_TOL):
                break
            crossed = g_middle * g_high < 0
            low, g_low = np.where(crossed, high, low), np.where(crossed, g_high, 0.5 * g_low)
            high, g_high = middle, g_middle
        found = bracketed & np.isfinite(gap(middle)[0]) & (np.abs(g_middle) <= _RELEVANCE_TOL)
        return np.where(found, first, np.nan)

    def tilted_departure(self, cav_mean: np.ndarray, cav_var: np.ndarray) -> np.ndarray:
        """``KL(tilted ‖ N(its mean, its variance))`` per coefficient, in nats: what a
        Gaussian site drops of each tilted density ``r(t) N(t; cav_mean, cav_var)`` (0 for
        a Gaussian one; a bimodal spike-and-slab density, the horseshoe's, up to nats).

        By the trapezoid rule on the tilted mean ± 12 of its sds (``_DEPARTURE_NODES``
        even nodes) joined with nodes spaced geometrically about 0 (the Laplace kink, the
        horseshoe's logarithmic spike, which an even grid resolves only slowly: 3.8 nats
        for 1.5 on 801 nodes), the density normalized on the same nodes.
        """
        cav_mean = np.asarray(cav_mean, dtype=float)
        cav_var = np.asarray(cav_var, dtype=float)
        _, mean, var, fitted = self.tilted_moments(cav_mean, cav_var)
        var = np.where(fitted, var, cav_var)
        sd = np.sqrt(var)
        even = np.linspace(-_DEPARTURE_HALF_WIDTH, _DEPARTURE_HALF_WIDTH, _DEPARTURE_NODES)
        near_zero = math.sqrt(self.start_var) * np.geomspace(*_DEPARTURE_SPIKE)
        t = np.sort(
            np.concatenate(
                [
                    mean[:, None] + sd[:, None] * even,
                    np.broadcast_to(
                        np.concatenate([-near_zero, near_zero]), (mean.size, 2 * near_zero.size)
                    ),
                ],
                axis=1,
            ),
            axis=1,
        )
        with np.errstate(divide="ignore"):
            log_p = self.log_ratio(t) - 0.5 * (t - cav_mean[:, None]) ** 2 / cav_var[:, None]
        log_p -= np.max(log_p, axis=1, keepdims=True)
        width = np.diff(t, axis=1)

        def trapezoid(values):
            return 0.5 * np.sum(width * (values[:, 1:] + values[:, :-1]), axis=1)

        density = np.exp(log_p)
        log_z = np.log(trapezoid(density))
        log_q = (
            -0.5 * (t - mean[:, None]) ** 2 / var[:, None] - 0.5 * (_LOG_2PI + np.log(var))[:, None]
        )
        safe_log_p = np.where(density > 0, log_p, 0.0)
        departure = trapezoid(density * (safe_log_p - log_z[:, None] - log_q)) / np.exp(log_z)
        return np.where(fitted, np.maximum(departure, 0.0), np.inf)

    def _vs_tilted_moments(self, cav_mean, cav_var, kernel_mean, kernel_var):
        def log_tilted(t):
            u = t[..., 0]
            diff = u - cav_mean[:, None]
            return (
                self.log_ratio(u)
                - 0.5 * diff * diff / cav_var[:, None]
                - 0.5 * (_LOG_2PI + np.log(cav_var))[:, None]
            )

        width = _KERNEL_WIDTH * np.sqrt(np.asarray(kernel_var, dtype=float))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            fits = fit_sites(
                log_tilted,
                np.asarray(kernel_mean, dtype=float)[:, None],
                width[:, None, None],
                GaussHermite(_SITE_ORDER),
            )
        mean, var = fits.mean[:, 0], fits.cov[:, 0, 0]
        fitted = fits.integrable & np.isfinite(fits.log_Z) & (var > 0)
        return fits.log_Z, mean, var, fitted

    def __repr__(self) -> str:
        return self.name


class _LaplaceFactor(CoefficientFactor):
    """Laplace(b), or the elastic net's Laplace(b) × N(0, v) normalized (``gauss_var`` v)."""

    # The mixing density's left tail is e^s (e^-30 at 30 below), its right e^{-e^s}.
    fast_step, fast_below, fast_above = 1.2, 30.0, 20.0

    def __init__(self, scale: float, gauss_var: float | None = None):
        self.scale, self.gauss_var = scale, gauss_var
        self.l1 = 1.0 / scale
        self.start_var = 2.0 * scale * scale
        if gauss_var is None:
            self.base_var = _BASE_FACTOR * self.start_var
            self._log_norm = -math.log(2.0 * scale)
            self.name = f"LaplacePrior(scale={scale:g})"
        else:
            self.base_var = gauss_var
            # ∫ Laplace(t; b) N(t; 0, v) dt = exp(x² / 2) Φ(-x) / b, x = √v / b; that is
            # erfcx(x / √2) / 2b, without the cancellation of x²/2 against log Φ(-x) (both
            # 5e11 at l1_ratio = 1 - 1e-12, whose evidence it put 4e-4 nats from the L1's).
            x = math.sqrt(gauss_var) / scale
            log_z = -math.log(2.0 * scale) + math.log(float(erfcx(x / math.sqrt(2.0))))
            self._log_norm = -math.log(2.0 * scale) - log_z
            # The base is the Gaussian part: the ratio is Laplace(t; b) / ∫ Laplace × N.
            self.divides_base, self.mixture_shift = False, -log_z
            self.name = f"elastic net (Laplace scale {scale:g}, Gaussian variance {gauss_var:g})"

    def log_density(self, t):
        value = -np.abs(t) / self.scale + self._log_norm
        if self.gauss_var is not None:
            value = value - 0.5 * (t * t / self.gauss_var + _LOG_2PI + math.log(self.gauss_var))
        return value

    def log_ratio(self, t):
        if self.gauss_var is not None:  # the base is the Gaussian part: no t² to cancel
            return -np.abs(t) / self.scale + self._log_norm
        return super().log_ratio(t)

    def smooth_part(self, t):
        if self.gauss_var is None:
            return np.full_like(t, self._log_norm), np.zeros_like(t), np.zeros_like(t)
        v = self.gauss_var
        value = self._log_norm - 0.5 * (t * t / v + _LOG_2PI + math.log(v))
        return value, -t / v, np.full_like(t, 1.0 / v)

    def log_mixing(self, s):
        # σ² ~ Exponential with mean 2b²: w(s) = e^s exp(-e^s / 2b²) / 2b².
        return s - np.exp(s) / self.start_var - math.log(self.start_var)

    def mode_curvature(self, t):
        smooth = 0.0 if self.gauss_var is None else 1.0 / self.gauss_var
        return np.where(t == 0.0, smooth + 1.0 / self.start_var, smooth)


class _StudentTFactor(CoefficientFactor):
    # The mixing density's left tail is e^{-β e^{-s}}: below e^-40 within 25 of the scale.
    fast_step, fast_below = 1.4, 25.0

    def __init__(self, df: float, scale: float):
        self.df, self.scale = df, scale
        self.start_var = scale * scale * (df / (df - 2.0) if df > 2.0 else 1.0)
        self.base_var = _BASE_FACTOR * self.start_var
        self._c = df * scale * scale
        self.mixture_step = _MIXTURE_STEP * min(1.0, math.sqrt(_SMOOTH_MIXING_DF / df))
        self._log_norm = float(
            gammaln(0.5 * (df + 1.0)) - gammaln(0.5 * df) - 0.5 * math.log(math.pi * self._c)
        )
        self.name = f"StudentTPrior(df={df:g}, scale={scale:g})"

    def log_density(self, t):
        return self._log_norm - 0.5 * (self.df + 1.0) * np.log1p(t * t / self._c)

    def smooth_part(self, t):
        # Curvature: the majorizer (ν + 1) / (νs² + t²) of a scale mixture of Gaussians
        # (-log p is concave in t²), positive everywhere, equal to the curvature at 0.
        denom = self._c + t * t
        return self.log_density(t), -(self.df + 1.0) * t / denom, (self.df + 1.0) / denom

    def log_mixing(self, s):
        # σ² ~ InvGamma(ν/2, νs²/2).
        alpha, beta = 0.5 * self.df, 0.5 * self._c
        return alpha * math.log(beta) - float(gammaln(alpha)) - alpha * s - beta * np.exp(-s)

    def exact_curvature(self, t):
        denom = self._c + t * t
        return (self.df + 1.0) * (self._c - t * t) / (denom * denom)

    def mode_curvature(self, t):
        exact = self.exact_curvature(t)
        return np.where(exact > 0, exact, 1.0 / self.start_var)


class _HorseshoeFactor(CoefficientFactor):
    exact_mode = False
    selects_at_half = True
    # The mixing density's left tail is e^{s/2}: e^-25 at 50 below (its sum over the rule's
    # nodes beyond, relative to the peak's, 1e-10).
    fast_step, fast_below = 2.0, 50.0

    def __init__(self, global_scale: float):
        self.global_scale = tau = global_scale
        # The horseshoe at its local scales' median (λ = 1): N(0, τ²) stands for it where a
        # mode is asked for (its density is infinite at 0, so it has none).
        self.start_var = tau * tau
        self.base_var = _BASE_FACTOR * self.start_var
        self._log_norm = -0.5 * math.log(2.0 * math.pi**3) - math.log(tau)
        self.name = f"HorseshoePrior(global_scale={tau:g})"

    def log_density(self, t):
        u = np.maximum(0.5 * t * t / self.start_var, 1e-300)
        return self._log_norm + _log_scaled_exp1(u)

    def smooth_part(self, t):
        v = self.start_var
        return -0.5 * (t * t / v + _LOG_2PI + math.log(v)), -t / v, np.full_like(t, 1.0 / v)

    def log_mixing(self, s):
        # σ² = λ²τ², λ ~ half-Cauchy(0, 1): w(s) = e^{s/2} / (π τ (1 + e^s / τ²)).
        tau = self.global_scale
        return 0.5 * s - math.log(math.pi * tau) - np.logaddexp(0.0, s - 2.0 * math.log(tau))

    def mode_curvature(self, t):
        return np.full_like(t, 1.0 / self.start_var)


def _log_scaled_exp1(u: np.ndarray) -> np.ndarray:
    """``log(exp(u) E₁(u))`` for u > 0, without overflow."""
    u = np.asarray(u, dtype=float)
    small = u < _SERIES_FROM
    out = np.empty_like(u)
    out[small] = u[small] + np.log(exp1(u[small]))
    large = u[~small]
    term, total = np.ones_like(large), np.ones_like(large)
    for k in range(1, 10):
        term = -term * k / large
        total += term
    out[~small] = np.log(total) - np.log(large)
    return out


def elastic_net_factor(C: float, l1_ratio: float) -> CoefficientFactor | None:
    """The prior of ``penalty="elasticnet"`` (or ``"l1"``, ratio 1) with this ``C``:
    ``∝ exp(-r|θ|/C - (1 - r)θ²/(2C))``, i.e. Laplace(C/r) × N(0, C/(1 - r)), normalized;
    None for r = 0 (the Gaussian prior N(0, C))."""
    if not 0.0 <= l1_ratio <= 1.0:
        raise ValueError(f"l1_ratio must be in [0, 1]; got {l1_ratio!r}.")
    if l1_ratio == 0.0:
        return None
    scale = float(C) / l1_ratio
    gauss_var = float(C) / (1.0 - l1_ratio) if l1_ratio < 1.0 else scale
    low, high = _SCALE_RANGE
    if not (low <= float(C) and scale <= high and gauss_var <= high):
        raise ValueError(
            f"C={C:g} with l1_ratio={l1_ratio:g} gives a prior of Laplace scale C/l1_ratio = "
            f"{scale:g}{'' if l1_ratio == 1.0 else f' and Gaussian variance {gauss_var:g}'}: "
            f"each must be within [{low:g}, {high:g}], where its variances stay inside "
            f"float64's range. Beyond, the prior is flat to round-off: C=np.inf (or "
            f"penalty=None) is the flat prior; l1_ratio=0 the Gaussian one."
        )
    if l1_ratio == 1.0:
        return _LaplaceFactor(scale)
    return _LaplaceFactor(scale, gauss_var)
