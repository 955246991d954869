"""Small reads of a fitted posterior, at BLAS's default threads and on one BLAS thread.

The reads that decision loops and services call after a fit (``predict_proba`` and
``decision_function`` on 1 or 10 rows, ``sample_coef``, ``thompson_sample``,
``predict_proba_interval``, ``sample_proba``, ``summary()``, ``loo``) do small linear algebra
(a Cholesky factor of the posterior covariance, a triangular solve, a draw's product).
OpenBLAS's second thread costs such calls milliseconds when another process holds a core.
Each call is timed in one process, three settings interleaved: "before", BLAS's default
threads (the one-thread rule for small reads switched off: ``vsbayes._blas.SMALL_WORK = 0``,
exactly the code before the rule), "after", the library as it is (small reads on one BLAS
thread, :func:`vsbayes._blas.one_blas_thread_below`), and "one thread", the call inside
``single_blas_thread()``; median and 99th percentile of the repeats, in ms. Also one large
call, ``predict_proba`` on 10⁶ × 20 rows, above the rule's size, which must keep its chunks
on the threads BLAS may use, before and after.

Cases: binary d = 20 (make_classification, 500 rows), 3 classes d = 20 (multinomial, 600
rows), breast cancer (standardized, 569 × 30), binary d = 100 (1000 rows), digits (10
classes × 64 features, multinomial: a 650 × 650 covariance, whose reads are above the
one-thread rule's size); VSLogisticRegression.

Run: ``python benchmarks/small_reads.py [--repeats N]``; writes ``results/small_reads.csv``
and ``.md``. The machine is shared: the load average is in the machine line.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
import warnings

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits, make_classification
from sklearn.preprocessing import StandardScaler

from vsbayes import VSLogisticRegression, _blas
from vsbayes._blas import single_blas_thread

try:
    from ._common import RESULTS, machine, machine_line, write_csv
except ImportError:  # run as a script
    from _common import RESULTS, machine, machine_line, write_csv


def _cases():
    X, y = make_classification(500, 20, n_informative=10, random_state=0)
    yield "binary d=20", X, y
    X, y = make_classification(600, 20, n_informative=10, n_classes=3, random_state=0)
    yield "3-class d=20", X, y
    X, y = load_breast_cancer(return_X_y=True)
    yield "breast cancer", StandardScaler().fit_transform(X), y
    X, y = make_classification(1000, 100, n_informative=20, random_state=0)
    yield "binary d=100", X, y
    X, y = load_digits(return_X_y=True)
    yield "digits 10-class", StandardScaler().fit_transform(X), y


def _calls(model, X, y):
    one, ten = X[:1], X[:10]
    calls = [
        ("predict_proba 1 row", lambda: model.predict_proba(one), 1),
        ("predict_proba 10 rows", lambda: model.predict_proba(ten), 1),
        ("decision_function 10 rows", lambda: model.decision_function(ten), 1),
        ("sample_coef 1 draw", lambda: model.sample_coef(1, random_state=0), 1),
        ("thompson_sample 10 rows", lambda: model.thompson_sample(ten, random_state=0), 1),
        ("predict_proba_interval 10 rows", lambda: model.predict_proba_interval(ten), 1),
        ("sample_proba 10 rows × 100", lambda: model.sample_proba(ten, 100, random_state=0), 1),
        ("summary()", lambda: model.summary(), 1),
    ]
    if len(X) * X.shape[1] < 50_000:  # (digits' multinomial loo takes seconds)
        calls.append(("loo", lambda: model.loo(X, y), 20))  # a loo costs ~20 small reads
    return calls


def _time(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _one_thread(call):
    def run():
        with single_blas_thread():
            call()

    return run


def _before(call):
    """The call with the one-thread rule off: every read at BLAS's threads, as before."""

    def run():
        small, _blas.SMALL_WORK = _blas.SMALL_WORK, 0.0
        try:
            call()
        finally:
            _blas.SMALL_WORK = small

    return run


SETTINGS = ("before", "after", "one_thread")


def _interleaved(call, n: int) -> dict[str, np.ndarray]:
    runs = {"before": _before(call), "after": call, "one_thread": _one_thread(call)}
    times = {name: [] for name in SETTINGS}
    for i in range(n):
        order = SETTINGS[i % 3 :] + SETTINGS[: i % 3]
        for name in order:
            times[name].append(_time(runs[name]))
    return {name: 1e3 * np.array(t) for name, t in times.items()}


def _row(case: str, name: str, n: int, times: dict[str, np.ndarray]) -> dict:
    row = {"case": case, "call": name, "repeats": n}
    for setting in SETTINGS:
        row[f"{setting}_median_ms"] = float(np.median(times[setting]))
        row[f"{setting}_p99_ms"] = float(np.percentile(times[setting], 99))
    print(
        f"{case:15s} {name:32s}"
        + "".join(
            f"  {s} {row[f'{s}_median_ms']:8.3f} / {row[f'{s}_p99_ms']:8.3f}" for s in SETTINGS
        ),
        flush=True,
    )
    return row


def measure(repeats: int) -> list[dict]:
    rows = []
    for case, X, y in _cases():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = VSLogisticRegression(random_state=0).fit(X, y)
            for name, call, cost in _calls(model, X, y):
                n = max(5, repeats // cost)
                call()  # warm (imports, caches)
                rows.append(_row(case, name, n, _interleaved(call, n)))
    return rows


def measure_large(repeats: int) -> dict:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20_000, 20))
    y = (X @ np.full(20, 0.45) + rng.logistic(size=20_000) > 0).astype(int)
    model = VSLogisticRegression(random_state=0).fit(X, y)
    big = rng.standard_normal((1_000_000, 20))
    model.predict_proba(big)
    times = _interleaved(lambda: model.predict_proba(big), repeats)
    return _row("1e6 × 20", "predict_proba 1e6 rows", repeats, times)


def plot(rows: list[dict], path) -> None:
    """Median ms per call in each setting, one bar group a call (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['case']}: {r['call']}" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.2))
    height = 0.27
    for i, setting in enumerate(SETTINGS):
        ax.barh(
            np.arange(len(rows)) + (i - 1) * height,
            [float(r[f"{setting}_median_ms"]) for r in rows],
            height=height,
            label=setting.replace("_", " "),
        )
    ax.set_yticks(np.arange(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median ms per call")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--large-repeats", type=int, default=9)
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the PNG from the committed CSV"
    )
    args = parser.parse_args()
    if args.replot:
        with open(RESULTS / "small_reads.csv", newline="") as f:
            plot(list(csv.DictReader(f)), RESULTS / "small_reads.png")
        return
    rows = measure(args.repeats)
    rows.append(measure_large(args.large_repeats))
    info = machine()
    write_csv(RESULTS / "small_reads.csv", rows)
    (RESULTS / "small_reads.json").write_text(json.dumps({"machine": info, "rows": rows}))
    plot(rows, RESULTS / "small_reads.png")
    lines = [
        "# Small reads: BLAS's default threads (before) against the one-thread rule (after)",
        "",
        machine_line(info),
        "",
        "Milliseconds per call, median / 99th percentile, the three settings interleaved.",
        "",
        "| case | call | before | after | one thread |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = " | ".join(f"{r[f'{s}_median_ms']:.3f} / {r[f'{s}_p99_ms']:.3f}" for s in SETTINGS)
        lines.append(f"| {r['case']} | {r['call']} | {cells} |")
    (RESULTS / "small_reads.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
