"""The benchmarks' shared harness: machine line, warning policy, timing, result files.

* :func:`machine` / :func:`machine_line`: what the numbers were measured on (CPU, cores,
  BLAS and its threads, the versions of NumPy, SciPy, scikit-learn and vsbayes, the git
  commit, the load average when the run ended).
* :func:`recorded_warnings` / :func:`timed`: the one warning policy. Every warning a timed
  call raises is recorded (the scripts count them, or name the first) and none is printed:
  expected warnings (a fallback, an unconverged baseline) would otherwise bury the progress
  lines, and a script that needs them has them in the returned list.
* :class:`LRBaseline` / :func:`speed_ratio`: the one way of measuring a speed ratio against
  scikit-learn's ``LogisticRegression``: fits interleaved with the baseline's, in the same
  process, medians of the repeats; the baseline's time is the faster of its median at the
  default BLAS threads and its median on one BLAS thread (a few-ms fit can lose 2× to
  threads spinning on a shared machine, and the ratio should not credit vsbayes with that).
* :func:`quick_report`: the ``--quick`` modes' seeded numbers next to the committed results'
  and the previous quick run's (:func:`compare_rows`).
* ``CACHE``: the folder, ignored by git, where large references are generated on demand and
  the quick runs write; no file over 1 MB is committed under ``results/``
  (``tests/test_benchmark_results.py``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
#: Generated on demand, ignored by git (``.gitignore``): large references and quick runs.
CACHE = RESULTS / "cache"


def _blas_pools() -> list[str]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [
        f"{i['internal_api']} {i['version']} ({i['num_threads']} threads)"
        for i in threadpool_info()
        if i["user_api"] == "blas"
    ]


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "?"


def machine() -> dict:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": _version("scipy"),
        "sklearn": _version("sklearn"),
        "vsbayes": _version("vsbayes"),
        "blas": _blas_pools(),
        "commit": commit,
        "load_average": load,
    }


def machine_line(info: dict) -> str:
    """One line for the reports; older result files lack the later fields."""
    versions = ", ".join(
        f"{label} {info[key]}"
        for key, label in (
            ("numpy", "NumPy"),
            ("scipy", "SciPy"),
            ("sklearn", "scikit-learn"),
            ("vsbayes", "vsbayes"),
        )
        if info.get(key)
    )
    load = info.get("load_average")
    load_text = f"; load average {' / '.join(f'{x:g}' for x in load)}" if load else ""
    return (
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, {versions}, "
        f"BLAS {', '.join(info['blas']) or '?'}; commit {info['commit']}{load_text}."
    )


# --- warnings and timing ---------------------------------------------------------------------


@contextmanager
def recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """The benchmarks' warning policy: every warning recorded (``always``), none printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def timed(call: Callable[[], Any]) -> tuple[float, Any, list[warnings.WarningMessage]]:
    """``(seconds, result, warnings)`` of one ``call()``, under :func:`recorded_warnings`."""
    with recorded_warnings() as caught:
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start
    return seconds, result, list(caught)


def warning_summary(caught: Iterable[warnings.WarningMessage]) -> dict:
    """Count, categories and first message of recorded warnings (the CSV columns)."""
    caught = list(caught)
    return {
        "warnings": len(caught),
        "warning_categories": ",".join(sorted({w.category.__name__ for w in caught})),
        "warning_first": f"{caught[0].category.__name__}: {caught[0].message}" if caught else "",
    }


class LRBaseline:
    """Fit times of scikit-learn's ``LogisticRegression(**params)`` on ``(X, y)``.

    Each :meth:`time` fits it once at the default BLAS threads and once on one BLAS thread
    (threadpoolctl); :attr:`seconds` is the faster of the two medians. Call :meth:`time`
    beside the fits it is compared with, so that both see the machine in the same state.
    """

    def __init__(self, X, y, **params):
        self.X, self.y, self.params = X, y, params
        self.default: list[float] = []
        self.one_thread: list[float] = []
        self.estimator = None
        self.caught: list[warnings.WarningMessage] = []

    def _fit(self):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(**self.params).fit(self.X, self.y)

    def time(self, repeats: int = 1, *, record: bool = True) -> LRBaseline:
        """Fit ``repeats`` times at each setting; ``record=False`` is a warm-up."""
        from threadpoolctl import threadpool_limits

        for _ in range(repeats):
            seconds, self.estimator, caught = timed(self._fit)
            with threadpool_limits(limits=1, user_api="blas"):
                one, _, _ = timed(self._fit)
            if record:
                self.default.append(seconds)
                self.one_thread.append(one)
                self.caught += caught
        return self

    @property
    def times(self) -> list[float]:
        """Every recorded fit time, both settings."""
        return self.default + self.one_thread

    @property
    def seconds(self) -> float:
        if not self.default:
            return math.nan
        return float(min(np.median(self.default), np.median(self.one_thread)))


