"""Long NUTS reference runs (ground truth) for the high-dimension benchmark.

For each (case, link) cell of ``_high_dim_cases``: the Laplace approximation (Newton's method
in NumPy on the same model, θ = [w, b], w ~ N(0, C I) with C = 1, b ~ N(0, 10⁶)), then NumPyro
NUTS in the whitened parameterization θ = m + L z, where m is the mode and L Lᵀ the inverse
Hessian there (a fixed linear preconditioner: the target is the exact posterior, carried by a
constant-Jacobian map), with a diagonal mass matrix adapted on z during warm-up. The
moment-matched Gaussian of the draws (mean, covariance of θ) and the diagnostics (rank-
normalized split R-hat, bulk and tail ESS, divergences, wall time) are written to
``results/nuts_reference/<case>_<link>.npz`` (those over 1 MB, ``LARGE_REFERENCES``, to
``results/cache/nuts_reference/``, ignored by git), and the summary of every stored cell to
``summary.json`` / ``summary.md`` in ``results/nuts_reference/``.

``--restore`` copies the large references from the git history into the cache instead (a few
seconds; restore them before ``--summary-only``, which lists only the references it finds).

Needs the ``bench`` extra (``pip install numpyro jax``); the library itself never imports
them. Run single-threaded on one core, e.g.::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
    taskset -c 1 python benchmarks/nuts_reference.py --cases breast_cancer digits3
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
import zlib

import numpy as np
import scipy.sparse as sp
from _common import machine, write_json
from _high_dim_cases import (
    CASES,
    INTERCEPT_PRIOR_VAR,
    PRIOR_VAR,
    REFERENCE_DIR,
    cells,
    gaussian_kl,
    load_case,
    load_reference,
    n_gaussian_parameters,
    reference_path,
    restore_large_references,
)
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.special import expit, log_ndtr, ndtri
from scipy.stats import rankdata

# --- the model in NumPy: Laplace approximation by Newton's method -----------------------


def signed_design(X, y):
    """Rows y_i [x_i, 1], so that y_i f_i = A θ."""
    if sp.issparse(X):
        return sp.hstack([sp.csr_matrix(X).multiply(y[:, None]), y[:, None]], format="csr")
    return np.hstack([X * y[:, None], y[:, None]])


def prior_variances(dim: int) -> np.ndarray:
    v = np.full(dim, PRIOR_VAR)
    v[-1] = INTERCEPT_PRIOR_VAR
    return v


def log_posterior(A, link: str, theta: np.ndarray, weights=None) -> np.ndarray:
    """Unnormalized log posterior (normalized prior) of the rows of ``theta`` (N, p);
    ``weights``: the rows' sample weights (default 1), powers of their likelihood factors."""
    theta = np.atleast_2d(theta)
    t = np.asarray(A @ theta.T)
    log_f = log_ndtr(t) if link == "probit" else -np.logaddexp(0.0, -t)
    if weights is not None:
        log_f = log_f * np.asarray(weights)[:, None]
    v = prior_variances(theta.shape[1])
    log_prior = -0.5 * ((theta**2) @ (1 / v) + np.log(2 * np.pi * v).sum())
    return log_f.sum(axis=0) + log_prior


def _slope_curvature(t: np.ndarray, link: str):
    """d/dt log F(t) and -d²/dt² log F(t)."""
    if link == "probit":
        ratio = np.exp(-0.5 * t * t - 0.5 * math.log(2 * math.pi) - log_ndtr(t))
        return ratio, ratio * (t + ratio)
    s = expit(-t)
    return s, s * (1 - s)


