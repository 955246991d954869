"""The weight of each class, as ``fit``, its dask form and leave-one-out apply
``class_weight`` (one home: the leave-one-out check compares the fit's row weights)."""

from __future__ import annotations

import numpy as np
from sklearn.utils.class_weight import compute_class_weight

__all__ = ["balanced_class_weight", "checked_class_weights", "class_weights"]


def balanced_class_weight(totals: np.ndarray) -> np.ndarray:
    """scikit-learn's "balanced" class weights ``W / (K · W_k)`` from each class's total
    sample weight ``W_k`` (its row count without sample weights), as its
    ``compute_class_weight(..., sample_weight=)`` and ``LogisticRegression`` (since 1.7)
    weigh them. K counts the classes of positive total, and a class of total 0 gets 0: a
    row of weight 0 is a row absent (scikit-learn's division gives such a class inf)."""
    totals = np.asarray(totals, dtype=np.float64)
    weighted = totals > 0
    weights = np.zeros(len(totals))
    np.divide(totals.sum(), weighted.sum() * totals, out=weights, where=weighted)
    return weights


def checked_class_weights(per_class: np.ndarray, class_weight) -> np.ndarray:
    """The weight of each class, refused unless finite and non-negative (a negative one
    would turn the likelihood into its reciprocal; scikit-learn does not check)."""
    if not np.all(np.isfinite(per_class) & (per_class >= 0)):
        raise ValueError(
            f"class_weight must give every class a finite non-negative weight; got "
            f"{class_weight!r}."
        )
    return per_class


def class_weights(class_weight, classes: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """The checked weight of each of ``classes`` under ``class_weight`` (a dict or
    "balanced"), given each class's total sample weight ``totals``."""
    if isinstance(class_weight, str) and class_weight == "balanced":
        per_class = balanced_class_weight(totals)
    else:
        per_class = compute_class_weight(class_weight, classes=classes, y=classes)
    return checked_class_weights(per_class, class_weight)
