"""Argument checks shared by the engine fitters."""

from __future__ import annotations

import numbers

from ..exceptions import TooFewSamplesError
from ..gaussian import Gaussian


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ValueError."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}.")
    return int(value)


def check_kernel(kernel) -> Gaussian:
    """Return ``kernel`` if it is a :class:`~vsbayes.gaussian.Gaussian`, else raise TypeError."""
    if not isinstance(kernel, Gaussian):
        raise TypeError(
            f"kernel must be a vsbayes.Gaussian (e.g. a Laplace approximation); got {type(kernel)}."
        )
    return kernel


def check_positive(value, name: str) -> float:
    """Return ``value`` as a float if it is a finite positive number, else raise ValueError."""
    if not isinstance(value, numbers.Real) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive number; got {value!r}.")
    return float(value)


def check_enough_samples(
    n_samples: int, n_params: int, dim: int, family: str, why: str, advice: str
) -> None:
    """Raise :class:`~vsbayes.exceptions.TooFewSamplesError` if ``n_samples`` is below the
    ``n_params`` parameters of the Gaussian ``family`` in dimension ``dim``: the one rule of
    VS, BMC and importance sampling for an undersized sample (``why``: what fewer points do
    to the fit; ``advice``: the method's typical sizes and further options, after the
    floor)."""
    if n_samples < n_params:
        raise TooFewSamplesError(
            f"n_samples={n_samples} is fewer than the n={n_params} parameters of the "
            f"{family!r} family in dimension {dim}: {why}. Use n_samples >= {n_params} "
            f"{advice}.",
            n_samples,
            n_params,
        )
