"""The examples in the docstrings run and print what they show, and the estimators'
documented defaults are their signatures'."""

import ast
import doctest
import importlib
import inspect
import pkgutil
import re

import pytest

import vsbayes
from vsbayes.estimators import ESTIMATORS

MODULES = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(vsbayes.__path__, "vsbayes.")
    if not name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_documented_defaults_match_the_signature(cls):
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if parameter.default is inspect.Parameter.empty:
            continue
        documented = re.search(rf"^{name} : .*default=(.+)$", inspect.getdoc(cls), re.MULTILINE)
        assert documented, name
        assert ast.literal_eval(documented.group(1)) == parameter.default, name
