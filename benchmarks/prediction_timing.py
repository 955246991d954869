"""Prediction time and memory of the VS estimators, next to scikit-learn's LogisticRegression.

``predict_proba`` on 1,000,000 rows, timed in one process: every round times each estimator
once, in turn, and the best of ``--rounds`` rounds is kept (the median is reported too), so
that another process competing for the 2 cores slows all estimators alike. Ratios divide
by ``LogisticRegression().predict_proba`` on the same rows.

Cases (X seeded, labels Bernoulli(σ(X w)) with |w| = 2 as in estimator_timing.py):

1. dense 1e6 × 20, standard normal;
2. dense 1e6 × 200, standard normal;
3. sparse CSR 1e6 × 10,000 with 0.1 % non-zeros (N(0, 1) values; ~10 per row).

Every estimator is fitted on the first ``--fit-rows`` rows only (20,000 dense, 2,000
sparse): the cost of the predictive depends on the posterior's shape (a mean vector and a
covariance matrix per class), not on how it was fitted; the fitted posterior only sets the
latent variances, whose spread is reported, and with it the share of rows that each rule of
the logistic predictive takes (Gauss–Hermite, mixture of probits, quadrature).

Also: the logistic predictive alone on the d = 20 case's latent means and variances (the
closed-form terms against the quadrature they replace); the peak memory that
``predict_proba`` allocates on the 1e6 × 20 case (tracemalloc, which sees NumPy's
allocations), against the size of X; and the accuracy of the closed-form terms against the
quadrature on a grid of |mean| ≤ 60, var from 1e-6 to 1e8.

Targets (D-022 in docs/decisions.md): on 1e6 × 20, VSLogisticRegression ≤ 4 × and
VSProbitRegression ≤ 3 × LogisticRegression; peak memory of predict_proba ≤ 2 × the size
of X; relative error of log p and log(1 - p) ≤ 1e-6 and absolute error of p ≤ 1e-7 on the
grid.

Usage: python benchmarks/prediction_timing.py [--rounds 7] [--out DIR]
       python benchmarks/prediction_timing.py --quick --out /tmp/bench_out   (smoke test:
       1e5 rows, d = 20 and sparse 1e5 × 1,000 only)
Writes DIR/prediction_timing.{csv,json,md,png}; DIR defaults to benchmarks/results.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from _common import RESULTS, fmt, machine, machine_line, timed, write_csv, write_json
from scipy.special import expit
from sklearn.linear_model import LogisticRegression

from vsbayes import VSLogisticRegression, VSProbitRegression
from vsbayes._blas import blas_thread_count
from vsbayes.models import logistic_predictive_log_proba
from vsbayes.models import predictive as _predictive

TARGETS = {"logistic_ratio": 4.0, "probit_ratio": 3.0, "memory_ratio": 2.0}
ACCURACY_TARGETS = {"log_relative": 1e-6, "p_absolute": 1e-7}
ESTIMATORS = {
    "LogisticRegression": lambda: LogisticRegression(),
    "VSLogisticRegression": lambda: VSLogisticRegression(random_state=0),
    "VSProbitRegression": lambda: VSProbitRegression(random_state=0),
}
SHORT = {
    "LogisticRegression": "LR",
    "VSLogisticRegression": "VS",
    "VSProbitRegression": "VS-probit",
}


def dense_case(n_rows, d, seed=0):
    """Standard-normal X and Bernoulli(σ(X w)) labels, |w| = 2."""
    rng = np.random.default_rng([n_rows, d, seed])
    X = rng.standard_normal((n_rows, d))
    return X, _labels(X, d, rng)


def sparse_case(n_rows, d, density, seed=0):
    """CSR X with N(0, 1) non-zeros and Bernoulli(σ(X w)) labels, |w| = 2 per row's scale."""
    rng = np.random.default_rng([n_rows, d, seed, 1])
    X = sp.random(n_rows, d, density=density, format="csr", rng=rng, data_rvs=rng.standard_normal)
    # A row holds ~density·d non-zeros: w scaled so that the latent x·w has sd about 2.
    return X, _labels(X, density * d, rng)


def _labels(X, effective_d, rng):
    w = rng.normal(0.0, 2.0 / np.sqrt(effective_d), size=X.shape[1])
    return (rng.random(X.shape[0]) < expit(np.asarray(X @ w))).astype(np.int64)


