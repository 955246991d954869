"""Accuracy and fit time of every estimator on the high-dimension cases, against NUTS.

Cells: every (case, link) of ``_high_dim_cases.cells()`` whose NUTS reference is cached
(``load_reference``; the others are listed as "no reference yet"). Data as ``load_case``,
``C = 1``, ``fit_intercept=True`` (the references' prior). Methods (``--methods``):

* ``laplace``, ``ep`` (the link's EP estimator), ``vb`` (logistic only): deterministic, one
  fit (timed as the median of 3 when a fit takes under ``FAST_SECONDS``);
* ``vs`` (the default, ``strategy="auto"``), ``vs-sites`` (``strategy="sites"``),
  ``vs-global`` (``strategy="global"``), ``is`` (default kernel), ``bmc``: one fit per seed
  (``--seeds``, 3), reported as the median error and the median time over the seeds.
  ``vs-global`` and ``is`` evaluate the likelihood at N = 8n points (n = (p+1)(p+2)/2,
  p = d+1): they are skipped where N·M·p > ``MAX_WORK`` (5e10) as too expensive. BMC is
  skipped for d ≥ 64: its Gaussian process on at most 16384 points cannot fit n parameters.

Error: ``gaussian_kl(reference, fit)`` (nats, KL from the NUTS Gaussian to the method's), and
that KL divided by Laplace's — "error ÷ Laplace's". The reference's own noise floor (from its
summary) bounds what can be resolved. Time: wall time of ``fit`` and its ratio to
``sklearn.linear_model.LogisticRegression(C=1)`` on the same data, timed in the same process
by ``_common.LRBaseline`` (5 fits after a warm-up and one more beside each fit, each at the
default BLAS threads and on one; the faster median). Warnings raised by a fit are recorded
(categories, first message), not printed; an estimator that raises has its error text
recorded and the run goes on.

Every fit is saved in ``results/high_dimension.json`` as it ends; a rerun skips the fits
already there (those that errored are retried; ``--force`` refits), and ``--render-only``
rebuilds the CSV, Markdown and PNG from that JSON.

Usage: python benchmarks/high_dimension.py [--cases breast_cancer digits3] [--links logistic]
           [--methods laplace ep vs] [--seeds 3] [--out DIR] [--force] [--render-only]

The full run takes hours (the d = 500 and sparse d = 2000 cells dominate). Their references
are over 1 MB and so not committed: ``nuts_reference.py --restore`` copies them from the
history into ``results/cache/nuts_reference/`` (or reruns NUTS; see its docstring); without
them those cells are listed as "no reference yet".

Quick check (under a minute on 2 cores)::

    python benchmarks/high_dimension.py --quick

refits every method on breast cancer (both links, seed 0: the committed run's first seed)
into ``results/cache/high_dimension_quick/`` and compares each KL, warning count, fallback and
strategy with the committed ``results/high_dimension.json`` and with the last quick run
(``results/cache/high_dimension_quick.json``): unchanged numbers show "0 differ" (times and
ratios to LR are not compared: they follow the machine's state).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
from _common import (
    CACHE,
    RESULTS,
    LRBaseline,
    fmt,
    machine,
    machine_line,
    quick_report,
    timed,
    warning_summary,
    write_csv,
    write_json,
)
from _high_dim_cases import CASES, cells, gaussian_kl, load_case, load_reference

import vsbayes

NAME = "high_dimension"
C = 1.0
LINKS = ("logistic", "probit")
#: key -> (label, estimator family, extra parameters, seeded)
METHODS = {
    "laplace": ("Laplace", "Laplace", {}, False),
    "ep": ("EP", "EP", {}, False),
    "vs": ("VS default", "VS", {}, True),
    "vs-sites": ("VS sites", "VS", {"strategy": "sites"}, True),
    "vs-global": ("VS global", "VS", {"strategy": "global"}, True),
    "is": ("IS", "IS", {}, True),
    "bmc": ("BMC", "BMC", {}, True),
    "vb": ("VB", "VB", {}, False),
}
#: N·M·p beyond which the methods that evaluate the likelihood at N = 8n points are skipped.
MAX_WORK = 5e10
EXPENSIVE = ("vs-global", "is")
BMC_MAX_D = 64
#: A deterministic fit faster than this is timed as the median of ``DETERMINISTIC_REPEATS``.
FAST_SECONDS = 5.0
DETERMINISTIC_REPEATS = 3
BASELINE_REPEATS = 5
#: The default VS estimators' targets on every cell.
TARGET_ERROR = 0.05
TARGET_RATIO = 30.0
TARGETS_LINE = (
    f"VS defaults: no warning, no fallback, error ≤ {TARGET_ERROR:g} × Laplace's, "
    f"time ≤ {TARGET_RATIO:g} × LR"
)
MARKERS = {"laplace": "s", "ep": "D", "vs": "o", "vs-sites": "v", "vs-global": "^",
           "is": "x", "bmc": "+", "vb": "P"}  # fmt: skip


# --- fitting (shared with strategy_choice.py) ----------------------------------------------


def make_estimator(family: str, link: str, seed: int | None, **params):
    """The vsbayes estimator of one family ("VS", "EP", …) and link."""
    cls = getattr(vsbayes, f"{family}{link.capitalize()}Regression")
    if seed is not None:
        params["random_state"] = seed
    return cls(**params)


def timed_fit(make, X, y, *, repeats: int = 1) -> dict:
    """Fit ``make()`` on (X, y); its posterior Gaussian, fit seconds and diagnostics.

    With ``repeats`` > 1 and a first fit under ``FAST_SECONDS``, the fit is repeated (same
    estimator parameters) and the median time kept. An exception is recorded in ``status``.
    """
    times, estimator, caught = [], None, []
    try:
        for k in range(repeats):
            estimator = make()
            seconds, _, record = timed(lambda estimator=estimator: estimator.fit(X, y))
            times.append(seconds)
            if k == 0:
                caught = record
                if times[0] >= FAST_SECONDS:
                    break
    except Exception as error:  # the package changes under us: record it and go on
        return {"status": f"error: {type(error).__name__}: {error}"}
    mean = np.r_[estimator.coef_.ravel(), estimator.intercept_.ravel()]
    if not estimator.fit_intercept:
        mean = estimator.coef_.ravel()
    fallback = getattr(estimator, "laplace_fallback_", None)
    strategy = getattr(estimator, "strategy_", None)
    reasons = getattr(estimator, "strategy_reason_", None)
    return {
        "status": "ok",
        "seconds": float(np.median(times)),
        "fits": len(times),
        "mean": mean,
        "cov": np.asarray(estimator.sigma_, dtype=float),
        "log_Z": float(estimator.log_marginal_likelihood_value_),
        **warning_summary(caught),
        "fallback": "" if fallback is None else bool(np.any(fallback)),
        "strategy": "" if strategy is None else ",".join(map(str, strategy)),
        "strategy_reason": "" if reasons is None else " | ".join(reasons),
    }


def load_saved(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def run_key(run: dict) -> tuple:
    return run["case"], run["link"], run["method"], run["seed"]


def median_or_nan(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else float("nan")


def summarize_runs(runs: list[dict], error_key: str) -> dict:
    """Median error and time over the seeds of one (cell, method), and the diagnostics."""
    ok = [r for r in runs if r["status"] == "ok"]
    failed = [r for r in runs if r["status"].startswith("error")]
    if not ok:
        status = runs[0]["status"] if runs else "not run"
    else:
        status = "ok" if not failed else f"ok ({len(failed)} of {len(runs)} fits failed)"
    warned = [r for r in ok if r["warnings"]]
    strategies = Counter(s for r in ok for s in r["strategy"].split(",") if s)
    return {
        "status": status,
        "seeds": len(ok),
        "seconds": median_or_nan(r["seconds"] for r in ok),
        "ratio_to_lr": median_or_nan(r.get("ratio_to_lr") for r in ok),
        error_key: median_or_nan(r[error_key] for r in ok),
        "warnings": sum(r["warnings"] for r in ok),
        "warning_categories": ",".join(
            sorted({c for r in warned for c in r["warning_categories"].split(",")})
        ),
        "warning_first": warned[0]["warning_first"] if warned else "",
        # blank for the estimators without a Laplace fallback
        "fallbacks": sum(bool(r["fallback"]) for r in ok)
        if any(r["fallback"] != "" for r in ok)
        else "",
        "strategies": ", ".join(f"{s} ×{k}" for s, k in sorted(strategies.items())),
        "strategy_reason": ok[0]["strategy_reason"] if ok else "",
        "failure": failed[0]["status"] if failed else "",
    }


# --- this benchmark --------------------------------------------------------------------------


def sizes(case: str) -> dict:
    M, d = CASES[case]["shape"]
    p = d + 1
    n = (p + 1) * (p + 2) // 2
    return {"M": M, "d": d, "p": p, "n": n, "N": 8 * n, "work": float(8 * n * M * p)}


def skip_reason(case: str, link: str, method: str) -> str | None:
    s = sizes(case)
    if method == "vb" and link != "logistic":
        return "n/a (logistic only)"
    if method in EXPENSIVE and s["work"] > MAX_WORK:
        return f"skipped: too expensive (N·M·p = {s['work']:.2g} > {MAX_WORK:.0e})"
    if method == "bmc" and s["d"] >= BMC_MAX_D:
        return (
            f"skipped: d ≥ {BMC_MAX_D} (its GP on ≤ 16384 points cannot fit n = {s['n']} "
            f"parameters)"
        )
    return None


def warm_up(specs) -> None:
    """One fit of every (family, link, params, seeded) of ``specs`` on a tiny problem, so
    that first-call costs (lazy imports, caches) are not charged to the first timed fit."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X, y = X[:120, :4], y[:120]
    X = (X - X.mean(0)) / X.std(0)
    for family, link, params, seeded in specs:
        timed_fit(lambda: make_estimator(family, link, 0 if seeded else None, **params), X, y)
    LRBaseline(X, y).time(record=False)


