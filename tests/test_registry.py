"""The estimators' registry is complete: every estimator class is in it, and exported."""

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import vsbayes
from vsbayes import _choices
from vsbayes.estimators import ESTIMATORS, METHODS, BayesianGLMClassifier, estimator_class


def _concrete_subclasses(cls):
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("vsbayes.") and not inspect.isabstract(sub):
            yield sub
        yield from _concrete_subclasses(sub)


def test_every_estimator_class_is_registered_and_exported():
    public = {cls for cls in _concrete_subclasses(BayesianGLMClassifier) if cls._link}
    assert public == set(ESTIMATORS)
    for cls in ESTIMATORS:
        assert getattr(vsbayes, cls.__name__) is cls and cls.__name__ in vsbayes.__all__
        assert estimator_class(cls._method, cls._link) is cls


def test_traits():
    assert {key for key, m in METHODS.items() if m.sampling} == {"vs", "is", "bmc"}
    assert list(METHODS) == ["vs", "laplace", "is", "bmc", "ep", "vb"]
    assert set(METHODS["vb"].classes) == {"logistic"}
    # fit's docstring names the methods whose logistic estimator is multinomial.
    multinomial = {key for key, m in METHODS.items() if m.classes["logistic"]._multinomial}
    assert multinomial == {"vs", "laplace", "is", "ep"}
    doc = " ".join(BayesianGLMClassifier.fit.__doc__.split())
    assert "(Laplace, VS, IS, EP) fit the joint multinomial" in doc


def test_the_names_the_command_line_reads_are_the_registrys():
    # vsbayes._choices: what the command line offers, read without importing the library.
    assert tuple(METHODS) == _choices.METHODS
    assert tuple(k for k, m in METHODS.items() if m.sampling) == _choices.SAMPLING_METHODS
    assert {link for m in METHODS.values() for link in m.classes} == set(_choices.LINKS)


def test_the_package_imports_each_public_name_from_its_module():
    # The package imports its names on first use, from a list of its own.
    sources = vsbayes._SOURCES
    assert {n for n, m in sources.items() if m == "estimators"} == set(vsbayes.estimators.__all__)
    for name, module in sources.items():
        assert name in importlib.import_module(f"vsbayes.{module}").__all__, (name, module)
        assert getattr(vsbayes, name) is getattr(importlib.import_module(f"vsbayes.{module}"), name)
    assert set(vsbayes.__all__) == {"__version__", *sources}
    assert set(vsbayes.__all__) <= set(dir(vsbayes))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        vsbayes.no_such_name


def test_the_static_imports_are_the_lazy_table():
    # The `if TYPE_CHECKING:` imports, which type checkers and editors read, name what the
    # lazy table imports at run time, from the same modules.
    tree = ast.parse(Path(vsbayes.__file__).read_text(encoding="utf-8"))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    static = {alias.name: node.module for node in block.body for alias in node.names}
    assert static == vsbayes._SOURCES


@pytest.mark.parametrize(
    ("method", "link", "message"),
    [
        ("nuts", "logistic", "unknown method"),
        ("vs", "cauchit", "unknown link"),
        ("vb", "probit", "no probit estimator"),
    ],
)
def test_unknown_pairs_say_what_exists(method, link, message):
    with pytest.raises(ValueError, match=message):
        estimator_class(method, link)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda cls: cls.__name__)
def test_the_method_object_takes_the_parameters_of_its_names(cls):
    """The method object's fields are the estimator's parameters of the same names (read
    from a cached list of names, not from get_params at each fit), as set now."""
    estimator = cls(tol=1e-5, max_iter=7)
    method = estimator._new_posterior_method()
    fields = {f.name for f in dataclasses.fields(method) if f.init}
    shared = fields & set(estimator.get_params(deep=False))
    assert {"tol", "max_iter"} & fields <= shared
    for name in shared:
        assert getattr(method, name) == getattr(estimator, name)
    if "estimator_name" in fields:
        assert method.estimator_name == cls.__name__
    estimator.set_params(tol=1e-3)  # a parameter set later is read at the next fit
    assert "tol" not in fields or estimator._new_posterior_method().tol == 1e-3
