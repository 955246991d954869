"""The search subspace of :class:`~vsbayes.engine.vs_solver.VSSolver`: its last directions."""

from __future__ import annotations

import numpy as np

__all__ = ["Subspace"]


class Subspace:
    """The last ``size`` search directions and their values at the points (a ring buffer).

    ``directions`` and ``values`` list the stored ones in slot order, which is the order the
    subspace Newton solve sees them in.
    """

    def __init__(self, size: int, n_points: int):
        self._directions: list[np.ndarray | None] = [None] * size
        self._values = np.empty((size, n_points))
        self._count = 0

    def add(self, direction: np.ndarray, values: np.ndarray) -> None:
        """Store a direction and its values, replacing the oldest one when full."""
        slot = self._count % len(self._directions)
        self._directions[slot] = direction
        self._values[slot] = values
        self._count += 1

    @property
    def _stored(self) -> int:
        return min(self._count, len(self._directions))

    @property
    def directions(self) -> list[np.ndarray]:
        """The stored directions in θ space."""
        return self._directions[: self._stored]

    @property
    def values(self) -> np.ndarray:
        """Their values at the points, shape (k, N)."""
        return self._values[: self._stored]
