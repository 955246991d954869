"""The multinomial EP's site updates at three classes (K − 1 = 2) on a few rows, in closed
form: the 2 × 2 algebra around the tilted moments (the cavities' moments and Cholesky
factors, Stein's moment matching, the direct sites, the inverses and the PSD projection of
the new sites) written out row by row on Python floats, and the tilted moments' block with
fewer and cheaper array steps.

Why a second copy of that math: a stream's one-row calls (``partial_fit``'s window) update
a handful of rows at a time, where numpy's per-call overhead on (m, 2, 2) stacks (1-9 µs a
step, whatever m) was most of a call's site update; at K − 1 = 2 the same arithmetic on
floats costs a fraction of it (docs/decisions.md, D-122 and D-127). The general code
(:mod:`~vsbayes.approximations.softmax_sites` and the modules it names) stays the
reference (the tests check these forms against it to round-off) and the fallback: the
functions here only compute, those that can meet a row outside what they handle (a matrix
not positive definite, a value not finite: the cavities, factors, inverses and PSD
projection) return None there, and their callers
(:func:`~vsbayes.approximations._softmax_tilted_moments._few_tilted_sites` and its direct
pass, the one-row update in :mod:`~vsbayes.approximations.softmax_ep`) dispatch — three
classes to these, anything else or None to the general code. The sweeps never come here
(their bits stay the general code's). The general functions the docstrings below name are
:mod:`~vsbayes.approximations._softmax_matching`'s (``_row_matched``, ``_direct``),
:mod:`~vsbayes.approximations._softmax_tilted_moments`' (``_tilted_block``…) and
:mod:`~vsbayes.approximations._softmax_cavities`' (``_row_psd``…).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ._tilted_rule import _DIRECT, _rule_nodes


def _three_class_matched(q, y, expected, second, power, cav_cov, cav_mean, cav_prec, chol):
    """:func:`_row_matched` at three classes (K − 1 = 2), row by row on Python floats: the
    same match, its 2 × 2 products, positive-definiteness tests (a Cholesky factorization's
    pivots) and solve written out. A one-row call's Stein match is of 1-6 rows, on which
    numpy's per-call cost (~30 steps of 1-9 µs) made it ~80 µs whatever the rows; the
    sweeps keep :func:`_row_matched` (their bits). Round-off apart, the same sites."""
    q00, q01, q10, q11, q20, q21 = q.ravel().tolist()
    lam_out, eta_out, fine_out, narrowed_out = [], [], [], []
    for label, s, e, sec, cov, mean, prec, low in zip(
        y.tolist(),
        power.tolist(),
        expected.tolist(),
        second.tolist(),
        cav_cov.tolist(),
        cav_mean.tolist(),
        cav_prec.tolist(),
        chol.tolist(),
        strict=True,
    ):
        e0, e1, e2 = e
        # H = s diag(E p) − (s + s²) E[p pᵀ] + s² E p E pᵀ in the contrasts, Qᵀ H Q, from
        # the symmetric second moments' Q-products; γ = s (e_y − E p) in the contrasts.
        (s00, s01, s02), (_, s11, s12), (_, _, s22) = sec
        a00 = s00 * q00 + s01 * q10 + s02 * q20  # (E[p pᵀ] Q), rows by class
        a01 = s00 * q01 + s01 * q11 + s02 * q21
        a10 = s01 * q00 + s11 * q10 + s12 * q20
        a11 = s01 * q01 + s11 * q11 + s12 * q21
        a20 = s02 * q00 + s12 * q10 + s22 * q20
        a21 = s02 * q01 + s12 * q11 + s22 * q21
        m00 = q00 * a00 + q10 * a10 + q20 * a20  # Qᵀ E[p pᵀ] Q
        m01 = q00 * a01 + q10 * a11 + q20 * a21
        m10 = q01 * a00 + q11 * a10 + q21 * a20
        m11 = q01 * a01 + q11 * a11 + q21 * a21
        d00 = e0 * q00 * q00 + e1 * q10 * q10 + e2 * q20 * q20  # Qᵀ diag(E p) Q
        d01 = e0 * q00 * q01 + e1 * q10 * q11 + e2 * q20 * q21
        d11 = e0 * q01 * q01 + e1 * q11 * q11 + e2 * q21 * q21
        u0, u1 = e0 * q00 + e1 * q10 + e2 * q20, e0 * q01 + e1 * q11 + e2 * q21  # Qᵀ E p
        both, square = s + s * s, s * s
        h00 = s * d00 - both * m00 + square * u0 * u0
        h01 = s * d01 - both * 0.5 * (m01 + m10) + square * u0 * u1
        h11 = s * d11 - both * m11 + square * u1 * u1
        grad0, grad1 = -s * u0, -s * u1
        grad0 += s * (q00, q10, q20)[label]
        grad1 += s * (q01, q11, q21)[label]
        # Lᵀ H L (the cavity's factor L lower): its Frobenius norm bounds λ_max.
        (l00, _), (l10, l11) = low
        w00 = l00 * (h00 * l00 + h01 * l10) + l10 * (h01 * l00 + h11 * l10)
        w01 = l00 * (h01 * l11) + l10 * (h11 * l11)
        w11 = l11 * h11 * l11
        settled = w00 * w00 + 2.0 * w01 * w01 + w11 * w11 < _DIRECT**2
        if not settled:
            settled = _positive_2x2(_DIRECT - w00, -w01, _DIRECT - w11)
        (p00, p01), (p10, p11) = prec
        fine = settled or _positive_2x2(p00 - h00, 0.5 * (p01 + p10) - h01, p11 - h11)
        if not fine:
            lam_out.append(((0.0, 0.0), (0.0, 0.0)))
            eta_out.append((0.0, 0.0))
            fine_out.append(False)
            narrowed_out.append(False)
            continue
        # Λ = (I − H Σ)⁻¹ H, symmetrized; η = γ + Λ μ_t, μ_t = μ + Σ γ.
        (c00, c01), (c10, c11) = cov
        b00, b01 = 1.0 - (h00 * c00 + h01 * c10), -(h00 * c01 + h01 * c11)
        b10, b11 = -(h01 * c00 + h11 * c10), 1.0 - (h01 * c01 + h11 * c11)
        det = b00 * b11 - b01 * b10
        x00, x01 = (b11 * h00 - b01 * h01) / det, (b11 * h01 - b01 * h11) / det
        x10, x11 = (b00 * h01 - b10 * h00) / det, (b00 * h11 - b10 * h01) / det
        x01 = x10 = 0.5 * (x01 + x10)
        t0 = mean[0] + c00 * grad0 + c01 * grad1
        t1 = mean[1] + c10 * grad0 + c11 * grad1
        lam_out.append(((x00, x01), (x10, x11)))
        eta_out.append((grad0 + x00 * t0 + x01 * t1, grad1 + x10 * t0 + x11 * t1))
        fine_out.append(True)
        narrowed_out.append(not settled)
    return (
        np.array(lam_out).reshape(-1, 2, 2),
        np.array(eta_out).reshape(-1, 2),
        np.array(fine_out, dtype=bool),
        np.array(narrowed_out, dtype=bool),
    )


#: The exponents' floor of :func:`_three_class_block`, above :data:`_EXP_FLOOR`: a product
#: of three floored terms (E[p pᵀ]'s p_i p_j × weight) stays above the smallest normal
#: number (e^−708.4), where a stream's wide cavities put most nodes' terms far below it
#: and the subnormal products cost a Stein block of 5 rows on 512 nodes ~40 µs of its
#: ~110. A term raised to e^−230 ≈ 10⁻¹⁰⁰ moves sums whose largest term is 1 by at most
#: the nodes' count times that: far below round-off.
_THREE_CLASS_EXP_FLOOR = -230.0


@functools.cache
def _three_class_nodes(level: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The default rule's nodes at ``level`` in 2 dimensions for :func:`_three_class_block`
    (read-only): with a unit coordinate (3, P); |z|² at both kernels' nodes (2P,); the
    signs ±1/2 of the mixture's log-density difference there (2P,); the log-weight."""
    z, log_w = _rule_nodes(None, 2, level)
    lifted = np.empty((3, len(z)))
    lifted[:2], lifted[2] = z.T, 1.0
    norms = np.einsum("pa,pa->p", z, z)
    both = np.concatenate([norms, norms])
    signs = np.concatenate([np.full(len(z), 0.5), np.full(len(z), -0.5)])
    for array in (lifted, both, signs):
        array.flags.writeable = False
    return lifted, both, signs, float(log_w[0])


