"""The paper's UCI datasets, prepared as in the paper (read from ../shared, never copied)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _uci

# benchmarks/ only for that import: its distributed.py would shadow the package of that
# name in the modules imported after this one.
sys.path.pop(0)

AVAILABLE = all((_uci.DEFAULT_DATA_DIR / file).is_file() for file, _ in _uci.DATASETS.values())
needs_data = pytest.mark.skipif(
    not AVAILABLE, reason=f"the paper's UCI files are not in {_uci.DEFAULT_DATA_DIR}"
)

#: rows labelled +1 in the author's loader (the dataset README)
POSITIVES = {"haberman": 81, "parkinsons": 147, "ionosphere": 225, "wpbc": 46}


@needs_data
@pytest.mark.parametrize("name", sorted(_uci.DATASETS))
def test_prepared_as_the_paper(name):
    X, y = _uci.load(name)
    assert X.shape == _uci.DATASETS[name][1]
    np.testing.assert_allclose(np.linalg.norm(X, axis=0), 1.0, rtol=1e-12)
    np.testing.assert_allclose(X[:, -1], 1.0 / np.sqrt(len(X)), rtol=1e-12)  # the constant
    assert int(y.sum()) == POSITIVES[name]


def test_missing_directory_says_where_to_point(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        _uci.load("haberman", tmp_path)
