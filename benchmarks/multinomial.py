"""The multinomial (softmax) posterior on iris, wine and digits: time and error per method.

The targets of D-015 (docs/decisions.md), measured in one process on the standardized
data at C = 1 (intercepts fitted, the estimators' defaults otherwise):

1. Time of ``fit`` and of ``predict_proba`` on the training rows, per method
   (``LaplaceLogisticRegression``, ``VSLogisticRegression``, ``ISLogisticRegression``,
   ``EPLogisticRegression``: multinomial EP of the (K − 1)-dimensional sites), with
   scikit-learn's ``LogisticRegression(C)`` timed in the same process as the baseline (median
   of ``--rounds`` rounds, each round timing every method once in turn, LR at the default
   BLAS threads and on one BLAS thread: the faster median, as ``_common.LRBaseline``).
2. Error against the long NUTS references of ``nuts_softmax_reference.py`` (iris, wine,
   and classes20: 20 classes, 300 rows × 5 features, where the target is also D-051's):
   KL(reference ‖ method) of the reference's moment-matched Gaussian (its shift directions
   exact: ``nuts_softmax_reference.with_exact_shifts``), over Laplace's (target for VS:
   ≤ 0.1), and the largest difference on any training row between the
   method's ``predict_proba`` and the reference's posterior-predictive average (the average
   of the softmax over the NUTS draws; target ≤ 0.005), next to the reference's own Monte
   Carlo standard error.
3. Digits (10 classes, 650 parameters): ``VSLogisticRegression()`` with its defaults fits
   without a warning within 60 s; its held-out log loss (5-fold, stratified, standardized
   inside a Pipeline) over a grid of C against ``LogisticRegression``'s over the same grid
   (target: best VS within 0.01 of LR's best, or better).

4. Where the digits log loss stands: a short NUTS run on one split against the Laplace
   and EP posteriors' predictives (``digits_nuts_diagnosis``; needs the ``bench`` extra).

Usage: python benchmarks/multinomial.py [--rounds 3] [--out DIR] [--skip-cv] [--skip-nuts]
[--cases ...] [--update] (``--update``: rerun only ``--cases`` and keep the committed report's
other rows and digits sections, e.g. ``--cases classes20 --update``)
Writes DIR/multinomial.{csv,json,md,png}; DIR defaults to benchmarks/results. The full run
(digits' C grid and NUTS diagnosis included) takes about an hour and needs the ``bench``
extra.

Quick check (about 30 s)::

    python benchmarks/multinomial.py --quick

is ``--cases iris wine --rounds 1 --skip-cv --skip-nuts --out results/cache/multinomial_quick``
and compares each method's errors (KL to the reference, over Laplace's, largest probability
gap, strategy) with the committed ``results/multinomial.csv`` and with the last quick run
(``results/cache/multinomial_quick.json``): unchanged numbers show "0 differ" (times are not
compared: they follow the machine's state).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from _common import (
    CACHE,
    RESULTS,
    machine,
    machine_line,
    quick_report,
    read_csv,
    recorded_warnings,
    timed,
    write_csv,
    write_json,
)
from _high_dim_cases import gaussian_kl
from nuts_softmax_reference import classes20, load_reference
from sklearn.datasets import load_digits, load_iris, load_wine
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_validate
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from vsbayes import (
    EPLogisticRegression,
    ISLogisticRegression,
    LaplaceLogisticRegression,
    VSLogisticRegression,
)
from vsbayes.exceptions import MemoryLimitError
from vsbayes.models import softmax_predictive_log_proba
from vsbayes.models.latent import JointLatents

CASES = {"iris": load_iris, "wine": load_wine, "classes20": classes20, "digits": load_digits}
METHODS = {
    "LogisticRegression": lambda C: LogisticRegression(C=C),
    "Laplace": lambda C: LaplaceLogisticRegression(C=C),
    "VS": lambda C: VSLogisticRegression(C=C, random_state=0),
    "IS": lambda C: ISLogisticRegression(C=C, random_state=0),
    "EP": lambda C: EPLogisticRegression(C=C),
}
C_GRID = np.logspace(-3, 3, 7)
TARGETS = {"kl_ratio": 0.1, "proba_gap": 0.005, "digits_seconds": 60.0, "log_loss_gap": 0.01}


def _standardized(case: str):
    X, y = CASES[case](return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _posterior(est):
    mean = np.r_[est.coef_.ravel(), est.intercept_]
    return mean, est.sigma_


def _fit_and_predict(make, X, y):
    """(estimator, proba, fit seconds, predict_proba seconds, warnings) of one fit."""
    fit_s, est, caught = timed(lambda: make(1.0).fit(X, y))
    pred_s, proba, more = timed(lambda: est.predict_proba(X))
    return est, proba, fit_s, pred_s, caught + more


def time_and_error(case: str, rounds: int) -> list[dict]:
    """Every method's row on one case. Each round times every method once in turn, and
    LogisticRegression twice, at the default BLAS threads and on one (threadpoolctl): the
    times are medians over the rounds, LR's the faster setting's (as ``_common.LRBaseline``)."""
    from threadpoolctl import threadpool_limits

    X, y = _standardized(case)
    ref = load_reference(case) if case != "digits" else None
    times = {method: ([], []) for method in METHODS}
    lr_one_thread = ([], [])
    fitted, caught = {}, {}
    failed = {}
    for _ in range(rounds):
        for method, make in METHODS.items():
            if method in failed:
                continue
            try:
                est, proba, fit_s, pred_s, record = _fit_and_predict(make, X, y)
            except (MemoryLimitError, ValueError) as exc:
                # A method refusing the problem before any work (memory, or importance
                # sampling's 'auto' sizing: more work than its limit), recorded as such.
                failed[method] = f"{type(exc).__name__}: {exc}"
                continue
            times[method][0].append(fit_s)
            times[method][1].append(pred_s)
            fitted[method] = (est, proba)
            caught[method] = sorted({f"{w.category.__name__}: {w.message}" for w in record})
            if method == "LogisticRegression":
                with threadpool_limits(limits=1, user_api="blas"):
                    *_, fit_s, pred_s, _ = _fit_and_predict(make, X, y)
                lr_one_thread[0].append(fit_s)
                lr_one_thread[1].append(pred_s)
    median = {
        method: (float(np.median(fit)), float(np.median(pred)))
        for method, (fit, pred) in times.items()
        if fit
    }
    median["LogisticRegression"] = tuple(
        min(default, float(np.median(one)))
        for default, one in zip(median["LogisticRegression"], lr_one_thread, strict=True)
    )
    rows = []
    kl_laplace = None
    if ref is not None:
        mean_ref, cov_ref, proba_ref, diag = ref
        kl_laplace = gaussian_kl(mean_ref, cov_ref, *_posterior(fitted["Laplace"][0]))
    for method in METHODS:
        if method in failed:
            rows.append(_failed_row(case, method, X, y, failed[method]))
            print(rows[-1], flush=True)
            continue
        est, proba = fitted[method]
        row = {
            "case": case,
            "method": method,
            "M": X.shape[0],
            "d": X.shape[1],
            "K": len(np.unique(y)),
            "fit_s": median[method][0],
            "predict_proba_s": median[method][1],
            "fit_ratio_lr": median[method][0] / median["LogisticRegression"][0],
            "predict_ratio_lr": median[method][1] / median["LogisticRegression"][1],
            "strategy": str(getattr(est, "strategy_", [""])[0]),
            "warnings": "; ".join(caught[method]),
            "kl_ref": np.nan,
            "kl_ratio": np.nan,
            "proba_gap": np.nan,
            "proba_gap_rows_over_target": np.nan,
            "ref_proba_mcse_max": np.nan,
        }
        if ref is not None:
            gap = np.abs(proba - proba_ref)
            row["proba_gap"] = float(gap.max())
            row["proba_gap_rows_over_target"] = int((gap.max(axis=1) > TARGETS["proba_gap"]).sum())
            row["ref_proba_mcse_max"] = diag["proba_mcse_max"]
            if method != "LogisticRegression":
                kl = gaussian_kl(mean_ref, cov_ref, *_posterior(est))
                row["kl_ref"] = kl
                row["kl_ratio"] = kl / kl_laplace
        rows.append(row)
        print(
            {
                k: row[k]
                for k in (
                    "case",
                    "method",
                    "fit_s",
                    "predict_proba_s",
                    "kl_ratio",
                    "proba_gap",
                    "strategy",
                )
            },
            flush=True,
        )
    if ref is not None:
        # The best any Gaussian posterior can do: the reference's own moment-matched one.
        k, d = len(np.unique(y)), X.shape[1]
        latent = JointLatents(X, mean_ref[: k * d].reshape(k, d), mean_ref[k * d :], cov_ref)
        proba = np.exp(softmax_predictive_log_proba(*latent(slice(0, len(X)))))
        gap = np.abs(proba - proba_ref)
        row = _failed_row(case, "NUTS moments (Gaussian)", X, y, "")
        row.update(
            kl_ref=0.0,
            kl_ratio=0.0,
            proba_gap=float(gap.max()),
            proba_gap_rows_over_target=int((gap.max(axis=1) > TARGETS["proba_gap"]).sum()),
            ref_proba_mcse_max=diag["proba_mcse_max"],
        )
        rows.append(row)
    return rows


def _failed_row(case, method, X, y, reason) -> dict:
    nan = float("nan")
    return {
        "case": case,
        "method": method,
        "M": X.shape[0],
        "d": X.shape[1],
        "K": len(np.unique(y)),
        "fit_s": nan,
        "predict_proba_s": nan,
        "fit_ratio_lr": nan,
        "predict_ratio_lr": nan,
        "strategy": "",
        "warnings": f"failed: {reason}" if reason else "",
        "kl_ref": nan,
        "kl_ratio": nan,
        "proba_gap": nan,
        "proba_gap_rows_over_target": nan,
        "ref_proba_mcse_max": nan,
    }


def digits_defaults() -> dict:
    X, y = _standardized("digits")
    seconds, est, record = timed(lambda: VSLogisticRegression().fit(X, y))
    return {
        "fit_s": seconds,
        "warnings": sorted({f"{w.category.__name__}: {w.message}" for w in record}),
        "strategy": str(est.strategy_[0]),
        "strategy_reason": est.strategy_reason_[0],
    }


def digits_cv() -> list[dict]:
    X, y = load_digits(return_X_y=True)
    cv = StratifiedKFold(5, shuffle=True, random_state=0)
    rows = []
    for C in C_GRID:
        for method in ("LogisticRegression", "VS"):
            est = make_pipeline(StandardScaler(), METHODS[method](C))
            if method == "LogisticRegression":
                est.set_params(logisticregression__max_iter=10_000)
            start = time.perf_counter()
            with recorded_warnings() as record:
                result = cross_validate(
                    est, X, y, cv=cv, scoring="neg_log_loss", return_estimator=True
                )
            scores = result["test_score"]
            rows.append(
                {
                    "C": float(C),
                    "method": method,
                    "log_loss": float(-scores.mean()),
                    "log_loss_sd": float(scores.std()),
                    "seconds": time.perf_counter() - start,
                    "fit_s_max": float(result["fit_time"].max()),
                    "strategy": ",".join(
                        sorted(
                            {str(getattr(e[-1], "strategy_", [""])[0]) for e in result["estimator"]}
                        )
                    ),
                    "warnings": len(record),
                }
            )
            print(rows[-1], flush=True)
    return rows


def digits_nuts_diagnosis(draws: int = 600) -> dict:
    """Why the Laplace posterior's log loss misses on digits: on one held-out split (80/20,
    stratified, seed 0) at C = 1, the log loss of the posterior predictive of a short NUTS
    run (one chain, Laplace-whitened as in ``nuts_softmax_reference.py``), of the Gaussian
    with the NUTS mean and the Laplace covariance, of the Laplace Gaussian, and of the mode's
    plug-in softmax (= LogisticRegression's)."""
    import jax
    from numpyro.infer import MCMC, NUTS
    from nuts_softmax_reference import potential
    from scipy.special import softmax
    from sklearn.metrics import log_loss
    from sklearn.model_selection import train_test_split

    from vsbayes.approximations import softmax_laplace
    from vsbayes.models import SoftmaxGLMPosterior

    jax.config.update("jax_enable_x64", True)
    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_tr)
    X_tr, X_te = scaler.transform(X_tr), scaler.transform(X_te)
    model = SoftmaxGLMPosterior(
        X_tr, y_tr, np.ones(len(y_tr)), 10, prior_var=1.0, intercept_prior_var=1e6
    )
    laplace = softmax_laplace(model, tol=1e-10)
    root = np.linalg.cholesky(laplace.cov)
    start = time.perf_counter()
    mcmc = MCMC(
        NUTS(potential_fn=potential(model, laplace.mean, root)),
        num_warmup=400,
        num_samples=draws,
        num_chains=1,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), init_params=np.zeros(model.dim))
    seconds = time.perf_counter() - start
    theta = np.asarray(mcmc.get_samples()) @ root.T + laplace.mean
    z = np.random.default_rng(0).standard_normal((2000, model.dim)) @ root.T

    def predictive(draws_):
        W, b = model.split(draws_)
        return softmax(np.einsum("nd,skd->snk", X_te, W) + b[:, None, :], axis=2).mean(axis=0)

    mean = theta.mean(axis=0)
    W, b = model.split(laplace.mean)
    sd = np.sqrt(np.diag(laplace.cov))
    start = time.perf_counter()
    ep = VSLogisticRegression(C=1.0).fit(X_tr, y_tr)  # the multinomial EP on digits
    ep_seconds = time.perf_counter() - start
    return {
        "log_loss_vs": log_loss(y_te, ep.predict_proba(X_te)),
        "vs_strategy": str(ep.strategy_[0]),
        "vs_seconds": ep_seconds,
        "vs_mean_shift_in_sd_median": float(np.median(np.abs(ep.posteriors_[0].mean - mean) / sd)),
        "nuts_draws": draws,
        "nuts_seconds": seconds,
        "log_loss_nuts": log_loss(y_te, predictive(theta)),
        "log_loss_nuts_mean_laplace_cov": log_loss(y_te, predictive(mean + z)),
        "log_loss_laplace": log_loss(y_te, predictive(laplace.mean + z)),
        "log_loss_plug_in": log_loss(y_te, softmax(X_te @ W.T + b, axis=1)),
        "mean_shift_in_sd_median": float(np.median(np.abs(mean - laplace.mean) / sd)),
        "mean_shift_in_sd_max": float(np.max(np.abs(mean - laplace.mean) / sd)),
    }


