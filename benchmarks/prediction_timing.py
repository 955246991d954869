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

Multinomial part (D-044): ``predict_proba`` of ``LaplaceLogisticRegression`` (C = 1) on
standardized digits (10 classes × 64 features: its own 1,797 rows, and 1e5 rows resampled
from them), on make_classification 4000 × 8 with 4 classes, and on 20,000 held-out rows of
make_classification 40,000 × 20 with 6 and 10 classes (rows of moderate spread, which the
sparse grids take: D-195) and with 15, 20 and 30 classes (most rows of the first two on the
anisotropic grid, D-204; the third beyond its dimensions, on the QMC rule), against
``LogisticRegression().predict_proba`` on the same rows (interleaved rounds, medians; LR's
time the faster of its default-thread and one-thread medians), with one pass of the latent
moments alone (the floor of any rule on exact moments), the share of rows per rule, and
the largest and 99th-percentile absolute errors on 200 rows stratified by latent spread
against references (cached under ``results/cache``; two references on other scramblings
compared on 20 rows): the Gumbel–orthant rule on 2^18 nodes for the wide rows, QMC averages
of the softmax on 2^20 nodes for the narrower (D-117); and the error against nodes of the
QMC rule, of its own-direction integrand (``tol`` below the default, D-268) and of the
Gumbel–orthant rule (``tol`` < 2e-4; not for 15 to 30 classes, whose references are on 100
rows). On the anisotropic grid's rows, its own values' error beside
its estimate (D-204, D-226: kept where the estimate is ≤ 5e-5). Also ``predict`` against
``LogisticRegression().predict`` in the same rounds (D-157: each wide row refined only
until its class is settled). Targets: ≤ 10 × LR on the 1e5 digits rows, error ≤ 1e-4.

Usage: python benchmarks/prediction_timing.py [--rounds 7] [--part all] [--out DIR]
       python benchmarks/prediction_timing.py --quick --out /tmp/bench_out   (smoke test:
       1e5 rows, d = 20 and sparse 1e5 × 1,000 only; multinomial: 1e4 resampled digits
       rows, one round, references on 40 rows with 2^14 orthant nodes)
       python benchmarks/prediction_timing.py --part multinomial   (the multinomial part)
Writes DIR/prediction_timing.{csv,json,md,png} (binary) and
DIR/prediction_timing_multinomial.{csv,json,md,png}; DIR defaults to benchmarks/results.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from _common import (
    CACHE,
    RESULTS,
    fmt,
    machine,
    machine_line,
    recorded_warnings,
    timed,
    write_csv,
    write_json,
)
from scipy.special import expit
from sklearn.linear_model import LogisticRegression

