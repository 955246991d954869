"""Index arrays of a matrix's upper triangle, built once per shape.

``numpy.triu_indices`` builds an n × n mask per call (tens of microseconds); expectation
propagation's site fits ask for the same few small triangles at every sweep.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["triu_indices"]


# Triangles up to this size are kept (at most 64 of them, 0.5 MB each).
_CACHED_N = 128


def triu_indices(n: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.triu_indices(n, offset)``, read-only; cached for small n."""
    if n > _CACHED_N:
        return np.triu_indices(n, offset)
    return _cached(n, offset)


@lru_cache(maxsize=64)
def _cached(n: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.triu_indices(n, offset)
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols
