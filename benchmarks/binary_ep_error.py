"""Where the binary EP's interval endpoints miss the NUTS references, and what corrects them.

On the binary references of ``nuts_reference.py`` (breast_cancer, classif_d100, digits3;
logistic and probit), the 95 % endpoints of EP's marginals against those of the NUTS
Gaussian, in the reference's sds (as ``posterior_checks.py``; target 0.05), for EP as
``EPLogisticRegression`` fits it (the default VS's route "sites") and for corrections of
it (docs/decisions.md D-205):

1. **The site fits.** EP with every tilted density integrated by the adaptive trapezoid
   rule (``site_fit="quadrature"``, the reference of the VS site fits), both at
   ``tol=1e-8``: how far the VS site fits move EP's posterior (logistic; the probit's
   sites are in closed form).
2. **Linear response.** EP's covariance as the response of its mean to a linear term in
   the log-density (Opper & Winther's linear response): the derivative of EP's fixed point,
   by implicit differentiation. At the fixed point each site's change is local in its
   latent marginal's (mean, variance) change, ``(dν, dτ) = D_i (dm_i, dv_i)`` with
   ``D_i = Jq_i − Jc_i⁻¹`` (the Gaussian's and the tilted density's Jacobians of their
   natural parameters in (m, v): zero for a Gaussian factor, from the tilted density's
   central moments to the fourth), and the marginals move with all sites,
   ``dm = A Σ Aᵀ (dν − m dτ) + A Σ dh`` and ``dv = −((A Σ Aᵀ)∘(A Σ Aᵀ)) dτ``: one linear
   system of 2M unknowns per coefficient, solved by GMRES for all at once. Also with
   the variances' coupling cut to each row's own site (the diagonal of that matrix).
3. **The factorized marginal correction** (Cseke & Heskes 2011): each coefficient's
   marginal ``q(x) Π_i E_{q(t_i | x)}[F(t_i) / site_i(t_i)]`` on a grid of 41 points within
   ±7 EP sds (closed-form tilted normalizers: the logistic's mixture of probits).
4. **Importance sampling** from EP's Gaussian: 20 000 draws, three seeds.
5. With ``--conditional``: on digits3, Cseke & Heskes' EP-L marginal of the intercept and
   of EP's three worst other coefficients: EP refitted with the coefficient held at each
   point of a grid (21 points within ±5 EP sds; its prior N(x, 1e-8)), the marginal
   ``∝ Z_EP(x) N(x; 0, prior variance)``: what EP itself gives with that coefficient's
   uncertainty taken out of its sites.
6. With ``--global-fits``: the global VS fit from EP's kernel (``strategy="global"``) at
   16n and 32n points (n = the Gaussian's parameters), random_state 0 to 4, on digits3
   (``posterior_checks.py`` has 8n and 64n).

The linear-response and factorized corrections are prototypes here (the linear response
forms the M × M coupling; the factorized correction loops over the coefficients): their
times, against EP's fit in the same process on one BLAS thread, are what such code
costs, not a tuned library version's.

Usage: python benchmarks/binary_ep_error.py [--cases digits3 ...] [--conditional]
[--global-fits] [--out DIR]
Writes DIR/binary_ep_error.{csv,json,md,png}; DIR defaults to benchmarks/results (about a minute;
the conditional marginals one more, the global fits four).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import matplotlib
import numpy as np
from _common import RESULTS, machine, machine_line, write_csv, write_json

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from _high_dim_cases import INTERCEPT_PRIOR_VAR, PRIOR_VAR, load_case, load_reference
from scipy.sparse.linalg import LinearOperator, gmres
from threadpoolctl import threadpool_limits

from vsbayes import (
    EPLogisticRegression,
    EPProbitRegression,
    VSLogisticRegression,
    VSProbitRegression,
)
from vsbayes.approximations.expectation_propagation import expectation_propagation
from vsbayes.engine import n_family_params
from vsbayes.models import BinaryGLMPosterior
from vsbayes.models.tilted import tilted_mode

CASES = ("breast_cancer", "classif_d100", "digits3")
LINKS = ("logistic", "probit")
Z95 = 1.959963984540054
GRID = np.linspace(-7.0, 7.0, 41)  # the factorized correction's grid, in EP sds
IS_DRAWS, IS_SEEDS = 20_000, 3
GLOBAL_FACTORS, GLOBAL_SEEDS = (16, 32), 5
CONDITIONAL_GRID = np.linspace(-5.0, 5.0, 21)  # EP-L's grid, in EP sds
# The held coefficient's prior variance: tight (sd 1e-4 of a coefficient of sd ~1), yet
# its term x²/var in EP's evidence (x ~ 10) stays ~1e10, whose round-off (~1e-6 nats) is
# far below the evidence's curvature over the grid.
HELD_VAR = 1e-8


def endpoint_gaps(mean, sd, ref_mean, ref_sd) -> np.ndarray:
    """Each coefficient's larger 95 % endpoint gap, in the reference's sds."""
    lower = np.abs(mean - Z95 * sd - (ref_mean - Z95 * ref_sd))
    upper = np.abs(mean + Z95 * sd - (ref_mean + Z95 * ref_sd))
    return np.maximum(lower, upper) / ref_sd


def summarize(mean, sd, ref_mean, ref_sd) -> dict:
    gap = endpoint_gaps(mean, sd, ref_mean, ref_sd)
    return {
        "max_gap": float(gap.max()),
        "worst": int(gap.argmax()),
        "median_gap": float(np.median(gap)),
        "share_within_0.05": float((gap <= 0.05).mean()),
        "max_mean_gap_sd": float(np.max(np.abs(mean - ref_mean) / ref_sd)),
        "max_sd_relative_gap": float(np.max(np.abs(sd / ref_sd - 1.0))),
        "intercept_mean_gap_sd": float((mean[-1] - ref_mean[-1]) / ref_sd[-1]),
        "intercept_sd_relative_gap": float(sd[-1] / ref_sd[-1] - 1.0),
    }


def model_of(X, y, link: str) -> BinaryGLMPosterior:
    """The estimators' model of (X, y): prior variance 1 (C = 1), a vague intercept."""
    return BinaryGLMPosterior(
        X,
        np.where(y > 0, 1.0, -1.0),
        np.ones(len(y)),
        link,
        prior_var=PRIOR_VAR,
        intercept_prior_var=INTERCEPT_PRIOR_VAR,
    )


