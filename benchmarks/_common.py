"""Helpers shared by the benchmark scripts: machine description, result files, summaries."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


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
        from threadpoolctl import threadpool_info

        blas = [
            f"{i['internal_api']} {i['version']} ({i['num_threads']} threads)"
            for i in threadpool_info()
            if i["user_api"] == "blas"
        ]
    except ImportError:
        blas = []
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas,
        "commit": commit,
    }


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


def machine_line(info: dict) -> str:
    return (
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
        f"NumPy {info['numpy']}, BLAS {', '.join(info['blas']) or '?'}; commit {info['commit']}."
    )
