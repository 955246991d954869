"""``vsbayes fit``: one method on one data set, the posterior summary of every coefficient."""

from __future__ import annotations

import argparse

import numpy as np

from ..engine import n_family_params
from ..estimators import INTERCEPT_PRIOR_VAR
from ..estimators._strategy import DEFAULT_TARGET_KL
from ..exceptions import TooFewSamplesError
from .data import Dataset, load_dataset
from .methods import METHOD_TITLES, SAMPLING, TimedFit, in_options, make_estimator, timed_fit
from .plots import PLOT_HINT, write_fit_plot
from .summary import (
    STDOUT,
    Console,
    coefficient_summary,
    counted,
    diagnostics,
    format_diagnostics,
    format_number,
    format_table,
    write_json,
)

__all__ = ["fit_summary", "run_fit"]


def run_fit(args: argparse.Namespace, console: Console) -> int:
    """Run ``vsbayes fit`` with parsed arguments; print the summary, return the exit status.

    Parameters
    ----------
    args : argparse.Namespace
        ``data``, ``target``, ``link``, ``method``, ``C``, ``n_samples``, ``seed``,
        ``json``, ``plot``, ``verbose``.
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
    options = {}
    if args.method == "vs":
        options = {"strategy": args.strategy, "time_budget": args.budget}
        if args.target_kl is not None:  # else the estimator's default ("auto")
            options["target_kl"] = args.target_kl
    estimator = make_estimator(
        args.method, args.link, C=args.C, n_samples=args.n_samples, seed=args.seed, **options
    )
    name = type(estimator).__name__
    console.progress(f"fit: {name} on {len(data.y)} rows x {data.X.shape[1]} features")
    try:
        fit = timed_fit(estimator, data.X, data.y)
    except TooFewSamplesError as error:
        # The library's advice names its parameters (n_samples, VS's family): say what
        # this command offers instead.
        raise ValueError(
            f"--n-samples {error.n_samples} is fewer than the n = {error.needed} parameters "
            f"of the Gaussian the points determine, too few for --method {args.method}: "
            f"use --n-samples {error.needed} or more, or --n-samples auto (the default)."
        ) from None
    console.progress(f"fit: done ({fit.seconds:.2f} s)")
    for text in fit.warnings:
        console.warn(text)
    summary = fit_summary(data, fit, args)
    if args.plot:
        if write_fit_plot(args.plot, fit.estimator, data):
            summary["plot"] = str(args.plot)
        else:
            console.warn(f"no plot written: it needs matplotlib ({PLOT_HINT}).")
    if args.json != STDOUT:  # "--json -": the JSON is the output, in the table's place
        print(_format_summary(summary))
    if args.json:
        write_json(args.json, summary)
    return 0


def fit_summary(data: Dataset, fit: TimedFit, args: argparse.Namespace) -> dict:
    """The summary of a fit as a JSON-ready dict (what the table prints).

    Parameters
    ----------
    data : Dataset
        The data the estimator was fitted on.
    fit : TimedFit
        The fitted estimator, its time and warnings.
    args : argparse.Namespace
        The command's settings.

    Returns
    -------
    dict
        ``data``, ``settings``, ``problems`` (one per binary problem, or one for the
        multinomial posterior: ``positive_class``, ``coefficients`` with ``name``,
        ``mean``, ``sd``, ``q025``, ``q975``, ``p_sign`` — the multinomial's centred per
        class, named ``"class: feature"`` —, ``log_evidence``, ``ran_as``, ``accuracy``,
        ``diagnostics``, ``laplace_fallback``, and for VS ``strategy``,
        ``strategy_reason``, ``predicted_error`` and ``stop_reason``),
        ``training_accuracy``, ``seconds``, ``plot`` and ``warnings``.
    """
    estimator = fit.estimator
    classes = estimator.classes_.tolist()
    n_params = len(estimator.posteriors_[0].mean)
    evidence = estimator.log_marginal_likelihood_value_
    evidences = [evidence] if len(estimator.posteriors_) == 1 else list(evidence)
    multinomial = estimator._is_multinomial()
    tables = coefficient_summary(estimator, data.feature_names)
    if multinomial:  # one joint problem: every class's centred coefficients
        coefficients = [
            [
                {**c.as_dict(), "name": f"{label}: {c.name}"}
                for label, table in zip(classes, tables, strict=True)
                for c in table
            ]
        ]
    else:
        coefficients = [[c.as_dict() for c in table] for table in tables]
    problems = []
    for k, posterior in enumerate(estimator.posteriors_):
        problem = {
            # Binary: P(y = classes_[1]); one-vs-rest: class k against the rest;
            # multinomial: one joint problem over all classes (None).
            "positive_class": None
            if multinomial
            else classes[1]
            if len(classes) == 2
            else classes[k],
            "coefficients": coefficients[k],
            "log_evidence": float(evidences[k]),
            "diagnostics": diagnostics(posterior),
            "laplace_fallback": fit.fell_back[k],
        }
        if hasattr(estimator, "strategy_"):  # VS: the global fit or VS site fits in EP
            problem["strategy"] = str(estimator.strategy_[k])
            problem["strategy_reason"] = in_options(estimator.strategy_reason_[k])
            problem["predicted_error"] = _finite_or_none(estimator.kl_error_[k])
            problem["stop_reason"] = estimator.stop_reason_[k]
        problem["ran_as"] = _ran_as(args.method, problem, posterior)
        problem["accuracy"] = _accuracy(args.method, problem, args.target_kl)
        problems.append(problem)
    sampling = args.method in SAMPLING
    return {
        "command": "fit",
        "data": data.summary(),
        "settings": {
            "estimator": type(estimator).__name__,
            "method": args.method,
            "link": args.link,
            "C": args.C,
            "intercept_prior_var": INTERCEPT_PRIOR_VAR,
            "n_samples": args.n_samples if sampling else None,
            # The count used (None: no points, e.g. VS site fits inside EP).
            "n_samples_used": _samples_used(estimator) if sampling else None,
            "strategy": getattr(args, "strategy", None) if args.method == "vs" else None,
            "target_kl": getattr(args, "target_kl", None),
            "time_budget": getattr(args, "budget", None),
            "n_family_params": n_family_params(n_params),
            "seed": args.seed,
            "verbose": bool(getattr(args, "verbose", False)),
        },
        "multinomial": multinomial,
        "problems": problems,
        "training_accuracy": float(estimator.score(data.X, data.y)),
        "seconds": fit.seconds,
        "plot": None,
        "warnings": [*data.warnings, *fit.warnings],
    }


# What each route is, in words (the strategy names are VS's ``strategy_``).
_ROUTES = {
    "sites": "expectation propagation, each row's likelihood factor fitted by variational "
    "sampling (no global sample of points)",
    "global": "one variational-sampling fit of the whole posterior",
    # strategy_ "laplace" with a predicted error: many rows per parameter, where the
    # skewness-corrected Laplace approximation is already within target_kl.
    "skew": "the Laplace approximation with its mean moved by the skewness correction "
    "(enough for this many rows per parameter: no global fit or EP was run)",
    # strategy_ "laplace" without one: VS kept the Laplace approximation by its own choice
    # (e.g. beyond the dense covariance's size); strategy_reason_ says why.
    "laplace": "the Laplace approximation, kept by the strategy (--verbose says why)",
}
_FALLBACK = "the Laplace approximation (the chosen fit failed; see the warning)"
_METHODS = {
    "laplace": "the Laplace approximation (a Gaussian at the posterior mode)",
    "ep": "expectation propagation (one Gaussian site per row)",
    "vb": "variational Bayes (the Jaakkola–Jordan bound)",
    "is": "importance sampling",
    "bmc": "Bayesian Monte Carlo",
}


def _route(problem: dict) -> str:
    """The key of ``_ROUTES`` for VS's route of one problem."""
    if problem["strategy"] == "laplace" and problem.get("predicted_error") is not None:
        return "skew"
    return problem["strategy"]