def tilted_central_moments(link, cav_mean, cav_var) -> tuple[np.ndarray, ...]:
    """Mean, variance and third and fourth central moments of ``F(t) N(t; m, v) / Z`` per
    site: a trapezoid rule of 201 nodes over ±10 widths around the mode (bounded
    temporaries: sites in blocks). The linear response's sds from it are within 2e-4 of a
    rule of 1201 nodes over ±14 on digits3 (GMRES's tolerance), 5e-6 on classif_d100."""
    out = [np.empty_like(cav_mean) for _ in range(4)]
    u = np.linspace(-10.0, 10.0, 201)
    for start in range(0, cav_mean.size, 512):
        part = slice(start, start + 512)
        m, v = cav_mean[part], cav_var[part]
        mode, width = tilted_mode(link, m, v, np.ones_like(m))
        t = mode[:, None] + width[:, None] * u
        log_f = link.log_cdf(t) - 0.5 * (t - m[:, None]) ** 2 / v[:, None]
        w = np.exp(log_f - log_f.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        mean = (w * t).sum(axis=1)
        c = t - mean[:, None]
        out[0][part], out[1][part] = mean, (w * c**2).sum(axis=1)
        out[2][part], out[3][part] = (w * c**3).sum(axis=1), (w * c**4).sum(axis=1)
    return tuple(out)


def linear_response(model, ep, own_rows: bool = False, rtol: float = 1e-4):
    """EP's linear-response covariance ``d mean / d h`` (see the module docstring), and the
    GMRES iterations. ``own_rows``: the variances' coupling cut to each row's own site
    (the diagonal of ``(A Σ Aᵀ)∘(A Σ Aᵀ)``)."""
    A = np.asarray(model.design)
    tau, nu = ep.sites.precision, ep.sites.linear
    S = ep.cov
    M, p = A.shape
    W = A @ S
    m = A @ ep.mean
    v = np.einsum("ij,ij->i", W, A)
    cav_prec, cav_lin = 1.0 / v - tau, m / v - nu
    _, _, mu3, mu4 = tilted_central_moments(model.link, cav_lin / cav_prec, 1.0 / cav_prec)
    # The tilted density's Jacobian of (mean, variance) in its cavity's natural parameters
    # (η, λ) of exp(η t − λ t²/2): covariances of (t, t²) under it.
    cov_t_t2 = mu3 + 2.0 * m * v
    var_t2 = mu4 - v**2 + 4.0 * m * mu3 + 4.0 * m * m * v
    d_mean = np.stack([v, -0.5 * cov_t_t2], axis=-1)
    d_square = np.stack([cov_t_t2, -0.5 * var_t2], axis=-1)
    jc = np.stack([d_mean, d_square - 2.0 * m[:, None] * d_mean], axis=1)
    # The Gaussian marginal's: (η, λ) = (m / v, 1 / v).
    jq = np.zeros((M, 2, 2))
    jq[:, 0, 0], jq[:, 0, 1], jq[:, 1, 1] = 1.0 / v, -m / v**2, -1.0 / v**2
    local = jq - np.linalg.inv(jc)  # (dν, dτ) = local (dm, dv)
    dmm, dmv, dvm, dvv = (local[:, a, b][:, None] for a, b in ((0, 0), (0, 1), (1, 0), (1, 1)))
    latent_cov = W @ A.T
    coupling = latent_cov * latent_cov
    if own_rows:
        coupling = np.diag(np.diag(coupling))

    def apply(flat):
        x = flat.reshape(2 * M, p)
        d_nu, d_tau = x[:M], x[M:]
        dm = W @ (A.T @ (d_nu - m[:, None] * d_tau))
        dv = -(coupling @ d_tau)
        return (x - np.concatenate([dmm * dm + dmv * dv, dvm * dm + dvv * dv])).ravel()

    count = [0]
    operator = LinearOperator((2 * M * p, 2 * M * p), matvec=apply, dtype=float)
    rhs = np.concatenate([dmm * W, dvm * W]).ravel()
    solution, info = gmres(
        operator,
        rhs,
        rtol=rtol,
        restart=60,
        maxiter=10,
        callback=lambda _: count.__setitem__(0, count[0] + 1),
        callback_type="pr_norm",
    )
    if info != 0:
        raise RuntimeError(f"GMRES did not converge (info {info}).")
    x = solution.reshape(2 * M, p)
    cov = S + W.T @ (x[:M] - m[:, None] * x[M:])
    return 0.5 * (cov + cov.T), count[0]


def factorized_correction(model, ep) -> tuple[np.ndarray, np.ndarray]:
    """Each coefficient's mean and sd under Cseke & Heskes' factorized correction."""
    A = np.asarray(model.design)
    tau, nu = ep.sites.precision, ep.sites.linear
    mu, S = ep.mean, ep.cov
    sd = np.sqrt(np.diag(S))
    m_t, W = A @ mu, A @ S
    v_t = np.einsum("ij,ij->i", W, A)
    method = "fast" if model.link.name == "logistic" else "closed"
    new_mean, new_sd = np.empty_like(mu), np.empty_like(mu)
    for j in range(mu.size):
        x = mu[j] + sd[j] * GRID
        c = W[:, j] / S[j, j]
        cond_mean = m_t[:, None] + c[:, None] * (x - mu[j])[None, :]
        cond_var = v_t - c * W[:, j]
        # q(t | x) divided by the site: a proper Gaussian (its precision 1/v(t|x) − τ ≥ the
        # cavity's), whose tilted normalizer with F is the factor's correction.
        var = 1.0 / (1.0 / cond_var - tau)
        mean = (cond_mean / cond_var[:, None] - nu[:, None]) * var[:, None]
        log_z, _, _ = model.link.tilted_moments(
            mean.ravel(), np.repeat(var, GRID.size), 1.0, method=method
        )
        log_eps = (
            log_z.reshape(mean.shape)
            + 0.5 * mean**2 / var[:, None]
            - 0.5 * cond_mean**2 / cond_var[:, None]
        )
        log_p = -0.5 * GRID**2 + log_eps.sum(axis=0)
        w = np.exp(log_p - log_p.max())
        w /= w.sum()
        new_mean[j] = w @ x
        new_sd[j] = np.sqrt(w @ (x - new_mean[j]) ** 2)
    return new_mean, new_sd


def importance(model, ep, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Self-normalized importance sampling from EP's Gaussian: mean, sd, ESS."""
    rng = np.random.default_rng(seed)
    lower = np.linalg.cholesky(ep.cov)
    log_w, draws = [], []
    for _ in range(IS_DRAWS // 4000):
        z = rng.standard_normal((4000, ep.mean.size))
        theta = ep.mean + z @ lower.T
        log_w.append(model.log_density(theta) + 0.5 * np.einsum("ij,ij->i", z, z))
        draws.append(theta)
    log_w, theta = np.concatenate(log_w), np.vstack(draws)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ theta
    return mean, np.sqrt(w @ (theta - mean) ** 2), float(1.0 / np.sum(w**2))


def timed_fit(estimator_class, X, y, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            estimator_class().fit(X, y)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def conditional_marginal(X, y, link: str, ep, j: int) -> tuple[float, float, float]:
    """EP-L's mean and sd of coefficient ``j`` (see the module docstring), and its time."""
    start = time.perf_counter()
    sd = np.sqrt(ep.cov[j, j])
    grid = ep.mean[j] + sd * CONDITIONAL_GRID
    prior_var = np.r_[np.full(X.shape[1], PRIOR_VAR), INTERCEPT_PRIOR_VAR]
    log_p = []
    for x in grid:
        variances, means = prior_var.copy(), np.zeros(prior_var.size)
        variances[j], means[j] = HELD_VAR, x
        held = BinaryGLMPosterior(
            X,
            np.where(y > 0, 1.0, -1.0),
            np.ones(len(y)),
            link,
            prior_var=variances[:-1],
            intercept_prior_var=variances[-1],
            prior_mean=means,
        )
        start_at = ep.mean.copy()
        start_at[j] = x
        fit = expectation_propagation(held, tol=1e-8, start=start_at)
        log_p.append(fit.log_Z - 0.5 * x * x / prior_var[j])
    log_p = np.asarray(log_p)
    w = np.exp(log_p - log_p.max())
    w /= w.sum()
    mean = float(w @ grid)
    return mean, float(np.sqrt(w @ (grid - mean) ** 2)), time.perf_counter() - start


def global_fits(X, y, link: str, ref_mean, ref_sd, ep_seconds: float) -> list[dict]:
    """The global VS fit from EP's kernel at each of GLOBAL_FACTORS × n points: the largest
    endpoint gap over random_state 0 to GLOBAL_SEEDS − 1 and the median time."""
    vs_class = VSLogisticRegression if link == "logistic" else VSProbitRegression
    n = n_family_params(X.shape[1] + 1, "gaussian")
    rows = []
    for factor in GLOBAL_FACTORS:
        gaps, times = [], []
        for seed in range(GLOBAL_SEEDS):
            start = time.perf_counter()
            fit = vs_class(strategy="global", n_samples=factor * n, random_state=seed).fit(X, y)
            times.append(time.perf_counter() - start)
            mean = np.r_[fit.coef_.ravel(), fit.intercept_]
            gaps.append(endpoint_gaps(mean, np.sqrt(np.diag(fit.sigma_)), ref_mean, ref_sd).max())
        rows.append(
            {
                "factor": factor,
                "points": factor * n,
                "max_gap_min": float(min(gaps)),
                "max_gap_median": float(np.median(gaps)),
                "max_gap_max": float(max(gaps)),
                "seconds": float(np.median(times)),
                "over_ep_fit": float(np.median(times)) / ep_seconds,
            }
        )
    return rows


def run_case(
    case: str, link: str, with_global: bool = False, with_conditional: bool = False
) -> dict | None:
    reference = load_reference(case, link)
    if reference is None:
        return None
    ref_mean, ref_cov, _ = reference
    ref_sd = np.sqrt(np.diag(ref_cov))
    X, y = load_case(case)
    model = model_of(X, y, link)
    estimator_class = EPLogisticRegression if link == "logistic" else EPProbitRegression
    row: dict = {"case": case, "link": link, "rows": X.shape[0], "coefficients": ref_sd.size}
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y01 = (y > 0).astype(int)
        row["ep_fit_seconds"] = timed_fit(estimator_class, X, y01)
        fitted = estimator_class().fit(X, y01)
        est_mean = np.r_[fitted.coef_.ravel(), fitted.intercept_]
        row["ep"] = summarize(est_mean, np.sqrt(np.diag(fitted.sigma_)), ref_mean, ref_sd)
        ep = expectation_propagation(model, tol=1e-8)
        sd = np.sqrt(np.diag(ep.cov))
        row["ep_tol_1e-8"] = summarize(ep.mean, sd, ref_mean, ref_sd)
        row["ep_sweeps"] = ep.n_iter
        if link == "logistic":
            quad = expectation_propagation(model, tol=1e-8, site_fit="quadrature")
            row["quadrature_vs_sites"] = {
                "max_mean_difference_sd": float(np.max(np.abs(quad.mean - ep.mean) / sd)),
                "max_sd_relative_difference": float(
                    np.max(np.abs(np.sqrt(np.diag(quad.cov)) / sd - 1.0))
                ),
            }
        start = time.perf_counter()
        lr_cov, iterations = linear_response(model, ep)
        row["lr_seconds"] = time.perf_counter() - start
        row["lr_iterations"] = iterations
        lr_sd = np.sqrt(np.diag(lr_cov))
        row["lr_positive_definite"] = bool(np.all(np.linalg.eigvalsh(lr_cov) > 0))
        row["ep_mean_lr_sd"] = summarize(ep.mean, lr_sd, ref_mean, ref_sd)
        own_cov, _ = linear_response(model, ep, own_rows=True)
        row["own_rows_lr"] = summarize(ep.mean, np.sqrt(np.diag(own_cov)), ref_mean, ref_sd)
        row["own_rows_lr_vs_ep_sd"] = float(np.max(np.abs(np.sqrt(np.diag(own_cov)) / sd - 1.0)))
        start = time.perf_counter()
        fact_mean, fact_sd = factorized_correction(model, ep)
        row["factorized_seconds"] = time.perf_counter() - start
        row["factorized"] = summarize(fact_mean, fact_sd, ref_mean, ref_sd)
        row["factorized_mean_lr_sd"] = summarize(fact_mean, lr_sd, ref_mean, ref_sd)
        runs = [importance(model, ep, seed) for seed in range(IS_SEEDS)]
        row["importance"] = [
            {**summarize(mean, sd_, ref_mean, ref_sd), "ess": ess} for mean, sd_, ess in runs
        ]
        if with_conditional and case == "digits3":
            gap = endpoint_gaps(ep.mean, sd, ref_mean, ref_sd)
            chosen = [ref_sd.size - 1, *np.argsort(gap[:-1])[::-1][:3]]
            row["conditional"] = []
            for j in chosen:
                mean_j, sd_j, seconds = conditional_marginal(X, y, link, ep, int(j))
                row["conditional"].append(
                    {
                        "coefficient": int(j),
                        "ep_mean_gap_sd": float((ep.mean[j] - ref_mean[j]) / ref_sd[j]),
                        "ep_sd_relative_gap": float(sd[j] / ref_sd[j] - 1.0),
                        "mean_gap_sd": (mean_j - ref_mean[j]) / ref_sd[j],
                        "sd_relative_gap": sd_j / ref_sd[j] - 1.0,
                        "lr_sd_relative_gap": float(lr_sd[j] / ref_sd[j] - 1.0),
                        "seconds": seconds,
                    }
                )
        if with_global and case == "digits3":
            row["global"] = global_fits(X, y01, link, ref_mean, ref_sd, row["ep_fit_seconds"])
    print(
        f"{case} {link}: EP {row['ep']['max_gap']:.3f}, EP + LR sd "
        f"{row['ep_mean_lr_sd']['max_gap']:.3f} ({row['lr_seconds']:.2f} s, EP fit "
        f"{row['ep_fit_seconds']:.3f} s), factorized {row['factorized']['max_gap']:.3f}, "
        f"factorized mean + LR sd {row['factorized_mean_lr_sd']['max_gap']:.3f}",
        flush=True,
    )
    return row


#: The posteriors every case reports, as (CSV/plot label, the row's key).
POSTERIORS = (
    ("EP (estimator)", "ep"),
    ("EP, tol 1e-8", "ep_tol_1e-8"),
    ("EP mean, linear-response sd", "ep_mean_lr_sd"),
    ("linear response, own rows only", "own_rows_lr"),
    ("factorized correction", "factorized"),
    ("factorized mean, linear-response sd", "factorized_mean_lr_sd"),
)


def summary_rows(rows: list[dict]) -> list[dict]:
    """One flat row per (case, link, posterior): the CSV's and the plot's."""
    flat = []
    for r in rows:
        named = [(label, r[key]) for label, key in POSTERIORS]
        named += [
            (f"importance sampling, seed {seed}", s) for seed, s in enumerate(r["importance"])
        ]
        for label, s in named:
            flat.append(
                {
                    "case": r["case"],
                    "link": r["link"],
                    "posterior": label,
                    **{k: v for k, v in s.items() if k != "ess"},
                    "ess": s.get("ess", ""),
                }
            )
    return flat


def plot(path: Path, rows: list[dict]) -> None:
    """The largest endpoint gap of each posterior, per case and link, against 0.05."""
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(POSTERIORS)
    for i, (label, key) in enumerate(POSTERIORS):
        gaps = [r[key]["max_gap"] for r in rows]
        ax.bar(np.arange(len(rows)) + i * width, gaps, width, label=label)
    ax.axhline(0.05, color="k", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{r['case']}\n{r['link']}" for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("largest 95 % endpoint gap / NUTS sd")
    ax.set_title("Binary EP against NUTS, and its corrections (target 0.05, dashed)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, rows: list[dict], info: dict) -> None:
    write_json(out / "binary_ep_error.json", {"machine": info, "rows": rows})
    write_csv(out / "binary_ep_error.csv", summary_rows(rows))
    plot(out / "binary_ep_error.png", rows)

    def cells(s: dict) -> str:
        return (
            f"{s['max_gap']:.3f} | {s['worst']} | {s['share_within_0.05']:.3f} | "
            f"{s['max_mean_gap_sd']:.3f} | {s['max_sd_relative_gap']:.3f} | "
            f"{s['intercept_mean_gap_sd']:+.3f} / {s['intercept_sd_relative_gap']:+.3f}"
        )

    lines = [
        "# The binary EP's interval endpoints against NUTS, and its corrections",
        "",
        machine_line(info),
        "",
        "95 % endpoints against the NUTS references' (`nuts_reference.py`), in their sds "
        "(target 0.05); worst: the coefficient of the largest gap (the intercept is the "
        "last); intercept: its mean gap (sd) / sd relative gap. Times on one BLAS thread, "
        "the estimator's EP fit the median of 5; the corrections are dense prototypes "
        "(docs/decisions.md D-205).",
        "",
        "| case | link | posterior | max gap / sd | worst | share ≤ 0.05 | mean / sd | sd rel. "
        "| intercept | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"| {r['case']} | {r['link']} |"
        lines += [
            f"{name} EP (estimator) | {cells(r['ep'])} | {r['ep_fit_seconds']:.3f} |",
            f"{name} EP, tol 1e-8 ({r['ep_sweeps']} sweeps) | {cells(r['ep_tol_1e-8'])} | — |",
            f"{name} EP mean, linear-response sd ({r['lr_iterations']} GMRES iterations) | "
            f"{cells(r['ep_mean_lr_sd'])} | {r['lr_seconds']:.3f} |",
            f"{name} the same, each row's variance coupled to its own site only (sds within "
            f"{r['own_rows_lr_vs_ep_sd']:.0e} of EP's) | {cells(r['own_rows_lr'])} | — |",
            f"{name} factorized correction | {cells(r['factorized'])} | "
            f"{r['factorized_seconds']:.3f} |",
            f"{name} factorized mean, linear-response sd | {cells(r['factorized_mean_lr_sd'])} "
            f"| — |",
        ]
        for seed, s in enumerate(r["importance"]):
            lines.append(
                f"{name} importance sampling, {IS_DRAWS} draws, seed {seed} (ESS "
                f"{s['ess']:.0f}) | {cells(s)} | — |"
            )
    held = [(r, c) for r in rows for c in r.get("conditional", [])]
    if held:
        lines += [
            "",
            "EP-L, EP refitted with the coefficient held on a grid (the intercept is the "
            "last): each coefficient's mean gap (in sd) and sd relative gap, against EP's "
            "and the linear response's sd:",
            "",
            "| case | link | coefficient | EP mean / sd | EP-L mean / sd | linear-response sd "
            "| seconds |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['case']} | {r['link']} | {c['coefficient']} | {c['ep_mean_gap_sd']:+.3f} / "
            f"{c['ep_sd_relative_gap']:+.3f} | {c['mean_gap_sd']:+.3f} / "
            f"{c['sd_relative_gap']:+.3f} | {c['lr_sd_relative_gap']:+.3f} | "
            f"{c['seconds']:.1f} |"
            for r, c in held
        ]
    fits = [(r, g) for r in rows for g in r.get("global", [])]
    if fits:
        lines += [
            "",
            f"The global VS fit from EP's kernel (`strategy='global'`), random_state 0 to "
            f"{GLOBAL_SEEDS - 1}: its largest endpoint gap (min / median / max over the "
            "seeds) and median time against the EP fit's:",
            "",
            "| case | link | points | max gap / sd | seconds | × EP fit |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['case']} | {r['link']} | {g['factor']}n ({g['points']}) | "
            f"{g['max_gap_min']:.3f} / {g['max_gap_median']:.3f} / {g['max_gap_max']:.3f} | "
            f"{g['seconds']:.2f} | {g['over_ep_fit']:.1f} |"
            for r, g in fits
        ]
    lines += ["", "Site fits against quadrature (logistic, EP at tol 1e-8):", ""]
    for r in rows:
        if "quadrature_vs_sites" in r:
            q = r["quadrature_vs_sites"]
            lines.append(
                f"- {r['case']}: means within {q['max_mean_difference_sd']:.1e} EP sds, sds "
                f"within {q['max_sd_relative_difference']:.1e} relative."
            )
    (out / "binary_ep_error.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--conditional", action="store_true", help="digits3's EP-L marginals")
    parser.add_argument("--global-fits", action="store_true", help="digits3's global VS fits")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = machine()
    rows = [
        row
        for case in args.cases
        for link in LINKS
        if (row := run_case(case, link, args.global_fits, args.conditional))
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, rows, info)


if __name__ == "__main__":
    main()
