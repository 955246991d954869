"""scikit-learn's gallery examples that use LogisticRegression, run with VSLogisticRegression.

The examples are code no one here wrote, as a user would run it: whole scripts that load
data, build pipelines, searches, calibration and displays, and plot. Each example that names
``LogisticRegression`` (or ``LogisticRegressionCV``) is run as a script in a subprocess
(``cwd`` a temporary folder, matplotlib's Agg backend, a timeout each) twice: unchanged, and
with ``sklearn.linear_model.LogisticRegression`` replaced, before the example imports it,
by the factory of ``benchmarks/sklearn_dropin_sweep.py`` (``install``: both ``from
sklearn.linear_model import LogisticRegression`` and ``linear_model.LogisticRegression``
find it). ``LogisticRegressionCV`` is not replaced: vsbayes has no estimator with its
keywords (``EmpiricalBayesClassifier`` chooses C by the evidence); an example that uses only
it runs unchanged both times and is listed so.

Each run records its outcome — ran, failed (the exception's last line), timeout, or not
runnable: the unchanged run failed on a dataset download (no network here; the run with
vsbayes is then skipped, never faked) — its wall time, the warnings shown to the user (the
default filters: what reaches ``warnings.showwarning``), and of those the ones shown while a
vsbayes frame was on the stack (raised by vsbayes or by code it called), with the first.
Each example runs unchanged, then with vsbayes (interleaved, so that both see the machine
in the same state; the clock starts after scikit-learn, matplotlib and vsbayes are imported),
in the order of the last results' times, fastest first, so that a sweep cut short leaves
the slowest undone; the results are written after each example.

    nice -n 10 python benchmarks/sklearn_examples_sweep.py \\
        --examples-dir /path/to/scikit-learn-1.9.1/examples     # ~40 min, 2 loaded cores
    python benchmarks/sklearn_examples_sweep.py --examples-dir ... \\
        --only linear_model/plot_logistic_path.py --no-write

The examples are read where they are, never copied. Writes
``benchmarks/results/sklearn_examples_sweep.{csv,json,md}``; ``docs/differences.md`` explains
each failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sklearn
from _common import RESULTS, machine, machine_line, write_csv, write_json
from sklearn_dropin_sweep import run_environment, write_factory

NAME = re.compile(r"\bLogisticRegression(CV)?\b")
# The gallery's datasets that are downloaded (fetch_*, OpenML): with no network, their
# examples fail before any fit, with both estimators.
DOWNLOAD = re.compile(r"\bfetch_\w+|openml")

# Runs the example as sphinx-gallery does (as __main__), writes what happened as JSON.
RUNNER = r"""
import importlib.util
import json
import os
import runpy
import socket
import sys
import time
import traceback
import urllib.error
import warnings

import matplotlib

matplotlib.use("Agg")

OUT = os.environ["VSBAYES_EXAMPLE_OUT"]
REPLACE = os.environ.get("VSBAYES_SWEEP_REPLACE") == "1"
# vsbayes's folder, found without importing it (the unchanged run does not).
PACKAGE = os.path.join(os.path.dirname(importlib.util.find_spec("vsbayes").origin), "")
NETWORK = (urllib.error.URLError, ConnectionError, socket.gaierror, socket.timeout)

shown = []
_show = warnings.showwarning


def _from_vsbayes() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            return True
        frame = frame.f_back
    return False


def _record(message, category, filename, lineno, file=None, line=None):
    text = str(message).strip().splitlines()
    shown.append({
        "category": category.__name__,
        "first_line": (text[0] if text else "")[:300],
        "vsbayes": _from_vsbayes(),
    })
    _show(message, category, filename, lineno, file, line)


warnings.showwarning = _record

# What both runs import before the clock starts (the example's own imports of them are
# then free in both): the replacement imports scikit-learn and vsbayes; vsbayes's import
# is charged to neither.
import matplotlib.pyplot
import sklearn.linear_model

if REPLACE:
    import _vs_factory

    _vs_factory.install()

