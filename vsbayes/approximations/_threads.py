"""BLAS threads of the GLM approximations (Newton, EP, VB): one, as every fit; and the
multinomial EP's per-row steps on row slices side by side (:func:`_by_rows`), each slice
on one BLAS thread."""

from __future__ import annotations

import numpy as np

from .._blas import block_slices, map_blocks, one_blas_thread, single_blas_thread

__all__ = ["blas_policy"]

#: Run ``func(model, ...)`` on one BLAS thread, its blocks side by side (see
#: :mod:`vsbayes._blas`).
blas_policy = one_blas_thread


def _by_rows(func, *arrays, work: float = 1.0, min_work: float = 2**23):
    """``func(*arrays)`` for functions of each row alone (batched small factorizations and
    products of (M, r, r) stacks), run on consecutive row slices by :func:`map_blocks`:
    outside the tilted moments' blocks these per-row steps were the sweep's serial part.
    The same bits as one call (each row's LAPACK call and products are the same);
    ``work`` is the multiply-adds per row, ``min_work`` a slice's least. Returns the
    slices' outputs concatenated (a tuple of arrays if ``func`` returns one)."""
    m = len(arrays[0])
    slices = block_slices(m, work, None, min_work)
    if len(slices) == 1:
        return func(*arrays)
    # The outputs' shapes from the function on no rows; each slice writes its part in its
    # own thread: concatenating the parts afterwards copied every (M, r, r) output once
    # more on one thread (8 % of the fit at 26 classes × 5000 rows).
    empty = func(*(a[:0] for a in arrays))
    single = not isinstance(empty, tuple)
    outputs = tuple(np.empty((m, *e.shape[1:]), e.dtype) for e in ((empty,) if single else empty))

    def run(rows: slice) -> None:
        parts = func(*(a[rows] for a in arrays))
        for out, part in zip(outputs, (parts,) if single else parts, strict=True):
            out[rows] = part

    with single_blas_thread():
        map_blocks(run, slices)
    return outputs[0] if single else outputs
