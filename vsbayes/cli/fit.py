"""``vsbayes fit``: one method on one data set, the posterior summary of every coefficient."""

from __future__ import annotations

import argparse

import numpy as np

from ..engine import n_family_params
from ..estimators import INTERCEPT_PRIOR_VAR
from .data import Dataset, load_dataset
from .methods import METHOD_TITLES, SAMPLING, TimedFit, make_estimator, timed_fit
from .summary import (
    INTERCEPT_NAME,
    Console,
    coefficient_summary,
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
        ``json``.
    console : Console
        Where progress and warnings go.

    Returns
    -------
    int
        0 (errors raise ValueError, OSError or EstimationError).
    """
    data = load_dataset(args.data, args.target)
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
    fit = timed_fit(estimator, data.X, data.y)
    console.progress(f"fit: done ({fit.seconds:.2f} s)")
    for text in fit.warnings:
        console.warn(text)
    summary = fit_summary(data, fit, args)
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
        ``data``, ``settings``, ``problems`` (one per binary problem: ``positive_class``,
        ``coefficients`` with ``name``, ``mean``, ``sd``, ``q025``, ``q975``,
        ``log_evidence``, ``diagnostics``, ``laplace_fallback``, and for VS ``strategy``
        and ``strategy_reason``), ``training_accuracy``,
        ``seconds`` and ``warnings``.
    """
    estimator = fit.estimator
    classes = estimator.classes_.tolist()
    # Coefficients and intercept, of one binary problem or of all classes (multinomial).
    n_params = len(estimator.posteriors_[0].mean)
    evidence = estimator.log_marginal_likelihood_value_
    evidences = [evidence] if len(estimator.posteriors_) == 1 else list(evidence)
    problems = []
    multinomial = estimator._is_multinomial()
    names = data.feature_names
    if multinomial:  # θ = [W.ravel(), b]: each class's coefficients, then the intercepts
        names = [f"{c}: {n}" for c in classes for n in data.feature_names]
        names += [f"{c}: {INTERCEPT_NAME}" for c in classes]
    for k, posterior in enumerate(estimator.posteriors_):
        problems.append(
            {
                # Binary: P(y = classes_[1]); one-vs-rest: class k against the rest;
                # multinomial: one joint problem over all classes (None).
                "positive_class": None
                if multinomial
                else classes[1]
                if len(classes) == 2
                else classes[k],
                "coefficients": [c.as_dict() for c in coefficient_summary(posterior, names)],
                "log_evidence": float(evidences[k]),
                "diagnostics": diagnostics(posterior),
                "laplace_fallback": fit.fell_back[k],
            }
        )
        if hasattr(estimator, "strategy_"):  # VS: the global fit or VS site fits in EP
            problems[-1]["strategy"] = str(estimator.strategy_[k])
            problems[-1]["strategy_reason"] = estimator.strategy_reason_[k]
            problems[-1]["predicted_error"] = _finite_or_none(estimator.kl_error_[k])
            problems[-1]["stop_reason"] = estimator.stop_reason_[k]
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
        },
        "problems": problems,
        "training_accuracy": float(estimator.score(data.X, data.y)),
        "seconds": fit.seconds,
        "warnings": fit.warnings,
    }


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _samples_used(estimator) -> int | None:
    """Points of the (first) fit: None where no point was drawn (VS site fits in EP)."""
    return getattr(estimator.posteriors_[0], "n_samples", None)


def _format_summary(summary: dict) -> str:
    data, settings = summary["data"], summary["settings"]
    classes = ", ".join(f"{c['label']} ({c['rows']})" for c in data["classes"])
    if settings["n_samples_used"] is None and settings["method"] == "vs":
        samples = "none (VS site fits inside expectation propagation: see strategy)"
    elif settings["n_samples_used"] is None:
        samples = f"none ({settings['method']} is deterministic)"
    else:
        used, n = settings["n_samples_used"], settings["n_family_params"]
        rule = "auto" if settings["n_samples"] == "auto" else "given"
        samples = (
            f"{used} posterior evaluations per problem ({rule}, {used / n:.3g}n with "
            f"n = {n} parameters of a Gaussian)"
        )
    lines = [
        f"vsbayes fit: Bayesian {settings['link']} regression, "
        f"{METHOD_TITLES[settings['method']]} ({settings['estimator']})",
        f"data:      {data['source']}",
        f"           {data['rows']} rows, {data['features']} features, standardized "
        f"(mean 0, sd 1: the prior treats every coefficient alike)",
        f"target:    {data['target']}; classes {classes}",
        f"method:    {settings['method']}, link {settings['link']}",
        f"prior:     coefficients N(0, C I) with C = {settings['C']:g}, "
        f"intercept N(0, {settings['intercept_prior_var']:.0e})".replace("e+0", "e"),
        f"N:         {samples}",
        f"seed:      {settings['seed']}",
    ]
    binary = len(summary["problems"]) == 1
    negative = data["classes"][0]["label"]
    for k, problem in enumerate(summary["problems"]):
        positive = problem["positive_class"]
        if positive is None:
            title = f"problem: {data['target']}, all classes (multinomial)"
        elif binary:
            title = f"problem: {data['target']} = {positive} (against {negative})"
        else:
            title = (
                f"problem {k + 1} of {len(summary['problems'])}: "
                f"{data['target']} = {positive} vs rest"
            )
        rows = [
            [c["name"], *(format_number(c[key]) for key in ("mean", "sd", "q025", "q975"))]
            for c in problem["coefficients"]
        ]
        lines += [
            "",
            title,
            format_table(["coefficient", "mean", "sd", "2.5%", "97.5%"], rows),
            f"log evidence:     {problem['log_evidence']:.4f}",
            f"diagnostics:      {format_diagnostics(problem['diagnostics'])}",
        ]
        if "strategy" in problem:
            lines.append(f"strategy:         {problem['strategy']} ({problem['strategy_reason']})")
        if problem.get("stop_reason") is not None:  # a global VS fit
            error = problem["predicted_error"]
            # kl_error is infinite when the fit has fewer effective points than parameters.
            said = "unavailable" if error is None else f"{error:.3g} nats (excess KL"
            lines.append(
                f"predicted error:  {said}; sampling stopped: {problem['stop_reason']}"
                + ("" if error is None else ")")
            )
        if settings["method"] != "laplace":
            fallback = "yes (see the warning)" if problem["laplace_fallback"] else "no"
            lines.append(f"Laplace fallback: {fallback}")
    lines += [
        "",
        f"training accuracy: {summary['training_accuracy']:.4f}",
        f"fit time:          {summary['seconds']:.3f} s",
    ]
    return "\n".join(lines)
