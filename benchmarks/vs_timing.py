"""Speed of the VS fit: d = 5, 30, 60, 100 at N = 32n, next to IS on the same draws.

The fit is timed excluding sampling and target evaluation (the target is evaluated once per
pool). Each pool is fitted ``--repeats`` times and the median kept, to damp machine noise;
the table reports the median over pools. Baselines run in the same process:

* IS on the same draws (self-normalized moments);
* at d <= 30, a re-implementation of the 2013 algorithm: the explicit N×n feature matrix,
  Newton's method with the full n×n Hessian and a backtracking line search, stopped when
  the Newton decrement is below 1e-10 per unit mass (the accuracy of our default stop
  is looser: see ``tol``); this is what the paper's code does in small dimension.

Also: fit time against N at d = 30 (N = 2n … 64n), to show linear scaling.

Usage: python benchmarks/vs_timing.py [--pools 5] [--repeats 5]
Writes benchmarks/results/vs_timing.{csv,md,json} and vs_timing.png.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import RESULTS, machine, machine_line, timed, write_csv, write_json

from vsbayes import laplace, n_family_params
from vsbayes.engine.bayesian_monte_carlo import fit_bmc_pool
from vsbayes.engine.importance_sampling import fit_is_pool
from vsbayes.engine.sample_pool import SamplePool, evaluate_log_target
from vsbayes.engine.variational_sampling import fit_vs_pool
from vsbayes.exceptions import EstimationError
from vsbayes.models import GaussianMixtureTarget
from vsbayes.sampling import MonteCarlo, draw_from_kernel


def paper_newton(pool, tol=1e-10, max_iter=200):
    """The 2013 method: explicit features, full Hessian Newton (baseline only)."""
    z = pool.coordinates(_frame(pool))
    n_points, d = z.shape
    i, j = np.triu_indices(d)
    phi = np.hstack([np.ones((n_points, 1)), z, z[:, i] * z[:, j]])
    log_r = pool.log_p - pool.log_window()
    log_r -= log_r.max()
    pbar = np.exp(log_r) / n_points
    theta = np.zeros(phi.shape[1])
    theta[0] = np.log(pbar.sum() * n_points) - np.log(n_points)
    for it in range(max_iter):  # noqa: B007 (returned)
        eta = phi @ theta
        qbar = np.exp(eta) / n_points
        grad = phi.T @ (qbar - pbar)
        hess = (phi.T * qbar) @ phi
        step = np.linalg.solve(hess, -grad)
        dec = -grad @ step
        if dec / (2 * pbar.sum()) < tol:
            break
        t, f0 = 1.0, qbar.sum() - pbar @ eta
        along = phi @ step
        while t > 1e-10:
            e = eta + t * along
            if e.max() < 700 and np.exp(e).sum() / n_points - pbar @ e <= f0 - 0.25 * t * dec:
                break
            t *= 0.5
        theta += t * step
    return it


def _frame(pool):
    from vsbayes.engine.sample_pool import Frame

    return Frame(pool.kernels[-1])


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            seconds, out, _ = timed(fn)
        except EstimationError:
            seconds, out = time.perf_counter() - t0, None
        times.append(seconds)
    return float(np.median(times)), out


def build_pool(d, delta, seed, mult):
    target = GaussianMixtureTarget.paper(d, delta, random_state=np.random.default_rng([d, seed, 7]))
    kernel = laplace(target, target.means.mean(axis=0), target.gradient, target.hessian)
    n = mult * n_family_params(d)
    draws = draw_from_kernel(kernel, n, MonteCarlo(), np.random.default_rng([d, seed, mult]))
    t0 = time.perf_counter()
    log_p = evaluate_log_target(target, draws.x)
    target_seconds = time.perf_counter() - t0
    pool = SamplePool()
    pool.add(kernel, draws, log_p)
    return pool, target_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[5, 30, 60, 100])
    parser.add_argument("--deltas", type=float, nargs="+", default=[1.5, 3.0])
    parser.add_argument("--pools", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scaling-dim", type=int, default=30)
    parser.add_argument("--multiples", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--bmc-max-n", type=int, default=4000)
    args = parser.parse_args()
    rows = []

    def measure(experiment, d, delta, seed, mult, *, paper=False, bmc=False):
        """Time VS, IS (and optionally the 2013 Newton, BMC) on one pool: one CSV row."""
        pool, t_target = build_pool(d, delta, seed, mult)
        t_vs, fit = median_time(
            lambda: fit_vs_pool(pool, None, family="gaussian", tol=1e-2, max_iter=100),
            args.repeats,
        )
        row = {
            "experiment": experiment,
            "d": d,
            "delta": delta,
            "pool": seed,
            "N": pool.n_samples,
            "vs_s": t_vs,
            "is_s": median_time(lambda: fit_is_pool(pool), args.repeats)[0],
            "target_s": t_target,
            "vs_iter": getattr(fit, "n_iter", -1),
            "bmc_s": "",
            "paper_newton_s": "",
            "paper_newton_iter": "",
        }
        if paper:
            t_p, it = median_time(lambda: paper_newton(pool), max(1, args.repeats // 2))
            row.update(paper_newton_s=t_p, paper_newton_iter=it)
        if bmc and pool.n_samples <= args.bmc_max_n:
            row["bmc_s"] = median_time(lambda: fit_bmc_pool(pool, 1.0, 1e-8), 1)[0]
        rows.append(row)

    for d in args.dims:
        for delta in args.deltas:
            for seed in range(args.pools):
                measure("dims", d, delta, seed, 32, paper=d <= 30)
            print(f"d={d} δ={delta} done", flush=True)
    for delta in args.deltas:
        for mult in args.multiples:
            for seed in range(args.pools):
                measure("scaling", args.scaling_dim, delta, seed, mult, bmc=True)
        print(f"scaling δ={delta} done", flush=True)

    info = machine()
    write_csv(RESULTS / "vs_timing.csv", rows)
    summary = summarize(rows)
    write_json(
        RESULTS / "vs_timing.json", {"machine": info, "args": vars(args), "summary": summary}
    )
    md = markdown(summary, info, args)
    (RESULTS / "vs_timing.md").write_text(md + "\n")
    plot(rows, RESULTS / "vs_timing.png")
    print(md)


def summarize(rows):
    out = []
    keys = sorted({(r["experiment"], r["d"], r["delta"], r["N"]) for r in rows})
    for exp, d, delta, n in keys:
        sub = [
            r for r in rows if (r["experiment"], r["d"], r["delta"], r["N"]) == (exp, d, delta, n)
        ]
        med = {
            k: float(np.median([r[k] for r in sub]))
            for k in ("vs_s", "is_s", "target_s", "vs_iter")
        }
        entry = {
            "experiment": exp,
            "d": d,
            "delta": delta,
            "N": n,
            **med,
            "vs_over_is": float(np.median([r["vs_s"] / r["is_s"] for r in sub])),
            "vs_plus_target_over_is_plus_target": float(
                np.median([(r["vs_s"] + r["target_s"]) / (r["is_s"] + r["target_s"]) for r in sub])
            ),
        }
        bmc = [r["bmc_s"] for r in sub if r["bmc_s"] != ""]
        if bmc:
            entry["bmc_s"] = float(np.median(bmc))
        paper = [r["paper_newton_s"] for r in sub if r["paper_newton_s"] != ""]
        if paper:
            entry["paper_newton_s"] = float(np.median(paper))
            entry["paper_over_vs"] = float(
                np.median(
                    [r["paper_newton_s"] / r["vs_s"] for r in sub if r["paper_newton_s"] != ""]
                )
            )
        out.append(entry)
    return out


def markdown(summary, info, args):
    lines = [
        "# VS fit time",
        "",
        f"Mixture targets (paper, section 4.1), Laplace kernel, N = 32n. Median over "
        f"{args.pools} pools of the median of {args.repeats} repeated fits; estimation only "
        "(sampling and target evaluation excluded). `VS/IS` is the ratio of fit times on the "
        "same draws; `(VS+t)/(IS+t)` includes the target evaluation t of this mixture "
        "target (100 components). `2013/VS`: a re-implementation of the paper's Newton "
        "method with the explicit N×n feature matrix, in the same process.",
        "",
        machine_line(info),
        "",
        "| d | δ | N | VS ms | iters | IS ms | VS/IS | target ms | (VS+t)/(IS+t) "
        "| 2013 Newton ms | 2013/VS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        if e["experiment"] != "dims":
            continue
        paper = (
            f"{1e3 * e['paper_newton_s']:.1f} | {e['paper_over_vs']:.2g}×"
            if "paper_newton_s" in e
            else " | "
        )
        lines.append(
            f"| {e['d']} | {e['delta']} | {e['N']} | {1e3 * e['vs_s']:.1f} | "
            f"{e['vs_iter']:.0f} | {1e3 * e['is_s']:.2f} | {e['vs_over_is']:.1f} | "
            f"{1e3 * e['target_s']:.1f} | {e['vs_plus_target_over_is_plus_target']:.2f} | {paper} |"
        )
    lines += [
        "",
        f"## Scaling with N (d = {args.scaling_dim})",
        "",
        "| δ | N | VS ms | iters | IS ms | BMC ms | VS ms per 1000 points |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        if e["experiment"] == "scaling":
            lines.append(
                f"| {e['delta']} | {e['N']} | {1e3 * e['vs_s']:.1f} | {e['vs_iter']:.0f} | "
                f"{1e3 * e['is_s']:.2f} | "
                + (f"{1e3 * e['bmc_s']:.0f}" if "bmc_s" in e else "")
                + f" | {1e6 * e['vs_s'] / e['N']:.2f} |"
            )
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.3))
    for delta, c in zip(sorted({r["delta"] for r in rows}), ["C0", "C2", "C4"], strict=False):
        sub = [r for r in rows if r["experiment"] == "scaling" and r["delta"] == delta]
        for key, style, name in (
            ("vs_s", "o-", "VS"),
            ("is_s", "s--", "IS"),
            ("bmc_s", "^:", "BMC"),
        ):
            timed = [r for r in sub if r[key] != ""]
            ns = sorted({r["N"] for r in timed})
            medians = [np.median([r[key] for r in timed if r["N"] == n]) for n in ns]
            ax.plot(
                ns,
                medians,
                style,
                color=c,
                alpha=1.0 if name == "VS" else 0.6,
                label=f"{name}, δ={delta}",
            )
    ns = np.array(sorted({r["N"] for r in rows if r["experiment"] == "scaling"}), dtype=float)
    if len(ns):
        ax.plot(ns, 25e-3 * ns / 15872, "k:", label="linear through 25 ms at 32n")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N")
    ax.set_ylabel("fit time [s]")
    ax.set_title("Estimation time vs N, d = 30 (paper, Figure 4)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
