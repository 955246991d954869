"""The default estimators on data unlike the other benchmarks' cases, against long NUTS runs.

``VSLogisticRegression()`` and ``VSProbitRegression()`` at their defaults (C = 1, intercept,
``strategy="auto"``) on cases a user might bring and the committed benchmarks do not cover:
strongly imbalanced classes (2 % and 1 % positives), near-separable data, collinear
features, features on scales from 10⁻³ to 10³ left unstandardized, a dense 0/1 (one-hot)
design, few rows per parameter (M ≈ 2.5 p), many (M ≈ 200 p), heavy-tailed features,
``class_weight="balanced"``, a four-class problem with one rare class, and scikit-learn's
bundled diabetes (thresholded) and digits (1 against 7, 2 × 2 pooled pixels). Every case
is small enough for a long NUTS run (M ≤ 2000, at most 25 parameters) and seeded.

References (``--references``; needs the ``bench`` extra): NUTS by
``nuts_reference.sample_reference`` (binary; the rows' class weights in the potential) and
``nuts_softmax_reference.sample_reference`` (multinomial): 4 chains, whitened by the
Laplace approximation, the draws' moments, 2.5 % / 97.5 % quantiles and diagnostics in
``results/nuts_reference/unseen_<case>_<link>.npz`` (a few kB each). Run one cell a
process, niced and bounded, e.g.::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
    OMP_NUM_THREADS=1 timeout 600 nice -n 10 \\
    python benchmarks/unseen_cases.py --references --cases imbalanced --links logistic

A second, independent reference (``--is-check DRAWS``): importance sampling around each
NUTS Gaussian (``_ground_truth.ground_truth``: a Student-t proposal refined once, so
consistent whatever the start) in ``unseen_<case>_<link>_is.npz``. Where the posterior is
nearly Gaussian its ESS is most of its 10⁶ draws, and its noise floor in KL (n / (2 ESS))
is 10-20 times below NUTS's: it resolves the errors of 10⁻³ nats and less that the
default reaches there, which NUTS's floor hides.

Measured per cell (``python benchmarks/unseen_cases.py``): the default's error
``gaussian_kl(reference, fit)`` (nats; median of ``--seeds`` fits; against NUTS and IS)
and ÷ Laplace's,
``strategy_``, ``strategy_reason_``, ``kl_error_`` (the estimator's predicted error) against
the measured error, the warnings of the fits, the fit time over
``LogisticRegression``'s (``_common.speed_ratio``: interleaved, medians, the faster of the
default BLAS threads and one), and the largest gap of the ``summary()`` 95 % interval
endpoints from the reference draws' 2.5 % / 97.5 % quantiles, in reference sds. Writes
``results/unseen_cases.{csv,json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from _common import (
    RESULTS,
    fmt,
    machine,
    machine_line,
    speed_ratio,
    timed,
    warning_summary,
    write_csv,
    write_json,
)
from _high_dim_cases import REFERENCE_DIR, gaussian_kl, n_gaussian_parameters
from sklearn import datasets
from sklearn.preprocessing import StandardScaler
from sklearn.utils.class_weight import compute_class_weight

import vsbayes
from vsbayes.estimators._summaries import gaussian_marginals

NAME = "unseen_cases"
BOTH = ("logistic", "probit")
LOGISTIC = ("logistic",)


def _standardized(X) -> np.ndarray:
    return StandardScaler().fit_transform(np.asarray(X, dtype=float))


def _bernoulli(rng, logits) -> np.ndarray:
    return (rng.random(len(logits)) < 1.0 / (1.0 + np.exp(-logits))).astype(int)


def imbalanced():
    X, y = datasets.make_classification(
        2000, 10, n_informative=5, n_redundant=2, weights=[0.98], flip_y=0.0, random_state=1
    )
    return _standardized(X), y


def rare_positives():
    X, y = datasets.make_classification(
        1000, 6, n_informative=4, n_redundant=0, weights=[0.99], flip_y=0.0, random_state=13
    )
    return _standardized(X), y


def near_separable():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((400, 6))
    return X, _bernoulli(rng, 6.0 * X[:, 0] + 6.0 * X[:, 1])


def collinear():
    rng = np.random.default_rng(3)
    factors = rng.standard_normal((500, 4))
    X = factors @ rng.standard_normal((4, 20)) + 0.01 * rng.standard_normal((500, 20))
    return _standardized(X), _bernoulli(rng, factors @ np.array([1.0, -1.0, 0.5, 0.0]))


def unscaled():
    rng = np.random.default_rng(4)
    scales = 10.0 ** np.linspace(-3, 3, 8)
    z = rng.standard_normal((600, 8))
    X = (z + np.array([0, 3, 0, 1, 0, 2, 0, 5])) * scales  # offsets: non-centred columns
    return X, _bernoulli(rng, z @ np.array([1.0, -0.5, 0.8, 0.0, 0.6, -1.0, 0.3, 0.5]))


def onehot():
    rng = np.random.default_rng(5)
    levels = rng.integers(0, 4, size=(800, 5))
    X = np.concatenate([np.eye(4)[levels[:, j]] for j in range(5)], axis=1)
    effects = rng.normal(0.0, 0.8, size=20)
    return X, _bernoulli(rng, X @ effects - 1.0)


def few_rows():
    X, y = datasets.make_classification(50, 20, n_informative=5, random_state=6)
    return _standardized(X), y


def many_rows():
    X, y = datasets.make_classification(2000, 9, n_informative=4, random_state=7)
    return _standardized(X), y


def heavy_tailed():
    rng = np.random.default_rng(8)
    raw = rng.standard_t(1.5, size=(500, 6))
    logits = np.tanh(raw) @ np.array([1.5, -1.0, 1.0, 0.5, 0.0, -0.5])
    return _standardized(raw), _bernoulli(rng, logits)


def balanced_weights():
    X, y = datasets.make_classification(
        1000, 8, n_informative=4, weights=[0.95], flip_y=0.0, random_state=9
    )
    return _standardized(X), y


def rare_class():
    X, y = datasets.make_classification(
        800,
        5,
        n_informative=4,
        n_redundant=0,
        n_classes=4,
        n_clusters_per_class=1,
        weights=[0.45, 0.3, 0.22, 0.03],
        flip_y=0.0,
        random_state=10,
    )
    return _standardized(X), y


def diabetes():
    X, target = datasets.load_diabetes(return_X_y=True)
    return _standardized(X), (target > 200).astype(int)


def digits_1v7():
    X, y = datasets.load_digits(return_X_y=True)
    keep = (y == 1) | (y == 7)
    pooled = X[keep].reshape(-1, 4, 2, 4, 2).sum(axis=(2, 4)).reshape(-1, 16)
    return _standardized(pooled), (y[keep] == 7).astype(int)


#: name -> loader, links, estimator parameters beyond the defaults, what it is
CASES = {
    "imbalanced": (imbalanced, BOTH, {}, "make_classification, 2 % positives (40 of 2000)"),
    "rare_positives": (rare_positives, BOTH, {}, "make_classification, 1 % positives (10 of "
                       "1000)"),
    "near_separable": (near_separable, BOTH, {}, "y ~ σ(6 x₀ + 6 x₁): two features nearly "
                       "determine y"),
    "collinear": (collinear, LOGISTIC, {}, "20 features from 4 factors + 1 % noise "
                  "(condition number of XᵀX 5·10⁵)"),
    "unscaled": (unscaled, BOTH, {}, "8 features with sds 10⁻³…10³ and offsets, not "
                 "standardized"),
    "onehot": (onehot, LOGISTIC, {}, "five 4-level factors one-hot (20 dense 0/1 columns, "
               "each group summing to the intercept)"),
    "few_rows": (few_rows, BOTH, {}, "make_classification, 50 rows for 21 parameters"),
    "many_rows": (many_rows, LOGISTIC, {}, "make_classification, 2000 rows for 10 parameters"),
    "heavy_tailed": (heavy_tailed, BOTH, {}, "Student-t (ν = 1.5) features, standardized "
                     "(outliers stay)"),
    "balanced_weights": (balanced_weights, BOTH, {"class_weight": "balanced"},
                         "5 % positives, class_weight='balanced'"),
    "rare_class": (rare_class, ("multinomial",), {}, "4 classes, one with 3 % of 800 rows "
                   "(multinomial)"),
    "diabetes": (diabetes, BOTH, {}, "load_diabetes, target > 200 (31 % positives)"),
    "digits_1v7": (digits_1v7, LOGISTIC, {}, "load_digits 1 vs 7, 2 × 2 pooled pixels"),
}  # fmt: skip


def cells() -> list[tuple[str, str]]:
    return [(case, link) for case, (_, links, _, _) in CASES.items() for link in links]


def reference_path(case: str, link: str) -> Path:
    return REFERENCE_DIR / f"unseen_{case}_{link}.npz"


def load_reference(case: str, link: str, exact_shifts: bool = True):
    """``(mean, cov, quantiles, diagnostics)`` of one cell's reference, or ``None``; a
    multinomial cell's moments with the shift directions exact unless ``exact_shifts`` is
    false (:func:`_exact_shifts`)."""
    path = reference_path(case, link)
    if not path.is_file():
        return None
    with np.load(path) as data:
        mean, cov = _exact_shifts(case, link, data["mean"], data["cov"], exact_shifts)
        return mean, cov, data["quantiles"], json.loads(str(data["diagnostics"]))


def _exact_shifts(case: str, link: str, mean, cov, exact: bool = True):
    """A multinomial reference's moments with the shift directions' exact posterior (their
    draws' moments are Monte Carlo error alone: ``nuts_softmax_reference.with_exact_shifts``);
    others as they are."""
    if link != "multinomial" or not exact:
        return mean, cov
    from nuts_softmax_reference import with_exact_shifts

    return with_exact_shifts(*CASES[case][0](), mean, cov)


def row_weights(case: str, y) -> np.ndarray | None:
    """The rows' weights of the case's ``class_weight`` (None: unweighted)."""
    class_weight = CASES[case][2].get("class_weight")
    if class_weight is None:
        return None
    classes = np.unique(y)
    per_class = compute_class_weight(class_weight, classes=classes, y=y)
    return per_class[np.searchsorted(classes, y)]


# --- references ---------------------------------------------------------------------------


def run_references(args) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    for case, link in cells():
        if case not in args.cases or link not in args.links:
            continue
        if reference_path(case, link).is_file() and not args.force:
            print(f"{case}/{link}: reference exists", flush=True)
            continue
        X, y = CASES[case][0]()
        if link == "multinomial":
            import nuts_softmax_reference

            options = argparse.Namespace(
                chains=4, draws=args.draws, warmup=args.warmup, target_accept=0.9
            )
            nuts_softmax_reference.sample_reference(X, y, case, reference_path(case, link), options)
            continue
        import nuts_reference

        options = argparse.Namespace(
            chains=4,
            draws=args.draws,
            warmup=args.warmup,
            chain_method="sequential",
            target_accept=args.target_accept,
            max_tree_depth=10,
            init_scale=1.5,
            precondition="laplace",
        )
        signs = np.where(y == y.max(), 1.0, -1.0)
        nuts_reference.sample_reference(
            X, signs, link, case, reference_path(case, link), options, row_weights(case, y)
        )


def is_path(case: str, link: str) -> Path:
    return REFERENCE_DIR / f"unseen_{case}_{link}_is.npz"


def run_is_checks(args) -> None:
    """Importance sampling around each NUTS reference's Gaussian (``_ground_truth``: a
    Student-t proposal refined once; consistent whatever the start): an independent
    reference whose Monte Carlo error is far below NUTS's where the posterior is nearly
    Gaussian (ESS ~ the draws), and so resolves the small errors NUTS's noise floor hides."""
    from _ground_truth import ground_truth, save_ground_truth

    from vsbayes import Gaussian

    for case, link in cells():
        if case not in args.cases or link not in args.links:
            continue
        reference = load_reference(case, link)
        if reference is None:
            continue
        X, y = CASES[case][0]()
        if link == "multinomial":
            from nuts_softmax_reference import model_of

            log_target = model_of(X, y).log_density
        else:
            from nuts_reference import log_posterior, signed_design

            A = signed_design(X, np.where(y == y.max(), 1.0, -1.0))
            weights = row_weights(case, y)

            def log_target(theta, A=A, link=link, weights=weights):
                return log_posterior(A, link, theta, weights)

        truth = ground_truth(log_target, Gaussian(*reference[:2]), args.is_check, seed=0)
        save_ground_truth(is_path(case, link), truth)
        print(f"{case}/{link}: IS ESS {truth['ess']:.0f} in {truth['seconds']:.0f} s", flush=True)


