"""Result objects of the engine fitters: Gaussians carrying their diagnostics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gaussian import Gaussian

__all__ = [
    "BMCResult",
    "DiagnosedGaussian",
    "ISResult",
    "LaplaceResult",
    "RoundInfo",
    "VSResult",
]


@dataclass(frozen=True)
class RoundInfo:
    """What happened in one sampling round.

    Attributes
    ----------
    kernel : Gaussian
        Kernel the round's points were drawn from.
    n_samples : int
        Number of points drawn in the round.
    n_iter : int
        Solver iterations of the fit at the end of the round (0 for IS).
    fitted : bool
        False when the round's fit failed (then the next round reuses ``kernel``).
    """

    kernel: Gaussian
    n_samples: int
    n_iter: int
    fitted: bool


class DiagnosedGaussian(Gaussian):
    """A Gaussian estimate with method diagnostics given as keyword arguments."""

    _diagnostics: tuple[str, ...] = ()

    def __init__(self, mean, cov, log_Z, **diagnostics):
        super().__init__(mean, cov, log_Z)
        missing = set(self._diagnostics) - set(diagnostics)
        if missing:
            raise TypeError(f"missing diagnostics: {sorted(missing)}")
        for name, value in diagnostics.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        # Scalars only: per-round records and per-observation arrays would flood the repr.
        shown = ", ".join(
            f"{k}={getattr(self, k)!r}" for k in self._diagnostics if np.ndim(getattr(self, k)) == 0
        )
        return f"{type(self).__name__}(dim={self.dim}, log_Z={self.log_Z:.6g}, {shown})"


class VSResult(DiagnosedGaussian):
    """Variational-sampling fit ``q = exp(log_Z) N(mean, cov)``.

    Attributes
    ----------
    n_iter : int
        Solver iterations of the final fit.
    converged : bool
        Whether the stopping rule was met within ``max_iter``.
    kl_error : float
        Predicted excess KL of the fit, ``tr(Σ H⁻¹) / (2N)`` per unit mass (paper,
        Proposition 2), estimated from the sample; exact for iid Monte Carlo, conservative
        for QMC.
    decrement : float
        Half the squared Newton decrement per unit mass at the last iterate: the
        optimization error, in the same units as ``kl_error``.
    objective : float
        Sampled generalized KL divergence ``D(p̄ || q̄)`` per unit mass: how far the target
        is from Gaussian at the sample points.
    ess : float
        Effective sample size of the importance weights ``p/π``.
    n_samples : int
        Number of target evaluations.
    family : str
        ``"gaussian"`` or ``"diagonal"``.
    rounds : list of RoundInfo
        Per-round record when kernel adaptation is used.
    """

    _diagnostics = (
        "n_iter",
        "converged",
        "kl_error",
        "decrement",
        "objective",
        "ess",
        "n_samples",
        "family",
        "rounds",
    )


class ISResult(DiagnosedGaussian):
    """Importance-sampling estimate.

    Attributes
    ----------
    ess : float
        Effective sample size ``(Σ w)² / Σ w²``.
    n_samples : int
        Number of target evaluations.
    rounds : list of RoundInfo
        Per-round record.
    """

    _diagnostics = ("ess", "n_samples", "rounds")


class BMCResult(DiagnosedGaussian):
    """Bayesian Monte Carlo estimate.

    Attributes
    ----------
    length_scale : float
        Correlation length of the GP, in kernel-whitened units.
    n_samples : int
        Number of target evaluations.
    rounds : list of RoundInfo
        The single sampling round.
    """

    _diagnostics = ("length_scale", "n_samples", "rounds")


class LaplaceResult(DiagnosedGaussian):
    """Laplace approximation around the mode.

    Attributes
    ----------
    n_iter : int
        Optimizer iterations.
    converged : bool
        Optimizer success flag.
    grad_norm : float
        Euclidean norm of the gradient of ``log p`` at the returned mode.
    log_density_at_mode : float
        ``log p`` at the mode.
    """

    _diagnostics = ("n_iter", "converged", "grad_norm", "log_density_at_mode")
