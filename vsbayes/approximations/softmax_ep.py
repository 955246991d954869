"""Expectation propagation for the multinomial logistic (softmax) posterior, with VS site fits.

**Sites in the contrast basis.** Observation i's factor ``softmax(f_i)[y_i]^{s_i}`` depends
on θ through its K latent values ``f_i = Θ x̃_i`` only (Θ the K × w matrix of rows
``[w_k, b_k]``, ``x̃ = [x, 1]``), and only through their centred part: with Q an
orthonormal basis (K × r, r = K − 1) of the vectors summing to zero, through
``g_i = Qᵀ f_i = B x̃_i``, ``B = Qᵀ Θ``. The sites are Gaussian factors on ``g_i``,
``exp(−gᵀΛ_i g/2 + η_iᵀ g)`` (r × r and r parameters), never on the all-ones direction,
along which the factor is flat: a K-dimensional site would be degenerate there. Since the
prior N(0, diag(prior_var)) gives every class of a column the same variance, it factorizes
over the rotation ``Θ ↦ (B, 1ᵀΘ/√K)``: the shift part keeps its prior exactly, and EP runs
on B alone, whose posterior has precision ``D + Σ_i Λ_i ⊗ x̃_i x̃_iᵀ`` (r·w square; 585 for
digits) and linear term ``Σ_i η_i x̃_iᵀ``, without the vague intercepts' 10⁶ direction.

**The sweep.** All sites at once (no loop over observations), from the posterior
N(μ, Σ) of B: each row's latent moments ``(m_i, V_i)``, its cavity ``V_i⁻¹ − Λ_i/c_i``
(a weight ``s_i ≥ 1`` is c_i = s_i copies of the factor, power EP, exactly EP on duplicated
rows; a weight below 1 is one factor ``F^{s_i}``, as the binary EP), the Gaussian fitted by
variational sampling to the tilted density ``F^{min(s,1)} × cavity`` — the site fit is
:func:`~vsbayes.engine.site_fits.fit_sites` on a deterministic rule in r dimensions
(:class:`~vsbayes.sampling.SymmetricSobol`: whitened, mirrored Sobol nodes, 16 per
parameter of the fit, at least 256: 1024 for r = 9), its kernel the posterior's latent marginal
``N(m_i, V_i)`` — and the new site, the fit's natural parameters minus the cavity's.
The new sites are projected on the positive semi-definite cone (a log-concave factor
gives PSD sites; the fits' round-off need not), damped and mixed by Anderson's
acceleration in the binary EP's sweep loop (:mod:`~vsbayes.approximations._damped_sweeps`,
with its stall rules: without progress, plain damped sweeps, then halved damping down to
1/64, and an :class:`~vsbayes.exceptions.EstimationError` if that stalls too).

The sites start at the Laplace approximation's (the factors' second-order expansions at
the mode), so that the first posterior is Laplace's. The log evidence is EP's estimate at
the fixed point, from one more pass of site fits at the final cavities.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import cho_solve
from scipy.linalg.lapack import dpotri

from .._blas import block_slices, map_blocks, single_blas_thread
from .._memory import block_bytes
from ..engine.site_fits import fit_sites
from ..exceptions import EstimationError, NotPositiveDefiniteError
from ..gaussian import lower_cholesky
from ..models.latent import row_moments
from ..models.softmax import SoftmaxGLMPosterior
from ..models.softmax_predictive import centred_basis
from ..sampling import SamplingRule, SymmetricSobol
from ._damped_sweeps import ArraySites, damped_sweeps
from ._threads import blas_policy
from .expectation_propagation import DEFAULT_DAMPING, EPResult, EPSites, _split_weights
from .softmax_laplace import check_softmax_size, softmax_laplace

__all__ = ["softmax_ep"]

_LOG_2PI = math.log(2.0 * math.pi)


class _Contrast:
    """The posterior of B from the sites, and the rows' latent moments under it."""

    def __init__(self, model: SoftmaxGLMPosterior):
        self.model = model
        k, d = model.n_classes, model.n_features
        self.k, self.r = k, k - 1
        self.width = d + int(model.fit_intercept)
        self.q = centred_basis(k)
        # Prior variance of B's entries (class-major rows of w), the same for every class.
        columns = list(range(d)) + ([k * d] if model.fit_intercept else [])
        self.column_var = model.prior_var[columns]
        self.prior_var = np.tile(self.column_var, self.r)
        # A general prior (a full precision, or a mean) does not factorize over the
        # rotation: EP runs on B under B's marginal prior, and the shift part follows B
        # through the prior's conditional (exact: the likelihood sees B only).
        self.general = model.prior_precision is not None or bool(np.any(model.prior_mean))
        if self.general:
            self._general_prior()
        else:
            self.prior_constant = 0.5 * float(np.log(self.prior_var).sum())

    def _general_prior(self) -> None:
        """B's marginal prior N(m_B, C_BB) (precision and linear term), and the shift's
        conditional ``s | B ~ N(m_s + G (B − m_B), C_ss − G C_Bs)``, ``G = C_sB C_BB⁻¹``."""
        model, k, r, w = self.model, self.k, self.r, self.width
        self.rotation = np.hstack([self.q, np.full((k, 1), 1.0 / math.sqrt(k))])
        index = self._theta_index()
        if model.prior_precision is None:
            cov = np.diag(model.prior_var)
        else:
            inverse = np.linalg.inv(lower_cholesky(model.prior_precision, "prior precision"))
            cov = inverse.T @ inverse
        u = self.rotation
        rotated = np.einsum(
            "ka,kjlm,lb->ajbm", u, cov[index[:, :, None, None], index[None, None]], u
        )
        rotated_mean = u.T @ model.prior_mean[index]  # (k, w): B's rows, then s
        n = r * w
        c_bb = rotated[:r, :, :r, :].reshape(n, n)
        c_sb = rotated[r, :, :r, :].reshape(w, n)
        lower = lower_cholesky(0.5 * (c_bb + c_bb.T), "prior covariance of the contrasts")
        precision = cho_solve((lower, True), np.eye(n), check_finite=False)
        self.prior_precision_b = 0.5 * (precision + precision.T)
        self.prior_mean_b, self.prior_mean_s = rotated_mean[:r].ravel(), rotated_mean[r]
        self.prior_linear_b = self.prior_precision_b @ self.prior_mean_b
        self.gain = cho_solve((lower, True), c_sb.T, check_finite=False).T  # (w, n)
        self.shift_cov = rotated[r, :, r, :] - self.gain @ c_sb.T
        self.prior_constant = float(np.log(np.diag(lower)).sum()) + 0.5 * float(
            self.prior_mean_b @ self.prior_linear_b
        )

    def _theta_index(self) -> np.ndarray:
        """Index in θ of each (class, column): (K, w)."""
        k, d = self.k, self.model.n_features
        index = np.arange(k)[:, None] * d + np.arange(d)[None, :]
        if self.model.fit_intercept:
            index = np.hstack([index, k * d + np.arange(k)[:, None]])
        return index

    def posterior(self, lam: np.ndarray, eta: np.ndarray) -> tuple:
        """``(mean, cov, half_log_det, linear)`` of B (r·w) given the sites."""
        r, w = self.r, self.width
        blocks = self.model.latent_gram(lam)  # (r, r, w, w)
        precision = blocks.transpose(0, 2, 1, 3).reshape(r * w, r * w)
        precision = 0.5 * (precision + precision.T)
        linear = self.model.latent_transpose(eta).ravel()
        if self.general:
            precision += self.prior_precision_b
            linear += self.prior_linear_b
        else:
            precision[np.diag_indices(r * w)] += 1.0 / self.prior_var
        lower = lower_cholesky(precision, "softmax EP posterior precision")
        mean = cho_solve((lower, True), linear, check_finite=False)
        cov, info = dpotri(lower, lower=1)
        if info != 0:
            raise NotPositiveDefiniteError("The softmax EP posterior could not be inverted.")
        upper = np.triu_indices(r * w, 1)
        cov[upper] = cov.T[upper]
        return mean, cov, float(np.log(np.diag(lower)).sum()), linear

    def latent(self, mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean (M, r) and covariance (M, r, r) of every row's ``g = B x̃``."""
        return row_moments(self.model.X, mean.reshape(self.r, self.width), cov)

    def to_theta(self, mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """θ's mean and covariance (model layout): B's rotated back, plus the shift's prior."""
        if self.general:
            return self._general_to_theta(mean, cov)
        r, w, q = self.r, self.width, self.q
        theta = self.model.to_vector(q @ mean.reshape(r, w))
        blocks = np.einsum("ka,ajcm,lc->kljm", q, cov.reshape(r, w, r, w), q, optimize=True)
        shift = np.diag(self.column_var) / self.k
        blocks += shift  # every (k, l) block: the prior of 1ᵀΘ/√K, spread over the classes
        full = self.model.to_layout(blocks)
        return theta, 0.5 * (full + full.T)

    def _general_to_theta(self, mean: np.ndarray, cov: np.ndarray):
        """θ's moments from B's posterior and the shift's prior conditional on B."""
        r, w, u = self.r, self.width, self.rotation
        shift_mean = self.prior_mean_s + self.gain @ (mean - self.prior_mean_b)
        cross = self.gain @ cov  # Cov(s, B), (w, r·w)
        rotated = np.empty((r + 1, w, r + 1, w))
        rotated[:r, :, :r, :] = cov.reshape(r, w, r, w)
        rotated[r, :, :r, :] = cross.reshape(w, r, w)
        rotated[:r, :, r, :] = cross.reshape(w, r, w).transpose(1, 2, 0)
        rotated[r, :, r, :] = self.shift_cov + cross @ self.gain.T
        theta = self.model.to_vector(u @ np.vstack([mean.reshape(r, w), shift_mean]))
        blocks = np.einsum("ka,ajbm,lb->kljm", u, rotated, u, optimize=True)
        full = self.model.to_layout(blocks)
        return theta, 0.5 * (full + full.T)


def _site_fits(model, q, mean, cov, cav_prec, cav_lin, power, rules, level, ok):
    """VS fits of the tilted densities ``F^power × cavity`` of the rows ``ok``: (log Z, mean,
    cov, integrable) per row, NaN where not fitted.

    Row i is fitted on ``rules[level[i]]``. A fit that is not integrable (a quadratic form
    that is not negative definite, met on wide cavities where the factor is nearly a step
    over the kernel's nodes) is done again on the next rule, and the row keeps that rule in
    the later sweeps (``level`` is raised in place): the sweep stays one fixed map, which a
    rule chosen afresh at each sweep would not be.
    """
    r = q.shape[1]
    log_z = np.full(len(mean), np.nan)
    fit_mean, fit_cov = np.full_like(mean, np.nan), np.full_like(cov, np.nan)
    good = np.zeros(len(mean), dtype=bool)
    for at, rule in enumerate(rules):
        rows = np.flatnonzero(ok & (level == at) & ~good)
        if not rows.size:
            continue
        n_points = rule.n_points(r)
        n_params = (r + 1) * (r + 2) // 2
        chol = np.linalg.cholesky(cov[rows])
        y = model.y[rows]

        def block(part: slice, rows=rows, chol=chol, y=y, rule=rule) -> None:
            sites = rows[part]
            prec, lin, pw, label = cav_prec[sites], cav_lin[sites], power[sites], y[part]

            def log_target(t):
                f = t @ q.T  # (m, P, K)
                chosen = np.take_along_axis(f, label[:, None, None], 2)[..., 0]
                top = f.max(axis=2)
                f -= top[..., None]
                np.exp(f, out=f)
                chosen -= np.log(f.sum(axis=2)) + top  # log softmax(f)[y]
                # The cavity's −tᵀPt/2 + hᵀt, as (h − Pt/2)ᵀt: one batched product.
                half = np.matmul(t, prec)
                half *= -0.5
                half += lin[:, None, :]
                return pw[:, None] * chosen + np.einsum("mpa,mpa->mp", half, t)

            fits = fit_sites(log_target, mean[sites], chol[part], rule)
            log_z[sites], fit_mean[sites], fit_cov[sites] = fits.log_Z, fits.mean, fits.cov
            good[sites] = fits.integrable

        # Per site: the points' latent values and log-softmax (K each), their coordinates,
        # the fit's per-point arrays, and its Newton system (n² entries, thrice). Blocks of
        # 2²⁸ multiply-adds at least: each runs its own Newton iterations, whose per-call
        # overhead small blocks would repeat hundreds of times.
        per_site = 8.0 * (n_points * (2 * len(q) + 2 * r + 8) + 3 * n_params**2)
        cap = max(1, int(block_bytes() // per_site))
        with single_blas_thread():
            map_blocks(block, block_slices(len(rows), n_points * n_params**2, cap, 2**28))
        if at + 1 < len(rules):
            level[rows[~good[rows]]] = at + 1
    return log_z, fit_mean, fit_cov, good


def _rules(rule: SamplingRule) -> list[SamplingRule]:
    """The rule, then (a :class:`SymmetricSobol`) the same with 4 and 16 times the nodes."""
    if not isinstance(rule, SymmetricSobol):
        return [rule]
    return [
        SymmetricSobol(f * rule.points_per_param, f * rule.min_points, rule.seed)
        for f in (1, 4, 16)
    ]


def _laplace_sites(model, q, start) -> tuple[np.ndarray, np.ndarray]:
    """The factors' second-order expansions at ``start`` in g = Qᵀf: (Λ, η) per row."""
    _, p = model.probabilities(np.asarray(start, dtype=float))
    s = model.sample_weight[:, None]
    residual = -s * p
    residual[np.arange(len(p)), model.y] += model.sample_weight
    curvature = s[..., None] * np.einsum("ia,ab->iab", p, np.eye(p.shape[1]))
    curvature -= s[..., None] * (p[:, :, None] * p[:, None, :])
    lam = q.T @ curvature @ q
    W, b = model.split(start)
    g = (np.asarray(model.X @ W.T) + b) @ q
    return lam, np.einsum("iab,ib->ia", lam, g) + residual @ q


def _new_sites(model, contrast, post, lam, eta, power, rules, level):
    """One undamped sweep: every site moment-matched to its tilted fit (PSD-projected); a
    row whose cavity or fit is improper keeps its site."""
    copies = np.maximum(model.sample_weight, 1.0)
    r = contrast.r
    v_mean, v_cov = contrast.latent(post[0], post[1])
    cav_prec, cav_lin, ok = _cavity(v_mean, v_cov, lam, eta, copies)
    _, t_mean, t_cov, good = _site_fits(
        model, contrast.q, v_mean, v_cov, cav_prec, cav_lin, power, rules, level, ok
    )
    ok &= good
    t_prec = np.linalg.inv(np.where(ok[:, None, None], t_cov, np.eye(r)))
    new_lam = np.where(ok[:, None, None], copies[:, None, None] * (t_prec - cav_prec), lam)
    t_lin = np.einsum("iab,ib->ia", t_prec, np.where(ok[:, None], t_mean, 0.0))
    new_eta = np.where(ok[:, None], copies[:, None] * (t_lin - cav_lin), eta)
    return _psd(new_lam), new_eta


def _cavity(v_mean, v_cov, lam, eta, copies):
    """Cavity natural parameters of one copy of each factor, and whether they are proper."""
    v_prec = np.linalg.inv(v_cov)
    v_prec = 0.5 * (v_prec + np.swapaxes(v_prec, 1, 2))
    c = copies[:, None, None]
    cav_prec = v_prec - lam / c
    cav_lin = np.einsum("iab,ib->ia", v_prec, v_mean) - eta / copies[:, None]
    ok = np.linalg.eigvalsh(cav_prec)[:, 0] > 0
    return cav_prec, cav_lin, ok


def _psd(lam: np.ndarray) -> np.ndarray:
    """Each symmetric matrix's projection on the positive semi-definite cone."""
    eigval, eigvec = np.linalg.eigh(0.5 * (lam + np.swapaxes(lam, 1, 2)))
    if eigval[:, 0].min() >= 0:
        return lam
    return (eigvec * np.maximum(eigval, 0.0)[:, None, :]) @ np.swapaxes(eigvec, 1, 2)


@blas_policy
def softmax_ep(
    model: SoftmaxGLMPosterior,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-8,
    max_iter: int = 200,
    start: np.ndarray | None = None,
    rule: SamplingRule | None = None,
    memory: int = 5,
) -> EPResult:
    """EP approximation of the multinomial logistic posterior, with VS site fits.

    See the module docstring for the algorithm.

    Parameters
    ----------
    model : SoftmaxGLMPosterior
        The posterior.
    damping : float, default=0.85
        Fraction of the new site parameters taken at each sweep (1 = undamped).
    tol : float, default=1e-8
        Stop when no site parameter changes by more than ``tol · (1 + |value|)``.
    max_iter : int, default=200
        Maximum sweeps; a ConvergenceWarning is emitted when reached, and the sites of the
        sweep that moved least are returned.
    start : ndarray of shape (dim,), optional
        The posterior mode (default: found by :func:`softmax_laplace`); the sites start as
        the factors' second-order expansions there.
    rule : SamplingRule, optional
        Deterministic rule of the site fits in K − 1 dimensions (default
        ``SymmetricSobol(16)``: 16 nodes per parameter of the fit, at least 256; 1024
        for 10 classes); a :class:`~vsbayes.sampling.SymmetricSobol` rule is refined 4
        and 16 times for the sites whose fit is not integrable.
    memory : int, default=5
        Sweeps mixed by Anderson's acceleration (0: plain damped sweeps).

    Returns
    -------
    EPResult
        Mean and covariance in the model's layout of θ (``[W.ravel(), b]``), EP's log
        evidence, the sweeps and the last site change.

    Raises
    ------
    EstimationError
        If the sweeps stall short of ``tol`` even at the smallest damping, or if the final
        cavities are improper (no evidence estimate). Reaching ``max_iter`` only warns.
    NotPositiveDefiniteError
        If the plain damped sites give a posterior precision that is not positive definite.
    """
    if not 0 < damping <= 1:
        raise ValueError(f"damping must be in (0, 1]; got {damping!r}.")
    check_softmax_size(model)
    rules = _rules(SymmetricSobol(16) if rule is None else rule)
    level = np.zeros(model.n_observations, dtype=int)
    contrast = _Contrast(model)
    q, r, m = contrast.q, contrast.r, model.n_observations
    copies, power = _split_weights(model.sample_weight)
    if start is None:
        start = softmax_laplace(model).mean
    lam, eta = _laplace_sites(model, q, start)
    n_lam = m * r * r

    def split(sites):
        return sites[:n_lam].reshape(m, r, r), sites[n_lam:].reshape(m, r)

    def update(post, sites):
        new_lam, new_eta = _new_sites(model, contrast, post, *split(sites), power, rules, level)
        return np.concatenate([new_lam.ravel(), new_eta.ravel()])

    def project(sites, extrapolated):
        # Log-concave factors give PSD sites at every EP update; an extrapolation may not.
        if extrapolated:
            sites = sites.copy()
            sites[:n_lam] = _psd(sites[:n_lam].reshape(m, r, r)).ravel()
        return sites

    store = ArraySites(
        np.concatenate([lam.ravel(), eta.ravel()]),
        update,
        lambda sites: contrast.posterior(*split(sites)),
        project,
        marginals=lambda post: (post[0], np.diag(post[1])),
    )
    run = damped_sweeps(store, damping=damping, tol=tol, max_iter=max_iter, memory=memory)
    post, (lam, eta) = run.posterior, split(store.sites)
    log_Z = _log_evidence(model, contrast, post, lam, eta, copies, power, rules, level)
    mean, cov = contrast.to_theta(post[0], post[1])
    return EPResult(
        mean, cov, log_Z, n_iter=run.n_iter, converged=run.converged, site_change=run.change
    ).with_sites(EPSites(lam, eta, "contrast"))


def _log_evidence(model, contrast, post, lam, eta, copies, power, rules, level) -> float:
    """EP's log evidence: each copy's site normalizer, and the Gaussian integral of the
    prior times the sites (the shift part's prior integrates to 1).

    A copy's normalizer is ``Z_i / ∫ site × cavity``; with the tilted fit's ``log Z`` over
    the unnormalized cavity ``exp(−gᵀP g/2 + hᵀg)``, the cavity's normalizer cancels and
    ``log s_i = log Z_fit − (r/2) log 2π − m_iᵀV_i⁻¹m_i/2 − log det V_i / 2``, with
    ``(m_i, V_i)`` the posterior's latent moments (cavity × site copy).
    """
    mean, cov, half_log_det, linear = post
    v_mean, v_cov = contrast.latent(mean, cov)
    cav_prec, cav_lin, ok = _cavity(v_mean, v_cov, lam, eta, copies)
    log_z, _, _, good = _site_fits(
        model, contrast.q, v_mean, v_cov, cav_prec, cav_lin, power, rules, level, ok
    )
    if not (ok & good).all():
        raise EstimationError(
            f"{int((~(ok & good)).sum())} of the final expectation-propagation cavities or "
            f"tilted fits are improper (EP stopped short of a fixed point), so EP has no "
            f"evidence estimate. Increase max_iter or lower damping."
        )
    _, log_det = np.linalg.slogdet(v_cov)
    quad = np.einsum("ia,ia->i", v_mean, np.linalg.solve(v_cov, v_mean[..., None])[..., 0])
    site = log_z - 0.5 * contrast.r * _LOG_2PI - 0.5 * quad - 0.5 * log_det
    gaussian = 0.5 * float(linear @ mean) - half_log_det - contrast.prior_constant
    return float(copies @ site) + gaussian