record = {"status": "ran", "error": "", "network": False, "missing": False}
start = time.perf_counter()
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
except SystemExit as exit:
    if exit.code not in (None, 0):
        record.update(status="failed", error=f"SystemExit: {exit.code}")
except BaseException as error:
    record.update(
        status="failed", error=traceback.format_exception_only(error)[-1].strip()[:500]
    )
    cause, seen = error, set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        record["network"] |= isinstance(cause, NETWORK)
        # A module the example imports is not installed ("requires rich" included).
        record["missing"] |= isinstance(cause, ImportError)
        cause = cause.__cause__ or cause.__context__
    traceback.print_exc()
record["seconds"] = time.perf_counter() - start
record["warnings"] = shown
record["made_vs"] = len(_vs_factory.FITS) if REPLACE else 0
with open(OUT, "w") as out:
    json.dump(record, out)
"""


def find_examples(folder: Path) -> list[dict]:
    """The examples (relative paths) that name LogisticRegression(CV), and what they use."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text(errors="replace")
        names = {m.group(0) for m in NAME.finditer(text)}
        if names:
            found.append(
                {
                    "example": path.relative_to(folder).as_posix(),
                    "uses_cv": "LogisticRegressionCV" in names,
                    "uses_lr": "LogisticRegression" in names,
                    "downloads": bool(DOWNLOAD.search(text)),
                }
            )
    return found


def run_example(path: Path, replace: bool, timeout: int, estimator: str) -> dict:
    """One run of the example at ``path``: its record (see ``RUNNER``) and wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_factory(folder, estimator)
        (folder / "_vs_example_runner.py").write_text(RUNNER)
        out = folder / "record.json"
        env = run_environment(
            folder,
            replace,
            VSBAYES_EXAMPLE_OUT=str(out),
            # Datasets that scikit-learn caches go to the run's folder, not the user's home.
            SCIKIT_LEARN_DATA=str(folder / "scikit_learn_data"),
        )
        start = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, str(folder / "_vs_example_runner.py"), str(path)],
                cwd=folder,
                env=env,
                check=False,
                timeout=timeout,
                capture_output=True,
                text=True,
            )
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "seconds": time.perf_counter() - start, "error": ""}
        wall = time.perf_counter() - start
        if not out.exists():  # the interpreter died (a signal, out of memory)
            tail = (done.stderr.strip().splitlines() or [""])[-1]
            return {"status": "failed", "seconds": wall, "error": f"exit {done.returncode}: {tail}"}
        record = json.loads(out.read_text())
        record["wall"] = wall
        return record


def _warnings(record: dict, vsbayes_only: bool) -> tuple[int, str]:
    shown = [w for w in record.get("warnings", []) if w["vsbayes"] or not vsbayes_only]
    first = f"{shown[0]['category']}: {shown[0]['first_line']}" if shown else ""
    return len(shown), first


def row_of(example: dict, base: dict, ours: dict | None) -> dict:
    """One example's CSV row."""
    status = base["status"]
    if status == "failed" and base.get("network"):
        status = "not runnable (dataset download)"
    elif status == "failed" and base.get("missing"):
        status = "not runnable (missing dependency)"
    row = {
        "example": example["example"],
        "uses": "+".join(
            name
            for name, used in (
                ("LogisticRegression", example["uses_lr"]),
                ("LogisticRegressionCV", example["uses_cv"]),
            )
            if used
        ),
        "sklearn_status": status,
        "sklearn_seconds": round(base["seconds"], 2),
        "sklearn_error": base.get("error", ""),
        "sklearn_warnings": _warnings(base, False)[0],
    }
    if ours is None:
        row.update(
            vsbayes_status="not run" if status.startswith("not runnable") else "pending",
            vsbayes_seconds="",
            ratio="",
            vsbayes_error="",
            vsbayes_made=0,
            vsbayes_warnings_shown="",
            vsbayes_warnings="",
            vsbayes_warning_first="",
        )
        return row
    count, first = _warnings(ours, True)
    ratio = ours["seconds"] / base["seconds"] if ours["status"] == "ran" == base["status"] else ""
    row.update(
        vsbayes_status=ours["status"],
        vsbayes_seconds=round(ours["seconds"], 2),
        ratio=round(ratio, 2) if ratio != "" else "",
        vsbayes_error=ours.get("error", ""),
        vsbayes_made=ours.get("made_vs", 0),
        vsbayes_warnings_shown=_warnings(ours, False)[0] if "warnings" in ours else "",
        vsbayes_warnings=count,
        vsbayes_warning_first=first,
    )
    return row


