"""Streaming a text-scale binary problem: ``partial_fit`` with a structured posterior.

Where the dense p × p posterior does not fit (here p > 4096: the structured covariance of
``choose_covariance``), ``partial_fit`` fits each batch by the structured Laplace route
and carries the posterior's projection onto the Gaussians whose coefficients are
independent given the intercept (mean, marginal variances, the intercept's covariances:
assumed-density filtering, docs/decisions.md D-112). The projection drops the
correlations between the coefficients; this measures what that costs against the batch
fit of the same rows (the structured fit ``fit`` takes):

* held-out log loss of the streamed posterior over the batch fit's (the ratio; the
  streaming target of the updating issue is within 1 %), the largest difference of
  held-out probabilities, LogisticRegression's log loss at the same C for scale;
* marginal posterior sds of the streamed posterior over the batch fit's: the coefficients'
  (quantiles and extremes) and the intercept's, which every row shares (correlated with
  every coefficient: what a carried diagonal lost most, 0.35-0.74× the batch fit's sd);
* time: the median batch of the stream, the whole stream, the batch fit, and
  LogisticRegression's fit of all the rows (faster of default and one BLAS thread);
* peak memory (``ru_maxrss`` of a subprocess running that fit alone).

Data: :func:`text_scale.text_data` (Zipf-distributed columns, unit-norm rows, labels from a
sparse true coefficient vector, latent sd 3), 2000 held-out rows; shapes 2000 × 5000 (1 %)
and 5000 × 20,000 (0.2 %), batches of 100 and 1000 rows, in the data's order.

The machine is shared (2 cores, other engineers' jobs): times are noisy.

Usage: python benchmarks/sparse_streaming.py [--quick] [--out DIR]
       (writes DIR/sparse_streaming.{csv,json,md}; DIR = benchmarks/results)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import CACHE, RESULTS, LRBaseline, machine, machine_line, write_csv  # noqa: E402
from text_scale import text_data  # noqa: E402

HELD_OUT = 2000
CASES = {"2000x5000": (2000, 5000, 0.01), "5000x20000": (5000, 20_000, 0.002)}
QUICK_CASES = {"1000x5000": (1000, 5000, 0.01)}
BATCHES = (100, 1000)


def data(case: str):
    m, p, density = {**CASES, **QUICK_CASES}[case]
    X, y = text_data(m + HELD_OUT, p, density, seed=7)
    return X[:m], y[:m].astype(int), X[m:], y[m:].astype(int)


def log_loss(y, proba) -> float:
    proba = np.clip(proba, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(proba) + (1 - y) * np.log1p(-proba)))


def worker(case: str, mode: str) -> dict:
    """One fit ("fit", or "stream<batch>") of ``case`` in this process: its times, held-out
    probabilities and marginal sds saved for the comparison, its peak memory."""
    import vsbayes

    X, y, held, _ = data(case)
    estimator = vsbayes.VSLogisticRegression()
    start = time.perf_counter()
    batch_times = []
    if mode == "fit":
        estimator.fit(X, y)
    else:
        size = int(mode.removeprefix("stream"))
        for first in range(0, X.shape[0], size):
            began = time.perf_counter()
            rows = slice(first, first + size)
            estimator.partial_fit(X[rows], y[rows], classes=[0, 1])
            batch_times.append(time.perf_counter() - began)
    seconds = time.perf_counter() - start
    proba = estimator.predict_proba(held)[:, 1]
    sd = np.sqrt(estimator.sigma_.diagonal())
    np.savez(CACHE / f"sparse_streaming_{case}_{mode}.npz", proba=proba, sd=sd)
    return {
        "seconds": seconds,
        "median_batch_seconds": float(np.median(batch_times)) if batch_times else np.nan,
        "batches": len(batch_times),
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "structure": str(estimator.covariance_structure_),
        "reason": estimator.covariance_reason_,
    }


def in_subprocess(case: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", case, mode],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_case(case: str) -> list[dict]:
    X, y, held, y_held = data(case)
    baseline = LRBaseline(X, y).time(3)
    lr_loss = log_loss(y_held, baseline.estimator.predict_proba(held)[:, 1])
    fit = in_subprocess(case, "fit")
    reference = np.load(CACHE / f"sparse_streaming_{case}_fit.npz")
    fit_loss = log_loss(y_held, reference["proba"])
    rows = []
    for size in BATCHES:
        if size >= X.shape[0]:
            continue
        stream = in_subprocess(case, f"stream{size}")
        streamed = np.load(CACHE / f"sparse_streaming_{case}_stream{size}.npz")
        # The coefficients' sds, and the intercept's apart: shared by every row, it is
        # correlated with every coefficient, which the carried diagonal drops.
        sd_ratio = streamed["sd"][:-1] / reference["sd"][:-1]
        intercept_ratio = float(streamed["sd"][-1] / reference["sd"][-1])
        loss = log_loss(y_held, streamed["proba"])
        rows.append(
            {
                "case": case,
                "batch_rows": size,
                "stream_log_loss": loss,
                "fit_log_loss": fit_loss,
                "log_loss_ratio": loss / fit_loss,
                "lr_log_loss": lr_loss,
                "max_proba_diff": float(np.abs(streamed["proba"] - reference["proba"]).max()),
                "sd_ratio_min": float(sd_ratio.min()),
                "sd_ratio_q05": float(np.quantile(sd_ratio, 0.05)),
                "sd_ratio_median": float(np.median(sd_ratio)),
                "sd_ratio_q95": float(np.quantile(sd_ratio, 0.95)),
                "sd_ratio_max": float(sd_ratio.max()),
                "intercept_sd_ratio": intercept_ratio,
                "batch_seconds": stream["median_batch_seconds"],
                "stream_seconds": stream["seconds"],
                "fit_seconds": fit["seconds"],
                "lr_seconds": baseline.seconds,
                "stream_peak_gib": stream["peak_gib"],
                "fit_peak_gib": fit["peak_gib"],
                "stream_structure": stream["structure"],
                "fit_structure": fit["structure"],
            }
        )
        print(rows[-1], flush=True)
    return rows


def report(rows: list[dict], out: Path, info: dict) -> None:
    lines = [
        "# Streaming a text-scale binary problem (structured posterior, its projection carried)",
        "",
        "`benchmarks/sparse_streaming.py` (see its docstring). The stream's posterior after "
        "the last batch against `VSLogisticRegression().fit` of the same rows (both the "
        "structured Laplace posterior); held-out: 2000 rows. Log loss ratio: stream / fit. "
        "sd ratio: the streamed marginal sds of the coefficients over the batch fit's (5 %, "
        "50 %, 95 % quantiles, and the extremes), and the intercept's. Times in seconds (the "
        "machine line below gives the load).",
        "",
        "| data | batch | log loss stream / fit (ratio) | LR | max Δp | sd ratio min / q05 / "
        "median / q95 / max | intercept sd ratio | s per batch | stream s | fit s | LR s | "
        "peak GiB stream / fit | structures stream / fit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['batch_rows']} | {r['stream_log_loss']:.4f} / "
            f"{r['fit_log_loss']:.4f} ({r['log_loss_ratio']:.4f}) | {r['lr_log_loss']:.4f} | "
            f"{r['max_proba_diff']:.3f} | {r['sd_ratio_min']:.3f} / {r['sd_ratio_q05']:.3f} / "
            f"{r['sd_ratio_median']:.3f} / {r['sd_ratio_q95']:.3f} / {r['sd_ratio_max']:.3f} | "
            f"{r['intercept_sd_ratio']:.3f} | "
            f"{r['batch_seconds']:.3f} | "
            f"{r['stream_seconds']:.2f} | {r['fit_seconds']:.2f} | {r['lr_seconds']:.3f} | "
            f"{r['stream_peak_gib']:.2f} / {r['fit_peak_gib']:.2f} | "
            f"{r['stream_structure']} / {r['fit_structure']} |"
        )
    lines += ["", machine_line(info), ""]
    (out / "sparse_streaming.md").write_text("\n".join(lines))


def plot(rows: list[dict], path: Path) -> None:
    """Per case, against the batch's rows: the held-out log loss and the intercept's sd
    of the stream over the batch fit's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        batches = [r["batch_rows"] for r in mine]
        axes[0].plot(batches, [r["log_loss_ratio"] for r in mine], "o-", label=case)
        axes[1].plot(batches, [r["intercept_sd_ratio"] for r in mine], "o-", label=case)
    axes[0].axhline(1.01, color="tab:red", lw=0.8, label="1 % target")
    axes[0].set_ylabel("held-out log loss, stream / fit")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].set_ylabel("intercept sd, stream / fit")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("rows per partial_fit batch")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", nargs=2)
    args = parser.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    out = CACHE if args.quick else args.out
    rows = []
    for case in QUICK_CASES if args.quick else CASES:
        rows += run_case(case)
    info = machine()
    write_csv(out / "sparse_streaming.csv", rows)
    (out / "sparse_streaming.json").write_text(json.dumps({"machine": info, "rows": rows}))
    report(rows, out, info)
    plot(rows, out / "sparse_streaming.png")
    print((out / "sparse_streaming.md").read_text())


if __name__ == "__main__":
    main()
