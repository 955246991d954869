"""Expectation propagation for the multinomial logistic (softmax) posterior: sites by VS fits
or by tilted expectations.

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

**Wide problems.** Where the rows' contrasts are far fewer than B's entries (more
columns than rows), B's posterior is held in the rows' space instead, exactly
(:mod:`~vsbayes.approximations._softmax_dual`, D-197): an M·r square factorization a
sweep, θ's dense covariance formed only for the result (once, when read: D-202).

**The sweep.** All sites at once (no loop over observations), from the posterior
N(μ, Σ) of B: each row's latent moments ``(m_i, V_i)``, its cavity ``V_i⁻¹ − Λ_i/c_i``
(a weight ``s_i ≥ 1`` is c_i = s_i copies of the factor, power EP, exactly EP on duplicated
rows; a weight below 1 is one factor ``F^{s_i}``, as the binary EP), the Gaussian with the
moments of the tilted density ``F^{min(s,1)} × cavity``, and the new site, its natural
parameters minus the cavity's (from 17 classes on, the tilted moments' cavities come as
their covariance and mean ``(I − VΛ/c)⁻¹ [V, m − Vη/c]``, one solve a row, by products
``(I + E)(I + E²)(I + E⁴)…`` where the systems are near the identity). The tilted
moments come one of two ways (``sites``):

* **VS fits** (up to :data:`MAX_FITTED_CLASSES` classes where the rows' cavities are wide,
  see ``sites``): the Gaussian fitted by variational
  sampling to the tilted density, :func:`~vsbayes.engine.site_fits.fit_sites` on a
  deterministic rule in r dimensions (:class:`~vsbayes.sampling.SymmetricSobol`: whitened,
  mirrored Sobol nodes, 16 per parameter of the fit, at least 256: 1024 for r = 9), its
  kernel the posterior's latent marginal ``N(m_i, V_i)``. Exact for a Gaussian tilted
  density on any rule, but a fit of (r + 1)(r + 2)/2 parameters: work per row ~K⁶.
* **Tilted expectations** (otherwise): by Stein's identities the tilted mean and
  covariance of ``F^s × N(μ, Σ)`` are ``μ + Σγ`` and ``Σ − ΣHΣ``, with ``γ = E[∇ log F^s]``
  and ``H = γγᵀ − E[∇∇F^s / F^s]`` under the tilted density; for the softmax both are
  linear in E[p] and E[p pᵀ] (p the class probabilities at g), so the site is
  ``Λ = (I − HΣ)⁻¹H``, ``η = γ + Λ μ_t``. The expectations are self-normalized quadrature on
  mirrored Sobol nodes mapped through the cavity (weights ``F^s ≤ 1``), 8 nodes per
  dimension, at least 128, and 4 or 16 times that on a row whose cavity is wide (its largest
  variance above 4 or 16: the factor is then nearly a step over it), a quarter of it on a
  row whose cavity is narrow (largest variance at most 1, from 17 classes on): work per
  row ~K² per node (from 17 classes on, at a tolerance of 10⁻⁶ or more, on float32 values:
  their rounding is far below the quadrature's error). They are closer to EP's fixed point
  than the VS fits at a tenth of their cost (iris, wine: 1.7·10⁻⁴ and 1.3·10⁻³ nats from it
  on 8192 nodes, the fits 2·10⁻³ and 0.025). Where the factor narrows the cavity by
  more than half a variance in some direction, ``Σ − ΣHΣ`` is a difference of nearly equal
  terms, and the row takes its nodes' own tilted moments instead, on the mixture of the
  cavity and the latent marginal, with four times the nodes (see D-045).

The new sites are projected on the positive semi-definite cone (a log-concave factor
gives PSD sites; the fits' round-off need not), damped and mixed by Anderson's
acceleration in the binary EP's sweep loop (:mod:`~vsbayes.approximations._damped_sweeps`,
with its stall rules: without progress, plain damped sweeps, then halved damping down to
1/64 while halving helps, and an :class:`~vsbayes.exceptions.EstimationError` if that
stalls too).

The sites start at the Laplace approximation's (the factors' second-order expansions at
the mode), so that the first posterior is Laplace's. The log evidence is EP's estimate at
the fixed point, from one more pass of site fits at the final cavities.

This module holds the posterior of the contrasts, the sweep loop, the one-row update,
the sizing and the evidence; the rows' site updates (cavities, tilted moments, VS site
fits, moment matching, the Laplace start, the PSD checks) are in
:mod:`~vsbayes.approximations.softmax_sites` and the modules it names.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.linalg.lapack import dpotri

from .._indices import triu_indices
from .._lapack import cho_solve
from .._linalg import class_congruence
from .._memory import block_bytes, check_memory, format_bytes
from .._warnings import warn
from ..exceptions import EstimationError, NotPositiveDefiniteError, UnreliableFitWarning
from ..gaussian import lower_cholesky
from ..models.latent import row_moments
from ..models.softmax import MANY_CLASSES, SoftmaxGLMPosterior
from ..models.softmax_predictive_rules import centred_basis
from ..sampling import SamplingRule, SymmetricSobol
from ._damped_sweeps import (
    Anderson,
    ArraySites,
    damped_sweeps,
    flat_concatenate,
    relative_change,
)
from ._glm_gaussian import BlockLatent
from ._softmax_cavities import _positive_definite, _psd, _row_psd, _whitened_norms
from ._softmax_dual import (
    DualContrast,
    column_variances,
    dense_contrast_work,
    dual_contrast_bytes,
    dual_contrast_work,
    factorizing_prior,
    holds_dual,
    row_kernel,
    theta_moments,
)
from ._softmax_latent_modes import (
    _three_class_kernels,
    latent_softmax_mode,
    softmax_mode_site_updates,
)
from ._softmax_site_fits import _FIT_SINGLE_TOL, _chord_tol, _rules, _sweep_chord_tol
from ._softmax_tilted_moments import _LOG_2PI, _SINGLE_TOL, _few_tilted_sites, _node_bytes
from ._threads import _by_rows, blas_policy
from ._three_class_sites import _three_class_inverses, _three_class_psd
from ._tilted_rule import _many_classes, _n_levels, _rule_size
from .expectation_propagation import (
    DEFAULT_DAMPING,
    EPResult,
    EPSites,
    _split_weights,
    with_constant_rows,
)
from .laplace_error import softmax_row_skewness
from .softmax_laplace import check_softmax_size, softmax_laplace
from .softmax_sites import (
    MAX_FITTED_CLASSES,
    _cavities,
    _laplace_sites,
    _new_sites,
    _OneRow,
    _RowState,
    _sites,
    _wide_rows,
)

__all__ = [
    "MAX_FITTED_CLASSES",
    "assumed_density_softmax_row",
    "check_softmax_ep_size",
    "softmax_ep",
    "softmax_ep_cost",
    "softmax_site_updates",
]


class _Contrast:
    """The posterior of B from the sites, and the rows' latent moments under it."""

    def __init__(self, model: SoftmaxGLMPosterior):
        self.model = model
        k, d = model.n_classes, model.n_features
        self.k, self.r = k, k - 1
        self.width = d + int(model.fit_intercept)
        self.q = centred_basis(k)
        # Prior variance of B's entries (class-major rows of w), the same for every class.
        self.column_var = column_variances(model)
        self.prior_var = np.tile(self.column_var, self.r)
        # A general prior (a full precision, or a mean) does not factorize over the
        # rotation: EP runs on B under B's marginal prior, and the shift part follows B
        # through the prior's conditional (exact: the likelihood sees B only).
        # (Also where the prior variances differ between the classes of a column: the
        # prior sites of a shrinkage prior, softmax_prior_sites.py.)
        self.general = not factorizing_prior(model)
        self._kept = None  # (posterior covariance, rows' latent covariances): keep_latent
        self._factor = None  # the sites' precisions and their posterior's: posterior(keep=)
        # More columns than rows: the posterior in the rows' space (_softmax_dual), exact;
        # a general prior has no such form here and stays dense.
        self.dual = holds_dual(model)
        self._row_kernel = None
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

    def posterior(self, lam: np.ndarray, eta: np.ndarray, keep: bool = False) -> tuple:
        """``(mean, cov, half_log_det, linear, precision)`` of B (r·w) given the sites
        (``half_log_det``: log |L| of the precision's Cholesky factor L). ``keep``: keep
        the precision's factorization for the next call, which reuses it if its site
        precisions ``lam`` are the same (once)."""
        if self.dual:
            return self._dual_posterior(lam, eta, keep)
        r, w = self.r, self.width
        kept, self._factor = self._factor, None
        if kept is not None and np.array_equal(kept[0], lam):
            _, precision, lower, cov, half_log_det = kept
        else:
            # (r, r, w, w) from the rows' distinct products of pairs of columns: half the
            # GEMM of their full outer products (round-off apart, symmetric blocks).
            blocks = self.model.latent_gram(lam, distinct=True)
            precision = blocks.transpose(0, 2, 1, 3).reshape(r * w, r * w)
            precision = 0.5 * (precision + precision.T)
            if self.general:
                precision += self.prior_precision_b
            else:
                precision[np.diag_indices(r * w)] += 1.0 / self.prior_var
            lower = lower_cholesky(precision, "softmax EP posterior precision")
            cov, info = dpotri(lower, lower=1)
            if info != 0:
                raise NotPositiveDefiniteError("The softmax EP posterior could not be inverted.")
            upper = triu_indices(r * w, 1)
            cov[upper] = cov.T[upper]
            half_log_det = float(np.log(np.diag(lower)).sum())
        if keep:
            self._factor = (lam, precision, lower, cov, half_log_det)
        linear = self.model.latent_transpose(eta).ravel()
        if self.general:
            linear += self.prior_linear_b
        mean = cho_solve((lower, True), linear, check_finite=False)
        return mean, cov, half_log_det, linear, precision

    def _dual_posterior(self, lam: np.ndarray, eta: np.ndarray, keep: bool) -> tuple:
        """:meth:`posterior` in the dual form: the covariance slot holds the
        :class:`DualContrast` (θ's dense covariance formed only on request), no precision."""
        kept, self._factor = self._factor, None
        if kept is not None and np.array_equal(kept[0], lam):
            dual = kept[1]
        else:
            if self._row_kernel is None:
                d = self.model.n_features
                self._row_kernel = row_kernel(self.model.X, self.column_var[:d])
            dual = DualContrast(
                self.model.X, self._row_kernel, self.column_var, lam, self.model.fit_intercept
            )
        if keep:
            self._factor = (lam, dual)
        linear = self.model.latent_transpose(eta).ravel()
        return dual.solve(linear), dual, dual.half_log_det, linear, None

    def variances(self, post: tuple) -> np.ndarray:
        """The variances of B's entries under a posterior of :meth:`posterior`."""
        cov = post[1]
        return cov.variances() if isinstance(cov, DualContrast) else np.diag(cov)

    def latent(self, mean: np.ndarray, cov) -> tuple[np.ndarray, np.ndarray]:
        """Mean (M, r) and covariance (M, r, r) of every row's ``g = B x̃``: the covariances
        kept by :meth:`keep_latent` if ``cov`` is the one they came from (once), or the
        dual form's (:class:`DualContrast`)."""
        kept, self._kept = self._kept, None
        coef = mean.reshape(self.r, self.width)
        dual = isinstance(cov, DualContrast)
        if dual or (kept is not None and np.array_equal(kept[0], cov)):
            d = self.model.n_features
            v_mean = np.asarray(self.model.X @ coef[:, :d].T)
            if self.width > d:
                v_mean += coef[:, d]
            return v_mean, cov.latent_cov() if dual else kept[1]
        # The r(r + 1)/2 distinct covariances by one GEMM (round-off apart from the full
        # product, a quarter of its work; digits' 10 classes: 17 → 12 ms a sweep).
        return row_moments(
            self.model.X, coef, cov, by_pairs=True, products=self.model.pair_products()
        )

    def keep_latent(self, cov, latent_cov: np.ndarray) -> None:
        """Keep the rows' latent covariances ``latent_cov`` under the posterior covariance
        ``cov`` for the next :meth:`latent` (a new linear term leaves them as they were:
        the first sweep after the sites' start moved their linear terms alone; the dual
        form keeps its own)."""
        if not isinstance(cov, DualContrast):
            self._kept = (cov, latent_cov)

    def to_theta(self, mean: np.ndarray, cov, formed: bool = True) -> tuple:
        """θ's mean and covariance (model layout): B's rotated back, plus the shift's prior.
        Not ``formed``: the dual form's covariance as the function that forms it (a lazy
        :class:`~vsbayes.gaussian.Gaussian`'s), a dense one as it is."""
        if isinstance(cov, DualContrast):
            theta = self.model.to_vector(self.q @ mean.reshape(self.r, self.width))
            form = functools.partial(cov.theta_cov, self.q)
            form.in_representative = True  # (SoftmaxGLMPosterior.centred keeps it)
            return theta, form() if formed else form
        if self.general:
            return self._general_to_theta(mean, cov)
        return theta_moments(self.model, self.q, self.column_var, mean, cov)

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
        blocks = class_congruence(u, rotated).transpose(0, 2, 1, 3)
        full = self.model.to_layout(blocks)
        return theta, 0.5 * (full + full.T)


