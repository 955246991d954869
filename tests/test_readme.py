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
