"""The package's layers import only from the layers above them (docs/developer.md, "Layers"),
and no module imports itself through others: not even inside a function, where a cycle
imports fine until a caller finds the half-initialized module."""

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vsbayes"

# Module prefix -> layer. Layer 0 holds the utilities every layer may use.
LAYERS = {
    "vsbayes._blas": 0,
    "vsbayes._choices": 0,
    "vsbayes._indices": 0,
    "vsbayes._lapack": 0,
    "vsbayes._linalg": 0,
    "vsbayes._memory": 0,
    "vsbayes._random": 0,
    "vsbayes._version": 0,
    "vsbayes._sums": 0,
    "vsbayes._warnings": 0,
    "vsbayes._progress": 0,
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


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _parsed(source: str) -> ast.Module:
    """The syntax tree of a source text, parsed once: each module's imports are read by its
    own test and again by the import graph's (keyed by the text, so never a stale tree)."""
    return ast.parse(source)


def _imports(path: Path, package: Path = PACKAGE):
    """``(module, names)`` of every import statement in the file, at any depth (inside
    functions too), with relative imports made absolute."""
    name = module_name(path, package)
    parent = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(_parsed(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level:
                base = parent.split(".")
                base = base[: len(base) - node.level + 1]
                yield ".".join([*base, node.module] if node.module else base), names
            else:
                yield node.module, names


def imported_modules(path: Path):
    for module, _ in _imports(path):
        yield module


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


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` → the package's modules it imports (``from a import b``
    imports the module ``a.b`` if there is one, else ``a``)."""
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        graph[name] = set()
        for module, names in _imports(path, package):
            if module in paths:
                submodules = {f"{module}.{n}" for n in names} & paths.keys()
                graph[name] |= submodules
                if len(submodules) < len(names) or not names:
                    graph[name].add(module)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import one another (Tarjan's strongly
    connected components, with a module importing itself a group of its own)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                groups.append(set(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph, group: set[str]) -> list[str]:
    """A path ``[a, b, …, a]`` of imports within ``group``, found breadth first."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    for node in queue:
        for target in sorted(graph[node] & group):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")


def test_no_module_imports_itself_through_others():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycles_through_imports_in_functions_are_found(tmp_path):
    # As between the binary EP and its chunked sweeps once: the second import was inside
    # a function, to keep the cycle from breaking the package's import.
    package = tmp_path / "vsbayes"
    (package / "approximations").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import approximations\n")
    (package / "approximations" / "__init__.py").write_text("from .ep import fit\n")
    (package / "approximations" / "ep.py").write_text(
        "from ..exceptions import Error\n\ndef fit(model):\n    from .chunked import fit_chunks\n"
    )
    (package / "approximations" / "chunked.py").write_text("from .ep import fit\n")
    (package / "exceptions.py").write_text("class Error(Exception):\n    pass\n")
    graph = import_graph(package)
    assert graph["vsbayes.approximations.ep"] == {
        "vsbayes.exceptions",
        "vsbayes.approximations.chunked",
    }
    assert import_cycles(graph) == [
        [
            "vsbayes.approximations.chunked",
            "vsbayes.approximations.ep",
            "vsbayes.approximations.chunked",
        ]
    ]
