"""The code base is ruff-clean and ruff-formatted (configuration in pyproject.toml)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["vsbayes", "tests", "benchmarks", "examples"]


@pytest.mark.skipif(
    shutil.which("ruff") is None,
    reason="ruff is not installed: pip install -e '.[test]' provides it",
)
@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=" ".join)
def test_ruff_clean(command):
    done = subprocess.run(
        ["ruff", *command, *PATHS], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
