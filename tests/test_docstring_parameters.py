"""The documented parameters are the signatures' (after scikit-learn's
test_docstring_parameters): every public estimator's class docstring lists its ``__init__``
parameters in order, and every public method of vsbayes its own.

test_docstrings.py checks the documented defaults and runs the examples; here only names
and order are compared, parsed by numpydoc."""

import inspect

import pytest
from numpydoc.docscrape import NumpyDocString

from vsbayes.estimators import ESTIMATORS, EmpiricalBayesClassifier

CLASSES = (*ESTIMATORS, EmpiricalBayesClassifier)


def _documented(obj) -> list[str]:
    """The names in the Parameters section of ``obj``'s docstring ("a, b : int" gives two)."""
    doc = NumpyDocString(inspect.getdoc(obj) or "")
    return [name.strip() for entry in doc["Parameters"] for name in entry.name.split(",")]


def _signature(function, drop_first: bool) -> list[str]:
    parameters = list(inspect.signature(function).parameters.values())
    if drop_first:
        parameters = parameters[1:]
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in parameters if p.kind not in variadic]


def _public_methods(cls):
    """``(name, function)`` of the public methods vsbayes defines (scikit-learn's own, such
    as ``get_params`` or ``score``, are documented there)."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next(klass for klass in cls.__mro__ if name in vars(klass))
        member = vars(owner)[name]
        if not owner.__module__.startswith("vsbayes") or isinstance(member, property):
            continue
        if isinstance(member, staticmethod | classmethod):
            yield name, member.__func__, isinstance(member, classmethod)
        elif inspect.isfunction(member):
            yield name, member, True


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_class_docstring_lists_the_init_parameters_in_order(cls):
    assert _documented(cls) == _signature(cls.__init__, drop_first=True)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_public_methods_document_their_parameters_in_order(cls):
    methods = list(_public_methods(cls))
    assert {"fit", "predict", "predict_proba"} <= {name for name, _, _ in methods}
    wrong = {
        name: (_documented(function), _signature(function, drop_first))
        for name, function, drop_first in methods
        if _documented(function) != _signature(function, drop_first)
    }
    assert not wrong, wrong
