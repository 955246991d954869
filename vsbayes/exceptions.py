"""Errors and warnings raised by vsbayes.

Every numerical failure that would otherwise produce something that is not a valid
positive-definite Gaussian raises an :class:`EstimationError` subclass whose message says
what went wrong and what to change.
"""

from sklearn.exceptions import ConvergenceWarning

__all__ = [
    "ConvergenceWarning",
    "DegenerateEstimateError",
    "EstimationError",
    "MemoryLimitError",
    "NonIntegrableFitError",
    "NotPositiveDefiniteError",
    "PSISWarning",
    "TooFewSamplesError",
    "UnknownErrorWarning",
    "UnreliableFitWarning",
]


class EstimationError(RuntimeError):
    """An estimate could not be turned into a valid Gaussian."""


class NotPositiveDefiniteError(EstimationError, ValueError):
    """A covariance or precision matrix is not symmetric positive definite."""


class MemoryLimitError(ValueError):
    """A dense array the computation needs would not fit in memory.

    Raised before the allocation (instead of numpy's ``MemoryError``) when its estimated
    size exceeds ``vsbayes._memory.memory_limit()``, a fraction of physical memory. The
    message says which arrays, how large, and what to change (typically: fewer features,
    since a full posterior covariance over p coefficients takes ``8 p²`` bytes).
    """


class TooFewSamplesError(ValueError):
    """``n_samples`` is below the parameters of the Gaussian family the points determine.

    Raised by variational sampling, Bayesian Monte Carlo and importance sampling before any
    point is drawn: fewer points cannot determine the fit (VS), or resolve it (BMC's
    interpolant, whose covariance then comes out too narrow; importance sampling's weighted
    moments, too narrow even with ideal weights). ``n_samples`` and ``needed`` (the family's
    parameter count) let a caller word the remedy in its own terms (the command line names
    ``--n-samples``).
    """

    def __init__(self, message: str, n_samples: int | None = None, needed: int | None = None):
        super().__init__(message)
        self.n_samples = n_samples
        self.needed = needed


class NonIntegrableFitError(EstimationError):
    """The variational-sampling fit is an exponential quadratic with no finite integral.

    This happens when the sampled objective is minimized by a quadratic form that is not
    negative definite, typically because ``n_samples`` is too small or the sampling kernel
    is too narrow compared to the target.
    """


class DegenerateEstimateError(EstimationError):
    """A sampling estimate (VS, IS, BMC) is invalid or implausible.

    It has no valid normalizing constant or covariance, or its mean is far from the
    importance-sampling mean of the same points. Typical causes: too few effective samples
    (low ESS) or a kernel far from the target.
    """


class UnreliableFitWarning(UserWarning):
    """A valid Gaussian was returned, but its own diagnostics say it may be inaccurate.

    For example, variational sampling with fewer than 2n points interpolates the target at
    the points, so its predicted error ``kl_error`` is meaningless.
    """


class UnknownErrorWarning(UnreliableFitWarning):
    """A variational-sampling fit whose predicted error is unknown (``kl_error`` is inf):
    its own weights q/π at the points sit on fewer points than its parameters, so it
    interpolates there. The estimators' global fits record it in ``kl_error_`` and weigh
    it as they weigh any predicted error, so it is not one of their doubts."""


class PSISWarning(UnreliableFitWarning):
    """Some leave-one-out terms rest on importance weights with a heavy tail (Pareto
    k̂ > 0.7): the approximation of the posterior without those rows is unreliable."""
