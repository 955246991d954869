"""README.md: the two set-up commands come first, CI runs the test one, the code runs."""

import re
import shutil
from pathlib import Path

import pytest
from _helpers import EarlySubprocess

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def code_blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_begins_with_the_two_setup_commands():
    title, block = README.split("\n\n", 2)[:2]
    assert title.startswith("# vsbayes") and block.startswith("```bash")
    first = code_blocks("bash")[0].splitlines()
    assert first[0].split("#")[0].strip() == "pip install -e . && vsbayes fit"
    assert first[1].split("#")[0].strip() == 'pip install -e ".[test]" && pytest'


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]" && pytest\n' in ci


def test_quickstart_code_runs():
    for block in code_blocks("python"):
        exec(compile(block, "README.md", "exec"), {})


# `vsbayes fit`, the README's main job, through the installed entry point: started when the
# tests are collected (tests/conftest.py), a new interpreter's imports and a fit, on the
# other core meanwhile.
CONSOLE_SCRIPT_FIT = EarlySubprocess(
    "console_script_fit",
    lambda scratch, items: [shutil.which("vsbayes"), "fit"],
    when=lambda: shutil.which("vsbayes") is not None,
)


@pytest.fixture
def console_script_fit():
    return CONSOLE_SCRIPT_FIT.result() if CONSOLE_SCRIPT_FIT.when() else None


def test_main_job_runs_through_the_console_script(console_script_fit):
    """`vsbayes fit`, the README's main job, through the installed entry point."""
    assert shutil.which("vsbayes"), "the vsbayes console script is not installed (pip install -e .)"
    done = console_script_fit
    assert done.returncode == 0, done.stderr
    assert "log evidence" in done.stdout and "worst radius" in done.stdout