def laplace(A, link: str, tol: float = 1e-10, max_iter: int = 100, weights=None):
    """Mode and negative Hessian (precision) of the log posterior, by damped Newton."""
    dim = A.shape[1]
    inv_v = 1 / prior_variances(dim)
    w = 1.0 if weights is None else np.asarray(weights, dtype=float)
    theta = np.zeros(dim)
    value = float(log_posterior(A, link, theta, weights)[0])
    for _ in range(max_iter):
        t = np.asarray(A @ theta).ravel()
        slope, curv = _slope_curvature(t, link)
        slope, curv = w * slope, w * curv
        grad = np.asarray(A.T @ slope).ravel() - theta * inv_v
        if sp.issparse(A):
            hess = (A.T @ A.multiply(curv[:, None]).tocsr()).toarray()
        else:
            hess = A.T @ (A * curv[:, None])
        hess[np.diag_indices(dim)] += inv_v
        step = cho_solve(cho_factor(hess), grad)
        decrement = float(grad @ step)
        scale = 1.0
        while True:  # backtracking: the log posterior is concave
            new = theta + scale * step
            new_value = float(log_posterior(A, link, new, weights)[0])
            if new_value >= value - 1e-12 * abs(value) or scale < 1e-8:
                break
            scale /= 2
        theta, value = new, new_value
        if decrement < tol:
            break
    t = np.asarray(A @ theta).ravel()
    _, curv = _slope_curvature(t, link)
    curv = w * curv
    if sp.issparse(A):
        hess = (A.T @ A.multiply(curv[:, None]).tocsr()).toarray()
    else:
        hess = A.T @ (A * curv[:, None])
    hess[np.diag_indices(dim)] += inv_v
    return theta, hess


def check_against_vsbayes(X, y, link: str, points: np.ndarray, weights=None) -> float:
    """Largest |difference| of our log posterior and vsbayes' model's at ``points``."""
    from vsbayes.models import BinaryGLMPosterior

    model = BinaryGLMPosterior(
        X,
        y,
        np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float),
        link,
        prior_var=PRIOR_VAR,
        intercept_prior_var=INTERCEPT_PRIOR_VAR,
    )
    ours = log_posterior(signed_design(X, y), link, points, weights)
    return float(np.max(np.abs(ours - model.log_density(points))))


# --- diagnostics (rank-normalized split R-hat and ESS, Vehtari et al. 2021) --------------


def _split(x: np.ndarray) -> np.ndarray:
    """(chains, draws, p) -> (2 chains, draws // 2, p)."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _rank_normal(x: np.ndarray) -> np.ndarray:
    c, n, p = x.shape
    ranks = rankdata(x.reshape(c * n, p), axis=0)
    return ndtri((ranks - 0.375) / (c * n + 0.25)).reshape(c, n, p)


def diagnostics(x: np.ndarray) -> dict:
    """Per-coordinate R-hat and ESS of draws ``x`` (chains, draws, p), summarized."""
    from numpyro.diagnostics import effective_sample_size, gelman_rubin

    s = _split(x)
    rhat_classic = gelman_rubin(s)
    z = _rank_normal(s)
    rhat_bulk = gelman_rubin(z)
    folded = _rank_normal(np.abs(s - np.median(s, axis=(0, 1))))
    rhat = np.maximum(rhat_bulk, gelman_rubin(folded))
    del folded
    ess_bulk = effective_sample_size(z)
    del z
    lo, hi = np.quantile(s, [0.05, 0.95], axis=(0, 1))
    ess_tail = np.minimum(
        effective_sample_size((s <= lo).astype(float)),
        effective_sample_size((s <= hi).astype(float)),
    )
    ess_mean = effective_sample_size(s)
    sd = s.std(axis=(0, 1))
    return {
        "rhat_max": float(rhat.max()),
        "rhat_classic_max": float(rhat_classic.max()),
        "ess_bulk_min": float(ess_bulk.min()),
        "ess_bulk_median": float(np.median(ess_bulk)),
        "ess_tail_min": float(ess_tail.min()),
        "ess_tail_median": float(np.median(ess_tail)),
        "mcse_mean": sd / np.sqrt(ess_mean),
    }


# --- NUTS --------------------------------------------------------------------------------


def potential(A, link: str, mode: np.ndarray, root: np.ndarray, prior_var=None, weights=None):
    """JAX potential -log p(m + L z) (constants dropped) of the whitened coordinates z.

    ``prior_var``: the prior variances of θ (default: ``prior_variances``, this benchmark's
    prior); ``benchmarks/nuts_comparison.py`` passes the paper's, with m = 0 and L = 1.
    ``weights``: the rows' sample weights (default 1).
    """
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import log_ndtr as jlog_ndtr

    inv_v = jnp.asarray(1 / (prior_variances(len(mode)) if prior_var is None else prior_var))
    m, L = jnp.asarray(mode), jnp.asarray(root)
    # A diagonal preconditioner is stored as the vector of its diagonal.
    transform = (lambda z: m + L * z) if root.ndim == 1 else (lambda z: m + L @ z)
    log_f = jlog_ndtr if link == "probit" else (lambda t: -jax.nn.softplus(-t))
    if weights is not None:
        row_weights, unweighted = jnp.asarray(weights, dtype=float), log_f

        def log_f(t):
            return row_weights * unweighted(t)

    if sp.issparse(A):
        A = sp.coo_matrix(A)
        rows, cols, vals = jnp.asarray(A.row), jnp.asarray(A.col), jnp.asarray(A.data)
        n_rows = A.shape[0]

        def latent(theta, z):
            return jax.ops.segment_sum(vals * theta[cols], rows, num_segments=n_rows)

    else:
        B, c = jnp.asarray(A @ np.diag(root) if root.ndim == 1 else A @ root), jnp.asarray(A @ mode)

        def latent(theta, z):
            return c + B @ z

    def fn(z):
        theta = transform(z)
        return -(jnp.sum(log_f(latent(theta, z))) - 0.5 * jnp.sum(theta * theta * inv_v))

    return fn


def _kl_or_nan(mean_ref, cov_ref, mean, cov) -> float:
    """gaussian_kl, or NaN when the draws' covariance is singular (fewer draws than d)."""
    try:
        return gaussian_kl(mean_ref, cov_ref, mean, cov)
    except np.linalg.LinAlgError:
        return float("nan")


