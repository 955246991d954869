"""The documented parameters are the signatures' (after scikit-learn's
test_docstring_parameters): every public estimator's class docstring lists its ``__init__``
parameters in order, and every public method of vsbayes its own; its Attributes section
lists what a fit sets.

test_docstrings.py checks the documented defaults and runs the examples; here only names
and order are compared, parsed by numpydoc."""

import inspect
import warnings

import pytest
from numpydoc.docscrape import NumpyDocString
from sklearn.datasets import make_classification

from vsbayes.estimators import ESTIMATORS, EmpiricalBayesClassifier, LaplaceLogisticRegression

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


@pytest.fixture(scope="module")
def small_frame():
    """60 rows, three named features: every estimator fits them in milliseconds."""
    pandas = pytest.importorskip("pandas")
    X, y = make_classification(60, 3, n_informative=2, n_redundant=0, random_state=0)
    return pandas.DataFrame(X, columns=["a", "b", "c"]), y


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_documented_attributes_are_the_fitted_ones(cls, small_frame):
    """What a fit sets (public, trailing ``_``) is documented, and what is documented is
    there after a fit (a property, such as the empirical Bayes ``coef_``, too)."""
    estimator = cls(LaplaceLogisticRegression()) if cls is EmpiricalBayesClassifier else cls()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a small problem's notes are not this test's
        estimator.fit(*small_frame)
    doc = NumpyDocString(inspect.getdoc(cls))
    documented = {name.strip() for entry in doc["Attributes"] for name in entry.name.split(",")}
    fitted = {name for name in vars(estimator) if name.endswith("_") and name[0] != "_"}
    assert fitted - documented == set()
    assert [name for name in sorted(documented) if not hasattr(estimator, name)] == []
