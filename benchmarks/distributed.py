"""Data beyond one process (D-020): VSLogisticRegression on dask arrays on a LocalCluster.

For each number of rows M (× 20 features, a logistic model with a known coefficient
vector), the data are generated lazily on a 2-worker ``distributed.LocalCluster`` (one
thread per worker process; each chunk's rows and labels by one task from its own seeded
generator, so that nothing is computed in the caller) and persisted on the workers, as data
loaded from storage would be; then ``VSLogisticRegression(random_state=0).fit`` runs on
the dask arrays. Recorded per M:

* the fit's time, and for M ≤ ``--compare-up-to`` the in-memory fit's on the same rows
  (computed into this process) in the same process: the ratio, and the largest relative
  difference of the two posteriors (coefficients, intercept, covariance);
* the peak resident memory of the caller over its memory before the fit (sampled every
  20 ms; the caller also runs the LocalCluster's scheduler), and of each worker process;
* the bytes moved: everything the cluster's processes (the caller, which runs the
  scheduler, the workers and their nannies) sent on their TCP sockets during the fit
  (``ss -ti``'s ``bytes_sent``: all the traffic), the workers' transfers to each other
  (their transfer logs), and the arguments and results of the chunk passes (counted by
  :class:`vsbayes.models.dask_chunks.DaskChunks`) — against X's size.

Targets (D-020 in docs/decisions.md): at 10⁷ rows the fit completes, the caller's peak
grows by ≤ 200 MB and the traffic is ≤ 5 % of X; the posterior equals the in-memory fit's
at 10⁶ rows to 1e-8 relative; the time at 10⁶ rows ≤ 1.5 × the in-memory fit's.

Usage: python benchmarks/distributed.py [--rows 1e5 1e6 1e7] [--compare-up-to 1e6]
Writes benchmarks/results/distributed.{csv,json,md,png}. The full run takes about 10 minutes
(needs the ``dask`` extra: dask, distributed, psutil).

Quick check (10⁵ rows, about 30 s)::

    python benchmarks/distributed.py --quick

is ``--rows 1e5 --compare-up-to 1e5 --out results/cache/distributed_quick`` and compares the
seeded figures (strategy, N, chunks, the bytes of the chunk passes, the largest differences
from the in-memory fit) with the committed ``results/distributed.csv`` and with the last quick
run (``results/cache/distributed_quick.json``): unchanged numbers show "0 differ".
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import threading
import time
from pathlib import Path

import numpy as np

# This file's name is the package's: its directory must not be on the path, or
# ``import distributed`` (here and in the worker processes, which inherit the path) finds it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
_spec = importlib.util.spec_from_file_location("_common", _HERE / "_common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
RESULTS, machine, machine_line = _common.RESULTS, _common.machine, _common.machine_line
CACHE, quick_report, read_csv = _common.CACHE, _common.quick_report, _common.read_csv
recorded_warnings = _common.recorded_warnings
write_csv, write_json = _common.write_csv, _common.write_json

N_FEATURES = 20
COEF = np.linspace(-1.0, 1.0, N_FEATURES)


def _chunk(index: int, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One chunk's rows and labels, from its own seeded generator."""
    rng = np.random.default_rng([seed, index])
    X = rng.normal(size=(rows, N_FEATURES))
    y = (X @ COEF + 0.5 + rng.logistic(size=rows) > 0).astype(np.int64)
    return X, y