def run_cell(case: str, link: str, args) -> dict:
    X, y = load_case(case)
    return sample_reference(X, y, link, case, reference_path(case, link), args)


def sample_reference(X, y, link: str, case: str, path, args, weights=None) -> dict:
    """NUTS on the posterior of ``(X, y)`` (y in {-1, +1}, rows weighted by ``weights``),
    its moments, draws' quantiles and diagnostics saved to ``path``; returns the diagnostics."""
    import jax
    import numpyro
    from numpyro.infer import MCMC, NUTS

    A = signed_design(X, y)
    dim = A.shape[1]
    start = time.perf_counter()
    mode, hess = laplace(A, link, weights=weights)
    lower = np.linalg.cholesky(hess)  # H = R Rᵀ, so L = R⁻ᵀ gives L Lᵀ = H⁻¹
    root = solve_triangular(lower, np.eye(dim), lower=True).T
    laplace_cov = root @ root.T
    precondition = args.precondition
    if precondition == "auto":
        precondition = "diagonal" if sp.issparse(A) else "laplace"
    if precondition == "diagonal":  # L = diag of the Laplace standard deviations
        root = np.sqrt(np.diag(laplace_cov))
    laplace_seconds = time.perf_counter() - start
    rng = np.random.default_rng(zlib.crc32(f"{case}/{link}".encode()))
    probe = rng.multivariate_normal(mode, laplace_cov, size=3)
    model_gap = check_against_vsbayes(X, y, link, probe, weights)
    print(
        f"{case}/{link}: d+1={dim}, Laplace in {laplace_seconds:.1f} s, "
        f"|ours - vsbayes| log density {model_gap:.1e}",
        flush=True,
    )

    fn = potential(A, link, mode, root, weights=weights)
    kernel = NUTS(
        potential_fn=fn,
        dense_mass=False,
        target_accept_prob=args.target_accept,
        max_tree_depth=args.max_tree_depth,
    )
    mcmc = MCMC(
        kernel,
        num_warmup=args.warmup,
        num_samples=args.draws,
        num_chains=args.chains,
        chain_method=args.chain_method,
        progress_bar=False,
    )
    init = args.init_scale * rng.standard_normal((args.chains, dim))
    if args.chains == 1:  # NumPyro takes a batch of starting points only for several chains
        init = init[0]
    key = jax.random.PRNGKey(zlib.crc32(f"{case}/{link}".encode()) % 2**31)
    start = time.perf_counter()
    mcmc.run(key, init_params=init, extra_fields=("diverging", "num_steps"))
    z = np.asarray(mcmc.get_samples(group_by_chain=True))
    wall = time.perf_counter() - start
    print(f"  sampled in {wall:.0f} s", flush=True)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    steps = np.asarray(extra["num_steps"])
    step_size = np.atleast_1d(np.asarray(mcmc.last_state.adapt_state.step_size))

    theta = (z * root if root.ndim == 1 else z @ root.T) + mode  # (chains, draws, dim)
    del z
    diag = diagnostics(theta)
    flat = theta.reshape(-1, dim)
    # The draws' 2.5 % and 97.5 % quantiles: the intervals a summary should match.
    quantiles = np.quantile(flat, [0.025, 0.975], axis=0)
    mean = flat.mean(axis=0)
    centered = flat - mean
    cov = centered.T @ centered / (len(flat) - 1)
    del theta, flat, centered
    mcse = diag.pop("mcse_mean")
    n_par = n_gaussian_parameters(dim)
    result = {
        "case": case,
        "link": link,
        "M": int(A.shape[0]),
        "d": int(dim - 1),
        "chains": args.chains,
        "draws_per_chain": args.draws,
        "warmup": args.warmup,
        "chain_method": args.chain_method,
        "precondition": precondition,
        "target_accept": args.target_accept,
        "sampler": (
            "NumPyro NUTS on z, θ = m + L z (m: Laplace mode, "
            + (
                "L Lᵀ: inverse Hessian at m"
                if precondition == "laplace"
                else "L: diagonal of the Laplace standard deviations"
            )
            + f"), diagonal mass matrix adapted on z, target accept {args.target_accept}, "
            f"max tree depth {args.max_tree_depth}"
        ),
        **diag,
        "n_gaussian_parameters": n_par,
        "noise_floor_nats": n_par / (2 * diag["ess_bulk_min"]),
        "divergences": int(np.asarray(extra["diverging"]).sum()),
        "mean_leapfrog_steps": float(steps.mean()),
        "max_leapfrog_steps": int(steps.max()),
        "step_size": [float(s) for s in step_size],
        "wall_seconds": wall,
        "laplace_seconds": laplace_seconds,
        "kl_nuts_laplace": _kl_or_nan(mean, cov, mode, laplace_cov),
        "max_mean_gap_laplace_in_mcse": float(np.max(np.abs(mean - mode) / mcse)),
        "log_density_gap_vs_vsbayes": model_gap,
        "cov_dtype": "float32" if dim > 1000 else "float64",
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        mean=mean,
        cov=cov.astype(np.float32) if dim > 1000 else cov,
        mcse_mean=mcse,
        quantiles=quantiles,
        laplace_mode=mode,
        diagnostics=json.dumps(result),
    )
    print(
        f"  R-hat max {result['rhat_max']:.4f}, ESS bulk min/median "
        f"{result['ess_bulk_min']:.0f}/{result['ess_bulk_median']:.0f}, "
        f"{result['divergences']} divergences, {result['mean_leapfrog_steps']:.1f} steps/draw, "
        f"{wall:.0f} s, KL(NUTS||Laplace) {result['kl_nuts_laplace']:.3g}",
        flush=True,
    )
    return result


