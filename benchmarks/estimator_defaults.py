"""Accuracy per second of the VS estimators' sampling options: the evidence for the defaults.

For each dataset and link, a reference posterior is fitted once with far more points
(3 rounds, ``--reference-factor`` · n evaluations). Then ``VSLogisticRegression`` /
``VSProbitRegression`` are fitted with N = 4n … 32n evaluations in 1, 2 or 3 rounds of
kernel adaptation (``kernel_scale`` 1.5 and 2), ``--trials`` seeds each — all by the
global VS fit (``strategy="global"``), the route these options set: the default
``strategy="auto"`` keeps EP's fit with VS sites on both problems, where they do not
apply. Reported: the
median excess KL divergence of the posterior to the reference (the paper's error measure),
the median wall time of ``fit`` (its kernel + sampling + VS fit), and their product: VS
errors fall like 1/N and times grow at most like N, so the product measures accuracy per
second (lower is better). The reference's own error is its ``kl_error``, reported too.

Datasets: scikit-learn's breast cancer (569 × 30, standardized) and a synthetic problem
(M = 2000, d = 10, latent sd 3).

Usage: python benchmarks/estimator_defaults.py [--trials 10] [--reference-factor 300]
Writes benchmarks/results/estimator_defaults.{csv,json,md,png}.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import RESULTS, fmt, machine, machine_line, quartiles, timed, write_csv, write_json
from scipy.special import expit
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import StandardScaler

import vsbayes

ESTIMATORS = {"logistic": vsbayes.VSLogisticRegression, "probit": vsbayes.VSProbitRegression}
LAPLACE = {"logistic": vsbayes.LaplaceLogisticRegression, "probit": vsbayes.LaplaceProbitRegression}
FACTORS = [4, 8, 16, 32]
CONFIGS = [(1, 1.5), (2, 1.5), (3, 1.5), (2, 2.0)]  # (rounds, kernel_scale)


def datasets():
    X, y = load_breast_cancer(return_X_y=True)
    yield "breast cancer", StandardScaler().fit_transform(X), y
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 10))
    w = rng.standard_normal(10)
    w *= 3.0 / np.linalg.norm(w)
    yield "synthetic 2000×10", X, (rng.random(2000) < expit(X @ w)).astype(int)


def fit(cls, X, y, **params):
    estimator = cls(**params)
    seconds, _, _ = timed(lambda: estimator.fit(X, y))
    return estimator, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--reference-factor", type=int, default=300)
    args = parser.parse_args()
    rows, references = [], []
    for name, X, y in datasets():
        for link, cls in ESTIMATORS.items():
            n = vsbayes.n_family_params(X.shape[1] + 1)
            ref, ref_time = fit(
                cls,
                X,
                y,
                strategy="global",
                n_samples=args.reference_factor * n,
                rounds=3,
                random_state=12345,
            )
            reference = ref.posteriors_[0]
            lap, lap_time = fit(LAPLACE[link], X, y)
            references.append(
                {
                    "dataset": name,
                    "link": link,
                    "n_params": n,
                    "reference_kl_error": reference.kl_error,
                    "reference_seconds": ref_time,
                    "laplace_excess_kl": vsbayes.excess_kl(reference, lap.posteriors_[0]),
                    "laplace_seconds": lap_time,
                }
            )
            for rounds, scale in CONFIGS:
                for factor in FACTORS:
                    if factor < 2 * rounds:
                        continue
                    errors, seconds = [], []
                    for seed in range(args.trials):
                        est, sec = fit(
                            cls,
                            X,
                            y,
                            strategy="global",
                            n_samples=factor * n,
                            rounds=rounds,
                            kernel_scale=scale,
                            random_state=seed,
                        )
                        errors.append(vsbayes.excess_kl(reference, est.posteriors_[0]))
                        seconds.append(sec)
                    q1, med, q3 = quartiles(errors)
                    t = float(np.median(seconds))
                    rows.append(
                        {
                            "dataset": name,
                            "link": link,
                            "rounds": rounds,
                            "kernel_scale": scale,
                            "factor": factor,
                            "n_samples": factor * n,
                            "excess_kl_q1": q1,
                            "excess_kl_median": med,
                            "excess_kl_q3": q3,
                            "seconds_median": t,
                            "error_seconds": med * t,
                        }
                    )
                    print(rows[-1], flush=True)
    info = machine()
    write_csv(RESULTS / "estimator_defaults.csv", rows)
    write_json(
        RESULTS / "estimator_defaults.json",
        {"machine": info, "trials": args.trials, "references": references, "rows": rows},
    )
    report = markdown(rows, references, info, args)
    (RESULTS / "estimator_defaults.md").write_text(report)
    plot(rows, references)
    print(report)


def markdown(rows, references, info, args) -> str:
    lines = [
        "# Sampling options of the VS estimators: accuracy per second",
        "",
        f"Median over {args.trials} seeds of the excess KL divergence to a reference posterior "
        f"({args.reference_factor} n evaluations, 3 rounds) and of the wall time of `fit`; "
        "their product (error · s) is lower for more accuracy per second.",
        "",
        machine_line(info),
        "",
        "| dataset | link | n | reference kl_error | Laplace excess KL | Laplace s |",
        "|---|---|---|---|---|---|",
    ]
    for r in references:
        lines.append(
            f"| {r['dataset']} | {r['link']} | {r['n_params']} | {fmt(r['reference_kl_error'])} "
            f"| {fmt(r['laplace_excess_kl'])} | {fmt(r['laplace_seconds'])} |"
        )
    lines += [
        "",
        "| dataset | link | rounds | kernel_scale | N / n | excess KL median [IQR] | fit s "
        "| error · s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['link']} | {r['rounds']} | {r['kernel_scale']} "
            f"| {r['factor']} | {fmt(r['excess_kl_median'])} [{fmt(r['excess_kl_q1'])}, "
            f"{fmt(r['excess_kl_q3'])}] | {fmt(r['seconds_median'])} "
            f"| {fmt(r['error_seconds'])} |"
        )
    lines += ["", "Best error · s per dataset and link:", ""]
    for ref in references:
        cells = [r for r in rows if r["dataset"] == ref["dataset"] and r["link"] == ref["link"]]
        best = min(cells, key=lambda r: r["error_seconds"])
        default = next(
            r for r in cells if (r["rounds"], r["kernel_scale"], r["factor"]) == (2, 1.5, 8)
        )
        lines.append(
            f"- {ref['dataset']}, {ref['link']}: best rounds={best['rounds']}, "
            f"kernel_scale={best['kernel_scale']}, N={best['factor']}n "
            f"({fmt(best['error_seconds'])}); the defaults (2 rounds, 1.5, 8n): "
            f"{fmt(default['error_seconds'])}, excess KL {fmt(default['excess_kl_median'])} "
            f"vs Laplace {fmt(ref['laplace_excess_kl'])}."
        )
    return "\n".join(lines) + "\n"


def plot(rows, references):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(references), figsize=(4.2 * len(references), 3.8))
    for ax, ref in zip(np.atleast_1d(axes), references, strict=True):
        for rounds, scale in CONFIGS:
            cells = [
                r
                for r in rows
                if (r["dataset"], r["link"], r["rounds"], r["kernel_scale"])
                == (ref["dataset"], ref["link"], rounds, scale)
            ]
            ax.plot(
                [r["seconds_median"] for r in cells],
                [r["excess_kl_median"] for r in cells],
                "o-",
                label=f"{rounds} round(s), ×{scale}",
            )
        ax.axhline(ref["laplace_excess_kl"], color="k", ls="--", label="Laplace")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="fit time (s)",
            ylabel="excess KL",
            title=f"{ref['dataset']}, {ref['link']}",
        )
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "estimator_defaults.png", dpi=120)


if __name__ == "__main__":
    main()
