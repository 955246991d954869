"""The documentation builds with Sphinx, warnings as errors (needs the `docs` extra), and its
pages point at files that exist, showing every committed benchmark plot; the keywords
written in estimator calls are parameters."""

import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest
from _helpers import EarlySubprocess

import vsbayes

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: A figure, image or include directive of a MyST page and its path.
DIRECTIVE = re.compile(r"^`{3,}\{(figure|image|include)\}\s+(\S+)", re.MULTILINE)


def _directives(page):
    return [
        (kind, (page.parent / path).resolve()) for kind, path in DIRECTIVE.findall(page.read_text())
    ]


def test_pages_point_at_files_that_exist():
    missing = [
        f"{page.name}: {kind} {path}"
        for page in DOCS.glob("*.md")
        for kind, path in _directives(page)
        if not path.is_file()
    ]
    assert not missing


def test_benchmark_page_shows_every_committed_plot():
    directives = _directives(DOCS / "benchmarks.md")
    shown = {path for kind, path in directives if kind in ("figure", "image")}
    results = ROOT / "benchmarks" / "results"
    cache = results / "cache"  # generated on demand, ignored by git
    plots = {path.resolve() for path in results.rglob("*.png") if cache not in path.parents}
    assert not sorted(str(path.relative_to(ROOT)) for path in plots - shown)
    # The page puts each plot under its results' title, the first line of the results file.
    for kind, path in directives:
        if kind == "include" and path.is_file():
            assert path.read_text().startswith("# "), path


# The gallery scripts are run by test_examples.py; here only the pages are built. Smart
# quotes (typography only, which warns of nothing) are left out. Sphinx's "dummy" builder
# reads every page and resolves every reference as the html builder does, but writes
# nothing: 28% less CPU. Breaking on purpose a label, a document, a MyST link and anchor, an
# image, a figure, a toctree entry, a directive, an autosummary entry, RST inline markup in
# a page, a docstring and a gallery example, a duplicate label and html_static_path failed
# both builds with the same warnings; only a theme option the theme does not know is
# checked by the html builder alone (docs/conf.py sets two). The build starts when the
# tests are collected (tests/conftest.py): it runs on the other core meanwhile.
DOCS_MODULES = ("sphinx", "numpydoc", "pydata_sphinx_theme", "sphinx_gallery", "myst_parser")


def sphinx_command(scratch: Path, items=()) -> list[str]:
    return [
        sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "dummy",
        "-D", "plot_gallery=0", "-D", "smartquotes=0",
        "-d", str(scratch / "doctrees"), str(DOCS), str(scratch / "out"),
    ]  # fmt: skip


DOCS_BUILD = EarlySubprocess(
    "docs_build",
    sphinx_command,
    when=lambda: all(importlib.util.find_spec(module) for module in DOCS_MODULES),
)


@pytest.fixture(scope="module")
def docs_build():
    for module in DOCS_MODULES:
        pytest.importorskip(module, reason='the docs need the "docs" extra')
    return DOCS_BUILD.result(), DOCS_BUILD.scratch


@pytest.mark.slow
def test_docs_build_without_warnings(docs_build):
    done, scratch = docs_build
    assert done.returncode == 0, done.stderr[-4000:]
    assert (scratch / "doctrees" / "api.doctree").is_file()


# The Python blocks of the pages users copy from run as written, in order, each page's blocks
# sharing one namespace as a reader's session would (README.md's: tests/test_readme.py;
# developer.md's: tests/test_fit_path.py). A block that cannot run as written says so on its
# first line, where the reader sees it: "# (sketch: ...)" where it stands for the reader's
# own data or cluster, "# (slow: ...)" where it takes seconds; those are skipped, by name.
RUN_PAGES = ("guide.md", "estimators.md", "posterior.md", "differences.md")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"# \((sketch|slow):[^)]*\)")


