"""The estimators' fit path (docs/developer.md, "The fit path"): a binary VS fit crosses
few files of vsbayes/estimators/, and fit keeps no state on the estimator but its fitted
attributes."""

import re
import sys
from pathlib import Path

import pytest
from _helpers import ALL, make
from sklearn.datasets import load_iris, make_classification

import vsbayes

DEVELOPER = Path(__file__).resolve().parents[1] / "docs" / "developer.md"


def test_a_binary_vs_fit_switches_files_at_most_five_times(capsys):
    section = DEVELOPER.read_text().split("## The fit path", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    namespace = {}
    exec(compile(block, str(DEVELOPER), "exec"), namespace)
    assert namespace["switches"] <= 5, capsys.readouterr().out


def _transient(names, parameters) -> set:
    """The names that are neither parameters nor fitted attributes."""
    return {name for name in names if name not in parameters and not name.endswith("_")}


def _fit_watching_attributes(estimator, X, y) -> list[set]:
    """Fit, with the estimator's attribute names at every Python call of the fit."""
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(set(vars(estimator)))

    sys.setprofile(profile)
    try:
        estimator.fit(X, y)
    finally:
        sys.setprofile(None)
    return [*seen, set(vars(estimator))]


X_BINARY, Y_BINARY = make_classification(n_samples=120, n_features=3, n_redundant=0, random_state=0)
X_IRIS, Y_IRIS = load_iris(return_X_y=True)


@pytest.mark.parametrize(
    ("estimator", "X", "y"),
    [pytest.param(make(cls), X_BINARY, Y_BINARY, id=cls.__name__) for cls in ALL]
    + [
        pytest.param(
            vsbayes.VSLogisticRegression(random_state=0), X_IRIS, Y_IRIS, id="multinomial"
        ),
        pytest.param(vsbayes.VSProbitRegression(random_state=0), X_IRIS, Y_IRIS, id="one-vs-rest"),
    ],
)
def test_fit_sets_only_fitted_attributes(estimator, X, y):
    parameters = set(estimator.get_params(deep=False))
    for names in _fit_watching_attributes(estimator, X, y):
        assert parameters <= names
        assert not _transient(names, parameters)
