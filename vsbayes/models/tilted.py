"""Moments of tilted densities ``F(t)^e N(t; m, v) / Z``, vectorized over sites.

Two integrators. :func:`vs_tilted_moments` is the one expectation propagation uses: the
variational-sampling fit of each narrow tilted density
(:func:`vsbayes.engine.site_fits.fit_sites`) on a Gauss–Hermite rule in the frame of its
Laplace approximation, exact when the tilted density is Gaussian, and one trapezoid rule on
the link's own scale for the others (:func:`link_variable_moments`; for a power below 1,
:func:`fractional_link_moments`).
:func:`quadrature_tilted_moments` is the accurate reference (and serves the few sites
neither covers):

The log-density ``ψ(t) = e log F(t) + log N(t; m, v)`` is concave (F log-concave). Its mode
t* is found by safeguarded Newton inside the bracket ``[m, m + v e (log F)'(m)]``; the
curvature there gives the width ``w = (-ψ''(t*))^{-1/2}``. The trapezoid rule on
``t = t* + w u`` then converges geometrically (the integrands are analytic in a strip), with
a step of at most 0.25 in u and 0.4 in t (the singularities of ``log σ`` are π from the real
axis), over ``|u| ≤ U``: 12 where ψ has dropped by 40 there, more on a side where it falls
slower (concavity makes the drop grow at least linearly beyond 12). A power e below 1 (a
sample weight) makes F^e nearer a constant, and its step is sized by the aliasing error of
F^e's branch points, which falls with e (``_fractional_step``). The node count per site
follows (at least 64 per side). A site that would need more than 2¹⁵ per side (a cavity
whose sd is ~10⁴ times the link's scale, where one step cannot serve both the link's bend
and the cavity's width) takes the trapezoid rule on ``t = c + λ sinh(h j)`` instead, c the
link's bend: its step is the uniform rule's there and grows with the distance from it,
and the rule halves h until it agrees with its own even nodes (``_mapped_sizes``). Sites
are processed in blocks within ``_memory.block_bytes()`` (scikit-learn's
``working_memory``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erfcx, log_ndtr, ndtr

from .._memory import block_length
from ..engine.site_fits import fit_sites
from ..sampling import GaussHermite
from .predictive import _MIXTURE_INV_SCALES2, _MIXTURE_WEIGHTS

__all__ = [
    "fractional_link_moments",
    "link_variable_moments",
    "mixture_tilted_moments",
    "narrow_tilted_moments",
    "quadrature_tilted_moments",
    "tilted_mode",
    "vs_tilted_moments",
]

# Step of at most 0.4 in t: the singularities of log σ are π from the real axis.
_MAX_T_STEP = 0.4
_MIN_NODES, _MAX_NODES = 64, 2**15
# Temporaries of the rules: about eight float64 arrays of (sites × nodes) at once.
_BYTES_PER_ENTRY = 64
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _psi(link, t, mean, var, power):
    return power * link.log_cdf(t) - 0.5 * (t - mean) ** 2 / var - 0.5 * np.log(var) - _LOG_SQRT_2PI


def tilted_mode(link, mean, var, power) -> tuple[np.ndarray, np.ndarray]:
    """``(mode, width)`` of ``F(t)^power N(t; mean, var)``, elementwise: the mode by
    safeguarded Newton, the width ``(-ψ''(mode))^{-1/2}`` (its Laplace approximation's
    standard deviation; ``partial_fit``'s Laplace revisits)."""
    mean, var, power = _as_sites(mean, var, power)
    return _mode(link, mean, var, power)


def _mode(link, mean, var, power, iterations=80):
    """Mode of ψ by Newton's method, safeguarded by bisection inside its bracket."""
    slope0, curvature0 = link.derivatives(mean)
    lo, hi = mean.copy(), mean + var * power * slope0
    # One Newton step from the mean (inside the bracket: ψ'' ≤ -1/v).
    t = mean + var * power * slope0 / (1.0 + var * power * curvature0)
    last = np.zeros_like(t)  # each site's previous step
    for _ in range(iterations):
        slope, curvature = link.derivatives(t)
        grad = power * slope - (t - mean) / var
        hess = -(power * curvature + 1.0 / var)
        lo = np.where(grad > 0, t, lo)
        hi = np.where(grad > 0, hi, t)
        newton = t - grad / hess
        # A round-off step at the root may leave the bracket (t is one of its ends): taken,
        # lest bisection move a converged site away.
        inside = ((newton > lo) & (newton < hi)) | (np.abs(newton - t) <= 1e-11 * (1.0 + np.abs(t)))
        # A step back across the mode, not half the one before, bisects: over a wide
        # cavity, Newton can swing between the two flanks of the link's bend (steps
        # of ±10.7 on a cavity of variance 15), each swing inside the bracket and
        # shrinking it by little (75 iterations for one site of a one-row call).
        step = newton - t
        swinging = (step * last < 0) & (np.abs(step) > 0.5 * np.abs(last))
        inside &= ~swinging
        t_new = np.where(inside, newton, 0.5 * (lo + hi))
        last = t_new - t
        done = np.all(np.abs(t_new - t) <= 1e-13 * (1.0 + np.abs(t)))
        t = t_new
        if done:
            break
    _, curvature = link.derivatives(t)
    return t, 1.0 / np.sqrt(power * curvature + 1.0 / var)


# Gauss–Hermite orders of the VS site fits, chosen by the cavity variance v: the ratio of a
# tilted density to its Laplace approximation varies on the link's own scale (σ and Φ bend
# over |t| ≲ 1), i.e. on 1/√v of the frame, and the order needed grows like v. Measured
# against quadrature over cavity means within ±4√v (absolute error of mean and variance):
# order 16 to v = 1.5 (≤ 2e-8), 32 to 3 (≤ 1e-8), 64 to 6 (≤ 2e-9), 128 to 12 (≤ 6e-9);
# each order takes twice the v of the one before.
_GH_ORDERS = (16, 32, 64, 128)
_GH_FIRST_VAR = 1.5
# Beyond this cavity variance (power 1; or below 1 on the logistic, whose rule on the
# link's scale errs by about p times power 1's: measured against a fine quadrature over
# v in [1, 3e4], |m| ≤ 300√v, log Z, the mean in sds and the variance relative within
# 7.5e-10, 1.8e-9 and 1e-8 at p = 0.99 (as power 1's), 6e-14, 2.3e-13 and 6.6e-13 at
# p = 1e-3, round-off below) the moments come from the link's own scale: as
# accurate as the VS fits from v = 1 on (below, its step no longer resolves the Gaussian),
# and 10-50 times cheaper per site (one exp per node against Newton iterations on a rule
# of 16-64 points); measured on EP's cavities (sklearn digits, 1797 sites), 29 ms → 1.5 ms.
_WIDE_VAR = 1.0
# Trapezoid rule on the link's scale: step 0.7 (σ is analytic within π of the real axis)
# over [-45, 45], beyond which F - Φ(t/s) is below 3e-20 (sites whose tilted mass reaches
# further left are left to the other rules: see _link_rule_covers). Measured against quadrature,
# logistic and probit, |m| ≤ 40√v: log Z and mean (in sds) within 1e-9, variance within
# 1e-8 relative for v ≥ 1 (5e-10 for v ≥ 1.5).
_LINK_STEP, _LINK_LOW, _LINK_HIGH = 0.7, -45.0, 45.0
# Most nodes per site of vs_tilted_moments' rules (Gauss–Hermite up to order 128, or the
# trapezoid grid on [-45, 45] in steps of 0.7).
_MAX_SITE_NODES = 129


def _order_index(var: np.ndarray) -> np.ndarray:
    """Index into ``_GH_ORDERS`` of each site (``len(_GH_ORDERS)``: too wide, quadrature)."""
    ratio = np.maximum(var / _GH_FIRST_VAR, 1.0)
    return np.minimum(np.ceil(np.log2(ratio)), len(_GH_ORDERS)).astype(int)


def vs_tilted_moments(link, mean, var, power=1.0):
    """``(log Z, mean, variance)`` of ``F(t)^power N(t; mean, var) / Z``, fast and accurate.

    Sites whose cavity is narrow on the link's scale (variance up to 1 with power 1 or on
    the logistic, up to 12 otherwise) are fitted by variational sampling on a Gauss–Hermite
    rule in the frame of their Laplace approximation (mode and curvature), all sites of one
    rule order at once, the order growing with the cavity variance (see ``_GH_ORDERS``). On
    a wide cavity the tilted density bends sharply on the scale of its own frame, which no
    short rule in that frame resolves; there the moments are taken on the link's own scale
    (power 1: :func:`link_variable_moments`; a power below 1 on the logistic:
    :func:`fractional_link_moments`). The few sites beyond these use
    :func:`quadrature_tilted_moments`. Every part agrees with that quadrature to about 1e-7.

    Parameters
    ----------
    link : Link
        Provides ``log_cdf``, ``log_pdf`` and ``derivatives`` (a log-concave, increasing F).
    mean, var : array-like of shape (M,)
        Cavity means and (positive) variances.
    power : float or array-like of shape (M,), default=1.0
        Positive exponents of F.

    Returns
    -------
    log_Z, tilted_mean, tilted_var : ndarray of shape (M,)
    """
    mean, var, power = _as_sites(mean, var, power)
    block = block_length(_BYTES_PER_ENTRY * _MAX_SITE_NODES)
    if mean.size > block:
        # Sites in blocks: the rules' temporaries are (sites × nodes) arrays.
        blocks = [
            vs_tilted_moments(link, *(a[j : j + block] for a in (mean, var, power)))
            for j in range(0, mean.size, block)
        ]
        return tuple(np.concatenate(parts) for parts in zip(*blocks, strict=True))
    log_z, t_mean, t_var = (np.empty_like(mean) for _ in range(3))
    wide = (var > _WIDE_VAR) & (power == 1.0) & _link_rule_covers(mean, var)
    if wide.any():
        log_z[wide], t_mean[wide], t_var[wide] = link_variable_moments(link, mean[wide], var[wide])
    # A fractional power (a sample weight below 1) on the link's scale too, where the
    # link's left tail is exponential (σ): it covers every cavity (see its docstring).
    fraction = (var > _WIDE_VAR) & (power < 1.0) & link.exponential_left_tail
    if fraction.any():
        log_z[fraction], t_mean[fraction], t_var[fraction] = fractional_link_moments(
            link, mean[fraction], var[fraction], power[fraction]
        )
        wide |= fraction
    rest = np.flatnonzero(~wide)
    order_index = _order_index(var[rest])
    for index in np.unique(order_index):
        sites = rest[order_index == index]
        m, v, e = mean[sites], var[sites], power[sites]
        if index == len(_GH_ORDERS):
            log_z[sites], t_mean[sites], t_var[sites] = quadrature_tilted_moments(link, m, v, e)
            continue
        mode, width = _mode(link, m, v, e)

        def log_tilted(t, m=m, v=v, e=e):
            return _psi(link, t[..., 0], m[:, None], v[:, None], e[:, None])

        fits = fit_sites(
            log_tilted, mode[:, None], width[:, None, None], GaussHermite(_GH_ORDERS[index])
        )
        log_z[sites], t_mean[sites], t_var[sites] = fits.log_Z, fits.mean[:, 0], fits.cov[:, 0, 0]
        # A fit that is not integrable (never seen on log-concave sites) takes the reference.
        bad = ~fits.integrable
        if bad.any():
            ref = quadrature_tilted_moments(link, m[bad], v[bad], e[bad])
            log_z[sites[bad]], t_mean[sites[bad]], t_var[sites[bad]] = ref
    return log_z, t_mean, t_var


# The mixture's tilted moments are used where the site's Z is at least this: measured
# against quadrature over v in [1e-3, 1e4] and m/√(1 + v) in [-6, 8] (200 000 sites), the
# mean within 4e-8 of the tilted sd, the variance within 3e-7 relative and log Z within
# 4e-8 (at Z ≥ 1e-3: 5e-7, 4e-6; the mixture's absolute error 4e-10 grows relative to
# a small Z, times v in the variance). Wider cavities than that range (v > 1e4) keep the
# VS fits: the variance's cancellation grows with v.
_MIXTURE_MIN_Z = 1e-2
_MIXTURE_MAX_VAR = 1e4


# Cavities narrow on the link's scale, where a Gauss–Hermite rule in the cavity's own frame
# integrates F^e: measured against quadrature (powers in [0.3, 1], cavity means within
# ±6 √(1 + v), 4000 sites per range, and the grid of tests/test_site_fits.py), order 24 at
# v ≤ 1 is within 2e-10 (logistic) and 1e-7 (probit, whose log Φ bends quadratically in
# the tail; 7.5e-8 at m = −6√2, v = 1) in the variance, relative,
# 5e-11 and 4e-9 in the mean (in sds), 1e-11 and 6e-10 in log Z; at v ≤ 1.5 the probit's
# variance is 4e-6 off.
NARROW_MAX_VAR = 1.0
_NARROW_NODES, _NARROW_WEIGHTS = np.polynomial.hermite.hermgauss(24)


def narrow_tilted_moments(link, mean, var, power=1.0):
    """``(log Z, mean, variance)`` of ``F(t)^power N(t; mean, var) / Z`` on cavities of
    variance at most :data:`NARROW_MAX_VAR`, by a Gauss–Hermite rule of order 24 in the
    cavity's frame: no mode search, any power (``partial_fit``'s revisits under
    forgetting, whose powers are below 1, where :func:`mixture_tilted_moments` does not
    apply). Within 1e-7 of :func:`quadrature_tilted_moments` there (see
    ``NARROW_MAX_VAR``).

    Parameters
    ----------
    link : Link
        Provides ``log_cdf``.
    mean, var : array-like of shape (M,)
        Cavity means and variances in (0, ``NARROW_MAX_VAR``].
    power : float or array-like of shape (M,), default=1.0
        Positive exponents of F.

    Returns
    -------
    log_Z, tilted_mean, tilted_var : ndarray of shape (M,)
    """
    mean, var, power = _as_sites(mean, var, power)
    t = mean[:, None] + np.sqrt(2.0 * var)[:, None] * _NARROW_NODES
    log_f = power[:, None] * link.log_cdf(t)
    top = log_f.max(axis=1, keepdims=True)
    f = _NARROW_WEIGHTS * np.exp(log_f - top)
    z = f.sum(axis=1)
    t_mean = (f * t).sum(axis=1) / z
    t_var = (f * (t - t_mean[:, None]) ** 2).sum(axis=1) / z
    return np.log(z) + top[:, 0] - 0.5 * math.log(math.pi), t_mean, t_var


def mixture_tilted_moments(link, mean, var, power=1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log Z, mean, variance)`` of ``σ(t)^power N(t; mean, var) / Z`` (the logistic
    link) in closed form, from the logistic's mixture of nine probits
    ``σ(t) ≈ Σ a_k Φ(s_k t)`` (:mod:`~vsbayes.models.predictive`, error below 4e-10):
    ``Z = Σ a_k Φ(z_k)`` with ``z_k = m / √(1/s_k² + v)``, and the tilted mean and variance
    from Z's first two derivatives in m (``m + v ∂ log Z``, ``v + v² ∂² log Z``).

    About 40 times cheaper than :func:`vs_tilted_moments` (nine ``Φ`` and ``exp`` per site,
    no mode search, no rule), less exact where Z is small (the mixture's error is absolute):
    sites with ``Z < 1e-2`` (a cavity confident of the other label), a cavity variance
    above 1e4 or a power other than 1 take :func:`vs_tilted_moments`. Within 3e-7 of the
    quadrature elsewhere (see ``_MIXTURE_MIN_Z``): for many sweeps that stop at a coarser
    site change, as leave-one-out's refits.

    Parameters
    ----------
    link : Link
        The logistic link (its ``log_cdf`` etc. serve the sites the mixture leaves out).
    mean, var : array-like of shape (M,)
        Cavity means and (positive) variances.
    power : float or array-like of shape (M,), default=1.0
        Positive exponents of σ.

    Returns
    -------
    log_Z, tilted_mean, tilted_var : ndarray of shape (M,)
    """
    mean, var, power = _as_sites(mean, var, power)
    z0, z1, z2 = (np.zeros_like(mean) for _ in range(3))  # Z and its m-derivatives
    for weight, inv_scale2 in zip(_MIXTURE_WEIGHTS, _MIXTURE_INV_SCALES2, strict=True):
        root = 1.0 / np.sqrt(inv_scale2 + var)
        z = mean * root
        density = np.exp(-0.5 * z * z) * (weight / math.sqrt(2.0 * math.pi)) * root
        z0 += weight * ndtr(z)
        z1 += density
        z2 -= density * z * root
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = z1 / z0
        log_z = np.log(z0)
        t_mean = mean + var * slope
        t_var = var + var * var * (z2 / z0 - slope * slope)
    other = np.flatnonzero((z0 < _MIXTURE_MIN_Z) | (var > _MIXTURE_MAX_VAR) | (power != 1.0))
    if other.size:
        log_z[other], t_mean[other], t_var[other] = vs_tilted_moments(
            link, mean[other], var[other], power[other]
        )
    return log_z, t_mean, t_var


def _link_rule_covers(mean, var):
    """Whether :func:`link_variable_moments`' range holds the tilted mass of each site.

    In the left tail F ≤ e^t (logistic; the probit falls faster), so the tilted log-density
    is at most ``t - (t - m)²/(2v)``, concave with its peak at ``min(m + v, 0)`` on t ≤ 0:
    the rule covers the site when that bound drops by 40 from the peak to the lower end.
    """
    peak = np.clip(mean + var, _LINK_LOW, 0.0)
    drop = peak - _LINK_LOW - ((peak - mean) ** 2 - (_LINK_LOW - mean) ** 2) / (2.0 * var)
    return drop > 40.0


def link_variable_moments(link, mean, var):
    """Tilted moments of ``F(t) N(t; m, v)`` from one trapezoid rule on the link's own scale.

    With ``s²`` the variance of the link's variable ``L ~ F'``, ``F`` differs from the
    probit ``Φ(t/s)`` only where L has its mass, and ``∫ Φ(t/s) N(t; m, v) dt`` is
    ``Φ(m/√(s² + v))``; so

        Z(m) = Φ(m/√(s² + v)) + ∫ (F(t) - Φ(t/s)) N(t; m, v) dt

    exactly, the integrand vanishing outside a fixed range of t (see ``_LINK_STEP``). The
    Gaussian factor is the only part that depends on the site: the rule is one product of
    the (sites × nodes) Gaussian weights with three node vectors, no transcendental
    function per entry but one exp. Mean and variance are ``m + v ∂ log Z`` and
    ``v + v² ∂² log Z`` (derivatives in m), taken of the same discrete sum: consistent
    with log Z to round-off, they lose no digits to the cancellation in the variance of a
    wide cavity. Accurate when v ≳ 1 (the Gaussian is then resolved by the rule's step).

    Parameters
    ----------
    link : Link
        Provides ``log_cdf`` and ``log_pdf`` (the log-density of L, ``log F'``).
    mean, var : ndarray of shape (M,)
        Cavity means and variances.

    Returns
    -------
    log_Z, tilted_mean, tilted_var : ndarray of shape (M,)
    """
    nodes, scale, basis = _link_rule(link)
    gauss, log_scale = _link_rule_gauss(nodes, mean, var)
    s0, s1, s2 = (gauss @ basis).T
    root = np.sqrt(scale * scale + var)
    x = mean / root
    log_ref = log_ndtr(x)
    # Z and its derivatives in m, all relative to exp(top).
    top = np.maximum(log_ref, log_scale)
    k = np.exp(log_scale - top)
    d1 = np.exp(-0.5 * x * x - _LOG_SQRT_2PI - np.log(root) - top)  # ∂ Φ(m/√(s² + v))
    z0 = np.exp(log_ref - top) + k * s0
    z1 = d1 + k * (s1 - mean * s0) / var
    z2 = -(x / root) * d1 + k * ((s2 - 2.0 * mean * s1 + mean * mean * s0) / var - s0) / var
    slope = z1 / z0
    return top + np.log(z0), mean + var * slope, var + var * var * (z2 / z0 - slope * slope)


def _link_rule_gauss(nodes, mean, var):
    """The cavities' Gaussian densities at the link rule's nodes, one row per site, scaled
    to 1 at the node nearest each mean (no underflow far out), and the log of that scale."""
    nearest = np.clip(mean, _LINK_LOW, nodes[-1])
    gauss = nodes - mean[:, None]
    np.square(gauss, out=gauss)
    gauss -= ((nearest - mean) ** 2)[:, None]
    gauss *= (-0.5 / var)[:, None]
    np.exp(gauss, out=gauss)
    log_scale = -0.5 * (nearest - mean) ** 2 / var - 0.5 * np.log(var) - _LOG_SQRT_2PI
    return gauss, log_scale


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)


def _mills(x):
    """The inverse Mills ratio ``φ(x)/Φ(x) = √(2/π) / erfcx(-x/√2)``: accurate for any x
    (≈ -x as x → -∞, 0 far right, where erfcx overflows); the probit link's too."""
    return _SQRT_2_OVER_PI / erfcx(-x * _SQRT_HALF)


# Beyond this distance left of 0 the Mills ratio's excess over -x comes from its series:
# the difference x + r keeps ~eps·x² of its digits (1e-10 here, all of them from x ~ 10⁸),
# the series' first omitted term is 945/x⁸ of it (1e-21 here).
_MILLS_SERIES_FROM = 1e3


def _mills_excess(x, ratio):
    """``x + r`` for the inverse Mills ratio ``r = _mills(x)``, to round-off for any x: far
    left r ≈ -x - 1/x and the sum cancels, so there it is ``r (1 - u R)`` with ``u = -x``
    and ``u R(u) = 1 - 1/u² + 3/u⁴ - 15/u⁶ + 105/u⁸ - …`` (R: the Gaussian's upper-tail Mills
    ratio ``(1 - Φ(u))/φ(u) = 1/r``). Without it the probit's curvature ``r (x + r)`` was
    round-off beyond |x| ~ 10⁶ (228881 at x = -3·10¹⁰, for ~1), and a tilted mode on such a
    cavity came out at -7.6·10⁹ for -300."""
    excess = x + ratio
    far = x < -_MILLS_SERIES_FROM
    if not np.any(far):
        return excess
    w = 1.0 / np.square(np.where(far, x, 1.0))
    series = w * (1.0 - w * (3.0 - w * (15.0 - w * 105.0)))
    return np.where(far, ratio * series, excess)


def fractional_link_moments(link, mean, var, power):
    """Tilted moments of ``F(t)^p N(t; m, v)``, ``0 < p < 1``, from the trapezoid rule on
    the link's own scale, for a link whose left tail is exponential (σ: ``F(t) = e^t
    (1 + O(e^t))``).

    :func:`link_variable_moments` with a reference for each tail: ``F^p`` is ``e^{pt}`` far
    left and 1 far right, so with ``R(t) = e^{pt} Φ(-t/s) + Φ(t/s)``, whose Gaussian
    integral is closed (``e^{pm + p²v/2} Φ(-(m + pv)/r) + Φ(m/r)``, ``r = √(s² + v)``),

        Z(m) = ∫ R(t) N(t; m, v) dt + ∫ (F^p - R)(t) N(t; m, v) dt

    exactly. ``F^p - R`` is below ``p e^{(1+p)t}`` for t < -45 and ``p e^{-t}`` for t > 45
    (Φ(±45/s) ≈ 1e-136): relative to the tilted density there, ``p e^{-45}`` ≈ 3e-20 p, so
    the rule's range covers every cavity (the power-1 rule's ``F - Φ(t/s)`` is ``e^t`` far
    left, and covers only cavities whose tilted mass stays right of -45). The rule's step
    0.7 errs as for power 1 (``F^p``'s branch points at ±iπ, their strength about p;
    the Gaussian resolved for v ≥ 1). Mean and variance are ``m + v ∂ log Z`` and
    ``v + v² ∂² log Z``, from derivatives in m of the same sums. One rule per site (its
    power), three exp per node.

    Parameters
    ----------
    link : Link
        A link with ``exponential_left_tail``; provides ``log_cdf`` and ``log_pdf``.
    mean, var : ndarray of shape (M,)
        Cavity means and variances (v ≥ 1 for the rule's accuracy).
    power : ndarray of shape (M,)
        Exponents of F, in (0, 1).

    Returns
    -------
    log_Z, tilted_mean, tilted_var : ndarray of shape (M,)
    """
    nodes, scale, _ = _link_rule(link)
    log_f, left, right, moments = _fractional_rule(link)
    p = power[:, None]
    # F^p - R at the nodes, one row per site (its power).
    diff = np.exp(p * log_f)
    diff -= np.exp(p * nodes) * left
    diff -= right
    gauss, log_scale = _link_rule_gauss(nodes, mean, var)
    gauss *= diff
    s0, s1, s2 = (gauss @ moments).T
    root = np.sqrt(scale * scale + var)
    x1, x2 = -(mean + power * var) / root, mean / root
    # log(e^{pm + p²v/2} Φ(x₁)); for x₁ < 0 as log(erfcx(-x₁/√2)/2) - x₁²/2, whose
    # quadratic terms combine in closed form: pm + p²v/2 and x₁²/2, each ~p²v/2, would
    # cancel (to 3e-9 at v = 1e8, 3e-7 at 1e10).
    scale2 = scale * scale
    with np.errstate(over="ignore"):  # erfcx of a large argument: only where x₁ ≥ 0
        stable = (2.0 * power * mean * scale2 + power * power * var * scale2 - mean * mean) / (
            2.0 * (scale2 + var)
        ) + np.log(0.5 * erfcx(-x1 * _SQRT_HALF))
    direct = power * mean + 0.5 * power * power * var + log_ndtr(x1)
    log_left = np.where(x1 < 0.0, stable, direct)
    log_right = log_ndtr(x2)
    top = np.maximum(np.maximum(log_left, log_right), log_scale)
    a1, a2, k = np.exp(log_left - top), np.exp(log_right - top), np.exp(log_scale - top)
    q1, q2 = _mills(x1) / root, _mills(x2) / root
    # Z and its derivatives in m, all relative to exp(top).
    z0 = a1 + a2 + k * s0
    z1 = a1 * (power - q1) + a2 * q2 + k * (s1 - mean * s0) / var
    z2 = (
        a1 * (power * power - 2.0 * power * q1 - x1 * q1 / root)
        - a2 * x2 * q2 / root
        + k * ((s2 - 2.0 * mean * s1 + mean * mean * s0) / var - s0) / var
    )
    slope = z1 / z0
    return top + np.log(z0), mean + var * slope, var + var * var * (z2 / z0 - slope * slope)


# The fractional link rule's node values per link class: log F, Φ(-t/s), Φ(t/s), and the
# rule's weights times (1, t, t²).
_FRACTIONAL_RULES: dict = {}


def _fractional_rule(link) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    key = (type(link), link.name)
    if key not in _FRACTIONAL_RULES:
        nodes, scale, _ = _link_rule(link)
        rule = (
            link.log_cdf(nodes),
            ndtr(-nodes / scale),
            ndtr(nodes / scale),
            _LINK_STEP * np.stack([np.ones_like(nodes), nodes, nodes * nodes], axis=1),
        )
        for array in rule:
            array.flags.writeable = False
        _FRACTIONAL_RULES[key] = rule
    return _FRACTIONAL_RULES[key]


# The link rule's nodes, scale and basis, per link class (EP asks at every sweep).
_LINK_RULES: dict = {}


def _link_rule(link) -> tuple[np.ndarray, float, np.ndarray]:
    """Nodes of the trapezoid rule on the link's scale, the link variable's scale ``s``
    and the rule's weights times ``(1, t, t²)`` of ``F(t) - Φ(t/s)``."""
    key = (type(link), link.name)
    if key not in _LINK_RULES:
        nodes = np.arange(_LINK_LOW, _LINK_HIGH + 0.5 * _LINK_STEP, _LINK_STEP)
        scale = math.sqrt(_LINK_STEP * np.exp(link.log_pdf(nodes)) @ (nodes * nodes))
        diff = _LINK_STEP * (np.exp(link.log_cdf(nodes)) - ndtr(nodes / scale))
        basis = np.stack([diff, nodes * diff, nodes * nodes * diff], axis=1)
        for array in (nodes, basis):
            array.flags.writeable = False
        _LINK_RULES[key] = nodes, scale, basis
    return _LINK_RULES[key]


def _as_sites(mean, var, power):
    mean, var, power = np.broadcast_arrays(
        np.asarray(mean, dtype=float), np.asarray(var, dtype=float), np.asarray(power, float)
    )
    return tuple(np.array(a, dtype=float).ravel() for a in (mean, var, power))


def quadrature_tilted_moments(link, mean, var, power=1.0):
    """``(log Z, mean, variance)`` of ``F(t)^power N(t; mean, var) / Z`` for each site.

    Measured on the logistic and probit links, in log Z, the mean in standard deviations
    and the variance relative: within 2.1e-11 of a finer rule for cavity variances up to
    3·10⁴ (the probit's mean within 5.4e-9 at m = −10⁴, the round-off of ψ there; D-228,
    D-231), and within 7.1e-15 of adaptive quadrature from 3·10⁴ to 10¹⁴ (powers 10⁻⁸ to
    1, means within ±6 standard deviations; D-241).

    Parameters
    ----------
    link : Link
        Provides ``log_cdf`` and ``derivatives`` (a log-concave, increasing F). A link
        without a known ``singularity`` keeps the uniform rule, capped at 2¹⁵ nodes per
        side, which errs on cavities of sd beyond ~10³ times the link's scale (on σ and Φ:
        2.4e-6 at v = 10⁶, 3e-4 at 10⁷, up to 2.6e-3 from 10¹⁰).
    mean, var : array-like of shape (M,)
        Cavity means and (positive) variances.
    power : float or array-like of shape (M,), default=1.0
        Positive exponents of F.

    Returns
    -------
    log_Z, tilted_mean, tilted_var : ndarray of shape (M,)
    """
    mean, var, power = _as_sites(mean, var, power)
    mode, width, peak, reach, step, nodes = _rule_sizes(link, mean, var, power)
    log_z, t_mean, t_var = (np.empty_like(mean) for _ in range(3))
    # Sites whose uniform rule would need more than _MAX_NODES per side (a cavity whose sd
    # is ~10⁴ times the link's scale) take the rule in sinh-mapped nodes instead: the capped
    # uniform step no longer resolves the link's bend (D-241).
    # A site float64 cannot place (the mode's round-off a share of the width: a diverging
    # EP's cavities at |m| ~ 10¹⁹, whose drops are round-off and whose reach is so huge)
    # keeps the capped uniform rule: the mapped rule's nodes there give NaN.
    # And a site whose rule's range ends short of the bend (a cavity far out on a flank,
    # as a diverging EP's: m = -1.6·10¹⁰, v = 4.6·10⁷) needs no node there: over its range
    # F is smooth on the tilted width's scale, which the capped uniform step resolves,
    # whereas the mapped nodes, spread from the bend, were 10⁶ apart at its mode (NaN).
    mapped = (
        (reach / step > _MAX_NODES)
        & (np.abs(mode) * _UNRESOLVED < width)
        & (np.abs(mode - link.singularity.real) < reach * width + _BEND_MARGIN)
        if link.singularity is not None
        else np.zeros(mean.size, bool)
    )
    uniform = np.flatnonzero(~mapped)
    for sites, k in _blocks(nodes[uniform]):
        i = uniform[sites]
        h = np.maximum(step[i], reach[i] / k)
        log_z[i], t_mean[i], t_var[i] = _rule(
            link, mean[i], var[i], power[i], mode[i], width[i], peak[i], h, k
        )
    todo = np.flatnonzero(mapped)
    if todo.size:
        h, scale, k = _mapped_sizes(
            link.singularity.real, var[todo], mode[todo], width[todo], reach[todo], step[todo]
        )
    while todo.size:
        # Each site's rule against its own even nodes (step 2h): the rule converges
        # geometrically, so its error is about the square of that difference; the sites not
        # within _MAPPED_CHECK halve their step, until _MAPPED_MAX_NODES.
        error = np.empty(todo.size)
        for sites, _ in _blocks(k):
            i = todo[sites]
            log_z[i], t_mean[i], t_var[i], error[sites] = _mapped_rule(
                link, mean[i], var[i], power[i], mode[i], peak[i], h[sites], scale[sites], k[sites]
            )
        again = (error > _MAPPED_CHECK) & (2 * k <= _MAPPED_MAX_NODES)
        todo, h, scale, k = todo[again], 0.5 * h[again], scale[again], 2 * k[again]
    return log_z, t_mean, t_var


def _blocks(nodes: np.ndarray):
    """``(sites, k)`` blocks of consecutive sites, as many as fit the memory budget at the
    block's largest node count per side k."""
    budget = block_length(_BYTES_PER_ENTRY)  # entries (sites × nodes) per block
    start = 0
    while start < nodes.size:
        stop, k = start, 0
        while stop < nodes.size:
            k_new = max(k, int(nodes[stop]))
            if stop > start and (stop - start + 1) * (2 * k_new + 1) > budget:
                break
            k, stop = k_new, stop + 1
        yield slice(start, stop), k
        start = stop


def _rule_sizes(link, mean, var, power):
    """The quadrature's frame and size per site: ``(mode, width, peak, reach, step,
    nodes)``, the step and reach in u and the nodes per side."""
    mode, width = _mode(link, mean, var, power)
    peak = _psi(link, mode, mean, var, power)
    # Range in u: 12, or as far as a drop of 40 takes on the slower side (concavity).
    drops = [peak - _psi(link, mode + side * 12.0 * width, mean, var, power) for side in (-1, 1)]
    reach = 12.0 * np.maximum(1.0, 40.0 / np.maximum(np.minimum(*drops), 1e-3))
    step = np.minimum(0.25, _MAX_T_STEP / width)
    # A fractional power (a sample weight below 1) is nearer a Gaussian: a coarser step.
    fractional = power < 1.0
    if link.singularity is not None and fractional.any():
        step[fractional] = _fractional_step(
            link, *(a[fractional] for a in (mean, var, power, mode, width, peak))
        )
    # Nodes per side: enough for the step, within [_MIN_NODES, _MAX_NODES]. A wide,
    # vague cavity (w ≫ 1) needs many; a cavity near the posterior needs the minimum.
    nodes = np.clip(np.ceil(reach / step), _MIN_NODES, _MAX_NODES).astype(int)
    return mode, width, peak, reach, step, nodes


# The relative error a rule for a fractional power is sized to (about 2^-50): the rule's
# own error is then round-off's, as the step of power 1 makes it.
_RULE_ERROR = 1e-15
# Gaussian part of its aliasing error, 2 exp(-2π² s²/h²) for a Gaussian of sd s ≥ the
# tilted density's lower width: at most _RULE_ERROR where h ≤ this times s.
_GAUSS_STEP = math.pi * math.sqrt(2.0 / math.log(2.0 / _RULE_ERROR))
# 1/Γ(1 - p) and 1/Γ(1 + p) are at most 1/min Γ = 1.1292 on (0, 1).
_INV_GAMMA_MAX = 1.1292


def _fractional_step(link, mean, var, power, mode, width, peak):
    """The trapezoid rule's step in u for ``F(t)^p N(t; m, v)`` with ``0 < p < 1``: the
    largest step whose aliasing error is within ``_RULE_ERROR``, relative (log Z; the mean
    in standard deviations; the variance), where the step of power 1 is sized as if p = 1.

    The rule with step h_t in t errs by the integrand's Fourier transform at ω = 2π/h_t
    (Poisson summation). ``F^p`` has branch points where F has its nearest singularity
    ``t₀ = x₀ ± i d`` (σ's poles at ±iπ; Φ's zeros at 1.916 ± 2.816i), where
    ``F ≈ c (t - t₀)^{∓1}``; each adds to the transform (a Hankel contour around it)
    ``2π |c|^p ω^{±p-1} e^{-d ω} |N(t₀; m, v)| / |Γ(±p)|``, and ``1/|Γ(±p)| ≤ 1.13 p``: a
    small power's factor is nearly constant, and its rule can be coarse. With
    ``|N(t₀; m, v)| = N(x₀; m, v) e^{d²/(2v)}``, the tilted density's curvature at most
    ``1/w₋² = p c_max + 1/v`` (so ``Z ≥ e^ψ* √(2π) w₋`` at its peak ψ*, and its sd ≥ w₋),
    and ``ω^{±p-1} ≤ max(1, 1/ω)²``, the two conjugate branch points err by at most

        4π · 1.13 p |c|^p max(1, h_t/2π)² e^{-2π d/h_t} e^{d²/(2v)} N(x₀; m, v)
            · e^{-ψ*} / (√(2π) w₋) · (1 + |t₀ - t*|/w₋)²

    relative (the last factor: the moments about the mode t*, in units of w₋). Away from
    its singularities the integrand is a Gaussian of sd ``s = (p g + 1/v)^{-1/2}`` times
    a bounded factor (g: the growth of |F| off the axis, 0 for σ), whose rule errs by
    ``2 exp(-2π² s²/h_t²)``: hence ``h_t ≤ _GAUSS_STEP s``. The step is the largest within
    both, and never below the step of power 1.
    """
    x0, d = link.singularity.real, link.singularity.imag
    low_width = 1.0 / np.sqrt(power * link.max_curvature + 1.0 / var)
    gauss_step = _GAUSS_STEP / np.sqrt(power * link.growth_curvature + 1.0 / var)  # in t
    log_gauss_x0 = -0.5 * (x0 - mean) ** 2 / var - 0.5 * np.log(var) - _LOG_SQRT_2PI
    log_bound = (
        math.log(4.0 * math.pi * _INV_GAMMA_MAX / math.sqrt(2.0 * math.pi))
        + np.log(power)
        + power * link.singular_log_scale
        + 0.5 * d * d / var
        + log_gauss_x0
        - peak
        - np.log(low_width)
        + 2.0 * np.log1p(np.hypot(mode - x0, d) / low_width)
        - math.log(_RULE_ERROR)
    )

    def excess(h_t):  # log(bound / _RULE_ERROR) at a step h_t in t, increasing in h_t
        wide_step = 2.0 * np.log(np.maximum(1.0, h_t / (2.0 * math.pi)))
        return log_bound - 2.0 * math.pi * d / h_t + wide_step

    # Bisection in log h_t between power 1's step and the Gaussian's, 40 halvings.
    lo = np.log(np.minimum(0.25 * width, _MAX_T_STEP))
    largest = np.log(np.maximum(gauss_step, np.exp(lo)))
    hi = largest
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        good = excess(np.exp(mid)) <= 0.0
        lo, hi = np.where(good, mid, lo), np.where(good, hi, mid)
    return np.exp(np.where(excess(np.exp(largest)) <= 0.0, largest, lo)) / width


# The sinh-mapped rule's step h in v (see _mapped_sizes): at most this, its local step in t
# at the rule's farthest node at most _MAPPED_FAR_STEP cavity sds, and at the mode at most
# _MAPPED_MODE_STEP tilted widths (the uniform rule's 0.25). Measured against adaptive
# quadrature (SciPy's, split at the link's bend, decades of |t|, the mode and the cavity's
# sds) over v in [3·10⁴, 10¹⁴], m in ±6√v, powers 1, 0.3, 10⁻³ and 10⁻⁸, logistic and
# probit: log Z, the mean in sds and the variance relative within 7.1e-15 (the uniform
# rule at its cap: up to 2.6e-3), at most 3868 nodes per side before the check (D-241).
_MAPPED_MAX_STEP, _MAPPED_FAR_STEP, _MAPPED_MODE_STEP = 0.25, 0.5, 0.25
# A mapped rule within this of its own even nodes' is within its square (geometric
# convergence): round-off's. Steps halve until then, to at most this many nodes per side.
_MAPPED_CHECK = 1e-8
_MAPPED_MAX_NODES = 2**17
# A mode farther than 10¹⁰ widths from 0 (its round-off, 2.2e-16 |t*|, beyond 2e-6 widths)
# is not resolved; the mapped rule's measured range above is within 10⁸ (|t*| ≲ m + v).
_UNRESOLVED = 1e-10
# A rule's range that ends this many of the link's scales short of its bend (σ within
# e⁻⁴⁰ of its tail e^t there; Φ's log smooth on the scale of |t|) does not see the bend.
_BEND_MARGIN = 40.0


def _mapped_sizes(centre, var, mode, width, reach, step):
    """``(h, scale, k)`` of the rule ``t = centre + scale · sinh(h j)``, ``|j| ≤ k``.

    Its local step in t is ``h √(scale² + (t − centre)²)``: the uniform rule's step
    ``scale · h`` at the link's bend (its singularity's real part, where F bends on its own
    scale of 1), growing linearly away from it, where F^p is flat (or, on Φ's left, a
    Gaussian factor narrower than the cavity) and the tilted density varies on the scale
    of its width near the mode and of the cavity's sd beyond. The trapezoid rule in the
    mapped variable keeps its geometric convergence: F's singularity at ``centre ± i d``
    is ``asin(d / scale)`` ≈ d/scale from the real axis there (π/2 where d > scale), so
    the ratio of distance to step is the uniform rule's.
    """
    far = np.abs(mode - centre) + reach * width  # farthest node from the bend, in t
    near = np.maximum(np.abs(mode - centre), 1e-300)
    h = np.minimum.reduce(
        [
            np.full_like(far, _MAPPED_MAX_STEP),
            _MAPPED_FAR_STEP * np.sqrt(var) / far,
            _MAPPED_MODE_STEP * width / near,
        ]
    )
    scale = step * width / h
    # At most _MAPPED_MAX_NODES per side (a coarser h beyond: a mode Newton left short of
    # the peak, cavities of variance ~10¹⁵, can ask for 10⁸).
    reach_v = np.arcsinh(far / scale)
    k = np.minimum(np.ceil(reach_v / h), _MAPPED_MAX_NODES).astype(int)
    return np.maximum(h, reach_v / k), scale, k


def _mapped_rule(link, mean, var, power, mode, peak, h, scale, k):
    """Trapezoid rule in v on ``t = centre + scale · sinh(h j)``, j = -k … k per site,
    weights ``scale · cosh(h j) · h`` (see :func:`_mapped_sizes`); centre: the link's
    bend. The block's sites share the largest k, a site's nodes beyond its own k weighted
    zero (beyond them sinh(h j) would overflow a site of larger h)."""
    largest = int(k.max())
    j = np.arange(-largest, largest + 1)[None, :]
    inside = np.abs(j) <= k[:, None]
    j = np.where(inside, j * h[:, None], 0.0)
    t = link.singularity.real + scale[:, None] * np.sinh(j)
    psi = _psi(link, t, mean[:, None], var[:, None], power[:, None])
    peak = np.maximum(peak, psi.max(axis=1))
    f = np.where(inside, np.exp(psi - peak[:, None]) * np.cosh(j), 0.0)
    centred = t - mode[:, None]  # moments about the mode: no cancellation
    moments = []
    for nodes in (slice(None), slice(largest % 2, None, 2)):  # all, and the even j (step 2h)
        total = f[:, nodes].sum(axis=1)
        shift = (f[:, nodes] * centred[:, nodes]).sum(axis=1) / total
        second = (f[:, nodes] * centred[:, nodes] ** 2).sum(axis=1) / total
        moments.append((np.log(total), shift, second - shift * shift))
    (log_total, shift, t_var), (log_half, half_shift, half_var) = moments
    # The difference, in log Z, the mean in sds and the variance relative.
    error = np.maximum.reduce(
        [
            np.abs(log_half + math.log(2.0) - log_total),
            np.abs(half_shift - shift) / np.sqrt(t_var),
            np.abs(half_var / t_var - 1.0),
        ]
    )
    return log_total + peak + np.log(scale * h), mode + shift, t_var, error


def _rule(link, mean, var, power, mode, width, peak, step, k):
    """Trapezoid rule with 2k+1 nodes t = mode + width · step · j, j = -k … k."""
    u = np.arange(-k, k + 1)[None, :] * step[:, None]
    t = mode[:, None] + width[:, None] * u
    psi = _psi(link, t, mean[:, None], var[:, None], power[:, None])
    # The mode's value is the peak unless Newton stopped short of it (cavities of variance
    # ~1e15): the largest node value then is, and keeps exp from overflowing.
    peak = np.maximum(peak, psi.max(axis=1))
    f = np.exp(psi - peak[:, None])
    total = f.sum(axis=1)
    centred = t - mode[:, None]  # moments about the mode: no cancellation
    shift = (f * centred).sum(axis=1) / total
    second = (f * centred * centred).sum(axis=1) / total
    log_z = np.log(total) + peak + np.log(width * step)
    return log_z, mode + shift, second - shift * shift