def _skewness_shift(model, contrast, start, lam, eta) -> np.ndarray:
    """The linear terms (M, r) that move the Laplace sites' posterior mean from the mode
    ``start`` by the skewness correction ``S g / 2`` (:mod:`.laplace_error`): each row's
    ``h_i / 2`` (the third derivatives of its likelihood contracted with its latent
    covariance under the Laplace posterior, which the sites ``(lam, eta)`` give).

    The first sweep's move of the posterior is mostly that of its mean (at 20 classes ×
    8 features × 2000 rows the Laplace error predicted from the mean term, 0.84 nats, and
    the first sweep's move, 0.83): started there, the sweeps reach their stop one sweep
    earlier at 20-26 classes (docs/decisions.md)."""
    q = contrast.q
    # The first sweep's posterior has the same precisions Λ: its factorization and rows'
    # latent covariances are these.
    post = contrast.posterior(lam, eta, keep=True)
    _, v_cov = contrast.latent(post[0], post[1])
    contrast.keep_latent(post[1], v_cov)
    del post
    _, probabilities = model.probabilities(np.asarray(start, dtype=float))

    def rows_skewness(v_cov, probabilities, weights):
        # The classes' latent covariance (the contrasts' rotated back): the softmax's
        # derivatives vanish along the common shift, which the contrasts leave out.
        return softmax_row_skewness(probabilities, q @ v_cov @ q.T, weights)

    k = model.n_classes
    skewness = _by_rows(rows_skewness, v_cov, probabilities, model.sample_weight, work=4.0 * k**3)
    return 0.5 * skewness @ q


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
    sites: str = "auto",
    verbose: int = 0,
    start_sites: EPSites | None = None,
    posterior_tol: float | None = None,
    posterior_share: float | None = None,
    spread_levels: bool = True,
) -> EPResult:
    """EP approximation of the multinomial logistic posterior.

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
        the factors' second-order expansions there (from 17 classes on, their linear terms
        moved so that the starting mean is the mode plus the Laplace approximation's
        skewness correction).
    rule : SamplingRule, optional
        Deterministic rule in K − 1 dimensions of the site fits (default
        ``SymmetricSobol(16)``: 16 nodes per parameter of the fit, at least 256; 1024
        for 10 classes) or of the tilted moments (default: mirrored Sobol nodes, 8 per
        dimension, at least 128; rows with wide cavities start 4 or 16 times finer, from
        17 classes on rows with narrow ones 4 times coarser); a
        :class:`~vsbayes.sampling.SymmetricSobol` rule (and the default) is refined 4 and
        16 times for the sites it leaves improper.
    memory : int, default=5
        Sweeps mixed by Anderson's acceleration (0: plain damped sweeps).
    sites : {"auto", "fits", "moments"}, default="auto"
        How each site is found: ``"fits"``, VS fits of the tilted densities (a quadratic
        in K − 1 dimensions per row, work growing as K⁴); ``"moments"``, the tilted moments
        from expectations of the softmax (work growing as K²); ``"auto"``, the moments,
        except up to :data:`MAX_FITTED_CLASSES` classes where more than a tenth of the
        rows' cavities are wide (largest variance above 16) at the first sweep: fits.
    verbose : int, default=0
        Print the route and its estimated size before the sweeps, and one line per sweep
        (its number, site change and damping) when ≥ 1.
    start_sites : EPSites, optional
        Sites of the model's rows to start the sweeps from instead of the Laplace
        approximation's (then ``start`` is unused): a warm start, e.g. a leave-one-out
        refit from the full fit's sites without the row's.
    posterior_tol : float, optional
        Also stop, once the site change is within 10 × ``tol``, where one undamped sweep
        moves the posterior of the contrasts by at most ``posterior_tol`` nats (the KL
        divergence of the current posterior from the damped sweep's, over damping²): the
        sites may still move by more than ``tol`` where that no longer changes the
        posterior. None: the site change alone.
    posterior_share : float, optional
        With ``posterior_tol``: stop at ``max(posterior_tol, posterior_share × KL(start ‖
        current))`` nats instead (the KL divergence of the current posterior from the
        first, the start's), tested from a site change of 100 × ``tol`` on where that
        share is the larger: a stop relative to how far the posterior is from Gaussian
        at the mode, which scales EP's own error.
    spread_levels : bool, default=True
        Whether the tilted moments of rows with wide cavities start on 4 or 16 times the
        nodes (the rule's finer levels) at the first sweep, for EP's own accuracy at its
        fixed point. False: every row starts on the coarsest level and goes finer only
        where its moments come out improper or the factor narrows its cavity much: the
        kernel of VS's global fit, which does not see that quadrature error (wine: 0.01
        nats from the fixed point on the finer levels; docs/decisions.md, D-163).

    Returns
    -------
    EPResult
        Mean and covariance in the model's layout of θ (``[W.ravel(), b]``), EP's log
        evidence, the sweeps and the last site change.

    Raises
    ------
    EstimationError
        If the sweeps stall short of ``tol`` at the smallest damping (or at a halved one
        that took them no closer to a fixed point), or if the final
        cavities are improper (no evidence estimate), or the tilted moments of more than
        1 % of the rows (at least one) stay improper. Reaching ``max_iter`` only warns.
    NotPositiveDefiniteError
        If the plain damped sites give a posterior precision that is not positive definite.
    MemoryLimitError
        Before any large allocation, if the fit's estimated peak memory
        (:func:`softmax_ep_cost`) exceeds :func:`~vsbayes._memory.memory_limit`.
    """
    if not 0 < damping <= 1:
        raise ValueError(f"damping must be in (0, 1]; got {damping!r}.")
    informative = model.informative_rows()
    if informative.constant.any():
        # All-zero rows without intercepts: their factor K^(−s) is a constant, their
        # latent 0 under every Gaussian (no cavity): EP of the other rows, their sites 0.
        if start_sites is not None:
            kept = ~informative.constant
            start_sites = EPSites(
                start_sites.precision[kept], start_sites.linear[kept], start_sites.space
            )
        result = softmax_ep(
            informative.model,
            damping=damping,
            tol=tol,
            max_iter=max_iter,
            start=start,
            rule=rule,
            memory=memory,
            sites=sites,
            verbose=verbose,
            start_sites=start_sites,
            posterior_tol=posterior_tol,
            posterior_share=posterior_share,
            spread_levels=spread_levels,
        )
        return with_constant_rows(result, informative)
    method = _method(model, sites)
    check_softmax_ep_size(model, sites=method, rule=rule, memory=memory)
    if verbose:
        nbytes, work = softmax_ep_cost(model, sites=method, rule=rule, memory=memory)
        print(
            f"[softmax EP] {model.n_observations} rows, {model.n_classes} classes, sites by "
            f"{_METHOD_NAMES[method]}: about "
            f"{format_bytes(nbytes)} and {work:.2g} multiply-adds per sweep"
        )
    fit_rules = _rules(SymmetricSobol(16) if rule is None else rule)
    state = _RowState(
        model.n_observations,
        fit_rules if method == "fits" else None,
        fit_rules if method == "auto" else None,
    )
    state.fused = method == "moments" and _many_classes(model.n_classes - 1)
    state.single = model.n_classes >= MANY_CLASSES and tol >= _SINGLE_TOL
    state.spread = spread_levels
    # The first sweep's fits: to a hundredth of the changes' scale from Laplace's sites,
    # far from the fixed point; at EP's own stop from given sites (a warm start: near it).
    state.chord_tol = _chord_tol(tol) if start_sites is not None else _sweep_chord_tol(tol, None)
    state.fit_single = tol >= _FIT_SINGLE_TOL
    contrast = _Contrast(model)
    q, r, m = contrast.q, contrast.r, model.n_observations
    copies, power = _split_weights(model.sample_weight)
    if start_sites is not None:
        lam, eta = start_sites.precision.copy(), start_sites.linear.copy()
    else:
        if start is None:
            start = softmax_laplace(model).mean
        lam, eta = _laplace_sites(model, q, start)
        if _many_classes(r):
            eta += _skewness_shift(model, contrast, start, lam, eta)
    n_lam = m * r * r

    def split(sites):
        return sites[:n_lam].reshape(m, r, r), sites[n_lam:].reshape(m, r)

    last = {}  # what the last sweep saw of the evidence at the sites it started from

    def update(post, sites, bound):
        new_lam, new_eta = _new_sites(
            model, contrast, post, *split(sites), power, rule, state, record=last, bound=bound
        )
        new = flat_concatenate(new_lam, new_eta)
        # The next sweep's VS site fits solved to a hundredth of this sweep's change
        # (damped_sweeps' relative change, undamped), no finer than its fits can use. Sites
        # by tilted moments alone (no rules after the first sweep: none later) read no
        # stop: the change is not computed (at 40 classes × 2000 rows, 17 ms a fit; D-269).
        if new.size and state.rules is not None:
            state.chord_tol = _sweep_chord_tol(tol, relative_change(new, sites))
        return new

    def project(sites, extrapolated):
        # Log-concave factors give PSD sites at every EP update; an extrapolation may not.
        if extrapolated:  # Anderson's fresh array, nobody else's: projected in place
            precisions = sites[:n_lam].reshape(m, r, r)
            projected = _psd(precisions)
            if projected is not precisions:
                sites[:n_lam] = projected.ravel()
        return sites

    store = (_VerboseSites if verbose else ArraySites)(
        flat_concatenate(lam, eta),
        update,
        lambda sites: contrast.posterior(*split(sites)),
        project,
        marginals=lambda post: (post[0], contrast.variances(post)),
        # The rows' rule levels go back with the best sites: a diverged sweep's (rows of
        # wide cavities refitted on 16 times the nodes) would stay with every later sweep.
        state=(state.levels, state.set_levels),
        # A sweep already past the change at which it is discarded skips its rows' refits
        # on finer rules (_new_sites): 24.8 of the 28 s of a diverged sweep on digits.
        bounded=True,
    )
    run = damped_sweeps(
        store,
        damping=damping,
        tol=tol,
        max_iter=max_iter,
        memory=memory,
        as_gaussian=lambda post: contrast.to_theta(post[0], post[1]),
        posterior_tol=posterior_tol,
        divergence=_posterior_kl,
        posterior_share=posterior_share,
        # Rows whose cavities a diverged sweep widened take VS site fits on finer rules:
        # such a sweep cost 20-80 s on digits at C = 1e4, against 0.2 s near the start.
        costly_divergence=True,
    )
    post, (lam, eta) = run.posterior, split(store.sites)
    if run.converged and last.get("evidence") is not None:
        # The evidence of the sites the last sweep started from, whose site normalizers it
        # has computed: within tol of the returned sites, and EP's evidence is stationary
        # at its fixed point (Rasmussen & Williams 2006, §3.6), so it differs by O(tol²);
        # the final pass of site computations it saves was a sixth of the fit's sweeps.
        log_Z = _site_evidence(contrast, *last["evidence"], copies)
    else:
        state.chord_tol = _chord_tol(tol)  # the normalizers of the fits at EP's own stop
        log_Z = _log_evidence(model, contrast, post, lam, eta, copies, power, rule, state)
    # θ's dense covariance is formed when first read (the estimators' sigma_, once), its
    # factor when first needed (D-202).
    mean, cov = contrast.to_theta(post[0], post[1], formed=False)
    return EPResult(
        mean, cov, log_Z, n_iter=run.n_iter, converged=run.converged, site_change=run.change
    ).with_sites(EPSites(lam, eta, "contrast"))