from vsbayes import VSLogisticRegression, VSProbitRegression
from vsbayes._blas import blas_thread_count, single_blas_thread
from vsbayes.models import logistic_predictive_log_proba
from vsbayes.models import predictive as _predictive
from vsbayes.models import softmax_predictive_qmc as _qmc
from vsbayes.models import softmax_predictive_rules as _rules
from vsbayes.models.gumbel_orthant import gumbel_orthant_proba
from vsbayes.sampling.rules import symmetric_sobol_nodes

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
    parser.add_argument(
        "--rounds-multinomial", type=int, default=3, help="rounds of the multinomial cases"
    )
    parser.add_argument(
        "--part", choices=("binary", "multinomial", "all"), default="all", help="which cases"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.part in ("multinomial", "all"):
        run_multinomial(args)
    if args.part == "multinomial":
        return
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


# --- multinomial predict_proba -----------------------------------------------------------------

MULTINOMIAL_TARGETS = {"ratio": 10.0, "error": 1e-4}
# Nodes of the references: the Gumbel–orthant rule's fourth level (8 × 32,768).
REFERENCE_NODES = 2**18
# Nodes of the narrow rows' references (QMC averages of the softmax).
PLAIN_REFERENCE_NODES = 2**20


#: Classes of the moderate-spread cases: make_classification 40,000 × 20, fitted on one half
#: and predicted on the other, whose rows' centred latent traces (0.06-0.7 at 10 classes)
#: lie mostly just past the degree-5 rule's range (D-195: the sparse grids take them).
MODERATE_CLASSES = (6, 10)
#: Classes of the many-class cases, as the moderate ones: 15 and 20 classes (rows of traces
#: ~0.1-2.3, which the anisotropic grid tries up to 1.5: D-204) and 30 (beyond the grid's
#: dimensions: the QMC rule). Their references are built on fewer rows
#: (:data:`MANY_REFERENCE_ROWS`): a 2^20-node reference costs a time linear in K a row.
MANY_CLASSES = (15, 20, 30)
MANY_REFERENCE_ROWS = 100


def multinomial_problems():
    """Standardized digits (10 classes × 64), make_classification 4000 × 8 (4 classes) and
    the moderate-spread and many-class cases (:data:`MODERATE_CLASSES`,
    :data:`MANY_CLASSES`): LaplaceLogisticRegression and
    LogisticRegression, both C = 1, and the rows to predict (the training rows, or for the
    moderate cases the held-out half)."""
    from sklearn.datasets import load_digits, make_classification
    from sklearn.preprocessing import StandardScaler

    from vsbayes import LaplaceLogisticRegression

    problems = {}
    X, y = load_digits(return_X_y=True)
    Xc, yc = make_classification(4000, 8, n_informative=6, n_classes=4, random_state=0)
    data = {"digits": (X, y, None), "4 classes": (Xc, yc, None)}
    for k in MODERATE_CLASSES + MANY_CLASSES:
        Xm, ym = make_classification(
            40_000, 20, n_informative=16, n_classes=k, n_clusters_per_class=1, random_state=0
        )
        data[f"{k} classes"] = (Xm, ym, 20_000)
    for name, (A, b, n_fit) in data.items():
        A = StandardScaler().fit_transform(A)
        fit_rows = slice(None) if n_fit is None else slice(n_fit)
        predict_rows = slice(None) if n_fit is None else slice(n_fit, None)
        with recorded_warnings():  # LogisticRegression's convergence warnings
            lr = LogisticRegression(max_iter=2000).fit(A[fit_rows], b[fit_rows])
            laplace = LaplaceLogisticRegression().fit(A[fit_rows], b[fit_rows])
        problems[name] = (A[predict_rows], lr, laplace)
    return problems


def _lr_proba_seconds(lr, X, method="predict_proba"):
    """One LogisticRegression ``method`` call at the default BLAS threads and on one."""
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    getattr(lr, method)(X)
    default = time.perf_counter() - t0
    with threadpool_limits(limits=1, user_api="blas"):
        t0 = time.perf_counter()
        getattr(lr, method)(X)
        one = time.perf_counter() - t0
    return default, one


def latent_moments(estimator, X):
    """The rows' latent means (n, K) and covariances in the centred basis (n, K - 1, K - 1),
    as ``predict_proba`` computes them (``JointLatents.centred``)."""
    latent = estimator._predictive().latent(X)
    k = len(estimator.classes_)
    mean, reduced = np.empty((X.shape[0], k)), np.empty((X.shape[0], k - 1, k - 1))
    # On one BLAS thread, as predict_proba's chunks run: at the default two threads OpenBLAS's
    # pool spins between the chunks' small products (20,000 rows × 20 features, 30 classes,
    # load 3: 2.07 s against 0.29 s on one thread; the 192 × LR of an earlier run; D-227).
    with single_blas_thread():
        for rows in latent.chunks:
            mean[rows], reduced[rows] = latent.centred(rows)
    return mean, reduced


def full_covariance(reduced):
    """The centred K × K covariances ``Q R Qᵀ`` of covariances R in the centred basis Q."""
    q = _rules.centred_basis(reduced.shape[1] + 1)
    return q @ reduced @ q.T


def convergence(mean, cov, rows, reference, lr_seconds_per_row, own_directions=False):
    """Error and cost of the replicate QMC rule at each of its levels and one beyond, on
    ``rows`` against their references: every row on the level's nodes (no refinement);
    with ``own_directions``, its integrand below the default ``tol`` on the rows of
    centred trace above 5 (each class conditioned on its own direction, D-268), its
    averages normalized as ``predict_proba``'s."""
    k = mean.shape[1]
    q = _rules.centred_basis(k)
    reduced = q.T @ cov[rows] @ q
    root = np.linalg.cholesky(0.5 * (reduced + np.swapaxes(reduced, 1, 2)))
    factor = (q @ root).astype(np.float32)
    centred64 = mean[rows] - mean[rows].mean(axis=1, keepdims=True)
    centred = centred64.astype(np.float32)
    if own_directions:
        lead = _qmc._OwnDirections(*(x.astype(np.float32) for x in _qmc._own_conditioning(root)))
    else:
        lead = tuple(
            x if x.dtype.kind == "i" else x.astype(np.float32)
            for x in _qmc._leader_conditioning(root, centred64)
        )
    out = []
    for level in range(_rules._LEVELS + 1):
        # The levels are nested from level 1 on (which replaces level 0's nodes): up to
        # this one, the nodes of every level from 1.
        half = np.dstack(
            [_rules.replicate_nodes(k - 1, lv) for lv in (range(1, level + 1) if level else [0])]
        )
        _qmc._replicate_averages(
            factor[:2], centred[:2], _qmc._rows_of(lead, slice(2)), half, 2**27
        )  # warm-up
        t0 = time.perf_counter()
        replicates = _qmc._replicate_averages(factor, centred, lead, half, 2**27)
        seconds = time.perf_counter() - t0
        average = replicates.mean(axis=1)
        if own_directions:
            average /= average.sum(axis=1, keepdims=True)
        error = np.abs(average - reference).max(axis=1)
        out.append(
            {
                "nodes": int(half.shape[1] * half.shape[2] * 2),
                "max_error": float(error.max()),
                "p99_error": float(np.quantile(error, 0.99)),
                "median_error": float(np.median(error)),
                "ratio_to_lr": seconds / len(rows) / lr_seconds_per_row,
            }
        )
    return {"levels": out} | convergence_rates(out)


def convergence_rates(levels):
    """The rates at which the largest and the 99th-percentile errors fall over the nested
    levels (least squares in log-log), and the nodes at which each would reach 1e-4."""
    nested = levels[1:]
    log_n = np.log([lv["nodes"] for lv in nested])
    out = {}
    for key in ("max_error", "p99_error"):
        rate = -np.polyfit(log_n, np.log([lv[key] for lv in nested]), 1)[0]
        needed = nested[-1]["nodes"] * (nested[-1][key] / MULTINOMIAL_TARGETS["error"]) ** (
            1.0 / rate
        )
        out[f"{key}_rate"], out[f"{key}_nodes_for_target"] = float(rate), float(needed)
    return out


def rule_of_rows(cov):
    """Name of the rule each row takes (softmax_predictive's thresholds)."""
    k = cov.shape[1]
    q = _rules.centred_basis(k)
    reduced = q.T @ cov @ q
    trace = np.einsum("nii->n", reduced)
    names = np.full(len(cov), "QMC", dtype=object)
    if k == 3:
        largest = np.linalg.eigvalsh(reduced).max(axis=1)
        for per_axis, widest in _rules.TRAPEZOID_LEVELS[::-1]:
            names[largest <= widest] = f"trapezoid {per_axis}²"
        return names
    if k - 1 <= _rules.GAUSS_HERMITE_MAX_DIM:
        for per_axis, widest in _rules.GAUSS_HERMITE_LEVELS[::-1]:
            names[trace <= widest] = f"Gauss–Hermite {per_axis}^{k - 1}"
    else:
        for degree, widest, largest_dim in _rules.SPARSE_GRID_LEVELS[::-1]:
            if k - 1 <= largest_dim:
                nodes = len(_rules.sparse_grid_nodes(k - 1, degree)[0])
                names[trace <= widest] = f"degree {degree} ({nodes} nodes)"
        low, high = _rules.ANISOTROPIC_GRID_DIMS
        if low <= k - 1 <= high:
            # Kept where its embedded estimate holds (D-204), which the means decide.
            nodes = len(_rules.anisotropic_grid_nodes(k - 1)[0])
            names[trace <= _rules.ANISOTROPIC_GRID_MAX_TRACE] = (
                f"anisotropic grid ({nodes} nodes) or QMC"
            )
    names[trace <= _rules.STROUD_MAX_TRACE] = f"degree 5 ({2 * (k - 1) ** 2 + 1} nodes)"
    return names


#: The references take the Gumbel–orthant rule only on rows whose centred trace exceeds
#: this: on the moderate rows the QMC rule also takes (10 classes, traces 0.3-0.7), some
#: latent difference is narrow against the Gumbel noise and the orthant rule's integrand is
#: a step (two 16,384-node references differed by 2.1e-3 there), while the plain softmax is
#: smooth on the latents' scale and its 2^20-node average is accurate. Digits' rows (traces
#: ≥ 44) all take the orthant rule.
ORTHANT_REFERENCE_TRACE = 5.0


def reference_proba(mean, cov, n_nodes, seed):
    """``E[softmax(f)]`` row by row: the wide rows that the QMC rule takes (centred trace
    above :data:`ORTHANT_REFERENCE_TRACE`) by the Gumbel–orthant
    rule on ``n_nodes`` nodes (8 replicates; a power of 4 times 4096), scrambled from
    ``seed`` (on digits rows its error falls as N^-0.9, where the QMC average of the softmax
    on 2^20 nodes erred by up to 1.8e-4, D-117); the narrower rows, where a narrow
    difference of latents makes the orthant rule's integrand a step in its Gumbel
    coordinates, by that average on ``PLAIN_REFERENCE_NODES`` symmetric scrambled Sobol
    nodes (accurate to ~1e-9 there)."""
    out = np.empty(mean.shape)
    k = cov.shape[1]
    trace = np.einsum("nkk->n", cov) - cov.sum(axis=(1, 2)) / k
    wide = (rule_of_rows(cov) == "QMC") & (trace > ORTHANT_REFERENCE_TRACE)
    if wide.any():
        levels = 1 + round(math.log(n_nodes / (_rules.REPLICATES * 512), 4))
        out[wide] = gumbel_orthant_proba(mean[wide], cov[wide], levels=levels, seed=seed)[0]
    if not wide.all():
        out[~wide] = qmc_softmax_reference(mean[~wide], cov[~wide], PLAIN_REFERENCE_NODES, seed)
    return out


def qmc_softmax_reference(mean, cov, n_nodes, seed):
    """``E[softmax(f)]`` row by row on ``n_nodes`` symmetric scrambled Sobol nodes."""
    k = mean.shape[1]
    q = _rules.centred_basis(k)
    z = symmetric_sobol_nodes(k - 1, n_nodes, seed)
    out = np.zeros((len(mean), k))
    for i, (m, c) in enumerate(zip(mean, cov, strict=True)):
        factor = q @ np.linalg.cholesky(q.T @ c @ q)
        m = m - m.mean()
        for start in range(0, n_nodes, 2**17):
            f = z[start : start + 2**17] @ factor.T + m
            f -= f.max(axis=1, keepdims=True)
            np.exp(f, out=f)
            f /= f.sum(axis=1, keepdims=True)
            out[i] += f.sum(axis=0)
    return out / n_nodes


def orthant_convergence(mean, cov, rows, reference, lr_seconds_per_row):
    """Error and cost of the Gumbel–orthant rule (``tol`` below ``ORTHANT_BELOW``) on
    ``rows`` against their references, every row on the level's nodes (the fixed
    scrambling of ``predict_proba``, not the references')."""
    out = []
    for levels in (1, 2, 3):
        t0 = time.perf_counter()
        proba, _, nodes = gumbel_orthant_proba(mean[rows], cov[rows], levels=levels)
        seconds = time.perf_counter() - t0
        error = np.abs(proba - reference).max(axis=1)
        out.append(
            {
                "nodes": int(nodes[0]),
                "max_error": float(error.max()),
                "p99_error": float(np.quantile(error, 0.99)),
                "median_error": float(np.median(error)),
                "ratio_to_lr": seconds / len(rows) / lr_seconds_per_row,
            }
        )
    return out


def stratified_rows(cov, n_rows):
    """``n_rows`` rows evenly spaced in the rank of their centred latent trace."""
    k = cov.shape[1]
    trace = np.einsum("nkk->n", cov) - cov.sum(axis=(1, 2)) / k
    order = np.argsort(trace, kind="stable")
    return np.unique(order[np.linspace(0, len(order) - 1, n_rows).round().astype(int)])


def references(name, mean, cov, rows, n_nodes):
    """The reference probabilities of ``rows`` (cached under CACHE), and a second reference
    on other scramblings for the first 20 of them (the references' own error)."""
    stem = re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")
    path = CACHE / f"prediction_reference_{stem}_{len(rows)}_{n_nodes}.npz"
    if path.exists():
        saved = np.load(path)
        if np.array_equal(saved["rows"], rows):
            return saved["reference"], saved["second"]
    reference = reference_proba(mean[rows], cov[rows], n_nodes, seed=777)
    second = reference_proba(mean[rows[:20]], cov[rows[:20]], n_nodes, seed=778)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, rows=rows, reference=reference, second=second)
    return reference, second