def _ran_as(method: str, problem: dict, posterior) -> str:
    """Which computation gave the posterior, in plain words."""
    if problem["laplace_fallback"]:
        return _FALLBACK
    if "strategy" in problem:
        text = _ROUTES.get(_route(problem), problem["strategy"])
        if problem["strategy"] == "global":
            points = getattr(posterior, "n_samples", None)
            if points:
                text += f" with {points} posterior evaluations"
        return text
    text = _METHODS.get(method, method)
    kernel = _kernel_name(posterior)
    if kernel is not None:
        text += f" on points drawn through {kernel}"
    return text


def _kernel_name(posterior) -> str | None:
    """What the sampling methods' first round drew through, in words (None: no rounds)."""
    rounds = getattr(posterior, "rounds", None)
    if not rounds:
        return None
    kernel = rounds[0].kernel
    named = kernel.diagnostics() if hasattr(kernel, "diagnostics") else {}
    if "site_change" in named:
        return "expectation propagation's posterior"
    return "the Laplace approximation"


def _accuracy(method: str, problem: dict, target_kl: float | None = None) -> str:
    """How close the posterior is to the exact one, as far as the method can tell
    (``target_kl``: --target-kl, None for the estimator's default)."""
    values = problem["diagnostics"]
    if problem["laplace_fallback"]:
        return "unknown (the Laplace approximation has no error estimate)"
    error = problem.get("predicted_error")
    if "strategy" in problem and _route(problem) == "skew":
        target = DEFAULT_TARGET_KL if target_kl is None else target_kl
        return (
            f"predicted error {error:.2g} nats of excess KL (from the likelihood's skewness "
            f"at the mode), within the {target:g}-nat target (--target-kl)"
        )
    if problem.get("strategy") == "global" and error is not None:
        closeness = "close" if error < 0.1 else "approximate"
        return (
            f"predicted error {error:.2g} nats of excess KL ({closeness}: below 0.1 the "
            f"Gaussian is hard to tell from the best one)"
        )
    if problem.get("strategy") == "global":
        return "unknown (too few effective points to predict the error)"
    if "site_change" in values:  # EP (also VS's site route)
        if values.get("converged"):
            return (
                f"EP converged (its sites moved by at most {values['site_change']:.1g} in "
                f"the last sweep); EP's own distance to the exact posterior is not "
                f"estimated here (vsbayes compare measures it)"
            )
        return "EP stopped before converging (see the warning); treat it with care"
    if method == "laplace":
        return "no error estimate (exact only for a Gaussian posterior)"
    if "ess" in values:
        return (
            f"{values['ess']:.0f} effective points of {values.get('n_samples', '?')} drawn "
            f"(the more, the smaller the Monte Carlo error; no estimate of it)"
        )
    if method == "vb":
        converged = "converged" if values.get("converged") else "did not converge"
        return (
            f"the bound's updates {converged}; VB's Gaussian is known to be too narrow, by "
            f"an amount not estimated here (vsbayes compare measures it)"
        )
    return "no error estimate (vsbayes compare measures it)"


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _samples_used(estimator) -> int | None:
    """Points of the (first) fit: None where no point was drawn (VS site fits in EP)."""
    return getattr(estimator.posteriors_[0], "n_samples", None)