def _posterior_kl(post, other) -> float:
    """KL(N_post ‖ N_other) of two posteriors of the contrasts (:meth:`_Contrast.posterior`):
    from the one's covariance and the other's precision, no factorization."""
    if isinstance(post[1], DualContrast):
        return _dual_posterior_kl(post, other)
    mean, cov, half_log_det, _, _ = post
    other_mean, _, other_half_log_det, _, other_precision = other
    shift = other_mean - mean
    trace = float(np.einsum("ij,ij->", other_precision, cov))
    # log |Σ| = −2 log |L| of the precision's factor.
    log_ratio = 2.0 * (half_log_det - other_half_log_det)
    return 0.5 * (trace - len(mean) + float(shift @ other_precision @ shift) + log_ratio)


def _dual_posterior_kl(post, other) -> float:
    """:func:`_posterior_kl` in the dual form: the two precisions differ by the rows'
    sites alone, ``P_o − P = Σ_i (Λ_oi − Λ_i) ⊗ x̃_i x̃_iᵀ``, so ``tr(P_o Σ) − n`` is
    ``Σ_i tr((Λ_oi − Λ_i) V_i)`` over the rows' latent covariances under ``post``, and
    ``δᵀ P_o δ`` the prior's diagonal plus each row's ``(x̃_iᵀδ)ᵀ Λ_oi (x̃_iᵀδ)``."""
    mean, dual, half_log_det, _, _ = post
    other_mean, other, other_half_log_det, _, _ = other
    r = dual.r
    trace = float(np.einsum("iab,iba->", other.lam - dual.lam, dual.latent_cov()))
    shift = (other_mean - mean).reshape(r, -1)
    latent = dual._z(shift[:, : dual.d])
    if dual.fit_intercept:
        latent += shift[:, dual.d]
    quad = float(np.einsum("ia,iab,ib->", latent, other.lam, latent))
    quad += float((shift**2 / dual.column_var).sum())
    log_ratio = 2.0 * (half_log_det - other_half_log_det)
    return 0.5 * (trace + quad + log_ratio)