def digits_cv_nuts(Cs=(1.0, 10.0), draws: int = 500, chains: int = 2) -> list[dict]:
    """Is the log-loss target within reach of the exact posterior at all? Over the folds of
    :func:`digits_cv`, the held-out log loss of the posterior predictive of NUTS runs
    (``chains`` × ``draws`` after as many warm-up draws, Laplace-whitened) and of their
    moment-matched Gaussian, per C; with the runs' largest split R-hat and smallest bulk
    ESS over the parameters."""
    import jax
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
    from numpyro.infer import MCMC, NUTS
    from nuts_softmax_reference import potential
    from scipy.special import softmax
    from sklearn.metrics import log_loss

    from vsbayes.approximations import softmax_laplace
    from vsbayes.models import SoftmaxGLMPosterior

    jax.config.update("jax_enable_x64", True)
    X, y = load_digits(return_X_y=True)
    folds = list(StratifiedKFold(5, shuffle=True, random_state=0).split(X, y))
    rows = []
    for C in Cs:
        for k, (train, test) in enumerate(folds):
            scaler = StandardScaler().fit(X[train])
            X_tr, X_te = scaler.transform(X[train]), scaler.transform(X[test])
            model = SoftmaxGLMPosterior(
                X_tr, y[train], np.ones(len(train)), 10, prior_var=C, intercept_prior_var=1e6
            )
            laplace = softmax_laplace(model, tol=1e-10)
            root = np.linalg.cholesky(laplace.cov)
            start = time.perf_counter()
            mcmc = MCMC(
                NUTS(potential_fn=potential(model, laplace.mean, root)),
                num_warmup=draws,
                num_samples=draws,
                num_chains=chains,
                chain_method="sequential",
                progress_bar=False,
            )
            mcmc.run(jax.random.PRNGKey(k), init_params=np.zeros((chains, model.dim)))
            seconds = time.perf_counter() - start
            z = np.asarray(mcmc.get_samples(group_by_chain=True))
            theta = z.reshape(-1, model.dim) @ root.T + laplace.mean
            # Draws of N(mean, sample covariance) as mixtures of the centred draws (exact
            # even when the covariance is singular).
            centred = (theta - theta.mean(axis=0)) / np.sqrt(len(theta) - 1)
            mixing = np.random.default_rng(k).standard_normal((2000, len(theta)))
            gaussian = mixing @ centred + theta.mean(axis=0)

            def predictive(draws_, X_te=X_te, model=model):
                W, b = model.split(draws_)
                return softmax(np.einsum("nd,skd->snk", X_te, W) + b[:, None, :], axis=2).mean(0)

            rows.append(
                {
                    "C": float(C),
                    "fold": k,
                    "log_loss_nuts": log_loss(y[test], predictive(theta), labels=range(10)),
                    "log_loss_nuts_gaussian": log_loss(
                        y[test], predictive(gaussian), labels=range(10)
                    ),
                    "rhat_max": float(np.max(split_gelman_rubin(z))),
                    "ess_bulk_min": float(np.min(effective_sample_size(z))),
                    "seconds": seconds,
                }
            )
            print(rows[-1], flush=True)
    return rows


