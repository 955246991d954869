"""Result objects of the engine fitters: Gaussians carrying their diagnostics."""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import ClassVar

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
    draw_seconds : float
        Time spent drawing the round's points and evaluating the target there.
    fit_seconds : float
        Time of the round's fit (of all points pooled so far).
    """

    kernel: Gaussian
    n_samples: int
    n_iter: int
    fitted: bool
    draw_seconds: float = 0.0
    fit_seconds: float = 0.0


class DiagnosedGaussian(Gaussian):
    """A Gaussian estimate with its method's diagnostics, as declared read-only fields.

    A subclass declares its diagnostics as class annotations (``n_iter: int``), in order,
    and documents them under "Attributes". The constructor takes exactly those as keyword
    arguments (a missing or unknown one is a TypeError), so a result is complete when built;
    like the mean and covariance they are read-only afterwards (:meth:`replace` makes a
    changed copy). :meth:`diagnostics` returns them by name.

    Parameters
    ----------
    mean, cov, log_Z
        As for :class:`~vsbayes.Gaussian`.
    **diagnostics
        One keyword argument per declared diagnostic.

    Attributes
    ----------
    diagnostic_names : tuple of str
        The declared diagnostics, in declaration order (a class attribute).
    """

    diagnostic_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            if issubclass(klass, DiagnosedGaussian) and klass is not DiagnosedGaussian:
                names += [
                    name
                    for name, annotation in inspect.get_annotations(klass).items()
                    if not name.startswith("_")
                    and "ClassVar" not in str(annotation)
                    and name not in names
                ]
        cls.diagnostic_names = tuple(names)

    def __init__(self, mean, cov, log_Z, **diagnostics):
        super().__init__(mean, cov, log_Z)
        self._check_names(diagnostics, complete=True)
        for name in self.diagnostic_names:
            object.__setattr__(self, name, diagnostics[name])

    def _check_names(self, given, complete: bool) -> None:
        declared = set(self.diagnostic_names)
        unknown = set(given) - declared
        if unknown:
            raise TypeError(
                f"{type(self).__name__} has no diagnostics {sorted(unknown)}; it declares "
                f"{list(self.diagnostic_names)}."
            )
        missing = declared - set(given) if complete else set()
        if missing:
            raise TypeError(f"{type(self).__name__}: missing diagnostics {sorted(missing)}.")

    def __setattr__(self, name, value):
        if name in self.diagnostic_names:
            raise AttributeError(
                f"{type(self).__name__}.{name} is read-only; use replace({name}=...) for a "
                f"changed copy."
            )
        super().__setattr__(name, value)

    def diagnostics(self) -> dict[str, object]:
        """The diagnostics by name, in declaration order.

        Returns
        -------
        dict
            Name to value, for every name in ``diagnostic_names`` (per-round records and
            arrays included).
        """
        return {name: getattr(self, name) for name in self.diagnostic_names}

    def replace(self, **diagnostics):
        """A copy with the given diagnostics changed (the read-only Gaussian is shared).

        Parameters
        ----------
        **diagnostics
            New values of some declared diagnostics.

        Returns
        -------
        DiagnosedGaussian
            Of the same class.
        """
        self._check_names(diagnostics, complete=False)
        changed = copy.copy(self)
        for name, value in diagnostics.items():
            object.__setattr__(changed, name, value)
        return changed

    def __repr__(self) -> str:
        # Scalars only: per-round records and per-observation arrays would flood the repr;
        # floats to 4 digits, as a reader compares them (verbose=1 prints this repr, where
        # "decrement=0.00014888825311503142" hid the figure in its round-off).
        shown = ", ".join(
            f"{k}={_short(v)}" for k, v in self.diagnostics().items() if np.ndim(v) == 0
        )
        return f"{type(self).__name__}(dim={self.dim}, log_Z={self.log_Z:.6g}, {shown})"


def _short(value) -> str:
    """A diagnostic's value in a repr: a float (numpy's too) to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, (float, np.floating)) else repr(value)


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
        Proposition 2), estimated from the sample's residuals and corrected for their
        in-sample optimism by generalized cross-validation's ``(1 - n/ESS)⁻²`` (ESS of the
        fit's weights) while n ≤ ESS/2, beyond by each point's leverage in the sampled
        Hessian (up to a budget of N n² multiply-adds; past it, as before: infinite when
        n ≥ ESS); conservative for QMC.
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
    stop_reason : str or None
        Why sampling stopped: ``"n_samples"`` (the points asked for), ``"target_kl"`` (the
        predicted error met ``target_kl``), ``"max_samples"``, ``"time_budget"``,
        ``"stalled"`` (an added round raised no effective sample size ``ess``: its kernel
        sees less of the target than the pool's did; the fit before it is kept where it
        predicts a smaller error), or ``"failed"`` (an added round's fit failed; the
        previous fit is kept).
    """

    n_iter: int
    converged: bool
    kl_error: float
    decrement: float
    objective: float
    ess: float
    n_samples: int
    family: str
    rounds: list[RoundInfo] | None
    stop_reason: str | None


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

    ess: float
    n_samples: int
    rounds: list[RoundInfo] | None


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

    length_scale: float
    n_samples: int
    rounds: list[RoundInfo] | None


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

    n_iter: int
    converged: bool
    grad_norm: float
    log_density_at_mode: float
