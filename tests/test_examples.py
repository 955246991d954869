"""Every example script runs to completion (with a non-interactive plotting backend)."""

import runpy
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, monkeypatch):
    pytest.importorskip("matplotlib", reason="examples need the 'plot' extra (matplotlib)")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(script.parent)
    runpy.run_path(str(script), run_name="__main__")