def _with_committed(rows, cases):
    """``rows`` with the committed report's rows of the other cases (in CASES' order), and
    the committed report's other sections: ``(defaults, cv_rows, diagnosis, cv_nuts,
    {case: machine line}, the cross-validation's machine line or None)`` for
    :func:`write_report` (the digits NUTS diagnosis kept as the committed Markdown's section
    where the JSON does not hold it)."""
    committed = json.loads((RESULTS / "multinomial.json").read_text())
    others = [r for r in committed["rows"] if r["case"] not in cases]
    order = list(CASES)
    merged = sorted(others + rows, key=lambda r: order.index(r["case"]))
    diagnosis = committed.get("digits_nuts_diagnosis")
    if diagnosis is None:
        text = (RESULTS / "multinomial.md").read_text()
        head = "## Digits: the predictive against a NUTS run"
        if head in text:
            # The heading and its one paragraph: the notes after it describe a run, and
            # write_report writes this run's (kept, they piled up with every update).
            heading, _, paragraph = text[text.index(head) :].split("\n")[:3]
            diagnosis = [heading, "", paragraph, ""]
    # Each kept case's own run: the committed JSON's record of it, else (reports written
    # before that record) the committed note on the kept rows, else the last run's machine.
    machines = committed.get("case_machines", {})
    text = (RESULTS / "multinomial.md").read_text()
    note = re.search(r"from the previous run \((Machine: .*?)\); the other rows", text)
    fallback = note.group(1) if note else machine_line(committed["machine"])
    kept = {r["case"]: machines.get(r["case"], fallback) for r in others}
    return merged, (
        committed.get("digits_defaults"),
        committed.get("digits_cv", []),
        diagnosis,
        committed.get("digits_cv_nuts", []),
        kept,
        committed.get("digits_cv_machine"),
    )