def load_is(case: str, link: str):
    """``(mean, cov, ess)`` of the importance-sampling cross-check, or ``None``."""
    path = is_path(case, link)
    if not path.is_file():
        return None
    with np.load(path) as data:
        return (*_exact_shifts(case, link, data["mean"], data["cov"]), float(data["ess"]))


# --- measurements -------------------------------------------------------------------------


def estimator(family: str, link: str, case: str, seed: int | None = None):
    cls = getattr(vsbayes, f"{family}{'Probit' if link == 'probit' else 'Logistic'}Regression")
    params = dict(CASES[case][2])
    if seed is not None:
        params["random_state"] = seed
    return cls(**params)


def flat_posterior(est) -> tuple[np.ndarray, np.ndarray]:
    """θ = [coef.ravel(), intercept] and its covariance (the references' layout)."""
    return np.r_[est.coef_.ravel(), np.ravel(est.intercept_)], np.asarray(est.sigma_, float)


def interval_gap(est, mean_ref, cov_ref, quantiles, multinomial: bool) -> float:
    """Largest |summary()'s 95 % endpoint − the reference draws' quantile| in reference sds;
    ``est`` None: of the reference's own moment Gaussian (the best a Gaussian can do)."""
    if est is None:
        low = high = None
    else:
        table = est.summary()
        low, high = (np.asarray(table.iloc[:, j], float) for j in (2, 3))
    if multinomial:
        k = quantiles.shape[2]
        d = (len(mean_ref) - k) // k
        W, b = mean_ref[: k * d].reshape(k, d), mean_ref[k * d :]
        sds = np.concatenate([sd for _, sd in gaussian_marginals(W, b, cov_ref, True)])
        ref_low, ref_high = (q.T.ravel() for q in quantiles)  # (d + 1, K) -> class-major
        centred = np.column_stack([W, b])
        centre = (centred - centred.mean(axis=0)).ravel()
    else:
        sds = np.sqrt(np.diag(cov_ref))
        ref_low, ref_high = quantiles
        centre = mean_ref
    if est is None:
        low, high = centre - 1.959964 * sds, centre + 1.959964 * sds
    return float(np.max(np.maximum(np.abs(low - ref_low), np.abs(high - ref_high)) / sds))


