"""The paper's Figure 3: excess KL of VS, IS, BMC and Laplace on Gaussian-mixture targets.

Targets: mixtures of 100 unit normals with centers drawn from N(0, δ²/d I) (paper, eq. 10),
d in {5, 30}, δ in {1.5, 3}. Kernel: the Laplace approximation. For each trial and sample size
N = 2n … 64n, VS (Monte Carlo), IS and BMC run on the *same* draws; VS-QMC uses scrambled
Sobol points; "VS adaptive" uses the library's kernel adaptation (rounds, kernel_scale) at the
same total N. Error: excess KL to the exact moment-matched Gaussian q* (paper, section 2).
Time: estimation only, excluding sampling and target evaluation, one shot per fit (the
careful timing, and the paper's Figure 4, are in vs_timing.py).

Usage: python benchmarks/mixture_accuracy.py [--trials 50] [--quick]
Writes benchmarks/results/mixture_accuracy.{csv,md,json,png}. The full run (50 trials) takes
about 6 minutes on an idle machine.

Quick check (3 trials, the full run's first three seeds; 30 s of CPU, 2 minutes when busy)::

    python benchmarks/mixture_accuracy.py --quick

writes to ``results/cache/mixture_accuracy_quick/`` and compares every fit's excess KL,
``kl_error``, iterations and status with the committed ``results/mixture_accuracy.csv`` and
with the last quick run (``results/cache/mixture_accuracy_quick.json``): unchanged numbers
show "0 differ" ("VS adaptive" too: its draws are seeded, its times are not compared).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import (
    CACHE,
    RESULTS,
    fmt,
    machine,
    machine_line,
    quartiles,
    quick_report,
    read_csv,
    recorded_warnings,
    timed,
    write_csv,
    write_json,
)

from vsbayes import excess_kl, laplace, n_family_params, variational_sampling
from vsbayes.engine.bayesian_monte_carlo import fit_bmc_pool
from vsbayes.engine.importance_sampling import fit_is_pool
from vsbayes.engine.sample_pool import SamplePool, evaluate_log_target
from vsbayes.engine.variational_sampling import fit_vs_pool
from vsbayes.exceptions import EstimationError
from vsbayes.models import GaussianMixtureTarget
from vsbayes.sampling import MonteCarlo, ScrambledSobol, draw_from_kernel

METHODS = ["Laplace", "VS", "VS-QMC", "VS adaptive", "IS", "BMC"]


def make_pool(target, kernel, n, rule, rng):
    draws = draw_from_kernel(kernel, n, rule, rng)
    pool = SamplePool()
    pool.add(kernel, draws, evaluate_log_target(target, draws.x))
    return pool


def one_shot(fn):
    """(fit or None if it failed, seconds), under the benchmarks' warning policy."""
    t0 = time.perf_counter()
    try:
        seconds, out, _ = timed(fn)
    except EstimationError:
        return None, time.perf_counter() - t0
    return out, seconds


def run_trial(d, delta, trial, multiples, bmc_max_n, adapt):
    target = GaussianMixtureTarget.paper(
        d, delta, random_state=np.random.default_rng([d, int(10 * delta), trial, 999])
    )
    truth = target.moment_matched()
    kernel = laplace(target, target.means.mean(axis=0), target.gradient, target.hessian)
    n_params = n_family_params(d)
    rows = []

    def record(method, mult, fit, seconds, extra=None):
        err = excess_kl(truth, fit) if fit is not None else np.inf
        row = {
            "d": d,
            "delta": delta,
            "trial": trial,
            "multiple": mult,
            "N": mult * n_params,
            "method": method,
            "excess_kl": err,
            "seconds": seconds,
            "n_iter": getattr(fit, "n_iter", ""),
            "kl_error": getattr(fit, "kl_error", ""),
            "status": "ok" if fit is not None else "failed",
        }
        row.update(extra or {})
        rows.append(row)

    record("Laplace", 0, kernel, 0.0)
    for mult in multiples:
        n = mult * n_params
        rng = np.random.default_rng([d, int(10 * delta), trial, mult])
        pool = make_pool(target, kernel, n, MonteCarlo(), rng)
        fit, sec = one_shot(
            lambda: fit_vs_pool(pool, None, family="gaussian", tol=1e-2, max_iter=100)
        )
        record("VS", mult, fit, sec)
        fit, sec = one_shot(lambda: fit_is_pool(pool))
        record("IS", mult, fit, sec)
        if n <= bmc_max_n:
            fit, sec = one_shot(lambda: fit_bmc_pool(pool, 1.0, 1e-8))
            record("BMC", mult, fit, sec)
        qpool = make_pool(target, kernel, n, ScrambledSobol(), rng)
        fit, sec = one_shot(
            lambda: fit_vs_pool(qpool, None, family="gaussian", tol=1e-2, max_iter=100)
        )
        record("VS-QMC", mult, fit, sec)
        fit, sec = one_shot(
            lambda: variational_sampling(
                target,
                kernel,
                n,
                rounds=adapt["rounds"],
                kernel_scale=adapt["kernel_scale"],
                random_state=rng,
            )
        )
        record("VS adaptive", mult, fit, sec)
    return rows


