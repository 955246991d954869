"""scikit-learn's other test modules that use LogisticRegression, run with VSLogisticRegression.

Users build ``LogisticRegression`` into pipelines, searches, calibration, stacking, one-vs-rest
wrappers, feature selection, inspection tools and displays. This sweep runs the installed
scikit-learn's own tests of those tools with ``sklearn.linear_model.LogisticRegression``
replaced (before any test module is imported) by the factory of
``benchmarks/sklearn_conformance.py``: a subclass of :class:`vsbayes.VSLogisticRegression`
under scikit-learn's name that records that it was made or fitted. A test counts when it
makes or fits one; the others are collected but not counted. Each failing test is then
rerun with scikit-learn's own estimator: a failure that also happens there is the
environment's, not vsbayes's, and is listed apart.

Runs are bounded: each test by an alarm (``--test-timeout``, default 120 s), each module by a
timeout (``--module-timeout``, default 900 s); a module cut short keeps the outcomes it
recorded and says so.

    nice -n 10 python benchmarks/sklearn_dropin_sweep.py    # all modules: ~45 min, 2 loaded cores
    python benchmarks/sklearn_dropin_sweep.py --merge --modules tests/test_calibration.py
    # every counted test with both estimators: each module's pass count with each (D-192)
    nice -n 10 python benchmarks/sklearn_dropin_sweep.py --with-sklearn
    # a sibling in LogisticRegression's place (printed, not written)
    python benchmarks/sklearn_dropin_sweep.py --estimator EPProbitRegression --modules ...

writes ``benchmarks/results/sklearn_dropin_sweep.{json,md}``; ``docs/differences.md``
explains each remaining difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sklearn
from sklearn_conformance import FACTORY

import vsbayes
from vsbayes.estimators import ESTIMATORS

RESULTS = Path(__file__).resolve().parent / "results"
SKLEARN = Path(sklearn.__file__).resolve().parent

# The installed scikit-learn's test modules that construct LogisticRegression (grep; a
# module's tests can be selected after "::", comma separated). Left out: the ones about
# LogisticRegression's own solvers (test_logistic.py: sklearn_conformance.py; test_sag.py),
# the estimator lists of tests/test_common.py and tests/test_docstring_parameters.py (not
# users' code), and the modules none of whose tests makes or fits the replaced estimator
# (tests/test_metaestimators_metadata_routing.py, utils/tests/test_pprint.py).
MODULES = [
    "tests/test_calibration.py",
    "tests/test_multiclass.py",
    "tests/test_multioutput.py",
    "tests/test_pipeline.py",
    "tests/test_metaestimators.py",
    "feature_selection/tests/test_from_model.py",
    "feature_selection/tests/test_rfe.py",
    "inspection/tests/test_partial_dependence.py",
    "inspection/tests/test_permutation_importance.py",
    "inspection/_plot/tests/test_boundary_decision_display.py",
    "model_selection/tests/test_search.py",
    "model_selection/tests/test_validation.py",
    "model_selection/tests/test_classification_threshold.py",
    "ensemble/tests/test_stacking.py",
    "ensemble/tests/test_voting.py",
    "ensemble/tests/test_bagging.py",
    "ensemble/tests/test_weight_boosting.py",
    "semi_supervised/tests/test_self_training.py",
    "frozen/tests/test_frozen.py",
    "metrics/tests/test_score_objects.py",
    "metrics/_plot/tests/test_roc_curve_display.py",
    "metrics/_plot/tests/test_precision_recall_display.py",
    "metrics/_plot/tests/test_det_curve_display.py",
    "metrics/_plot/tests/test_common_curve_display.py",
    "metrics/_plot/tests/test_confusion_matrix_display.py",
    "utils/tests/test_response.py",
    "utils/tests/test_class_weight.py",
    "ensemble/tests/test_common.py",
    "linear_model/tests/test_common.py",
    "metrics/tests/test_ranking.py",
    "svm/tests/test_bounds.py",
    "svm/tests/test_sparse.py",
    "svm/tests/test_svm.py",
    "utils/tests/test_plotting.py",
    "utils/_repr_html/tests/test_estimator.py",
    "utils/_repr_html/tests/test_features.py",
    # Of the estimator checks' own tests, the ones that check LogisticRegression.
    # (scikit-learn 1.9.1's test_check_estimator is not collected: "not a function").
    "utils/tests/test_estimator_checks.py::test_check_estimator_with_class_removed,"
    "test_check_dataframe_column_names_consistency,test_estimator_checks_generator,"
    "test_check_estimator_callback_with_fast_fail_error",
]

# The conformance run's factory, recording fits too: these modules often build the
# estimator in a parametrize list (at collection) and fit that very instance in the test.
SWEEP_FACTORY = (
    FACTORY
    + """