def lazy_data(n_rows: int, chunk_rows: int, seed: int = 0):
    """X (n_rows × 20) and y as dask arrays whose chunks are generated where computed, a
    chunk's rows and labels by one task (so that they are on the same worker)."""
    import dask
    import dask.array as da

    sizes = [chunk_rows] * (n_rows // chunk_rows)
    if n_rows % chunk_rows:
        sizes.append(n_rows % chunk_rows)
    pairs = [dask.delayed(_chunk, pure=True, nout=2)(i, rows, seed) for i, rows in enumerate(sizes)]
    X = da.concatenate(
        [
            da.from_delayed(p[0], shape=(r, N_FEATURES), dtype=float)
            for p, r in zip(pairs, sizes, strict=True)
        ]
    )
    y = da.concatenate(
        [
            da.from_delayed(p[1], shape=(r,), dtype=np.int64)
            for p, r in zip(pairs, sizes, strict=True)
        ]
    )
    return X, y


class Sampler:
    """Peak RSS of this process and of the worker processes, sampled in a thread."""

    def __init__(self, worker_pids):
        import psutil

        self._me = psutil.Process()
        self._workers = [psutil.Process(pid) for pid in worker_pids]
        self.base = self._me.memory_info().rss
        self.worker_base = [w.memory_info().rss for w in self._workers]
        self.peak, self.worker_peak = self.base, list(self.worker_base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._me.memory_info().rss)
            for i, w in enumerate(self._workers):
                self.worker_peak[i] = max(self.worker_peak[i], w.memory_info().rss)
            self._stop.wait(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def socket_bytes(pids) -> dict:
    """Bytes sent so far on each TCP socket of these processes (``ss -tinp``)."""
    import re
    import subprocess

    text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    wanted = {f"pid={p}," for p in pids}
    sent, socket = {}, None
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):  # a socket line; its tcp_info follows
            fields = line.split()
            socket = (fields[3], fields[4]) if any(w in line for w in wanted) else None
        elif socket is not None:
            match = re.search(r"bytes_sent:(\d+)", line)
            if match:
                sent[socket] = int(match.group(1))
    return sent


def bytes_sent_since(before: dict, pids) -> int:
    after = socket_bytes(pids)
    return sum(n - before.get(key, 0) for key, n in after.items())


def _outgoing(dask_worker) -> int:
    return int(dask_worker.transfer_outgoing_bytes_total)


def run(n_rows: int, chunk_rows: int, compare: bool, client) -> dict:
    import os

    from distributed import wait

    from vsbayes import VSLogisticRegression
    from vsbayes.models import chunked

    # Generated on the workers and kept there, as data loaded from storage would be.
    start = time.perf_counter()
    X, y = client.persist(list(lazy_data(n_rows, chunk_rows)))
    wait([X, y])
    generated = time.perf_counter() - start
    x_bytes = n_rows * N_FEATURES * 8
    passes = []
    original = chunked.ChunkedPosterior.__init__

    def recording(self, *args, **kwargs):  # keeps the chunk store's traffic counters
        original(self, *args, **kwargs)
        passes.append(self.chunks)

    chunked.ChunkedPosterior.__init__ = recording
    import psutil

    pids = list(client.run(os.getpid).values())
    # The caller (with the scheduler), the workers and their nannies: every byte they send.
    cluster_pids = [os.getpid(), *pids, *(psutil.Process(p).ppid() for p in pids)]
    transfers = sum(client.run(_outgoing).values())
    lo = socket_bytes(cluster_pids)
    with Sampler(pids) as memory, recorded_warnings() as caught:
        start = time.perf_counter()
        model = VSLogisticRegression(random_state=0).fit(X, y)
        seconds = time.perf_counter() - start
    chunked.ChunkedPosterior.__init__ = original
    lo = bytes_sent_since(lo, cluster_pids)
    transfers = sum(client.run(_outgoing).values()) - transfers
    row = {
        "rows": n_rows,
        "chunks": X.numblocks[0],
        "x_mb": x_bytes / 1e6,
        "generate_s": generated,
        "fit_s": seconds,
        "strategy": str(model.strategy_[0]),
        # None where the default stopped before sampling (the data-rich shortcut, D-046).
        "n_samples": getattr(model.posteriors_[0], "n_samples", None),
        "caller_peak_growth_mb": (memory.peak - memory.base) / 1e6,
        "worker_peak_mb": max(memory.worker_peak) / 1e6,
        "sent_mb": lo / 1e6,
        "worker_transfer_mb": transfers / 1e6,
        "pass_args_mb": sum(p.bytes_sent for p in passes) / 1e6,
        "pass_results_mb": sum(p.bytes_received for p in passes) / 1e6,
        "traffic_share": lo / x_bytes,
        "warnings": "; ".join(sorted({str(w.message)[:120] for w in caught})),
        "load": os.getloadavg()[0],
    }
    if compare:
        X_local, y_local = (np.asarray(a) for a in client.compute([X, y], sync=True))
        start = time.perf_counter()
        local = VSLogisticRegression(random_state=0).fit(X_local, y_local)
        row["in_memory_s"] = time.perf_counter() - start
        row["ratio"] = seconds / row["in_memory_s"]
        row["coef_abs_diff"] = float(np.max(np.abs(model.coef_ - local.coef_)))
        row["max_rel_diff"] = max(
            float(np.max(np.abs(a - b) / np.abs(b).max()))
            for a, b in (
                (model.coef_, local.coef_),
                (model.intercept_, local.intercept_),
                (model.sigma_, local.sigma_),
            )
        )
        del X_local, y_local
    client.cancel([X, y])
    return row


def report(rows: list[dict], info: dict) -> str:
    lines = [
        "# Dask arrays on a LocalCluster: VSLogisticRegression over row chunks",
        "",
        "Produced by `benchmarks/distributed.py`. Data: M rows × 20 standard normal features,",
        "labels from a logistic model, generated chunk by chunk on a 2-worker",
        "`distributed.LocalCluster` (one thread per worker process); "
        "persisted there (as data loaded from storage would be), then",
        "`VSLogisticRegression(random_state=0).fit(X, y)` on the dask arrays. The in-memory",
        "fit (same rows computed into this process, same seed) is timed in the same process.",
        "Memory: peak resident set over the fit, sampled every 20 ms (the caller also runs",
        "the scheduler). Traffic: every byte the cluster's processes (caller with the",
        "scheduler, workers, nannies) sent on their TCP sockets during the fit (`ss -ti`),",
        "of which the workers' transfers to each other, and the chunk passes' arguments and",
        "results.",
        "",
        "| rows | chunks | X (MB) | fit (s) | in memory (s) | ratio | max rel. diff | "
        "caller peak growth (MB) | worker peak (MB) | bytes sent (MB) | share of X | "
        "worker↔worker (MB) | pass args / results (MB) | strategy, N |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rows']:.0e} | {r['chunks']} | {r['x_mb']:.0f} | {r['fit_s']:.1f} | "
            f"{r.get('in_memory_s', float('nan')):.1f} | {r.get('ratio', float('nan')):.2f} | "
            f"{r.get('max_rel_diff', float('nan')):.2g} | {r['caller_peak_growth_mb']:.0f} | "
            f"{r['worker_peak_mb']:.0f} | {r['sent_mb']:.1f} | "
            f"{100 * r['traffic_share']:.2f} % | {r['worker_transfer_mb']:.1f} | "
            f"{r['pass_args_mb']:.1f} / {r['pass_results_mb']:.1f} | "
            f"{r['strategy']}, {r['n_samples']} |"
        )
    warned = [f"{r['rows']:.0e}: {r['warnings']}" for r in rows if r["warnings"]]
    lines += ["", "Warnings: " + ("; ".join(warned) if warned else "none."), ""]
    loads = ", ".join(f"{r['rows']:.0e}: {r['load']:.1f}" for r in rows)
    lines += [
        f"Load average (1 min) at the end of each fit, on {info['cores']} cores: {loads} "
        f"(the cluster's own work counts in it; above ~2.5 another process was running).",
        "",
    ]
    lines.append(machine_line(info))
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    m = [r["rows"] for r in rows]
    axes[0].loglog(m, [r["fit_s"] for r in rows], "o-", label="dask, LocalCluster")
    compared = [r for r in rows if "in_memory_s" in r]
    axes[0].loglog(
        [r["rows"] for r in compared],
        [r["in_memory_s"] for r in compared],
        "s--",
        label="in memory",
    )
    axes[0].set(xlabel="rows", ylabel="fit time (s)", title="VSLogisticRegression, 20 features")
    axes[0].legend()
    axes[1].loglog(m, [r["x_mb"] for r in rows], "k:", label="X")
    axes[1].loglog(m, [r["sent_mb"] for r in rows], "o-", label="bytes sent (all sockets)")
    axes[1].loglog(
        m, [max(r["caller_peak_growth_mb"], 1e-1) for r in rows], "^-", label="caller's peak growth"
    )
    axes[1].set(xlabel="rows", ylabel="MB", title="what the caller holds and moves")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    parser.add_argument("--compare-up-to", type=float, default=1e6)
    parser.add_argument("--chunk-rows", type=int, default=250_000)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--quick", action="store_true", help="1e5 rows, compared")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.compare_up_to, args.out = [1e5], 1e5, str(CACHE / "distributed_quick")
    from distributed import Client, LocalCluster

    out = Path(args.out)
    rows = []
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        for m in args.rows:
            row = run(int(m), args.chunk_rows, m <= args.compare_up_to, client)
            print(
                {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()},
                flush=True,
            )
            rows.append(row)
    info = machine()
    write_csv(out / "distributed.csv", rows)
    write_json(out / "distributed.json", {"machine": info, "rows": rows})
    (out / "distributed.md").write_text(report(rows, info))
    plot(rows, out / "distributed.png")
    if args.quick:
        quick_report(
            "distributed",
            rows,
            keys=("rows",),
            values=("chunks", "strategy", "n_samples", "pass_args_mb", "pass_results_mb",
                    "coef_abs_diff", "max_rel_diff"),
            committed=read_csv(RESULTS / "distributed.csv"),
        )  # fmt: skip


if __name__ == "__main__":
    main()
