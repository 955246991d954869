"""Bayesian updating: streaming accuracy, update cost and the Thompson-sampling bandit.

Three measurements, in one process:

1. **Streaming accuracy.** Breast cancer, the paper's four UCI datasets (attributes
   standardized, the constant column dropped: the estimators fit the intercept) and a
   4-class problem (``make_classification``, multinomial), each split 75 / 25 (stratified,
   seeded). The training rows are streamed through ``partial_fit`` in batches of 1, 10 and
   100 rows (assumed-density filtering at the default ``buffer_size=100``: batches of 10
   refitted jointly each time the buffer reaches 100 rows, single rows each revisiting four
   sites of the window of the last 100 rows; Laplace's binary streams each batch jointly
   with the window's 100 rows, which keeps the rows whose sites fit worst; and, for VS,
   with ``buffer_size=0``: each batch on its own); the final posterior is
   compared with the batch ``fit`` on the same rows: KL(batch ‖ stream) of the two
   Gaussians and the held-out log loss's ratio stream / batch (target: within 1 %), and
   the stream's log loss over the batch EP fit's (the closest of the batch fits to the
   exact posterior: a common reference for every method). Laplace, EP (the multinomial EP
   for the 4-class problem)
   and VS, the default estimator. Then an order-shuffle study: each binary dataset in
   batches of 1 and 10, in ``--orders`` random orders (ADF depends on the order), as the
   rows come and with a first batch of 50 rows (Laplace and EP at the default buffer, and
   EP with ``buffer_size=0``; VS streams by EP's moments). And along the stream: VS one
   row at a time, with and without the buffer, its log loss every 20 rows from row 100
   over the batch fit on the rows seen so far (binary datasets).
2. **Update cost** (d = 20, ``make_classification``): one ``partial_fit`` of one row after
   0 (a stream from its first row; its first call left out, as every run's), 100, 1000 and
   10 000 rows seen, and of one row of 3 classes (the multinomial posterior) after 0, 1000
   and 10 000 (300 successive rows, the methods interleaved, beside
   ``SGDClassifier.partial_fit`` of the same rows; target: every call ≤ 1 ms, no growth
   with the rows seen): the median, 99th percentile and largest wall time of the calls,
   their process CPU time, the calls over 1 ms and the mean; and one ``partial_fit`` of
   1000 rows against ``fit`` on those rows (target ≤ 3×), each beside scikit-learn's
   ``LogisticRegression`` fit on the same 1000 rows (``_common.LRBaseline``).
3. **Bandit.** ``examples/plot_thompson_bandit.py``'s simulation over 20 seeds: final
   cumulative regret of Thompson sampling (``LaplaceLogisticRegression.partial_fit`` and
   ``thompson_sample``) and of ε-greedy ``LogisticRegression``; target: Thompson's lower.

Usage: python benchmarks/streaming.py [--quick] [--out DIR] [--orders 10] [--from-json]
[--note TEXT] [--dataset NAME] [--cost] (``--note``: a line for the Markdown, e.g. the
machine's load; ``--dataset``: rerun one dataset's accuracy and order rows into the saved
JSON; ``--cost``: rerun the update-cost rows into it, with their own machine line and note)
Writes DIR/streaming.{csv,json,md,png} (DIR defaults to benchmarks/results). ``--quick``
(about a minute) streams breast cancer and the 4-class problem only, in batches of 10 and
100, with 3 orders, fewer cost repeats and 5 bandit seeds, into results/cache.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import itertools
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer, make_classification
from sklearn.linear_model import SGDClassifier
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CACHE,
    RESULTS,
    LRBaseline,
    fmt,
    machine,
    machine_line,
    recorded_warnings,
    write_csv,
    write_json,
)

import vsbayes
from vsbayes import kl_divergence

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plot_thompson_bandit.py"
METHODS = {
    "laplace": vsbayes.LaplaceLogisticRegression,
    "ep": vsbayes.EPLogisticRegression,
    "vs": vsbayes.VSLogisticRegression,  # the default estimator
}
PAPER = ("haberman", "parkinsons", "ionosphere", "wpbc")
#: The streams measured: (method, buffer_size); None is the estimator's default.
STREAMS = (("laplace", None), ("ep", None), ("vs", None), ("vs", 0))
#: The held-out log loss target, stream / batch fit.
TARGET = 1.01


def datasets(quick: bool, only: str | None = None):
    """``(name, X, y)``: features standardized on the training split's rows later (only
    the dataset ``only`` if given)."""
    if only in (None, "breast_cancer"):
        X, y = load_breast_cancer(return_X_y=True)
        yield "breast_cancer", X, y
    if not quick:
        from _uci import load

        for name in PAPER:
            if only not in (None, name):
                continue
            try:
                X, y = load(name)
            except OSError as error:
                print(f"{name}: not found ({error}); skipped", flush=True)
                continue
            constant = np.ptp(X, axis=0) == 0
            yield name, X[:, ~constant], y
    if only in (None, "four_class"):
        X, y = make_classification(
            1000, 10, n_informative=6, n_classes=4, n_clusters_per_class=1, random_state=0
        )
        yield "four_class", X, y


def held_out_log_loss(model, X, y, classes) -> float:
    index = np.searchsorted(classes, y)
    return float(-np.mean(model.predict_log_proba(X)[np.arange(len(y)), index]))


def stream(cls, X, y, classes, batch: int, first: int | None = None, buffer_size=None):
    """``cls`` streamed over the rows in batches of ``batch`` (the first of ``first``),
    with ``buffer_size`` (None: the default)."""
    model = cls() if buffer_size is None else cls(buffer_size=buffer_size)
    starts = [0, *range(first or batch, len(y), batch)]
    for start, stop in zip(starts, [*starts[1:], len(y)], strict=True):
        model.partial_fit(X[start:stop], y[start:stop], classes=classes)
    return model


def accuracy_rows(quick: bool, n_orders: int, only: str | None = None) -> list[dict]:
    rows, splits = [], {}
    batches = (10, 100) if quick else (1, 10, 100)
    for name, X, y in datasets(quick, only):
        X_train, X_test, y_train, y_test = train_test_split(
            X, y, test_size=0.25, stratify=y, random_state=0
        )
        scaler = StandardScaler().fit(X_train)
        X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
        splits[name] = X_train, X_test, y_train, y_test
        classes = np.unique(y)
        reference = held_out_log_loss(
            METHODS["ep"]().fit(X_train, y_train), X_test, y_test, classes
        )
        batch_fits = {method: cls().fit(X_train, y_train) for method, cls in METHODS.items()}
        for method, buffer_size in STREAMS:
            cls, batch_fit = METHODS[method], batch_fits[method]
            batch_loss = held_out_log_loss(batch_fit, X_test, y_test, classes)
            buffer = cls().buffer_size if buffer_size is None else buffer_size
            for size in batches:
                started = time.perf_counter()
                with recorded_warnings() as caught:
                    model = stream(cls, X_train, y_train, classes, size, buffer_size=buffer)
                seconds = time.perf_counter() - started
                loss = held_out_log_loss(model, X_test, y_test, classes)
                rows.append(
                    {
                        "part": "accuracy",
                        "dataset": name,
                        "method": method,
                        "buffer_size": buffer,
                        "batch": size,
                        "order": 0,
                        "n_train": len(y_train),
                        "n_params": model.posteriors_[0].dim,
                        "kl_batch_stream": kl_divergence(
                            batch_fit.posteriors_[0], model.posteriors_[0]
                        ),
                        "log_loss": loss,
                        "batch_log_loss": batch_loss,
                        "log_loss_ratio": loss / batch_loss,
                        "ep_log_loss_ratio": loss / reference,
                        "seconds": seconds,
                        "warnings": len(caught),
                    }
                )
                print(
                    f"{name} {method} buffer {buffer} batch {size}: log loss ratio "
                    f"{loss / batch_loss:.4f}, KL {rows[-1]['kl_batch_stream']:.3g} "
                    f"({seconds:.2f} s)",
                    flush=True,
                )
    rows += order_rows(splits, quick, n_orders)
    rows += between_rows(splits, quick)
    return rows


#: The checkpoints of the study along the stream: every CHECK_EVERY rows from the
#: default buffer_size's row to the end.
CHECK_EVERY = 20


def between_rows(splits: dict, quick: bool) -> list[dict]:
    """The default VS streamed one row at a time with and without the buffer, its held-out
    log loss at checkpoints over the batch fit on the rows seen so far (the window's
    revisits against pure filtering)."""
    rows = []
    cls = METHODS["vs"]
    for name, (X_train, X_test, y_train, y_test) in splits.items():
        classes = np.unique(y_train)
        if len(classes) > 2 or quick:
            continue
        default = cls().buffer_size
        models = {buffer: cls(buffer_size=buffer) for buffer in (default, 0)}
        seen = 0
        for stop in [*range(default, len(y_train), CHECK_EVERY), len(y_train)]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for model in models.values():
                    for i in range(seen, stop):
                        model.partial_fit(X_train[i : i + 1], y_train[i : i + 1], classes=classes)
                batch_fit = cls().fit(X_train[:stop], y_train[:stop])
            seen = stop
            batch_loss = held_out_log_loss(batch_fit, X_test, y_test, classes)
            for buffer, model in models.items():
                loss = held_out_log_loss(model, X_test, y_test, classes)
                rows.append(
                    {
                        "part": "between",
                        "dataset": name,
                        "method": "vs",
                        "buffer_size": buffer,
                        "batch": 1,
                        "rows_seen": stop,
                        "kl_batch_stream": kl_divergence(
                            batch_fit.posteriors_[0], model.posteriors_[0]
                        ),
                        "log_loss": loss,
                        "batch_log_loss": batch_loss,
                        "log_loss_ratio": loss / batch_loss,
                    }
                )
        for buffer in models:
            ratios = [
                r["log_loss_ratio"]
                for r in rows
                if r["dataset"] == name and r["buffer_size"] == buffer
            ]
            print(
                f"along the stream: {name} buffer {buffer}: max ratio {max(ratios):.4f}, "
                f"{sum(r <= TARGET for r in ratios)} of {len(ratios)} checkpoints within",
                flush=True,
            )
    return rows


#: The order study's streams, (method, buffer_size) (VS streams by the same moments as EP:
#: its one-row updates are EP's), and the size of the first batch of its second variant.
ORDER_STREAMS, FIRST_BATCH = (("laplace", None), ("ep", None), ("ep", 0)), 50


def order_rows(splits: dict, quick: bool, n_orders: int) -> list[dict]:
    """Each binary dataset streamed in ``n_orders`` random orders, in batches of 1 and 10:
    as they come, and with a first batch of FIRST_BATCH rows (the steps under the vague
    prior are where assumed-density filtering loses most)."""
    rows = []
    for name, (X_train, X_test, y_train, y_test) in splits.items():
        classes = np.unique(y_train)
        if len(classes) > 2:
            continue
        batch_fits = {}
        for method, buffer_size in ORDER_STREAMS:
            cls = METHODS[method]
            buffer = cls().buffer_size if buffer_size is None else buffer_size
            if method not in batch_fits:
                batch_fits[method] = cls().fit(X_train, y_train)
            batch_fit = batch_fits[method]
            batch_loss = held_out_log_loss(batch_fit, X_test, y_test, classes)
            for size, first in itertools.product((10,) if quick else (1, 10), (None, FIRST_BATCH)):
                for order in range(1, n_orders + 1):
                    permutation = np.random.default_rng(order).permutation(len(y_train))
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        model = stream(
                            cls,
                            X_train[permutation],
                            y_train[permutation],
                            classes,
                            size,
                            first,
                            buffer,
                        )
                    loss = held_out_log_loss(model, X_test, y_test, classes)
                    rows.append(
                        {
                            "part": "order",
                            "dataset": name,
                            "method": method,
                            "buffer_size": buffer,
                            "batch": size,
                            "first_batch": first or size,
                            "order": order,
                            "n_train": len(y_train),
                            "n_params": model.posteriors_[0].dim,
                            "kl_batch_stream": kl_divergence(
                                batch_fit.posteriors_[0], model.posteriors_[0]
                            ),
                            "log_loss": loss,
                            "batch_log_loss": batch_loss,
                            "log_loss_ratio": loss / batch_loss,
                            "seconds": np.nan,
                            "warnings": 0,
                        }
                    )
                ratios = [r["log_loss_ratio"] for r in rows[-n_orders:]]
                print(
                    f"orders: {name} {method} buffer {buffer} batch {size} first "
                    f"{first or size}: log loss "
                    f"ratio median {np.median(ratios):.4f} [{min(ratios):.4f}, "
                    f"{max(ratios):.4f}]",
                    flush=True,
                )
    return rows


class FullCollections:
    """CPU time of the interpreter's full (generation-2) garbage collections, as a
    ``gc.callbacks`` entry: each is a pass over every container object of the process
    (~135,000 after importing vsbayes, scikit-learn and SciPy; 27–45 ms here), which
    lands in whichever call allocates when its turn comes — the runtime's cost, not the
    call's work, and one that ``gc.freeze()`` after start-up removes."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started


