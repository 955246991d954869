"""Fit time and memory of the estimators, next to scikit-learn's LogisticRegression.

Every time is the wall time of ``fit(X, y)`` alone (data generation and scaling excluded),
and every ratio divides by ``LogisticRegression()`` (scikit-learn defaults) timed in the same
process on the same data, so the ratios carry over to other machines better than the
seconds do: ``_common.LRBaseline`` fits it beside every timed fit, at the default BLAS
threads and on one, and the faster median is its time.

1. Breast cancer (``sklearn.datasets.load_breast_cancer``, 569 × 30) standardized with
   ``StandardScaler``: ``LogisticRegression()``, ``LaplaceLogisticRegression()`` and
   ``VSLogisticRegression(random_state=i)`` (i = 0, 1, … over the repeats); the median of
   ``--repeats`` fits after one warm-up fit. Secondary row: the raw, unstandardized data,
   on which LogisticRegression stops at ``max_iter`` with a ConvergenceWarning.
2. Synthetic data, M rows × d features, M ∈ {1e3, 1e4, 1e5, 1e6}, d ∈ {10, 20, 50, 100}:
   X standard normal (float64, seeded ``numpy`` Generator), true coefficients drawn from
   N(0, 1/d) and rescaled to norm 2 (so the latent x·w has sd 2), no intercept, labels
   Bernoulli(σ(x·w)). One fit per estimator when M ≥ 1e5, else the median of 3. VS
   evaluates the likelihood at N = 8·(d+2)(d+3)/2 points (``n_samples="auto"``), about
   N·M·d multiply-adds; a combination whose work exceeds ``--max-work`` is skipped and
   shown as such (at the default 2e12 only d = 100, M = 1e6).
3. Memory: the VS fit at M = 1e6, d = 20 in a fresh subprocess (``--memory-child M d``), so
   nothing this process allocated before counts: the peak resident set size
   (VmHWM on Linux, else ``ru_maxrss``) after the imports, after generating the data, and
   after the fit.

The report checks the targets of D-026 (docs/decisions.md): VS on standardized breast
cancer ≤ 0.5 s and ≤ 20× LogisticRegression; VS at M = 1e6, d = 20 within 60 s and a 2 GB
peak.

Warnings raised during a timed fit (expected here: ConvergenceWarning of LogisticRegression
on the raw data, VS diagnostics) are recorded, counted in the ``warnings`` column and their
messages kept in the JSON, not printed (``_common.timed``).

Usage: python benchmarks/estimator_timing.py [--repeats 7] [--max-work 2e12] [--out DIR]
       python benchmarks/estimator_timing.py --quick --out /tmp/bench_out   (smoke test:
       M ∈ {1e3, 1e4}, d = 10, 2 repeats, memory child at M = 1e4)
Writes DIR/estimator_timing.{csv,json,md,png}; DIR defaults to benchmarks/results.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from _common import RESULTS, LRBaseline, fmt, machine, machine_line, timed, write_csv, write_json
from scipy.special import expit
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from vsbayes import METHODS, n_family_params

SIZES = [10**3, 10**4, 10**5, 10**6]
DIMS = [10, 20, 50, 100]
MEMORY_CASE = (10**6, 20)
QUICK_SIZES, QUICK_DIMS, QUICK_MEMORY_CASE = [10**3, 10**4], [10], (10**4, 20)
# Above this M one fit per estimator: the run is long and its noise relatively small.
SINGLE_FIT_FROM = 10**5
# D-026's targets (2 GB read as 2 GiB, the unit the peak memory is reported in).
TARGETS = {"bc_seconds": 0.5, "bc_ratio": 20.0, "memory_seconds": 60.0, "memory_mb": 2048.0}

# From the estimators' registry: every logistic estimator, and EP's probit one.
TIMED = [(key, "logistic") for key in METHODS if "logistic" in METHODS[key].classes]
TIMED.append(("ep", "probit"))


def _maker(method: str, link: str):
    cls = METHODS[method].classes[link]
    if METHODS[method].sampling:
        return lambda seed: cls(random_state=seed)
    return lambda seed: cls()


ESTIMATORS = {"LogisticRegression": lambda seed: LogisticRegression()}
ESTIMATORS.update({METHODS[m].classes[link].__name__: _maker(m, link) for m, link in TIMED})
SHORT = {"LogisticRegression": "LR"}
SHORT.update(
    {
        METHODS[m].classes[link].__name__: ("Laplace" if m == "laplace" else m.upper())
        + ("-probit" if link == "probit" else "")
        for m, link in TIMED
    }
)
BASELINES = ["IS", "BMC", "EP", "VB", "EP-probit"]
# BMC stores and factors an N×N matrix: only where N (= VS's auto N) is at most this
# (breast cancer: 4224, a few seconds).
BMC_MAX_SAMPLES = 4500
# EP-logistic integrates every site numerically in every sweep (~1 s per 10⁴ rows at d = 10
# on this machine): skipped above this many rows to keep the run within about half an hour.
EP_LOGISTIC_MAX_ROWS = 10**5
SKIPPED = "skipped (work > cap)"
BMC_SKIPPED = f"skipped (N > {BMC_MAX_SAMPLES})"
EP_SKIPPED = f"skipped (M > {EP_LOGISTIC_MAX_ROWS:.0e})"


def synthetic(m, d, seed=0):
    """Standard-normal X (m, d) and Bernoulli(σ(X w)) labels, |w| = 2 (latent sd 2)."""
    rng = np.random.default_rng([m, d, seed])
    X = rng.standard_normal((m, d))
    w = rng.normal(0.0, 1.0 / np.sqrt(d), size=d)
    # Rescaled exactly rather than ≈ 2 on average, so every d is equally separable.
    w *= 2.0 / np.linalg.norm(w)
    y = (rng.random(m) < expit(X @ w)).astype(np.int64)
    return X, y


def vs_samples(d):
    """VS's (and IS's, BMC's) automatic N for d features and an intercept."""
    return max(8 * n_family_params(d + 1), 256)


