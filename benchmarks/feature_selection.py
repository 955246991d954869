"""Feature selection by the evidence (ARD) against the L1 grid search.

Sparse truth: M = 500 training rows, d = 200 standard normal features (independent, or
AR(1)-correlated with ρ = 0.5), 10 of them relevant (positions drawn at random,
coefficients ±U(0.5, 2)), labels from the logistic model; 5000 held-out rows from the
same model. Per design, ``--seeds`` data sets.

Methods (``METHODS``; each a name, a factory and the selected features of a fitted model):

* ``ard_vs``: ``EmpiricalBayesClassifier(VSLogisticRegression(random_state=0), scales="ard")``
  (the default estimator), the inclusion prior by the evidence;
* ``ard_ep``: the same with ``EPLogisticRegression()``;
* ``ard_plain_ep``: ``inclusion_prior=0.5``, plain type-II maximum likelihood (a feature
  stays whenever including it raises the evidence): what the inclusion prior adds;
* ``shared_c_ep``: one C by the evidence, every feature kept (no selection): the reference
  of the held-out log loss without selection.

Baseline: ``GridSearchCV(LogisticRegression(l1_ratio=1, solver="liblinear"))`` (the L1
penalty; ``penalty="l1"`` before scikit-learn 1.8) over 20 Cs log-spaced in [1e-3, 1e2], 5
stratified folds, ``scoring="neg_log_loss"``, refit on all the training rows; its selected
features are the nonzero coefficients.

Measured per data set: the true features' recovery (precision, recall, F1 of the selected
set against the 10 relevant ones), the held-out log loss, the fit time. Times are medians of
``--repeats`` fits interleaved with the grid search's in the same process; the grid
search's time is the faster of its median at the default BLAS threads and on one BLAS
thread (as ``_common.LRBaseline`` times ``LogisticRegression``); the ratio is the method's
time over that. The target: F1 and held-out log loss at least as good as the grid
search's, in less time.

Shrinkage priors (``vsbayes.LaplacePrior``, ``StudentTPrior``, ``HorseshoePrior``) are added
as rows by appending to ``METHODS`` (see the comment there).

Usage: python benchmarks/feature_selection.py [--seeds 5] [--repeats 3] [--quick]
Writes benchmarks/results/feature_selection.{csv,json,md,png} (``--quick``: 2 seeds, one
repeat, under results/cache/).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from _common import CACHE, RESULTS, machine, machine_line, recorded_warnings, write_csv, write_json
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, log_loss, precision_score, recall_score
from sklearn.model_selection import GridSearchCV, StratifiedKFold

from vsbayes import EmpiricalBayesClassifier, EPLogisticRegression, VSLogisticRegression

N_TRAIN, N_TEST, N_FEATURES, N_RELEVANT = 500, 5000, 200, 10
DESIGNS = {"independent": 0.0, "correlated": 0.5}
L1_CS = np.logspace(-3, 2, 20)


class Method(NamedTuple):
    """A row of the benchmark: ``make()`` an unfitted estimator, ``support(fitted)`` its
    selected features (a boolean mask over the d features)."""

    name: str
    make: Callable[[], object]
    support: Callable[[object], np.ndarray]


def _selector_support(model) -> np.ndarray:
    return model.get_support()


def _all_features(model) -> np.ndarray:
    return np.ones(model.n_features_in_, dtype=bool)


METHODS: list[Method] = [
    Method(
        "ard_vs",
        lambda: EmpiricalBayesClassifier(VSLogisticRegression(random_state=0), scales="ard"),
        _selector_support,
    ),
    Method(
        "ard_ep",
        lambda: EmpiricalBayesClassifier(EPLogisticRegression(), scales="ard"),
        _selector_support,
    ),
    Method(
        "ard_plain_ep",
        lambda: EmpiricalBayesClassifier(EPLogisticRegression(), scales="ard", inclusion_prior=0.5),
        _selector_support,
    ),
    Method(
        "shared_c_ep",
        lambda: EmpiricalBayesClassifier(EPLogisticRegression()),
        _all_features,
    ),
    # Shrinkage priors, once their global scale is chosen by the evidence: a row each, e.g.
    #   Method("horseshoe_ep", lambda: <estimator with prior=vsbayes.HorseshoePrior(τ)>,
    #          lambda model: <mask: summary()["relevance"] > 0.5, the coefficients'
    #          posterior relevance column of the summary's marks>)
    # and the same for LaplacePrior (the Bayesian L1, against the L1 grid search directly).
]


def grid_search() -> GridSearchCV:
    return GridSearchCV(
        LogisticRegression(l1_ratio=1.0, solver="liblinear"),
        {"C": L1_CS},
        cv=StratifiedKFold(5, shuffle=True, random_state=0),
        scoring="neg_log_loss",
    )


def sparse_truth(seed: int, rho: float):
    """Training and held-out rows of one sparse-truth data set, and the relevant mask."""
    rng = np.random.default_rng(seed)
    rows = N_TRAIN + N_TEST
    X = rng.standard_normal((rows, N_FEATURES))
    if rho:  # AR(1): x_j = ρ x_{j-1} + √(1 − ρ²) ε_j, unit variances
        for j in range(1, N_FEATURES):
            X[:, j] = rho * X[:, j - 1] + np.sqrt(1.0 - rho**2) * X[:, j]
    coef = np.zeros(N_FEATURES)
    relevant = rng.choice(N_FEATURES, N_RELEVANT, replace=False)
    coef[relevant] = rng.choice([-1.0, 1.0], N_RELEVANT) * rng.uniform(0.5, 2.0, N_RELEVANT)
    y = (X @ coef + rng.logistic(size=rows) > 0).astype(int)
    return X[:N_TRAIN], y[:N_TRAIN], X[N_TRAIN:], y[N_TRAIN:], coef != 0


def _timed_fit(make, X, y):
    model = make()
    with recorded_warnings() as caught:
        start = time.perf_counter()
        model.fit(X, y)
        seconds = time.perf_counter() - start
    return seconds, model, len(caught)


def _scores(truth, support, y_test, proba) -> dict:
    return {
        "selected": int(support.sum()),
        "precision": float(precision_score(truth, support, zero_division=0.0)),
        "recall": float(recall_score(truth, support)),
        "f1": float(f1_score(truth, support)),
        "log_loss": float(log_loss(y_test, proba)),
    }


def compare(design: str, seed: int, repeats: int) -> list[dict]:
    from threadpoolctl import threadpool_limits

    X, y, X_test, y_test, truth = sparse_truth(seed, DESIGNS[design])
    times = {m.name: [] for m in METHODS}
    grid_default, grid_one = [], []
    models, caught = {}, {}
    for _ in range(repeats):  # interleaved: each method, then the grid search, per round
        for method in METHODS:
            seconds, models[method.name], caught[method.name] = _timed_fit(method.make, X, y)
            times[method.name].append(seconds)
        seconds, grid, grid_warnings = _timed_fit(grid_search, X, y)
        grid_default.append(seconds)
        with threadpool_limits(limits=1, user_api="blas"):
            grid_one.append(_timed_fit(grid_search, X, y)[0])
    grid_seconds = float(min(np.median(grid_default), np.median(grid_one)))
    base = {"design": design, "seed": seed}
    lasso = grid.best_estimator_
    rows = [
        base
        | {"method": "l1_grid"}
        | _scores(truth, lasso.coef_[0] != 0, y_test, grid.predict_proba(X_test))
        | {
            "seconds": grid_seconds,
            "time_ratio": 1.0,
            "C": float(grid.best_params_["C"]),
            "warnings": grid_warnings,
        }
    ]
    for method in METHODS:
        model = models[method.name]
        seconds = float(np.median(times[method.name]))
        rows.append(
            base
            | {"method": method.name}
            | _scores(truth, method.support(model), y_test, model.predict_proba(X_test))
            | {
                "seconds": seconds,
                "time_ratio": seconds / grid_seconds,
                "C": float(model.C_),
                "warnings": caught[method.name],
            }
        )
    for row in rows:
        print(
            f"{design} seed {seed} {row['method']:>13}: F1 {row['f1']:.3f} "
            f"({row['selected']} selected), log loss {row['log_loss']:.4f}, "
            f"{row['seconds']:.2f} s ({row['time_ratio']:.2f} of the grid search's)",
            flush=True,
        )
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per design and method: the mean F1 and log loss, the median time ratio, and on how
    many data sets each is at least as good as the grid search's."""
    grid = {(r["design"], r["seed"]): r for r in rows if r["method"] == "l1_grid"}
    out = []
    for design in dict.fromkeys(r["design"] for r in rows):
        for name in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["design"] == design and r["method"] == name]
            paired = [(r, grid[(design, r["seed"])]) for r in mine]
            out.append(
                {
                    "design": design,
                    "method": name,
                    "data_sets": len(mine),
                    "f1": float(np.mean([r["f1"] for r in mine])),
                    "precision": float(np.mean([r["precision"] for r in mine])),
                    "recall": float(np.mean([r["recall"] for r in mine])),
                    "selected": float(np.mean([r["selected"] for r in mine])),
                    "log_loss": float(np.mean([r["log_loss"] for r in mine])),
                    "f1_at_least_grid": sum(r["f1"] >= g["f1"] for r, g in paired),
                    "log_loss_at_most_grid": sum(r["log_loss"] <= g["log_loss"] for r, g in paired),
                    "time_ratio": float(np.median([r["time_ratio"] for r in mine])),
                    "seconds": float(np.median([r["seconds"] for r in mine])),
                }
            )
    return out