def measure(case: str, link: str, seeds: int, repeats: int) -> dict:
    X, y = CASES[case][0]()
    mean_ref, cov_ref, quantiles, diag = load_reference(case, link)
    multinomial = link == "multinomial"
    _, lap, lap_warnings = timed(lambda: estimator("Laplace", link, case).fit(X, y))
    kl_laplace = gaussian_kl(mean_ref, cov_ref, *flat_posterior(lap))
    fits: list = []

    def fit(k):
        est = estimator("VS", link, case, seed=k % seeds).fit(X, y)
        if k < seeds and len(fits) < seeds:
            fits.append(est)
        return est

    lr_params = {"class_weight": CASES[case][2]["class_weight"]} if CASES[case][2] else {}
    timing = speed_ratio(fit, X, y, repeats=max(repeats, seeds), **lr_params)
    kls = [gaussian_kl(mean_ref, cov_ref, *flat_posterior(est)) for est in fits]
    checked = load_is(case, link)
    if checked is None:
        kls_is, kl_laplace_is, kl_nuts_is, is_ess = [np.nan], np.nan, np.nan, np.nan
    else:
        mean_is, cov_is, is_ess = checked
        kls_is = [gaussian_kl(mean_is, cov_is, *flat_posterior(est)) for est in fits]
        kl_laplace_is = gaussian_kl(mean_is, cov_is, *flat_posterior(lap))
        kl_nuts_is = gaussian_kl(mean_is, cov_is, mean_ref, cov_ref)
    median = int(np.argsort(kls)[len(kls) // 2])
    est = fits[median]
    n_par = n_gaussian_parameters(len(mean_ref))
    row = {
        "case": case,
        "link": link,
        "M": X.shape[0],
        "d": X.shape[1],
        "parameters": len(mean_ref),
        "kl_vs": float(np.median(kls)),
        "kl_vs_max": float(np.max(kls)),
        "kl_laplace": kl_laplace,
        "ratio_to_laplace": float(np.median(kls)) / kl_laplace,
        "kl_error_predicted": float(np.ravel(est.kl_error_)[0]),
        "kl_vs_is": float(np.median(kls_is)),
        "kl_laplace_is": kl_laplace_is,
        "ratio_to_laplace_is": float(np.median(kls_is)) / kl_laplace_is,
        "kl_nuts_is": kl_nuts_is,
        "is_ess": is_ess,
        "is_noise_floor": n_par / (2 * is_ess),
        "strategy": ",".join(map(str, est.strategy_)),
        "strategy_reason": " | ".join(est.strategy_reason_),
        "interval_gap_sd": interval_gap(est, mean_ref, cov_ref, quantiles, multinomial),
        "interval_gap_laplace_sd": interval_gap(lap, mean_ref, cov_ref, quantiles, multinomial),
        "interval_gap_nuts_gaussian_sd": interval_gap(
            None, mean_ref, cov_ref, quantiles, multinomial
        ),
        "seconds": timing["seconds"],
        "lr_seconds": timing["lr_seconds"],
        "time_ratio_lr": timing["ratio"],
        **warning_summary(timing["warnings"]),
        "laplace_warnings": len(lap_warnings),
        "ref_rhat_max": diag["rhat_max"],
        "ref_ess_bulk_min": diag["ess_bulk_min"],
        "ref_ess_tail_min": diag["ess_tail_min"],
        "ref_draws": diag["chains"] * diag["draws_per_chain"],
        "ref_divergences": diag["divergences"],
        "ref_noise_floor": n_par / (2 * diag["ess_tail_min"]),
        "ref_wall_seconds": diag["wall_seconds"],
    }
    return row


# --- report -------------------------------------------------------------------------------


def markdown(rows: list[dict], info: dict) -> str:
    lines = [
        "# The default estimators on unseen kinds of data",
        "",
        "Produced by `benchmarks/unseen_cases.py`. `VSLogisticRegression()` / "
        "`VSProbitRegression()` at their defaults (C = 1, intercept, strategy 'auto'; "
        "`class_weight='balanced'` where named) against long NUTS references (4 chains, "
        "whitened by the Laplace approximation) and, as a second reference, importance "
        "sampling (IS) around the NUTS Gaussian (10⁶ Student-t draws, refined once). "
        "Error: KL(reference moments ‖ fit), nats, median of the seeds; ÷ Laplace: that "
        "over the Laplace approximation's. Predicted: the fit's `kl_error_` (— where EP is "
        "kept unsampled). Floor: the reference's own Monte Carlo noise in KL, n / (2 ESS), "
        "n the Gaussian's parameters (NUTS: its smallest tail ESS; IS: its ESS); KL(IS‖NUTS) "
        "shows NUTS's noise directly. Interval gap: largest |95 % endpoint of `summary()` − "
        "the NUTS draws' 2.5 / 97.5 % quantile| over the coefficients, in reference sds (the "
        "default; Laplace; the NUTS draws' own moment Gaussian: the best a Gaussian can do). "
        "Time: fit over `LogisticRegression`'s (same data and class weights; medians of "
        "interleaved fits, the faster of the default and one BLAS thread).",
        "",
        "| case | link | M | p | error vs NUTS | ÷ Laplace | error vs IS | ÷ Laplace "
        "| predicted | strategy | NUTS floor | KL(IS‖NUTS) | IS floor | interval gap (sd) "
        "| time ÷ LR | warnings |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    best = [best_reference(r)[0] for r in rows]
    predicted = [r for r in rows if np.isfinite(r["kl_error_predicted"])]
    covered = sum(
        r["kl_error_predicted"] >= (r["kl_vs_is"] if np.isfinite(r["kl_vs_is"]) else r["kl_vs"])
        for r in predicted
    )
    worst = rows[int(np.nanargmax(best))]
    lines[4:4] = [
        f"Summary: against the reference of the lower noise floor (IS where it resolves "
        f"more than NUTS), the default's error is at most {np.nanmax(best):.3g} of "
        f"Laplace's ({worst['case']}/{worst['link']}; median {np.nanmedian(best):.3g}) "
        f"over the {len(rows)} cells; `kl_error_` is at least the measured error on "
        f"{covered} of the {len(predicted)} cells that predict one (the others keep EP "
        f"unsampled: NaN); {sum(r['warnings'] for r in rows)} warnings; fit time "
        f"{min(r['time_ratio_lr'] for r in rows):.1f}-{max(r['time_ratio_lr'] for r in rows):.1f}"
        f" × LogisticRegression's (the load average: the machine line).",
        "",
    ]
    for r in rows:
        warn_text = r["warning_first"][:80] if r["warnings"] else "none"
        lines.append(
            f"| {r['case']} | {r['link']} | {r['M']} | {r['parameters']} | {fmt(r['kl_vs'])} "
            f"| {fmt(r['ratio_to_laplace'])} | {fmt(r['kl_vs_is'])} "
            f"| {fmt(r['ratio_to_laplace_is'])} | {fmt(r['kl_error_predicted'])} "
            f"| {r['strategy']} | {fmt(r['ref_noise_floor'])} | {fmt(r['kl_nuts_is'])} "
            f"| {fmt(r['is_noise_floor'])} "
            f"| {r['interval_gap_sd']:.2f} / {r['interval_gap_laplace_sd']:.2f} / "
            f"{r['interval_gap_nuts_gaussian_sd']:.2f} | {r['time_ratio_lr']:.1f} | {warn_text} |"
        )
    lines += [
        "",
        "NUTS references (4 chains; R-hat: rank-normalized split, max over coordinates; ESS "
        "bulk / tail, min over coordinates; divergences after warm-up; Laplace's error):",
        "",
        "| case | link | draws | R-hat max | ESS bulk min | ESS tail min | divergences "
        "| wall (s) | KL(NUTS‖Laplace) | IS ESS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['link']} | {r['ref_draws']} | {r['ref_rhat_max']:.4f} "
            f"| {r['ref_ess_bulk_min']:.0f} | {r['ref_ess_tail_min']:.0f} "
            f"| {r['ref_divergences']} | {r['ref_wall_seconds']:.0f} | {fmt(r['kl_laplace'])} "
            f"| {fmt(r['is_ess'])} |"
        )
    lines += ["", "Cases:", ""]
    lines += [f"- `{name}`: {spec[3]}." for name, spec in CASES.items()]
    lines += ["", "Why each route (`strategy_reason_`, first seed):", ""]
    lines += [f"- {r['case']}/{r['link']}: {r['strategy_reason']}" for r in rows]
    lines += ["", machine_line(info), ""]
    return "\n".join(lines)


def best_reference(row: dict) -> tuple[float, float]:
    """``(error ÷ Laplace's, its reference's floor ÷ Laplace's)`` against the reference of
    the lower noise floor (IS where it resolves more than NUTS)."""
    if np.isfinite(row["is_noise_floor"]) and row["is_noise_floor"] < row["ref_noise_floor"]:
        return row["ratio_to_laplace_is"], row["is_noise_floor"] / row["kl_laplace_is"]
    return row["ratio_to_laplace"], row["ref_noise_floor"] / row["kl_laplace"]


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [f"{r['case']}\n{r['link']}" for r in rows]
    x = np.arange(len(rows))
    ax.scatter(x, [r["ratio_to_laplace"] for r in rows], color="tab:blue", marker="o",
               label="default ÷ Laplace, vs NUTS")  # fmt: skip
    ax.scatter(x, [r["ratio_to_laplace_is"] for r in rows], color="tab:orange", marker="s",
               label="default ÷ Laplace, vs IS")  # fmt: skip
    floors = [best_reference(r)[1] for r in rows]
    ax.scatter(x, floors, color="k", marker="_", s=200, label="lower reference floor ÷ Laplace")
    ax.axhline(0.1, color="tab:red", ls="--", lw=1, label="0.1")
    ax.set_yscale("log")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("KL(reference ‖ fit) ÷ KL(reference ‖ Laplace)")
    ax.set_title("Default VS estimators on unseen cases")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--links", nargs="+", default=[*BOTH, "multinomial"])
    parser.add_argument("--references", action="store_true", help="run the missing NUTS")
    parser.add_argument("--force", action="store_true", help="rerun existing references")
    parser.add_argument(
        "--is-check", type=int, default=0, metavar="DRAWS", help="the IS cross-checks"
    )
    parser.add_argument("--draws", type=int, default=10_000, help="per chain")
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.references:
        run_references(args)
        return
    if args.is_check:
        run_is_checks(args)
        return
    rows = []
    for case, link in cells():
        if case not in args.cases or link not in args.links:
            continue
        if load_reference(case, link) is None:
            print(f"{case}/{link}: no reference yet", file=sys.stderr)
            continue
        rows.append(measure(case, link, args.seeds, args.repeats))
        shown = ("kl_vs", "ratio_to_laplace", "kl_error_predicted", "strategy",
                 "interval_gap_sd", "time_ratio_lr", "warnings")  # fmt: skip
        print(case, link, {k: rows[-1][k] for k in shown}, flush=True)
    info = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / f"{NAME}.csv", rows)
    write_json(args.out / f"{NAME}.json", {"machine": info, "rows": rows})
    (args.out / f"{NAME}.md").write_text(markdown(rows, info))
    plot(rows, args.out / f"{NAME}.png")


if __name__ == "__main__":
    main()
