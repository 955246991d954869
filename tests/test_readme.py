"""README.md: the two set-up commands come first, CI runs the test one, the code runs."""

import re
from pathlib import Path

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


def test_main_job_runs_through_the_console_script():
    """`vsbayes fit`, the README's main job, through the installed entry point."""
    import shutil
    import subprocess

    command = shutil.which("vsbayes")
    assert command, "the vsbayes console script is not installed (pip install -e .)"
    done = subprocess.run([command, "fit"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "log evidence" in done.stdout and "worst radius" in done.stdout
