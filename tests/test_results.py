"""Result objects: diagnostics are declared fields, complete at construction and read-only."""

import pickle
import re

import numpy as np
import pytest

import vsbayes
import vsbayes.approximations  # defines EPResult and VBResult
from vsbayes import Gaussian
from vsbayes.engine import DiagnosedGaussian


def _result_classes(cls=DiagnosedGaussian):
    for sub in cls.__subclasses__():
        yield sub
        yield from _result_classes(sub)


RESULTS = sorted(set(_result_classes()), key=lambda c: c.__name__)


def test_every_result_class_is_found():
    names = {c.__name__ for c in RESULTS}
    assert {"VSResult", "ISResult", "BMCResult", "LaplaceResult", "EPResult", "VBResult"} <= names


@pytest.mark.parametrize("cls", RESULTS, ids=lambda c: c.__name__)
def test_declared_diagnostics_are_documented(cls):
    assert cls.diagnostic_names
    documented = re.findall(r"^    (\w+) : ", cls.__doc__, re.MULTILINE)
    assert documented == list(cls.diagnostic_names)


@pytest.mark.parametrize("cls", RESULTS, ids=lambda c: c.__name__)
def test_construction_takes_exactly_the_declared_diagnostics(cls):
    values = {name: k for k, name in enumerate(cls.diagnostic_names)}
    result = cls([0.0], [[1.0]], 0.0, **values)
    assert result.diagnostics() == values
    assert list(result.diagnostics()) == list(cls.diagnostic_names)
    first = cls.diagnostic_names[0]
    with pytest.raises(TypeError, match="missing"):
        cls([0.0], [[1.0]], 0.0, **{k: v for k, v in values.items() if k != first})
    with pytest.raises(TypeError, match="no diagnostics"):
        cls([0.0], [[1.0]], 0.0, **values, unknown=1)
    with pytest.raises(AttributeError, match="read-only"):
        setattr(result, first, 1)


def test_replace_copies_with_changed_diagnostics():
    fit = vsbayes.ISResult([0.0], [[1.0]], 0.0, ess=2.0, n_samples=3, rounds=None)
    changed = fit.replace(rounds=[])
    assert fit.rounds is None and changed.rounds == []
    assert changed.ess == 2.0 and changed.mean is fit.mean and type(changed) is type(fit)
    with pytest.raises(TypeError, match="no diagnostics"):
        fit.replace(n_iter=1)


def test_the_rounds_driver_returns_a_complete_result_that_survives_pickling():
    target = Gaussian([1.0, -1.0], [[2.0, 0.3], [0.3, 0.5]], 3.0)
    kernel = Gaussian([0.0, 0.0], np.eye(2))
    fit = vsbayes.variational_sampling(target.log_density, kernel, rounds=2, random_state=0)
    assert len(fit.rounds) == 2 and fit.diagnostics()["rounds"] is fit.rounds
    again = pickle.loads(pickle.dumps(fit))
    assert again.diagnostics().keys() == fit.diagnostics().keys()
    assert again.n_iter == fit.n_iter and np.array_equal(again.cov, fit.cov)
    assert "n_iter=" in repr(fit) and "rounds" not in repr(fit)
    # Floats to 4 digits (verbose=1 prints the repr): "kl_error=0.027008145385293756" was
    # unreadable beside the integers and flags.
    shown = dict(item.split("=") for item in repr(fit).split("(", 1)[1][:-1].split(", "))
    assert shown["kl_error"] == f"{fit.kl_error:.4g}" and shown["converged"] == repr(fit.converged)