def _three_class_block(q, y, kernels, power, level: int):
    """:func:`_tilted_block` at three classes (K − 1 = 2) on the default rule's ``level``,
    for :func:`_few_tilted_sites`' few rows: the same moments with fewer and cheaper array
    steps — every node's latent values, mixture nodes and whitened nodes from one GEMM of
    the rows' affine maps with the nodes, quantity-major ((3, b, nodes) values: each
    class's a contiguous (b, nodes) slice, the classes' reductions over three of them),
    the log-weights a scalar — and the exponents floored at
    :data:`_THREE_CLASS_EXP_FLOOR`. Round-off apart, the same values; the sweeps keep
    :func:`_tilted_block` (their bits)."""
    lifted, both_norms, signs, log_w = _three_class_nodes(level)
    n = lifted.shape[1]
    b = kernels[0][0].shape[0]
    if len(kernels) == 1:
        mean, chol = kernels[0][:2]
        maps = np.empty((3, b, 3))
        maps[:, :, :2] = np.swapaxes(np.matmul(q, chol), 0, 1)
        maps[:, :, 2] = q @ mean.T
        f = (maps.reshape(3 * b, 3) @ lifted).reshape(3, b, n)
    else:
        # Per kernel j, the affine maps of the unit nodes z: the latent values Q(m + L z)
        # (3 rows), the nodes m + L z (2) and their whitening under the other kernel
        # L'⁻¹(m + L z − m') (2); laid out (7, b, 2, ·), so that one GEMM gives each
        # quantity over both kernels' nodes in the sweeps' order (the first's P, then the
        # second's).
        maps = np.empty((7, b, 2, 3))
        for j, (mean, chol, _, _) in enumerate(kernels):
            other_mean, _, other_inv, _ = kernels[1 - j]
            node_map = np.empty((b, 2, 3))
            node_map[:, :, :2], node_map[:, :, 2] = chol, mean
            maps[3:5, :, j] = np.swapaxes(node_map, 0, 1)
            maps[0:3, :, j] = np.swapaxes(np.matmul(q, node_map), 0, 1)
            node_map[:, :, :2] = np.matmul(other_inv, chol)
            node_map[:, :, 2] = np.matmul(other_inv, (mean - other_mean)[:, :, None])[..., 0]
            maps[5:7, :, j] = np.swapaxes(node_map, 0, 1)
        values = (maps.reshape(14 * b, 3) @ lifted).reshape(7, b, 2 * n)
        f, g, white = values[:3], values[3:5], values[5:7]
        # d = log N₁ − log N₂ (see _mixture_nodes): ±(|white|² − |z|²)/2 + log |L₂| − log |L₁|
        d = np.square(white[0])
        d += np.square(white[1])
        d -= both_norms
        d *= signs
        d += (kernels[1][3] - kernels[0][3])[:, None]
        # log N₂ − log(N₁ + N₂) = −max(d, 0) − log(1 + e^−|d|)
        negative = np.negative(d)
        log_mixed = np.minimum(negative, 0.0)
        np.minimum(d, negative, out=d)  # −|d|
        np.maximum(d, _THREE_CLASS_EXP_FLOOR, out=d)
        log_mixed -= np.log1p(np.exp(d, out=d), out=d)
    top = np.maximum(f[0], f[1])
    np.maximum(top, f[2], out=top)
    log_ratio = f[y, np.arange(b)]
    log_ratio -= top
    f -= top
    np.maximum(f, _THREE_CLASS_EXP_FLOOR, out=f)
    np.exp(f, out=f)
    total = f[0] + f[1]
    total += f[2]
    log_ratio -= np.log(total)
    log_ratio *= power[:, None]  # s log F
    if len(kernels) > 1:
        log_ratio += log_mixed
    log_ratio += log_w
    shift = log_ratio.max(axis=1)
    log_ratio -= shift[:, None]
    np.maximum(log_ratio, _THREE_CLASS_EXP_FLOOR, out=log_ratio)
    weight = np.exp(log_ratio, out=log_ratio)
    mass = weight.sum(axis=1)
    weight /= mass[:, None]
    log_z = shift + np.log(mass)
    if len(kernels) > 1:
        g_mean = np.matmul(g.transpose(1, 0, 2), weight[:, :, None])[..., 0]  # (b, 2)
        g -= g_mean.T[:, :, None]
        weighted = g * weight
        g_cov = np.matmul(weighted.transpose(1, 0, 2), g.transpose(1, 2, 0))
        return log_z, None, None, g_mean, g_cov
    per_total = weight / total
    expected = np.matmul(f.transpose(1, 0, 2), per_total[:, :, None])[..., 0]  # E[p], (b, 3)
    per_total /= total
    scaled = f * per_total
    second = np.matmul(scaled.transpose(1, 0, 2), f.transpose(1, 2, 0))  # E[p pᵀ]
    return log_z, expected, second, None, None