def vs_work(m, d):
    """Estimated multiply-adds of the VS likelihood evaluations: N·M·d, N by the auto rule."""
    return vs_samples(d) * m * d


def measure(dataset, X, y, n_fits, *, warmup, messages):
    """One row per estimator: median fit time over ``n_fits`` seeds, ratio to LR, diagnostics.

    LogisticRegression (``_common.LRBaseline``) is fitted beside every timed fit, at the
    default BLAS threads and on one; its row (first) shows the faster median, the divisor of
    every ratio.
    """
    baseline = LRBaseline(X, y)
    if warmup:
        baseline.time(record=False)
    rows = []
    for name, make in ESTIMATORS.items():
        if name == "LogisticRegression":
            continue
        if name == "BMCLogisticRegression" and vs_samples(X.shape[1]) > BMC_MAX_SAMPLES:
            rows.append(row(dataset, X.shape, name, warnings="", status=BMC_SKIPPED))
            continue
        if name == "EPLogisticRegression" and X.shape[0] > EP_LOGISTIC_MAX_ROWS:
            rows.append(row(dataset, X.shape, name, warnings="", status=EP_SKIPPED))
            continue
        if warmup:
            timed(lambda make=make: make(0).fit(X, y))
        times, caught = [], []
        for seed in range(n_fits):
            estimator = make(seed)
            seconds, _, new = timed(lambda estimator=estimator: estimator.fit(X, y))
            times.append(seconds)
            caught += new
            baseline.time()
        rows.append(fitted_row(dataset, X, name, estimator, times, caught, messages))
    if not baseline.default:
        baseline.time(n_fits)
    lr = fitted_row(
        dataset, X, "LogisticRegression", baseline.estimator, baseline.times,
        baseline.caught, messages,
    )  # fmt: skip
    lr.update(fits=len(baseline.default), seconds=baseline.seconds)
    rows.insert(0, lr)
    for r in rows:
        if r["status"] == "ok":
            r["ratio_to_lr"] = r["seconds"] / baseline.seconds
    return rows


def fitted_row(dataset, X, name, estimator, times, caught, messages) -> dict:
    post = getattr(estimator, "posteriors_", [None])[0]
    fallback = getattr(estimator, "laplace_fallback_", None)
    if caught:
        key = f"{dataset} {X.shape[0]}×{X.shape[1]} {name}"
        messages[key] = dict(Counter(f"{w.category.__name__}: {w.message}" for w in caught))
    return row(
        dataset,
        X.shape,
        name,
        fits=len(times),
        seconds=float(np.median(times)),
        # The spread shows when another process competed for the 2 cores.
        seconds_min=min(times),
        seconds_max=max(times),
        n_iter=int(np.max(estimator.n_iter_)),
        # The points of a sampling fit; where VS took another route (strategy_), the route.
        n_samples=getattr(post, "n_samples", None) or route(estimator),
        kl_error=getattr(post, "kl_error", ""),
        fallback="" if fallback is None else bool(fallback.any()),
        warnings=len(caught),
        status="ok",
    )