import functools

_fit = LogisticRegression.fit


# wraps: the signature stays fit's (meta-estimators read sample_weight from it).
@functools.wraps(_fit)
def _recording_fit(self, *args, **kwargs):
    FITS.append(type(self).__name__)
    return _fit(self, *args, **kwargs)


LogisticRegression.fit = _recording_fit


# The factory in scikit-learn's place, before the code run imports it: both
# "from sklearn.linear_model import LogisticRegression" and linear_model.LogisticRegression
# then find it.
def install():
    import sklearn.linear_model

    sklearn.linear_model.LogisticRegression = LogisticRegression
"""
)


def write_factory(folder: Path, estimator: str = "VSLogisticRegression") -> None:
    """Write the factory module ``_vs_factory.py`` into ``folder`` (put it on the run's
    path); another of vsbayes's classifiers takes VSLogisticRegression's place if named."""
    (folder / "_vs_factory.py").write_text(SWEEP_FACTORY.replace("VSLogisticRegression", estimator))


def run_environment(folder: Path, replace: bool, **variables: str) -> dict:
    """The environment of a sweep's subprocess run from ``folder``: the factory there and
    the vsbayes this script imports (the tree it runs from) first on its path, the
    replacement on or off, nothing written into the installed packages, matplotlib's Agg
    backend; plus ``variables``."""
    paths = [str(folder), str(Path(vsbayes.__file__).resolve().parents[1])]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return dict(
        os.environ,
        VSBAYES_SWEEP_REPLACE="1" if replace else "0",
        PYTHONPATH=os.pathsep.join(paths),
        PYTHONDONTWRITEBYTECODE="1",
        MPLBACKEND="Agg",
        **variables,
    )


# A pytest plugin (loaded with -p before any conftest or test module is imported): puts the
# factory in sklearn.linear_model, records each test's outcome as one JSON line as it ends
# (a module cut short by its timeout keeps what it recorded), bounds each test by an alarm.
PLUGIN = """
import json
import os
import signal

import pytest

import _vs_factory

if os.environ.get("VSBAYES_SWEEP_REPLACE") == "1":
    _vs_factory.install()

TIMEOUT = int(os.environ.get("VSBAYES_SWEEP_TEST_TIMEOUT", "120"))


class TestTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise TestTimeout(f"test timed out after {TIMEOUT} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _vs_factory.FITS.clear()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        record = {
            "test": item.nodeid.split("::", 1)[1],
            "outcome": "xfailed" if hasattr(report, "wasxfail") else report.outcome,
            "fits_vs": bool(_vs_factory.FITS),
            "message": _vs_factory.outcome_message(report),
            "seconds": round(report.duration, 2),
        }
        with open(os.environ["VSBAYES_SWEEP_OUT"], "a") as out:
            out.write(json.dumps(record) + "\\n")
