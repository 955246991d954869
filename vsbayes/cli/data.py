"""Data of the command line: the embedded breast-cancer set or a CSV file, standardized.

Only the standard library's ``csv`` module and numpy read files: pandas is not a runtime
dependency. Every problem with the file raises a ``ValueError`` (or ``OSError``) whose
message is one line naming the file, the column and the line.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.preprocessing import StandardScaler

from ..estimators._summaries import INTERCEPT_LABEL

__all__ = ["Dataset", "load_breast_cancer_data", "load_csv", "load_dataset"]


@dataclass(frozen=True)
class Dataset:
    """A classification data set ready to fit: standardized features and labels.

    Attributes
    ----------
    source : str
        What the data are, for the output header (a path or a description).
    X : ndarray of shape (n_rows, n_features)
        Features, standardized to mean 0 and standard deviation 1 (constant columns are
        only centred), because the prior N(0, C I) treats every coefficient alike.
    y : ndarray of shape (n_rows,)
        Class labels (integers, floats or strings).
    feature_names : list of str
        One name per column of X.
    target_name : str
        Name of the label column.
    warnings : tuple of str
        What the command should warn about the file (e.g. a header row that reads as data).
    """

    source: str
    X: np.ndarray
    y: np.ndarray
    feature_names: list[str]
    target_name: str
    warnings: tuple[str, ...] = ()

    @property
    def classes(self) -> np.ndarray:
        """Sorted distinct labels (the estimators' ``classes_``)."""
        return np.unique(self.y)

    def summary(self) -> dict:
        """What the data are, as a JSON-ready dict (the ``data`` entry of the outputs)."""
        return {
            "source": self.source,
            "rows": len(self.y),
            "features": self.X.shape[1],
            "feature_names": self.feature_names,
            "standardized": True,
            "target": self.target_name,
            "classes": [{"label": c, "rows": k} for c, k in self.class_counts()],
        }

    def class_counts(self) -> list[tuple[object, int]]:
        """``(label, number of rows)`` for each class, in the order of :attr:`classes`."""
        classes, counts = np.unique(self.y, return_counts=True)
        return [(label.item(), int(n)) for label, n in zip(classes, counts, strict=True)]


def load_dataset(path: str | None, target: str | None = None, header: bool = True) -> Dataset:
    """The data set of a command: the CSV file at ``path``, else the embedded one.

    Parameters
    ----------
    path : str or None
        CSV file; None for scikit-learn's bundled breast-cancer data.
    target : str or None, default=None
        Name of the label column (default: the last column). Only with ``path``.
    header : bool, default=True
        Whether the file's first row names the columns (else they are numbered from 1).

    Returns
    -------
    Dataset

    Raises
    ------
    OSError
        If the file cannot be opened.
    ValueError
        If its content is not a numeric feature table with a label column of 2+ classes.
    """
    if path is None:
        if target is not None:
            raise ValueError("a target column needs a DATA file; the embedded data have one.")
        return load_breast_cancer_data()
    return load_csv(path, target, header)


def load_breast_cancer_data() -> Dataset:
    """Scikit-learn's bundled breast-cancer data (569 rows, 30 features), standardized.

    Returns
    -------
    Dataset
        Labels are the class names ``"benign"`` and ``"malignant"``.
    """
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return Dataset(
        source="breast cancer (scikit-learn's bundled Wisconsin diagnostic data)",
        X=_standardize(bunch.data),
        y=np.asarray(bunch.target_names)[bunch.target],
        feature_names=[str(name) for name in bunch.feature_names],
        target_name="diagnosis",
    )


def load_csv(path: str | Path, target: str | None = None, header: bool = True) -> Dataset:
    """Read a CSV file: a header row of column names, then one row per observation.

    Parameters
    ----------
    path : str or Path
        Comma-separated file, UTF-8 (a byte-order mark is accepted). Blank lines are
        skipped; cells are stripped of surrounding spaces.
    target : str or None, default=None
        Name of the label column; default the last column. Labels may be text or numbers.
    header : bool, default=True
        Whether the first row names the columns; False: every row is data and the
        columns are named by their numbers, ``"1"``, ``"2"``, … (so is ``target``).

    Returns
    -------
    Dataset
        Every other column is a feature and must be numeric and finite.

    Raises
    ------
    OSError
        If the file cannot be opened.
    ValueError
        With a one-line message naming the problem: not text, no header or data rows,
        ragged rows, unnamed or duplicated columns, unknown target, non-numeric or
        missing or too large values, fewer than two classes or about one per row (an
        identifier).
    """
    path = Path(path)
    has_header = header
    header, rows, lines = _read_rows(path, has_header)
    name = _check_header(path, header)
    if len(header) < 2:  # before --target's lookup, which would list the one column
        delimiter = next((d for d in (";", "\t", "|") if d in header[0]), None)
        hint = (
            f" (the header reads as one column holding {delimiter!r}: write the file "
            f"comma-separated)"
            if delimiter
            else ""
        )
        raise ValueError(f"{name}: need at least one feature column besides the target{hint}.")
    if target is None:
        target_index = len(header) - 1
    elif target in header:
        target_index = header.index(target)
    else:
        what = "named" if has_header else "number"
        raise ValueError(
            f"{name}: no column {what} {target!r} for --target; the columns are "
            f"{_shorten(header)}{_no_header_hint(header) if has_header else ''}."
        )
    feature_index = [j for j in range(len(header)) if j != target_index]
    feature_names = [header[j] for j in feature_index]
    if INTERCEPT_LABEL in feature_names:  # two rows of that name in the table and the JSON
        raise ValueError(
            f"{name}: a feature column is named {INTERCEPT_LABEL!r}, the name the output gives "
            f"the intercept, which the fit adds itself: drop the column if it holds the "
            f"intercept's ones, else rename it."
        )
    X = _numeric_features(name, rows, lines, feature_index, feature_names)
    y = _labels(name, [row[target_index] for row in rows], lines, header[target_index])
    fractional = y[y != np.round(y)] if y.dtype.kind == "f" else y[:0]
    default = " (the last column, by default)" if target is None else ""
    if fractional.size:  # a measurement, not labels: most often the wrong column
        raise ValueError(
            f"{name}: the target column {header[target_index]!r}{default} holds continuous "
            f"values (e.g. {float(fractional[0]):g}), not class labels; name the label "
            f"column with --target."
        )
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) > _FEW_CLASSES and 2 * len(classes) > len(y):
        # An identifier or a count, not labels: its fit (one class per row or so) would
        # run for minutes to mean nothing (200 rows: over 2 minutes).
        raise ValueError(
            f"{name}: the target column {header[target_index]!r}{default} has "
            f"{len(classes)} distinct values in {len(y)} rows, too many to be class labels "
            f"(an identifier?); name the label column with --target."
        )
    notes = []
    constant = [column for column, same in zip(feature_names, np.ptp(X, axis=0) == 0, strict=True)
                if same]  # fmt: skip
    if constant:  # its row of the table is the prior's, which reads as "no effect"
        notes.append(
            f"{name}: column{'s' if len(constant) > 1 else ''} {_shorten(constant)} "
            f"{'are' if len(constant) > 1 else 'is'} constant: the data say nothing of "
            f"{'their coefficients' if len(constant) > 1 else 'its coefficient'}, whose "
            f"posterior is the prior's (mean 0, sd √C); drop such columns."
        )
    if has_header and _reads_as_data(header):
        notes.append(
            f"{name}: the header row reads as data ({_shorten(header, 4)}); if the file has "
            f"no header row, pass --no-header (its first row was taken as the column names)."
        )
    for label, count in zip(classes, counts, strict=True):
        if str(label).lower() in _MISSING:
            notes.append(
                f"{name}: {count} row{'s' if count > 1 else ''} of the target column "
                f"{header[target_index]!r} read {str(label)!r}, fitted as a class of its own; "
                f"if that marks a missing label, drop those rows."
            )
    return Dataset(
        source=name,
        X=_standardize(X, name, feature_names),
        y=y,
        feature_names=feature_names,
        target_name=header[target_index],
        warnings=tuple(notes),
    )


