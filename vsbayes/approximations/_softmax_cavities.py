"""The multinomial EP's cavities and the positive (semi-)definite cone of its sites.

A reader looking for how a sweep removes each row's site from the posterior of its K − 1
contrasts finds it here: the cavities' natural parameters (:func:`_cavity`), their moments
from them (:func:`_cavity_moments`), or from 17 classes on from the latent moments with
one solve a row (:func:`_cavity_moments_of`, by the series of
:func:`_near_identity_solve`, which Stein's moment matching solves with too), the
whitened norms of their means, and the cavities' precisions back from their moments
(:func:`_natural`). The positive-definiteness checks (:func:`_positive_definite`) and
the projection of the new sites' precisions on the positive semi-definite cone
(:func:`_psd`) are here too: they are the same batched factorizations of the rows' r × r
matrices, read by the sweeps, the one-row update and the leave-one-out refits. Moved out
of :mod:`~vsbayes.approximations.softmax_sites` unchanged.
"""

from __future__ import annotations

import numpy as np

from ._threads import _by_rows
from ._tilted_rule import _many_classes


def _cavity(v_mean, v_cov, lam, eta, copies):
    """Cavity natural parameters of one copy of each factor, and whether they are proper."""
    r = v_mean.shape[1]
    return _by_rows(_row_cavity, v_mean, v_cov, lam, eta, copies, work=4.0 * r**3)


def _row_cavity(v_mean, v_cov, lam, eta, copies):
    v_prec = np.linalg.inv(v_cov)
    v_prec = 0.5 * (v_prec + np.swapaxes(v_prec, 1, 2))
    c = copies[:, None, None]
    cav_prec = v_prec - lam / c
    cav_lin = np.einsum("iab,ib->ia", v_prec, v_mean) - eta / copies[:, None]
    ok = _positive_definite(cav_prec)
    return cav_prec, cav_lin, ok


def _cavity_moments(cav_prec, cav_lin, ok):
    """Covariance, mean, lower Cholesky factor and log |L| of each cavity (the identity's
    where the cavity is improper, ``ok`` False)."""
    r = cav_prec.shape[1]
    if ok.all():  # the usual case: no copies of the rows in and out
        cav_cov = np.linalg.inv(cav_prec)
    else:
        cav_cov = np.broadcast_to(np.eye(r), cav_prec.shape).copy()
        cav_cov[ok] = np.linalg.inv(cav_prec[ok])
    cav_cov = 0.5 * (cav_cov + np.swapaxes(cav_cov, 1, 2))
    cav_mean = np.einsum("mab,mb->ma", cav_cov, cav_lin)
    chol = np.linalg.cholesky(cav_cov)
    log_det_half = np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
    return cav_cov, cav_mean, chol, log_det_half


def _natural(cav_prec, cav_lin, cav_cov, cav_mean, rows):
    """The cavities' precisions and linear terms at ``rows``: given, or from their moments."""
    if cav_prec is not None:
        return cav_prec[rows], cav_lin[rows]
    precision = np.linalg.inv(cav_cov[rows])
    precision = 0.5 * (precision + np.swapaxes(precision, 1, 2))
    return precision, np.einsum("mab,mb->ma", precision, cav_mean[rows])


