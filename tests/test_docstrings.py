"""The examples in the docstrings run and print what they show."""

import doctest
import importlib
import pkgutil

import pytest

import vsbayes

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
