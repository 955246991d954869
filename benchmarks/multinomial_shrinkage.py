"""The multinomial posterior under penalty="l1" against long NUTS runs (iris, wine).

Standardized features, the Laplace(C) prior on each of the K·d coefficients (C = 1: the
mode is ``LogisticRegression(penalty="l1", C=1)``'s multinomial solution), intercepts
N(0, 10⁶). References: ``nuts_softmax_reference.py --cases iris wine --l1 1``
(``results/nuts_reference/softmax_l1_<case>.npz``: the draws' moment Gaussian of θ, 4 ×
25,000 draws). Per estimator (Laplace, EP, VS's default): the share of the coefficients
whose posterior mean and sd are both within 0.1 reference sd (D-054's criterion; the
intercepts are not coefficients), the worst of each, KL(reference ‖ fit) of the whole θ,
and the fit time against ``LogisticRegression(penalty="l1", solver="saga", C=1)`` (medians
of interleaved repeats; LR's the faster of default BLAS threads and one).

Outputs: ``results/multinomial_shrinkage.{json,md,png}`` with the machine line (the figure:
each coefficient's mean error in reference sds against its sd's relative error).
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
from _common import RESULTS, machine, machine_line, speed_ratio, write_json
from _high_dim_cases import gaussian_kl
from nuts_softmax_reference import load_case, reference_path

import vsbayes

NAME = "multinomial_shrinkage"
C = 1.0
ESTIMATORS = {
    "Laplace": vsbayes.LaplaceLogisticRegression,
    "EP": vsbayes.EPLogisticRegression,
    "VS (default)": vsbayes.VSLogisticRegression,
}


def run_case(case: str, repeats: int) -> list[dict]:
    X, y = load_case(case)
    with np.load(reference_path(case, C)) as data:
        ref_mean, ref_cov = data["mean"], data["cov"]
        diagnostics = json.loads(str(data["diagnostics"]))
    k, d = len(np.unique(y)), X.shape[1]
    n_coef = k * d
    ref_sd = np.sqrt(np.diag(ref_cov))[:n_coef]
    rows = []
    for name, cls in ESTIMATORS.items():

        def fit(_, cls=cls):
            return cls(penalty="l1", l1_ratio=1, C=C, random_state=0).fit(X, y)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (saga's ConvergenceWarning)
            timing = speed_ratio(
                fit, X, y, repeats=repeats, penalty="l1", solver="saga", C=C, max_iter=10_000
            )
        est = timing["result"]
        mean = np.concatenate([est.coef_.ravel(), est.intercept_])
        cov = np.asarray(est.sigma_)
        sd = np.sqrt(np.diag(cov))[:n_coef]
        mean_err = np.abs(mean[:n_coef] - ref_mean[:n_coef]) / ref_sd
        sd_err = np.abs(sd - ref_sd) / ref_sd
        rows.append(
            {
                "mean_errors": mean_err.tolist(),
                "sd_errors": ((sd - ref_sd) / ref_sd).tolist(),
                "case": case,
                "estimator": name,
                "within_0.1_sd": float(np.mean((mean_err <= 0.1) & (sd_err <= 0.1))),
                "mean_err_max": float(mean_err.max()),
                "mean_err_median": float(np.median(mean_err)),
                "sd_rel_err_max": float(sd_err.max()),
                "sd_rel_err_median": float(np.median(sd_err)),
                "kl_ref_fit": gaussian_kl(ref_mean, ref_cov, mean, cov),
                "seconds": timing["seconds"],
                "lr_seconds": timing["lr_seconds"],
                "ratio_to_lr": timing["ratio"],
                "strategy": str(getattr(est, "strategy_", [""])[0]),
                "reference_moment_kl_noise": diagnostics["moment_kl_noise"],
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if "errors" not in k}), flush=True)
    return rows


def report(rows: list[dict], info: dict) -> str:
    lines = [
        "# The multinomial posterior under penalty='l1' (C = 1) against NUTS",
        "",
        machine_line(info),
        "",
        "| case | estimator | coefficients within 0.1 sd | worst mean (sd) | worst sd (rel.) "
        "| KL(ref ‖ fit) | × LR (saga) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['estimator']} | {100 * r['within_0.1_sd']:.0f} % "
            f"| {r['mean_err_max']:.3f} | {r['sd_rel_err_max']:.3f} | {r['kl_ref_fit']:.3f} "
            f"| {r['ratio_to_lr']:.1f} |"
        )
    noise = {r["case"]: r["reference_moment_kl_noise"] for r in rows}
    noise_text = ", ".join(f"{case} {value:.4f}" for case, value in noise.items())
    lines += ["", f"KL(ref ‖ fit) includes the references' Monte Carlo bias ({noise_text} nats)."]
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[plot]'): no figure")
        return
    cases = list(dict.fromkeys(r["case"] for r in rows))
    style = {"Laplace": ("^", "C3", {}), "EP": ("s", "C1", {"mfc": "none", "ms": 8})}
    style["VS (default)"] = ("o", "C0", {"ms": 3})
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4.2), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        for r in (r for r in rows if r["case"] == case):
            marker, color, extra = style[r["estimator"]]
            ax.plot(
                r["mean_errors"], r["sd_errors"], marker, color=color, label=r["estimator"], **extra
            )
        ax.axvline(0.1, color="0.5", ls=":", lw=1)
        for level in (-0.1, 0.1):
            ax.axhline(level, color="0.5", ls=":", lw=1)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlim(left=0.0)
        ax.set_xlabel("|mean − NUTS mean| / NUTS sd")
        ax.set_ylabel("sd / NUTS sd − 1")
        ax.set_title(f"{case}, penalty='l1', C = {C:g}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["iris", "wine"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    info = machine()
    rows = [row for case in args.cases for row in run_case(case, args.repeats)]
    write_json(RESULTS / f"{NAME}.json", {"machine": info, "rows": rows})
    text = report(rows, info)
    (RESULTS / f"{NAME}.md").write_text(text)
    figure(rows, RESULTS / f"{NAME}.png")
    print(text)


if __name__ == "__main__":
    main()