def anisotropic_grid_rows(mean, reduced, tried):
    """The anisotropic grid's probabilities (normalized) and estimates on the ``tried`` rows
    (D-204: rows of 13 to 23 classes in its trace range), as the predictive computes them,
    and which rows keep them (estimate ≤ ``ANISOTROPIC_GRID_ESTIMATE``, default ``tol``)."""
    k = mean.shape[1]
    reduced = reduced[tried]
    factor = _rules.centred_basis(k) @ _rules._roots(0.5 * (reduced + np.swapaxes(reduced, 1, 2)))
    centred = mean[tried] - mean[tried].mean(axis=1, keepdims=True)
    z, w, embedded = _rules.anisotropic_grid_nodes(k - 1)
    logs, estimate = _rules._rule_log_average(
        _rules._curvature_rotation(factor, centred), centred, z, w, 2**27, embedded=embedded
    )
    kept = ~np.isnan(logs).any(axis=1) & (estimate <= _rules.ANISOTROPIC_GRID_ESTIMATE)
    with np.errstate(invalid="ignore"):
        proba = np.exp(logs - np.log(np.exp(logs).sum(axis=1, keepdims=True)))
    return proba, estimate, kept


def _grid_threshold() -> str:
    """The anisotropic grid's estimate threshold as the text writes it (5e-5, not 5e-05)."""
    return f"{_rules.ANISOTROPIC_GRID_ESTIMATE:.0e}".replace("e-0", "e-")