def _whitened_norms(chol: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``|L⁻¹ b|²`` of each row's vector b and lower triangular L: forward substitution
    over the r columns, each step on every row of a slice at once, the slices side by side
    (the same bits: a serial pass of r numpy steps over all rows was ~1 % of a 26-class
    fit, four times a fit)."""
    r = vectors.shape[1]
    return _by_rows(_row_whitened_norms, chol, vectors, work=float(r**3))


def _row_whitened_norms(chol: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    white = np.empty_like(vectors)
    for j in range(vectors.shape[1]):
        done = np.einsum("ma,ma->m", chol[:, j, :j], white[:, :j])
        white[:, j] = (vectors[:, j] - done) / chol[:, j, j]
    return np.einsum("ma,ma->m", white, white)


def _cavity_moments_of(v_mean, v_cov, lam, eta, copies):
    """:func:`_row_cavity_moments` on row slices run side by side."""
    r = v_mean.shape[1]
    return _by_rows(_row_cavity_moments, v_mean, v_cov, lam, eta, copies, work=4.0 * r**3)


def _row_cavity_moments(v_mean, v_cov, lam, eta, copies):
    """Covariance, mean, lower Cholesky factor and log |L| of each cavity, and whether it is
    proper (the identity's where not), from the latent moments (m, V) and the sites without
    the cavities' natural parameters: with ``P = V⁻¹ − Λ/c = V⁻¹(I − VΛ/c)``, the covariance
    ``(I − VΛ/c)⁻¹ V`` and the mean ``(I − VΛ/c)⁻¹ (m − Vη/c)``, one solve where
    :func:`_row_cavity` and :func:`_cavity_moments` take two inverses and a factorization
    more."""
    m, r = v_mean.shape
    shrink = np.matmul(v_cov, lam)  # VΛ/c: the site's share of the row's latent precision
    shrink /= copies[:, None, None]
    rhs = np.empty((m, r, r + 1))
    rhs[:, :, :r] = v_cov
    rhs[:, :, r] = v_mean - np.matmul(v_cov, eta[..., None])[..., 0] / copies[:, None]
    try:
        # VΛ/c is similar to the symmetric R ᵀΛR/c (V = RRᵀ): its spectral radius is at
        # most √tr((VΛ/c)²).
        bound = np.sqrt(np.einsum("mab,mba->m", shrink, shrink))
        solved = _near_identity_solve(shrink, rhs, bound)
    except np.linalg.LinAlgError:  # a singular system (an improper cavity): the two inverses
        cav_prec, cav_lin, ok = _row_cavity(v_mean, v_cov, lam, eta, copies)
        return (*_cavity_moments(cav_prec, cav_lin, ok), ok)
    cav_cov = solved[:, :, :r]
    cav_cov = 0.5 * (cav_cov + np.swapaxes(cav_cov, 1, 2))
    cav_mean = np.ascontiguousarray(solved[:, :, r])
    try:
        chol = np.linalg.cholesky(cav_cov)
        ok = np.ones(m, dtype=bool)
    except np.linalg.LinAlgError:
        finite = np.isfinite(cav_cov).all(axis=(1, 2))
        ok = finite.copy()
        ok[finite] = np.linalg.eigvalsh(cav_cov[finite])[:, 0] > 0
        cav_cov[~ok] = np.eye(r)
        cav_mean[~ok] = 0.0
        chol = np.linalg.cholesky(cav_cov)
    log_det_half = np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
    return cav_cov, cav_mean, chol, log_det_half, ok


#: Largest bound on the spectral radius of E for which :func:`_near_identity_solve` takes
#: the series (six factors at most); beyond it an LU solve, whose cost is about that of 14
#: batched products of the rows' r × r matrices.
_SERIES_BOUND = 0.5
#: Relative truncation error of the series: round-off (the unit round-off of float64).
_SERIES_EPS = 2.0**-52


def _series_factors(bound: np.ndarray) -> np.ndarray:
    """Factors k of :func:`_near_identity_solve`'s product for spectral radii at most
    ``bound`` (< :data:`_SERIES_BOUND`): the least with ``bound^(2^k) ≤ ε (1 − bound)``,
    the truncation's relative error."""
    b = np.clip(bound, 1e-300, _SERIES_BOUND)
    ratio = np.log(_SERIES_EPS * (1.0 - b)) / np.log(b)
    return np.maximum(np.ceil(np.log2(np.maximum(ratio, 1.0))), 1).astype(int)


def _near_identity_solve(e: np.ndarray, rhs: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """``(I − E)⁻¹ X`` for each row's E (M, r, r) and X (M, r, n), given a bound on E's
    spectral radius (M,): by the product ``(I + E)(I + E²)(I + E⁴)…`` of batched matrix
    products where the bound is below :data:`_SERIES_BOUND`, to the unit round-off; else
    by an LU solve (which raises ``LinAlgError`` where I − E is singular).

    The many-class sweeps' two solves a row (the cavity's, ``VΛ/c``, and the site's,
    ``HΣ``) are of this kind, with radii of 0.04 in the median and 0.2 at most at 20-26
    classes: numpy's batched LU solve of a 19 × 19 system with 19 right-hand sides costs
    as much as ~14 batched products of 19 × 19 matrices, the series 7-9 of them. Each
    row's series takes its own number of factors; its round-off is that of the products,
    which the LU solve's is not bitwise."""
    r = e.shape[1]
    series = bound < _SERIES_BOUND  # (NaN: the LU solve)
    if not series.any():
        return np.linalg.solve(np.eye(r) - e, rhs)
    if series.all():
        at, x, power = slice(None), rhs.copy(), e
        out = x
    else:
        out = np.empty_like(rhs)
        lu = np.flatnonzero(~series)
        out[lu] = np.linalg.solve(np.eye(r) - e[lu], rhs[lu])
        at = np.flatnonzero(series)
        x, power = rhs[at], e[at]
    need = _series_factors(bound[at])
    active = None  # positions in x of the rows that need the next factor (None: all)
    for factor in range(int(need.max())):
        if factor:
            keep = need > factor if active is None else need[active] > factor
            if not keep.all():
                active = np.flatnonzero(keep) if active is None else active[keep]
                power = power[keep]
            power = power @ power
        if active is None:
            x += power @ x
        else:
            x[active] += power @ x[active]
    if out is not x:
        out[at] = x
    return out


def _positive_definite(matrices: np.ndarray) -> np.ndarray:
    """Whether each symmetric matrix (M, r, r) is positive definite.

    One batched Cholesky factorization where all are (the sweeps' usual case: ~20 times
    cheaper than eigenvalues, r = 19); the smallest eigenvalues only where some is not.
    """
    r = matrices.shape[1]
    return _by_rows(_row_positive_definite, matrices, work=r**3 / 3, min_work=_CHECK_WORK)


#: Least multiply-adds of a slice of the batched positive-definiteness checks: a Cholesky
#: factorization of 2000 matrices 19 × 19 (r³/3 ≈ 2300 multiply-adds each) took
#: 4.3 ms in one slice and 2.4 ms in four on the 2 cores, where _by_rows' usual floor kept
#: it in one.
_CHECK_WORK = 2**21


def _row_positive_definite(matrices: np.ndarray) -> np.ndarray:
    try:
        np.linalg.cholesky(matrices)
    except np.linalg.LinAlgError:
        return np.linalg.eigvalsh(matrices)[:, 0] > 0
    return np.ones(len(matrices), dtype=bool)


def _psd(lam: np.ndarray) -> np.ndarray:
    """Each symmetric matrix's projection on the positive semi-definite cone (``lam``
    itself where every matrix is positive definite)."""
    r = lam.shape[1]
    work = r**3 / 3
    if not _many_classes(r) and len(lam) * work <= _CHECK_WORK:
        # One slice's check, where the VS fits' sites fail it on nearly every row
        # (_row_psd): then the eigendecompositions are the work, and sized by it they run
        # on row slices side by side (each row's own decomposition: the same bits), where
        # the check's work kept digits' 1797 rows in one serial slice (12 ms, twice a sweep).
        # Only the rows that fail a per-row test (_definite_rows) are decomposed: the new
        # sites of digits' VS fits fail it on 80-99 % of the rows, but their Anderson
        # extrapolations on 0 to 1771 of its 1797 (16 in the median, 8 of 10 below 210),
        # where the batched check, failing for one row, had every row decomposed (D-213).
        symmetric = _symmetric(lam)
        rows = np.flatnonzero(~_definite_rows(symmetric))
        if not rows.size:
            return lam
        out = lam.copy()
        out[rows] = _by_rows(
            _decomposed_psd, lam[rows], work=_EIGEN_WORK * r**3, min_work=_CHECK_WORK
        )
        return out
    return _by_rows(_row_psd, lam, work=work, min_work=_CHECK_WORK)


def _definite_rows(symmetric: np.ndarray) -> np.ndarray:
    """Whether each symmetric matrix (M, r, r) is positive definite: the pivots of its
    Cholesky factorization without square roots (``A = L D Lᵀ``), all rows at once, one
    column at a time (r steps of products over the rows, ~0.4 ms for 1797 rows at r = 9,
    where their eigenvalues take 6 ms; numpy's batched Cholesky fails all rows for one).
    A row is definite where every pivot is positive: the same rows as the eigenvalues'
    sign, but for matrices within round-off of singular."""
    m, r = symmetric.shape[:2]
    lower = np.zeros((m, r, r))
    pivot = np.empty((m, r))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for j in range(r):
            scaled = lower[:, j, :j] * pivot[:, :j]  # (m, j): L_jk d_k
            pivot[:, j] = symmetric[:, j, j] - np.einsum("mk,mk->m", scaled, lower[:, j, :j])
            below = np.einsum("mik,mk->mi", lower[:, j + 1 :, :j], scaled)
            lower[:, j + 1 :, j] = (symmetric[:, j + 1 :, j] - below) / pivot[:, j, None]
    return (pivot > 0).all(axis=1)


#: A batched symmetric eigendecomposition's work per matrix over r³, in the units of
#: :data:`_CHECK_WORK` (the 19 × 19 factorizations: ~1 ns a multiply-add): 6.7 µs a
#: 9 × 9 matrix, ~9 r³ (small matrices are mostly LAPACK's per-call overhead).
_EIGEN_WORK = 9.0


def _symmetric(lam: np.ndarray) -> np.ndarray:
    symmetric = lam + np.swapaxes(lam, 1, 2)
    symmetric *= 0.5
    return symmetric


def _symmetric_definite(lam: np.ndarray) -> bool:
    """Whether every matrix's symmetric part has a Cholesky factor (one batched call)."""
    try:
        np.linalg.cholesky(_symmetric(lam))
    except np.linalg.LinAlgError:
        return False
    return True


def _row_psd(lam: np.ndarray) -> np.ndarray:
    # One batched Cholesky factorization clears the usual case of the many-class sweeps.
    if _symmetric_definite(lam):
        return lam
    return _decomposed_psd(lam)


def _decomposed_psd(lam: np.ndarray) -> np.ndarray:
    # The rows with a negative eigenvalue are rebuilt from their eigendecompositions, and
    # the others keep their sites as they are (not their round-off reconstruction). From
    # 17 classes on a few rows fail the check: their eigenvalues find them, and they alone
    # are decomposed. With fewer, the VS fits' sites come out slightly indefinite on nearly
    # every row (digits): the slice's eigendecompositions at once, without the eigenvalues
    # first, which doubled the projection's cost.
    symmetric = _symmetric(lam)
    if _many_classes(lam.shape[1]):
        rows = np.flatnonzero(np.linalg.eigvalsh(symmetric)[:, 0] < 0)
        eigval, eigvec = np.linalg.eigh(symmetric[rows])
    else:
        eigval, eigvec = np.linalg.eigh(symmetric)
        rows = np.flatnonzero(eigval[:, 0] < 0)
        eigval, eigvec = eigval[rows], eigvec[rows]
    if not rows.size:
        return lam
    out = lam.copy()
    out[rows] = (eigvec * np.maximum(eigval, 0.0)[:, None, :]) @ np.swapaxes(eigvec, 1, 2)
    return out