# --- importance-sampling cross-check ------------------------------------------------------


def is_check(case: str, link: str, draws: int, start: str = "laplace") -> dict:
    """IS moments (Student-t proposal refined once around ``start``, the Laplace Gaussian
    or the NUTS one) against the reference."""
    from _ground_truth import ground_truth

    from vsbayes import Gaussian
    from vsbayes.exceptions import EstimationError

    mean_ref, cov_ref, diag = load_reference(case, link)
    with np.load(reference_path(case, link)) as data:
        mcse = data["mcse_mean"]
    X, y = load_case(case)
    A = signed_design(X, y)
    mode, hess = laplace(A, link)
    around = (
        Gaussian(mode, np.linalg.inv(hess)) if start == "laplace" else Gaussian(mean_ref, cov_ref)
    )
    try:
        truth = ground_truth(lambda t: log_posterior(A, link, t), around, draws, seed=0)
    except EstimationError as exc:  # degenerate weights: no positive-definite IS covariance
        result = {"case": case, "link": link, "is_start": start, "is_draws": draws}
        result["failed"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(result), flush=True)
        return result
    mean, cov = np.asarray(truth["mean"]), np.asarray(truth["cov"])
    gap = np.abs(mean - mean_ref) / mcse
    result = {
        "case": case,
        "link": link,
        "is_draws": draws,
        "is_start": start,
        "is_ess": truth["ess"],
        "is_seconds": truth["seconds"],
        "max_mean_gap_in_nuts_mcse": float(gap.max()),
        "median_mean_gap_in_nuts_mcse": float(np.median(gap)),
        "max_sd_relative_gap": float(np.max(np.abs(np.sqrt(np.diag(cov) / np.diag(cov_ref)) - 1))),
        "kl_nuts_is": gaussian_kl(mean_ref, cov_ref, mean, cov),
        "nuts_noise_floor_nats": diag["noise_floor_nats"],
    }
    print(json.dumps(result), flush=True)
    return result