def markdown(summary: list[dict], info: dict, seeds: int, repeats: int) -> str:
    lines = [
        "# Feature selection by the evidence (ARD) against the L1 grid search",
        "",
        machine_line(info),
        "",
        f"Sparse truth: {N_TRAIN} training rows, {N_FEATURES} features, {N_RELEVANT} "
        f"relevant (±U(0.5, 2)), {N_TEST} held-out rows; {seeds} data sets per design "
        f"(independent features, or AR(1) with ρ = 0.5). Baseline `l1_grid`: "
        f"`GridSearchCV(LogisticRegression(l1_ratio=1, solver='liblinear'))` over 20 Cs in "
        f"[1e-3, 1e2], 5 folds, log loss. F1, precision, recall: the selected features "
        f"against the relevant ones (means over the data sets); log loss: held out (mean); "
        f"time: median over the data sets of each fit's median of {repeats} interleaved "
        f"fits, as a ratio to the grid search's (the faster of its default-BLAS and "
        f'one-thread medians). "≥ grid": on how many data sets F1 is at least, and the '
        f"log loss at most, the grid search's. See `benchmarks/feature_selection.py`.",
        "",
        "| design | method | selected | precision | recall | F1 | F1 ≥ grid | log loss | "
        "log loss ≤ grid | time (s) | time ÷ grid |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['design']} | {s['method']} | {s['selected']:.1f} | {s['precision']:.3f} | "
            f"{s['recall']:.3f} | {s['f1']:.3f} | {s['f1_at_least_grid']}/{s['data_sets']} | "
            f"{s['log_loss']:.4f} | {s['log_loss_at_most_grid']}/{s['data_sets']} | "
            f"{s['seconds']:.2f} | {s['time_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in rows))
    designs = list(dict.fromkeys(r["design"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for panel, (key, label) in enumerate(
        (("f1", "F1 of the true features"), ("log_loss", "held-out log loss"))
    ):
        ax = axes[panel]
        for d, design in enumerate(designs):
            for m, name in enumerate(methods):
                values = [r[key] for r in rows if r["method"] == name and r["design"] == design]
                x = d * (len(methods) + 1) + m
                ax.scatter(np.full(len(values), x), values, s=12, color=f"C{m}", alpha=0.7)
                ax.hlines(np.mean(values), x - 0.35, x + 0.35, color=f"C{m}")
        ax.set_xticks([d * (len(methods) + 1) + (len(methods) - 1) / 2 for d in range(2)])
        ax.set_xticklabels(designs)
        ax.set_ylabel(label)
    ax = axes[2]
    for m, name in enumerate(methods):
        ratios = [r["time_ratio"] for r in rows if r["method"] == name]
        ax.scatter(np.full(len(ratios), m), ratios, s=12, color=f"C{m}", label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels(methods, rotation=30, fontsize=8)
    ax.set_ylabel("fit time ÷ the L1 grid search's")
    axes[0].legend(
        [plt.Line2D([], [], color=f"C{m}", marker="o", ls="") for m in range(len(methods))],
        methods,
        fontsize=7,
    )
    fig.suptitle(
        f"Sparse truth ({N_TRAIN} × {N_FEATURES}, {N_RELEVANT} relevant): ARD by the "
        f"evidence against GridSearchCV(L1 logistic regression)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 seeds, 1 repeat, in cache/")
    args = parser.parse_args()
    seeds, repeats, out = args.seeds, args.repeats, RESULTS
    if args.quick:
        seeds, repeats, out = 2, 1, CACHE
    rows = []
    for design in DESIGNS:
        for seed in range(seeds):
            rows += compare(design, seed, repeats)
    summary = summarize(rows)
    info = machine()
    write_csv(out / "feature_selection.csv", summary)
    write_json(
        out / "feature_selection.json",
        {"machine": info, "seeds": seeds, "repeats": repeats, "summary": summary, "rows": rows},
    )
    (out / "feature_selection.md").write_text(markdown(summary, info, seeds, repeats))
    figure(rows, out / "feature_selection.png")
    print(markdown(summary, info, seeds, repeats))


if __name__ == "__main__":
    main()
