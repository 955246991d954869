"""The multinomial EP's site updates: each row's Gaussian site on its K − 1 contrasts
``g_i = Qᵀ f_i`` from its cavity and tilted density, all rows at once.

What a sweep of :func:`~vsbayes.approximations.softmax_ep.softmax_ep` asks of the rows
(:func:`_new_sites`, :func:`_sites`; the method is described in
:mod:`~vsbayes.approximations.softmax_ep`, which holds the posterior of the contrasts, the
sweep loop, the one-row update, the sizing and the evidence): the rows' states
(:class:`_RowState`: the method, and per row its rule level and whether it is wide, narrow
or direct), the choice of ``sites="auto"`` between the two methods (:func:`_wide_rows`),
one undamped sweep's new sites (:func:`_new_sites`), and the Laplace sites the sweeps
start from (:func:`_laplace_sites`). Also used by the leave-one-out refits
(:mod:`~vsbayes.approximations.ep_leave_one_out`).

The pieces a sweep is made of live in their own modules, by what a reader looks for:

- :mod:`~vsbayes.approximations._softmax_cavities`: the cavities (their natural
  parameters, or from 17 classes on their moments from one solve a row) and the checks
  and projections on the positive (semi-)definite cone;
- :mod:`~vsbayes.approximations._softmax_tilted_moments`: the tilted moments by
  self-normalized quadrature on mirrored Sobol nodes (:func:`_tilted_sites`, and
  :func:`_few_tilted_sites` for a stream's few rows), with the per-row rule levels;
- :mod:`~vsbayes.approximations._softmax_matching`: the moment matching of those
  expectations into sites (Stein's identities, or the nodes' own moments);
- :mod:`~vsbayes.approximations._softmax_site_fits`: the tilted moments by VS fits on the
  sampling rules (:func:`_vs_sites`);
- :mod:`~vsbayes.approximations._tilted_rule` (the rules' nodes and levels, and from how
  many classes on the sweeps change their route: ``_many_classes``),
  :mod:`~vsbayes.approximations._three_class_sites` (the few rows' closed forms at three
  classes) and :mod:`~vsbayes.approximations._threads` (``_by_rows``: the per-row steps
  on row slices side by side).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..sampling import SamplingRule
from ._softmax_cavities import _cavity, _cavity_moments_of, _psd
from ._softmax_site_fits import _CHORD_TOL, _vs_sites
from ._softmax_tilted_moments import _WIDE_CAVITY, _tilted_sites
from ._threads import _by_rows

__all__ = ["MAX_FITTED_CLASSES"]


class _RowState:
    """How the sites are found: ``rules`` for VS fits (None: tilted moments), and per row
    the rule level and whether it takes the nodes' own moments — raised, never lowered, so
    that the sweep stays one fixed map once the rows have settled; put back with the best
    sites where the sweeps go back to those (:meth:`set_levels`)."""

    def __init__(
        self,
        m: int,
        rules: list[SamplingRule] | None = None,
        pending: list[SamplingRule] | None = None,
    ):
        self.rules = rules
        # sites="auto": the VS fits' rules, taken at the first sweep if the rows are wide.
        self.pending = pending
        self.level = np.zeros(m, dtype=int)
        self.direct = np.zeros(m, dtype=bool)
        # Rows of level 0 on a quarter of its nodes (narrow cavities, _spread_levels); cleared,
        # never set again, where such a row's moments come out improper or it goes direct.
        self.coarse = np.zeros(m, dtype=bool)
        # The cavities' moments from one solve (_row_cavity_moments), without their natural
        # parameters: the tilted moments' sweeps with many classes (_many_classes; never the
        # VS fits, which read them).
        self.fused = False
        self.sized = False  # the tilted moments' levels not yet set from the rows' spread
        # Whether rows with wide cavities start finer (_WIDE_CAVITY); False (EP as the
        # kernel of VS's global fit): every row starts on level 0 and goes finer only as the
        # sweeps find it needs to (improper moments, a direct row).
        self.spread = True
        # The tilted blocks' values in float32 (_values_dtype): set by softmax_ep where its
        # tolerance is far above their rounding; never the leave-one-out refits' states.
        self.single = False
        # The VS fits' chord stop (_chord_tol): set by softmax_ep from its tolerance.
        self.chord_tol = _CHORD_TOL
        # The VS fits' targets in float32 (_FIT_SINGLE_TOL): set by softmax_ep.
        self.fit_single = False

    def levels(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A copy of the rows' rule levels and their direct and coarse flags: the sweep's
        map as the rows have raised it (saved with the best sites, ``ArraySites``'
        ``state``)."""
        return self.level.copy(), self.direct.copy(), self.coarse.copy()

    def set_levels(self, saved: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Put back levels from :meth:`levels`: the map of the sites they were saved with."""
        self.level[...], self.direct[...], self.coarse[...] = saved


#: Most classes for which ``sites="auto"`` takes VS fits where more than ``_WIDE_SHARE`` of
#: the rows' cavities are wider than the second of ``_WIDE_CAVITY`` (digits: the median
#: row's largest variance 22, up to 2·10³): there the factors are steps over the cavities'
#: nodes, whose weighted moments came out singular on a few rows even on 16 times the
#: nodes, where a quadratic fit on the VS rule stays proper.
MAX_FITTED_CLASSES = 10
_WIDE_SHARE = 0.1


def _wide_rows(widest: np.ndarray) -> bool:
    """Whether ``sites="auto"`` takes VS fits for rows whose cavities' largest variances
    are ``widest`` (up to :data:`MAX_FITTED_CLASSES` classes)."""
    return bool(widest.size) and float(np.mean(widest > _WIDE_CAVITY[-1])) > _WIDE_SHARE


def _sites(
    model, q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok, moments=None, refine=True
):
    """Every row's new site for one copy of its factor: ``(log Z, Λ, η, found)`` by the
    method of ``state`` (:func:`_vs_sites` or :func:`_tilted_sites`; with ``sites="auto"``
    chosen here, at the first sweep, once). ``moments``: the cavities' moments from
    :func:`_cavity_moments_of` (then ``cav_prec`` and ``cav_lin`` are None: tilted moments
    only). ``refine`` False: the VS fits' rows on their own levels only, none refitted on a
    finer rule nor raised (:func:`_site_fits`)."""
    if state.pending is not None:
        if _wide_rows(1.0 / np.linalg.eigvalsh(cav_prec[ok])[:, 0]):
            state.rules = state.pending
        state.pending = None
    if state.rules is not None:
        return _vs_sites(
            model,
            q,
            v_mean,
            v_cov,
            cav_prec,
            cav_lin,
            power,
            state.rules,
            state.level,
            ok,
            state.chord_tol,
            state.fit_single,
            refine,
        )
    return _tilted_sites(
        model, q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state, ok, moments
    )


def _laplace_sites(model, q, start) -> tuple[np.ndarray, np.ndarray]:
    """The factors' second-order expansions at ``start`` in g = Qᵀf: (Λ, η) per row."""
    _, p = model.probabilities(np.asarray(start, dtype=float))
    s = model.sample_weight[:, None]
    residual = -s * p
    residual[np.arange(len(p)), model.y] += model.sample_weight

    def curvatures(p, s):
        # s (diag p − p pᵀ), the diagonal added to the outer products' negatives (the same
        # bits as the difference of the two matrices, without their einsum on the
        # identity), in the contrasts.
        curvature = s[..., None] * (p[:, :, None] * p[:, None, :])
        np.negative(curvature, out=curvature)
        diagonal = np.arange(p.shape[1])
        curvature[:, diagonal, diagonal] += s * p
        return q.T @ curvature @ q

    # On row slices side by side (the same bits): a serial pass of the (M, K, K)
    # curvatures cost the many-class fits as much as a tenth of a sweep.
    k = p.shape[1]
    lam = _by_rows(curvatures, p, s, work=2.0 * k**3)
    W, b = model.split(start)
    g = (np.asarray(model.X @ W.T) + b) @ q
    return lam, np.einsum("iab,ib->ia", lam, g) + residual @ q


def _new_sites(model, contrast, post, lam, eta, power, rule, state, record=None, bound=math.inf):
    """One undamped sweep: every site moment-matched to its tilted density (PSD-projected);
    a row whose cavity or tilted covariance is improper keeps its site.

    ``bound``: the undamped relative change above which the sweeps discard this one
    (``_damped_sweeps._discard_bound``). The VS fits' rows are fitted on their own rule
    levels first, and those improper there are refitted on finer rules (and raised) only
    where the sites found so far change by at most ``bound``: above it the refits could
    only add to a change already past it (they keep their sites; the change is then that
    lower bound). A diverged sweep's refits were 24.8 of its 28 s on digits at C = 10⁴.

    ``record`` (a dict), if given, receives what EP's evidence at the sites the sweep
    started from needs (``evidence``: :func:`_site_evidence`'s arguments), where that
    evidence is the one the final pass would compute at them: every row's cavity and tilted
    density proper, and no row's rule level or method moved by the sweep (else None)."""
    copies = np.maximum(model.sample_weight, 1.0)
    v_mean, v_cov = contrast.latent(post[0], post[1])
    cav_prec, cav_lin, ok, moments = _cavities(v_mean, v_cov, lam, eta, copies, state)
    before = (state.level.copy(), state.direct.copy(), state.rules, state.coarse.copy())
    args = (model, contrast.q, v_mean, v_cov, cav_prec, cav_lin, power, rule, state)
    bounded = state.rules is not None and bound < math.inf
    log_z, site_lam, site_eta, good = _sites(*args, ok, moments, refine=not bounded)
    if bounded:
        left = ok & ~good & (state.level + 1 < len(state.rules))  # rows a finer rule may fit
        if left.any() and _change(lam, eta, site_lam, site_eta, ok & good, copies) <= bound:
            state.level[left] += 1
            again = _sites(*args, left, moments)
            log_z, site_lam, site_eta = (
                np.where(left.reshape(-1, *[1] * (a.ndim - 1)), b, a)
                for a, b in zip((log_z, site_lam, site_eta), again[:3], strict=True)
            )
            good = np.where(left, again[3], good)
    ok &= good
    if record is not None:
        settled = (
            bool(ok.all())
            and before[2] is state.rules
            and np.array_equal(before[0], state.level)
            and np.array_equal(before[1], state.direct)
            and np.array_equal(before[3], state.coarse)
        )
        record["evidence"] = (post, log_z, v_mean, v_cov) if settled else None
    if ok.all() and np.all(copies == 1.0):  # the usual case: the new sites themselves
        return _psd(site_lam), site_eta
    new_lam = np.where(ok[:, None, None], copies[:, None, None] * site_lam, lam)
    new_eta = np.where(ok[:, None], copies[:, None] * site_eta, eta)
    return _psd(new_lam), new_eta


def _change(lam, eta, site_lam, site_eta, rows, copies) -> float:
    """The largest relative change ``|Δ| / (1 + |site|)`` of the sites of ``rows`` (a
    mask) from ``(lam, eta)`` to their new sites ``copies × (site_lam, site_eta)``
    (PSD-projected), as the sweeps measure it; 0 for no rows."""
    if not rows.any():
        return 0.0
    c = copies[rows]
    old_lam, old_eta = lam[rows], eta[rows]
    new_lam = _psd(c[:, None, None] * site_lam[rows])
    return max(
        float(np.max(np.abs(new_lam - old_lam) / (1.0 + np.abs(old_lam)))),
        float(np.max(np.abs(c[:, None] * site_eta[rows] - old_eta) / (1.0 + np.abs(old_eta)))),
    )


def _cavities(v_mean, v_cov, lam, eta, copies, state):
    """``(cav_prec, cav_lin, ok, moments)`` for :func:`_sites`: the cavities' natural
    parameters, or (``state.fused``) their moments alone."""
    if state.fused:
        *moments, ok = _cavity_moments_of(v_mean, v_cov, lam, eta, copies)
        return None, None, ok, tuple(moments)
    return (*_cavity(v_mean, v_cov, lam, eta, copies), None)


class _OneRow(NamedTuple):
    """What :func:`_sites` reads of a model: the rows' labels."""

    y: np.ndarray