def assumed_density_softmax_row(
    prior_mean: np.ndarray,
    prior_cov: np.ndarray,
    row: np.ndarray,
    label: int,
    n_classes: int,
    weight: float,
    *,
    fit_intercept: bool = True,
    rule: SamplingRule | None = None,
    tol: float = 1e-10,
    max_iter: int = 50,
) -> EPResult:
    """Multinomial EP of one row of weight ``s ≤ 1`` under a Gaussian prior of θ
    (``[W.ravel(), b]``): assumed-density filtering.

    With one site the cavity is the prior's marginal of the row's contrasts
    ``g = Qᵀ(Θ x̃)``, N(m, V), and EP's fixed point is the Gaussian whose marginal of g is
    what :func:`softmax_ep`'s sweep (``_sites``, ``sites="auto"``, on a one-row state) makes
    of that cavity, with the posterior's marginal of g as the kernel. The sweep's site is
    found at the fixed point by repeating it: each pass is the general sweep's undamped
    update of the one site (projected on the PSD cone, as the sweeps project it), then the
    posterior's marginal of g, Anderson-mixed as the sweeps are, until that marginal moves
    by less than ``tol`` (relative to its standard deviations). Where the site does not
    depend on the kernel — the tilted moments of a row the factor does not narrow much,
    on the cavity alone — the first pass is the fixed point. Where it does — the VS fits
    (a cavity wider than they need, :func:`_wide_rows`; their kernel starts at the Laplace
    approximation of g, Newton in r = K − 1 dimensions), and the tilted moments of a row
    the first pass moved to the mixture of the cavity and the posterior's marginal
    (``direct``, a rule level up) — the passes iterate, as the general EP's damped sweeps
    on one site do. θ's conditional given g is the prior's (a rank-(K − 1) update,
    :class:`~vsbayes.approximations._glm_gaussian.BlockLatent`). The log evidence is the
    site's normalizer over the normalized cavity, EP's of one site.

    Parameters
    ----------
    prior_mean, prior_cov : ndarray of shapes (p,), (p, p)
        The prior N(μ, Σ) of θ, p = K (d + 1) (K d without intercepts).
    row : ndarray of shape (d,)
        The row's features.
    label : int
        Its class index.
    n_classes : int
        K.
    weight : float
        Its weight, in (0, 1].
    fit_intercept : bool, default=True
        Whether θ ends with the K intercepts.
    rule : SamplingRule, optional
        As :func:`softmax_ep`'s (of its VS site fits or tilted moments, refined 4 and 16
        times where a site is improper).
    tol : float, default=1e-10
        Stop when the posterior's marginal of g moves by less than ``tol`` standard
        deviations (variances) between two passes.
    max_iter : int, default=50
        Most passes.

    Returns
    -------
    EPResult
        With the row's site (``sites``, in the contrast space), the passes as ``n_iter``.

    Raises
    ------
    EstimationError
        If the site is improper even on the finest rule, or the passes do not settle
        within ``max_iter``: met by the VS fits on the first rows under a vague prior (the
        intercepts' 10⁶ variance), where the factor is nearly a step over the kernel's
        nodes and the refits wander by a few hundredths of a standard deviation; damping
        did not help there, the general EP's damped sweeps take those rows.
    """
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"assumed_density_softmax_row takes a weight in (0, 1]; got {weight!r}.")
    q = centred_basis(n_classes)
    r = n_classes - 1
    latent = BlockLatent.of_softmax_row(prior_mean, prior_cov, row, q, fit_intercept)
    cav_prec = np.linalg.inv(latent.cov)
    cav_prec = 0.5 * (cav_prec + cav_prec.T)
    cav_lin = cav_prec @ latent.mean
    # The general EP's choice (sites="auto", at its first sweep, from the cavities).
    fits = n_classes <= MAX_FITTED_CLASSES and _wide_rows(np.linalg.eigvalsh(latent.cov)[-1:])
    state = _RowState(1, _rules(SymmetricSobol(16) if rule is None else rule) if fits else None)
    if fits:  # the first kernel: the Laplace approximation of g (the mode to round-off)
        mode = latent_softmax_mode(latent, q, int(label), float(weight), tol=1e-12, max_iter=100)
        kernel_mean, kernel_cov = mode.theta.copy(), mode.gaussian.cov
    else:  # the moments read no kernel until the row goes direct
        kernel_mean, kernel_cov = latent.mean, latent.cov
    one_row = _OneRow(np.array([int(label)]))
    power = np.array([float(weight)])
    ok = np.ones(1, dtype=bool)
    lower = np.tril_indices(r)
    # The passes' map converges linearly (the VS fits' at a rate ~0.2 at K = 4, d = 20,
    # after 1000 rows): Anderson's mixing of the kernel's mean and covariance entries, as
    # EP's sweeps mix the sites, takes 4-5 passes to 1e-8 instead of 11-12.
    mixing = Anderson(_REFIT_MEMORY)
    n_iter, change = 0, math.inf
    while True:
        if n_iter == max_iter:
            raise EstimationError(
                f"The sites of the row's tilted density did not settle in {max_iter} "
                f"passes (last change {change:.3g} standard deviations)."
            )
        n_iter += 1
        log_z, site_lam, site_eta, good = _sites(
            one_row,
            q,
            kernel_mean[None],
            kernel_cov[None],
            cav_prec[None],
            cav_lin[None],
            power,
            rule,
            state,
            ok,
        )
        if not good[0]:
            raise EstimationError(
                "The site of the row's tilted density is improper, even on the finest rule."
            )
        # EP's update (_new_sites): the site projected on the PSD cone (a VS fit of a
        # log-concave factor may come out slightly indefinite, and the projection moves
        # the fixed point), then the posterior's marginal of g.
        site_lam, site_eta = _psd(site_lam)[0], site_eta[0]
        post_cov = np.linalg.inv(cav_prec + site_lam)
        post_cov = 0.5 * (post_cov + post_cov.T)
        post_mean = post_cov @ (cav_lin + site_eta)
        if state.rules is None and not state.direct[0]:
            change = 0.0  # the site of the cavity alone: the fixed point at once
            break
        sd = np.sqrt(np.diag(post_cov))
        scale = np.concatenate([sd, np.outer(sd, sd)[lower]])
        image = np.concatenate([post_mean, post_cov[lower]])
        residual = (image - np.concatenate([kernel_mean, kernel_cov[lower]])) / scale
        change = float(np.max(np.abs(residual)))
        if change <= tol:
            break
        mixed = mixing.step(residual, image, change, scale)
        kernel_mean, kernel_cov = mixed[:r], np.zeros((r, r))
        kernel_cov[lower] = mixed[r:]
        kernel_cov = kernel_cov + np.tril(kernel_cov, -1).T
        if not _positive_definite(kernel_cov[None])[0]:  # an extrapolation too far
            mixing.restart()
            kernel_mean, kernel_cov = post_mean, post_cov
    mean, cov = latent.conditioned(prior_mean, prior_cov, post_mean, post_cov)
    # log ∫ F^s N(g; m, V) dg (EP's evidence with one site, whatever the site): the site's
    # log Z is over the unnormalized cavity exp(−gᵀPg/2 + hᵀg), whose integral is
    # exp(mᵀV⁻¹m/2) (2π)^(r/2) det(V)^(1/2).
    _, log_det = np.linalg.slogdet(latent.cov)
    log_evidence = float(log_z[0]) - 0.5 * (float(latent.mean @ cav_lin) + log_det + r * _LOG_2PI)
    result = EPResult(mean, cov, log_evidence, n_iter=n_iter, converged=True, site_change=change)
    return result.with_sites(EPSites(site_lam[None], site_eta[None], "contrast"))


