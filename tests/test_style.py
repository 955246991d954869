"""The code base is ruff-clean (configuration in pyproject.toml)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    shutil.which("ruff") is None,
    reason="ruff is not installed: pip install -e '.[test]' provides it",
)
def test_ruff_clean():
    done = subprocess.run(
        ["ruff", "check", "vsbayes", "tests", "benchmarks", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
