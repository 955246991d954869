"""Is VS's predicted error ``kl_error`` right? Predicted against measured, on the paper's cells.

Every fit is ``VSLogisticRegression`` / ``VSProbitRegression`` with ``strategy="global"``
(one VS fit of the whole posterior, EP's posterior as the kernel) on the paper's four UCI
datasets prepared as the paper (``C=1e5``, no intercept; ``_uci.py``), at N = 8n … 256n
(n = (d+1)(d+2)/2), ``--seeds`` seeds each. Measured error: the paper's excess KL
``excess_kl(truth, fit)`` to the importance-sampling ground truth cached in
``results/paper_truth.json`` (see ``paper_reproduction.py``); predicted: the fit's
``kl_error`` (``posteriors_[0].kl_error``), the asymptotic excess KL ``tr(ΣH⁻¹)/(2N)`` the
solver estimates from its own points. The ground truth's own Monte Carlo error, about
n/(2 ESS) nats, is reported beside it: where the measured error approaches it, the ratio
says more about the truth than about kl_error.

Per cell and N: median of predicted / measured, its 5-95 % range, the share of fits within
a factor 3, the median ESS of the fit's importance weights. Issue 16's target: median ratio
in [0.5, 2] in every cell and 90 % of fits within ×3, or the fit reports its error as
unreliable.

Every fit is appended to ``results/kl_error_calibration.jsonl`` as it ends, and a rerun
skips those already there; ``--report`` only rebuilds the table and figure.

Usage: python benchmarks/kl_error_calibration.py [--seeds 20] [--data-dir DIR] [--report]
Writes benchmarks/results/kl_error_calibration.{jsonl,csv,json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import warnings

import _uci
import numpy as np
from _common import RESULTS, machine, machine_line, write_csv, write_json
from paper_reproduction import ESTIMATORS, MODELS, TRUTH, n_params, truth_gaussian

from vsbayes import excess_kl

FACTORS = (8, 16, 32, 64, 128, 256)
RUNS = RESULTS / "kl_error_calibration.jsonl"
DATASETS = tuple(_uci.DATASETS)


def load_runs() -> list[dict]:
    if not RUNS.exists():
        return []
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()]


def run(data_dir, seeds: int) -> None:
    truth = json.loads(TRUTH.read_text())
    done = {(r["dataset"], r["model"], r["factor"], r["seed"]) for r in load_runs()}
    for name in DATASETS:
        X, y = _uci.load(name, data_dir)
        n = n_params(X.shape[1])
        for model in MODELS:
            reference = truth_gaussian(truth[f"{name}/{model}"])
            for factor in FACTORS:
                for seed in range(seeds):
                    if (name, model, factor, seed) in done:
                        continue
                    estimator = ESTIMATORS[("VS", model)](
                        C=1e5,
                        fit_intercept=False,
                        n_samples=factor * n,
                        strategy="global",
                        random_state=seed,
                    )
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        estimator.fit(X, y)
                    fit = estimator.posteriors_[0]
                    row = {
                        "dataset": name,
                        "model": model,
                        "factor": factor,
                        "N": factor * n,
                        "seed": seed,
                        "predicted": float(getattr(fit, "kl_error", np.nan)),
                        "measured": float(excess_kl(reference, fit)),
                        "ess": float(getattr(fit, "ess", np.nan)),
                        "warnings": [str(w.message)[:120] for w in caught],
                    }
                    with open(RUNS, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                print(f"{name} {model} {factor}n done", flush=True)


def summary(runs, truth) -> list[dict]:
    rows = []
    for name in DATASETS:
        for model in MODELS:
            entry = truth.get(f"{name}/{model}", {})
            for factor in FACTORS:
                cell = [
                    r
                    for r in runs
                    if (r["dataset"], r["model"], r["factor"]) == (name, model, factor)
                ]
                if not cell:
                    continue
                ratio = np.array([r["predicted"] / r["measured"] for r in cell])
                finite = ratio[np.isfinite(ratio)]
                n = cell[0]["N"] // factor
                rows.append(
                    {
                        "dataset": name,
                        "model": model,
                        "factor": factor,
                        "N": cell[0]["N"],
                        "fits": len(cell),
                        "median_ratio": float(np.median(finite)) if finite.size else np.nan,
                        "ratio_p05": float(np.percentile(finite, 5)) if finite.size else np.nan,
                        "ratio_p95": float(np.percentile(finite, 95)) if finite.size else np.nan,
                        "within_3x": float(np.mean((ratio >= 1 / 3) & (ratio <= 3))),
                        "median_measured": float(np.median([r["measured"] for r in cell])),
                        "median_predicted": float(np.median([r["predicted"] for r in cell])),
                        "median_ess": float(np.median([r["ess"] for r in cell])),
                        "truth_floor": n / (2 * entry["ess"]) if "ess" in entry else np.nan,
                    }
                )
    return rows


def markdown(rows, info) -> str:
    lines = [
        "# Predicted against measured error of VS (`kl_error`)",
        "",
        'Paper\'s four datasets × two links (C = 1e5, no intercept), `strategy="global"` '
        "from EP's posterior. Ratio = predicted `kl_error` ÷ measured excess KL to the IS "
        "ground truth; the truth's own error is about n/(2 ESS) nats (last column). "
        "Produced by `benchmarks/kl_error_calibration.py`.",
        "",
        machine_line(info),
        "",
        "| dataset | link | N | fits | median ratio | 5–95 % | within ×3 | measured | predicted "
        "| ESS | truth's error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['model']} | {r['factor']}n | {r['fits']} | "
            f"{r['median_ratio']:.2f} | {r['ratio_p05']:.2f}–{r['ratio_p95']:.2f} | "
            f"{r['within_3x']:.0%} | {r['median_measured']:.2e} | {r['median_predicted']:.2e} | "
            f"{r['median_ess']:.0f} | {r['truth_floor']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def figure(runs, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(14, 6.5), sharex=True, sharey=True)
    for col, name in enumerate(DATASETS):
        for row, model in enumerate(MODELS):
            ax = axes[row, col]
            cell = [r for r in runs if (r["dataset"], r["model"]) == (name, model)]
            for factor in FACTORS:
                pts = [r for r in cell if r["factor"] == factor]
                ax.loglog(
                    [r["measured"] for r in pts],
                    [r["predicted"] for r in pts],
                    ".",
                    ms=4,
                    label=f"{factor}n",
                )
            lim = np.array([1e-5, 1.0])
            ax.plot(lim, lim, "k-", lw=0.8)
            ax.plot(lim, 3 * lim, "k:", lw=0.8)
            ax.plot(lim, lim / 3, "k:", lw=0.8)
            ax.set_title(f"{name} {model}", fontsize=9)
            if row == 1:
                ax.set_xlabel("measured excess KL")
            if col == 0:
                ax.set_ylabel("predicted kl_error")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--data-dir", default=str(_uci.DEFAULT_DATA_DIR))
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    args = parser.parse_args()
    if not args.report:
        run(args.data_dir, args.seeds)
    runs = load_runs()
    truth = json.loads(TRUTH.read_text())
    rows = summary(runs, truth)
    info = machine()
    write_csv(RESULTS / "kl_error_calibration.csv", rows)
    write_json(RESULTS / "kl_error_calibration.json", {"machine": info, "cells": rows})
    (RESULTS / "kl_error_calibration.md").write_text(markdown(rows, info))
    figure(runs, RESULTS / "kl_error_calibration.png")


if __name__ == "__main__":
    main()