def _fmt(x, spec=".3g") -> str:
    return "—" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def write_report(
    out: Path,
    rows,
    defaults,
    cv_rows,
    diagnosis,
    info,
    cv_nuts=(),
    kept_cases=None,
    cv_machine=None,
) -> None:
    """The report; ``diagnosis`` is the digits NUTS diagnosis (a dict), or its committed
    Markdown lines; ``kept_cases`` maps the cases whose rows are the committed report's to
    that run's machine line; ``cv_machine``: the machine line of the cross-validation's
    run where it is not this run's (rerun by ``--update --cv``, or kept)."""
    write_csv(out / "multinomial.csv", rows)
    write_json(
        out / "multinomial.json",
        {
            "machine": info,
            "targets": TARGETS,
            "rows": rows,
            "case_machines": {
                **dict.fromkeys((r["case"] for r in rows), machine_line(info)),
                **(kept_cases or {}),
            },
            "digits_defaults": defaults,
            "digits_cv": cv_rows,
            "digits_cv_machine": cv_machine,
            "digits_cv_nuts": list(cv_nuts),
            **({"digits_nuts_diagnosis": diagnosis} if isinstance(diagnosis, dict) else {}),
        },
    )
    lines = [
        "# The multinomial posterior: time and error per method on iris, wine, 20 classes "
        "and digits",
        "",
        "Produced by `benchmarks/multinomial.py`. Standardized features, C = 1, intercepts "
        "fitted; times are the medians of the rounds, each round timing every method once in "
        "turn in one process (ratios divide by `LogisticRegression(C=1)` on the same data, "
        "the faster of its default BLAS threads and one BLAS thread). "
        "Error against the NUTS references (`nuts_softmax_reference.py`; their draws "
        "below): KL(reference ‖ method) of the moment-matched Gaussians over Laplace's, the "
        "reference's d + 1 shift directions set to their exact posterior, the prior (their "
        "draws' moments were Monte Carlo error alone: 0.0007 nats on iris, 0.0062 on wine, "
        "D-103) "
        f"(target for VS ≤ {TARGETS['kl_ratio']}; every KL includes the reference's own Monte "
        "Carlo error in the contrasts, given below each reference where recorded; against long "
        "importance sampling 0.0007 nats on iris, 0.0053 on wine: `kl_error_multinomial.md`), "
        "and the largest "
        "|difference| on any training row between "
        "`predict_proba` and the reference's posterior-predictive average (target "
        f"≤ {TARGETS['proba_gap']}; the reference's own Monte Carlo standard error beside it). "
        "The row *NUTS moments (Gaussian)* is the predictive of the reference's own "
        "moment-matched Gaussian: the closest any Gaussian posterior's predictive can be "
        "expected to come (on wine the posterior is far from Gaussian: KL(NUTS ‖ Laplace) "
        "≈ 4 nats). *classes20*: make_classification, 300 rows × 5 features, 20 classes "
        "(15 rows a class, 120 parameters; `nuts_softmax_reference.classes20`).",
        "",
        "| case | method | fit (s) | × LR | predict_proba (s) | × LR | strategy "
        "| KL(ref‖·) | / Laplace's | max proba gap | rows > 0.005 | ref. MCSE |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['method']} | {_fmt(r['fit_s'])} | {_fmt(r['fit_ratio_lr'])} | "
            f"{_fmt(r['predict_proba_s'])} | {_fmt(r['predict_ratio_lr'])} | "
            f"{r['strategy'] or '—'} "
            f"| {_fmt(r['kl_ref'])} | {_fmt(r['kl_ratio'])} | {_fmt(r['proba_gap'])} | "
            f"{_fmt(r['proba_gap_rows_over_target'], '.0f')} | {_fmt(r['ref_proba_mcse_max'])} |"
        )
    references = [(case, load_reference(case)) for case in ("iris", "wine", "classes20")]
    references = [(case, ref[3]) for case, ref in references if ref is not None]
    if references:
        lines += [""] + [
            f"Reference {case}: NumPyro NUTS on the Laplace-whitened coordinates, "
            f"{r['chains']} × {r['draws_per_chain']:,} draws after {r['warmup']:,} warm-up, "
            f"R-hat ≤ {r['rhat_max']:.4f}, bulk ESS ≥ {r['ess_bulk_min']:,.0f}, tail ESS ≥ "
            f"{r['ess_tail_min']:,.0f}, {r['divergences']} divergences, "
            f"{r['mean_leapfrog_steps']:.1f} leapfrog steps per draw, {r['wall_seconds']:.0f} s; "
            f"KL(NUTS ‖ Laplace) {r['kl_nuts_laplace']:.3g} nats"
            + (
                f"; its moment Gaussian's own Monte Carlo error in KL "
                f"{r['moment_kl_noise']:.3g} ± {r['moment_kl_noise_sd']:.2g} nats (batch-means "
                "bootstrap), part of every KL above."
                if "moment_kl_noise" in r
                else "."
            )
            for case, r in references
        ]
    if any(case == "classes20" for case, _ in references):
        lines += [
            "",
            "classes20's first reference, 4 × 5,000 draws, put the default VS (EP) at 0.583 "
            "nats, 0.214 of Laplace's 2.73: about 0.4–0.46 nats of every KL against it was its own "
            "Monte Carlo error, not the methods'. What is left of EP's error (its covariance's "
            "variances some 4–5 % short) and its corrections by importance sampling from EP's "
            "Gaussian, with their costs: `softmax_ep_error.md` (docs/decisions.md D-089).",
        ]
    warned = [f"{r['case']}/{r['method']}: {r['warnings']}" for r in rows if r["warnings"]]
    lines += ["", "Warnings: " + ("; ".join(warned) if warned else "none."), ""]
    if defaults:
        lines += [
            "## Digits with the defaults",
            "",
            f"`VSLogisticRegression().fit` on standardized digits (1797 × 64, 10 classes, "
            f"650 parameters): {defaults['fit_s']:.1f} s (target ≤ "
            f"{TARGETS['digits_seconds']:.0f} s), warnings: "
            f"{'; '.join(defaults['warnings']) or 'none'}; strategy_ "
            f"{defaults['strategy']!r} ({defaults['strategy_reason']}).",
            "",
        ]
    if cv_rows:
        lr = {r["C"]: r for r in cv_rows if r["method"] == "LogisticRegression"}
        vs = {r["C"]: r for r in cv_rows if r["method"] == "VS"}
        best_lr = min(r["log_loss"] for r in lr.values())
        best_vs = min(r["log_loss"] for r in vs.values())
        lines += [
            "## Digits: held-out log loss over C",
            "",
            "5-fold stratified cross-validation (shuffled, seed 0), `StandardScaler` inside the "
            "pipeline; mean log loss over the folds (± their standard deviation).",
            "",
            "| C | LogisticRegression | VSLogisticRegression | VS strategy | VS time, 5 folds (s) "
            "| slowest VS fit (s) | VS warnings |",
            "|---:|---:|---:|---|---:|---:|---:|",
        ]
        for C in sorted(lr):
            lines.append(
                f"| {C:g} | {lr[C]['log_loss']:.4f} ± {lr[C]['log_loss_sd']:.4f} | "
                f"{vs[C]['log_loss']:.4f} ± {vs[C]['log_loss_sd']:.4f} | {vs[C]['strategy']} | "
                f"{vs[C]['seconds']:.1f} | {vs[C]['fit_s_max']:.1f} | {vs[C]['warnings']} |"
            )
        lines += [
            "",
            f"Best: LogisticRegression {best_lr:.4f}, VS {best_vs:.4f} (difference "
            f"{best_vs - best_lr:+.4f}; target ≤ +{TARGETS['log_loss_gap']}).",
            "",
        ]
        if cv_machine:
            lines += [f"This section's run: {cv_machine}", ""]
    if cv_nuts and cv_rows:
        lines += _cv_nuts_lines(cv_rows, cv_nuts)
    if isinstance(diagnosis, list):  # the committed section, kept by --update
        lines += diagnosis
    elif diagnosis:
        lines += [
            "## Digits: the predictive against a NUTS run",
            "",
            "One held-out split (80/20, stratified, seed 0), C = 1: held-out log loss of the "
            f"posterior predictive of a short NUTS run ({diagnosis['nuts_draws']} draws, one "
            f"chain, Laplace-whitened; {diagnosis['nuts_seconds']:.0f} s) "
            f"{diagnosis['log_loss_nuts']:.4f}; of the Gaussian with the NUTS mean and the "
            f"Laplace covariance {diagnosis['log_loss_nuts_mean_laplace_cov']:.4f}; of the "
            f"Laplace Gaussian {diagnosis['log_loss_laplace']:.4f}; of the mode's plug-in "
            f"softmax (LogisticRegression's) {diagnosis['log_loss_plug_in']:.4f}; of "
            f"`VSLogisticRegression(C=1)` {diagnosis['log_loss_vs']:.4f} (strategy "
            f"{diagnosis['vs_strategy']!r}, {diagnosis['vs_seconds']:.0f} s). The posterior "
            "mean lies "
            f"{diagnosis['mean_shift_in_sd_median']:.2f} Laplace standard deviations from the "
            f"mode (median; up to {diagnosis['mean_shift_in_sd_max']:.1f}), and EP's mean "
            f"{diagnosis['vs_mean_shift_in_sd_median']:.2f} from the NUTS mean (median, in "
            "the same units): the Laplace Gaussian, centred at the mode, misses the exact "
            "posterior predictive; EP's Gaussian comes close.",
            "",
        ]
    if kept_cases:
        sections = (
            "the digits sections"
            if "digits" in kept_cases
            else "the digits sections but the defaults' fit (rerun with digits' rows)"
        )
        runs = {}  # the kept cases by the run they come from
        for case, line in kept_cases.items():
            runs.setdefault(line, []).append(case)
        # The digits sections go with digits' rows where kept, else with the first run.
        with_sections = kept_cases.get("digits", next(iter(runs)))
        lines += [
            f"Rows of {', '.join(cases)}"
            + (f" and {sections}" if line == with_sections else "")
            + f": from the previous run ({line}); the other rows: this run's."
            for line, cases in runs.items()
        ] + [""]
    lines += [machine_line(info), ""]
    (out / "multinomial.md").write_text("\n".join(lines))
    _plot(out, rows, cv_rows)


