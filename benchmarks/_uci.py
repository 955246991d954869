"""The paper's four UCI datasets, prepared as in Roche (2013), section 4.

Read from ``--data-dir`` (default ``../shared/datasets/uci``, relative to the project root);
nothing is copied into the repository. Preparation (the dataset README gives the columns):
the attribute columns, a constant attribute, every column (the constant too) scaled to unit
Euclidean norm; labels y in {0, 1} with 1 for the class the author's loader codes +1.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "uci"

#: name -> (file, expected (M, d) with the constant)
DATASETS = {
    "haberman": ("haberman.data", (306, 4)),
    "parkinsons": ("parkinsons.data", (195, 23)),
    "ionosphere": ("ionosphere.data", (351, 33)),
    "wpbc": ("wpbc.data", (194, 34)),
}


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return [row for row in csv.reader(fh) if row]


def _attributes_and_labels(name: str, rows: list[list[str]]):
    if name == "haberman":  # columns 1-3; label 2 = died within 5 years -> +1
        return [r[:3] for r in rows], [r[3] == "2" for r in rows]
    if name == "parkinsons":  # header row; every column but `name` and `status`
        header, body = rows[0], rows[1:]
        status = header.index("status")
        keep = [j for j, h in enumerate(header) if h not in ("name", "status")]
        return [[r[j] for j in keep] for r in body], [r[status] == "1" for r in body]
    if name == "ionosphere":  # attributes 3-34 (1 and 2 dropped); g -> +1
        return [r[2:34] for r in rows], [r[34] == "g" for r in rows]
    if name == "wpbc":  # columns 3-35, rows with '?' dropped; R -> +1
        rows = [r for r in rows if "?" not in r]
        return [r[2:35] for r in rows], [r[1] == "R" for r in rows]
    raise ValueError(f"Unknown dataset {name!r}; choose from {sorted(DATASETS)}.")


def load(name: str, data_dir: Path | str = DEFAULT_DATA_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Prepared ``(X, y)`` of one dataset: X (M, d) with the constant last, y in {0, 1}."""
    file, shape = DATASETS[name]
    path = Path(data_dir) / file
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: pass --data-dir pointing at the folder with the paper's UCI "
            f"files (shared/datasets/uci)."
        )
    attributes, labels = _attributes_and_labels(name, _rows(path))
    X = np.column_stack([np.array(attributes, dtype=float), np.ones(len(attributes))])
    X /= np.linalg.norm(X, axis=0)
    y = np.array(labels, dtype=int)
    if X.shape != shape:
        raise ValueError(f"{name}: prepared shape {X.shape}, expected {shape} (see its README).")
    return X, y
