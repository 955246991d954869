"""Whether a flat prior gives a proper posterior: the likelihood must not be maximal at infinity.

Under a flat prior the posterior is the normalized likelihood, which is integrable exactly
when the maximum-likelihood estimate exists: the classes are not (quasi-)separated by a
hyperplane (Albert & Anderson 1984) and no direction of the coefficients leaves every row's
latent value unchanged (the design has full column rank). Separation is the feasibility of
a linear program (Konis 2007): find β in the box [-1, 1]^p with every row's margin
``z_i·β ≥ 0`` and the sum of margins largest; a positive optimum is a separating direction.
For K classes the margins are ``(w_{y_i} − w_k)·x_i`` for every other class k.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .glm import BinaryGLMPosterior
from .softmax import SoftmaxGLMPosterior

__all__ = ["check_flat_prior_is_proper", "separates_at"]


def separates_at(model, theta: np.ndarray) -> bool:
    """Whether the coefficients ``theta`` classify every row of ``model`` (its rows of
    positive weight) strictly right: then a hyperplane separates the classes, and the
    posterior is one-sided along it, reaching as far as the prior lets it.

    Answered for the binary and multinomial models with their rows in memory; any other
    model (dask chunks) answers False.
    """
    theta = np.asarray(theta, dtype=float)
    if type(model) is BinaryGLMPosterior:  # its signed rows: y_i f_i = design @ θ
        return bool(np.all(np.asarray(model.design @ theta) > 0))
    if type(model) is SoftmaxGLMPosterior:
        W, b = model.split(theta)
        scores = np.asarray(model.X @ W.T) + b
        rows = np.arange(len(scores))
        own = scores[rows, model.y].copy()
        scores[rows, model.y] = -np.inf
        return bool(np.all(own > scores.max(axis=1)))
    return False


def check_flat_prior_is_proper(X, y_index, sample_weight, n_classes: int, fit_intercept: bool):
    """Raise a ValueError naming the remedy if the posterior under a flat prior is improper.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (M, d)
    y_index : ndarray of int, shape (M,)
        Class indices in ``0 … n_classes - 1``.
    sample_weight : ndarray of shape (M,)
        Rows with weight 0 are left out (they are not in the likelihood).
    n_classes : int
    fit_intercept : bool
    """
    keep = np.asarray(sample_weight) > 0
    X = X[keep] if not keep.all() else X
    y_index = np.asarray(y_index)[keep]
    rows = sp.csr_matrix(X, dtype=float) if sp.issparse(X) else np.asarray(X, dtype=float)
    if fit_intercept:
        ones = np.ones((rows.shape[0], 1))
        rows = (
            sp.hstack([rows, ones], format="csr") if sp.issparse(rows) else np.hstack([rows, ones])
        )
    rows = _unit_columns(rows)
    m, p = rows.shape
    remedy = (
        "Use a proper prior instead: penalty='l2' with a finite C (the evidence-based C of "
        "EmpiricalBayesClassifier, for instance)."
    )
    if p > m:
        raise ValueError(
            f"With penalty=None (a flat prior) the posterior is improper: {p} coefficients "
            f"for {m} rows leave directions the likelihood does not see. {remedy}"
        )
    rank = _column_rank(rows)
    if rank < p:
        raise ValueError(
            f"With penalty=None (a flat prior) the posterior is improper: the design's "
            f"columns{' and the intercept' if fit_intercept else ''} have rank {rank} < {p} "
            f"(collinear columns, or a constant one beside the intercept). {remedy}"
        )
    margins = _margins(rows, y_index, n_classes)
    n_vars = margins.shape[1]
    result = linprog(
        -np.asarray(margins.sum(axis=0)).ravel(),
        A_ub=-margins,
        b_ub=np.zeros(margins.shape[0]),
        bounds=[(-1.0, 1.0)] * n_vars,
        method="highs",
    )
    scale = float(abs(margins).sum()) if sp.issparse(margins) else float(np.abs(margins).sum())
    if result.status == 0 and -result.fun > 1e-9 * max(scale, 1.0):
        raise ValueError(
            "With penalty=None (a flat prior) the posterior is improper: the classes are "
            "separated (or quasi-separated) by a hyperplane, so the likelihood grows without "
            f"bound along it and no maximum-likelihood estimate exists. {remedy}"
        )


def _unit_columns(rows):
    """``rows`` with each non-zero column scaled to unit norm: neither the rank nor
    separation depends on the columns' scales, and the numerical tests (a rank of the Gram
    matrix, whose condition number is the design's squared; the program's box of
    coefficients) would take a column on a scale 10⁻⁸ of the others for a zero one."""
    if sp.issparse(rows):
        norms = np.sqrt(np.asarray(rows.multiply(rows).sum(axis=0)).ravel())
        scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        return (rows @ sp.diags(scale)).tocsr()
    norms = np.linalg.norm(rows, axis=0)
    return rows * np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)


def _column_rank(rows) -> int:
    """Numerical column rank (of the Gram matrix: p × p, p ≤ M here)."""
    gram = (rows.T @ rows).toarray() if sp.issparse(rows) else rows.T @ rows
    return int(np.linalg.matrix_rank(np.asarray(gram), hermitian=True))


def _margins(rows, y_index, n_classes: int):
    """The rows' margins as a matrix acting on the stacked coefficients: (M, p) signed rows
    for two classes, (M (K − 1), K p) rows ``e_{y_i} ⊗ x_i − e_k ⊗ x_i`` beyond."""
    if n_classes == 2:
        signs = np.where(y_index == 1, 1.0, -1.0)
        return rows.multiply(signs[:, None]).tocsr() if sp.issparse(rows) else rows * signs[:, None]
    p = rows.shape[1]
    rows = sp.csr_matrix(rows)
    others = np.array([[k for k in range(n_classes) if k != y] for y in range(n_classes)])
    blocks = []
    for step in range(n_classes - 1):
        other = others[y_index, step]
        # Row i: +x_i in the block of class y_i, −x_i in the block of class `other`.
        plus = _place(rows, y_index, n_classes, p)
        minus = _place(rows, other, n_classes, p)
        blocks.append(plus - minus)
    return sp.vstack(blocks, format="csr")


def _place(rows: sp.csr_matrix, classes: np.ndarray, n_classes: int, p: int) -> sp.csr_matrix:
    """Each row i of ``rows`` moved to the columns of class ``classes[i]``'s block."""
    coo = rows.tocoo()
    return sp.csr_matrix(
        (coo.data, (coo.row, coo.col + p * classes[coo.row])), shape=(rows.shape[0], n_classes * p)
    )