def grid_check(proba, mean, reduced, rules, rows, reference):
    """The anisotropic grid's rows: their share, and on the reference rows among them the
    grid's error against the references beside its estimate (D-204's claim: the error is
    below the estimate, so ≤ ``ANISOTROPIC_GRID_ESTIMATE`` on the rows that keep the grid).
    Relabels ``rules``."""
    tried = np.flatnonzero([str(r).startswith("anisotropic") for r in rules])
    if not tried.size:
        return None
    grid, estimate, kept = anisotropic_grid_rows(mean, reduced, tried)
    nodes = len(_rules.anisotropic_grid_nodes(mean.shape[1] - 1)[0])
    rules[tried[kept]] = f"anisotropic grid ({nodes} nodes)"
    rules[tried[~kept]] = f"QMC (grid tried, estimate > {_grid_threshold()})"
    at = np.flatnonzero(np.isin(tried, rows))  # tried rows among the reference rows
    where = np.searchsorted(rows, tried[at])
    error = np.abs(grid[at] - reference[where]).max(axis=1)
    on = kept[at]
    ratio = error / estimate[at]
    return {
        "tried_share": tried.size / len(rules),
        "kept_share": int(kept.sum()) / len(rules),
        "reference_rows_tried": int(at.size),
        "reference_rows_kept": int(on.sum()),
        "max_error_kept": float(error[on].max()) if on.any() else None,
        "max_estimate_kept": float(estimate[at][on].max()) if on.any() else None,
        "max_error_over_estimate": float(ratio.max()),
        "max_error_not_kept": float(error[~on].max()) if (~on).any() else None,
        # The grid's values here against predict_proba's on the rows that keep them: the
        # rows labelled as the grid's are the ones the predictive took on it.
        "kept_vs_predict_proba": float(np.abs(grid[at][on] - proba[tried[at][on]]).max())
        if on.any()
        else None,
    }