def write(rows: list[dict], info: dict, timeouts: tuple[int, int]) -> None:
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / "sklearn_examples_sweep.csv", rows)
    runnable = [r for r in rows if not r["sklearn_status"].startswith("not runnable")]
    download = [r for r in rows if r["sklearn_status"].endswith("download)")]
    missing = [r for r in rows if r["sklearn_status"].endswith("dependency)")]
    made = [r for r in runnable if r["vsbayes_made"]]
    both = [r for r in runnable if r["sklearn_status"] == "ran" == r["vsbayes_status"]]
    both_made = [r for r in both if r["vsbayes_made"]]
    lost = [r for r in runnable if r["sklearn_status"] == "ran" != r["vsbayes_status"]]
    pending = [r for r in runnable if r["vsbayes_status"] == "pending"]
    ratios = sorted(r["ratio"] for r in both_made)
    summary = {
        "scikit_learn": sklearn.__version__,
        "machine": info,
        "timeouts": {"sklearn": timeouts[0], "vsbayes": timeouts[1]},
        "examples": len(rows),
        "not_runnable_download": len(download),
        "not_runnable_missing_dependency": len(missing),
        "runnable": len(runnable),
        "ran_with_sklearn": sum(r["sklearn_status"] == "ran" for r in runnable),
        "made_vs": len(made),
        "ran_with_both": len(both),
        "ran_with_both_making_vs": len(both_made),
        "ran_with_sklearn_not_vsbayes": len(lost),
        "pending": len(pending),
        "median_ratio": ratios[len(ratios) // 2] if ratios else None,
        "rows": rows,
    }
    write_json(RESULTS / "sklearn_examples_sweep.json", summary)
    lines = [
        "# scikit-learn's gallery examples that use LogisticRegression, with VSLogisticRegression",
        "",
        machine_line(info),
        "",
        f"scikit-learn {sklearn.__version__}: {len(rows)} examples name `LogisticRegression` "
        f"or `LogisticRegressionCV`; {len(download)} download a dataset (no network here: "
        f"not runnable, not run with vsbayes)"
        + (f", {len(missing)} import a package not installed" if missing else "")
        + f". Of the {len(runnable)} others, "
        f"{summary['ran_with_sklearn']} run unchanged; with "
        "`sklearn.linear_model.LogisticRegression` replaced by the VS factory, "
        f"**{len(both)} run with both** ({len(both_made)} of them making the VS estimator; "
        f"{len(runnable) - len(made)} make none in the main process: `LogisticRegressionCV` "
        "only, the name in the text only, or fits in worker processes), "
        f"**{len(lost)} run unchanged and not with vsbayes**"
        + (f", {len(pending)} not run (the sweep was cut short)" if pending else "")
        + ". Timeouts: "
        f"{timeouts[0]} s unchanged, {timeouts[1]} s with vsbayes."
        + (
            f" Median ratio of wall times (vsbayes / unchanged, whole scripts but the imports, "
            f"plots included) over the {len(both_made)}: {summary['median_ratio']:.2g}."
            if ratios
            else ""
        ),
        "",
        "*vsbayes warnings*: warnings shown to the user (default filters) while a vsbayes "
        "frame was on the stack; *shown*: all warnings shown, each run.",
        "",
        "| example | unchanged | s | with vsbayes | s | ratio | VS made | warnings shown "
        "(unchanged / vsbayes) | vsbayes warnings | first vsbayes warning or error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        detail = r["vsbayes_error"] or r["vsbayes_warning_first"] or r["sklearn_error"]
        detail = detail.replace("|", "\\|").replace("\n", " ")[:200]
        lines.append(
            f"| `{r['example']}` | {r['sklearn_status']} | {r['sklearn_seconds']} | "
            f"{r['vsbayes_status']} | {r['vsbayes_seconds']} | {r['ratio']} | "
            f"{r['vsbayes_made']} | {r['sklearn_warnings']} / {r['vsbayes_warnings_shown']} | "
            f"{r['vsbayes_warnings']} | {detail} |"
        )
    (RESULTS / "sklearn_examples_sweep.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples-dir",
        type=Path,
        default=os.environ.get("SKLEARN_EXAMPLES_DIR"),
        help="scikit-learn's examples/ folder, from its source distribution (matching the "
        "installed version); default $SKLEARN_EXAMPLES_DIR",
    )
    parser.add_argument("--only", nargs="*", help="examples (paths under the folder)")
    parser.add_argument("--sklearn-timeout", type=int, default=300, help="seconds, unchanged")
    parser.add_argument("--timeout", type=int, default=300, help="seconds, with vsbayes")
    parser.add_argument("--no-write", action="store_true", help="print, write no results")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the committed results' rows of the examples not run (with --only)",
    )
    parser.add_argument(
        "--estimator",
        default="VSLogisticRegression",
        help="the vsbayes classifier put in LogisticRegression's place; another than "
        "VSLogisticRegression prints its figures and writes no result files",
    )
    args = parser.parse_args()
    folder = args.examples_dir
    if folder is None or not Path(folder).is_dir():
        print(
            f"Skipped: no examples folder ({folder}). Unpack scikit-learn "
            f"{sklearn.__version__}'s source distribution (pip download --no-binary :all: "
            f"--no-deps scikit-learn=={sklearn.__version__}) and pass its examples/ folder "
            "with --examples-dir."
        )
        return
    folder = Path(folder).resolve()
    write_results = not args.no_write and args.estimator == "VSLogisticRegression"
    examples = find_examples(folder)
    if args.only:
        examples = [e for e in examples if e["example"] in args.only]
    print(f"{len(examples)} examples name LogisticRegression(CV) under {folder}", flush=True)
    timeouts = (args.sklearn_timeout, args.timeout)

    committed = RESULTS / "sklearn_examples_sweep.json"
    previous = (
        {r["example"]: r for r in json.loads(committed.read_text())["rows"]}
        if committed.is_file()
        else {}
    )
    # The fastest first by the last run's times (unknown ones first): a sweep cut short
    # leaves the slowest undone.
    examples.sort(key=lambda e: float(previous.get(e["example"], {}).get("sklearn_seconds", 0)))
    rerun = {e["example"] for e in examples}
    kept = [r for name, r in previous.items() if name not in rerun] if args.merge else []
    order = {e["example"]: k for k, e in enumerate(find_examples(folder))}
    rows = []
    for e in examples:
        # Interleaved: each example with both estimators, the machine in the same state.
        b = run_example(folder / e["example"], False, args.sklearn_timeout, args.estimator)
        o = None
        if not (b.get("network") or b.get("missing")):
            o = run_example(folder / e["example"], True, args.timeout, args.estimator)
        rows.append(row_of(e, b, o))
        r = rows[-1]
        print(
            f"{e['example']}: unchanged {r['sklearn_status']} {r['sklearn_seconds']} s; "
            f"vsbayes {r['vsbayes_status']} {r['vsbayes_seconds']} s, "
            f"made {r['vsbayes_made']}, {r['vsbayes_warnings']} vsbayes warnings "
            f"{r['vsbayes_warning_first'][:100]} "
            f"{(r['vsbayes_error'] or r['sklearn_error'])[:200]}",
            flush=True,
        )
        if write_results:  # after each example: a sweep cut short keeps what it ran
            everything = sorted(kept + rows, key=lambda r: order.get(r["example"], len(order)))
            write(everything, machine(), timeouts)


if __name__ == "__main__":
    main()
