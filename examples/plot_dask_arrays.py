"""
Data on a cluster: fitting dask arrays whose rows stay on the workers
======================================================================

``VSLogisticRegression().fit`` takes dask arrays chunked by rows. With a ``distributed``
client, each chunk's rows stay on the worker that holds them: every pass of the fit is a
map over the chunks and a sum of small results (a gradient, a Hessian, the log-density
of the sample points), and ``predict_proba`` returns a lazy dask array. Here a local
cluster of two workers (threads of this process, to start fast) fits 100,000 rows
generated on the workers themselves, chunk by chunk, and the posterior is compared with
the in-memory fit of the same rows: they agree to round-off. The same code runs on a real
cluster with ``Client("scheduler-address")`` and, e.g., ``da.from_zarr`` for the data.
"""

import dask
import dask.array as da
import matplotlib.pyplot as plt
import numpy as np
from distributed import Client, LocalCluster

import vsbayes

N_ROWS, CHUNK, N_FEATURES = 100_000, 25_000, 8
TRUE_COEF = np.linspace(-1.0, 1.0, N_FEATURES)


def make_chunk(index, rows):
    """One chunk's rows and labels, drawn on the worker that computes it."""
    rng = np.random.default_rng(index)
    X = rng.standard_normal((rows, N_FEATURES))
    y = (X @ TRUE_COEF + 0.5 + rng.logistic(size=rows) > 0).astype(int)
    return X, y


if __name__ == "__main__":
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    )
    with cluster, Client(cluster):
        pairs = [dask.delayed(make_chunk, nout=2)(i, CHUNK) for i in range(N_ROWS // CHUNK)]
        X = da.concatenate([da.from_delayed(p[0], (CHUNK, N_FEATURES), dtype=float) for p in pairs])
        y = da.concatenate([da.from_delayed(p[1], (CHUNK,), dtype=int) for p in pairs])

        model = vsbayes.VSLogisticRegression(random_state=0).fit(X, y)
        proba = model.predict_proba(X)  # lazy, chunk by chunk on the workers
        print(type(proba).__name__, proba.shape, "mean:", float(proba[:, 1].mean().compute()))
        print("strategy:", model.strategy_reason_[0])

        # The same rows in memory (small enough here), the same seed: the same posterior.
        X_local, y_local = dask.compute(X, y)
    local = vsbayes.VSLogisticRegression(random_state=0).fit(X_local, y_local)
    gap = np.abs(model.coef_ - local.coef_).max() / np.abs(local.coef_).max()
    print(f"largest relative difference from the in-memory fit: {gap:.1e}")

    sd = np.sqrt(np.diag(model.sigma_))[:N_FEATURES]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.errorbar(np.arange(N_FEATURES), model.coef_[0], yerr=2 * sd, fmt="o", capsize=3,
                label="posterior mean ± 2 sd (dask fit)")  # fmt: skip
    ax.plot(np.arange(N_FEATURES), TRUE_COEF, "k_", markersize=14, label="true coefficient")
    ax.set(xlabel="feature", ylabel="coefficient",
           title=f"{N_ROWS:,} rows fitted on 2 workers")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    plt.show()