def multinomial_case(
    label, X, lr, estimator, rounds, reference_rows, n_nodes, convergence_tables=True
):
    """Interleaved timing of predict_proba (LR at both thread settings, the estimator, and
    the latent moments alone), the rules' shares and the errors against references (and
    the QMC and Gumbel–orthant rules' errors against their nodes if ``convergence_tables``)."""
    print(f"{label}: {X.shape[0]} × {X.shape[1]}, {len(lr.classes_)} classes", flush=True)
    lr.predict_proba(X[:100]), estimator.predict_proba(X[:100])  # warm-up
    lr_default, lr_one, vs, moments = [], [], [], []
    # predict (D-157: each wide row refined only until its class is settled) against
    # LogisticRegression.predict, in the same rounds.
    lr_predict_default, lr_predict_one, predict = [], [], []
    for _ in range(rounds):
        a, b = _lr_proba_seconds(lr, X)
        lr_default.append(a)
        lr_one.append(b)
        t0 = time.perf_counter()
        proba = estimator.predict_proba(X)
        vs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mean, reduced = latent_moments(estimator, X)
        moments.append(time.perf_counter() - t0)
        a, b = _lr_proba_seconds(lr, X, "predict")
        lr_predict_default.append(a)
        lr_predict_one.append(b)
        t0 = time.perf_counter()
        estimator.predict(X)
        predict.append(time.perf_counter() - t0)
    lr_seconds = min(float(np.median(lr_default)), float(np.median(lr_one)))
    lr_predict = min(float(np.median(lr_predict_default)), float(np.median(lr_predict_one)))
    cov = full_covariance(reduced)
    rules = rule_of_rows(cov)
    rows = stratified_rows(cov, reference_rows) if reference_rows else np.arange(0)
    reference = second = None
    if reference_rows:
        reference, second = references(label, mean, cov, rows, n_nodes)
    grid = grid_check(proba, mean, reduced, rules, rows, reference) if reference_rows else None
    shares = {str(r): float(np.mean(rules == r)) for r in dict.fromkeys(rules)}
    row = {
        "case": label,
        "rows": X.shape[0],
        "features": X.shape[1],
        "classes": len(lr.classes_),
        "lr_seconds": lr_seconds,
        "seconds": float(np.median(vs)),
        "ratio_to_lr": float(np.median(vs)) / lr_seconds,
        "moments_seconds": float(np.median(moments)),
        "moments_ratio_to_lr": float(np.median(moments)) / lr_seconds,
        "lr_predict_seconds": lr_predict,
        "predict_seconds": float(np.median(predict)),
        "predict_ratio_to_lr": float(np.median(predict)) / lr_predict,
        "rounds": rounds,
    }
    print(
        f"  LR {lr_seconds * 1e3:.1f} ms; VS {row['seconds']:.3f} s = {row['ratio_to_lr']:.0f} × "
        f"LR (latent moments alone {row['moments_ratio_to_lr']:.0f} ×); predict "
        f"{row['predict_seconds']:.3f} s = {row['predict_ratio_to_lr']:.0f} × LR's; rules {shares}",
        flush=True,
    )
    if grid is not None:
        row["anisotropic_grid"] = grid
        print(f"  anisotropic grid: {grid}", flush=True)
    if reference_rows:
        error = np.abs(proba[rows] - reference).max(axis=1)
        row |= {
            "reference_rows": len(rows),
            "reference_nodes": n_nodes,
            "max_error": float(error.max()),
            "p99_error": float(np.quantile(error, 0.99)),
            "median_error": float(np.median(error)),
            "reference_self_error": float(np.abs(reference[:20] - second).max()),
        }
        if convergence_tables and len(lr.classes_) > _rules.GAUSS_HERMITE_MAX_DIM + 1:
            row["convergence"] = convergence(mean, cov, rows, reference, lr_seconds / len(X))
            row["convergence"]["orthant"] = orthant_convergence(
                mean, cov, rows, reference, lr_seconds / len(X)
            )
            row["convergence"]["own"] = convergence(
                mean, cov, rows, reference, lr_seconds / len(X), own_directions=True
            )
        print(
            f"  error on {len(rows)} rows stratified by latent spread: max {error.max():.2g}, "
            f"99 % {row['p99_error']:.2g} (references differ by {row['reference_self_error']:.2g})",
            flush=True,
        )
    return row, shares