def _three_class_direct(t_mean, t_cov, cav_prec, cav_lin):
    """:func:`_direct` at three classes (K − 1 = 2), row by row on Python floats: the
    tilted covariance's inverse by its adjugate where it is positive definite (its trace
    and determinant positive), instead of an eigendecomposition. Round-off apart, the same
    sites."""
    lam_out, eta_out, fine_out = [], [], []
    for (m0, m1), ((c00, _), (c10, c11)), ((p00, p01), (p10, p11)), (h0, h1) in zip(
        t_mean.tolist(), t_cov.tolist(), cav_prec.tolist(), cav_lin.tolist(), strict=True
    ):
        det = c00 * c11 - c10 * c10
        if not (c00 + c11 > 0.0 and det > 0.0):
            lam_out.append(((0.0, 0.0), (0.0, 0.0)))
            eta_out.append((0.0, 0.0))
            fine_out.append(False)
            continue
        t00, t01, t11 = c11 / det, -c10 / det, c00 / det
        lam_out.append(((t00 - p00, t01 - p01), (t01 - p10, t11 - p11)))
        eta_out.append((t00 * m0 + t01 * m1 - h0, t01 * m0 + t11 * m1 - h1))
        fine_out.append(True)
    return (
        np.array(lam_out).reshape(-1, 2, 2),
        np.array(eta_out).reshape(-1, 2),
        np.array(fine_out, dtype=bool),
    )


