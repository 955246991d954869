"""Posterior-predictive class probabilities of the logistic model whose latent is Gaussian
(the probit's closed form: :mod:`vsbayes.models.probit_predictive`)."""

from __future__ import annotations

import math

import numpy as np
from numpy.polynomial import Polynomial
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import log_expit, log_ndtr, ndtr

from .._memory import block_length

__all__ = ["logistic_predictive_log_proba"]

# --- The accurate rule: log-domain trapezoid sums (the reference, and the fast rule's fallback)

# Bytes of temporaries per node × point of a block: about eight float64 arrays.
_BYTES_PER_ENTRY = 64

# Gaussian-side rule: trapezoid in z (f = m + s z) on s + [-10, 10]. The integrand is
# log-concave with curvature ≥ 1 and its mode lies in (0, s), so the window holds all but
# e^-40 of it; σ(m + s z) has its poles at Im z = π/s ≥ π, where step 0.5 leaves a
# discretization error near 1e-14 (relative).
_Z_STEP = 0.5
_Z_NODES = np.arange(-20, 21) * _Z_STEP
_Z_LOG_WEIGHT = math.log(_Z_STEP) - 0.5 * math.log(2.0 * math.pi)

# Logistic-side rule: trapezoid in l, where p = E_L[Φ((m - l)/s)] with L standard logistic,
# on c + [-56, 40]. The poles of the logistic density σ'(l) are at Im l = ±π for every s,
# so step 0.5 keeps the error near 1e-14 however wide the Gaussian is. For m ≤ 0 the
# integrand is ≈ e^l Φ((m - l)/s), a Gaussian of sd s centered at m + s² (the saddle point)
# cut off at l ≈ 0 by σ': hence c = min(m + s², 0). The wider left half covers s up to
# √50, the widest such Gaussian when |m| ≤ 50.
_L_STEP = 0.5
_L_NODES = np.arange(-112, 81) * _L_STEP
_L_LOG_WEIGHT = math.log(_L_STEP)

# s > 1 still uses the Gaussian-side rule when the mass (near z = s) is this many sds below
# the logistic transition (z = -m/s): there the poles, now close to the real axis, lie
# where the integrand is below e^-32 of its peak. This keeps the relative accuracy for
# |m| ≫ 50 outside the band |m + s²| < 8 s.
_SEPARATION = 8.0


def _log_sum_exp_rows(terms: np.ndarray) -> np.ndarray:
    """Row-wise log Σ exp, shifted by the row maximum (terms are finite for finite input)."""
    top = terms.max(axis=1)
    return top + np.log(np.exp(terms - top[:, None]).sum(axis=1))


