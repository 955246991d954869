"""Fit time against the number of classes K at fixed features and rows, LogisticRegression beside.

``make_classification`` (``n_informative = d``, one cluster per class, standardized) with
K = 3 … 50 classes at d features and M rows; per K, the fit times of
``VSLogisticRegression()`` (its default route), ``EPLogisticRegression()`` and
``LaplaceLogisticRegression()`` against scikit-learn's ``LogisticRegression()`` in the same
process (``_common.LRBaseline``: the faster of its medians at the default BLAS threads and
on one thread), medians of ``--repeats`` interleaved fits; the route taken, the EP sweeps,
and any error (a fit that fails or is refused is recorded, not raised).

Usage: python benchmarks/many_classes.py [--repeats 3] [--rows 2000] [--features 8] [--out DIR]
Writes DIR/many_classes.{csv,json,md,png}; DIR defaults to benchmarks/results.

The issue's shapes (K × d × M = 20 × 10 × 2000 and 26 × 16 × 5000, each with its own
LogisticRegression baseline)::

    python benchmarks/many_classes.py --shapes [--repeats 5]

writes DIR/many_classes_shapes.{csv,json,md}.

Quick check (K = 3, 10, 20 on 500 rows, one repeat; a few minutes on an idle machine)::

    python benchmarks/many_classes.py --quick

writes to results/cache/many_classes_quick (compare its routes and sweeps with the committed
results; times follow the machine's state).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from _common import CACHE, RESULTS, LRBaseline, machine, machine_line, timed, write_csv, write_json
from sklearn.datasets import make_classification
from sklearn.preprocessing import StandardScaler

from vsbayes import EPLogisticRegression, LaplaceLogisticRegression, VSLogisticRegression

METHODS = {
    "VS": VSLogisticRegression,
    "EP": EPLogisticRegression,
    "Laplace": LaplaceLogisticRegression,
}
CLASSES = (3, 5, 10, 20, 26, 30, 40, 50)
QUICK_CLASSES = (3, 10, 20)
#: (classes, features, rows) of --shapes: a newsgroup-like and the letter-recognition shape.
SHAPES = ((20, 10, 2000), (26, 16, 5000))


def data(k: int, d: int, m: int, seed: int = 0):
    X, y = make_classification(
        m,
        d,
        n_informative=d,
        n_redundant=0,
        n_classes=k,
        n_clusters_per_class=1,
        random_state=seed,
    )
    return StandardScaler().fit_transform(X), y


def run_case(k: int, d: int, m: int, repeats: int) -> list[dict]:
    X, y = data(k, d, m)
    baseline = LRBaseline(X, y)
    baseline.time(record=False)
    times = {name: [] for name in METHODS}
    info = {name: {} for name in METHODS}
    for _ in range(repeats):
        for name, make in METHODS.items():
            if info[name].get("error"):
                continue
            try:
                seconds, est, caught = timed(lambda make=make: make().fit(X, y))
            except Exception as error:  # recorded: the point is which K fit at all
                info[name]["error"] = f"{type(error).__name__}: {str(error)[:120]}"
                continue
            times[name].append(seconds)
            info[name] = {
                "route": str(np.ravel(getattr(est, "strategy_", [name]))[0]),
                "n_iter": int(np.max(est.n_iter_)),
                "warnings": len(caught),
            }
        baseline.time()
    rows = []
    for name in METHODS:
        seconds = float(np.median(times[name])) if times[name] else float("nan")
        rows.append(
            {
                "classes": k,
                "features": d,
                "rows": m,
                "method": name,
                "seconds": seconds,
                "lr_seconds": baseline.seconds,
                "ratio": seconds / baseline.seconds,
                "route": info[name].get("route", ""),
                "n_iter": info[name].get("n_iter", ""),
                "warnings": info[name].get("warnings", ""),
                "error": info[name].get("error", ""),
            }
        )
        print(
            f"K={k:3d} {name:8s} {seconds:8.2f} s  LR {baseline.seconds:.3f} s  "
            f"{seconds / baseline.seconds:7.1f}×  {rows[-1]['route']} {rows[-1]['error']}",
            flush=True,
        )
    return rows


def markdown(rows: list[dict], info: dict, title: str = "Fit time against the number of classes"):
    lines = [
        f"# {title}",
        "",
        machine_line(info),
        "",
        "make_classification (n_informative = d, one cluster per class, standardized), "
        "defaults; ratio = fit time / LogisticRegression's (faster of default and one BLAS "
        "thread), medians of interleaved repeats. The machine was shared (see the load).",
        "",
        "| K | d | M | method | seconds | LR seconds | ratio | route | sweeps/iters | warnings "
        "| error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['classes']} | {row['features']} | {row['rows']} | {row['method']} | "
            f"{row['seconds']:.3g} | "
            f"{row['lr_seconds']:.3g} | {row['ratio']:.3g} | {row['route']} | {row['n_iter']} "
            f"| {row['warnings']} | {row['error']} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = sorted({row["classes"] for row in rows})
    for name in METHODS:
        ax.plot(
            ks,
            [
                next(r["seconds"] for r in rows if r["classes"] == k and r["method"] == name)
                for k in ks
            ],
            "o-",
            label=name,
        )
    ax.plot(
        ks,
        [next(r["lr_seconds"] for r in rows if r["classes"] == k) for k in ks],
        "k--",
        label="LogisticRegression",
    )
    ax.set_xlabel("classes K")
    ax.set_ylabel("fit seconds")
    ax.set_yscale("log")
    d, m = rows[0]["features"], rows[0]["rows"]
    ax.set_title(f"Fit time against K ({d} features, {m} rows)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--classes", type=int, nargs="*", default=list(CLASSES))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shapes", action="store_true", help="the issue's shapes (SHAPES)")
    args = parser.parse_args()
    if args.quick:
        args.classes, args.rows, args.repeats = list(QUICK_CLASSES), 500, 1
        args.out = CACHE / "many_classes_quick"
    if args.shapes:
        rows = [row for k, d, m in SHAPES for row in run_case(k, d, m, args.repeats)]
        info = machine()
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(args.out / "many_classes_shapes.csv", rows)
        write_json(args.out / "many_classes_shapes.json", {"machine": info, "rows": rows})
        title = "Fit time at the many-class issue's shapes"
        (args.out / "many_classes_shapes.md").write_text(markdown(rows, info, title))
        print(f"wrote {args.out / 'many_classes_shapes.md'}")
        return
    rows = []
    for k in args.classes:
        rows += run_case(k, args.features, args.rows, args.repeats)
    info = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "many_classes.csv", rows)
    write_json(args.out / "many_classes.json", {"machine": info, "rows": rows})
    (args.out / "many_classes.md").write_text(markdown(rows, info))
    plot(rows, args.out / "many_classes.png")
    print(f"wrote {args.out / 'many_classes.md'}")


if __name__ == "__main__":
    main()
