"""The sites of a window of rows: refitted from one posterior, removed from it, and judged.

A stream's window (``partial_fit``; :mod:`vsbayes.estimators._site_window`) keeps its last
rows with their Gaussian sites: each row's factor in its r latent values, ``exp(νᵀt −
tᵀτt / 2)`` — binary (r = 1): in its signed latent ``t = ±[x, 1]·θ``; multinomial: in its
K − 1 contrasts ``t = Qᵀ(Θ x̃)`` (:func:`softmax_design`), the multinomial EP's sites,
binary the K = 2 case. The math of those sites, on arrays:

- :func:`revisit_sites` and :func:`revisit_softmax_sites`: a parallel EP step on some of
  the sites, all from the posterior before it (a new row's site is zero): each row's
  cavity, then its tilted density's site — EP's update (the tilted moments; multinomial,
  :func:`~vsbayes.approximations.softmax_ep.softmax_site_updates`), Laplace propagation's
  (the mode and curvature of the same tilted density: its fixed point is the joint
  Laplace approximation) or the Jaakkola–Jordan bound's at the row's optimal ξ under its
  cavity (a coordinate ascent on the bound, whose fixed point is the batch VB fit) — then
  the posterior's rank-one updates (multinomial: one Woodbury update of rank r·m).
  Revisiting each row's site while it is in the window is incremental EP over a sliding
  window, at the cost of a few rank-r updates, O(p² K), bounded whatever the stream.
- :func:`row_mode_result` and :func:`softmax_row_mode_result`: a Laplace one-row call's
  posterior with its own row's Laplace fit as diagnostics, read off the row's site.
- :func:`frozen_part`: the posterior without the window's sites (the prior and the sites
  of the rows that left), under which a Laplace or VB batch is fitted jointly with the
  window.
- :func:`taylor_errors`: how far a Laplace site (the expansion of the row's
  log-likelihood at a mode) is from its likelihood where the posterior may still move:
  the rows where it is smallest leave a Laplace window. :func:`bound_gaps`: the same for
  a Jaakkola–Jordan site (the bound at the row's ξ), for a VB window.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import log_expit

from ..engine import LaplaceResult
from ..exceptions import EstimationError, NotPositiveDefiniteError
from ..models.priors import GaussianPrior
from ..models.softmax_predictive_rules import centred_basis
from ..models.tilted import NARROW_MAX_VAR, narrow_tilted_moments, tilted_mode
from ._softmax_latent_modes import softmax_mode_site_updates
from .softmax_ep import softmax_site_updates
from .variational_bayes import bound_constant, bound_curvature, bound_xi, jaakkola_jordan_latent

__all__ = [
    "bound_gaps",
    "contrast_basis",
    "frozen_part",
    "revisit_sites",
    "revisit_softmax_sites",
    "row_mode_result",
    "softmax_design",
    "softmax_row_mode_result",
    "taylor_errors",
]


def row_mode_result(mean, cov, prior, row, weight, site, log_z, link) -> LaplaceResult:
    """A Laplace one-row call's posterior (after its revisits) with its own row's Laplace
    fit as diagnostics: the mode t* and curvature of ``F(t)^s N(t; m, v)`` in the row's
    latent under the carried ``prior`` (what :func:`row_laplace` solves), read off the
    row's site ``(τ, ν)``."""
    latent_mean, latent_var = float(row @ prior.mean), float(row @ (prior.cov @ row))
    var = 1.0 / (1.0 / latent_var + site[0])
    mode = var * (latent_mean / latent_var + site[1])
    slope = float(link.derivatives(np.array([mode]))[0][0])
    # ∇ log p(θ*) = a (s (log F)'(t*) − (t* − m) / v) at the row's mode.
    grad = weight * slope - (mode - latent_mean) / latent_var
    log_det = 2.0 * float(np.log(np.diag(prior.lower)).sum())
    at_mode = log_z - 0.5 * math.log(var / latent_var)
    at_mode -= 0.5 * (row.size * math.log(2.0 * math.pi) + log_det)
    return LaplaceResult(
        mean,
        cov,
        log_z,
        n_iter=1,
        converged=True,
        grad_norm=abs(grad) * float(np.linalg.norm(row)),
        log_density_at_mode=at_mode,
    )


