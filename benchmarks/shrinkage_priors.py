"""Shrinkage priors (Gaussian, Laplace, Student t, horseshoe) against long NUTS references.

Cells: each prior × dataset of ``_shrinkage_cases`` whose NUTS reference is stored
(``benchmarks/nuts_shrinkage_reference.py``): binary logistic regression on standardized
features, the prior on the coefficients, the intercept N(0, 10⁶). Each vsbayes estimator
(``METHODS``: ``VSLogisticRegression`` at its defaults, ``EPLogisticRegression``,
``LaplaceLogisticRegression``, the Laplace approximation at the mode) is fitted with the
cell's prior through ``prior=`` (the Gaussian: a (mean, variances) pair, N(0, C·I) with C = 1;
the others: ``vsbayes.LaplacePrior``, ``StudentTPrior``, ``HorseshoePrior``).

Accuracy, against the reference's mean and covariance of θ = [w, b]:

* *share*: the coefficients w_j (the intercept apart) whose posterior mean AND sd are both
  within 0.1 reference sd of the reference's (|m − m*| ≤ 0.1 s*, |s − s*| ≤ 0.1 s*);
  target ≥ 95 %; the mean and sd criteria are also reported alone;
* *KL*: the joint error KL(N(reference mean, cov) ‖ the fit's Gaussian) in nats, beside the
  Laplace approximation's (the ``Laplace`` row of the same cell) and the reference's own
  Monte Carlo floor.

Each is the median over the timed fits (``random_state`` 0 … repeats − 1).

Speed:

* *÷ LR*: the median whole-fit time ÷ ``LogisticRegression(penalty="l1", solver="saga",
  C=1)``'s (C = the Laplace scale: the same mode) on the same data, fits interleaved in the
  same process, LR's time the faster of its medians at the default BLAS threads and on one
  (``_common.speed_ratio``); target ≤ 30;
* *÷ NUTS*: default NUTS (NumPyro's defaults, as ``nuts_comparison.py``: 1 chain, diagonal
  mass, target acceptance 0.8, 1000 warm-up steps, 5000 draws, the natural parameterization
  — for the horseshoe the non-centred one, w_j = τ λ_j z_j — started uniformly in [-2, 2],
  JAX compile time excluded; XLA on one thread, and its time the process's CPU time, as
  the vsbayes fit's (one BLAS thread) for this ratio: neither is charged for the waiting on
  a loaded shared machine) measured as ``nuts_comparison.py`` does: the error of the
  moment-matched Gaussian of its first k draws against the reference at its checkpoints,
  the median over ``--nuts-seeds`` runs; the time NUTS needs to reach the estimator's error
  (log-log interpolation on that curve) ÷ the estimator's time: "≥" when NUTS does not
  reach it in 5000 draws (its whole time is used; beside it "≈", the ratio with NUTS's
  sampling time extrapolated to that error by the 1/draws law of a moment Gaussian's Monte
  Carlo KL), "≤" when it is already there at its first checkpoint (100 draws, mostly
  warm-up); target ≥ 100. The NUTS runs are cached in
  ``results/shrinkage_priors/<prior>_<dataset>_seed<s>.json`` (they do not depend on
  vsbayes) and skipped on a rerun.

Outputs: ``results/shrinkage_priors.{csv,json,md,png}`` with the machine line.

Usage (``--check-api`` first: it says which prior classes vsbayes lacks)::

    python benchmarks/shrinkage_priors.py --check-api
    python benchmarks/shrinkage_priors.py                    # every prior with a reference
    python benchmarks/shrinkage_priors.py --priors gaussian  # before the priors exist
    python benchmarks/shrinkage_priors.py --nuts-only        # the default-NUTS runs (bench extra)

``--no-nuts`` skips the NUTS comparison (cached runs are still used in the report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

import _uci
import numpy as np
from _common import (
    RESULTS,
    machine,
    machine_line,
    speed_ratio,
    warning_summary,
    write_csv,
    write_json,
)
from _high_dim_cases import gaussian_kl, n_gaussian_parameters
from _shrinkage_cases import (
    DATASETS,
    PRIOR_CLASSES,
    PRIOR_LABELS,
    PRIORS,
    load_dataset,
    load_reference,
    vsbayes_prior,
)

NAME = "shrinkage_priors"
RUNS_DIR = RESULTS / NAME
METHODS = ("VS", "EP", "Laplace")
ESTIMATORS = {
    "VS": "VSLogisticRegression",
    "EP": "EPLogisticRegression",
    "Laplace": "LaplaceLogisticRegression",
}
#: The baseline: LogisticRegression's L1 fit at C = the Laplace prior's scale.
LR_PARAMS = {"penalty": "l1", "solver": "saga", "C": PRIORS["laplace"]["scale"]}
#: The horseshoe's density is infinite at 0: it has no mode, so no Laplace approximation
#: (``LaplaceLogisticRegression`` refuses it, naming the estimators that fit it).
NO_MODE = ("horseshoe",)
TOLERANCE_SD = 0.1
TARGET_SHARE = 0.95
TARGET_LR_RATIO = 30.0
TARGET_NUTS_RATIO = 100.0
#: Default NUTS as ``nuts_comparison.py`` runs it.
NUTS_WARMUP = 1000
NUTS_DRAWS = 5000
NUTS_CHECKPOINTS = (100, 200, 500, 1000, 2000, 5000)


# --- the API the priors need -------------------------------------------------------------


def methods_for(prior: str) -> tuple[str, ...]:
    """The methods fitted under ``prior``: all but the Laplace approximation where the prior
    has no mode."""
    return tuple(m for m in METHODS if not (m == "Laplace" and prior in NO_MODE))


def missing_api(priors) -> list[str]:
    """What vsbayes lacks for ``priors``: one message per missing class or refused fit."""
    import vsbayes

    problems = []
    for prior in priors:
        name = PRIOR_CLASSES[prior]
        if name is not None and not hasattr(vsbayes, name):
            problems.append(f"vsbayes.{name} (the {prior} prior) does not exist")
    if problems:
        return problems
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    y = (X[:, 0] + rng.standard_normal(40) > 0).astype(int)
    for prior in priors:
        for method in methods_for(prior):
            cls = getattr(vsbayes, ESTIMATORS[method])
            try:
                cls(prior=vsbayes_prior(prior, 4), random_state=0).fit(X, y)
            except Exception as error:  # any refusal: reported, the benchmark cannot run it
                problems.append(
                    f"{ESTIMATORS[method]}(prior=<{prior}>) fails on a 40 × 3 problem: "
                    f"{type(error).__name__}: {error}"
                )
    return problems


def check_api(priors) -> None:
    """Exit with a message naming what is missing, if anything is."""
    problems = missing_api(priors)
    if problems:
        sys.exit(
            "The shrinkage-prior benchmark needs vsbayes.LaplacePrior(scale), "
            "StudentTPrior(df, scale) and HorseshoePrior(global_scale), accepted as prior= by "
            "VSLogisticRegression, EPLogisticRegression and LaplaceLogisticRegression:\n  - "
            + "\n  - ".join(problems)
            + "\nMerge the priors' branch first, or run only the Gaussian rows: "
            "--priors gaussian."
        )
    print(f"API check passed for the priors {', '.join(priors)}.")


# --- accuracy -----------------------------------------------------------------------------


def accuracy(mean_ref, cov_ref, mean, cov) -> dict:
    """The shares of coefficients within ``TOLERANCE_SD`` reference sd, and the joint KL."""
    d = len(mean_ref) - 1  # the intercept is last and not a coefficient
    sd_ref = np.sqrt(np.diag(cov_ref))[:d]
    mean_gap = np.abs(np.asarray(mean)[:d] - mean_ref[:d]) / sd_ref
    sd_gap = np.abs(np.sqrt(np.diag(cov))[:d] - sd_ref) / sd_ref
    return {
        "share": float(np.mean((mean_gap <= TOLERANCE_SD) & (sd_gap <= TOLERANCE_SD))),
        "share_mean": float(np.mean(mean_gap <= TOLERANCE_SD)),
        "share_sd": float(np.mean(sd_gap <= TOLERANCE_SD)),
        "max_mean_gap_sd": float(mean_gap.max()),
        "max_sd_gap": float(sd_gap.max()),
        "kl": gaussian_kl(mean_ref, cov_ref, mean, cov),
    }


# --- default NUTS, as nuts_comparison.py measures it ----------------------------------------


def nuts_path(prior: str, dataset: str, seed: int):
    return RUNS_DIR / f"{prior}_{dataset}_seed{seed}.json"


def nuts_run(prior: str, dataset: str, seed: int, data_dir) -> dict:
    """One default-NUTS run: errors and compile-free times at the checkpoints."""
    import jax
    import numpyro
    from numpyro.infer import MCMC, NUTS
    from nuts_comparison import _SPANS, _union_seconds
    from nuts_reference import signed_design
    from nuts_shrinkage_reference import horseshoe_parts, whitened_potential

    mean_ref, cov_ref, _ = load_reference(prior, dataset)
    X, y = load_dataset(dataset, data_dir)
    A = signed_design(X, y)
    dim = A.shape[1]
    if prior == "horseshoe":  # what a user writes: the non-centred horseshoe
        fn, theta_of = horseshoe_parts(A, 0.0, 1.0)
        n_par = 2 * (dim - 1) + 1
    else:
        fn, theta_of = whitened_potential(A, prior, np.zeros(dim), np.eye(dim)), None
        n_par = dim
    mcmc = MCMC(
        NUTS(potential_fn=fn),
        num_warmup=NUTS_WARMUP,
        num_samples=NUTS_DRAWS,
        num_chains=1,
        progress_bar=False,
    )
    stream = zlib.crc32(f"{prior}/{dataset}/default".encode())
    init = np.random.default_rng([stream, seed]).uniform(-2.0, 2.0, size=n_par)
    warm_key, sample_key = jax.random.split(jax.random.PRNGKey(stream % 2**31 + seed))
    _SPANS.clear()
    w0, t0, c0 = time.time(), time.perf_counter(), time.process_time()
    mcmc.warmup(warm_key, init_params=init)
    jax.block_until_ready(mcmc.post_warmup_state)
    w1, t1, c1 = time.time(), time.perf_counter(), time.process_time()
    mcmc.run(sample_key, extra_fields=("num_steps", "diverging"))
    q = np.asarray(jax.block_until_ready(mcmc.get_samples()))
    w2, t2, c2 = time.time(), time.perf_counter(), time.process_time()
    compile_warmup = _union_seconds(_SPANS, w0, w1)
    compile_sampling = _union_seconds(_SPANS, w1, w2)
    warmup_wall = (t1 - t0) - compile_warmup
    sampling_wall = (t2 - t1) - compile_sampling
    # NUTS's time is its CPU time (one XLA thread: its compute, whatever else the shared
    # machine runs), the compile's share of each phase's wall time removed from it.
    warmup_s = (c1 - c0) * warmup_wall / (t1 - t0)
    sampling_s = (c2 - c1) * sampling_wall / (t2 - t1)
    theta = np.asarray(theta_of(q)) if theta_of is not None else q
    extra = mcmc.get_extra_fields()
    steps = np.asarray(extra["num_steps"], dtype=float)
    cumulative = np.cumsum(steps)
    checkpoints = []
    for k in NUTS_CHECKPOINTS:
        draws = theta[:k]
        try:
            error = gaussian_kl(mean_ref, cov_ref, draws.mean(axis=0), np.cov(draws, rowvar=False))
        except np.linalg.LinAlgError:
            error = float("inf")
        checkpoints.append(
            {
                "draws": k,
                "seconds": warmup_s + sampling_s * cumulative[k - 1] / cumulative[-1],
                "error": error,
            }
        )
    return {
        "prior": prior,
        "dataset": dataset,
        "seed": seed,
        "warmup": NUTS_WARMUP,
        "draws": NUTS_DRAWS,
        "warmup_seconds": warmup_s,
        "sampling_seconds": sampling_s,
        "warmup_wall_seconds": warmup_wall,
        "sampling_wall_seconds": sampling_wall,
        "time": "CPU",
        "compile_seconds": compile_warmup + compile_sampling,
        "mean_leapfrog_steps": float(steps.mean()),
        "divergences": int(np.asarray(extra["diverging"]).sum()),
        "checkpoints": checkpoints,
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "machine": machine(),
    }


def run_nuts(cells, seeds: int, data_dir) -> None:
    """The default-NUTS runs not cached yet, seed by seed (a stopped run leaves whole seeds);
    JAX is imported only if one is missing."""
    missing = [
        (seed, prior, dataset)
        for seed in range(seeds)
        for prior, dataset in cells
        if not nuts_path(prior, dataset, seed).is_file()
    ]
    if not missing:
        return
    import jax
    from nuts_comparison import _listen_to_compilation

    jax.config.update("jax_enable_x64", True)
    _listen_to_compilation()
    for seed, prior, dataset in missing:
        path = nuts_path(prior, dataset, seed)
        run = nuts_run(prior, dataset, seed, data_dir)
        write_json(path, run)
        last = run["checkpoints"][-1]
        print(
            f"NUTS {prior}/{dataset} seed {seed}: warm-up {run['warmup_seconds']:.1f} s, "
            f"sampling {run['sampling_seconds']:.1f} s, {run['mean_leapfrog_steps']:.0f} "
            f"steps/draw, {run['divergences']} divergences; KL at {last['draws']} draws "
            f"{last['error']:.3g}",
            flush=True,
        )


def load_nuts(prior: str, dataset: str) -> list[dict]:
    return [
        json.loads(path.read_text())
        for path in sorted(RUNS_DIR.glob(f"{prior}_{dataset}_seed*.json"))
    ]


def nuts_curve(runs: list[dict]) -> list[dict]:
    """Median error and time over the seeds, per checkpoint (no runs: empty)."""
    if not runs:
        return []
    return [
        {
            "draws": k,
            "error": float(np.median([r["checkpoints"][j]["error"] for r in runs])),
            "seconds": float(np.median([r["checkpoints"][j]["seconds"] for r in runs])),
            "warmup_seconds": float(np.median([r["warmup_seconds"] for r in runs])),
        }
        for j, k in enumerate(NUTS_CHECKPOINTS)
    ]


def nuts_time_to(level: float, curve: list[dict]) -> tuple[float | None, str]:
    """(NUTS seconds to reach the error ``level``, its bound): "=" interpolated log-log,
    "≥" never reached (the whole run's time), "≤" reached at the first checkpoint."""
    if not curve or not np.isfinite(level):
        return None, ""
    for i, point in enumerate(curve):
        if point["error"] <= level:
            if i == 0:
                return point["seconds"], "≤"
            prev = curve[i - 1]
            if not np.isfinite(prev["error"]):
                return point["seconds"], "≤"
            x0, x1 = np.log(prev["error"]), np.log(point["error"])
            y0, y1 = np.log(prev["seconds"]), np.log(point["seconds"])
            if x1 == x0:
                return point["seconds"], "="
            return float(np.exp(y0 + (np.log(level) - x0) * (y1 - y0) / (x1 - x0))), "="
    return curve[-1]["seconds"], "≥"


# --- the vsbayes fits -------------------------------------------------------------------------


def run_cell(prior: str, dataset: str, args) -> list[dict]:
    import vsbayes

    mean_ref, cov_ref, diag = load_reference(prior, dataset)
    X, y = load_dataset(dataset, args.data_dir)
    dim = X.shape[1] + 1
    spec = vsbayes_prior(prior, dim)
    floor = n_gaussian_parameters(dim) / (2 * diag["ess_bulk_min"])
    rows = []
    for method in methods_for(prior):
        cls = getattr(vsbayes, ESTIMATORS[method])
        fitted, cpu = [], []

        def fit(k, cls=cls, fitted=fitted, cpu=cpu):
            start = time.process_time()
            estimator = cls(prior=spec, random_state=k).fit(X, y)
            cpu.append(time.process_time() - start)
            fitted.append(estimator)
            return estimator

        timing = speed_ratio(fit, X, y, repeats=args.repeats, **LR_PARAMS)
        timed_fits = fitted[1:]  # the first is the untimed warm-up
        scores = [
            accuracy(mean_ref, cov_ref, e.posteriors_[0].mean, e.posteriors_[0].cov)
            for e in timed_fits
        ]
        row = {
            "prior": prior,
            "dataset": dataset,
            "method": method,
            "estimator": ESTIMATORS[method],
            "M": X.shape[0],
            "d": X.shape[1],
            **{key: float(np.median([s[key] for s in scores])) for key in scores[0]},
            "kl_worst": float(max(s["kl"] for s in scores)),
            "share_worst": float(min(s["share"] for s in scores)),
            "reference_floor_nats": floor,
            "seconds": timing["seconds"],
            "cpu_seconds": float(np.median(cpu[1:])),
            "lr_seconds": timing["lr_seconds"],
            "lr_ratio": timing["ratio"],
            "fallbacks": int(
                sum(bool(np.any(getattr(e, "laplace_fallback_", False))) for e in timed_fits)
            ),
            "strategy": str(getattr(timed_fits[-1], "strategy_", "") or ""),
            **warning_summary(timing["warnings"]),
        }
        rows.append(row)
        print(
            f"{prior}/{dataset} {method}: share {row['share']:.0%} (mean {row['share_mean']:.0%}"
            f", sd {row['share_sd']:.0%}), KL {row['kl']:.3g}, {row['seconds'] * 1e3:.1f} ms = "
            f"{row['lr_ratio']:.2g} × LR",
            flush=True,
        )
    laplace_kl = next((r["kl"] for r in rows if r["method"] == "Laplace"), float("nan"))
    curve = nuts_curve(load_nuts(prior, dataset))
    for row in rows:
        row["laplace_kl"] = laplace_kl
        row["kl_over_laplace"] = row["kl"] / laplace_kl if laplace_kl > 0 else float("nan")
        add_nuts(row, curve)
    return rows


def add_nuts(row: dict, curve: list[dict]) -> None:
    """The NUTS columns of one row from the cell's NUTS curve (none: empty)."""
    seconds, bound = nuts_time_to(row["kl"], curve)
    row["nuts_seconds_to_error"] = seconds
    row["nuts_bound"] = bound
    # CPU time against CPU time: both single-threaded, neither charged for a loaded machine
    row["nuts_ratio"] = seconds / row["cpu_seconds"] if seconds is not None else None
    row["nuts_best_kl"] = curve[-1]["error"] if curve else None
    row["nuts_seconds"] = curve[-1]["seconds"] if curve else None
    # Not reached in 5000 draws: the Monte Carlo KL of a moment-matched Gaussian falls as
    # 1/draws, so NUTS needs about (KL at 5000 / the level) times its sampling time.
    row["nuts_ratio_extrapolated"] = None
    if bound == "≥" and row["kl"] > 0:
        last = curve[-1]
        sampling = last["seconds"] - last["warmup_seconds"]
        extrapolated = last["warmup_seconds"] + sampling * last["error"] / row["kl"]
        row["nuts_ratio_extrapolated"] = extrapolated / row["cpu_seconds"]


# --- report -------------------------------------------------------------------------------------


def _num(x, spec=".3g") -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "—"
    if not np.isfinite(x):
        return "∞"
    return format(x, spec)


def _nuts_cell(row: dict) -> str:
    if row.get("nuts_ratio") is None:
        return "—"
    text = f"{row['nuts_bound'] if row['nuts_bound'] != '=' else ''}{row['nuts_ratio']:.3g}"
    if row.get("nuts_ratio_extrapolated") is not None:
        text += f" (≈{row['nuts_ratio_extrapolated']:.3g})"
    return text


def markdown(rows: list[dict], info: dict, skipped: list[str]) -> str:
    lines = [
        "# Shrinkage priors against NUTS",
        "",
        "Produced by `benchmarks/shrinkage_priors.py` (its docstring has the details; the "
        "references' diagnostics are in `results/nuts_reference/shrinkage/summary.md`). "
        "Binary logistic regression on standardized features, the prior on the "
        "coefficients, intercept N(0, 10⁶). *share*: coefficients whose posterior mean and sd "
        "are both within 0.1 reference sd of NUTS's (target ≥ 95 %); *mean*, *sd*: each "
        "criterion alone; *KL*: KL(NUTS moment Gaussian ‖ fit) in nats; *÷ Laplace*: KL ÷ the "
        "Laplace approximation's at the mode (the Laplace row); *floor*: the reference's own "
        "Monte Carlo noise, n/(2 ESS) nats. Medians over the timed fits; *ms*: wall time, "
        "*CPU ms*: the process's CPU time of the fit. *÷ LR*: wall time ÷ "
        '`LogisticRegression(penalty="l1", solver="saga", C=1)`\'s, interleaved in the same '
        "process (target ≤ 30); *÷ NUTS*: default NUTS's CPU time to the same KL ÷ the fit's "
        "(target ≥ 100; ≥: NUTS does not reach it in 5000 draws, and in parentheses the ratio "
        "with NUTS's sampling time extrapolated to that KL by its 1/draws law; ≤: NUTS is "
        "already there at 100 draws). *route*: VS's ``strategy_`` (sites: EP's fit kept; "
        "global: the global VS fit with the prior's exact log-density, which the default "
        "runs under a heavy-tailed prior where EP's coefficient sites drop more than 0.5 "
        "nats of their tilted densities and the fit can see the posterior's mass).",
        "",
        "| prior | dataset | d | method | route | share | mean | sd | KL | ÷ Laplace | floor "
        "| ms | CPU ms | ÷ LR | ÷ NUTS | fallbacks | warnings |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        route = r["strategy"].strip("[]'") if r["method"] == "VS" else ""
        lines.append(
            f"| {PRIOR_LABELS[r['prior']]} | {r['dataset']} | {r['d']} | {r['method']} | "
            f"{route} | "
            f"{r['share']:.0%} | {r['share_mean']:.0%} | {r['share_sd']:.0%} | "
            f"{_num(r['kl'])} | {_num(r['kl_over_laplace'])} | "
            f"{_num(r['reference_floor_nats'], '.2g')} | {r['seconds'] * 1e3:.3g} | "
            f"{r['cpu_seconds'] * 1e3:.3g} | "
            f"{r['lr_ratio']:.3g} | {_nuts_cell(r)} | {r['fallbacks']} | {r['warnings']} |"
        )
    vs = [r for r in rows if r["method"] == "VS"]
    missed_share = [f"{r['prior']}/{r['dataset']} ({r['share']:.0%})" for r in vs
                    if r["share"] < TARGET_SHARE]  # fmt: skip
    missed_lr = [f"{r['prior']}/{r['dataset']} ({r['lr_ratio']:.3g}×)" for r in vs
                 if r["lr_ratio"] > TARGET_LR_RATIO]  # fmt: skip
    slow = [r for r in vs if r["nuts_ratio"] is not None and r["nuts_ratio"] < TARGET_NUTS_RATIO]
    # a lower bound under the target whose extrapolation meets it: met, by extrapolation
    by_extrapolation = [
        r for r in slow if (r["nuts_ratio_extrapolated"] or 0.0) >= TARGET_NUTS_RATIO
    ]
    missed_nuts = [
        f"{r['prior']}/{r['dataset']} ({_nuts_cell(r)})" for r in slow if r not in by_extrapolation
    ]
    no_nuts = [f"{r['prior']}/{r['dataset']}" for r in vs if r["nuts_ratio"] is None]
    lines += [
        "",
        f"VSLogisticRegression (default): share ≥ 95 % on {len(vs) - len(missed_share)} of "
        f"{len(vs)} cells"
        + (f"; not on {', '.join(missed_share)}" if missed_share else "")
        + f". Within 30× of LR on {len(vs) - len(missed_lr)} of {len(vs)}"
        + (f"; not on {', '.join(missed_lr)}" if missed_lr else "")
        + f". ≥ 100× faster than default NUTS on {len(vs) - len(missed_nuts) - len(no_nuts)} "
        f"of {len(vs) - len(no_nuts)} cells with NUTS runs"
        + (
            f" ({len(by_extrapolation)} of them by the extrapolated NUTS time)"
            if by_extrapolation
            else ""
        )
        + (f"; not on {', '.join(missed_nuts)}" if missed_nuts else "")
        + (f"; no NUTS runs for {', '.join(no_nuts)}" if no_nuts else "")
        + ".",
    ]
    kept = [f"{r['prior']}/{r['dataset']}" for r in vs
            if r["prior"] == "horseshoe" and "sites" in r["strategy"]]  # fmt: skip
    if kept:
        lines += [
            "",
            f"Horseshoe ({', '.join(kept)}): VS keeps EP's fit. The reference's moment "
            "Gaussian is itself a Gaussian (share 100 %, KL 0 by construction), so a Gaussian "
            "can represent what the benchmark asks; what no Gaussian-kernel sampler can do is "
            "find it: the posterior is a spike at 0 with heavy tails on every coefficient, "
            "EP's coefficient sites drop 8-45 nats of their tilted densities, which bounds "
            "the effective sample size of N draws from any Gaussian kernel by N·exp(-8…-45) "
            "(the reference's importance-sampling cross-check: ESS 2-18 of 10⁵ Student-t "
            "draws), and the global VS fit and IS are discarded as unreliable there "
            "(measured at 32n: ESS 1-10; on sparse_d200 the global fit is beyond the work "
            "limit in any case). EP's error on these cells is its own (docs/decisions.md "
            "D-070): its sites' tilted moments are exact to 1e-11 at the fits' cavities; "
            "parallel and sequential schedules reach the same fixed point (unique on wpbc), "
            "power EP (α = 0.5) is drawn into the spike, and on breast cancer no schedule "
            "reaches a fixed point with signed sites (what runs is the fallback with "
            "non-negative ones, with a warning); NUTS's draws there show a mode for each "
            "choice of the collinear features that carry an effect, which EP's one Gaussian "
            "cavity per coefficient cannot follow.",
        ]
    if skipped:
        lines += ["", "Not run: " + "; ".join(skipped) + "."]
    lines += ["", machine_line(info), ""]
    return "\n".join(lines)


def figure(rows: list[dict], path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[plot]'): no figure")
        return
    cells = list(dict.fromkeys((r["prior"], r["dataset"]) for r in rows))
    labels = [f"{p}\n{d}" for p, d in cells]
    x = np.arange(len(cells))
    # EP open and larger: VS's default often is EP's fit (its sites strategy), drawn on top
    markers = {"VS": ("o", "C0"), "EP": ("s", "C1"), "Laplace": ("^", "C3")}
    style = {"VS": {}, "EP": {"mfc": "none", "ms": 9}, "Laplace": {}}
    fig, axes = plt.subplots(1, 3, figsize=(max(10, 1.1 * len(cells) + 6), 4.2))
    for method, (marker, color) in markers.items():
        mine = {(r["prior"], r["dataset"]): r for r in rows if r["method"] == method}
        share = [mine[c]["share"] * 100 if c in mine else np.nan for c in cells]
        kl = [mine[c]["kl"] if c in mine else np.nan for c in cells]
        axes[0].plot(x, share, marker, color=color, label=method, **style[method])
        axes[1].plot(x, kl, marker, color=color, label=method, **style[method])
        axes[2].plot(
            [mine[c]["lr_ratio"] for c in cells if c in mine],
            [mine[c]["kl"] for c in cells if c in mine],
            marker, color=color, label=method, **style[method],
        )  # fmt: skip
    floor = {(r["prior"], r["dataset"]): r["reference_floor_nats"] for r in rows}
    axes[1].plot(x, [floor[c] for c in cells], "_", color="0.5", ms=14, label="NUTS floor")
    axes[0].axhline(TARGET_SHARE * 100, color="0.5", ls=":", lw=1)
    axes[0].set_ylabel("% coefficients, mean and sd within 0.1 sd")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("KL(NUTS ‖ fit), nats")
    for ax in axes[:2]:
        ax.set_xticks(x, labels, fontsize=7, rotation=60)
        ax.grid(True, alpha=0.3)
    axes[2].axvline(TARGET_LR_RATIO, color="0.5", ls=":", lw=1)
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("time ÷ L1 LogisticRegression's (saga)")
    axes[2].set_ylabel("KL(NUTS ‖ fit), nats")
    axes[2].grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Shrinkage priors: accuracy against NUTS and time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--priors", nargs="+", default=list(PRIORS), choices=list(PRIORS))
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--data-dir", default=str(_uci.DEFAULT_DATA_DIR))
    parser.add_argument("--repeats", type=int, default=5, help="timed fits per method")
    parser.add_argument("--nuts-seeds", type=int, default=3, help="default-NUTS runs per cell")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check-api", action="store_true", help="only check vsbayes' priors")
    mode.add_argument("--nuts-only", action="store_true", help="only the missing NUTS runs")
    mode.add_argument("--no-nuts", action="store_true", help="no new NUTS runs")
    args = parser.parse_args()
    if args.check_api:
        check_api(args.priors)
        return
    cells, skipped = [], []
    for prior in args.priors:
        for dataset in args.datasets:
            if load_reference(prior, dataset) is None:
                skipped.append(f"{prior}/{dataset} (no NUTS reference)")
            else:
                cells.append((prior, dataset))
    if not args.nuts_only:  # before the NUTS runs: a missing prior fails in seconds
        check_api(args.priors)
    if not args.no_nuts:
        run_nuts(cells, args.nuts_seeds, args.data_dir)
    if args.nuts_only:
        return
    rows = []
    for prior, dataset in cells:
        rows += run_cell(prior, dataset, args)
    if not rows:
        print("nothing to report: no cell has a reference")
        return
    info = machine()
    write_csv(RESULTS / f"{NAME}.csv", rows)
    write_json(RESULTS / f"{NAME}.json", {"machine": info, "skipped": skipped, "rows": rows})
    text = markdown(rows, info, skipped)
    (RESULTS / f"{NAME}.md").write_text(text)
    figure(rows, RESULTS / f"{NAME}.png")
    print(text)


if __name__ == "__main__":
    main()