def fit_all(X, y, fit_rows):
    """The three estimators fitted on the first ``fit_rows`` rows (VS warnings counted)."""
    fitted, caught = {}, []
    for name, make in ESTIMATORS.items():
        seconds, fitted[name], record = timed(
            lambda make=make: make().fit(X[:fit_rows], y[:fit_rows])
        )
        caught += [f"{name}: {w.category.__name__}" for w in record]
        print(f"  fitted {name} on {fit_rows} rows in {seconds:.1f} s", flush=True)
    return fitted, caught


def time_predict_proba(fitted, X, rounds):
    """Best and median seconds of predict_proba per estimator, interleaved rounds."""
    times = {name: [] for name in fitted}
    for _ in range(rounds):
        for name, estimator in fitted.items():
            t0 = time.perf_counter()
            estimator.predict_proba(X)
            times[name].append(time.perf_counter() - t0)
    return {name: (min(t), float(np.median(t))) for name, t in times.items()}


def rule_shares(mean, var):
    """Share of rows that each rule of the logistic predictive takes (for m ≤ 0: -|mean|)."""
    m, v = -np.abs(mean), var
    gh = v <= _predictive._GH_MAX_VAR[-1]
    mixture = ~gh
    floor = _predictive._MIXTURE_FLOOR
    shifted_ok = _predictive._probit_mixture(-(m[mixture] + v[mixture]), v[mixture]) >= floor
    direct_ok = _predictive._probit_mixture(m[mixture], v[mixture]) >= floor
    quadrature = int(np.count_nonzero(~(shifted_ok | direct_ok)))
    n = mean.size
    return {
        "gauss_hermite": float(np.count_nonzero(gh) / n),
        "mixture": float((np.count_nonzero(mixture) - quadrature) / n),
        "quadrature": float(quadrature / n),
    }


def case_rows(label, X, y, fit_rows, rounds, extras):
    print(f"{label}: {X.shape[0]} × {X.shape[1]}", flush=True)
    fitted, caught = fit_all(X, y, fit_rows)
    timings = time_predict_proba(fitted, X, rounds)
    lr_best, lr_median = timings["LogisticRegression"]
    mean, var = fitted["VSLogisticRegression"].latent_mean_and_variance(X)
    shares = rule_shares(mean, var)
    quantiles = np.quantile(var, [0.0, 0.5, 0.99, 1.0])
    rows = []
    for name, (best, median) in timings.items():
        rows.append(
            {
                "case": label,
                "M": X.shape[0],
                "d": X.shape[1],
                "sparse": sp.issparse(X),
                "fit_rows": fit_rows,
                "estimator": name,
                "seconds": best,
                "seconds_median": median,
                "ratio_to_lr": best / lr_best,
                "ratio_to_lr_median": median / lr_median,
            }
        )
        print(f"  {name}: {best:.3f} s (× LR {best / lr_best:.2f})", flush=True)
    extras[label] = {
        "latent_var_quantiles_0_50_99_100": quantiles.tolist(),
        "logistic_rule_shares": shares,
        "fit_warnings": caught,
    }
    return rows, fitted


def predictive_alone(fitted, X):
    """Seconds of the logistic predictive on the latent moments of X: closed form vs quadrature."""
    mean, var = fitted["VSLogisticRegression"].latent_mean_and_variance(X)
    fast = []
    for _ in range(5):
        t0 = time.perf_counter()
        logistic_predictive_log_proba(mean, var)
        fast.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    logistic_predictive_log_proba(mean, var, method="quadrature")
    return {"auto_seconds": min(fast), "quadrature_seconds": time.perf_counter() - t0}


def peak_memory(fitted, X):
    """Peak bytes allocated during one predict_proba (tracemalloc), per estimator."""
    out = {}
    for name, estimator in fitted.items():
        estimator.predict_proba(X[:1000])  # imports and caches outside the measurement
        tracemalloc.start()
        estimator.predict_proba(X)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[name] = {"peak_bytes": peak, "ratio_to_X": peak / X.nbytes}
    return out