# --- summary -----------------------------------------------------------------------------


def write_summary() -> None:
    rows = []
    for case, link in cells():
        ref = load_reference(case, link)
        if ref is not None:
            rows.append(ref[2])
    info = machine()
    platform_line = f"processor {platform.processor() or 'n/a'}, {platform.platform()}"
    versions = {k: rows[0][k] for k in ("jax", "numpyro")} if rows else {}
    write_json(
        REFERENCE_DIR / "summary.json",
        {"machine": info, "platform": platform_line, **versions, "cells": rows},
    )
    lines = [
        "# NUTS references of the high-dimension benchmark",
        "",
        "Produced by `benchmarks/nuts_reference.py`. Model: vsbayes' binary GLM at C = 1 "
        "(w ~ N(0, I), intercept ~ N(0, 10⁶), θ = [w, b]). Sampler: NumPyro NUTS on the "
        "coordinates z of θ = m + L z, m the Laplace mode and L a fixed linear preconditioner "
        "(the target is the exact posterior): `laplace`, L Lᵀ the inverse Hessian at m "
        "(whitening); `diagonal`, L the diagonal of the Laplace standard deviations (used "
        "where a dense L would dominate the cost). Diagonal mass matrix adapted on z during "
        "warm-up, chains run one after another on one core. R-hat: "
        "rank-normalized split R-hat (max of bulk and folded), max over the d+1 coordinates; "
        "ESS: bulk ESS (rank-normalized, split chains), min / median over the coordinates. "
        "Noise floor: n / (2 ESS_min) nats with n = (d+1) + (d+1)(d+2)/2 the Gaussian's "
        "parameters, the order of the KL of the moment-matched Gaussian from the exact one "
        "due to Monte Carlo error. Bulk ESS can exceed the draws (NUTS is antithetic for "
        "means); the covariance's error goes with the ESS of second moments, closer to the "
        "tail ESS column, so n / (2 ESS_tail_min) is the more conservative floor. "
        "KL(NUTS‖Laplace): the Laplace approximation's error.",
        "",
        "| case | link | M | d | precond. | chains × draws | R-hat max | ESS bulk min / median "
        "| ESS tail min | noise floor (nats) | divergences | steps/draw | wall (s) "
        "| KL(NUTS‖Laplace) |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['link']} | {r['M']} | {r['d']} | "
            f"{r.get('precondition', 'laplace')} | {r['chains']} × "
            f"{r['draws_per_chain']} | {r['rhat_max']:.4f} | {r['ess_bulk_min']:.0f} / "
            f"{r['ess_bulk_median']:.0f} | {r['ess_tail_min']:.0f} | "
            f"{r['noise_floor_nats']:.3g} | {r['divergences']} | "
            f"{r['mean_leapfrog_steps']:.1f} | {r['wall_seconds']:.0f} | "
            f"{r['kl_nuts_laplace']:.3g} |"
        )
    checks_path = REFERENCE_DIR / "is_check.json"
    checks = json.loads(checks_path.read_text()) if checks_path.is_file() else []
    if checks:
        lines += [
            "",
            "Cross-check by importance sampling (Student-t proposal, ν = 5, refined once around "
            "the starting Gaussian, Laplace or the NUTS one; `_ground_truth.ground_truth`; the "
            "IS estimate is consistent whatever the start): largest / median gap of "
            "the IS mean from the NUTS mean in NUTS Monte Carlo standard errors, largest "
            "relative gap of the standard deviations, KL(NUTS‖IS).",
            "",
            "| case | link | start | IS draws | IS ESS | max / median mean gap (MCSE) "
            "| max sd gap | KL(NUTS‖IS) |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for c in checks:
            if "failed" in c:
                lines.append(
                    f"| {c['case']} | {c['link']} | {c['is_start']} | {c['is_draws']} | — "
                    f"| failed: degenerate weights, no positive-definite IS covariance | | |"
                )
                continue
            lines.append(
                f"| {c['case']} | {c['link']} | {c.get('is_start', 'laplace')} | "
                f"{c['is_draws']} | {c['is_ess']:.0f} | "
                f"{c['max_mean_gap_in_nuts_mcse']:.2f} / {c['median_mean_gap_in_nuts_mcse']:.2f} "
                f"| {c['max_sd_relative_gap']:.2%} | {c['kl_nuts_is']:.3g} |"
            )
    missing = [f"{c}/{k}" for c, k in cells() if load_reference(c, k) is None]
    short = [
        f"{r['case']}/{r['link']} ({r['chains']} × {r['draws_per_chain']})"
        for r in rows
        if r["chains"] * r["draws_per_chain"] < 40_000
    ]
    lines += [""]
    raised = [
        f"{r['case']}/{r['link']} ({r['target_accept']})"
        for r in rows
        if r.get("target_accept", 0.8) != 0.8
    ]
    if raised:
        lines.append(f"Target acceptance raised from 0.8 (fewer divergences): {', '.join(raised)}.")
    lines += [f"{r['case']}/{r['link']}: {r['note']}." for r in rows if r.get("note")]
    if short:
        lines.append(f"Fewer than 4 × 10,000 draws (time budget): {', '.join(short)}.")
    if missing:
        lines.append(f"Not run: {', '.join(missing)}.")
    lines += [
        "",
        f"Machine: {info['cpu']} ({platform_line}), run on 1 core; JAX "
        f"{versions.get('jax', '?')}, NumPyro {versions.get('numpyro', '?')}, NumPy "
        f"{info['numpy']}; commit {info['commit']}.",
        "",
    ]
    (REFERENCE_DIR / "summary.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--links", nargs="+", default=["logistic", "probit"])
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=10_000, help="per chain, after warm-up")
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--chain-method", default="sequential")
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--init-scale", type=float, default=1.5, help="of z at the start")
    parser.add_argument(
        "--precondition",
        choices=["auto", "laplace", "diagonal"],
        default="auto",
        help="θ = m + L z with L the Laplace covariance's Cholesky factor, or its diagonal "
        "(auto: diagonal for the sparse case, where a dense L would dominate the cost)",
    )
    parser.add_argument(
        "--is-start",
        choices=["laplace", "nuts"],
        default="laplace",
        help="the Gaussian around which --is-check's proposal starts",
    )
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument(
        "--is-check",
        type=int,
        default=0,
        metavar="DRAWS",
        help="instead of NUTS: check the stored references of --cases by importance sampling",
    )
    parser.add_argument(
        "--restore",
        action="store_true",
        help="copy the references over 1 MB from the git history into results/cache/",
    )
    args = parser.parse_args()
    if args.restore:
        for path in restore_large_references():
            print(f"restored {path}")
        return

    import jax

    jax.config.update("jax_enable_x64", True)
    if args.is_check:
        path = REFERENCE_DIR / "is_check.json"
        checks = json.loads(path.read_text()) if path.is_file() else []
        for case, link in cells():
            if case in args.cases and link in args.links:
                new = is_check(case, link, args.is_check, args.is_start)
                checks = [c for c in checks if (c["case"], c["link"]) != (case, link)]
                checks.append(new)
        write_json(path, checks)
    elif not args.summary_only:
        for case, link in cells():
            if case in args.cases and link in args.links:
                run_cell(case, link, args)
                write_summary()
    write_summary()


if __name__ == "__main__":
    main()