#: The probabilists' Gauss–Hermite rule of :func:`taylor_errors` (weights summing to 1).
#: The nodes with 0 last (log F at the mean, in the same call).
_ERROR_NODES, _ERROR_WEIGHTS = np.polynomial.hermite_e.hermegauss(16)
_ERROR_NODES, _ERROR_WEIGHTS = np.append(_ERROR_NODES, 0.0), np.append(_ERROR_WEIGHTS, 0.0)
_ERROR_WEIGHTS = _ERROR_WEIGHTS / _ERROR_WEIGHTS.sum()


def taylor_errors(signed_rows, powers, mean, cov, link) -> np.ndarray:
    """How far each row's Laplace site is from its likelihood where the posterior puts the
    row: ``E |s log F(t) − q(t)|`` over the latent's marginal ``t ~ N(m, v)`` under
    N(``mean``, ``cov``), ``q`` the quadratic Taylor expansion of ``s log F`` at ``m`` (the
    site a Laplace fit gives the row at that mode) and ``s`` its power (a 16-point
    Gauss–Hermite rule). A Laplace stream's window keeps the rows where this is largest:
    a row whose site is frozen is expanded where the posterior was then, and its error
    when the mode later moves within the posterior's spread is what this measures (the
    log-likelihood's third and higher derivatives over the latent's standard deviation;
    negligible for a row far from the boundary, whose curvature has died out, and for
    one the posterior pins down)."""
    latent_mean = signed_rows @ mean
    latent_var = np.einsum("ij,ij->i", signed_rows @ cov, signed_rows)
    steps = np.sqrt(np.maximum(latent_var, 0.0))[:, None] * _ERROR_NODES
    slope, curvature = link.derivatives(latent_mean)
    log_f = link.log_cdf(latent_mean[:, None] + steps)
    quadratic = steps * (slope[:, None] - 0.5 * curvature[:, None] * steps)
    quadratic += log_f[:, -1:]
    return powers * (np.abs(log_f - quadratic) @ _ERROR_WEIGHTS)


def bound_gaps(signed_rows, powers, mean, cov) -> np.ndarray:
    """How far each row's Jaakkola–Jordan site is from its likelihood where the posterior
    puts the row: ``E [s log σ(t) − s b_ξ(t)]`` over the latent's marginal ``t ~ N(m, v)``
    under N(``mean``, ``cov``), ``b_ξ`` the bound at the row's optimal ξ there
    (``ξ² = m² + v``, the site a VB fit gives the row at this posterior) and ``s`` its
    power (the rule of :func:`taylor_errors`; the bound is below the likelihood, so the
    gap is its mean error). A VB stream's window keeps the rows where this is largest:
    the bound is tight at ``t = ±ξ`` only, and a site frozen with the ξ of an earlier
    posterior is off by what the gap measures once the posterior moves within its
    spread; the bound's curvature ``2λ(ξ) ≈ 1/|t|`` far from the boundary dies out
    slowly, so unlike a Laplace site's a far row's site still depends on where the
    posterior puts it."""
    latent_mean = signed_rows @ mean
    latent_var = np.maximum(np.einsum("ij,ij->i", signed_rows @ cov, signed_rows), 0.0)
    xi = np.sqrt(latent_var + latent_mean * latent_mean)[:, None]
    t = latent_mean[:, None] + np.sqrt(latent_var)[:, None] * _ERROR_NODES
    lam = bound_curvature(xi)
    bound = log_expit(xi) + 0.5 * (t - xi) - lam * (t * t - xi * xi)
    return powers * (np.maximum(log_expit(t) - bound, 0.0) @ _ERROR_WEIGHTS)


