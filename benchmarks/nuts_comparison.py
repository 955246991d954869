"""NUTS (NumPyro) against VS: the error each method reaches and the time it needs.

Cells (``CELLS``): the paper's Parkinsons and Ionosphere × {logistic, probit}, prepared and
fitted as in ``paper_reproduction.py`` (unit-norm columns with a constant, prior
N(0, 10⁵ I), no separate intercept: the "four paper cells"), and breast cancer × {logistic,
probit} as in ``_high_dim_cases.py`` (standardized, C = 1, intercept with prior N(0, 10⁶)).

Error: the error measure of ``paper_reproduction.py``, excess KL divergence to the ground
truth divided by the Laplace approximation's excess KL (the unit of every error here).
Ground truth: the importance-sampling Gaussians of ``results/paper_truth.json`` (mean,
covariance, log Z) on the paper cells; the long NUTS references of
``results/nuts_reference/`` (mean and covariance) on breast cancer, where errors are
``gaussian_kl`` and the unit is Laplace's. NUTS gives no evidence, so NUTS is measured on
the mean/covariance part, ``vsbayes.kl_divergence(truth, N(mean, cov))`` of the moment-
matched Gaussian of its draws; ``vsbayes.excess_kl`` adds VS's log-Z error
``r - 1 - log r`` (r = Ẑ/Z*). VS is reported both ways on the paper cells, and the targets
compare the mean/covariance parts.

NUTS (``--seeds`` 3 per configuration, ``CONFIGS``): NumPyro NUTS on the exact posterior in
the natural parameterization θ (no whitening by Laplace: what a user writes), the potential
of ``nuts_reference.potential`` (m = 0, L = 1, the cell's prior), float64, NumPyro's
defaults otherwise (target acceptance 0.8, tree depth 10, 1000 warm-up steps with step-size
and mass adaptation), started uniformly in [-2, 2]^p as NumPyro's ``init_to_uniform``:

* ``default``: 1 chain, diagonal mass matrix (NumPyro's defaults);
* ``dense``: 1 chain, ``dense_mass=True``;
* ``2chains``: 2 chains run one after the other (``chain_method="sequential"``),
  diagonal mass.

Each run draws ``DRAWS`` = 5000 draws in all after warm-up (split over the chains) and
measures the error of the moment-matched Gaussian of the first k draws (k/2 of each chain
for two chains) at ``CHECKPOINTS``. Time to k draws: warm-up time + sampling time × the
fraction of the sampling phase's leapfrog steps spent on those draws (draws cost their
steps). JAX compile time is excluded and reported separately: ``jax.monitoring`` reports
the spans of every trace, lowering and XLA compilation (``/jax/core/compile/*`` events);
their union within each phase is subtracted from the phase's wall time (``mcmc.warmup``,
then ``mcmc.run``, each timed to ``block_until_ready``). NumPyro recompiles its loop on
every run, so every run is measured this way. (Checked on Ionosphere-logistic, default: the
first run, compiling, measured 4.9 s without its 9.5 s of compilation; two repeats of it
served by JAX's persistent compilation cache took 4.4 and 4.8 s without their 0.6 s of
cache reads.) Each NUTS run is cached in
``results/nuts_comparison/<cell>_<config>_seed<s>.json`` (errors and times per checkpoint,
diagnostics) and skipped on a rerun: NUTS does not change with vsbayes' code.

VS: the public estimators (``VSLogisticRegression`` / ``VSProbitRegression``,
``strategy="global"``, the EP kernel, as the paper table), N = 2n … 256n (n =
(p+1)(p+2)/2), ``--vs-seeds`` 5 seeds each, whole-fit wall time; median error and median
time per N. EP alone (``EPLogisticRegression`` / ``EPProbitRegression``) and the VS
estimator's factor-wise form (``strategy="sites"``: EP whose site fits are VS fits of the
tilted densities; closed-form ones for probit) at the estimator's ``tol`` of 1e-8 (the
default), 1e-4, 1e-2, 0.1 and 1 (``SITES_TOLS``: EP's sweeps stop at site changes of
tol / 100, its one cost knob, as N is the global fit's), one point each, the median time
of 5 fits.
Stored in ``results/nuts_comparison/vs.json``. The comparison is made twice: against the
global fit's ladder alone, and against the VS estimator's faster setting at each level
(the global fit at some N, or ``strategy="sites"`` at some tol).

Comparison: each error level a NUTS configuration reaches (its median error over seeds at
a checkpoint, reached in the median time) and the time VS needs for it, interpolated on
VS's median error-against-time curve (log-log, at the first N whose error is at most the
level; where VS's smallest N is already below the level, its time, so the ratio is a lower
bound "≥"). Target (D-027, on the four paper cells): NUTS time ÷ VS time ≥ 50 for
``default``, ≥ 10 for ``dense`` and ``2chains``, at every level.

Outputs: ``results/nuts_comparison.md`` / ``.csv`` / ``.json`` and ``nuts_comparison.png``
(error against time, log-log, one panel per cell). Needs the ``bench`` extra for the NUTS
runs (``pip install -e '.[bench]'``); ``--vs-only`` and ``--report`` do not import JAX.

Usage
-----
NUTS (cached runs skipped), VS (the cells not in ``vs.json``) and the report, JAX
single-threaded on one core::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
    taskset -c 1 python benchmarks/nuts_comparison.py

VS again against the cached NUTS runs (after a change to vsbayes; on an idle machine), and
the report — one command::

    python benchmarks/nuts_comparison.py --vs-only

``--report`` only rebuilds the table and plot; ``--cells`` / ``--configs`` restrict a run;
``--data-dir`` is the folder of the UCI files (as ``paper_reproduction.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zlib

import _uci
import numpy as np
import paper_reproduction as paper
from _common import RESULTS, machine, machine_line, timed, write_csv, write_json
from _high_dim_cases import gaussian_kl, load_case, load_reference
from high_dimension import make_estimator
from nuts_reference import potential, prior_variances, signed_design

from vsbayes import Gaussian, excess_kl, kl_divergence

NAME = "nuts_comparison"
RUNS_DIR = RESULTS / NAME
VS_FILE = RUNS_DIR / "vs.json"

#: (dataset, link): the four paper cells, then breast cancer.
CELLS = (
    ("parkinsons", "logistic"),
    ("parkinsons", "probit"),
    ("ionosphere", "logistic"),
    ("ionosphere", "probit"),
    ("breast_cancer", "logistic"),
    ("breast_cancer", "probit"),
)
PAPER_DATASETS = ("parkinsons", "ionosphere")
#: Breast cancer's model (as ``high_dimension.py``): C = 1, with intercept.
BREAST_C = 1.0

#: name -> (label, chains, dense mass, target ratio NUTS time ÷ VS time)
CONFIGS = {
    "default": ("default NUTS (1 chain, diagonal mass)", 1, False, 50.0),
    "dense": ("NUTS, dense mass (1 chain)", 1, True, 10.0),
    "2chains": ("NUTS, 2 chains (sequential, diagonal mass)", 2, False, 10.0),
}
WARMUP = 1000
#: Draws after warm-up, over all chains; the error is measured after the first k of them.
DRAWS = 5000
CHECKPOINTS = (100, 200, 500, 1000, 2000, 5000)
#: VS sample sizes, multiples of n = (p+1)(p+2)/2.
VS_MULTIPLES = (2, 4, 8, 16, 32, 64, 128, 256)
EP_REPEATS = 5
# The estimator's tol for its strategy="sites" points: the default, and looser ones (EP's
# sweeps stop at site changes of tol / 100, down to 1 % at tol = 1) — the factor-wise form's
# cost knob, as N is the global fit's.
SITES_TOLS = (1e-8, 1e-4, 1e-2, 1e-1, 1.0)
COMPILE_EVENTS = "/jax/core/compile/"


def cell_name(dataset: str, link: str) -> str:
    return f"{dataset}_{link}"


# --- cells: data, ground truth, error --------------------------------------------------------


class Cell:
    """One (dataset, link): data, NUTS design and prior, ground truth and error unit."""

    def __init__(self, dataset: str, link: str, data_dir: str):
        self.dataset, self.link, self.name = dataset, link, cell_name(dataset, link)
        self.paper = dataset in PAPER_DATASETS
        if self.paper:
            self.X, self.y = _uci.load(dataset, data_dir)  # constant column last, y in {0, 1}
            self.A = self.X * (2.0 * self.y - 1.0)[:, None]
            self.prior_var = np.full(self.X.shape[1], paper.C)
            entry = json.loads(paper.TRUTH.read_text())[f"{dataset}/{link}"]
            self.truth = paper.truth_gaussian(entry)
            self.truth_floor_nats = paper.n_params(self.X.shape[1]) / (2 * entry["ess"])
            self.truth_label = f"IS, {entry['draws']:.0e} draws, ESS {entry['ess']:.3g}"
        else:
            self.X, self.y = load_case(dataset)  # y in {-1, +1}
            self.A = signed_design(self.X, self.y)
            self.prior_var = prior_variances(self.A.shape[1])
            mean, cov, diag = load_reference(dataset, link)
            self.truth = Gaussian(mean, cov)
            self.truth_floor_nats = diag["noise_floor_nats"]
            self.truth_label = (
                f"NUTS reference, {diag['chains']} × {diag['draws_per_chain']} draws, "
                f"ESS bulk min {diag['ess_bulk_min']:.0f}"
            )
        self.dim = self.A.shape[1]
        self.n = paper.n_params(self.dim)
        laplace = self.fit("Laplace")[0]
        self.unit = self.excess(laplace) if self.paper else self.kl(laplace)
        self.laplace_kl = self.kl(laplace)

    def estimator(
        self, family: str, n_samples: int | None = None, seed: int = 0, tol: float = 1e-8
    ):
        """The public estimator of ``family`` (Laplace, EP, VS, VS-sites) on this cell's
        model (``tol``: VS-sites' only)."""
        if family == "VS-sites":  # EP whose site fits are VS fits (closed form for probit)
            cls = paper.ESTIMATORS[("VS", self.link)]
            c, intercept = (paper.C, False) if self.paper else (BREAST_C, True)
            return cls(C=c, fit_intercept=intercept, strategy="sites", tol=tol, random_state=seed)
        if self.paper:
            method = f"EP-{self.link}" if family == "EP" else family
            return paper.make(method, self.link, n_samples, seed)
        params = {"C": BREAST_C, "fit_intercept": True}
        if family == "VS":
            params.update(strategy="global", n_samples=n_samples)
        return make_estimator(family, self.link, seed if family == "VS" else None, **params)

    def fit(self, family: str, n_samples: int | None = None, seed: int = 0, tol: float = 1e-8):
        """(posterior Gaussian of θ, whole-fit seconds, fell back to Laplace)."""
        estimator = self.estimator(family, n_samples, seed, tol)
        # fallbacks are recorded, not printed
        seconds, _, _ = timed(lambda: estimator.fit(self.X, self.y))
        fallback = bool(np.any(getattr(estimator, "laplace_fallback_", False)))
        return estimator.posteriors_[0], seconds, fallback

    def kl(self, g: Gaussian) -> float:
        """Mean/covariance part: KL(truth ‖ g) in nats."""
        if self.paper:
            return kl_divergence(self.truth, g)
        return gaussian_kl(self.truth.mean, self.truth.cov, g.mean, g.cov)

    def excess(self, g: Gaussian) -> float:
        """The paper's excess KL (with the log-Z term), paper cells only."""
        return excess_kl(self.truth, g)

    def error_of_moments(self, mean: np.ndarray, cov: np.ndarray) -> float:
        """Error ÷ Laplace's of N(mean, cov); inf where cov is not positive definite."""
        try:
            return self.kl(Gaussian(mean, cov)) / self.unit
        except (np.linalg.LinAlgError, ValueError):
            return float("inf")


# --- NUTS ------------------------------------------------------------------------------------


def _union_seconds(spans, start: float, end: float) -> float:
    """Seconds covered by the union of the (start, end) spans, clipped to [start, end]."""
    total, current = 0.0, None
    for s, e in sorted((max(s, start), min(e, end)) for s, e in spans):
        if e <= s:
            continue
        if current is None or s > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [s, e]
        else:
            current[1] = max(current[1], e)
    if current is not None:
        total += current[1] - current[0]
    return total


_SPANS: list[tuple[float, float]] = []


def _listen_to_compilation() -> None:
    from jax import monitoring

    def listener(event, start, end, **kwargs):
        if event.startswith(COMPILE_EVENTS):
            _SPANS.append((start, end))

    monitoring.register_event_time_span_listener(listener)


def run_path(cell: str, config: str, seed: int):
    return RUNS_DIR / f"{cell}_{config}_seed{seed}.json"


def nuts_run(cell: Cell, config: str, seed: int) -> dict:
    """One NUTS run: errors and compile-free times at the checkpoints, diagnostics."""
    import jax
    import numpyro
    from numpyro.infer import MCMC, NUTS

    _, chains, dense, _ = CONFIGS[config]
    per_chain = DRAWS // chains
    p = cell.dim
    fn = potential(cell.A, cell.link, np.zeros(p), np.ones(p), prior_var=cell.prior_var)
    mcmc = MCMC(
        NUTS(potential_fn=fn, dense_mass=dense),
        num_warmup=WARMUP,
        num_samples=per_chain,
        num_chains=chains,
        chain_method="sequential",
        progress_bar=False,
    )
    stream = zlib.crc32(f"{cell.name}/{config}".encode())
    init = np.random.default_rng([stream, seed]).uniform(-2.0, 2.0, size=(chains, p))
    if chains == 1:  # NumPyro takes a batch of starting points only for several chains
        init = init[0]
    key = jax.random.PRNGKey(stream % 2**31 + seed)
    warm_key, sample_key = jax.random.split(key)

    _SPANS.clear()
    w0, t0 = time.time(), time.perf_counter()
    mcmc.warmup(warm_key, init_params=init)
    jax.block_until_ready(mcmc.post_warmup_state)
    w1, t1 = time.time(), time.perf_counter()
    mcmc.run(sample_key, extra_fields=("num_steps", "diverging"))
    theta = np.asarray(jax.block_until_ready(mcmc.get_samples(group_by_chain=True)))
    w2, t2 = time.time(), time.perf_counter()
    compile_warmup = _union_seconds(_SPANS, w0, w1)
    compile_sampling = _union_seconds(_SPANS, w1, w2)
    warmup_s = (t1 - t0) - compile_warmup
    sampling_s = (t2 - t1) - compile_sampling

    extra = mcmc.get_extra_fields(group_by_chain=True)
    steps = np.asarray(extra["num_steps"], dtype=float)  # (chains, per_chain)
    cumulative = np.cumsum(steps, axis=1)
    checkpoints = []
    for k in CHECKPOINTS:
        each = k // chains
        draws = theta[:, :each].reshape(-1, p)
        mean = draws.mean(axis=0)
        cov = np.cov(draws, rowvar=False)
        fraction = cumulative[:, each - 1].sum() / cumulative[:, -1].sum()
        checkpoints.append(
            {
                "draws": k,
                "seconds": warmup_s + sampling_s * fraction,
                "error": cell.error_of_moments(mean, cov),
            }
        )
    step_size = np.atleast_1d(np.asarray(mcmc.last_state.adapt_state.step_size))
    return {
        "cell": cell.name,
        "config": config,
        "seed": seed,
        "chains": chains,
        "dense_mass": dense,
        "warmup": WARMUP,
        "draws": DRAWS,
        "warmup_seconds": warmup_s,
        "sampling_seconds": sampling_s,
        "compile_seconds": compile_warmup + compile_sampling,
        "compile_warmup_seconds": compile_warmup,
        "compile_sampling_seconds": compile_sampling,
        "wall_seconds": t2 - t0,
        "mean_leapfrog_steps": float(steps.mean()),
        "max_leapfrog_steps": int(steps.max()),
        "divergences": int(np.asarray(extra["diverging"]).sum()),
        "step_size": [float(s) for s in step_size],
        "checkpoints": checkpoints,
        "unit_nats": cell.unit,
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpus": sorted(os.sched_getaffinity(0)),
        "machine": machine(),
    }


def run_nuts(cells: list[Cell], configs, seeds: int) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    _listen_to_compilation()
    for seed in range(seeds):  # seed by seed: a stopped run leaves whole seeds behind
        for cell in cells:
            for config in configs:
                path = run_path(cell.name, config, seed)
                if path.is_file():
                    continue
                run = nuts_run(cell, config, seed)
                write_json(path, run)
                last = run["checkpoints"][-1]
                print(
                    f"{cell.name} {config} seed {seed}: warm-up {run['warmup_seconds']:.1f} s, "
                    f"sampling {run['sampling_seconds']:.1f} s, compile "
                    f"{run['compile_seconds']:.1f} s, {run['mean_leapfrog_steps']:.0f} steps/draw, "
                    f"{run['divergences']} divergences; error at {last['draws']} draws "
                    f"{last['error']:.3g}",
                    flush=True,
                )


# --- VS ---------------------------------------------------------------------------------------


def run_vs(cells: list[Cell], seeds: int, again: bool) -> None:
    """VS and EP on each cell not in ``vs.json`` yet (every cell if ``again``)."""
    saved = json.loads(VS_FILE.read_text()) if VS_FILE.is_file() else {"cells": {}}
    for cell in cells:
        if cell.name in saved["cells"] and not again:
            continue
        cell.fit("VS", VS_MULTIPLES[0] * cell.n, seed=0)  # warm-up, untimed
        fits = []
        for multiple in VS_MULTIPLES:
            for seed in range(1, seeds + 1):
                g, seconds, fallback = cell.fit("VS", multiple * cell.n, seed)
                fit = {
                    "multiple": multiple,
                    "N": multiple * cell.n,
                    "seed": seed,
                    "seconds": seconds,
                    "error": cell.kl(g) / cell.unit,
                    "error_with_log_Z": cell.excess(g) / cell.unit if cell.paper else None,
                    "fallback": fallback,
                }
                fits.append(fit)
            mine = [f for f in fits if f["multiple"] == multiple]
            print(
                f"{cell.name} VS {multiple}n: {np.median([f['seconds'] for f in mine]):.3g} s, "
                f"error {np.median([f['error'] for f in mine]):.3g}",
                flush=True,
            )
        points = {}
        for family, tol in [("EP", 1e-8)] + [("VS-sites", tol) for tol in SITES_TOLS]:
            times = []
            for _ in range(EP_REPEATS):
                g, seconds, fallback = cell.fit(family, tol=tol)
                times.append(seconds)
            points[family, tol] = {
                "seconds": float(np.median(times)),
                "error": cell.kl(g) / cell.unit,
                "error_with_log_Z": cell.excess(g) / cell.unit if cell.paper else None,
                "fallback": fallback,
                "tol": tol,
            }
        saved["cells"][cell.name] = {
            "fits": fits,
            "ep": points["EP", 1e-8],
            "sites": points["VS-sites", SITES_TOLS[0]],
            "sites_ladder": [points["VS-sites", tol] for tol in SITES_TOLS],
            "unit_nats": cell.unit,
            "laplace_kl_nats": cell.laplace_kl,
            "truth_floor": cell.truth_floor_nats / cell.unit,
            "truth": cell.truth_label,
            "n": cell.n,
            "dim": cell.dim,
            "cpus": sorted(os.sched_getaffinity(0)),
            "machine": machine(),
        }
        write_json(VS_FILE, saved)


# --- comparison and report ---------------------------------------------------------------------


def vs_curve(entry: dict) -> list[dict]:
    """Median time and errors of VS per N, in increasing N."""
    rows = []
    for multiple in sorted({f["multiple"] for f in entry["fits"]}):
        mine = [f for f in entry["fits"] if f["multiple"] == multiple]
        with_z = [f["error_with_log_Z"] for f in mine if f["error_with_log_Z"] is not None]
        rows.append(
            {
                "multiple": multiple,
                "N": mine[0]["N"],
                "seconds": float(np.median([f["seconds"] for f in mine])),
                "error": float(np.median([f["error"] for f in mine])),
                "error_with_log_Z": float(np.median(with_z)) if with_z else None,
                "fallbacks": sum(f["fallback"] for f in mine),
                "fits": len(mine),
            }
        )
    return rows


def vs_time_to(level: float, curve: list[dict]) -> tuple[float | None, bool]:
    """(VS seconds to reach ``level``, whether VS's smallest N is already below it).

    Log-log interpolation between the first N whose median error is at most ``level`` and
    the N before it; ``None`` if no N reaches the level.
    """
    if not np.isfinite(level):
        return None, False
    for i, point in enumerate(curve):
        if point["error"] <= level:
            if i == 0:
                return point["seconds"], True
            prev = curve[i - 1]
            x0, x1 = np.log(prev["error"]), np.log(point["error"])
            y0, y1 = np.log(prev["seconds"]), np.log(point["seconds"])
            return float(np.exp(y0 + (np.log(level) - x0) * (y1 - y0) / (x1 - x0))), False
    return None, False


def estimator_time_to(level: float, curve: list[dict], sites: list[dict]):
    """(seconds, bound) of the VS estimator's fastest setting for ``level``: the global
    ladder (:func:`vs_time_to`) or a ``strategy="sites"`` point (one per tol), whichever is
    faster."""
    seconds, bound = vs_time_to(level, curve)
    for point in sites:
        if point["error"] <= level and (seconds is None or point["seconds"] < seconds):
            seconds, bound = point["seconds"], True
    return seconds, bound


def sites_points(entry: dict) -> list[dict]:
    """The cell's ``strategy="sites"`` points (older files: the default's only)."""
    if "sites_ladder" in entry:
        return entry["sites_ladder"]
    return [entry["sites"]] if "sites" in entry else []


def load_nuts(cell: str, config: str) -> list[dict]:
    return [
        json.loads(path.read_text())
        for path in sorted(RUNS_DIR.glob(f"{cell}_{config}_seed*.json"))
    ]


def nuts_curve(runs: list[dict]) -> list[dict]:
    """Median error and median time over the seeds, per checkpoint."""
    rows = []
    for j, k in enumerate(CHECKPOINTS):
        errors = [r["checkpoints"][j]["error"] for r in runs]
        seconds = [r["checkpoints"][j]["seconds"] for r in runs]
        rows.append(
            {"draws": k, "error": float(np.median(errors)), "seconds": float(np.median(seconds))}
        )
    return rows


def comparison(cells, configs) -> tuple[list[dict], list[dict], dict]:
    """Level rows, summary rows (cell × config) and the VS data of every cell."""
    vs = json.loads(VS_FILE.read_text())["cells"] if VS_FILE.is_file() else {}
    levels, summary = [], []
    for dataset, link in cells:
        name = cell_name(dataset, link)
        if name not in vs:
            continue
        curve = vs_curve(vs[name])
        for config in configs:
            runs = load_nuts(name, config)
            if not runs:
                continue
            label, _, _, target = CONFIGS[config]
            rows = []
            for point in nuts_curve(runs):
                vs_seconds, bound = vs_time_to(point["error"], curve)
                ratio = point["seconds"] / vs_seconds if vs_seconds else None
                est_seconds, est_bound = estimator_time_to(
                    point["error"], curve, sites_points(vs[name])
                )
                est_ratio = point["seconds"] / est_seconds if est_seconds else None
                rows.append(
                    {
                        "cell": name,
                        "paper_cell": dataset in PAPER_DATASETS,
                        "config": config,
                        "draws": point["draws"],
                        "nuts_error": point["error"],
                        "nuts_seconds": point["seconds"],
                        "vs_seconds": vs_seconds,
                        "vs_at_smallest_N": bound,
                        "ratio": ratio,
                        "target": target,
                        "met": ratio is not None and ratio >= target,
                        "estimator_seconds": est_seconds,
                        "estimator_bound": est_bound,
                        "estimator_ratio": est_ratio,
                        "estimator_met": est_ratio is not None and est_ratio >= target,
                    }
                )
            levels += rows
            ratios = [r["ratio"] for r in rows]
            est_ratios = [r["estimator_ratio"] for r in rows]
            compile_s = [r["compile_seconds"] for r in runs]
            summary.append(
                {
                    "cell": name,
                    "paper_cell": dataset in PAPER_DATASETS,
                    "config": config,
                    "label": label,
                    "seeds": len(runs),
                    "best_error": rows[-1]["nuts_error"],
                    "best_seconds": rows[-1]["nuts_seconds"],
                    "vs_seconds_for_best": rows[-1]["vs_seconds"],
                    "min_ratio": None if None in ratios else min(ratios),
                    "target": target,
                    "met": all(r["met"] for r in rows),
                    "min_estimator_ratio": None if None in est_ratios else min(est_ratios),
                    "estimator_met": all(r["estimator_met"] for r in rows),
                    "compile_seconds": float(np.median(compile_s)),
                    "warmup_seconds": float(np.median([r["warmup_seconds"] for r in runs])),
                    "sampling_seconds": float(np.median([r["sampling_seconds"] for r in runs])),
                    "steps_per_draw": float(np.median([r["mean_leapfrog_steps"] for r in runs])),
                    "divergences": int(sum(r["divergences"] for r in runs)),
                }
            )
    return levels, summary, vs


def _num(x, spec=".3g") -> str:
    if x is None:
        return "—"
    if not np.isfinite(x):
        return "∞"
    return format(x, spec)


def _ratio(row: dict) -> str:
    if row["ratio"] is None:
        return "VS does not reach it"
    return ("≥ " if row["vs_at_smallest_N"] else "") + f"{row['ratio']:.3g}"


def markdown(levels, summary, vs, info_nuts, info_vs) -> str:
    nuts_info = info_nuts or {}
    lines = [
        "# NUTS (NumPyro) against VS: error against time",
        "",
        "Produced by `benchmarks/nuts_comparison.py` (its docstring has the details). Error: "
        "excess KL to the ground truth ÷ the Laplace approximation's (`paper_reproduction.py`'s "
        "measure), NUTS and VS both on the mean/covariance part (NUTS gives no evidence; VS's "
        "error with its log-Z term is in the VS table). Ground truth: importance sampling "
        "(`results/paper_truth.json`) on the paper cells (C = 10⁵, no intercept), the long "
        "NUTS references on breast cancer (C = 1, intercept). NUTS: NumPyro in the natural "
        "parameterization, 1000 warm-up steps, 5000 draws after warm-up, "
        f"{max((s['seeds'] for s in summary), default=0)} seeds per configuration; time to k "
        "draws = warm-up + the sampling time of the first k draws (by leapfrog steps), JAX "
        'compile time excluded (reported below). VS: `strategy="global"`, whole-fit time, '
        "N = 2n … 256n, median of 5 seeds per N. Each NUTS level is its median error over "
        "the seeds at k draws, reached in the median time; *VS s* is the time VS needs for "
        'that error, interpolated log-log on its median curve ("≥": VS\'s smallest N is '
        "already below the level, so the ratio is a lower bound). Targets (D-027, the four "
        "paper cells): NUTS time ÷ VS time ≥ 50 for default NUTS, ≥ 10 for the tuned ones.",
        "",
        f"NUTS: JAX {nuts_info.get('jax', '?')}, NumPyro {nuts_info.get('numpyro', '?')}, "
        f"float64, XLA single-threaded (`{nuts_info.get('xla_flags', '') or 'default'}`) "
        f"on CPUs {nuts_info.get('cpus', '?')}. "
        + (machine_line(nuts_info["machine"]) if "machine" in nuts_info else ""),
        "",
        f"VS: on CPUs {info_vs.get('cpus', '?')}. " + machine_line(info_vs["machine"]),
        "",
        "## Summary: the smallest ratio over the levels of each NUTS configuration",
        "",
        "| cell | NUTS | best error (5000 draws) | NUTS s | VS s | min ratio | target | met "
        "| min ratio, VS estimator | met | compile s | warm-up s | sampling s | steps/draw "
        "| divergences |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        met = ("✓" if s["met"] else "✗") + ("" if s["paper_cell"] else " (not a target cell)")
        lines.append(
            f"| {s['cell']} | {s['config']} | {_num(s['best_error'])} | "
            f"{_num(s['best_seconds'])} | {_num(s['vs_seconds_for_best'])} | "
            f"{_num(s['min_ratio'])} | {s['target']:g} | {met} | "
            f"{_num(s['min_estimator_ratio'])} | {'✓' if s['estimator_met'] else '✗'} | "
            f"{_num(s['compile_seconds'])} | "
            f"{_num(s['warmup_seconds'])} | {_num(s['sampling_seconds'])} | "
            f"{s['steps_per_draw']:.0f} | {s['divergences']} |"
        )
    target_rows = [s for s in summary if s["paper_cell"]]
    missed = [
        f"{s['cell']} {s['config']} (min ratio {_num(s['min_ratio'])}, target {s['target']:g})"
        for s in target_rows
        if not s["met"]
    ]
    missed_estimator = [
        f"{s['cell']} {s['config']} (min ratio {_num(s['min_estimator_ratio'])})"
        for s in target_rows
        if not s["estimator_met"]
    ]
    lines += [
        "",
        f"Targets met by the global VS fit on {len(target_rows) - len(missed)} of "
        f"{len(target_rows)} paper cell × NUTS configuration pairs"
        + (f"; not on {', '.join(missed)}." if missed else ".")
        + " By the VS estimator's faster setting at each level (the global fit at some N, "
        'or `strategy="sites"` at some `tol`: EP whose site fits are VS fits — closed-form '
        f"tilted moments for probit): {len(target_rows) - len(missed_estimator)} of "
        f"{len(target_rows)}"
        + (f"; not on {', '.join(missed_estimator)}." if missed_estimator else "."),
    ]
    lines += [
        "",
        "Columns: *best error*, *NUTS s*: NUTS's median error and time at 5000 draws; *VS s*: "
        "VS's time to that error; *min ratio*: the smallest NUTS s ÷ VS s over the levels "
        "below; *compile s*: JAX tracing and XLA compilation per run, excluded from NUTS s; "
        "*warm-up s*, *sampling s* (5000 draws), *steps/draw* (leapfrog): medians over the "
        "seeds; *divergences*: after warm-up, all seeds.",
        "",
        "## Every level",
        "",
        "| cell | NUTS | draws | NUTS error | NUTS s | VS s | NUTS s ÷ VS s | target | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in levels:
        met = ("✓" if r["met"] else "✗") if r["paper_cell"] else "—"
        lines.append(
            f"| {r['cell']} | {r['config']} | {r['draws']} | {_num(r['nuts_error'])} | "
            f"{_num(r['nuts_seconds'])} | {_num(r['vs_seconds'])} | {_ratio(r)} | "
            f"{r['target']:g} | {met} |"
        )
    lines += [
        "",
        "## VS and EP",
        "",
        "| cell | N | VS error | VS error with log Z | VS s | fallbacks | truth floor "
        "| Laplace KL (nats) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in vs.items():
        for point in vs_curve(entry):
            lines.append(
                f"| {name} | {point['multiple']}n | {_num(point['error'])} | "
                f"{_num(point['error_with_log_Z'])} | {_num(point['seconds'])} | "
                f"{point['fallbacks']}/{point['fits']} | {_num(entry['truth_floor'], '.2g')} | "
                f"{_num(entry['laplace_kl_nats'])} |"
            )
        labelled = [("EP", entry["ep"])] + [
            (f'VS `strategy="sites"`, tol={point.get("tol", 1e-8):g}', point)
            for point in sites_points(entry)
        ]
        for label, point in labelled:
            lines.append(
                f"| {name} | {label} | {_num(point['error'])} | "
                f"{_num(point['error_with_log_Z'])} | {_num(point['seconds'])} | "
                f"{int(point['fallback'])}/1 | {_num(entry['truth_floor'], '.2g')} | "
                f"{_num(entry['laplace_kl_nats'])} |"
            )
    lines += [
        "",
        "*VS error*: mean/covariance part ÷ the unit; *with log Z*: the paper's excess KL "
        "(paper cells); the unit is Laplace's excess KL with its log-Z term on the paper cells "
        "(as `paper_table.md`) and Laplace's KL on breast cancer, so *Laplace KL* (its "
        "mean/covariance part, in nats) is the unit there. *Truth floor*: the ground truth's "
        "own noise, n/(2·ESS) ÷ the unit; errors near it are not resolved.",
        "",
    ]
    return "\n".join(lines)


def figure(cells, configs, vs, path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[plot]'): no figure")
        return
    names = [cell_name(d, k) for d, k in cells if cell_name(d, k) in vs]
    cols = 3
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    colors = {"default": "C0", "dense": "C1", "2chains": "C2"}
    for ax, name in zip(axes.flat, names, strict=False):
        entry = vs[name]
        for config in configs:
            runs = load_nuts(name, config)
            if not runs:
                continue
            for r in runs:
                ax.plot([c["seconds"] for c in r["checkpoints"]],
                        [c["error"] for c in r["checkpoints"]],
                        color=colors[config], alpha=0.25, lw=0.8)  # fmt: skip
            curve = nuts_curve(runs)
            ax.plot([c["seconds"] for c in curve], [c["error"] for c in curve], "o-",
                    color=colors[config], ms=3, label=f"NUTS {config}")  # fmt: skip
        curve = vs_curve(entry)
        ax.plot([c["seconds"] for c in curve], [c["error"] for c in curve], "s-", color="k",
                ms=3, label="VS")  # fmt: skip
        if curve[0]["error_with_log_Z"] is not None:
            ax.plot([c["seconds"] for c in curve], [c["error_with_log_Z"] for c in curve],
                    "s--", color="0.5", ms=2, label="VS with log Z")  # fmt: skip
        ax.plot(entry["ep"]["seconds"], entry["ep"]["error"], "*", color="C3", ms=9, label="EP")
        sites = sites_points(entry)
        if sites:
            ax.plot([p["seconds"] for p in sites], [p["error"] for p in sites], "D", color="C4",
                    ms=5, label="VS sites (tol ladder)")  # fmt: skip
        lowest = min([c["error"] for c in curve] + [entry["ep"]["error"]])
        if entry["truth_floor"] > lowest / 10:  # else far below everything: not drawn
            ax.axhline(entry["truth_floor"], color="0.6", ls=":", lw=1, label="truth floor")
        ax.set_xscale("log")
        ax.set_yscale("log")
        dataset, link = name.rsplit("_", 1)
        ax.set_title(f"{dataset.replace('_', ' ').capitalize()}, {link}", fontsize=10)
        ax.set_xlabel("seconds (JAX compile excluded)")
        ax.set_ylabel("error ÷ Laplace's")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    handles = {}  # every panel's entries (the paper cells' "VS with log Z" too), in one legend
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    axes.flat[len(names) - 1].legend(
        list(handles.values()), list(handles), fontsize=7, loc="upper left"
    )
    fig.suptitle("NUTS (NumPyro) against VS: error against time (NUTS: median; thin: each seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(cells, configs) -> None:
    levels, summary, vs = comparison(cells, configs)
    if not levels:
        print("nothing to report yet")
        return
    first = load_nuts(summary[0]["cell"], summary[0]["config"])[0]  # its versions and machine
    info_vs = next(iter(vs.values()))
    write_csv(RESULTS / f"{NAME}.csv", levels)
    write_json(RESULTS / f"{NAME}.json", {"levels": levels, "summary": summary, "vs": vs})
    text = markdown(levels, summary, vs, first, info_vs)
    (RESULTS / f"{NAME}.md").write_text(text)
    figure(cells, configs, vs, RESULTS / f"{NAME}.png")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=str(_uci.DEFAULT_DATA_DIR))
    parser.add_argument(
        "--cells", nargs="+", default=[cell_name(*c) for c in CELLS],
        choices=[cell_name(*c) for c in CELLS],
    )  # fmt: skip
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", type=int, default=3, help="NUTS runs per configuration")
    parser.add_argument("--vs-seeds", type=int, default=5, help="VS fits per N")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--vs-only", action="store_true", help="rerun VS (all --cells), report")
    mode.add_argument("--nuts-only", action="store_true", help="only the missing NUTS runs")
    mode.add_argument("--report", action="store_true", help="only rebuild table and plot")
    args = parser.parse_args()
    cells = [c for c in CELLS if cell_name(*c) in args.cells]
    if not args.report:
        built = [Cell(d, k, args.data_dir) for d, k in cells]
        if not args.vs_only:
            run_nuts(built, args.configs, args.seeds)
        if not args.nuts_only:
            run_vs(built, args.vs_seeds, again=args.vs_only)
    report(CELLS, list(CONFIGS))


if __name__ == "__main__":
    main()
