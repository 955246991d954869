"""Every example script runs to completion (with a non-interactive plotting backend).

The scripts run in one process of their own (tests/_run_examples.py), started when the tests
are collected (tests/conftest.py): on the other core while the tests before these run here.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from _helpers import EarlySubprocess

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))
WORKER = Path(__file__).with_name("_run_examples.py")


def worker_command(scratch: Path, items=()) -> list[str]:
    """The worker over the selected examples (all when none is said)."""
    scripts = [item.callspec.params["script"] for item in items] or EXAMPLES
    return [sys.executable, str(WORKER), *map(str, scripts)]


RUN_EXAMPLES = EarlySubprocess(
    "example_runs",
    worker_command,
    env=lambda: dict(os.environ, MPLBACKEND="Agg"),
    when=lambda: importlib.util.find_spec("matplotlib") is not None,
)


@pytest.fixture(scope="module")
def example_runs():
    pytest.importorskip("matplotlib", reason="examples need the 'plot' extra (matplotlib)")
    done = RUN_EXAMPLES.result()
    errors = {}
    for line in done.stdout.splitlines():
        if line.startswith('{"script"'):  # the scripts' own output is on stdout too
            result = json.loads(line)
            errors[result["script"]] = result["error"]
    return done, errors


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, example_runs):
    done, errors = example_runs
    assert str(script) in errors, f"the worker stopped before it: {done.stderr[-4000:]}"
    assert errors[str(script)] is None, errors[str(script)]
