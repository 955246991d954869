"""The diagonal of a binary GLM's ``Aᵀ diag(τ) A`` (dense or CSR ``A``), without densifying it.

The rows' ``a_iᵀ Σ a_i`` live with the other latent moments in :mod:`vsbayes.models.latent`."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..models import BinaryGLMPosterior

__all__ = ["precision_diagonal"]


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