#: Newton's stop (half the decrement) for :func:`softmax_site_updates`' Laplace kernels: a
#: kernel is one half of the even mixture the direct moments are taken on (its weights at
#: most 2), not the answer, and a mode to 10⁻⁵ of the log density (~0.005 of a standard
#: deviation, Newton's last steps being quadratic) places it as well as one to 10⁻¹⁰: the
#: one-row stream's KL to its batch fit the same to six digits, a Newton step less.
_KERNEL_TOL = 1e-5


def softmax_site_updates(
    q: np.ndarray,
    labels: np.ndarray,
    latent_mean: np.ndarray,
    latent_cov: np.ndarray,
    lam: np.ndarray,
    eta: np.ndarray,
    power: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One undamped EP update of some rows' sites, all from one posterior: each row's
    cavity (the posterior's marginal of its contrasts ``N(m_i, V_i)`` without its site
    ``(Λ_i, η_i)``), then :func:`softmax_ep`'s site of its tilted density ``F^s × cavity``
    by the tilted moments on the default rule: its levels 0 and 1 for wide cavities, and,
    for the rows the factor narrows much or whose tilted mass is deep in a wide cavity's
    tail, the nodes' own moments on the mixture of the cavity and the posterior's marginal
    (for a new row its Stein tilted Gaussian where proper; else, and for a row in the
    tail, the Laplace approximation of its tilted density:
    :func:`softmax_mode_site_updates`' Newton in the contrasts), taken at once where a
    sweep takes them from the next sweep on (:func:`_few_tilted_sites`); projected on the
    PSD cone. Not the VS fits, which ``sites="auto"`` takes where the cavities are wide:
    their kernel must be near each row's tilted density, and they settle only by iterating
    (a stream's first rows under the vague intercept prior). A site of zeros makes its
    row's update assumed-density filtering's (:func:`assumed_density_softmax_row`'s first
    pass where the factor does not narrow its cavity much; else one pass of the nodes'
    own moments, where that update iterates to its fixed point).

    Parameters
    ----------
    q : ndarray of shape (K, K - 1)
        The contrasts' basis.
    labels : ndarray of shape (m,)
        The rows' class indices.
    latent_mean, latent_cov : ndarray of shapes (m, K - 1), (m, K - 1, K - 1)
        The posterior's marginals of the rows' contrasts.
    lam, eta : ndarray of shapes (m, K - 1, K - 1), (m, K - 1)
        The rows' current sites.
    power : ndarray of shape (m,)
        Their weights, in (0, 1] (power EP).

    Returns
    -------
    new_lam, new_eta : ndarray
        The new sites (the current ones where ``found`` is False).
    log_z : ndarray of shape (m,)
        log ∫ F^s × cavity over the normalized cavity (NaN where not found).
    found : ndarray of shape (m,)
        Whether the row's cavity and tilted density were proper.
    """
    precision = _three_class_inverses(latent_cov) if q.shape[1] == 2 else None
    if precision is None:
        precision = np.linalg.inv(latent_cov)
        precision = 0.5 * (precision + np.swapaxes(precision, 1, 2))
    cav_prec = precision - lam
    cav_lin = np.einsum("mab,mb->ma", precision, latent_mean) - eta
    labels = np.asarray(labels)

    def laplace_kernels(rows, start, cavities):
        # Newton's method in the contrasts (the tilted mode to _KERNEL_TOL of its log density).
        if q.shape[1] == 2:  # (three classes: its rows' Newton and kernels on Python floats)
            three = _three_class_kernels(
                q, labels[rows], power[rows], cavities, latent_mean[rows], start, _KERNEL_TOL
            )
            if three is not None:
                return three
        modes = softmax_mode_site_updates(
            q,
            labels[rows],
            latent_mean[rows],
            latent_cov[rows],
            lam[rows],
            eta[rows],
            power[rows],
            start=start,
            cavities=cavities,
            tol=_KERNEL_TOL,
        )
        cov = np.linalg.inv(cavities[0] + modes.lam)
        return modes.mode, 0.5 * (cov + np.swapaxes(cov, 1, 2)), modes.found

    log_z, site_lam, site_eta, found = _few_tilted_sites(
        q, labels, latent_mean, latent_cov, cav_prec, cav_lin, power, (lam, eta), laplace_kernels
    )
    # _psd's, on these few rows without its row blocks (three classes: on Python floats,
    # the sites themselves where each is positive definite, as its Cholesky test finds)
    projected = _three_class_psd(site_lam) if q.shape[1] == 2 else None
    site_lam = _row_psd(site_lam) if projected is None else projected
    if not found.all():
        site_lam = np.where(found[:, None, None], site_lam, lam)
        site_eta = np.where(found[:, None], site_eta, eta)
    return site_lam, site_eta, log_z, found


#: Passes mixed by Anderson's acceleration in :func:`assumed_density_softmax_row`.
_REFIT_MEMORY = 5


class _VerboseSites(ArraySites):
    """The sites' array, printing each sweep as it ends (scikit-learn's verbose style)."""

    n_sweeps = 0

    def sweep(self, post, damping: float, bound: float = math.inf) -> float:
        change = super().sweep(post, damping, bound)
        self.n_sweeps += 1
        print(f"[softmax EP] sweep {self.n_sweeps}: site change {change:.3g}, damping {damping:g}")
        return change


_METHOD_NAMES = {
    "fits": "VS fits",
    "moments": "tilted moments",
    "auto": "tilted moments (VS fits if the cavities are wide)",
}


def _method(model: SoftmaxGLMPosterior, sites: str) -> str:
    """``"fits"``, ``"moments"`` or (up to :data:`MAX_FITTED_CLASSES` classes) ``"auto"``:
    chosen at the first sweep."""
    if sites not in ("auto", "fits", "moments"):
        raise ValueError(f"sites must be 'auto', 'fits' or 'moments'; got {sites!r}.")
    if sites == "auto":
        return "auto" if model.n_classes <= MAX_FITTED_CLASSES else "moments"
    return sites


def softmax_ep_cost(
    model: SoftmaxGLMPosterior,
    *,
    sites: str = "auto",
    rule: SamplingRule | None = None,
    memory: int = 5,
) -> tuple[float, float]:
    """Estimated peak bytes and multiply-adds per sweep of :func:`softmax_ep` on ``model``.

    The bytes count the sites as the sweeps hold them (current, candidate, best, the
    change's scale and residual, Anderson's ``2 · memory`` differences), the rows' latent
    and cavity moments, the dense posterior of the contrasts (two at once, where a sweep's
    posterior is weighed against the current one) and θ's covariance, and the
    largest site computation's temporaries (a block of rows, at least one row on the
    finest rule, with the VS fits' Hessian products). The work is one sweep's: the
    posterior's Gram matrices, factorization and inverse, the rows' latent moments and the
    site computations at the base rule. Both are for route choices and guards, within a
    factor of about two.

    Parameters
    ----------
    model : SoftmaxGLMPosterior
    sites : {"auto", "fits", "moments"}, default="auto"
    rule : SamplingRule, optional
    memory : int, default=5

    Returns
    -------
    nbytes : float
    work : float
    """
    method = _method(model, sites)
    m, k = model.n_observations, model.n_classes
    r, w = k - 1, model.n_features + int(model.fit_intercept)
    n_sites = m * (r * r + r)
    held = 8.0 * n_sites * (8 + 2 * memory)  # the sweeps' copies of the sites
    held += 8.0 * m * (14 * r * r + 2 * k * k + 8 * r)  # latent, cavity, new sites, eigh
    # The posterior of B (its covariance and precision, and a second one's while a sweep's
    # candidate is weighed against it: the posterior stop) and its factorization; θ's
    # covariance.
    dual = holds_dual(model)
    if dual:  # two posteriors in the dual form; B's and θ's dense covariances at the end
        held += 2 * dual_contrast_bytes(m, r) + 8.0 * (2 * (r * w) ** 2 + 3 * model.dim**2)
    else:
        held += 8.0 * (6 * (r * w) ** 2 + 3 * model.dim**2)
        held += model.kept_products_bytes()  # the rows' pair products, kept for the fit
    if method != "moments":  # "auto" may take the fits
        fit_rule = SymmetricSobol(16) if rule is None else rule
        nodes = fit_rule.n_points(r)
        n_params = (r + 1) * (r + 2) // 2
        finest = nodes * 16 if isinstance(fit_rule, SymmetricSobol) else nodes
        # One site on the finest rule: its points' arrays and the Hessian's products of
        # pairs of features (n(n + 1)/2 per node, formed whole), next to the blocks.
        one_row = 8.0 * finest * (2 * k + 2 * r + 8 + n_params * (n_params + 3) / 2)
        site_work = m * nodes * (r * k + 3 * n_params**2)
    else:
        nodes = _rule_size(rule, r)
        finest = nodes * 16 if rule is None or isinstance(rule, SymmetricSobol) else nodes
        one_row = 2 * finest * _node_bytes(k, r)
        site_work = m * nodes * (r * k + k * k + 4 * k) + m * r**3
    held += max(float(block_bytes()), one_row)
    work = (dual_contrast_work if dual else dense_contrast_work)(m, r, w) + site_work
    return held, float(work)


def check_softmax_ep_size(
    model: SoftmaxGLMPosterior,
    *,
    sites: str = "auto",
    rule: SamplingRule | None = None,
    memory: int = 5,
) -> None:
    """Raise :class:`~vsbayes.exceptions.MemoryLimitError` before the multinomial EP starts
    if its estimated peak memory (:func:`softmax_ep_cost`) exceeds the memory limit.

    Parameters
    ----------
    model : SoftmaxGLMPosterior
    sites : {"auto", "fits", "moments"}, default="auto"
    rule : SamplingRule, optional
    memory : int, default=5
    """
    check_softmax_size(model)
    method = _method(model, sites)
    nbytes, _ = softmax_ep_cost(model, sites=method, rule=rule, memory=memory)
    k, m = model.n_classes, model.n_observations
    check_memory(
        nbytes,
        f"the multinomial expectation propagation of {m} rows and {k} classes (sites of "
        f"{k - 1} × {k - 1} per row, by {_METHOD_NAMES[method]})",
        "Fit fewer rows or classes, use the Laplace approximation "
        "(LaplaceLogisticRegression), or fit one-vs-rest binary posteriors with "
        "sklearn.multiclass.OneVsRestClassifier, whose sites are one-dimensional"
        + (
            "; sites='moments' needs far less memory than VS fits."
            if method != "moments" and k > 3
            else "."
        ),
    )


#: Most rows, as a share of all, whose tilted moments stay improper at EP's end and whose
#: normalizers the evidence still takes (at least one row; see :func:`_log_evidence`).
_UNMATCHED_SHARE = 0.01


def _log_evidence(model, contrast, post, lam, eta, copies, power, rule, state) -> float:
    """EP's log evidence: each copy's site normalizer, and the Gaussian integral of the
    prior times the sites (the shift part's prior integrates to 1).

    A copy's normalizer is ``Z_i / ∫ site × cavity``; with the tilted fit's ``log Z`` over
    the unnormalized cavity ``exp(−gᵀP g/2 + hᵀg)``, the cavity's normalizer cancels and
    ``log s_i = log Z_fit − (r/2) log 2π − m_iᵀV_i⁻¹m_i/2 − log det V_i / 2``, with
    ``(m_i, V_i)`` the posterior's latent moments (cavity × site copy).

    A row whose cavity is proper but whose tilted covariance stays improper on the finest
    rule (a near-step factor over a cavity about as wide as the prior: Stein's covariance
    ``Σ − ΣHΣ`` is a difference of nearly equal terms) has kept its last matched site
    through the sweeps, which converge with it. The formula above holds for any site given
    the tilted mass ``Z_i``, which the same quadrature gives (a zeroth moment: on digits,
    within 5·10⁻³ nats of 1.6·10⁶ Monte Carlo draws where the covariance failed): the
    evidence takes it, with a first-order error in the site's distance from its match where
    EP's stationarity bounds the others' by O(tol²). Up to :data:`_UNMATCHED_SHARE` of the
    rows are so counted, with an :class:`~vsbayes.exceptions.UnreliableFitWarning`; more,
    or an improper cavity (no mass), raise. A VS fit that stays improper on the finest rule
    is counted the same way, its tilted mass the rule's own zeroth moment
    (``SiteFits.log_mass``): its fitted Gaussian's integral diverges, the target's does not.
    Raising there made the estimators fall back to the Laplace approximation, whose
    predictive on the separable data where this happens leaves its mode (digits, 60
    principal components, C = 10⁴: held-out accuracy 0.025, against EP's 0.9).
    """
    v_mean, v_cov = contrast.latent(post[0], post[1])
    cav_prec, cav_lin, ok, moments = _cavities(v_mean, v_cov, lam, eta, copies, state)
    # A row whose tilted moments come out improper here has been moved up a rule level
    # (or to the nodes' own moments) by the pass itself: it is tried again, as a sweep would.
    for _ in range(_n_levels(rule)):
        log_z, _, _, good = _sites(
            model, contrast.q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok, moments
        )
        if (ok & good).all() or state.rules is not None:
            break
    unmatched = ok & ~good & np.isfinite(log_z)
    n_unmatched = int(unmatched.sum())
    n_bad = int((~(ok & good)).sum())
    most = max(1, int(_UNMATCHED_SHARE * len(ok)))
    if n_bad > n_unmatched or n_unmatched > most:
        raise EstimationError(
            f"{n_bad} of the final expectation-propagation cavities or "
            f"tilted fits are improper (EP stopped short of a fixed point), so EP has no "
            f"evidence estimate. Increase max_iter or lower damping."
        )
    if n_unmatched:
        what = "moments" if state.rules is None else "fits"
        warn(
            f"{n_unmatched} of {len(ok)} rows' tilted {what} are improper at the end of "
            f"expectation propagation (a near-step likelihood over a wide cavity): their "
            f"sites are the last ones matched (or the start's), and the evidence takes their "
            f"tilted masses at the final cavities, an approximation to first order in the "
            f"sites' distance from their match. The posterior is EP's.",
            UnreliableFitWarning,
        )
    return _site_evidence(contrast, post, log_z, v_mean, v_cov, copies)


def _site_evidence(contrast, post, log_z, v_mean, v_cov, copies) -> float:
    """EP's log evidence from the posterior ``post`` of the sites, its rows' latent moments
    ``(v_mean, v_cov)`` and the site normalizers ``log_z`` at their cavities (see
    :func:`_log_evidence`)."""
    mean, _, half_log_det, linear, _ = post
    lower = None
    if contrast.k >= MANY_CLASSES:  # fewer classes keep their bits
        # log det V and mᵀV⁻¹m from one Cholesky factorization a row, against two LU's.
        try:
            lower = _by_rows(np.linalg.cholesky, v_cov, work=contrast.r**3 / 3.0)
        except np.linalg.LinAlgError:  # not positive definite to round-off: the LU's
            lower = None
    if lower is not None:
        log_det = 2.0 * np.log(np.diagonal(lower, axis1=1, axis2=2)).sum(axis=1)
        quad = _whitened_norms(lower, v_mean)
    else:
        _, log_det = np.linalg.slogdet(v_cov)
        quad = np.einsum("ia,ia->i", v_mean, np.linalg.solve(v_cov, v_mean[..., None])[..., 0])
    site = log_z - 0.5 * contrast.r * _LOG_2PI - 0.5 * quad - 0.5 * log_det
    gaussian = 0.5 * float(linear @ mean) - half_log_det - contrast.prior_constant
    return float(copies @ site) + gaussian