def run(args, saved: dict) -> dict:
    info = machine()
    warm_up(
        (family, link, params, seeded)
        for link in args.links
        for method, (_, family, params, seeded) in METHODS.items()
        if method in args.methods and not (method == "vb" and link != "logistic")
    )
    runs = {run_key(r): r for r in saved.get("runs", [])}
    meta = saved.get("cells", {})
    out = args.out / f"{NAME}.json"

    def save():
        saved.update(
            machine=info,
            args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            cells=meta,
            runs=list(runs.values()),
        )
        write_json(out, saved)

    for case, link in cells():
        if case not in args.cases or link not in args.links:
            continue
        reference = load_reference(case, link)
        cell = f"{case}/{link}"
        if reference is None:
            meta[cell] = {"case": case, "link": link, "reference": False}
            continue
        ref_mean, ref_cov, diagnostics = reference
        meta[cell] = {
            "case": case,
            "link": link,
            "reference": True,
            **sizes(case),
            "noise_floor_nats": diagnostics.get("noise_floor_nats"),
            "kl_nuts_laplace": diagnostics.get("kl_nuts_laplace"),
            **{k: v for k, v in meta.get(cell, {}).items() if k.startswith("lr_")},
        }
        X = y = None
        lr, baseline = None, None
        for method in args.methods:
            if method not in METHODS or skip_reason(case, link, method) == "n/a (logistic only)":
                continue
            label, family, params, seeded = METHODS[method]
            for seed in range(args.seeds) if seeded else [None]:
                key = (case, link, method, seed)
                old = runs.get(key)
                if old and not args.force and not old["status"].startswith("error"):
                    continue
                row = {"case": case, "link": link, "method": method, "label": label,
                       "seed": seed, "commit": info["commit"]}  # fmt: skip
                reason = skip_reason(case, link, method)
                if reason:
                    runs[key] = {**row, "status": reason}
                    continue
                if X is None:
                    X, y = load_case(case)
                    baseline = LRBaseline(X, y, C=C).time(record=False)
                    baseline.time(BASELINE_REPEATS)
                    print(f"{cell}: LogisticRegression(C=1) {baseline.seconds:.3g} s", flush=True)
                # LR is timed again beside every fit, and each ratio takes the medians of all
                # the cell's LR times so far: a few-ms baseline varies 2× with the machine's
                # state (measured 3.9 and 7.9 ms on 1000 × 200), and one median of 5 taken
                # at the start made a whole cell's ratios follow it.
                baseline.time()
                lr = baseline.seconds
                meta[cell]["lr_seconds"] = lr
                fit = timed_fit(
                    lambda family=family, params=params, seed=seed: make_estimator(
                        family, link, seed, C=C, fit_intercept=True, **params
                    ),
                    X,
                    y,
                    repeats=1 if seeded else DETERMINISTIC_REPEATS,
                )
                row["lr_seconds"] = lr
                if fit["status"] == "ok":
                    mean, cov = fit.pop("mean"), fit.pop("cov")
                    fit["kl"] = gaussian_kl(ref_mean, ref_cov, mean, cov)
                    fit["ratio_to_lr"] = fit["seconds"] / lr
                runs[key] = {**row, **fit}
                r = runs[key]
                print(
                    f"{cell} {label} seed={seed}: "
                    + (
                        f"{r['seconds']:.3g} s, KL {r['kl']:.3g}"
                        + (f", {r['strategy']}" if r["strategy"] else "")
                        + (f", {r['warning_first'][:100]}" if r["warnings"] else "")
                        if r["status"] == "ok"
                        else r["status"][:200]
                    ),
                    flush=True,
                )
                save()
        save()
    return saved


