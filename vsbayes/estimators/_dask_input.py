"""Dask arrays (and DataFrames) as training and prediction data, used chunk by chunk.

The rows of a dask array are never gathered in this process: the checks of ``fit`` (shape,
numeric dtype, finiteness, the classes, the weights) are reductions computed where the
chunks are, in one ``dask.compute``; the labels and weights the model needs stay lazy
arrays chunked like X; prediction maps the fitted estimator over X's chunks and returns a
lazy dask array.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.utils.multiclass import type_of_target

from .._memory import carried_config, get_config
from ..models.dask_chunks import is_dask_frame

__all__ = [
    "NEGATIVE_SAMPLE_WEIGHT",
    "OVERFLOWING_FEATURES",
    "chunkwise_prediction",
    "class_weighted",
    "reindexed",
    "validate_dask_fit_data",
]

#: The refusal of a negative sample weight, in memory and in dask chunks (scikit-learn's
#: opening words, which its callers may match, then why and what to do).
NEGATIVE_SAMPLE_WEIGHT = (
    "Negative values in data passed to sample_weight: a row's weight is the power of its "
    "likelihood, and a negative one turns the likelihood into its reciprocal, which gives no "
    "posterior. Give every row a weight >= 0 (a weight of 0 leaves the row out)."
)


#: The refusal of an X whose largest magnitude squared overflows float64 (~1e154), in memory
#: and in dask chunks (``.format(largest=...)``): the likelihood's curvature cannot be
#: formed, and every route failed further on with messages about its own internals.
OVERFLOWING_FEATURES = (
    "X has values up to {largest:.3g} in magnitude, whose squares overflow float64: the "
    "likelihood's curvature cannot be formed. Rescale X, e.g. with "
    "sklearn.preprocessing.StandardScaler in a pipeline."
)


def _block_largest(block) -> np.ndarray:
    """A block's largest magnitude (inf if it holds NaN or infinity), as a 1 × 1 block."""
    values = block.data if sp.issparse(block) else np.asarray(block)
    if not np.isfinite(values).all():
        return np.array([[np.inf]])
    largest = max(float(values.max()), -float(values.min())) if values.size else 0.0
    return np.array([[largest]])


def _as_float(block):
    return block.astype(np.float64) if block.dtype != np.float64 else block


def _as_array(X):
    """A dask DataFrame or Series as a dask array (its partitions' lengths computed), with
    its column names (None for anything else). A frame's columns of pandas' nullable
    numbers (Int64, Float64, boolean) become float64, missing values NaN, as scikit-learn
    makes them in memory: ``to_dask_array`` would make them objects, refused as text."""
    if not is_dask_frame(X):
        return X, None
    names = getattr(X, "columns", None)
    if names is not None and X.ndim == 2:  # (a dask Series has columns too)
        from pandas.api.types import is_extension_array_dtype, is_numeric_dtype

        nullable = {
            column: np.float64
            for column, dtype in X.dtypes.items()
            if is_extension_array_dtype(dtype) and is_numeric_dtype(dtype)
        }
        if nullable:
            X = X.astype(nullable)
    return X.to_dask_array(lengths=True), None if names is None else np.asarray(names)


def _rows_like(values, X, name: str):
    """``values`` (dask or in-memory, 1-D) as a dask array chunked like X's rows."""
    import dask.array as da

    values, _ = _as_array(values)
    if not hasattr(values, "to_delayed"):
        values = np.asarray(values)
        if values.ndim == 2 and values.shape[1] == 1:
            values = values.ravel()
        if values.ndim != 1:  # (before dask's message on chunks, which names neither)
            raise ValueError(f"{name} must be 1-dimensional; got shape {values.shape}.")
        if values.shape[0] != X.shape[0]:
            raise ValueError(
                f"X has {X.shape[0]} rows but {name} has {values.shape[0]}; they must match."
            )
        values = da.from_array(values, chunks=(X.chunks[0],))
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional; got shape {values.shape}.")
    if any(np.isnan(c) for c in values.chunks[0]):  # masked as X was: sizes, as for X
        values = values.compute_chunk_sizes()
    if values.shape[0] != X.shape[0]:
        raise ValueError(
            f"X has {X.shape[0]} rows but {name} has {values.shape[0]}; they must match."
        )
    return values.rechunk((X.chunks[0],))


def _check_dask_X(estimator, X):
    """X with known row chunks, one column chunk and float64 blocks (lazily)."""
    if X.ndim != 2:
        raise ValueError(
            f"Expected a 2-dimensional dask array for X; got {X.ndim} dimension(s) with shape "
            f"{X.shape}. Reshape it, e.g. X.reshape(-1, 1) for a single feature."
        )
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool) or np.issubdtype(
        X.dtype, np.complexfloating
    ):
        raise ValueError(
            f"X must hold real numbers; the dask array has dtype {X.dtype}. Encode text or "
            f"categorical columns first (e.g. dask_ml's preprocessing)."
        )
    if any(np.isnan(c) for c in X.chunks[0]):
        X = X.compute_chunk_sizes()  # a count per chunk: only sizes come back
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"X has shape {X.shape}; at least one row and one feature are needed.")
    X = X.rechunk({1: -1})
    return X.map_blocks(_as_float, dtype=np.float64)


