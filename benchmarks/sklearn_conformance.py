"""scikit-learn's own LogisticRegression tests, run with VSLogisticRegression in its place.

The installed scikit-learn's ``sklearn/linear_model/tests/test_logistic.py`` is copied to a
temporary folder with its ``LogisticRegression`` replaced by a subclass of
:class:`vsbayes.VSLogisticRegression` that only records that it was fitted; every test is
run and its outcome recorded. A test counts as *fitting the VS estimator* when it calls that
``fit`` at least once; the others (``LogisticRegressionCV`` alone, private solver paths) are
listed but not counted. Penalties that vsbayes does not have (``penalty="l1"``,
``"elasticnet"``) are skipped at ``fit`` with the reason; every other keyword runs.

    python benchmarks/sklearn_conformance.py            # about 2-4 min on 2 cores

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

RESULTS = Path(__file__).resolve().parent / "results"

# Replaces scikit-learn's estimator in the copied test module. Written to the temporary
# folder as a module of its own, so the tests import it as they import scikit-learn's.
FACTORY = '''
import pytest
from vsbayes import VSLogisticRegression

FITS = []


def _laplace_prior(estimator):
    penalty, ratio = estimator.penalty, estimator.l1_ratio
    if penalty == "deprecated":
        return ratio not in (0, None)
    return penalty in ("l1", "elasticnet")


class LogisticRegression(VSLogisticRegression):
    """VSLogisticRegression under scikit-learn's name; records each fit."""

    def fit(self, X, y, sample_weight=None):
        FITS.append(type(self).__name__)
        if _laplace_prior(self):
            pytest.skip(
                f"penalty={self.penalty!r}, l1_ratio={self.l1_ratio!r}: a Laplace prior, "
                "which vsbayes does not have yet"
            )
        return super().fit(X, y, sample_weight)
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
        message = ""
        if report.outcome != "passed":
            text = report.longreprtext or ""
            lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
            message = (lines[0][1:].strip() if lines else text.strip().splitlines()[-1:] and
                       text.strip().splitlines()[-1])[:300]
        RECORDS.append({
            "test": item.nodeid.split("::", 1)[1],
            "outcome": report.outcome,
            "fits_vs": bool(_vs_factory.FITS),
            "message": message,
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
        env = dict(os.environ, VSBAYES_CONFORMANCE_OUT=str(out), PYTHONPATH=str(folder))
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
        f"{summary['fit_vs']} fit the VS estimator, of which {summary['fit_vs_skipped']} are "
        f"skipped (penalties vsbayes does not have); of the {summary['fit_vs_run']} run, "
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=None, help="pytest -k expression (a subset)")
    args = parser.parse_args()
    extra = ["-k", args.k] if args.k else []
    summary = summarize(run(extra))
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _common import machine, machine_line

        machine = machine_line(machine())
    except Exception:  # the harness is optional here: the counts do not depend on it
        machine = f"Python {sys.version.split()[0]}, scikit-learn {sklearn.__version__}"
    if not args.k:
        write(summary, machine)
    print({k: v for k, v in summary.items() if k != "records"})


if __name__ == "__main__":
    main()