def run_multinomial(args):
    start = time.perf_counter()
    problems = multinomial_problems()
    X_digits, lr_digits, laplace_digits = problems["digits"]
    n_resampled = 10**4 if args.quick else 10**5
    rng = np.random.default_rng(0)
    resampled = X_digits[rng.integers(0, len(X_digits), n_resampled)]
    rounds = 1 if args.quick else args.rounds_multinomial
    n_reference = 40 if args.quick else 200
    n_nodes = 2**14 if args.quick else REFERENCE_NODES
    X4, lr4, laplace4 = problems["4 classes"]
    cases = [
        ("digits", X_digits, lr_digits, laplace_digits, n_reference, True),
        (f"digits resampled ({n_resampled:,} rows)", resampled, lr_digits, laplace_digits, 0, True),
        ("make_classification 4000 × 8, 4 classes", X4, lr4, laplace4, n_reference, True),
    ]
    for k in MODERATE_CLASSES + MANY_CLASSES:
        Xk, lrk, laplacek = problems[f"{k} classes"]
        label = f"make_classification 20,000 held-out × 20, {k} classes"
        if k in MANY_CLASSES:
            # No tables of the QMC and orthant rules against their nodes: with 15 to 30
            # classes they would cost more than the rest of the case.
            n_ref = n_reference if args.quick else MANY_REFERENCE_ROWS
            cases.append((label, Xk, lrk, laplacek, n_ref, False))
        else:
            cases.append((label, Xk, lrk, laplacek, n_reference, True))
    rows, shares = [], {}
    load_before = os.getloadavg()
    for label, X, lr, estimator, n_ref, tables in cases:
        row, shares[label] = multinomial_case(
            label, X, lr, estimator, rounds, n_ref, n_nodes, tables
        )
        rows.append(row)
    # The resampled rows are digits rows and the rule is row by row: the same errors.
    for key in ("reference_rows", "max_error", "p99_error", "median_error"):
        rows[1][key] = rows[0][key]
    info = machine()
    info["load_average_1_5_15min"] = {"before": load_before, "after": os.getloadavg()}
    # Fits, timings and references (those not cached) of the whole part.
    info["part_seconds"] = time.perf_counter() - start
    out = args.out
    # The nested tables (convergence, the anisotropic grid's check) stay in the JSON and
    # the Markdown.
    nested = ("convergence", "anisotropic_grid")
    write_csv(
        out / "prediction_timing_multinomial.csv",
        [{key: value for key, value in r.items() if key not in nested} for r in rows],
    )
    write_json(
        out / "prediction_timing_multinomial.json",
        {
            "machine": info,
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows,
            "rule_shares": shares,
        },
    )
    md = multinomial_markdown(rows, shares, info, args)
    (out / "prediction_timing_multinomial.md").write_text(md + "\n")
    multinomial_plot(rows, out / "prediction_timing_multinomial.png")
    print(md)


