"""The documentation builds with Sphinx, warnings as errors (needs the `docs` extra)."""

import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path):
    for module in ("sphinx", "numpydoc", "pydata_sphinx_theme", "sphinx_gallery", "myst_parser"):
        pytest.importorskip(module, reason='the docs need the "docs" extra')
    # The gallery scripts are run by test_examples.py; here only the pages are built.
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-D", "plot_gallery=0", "-d", str(tmp_path / "doctrees"),
         str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "html" / "api.html").is_file()
