"""Quadratic forms of a binary GLM's signed design ``A`` (dense or CSR), without densifying it:
the diagonal of ``Aᵀ diag(τ) A`` here, and the rows' ``a_iᵀ Σ a_i``, re-exported from their
home with the other latent moments, :func:`vsbayes.models.latent.row_variances`."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..models import BinaryGLMPosterior
from ..models.latent import row_variances

__all__ = ["precision_diagonal", "row_variances"]


def precision_diagonal(model: BinaryGLMPosterior, tau: np.ndarray) -> np.ndarray:
    """The diagonal of ``H = diag(1/prior_var) + Aᵀ diag(τ) A``, without forming H.

    Parameters
    ----------
    model : BinaryGLMPosterior
        The model giving ``A`` and ``prior_var``.
    tau : ndarray of shape (M,)
        Site precisions.

    Returns
    -------
    ndarray of shape (p,)
    """
    design = model.design
    if sp.issparse(design):
        squares = np.asarray(design.multiply(design).T @ tau).ravel()
    else:
        squares = np.einsum("ij,ij,i->j", design, design, tau)  # no (M, p) temporary
    return squares + 1.0 / model.prior_var