def _cv_nuts_lines(cv_rows, cv_nuts) -> list[str]:
    lr = {r["C"]: r["log_loss"] for r in cv_rows if r["method"] == "LogisticRegression"}
    vs = {r["C"]: r["log_loss"] for r in cv_rows if r["method"] == "VS"}
    lines = [
        "## Digits: the exact posterior predictive on the same folds",
        "",
        "The same 5 folds, the posterior of the same model (prior N(0, C) on the "
        "coefficients, N(0, 1e6) on the intercepts) sampled by NUTS: the mean held-out log "
        "loss of its posterior predictive, and of its moment-matched Gaussian's (the best a "
        "Gaussian posterior can be expected to do).",
        "",
        "| C | LogisticRegression | VSLogisticRegression | NUTS (exact) | NUTS's Gaussian "
        "| R-hat max | bulk ESS min | NUTS s per fold |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    exact = {}
    for C in sorted({r["C"] for r in cv_nuts}):
        runs = [r for r in cv_nuts if r["C"] == C]
        exact[C] = np.mean([r["log_loss_nuts"] for r in runs])
        lines.append(
            f"| {C:g} | {lr.get(C, np.nan):.4f} | {vs.get(C, np.nan):.4f} | {exact[C]:.4f} | "
            f"{np.mean([r['log_loss_nuts_gaussian'] for r in runs]):.4f} | "
            f"{max(r['rhat_max'] for r in runs):.3f} | "
            f"{min(r['ess_bulk_min'] for r in runs):.0f} | "
            f"{np.mean([r['seconds'] for r in runs]):.0f} |"
        )
    best_exact = min(exact.values())
    best_lr = min(lr.values())
    lines += [
        "",
        f"Best over these C: the exact posterior predictive {best_exact:.4f}, "
        f"LogisticRegression {best_lr:.4f} (difference {best_exact - best_lr:+.4f}; the "
        f"target for VS is +{TARGETS['log_loss_gap']}).",
        "",
    ]
    return lines


def _plot(out: Path, rows, cv_rows) -> None:
    fig, axes = plt.subplots(1, 2 if cv_rows else 1, figsize=(11 if cv_rows else 6, 4))
    axes = np.atleast_1d(axes)
    ax = axes[0]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    methods = list(METHODS)
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        values = [
            next(r["fit_s"] for r in rows if r["case"] == c and r["method"] == method)
            for c in cases
        ]
        values = [0.0 if not np.isfinite(v) else v for v in values]
        ax.bar(np.arange(len(cases)) + i * width, values, width, label=method)
    ax.set_xticks(np.arange(len(cases)) + 0.4 - width / 2, cases)
    ax.set_yscale("log")
    ax.set_ylabel("fit time (s)")
    ax.set_title("Fit time at C = 1")
    ax.legend(fontsize=8)
    if cv_rows:
        ax = axes[1]
        for method in ("LogisticRegression", "VS"):
            sub = [r for r in cv_rows if r["method"] == method]
            ax.errorbar(
                [r["C"] for r in sub],
                [r["log_loss"] for r in sub],
                [r["log_loss_sd"] for r in sub],
                marker="o",
                capsize=3,
                label=method,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("C")
        ax.set_ylabel("held-out log loss (5-fold)")
        ax.set_title("Digits")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "multinomial.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--skip-cv", action="store_true")
    parser.add_argument(
        "--skip-nuts", action="store_true", help="skip the digits NUTS diagnosis (needs numpyro)"
    )
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument(
        "--quick", action="store_true", help="iris and wine, compared with the committed CSV"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="rerun only --cases; keep the committed report's other cases and sections",
    )
    parser.add_argument(
        "--cv",
        action="store_true",
        help="with --update: rerun the digits cross-validation over C too (its NUTS rows kept)",
    )
    args = parser.parse_args()
    if args.quick:
        args.cases, args.rounds, args.skip_cv, args.skip_nuts = ["iris", "wine"], 1, True, True
        args.out = CACHE / "multinomial_quick"
    info = machine()
    rows = [row for case in args.cases for row in time_and_error(case, args.rounds)]
    if args.update:
        rows, kept = _with_committed(rows, args.cases)
        args.skip_cv = args.skip_nuts = True
        defaults, cv_rows, diagnosis, cv_nuts, kept_cases, cv_machine = kept
        if args.cv:
            cv_rows, cv_machine = digits_cv(), machine_line(machine())
        if "digits" in args.cases:  # the defaults' fit is digits' own row: rerun it too
            defaults = digits_defaults()
            print(defaults, flush=True)
        write_report(
            args.out, rows, defaults, cv_rows, diagnosis, info, cv_nuts, kept_cases, cv_machine
        )
        return
    defaults = digits_defaults() if "digits" in args.cases else None
    print(defaults, flush=True)
    cv_rows = [] if args.skip_cv else digits_cv()
    diagnosis, cv_nuts = None, []
    if "digits" in args.cases and not args.skip_nuts:
        diagnosis = digits_nuts_diagnosis()
        print(diagnosis, flush=True)
        if cv_rows:
            cv_nuts = digits_cv_nuts()
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, rows, defaults, cv_rows, diagnosis, info, cv_nuts)
    if args.quick:
        quick_report(
            "multinomial",
            rows,
            keys=("case", "method"),
            values=("kl_ref", "kl_ratio", "proba_gap", "proba_gap_rows_over_target", "strategy"),
            committed=read_csv(RESULTS / "multinomial.csv"),
        )


if __name__ == "__main__":
    main()
