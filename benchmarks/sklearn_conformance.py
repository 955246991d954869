"""scikit-learn's own LogisticRegression tests, run with VSLogisticRegression in its place.

The installed scikit-learn's ``sklearn/linear_model/tests/test_logistic.py`` is copied to a
temporary folder with its ``LogisticRegression`` replaced by a subclass of
:class:`vsbayes.VSLogisticRegression` that only records that it was made; every test is run
and its outcome recorded. A test counts as *exercising the VS estimator* when it makes one
(fitted or not: a test that fails on a missing method counts); the others
(``LogisticRegressionCV`` alone, private solver paths) are listed but not counted. Every
keyword runs: ``penalty="l1"`` and ``"elasticnet"`` are the Laplace and elastic-net
priors, whose posterior mean is not the sparse L1 solution (docs/differences.md).

    python benchmarks/sklearn_conformance.py            # 35 s on 2 idle cores without the
                                                        # L1 cases; 20 min with them, loaded
    python benchmarks/sklearn_conformance.py --check    # CI: no test that passed may fail

writes ``benchmarks/results/sklearn_conformance.{json,md}``: the counts, and every failure and
skip with its first line. ``docs/differences.md`` explains each remaining difference.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import sklearn

import vsbayes

RESULTS = Path(__file__).resolve().parent / "results"

# Replaces scikit-learn's estimator in the copied test module. Written to the temporary
# folder as a module of its own, so the tests import it as they import scikit-learn's.
FACTORY = '''
from vsbayes import VSLogisticRegression

FITS = []


class LogisticRegression(VSLogisticRegression):
    """VSLogisticRegression under scikit-learn's name; records each one made."""

    def __new__(cls, *args, **kwargs):
        FITS.append(cls.__name__)  # made (cloned too): the test exercises it
        return super().__new__(cls)


CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def outcome_message(report) -> str:
    """A test report's reason in one line: the skip's, or the failure's error."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")[:300]
    if report.outcome == "passed":
        return ""
    text = (report.longreprtext or "").strip()
    # A chained exception is printed cause first: the error raised is the last one.
    for marker in CHAINED:
        text = text.rsplit(marker, 1)[-1]
    lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
    message = lines[0][1:].strip() if lines else text.splitlines()[-1] if text else ""
    return message[:300]
'''

CONFTEST = """
import json
import os

import pytest

import _vs_factory

RECORDS = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _vs_factory.FITS.clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        RECORDS.append({
            "test": item.nodeid.split("::", 1)[1],
            "outcome": report.outcome,
            "fits_vs": bool(_vs_factory.FITS),
            "message": _vs_factory.outcome_message(report),
        })


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["VSBAYES_CONFORMANCE_OUT"], "w") as out:
        json.dump(RECORDS, out)
"""


def prepare(folder: Path) -> Path:
    source = Path(sklearn.__file__).parent / "linear_model" / "tests" / "test_logistic.py"
    text = source.read_text()
    pattern = r"from sklearn\.linear_model import LogisticRegression, "
    if not re.search(pattern, text):
        raise RuntimeError(f"{source}: the import of LogisticRegression was not found")
    replacement = "from _vs_factory import LogisticRegression\nfrom sklearn.linear_model import "
    text = re.sub(pattern, replacement, text)
    target = folder / "test_logistic_vs.py"
    target.write_text(text)
    (folder / "_vs_factory.py").write_text(FACTORY)
    (folder / "conftest.py").write_text(CONFTEST)
    return target


def run(extra: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        test_file = prepare(folder)
        out = folder / "records.json"
        # The tests import the vsbayes this script imports (the tree it runs from, not
        # whichever one is installed), after the temporary folder's modules.
        paths = [str(folder), str(Path(vsbayes.__file__).resolve().parents[1])]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env = dict(os.environ, VSBAYES_CONFORMANCE_OUT=str(out), PYTHONPATH=os.pathsep.join(paths))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "sklearn.conftest",
                "--rootdir",
                str(folder),
                "-o",
                "addopts=",
                str(test_file),
                *extra,
            ],
            cwd=folder,
            env=env,
            check=False,
            # pytest's own closing line ("N failed, N passed") would read as this
            # project's test result in a CI log: only the summary below is printed.
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return json.loads(out.read_text())


def summarize(records: list[dict]) -> dict:
    vs = [r for r in records if r["fits_vs"]]
    counted = [r for r in vs if r["outcome"] != "skipped"]
    passed = [r for r in counted if r["outcome"] == "passed"]
    return {
        "scikit_learn": sklearn.__version__,
        "collected": len(records),
        "fit_vs": len(vs),
        "fit_vs_run": len(counted),
        "fit_vs_passed": len(passed),
        "fit_vs_failed": len(counted) - len(passed),
        "fit_vs_skipped": len(vs) - len(counted),
        "pass_rate": len(passed) / max(len(counted), 1),
        "records": records,
    }


def write(summary: dict, machine: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sklearn_conformance.json").write_text(json.dumps(summary, indent=1))
    lines = [
        "# scikit-learn's test_logistic.py with VSLogisticRegression in its place",
        "",
        machine,
        "",
        f"scikit-learn {summary['scikit_learn']}: {summary['collected']} tests collected; "
        f"{summary['fit_vs']} exercise the VS estimator (make one), of which "
        f"{summary['fit_vs_skipped']} are skipped (by the tests themselves); of the "
        f"{summary['fit_vs_run']} run, "
        f"**{summary['fit_vs_passed']} pass ({100 * summary['pass_rate']:.0f} %)**, "
        f"{summary['fit_vs_failed']} fail.",
        "",
        "| test | outcome | first line of the failure or skip |",
        "|---|---|---|",
    ]
    for r in summary["records"]:
        if r["fits_vs"] and r["outcome"] != "passed":
            message = r["message"].replace("|", "\\|")
            lines.append(f"| `{r['test']}` | {r['outcome']} | {message} |")
    (RESULTS / "sklearn_conformance.md").write_text("\n".join(lines) + "\n")


def regressions(summary: dict, committed: dict) -> list[str]:
    """The tests that passed in the committed run and do not pass now."""
    now = {r["test"]: r["outcome"] for r in summary["records"]}
    return [
        r["test"]
        for r in committed["records"]
        if r["fits_vs"] and r["outcome"] == "passed" and now.get(r["test"], "passed") != "passed"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=None, help="pytest -k expression (a subset)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the committed results instead of writing them: exit 1 if a test "
        "that passed there does not pass now (CI)",
    )
    args = parser.parse_args()
    extra = ["-k", args.k] if args.k else []
    summary = summarize(run(extra))
    print(
        f"conformance: of {summary['fit_vs_run']} tests run with VSLogisticRegression, "
        f"{summary['fit_vs_passed']} pass ({100 * summary['pass_rate']:.0f} %); "
        f"{summary['fit_vs_skipped']} skipped"
    )
    if args.check:
        committed = json.loads((RESULTS / "sklearn_conformance.json").read_text())
        lost = regressions(summary, committed)
        print(f"{len(lost)} tests that passed in the committed run do not pass now: {lost}")
        if committed["scikit_learn"] != summary["scikit_learn"]:
            # Another release's test file: its tests may differ for reasons of its own.
            print(f"(committed with scikit-learn {committed['scikit_learn']}: not failing)")
            lost = []
        sys.exit(1 if lost else 0)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine, machine_line

    if not args.k:
        write(summary, machine_line(machine()))


if __name__ == "__main__":
    main()