def _read_rows(path: Path, header: bool = True) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, data rows and their line numbers; blank lines dropped. Without a header
    row, the columns are named by their numbers from 1."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as file:
            reader = csv.reader(file)
            records = [
                ([cell.strip() for cell in row], reader.line_num)
                for row in reader
                if any(cell.strip() for cell in row)
            ]
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 text file, so not a CSV file.") from None
    except csv.Error as error:
        raise ValueError(f"{path}: unreadable CSV ({error}).") from None
    except OSError as error:
        # One line whatever the platform's wording: "cannot read <path>: <reason>".
        raise OSError(f"cannot read {path}: {error.strerror or error}") from None
    if not records:
        expected = "a header row and data rows" if header else "data rows"
        raise ValueError(f"{path}: the file is empty; expected {expected}.")
    names = records[0][0] if header else [str(j + 1) for j in range(len(records[0][0]))]
    data = records[1:] if header else records
    rows = [row for row, _ in data]
    lines = [line for _, line in data]
    if not rows:
        raise ValueError(f"{path}: no data rows after the header.")
    for row, line in zip(rows, lines, strict=True):
        if len(row) != len(names):
            reference = "the header has" if header else "the first row has"
            raise ValueError(
                f"{path}, line {line}: {len(row)} fields, but {reference} {len(names)}."
            )
    return names, rows, lines


