"""Leave-one-out under shrinkage priors: ``EPLogisticRegression(prior=...).loo`` against
brute force, and its cost.

Cases: breast cancer and the paper's Ionosphere (``_shrinkage_cases.load_dataset``:
standardized, the intercept separate) under the Laplace (scale 1), Student-t (ν = 3, scale
1) and horseshoe (τ = 0.1) priors of ``_shrinkage_cases.PRIORS``. ``loo()`` takes each
row's term from EP's cavity and refits the rows above ``refit_above`` by EP warm from the
fit's sites, the coefficient sites relaxed without the row in the refits and in the
cavities of the rows of share above 0.1 (docs/decisions.md, D-158, D-166, D-194). Brute
force: ``EPLogisticRegression`` refitted without each row (n refits, the estimator's own
route: under a heavy-tailed prior, EP's non-negative rerun where its sites left the
posterior improper), each scored on its row with the refit's predictive; cached under
``results/cache/shrinkage_loo_brute_force``, keyed by the data and the prior.

Reported per case: ``elpd_loo`` and brute force's, their difference in percent and in
standard errors (targets: 0.5 % and one SE), split into the refitted rows' part and the
others' (the cavities'), the cavities alone (``refit_above=None``), and the cost of
``loo`` over ``fit``: medians of interleaved repeats (fit, then its ``loo``), CPU time
(``time.process_time``: both run on one BLAS thread) and wall time, with the load average.

Which rows: the JSON gives each case's rows farthest from brute force (``worst_rows``:
index, brute force's term, ``loo``'s, the cavity's, whether refitted), and the table counts
the rows not refitted whose cavity is more than ``CAVITY_MISS`` nats from brute force, and
their sum (docs/decisions.md, D-184: under the horseshoe the cavities' error is spread over
dozens of rows). The cases: breast cancer, ionosphere and the paper's WPBC, each under the
three priors; ``--cases`` takes a subset, e.g. ``horseshoe:wpbc``.

Usage: python benchmarks/shrinkage_loo.py [--data-dir DIR] [--repeats N] [--out DIR]
[--cases horseshoe:breast_cancer ...] [--refresh-brute-force]
Writes DIR/shrinkage_loo.{csv,json,md,png} (DIR defaults to benchmarks/results). The brute
force takes about 10 minutes on 2 cores the first time (breast cancer's horseshoe fits
take 0.3 s each); the rest about a minute.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
import warnings
from pathlib import Path

import _shrinkage_cases as cases
import _uci
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from _common import CACHE, RESULTS, machine, machine_line, write_csv, write_json

from vsbayes import EPLogisticRegression
from vsbayes.exceptions import UnreliableFitWarning

DATASETS = ("breast_cancer", "ionosphere", "wpbc")
PRIORS = ("laplace", "student_t", "horseshoe")
TARGET_PERCENT = 0.5
TARGET_COST = 2.0
#: A cavity term farther than this from brute force (nats) is counted as a miss.
CAVITY_MISS = 0.05
#: Rows listed per case in the JSON, farthest from brute force first.
WORST_ROWS = 8


def brute_force(X, y, params, refresh: bool) -> tuple[np.ndarray, float]:
    """``log p(y_i | y_−i)`` of every row from ``EPLogisticRegression(**params)`` refitted
    without it (cached), and the seconds the refits took."""
    digest = hashlib.sha256()
    for part in (X, y):
        digest.update(np.ascontiguousarray(part).tobytes())
    digest.update(repr(sorted(params.items())).encode())
    path = CACHE / "shrinkage_loo_brute_force" / f"{digest.hexdigest()[:16]}.npz"
    if path.is_file() and not refresh:
        with np.load(path) as data:
            return data["terms"], float(data["seconds"])
    terms = np.empty(len(y))
    keep = np.ones(len(y), dtype=bool)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(len(y)):
            keep[i] = False
            refit = EPLogisticRegression(**params).fit(X[keep], y[keep])
            terms[i] = refit.predict_log_proba(X[i : i + 1])[0, y[i]]
            keep[i] = True
    seconds = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, terms=terms, seconds=seconds)
    return terms, seconds


def case_rows(name: str, prior: str, data_dir: Path, repeats: int, refresh: bool) -> dict:
    X, labels = cases.load_dataset(name, data_dir)
    y = (labels > 0).astype(int)
    params = {"prior": cases.vsbayes_prior(prior, X.shape[1] + 1)}
    reference, brute_seconds = brute_force(X, y, params, refresh)
    load_before = os.getloadavg()[0]
    fit_cpu, fit_wall, loo_cpu, loo_wall = [], [], [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(repeats):  # interleaved: fit, then its leave-one-out
            cpu, wall = time.process_time(), time.perf_counter()
            fitted = EPLogisticRegression(**params).fit(X, y)
            fit_cpu.append(time.process_time() - cpu)
            fit_wall.append(time.perf_counter() - wall)
            cpu, wall = time.process_time(), time.perf_counter()
            result = fitted.loo(X, y, random_state=0)
            loo_cpu.append(time.process_time() - cpu)
            loo_wall.append(time.perf_counter() - wall)
        cavity = fitted.loo(X, y, random_state=0, refit_above=None)
    unreliable = sum(issubclass(w.category, UnreliableFitWarning) for w in caught)
    brute = float(reference.sum())
    diff = result.pointwise - reference
    refitted = result.refitted
    missed = ~refitted & (np.abs(cavity.pointwise - reference) > CAVITY_MISS)
    worst = np.argsort(-np.abs(diff))[:WORST_ROWS]
    return {
        "dataset": name,
        "prior": prior,
        "n": len(y),
        "fit_unreliable_warnings": unreliable // repeats,
        "rows_refitted": int(refitted.sum()),
        "elpd_loo": float(result.elpd_loo),
        "se": float(result.se),
        "elpd_brute_force": brute,
        "diff_percent": 100.0 * (result.elpd_loo - brute) / abs(brute),
        "diff_in_se": float((result.elpd_loo - brute) / result.se),
        "refitted_rows_diff": float(diff[refitted].sum()),
        "other_rows_diff": float(diff[~refitted].sum()),
        "max_pointwise_diff": float(np.abs(diff).max()),
        "worst_row": int(np.abs(diff).argmax()),
        "cavity_misses": int(missed.sum()),
        "cavity_misses_diff": float((cavity.pointwise - reference)[missed].sum()),
        "cavities_alone_diff_percent": 100.0 * (cavity.elpd_loo - brute) / abs(brute),
        "fit_cpu_seconds": float(np.median(fit_cpu)),
        "loo_cpu_seconds": float(np.median(loo_cpu)),
        "loo_over_fit_cpu": float(np.median(loo_cpu) / np.median(fit_cpu)),
        "loo_over_fit_wall": float(np.median(loo_wall) / np.median(fit_wall)),
        "load_average": 0.5 * (load_before + os.getloadavg()[0]),
        "brute_force_seconds": brute_seconds,
        "worst_rows": [
            {
                "row": int(i),
                "brute_force": float(reference[i]),
                "loo": float(result.pointwise[i]),
                "cavity": float(cavity.pointwise[i]),
                "refitted": bool(refitted[i]),
            }
            for i in worst
        ],
    }


def markdown(rows: list[dict], info: dict) -> str:
    lines = [
        "# Leave-one-out under shrinkage priors against brute force",
        "",
        "Leave-one-out under shrinkage priors (`EPLogisticRegression(prior=...).loo()`) "
        "against brute force (n EP refits without each row), and its cost over the fit's "
        "(medians of interleaved repeats, CPU time and wall time). *Refitted* / *others*: "
        "the difference from brute force (nats) of the rows `loo` refits (warm EP, the "
        "coefficient sites relaxed without the row) and of the rest (EP's cavities, the "
        "coefficient sites relaxed in those of `p_loo` share above 0.1). Targets: "
        f"within {TARGET_PERCENT} % and one SE; cost ≤ {TARGET_COST:g} × the fit. *Cavity "
        f"misses*: the rows not refitted whose cavity is more than {CAVITY_MISS} nats from "
        "brute force, and their sum (the rows farthest from brute force are in the JSON).",
        "",
        "| data set | prior | refitted rows | elpd_loo | SE | brute force | diff % | diff / SE "
        "| refitted | others | cavity misses | cavities alone % | loo / fit CPU | wall | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['prior']} | {r['rows_refitted']} | {r['elpd_loo']:.3f} | "
            f"{r['se']:.3f} | {r['elpd_brute_force']:.3f} | {r['diff_percent']:+.2f} | "
            f"{r['diff_in_se']:+.3f} | {r['refitted_rows_diff']:+.3f} | "
            f"{r['other_rows_diff']:+.3f} | "
            f"{r['cavity_misses']} ({r['cavity_misses_diff']:+.3f}) | "
            f"{r['cavities_alone_diff_percent']:+.2f} | "
            f"{r['loo_over_fit_cpu']:.2f} | "
            f"{r['loo_over_fit_wall']:.2f} | {r['load_average']:.1f} |"
        )
    lines += ["", machine_line(info)]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    labels = [f"{r['prior']}\n{r['dataset'].replace('_', ' ')}" for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    axes[0].bar(x, [r["diff_percent"] for r in rows], color="C0", label="loo()")
    axes[0].plot(x, [r["cavities_alone_diff_percent"] for r in rows], "k_", ms=14,
                 label="cavities alone")  # fmt: skip
    axes[0].axhspan(-TARGET_PERCENT, TARGET_PERCENT, color="0.9", zorder=0)
    axes[0].set_ylabel("elpd_loo − brute force (%)")
    axes[0].legend(fontsize=8)
    axes[1].bar(x, [r["loo_over_fit_cpu"] for r in rows], color="C1")
    axes[1].axhline(TARGET_COST, color="0.5", ls="--")
    axes[1].set_ylabel("loo / fit (CPU time)")
    for ax in axes:
        ax.set_xticks(x, labels, fontsize=7, rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=_uci.DEFAULT_DATA_DIR)
    parser.add_argument("--repeats", type=int, default=5, help="timings of fit and loo")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--cases", nargs="*", default=None, help="prior:dataset pairs (default: all nine)"
    )
    parser.add_argument("--refresh-brute-force", action="store_true")
    args = parser.parse_args()
    pairs = [c.split(":") for c in args.cases] if args.cases else [
        (prior, name) for name in DATASETS for prior in PRIORS
    ]  # fmt: skip
    info = machine()
    rows = []
    for prior, name in pairs:
        rows.append(case_rows(name, prior, args.data_dir, args.repeats, args.refresh_brute_force))
        r = rows[-1]
        print(
            f"{name:14s} {prior:10s} diff {r['diff_percent']:+.2f} % ({r['diff_in_se']:+.3f} SE; "
            f"refitted {r['refitted_rows_diff']:+.3f}, others {r['other_rows_diff']:+.3f}) "
            f"loo/fit CPU {r['loo_over_fit_cpu']:.2f} wall {r['loo_over_fit_wall']:.2f} "
            f"(load {r['load_average']:.1f})",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "shrinkage_loo.csv", [
        {key: value for key, value in r.items() if key != "worst_rows"} for r in rows
    ])  # fmt: skip
    write_json(args.out / "shrinkage_loo.json", {"machine": info, "rows": rows})
    (args.out / "shrinkage_loo.md").write_text(markdown(rows, info))
    plot(rows, args.out / "shrinkage_loo.png")


if __name__ == "__main__":
    main()