def _three_class_factors(cov):
    """Lower Cholesky factors (m, 2, 2) of symmetric 2 × 2 matrices (their lower
    triangles), their inverses and log |L|, on Python floats; None where one is not
    positive definite or not finite (numpy's factorization decides there)."""
    roots, inverses, log_dets = [], [], []
    for (c00, _), (c10, c11) in cov.tolist():
        if not c00 > 0.0:
            return None
        l00 = math.sqrt(c00)
        l10 = c10 / l00
        pivot = c11 - l10 * l10
        if not (pivot > 0.0 and math.isfinite(pivot + l10)):
            return None
        l11 = math.sqrt(pivot)
        roots.append(((l00, 0.0), (l10, l11)))
        inverses.append(((1.0 / l00, 0.0), (-l10 / (l00 * l11), 1.0 / l11)))
        log_dets.append(math.log(l00) + math.log(l11))
    return np.array(roots), np.array(inverses), np.array(log_dets)


def _three_class_cavities(cav_prec, cav_lin):
    """:func:`_few_tilted_sites`' cavity moments at three classes (K − 1 = 2), row by row
    on Python floats: the covariances (the precisions' inverses by their adjugates,
    symmetric), their lower Cholesky factors, the means, log |L| and the largest
    variances (closed-form eigenvalues); None where a cavity is not positive definite or
    not finite (numpy's path sorts those out). A handful of rows, where the eight numpy
    steps this replaces cost ~40 µs whatever the rows."""
    covs, roots, means, log_dets, tops = [], [], [], [], []
    for ((p00, p01), (p10, p11)), (h0, h1) in zip(cav_prec.tolist(), cav_lin.tolist(), strict=True):
        det = p00 * p11 - p01 * p10
        c00, c11 = p11 / det, p00 / det
        c01 = -0.5 * (p01 + p10) / det
        if not c00 > 0.0:
            return None
        l00 = math.sqrt(c00)
        l10 = c01 / l00
        pivot = c11 - l10 * l10
        if not (pivot > 0.0 and math.isfinite(pivot + l10 + h0 + h1)):
            return None
        l11 = math.sqrt(pivot)
        covs.append(((c00, c01), (c01, c11)))
        roots.append(((l00, 0.0), (l10, l11)))
        means.append((c00 * h0 + c01 * h1, c01 * h0 + c11 * h1))
        log_dets.append(math.log(l00) + math.log(l11))
        half = 0.5 * (c00 - c11)
        tops.append(0.5 * (c00 + c11) + math.sqrt(half * half + c01 * c01))
    return tuple(np.array(x) for x in (covs, roots, means, log_dets, tops))