def check_prediction_input(estimator, X):
    """A dask X for prediction: 2-D, numeric, with the features seen in fit (lazily)."""
    X, names = _as_array(X)
    fitted = getattr(estimator, "feature_names_in_", None)
    if fitted is not None and names is not None and not np.array_equal(names, fitted):
        raise ValueError(
            f"The feature names should match those that were passed during fit: got "
            f"{list(names)}, fitted with {list(fitted)}."
        )
    X = _check_dask_X(estimator, X)
    if X.shape[1] != estimator.n_features_in_:
        raise ValueError(
            f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting "
            f"{estimator.n_features_in_} features as input."
        )
    return X


def validate_dask_fit_data(estimator, X, y, sample_weight):
    """``(X, classes, y_index, weights, weighted_counts, dtype)`` for a dask X, checked
    where the chunks are.

    ``X`` comes back as float64 with one column chunk, ``y_index`` (class indices) and
    ``weights`` (None for unit weights) as dask arrays chunked like its rows; ``classes``
    and ``weighted_counts`` (each class's total sample weight, its row count without
    sample weights) are small ndarrays; ``dtype`` is the input's, float32 or float64, as
    in memory (the fitted coefficients keep it).
    """
    import dask
    import dask.array as da

    X, names = _as_array(X)
    dtype = np.dtype(np.float32 if X.dtype == np.float32 else np.float64)
    X = _check_dask_X(estimator, X)
    estimator.n_features_in_ = X.shape[1]
    if names is not None and all(isinstance(n, str) for n in names):
        estimator.feature_names_in_ = names.astype(object)  # as scikit-learn's
    elif hasattr(estimator, "feature_names_in_"):
        del estimator.feature_names_in_
    y = _rows_like(y, X, "y")
    if sample_weight is None:
        # No array of ones: the chunks make their own (a separate array's chunks could be
        # computed on other workers than X's, and travel).
        weights = None
    elif isinstance(sample_weight, numbers.Number):
        weights = da.full(X.shape[0], float(sample_weight), chunks=(X.chunks[0],))
    else:
        weights = _rows_like(sample_weight, X, "sample_weight").astype(np.float64)
    largest = X.map_blocks(_block_largest, chunks=((1,) * X.numblocks[0], (1,)), dtype=float)
    w_finite, w_negative = (
        (True, False)
        if weights is None
        else (
            da.isfinite(weights).all(),
            (weights < 0).any(),
        )
    )
    largest, classes, w_finite, w_negative = dask.compute(
        largest.max(), da.unique(y), w_finite, w_negative
    )
    if largest == np.inf:
        raise ValueError("Input X contains NaN or infinity; impute or drop those values first.")
    largest = float(largest)
    if not np.isfinite(largest * largest):
        raise ValueError(OVERFLOWING_FEATURES.format(largest=largest))
    if classes.dtype.kind == "f" and not np.isfinite(classes).all():
        # (before type_of_target, whose cast of NaN to int warns)
        raise ValueError("Input y contains NaN or infinity; drop those rows first.")
    target = type_of_target(classes)
    if target not in ("binary", "multiclass") and not (
        target == "continuous" and np.all(np.equal(np.mod(classes, 1), 0))
    ):
        raise ValueError(
            f"Unknown label type: {target}. Maybe you are trying to fit a classifier, which "
            f"expects discrete classes on a regression target with continuous values."
        )
    if not w_finite:
        raise ValueError("sample_weight contains NaN or infinity.")
    if w_negative:
        raise ValueError(NEGATIVE_SAMPLE_WEIGHT)
    y_index = y.map_blocks(_class_index, classes, dtype=np.intp)
    # Rows per class without sample weights, else their total sample weight.
    weighted_counts = da.bincount(y_index, weights, minlength=len(classes)).compute()
    if not np.any(weighted_counts > 0):
        raise ValueError("sample_weight is all zero; at least one weight must be positive.")
    return X, classes, y_index, weights, weighted_counts, dtype


def _class_index(block, classes):
    return np.searchsorted(classes, block).astype(np.intp)


def class_weighted(weights, y_index, per_class: np.ndarray):
    """The weights (None: ones) times each row's class weight (lazily)."""
    per_row = y_index.map_blocks(_take, per_class, dtype=np.float64)
    return per_row if weights is None else weights * per_row


def reindexed(y_index, index: np.ndarray):
    """The lazy class indices ``y_index`` mapped through ``index`` (``index[y_index]``)."""
    return y_index.map_blocks(_take, index, dtype=index.dtype)


def _take(block, values):
    return values[block]


def chunkwise_prediction(method, X, n_columns: int | None, dtype):
    """``method`` mapped over the row chunks of a checked dask X: a lazy dask array of
    shape (M,) when ``n_columns`` is None, else (M, n_columns), whose chunks compute with
    this call's ``predictive_tol`` (not the one set when, or where, they are computed)."""
    carried = {"predictive_tol": get_config()["predictive_tol"]}
    block = functools.partial(_predicted_block, method, n_columns, dtype, carried)
    if n_columns is None:
        return X.map_blocks(block, drop_axis=1, chunks=(X.chunks[0],), dtype=dtype)
    return X.map_blocks(block, chunks=(X.chunks[0], (n_columns,)), dtype=dtype)


def _predicted_block(method, n_columns: int | None, dtype, carried: dict, block):
    if block.shape[0] == 0:  # a chunk a filter emptied: the in-memory methods refuse no rows
        return np.empty((0,) if n_columns is None else (0, n_columns), dtype=dtype)
    with carried_config(carried):
        return method(block)