def frozen_part(prior: GaussianPrior, signed, tau, nu, powers, link, rule: str = "mode"):
    """``(frozen, evidence)``: the Gaussian ``prior`` (a stream's posterior) without the
    sites ``(tau, nu)`` of a window's ``signed`` rows (its natural parameters less theirs:
    the prior and the sites of the rows that left the window), and the evidence of the
    window's rows, of ``powers``, under it (0 without rows): ``rule`` "mode", the Laplace
    evidence at ``prior``'s mean μ, ``Σ s log F(t(μ)) + log N_frozen(μ) − log
    N_prior(μ)``; "bound", the Jaakkola–Jordan bound at the sites' ξ (read off τ = 2sλ(ξ)),
    ``Σ c(ξ) + ½ hᵀμ − ½ h_fᵀμ_f + ½ log|Λ_f| − ½ log|Λ|`` (``c`` each site's constant,
    h and Λ the natural parameters)."""
    if signed.shape[0] == 0:
        return prior, 0.0
    precision = prior.precision - (signed.T * tau) @ signed
    linear = prior.precision @ prior.mean - signed.T @ nu
    frozen = GaussianPrior(np.zeros(prior.dim), precision=precision, name="frozen part")
    frozen.mean = frozen.cov @ linear
    shift = prior.mean - frozen.mean
    # log N_frozen(μ) − log N_prior(μ) = ½ log|Λ_f| − ½ log|Λ| − ½ (μ − μ_f)ᵀ Λ_f (μ − μ_f)
    log_det = 2.0 * float(np.log(np.diag(prior.lower)).sum() - np.log(np.diag(frozen.lower)).sum())
    if rule == "bound":
        # The sites' constants s c(ξ) (τ = 2 s λ(ξ)), times their Gaussian integral against
        # the frozen part.
        xi = bound_xi(0.5 * tau / np.where(powers > 0.0, powers, 1.0))
        evidence = float(powers @ bound_constant(xi)) + 0.5 * log_det
        evidence += 0.5 * float(prior.mean @ prior.precision @ prior.mean - linear @ frozen.mean)
        return frozen, evidence
    evidence = float(powers @ link.log_cdf(signed @ prior.mean))
    evidence += 0.5 * log_det - 0.5 * float(shift @ precision @ shift)
    return frozen, evidence


def revisit_sites(mean, cov, rows, tau, nu, powers, link, rule: str):
    """The posterior N(mean, cov) with the sites ``(tau, nu)`` of the signed ``rows``
    refitted, all from it (a parallel EP step on these sites; a new row's site is zero):
    each row's cavity (the posterior without its site), then its tilted density's moments
    (``rule`` "moments": EP's update) or its mode and curvature ("mode": Laplace
    propagation, whose fixed point is the joint mode and curvature), then the rank-one
    changes one after the other. A row whose cavity is improper, or whose tilted density
    gives no usable moments, keeps its site. Returns ``(mean, cov, tau, nu, log_z)``,
    ``log_z`` the tilted normalizers ("mode": their Laplace approximations; NaN where a
    site was kept)."""
    gains = cov @ rows.T  # (p, r): Σa
    latent_mean = rows @ mean
    latent_var = np.einsum("rp,pr->r", rows, gains)
    with np.errstate(divide="ignore"):  # an all-zero row (no intercept): not usable below
        cavity_precision = 1.0 / latent_var - tau
    usable = (latent_var > 0.0) & (cavity_precision > 0.0)
    log_z = np.full(rows.shape[0], np.nan)
    new_tau, new_nu = tau.copy(), nu.copy()
    if not usable.any():
        return mean, cov, new_tau, new_nu, log_z
    cavity_var = 1.0 / cavity_precision[usable]
    cavity_mean = cavity_var * (latent_mean[usable] / latent_var[usable] - nu[usable])
    power = powers[usable]
    if rule == "bound":  # (the logistic link's; each row's at its optimal ξ)
        optima = map(jaakkola_jordan_latent, cavity_mean, cavity_var, power)
        normalizer, tilted_mean, tilted_var, _ = map(np.array, zip(*optima, strict=True))
    elif rule == "mode":
        tilted_mean, width = tilted_mode(link, cavity_mean, cavity_var, power)
        tilted_var = width * width
        # The Laplace evidence s log F(t*) − (t* − m)² / (2v) − ½ log(1 + s h(t*) v).
        normalizer = (
            power * link.log_cdf(tilted_mean)
            - 0.5 * (tilted_mean - cavity_mean) ** 2 / cavity_var
            + np.log(width / np.sqrt(cavity_var))
        )
    else:
        normalizer, tilted_mean, tilted_var = _tilted_moments(link, cavity_mean, cavity_var, power)
    index = np.flatnonzero(usable)
    fitted = (tilted_var > 0.0) & np.isfinite(tilted_var) & np.isfinite(tilted_mean)
    index, cavity_var, cavity_mean = index[fitted], cavity_var[fitted], cavity_mean[fitted]
    tilted_mean, tilted_var = tilted_mean[fitted], tilted_var[fitted]
    # Log-concave factors give τ ≥ 0, as EP's sweeps project it.
    new_tau[index] = np.maximum(1.0 / tilted_var - 1.0 / cavity_var, 0.0)
    new_nu[index] = tilted_mean / tilted_var - cavity_mean / cavity_var
    log_z[index] = normalizer[fitted]
    for k in index:
        row = rows[k]
        gain = cov @ row
        var, at = float(row @ gain), float(row @ mean)
        d_tau, d_nu = new_tau[k] - tau[k], new_nu[k] - nu[k]
        denominator = 1.0 + d_tau * var
        if not denominator > 0.0:  # round-off against a decisive site: kept as it was
            new_tau[k], new_nu[k], log_z[k] = tau[k], nu[k], np.nan
            continue
        # Sherman–Morrison: precision + Δτ aaᵀ, precision × mean + Δν a.
        mean = mean + gain * ((d_nu - d_tau * at) / denominator)
        cov = cov - (d_tau / denominator) * np.outer(gain, gain)
    return mean, cov, new_tau, new_nu, log_z