def summary_rows(saved: dict) -> list[dict]:
    runs, rows = saved.get("runs", []), []
    for meta in saved.get("cells", {}).values():
        if not meta.get("reference"):
            continue
        mine = [r for r in runs if r["case"] == meta["case"] and r["link"] == meta["link"]]
        laplace = [r for r in mine if r["method"] == "laplace" and r["status"] == "ok"]
        laplace_kl = laplace[0]["kl"] if laplace else meta.get("kl_nuts_laplace")
        for method, (label, *_) in METHODS.items():
            sub = [r for r in mine if r["method"] == method]
            if not sub:
                continue
            s = summarize_runs(sub, "kl")
            rows.append(
                {
                    "case": meta["case"],
                    "link": meta["link"],
                    "M": meta["M"],
                    "d": meta["d"],
                    "method": method,
                    "label": label,
                    **s,
                    "error_ratio": s["kl"] / laplace_kl if laplace_kl else float("nan"),
                    "laplace_kl": laplace_kl,
                    "noise_floor_nats": meta.get("noise_floor_nats"),
                    "lr_seconds": meta.get("lr_seconds"),
                }
            )
    order = {c: k for k, c in enumerate(cells())}
    rows.sort(
        key=lambda r: (order.get((r["case"], r["link"]), 99), list(METHODS).index(r["method"]))
    )
    return rows


