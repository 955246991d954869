"""The package's layers import only from the layers above them (docs/developer.md, "Layers")."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vsbayes"

# Module prefix -> layer. Layer 0 holds the utilities every layer may use.
LAYERS = {
    "vsbayes._blas": 0,
    "vsbayes._indices": 0,
    "vsbayes._memory": 0,
    "vsbayes._random": 0,
    "vsbayes._version": 0,
    "vsbayes._sums": 0,
    "vsbayes._warnings": 0,
    "vsbayes.exceptions": 0,
    "vsbayes.gaussian": 1,
    "vsbayes.sampling": 2,
    "vsbayes.engine": 3,
    "vsbayes.models": 4,
    "vsbayes.approximations": 5,
    "vsbayes.estimators": 6,
    "vsbayes.cli": 7,
    "vsbayes.__main__": 7,
}


def layer_of(module: str) -> int | None:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path):
    tree = ast.parse(path.read_text())
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                yield ".".join([*base, node.module] if node.module else base)
            else:
                yield node.module


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if module_name(p) != "vsbayes")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_follow_the_layers(path):
    own = layer_of(module_name(path))
    assert own is not None, f"{module_name(path)} is in no layer: add it to LAYERS"
    for target in imported_modules(path):
        if target and target.startswith("vsbayes"):
            theirs = layer_of(target)
            assert theirs is not None and theirs <= own, (
                f"{module_name(path)} (layer {own}) imports {target} (layer {theirs})"
            )