"""


def run_module(
    module: str,
    replace: bool,
    test_timeout: int,
    module_timeout: int,
    select: list[str] | None,
    estimator: str = "VSLogisticRegression",
) -> tuple[list[dict], bool, float]:
    """``(records, finished, seconds)`` of one test module's run."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_factory(folder, estimator)  # (--estimator: another classifier in its place)
        (folder / "_vs_sweep_plugin.py").write_text(PLUGIN)
        out = folder / "records.jsonl"
        env = run_environment(
            folder,
            replace,
            VSBAYES_SWEEP_OUT=str(out),
            VSBAYES_SWEEP_TEST_TIMEOUT=str(test_timeout),
        )
        # The module runs where it is installed, under scikit-learn's own conftest files.
        targets = (
            [f"{SKLEARN / module}::{name}" for name in select]
            if select
            else [str(SKLEARN / module)]
        )
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "_vs_sweep_plugin",
            "--rootdir",
            str(SKLEARN),
            "--confcutdir",
            str(SKLEARN),
            "-o",
            "addopts=",
            *targets,
        ]
        start = time.perf_counter()
        try:
            subprocess.run(
                command,
                cwd=folder,
                env=env,
                check=False,
                timeout=module_timeout,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            finished = True
        except subprocess.TimeoutExpired:
            finished = False
        seconds = time.perf_counter() - start
        text = out.read_text() if out.exists() else ""
        return [json.loads(line) for line in text.splitlines()], finished, seconds


def summarize_module(module: str, records: list[dict], finished: bool, seconds: float) -> dict:
    vs = [r for r in records if r["fits_vs"]]
    counted = [r for r in vs if r["outcome"] in ("passed", "failed")]
    passed = [r for r in counted if r["outcome"] == "passed"]
    own = [r for r in counted if r["outcome"] == "failed" and r.get("fails_with_sklearn")]
    # With --with-sklearn: the same tests' outcomes with scikit-learn's estimator.
    compared = [r for r in counted if "with_sklearn" in r]
    return {
        "module": module,
        "finished": finished,
        "seconds": round(seconds, 1),
        "collected_run": len(records),
        "fit_vs": len(vs),
        "fit_vs_run": len(counted),
        "fit_vs_passed": len(passed),
        "fit_vs_failed": len(counted) - len(passed),
        "fit_vs_failed_with_sklearn_too": len(own),
        "fit_vs_skipped_or_xfailed": len(vs) - len(counted),
        "with_sklearn_run": len(compared),
        "with_sklearn_passed": sum(r["with_sklearn"] == "passed" for r in compared),
        # The findings: pass with scikit-learn's estimator, fail with vsbayes's.
        "lost": [
            r["test"]
            for r in compared
            if r["with_sklearn"] == "passed" and r["outcome"] == "failed"
        ],
        "records": records,
    }


def write(modules: list[dict], machine: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    run = sum(m["fit_vs_run"] for m in modules)
    passed = sum(m["fit_vs_passed"] for m in modules)
    summary = {
        "scikit_learn": sklearn.__version__,
        "fit_vs_run": run,
        "fit_vs_passed": passed,
        "pass_rate": passed / max(run, 1),
        "with_sklearn_run": sum(m.get("with_sklearn_run", 0) for m in modules),
        "with_sklearn_passed": sum(m.get("with_sklearn_passed", 0) for m in modules),
        "lost": sum(len(m.get("lost", [])) for m in modules),
        # The tests with the VS estimator only: the others are counted, not listed.
        "modules": [{**m, "records": [r for r in m["records"] if r["fits_vs"]]} for m in modules],
    }
    (RESULTS / "sklearn_dropin_sweep.json").write_text(json.dumps(summary, indent=1))
    lines = [
        "# scikit-learn's tests of the tools around LogisticRegression, with VSLogisticRegression",
        "",
        machine,
        "",
        f"scikit-learn {sklearn.__version__}: {len(modules)} test modules run with "
        f"`sklearn.linear_model.LogisticRegression` replaced; of the {run} tests that make "
        f"or fit the VS estimator and run, **{passed} pass ({100 * passed / max(run, 1):.0f} %)**. "
        "A failure marked *also with scikit-learn* fails with scikit-learn's own estimator "
        "too (the environment's, not vsbayes's).",
        "",
        f"Rerun with scikit-learn's own estimator: {summary['with_sklearn_run']} of these "
        f"tests, of which {summary['with_sklearn_passed']} pass; **{summary['lost']} pass "
        "with it and fail with vsbayes's**.",
        "",
        "With `--with-sklearn`, every counted test is run again with scikit-learn's own "
        "estimator: *pass with LogisticRegression* counts those that pass there, *lost* "
        "those that pass there and fail with vsbayes's.",
        "",
        "| module | tests run | make or fit the VS estimator | pass | fail | skipped/xfail "
        "| pass with LogisticRegression | lost | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in modules:
        path, _, names = m["module"].partition("::")
        cut = "" if m["finished"] else " (cut at the module timeout)"
        chosen = f" ({len(names.split(','))} tests chosen)" if names else ""
        lines.append(
            f"| `{path}`{chosen}{cut} | {m['collected_run']} | {m['fit_vs']} | "
            f"{m['fit_vs_passed']} | {m['fit_vs_failed']} | {m['fit_vs_skipped_or_xfailed']} | "
            f"{_with_sklearn(m)} | {m['seconds']:.0f} |"
        )
    lines += [
        "",
        "## Failures",
        "",
        "| module | test | first line of the failure |",
        "|---|---|---|",
    ]
    for m in modules:
        for r in m["records"]:
            if r["fits_vs"] and r["outcome"] == "failed":
                also = " *(also with scikit-learn)*" if r.get("fails_with_sklearn") else ""
                message = r["message"].replace("|", "\\|")
                path = m["module"].partition("::")[0]
                lines.append(f"| `{path}` | `{r['test']}`{also} | {message} |")
    (RESULTS / "sklearn_dropin_sweep.md").write_text("\n".join(lines) + "\n")


def _with_sklearn(module: dict) -> str:
    """A module's "pass with LogisticRegression | lost" cells ("–" when not rerun)."""
    if not module.get("with_sklearn_run"):
        return "– | –"
    return (
        f"{module['with_sklearn_passed']} of {module['with_sklearn_run']} | {len(module['lost'])}"
    )


def _position(module: dict) -> int:
    """A module's place in the table: MODULES's order, others after."""
    return MODULES.index(module["module"]) if module["module"] in MODULES else len(MODULES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="*", default=MODULES, help="paths under sklearn/")
    parser.add_argument("--test-timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--module-timeout", type=int, default=900, help="seconds per module")
    parser.add_argument(
        "--with-sklearn",
        action="store_true",
        help="rerun every counted test with scikit-learn's own estimator, not only the "
        "failures: each module's pass count with both estimators",
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print the figures, write no result files"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace these modules' results in the committed ones, keep the others",
    )
    parser.add_argument(
        "--estimator",
        default="VSLogisticRegression",
        choices=[cls.__name__ for cls in ESTIMATORS],
        help="the vsbayes classifier put in LogisticRegression's place; another than "
        "VSLogisticRegression prints its figures and writes no result files",
    )
    args = parser.parse_args()
    write_results = not args.no_write and args.estimator == "VSLogisticRegression"
    from _common import machine, machine_line

    kept = []
    if args.merge:
        committed = json.loads((RESULTS / "sklearn_dropin_sweep.json").read_text())["modules"]
        rerun = {entry.partition("::")[0] for entry in args.modules}
        kept = [m for m in committed if m["module"].partition("::")[0] not in rerun]
    modules = []
    for entry in args.modules:
        module, _, names = entry.partition("::")
        select = names.split(",") if names else None
        records, finished, seconds = run_module(
            module, True, args.test_timeout, args.module_timeout, select, args.estimator
        )
        counted = [
            r["test"] for r in records if r["fits_vs"] and r["outcome"] in ("passed", "failed")
        ]
        failed = [r["test"] for r in records if r["fits_vs"] and r["outcome"] == "failed"]
        # The same tests with scikit-learn's own estimator: which failures are vsbayes's
        # (--with-sklearn: every counted test, for each module's pass count with both).
        rerun = counted if args.with_sklearn else failed
        if rerun:
            baseline, _, _ = run_module(
                module, False, args.test_timeout, args.module_timeout, rerun
            )
            there = {r["test"]: r["outcome"] for r in baseline}
            for r in records:
                r["fails_with_sklearn"] = there.get(r["test"]) == "failed"
                if args.with_sklearn and r["test"] in there:
                    r["with_sklearn"] = there[r["test"]]
        summary = summarize_module(entry, records, finished, seconds)
        modules.append(summary)
        print(
            f"{module}: {summary['fit_vs_passed']}/{summary['fit_vs_run']} pass "
            + (
                f"(with LogisticRegression {summary['with_sklearn_passed']}/"
                f"{summary['with_sklearn_run']}, lost {len(summary['lost'])}) "
                if args.with_sklearn
                else ""
            )
            + f"({summary['fit_vs_failed_with_sklearn_too']} of the failures also with "
            f"scikit-learn){'' if finished else ' [cut at the timeout]'}, {seconds:.0f} s",
            flush=True,
        )
        if not write_results:
            # No result file to read them in: the failures are printed.
            for r in records:
                if r["fits_vs"] and r["outcome"] == "failed":
                    print(f"  failed: {r['test']}: {r['message'][:200]}", flush=True)
        else:
            # After each module: a long sweep cut short keeps the modules it ran.
            ordered = sorted(kept + modules, key=_position)
            write(ordered, machine_line(machine()))


if __name__ == "__main__":
    main()
