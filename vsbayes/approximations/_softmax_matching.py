"""The multinomial EP's moment matching: the site whose product with a row's cavity has
the tilted density's mean and covariance.

From the tilted expectations of the softmax on the cavity's nodes by Stein's identities
(:func:`_matched`, :func:`_row_matched`: the tilted mean and covariance as the cavity's
moved by the expected gradient and Hessian of the factor, with the test of whether the
factor narrows the cavity so much that the row should take its nodes' own moments), or
from the nodes' own tilted mean and covariance (:func:`_direct`). Read by the tilted
moments' passes (:mod:`~vsbayes.approximations._softmax_tilted_moments`); the VS site
fits match their fitted moments themselves
(:func:`~vsbayes.approximations._softmax_site_fits._vs_sites`), and the three-class closed
forms of the same match are in :mod:`~vsbayes.approximations._three_class_sites`. Moved
out of :mod:`~vsbayes.approximations.softmax_sites` unchanged.
"""

from __future__ import annotations

import numpy as np

from ._softmax_cavities import _natural, _near_identity_solve, _row_positive_definite
from ._threads import _by_rows
from ._tilted_rule import _DIRECT, _many_classes


def _matched(q, y, expected, second, power, cav_cov, cav_mean, cav_prec, chol):
    """:func:`_row_matched` on row slices run side by side (``cav_prec`` None: the cavities'
    precisions are the inverses of ``cav_cov``, taken where needed)."""
    if cav_prec is None:
        return _by_rows(
            lambda *rows: _row_matched(q, *rows[:-1], None, rows[-1]),
            y,
            expected,
            second,
            power,
            cav_cov,
            cav_mean,
            chol,
            work=4.0 * q.shape[1] ** 3,
        )
    return _by_rows(
        lambda *rows: _row_matched(q, *rows),
        y,
        expected,
        second,
        power,
        cav_cov,
        cav_mean,
        cav_prec,
        chol,
        work=4.0 * q.shape[1] ** 3,
    )


def _row_matched(q, y, expected, second, power, cav_cov, cav_mean, cav_prec, chol):
    """The site (precision, linear term) whose product with the cavity has the tilted
    density's mean and covariance, from the tilted expectations of the softmax (Stein's
    identities, see the module docstring), whether the tilted covariance is proper, and
    whether the factor narrows the cavity by more than :data:`_DIRECT` of a variance in some
    direction (``chol``: the cavity covariance's lower Cholesky factor)."""
    m, k = expected.shape
    s = power[:, None]
    residual = -s * expected
    residual[np.arange(m), y] += power  # γ = E[∇ log F^s] in the latent values: s (e_y − E p)
    # E[∇∇ F^s / F^s] = s² E[(e_y − p)(e_y − p)ᵀ] − s E[diag p − p pᵀ], and the tilted
    # covariance is Σ − Σ H Σ with H = γγᵀ − that. The label's terms cancel between γγᵀ and
    # the first expectation: H = s diag(E p) − (s + s²) E[p pᵀ] + s² E p E pᵀ.
    h_latent = (-(s + s * s))[..., None] * second
    h_latent[:, np.arange(k), np.arange(k)] += s * expected
    scaled = s * expected
    h_latent += scaled[:, :, None] * scaled[:, None, :]
    grad = residual @ q  # (m, r)
    hess = q.T @ h_latent @ q
    hess = 0.5 * (hess + np.swapaxes(hess, 1, 2))
    # Where the factor narrows the cavity much (a step over a wide cavity), the Stein form's
    # covariance Σ − ΣHΣ is a difference of nearly equal terms. The factor's largest
    # reduction of a cavity variance is λ_max(Lᵀ H L), LLᵀ = Σ; below _DIRECT (_DIRECT·I −
    # Lᵀ H L positive definite) the tilted covariance Σ − ΣHΣ = L (I − LᵀHL) Lᵀ is proper too.
    eye = np.eye(q.shape[1])
    many = _many_classes(q.shape[1])
    if many:
        # |LᵀHL|²_F = tr((HΣ)²): from H Σ, which the site's series solve takes, without
        # LᵀHL on every row (round-off apart; fewer classes keep their bits).
        shrink = hess @ cav_cov
        norms = np.einsum("mab,mba->m", shrink, shrink)
    else:
        whitened = np.swapaxes(chol, 1, 2) @ hess @ chol
        norms = np.einsum("mab,mab->m", whitened, whitened)
    # λ_max ≤ the Frobenius norm: rows within _DIRECT by the norm are settled without a
    # factorization (every row at 20-26 classes, norms 0.04 in the median).
    settled = norms < _DIRECT**2
    if not settled.all():
        if many:
            lower = chol[~settled]
            whitened = np.swapaxes(lower, 1, 2) @ hess[~settled] @ lower
        else:
            whitened = whitened[~settled]
        settled[~settled] = _row_positive_definite(_DIRECT * eye - whitened)
    # Otherwise: proper tilted covariance ⇔ P − H positive definite.
    fine = settled.copy()
    if not settled.all():
        if cav_prec is None:
            precision, _ = _natural(None, None, cav_cov, cav_mean, ~settled)
        else:
            precision = cav_prec[~settled]
        fine[~settled] = _row_positive_definite(precision - hess[~settled])
    every = bool(fine.all())  # the usual case: no copies to zero the other rows
    if not every:
        hess = np.where(fine[:, None, None], hess, 0.0)
    # The site precision (H⁻¹ − Σ)⁻¹ = (I − H Σ)⁻¹ H, and its linear term γ + Λ μ_t with
    # the tilted mean μ_t = Σ (h + γ).
    if many:
        # H Σ is similar to Lᵀ H L: its spectral radius is at most the latter's Frobenius
        # norm (the zeroed rows' H Σ is 0).
        if every:
            bound = np.sqrt(norms)
        else:
            bound = np.where(fine, np.sqrt(norms), 0.0)
            shrink = np.where(fine[:, None, None], shrink, 0.0)
        lam = _near_identity_solve(shrink, hess, bound)
    else:
        lam = np.linalg.solve(eye - hess @ cav_cov, hess)
    lam += np.swapaxes(lam, 1, 2)  # (overlapping operands: NumPy buffers them)
    lam *= 0.5
    t_mean = cav_mean + np.einsum("mab,mb->ma", cav_cov, grad)
    eta = grad + np.einsum("mab,mb->ma", lam, t_mean)
    if not every:
        eta = np.where(fine[:, None], eta, 0.0)
    return lam, eta, fine, fine & ~settled


def _direct(t_mean, t_cov, cav_prec, cav_lin):
    """The site from the tilted mean and covariance of the nodes, and whether it is proper."""
    eigval, eigvec = np.linalg.eigh(t_cov)
    fine = eigval[:, 0] > 0
    eigval = np.where(fine[:, None], eigval, 1.0)
    t_prec = (eigvec / eigval[:, None, :]) @ np.swapaxes(eigvec, 1, 2)
    lam = t_prec - cav_prec
    eta = np.einsum("mab,mb->ma", t_prec, t_mean) - cav_lin
    return np.where(fine[:, None, None], lam, 0.0), np.where(fine[:, None], eta, 0.0), fine
