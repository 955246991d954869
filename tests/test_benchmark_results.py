"""The benchmarks stay a small harness: no committed result over 1 MB, every script imports.

Large references are generated on demand into ``benchmarks/results/cache/`` (ignored by git);
every script runs its work only under ``if __name__ == "__main__"``, so importing it is cheap
and shows that it still matches the library's API.
"""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
CACHE = RESULTS / "cache"
MAX_BYTES = 2**20
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def test_no_result_file_over_one_megabyte():
    large = [
        f"{path.relative_to(ROOT)}: {path.stat().st_size / MAX_BYTES:.1f} MB"
        for path in RESULTS.rglob("*")
        if path.is_file() and CACHE not in path.parents and path.stat().st_size > MAX_BYTES
    ]
    assert not large, "generate these into benchmarks/results/cache/ instead"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_guards_its_main(script):
    tree = ast.parse(script.read_text())
    top_level_calls = [
        ast.unparse(node.value.func)
        for node in tree.body
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    ]
    assert "main" not in top_level_calls, "main() runs at import time"
    if script.name.startswith("_"):  # helper modules have no main
        return
    guards = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    ]
    assert guards, 'no `if __name__ == "__main__":` guard'


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_imports(script, monkeypatch):
    pytest.importorskip("matplotlib")
    # The scripts import their helpers as top-level modules, from their own folder; one
    # (distributed.py) removes that folder from the path, so the path is restored after.
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS), *sys.path])
    name = f"_benchmark_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:  # an optional extra (dask, numpyro...) is not installed
        if error.name and error.name.split(".")[0] in ("distributed", "dask", "numpyro", "jax"):
            pytest.skip(f"needs {error.name}")
        raise
    if not script.name.startswith("_"):
        assert callable(getattr(module, "main", None)), "no main()"