def _page_blocks(page):
    return PYTHON_BLOCK.findall((DOCS / page).read_text())


@pytest.fixture(scope="module")
def page_sessions():
    """Per page, the namespace its blocks ran in and the indices of the blocks run."""
    return {page: ({}, set()) for page in RUN_PAGES}


@pytest.mark.parametrize(
    ("page", "index"),
    [(page, index) for page in RUN_PAGES for index in range(len(_page_blocks(page)))],
    ids=lambda value: str(value),
)
def test_page_code_runs_as_written(page, index, page_sessions):
    blocks = _page_blocks(page)
    marker = NOT_RUN.match(blocks[index])
    if marker:
        pytest.skip(f"{page}, block {index + 1}: marked {marker.group(0)}")
    namespace, done = page_sessions[page]
    for earlier in range(index + 1):  # the blocks before it too, when it is run alone
        if earlier not in done and not NOT_RUN.match(blocks[earlier]):
            done.add(earlier)
            exec(compile(blocks[earlier], f"{DOCS / page}, block {earlier + 1}", "exec"), namespace)


def test_every_page_with_python_blocks_is_run():
    """A page that gains Python blocks is added to RUN_PAGES (or to this list, with why)."""
    run_elsewhere = {"developer.md"}  # tests/test_fit_path.py runs its one block
    with_blocks = {page.name for page in DOCS.glob("*.md") if _page_blocks(page.name)}
    assert with_blocks - set(RUN_PAGES) - run_elsewhere == set()


# What the pages say in prose, not only in the blocks that run: a keyword written in an
# estimator's or the engine's call (`VSLogisticRegression(target_kl=0.01)`) is a parameter, and
# README.md's links lead to files (Sphinx checks the docs pages' own, not README's).
PROSE_FILES = [
    ROOT / "README.md",
    *sorted(page for page in DOCS.glob("*.md") if page.name != "decisions.md"),
    *sorted((ROOT / "examples").glob("*.py")),
]
#: A call of one of vsbayes's public names: an estimator, a prior, a fitter of the engine.
CALL = re.compile(r"(?<![\w.])(?:vsbayes\.)?(\w+)\(")


def _keywords(text: str, start: int) -> list[str]:
    """The keyword names at the top level of the call whose arguments begin at start."""
    depth, top = 1, []
    for char in text[start:]:
        depth += (char in "([{") - (char in ")]}")
        if depth == 0:
            break
        top.append(char if depth == 1 else " ")
    return re.findall(r"(?:^|,)\s*(\w+)\s*=(?!=)", "".join(top))


#: The estimators' own public methods (scikit-learn's inherited ones are its to document).
METHODS = {
    name
    for klass in vsbayes.VSLogisticRegression.__mro__
    if klass.__module__.startswith("vsbayes")
    for name in vars(klass)
    if not name.startswith("_") and callable(getattr(vsbayes.VSLogisticRegression, name, None))
}


def test_keywords_written_in_calls_are_parameters():
    unknown, checked = [], 0
    for path in PROSE_FILES:
        text = path.read_text()
        for call in CALL.finditer(text):
            name = call.group(1)
            if name in vsbayes.__all__:
                target = getattr(vsbayes, name)
            elif name in METHODS:  # `model.loo(X, y, sample_weight=None)`
                target = getattr(vsbayes.VSLogisticRegression, name)
            else:  # scikit-learn's, numpy's, a sentence's
                continue
            if not callable(target):
                continue
            parameters = set(inspect.signature(target).parameters)
            if target is vsbayes.config_context:  # (**settings): get_config's keys
                parameters = set(vsbayes.get_config())
            keywords = _keywords(text, call.end())
            checked += len(keywords)
            unknown += [
                f"{path.name}: {call.group(1)}({keyword}=...)"
                for keyword in keywords
                if keyword not in parameters
            ]
    assert checked > 50 and not unknown


def test_readme_links_lead_to_files():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert links and not missing