def _timed_stream(X, y, seen: int, repeats: int) -> dict[str, np.ndarray]:
    """One replay: per method, (wall, CPU, full-collection CPU) seconds of each call."""
    classes = np.unique(y).tolist()
    models = {}
    for method, cls in METHODS.items():
        models[method] = model = cls()
        for start in range(0, seen, 1000):
            stop = min(start + 1000, seen)
            model.partial_fit(X[start:stop], y[start:stop], classes=classes)
    # scikit-learn's incremental linear classifier, with the same checks of a batch: the
    # reference of what validating one row costs on this machine now.
    sgd = SGDClassifier(loss="log_loss", random_state=0)
    if seen:
        sgd.partial_fit(X[:seen], y[:seen], classes=classes)
    models["sgd"] = sgd
    # Successive single rows, the methods interleaved (the machine's load hits each
    # alike): each one update after about ``seen`` rows; wall and CPU time of the
    # calling thread (the calls run on one BLAS thread: the process's time would add
    # the BLAS pool's idle spinning).
    times = {method: [] for method in models}
    collections = FullCollections()
    gc.callbacks.append(collections)
    try:
        for k in range(seen, seen + repeats):
            for method, model in models.items():
                # From the first row (seen = 0), the first call names the classes (and is
                # left out of the figures below, as every first call).
                first = {"classes": classes} if k == 0 else {}
                started, cpu = time.perf_counter(), time.thread_time()
                collected = collections.seconds
                model.partial_fit(X[k : k + 1], y[k : k + 1], **first)
                times[method].append(
                    (
                        time.perf_counter() - started,
                        time.thread_time() - cpu,
                        collections.seconds - collected,
                    )
                )
    finally:
        gc.callbacks.remove(collections)
    return {method: np.array(measured[1:]) for method, measured in times.items()}