@functools.lru_cache(maxsize=16)
def contrast_basis(n_classes: int) -> np.ndarray:
    """:func:`centred_basis` of K classes, computed once (read-only)."""
    q = centred_basis(n_classes)
    q.setflags(write=False)
    return q


def softmax_design(rows: np.ndarray, q: np.ndarray, fit_intercept: bool) -> np.ndarray:
    """Each row's map A (r × p) of θ = ``[W.ravel(), b]`` to its contrasts ``Qᵀ(Θ x̃)``
    (:meth:`BlockLatent.of_softmax_row`'s): (m, r, p)."""
    m, d = rows.shape
    k, r = q.shape
    # The products written into place (one allocation: a one-row call's fixed cost is
    # mostly such small steps): A[i, a, (k, j)] = Q[k, a] x_ij, then the intercepts' Qᵀ.
    design = np.empty((m, r, k * d + (k if fit_intercept else 0)))
    products = design[:, :, : k * d].reshape(m, r, k, d)  # (a view: the last axis split)
    np.multiply(q.T[None, :, :, None], rows[:, None, None, :], out=products)
    if fit_intercept:
        design[:, :, k * d :] = q.T
    return design


def revisit_softmax_sites(
    mean, cov, design, labels, lam, eta, powers, q, rule: str, own_update, tol
):
    """The posterior N(mean, cov) with the multinomial rows' sites ``(lam, eta)`` (on their
    contrasts ``design @ θ``, (m, r, p)) refitted, all from it (a parallel EP step on these
    sites; a new row's site is zero, the first).

    Each row's cavity and the site of its tilted density: ``rule`` "moments",
    :func:`softmax_site_updates` (EP's; the new row's by ``own_update()``,
    :func:`assumed_density_softmax_row`, where its tilted moments are not proper);
    "mode", :func:`softmax_mode_site_updates` (Laplace propagation, Newton's stop at
    ``tol``). Then the posterior's precision and linear term change by ``Σ Aᵢᵀ ΔΛᵢ Aᵢ`` and
    ``Σ Aᵢᵀ Δηᵢ`` in one Woodbury update of rank r·m, ``Σ' = Σ − G (I + D V)⁻¹ D Gᵀ`` and
    ``μ' = μ + G (I + D V)⁻¹ (Δη − D m)``, with G = ΣAᵀ, V = AΣAᵀ, m = Aμ and D the block
    diagonal of the ΔΛᵢ: O(p² r m), no p × p factorization (the sites' precisions are
    PSD, so the updated precision is positive definite but for round-off, which the
    posterior's own factorization catches). A revisited row whose site is not found keeps
    it. Returns ``(mean, cov, lam, eta, log_z, modes)`` (``log_z``, the new row's tilted
    normalizer; ``modes``, mode: the :class:`ModeSites`, whose first row is the new row's
    fit, else None), or None where the new row's own site is not usable."""
    m, r, p = design.shape
    flat = design.reshape(m * r, p)
    spread = cov @ flat.T  # G, (p, r m)
    joint = flat @ spread  # V, (r m, r m)
    joint = 0.5 * (joint + joint.T)
    latent_mean = (flat @ mean).reshape(m, r)
    rows = np.arange(m)
    latent_cov = joint.reshape(m, r, m, r)[rows, :, rows, :]
    if rule == "moments":
        new_lam, new_eta, log_z, found = softmax_site_updates(
            q, labels, latent_mean, latent_cov, lam, eta, powers
        )
        if not found[0]:
            # Its tilted moments improper even on the finest rule (a factor nearly a step
            # over a wide cavity, many classes): its own update's site (VS fits there).
            try:
                alone = own_update()
            except (EstimationError, NotPositiveDefiniteError):
                return None
            new_lam[0], new_eta[0] = alone.sites.precision[0], alone.sites.linear[0]
            log_z[0], found[0] = alone.log_Z, True
        modes = None
    else:
        modes = softmax_mode_site_updates(
            q, labels, latent_mean, latent_cov, lam, eta, powers, tol=tol
        )
        new_lam, new_eta, log_z, found = modes[:4]
    if not found[0]:
        return None
    if not found.all():  # a revisited row whose site is not found keeps it
        new_lam = np.where(found[:, None, None], new_lam, lam)
        new_eta = np.where(found[:, None], new_eta, eta)
    blocks = np.zeros((m, r, m, r))
    blocks[rows, :, rows, :] = new_lam - lam
    blocks = blocks.reshape(m * r, m * r)
    system = np.eye(m * r) + blocks @ joint
    rhs = np.column_stack([blocks, (new_eta - eta).ravel() - blocks @ latent_mean.ravel()])
    try:
        solved = np.linalg.solve(system, rhs)
    except np.linalg.LinAlgError:  # round-off against a decisive site
        return None
    updated = cov - spread @ solved[:, :-1] @ spread.T
    return mean + spread @ solved[:, -1], updated, new_lam, new_eta, float(log_z[0]), modes


