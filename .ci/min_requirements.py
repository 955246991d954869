"""Print the runtime dependencies' declared floors as exact pins, one per line.

Reads ``[project].dependencies`` of pyproject.toml (with tomllib: Python ≥ 3.11, as CI
runs), where every entry must be ``name>=version`` (optionally with an upper bound after a
comma), and prints ``name==version``: the floors are written once, in pyproject.toml, and
.ci/run installs exactly them in its minimum-dependencies environment.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*>=\s*([0-9][^,;\s]*)")


def main() -> int:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    for requirement in dependencies:
        match = FLOOR.match(requirement)
        if match is None:
            print(f"no '>=' floor in dependency {requirement!r}", file=sys.stderr)
            return 1
        print(f"{match[1]}=={match[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
