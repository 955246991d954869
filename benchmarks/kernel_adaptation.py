"""Choosing the kernel-adaptation defaults of variational_sampling (rounds, kernel_scale).

Same mixture targets as mixture_accuracy.py. At equal total N, compares the paper's single
round from the Laplace kernel with: a single round from an inflated Laplace kernel, and 2–3
rounds where each round draws from the previous fit with its covariance scaled, pooling all
points against the mixture of round kernels.

Usage: python benchmarks/kernel_adaptation.py [--trials 30]
Writes benchmarks/results/kernel_adaptation.{csv,md,json} and kernel_adaptation.png.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import (
    RESULTS,
    fmt,
    machine,
    machine_line,
    quartiles,
    recorded_warnings,
    write_csv,
    write_json,
)

from vsbayes import excess_kl, laplace, n_family_params, variational_sampling
from vsbayes.exceptions import EstimationError
from vsbayes.models import GaussianMixtureTarget

# (label, rounds, kernel_scale, scale of the first (Laplace) kernel)
CONFIGS = [
    ("1 round", 1, 1.0, 1.0),
    ("1 round, Laplace×1.5", 1, 1.0, 1.5),
    ("2 rounds, ×1", 2, 1.0, 1.0),
    ("2 rounds, ×1.5", 2, 1.5, 1.0),
    ("2 rounds, ×2", 2, 2.0, 1.0),
    ("2 rounds, ×1.5, Laplace×1.5", 2, 1.5, 1.5),
    ("3 rounds, ×1.5", 3, 1.5, 1.0),
]


def run(args) -> list[dict]:
    """Every (d, δ, trial, multiple, config) fit: one row each."""
    rows = []
    t0 = time.perf_counter()
    for d in args.dims:
        n_params = n_family_params(d)
        for delta in args.deltas:
            for trial in range(args.trials):
                target = GaussianMixtureTarget.paper(
                    d, delta, random_state=np.random.default_rng([d, int(10 * delta), trial, 999])
                )
                truth = target.moment_matched()
                lap = laplace(target, target.means.mean(axis=0), target.gradient, target.hessian)
                laplace_err = excess_kl(truth, lap)
                for mult in args.multiples:
                    for label, rounds, scale, first in CONFIGS:
                        rng = np.random.default_rng([d, int(10 * delta), trial, mult, 5])
                        kernel = lap if first == 1.0 else lap.scale_cov(first)
                        t1 = time.perf_counter()
                        try:
                            fit = variational_sampling(
                                target,
                                kernel,
                                mult * n_params,
                                rounds=rounds,
                                kernel_scale=scale,
                                random_state=rng,
                            )
                            err = excess_kl(truth, fit)
                        except EstimationError:
                            err = np.inf
                        rows.append(
                            {
                                "d": d,
                                "delta": delta,
                                "trial": trial,
                                "multiple": mult,
                                "config": label,
                                "excess_kl": err,
                                "laplace_kl": laplace_err,
                                "seconds": time.perf_counter() - t1,
                            }
                        )
            print(f"d={d} δ={delta} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--dims", type=int, nargs="+", default=[5, 30])
    parser.add_argument("--deltas", type=float, nargs="+", default=[1.5, 3.0])
    parser.add_argument("--multiples", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args()
    with recorded_warnings():
        rows = run(args)
    info = machine()
    summary = []
    for d in args.dims:
        for delta in args.deltas:
            for mult in args.multiples:
                sub = [r for r in rows if (r["d"], r["delta"], r["multiple"]) == (d, delta, mult)]
                base = {r["trial"]: r["excess_kl"] for r in sub if r["config"] == CONFIGS[0][0]}
                for label, *_ in CONFIGS:
                    errs = [r["excess_kl"] for r in sub if r["config"] == label]
                    ratios = [
                        r["excess_kl"] / base[r["trial"]]
                        for r in sub
                        if r["config"] == label and np.isfinite(base[r["trial"]])
                    ]
                    summary.append(
                        {
                            "d": d,
                            "delta": delta,
                            "multiple": mult,
                            "config": label,
                            "excess_kl": quartiles(errs),
                            "median_ratio_to_1_round": float(np.median(ratios)),
                            "failures": int(np.sum(~np.isfinite(errs))),
                            "seconds": float(
                                np.median([r["seconds"] for r in sub if r["config"] == label])
                            ),
                        }
                    )
    write_csv(RESULTS / "kernel_adaptation.csv", rows)
    write_json(
        RESULTS / "kernel_adaptation.json",
        {"machine": info, "args": vars(args), "summary": summary},
    )
    lines = [
        "# Kernel adaptation at equal total N",
        "",
        f"Mixture targets, {args.trials} trials. Median excess KL [IQR]; `ratio` = median over "
        "trials of the error divided by the paper's single-round error on the same target "
        "(paired). Failures = no valid Gaussian (counted as ∞). Time includes sampling and "
        "target evaluation of every round.",
        "",
        machine_line(info),
        "",
    ]
    for d in args.dims:
        for delta in args.deltas:
            for mult in args.multiples:
                lines += [
                    f"## d = {d}, δ = {delta}, N = {mult}n",
                    "",
                    "| configuration | excess KL | ratio | failures | ms |",
                    "|---|---|---|---|---|",
                ]
                for e in summary:
                    if (e["d"], e["delta"], e["multiple"]) == (d, delta, mult):
                        q1, q2, q3 = e["excess_kl"]
                        lines.append(
                            f"| {e['config']} | {fmt(q2)} [{fmt(q1)}, {fmt(q3)}] | "
                            f"{e['median_ratio_to_1_round']:.3f} | {e['failures']} | "
                            f"{1e3 * e['seconds']:.0f} |"
                        )
                lines.append("")
    geo = {}
    for label, *_ in CONFIGS:
        r = [e["median_ratio_to_1_round"] for e in summary if e["config"] == label]
        geo[label] = float(np.exp(np.mean(np.log(r))))
    lines += [
        "## Geometric mean of the median ratios over all settings",
        "",
        "| configuration | ratio |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in geo.items()]
    (RESULTS / "kernel_adaptation.md").write_text("\n".join(lines) + "\n")
    plot(summary, args, RESULTS / "kernel_adaptation.png")
    print("\n".join(lines))


def plot(summary, args, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [(d, delta, m) for d in args.dims for delta in args.deltas for m in args.multiples]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(CONFIGS)
    for k, (label, *_) in enumerate(CONFIGS):
        vals = [
            next(
                e["median_ratio_to_1_round"]
                for e in summary
                if (e["d"], e["delta"], e["multiple"], e["config"]) == (*s, label)
            )
            for s in settings
        ]
        ax.bar(np.arange(len(settings)) + k * width, vals, width, label=label)
    ax.set_xticks(np.arange(len(settings)) + 0.4 - width / 2)
    ax.set_xticklabels([f"d={d}\nδ={dl}\n{m}n" for d, dl, m in settings], fontsize=8)
    ax.set_yscale("log")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_ylabel("excess KL / single round (median)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