def summarize(rows, dims, deltas, multiples):
    table = []
    for d in dims:
        for delta in deltas:
            sub = [r for r in rows if r["d"] == d and r["delta"] == delta]
            lap = quartiles([r["excess_kl"] for r in sub if r["method"] == "Laplace"])
            for mult in multiples:
                entry = {"d": d, "delta": delta, "multiple": mult, "Laplace": lap}
                for m in METHODS[1:]:
                    vals = [
                        r["excess_kl"] for r in sub if r["method"] == m and r["multiple"] == mult
                    ]
                    secs = [r["seconds"] for r in sub if r["method"] == m and r["multiple"] == mult]
                    if vals:
                        entry[m] = quartiles(vals)
                        entry[m + " time"] = float(np.median(secs))
                        entry[m + " failures"] = int(np.sum(~np.isfinite(vals)))
                table.append(entry)
    return table


def markdown(table, info, args):
    lines = [
        "# Gaussian-mixture targets (paper, Figure 3)",
        "",
        f"Median excess KL divergence to the exact q* over {args.trials} trials, with the "
        "interquartile range in brackets; kernel = Laplace approximation; VS, IS and BMC on the "
        "same draws. `VS adaptive` = "
        f"rounds={args.rounds}, kernel_scale={args.kernel_scale} at the same total N. "
        "Failures (no valid Gaussian) count as ∞. Time = median estimation time in ms "
        "(excluding sampling and target evaluation; VS adaptive includes its second round's "
        "sampling and evaluation).",
        "",
        machine_line(info),
        "",
    ]
    for d in sorted({e["d"] for e in table}):
        for delta in sorted({e["delta"] for e in table}):
            rows = [e for e in table if e["d"] == d and e["delta"] == delta]
            lap = rows[0]["Laplace"]
            lines += [
                f"## d = {d}, δ = {delta} (Laplace: {fmt(lap[1])})",
                "",
                "| N/n | " + " | ".join(METHODS[1:]) + " | VS ms | IS ms |",
                "|---|" + "---|" * (len(METHODS) + 1),
            ]
            for e in rows:
                cells = []
                for m in METHODS[1:]:
                    if m in e:
                        q1, q2, q3 = e[m]
                        fail = f" ({e[m + ' failures']} failed)" if e[m + " failures"] else ""
                        cells.append(f"{fmt(q2)} [{fmt(q1)}, {fmt(q3)}]{fail}")
                    else:
                        cells.append("")
                vs_ms = f"{1e3 * e['VS time']:.1f}" if "VS time" in e else ""
                is_ms = f"{1e3 * e['IS time']:.2f}" if "IS time" in e else ""
                lines.append(
                    f"| {e['multiple']} | " + " | ".join(cells) + f" | {vs_ms} | {is_ms} |"
                )
            lines.append("")
    return "\n".join(lines)


def plot(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({e["d"] for e in table})
    deltas = sorted({e["delta"] for e in table})
    fig, axes = plt.subplots(
        len(dims), len(deltas), figsize=(5.5 * len(deltas), 4.2 * len(dims)), squeeze=False
    )
    colors = {"VS": "C0", "VS-QMC": "C9", "VS adaptive": "C2", "IS": "C3", "BMC": "C1"}
    for i, d in enumerate(dims):
        for j, delta in enumerate(deltas):
            ax = axes[i, j]
            sub = [e for e in table if e["d"] == d and e["delta"] == delta]
            for k, m in enumerate(colors):
                pts = [(e["multiple"], *e[m]) for e in sub if m in e]
                if not pts:
                    continue
                x, q1, q2, q3 = map(np.array, zip(*pts, strict=True))
                x = x * (1 + 0.04 * (k - 2))
                ok = np.isfinite(q2)
                ax.errorbar(
                    x[ok],
                    q2[ok],
                    yerr=[q2[ok] - q1[ok], np.minimum(q3[ok], 1e3) - q2[ok]],
                    fmt="o-",
                    ms=4,
                    capsize=2,
                    color=colors[m],
                    label=m,
                )
            ax.axhline(sub[0]["Laplace"][1], color="k", ls="--", lw=1, label="Laplace")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("N / n")
            ax.set_ylabel("excess KL")
            ax.set_title(f"d = {d}, δ = {delta}")
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--dims", type=int, nargs="+", default=[5, 30])
    parser.add_argument("--deltas", type=float, nargs="+", default=[1.5, 3.0])
    parser.add_argument("--multiples", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--bmc-max-n", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kernel-scale", type=float, default=1.5)
    parser.add_argument(
        "--quick", action="store_true", help="3 trials into results/cache/, compared"
    )
    parser.add_argument("--name", default="mixture_accuracy")
    args = parser.parse_args()
    out = RESULTS
    if args.quick:
        args.trials = 3
        out = CACHE / f"{args.name}_quick"
    adapt = {"rounds": args.rounds, "kernel_scale": args.kernel_scale}
    rows = []
    t0 = time.perf_counter()
    with recorded_warnings():
        for d in args.dims:
            for delta in args.deltas:
                for trial in range(args.trials):
                    rows += run_trial(d, delta, trial, args.multiples, args.bmc_max_n, adapt)
                print(f"d={d} δ={delta} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    info = machine()
    table = summarize(rows, args.dims, args.deltas, args.multiples)
    write_csv(out / f"{args.name}.csv", rows)
    write_json(out / f"{args.name}.json", {"machine": info, "args": vars(args), "summary": table})
    (out / f"{args.name}.md").write_text(markdown(table, info, args) + "\n")
    plot(table, out / f"{args.name}.png")
    print((out / f"{args.name}.md").read_text())
    if args.quick:
        quick_report(
            args.name,
            rows,
            keys=("d", "delta", "trial", "multiple", "method"),
            values=("excess_kl", "kl_error", "n_iter", "status"),
            committed=read_csv(RESULTS / f"{args.name}.csv"),
        )


if __name__ == "__main__":
    main()
