"""The methods of the command line: which estimator each name and link means, and a timed fit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .._choices import METHODS, SAMPLING_METHODS
from .._warnings import catch
from ..estimators import METHODS as _REGISTRY
from ..estimators import BayesianGLMClassifier, estimator_class

__all__ = [
    "DETERMINISTIC",
    "METHOD_TITLES",
    "SAMPLING",
    "TimedFit",
    "make_estimator",
    "timed_fit",
]

# The names the parser offers (vsbayes._choices; tests/test_registry.py checks them against
# the estimators' registry, vsbayes.estimators.METHODS).
#: Methods whose cost is set by ``n_samples`` (posterior evaluations at random points).
SAMPLING = SAMPLING_METHODS
#: Methods without randomness or a sample size.
DETERMINISTIC = tuple(key for key in METHODS if key not in SAMPLING)
METHOD_TITLES = {key: method.title for key, method in _REGISTRY.items()}


def make_estimator(
    method: str,
    link: str,
    *,
    C: float = 1.0,
    n_samples: int | str = "auto",
    seed: int = 0,
    **options,
) -> BayesianGLMClassifier:
    """An unfitted estimator; ``n_samples`` only reaches the sampling methods.

    Parameters
    ----------
    method, link : str
        See :func:`estimator_class`.
    C : float, default=1.0
        Prior variance of the coefficients.
    n_samples : int or "auto", default="auto"
        Posterior evaluations of the sampling methods; ignored by the others.
    seed : int, default=0
        ``random_state`` of the estimator.
    **options
        Further estimator parameters (e.g. ``rounds`` for VS).

    Returns
    -------
    BayesianGLMClassifier
    """
    params = {"C": C, "random_state": seed, **options}
    if method in SAMPLING:
        params["n_samples"] = n_samples
    return estimator_class(method, link)(**params)


@dataclass
class TimedFit:
    """A fitted estimator, the wall time of its ``fit`` and the warnings it raised."""

    estimator: BayesianGLMClassifier
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def fell_back(self) -> list[bool]:
        """Per problem, whether the method fell back to the Laplace approximation."""
        fallback = getattr(self.estimator, "laplace_fallback_", None)
        n_problems = len(self.estimator.posteriors_)
        return [False] * n_problems if fallback is None else [bool(f) for f in fallback]


def timed_fit(estimator: BayesianGLMClassifier, X: np.ndarray, y: np.ndarray) -> TimedFit:
    """Fit ``estimator``, timing the call and collecting its warnings as one-line texts.

    Warnings are recorded rather than shown so that the command line can print each once,
    as a single line, whatever the process's warning filters (e.g. pytest's).
    """
    with catch(("always", Warning), record=True) as caught:
        start = time.perf_counter()
        estimator.fit(X, y)
        seconds = time.perf_counter() - start
    messages: list[str] = []
    for warning in caught:
        text = f"{warning.category.__name__}: {' '.join(str(warning.message).split())}"
        if text not in messages:
            messages.append(text)
    return TimedFit(estimator, seconds, messages)