#: Replays of each one-row stream: a call's figure is the least of its replays' times.
REPLAYS = 3


def one_row_costs(X, y, seen: int, repeats: int) -> list[dict]:
    """``repeats`` successive one-row calls of each method after ``seen`` rows (in batches
    of up to 1000), beside ``SGDClassifier.partial_fit`` of the same rows: each call's
    least time over ``REPLAYS`` replays of the same stream (the same computation each
    time; what a replay adds is the machine's: other jobs, the virtual machine's stolen
    time, the interpreter's full garbage collections)."""
    replays = [_timed_stream(X, y, seen, repeats) for _ in range(REPLAYS)]
    times = {
        method: np.min([replay[method] for replay in replays], axis=0) for method in replays[0]
    }
    collected = {
        method: np.concatenate([replay[method][:, 2] for replay in replays]) for method in times
    }
    # The gauge's own spread: calls a shared machine's other jobs delay.
    sgd_wall, sgd_cpu, _ = times.pop("sgd").T
    classes = np.unique(y)
    sgd_seconds = float(np.median(sgd_wall))
    rows = []
    for method, measured in times.items():
        wall, cpu, _ = measured.T
        # The replays' calls that ran a full garbage collection (FullCollections).
        pauses = collected[method][collected[method] > 0]
        rows.append(
            {
                "part": "cost_one_row",
                "method": method,
                "rows_seen": seen,
                "d": X.shape[1],
                "n_classes": len(classes),
                "buffer_size": METHODS[method]().buffer_size,
                "replays": REPLAYS,
                "n_calls": wall.size,
                "seconds": float(np.median(wall)),
                "p99_seconds": float(np.percentile(wall, 99)),
                "max_seconds": float(wall.max()),
                "cpu_seconds": float(np.median(cpu)),
                "p99_cpu_seconds": float(np.percentile(cpu, 99)),
                "max_cpu_seconds": float(cpu.max()),
                "over_1ms": int((wall > 1e-3).sum()),
                "full_gc_calls": int(pauses.size),
                "full_gc_seconds": [float(c) for c in pauses],
                "mean_seconds": float(wall.mean()),
                "sgd_seconds": sgd_seconds,
                "sgd_p99_seconds": float(np.percentile(sgd_wall, 99)),
                "sgd_over_1ms": int((sgd_wall > 1e-3).sum()),
                "sgd_max_cpu_seconds": float(sgd_cpu.max()),
            }
        )
        print(
            f"{method}: one row of {len(classes)} classes after {seen} rows: median "
            f"{1e3 * np.median(wall):.3f} ms, p99 {1e3 * np.percentile(wall, 99):.3f}, max "
            f"{1e3 * wall.max():.3f} (CPU median {1e3 * np.median(cpu):.3f}, p99 "
            f"{1e3 * np.percentile(cpu, 99):.3f}, max {1e3 * cpu.max():.3f}), "
            f"{int((wall > 1e-3).sum())} of {wall.size} over 1 ms, mean "
            f"{1e3 * wall.mean():.3f} ms (SGDClassifier {1e3 * sgd_seconds:.3f} ms, p99 "
            f"{1e3 * np.percentile(sgd_wall, 99):.3f}, {int((sgd_wall > 1e-3).sum())} "
            f"over 1 ms, CPU max {1e3 * sgd_cpu.max():.3f})",
            flush=True,
        )
    return rows