def target_checks(row: dict) -> dict:
    """The VS default's targets on one cell: {name: (met, shown value)}."""
    ok = row["status"].startswith("ok")
    return {
        "no warning": (ok and row["warnings"] == 0, str(row["warnings"])),
        "no fallback": (ok and row["fallbacks"] in (0, ""), str(row["fallbacks"])),
        f"error ≤ {TARGET_ERROR:g} × Laplace's": (
            ok and row["error_ratio"] <= TARGET_ERROR,
            fmt(row["error_ratio"]),
        ),
        f"time ≤ {TARGET_RATIO:g} × LR": (
            ok and row["ratio_to_lr"] <= TARGET_RATIO,
            f"{fmt(row['ratio_to_lr'])}×",
        ),
    }


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def markdown(saved: dict, rows: list[dict]) -> str:
    cells_meta = saved.get("cells", {})
    lines = [
        "# High-dimension benchmark: every estimator against NUTS",
        "",
        "Error: `gaussian_kl` — KL(NUTS Gaussian ‖ the method's Gaussian of [w, b]) in nats — "
        "and that KL ÷ Laplace's on the same cell (\"error ÷ Laplace\"). The reference's noise "
        "floor (nats, from its NUTS summary) is the error its finite draws alone would show. "
        "Time: wall time of `fit`, and × LR its ratio to `LogisticRegression(C=1)` timed in "
        "the same process (median of 5, and of one more beside each fit; the faster of its "
        "default BLAS threads and one BLAS thread). Sampling methods: "
        "median over seeds (column `seeds`); "
        "deterministic ones: one fit, timed as the median of 3 when fast. C = 1, intercept; "
        f"N = 8n points for VS global and IS, skipped where N·M·p > {MAX_WORK:.0e}. `warnings`: "
        "warnings raised by the fits (summed over seeds; categories and first message in the "
        "CSV/JSON); `strategy`: what the VS estimators chose (counts over seeds).",
        "",
        machine_line(saved["machine"]) if "machine" in saved else "",
        "",
        "## Targets",
        "",
        f"{TARGETS_LINE}.",
        "",
        "| case | link | " + " | ".join(target_checks(_dummy_row())) + " | all |",
        "|---|---|" + "---|" * (len(target_checks(_dummy_row())) + 1),
    ]
    for row in rows:
        if row["method"] != "vs":
            continue
        checks = target_checks(row)
        lines.append(
            f"| {row['case']} | {row['link']} | "
            + " | ".join(f"{mark(ok)} {value}" for ok, value in checks.values())
            + f" | {mark(all(ok for ok, _ in checks.values()))} |"
        )
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        if not mine:
            continue
        M, d = CASES[case]["shape"]
        lines += ["", f"## {case} ({M} × {d}; {CASES[case]['source']})", ""]
        for link in LINKS:
            meta = cells_meta.get(f"{case}/{link}")
            if meta and meta.get("reference"):
                laplace_kl = next((r["laplace_kl"] for r in mine if r["link"] == link), None)
                lines.append(
                    f"- {link}: LogisticRegression {fmt(meta.get('lr_seconds') or np.nan)} s; "
                    f"Laplace's KL {fmt(laplace_kl or np.nan)} nats; reference noise floor "
                    f"{fmt(meta.get('noise_floor_nats') or np.nan)} nats; N = 8n = "
                    f"{meta['N']}, N·M·p = {meta['work']:.2g}."
                )
        lines += [
            "",
            "| method | link | seeds | time s | × LR | KL nats | error ÷ Laplace | warnings "
            "| fallbacks | strategy | status |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in mine:
            if not r["status"].startswith("ok"):
                lines.append(
                    f"| {r['label']} | {r['link']} | | | | | | | | | {_short(r['status'])} |"
                )
                continue
            warn = f"{r['warnings']} ({r['warning_categories']})" if r["warnings"] else "0"
            status = "ok" if r["status"] == "ok" else f"{r['status']}: {_short(r['failure'])}"
            lines.append(
                f"| {r['label']} | {r['link']} | {r['seeds']} | {fmt(r['seconds'])} | "
                f"{fmt(r['ratio_to_lr'])} | {fmt(r['kl'])} | {fmt(r['error_ratio'])} | {warn} | "
                f"{r['fallbacks']} | {r['strategies']} | {status} |"
            )
        reasons = {r["link"]: r["strategy_reason"] for r in mine if r["method"] == "vs"}
        for link, reason in reasons.items():
            if reason:
                lines.append(f"\nVS default, {link}, first seed's reason: {reason}.")
    missing = [f"{m['case']}/{m['link']}" for m in cells_meta.values() if not m.get("reference")]
    if missing:
        lines += ["", "## No reference yet", "", ", ".join(missing) + "."]
    return "\n".join(lines)


def _dummy_row() -> dict:
    return {"status": "ok", "warnings": 0, "fallbacks": 0, "error_ratio": 0, "ratio_to_lr": 0}


def _short(text: str, limit: int = 160) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [
        r
        for r in rows
        if r["status"].startswith("ok") and np.isfinite(r["error_ratio"]) and r["error_ratio"] > 0
    ]
    cases = [c for c in CASES if any(r["case"] == c for r in ok)]
    if not cases:
        return
    cols = min(3, len(cases))
    nrows = -(-len(cases) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 4.0 * nrows), squeeze=False)
    for ax, case in zip(axes.flat, cases, strict=False):
        for r in (r for r in ok if r["case"] == case):
            k = list(METHODS).index(r["method"])
            filled = r["link"] == "logistic"
            ax.plot(
                r["seconds"],
                r["error_ratio"],
                MARKERS[r["method"]],
                color=f"C{k}",
                markerfacecolor=f"C{k}" if filled else "none",
                markersize=8,
                label=f"{r['label']} ({r['link']})",
            )
        ax.axhline(TARGET_ERROR, color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        M, d = CASES[case]["shape"]
        ax.set_title(f"{case} ({M} × {d})", fontsize=10)
        ax.set_xlabel("fit time [s]")
        ax.set_ylabel("error ÷ Laplace's")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(cases) :]:
        ax.axis("off")
    fig.suptitle(
        "KL to NUTS ÷ Laplace's vs fit time (filled: logistic, open: probit; dotted: "
        f"{TARGET_ERROR:g})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(saved: dict, out: Path) -> str:
    rows = summary_rows(saved)
    if rows:
        write_csv(out / f"{NAME}.csv", rows)
    md = markdown(saved, rows)
    (out / f"{NAME}.md").write_text(md + "\n")
    plot(rows, out / f"{NAME}.png")
    return md


def main() -> None:
    all_cases = list(CASES)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=all_cases, choices=all_cases)
    parser.add_argument("--links", nargs="+", default=list(LINKS), choices=LINKS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the sampling methods")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    parser.add_argument("--force", action="store_true", help="refit the selected fits")
    parser.add_argument("--render-only", action="store_true", help="only redo CSV/MD/PNG")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="breast cancer, seed 0, into results/cache/; compared with the committed run",
    )
    args = parser.parse_args()
    if args.quick:
        args.cases, args.seeds, args.force = ["breast_cancer"], 1, True
        args.out = CACHE / f"{NAME}_quick"
    args.out.mkdir(parents=True, exist_ok=True)
    saved = load_saved(args.out / f"{NAME}.json")
    if not args.render_only:
        saved = run(args, saved)
    print(render(saved, args.out))
    if args.quick:
        quick_report(
            NAME,
            saved["runs"],
            keys=("case", "link", "method", "seed"),
            values=("status", "kl", "warnings", "fallback", "strategy"),
            committed=load_saved(RESULTS / f"{NAME}.json").get("runs", []),
        )


if __name__ == "__main__":
    main()
