"""Objects built from the row chunks of dask arrays, kept where they were built.

A :class:`DaskChunks` builds one object per row chunk (e.g. the in-memory posterior of the
chunk's rows) and keeps it there: on the workers of a ``distributed`` cluster when a
client is active, else in this process (dask's local scheduler). Its :meth:`~DaskChunks.map`
calls one method of every chunk's object with shared arguments, on the worker holding the
chunk, and returns the results in chunk order: only the arguments (parameter vectors) and
the results (vectors and small matrices) travel, never the rows. Warnings raised in a chunk
are recorded there and raised again here, once each.

dask is an optional dependency: it is imported only when a dask array is passed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import numpy as np

from .._sums import CompensatedSum
from .._warnings import catch, warn

__all__ = ["DaskChunks", "is_dask", "is_dask_array", "is_dask_frame"]

# Arguments of a pass sent with every chunk's task when all their copies stay below this.
_INLINE_BYTES = 2**20


def is_dask_array(x) -> bool:
    """Whether ``x`` is a dask array (without importing dask)."""
    return type(x).__module__.startswith("dask.array") and hasattr(x, "to_delayed")


def is_dask_frame(x) -> bool:
    """Whether ``x`` is a dask DataFrame or Series (without importing dask)."""
    return type(x).__module__.startswith("dask.dataframe") and hasattr(x, "to_dask_array")


def is_dask(x) -> bool:
    """Whether ``x`` is a dask array, DataFrame or Series."""
    return is_dask_array(x) or is_dask_frame(x)


def _active_client():
    """The ``distributed`` client dask computes with, or None (local scheduler)."""
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:  # no client
        return None


def _recorded(function: Callable, *args):
    """``(function(*args), warnings)``: the warnings as (category, text) pairs, picklable."""
    with catch(("always", Warning), record=True) as caught:
        result = function(*args)
    return result, [(w.category, str(w.message)) for w in caught]


class _Held:
    """A chunk's object and the warnings its building raised."""

    def __init__(self, build: Callable, *blocks):
        self.item, self.caught = _recorded(build, *blocks)

    def __sizeof__(self) -> int:
        # dask weighs where to run a task by the bytes of its inputs (dask.sizeof falls
        # back to sys.getsizeof): the chunk's object must say what it holds.
        return object.__sizeof__(self) + sys.getsizeof(self.item)


def _caught(held: _Held):
    return held.caught


def _call(held: _Held, what: str | Callable, *args):
    """``chunk.what(*args)`` for a method name, else ``what(chunk, *args)``."""
    if isinstance(what, str):
        return _recorded(getattr(held.item, what), *args)
    return _recorded(what, held.item, *args)


def _relay(caught: Sequence[tuple[type[Warning], str]], seen: set) -> None:
    for category, text in caught:
        if (category, text) not in seen:
            seen.add((category, text))
            warn(f"{text} (raised on a dask worker)", category)


class DaskChunks:
    """One object per row chunk of dask arrays, built and kept where the chunk is.

    Parameters
    ----------
    build : callable
        ``build(*blocks)`` → the chunk's object, given the chunk's block of each array. A
        module-level function (it is pickled to the workers).
    arrays : sequence of dask arrays
        Chunked by rows alike (one chunk along any other axis).

    Attributes
    ----------
    n_chunks : int
        Number of row chunks.
    bytes_sent, bytes_received : int
        Bytes of the arguments shipped to the cluster (once if scattered, else with each
        chunk's task) and of the results gathered back, summed over the calls of
        :meth:`map` (with a ``distributed`` client; the rows themselves never travel).
    """

    def __init__(self, build: Callable, arrays: Sequence):
        import dask

        blocks = [np.asarray(a.to_delayed(), dtype=object).reshape(-1) for a in arrays]
        tasks = [dask.delayed(_Held)(build, *parts) for parts in zip(*blocks, strict=True)]
        self.n_chunks = len(tasks)
        self.bytes_sent = self.bytes_received = 0
        self._client = _active_client()
        if self._client is None:
            self._items = list(dask.compute(*tasks, scheduler="threads"))
            caught = [held.caught for held in self._items]
        else:
            from distributed import wait

            # Futures: the objects stay on the workers that built them.
            self._items = self._client.compute(tasks)
            wait(self._items)
            caught = self._client.gather(self._submit_all(_caught))
        seen: set = set()
        for each in caught:
            _relay(each, seen)

    def _submit_all(self, function: Callable, *args) -> list:
        """``function(chunk, *args)`` for every chunk, on the worker holding it.

        Strictly there: a task allowed elsewhere can be stolen by an idle worker, which
        then fetches the whole chunk (measured: 44 MB for one pass). A chunk whose worker
        is gone is rebuilt by dask from its lineage wherever it can (no restriction).
        """
        holders = self._client.who_has(self._items)
        futures = []
        for item in self._items:
            where = list(holders.get(item.key, ()))
            futures.append(
                self._client.submit(function, item, *args, workers=where or None, pure=False)
            )
        return futures

    def map(self, what: str | Callable, *args) -> list:
        """``[chunk.what(*args) for chunk in chunks]`` for a method's name, else
        ``[what(chunk, *args) …]`` (a module-level function, which may keep state in the
        chunk's object), each run where its chunk is."""
        seen: set = set()
        if self._client is None:
            pairs = [_call(held, what, *args) for held in self._items]
        else:
            client = self._client
            # Large arrays (the N points) travel once to the cluster, the workers sharing
            # them; small ones (θ, a p × p matrix) with each task, saving a round trip.
            shared = []
            for a in args:
                nbytes = getattr(a, "nbytes", 0)
                if isinstance(a, np.ndarray) and nbytes * self.n_chunks > _INLINE_BYTES:
                    shared.append(client.scatter(a, hash=False))
                    self.bytes_sent += nbytes
                else:
                    shared.append(a)
                    self.bytes_sent += nbytes * self.n_chunks
            pairs = client.gather(self._submit_all(_call, what, *shared))
        out = []
        for result, caught in pairs:
            _relay(caught, seen)
            out.append(result)
        if self._client is not None:
            self.bytes_received += sum(_nbytes(r) for r in out)
        return out

    def sum(self, what: str | Callable, *args):
        """The compensated sum, in chunk order, of :meth:`map`'s results (numbers, arrays
        or tuples of them): the same bits whatever the workers, and to a few ulps the sum
        of any other grouping of the rows (:mod:`vsbayes._sums`)."""
        results = self.map(what, *args)
        single = not isinstance(results[0], tuple)
        columns = [[r] for r in results] if single else results
        totals = []
        for terms in zip(*columns, strict=True):
            total = CompensatedSum(np.shape(terms[0]))
            for term in terms:
                total.add(term)
            value = total.result()
            totals.append(value.item() if np.ndim(terms[0]) == 0 else value)
        return totals[0] if single else tuple(totals)

    def release(self) -> None:
        """Free the chunks' objects (on the workers)."""
        self._items = []


def _nbytes(result) -> int:
    if isinstance(result, tuple):
        return sum(_nbytes(r) for r in result)
    return int(getattr(result, "nbytes", 8))