def cost_rows(quick: bool) -> list[dict]:
    """One-row updates after n rows seen (binary, and multinomial with 3 classes), and
    1000-row updates against fit."""
    d = 20
    repeats = 50 if quick else 300
    rows = []
    # 0: a stream of one-row calls from its first row (the default prior's wide cavities).
    for n_classes, seen_levels in ((2, (0, 100, 1000, 10_000)), (3, (0, 1000, 10_000))):
        X, y = make_classification(12_000, d, n_informative=10, n_classes=n_classes, random_state=0)
        for seen in seen_levels:
            rows += one_row_costs(X, y, seen, repeats)
    X, y = make_classification(12_000, d, n_informative=10, random_state=0)
    for method, cls in METHODS.items():
        # 1000 rows: partial_fit on a posterior of 1000 earlier rows against fit, and LR.
        earlier = cls().fit(X[:1000], y[:1000])
        batch_x, batch_y = X[1000:2000], y[1000:2000]
        baseline = LRBaseline(batch_x, batch_y)
        update_times, fit_times = [], []
        for _ in range(5 if quick else 21):
            model = cls(prior=earlier)  # the posterior of 1000 earlier rows
            started, cpu = time.perf_counter(), time.process_time()
            model.partial_fit(batch_x, batch_y, classes=[0, 1])
            update_times.append((time.perf_counter() - started, time.process_time() - cpu))
            started, cpu = time.perf_counter(), time.process_time()
            cls().fit(batch_x, batch_y)
            fit_times.append((time.perf_counter() - started, time.process_time() - cpu))
            baseline.time()
        # Medians of the wall and of the CPU time (a shared machine's other jobs delay a
        # few-ms call by their time slices, which the CPU time leaves out).
        update, update_cpu = (float(t) for t in np.median(update_times, axis=0))
        fit, fit_cpu = (float(t) for t in np.median(fit_times, axis=0))
        rows.append(
            {
                "part": "cost_1000_rows",
                "method": method,
                "rows_seen": 1000,
                "d": d,
                "seconds": update,
                "fit_seconds": fit,
                "ratio_to_fit": update / fit,
                "cpu_seconds": update_cpu,
                "fit_cpu_seconds": fit_cpu,
                "cpu_ratio_to_fit": update_cpu / fit_cpu,
                "lr_seconds": baseline.seconds,
                "ratio_to_lr": update / baseline.seconds,
            }
        )
        print(
            f"{method}: 1000 rows {1e3 * update:.2f} ms, fit {1e3 * fit:.2f} ms "
            f"(ratio {update / fit:.2f}; CPU {1e3 * update_cpu:.2f} and {1e3 * fit_cpu:.2f} "
            f"ms, ratio {update_cpu / fit_cpu:.2f}), LR {1e3 * baseline.seconds:.2f} ms",
            flush=True,
        )
    return rows