def _check_header(path: Path, header: list[str]) -> str:
    """Reject unnamed and duplicated columns; return the file's display name."""
    for j, column in enumerate(header):
        if not column:
            hint = (
                " (a saved index? write the file with index=False)"
                if j == 0
                else " (a comma at the end of each line?)"
                if j == len(header) - 1
                else ""
            )
            raise ValueError(f"{path}: column {j + 1} of the header has no name{hint}.")
    seen: set[str] = set()
    for column in header:
        if column in seen:
            raise ValueError(
                f"{path}: the header names column {column!r} twice{_no_header_hint(header)}."
            )
        seen.add(column)
    return str(path)


def _reads_as_data(header: list[str]) -> bool:
    """Whether a header row looks like a row of data: numbers in every cell but at most one
    (a text label), other than the column numbers pandas writes (0, 1, 2, … or 1, 2, …)."""
    numbers = []
    for cell in header:
        try:
            numbers.append(float(cell))
        except ValueError:
            continue
    if len(numbers) < 2 or len(numbers) < len(header) - 1:
        return False
    return numbers not in (list(range(len(numbers))), list(range(1, len(numbers) + 1)))


def _no_header_hint(header: list[str]) -> str:
    """A hint for an error about a header row that reads as data."""
    if not _reads_as_data(header):
        return ""
    return " (the header row reads as data: if the file has no header row, pass --no-header)"


#: Up to this many classes, a target with about one row per class is let through (a toy
#: problem fits in a moment); beyond, it is refused as an identifier.
_FEW_CLASSES = 10
#: Cells that mean a missing value in common exports (R, pandas, the UCI repository).
_MISSING = frozenset({"na", "n/a", "nan", "?", "null", "none"})


def _numeric_features(
    name: str,
    rows: list[list[str]],
    lines: list[int],
    columns: list[int],
    names: list[str],
) -> np.ndarray:
    """The feature columns as floats; a ValueError naming the first bad cell."""
    cells = [[row[j] for j in columns] for row in rows]
    try:
        X = np.array(cells, dtype=np.float64)
    except ValueError:
        X = None  # locate the offending cell below, for the message
    if X is not None and np.isfinite(X).all():
        return X
    for row, line in zip(cells, lines, strict=True):
        for value, column in zip(row, names, strict=True):
            if not value or value.lower() in _MISSING:
                raise ValueError(
                    f"{name}, line {line}: missing value{f' ({value!r})' if value else ''} in "
                    f"column {column!r}; the features must be complete (drop or impute the row)."
                )
            try:
                number = float(value)
            except ValueError:
                raise ValueError(
                    f"{name}, line {line}: column {column!r} is not numeric ({value!r}); encode "
                    f"it as numbers or drop it, or name it with --target if it is the label."
                ) from None
            if not np.isfinite(number):
                raise ValueError(
                    f"{name}, line {line}: column {column!r} holds {value!r}; the features "
                    f"must be finite numbers."
                )
    raise AssertionError("unreachable: some cell failed to convert")  # pragma: no cover


def _labels(name: str, values: list[str], lines: list[int], column: str) -> np.ndarray:
    """Labels as integers, else floats, else strings; at least two classes."""
    for value, line in zip(values, lines, strict=True):
        if not value:
            raise ValueError(
                f"{name}, line {line}: missing label in column {column!r}; drop the rows "
                f"without a label (or name the label column with --target)."
            )
    labels: np.ndarray | None = None
    for kind in (int, float):
        try:
            labels = np.array([kind(v) for v in values])
            break
        except ValueError:
            continue
    if labels is None or (labels.dtype.kind == "f" and not np.isfinite(labels).all()):
        labels = np.array(values)  # text labels ("nan" stays a text label here)
    classes = np.unique(labels)
    if len(classes) < 2:
        raise ValueError(
            f"{name}: the target column {column!r} has only one class "
            f"({classes[0].item()!r}); a classifier needs at least two."
        )
    return labels


def _standardize(X: np.ndarray, name: str = "", feature_names: Sequence[str] = ()) -> np.ndarray:
    """Columns to mean 0 and sd 1; a ValueError naming a column too large for it."""
    with np.errstate(over="ignore", invalid="ignore"):  # said below, in one line
        scaler = StandardScaler().fit(X)
    finite = np.isfinite(scaler.var_)  # (scikit-learn would leave such a column unscaled)
    if not finite.all():
        j = int(np.argmin(finite))
        raise ValueError(
            f"{name}: column {feature_names[j]!r} holds values too large to standardize "
            f"(up to {np.abs(X[:, j]).max():g}: their squares overflow); rescale it."
        )
    return scaler.transform(X)


def _shorten(names: Sequence[str], limit: int = 8) -> str:
    """Quoted column names, the middle elided beyond ``limit``."""
    quoted = [repr(n) for n in names]
    if len(quoted) > limit:
        quoted = [*quoted[: limit - 2], "…", *quoted[-2:]]
    return ", ".join(quoted)