def multinomial_markdown(rows, shares, info, args):
    big = rows[1]
    lines = [
        "# Multinomial predict_proba",
        "",
        "`predict_proba` of `LaplaceLogisticRegression` (C = 1, standardized features) against "
        "`LogisticRegression().predict_proba` on the same rows, in one process: interleaved "
        f"rounds ({rows[0]['rounds']} here), medians; LogisticRegression's time is the faster "
        "of its medians at the default BLAS threads and on one. 'Latent moments alone' is one "
        "pass computing each row's latent mean and centred covariance (`JointLatents.centred`, "
        "chunk after chunk on one thread, where `predict_proba` runs its chunks on the BLAS "
        "threads), the floor of any rule on exact moments. Errors: largest absolute error "
        "over the classes, on rows sampled evenly in the rank of their latent spread, against "
        "references on "
        f"{rows[0].get('reference_nodes', REFERENCE_NODES):,} nodes of the Gumbel–orthant rule "
        "(`gumbel_orthant_proba`) for the rows the QMC rule takes whose centred trace "
        f"exceeds {ORTHANT_REFERENCE_TRACE:g}, and QMC averages of the "
        f"softmax on {PLAIN_REFERENCE_NODES:,} symmetric scrambled Sobol nodes for the narrower "
        "rows, where the orthant rule's integrand is a step in its Gumbel coordinates (the "
        "last column: two such references on other scramblings differ by this much on 20 of "
        "the rows; on digits, QMC averages of the softmax on 2^20 nodes, the references "
        "before, differed by up to 2.2e-4)."
        + (" **Quick run (smoke test sizes).**" if args.quick else ""),
        "",
        machine_line(info) + " Load average (1 min) of the shared machine: "
        f"{info['load_average_1_5_15min']['before'][0]:.1f} before the run, "
        f"{info['load_average_1_5_15min']['after'][0]:.1f} after. The whole part (fits, "
        f"timings, references not cached) took {info['part_seconds'] / 60:.0f} min.",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| {big['case']}: ≤ {MULTINOMIAL_TARGETS['ratio']:g} × LR | {big['ratio_to_lr']:.0f} × "
        f"(latent moments alone {big['moments_ratio_to_lr']:.0f} ×) | "
        f"{_mark(big['ratio_to_lr'] <= MULTINOMIAL_TARGETS['ratio'])} |",
        f"| absolute error ≤ 1e-4 on every row (digits rows) | max {rows[0]['max_error']:.2g} | "
        f"{_mark(rows[0]['max_error'] <= MULTINOMIAL_TARGETS['error'])} |",
        "",
        "## Cases",
        "",
        "| case | rows × features, classes | LR | predict_proba | × LR | latent moments × LR |"
        " predict × LR's predict | max error | 99 % error | references differ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['rows']:,} × {r['features']}, {r['classes']} | "
            f"{r['lr_seconds'] * 1e3:.1f} ms | {fmt(r['seconds'])} s | {r['ratio_to_lr']:.0f} | "
            f"{r['moments_ratio_to_lr']:.0f} | {r['predict_ratio_to_lr']:.0f} | "
            f"{fmt(r.get('max_error', np.nan))} | "
            f"{fmt(r.get('p99_error', np.nan))} | {fmt(r.get('reference_self_error', np.nan))} |"
        )
    lines += ["", "Share of rows by rule:", ""]
    for label, s in shares.items():
        lines.append(f"- {label}: " + ", ".join(f"{k} {v:.1%}" for k, v in s.items()))
    grids = [r for r in rows if "anisotropic_grid" in r]
    if grids:
        lines += [
            "",
            "## The anisotropic grid's estimate (D-204, D-226)",
            "",
            "Rows of 13 to 23 classes with a centred trace in (0.08, 1.5] try the anisotropic "
            "grid and keep its value where its embedded rule's estimate (the largest "
            f"difference over the classes) is ≤ {_grid_threshold()}, the "
            "others going on to the QMC rule. On "
            "the reference rows that try it, the grid's own value against the references: "
            "on the rows that keep it, the largest error and the largest estimate; on all of "
            "them, the largest ratio of error to estimate (the claim: below 1), and the "
            "largest error of the rows that do not keep it.",
            "",
            "| case | rows trying / keeping the grid | reference rows trying / keeping | "
            "max error (kept) | max estimate (kept) | max error / estimate | "
            "max error (not kept) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in grids:
            g = r["anisotropic_grid"]
            lines.append(
                f"| {r['case']} | {g['tried_share']:.1%} / {g['kept_share']:.1%} | "
                f"{g['reference_rows_tried']} / {g['reference_rows_kept']} | "
                f"{_fmt(g['max_error_kept'])} | {_fmt(g['max_estimate_kept'])} | "
                f"{fmt(g['max_error_over_estimate'])} | {_fmt(g['max_error_not_kept'])} |"
            )
    for r in rows:
        if "convergence" not in r:
            continue
        c = r["convergence"]
        lines += [
            "",
            f"## The replicate QMC rule's error against its nodes ({r['case']})",
            "",
            f"Every one of the {r['reference_rows']} rows above on the nodes up to one level "
            "(8 scrambled replicates, no refinement; `predict_proba` refines row by row up to "
            f"{c['levels'][-2]['nodes']:,} nodes); × LR: the time per row over "
            "LogisticRegression's on these rows, as if every row took that level (one thread, "
            "in blocks of 2^27 bytes).",
            "",
            "| nodes per row | max error | 99 % error | median error | × LR |",
            "|---|---|---|---|---|",
        ]
        for level in c["levels"]:
            lines.append(
                f"| {level['nodes']:,} | {fmt(level['max_error'])} | {fmt(level['p99_error'])} | "
                f"{fmt(level['median_error'])} | {level['ratio_to_lr']:.0f} |"
            )
        lines += [
            "",
            f"Over the nested levels ({c['levels'][1]['nodes']:,} to "
            f"{c['levels'][-1]['nodes']:,} nodes) the largest error falls as "
            f"N^-{c['max_error_rate']:.2f} and the 99th percentile as "
            f"N^-{c['p99_error_rate']:.2f}: 1e-4 would take about "
            f"{c['max_error_nodes_for_target']:.0e} nodes on the worst of these rows and "
            f"{c['p99_error_nodes_for_target']:.0e} on 99 % of them.",
        ]
        if "own" in c:
            lines += [
                "",
                f"## The own-direction rule's error against its nodes ({r['case']})",
                "",
                "Below the default `tol` the rows of centred trace above 5 average every "
                "class's softmax conditioned on its own direction (D-268); here every row on "
                "the level's nodes as above.",
                "",
                "| nodes per row | max error | 99 % error | median error | × LR |",
                "|---|---|---|---|---|",
            ]
            for level in c["own"]["levels"]:
                lines.append(
                    f"| {level['nodes']:,} | {fmt(level['max_error'])} | "
                    f"{fmt(level['p99_error'])} | {fmt(level['median_error'])} | "
                    f"{level['ratio_to_lr']:.0f} |"
                )
        if "orthant" in c:
            lines += [
                "",
                f"## The Gumbel–orthant rule's error against its nodes ({r['case']})",
                "",
                "`softmax_predictive_log_proba(..., tol=1e-4)` (any `tol` below "
                "`ORTHANT_BELOW`) takes this rule on the wide rows that the own-direction "
                "rule leaves above `tol`; here every row on the level's nodes (8 replicates, "
                "float64, one thread at a time in blocks).",
                "",
                "| nodes per row | max error | 99 % error | median error | × LR |",
                "|---|---|---|---|---|",
            ]
            for level in c["orthant"]:
                lines.append(
                    f"| {level['nodes']:,} | {fmt(level['max_error'])} | "
                    f"{fmt(level['p99_error'])} | {fmt(level['median_error'])} | "
                    f"{level['ratio_to_lr']:.0f} |"
                )
    return "\n".join(lines)


def _fmt(x):
    """``fmt`` of a value that may be missing (None)."""
    return fmt(np.nan if x is None else x)


def _plot_label(case):
    """A case's name on short lines: the classes first for make_classification's."""
    if case.startswith("make_classification "):
        size, classes = case.removeprefix("make_classification ").rsplit(", ", 1)
        return f"{classes}\n({size.replace(' held-out ', chr(10) + 'held-out' + chr(10))})"
    return case.replace(" (", "\n(")


def multinomial_plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(14, 4.8))
    labels = [_plot_label(r["case"]) for r in rows]
    x = np.arange(len(rows))
    ax_t.bar(x - 0.2, [r["ratio_to_lr"] for r in rows], 0.4, label="predict_proba")
    ax_t.bar(x + 0.2, [r["moments_ratio_to_lr"] for r in rows], 0.4, label="latent moments alone")
    ax_t.axhline(MULTINOMIAL_TARGETS["ratio"], color="k", ls=":", label="target 10 ×")
    ax_t.set_xticks(x, labels, fontsize=7)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time / LogisticRegression.predict_proba")
    ax_t.grid(True, which="both", axis="y", alpha=0.3)
    ax_t.legend(fontsize=8)
    measured = [r for r in rows if "max_error" in r and "resampled" not in r["case"]]
    xe = np.arange(len(measured))
    ax_e.bar(xe - 0.2, [r["max_error"] for r in measured], 0.4, label="max")
    ax_e.bar(xe + 0.2, [r["p99_error"] for r in measured], 0.4, label="99th percentile")
    ax_e.plot(xe, [r["reference_self_error"] for r in measured], "kx", label="references differ")
    ax_e.axhline(MULTINOMIAL_TARGETS["error"], color="k", ls=":", label="target 1e-4")
    ax_e.set_xticks(xe, [_plot_label(r["case"]) for r in measured], fontsize=7)
    ax_e.set_yscale("log")
    ax_e.set_ylabel("absolute error of p (largest over classes)")
    ax_e.grid(True, which="both", axis="y", alpha=0.3)
    ax_e.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