def _three_class_inverses(matrices):
    """Inverses of symmetric 2 × 2 matrices (m, 2, 2) by their adjugates, exactly
    symmetric (the off-diagonal entries' mean), on Python floats; None where one is
    singular or not finite (numpy's inverse decides there)."""
    out = []
    for (a00, a01), (a10, a11) in matrices.tolist():
        det = a00 * a11 - a01 * a10
        if not (det != 0.0 and math.isfinite(det)):
            return None
        off = -0.5 * (a01 + a10) / det
        out.append(((a11 / det, off), (off, a00 / det)))
    return np.array(out).reshape(-1, 2, 2)


def _three_class_psd(lam: np.ndarray) -> np.ndarray | None:
    """:func:`_row_psd` of 2 × 2 sites (m, 2, 2) on Python floats: each row kept as it is
    where its symmetric part is positive definite (its Cholesky pivots) or has no negative
    eigenvalue, else replaced by the projection of its symmetric part on the PSD cone
    (its negative eigenvalue set to 0: the larger one's λ v vᵀ, or 0), the eigenvalues and
    vector in closed form. ``lam`` itself where no row changes; None where a value is not
    finite (numpy's projection decides there). Round-off apart, :func:`_row_psd`'s sites
    (the one-row path's: its eigendecompositions cost a call ~50 µs)."""
    rows = lam.tolist()
    changed = {}
    for i, ((a00, a01), (a10, a11)) in enumerate(rows):
        off = 0.5 * (a01 + a10)
        if _positive_2x2(a00, off, a11):
            continue
        if not math.isfinite(a00 + off + a11):
            return None
        mean, half = 0.5 * (a00 + a11), 0.5 * (a00 - a11)
        radius = math.hypot(half, off)
        if mean - radius >= 0.0:  # positive semidefinite: kept, as numpy's eigenvalues
            continue
        top = mean + radius
        if top <= 0.0:
            changed[i] = ((0.0, 0.0), (0.0, 0.0))
            continue
        angle = 0.5 * math.atan2(off, half)  # the larger eigenvalue's eigenvector
        c, s = math.cos(angle), math.sin(angle)
        changed[i] = ((top * c * c, top * c * s), (top * c * s, top * s * s))
    if not changed:
        return lam
    out = lam.copy()
    for i, block in changed.items():
        out[i] = block
    return out


def _positive_2x2(a00: float, a01: float, a11: float) -> bool:
    """Whether the symmetric 2 × 2 matrix is positive definite: its Cholesky factorization's
    pivots (NaN fails, as LAPACK's)."""
    return a00 > 0.0 and a11 - a01 * a01 / a00 > 0.0