def speed_ratio(
    fit: Callable[[int], Any], X, y, *, repeats: int = 5, warmup: bool = True, **lr_params
) -> dict:
    """``fit(k)`` (k = 0, 1, …) against :class:`LRBaseline`, interleaved, in this process.

    Returns ``seconds`` (median of the fits), ``lr_seconds``, ``ratio``, ``times``, the last
    ``result``, the ``warnings`` of every fit and the ``baseline``.
    """
    baseline = LRBaseline(X, y, **lr_params)
    if warmup:  # first-call costs (imports, caches) charged to neither side
        timed(lambda: fit(0))
        baseline.time(record=False)
    times, caught, result = [], [], None
    for k in range(repeats):
        seconds, result, new = timed(lambda k=k: fit(k))
        times.append(seconds)
        caught += new
        baseline.time()
    median = float(np.median(times))
    return {
        "seconds": median,
        "lr_seconds": baseline.seconds,
        "ratio": median / baseline.seconds,
        "times": times,
        "result": result,
        "warnings": caught,
        "baseline": baseline,
    }


# --- result files ------------------------------------------------------------------------------


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=float) + "\n")


def quartiles(values) -> tuple[float, float, float]:
    """(q1, median, q3); failures are recorded as inf and sort last."""
    v = np.sort(np.asarray(values, dtype=float))
    q = np.percentile(v, [25, 50, 75], method="nearest")
    return float(q[0]), float(q[1]), float(q[2])


def fmt(x: float) -> str:
    if not np.isfinite(x):
        return "∞" if x > 0 else "—"
    return f"{x:.3g}"


def compare_rows(
    new: Iterable[dict],
    reference: Iterable[dict],
    keys: tuple[str, ...],
    values: tuple[str, ...],
    *,
    label: str = "the committed results",
    show: int = 10,
) -> int:
    """Print how many ``values`` of the new rows equal those of the ``reference`` rows with the
    same ``keys``, and the first ``show`` that differ; return the number that differ.

    Numbers are compared as floats (CSV and JSON hold ``repr``, which round-trips exactly), so
    a seeded rerun of unchanged code shows every value the same.
    """

    def key(row):
        return tuple(str(row.get(k)) for k in keys)

    def same(a, b) -> bool:
        # (None is an empty cell in a CSV: csv.DictWriter writes it so)
        a, b = ("" if a is None else a), ("" if b is None else b)
        try:
            a, b = float(a), float(b)
        except (TypeError, ValueError):
            return str(a) == str(b)
        return a == b or (math.isnan(a) and math.isnan(b))

    old = {key(r): r for r in reference}
    differ = missing = total = 0
    for row in new:
        ref = old.get(key(row))
        if ref is None:
            missing += 1
            continue
        for name in values:
            total += 1
            if not same(row.get(name), ref.get(name)):
                differ += 1
                if differ <= show:
                    where = dict(zip(keys, key(row), strict=True))
                    print(f"  differs: {where} {name}: {ref.get(name)} -> {row.get(name)}")
    print(
        f"Compared with {label}: {total} numbers, {total - differ} same, {differ} differ"
        + (f"; {missing} rows not there" if missing else "")
        + ".",
        flush=True,
    )
    return differ


def quick_report(
    name: str, rows: list[dict], keys: tuple[str, ...], values: tuple[str, ...], committed
) -> None:
    """The ``--quick`` modes' report: the seeded numbers of ``rows`` beside the committed
    results' and beside the previous quick run's (``CACHE/<name>_quick.json``), then saved
    there for the next run. Run ``--quick`` before and after a change: "every number the
    same" against the previous run is the check (the committed results may come from an older
    commit, and say so by differing)."""
    path = CACHE / f"{name}_quick.json"
    compare_rows(rows, committed, keys, values)
    if path.is_file():
        previous = json.loads(path.read_text())
        commit = previous.get("machine", {}).get("commit", "?")
        compare_rows(rows, previous["rows"], keys, values, label=f"the last quick run ({commit})")
    kept = [{k: row.get(k) for k in (*keys, *values)} for row in rows]
    write_json(path, {"machine": machine(), "rows": kept})
    print(f"Saved in {path}.")


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
