"""``vsbayes compare``: every method on one data set, error against a long-run reference.

The error of a method is the paper's measure, ``excess_kl(reference, estimate)``, between
the posterior Gaussians of the binary problem. The reference is the strongest available:
expectation propagation (as close as VS with 32n points on breast cancer, at a fraction of
the cost), corrected to the exact posterior's mean and covariance by importance sampling
with EP's Gaussian as the proposal and as a control variate — the moments are EP's plus
the weighted average of ``(w − 1)`` times the draws' deviations, so that the Monte Carlo
error scales with how far EP is from the exact posterior, not with the posterior's spread
(a plain 64n-point VS reference carries an error of the size of those it judges). Its
Pareto k̂ says whether the weights can be trusted, and the excess KL between the
references of its two halves of draws measures its own noise. The sampling methods run
with N = 2n, 4n, 8n, … posterior evaluations, doubling while the next fit is predicted to
fit the time budget; the deterministic methods run once.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .._blas import one_blas_thread
from .._memory import check_memory
from ..engine import n_family_params
from ..engine.bayesian_monte_carlo import MAX_BMC_SAMPLES
from ..estimators import INTERCEPT_PRIOR_VAR
from ..exceptions import EstimationError
from ..gaussian import Gaussian, excess_kl
from ..models import BinaryGLMPosterior
from ..models.psis import PARETO_K_THRESHOLD, pareto_smoothed_log_weights
from ..models.work import likelihood_point_work
from .data import Dataset, load_dataset
from .methods import DETERMINISTIC, SAMPLING, TimedFit, make_estimator, timed_fit
from .plots import PLOT_HINT, new_figure
from .summary import STDOUT, Console, counted, format_table, write_json

__all__ = [
    "REFERENCE_FACTOR",
    "REFERENCE_SEED",
    "REFERENCE_WORK_LIMIT",
    "reference_posterior",
    "reference_work",
    "run_compare",
]

#: The reference: importance draws of EP's Gaussian, REFERENCE_FACTOR · n of them. Its
#: noise falls like 1/N: at 16 times the ladder's top N it stays below a fifth of the best
#: sampled fit's error (at 64n, VS at 32n reached the reference's own noise, 5.4e-4 nats, on
#: 200 rows × 3 features).
REFERENCE_FACTOR = 512
#: EP's covariance is widened by the first of these factors for the draws, and by the next
#: ones while Pareto k̂ stays above 0.7: a proposal wider than the posterior keeps the
#: importance weights bounded (at 512n draws of EP's own Gaussian on 200 rows × 3
#: features, Pareto k̂ reached 0.79 — a heavy tail the extra draws made visible — and 0.45
#: widened by 1.05, the reference's noise 1.5e-5 → 2.9e-5 nats; by 1.1: 0.23, 9e-5). Fewer
#: rows per parameter leave the posterior further from EP's Gaussian: 60 rows × 3 features
#: (D-151), k̂ 0.76 at 1.05, 0.20 at 1.2; with a zero column, 1.34 and 0.40.
REFERENCE_WIDENINGS = (1.05, 1.2, 1.5)
#: The most work the reference may plan, in multiply-adds, over every proposal it may draw
#: from (REFERENCE_WIDENINGS): --budget does not bound it (it bounds the ladders), so it is
#: sized before anything runs and refused beyond this. Measured (one proposal, one BLAS
#: thread, 2 cores at load 7): 1.1e9 planned multiply-adds a second at 20 rows (20-60
#: features; 20 x 60 plans 1.9e10, 18 s), 4e9 at 569 x 30 (the breast-cancer data: 1.1e10,
#: 2.7 s). 20 rows x 100 features plans 1.2e11 a proposal, 3.5e11 for three: refused (it
#: had taken 224 s on BLAS's own threads).
REFERENCE_WORK_LIMIT = 1e11
#: Multiply-adds' time a draw takes per parameter beyond its products: drawing the normal,
#: the prior's and the proposal's densities, the copies of the draws (fresh memory: they
#: dominate at few rows; 100 brings 20 rows x 20-60 features to one rate, 1.1e9 a second).
DRAW_ENTRY_WORK = 100.0
#: Fixed, and apart from the default --seed: the reference's draws are its own.
REFERENCE_SEED = 2013
#: The sampling ladders stop at N = LADDER_TOP · n, a sixteenth of the reference's N: beyond
#: it the measured error would mostly be the reference's own.
LADDER_TOP = 32


@dataclass
class Row:
    """One fit of the comparison (``n_samples`` is None for a deterministic method)."""

    method: str
    n_samples: int | None
    seconds: float | None
    excess_kl: float | None
    laplace_fallback: bool = False
    note: str = ""
    warnings: list[str] = field(default_factory=list)


def run_compare(args: argparse.Namespace, console: Console) -> int:
    """Run ``vsbayes compare`` with parsed arguments; return the exit status.

    Parameters
    ----------
    args : argparse.Namespace
        ``data``, ``target``, ``link``, ``C``, ``budget``, ``seed``, ``plot``, ``json``.
    console : Console
        Where progress and warnings go.

    Returns
    -------
    int
        0 (errors raise ValueError, OSError or EstimationError).
    """
    data = load_dataset(args.data, args.target, header=not args.no_header)
    for text in data.warnings:
        console.warn(text)
    if len(data.classes) != 2:
        raise ValueError(
            f"compare needs a binary target; {data.target_name!r} has {len(data.classes)} "
            f"classes. Use vsbayes fit, which fits them all (the multinomial posterior with "
            f"the logistic link, one-vs-rest with probit), or name a two-class column with "
            f"--target."
        )
    n_params = data.X.shape[1] + 1
    n = n_family_params(n_params)
    reference, reference_record = _reference(data, args, n, console)

    rows: list[Row] = []
    deterministic = [m for m in DETERMINISTIC if not (m == "vb" and args.link == "probit")]
    for method in deterministic:
        estimator = make_estimator(method, args.link, C=args.C, seed=args.seed)
        rows.append(_row(method, None, timed_fit(estimator, data.X, data.y, "compare"), reference))
        console.progress(f"compare: {method} ({rows[-1].seconds:.2f} s)")
    for method in SAMPLING:
        rows += _ladder(method, data, args, n, reference, console)
    for row in rows:
        for text in row.warnings:
            size = "" if row.n_samples is None else f" N={row.n_samples}"
            console.warn(f"{row.method}{size}: {text}")

    plot_written = bool(args.plot) and _plot(args.plot, rows, data, args)
    plot = args.plot if plot_written else None
    summary = _summary(data, args, n, reference_record, rows, plot)
    if args.json != STDOUT:  # "--json -": the JSON is the output, in the table's place
        print(_format(summary))
    if args.plot and not plot_written:
        console.warn(f"no plot written: it needs matplotlib ({PLOT_HINT}).")
    if args.json:
        write_json(args.json, summary)
    return 0


@dataclass
class Reference:
    """The reference posterior and what it rests on."""

    posterior: Gaussian
    seconds: float
    log_evidence: float
    n_draws: int
    pareto_k: float
    noise: float
    widening: float  #: the factor EP's covariance was widened by for the draws


def _reference(data: Dataset, args, n: int, console: Console):
    """The reference every method is compared with (see the module docstring)."""
    n_draws = REFERENCE_FACTOR * n
    # reference_posterior holds about five arrays of n_draws points at once (measured: 2.4
    # GB at 60 features); beyond a few dozen features they outgrow the memory (500: 1 TB).
    n_params = data.X.shape[1] + 1
    what = f"the reference's {n_draws} importance draws over {n_params} parameters"
    remedy = (
        f"compare draws {REFERENCE_FACTOR}n points, n = (p+1)(p+2)/2 for p parameters: compare "
        f"fewer features, or fit them with vsbayes fit."
    )
    check_memory(5 * 8.0 * n_draws * n_params, what, remedy)
    labels = np.where(data.y == data.classes[1], 1.0, -1.0)
    model = BinaryGLMPosterior(
        data.X,
        labels,
        np.ones(len(labels)),
        args.link,
        prior_var=args.C,
        intercept_prior_var=INTERCEPT_PRIOR_VAR,
    )
    # Sized before EP runs: a wider proposal draws them all again.
    work = reference_work(model, n_draws)
    attempts = len(REFERENCE_WIDENINGS)
    if attempts * work > REFERENCE_WORK_LIMIT:
        raise ValueError(
            f"{what} would take {work:.3g} multiply-adds, and up to {attempts * work:.3g} "
            f"(up to {attempts * n_draws} draws) if the weights' tail asks for a wider "
            f"proposal: beyond compare's limit of {REFERENCE_WORK_LIMIT:.3g} multiply-adds "
            f"for its reference (--budget bounds the methods' fits, not the reference). "
            f"{remedy[0].upper()}{remedy[1:]}"
        )
    console.progress(
        f"compare: reference: EP, then {n_draws} importance draws ({work:.3g} multiply-adds; "
        f"up to {attempts}x that if the proposal must be widened)"
    )
    start = time.perf_counter()
    ep = timed_fit(
        make_estimator("ep", args.link, C=args.C, seed=args.seed), data.X, data.y, "compare"
    )
    for text in ep.warnings:
        console.warn(f"reference: {text}")
    if ep.fell_back[0]:
        raise EstimationError(
            "the reference's expectation propagation fell back to the Laplace approximation, "
            "so there is no reliable reference on these data (see the warning above)."
        )
    for widening in REFERENCE_WIDENINGS:
        proposal = ep.estimator.posteriors_[0].scale_cov(widening)
        posterior, pareto_k, noise = reference_posterior(
            model, proposal, n_draws, np.random.default_rng(REFERENCE_SEED)
        )
        if pareto_k <= PARETO_K_THRESHOLD:
            break
        console.progress(
            f"compare: reference: Pareto k {pareto_k:.2f} with EP's covariance widened by "
            f"{widening:g}; drawing again, wider"
        )
    seconds = time.perf_counter() - start
    console.progress(f"compare: reference done ({seconds:.2f} s)")
    if pareto_k > PARETO_K_THRESHOLD:
        console.warn(
            f"reference: the importance weights from EP have a heavy tail (Pareto k = "
            f"{pareto_k:.2f} > {PARETO_K_THRESHOLD}, EP's covariance widened by "
            f"{widening:g}); the reference is uncertain."
        )
    evidence = float(ep.estimator.log_marginal_likelihood_value_)
    record = Reference(posterior, seconds, evidence, n_draws, pareto_k, noise, widening)
    return posterior, record


def reference_work(model, n_draws: int) -> float:
    """Multiply-adds of one :func:`reference_posterior` call of ``n_draws`` draws: per draw,
    the log-density, the draw through the proposal's factor (d²), its share of the second
    moments of the whole and of the halves (2d²), and the per-entry work of drawing it
    (DRAW_ENTRY_WORK · d)."""
    d = model.dim
    return n_draws * (likelihood_point_work(model) + 3.0 * d * d + DRAW_ENTRY_WORK * d)


@one_blas_thread  # as every fit: BLAS's pool of threads stalls on a busy machine
def reference_posterior(model, proposal: Gaussian, n_draws: int, rng) -> tuple:
    """The exact posterior's mean and covariance by importance sampling from ``proposal``,
    which is also the control variate; its Pareto k̂ and its noise.

    Parameters
    ----------
    model : BinaryGLMPosterior
        The log posterior density (``log_density``).
    proposal : Gaussian
        Close to the posterior (EP's).
    n_draws : int
        Draws, in antithetic pairs (even: rounded up).
    rng : numpy.random.Generator

    Returns
    -------
    posterior : Gaussian
        The reference (``log_Z`` the proposal's).
    pareto_k : float
        Pareto k̂ of the importance weights (above 0.7: not to be trusted).
    noise : float
        ``excess_kl`` between the references of the two halves of the draws, / 4: about
        the reference's own error (each half has twice the variance of the whole).
    """
    half = (n_draws + 1) // 2
    root = np.linalg.cholesky(proposal.cov)
    z = rng.standard_normal((half, proposal.dim))
    deviations = np.concatenate([z, -z]) @ root.T  # antithetic: odd moments cancel
    theta = proposal.mean + deviations
    log_q = -0.5 * np.concatenate([(z * z).sum(axis=1)] * 2)
    log_ratio = model.log_density(theta) - log_q
    _, k = pareto_smoothed_log_weights(log_ratio[None, :])

    def moments(rows) -> Gaussian:
        w = np.exp(log_ratio[rows] - log_ratio[rows].max())
        w *= len(w) / w.sum()
        excess = (w - 1.0) / len(w)  # control variate: E_p[g] = E_q[g] + E_q[(w - 1) g]
        d = deviations[rows]
        shift = excess @ d
        second = proposal.cov + (d * excess[:, None]).T @ d
        cov = second - np.outer(shift, shift)
        return Gaussian(proposal.mean + shift, 0.5 * (cov + cov.T), proposal.log_Z)

    # Halves that keep the antithetic pairs together.
    first = np.r_[0 : half // 2, half : half + half // 2]
    in_second = np.ones(2 * half, dtype=bool)
    in_second[first] = False
    second = np.flatnonzero(in_second)  # (np.setdiff1d's sort took a fifth of the time)
    noise = excess_kl(moments(first), moments(second)) / 4.0
    return moments(slice(None)), float(k[0]), float(noise)


def _row(method: str, n_samples: int | None, fit: TimedFit, reference) -> Row:
    fell_back = fit.fell_back[0]
    return Row(
        method=method,
        n_samples=n_samples,
        seconds=fit.seconds,
        excess_kl=excess_kl(reference, fit.estimator.posteriors_[0]),
        laplace_fallback=fell_back,
        note="fell back to Laplace" if fell_back else "",
        warnings=fit.warnings,
    )


def _ladder(method: str, data: Dataset, args, n: int, reference, console) -> list[Row]:
    """Fits with N = 2n, 4n, … while the next one is predicted to take at most the budget.

    The prediction is the last time times the last growth ratio, at least 2 (the cost is
    at least linear in N; BMC's grows like N³): stopping only after a fit over budget
    could cost 8 budgets for BMC.
    """
    limit = LADDER_TOP * n
    if method == "bmc":
        limit = min(limit, MAX_BMC_SAMPLES)
    if 2 * n > limit:
        return [Row(method, None, None, None, note=f"skipped: 2n = {2 * n} > {limit}")]
    rows: list[Row] = []
    n_samples = 2 * n
    while n_samples <= limit:
        # VS as one global fit: its error against N is what the ladder measures.
        options = {"strategy": "global"} if method == "vs" else {}
        estimator = make_estimator(
            method, args.link, C=args.C, n_samples=n_samples, seed=args.seed, **options
        )
        fit = timed_fit(estimator, data.X, data.y, "compare")
        rows.append(_row(method, n_samples, fit, reference))
        seconds = rows[-1].seconds
        console.progress(f"compare: {method} N={n_samples} ({seconds:.2f} s)")
        growth = seconds / rows[-2].seconds if len(rows) > 1 else 2.0
        if seconds * max(growth, 2.0) > args.budget:
            break
        n_samples *= 2
    return rows


def _summary(data: Dataset, args, n: int, reference: Reference, rows, plot) -> dict:
    laplace_kl = next(r.excess_kl for r in rows if r.method == "laplace")
    results = []
    for row in rows:
        ratio = None
        if row.excess_kl is not None and laplace_kl > 0:
            ratio = row.excess_kl / laplace_kl
        results.append(
            {
                "method": row.method,
                "n_samples": row.n_samples,
                "n_samples_over_n": None if row.n_samples is None else row.n_samples // n,
                "seconds": row.seconds,
                "excess_kl": row.excess_kl,
                "ratio_to_laplace": ratio,
                "laplace_fallback": row.laplace_fallback,
                "note": row.note,
                "warnings": row.warnings,
            }
        )
    return {
        "command": "compare",
        "data": data.summary(),
        "settings": {
            "link": args.link,
            "C": args.C,
            "budget": args.budget,
            "seed": args.seed,
            "n_params": data.X.shape[1] + 1,
            "n_family_params": n,
            "ladder_top": LADDER_TOP * n,
        },
        "reference": {
            "method": "ep + importance sampling",
            "n_draws": reference.n_draws,
            "seed": REFERENCE_SEED,
            "seconds": reference.seconds,
            "log_evidence": reference.log_evidence,
            "pareto_k": reference.pareto_k,
            "noise": reference.noise,
            "widening": reference.widening,
        },
        "results": results,
        "plot": None if plot is None else str(plot),
        "warnings": list(data.warnings),
    }


def _format(summary: dict) -> str:
    data, settings, ref = summary["data"], summary["settings"], summary["reference"]
    classes = ", ".join(f"{c['label']} ({c['rows']})" for c in data["classes"])
    n, p = settings["n_family_params"], settings["n_params"]
    lines = [
        f"vsbayes compare: every method against a reference posterior ({settings['link']} link)",
        f"data:      {data['source']}",
        f"           {counted(data['rows'], 'row')}, {counted(data['features'], 'feature')}, "
        f"standardized (mean 0, sd 1)",
        f"target:    {data['target']}; classes {classes}",
        f"prior:     coefficients N(0, C I) with C = {settings['C']:g}; "
        f"p = {p} parameters, n = (p+1)(p+2)/2 = {n}",
        f"reference: the exact posterior's mean and covariance, from EP corrected by "
        f"{ref['n_draws']} = {REFERENCE_FACTOR}n importance draws (seed {ref['seed']}, "
        f"{ref['seconds']:.2f} s; EP's covariance widened by {ref['widening']:g}; Pareto k "
        f"{ref['pareto_k']:.2f}; its own error about {ref['noise']:.2g} nats)",
        f"sampling:  vs, is, bmc with N = 2n, 4n, … up to {LADDER_TOP}n (bmc: "
        f"{MAX_BMC_SAMPLES}), doubled while the next fit is predicted to take at most "
        f"{settings['budget']:g} s; seed {settings['seed']}",
        "error:     excess KL of the posterior Gaussian to the reference's "
        "(vsbayes.excess_kl); / Laplace = ratio to the Laplace approximation's",
        "",
    ]
    table = []
    for r in summary["results"]:
        size = "-" if r["n_samples"] is None else f"{r['n_samples']} = {r['n_samples_over_n']}n"
        table.append(
            [
                r["method"],
                size,
                "-" if r["seconds"] is None else f"{r['seconds']:.3f}",
                _g(r["excess_kl"]),
                _g(r["ratio_to_laplace"]),
                r["note"],
            ]
        )
    lines.append(
        format_table(
            ["method", "N", "seconds", "excess KL", "/ Laplace", "note"], table, align="llrrrl"
        )
    )
    if summary["plot"] is not None:
        lines += ["", f"plot:      {summary['plot']}"]
    return "\n".join(lines)


def _g(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if math.isfinite(value) else str(value)


def _plot(path, rows: list[Row], data: Dataset, args) -> bool:
    """Excess KL against fit time, log–log, to ``path``; False when matplotlib is absent.

    The Agg canvas is attached explicitly: no pyplot, so no global backend is changed and
    no display is needed.
    """
    figure = new_figure(7.0, 4.8)
    if figure is None:
        return False
    axes = figure.add_subplot()
    styles = iter(["C0", "C1", "C2", "C3", "C4", "C5", "C6"])
    for method in SAMPLING:
        points = [
            (r.seconds, r.excess_kl)
            for r in rows
            if r.method == method and r.excess_kl is not None and r.excess_kl > 0
        ]
        if points:
            times, errors = zip(*points, strict=True)
            axes.plot(times, errors, marker="o", color=next(styles), label=method)
    # A fallback's error is Laplace's: cross it out so it does not read as the method's.
    fallbacks = [(r.seconds, r.excess_kl) for r in rows if r.n_samples and r.laplace_fallback]
    if fallbacks:
        times, errors = zip(*fallbacks, strict=True)
        axes.plot(times, errors, "kx", markersize=9, linestyle="none", label="Laplace fallback")
    for r in rows:
        if r.n_samples is None and r.excess_kl is not None and r.excess_kl > 0:
            axes.axhline(
                r.excess_kl,
                linestyle="--",
                color=next(styles),
                label=f"{r.method} ({r.seconds:.2g} s)",
            )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("fit time (s)")
    axes.set_ylabel("excess KL to the reference")
    axes.set_title(
        f"{data.source}\n{args.link} link, C = {args.C:g}, {len(data.y)} rows, "
        f"{counted(data.X.shape[1], 'feature')}",
        fontsize=9,
    )
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize=8)
    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise OSError(f"cannot write the plot {path}: {error.strerror or error}") from None
    return True