def softmax_row_mode_result(mean, cov, prior, modes, log_z, norm):
    """A Laplace one-row call's posterior (after its revisits) with its own row's Laplace
    fit as diagnostics (as :func:`row_mode_result`, in the row's K − 1 contrasts): its
    tilted density's mode under the carried prior's marginal (``modes``, the
    :class:`ModeSites` of the call, the row first); ``norm``: |x̃|, the row's with the
    intercept's 1."""
    log_det = 2.0 * float(np.log(np.diag(prior.lower)).sum())
    at_mode = float(modes.log_density[0]) - 0.5 * (mean.size * math.log(2.0 * math.pi) + log_det)
    return LaplaceResult(
        mean,
        cov,
        log_z,
        n_iter=1,
        converged=True,
        # |Aᵀ∇| with A = Qᵀ ⊗ x̃ᵀ (Q's columns orthonormal): |∇| |x̃|.
        grad_norm=float(np.linalg.norm(modes.gradient[0])) * norm,
        log_density_at_mode=at_mode,
    )


def _tilted_moments(link, mean, var, power):
    """The tilted moments of a window step's sites, cheaply: the link's closed form where it
    has one (the probit, power 1); on narrow cavities (the rows' latent variance at most
    ``NARROW_MAX_VAR``: all but the first rows of a stream) a Gauss–Hermite rule in the
    cavity's frame, any power (within 2e-10 of the quadrature for the logistic); the
    others as ``method="fast"`` takes them (the logistic's mixture of probits, or the VS
    site fits)."""
    narrow = var <= NARROW_MAX_VAR
    if link.has_closed_form(1.0):
        narrow &= power != 1.0
    if not narrow.any():
        return link.tilted_moments(mean, var, power, method="fast")
    moments = np.empty((3, mean.size))
    moments[:, narrow] = narrow_tilted_moments(link, mean[narrow], var[narrow], power[narrow])
    if not narrow.all():
        rest = ~narrow
        moments[:, rest] = link.tilted_moments(mean[rest], var[rest], power[rest], method="fast")
    return moments