def route(estimator) -> str:
    """The route(s) a VS fit took (``strategy_``, one per problem), "" for other methods."""
    strategy = getattr(estimator, "strategy_", None)
    return "" if strategy is None else "/".join(dict.fromkeys(map(str, np.ravel(strategy))))


def row(dataset, shape, estimator, **values):
    """A CSV row; every row has the same columns (blank where not applicable)."""
    columns = ["fits", "seconds", "seconds_min", "seconds_max", "ratio_to_lr", "n_iter"]
    out = dict.fromkeys([*columns, "n_samples", "kl_error", "fallback"], "")
    out = {"dataset": dataset, "M": shape[0], "d": shape[1], "estimator": estimator, **out}
    out.update(warnings=0, work="", status="")
    out.update(values)
    return out


def peak_rss_mb():
    """Peak resident set size of this process so far, in MiB.

    On Linux, VmHWM of /proc/self/status: unlike ru_maxrss, which a child inherits from its
    parent across fork and exec, it starts afresh in a new program.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def memory_child(m, d):
    """Run in a fresh process: generate the data, fit VS once, print one JSON line."""
    rss_start = peak_rss_mb()
    X, y = synthetic(m, d)
    rss_data = peak_rss_mb()
    estimator = METHODS["vs"].classes["logistic"](random_state=0)
    seconds, _, caught = timed(lambda: estimator.fit(X, y))
    result = {
        "M": m,
        "d": d,
        "seconds": seconds,
        # No points where the VS estimator took another route: its strategy_ then.
        "n_samples": getattr(estimator.posteriors_[0], "n_samples", None)
        or f"none ({route(estimator)})",
        "warnings": len(caught),
        "rss_start_mb": rss_start,
        "rss_data_mb": rss_data,
        "rss_peak_mb": peak_rss_mb(),
        "data_mb": (X.nbytes + y.nbytes) / 2**20,
    }
    print(json.dumps(result))


def run_memory_child(m, d):
    """The memory child's JSON result; a fresh interpreter so the peak RSS is the fit's own."""
    script = str(Path(__file__).resolve())
    cmd = [sys.executable, script, "--memory-child", str(m), str(d)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"memory child failed with exit code {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed fits on breast cancer")
    parser.add_argument("--max-work", type=float, default=2e12, help="skip when N·M·d > this")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    parser.add_argument(
        "--memory-child", type=int, nargs=2, metavar=("M", "D"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--from-json", action="store_true", help="only redo the table and plot from DIR's JSON"
    )
    args = parser.parse_args()
    if args.memory_child:
        memory_child(*args.memory_child)
        return
    if args.from_json:
        saved = json.loads((args.out / "estimator_timing.json").read_text())
        for key in ("repeats", "max_work", "quick"):
            setattr(args, key, saved["args"][key])
        report(saved["rows"], saved["memory"], saved["machine"], args)
        return
    sizes, dims, memory_case = SIZES, DIMS, MEMORY_CASE
    if args.quick:
        sizes, dims, memory_case = QUICK_SIZES, QUICK_DIMS, QUICK_MEMORY_CASE
        args.repeats = 2

    # First, while this process is small and nothing else runs.
    memory = run_memory_child(*memory_case)
    print(f"memory child M={memory['M']} d={memory['d']} done", flush=True)

    rows, messages = [], {}
    X_raw, y_bc = load_breast_cancer(return_X_y=True)
    X_std = StandardScaler().fit_transform(X_raw)
    for dataset, X in (("breast_cancer_std", X_std), ("breast_cancer_raw", X_raw)):
        rows += measure(dataset, X, y_bc, args.repeats, warmup=True, messages=messages)
        print(f"{dataset} done", flush=True)

    for d in dims:
        for m in sizes:
            work = vs_work(m, d)
            if work > args.max_work:
                rows += [
                    row("synthetic", (m, d), name, warnings="", work=work, status=SKIPPED)
                    for name in ESTIMATORS
                ]
                print(f"M={m} d={d} {SKIPPED}", flush=True)
                continue
            X, y = synthetic(m, d)
            n_fits = 1 if m >= SINGLE_FIT_FROM else min(3, args.repeats)
            cell = measure("synthetic", X, y, n_fits, warmup=False, messages=messages)
            for r in cell:
                r["work"] = work
            rows += cell
            del X, y  # free the largest arrays before the next cell is generated
            vs_row = next(r for r in cell if r["estimator"] == "VSLogisticRegression")
            print(f"M={m} d={d}: VS {vs_row['seconds']:.3g} s", flush=True)

    info = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "estimator_timing.csv", rows)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_json(
        args.out / "estimator_timing.json",
        {
            "machine": info,
            "args": settings,
            "targets": TARGETS,
            "rows": rows,
            "memory": memory,
            "warning_messages": messages,
        },
    )
    report(rows, memory, info, args)


def report(rows, memory, info, args):
    """Write the Markdown table and the plot, and print the table."""
    md = markdown(rows, memory, info, args)
    (args.out / "estimator_timing.md").write_text(md + "\n")
    plot(rows, args.out / "estimator_timing.png")
    print(md)


def met(ok):
    return "**met**" if ok else "**not met**"


def markdown(rows, memory, info, args):
    lines = [
        "# Estimator fit time and memory",
        "",
        "Wall time of `fit(X, y)` and its ratio to `LogisticRegression()` (scikit-learn "
        "defaults, lbfgs) fitted in the same process on the same data, beside every timed "
        "fit (its time: the faster median of its default BLAS threads and one BLAS thread). "
        "`N`: VS posterior evaluations (`posteriors_[0].n_samples`), or where the fit "
        "took no points the route it took (`strategy_`); `warnings`: warnings "
        "raised by the timed fits, counted and not printed (messages "
        "in the JSON); `iters`: lbfgs iterations (LR), Newton iterations (Laplace), VS solver "
        "iterations summed over the rounds (VS); `min–max`: spread of the timed fits."
        + (" **Quick run (smoke test sizes).**" if args.quick else ""),
        "",
        machine_line(info),
        "",
        f"## Breast cancer (569 × 30, median of {args.repeats} fits after one warm-up)",
        "",
        "| data | estimator | fit s | min–max s | × LR | N | iters | warnings |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["dataset"].startswith("breast_cancer"):
            data = "standardized" if r["dataset"].endswith("std") else "raw"
            if r["status"] != "ok":
                lines.append(f"| {data} | {r['estimator']} | {r['status']} | | | | | |")
                continue
            lines.append(
                f"| {data} | {r['estimator']} | {fmt(r['seconds'])} | "
                f"{fmt(r['seconds_min'])}–{fmt(r['seconds_max'])} | "
                f"{fmt(r['ratio_to_lr'])} | {r['n_samples']} | {r['n_iter']} | "
                f"{r['warnings']} |"
            )
    vs = next(
        r
        for r in rows
        if r["dataset"] == "breast_cancer_std" and r["estimator"] == "VSLogisticRegression"
    )
    raw_lr = next(
        r
        for r in rows
        if r["dataset"] == "breast_cancer_raw" and r["estimator"] == "LogisticRegression"
    )
    lines += [
        "",
        f"Raw data: LogisticRegression used {raw_lr['n_iter']} lbfgs iterations "
        f"(max_iter={LogisticRegression().max_iter}) and raised {raw_lr['warnings']} "
        f"ConvergenceWarning(s) over "
        f"{raw_lr['fits']} fits (not printed); its time is of the truncated fit.",
        "",
        f"Target, standardized data: VS fit ≤ {TARGETS['bc_seconds']} s — "
        f"{fmt(vs['seconds'])} s, {met(vs['seconds'] <= TARGETS['bc_seconds'])}; "
        f"≤ {TARGETS['bc_ratio']:g}× LogisticRegression — {fmt(vs['ratio_to_lr'])}×, "
        f"{met(vs['ratio_to_lr'] <= TARGETS['bc_ratio'])}.",
        "",
        "## Synthetic data",
        "",
        "X standard normal, latent sd 2, labels Bernoulli(σ(f)). Median of "
        f"{min(3, args.repeats)} fits for M < {SINGLE_FIT_FROM:,}, one fit above. VS work "
        f"N·M·d above {args.max_work:.3g} is skipped.",
        "",
        "| M | d | LR s | Laplace s | VS s | VS N | VS/LR | Laplace/LR | warnings |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cells = {}
    for r in rows:
        if r["dataset"] == "synthetic":
            cells.setdefault((r["d"], r["M"]), {})[SHORT[r["estimator"]]] = r
    for (d, m), cell in sorted(cells.items()):
        lr, la, vs_r = cell["LR"], cell["Laplace"], cell["VS"]
        if vs_r["status"] == SKIPPED:
            lines.append(f"| {m:,} | {d} | {SKIPPED} | | | | | | |")
            continue
        n_warn = sum(r["warnings"] for r in cell.values() if r["status"] == "ok")
        lines.append(
            f"| {m:,} | {d} | {fmt(lr['seconds'])} | {fmt(la['seconds'])} | "
            f"{fmt(vs_r['seconds'])} | {vs_r['n_samples']} | {fmt(vs_r['ratio_to_lr'])} | "
            f"{fmt(la['ratio_to_lr'])} | {n_warn} |"
        )
    lines += [
        "",
        "### Baselines on the same data (D-028): fit seconds, and × VS",
        "",
        "| M | d | VS s | " + " | ".join(f"{b} s (× VS)" for b in BASELINES) + " |",
        "|---|---|---|" + "---|" * len(BASELINES),
    ]
    for (d, m), cell in sorted(cells.items()):
        vs_r = cell["VS"]
        if vs_r["status"] == SKIPPED:
            continue
        entries = []
        for b in BASELINES:
            r = cell.get(b)
            if r is None or r["status"] != "ok":
                entries.append(r["status"] if r else "")
            else:
                entries.append(f"{fmt(r['seconds'])} ({fmt(r['seconds'] / vs_r['seconds'])})")
        lines.append(f"| {m:,} | {d} | {fmt(vs_r['seconds'])} | " + " | ".join(entries) + " |")
    m, d = memory["M"], memory["d"]
    target_size = (m, d) == MEMORY_CASE
    caveat = (
        ""
        if target_size
        else f" (measured at M = {m:,}, d = {d}; the targets are for M = {MEMORY_CASE[0]:,}, "
        f"d = {MEMORY_CASE[1]}, so this check says nothing about them)"
    )
    grid = cells.get((d, m), {}).get("VS")
    in_grid = (
        f" The same fit in the synthetic grid above (this process): {fmt(grid['seconds'])} s."
        if grid and grid["status"] == "ok"
        else ""
    )
    lines += [
        "",
        "## Memory (VS fit in a fresh process)",
        "",
        "Peak resident set size (VmHWM, MB = 2²⁰ bytes) after the imports, after "
        "generating the data (the peak before the fit), and after the fit.",
        "",
        "| M | d | VS fit s | N | data MB | peak after imports MB | peak before fit MB "
        "| peak after fit MB |",
        "|---|---|---|---|---|---|---|---|",
        f"| {m:,} | {d} | {fmt(memory['seconds'])} | {memory['n_samples']} | "
        f"{memory['data_mb']:.0f} | {memory['rss_start_mb']:.0f} | "
        f"{memory['rss_data_mb']:.0f} | {memory['rss_peak_mb']:.0f} |",
        "",
        f"Targets: within {TARGETS['memory_seconds']:g} s — {fmt(memory['seconds'])} s, "
        f"{met(memory['seconds'] <= TARGETS['memory_seconds'])}; peak ≤ "
        f"{TARGETS['memory_mb']:.0f} MB — {memory['rss_peak_mb']:.0f} MB, "
        f"{met(memory['rss_peak_mb'] <= TARGETS['memory_mb'])}{caveat}.{in_grid}",
    ]
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    timed = [r for r in rows if r["dataset"] == "synthetic" and r["status"] == "ok"]
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4.3))
    for k, d in enumerate(sorted({r["d"] for r in timed})):
        color = f"C{k}"
        for name, style in (
            ("VSLogisticRegression", "o-"),
            ("LaplaceLogisticRegression", "s:"),
            ("LogisticRegression", "--"),
        ):
            sub = sorted(
                (r for r in timed if r["d"] == d and r["estimator"] == name), key=lambda r: r["M"]
            )
            ms = [r["M"] for r in sub]
            label = f"{SHORT[name]}, d={d}"
            ax_t.plot(ms, [r["seconds"] for r in sub], style, color=color, label=label)
            if name == "VSLogisticRegression":
                ax_r.plot(ms, [r["ratio_to_lr"] for r in sub], "o-", color=color, label=f"d={d}")
    ax_r.axhline(TARGETS["bc_ratio"], color="k", ls=":", label="20× (breast-cancer target)")
    for ax, ylabel, title in (
        (ax_t, "fit time [s]", "Fit time (VS solid, Laplace dotted, LR dashed)"),
        (ax_r, "VS / LR fit time", "VS fit time relative to LogisticRegression"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("M (rows)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if ax is ax_t else 1)
    # Plain ratios rather than 2×10¹ (after set_yscale, which resets the formatters).
    ax_r.yaxis.set_major_formatter(ScalarFormatter())
    ax_r.yaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