def bandit_rows(quick: bool) -> tuple[list[dict], dict]:
    spec = importlib.util.spec_from_file_location("plot_thompson_bandit", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # its functions; the plotting runs only as __main__
    seeds = range(5 if quick else 20)
    curves = {}
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for policy in ("thompson", "epsilon"):
            curves[policy] = np.array([example.run(policy, seed) for seed in seeds])
    rows = [
        {
            "part": "bandit",
            "method": policy,
            "seed": seed,
            "final_regret": float(curves[policy][i, -1]),
        }
        for policy in curves
        for i, seed in enumerate(seeds)
    ]
    lower = int((curves["thompson"][:, -1] < curves["epsilon"][:, -1]).sum())
    print(
        f"bandit: Thompson {curves['thompson'][:, -1].mean():.2f}, ε-greedy "
        f"{curves['epsilon'][:, -1].mean():.2f}; Thompson lower on {lower} of {len(seeds)}",
        flush=True,
    )
    return rows, {k: v.mean(axis=0).tolist() for k, v in curves.items()}


def report(
    rows, curves, info, out: Path, quick: bool, note: str = "", saved: dict | None = None
) -> None:
    """The Markdown and the plot (``saved``: the JSON, whose ``cost_machine`` and
    ``cost_note``, if any, are those of a later run of the cost rows alone)."""
    accuracy = [r for r in rows if r["part"] == "accuracy"]
    order = [r for r in rows if r["part"] == "order"]
    between = [r for r in rows if r["part"] == "between"]
    cost = [r for r in rows if r["part"].startswith("cost")]
    bandit = [r for r in rows if r["part"] == "bandit"]
    lines = [
        "# Bayesian updating: streaming accuracy, update cost, bandit",
        "",
        machine_line(info) + (" **Quick run.**" if quick else ""),
        *([note] if note else []),
        "",
        "Generated by `benchmarks/streaming.py` (its docstring says what is measured).",
        "",
        "## Streaming accuracy (held-out log loss, stream / batch fit; target ≤ 1.01)",
        "",
        "buffer: `buffer_size` (100, the default: batches of 10 refitted jointly each time "
        "100 rows have come; single rows each revisiting the sites of four of the last 100 "
        "rows, those visited longest ago; Laplace's binary streams: each batch fitted "
        "jointly with the 100 rows kept, and the rows kept, one-row calls' too, those whose "
        "sites are furthest from their likelihood over the posterior; 0: each batch on its "
        "own, pure assumed-density filtering). "
        f"Target: the log loss ratio ≤ {TARGET}. Last column: the stream's held-out log loss "
        "over the batch EP fit's, one reference for every method (the batch fit closest to "
        "the exact posterior).",
        "",
        *target_summary(accuracy),
        "",
        "| dataset | method | buffer | params | batch | KL(batch ‖ stream) | log loss ratio "
        f"| ≤ {TARGET} | s | / batch EP |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in accuracy:
        met = "yes" if r["log_loss_ratio"] <= TARGET else "**no**"
        lines.append(
            f"| {r['dataset']} | {r['method']} | {r.get('buffer_size', 0)} | {r['n_params']} "
            f"| {r['batch']} | {fmt(r['kl_batch_stream'])} | {r['log_loss_ratio']:.4f} | {met} "
            f"| {fmt(r['seconds'])} | {r.get('ep_log_loss_ratio', np.nan):.4f} |"
        )
    lines += [
        "",
        "## Order study (binary datasets, training rows reshuffled)",
        "",
        "Each stream in random orders, as it comes (first batch = batch) and with a first "
        f"batch of {FIRST_BATCH} rows, at the default buffer (100) and EP also without it "
        "(0); VS streams by EP's moments (not repeated). With the buffer and a first batch "
        "of 50 rows, the next 50 single rows join it and are refitted with it at row 100, "
        "the later ones revisit the window's sites.",
        "",
        "| dataset | method | buffer | batch | first batch | orders | KL median [min, max] | "
        "log loss ratio median [min, max] |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def key(r):
        return (
            r["dataset"],
            r["method"],
            r.get("buffer_size", 0),
            r["batch"],
            r.get("first_batch", r["batch"]),
        )

    cells = dict.fromkeys(key(r) for r in order)
    for dataset, method, buffer, batch, first in cells:
        cell = [r for r in order if key(r) == (dataset, method, buffer, batch, first)]
        kl = [r["kl_batch_stream"] for r in cell]
        ratio = [r["log_loss_ratio"] for r in cell]
        lines.append(
            f"| {dataset} | {method} | {buffer} | {batch} | {first} | {len(cell)} | "
            f"{fmt(np.median(kl))} [{fmt(min(kl))}, {fmt(max(kl))}] | "
            f"{np.median(ratio):.4f} [{min(ratio):.4f}, {max(ratio):.4f}] |"
        )
    if between:
        lines += [
            "",
            "## Along the stream (VS, batches of one row, training rows in the split's order)",
            "",
            f"The stream's held-out log loss every {CHECK_EVERY} rows from row 100 to the "
            "end, over the batch fit on the rows seen so far: the window's revisits (buffer "
            "100) against pure filtering (0).",
            "",
            f"| dataset | buffer | checkpoints | ≤ {TARGET} | ratio median | ratio max (rows "
            "seen) | KL(batch ‖ stream) median [max] |",
            "|---|---|---|---|---|---|---|",
        ]
        for dataset, buffer in dict.fromkeys((r["dataset"], r["buffer_size"]) for r in between):
            cell = [r for r in between if (r["dataset"], r["buffer_size"]) == (dataset, buffer)]
            ratios = np.array([r["log_loss_ratio"] for r in cell])
            worst = cell[int(ratios.argmax())]
            kl = np.array([r.get("kl_batch_stream", np.nan) for r in cell])
            lines.append(
                f"| {dataset} | {buffer} | {len(cell)} | {int((ratios <= TARGET).sum())} | "
                f"{np.median(ratios):.4f} | {ratios.max():.4f} ({worst['rows_seen']}) | "
                f"{fmt(np.median(kl))} [{fmt(kl.max())}] |"
            )
    lines += ["", "## Update cost (d = 20; targets: one row ≤ 1 ms, 1000 rows ≤ 3× fit)", ""]
    if saved and saved.get("cost_machine"):
        lines += [
            "Rerun apart from the sections above (`--cost`): "
            + machine_line(saved["cost_machine"]),
            *([saved["cost_note"]] if saved.get("cost_note") else []),
            "",
        ]
    lines += [
        "One row: 300 successive rows, the methods interleaved, at the default "
        "`buffer_size=100` (each call: the row's update and the refit of the four sites of "
        "the window's rows visited longest ago; no call refits the buffer), binary and "
        "multinomial (3 classes: sites of 2 dimensions, each call one rank-10 update of the "
        "posterior; the SGD gauge then fits 3 one-vs-rest problems); each stream replayed "
        f"{REPLAYS} times (the same computation each time) and each call's wall and CPU "
        "time the least of its replays' (what a replay adds is the machine's: other "
        "jobs, the virtual machine's stolen time, the interpreter's full garbage "
        "collections). ms, p99 ms, max "
        "ms: the median, 99th percentile and largest wall time of the calls (the 1 ms "
        "target: every call); CPU ms: the median / 99th percentile / largest CPU time of "
        "the calling thread in a call (which a shared machine's other jobs inflate less "
        "than the wall time, though a core shared with them runs slower); > 1 ms: "
        "the calls over 1 ms (wall) of all; mean ms: over all calls. Beside them "
        "`SGDClassifier(loss='log_loss').partial_fit` of the same row (the same checks of "
        "the batch, no posterior), as a gauge of the machine's speed at the time: its "
        "median, 99th percentile and calls over 1 ms (of as many) show how often the "
        "machine's other jobs delay a call of a few tenths of a millisecond. 1000 "
        "rows: one `partial_fit` on an estimator whose prior is the "
        "posterior of 1000 earlier rows (its buffer empty: one fit of the batch), against "
        "`fit` on those rows: medians of 21, wall and CPU time (a few-ms call that other "
        "jobs delay by a time slice doubles or more in wall time).",
        "",
    ]
    lines += [
        "| method | what | rows seen | ms | p99 ms | max ms | CPU ms (median / p99 / max) "
        "| > 1 ms | mean ms | SGD ms (median / p99, > 1 ms; CPU max) | fit ms | ratio to fit "
        "(wall / CPU) | LR ms |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(cost, key=lambda r: (list(METHODS).index(r["method"]), r["part"])):
        one_row = r["part"] == "cost_one_row"
        what = "1000 rows" if not one_row else "one row"
        if one_row and r["rows_seen"] == 0:
            what += " from the first row"
        if r.get("n_classes", 2) > 2:
            what += f", {r['n_classes']} classes"
        cpu = (
            f"{fmt(1e3 * r['cpu_seconds'])} / {fmt(1e3 * r['p99_cpu_seconds'])} / "
            f"{fmt(1e3 * r['max_cpu_seconds'])}"
            if "p99_cpu_seconds" in r
            else "—"
        )
        over = f"{r['over_1ms']} of {r['n_calls']}" if "over_1ms" in r else "—"
        ratio = fmt(r.get("ratio_to_fit", np.nan))
        if "cpu_ratio_to_fit" in r:
            ratio += f" / {fmt(r['cpu_ratio_to_fit'])}"
        sgd = (
            f"{fmt(1e3 * r['sgd_seconds'])} / {fmt(1e3 * r['sgd_p99_seconds'])}, "
            f"{r['sgd_over_1ms']}; {fmt(1e3 * r['sgd_max_cpu_seconds'])}"
            if "sgd_max_cpu_seconds" in r
            else "—"
        )
        lines.append(
            f"| {r['method']} | {what} | {r['rows_seen']} | {1e3 * r['seconds']:.3f} | "
            f"{fmt(1e3 * r.get('p99_seconds', np.nan))} | "
            f"{fmt(1e3 * r.get('max_seconds', np.nan))} | {cpu} | {over} | "
            f"{fmt(1e3 * r.get('mean_seconds', np.nan))} | "
            f"{sgd} | "
            f"{fmt(1e3 * r.get('fit_seconds', np.nan))} | {ratio} "
            f"| {fmt(1e3 * r.get('lr_seconds', np.nan))} |"
        )
    hit = [r for r in cost if r.get("full_gc_calls")]
    if hit:
        pauses = [1e3 * t for r in hit for t in r["full_gc_seconds"]]
        lines += [
            "",
            f"Full garbage collections: {sum(r['full_gc_calls'] for r in hit)} call(s) of "
            f"the replays ran one of the interpreter's generation-2 collections, "
            f"{fmt(min(pauses))}–{fmt(max(pauses))} ms of CPU each (a pass over the "
            "process's ~135,000 container objects, which lands in whichever call allocates "
            "when its turn comes; `gc.freeze()` after start-up removes it; a call's figure "
            "is the least of its replays'): "
            + "; ".join(
                f"{r['method']}, {r.get('n_classes', 2)} classes after {r['rows_seen']} rows: "
                f"{r['full_gc_calls']}"
                for r in hit
            )
            + ".",
        ]
    thompson = np.array([r["final_regret"] for r in bandit if r["method"] == "thompson"])
    greedy = np.array([r["final_regret"] for r in bandit if r["method"] == "epsilon"])
    lines += [
        "",
        "## Bandit (examples/plot_thompson_bandit.py; target: Thompson's regret lower)",
        "",
        f"Final cumulative regret over {len(thompson)} seeds: Thompson sampling "
        f"{thompson.mean():.2f} ± {thompson.std(ddof=1) / np.sqrt(len(thompson)):.2f}, "
        f"ε-greedy LogisticRegression {greedy.mean():.2f} ± "
        f"{greedy.std(ddof=1) / np.sqrt(len(greedy)):.2f}; Thompson lower on "
        f"{int((thompson < greedy).sum())} of {len(thompson)} seeds.",
        "",
    ]
    (out / "streaming.md").write_text("\n".join(lines))
    plot(accuracy, cost, curves, out / "streaming.png")


def target_summary(accuracy: list[dict]) -> list[str]:
    """One line per stream (method and buffer): its cells within the target, and the worst."""
    lines = []
    for method, buffer in dict.fromkeys((r["method"], r.get("buffer_size", 0)) for r in accuracy):
        cells = [r for r in accuracy if (r["method"], r.get("buffer_size", 0)) == (method, buffer)]
        worst = max(cells, key=lambda r: r["log_loss_ratio"])
        within = sum(r["log_loss_ratio"] <= TARGET for r in cells)
        lines.append(
            f"- {method}, buffer_size={buffer}: {within} of {len(cells)} cells within "
            f"{TARGET}; worst {worst['log_loss_ratio']:.4f} ({worst['dataset']}, batch "
            f"{worst['batch']})."
        )
    return lines


def plot(accuracy, cost, curves, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    names = list(dict.fromkeys(r["dataset"] for r in accuracy))
    streams = {(r["dataset"], r["method"], r.get("buffer_size", 0)) for r in accuracy}
    for dataset, method, buffer in sorted(streams):
        points = sorted(
            (r["batch"], r["log_loss_ratio"])
            for r in accuracy
            if (r["dataset"], r["method"], r.get("buffer_size", 0)) == (dataset, method, buffer)
        )
        pure = buffer <= 1 and any(b > 1 for _, m, b in streams if m == method)
        ax.semilogx(
            *zip(*points, strict=True),
            "x:" if pure else {"ep": "o-", "vs": "^-"}.get(method, "s--"),
            color=f"C{names.index(dataset)}",
            alpha=0.45 if pure else 1.0,
            label=f"{dataset} {method}" + (f" buffer {buffer}" if pure else ""),
        )
    ax.axhline(TARGET, color="k", ls="--", lw=0.8)
    ax.set_xlabel("batch size (rows)")
    ax.set_ylabel("held-out log loss, stream / batch")
    ax.legend(fontsize=5, ncol=3, loc="upper right")
    ax = axes[1]
    one_rows = [r for r in cost if r["part"] == "cost_one_row"]
    for method, n_classes in dict.fromkeys((r["method"], r.get("n_classes", 2)) for r in one_rows):
        mine = [r for r in one_rows if (r["method"], r.get("n_classes", 2)) == (method, n_classes)]
        name = method if n_classes == 2 else f"{method}, {n_classes} classes"
        points = sorted((r["rows_seen"], 1e3 * r["seconds"]) for r in mine)
        line = ax.plot(
            *zip(*points, strict=True),
            "o-" if n_classes == 2 else "s-.",
            label=f"{name}: one row, median",
        )[0]
        slowest = sorted(
            (r["rows_seen"], 1e3 * r["max_cpu_seconds"]) for r in mine if "max_cpu_seconds" in r
        )
        if slowest:
            ax.plot(
                *zip(*slowest, strict=True),
                "v--",
                color=line.get_color(),
                mfc="none",
                label=f"{name}: the slowest call (CPU)",
            )
    gauge = sorted(
        {
            (r["rows_seen"], 1e3 * r["sgd_seconds"])
            for r in cost
            if "sgd_seconds" in r and r.get("n_classes", 2) == 2
        }
    )
    if gauge:
        ax.plot(*zip(*gauge, strict=True), "x:", color="gray", label="SGDClassifier")
    gauge_slowest = sorted(
        {
            (r["rows_seen"], 1e3 * r["sgd_max_cpu_seconds"])
            for r in cost
            if "sgd_max_cpu_seconds" in r and r.get("n_classes", 2) == 2
        }
    )
    if gauge_slowest:
        ax.plot(
            *zip(*gauge_slowest, strict=True),
            "v:",
            color="gray",
            mfc="none",
            label="SGDClassifier: the slowest call (CPU)",
        )
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set_xscale("symlog", linthresh=100)  # 0 rows seen: a stream from its first row
    ax.set_yscale("log")
    ax.set_xlabel("rows seen before")
    ax.set_ylabel("partial_fit of one row (ms), d = 20")
    ax.legend(fontsize=7)
    ax = axes[2]
    labels = {"thompson": "Thompson (vsbayes)", "epsilon": "ε-greedy LogisticRegression"}
    for policy, curve in curves.items():
        ax.plot(np.arange(1, len(curve) + 1), curve, label=labels[policy])
    ax.set_xlabel("round")
    ax.set_ylabel("mean cumulative regret")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _rewrite(out: Path, rows: list[dict], saved: dict) -> None:
    """The CSV, JSON, Markdown and PNG of a saved run whose rows were partly rerun."""
    columns = sorted({key for row in rows for key in row})
    write_csv(out / "streaming.csv", [{k: row.get(k, "") for k in columns} for row in rows])
    write_json(out / "streaming.json", saved)
    report(rows, saved["curves"], saved["machine"], out, saved["quick"], saved["note"], saved)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (about a minute)")
    parser.add_argument("--orders", type=int, default=10, help="orders of the order study")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument(
        "--from-json", action="store_true", help="only redo the table and plot from the JSON"
    )
    parser.add_argument("--note", default="", help="a line for the Markdown (e.g. the load)")
    parser.add_argument(
        "--dataset",
        default=None,
        help="rerun this dataset's streaming-accuracy and order rows only, replacing them in "
        "DIR/streaming.json (the other rows kept)",
    )
    parser.add_argument(
        "--cost",
        action="store_true",
        help="rerun the update-cost rows only, replacing them in DIR/streaming.json (the "
        "other rows kept; the cost section gets its own machine line and --note)",
    )
    args = parser.parse_args()
    out = args.out or (CACHE / "streaming_quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    if args.cost:
        saved = json.loads((out / "streaming.json").read_text())
        info = machine()  # the load average at the start, as a whole run's
        fresh = cost_rows(saved["quick"])
        at = next(i for i, r in enumerate(saved["rows"]) if r["part"].startswith("cost"))
        kept = [r for r in saved["rows"] if not r["part"].startswith("cost")]
        saved["rows"] = kept[:at] + fresh + kept[at:]
        saved["cost_machine"], saved["cost_note"] = info, args.note
        rows = saved["rows"]
        _rewrite(out, rows, saved)
        print(f"Rewrote {out}/streaming.{{csv,json,md,png}} with the cost rows rerun.")
        return
    if args.dataset:
        saved = json.loads((out / "streaming.json").read_text())
        fresh = accuracy_rows(saved["quick"], 3 if saved["quick"] else args.orders, args.dataset)
        if not fresh:
            parser.error(f"--dataset {args.dataset!r}: no such dataset (or not in this run)")
        kept = [r for r in saved["rows"] if r.get("dataset") != args.dataset]
        # The rerun rows where the dataset's were, the others in their order.
        at = next(i for i, r in enumerate(saved["rows"]) if r.get("dataset") == args.dataset)
        rows = kept[:at] + fresh + kept[at:]
        rows.sort(
            key=lambda r: (
                ("accuracy", "order", "between").index(r["part"])
                if r["part"] in ("accuracy", "order", "between")
                else 3
            )
        )
        saved["rows"], saved["note"] = rows, args.note or saved.get("note", "")
        _rewrite(out, rows, saved)
        print(f"Rewrote {out}/streaming.{{csv,json,md,png}} with {args.dataset}'s rows rerun.")
        return
    if args.from_json:
        saved = json.loads((out / "streaming.json").read_text())
        note = args.note or saved.get("note", "")
        report(saved["rows"], saved["curves"], saved["machine"], out, saved["quick"], note, saved)
        return
    info = machine()
    rows = accuracy_rows(args.quick, 3 if args.quick else args.orders)
    rows += cost_rows(args.quick)
    bandit, curves = bandit_rows(args.quick)
    rows += bandit
    columns = sorted({key for row in rows for key in row})
    write_csv(out / "streaming.csv", [{k: row.get(k, "") for k in columns} for row in rows])
    write_json(
        out / "streaming.json",
        {"machine": info, "quick": args.quick, "note": args.note, "rows": rows, "curves": curves},
    )
    report(rows, curves, info, out, args.quick, args.note)
    print(f"Wrote {out}/streaming.{{csv,json,md,png}}.")


if __name__ == "__main__":
    main()