def _gaussian_side(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    z = s[:, None] + _Z_NODES
    terms = log_expit(m[:, None] + s[:, None] * z) - 0.5 * z * z
    return _log_sum_exp_rows(terms) + _Z_LOG_WEIGHT


def _logistic_side(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    # min(s, √-m)² keeps m + s² from overflowing; the clip removes a rounding ulp above 0.
    center = np.minimum(m + np.minimum(s, np.sqrt(-m)) ** 2, 0.0)
    threshold = center[:, None] + _L_NODES  # the nodes l of L
    a = -np.abs(threshold)
    log_density = a - 2.0 * np.log1p(np.exp(a))  # log σ'(l) = log σ(l) + log σ(-l)
    terms = log_density + log_ndtr((m[:, None] - threshold) / s[:, None])
    return _log_sum_exp_rows(terms) + _L_LOG_WEIGHT


def _logistic_log_lower(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """log p for 1-d arrays with m ≤ 0 and 0 < s < ∞, where p ≤ 1/2: the side computed with
    relative accuracy (the other is log1p(-p), which stays accurate as p → 0)."""
    out = np.empty_like(m)
    wide = np.maximum(s, 1.0)
    gaussian = (s <= 1.0) | (-m / wide - wide >= _SEPARATION)
    for rule, n_nodes, index in (
        (_gaussian_side, _Z_NODES.size, np.flatnonzero(gaussian)),
        (_logistic_side, _L_NODES.size, np.flatnonzero(~gaussian)),
    ):
        block = block_length(_BYTES_PER_ENTRY * n_nodes)
        for start in range(0, index.size, block):
            rows = index[start : start + block]
            out[rows] = rule(m[rows], s[rows])
    return out


# --- The fast rule: a handful of closed-form terms, with a bound on their error -----------
#
# Both evaluate P(μ, v) = E σ(μ + √v Z), Z ~ N(0, 1), to an absolute error ε. The smaller
# side p = P(m, v), m ≤ 0, needs a relative error: σ(f) = e^f σ(-f) and shifting the
# Gaussian by v give p = e^(m + v/2) Q with Q = P(-(m + v), v), and Q ≥ 1/2 when m + v ≤ 0,
# Q ≥ P(-v, v) = e^(-v/2)/2 when -v < m ≤ 0. So ε on Q is a relative error of at most
# 2 e^(v/2) ε on p, however small p is.

#: Relative error of the fast rule on min(p, 1 - p); it gives ≤ 1.5e-7 relative on log p,
#: ≤ 2e-7 relative on log(1 - p) and ≤ 5e-8 absolute on p.
_RELATIVE_ERROR = 1e-7

# Gauss–Hermite. The n-point rule for E g(Z) errs by n!/(2n)! g⁽²ⁿ⁾(ξ) for some ξ; with
# g(z) = σ(μ + √v z) that is at most v^n n!/(2n)! ‖σ⁽²ⁿ⁾‖∞ whatever μ. Each row takes the
# fewest nodes whose bound is below _GH_ERROR: 3 for v ≤ 0.014, 12 for v ≤ 0.42. There
# Q > 0.4, so the relative error of p stays below 2.5e-8.
_GH_ERROR = 1e-8
_GH_MAX_NODES = 12


def _sigmoid_derivative_sup(order: int) -> float:
    """An upper bound of ‖σ⁽ᵒʳᵈᵉʳ⁾‖∞: σ⁽ᵏ⁾ = q_k(σ), with q_(k+1) = q_k' · u(1 - u), on [0, 1]."""
    q, tangent = Polynomial([0.0, 1.0]), Polynomial([0.0, 1.0, -1.0])
    for _ in range(order):
        q = q.deriv() * tangent
    step = 2.0**-16
    grid_max = np.abs(q(np.arange(0.0, 1.0 + step, step))).max()
    # Markov's inequality ‖q'‖ ≤ 2 deg² ‖q‖ on [0, 1] bounds what the grid misses.
    return float(grid_max / (1.0 - step * q.degree() ** 2))


def _gauss_hermite_rules() -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Largest variance of each n-point rule (n = 1 … _GH_MAX_NODES) and its nodes z ≥ 0 with
    weights (the pair ±z summed later; a node at 0 once)."""
    max_var, rules = [], []
    for n in range(1, _GH_MAX_NODES + 1):
        bound = math.factorial(n) / math.factorial(2 * n) * _sigmoid_derivative_sup(2 * n)
        max_var.append((_GH_ERROR / bound) ** (1.0 / n))
        z, w = hermegauss(n)
        keep = z >= 0
        rules.append((z[keep], w[keep] / w.sum()))
    return np.array(max_var), rules


_GH_MAX_VAR, _GH_RULES = _gauss_hermite_rules()

# A mixture of nine probits σ(f) ≈ Σ a_k Φ(s_k f), a_k > 0 summing to 1 (so it is exact at
# 0 and ±∞): the minimax one (Remez exchange; its error equioscillates at 3.66e-10), whose
# error sup_f |σ(f) - Σ a_k Φ(s_k f)| is below _MIXTURE_ERROR (a test bounds it from a grid
# and a bound on the error's second derivative). Then P(μ, v) ≈ Σ a_k Φ(μ / √(1/s_k² + v))
# to the same absolute error for every v. Used where Gauss–Hermite would need > 12 nodes.
_MIXTURE_SCALES = np.array(
    [0.22653302551724872, 0.28870444803480244, 0.3635595203227741, 0.45724807439276277,
     0.5749887376148658, 0.7216356768889334, 0.9034423610568958, 1.131487634337342,
     1.4339163710712446]
)  # fmt: skip
_MIXTURE_WEIGHTS = np.array(
    [0.0005922493385527418, 0.013891649542803204, 0.07893873171201202, 0.20018661309475524,
     0.2915374773700932, 0.25884971639729004, 0.12751882223954514, 0.02710771169721178,
     0.0013770286077365856]
)  # fmt: skip
_MIXTURE_ERROR = 4e-10
_MIXTURE_INV_SCALES2 = 1.0 / _MIXTURE_SCALES**2
# The smallest P whose absolute error is still a relative _RELATIVE_ERROR.
_MIXTURE_FLOOR = _MIXTURE_ERROR / _RELATIVE_ERROR


def _gauss_hermite(mu: np.ndarray, v: np.ndarray, n_nodes: int) -> np.ndarray:
    """P(μ, v) by the n-point rule, as 1/2 + Σ w tanh((μ + √v z)/2)/2 (σ = (1 + tanh(·/2))/2)."""
    nodes, weights = _GH_RULES[n_nodes - 1]
    half = 0.5 * mu
    scale = np.sqrt(v)
    scale *= 0.5
    total = np.zeros_like(mu)
    left, right = np.empty_like(mu), np.empty_like(mu)
    for z, w in zip(nodes, weights, strict=True):
        if z == 0.0:
            np.tanh(half, out=left)
        else:
            np.multiply(scale, z, out=right)
            np.add(half, right, out=left)
            np.subtract(half, right, out=right)
            np.tanh(left, out=left)
            np.tanh(right, out=right)
            left += right
        left *= 0.5 * w
        total += left
    total += 0.5
    return total


def _probit_mixture(mu: np.ndarray, v: np.ndarray) -> np.ndarray:
    """P(μ, v) by the mixture of probits."""
    total = np.zeros_like(mu)
    for a, c in zip(_MIXTURE_WEIGHTS, _MIXTURE_INV_SCALES2, strict=True):
        with np.errstate(over="ignore"):  # |μ| near the largest double: ±∞, Φ = 0 or 1
            total += a * ndtr(mu / np.sqrt(c + v))
    return total


def _fast_log_lower(m: np.ndarray, v: np.ndarray, bounds=None) -> np.ndarray:
    """log p for 1-d arrays with m ≤ 0 and 0 < v < ∞: closed-form terms where their bound
    gives a relative error below _RELATIVE_ERROR, the trapezoid rules elsewhere.
    ``bounds``: (min v, max v) when the caller has them."""
    if not m.size:
        return np.empty_like(m)
    mu = m + v
    np.negative(mu, out=mu)
    offset = m + 0.5 * v  # log p = offset + log Q, Q = P(mu, v)
    # Each row takes the fewest nodes its variance needs (rule 1 … _GH_MAX_NODES), or the
    # mixture (rule _GH_MAX_NODES + 1), whatever rows it comes with. The most common rule
    # runs on all rows, without gathers; rows of other rules are redone on their own.
    low, high = (_rule(b) for b in (bounds or (v.min(), v.max())))
    if low == high:
        return _log_lower_by_rule(low, m, v, mu, offset)
    if high == low + 1:  # the common case of two rules: one mask
        above = v > _GH_MAX_VAR[low - 1]
        if 2 * np.count_nonzero(above) <= v.size:
            common, others = low, [(high, above)]
        else:
            common, others = high, [(low, ~above)]
    else:
        rules = np.full(v.shape, low, dtype=np.intp)
        for threshold in _GH_MAX_VAR[low - 1 : high - 1]:
            rules += v > threshold
        counts = np.bincount(rules, minlength=high + 1)
        common = int(counts.argmax())
        others = [(rule, rules == rule) for rule in np.flatnonzero(counts) if rule != common]
    with np.errstate(divide="ignore", invalid="ignore"):  # rows of other rules: redone
        out = _log_lower_by_rule(common, m, v, mu, offset)
    for rule, mask in others:
        rows = np.flatnonzero(mask)
        out[rows] = _log_lower_by_rule(rule, m[rows], v[rows], mu[rows], offset[rows])
    return out


def _rule(v: float) -> int:
    """Gauss–Hermite nodes for variance v (1 … _GH_MAX_NODES), or _GH_MAX_NODES + 1."""
    return int(np.searchsorted(_GH_MAX_VAR, v)) + 1


def _log_lower_by_rule(rule, m, v, mu, offset) -> np.ndarray:
    if rule > _GH_MAX_NODES:
        return _mixture_log_lower(m, v, mu, offset)
    return offset + np.log(_gauss_hermite(mu, v, rule))


def _mixture_log_lower(m, v, mu, offset) -> np.ndarray:
    """log p by the mixture of probits where it is accurate enough, else the quadrature."""
    q = _probit_mixture(mu, v)
    with np.errstate(divide="ignore"):
        log_p = offset + np.log(q)
    # Q too small for a relative bound (only when m > -v): P(m, v) itself may be large
    # enough; the rows where neither is (|m| between about 2.7√v and v - 2.7√v, so v > 32)
    # take the accurate rule.
    small = q < _MIXTURE_FLOOR
    if small.any():
        m_s, v_s = m[small], v[small]
        p = _probit_mixture(m_s, v_s)
        with np.errstate(divide="ignore"):
            log_direct = np.log(p)
        hard = p < _MIXTURE_FLOOR
        if hard.any():
            log_direct[hard] = _logistic_log_lower(m_s[hard], np.sqrt(v_s[hard]))
        log_p[small] = log_direct
    return log_p


def _broadcast(mean, var) -> tuple[np.ndarray, np.ndarray, float]:
    """Broadcast float arrays and the smallest variance (nan if any is nan or none)."""
    mean, var = np.asarray(mean, dtype=float), np.asarray(var, dtype=float)
    if mean.shape != var.shape:
        mean, var = np.broadcast_arrays(mean, var)
    # min propagates nan (allowed): the mask only when the minimum is not plainly ≥ 0.
    smallest = var.min() if var.size else np.nan
    if not smallest >= 0 and np.any(var < 0):
        raise ValueError("var must be nonnegative: it is the variance of the latent f.")
    return mean, var, smallest


_LOWER_SIDES = {"auto": _fast_log_lower, "quadrature": None}


def logistic_predictive_log_proba(
    mean, var, *, method: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Logarithms of the posterior-predictive probabilities of a logistic model.

    The class probability is ``p = ∫ σ(f) N(f; mean, var) df`` with ``σ`` the logistic
    sigmoid, the predictive of logistic regression when the latent ``f = w @ x`` has a
    Gaussian posterior.

    Parameters
    ----------
    mean : array-like
        Mean of the latent f.
    var : array-like
        Variance of the latent f, nonnegative; broadcast against ``mean``.
    method : {"auto", "quadrature"}, default="auto"
        ``"auto"``: a few closed-form terms per value (Gauss–Hermite or a mixture of
        probits) wherever their error bound gives a relative error below 1e-7, the
        quadrature elsewhere. ``"quadrature"``: log-domain trapezoid rules accurate to
        about 1e-13, tens to hundreds of times as costly.

    Returns
    -------
    log_p : ndarray
        ``log p``, of the broadcast shape of ``mean`` and ``var``.
    log_1mp : ndarray
        ``log(1 - p)``, which equals ``log p`` at ``-mean`` since ``σ(-f) = 1 - σ(f)``.

    Raises
    ------
    ValueError
        If some variance is negative, or ``method`` is unknown.

    Notes
    -----
    ``p`` is computed on the side ``mean ≤ 0``, where ``p ≤ 1/2``, and the other side is
    ``log1p(-p)``, so both logarithms keep their relative accuracy however close ``p`` is
    to 0 or 1.

    ``"auto"`` writes ``P(μ, v) = E σ(μ + √v Z)``, ``Z ~ N(0, 1)``, and with ``m = -|mean|``
    takes ``p = e^(m + v/2) P(-(m + v), v)`` (from ``σ(f) = e^f σ(-f)``), whose second factor
    is at least ``e^(-v/2)/2``: an absolute error ε on it is a relative error of at most
    ``2 e^(v/2) ε`` on ``p``, however small ``p`` is. For ``var ≤ 0.42`` it takes the
    Gauss–Hermite rule with the fewest nodes (1 to 12; 3 up to ``var = 0.014``) whose
    remainder bound ``var^n n!/(2n)! ‖σ⁽²ⁿ⁾‖∞`` is below 1e-8. Beyond, ``σ`` as the minimax
    mixture of nine probits ``Σ a_k Φ(s_k f)``, within 4e-10 of it everywhere, gives
    ``P(μ, v) ≈ Σ a_k Φ(μ / √(1/s_k² + v))``; where the second factor is too small for
    that error to be a relative 1e-7, ``P(m, v)`` itself is used if it is large enough, and
    the quadrature otherwise (``var`` between about 32 and 500 when ``|mean| ≤ 60``, with
    ``|mean|`` between about ``2.7√var`` and ``var - 2.7√var``). The relative error of
    ``min(p, 1 - p)`` is thus below 1e-7 for any mean and variance: below 1.5e-7 on
    ``log p`` and 2e-7 on ``log(1 - p)`` (relative), 5e-8 on ``p``. A row's rule depends on
    its variance only, not on the other rows.

    ``"quadrature"``: with ``s = √var``, a trapezoid rule sums in the log domain either over
    ``z = (f - mean)/s`` (41 nodes; for ``s ≤ 1``, where σ's poles are far from the real
    axis) or over ``l`` in ``p = E[Φ((mean - L)/s)]``, ``L`` standard logistic (193 nodes).
    Both converge geometrically. Against a brute-force reference, the relative error of
    ``log p`` is below 1e-13 for ``|mean| ≤ 60`` and any ``var``; for larger ``|mean|`` it
    grows only near ``var ≈ |mean|``, to about 2e-4 at ``|mean| = 1e4``.

    Either way ``var = 0`` gives ``log_expit(±mean)`` exactly.
    """
    if method not in _LOWER_SIDES:
        raise ValueError(f"method must be 'auto' or 'quadrature'; got {method!r}.")
    lower_side = _LOWER_SIDES[method] or _quadrature_log_lower
    mean, var, smallest = _broadcast(mean, var)
    shape = mean.shape
    m, v = mean.ravel(), var.ravel()
    lower = np.abs(m)
    np.negative(lower, out=lower)
    # min and max propagate nan: reductions instead of masks when all is finite and v > 0.
    regular = smallest > 0.0 and np.isfinite(lower.min())
    largest = v.max() if regular else np.nan
    if regular and np.isfinite(largest):
        log_lower = lower_side(lower, v, (smallest, largest))
        zero = None if lower.max() < 0.0 else m == 0
    else:
        regular = False
        inner = np.isfinite(m) & np.isfinite(v) & (v > 0)
        log_lower = np.full(m.shape, np.nan)
        log_lower[inner] = lower_side(lower[inner], v[inner])
        # Limits: an infinite mean decides the class; a zero mean or an infinite variance
        # leaves a fair coin (exactly, so that p(0) = 1 - p(0)).
        log_lower[np.isinf(m) & np.isfinite(v)] = -np.inf
        log_lower[np.isfinite(m) & np.isposinf(v)] = -math.log(2.0)
        zero = (m == 0) & ~np.isnan(v)
    if zero is not None:
        log_lower[zero] = -math.log(2.0)
    log_upper = np.exp(log_lower)
    np.negative(log_upper, out=log_upper)
    np.log1p(log_upper, out=log_upper)
    positive = m > 0
    log_p = np.where(positive, log_upper, log_lower)
    log_1mp = np.where(positive, log_lower, log_upper)
    exact = np.zeros(0, dtype=int) if regular else np.flatnonzero(v == 0)
    if exact.size:
        log_p[exact] = log_expit(m[exact])
        log_1mp[exact] = log_expit(-m[exact])
    return log_p.reshape(shape), log_1mp.reshape(shape)


def _quadrature_log_lower(m: np.ndarray, v: np.ndarray, bounds=None) -> np.ndarray:
    return _logistic_log_lower(m, np.sqrt(v))