def accuracy_grid():
    """Closed-form terms against the quadrature: |mean| ≤ 60, var from 1e-6 to 1e8."""
    half = np.geomspace(1e-3, 60.0, 120)
    mean = np.concatenate([-half[::-1], [0.0], half])[:, None]
    var = np.geomspace(1e-6, 1e8, 141)[None, :]
    log_p, log_q = logistic_predictive_log_proba(mean, var)
    ref_p, ref_q = logistic_predictive_log_proba(mean, var, method="quadrature")
    rel = np.maximum(np.abs(log_p - ref_p) / np.abs(ref_p), np.abs(log_q - ref_q) / np.abs(ref_q))
    return {
        "grid": "241 means (0 and ±geomspace(1e-3, 60)) × 141 variances (geomspace(1e-6, 1e8))",
        "max_log_relative": float(rel.max()),
        "max_p_absolute": float(np.abs(np.exp(log_p) - np.exp(ref_p)).max()),
        "var": var.ravel().tolist(),
        "max_log_relative_per_var": rel.max(axis=0).tolist(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the 1e6 × 20 case")
    parser.add_argument("--rounds-large", type=int, default=5, help="rounds of the others")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    n_rows = 10**5 if args.quick else 10**6
    cases = [("dense d=20", dense_case(n_rows, 20), 20_000)]
    if not args.quick:
        cases.append(("dense d=200", dense_case(n_rows, 200), 20_000))
    sparse_d = 1_000 if args.quick else 10_000
    cases.append((f"sparse d={sparse_d}", sparse_case(n_rows, sparse_d, 1e-3), 2_000))
    rows, extras = [], {}
    memory = alone = None
    load_before = os.getloadavg()
    for label, (X, y), fit_rows in cases:
        rounds = args.rounds if label == "dense d=20" else args.rounds_large
        case, fitted = case_rows(label, X, y, fit_rows, rounds, extras)
        rows += case
        if label == "dense d=20":
            alone = predictive_alone(fitted, X)
            memory = peak_memory(fitted, X)
            memory["X_bytes"] = X.nbytes
        del X, y, fitted
    accuracy = accuracy_grid()
    info = machine()
    # Other processes share the 2 cores: their load is part of the conditions.
    info["load_average_1_5_15min"] = {"before": load_before, "after": os.getloadavg()}
    info["prediction_threads"] = blas_thread_count()
    out = args.out
    write_csv(out / "prediction_timing.csv", rows)
    write_json(
        out / "prediction_timing.json",
        {
            "machine": info,
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows,
            "cases": extras,
            "predictive_alone": alone,
            "memory": memory,
            "accuracy": accuracy,
        },
    )
    md = markdown(rows, extras, alone, memory, accuracy, info, args)
    (out / "prediction_timing.md").write_text(md + "\n")
    plot(rows, accuracy, out / "prediction_timing.png")
    print(md)


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def markdown(rows, extras, alone, memory, accuracy, info, args):
    first = [r for r in rows if r["case"] == "dense d=20"]
    ratio = {r["estimator"]: r["ratio_to_lr"] for r in first}
    x_mib = memory["X_bytes"] / 2**20
    lines = [
        "# Prediction time",
        "",
        "`predict_proba` on every row, timed in one process in interleaved rounds (each "
        f"estimator once per round, best of {args.rounds} rounds on 1e6 × 20 and of "
        f"{args.rounds_large} on the others; the median is in the table too), and its "
        "ratio to `LogisticRegression().predict_proba` on the same rows. The estimators are "
        "fitted on the first rows only (`fit rows`): the predictive's cost depends on the "
        "posterior's shape, not on how it was fitted. The logistic predictive takes a few "
        "closed-form terms per row (Gauss–Hermite for latent variances up to 0.42, a mixture of "
        "nine probits beyond) and the quadrature only for the rows where their error bound "
        "does not hold (shares of rows by rule below)."
        + (" **Quick run (smoke test sizes).**" if args.quick else ""),
        "",
        machine_line(info) + " Load average (1 min) of the machine, shared with other processes: "
        f"{info['load_average_1_5_15min']['before'][0]:.1f} before the run, "
        f"{info['load_average_1_5_15min']['after'][0]:.1f} after. The VS estimators run their "
        f"chunks of rows on as many threads as BLAS may use (here {info['prediction_threads']}),"
        " each product on one BLAS thread; LogisticRegression's product is BLAS's own.",
        "",
        f"## Targets ({first[0]['M']:,} × 20)",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| VSLogisticRegression ≤ {TARGETS['logistic_ratio']:g} × LR | "
        f"{ratio['VSLogisticRegression']:.2f} × | "
        f"{_mark(ratio['VSLogisticRegression'] <= TARGETS['logistic_ratio'])} |",
        f"| VSProbitRegression ≤ {TARGETS['probit_ratio']:g} × LR | "
        f"{ratio['VSProbitRegression']:.2f} × | "
        f"{_mark(ratio['VSProbitRegression'] <= TARGETS['probit_ratio'])} |",
    ]
    for name in ("VSLogisticRegression", "VSProbitRegression"):
        peak = memory[name]
        lines.append(
            f"| peak memory of {SHORT[name]} predict_proba ≤ {TARGETS['memory_ratio']:g} × X "
            f"({x_mib:.0f} MiB) | {peak['peak_bytes'] / 2**20:.0f} MiB = "
            f"{peak['ratio_to_X']:.2f} × | {_mark(peak['ratio_to_X'] <= TARGETS['memory_ratio'])} |"
        )
    rel_ok = accuracy["max_log_relative"] <= ACCURACY_TARGETS["log_relative"]
    abs_ok = accuracy["max_p_absolute"] <= ACCURACY_TARGETS["p_absolute"]
    lines += [
        f"| relative error of log p, log(1 - p) ≤ 1e-6 (grid below) | "
        f"{accuracy['max_log_relative']:.2g} | {_mark(rel_ok)} |",
        f"| absolute error of p ≤ 1e-7 | {accuracy['max_p_absolute']:.2g} | {_mark(abs_ok)} |",
        "",
        "## predict_proba",
        "",
        "| case | fit rows | estimator | seconds | × LR | median × LR |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['fit_rows']} | {r['estimator']} | {fmt(r['seconds'])} | "
            f"{r['ratio_to_lr']:.2f} | {r['ratio_to_lr_median']:.2f} |"
        )
    lines += [
        "",
        "Latent variance of the VSLogisticRegression posterior at the rows (min, median, 99 %, "
        "max), and the share of rows by rule of the logistic predictive:",
        "",
        "| case | latent variance | Gauss–Hermite | mixture | quadrature |",
        "|---|---|---|---|---|",
    ]
    for label, extra in extras.items():
        q = ", ".join(fmt(x) for x in extra["latent_var_quantiles_0_50_99_100"])
        s = extra["logistic_rule_shares"]
        lines.append(
            f"| {label} | {q} | {s['gauss_hermite']:.2%} | {s['mixture']:.2%} | "
            f"{s['quadrature']:.2%} |"
        )
    lines += [
        "",
        f"## The logistic predictive alone ({first[0]['M']:,} × 20 case's latent moments)",
        "",
        f"Closed-form terms {alone['auto_seconds'] * 1e3:.0f} ms (best of 5); the quadrature "
        f"they replace {alone['quadrature_seconds']:.2f} s "
        f"({alone['quadrature_seconds'] / alone['auto_seconds']:.0f} ×).",
        "",
        "## Accuracy",
        "",
        f"Closed-form terms against the quadrature (accurate to 1e-13) on {accuracy['grid']}: "
        f"largest relative error of log p or log(1 - p) {accuracy['max_log_relative']:.2g}, "
        f"largest absolute error of p {accuracy['max_p_absolute']:.2g}. The tests check the "
        "same bounds against scipy.integrate.quad.",
    ]
    return "\n".join(lines)


def plot(rows, accuracy, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_a) = plt.subplots(1, 2, figsize=(11, 4.3))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    width = 0.38
    for k, name in enumerate(("VSLogisticRegression", "VSProbitRegression")):
        values = [
            next(r["ratio_to_lr"] for r in rows if r["case"] == c and r["estimator"] == name)
            for c in cases
        ]
        ax_t.bar(np.arange(len(cases)) + (k - 0.5) * width, values, width, label=SHORT[name])
    ax_t.axhline(TARGETS["logistic_ratio"], color="C0", ls=":", label="VS target (d = 20)")
    ax_t.axhline(TARGETS["probit_ratio"], color="C1", ls=":", label="VS-probit target (d = 20)")
    ax_t.set_xticks(np.arange(len(cases)), cases)
    ax_t.set_yscale("log")
    ax_t.set_ylim(bottom=1.0)
    ax_t.set_ylabel("predict_proba time / LogisticRegression's")
    ax_t.set_title("predict_proba on 1e6 rows, relative to LogisticRegression", fontsize=10)
    ax_t.grid(True, which="both", axis="y", alpha=0.3)
    ax_t.legend(fontsize=8)
    ax_a.loglog(accuracy["var"], accuracy["max_log_relative_per_var"], "o-", ms=3)
    ax_a.axhline(ACCURACY_TARGETS["log_relative"], color="k", ls=":", label="requirement 1e-6")
    ax_a.set_xlabel("latent variance")
    ax_a.set_ylabel("max over |mean| ≤ 60 of the relative error")
    ax_a.set_title("log p and log(1 - p): closed-form terms vs quadrature", fontsize=10)
    ax_a.grid(True, which="both", alpha=0.3)
    ax_a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
