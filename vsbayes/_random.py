"""The one entry point for randomness: ``random_state`` to a NumPy Generator."""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["DEFAULT_SEED", "as_generator", "reproducible_generator"]

#: The seed of ``random_state=None`` where a result must be reproducible: fits, and the
#: summaries computed from draws (intervals, leave-one-out, ArviZ export) are
#: deterministic by default, as LogisticRegression's fits (docs/decisions.md,
#: "Deterministic by default"); draws asked for as draws (``sample_*``) are not.
DEFAULT_SEED = 0


def as_generator(random_state=None) -> np.random.Generator:
    """Turn a scikit-learn style ``random_state`` into a :class:`numpy.random.Generator`.

    Parameters
    ----------
    random_state : None, int, numpy.random.RandomState or numpy.random.Generator
        ``None`` gives fresh OS entropy; an int seeds a new generator (same int, same
        draws); a ``RandomState`` is consumed for one seed; a ``Generator`` is used as is.

    Returns
    -------
    numpy.random.Generator
    """
    if isinstance(random_state, numbers.Integral) and random_state < 0:
        # (NumPy's own words, "expected non-negative integer", name no parameter.)
        raise ValueError(f"random_state must be a non-negative int; got {random_state!r}.")
    if random_state is None or isinstance(random_state, numbers.Integral):
        return np.random.default_rng(random_state)
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(np.iinfo(np.int32).max))
    raise ValueError(
        f"random_state must be None, an int, a RandomState or a Generator; got {random_state!r}."
    )


def reproducible_generator(random_state=None) -> np.random.Generator:
    """:func:`as_generator`, but ``None`` gives :data:`DEFAULT_SEED`'s generator: for the
    results that are deterministic by default (fits, and the summaries computed from draws).

    Parameters
    ----------
    random_state : None, int, numpy.random.RandomState or numpy.random.Generator
        As :func:`as_generator`'s, but for None.

    Returns
    -------
    numpy.random.Generator
    """
    return as_generator(DEFAULT_SEED if random_state is None else random_state)
