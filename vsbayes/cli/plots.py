"""The pictures of ``vsbayes fit --plot``: a forest plot of the coefficients' intervals and a
calibration (reliability) plot of the posterior predictive.

matplotlib is optional (the ``plot`` extra): without it nothing is written and the caller
says so. The Agg canvas is attached explicitly: no pyplot, so no global backend is changed
and no display is needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .data import Dataset
from .summary import coefficient_summary

__all__ = ["PLOT_HINT", "new_figure", "plot_file", "write_fit_plot"]

PLOT_HINT = 'pip install "vsbayes[plot]"'
# Bins of predicted probability in the calibration plot.
_BINS = 10
#: The forest plot's most coefficients: beyond, those farthest from 0 in sds. (3500
#: features drew a 69,484-pixel-high PNG in 40 s, after a 2 s fit: lines no one reads.)
FOREST_ROWS = 60


def new_figure(width: float, height: float):
    """A matplotlib Figure on an Agg canvas, or None when matplotlib is absent."""
    try:
        # Plain imports (not ``from``): they go through the top-level package, so an
        # uninstalled (or blocked) matplotlib is seen even when submodules are cached.
        import matplotlib.backends.backend_agg
        import matplotlib.figure
    except ImportError:
        return None
    figure = matplotlib.figure.Figure(figsize=(width, height), layout="constrained")
    matplotlib.backends.backend_agg.FigureCanvasAgg(figure)
    return figure


def plot_file(path: str, option: str = "--plot") -> str:
    """The file a plot named ``path`` goes to, checked before any fitting.

    matplotlib reads the format from the suffix only when saving, after the fit: a name
    such as ``data.csv`` (e.g. ``compare --plot data.csv``, where the optional value took
    the data file) would fail only then. To a name without a suffix it adds ``.png``.

    Returns
    -------
    str
        ``path``, with ``.png`` added when it has no suffix.

    Raises
    ------
    ValueError
        If the suffix names a format matplotlib has no writer for (not checked without
        matplotlib: no plot is written then, and the command says so).
    """
    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return f"{path}.png"
    try:
        import matplotlib.backends.backend_agg
    except ImportError:
        return path
    if suffix not in matplotlib.backends.backend_agg.FigureCanvasAgg.get_supported_filetypes():
        raise ValueError(
            f"{option} {path}: matplotlib cannot write .{suffix} files; name a .png, .pdf "
            f"or .svg file."
        )
    return path


def write_fit_plot(path: str | Path, estimator, data: Dataset) -> bool:
    """Forest plot and calibration plot of a fitted estimator, side by side, to ``path``.

    Parameters
    ----------
    path : str or Path
        The PNG to write.
    estimator : BayesianGLMClassifier
        Fitted on ``data``.
    data : Dataset
        The training data.

    Returns
    -------
    bool
        False when matplotlib is absent (nothing written).

    Raises
    ------
    OSError
        If the file cannot be written; the message names it.
    """
    tables = coefficient_summary(estimator, data.feature_names)
    labels = estimator.classes_.tolist()
    n_all = sum(len(t) for t in tables)
    tables = _farthest_from_zero(tables, FOREST_ROWS)
    n_rows = sum(len(t) for t in tables)
    figure = new_figure(11.0, max(4.0, 0.18 * n_rows + 1.5))
    if figure is None:
        return False
    forest, calibration = figure.subplots(1, 2, width_ratios=[1.3, 1.0])
    _forest(forest, tables, labels if len(tables) > 1 else None)
    if n_rows < n_all:
        forest.set_title(
            f"Posterior of the {n_rows} of {n_all} coefficients farthest from 0 (|mean| / sd)",
            fontsize=9,
        )
    _calibration(calibration, estimator, data)
    figure.suptitle(f"{data.source}: {type(estimator).__name__}", fontsize=9)
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise OSError(f"cannot write the plot {path}: {error.strerror or error}") from None
    return True


def _farthest_from_zero(tables, most: int):
    """The tables (one per problem) with their ``most`` coefficients of largest
    ``|mean| / sd`` over all problems (an sd of 0, a pruned feature's, last), each table's
    in its order; all of them where there are no more."""
    if sum(len(t) for t in tables) <= most:
        return tables
    scores = [abs(c.mean) / c.sd if c.sd > 0 else -np.inf for t in tables for c in t]
    keep = np.zeros(len(scores), dtype=bool)
    keep[np.argsort(scores, kind="stable")[::-1][:most]] = True
    out, start = [], 0
    for table in tables:
        kept = keep[start : start + len(table)]
        out.append([c for c, k in zip(table, kept, strict=True) if k])
        start += len(table)
    return out


def _forest(axes, tables, labels) -> None:
    """Each coefficient's mean and 95 % interval, one line each (the classes in colours)."""
    y = 0
    ticks, names = [], []
    for k, table in enumerate(tables):
        colour = f"C{k % 10}"
        for c in table:
            axes.plot([c.q025, c.q975], [y, y], color=colour, lw=1.5)
            axes.plot(c.mean, y, "o", color=colour, ms=3.5)
            ticks.append(y)
            names.append(c.name if labels is None else f"{labels[k]}: {c.name}")
            y -= 1
        y -= 0.5
    axes.axvline(0.0, color="grey", lw=0.8, ls="--")
    axes.set_yticks(ticks, names, fontsize=6)
    axes.set_xlabel("coefficient (standardized features): mean and 95 % interval")
    axes.set_title("Posterior of the coefficients", fontsize=9)


def _calibration(axes, estimator, data: Dataset) -> None:
    """Predicted probability against observed frequency, in bins of the training rows:
    the class probability for two classes, else the most probable class's."""
    proba = estimator.predict_proba(data.X)
    index = np.searchsorted(estimator.classes_, data.y)
    if proba.shape[1] == 2:
        predicted, observed = proba[:, 1], (index == 1).astype(float)
        what = f"P({estimator.classes_[1]})"
    else:
        top = proba.argmax(axis=1)
        predicted = proba[np.arange(len(top)), top]
        observed = (top == index).astype(float)
        what = "P(most probable class)"
    edges = np.linspace(0.0, 1.0, _BINS + 1)
    which = np.clip(np.digitize(predicted, edges) - 1, 0, _BINS - 1)
    counts = np.bincount(which, minlength=_BINS)
    used = counts > 0
    mean_predicted = np.bincount(which, predicted, _BINS)[used] / counts[used]
    frequency = np.bincount(which, observed, _BINS)[used] / counts[used]
    axes.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="perfect calibration")
    axes.plot(mean_predicted, frequency, "o-", color="C0", label="training rows, binned")
    for x, f, n in zip(mean_predicted, frequency, counts[used], strict=True):
        axes.annotate(str(n), (x, f), fontsize=6, xytext=(3, -8), textcoords="offset points")
    axes.set_xlim(0, 1)
    axes.set_ylim(-0.02, 1.02)
    axes.set_xlabel(f"predicted {what} (posterior predictive)")
    axes.set_ylabel("observed frequency")
    axes.set_title("Calibration (rows per bin annotated)", fontsize=9)
    axes.legend(fontsize=7, loc="upper left")