def _format_summary(summary: dict) -> str:
    data, settings = summary["data"], summary["settings"]
    verbose = settings["verbose"]
    classes = ", ".join(f"{c['label']} ({c['rows']})" for c in data["classes"])
    lines = [
        f"vsbayes fit: Bayesian {settings['link']} regression, "
        f"{METHOD_TITLES[settings['method']]} ({settings['estimator']})",
        f"data:      {data['source']}",
        f"           {counted(data['rows'], 'row')}, {counted(data['features'], 'feature')}, "
        f"standardized "
        f"(mean 0, sd 1: the prior treats every coefficient alike)",
        f"target:    {data['target']}; classes {classes}",
        f"prior:     coefficients N(0, C I) with C = {settings['C']:g}, "
        f"intercept N(0, {settings['intercept_prior_var']:.0e})".replace("e+0", "e"),
    ]
    if verbose:
        lines += [
            f"method:    {settings['method']}, link {settings['link']}",
            f"N:         {_samples_text(settings, summary['problems'])}",
            f"seed:      {settings['seed']}",
        ]
    binary = len(summary["problems"]) == 1 and not summary["multinomial"]
    negative = data["classes"][0]["label"]
    for k, problem in enumerate(summary["problems"]):
        positive = problem["positive_class"]
        if positive is None:
            title = (
                f"problem: {data['target']}, all classes (multinomial; coefficients centred "
                f"over the classes, w_k - mean of w, the part the data determine)"
            )
        elif binary:
            title = f"problem: {data['target']} = {positive} (against {negative})"
        else:
            title = (
                f"problem {k + 1} of {len(summary['problems'])}: "
                f"{data['target']} = {positive} vs rest"
            )
        rows = [
            [
                c["name"],
                format_number(c["mean"], scale=c["sd"]),
                format_number(c["sd"]),
                *(format_number(c[key], scale=c["sd"]) for key in ("q025", "q975")),
                f"{c['p_sign']:.3f}",
            ]
            for c in problem["coefficients"]
        ]
        lines += [
            "",
            title,
            format_table(["coefficient", "mean", "sd", "2.5%", "97.5%", "P(sign)"], rows),
            f"ran as:           {problem['ran_as']}",
            f"accuracy:         {problem['accuracy']}",
            f"log evidence:     {problem['log_evidence']:.4f}",
        ]
        if verbose:
            lines.append(f"diagnostics:      {format_diagnostics(problem['diagnostics'])}")
            if "strategy" in problem:
                lines.append(
                    f"strategy:         {problem['strategy']} ({problem['strategy_reason']})"
                )
            if problem.get("stop_reason") is not None:
                # The skewness-corrected Laplace and the multinomial EP routes stop at the
                # target too ("target_kl"), with no points drawn ("N: none" above).
                drew = problem.get("strategy") == "global"
                label = "sampling stopped" if drew else "stopped, no sampling"
                lines.append(f"{label}: {problem['stop_reason']}")
    lines += [
        "",
        "P(sign): posterior probability that the coefficient has the sign of its mean.",
        f"training accuracy: {summary['training_accuracy']:.4f}",
        f"fit time:          {summary['seconds']:.3f} s",
    ]
    if summary["plot"] is not None:
        lines.append(f"plot:              {summary['plot']}")
    if not verbose:
        lines.append("(--verbose: the method's settings, diagnostics and route details)")
    return "\n".join(lines)


def _samples_text(settings: dict, problems: list[dict]) -> str:
    if settings["n_samples_used"] is None and settings["method"] == "vs":
        routes = {_route(problem) for problem in problems}
        if routes == {"sites"}:
            return "none (VS site fits inside expectation propagation)"
        return "none (no global fit ran: see each problem's route)"
    if settings["n_samples_used"] is None and settings["method"] in SAMPLING:
        # (the fallback's posterior draws no points: the method's did, to no avail)
        return "none (the fit fell back to the Laplace approximation: see the warning)"
    if settings["n_samples_used"] is None:
        return f"none ({settings['method']} is deterministic)"
    used, n = settings["n_samples_used"], settings["n_family_params"]
    rule = "auto" if settings["n_samples"] == "auto" else "given"
    return (
        f"{used} posterior evaluations per problem ({rule}, {used / n:.3g}n with "
        f"n = {n} parameters of a Gaussian)"
    )
