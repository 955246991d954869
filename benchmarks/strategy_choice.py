"""Does the VS estimators' ``strategy="auto"`` choose well? VS default against EP.

The target: the default VS estimators' median error ≤ the EP estimator's of the same link,
at ≤ 10× its time. Cells:

* the paper's four UCI datasets (``_uci.load(name, --data-dir)``, prepared as the paper)
  × {logistic, probit}: ``C = 1e5``, ``fit_intercept=False``; ground truth the cached
  importance-sampling truths of ``results/paper_truth.json`` (``paper_reproduction.py``);
  error the paper's excess KL ``vsbayes.excess_kl(truth, fit)`` (mean, covariance and
  evidence), truth noise floor n/(2·ESS);
* breast cancer (``_high_dim_cases.load_case``: standardized, intercept, ``C = 1``)
  × {logistic, probit}: truth the NUTS reference (``load_reference``); error
  ``gaussian_kl`` (the reference has no evidence), noise floor from its summary.

Methods: the link's EP estimator and Laplace (deterministic: one fit, timed as the median of
3), and over ``--seeds`` (10) seeds: VS default (``strategy="auto"``; the strategies chosen
are counted), VS ``strategy="global"`` with ``kernel="ep"`` and with ``kernel="laplace"``,
VS ``strategy="sites"``. Median error and median fit time over the seeds; times also as
ratios to EP's and to ``LogisticRegression`` (same C and intercept) timed in the same
process by ``_common.LRBaseline`` (5 fits, then one beside each fit). A cell whose data or
truth is absent is skipped with the reason.

Every fit is saved in ``results/strategy_choice.json`` as it ends; a rerun skips those already
there (errors are retried; ``--force`` refits) and ``--render-only`` rebuilds the CSV and
Markdown from it.

Usage: python benchmarks/strategy_choice.py [--datasets ionosphere breast_cancer]
           [--links probit] [--seeds 10] [--data-dir DIR] [--out DIR] [--force] [--render-only]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _uci
import numpy as np
from _common import RESULTS, LRBaseline, fmt, machine, machine_line, write_csv, write_json
from _high_dim_cases import gaussian_kl, load_case, load_reference
from high_dimension import (
    BASELINE_REPEATS,
    DETERMINISTIC_REPEATS,
    _short,
    load_saved,
    make_estimator,
    mark,
    run_key,
    summarize_runs,
    timed_fit,
    warm_up,
)

from vsbayes import Gaussian, excess_kl
from vsbayes.estimators._strategy import DEFAULT_TARGET_KL

NAME = "strategy_choice"
LINKS = ("logistic", "probit")
PAPER_DATASETS = tuple(_uci.DATASETS)
DATASETS = (*PAPER_DATASETS, "breast_cancer")
TRUTH = RESULTS / "paper_truth.json"
#: key -> (label, estimator family, extra parameters, seeded)
METHODS = {
    "laplace": ("Laplace", "Laplace", {}, False),
    "ep": ("EP", "EP", {}, False),
    "vs": ("VS default", "VS", {}, True),
    "vs-global-ep": ("VS global, EP kernel", "VS", {"strategy": "global", "kernel": "ep"}, True),
    "vs-global-laplace": (
        "VS global, Laplace kernel",
        "VS",
        {"strategy": "global", "kernel": "laplace"},
        True,
    ),
    "vs-sites": ("VS sites", "VS", {"strategy": "sites"}, True),
}
TARGET_TIME_RATIO = 10.0
TARGET = (
    "the default VS estimators' median error ≤ the EP estimator's of the same link, "
    f"at ≤ {TARGET_TIME_RATIO:g}× its time; or, where the default stopped at the "
    "corrected Laplace approximation because its predicted error was within the default "
    f"target_kl ({DEFAULT_TARGET_KL:g} nats, docs/decisions.md D-046), a measured error "
    "within that target (✓ target_kl)"
)


def prepare(dataset: str, link: str, data_dir: Path):
    """(X, y, settings, error function, noise floor) of one cell, or a skip reason (str)."""
    if dataset in PAPER_DATASETS:
        try:
            X, y = _uci.load(dataset, data_dir)
        except FileNotFoundError as error:
            return f"skipped: data absent ({error})"
        truths = json.loads(TRUTH.read_text()) if TRUTH.is_file() else {}
        entry = truths.get(f"{dataset}/{link}")
        if entry is None:
            return f"skipped: no cached truth {dataset}/{link} in {TRUTH.name}"
        truth = Gaussian(np.array(entry["mean"]), np.array(entry["cov"]), entry["log_Z"])
        d = X.shape[1]
        n = (d + 1) * (d + 2) // 2

        def error(mean, cov, log_Z):
            return excess_kl(truth, Gaussian(mean, cov, log_Z))

        settings = {"C": 1e5, "fit_intercept": False}
        return X, y, settings, error, "excess KL", n / (2 * entry["ess"])
    reference = load_reference(dataset, link)
    if reference is None:
        return f"skipped: no NUTS reference {dataset}/{link}"
    X, y = load_case(dataset)
    ref_mean, ref_cov, diagnostics = reference

    def error(mean, cov, log_Z):
        return gaussian_kl(ref_mean, ref_cov, mean, cov)

    settings = {"C": 1.0, "fit_intercept": True}
    return X, y, settings, error, "Gaussian KL", diagnostics.get("noise_floor_nats")


def run(args, saved: dict) -> dict:
    info = machine()
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

    warm_up(
        (family, link, params, seeded)
        for link in args.links
        for (_, family, params, seeded) in METHODS.values()
    )
    for dataset in args.datasets:
        for link in args.links:
            cell = f"{dataset}/{link}"
            prepared = prepare(dataset, link, args.data_dir)
            if isinstance(prepared, str):
                meta[cell] = {"case": dataset, "link": link, "status": prepared}
                print(f"{cell}: {prepared}", flush=True)
                save()
                continue
            X, y, settings, error, measure, floor = prepared
            baseline = LRBaseline(X, y, **settings).time(record=False)
            lr = baseline.time(BASELINE_REPEATS).seconds
            meta[cell] = {
                "case": dataset,
                "link": link,
                "status": "ok",
                "M": X.shape[0],
                "d": X.shape[1],
                **settings,
                "measure": measure,
                "noise_floor": floor,
                "lr_seconds": lr,
            }
            print(f"{cell}: LogisticRegression {lr:.3g} s", flush=True)
            for method, (label, family, params, seeded) in METHODS.items():
                for seed in range(args.seeds) if seeded else [None]:
                    key = (dataset, link, method, seed)
                    old = runs.get(key)
                    if old and not args.force and not old["status"].startswith("error"):
                        continue
                    fit = timed_fit(
                        lambda family=family, params=params, seed=seed: make_estimator(
                            family, link, seed, **settings, **params
                        ),
                        X,
                        y,
                        repeats=1 if seeded else DETERMINISTIC_REPEATS,
                    )
                    # beside every fit, as in high_dimension.py: the medians of the cell's LR
                    # times so far follow the machine's state
                    lr = meta[cell]["lr_seconds"] = baseline.time().seconds
                    if fit["status"] == "ok":
                        mean, cov, log_Z = fit.pop("mean"), fit.pop("cov"), fit.pop("log_Z")
                        fit["error"] = error(mean, cov, log_Z)
                        fit["ratio_to_lr"] = fit["seconds"] / lr
                    row = {"case": dataset, "link": link, "method": method, "label": label,
                           "seed": seed, "commit": info["commit"], "lr_seconds": lr}  # fmt: skip
                    runs[key] = r = {**row, **fit}
                    print(
                        f"{cell} {label} seed={seed}: "
                        + (
                            f"{r['seconds']:.3g} s, error {r['error']:.3g}"
                            + (f", {r['strategy']}" if r["strategy"] else "")
                            if r["status"] == "ok"
                            else r["status"][:200]
                        ),
                        flush=True,
                    )
                save()
    return saved


def summary_rows(saved: dict) -> list[dict]:
    runs, rows = saved.get("runs", []), []
    for meta in saved.get("cells", {}).values():
        if meta["status"] != "ok":
            continue
        mine = [r for r in runs if r["case"] == meta["case"] and r["link"] == meta["link"]]
        by_method = {
            m: summarize_runs([r for r in mine if r["method"] == m], "error") for m in METHODS
        }
        laplace, ep = by_method["laplace"], by_method["ep"]
        for method, (label, *_) in METHODS.items():
            s = by_method[method]
            if s["status"] == "not run":
                continue
            rows.append(
                {
                    "case": meta["case"],
                    "link": meta["link"],
                    "measure": meta["measure"],
                    "method": method,
                    "label": label,
                    **s,
                    "error_to_laplace": s["error"] / laplace["error"],
                    "error_to_ep": s["error"] / ep["error"],
                    "time_to_ep": s["seconds"] / ep["seconds"],
                    "noise_floor": meta["noise_floor"],
                    "lr_seconds": meta["lr_seconds"],
                }
            )
    order = {(d, link): k for k, (d, link) in enumerate((d, li) for d in DATASETS for li in LINKS)}
    rows.sort(
        key=lambda r: (order.get((r["case"], r["link"]), 99), list(METHODS).index(r["method"]))
    )
    return rows


def target_met(vs: dict) -> bool | str:
    """True, "target_kl" (stopped at the corrected Laplace approximation, within the
    default's accuracy target: D-046), or False."""
    if not vs["status"].startswith("ok") or vs["time_to_ep"] > TARGET_TIME_RATIO:
        return False
    if vs["error_to_ep"] <= 1.0:
        return True
    stopped = vs["strategies"].split(" ×")[0] == "laplace" and "," not in vs["strategies"]
    return "target_kl" if stopped and vs["error"] <= DEFAULT_TARGET_KL else False


def _target_mark(vs: dict) -> str:
    met = target_met(vs)
    return "✓ target_kl" if met == "target_kl" else mark(bool(met))


def markdown(saved: dict, rows: list[dict]) -> str:
    cells = saved.get("cells", {})
    by = {(r["case"], r["link"], r["method"]): r for r in rows}
    lines = [
        '# Strategy choice: VS default (strategy="auto") against EP',
        "",
        f"Target: {TARGET}.",
        "",
        "Error: on the paper's UCI cells (C = 1e5, no intercept, paper preparation) the "
        "paper's excess KL to the cached importance-sampling truth (mean, covariance and "
        "evidence); on breast cancer (C = 1, standardized, intercept) the Gaussian KL to the "
        "NUTS reference (no evidence). `floor`: the truth's own noise (n/(2·ESS), resp. the "
        "NUTS summary's). Sampling methods: median over seeds; EP and Laplace: one fit "
        "(median time of 3). Times: wall time of `fit`; × LR: ratio to LogisticRegression "
        "(same C, intercept) in the same process, the faster of its default BLAS threads and "
        "one BLAS thread.",
        "",
        machine_line(saved["machine"]) if "machine" in saved else "",
        "",
        "## Target",
        "",
        "| dataset | link | measure | floor | EP error | EP s | VS default error | VS default s "
        "| strategies chosen | error VS/EP | time VS/EP | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = [(d, link) for d in DATASETS for link in LINKS]
    for meta in sorted(cells.values(), key=lambda m: order.index((m["case"], m["link"]))):
        key = (meta["case"], meta["link"])
        if meta["status"] != "ok":
            lines.append(f"| {key[0]} | {key[1]} | {_short(meta['status'])} |" + " |" * 9)
            continue
        ep, vs = by.get((*key, "ep")), by.get((*key, "vs"))
        if not ep or not vs:
            continue
        lines.append(
            f"| {key[0]} | {key[1]} | {meta['measure']} | {fmt(meta['noise_floor'])} | "
            f"{fmt(ep['error'])} | {fmt(ep['seconds'])} | {fmt(vs['error'])} | "
            f"{fmt(vs['seconds'])} | {vs['strategies']} | {fmt(vs['error_to_ep'])} | "
            f"{fmt(vs['time_to_ep'])} | {_target_mark(vs)} |"
        )
    lines += [
        "",
        "## Every method",
        "",
        "| dataset | link | method | seeds | error | ÷ Laplace's | ÷ EP's | time s | × EP | × LR "
        "| warnings | fallbacks | strategies | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["status"].startswith("ok"):
            lines.append(
                f"| {r['case']} | {r['link']} | {r['label']} |" + " |" * 10
                + f" {_short(r['status'])} |"
            )  # fmt: skip
            continue
        warn = f"{r['warnings']} ({r['warning_categories']})" if r["warnings"] else "0"
        status = "ok" if r["status"] == "ok" else f"{r['status']}: {_short(r['failure'])}"
        lines.append(
            f"| {r['case']} | {r['link']} | {r['label']} | {r['seeds']} | {fmt(r['error'])} | "
            f"{fmt(r['error_to_laplace'])} | {fmt(r['error_to_ep'])} | {fmt(r['seconds'])} | "
            f"{fmt(r['time_to_ep'])} | {fmt(r['ratio_to_lr'])} | {warn} | {r['fallbacks']} | "
            f"{r['strategies']} | {status} |"
        )
    reasons = [r for r in rows if r["method"] == "vs" and r["strategy_reason"]]
    if reasons:
        lines += ["", "VS default's reason for its choice (first seed):", ""]
        lines += [f"- {r['case']}/{r['link']}: {r['strategy_reason']}" for r in reasons]
    return "\n".join(lines)


def render(saved: dict, out: Path) -> str:
    rows = summary_rows(saved)
    if rows:
        write_csv(out / f"{NAME}.csv", rows)
    md = markdown(saved, rows)
    (out / f"{NAME}.md").write_text(md + "\n")
    return md


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", "--cases", nargs="+", default=list(DATASETS),
                        choices=DATASETS)  # fmt: skip
    parser.add_argument("--links", nargs="+", default=list(LINKS), choices=LINKS)
    parser.add_argument("--seeds", type=int, default=10, help="seeds of the VS fits")
    parser.add_argument("--data-dir", type=Path, default=_uci.DEFAULT_DATA_DIR)
    parser.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    parser.add_argument("--force", action="store_true", help="refit the selected fits")
    parser.add_argument("--render-only", action="store_true", help="only redo CSV/MD")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    saved = load_saved(args.out / f"{NAME}.json")
    if not args.render_only:
        saved = run(args, saved)
    print(render(saved, args.out))


if __name__ == "__main__":
    main()
