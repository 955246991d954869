"""Posterior summaries, tables and JSON of the command line, and its stderr channel."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from ..engine import DiagnosedGaussian
from ..estimators._summaries import coefficient_table
from ..gaussian import Gaussian

__all__ = [
    "STDOUT",
    "Coefficient",
    "Console",
    "check_output_path",
    "coefficient_summary",
    "counted",
    "diagnostics",
    "format_diagnostics",
    "format_number",
    "format_table",
    "jsonable",
    "write_json",
]


def counted(n: int, noun: str) -> str:
    """``"1 feature"``, ``"3 features"``: a count and its noun, plural but for one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True)
class Coefficient:
    """Marginal posterior of one coefficient: mean, sd, 95 % interval, P(sign)."""

    name: str
    mean: float
    sd: float
    q025: float
    q975: float
    p_sign: float

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "mean": self.mean,
            "sd": self.sd,
            "q025": self.q025,
            "q975": self.q975,
            "p_sign": self.p_sign,
        }


def coefficient_summary(estimator, feature_names: Sequence[str]) -> list[list[Coefficient]]:
    """Per problem, one :class:`Coefficient` per feature, then the intercept: the rows of
    the estimator's own table (:meth:`summary`, the one home of these numbers).

    Parameters
    ----------
    estimator : BayesianGLMClassifier
        Fitted.
    feature_names : sequence of str
        Names of the features, in order.

    Returns
    -------
    list of list of Coefficient
        One list for two classes; beyond, one per class (the multinomial posterior's
        centred coefficients, or each one-vs-rest problem's).
    """
    table = coefficient_table(estimator, 0.95, feature_names=list(feature_names))
    records = table.to_records() if hasattr(table, "to_records") else table
    columns = records.dtype.names
    lower, upper = columns[-3], columns[-2]  # "2.5%", "97.5%"
    groups: dict[object, list[Coefficient]] = {}
    for record in records:
        label = record["class"] if "class" in columns else None
        groups.setdefault(label, []).append(
            Coefficient(
                str(record["coefficient"]),
                float(record["mean"]),
                float(record["sd"]),
                float(record[lower]),
                float(record[upper]),
                float(record["P(sign)"]),
            )
        )
    return list(groups.values())


def diagnostics(posterior: Gaussian) -> dict[str, object]:
    """The scalar diagnostics of a result (those its repr shows), as plain Python values.

    Parameters
    ----------
    posterior : Gaussian
        A result of the engine or of an approximation (a ``DiagnosedGaussian``, whose
        ``diagnostics()`` are read); a plain Gaussian has none.

    Returns
    -------
    dict
        Name to bool, int, float or str; per-round records and arrays are left out.
    """
    if not isinstance(posterior, DiagnosedGaussian):
        return {}
    return {
        name: jsonable(value)
        for name, value in posterior.diagnostics().items()
        if value is not None and np.ndim(value) == 0
    }


def jsonable(value):
    """``value`` with numpy scalars and arrays made plain and non-finite floats as None.

    JSON has no NaN or infinity: writing them would produce a file strict parsers reject.
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


#: The --json file name that means standard output, as Unix tools read "-".
STDOUT = "-"


def write_json(path: str | Path, document: dict) -> None:
    """Write ``document`` as indented JSON (strict: no NaN) to ``path``, or to standard
    output where ``path`` is :data:`STDOUT`.

    Raises
    ------
    OSError
        If the file cannot be written; the message names it.
    """
    text = json.dumps(jsonable(document), indent=2, allow_nan=False, ensure_ascii=False)
    if str(path) == STDOUT:
        print(text)
        return
    try:
        Path(path).write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        raise OSError(f"cannot write {path}: {error.strerror or error}") from None


def check_output_path(path: str | Path, option: str, data: str | Path | None = None) -> None:
    """Refuse, before any fitting, an output file that cannot be written or would destroy
    the data: the outputs are written after the fit, which ``compare`` may run for minutes.

    Parameters
    ----------
    path : str or Path
        The file an option writes.
    option : str
        The option's name, for the message (``--json``, ``--plot``).
    data : str or Path, optional
        The command's data file, which an output must not overwrite.

    Raises
    ------
    OSError
        If the folder does not exist or cannot be written, or ``path`` is a folder.
    ValueError
        If ``path`` is the data file.
    """
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise OSError(f"{option} {path}: is a folder; name a file.")
    if not folder.is_dir():
        raise OSError(f"{option} {path}: no folder {str(folder)!r} to write it in.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OSError(f"{option} {path}: the folder {str(folder)!r} is not writable.")
    if data is not None and target.exists() and os.path.samefile(target, data):
        raise ValueError(f"{option} {path}: that is the data file; name another file.")


def format_number(value, digits: int = 4, scale: float | None = None) -> str:
    """A table cell: fixed point for ordinary magnitudes, scientific beyond them.

    ``scale``: the magnitude the value is read against (a coefficient's sd, for its mean
    and interval): a value below the fixed point's resolution where ``scale`` is not, is
    zero at that resolution and printed so (a mean of round-off, 2.764e-16, beside an sd
    of 1.2 reads 0.0000, not as a number of its own)."""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        value = float(value)
        if not math.isfinite(value):
            return str(value)
        resolution = 10.0**-digits
        if (
            value == 0.0
            or resolution <= abs(value) < 1e6
            or (abs(value) < resolution and scale is not None and abs(scale) >= resolution)
        ):
            text = f"{value:.{digits}f}"
            return text[1:] if text.startswith("-") and float(text) == 0.0 else text
        return f"{value:.{digits - 1}e}"
    return str(value)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """Align text cells in columns, two spaces apart.

    Parameters
    ----------
    header : sequence of str
        Column titles.
    rows : sequence of sequence of str
        Cells, as many per row as titles.
    align : str, default=""
        One letter per column, ``"l"`` (left) or ``"r"`` (right); by default the first
        column is left-aligned (names) and the others right-aligned (numbers).

    Returns
    -------
    str
        The lines of the table, without a final newline.
    """
    align = align or "l" + "r" * (len(header) - 1)
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.ljust(w) if a == "l" else cell.rjust(w)
            for cell, w, a in zip(cells, widths, align, strict=True)
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def format_diagnostics(values: dict[str, object]) -> str:
    """``name=value`` pairs, floats to 4 significant digits."""
    if not values:
        return "none"
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )


class Console:
    """The stderr side of a command: progress lines, warnings, errors.

    Progress is shown only to a person watching (stderr is a terminal) or on request
    (``--verbose``), so that logs and pipes stay clean.
    """

    def __init__(self, verbose: bool = False, stream: TextIO | None = None):
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.show_progress = verbose or bool(isatty and isatty())

    def progress(self, text: str) -> None:
        """Print a progress line when progress is shown."""
        if self.show_progress:
            print(text, file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        """Print a warning as one line prefixed ``vsbayes: warning:``."""
        print(f"vsbayes: warning: {' '.join(text.split())}", file=self.stream, flush=True)
