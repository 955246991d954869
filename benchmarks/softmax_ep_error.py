"""What is left of the multinomial EP's error against NUTS, and what corrects it at what cost.

On the references of ``nuts_softmax_reference.py`` (iris, wine, classes20), for the
multinomial EP (``EPLogisticRegression``, the default VS's fit where it takes the route
"sites"), in KL(reference ‖ ·) of the moment-matched Gaussians (docs/decisions.md D-089):

1. The reference's own Monte Carlo error in that KL (``moment_kl_noise`` in the reference
   file, a batch-means bootstrap; the formula p(p + 3)/(4N) beside it) and EP's error split
   into its mean part KL(N(m_ref, S) ‖ N(m, S)) and its covariance part.
2. Importance sampling from EP's Gaussian (mirrored normal draws, their first two moments
   matched exactly, Pareto-smoothed weights): the weighted draws' moments, at several
   numbers of draws: k̂, the effective sample size, the KL and the time.
3. The same weights projected on EP's covariance scale: the Gaussian N(m, s S) closest to
   the weighted draws in KL(draws' Gaussian ‖ ·), s = Σ w |z|² / p (z the draws in EP's
   whitened coordinates), whose Monte Carlo error in KL is about 1 / (2 ESS) nats whatever
   p: a one-parameter correction of EP's covariance.

Usage: python benchmarks/softmax_ep_error.py [--draws 2000 8000 32000] [--out DIR]
Writes DIR/softmax_ep_error.{json,md}; DIR defaults to benchmarks/results (about a minute).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _common import RESULTS, machine, machine_line, write_json
from _high_dim_cases import gaussian_kl
from nuts_softmax_reference import load_case, load_reference, model_of

from vsbayes import EPLogisticRegression, LaplaceLogisticRegression
from vsbayes.models.psis import pareto_smoothed_log_weights

CASES = ("iris", "wine", "classes20")
BLOCK = 4000  # draws per log-density pass (bounded temporaries)


def _gaussian(est) -> tuple[np.ndarray, np.ndarray]:
    return np.r_[est.coef_.ravel(), est.intercept_], est.sigma_


def importance_moments(model, mean, cov, n_draws: int, seed: int = 0) -> dict:
    """Self-normalized IS from N(mean, cov): mirrored draws with exactly matched first and
    second moments, Pareto-smoothed weights. Returns the weighted moments, the scale
    projection ``s``, k̂, ESS and the time."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    dim = len(mean)
    lower = np.linalg.cholesky(cov)
    z = rng.standard_normal((n_draws // 2, dim))
    z = np.vstack([z, -z])
    # Whiten the draws by their own second moment: exactly zero mean and identity
    # covariance, so that the weights alone move the moments from EP's.
    z = z @ np.linalg.inv(np.linalg.cholesky(z.T @ z / len(z))).T
    log_w = np.concatenate(
        [model.log_density(mean + z[i : i + BLOCK] @ lower.T) for i in range(0, len(z), BLOCK)]
    )
    log_w += 0.5 * np.einsum("ij,ij->i", z, z)
    smoothed, pareto_k = pareto_smoothed_log_weights(log_w[None])
    w = np.exp(smoothed[0])
    w /= w.sum()
    shift = w @ z
    second = (z * w[:, None]).T @ z
    scale = float(np.trace(second)) / dim
    return {
        "mean": mean + lower @ shift,
        "cov": lower @ (second - np.outer(shift, shift)) @ lower.T,
        "scale": scale,
        "khat": float(pareto_k[0]),
        "ess": float(1.0 / np.sum(w * w)),
        "seconds": time.perf_counter() - start,
    }


def run_case(case: str, draws: list[int]) -> dict:
    X, y = load_case(case)
    model = model_of(X, y)
    mean_ref, cov_ref, _, diag = load_reference(case)
    times = []
    for _ in range(3):  # EP's time: the median of three fits
        start = time.perf_counter()
        ep_mean, ep_cov = _gaussian(EPLogisticRegression().fit(X, y))
        times.append(time.perf_counter() - start)
    ep_seconds = float(np.median(times))
    lap_mean, lap_cov = _gaussian(LaplaceLogisticRegression().fit(X, y))
    p = len(ep_mean)
    n_ref = diag["chains"] * diag["draws_per_chain"]
    kl_laplace = gaussian_kl(mean_ref, cov_ref, lap_mean, lap_cov)
    kl_ep = gaussian_kl(mean_ref, cov_ref, ep_mean, ep_cov)
    result = {
        "case": case,
        "p": p,
        "reference_draws": n_ref,
        "reference_noise": diag.get("moment_kl_noise", float("nan")),
        "reference_noise_formula": p * (p + 3) / (4.0 * n_ref),
        "kl_laplace": kl_laplace,
        "kl_ep": kl_ep,
        "kl_ep_mean_part": gaussian_kl(mean_ref, ep_cov, ep_mean, ep_cov),
        "kl_ep_cov_part": gaussian_kl(mean_ref, cov_ref, mean_ref, ep_cov),
        "ep_seconds": ep_seconds,
        "importance": [],
    }
    for n_draws in draws:
        fit = importance_moments(model, ep_mean, ep_cov, n_draws)
        row = {k: fit[k] for k in ("scale", "khat", "ess", "seconds")}
        row["draws"] = n_draws
        row["kl_moments"] = gaussian_kl(mean_ref, cov_ref, fit["mean"], fit["cov"])
        row["kl_scaled"] = gaussian_kl(mean_ref, cov_ref, ep_mean, fit["scale"] * ep_cov)
        result["importance"].append(row)
        print(case, row, flush=True)
    return result


def _fmt(x: float) -> str:
    return format(x, ".3g") if np.isfinite(x) else "—"


def write_report(out: Path, results: list[dict], info: dict) -> None:
    write_json(out / "softmax_ep_error.json", {"machine": info, "cases": results})
    lines = [
        "# The multinomial EP's error against NUTS, and corrections by importance sampling",
        "",
        "Produced by `benchmarks/softmax_ep_error.py` (docs/decisions.md D-089). KL(reference "
        "‖ ·) of the moment-matched Gaussians (nats), the references of "
        "`nuts_softmax_reference.py`; *reference noise*: the reference's own Monte Carlo "
        "error in that KL (batch-means bootstrap; p(p + 3)/(4N) beside it), part of every KL "
        "below. EP: `EPLogisticRegression()` (the default VS's fit where it takes the route "
        "'sites'), its error split into the mean's part and the covariance's.",
        "",
        "| case | p | reference draws | reference noise | p(p+3)/(4N) | Laplace | EP | "
        "EP / Laplace | EP's mean part | EP's covariance part | EP fit (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['p']} | {r['reference_draws']:,} | {_fmt(r['reference_noise'])} "
            f"| {r['reference_noise_formula']:.3g} | {r['kl_laplace']:.3g} | {r['kl_ep']:.3g} | "
            f"{r['kl_ep'] / r['kl_laplace']:.3g} | {r['kl_ep_mean_part']:.3g} | "
            f"{r['kl_ep_cov_part']:.3g} | {r['ep_seconds']:.3g} |"
        )
    lines += [
        "",
        "Importance sampling from EP's Gaussian (mirrored normal draws with their first two "
        "moments matched, PSIS): *IS moments*, the weighted draws' mean and covariance; "
        "*EP scaled*, EP's mean with its covariance times s = Σ w |z|² / p (the closest "
        "N(m, s S) to the weighted draws). Times: the draws, their log densities and the "
        "weights (EP's fit not included), and over EP's fit timed in the same process.",
        "",
        "| case | draws | k̂ | ESS | time (s) | × EP's fit | IS moments | / Laplace | s "
        "| EP scaled | / Laplace |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for row in r["importance"]:
            lines.append(
                f"| {r['case']} | {row['draws']:,} | {row['khat']:.2f} | {row['ess']:.0f} | "
                f"{row['seconds']:.2f} | {row['seconds'] / r['ep_seconds']:.2g} | "
                f"{row['kl_moments']:.3g} | "
                f"{row['kl_moments'] / r['kl_laplace']:.3g} | {row['scale']:.4f} | "
                f"{row['kl_scaled']:.3g} | {row['kl_scaled'] / r['kl_laplace']:.3g} |"
            )
    lines += ["", machine_line(info), ""]
    (out / "softmax_ep_error.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, nargs="+", default=[2000, 8000, 32000])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = machine()
    results = [run_case(case, args.draws) for case in args.cases]
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, results, info)


if __name__ == "__main__":
    main()
