"""Long NUTS reference runs (ground truth) for the shrinkage-prior benchmark.

Each cell is a (prior, dataset) pair of ``_shrinkage_cases`` (binary logistic regression,
standardized features, θ = [w, b], b ~ N(0, 10⁶)). NumPyro NUTS on the exact posterior:

* Gaussian, Laplace and Student-t priors: in the whitened coordinates z of θ = m + L z, m and
  L Lᵀ the mode and inverse Hessian of a Gaussian surrogate (the same likelihood, the prior
  replaced by the Gaussian of the prior's variance: Laplace 2s², Student t ν s²/(ν − 2)) —
  a fixed linear map, so the target is still the exact posterior; diagonal mass matrix
  adapted on z. The Laplace prior's kink at 0 is left as it is (NUTS's leapfrog crosses it
  with an O(ε) error that the accept step corrects).
* Horseshoe: the non-centred parametrization w_j = τ λ_j z_j, z_j ~ N(0, 1), λ_j = exp(u_j)
  half-Cauchy(0, 1) (u_j unconstrained, with its Jacobian), b = m_b + s_b β (the surrogate's
  mean and sd of the intercept); a high target acceptance (``--hs-target-accept``, default
  0.99) against the funnel, the divergences reported.

Chains run one after another on one core. Stored per cell (``_shrinkage_cases.reference_path``):
the mean, covariance and sds of θ's draws, the Monte Carlo standard errors of the means, and
the diagnostics (rank-normalized split R-hat max and bulk/tail ESS min of θ's coordinates,
and for the horseshoe of the sampler's coordinates (z, u, β) too; divergences, leapfrog steps,
wall time). Summary of every stored cell: ``summary.json`` / ``summary.md`` beside them.

Needs the ``bench`` extra. Run single-threaded, niced, e.g.::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
    nice -n 10 python benchmarks/nuts_shrinkage_reference.py --priors laplace \\
        --datasets ionosphere wpbc breast_cancer
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import zlib

import _uci
import numpy as np
from _common import machine, write_json
from _high_dim_cases import gaussian_kl, n_gaussian_parameters
from _shrinkage_cases import (
    DATASETS,
    INTERCEPT_PRIOR_VAR,
    PRIOR_LABELS,
    PRIORS,
    REFERENCE_DIR,
    load_dataset,
    load_reference,
    log_prior_coefficients,
    prior_variance,
    reference_path,
)
from nuts_reference import diagnostics, signed_design
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.special import expit

#: Why a cell has no reference yet (shown in the summary while it has none).
NOT_RUN_REASONS = {
    "horseshoe/sparse_d200": (
        "horseshoe/sparse_d200: not run in the time budget. Its 401 non-centred coordinates "
        "at target acceptance 0.99 need, extrapolated from the real sets (190-340 leapfrog "
        "steps per draw at d ≈ 32, the steps growing with d), about 10-40 CPU-minutes for "
        "4 × (1000 + 2000) iterations on one core: run "
        "`nuts_shrinkage_reference.py --priors horseshoe --datasets sparse_d200 "
        "--hs-draws 2000 --hs-warmup 1000` on a quiet machine."
    ),
}
SURROGATE_VAR_HORSESHOE = 1.0  # the horseshoe has no variance: the intercept's surrogate


def surrogate_laplace(A: np.ndarray, variances: np.ndarray, tol: float = 1e-10):
    """Mode and precision of the logistic posterior with the prior N(0, diag(variances))."""
    theta = np.zeros(A.shape[1])
    inv_v = 1.0 / variances

    def value(t):
        return float(-np.logaddexp(0.0, -(A @ t)).sum() - 0.5 * (t * t * inv_v).sum())

    current = value(theta)
    for _ in range(100):
        s = expit(-(A @ theta))
        grad = A.T @ s - theta * inv_v
        hess = A.T @ (A * (s * (1 - s))[:, None]) + np.diag(inv_v)
        step = cho_solve(cho_factor(hess), grad)
        scale = 1.0
        while value(theta + scale * step) < current - 1e-12 * abs(current) and scale > 1e-8:
            scale /= 2
        theta = theta + scale * step
        current = value(theta)
        if grad @ step < tol:
            break
    s = expit(-(A @ theta))
    hess = A.T @ (A * (s * (1 - s))[:, None]) + np.diag(inv_v)
    return theta, hess


def log_posterior(A: np.ndarray, prior: str, theta: np.ndarray) -> np.ndarray:
    """Unnormalized log posterior (normalized prior) of the rows of ``theta`` (N, d+1)."""
    theta = np.atleast_2d(theta)
    log_lik = -np.logaddexp(0.0, -(theta @ A.T)).sum(axis=1)
    b = theta[:, -1]
    log_b = -0.5 * (b * b / INTERCEPT_PRIOR_VAR + np.log(2 * np.pi * INTERCEPT_PRIOR_VAR))
    return log_lik + log_prior_coefficients(prior, theta[:, :-1]) + log_b


def _log_prior_jax(prior: str):
    """JAX log prior of the coefficients w (up to a constant), smooth priors."""
    import jax.numpy as jnp

    p = PRIORS[prior]
    if prior == "gaussian":
        return lambda w: -0.5 * jnp.sum(w * w) / p["var"]
    if prior == "laplace":
        return lambda w: -jnp.sum(jnp.abs(w)) / p["scale"]
    if prior == "student_t":
        nu, s = p["df"], p["scale"]
        return lambda w: -0.5 * (nu + 1) * jnp.sum(jnp.log1p((w / s) ** 2 / nu))
    raise ValueError(prior)


def whitened_potential(A: np.ndarray, prior: str, mode: np.ndarray, root: np.ndarray):
    """-log p(m + L z) (constants dropped) for the Gaussian, Laplace and Student-t priors."""
    import jax
    import jax.numpy as jnp

    B, c = jnp.asarray(A @ root), jnp.asarray(A @ mode)
    m, L = jnp.asarray(mode), jnp.asarray(root)
    log_prior = _log_prior_jax(prior)

    def fn(z):
        theta = m + L @ z
        log_lik = -jnp.sum(jax.nn.softplus(-(c + B @ z)))
        b = theta[-1]
        return -(log_lik + log_prior(theta[:-1]) - 0.5 * b * b / INTERCEPT_PRIOR_VAR)

    return fn


def horseshoe_parts(A: np.ndarray, intercept_mean: float, intercept_sd: float):
    """The non-centred horseshoe's potential of q = [z (d), u (d), β] and the map q → θ."""
    import jax
    import jax.numpy as jnp

    tau = PRIORS["horseshoe"]["global_scale"]
    d = A.shape[1] - 1
    Xs, ys = jnp.asarray(A[:, :-1]), jnp.asarray(A[:, -1])

    def theta_of(q):
        z, u, beta = q[..., :d], q[..., d : 2 * d], q[..., 2 * d :]
        return jnp.concatenate([tau * jnp.exp(u) * z, intercept_mean + intercept_sd * beta], -1)

    def fn(q):
        theta = theta_of(q)
        z, u, b = q[:d], q[d : 2 * d], theta[-1]
        log_lik = -jnp.sum(jax.nn.softplus(-(Xs @ theta[:-1] + ys * b)))
        # λ = e^u, half-Cauchy: log p(u) = log(2/π) - log(1 + e^{2u}) + u
        log_prior = -0.5 * jnp.sum(z * z) + jnp.sum(u - jax.nn.softplus(2 * u))
        return -(log_lik + log_prior - 0.5 * b * b / INTERCEPT_PRIOR_VAR)

    return fn, theta_of


def run_cell(prior: str, dataset: str, args) -> dict:
    import jax
    import numpyro
    from numpyro.infer import MCMC, NUTS

    X, y = load_dataset(dataset, args.data_dir)
    A = signed_design(X, y)
    dim = A.shape[1]
    horseshoe = prior == "horseshoe"
    start = time.perf_counter()
    variances = np.full(dim, prior_variance(prior) if not horseshoe else SURROGATE_VAR_HORSESHOE)
    variances[-1] = INTERCEPT_PRIOR_VAR
    mode, hess = surrogate_laplace(A, variances)
    lower = np.linalg.cholesky(hess)
    root = solve_triangular(lower, np.eye(dim), lower=True).T  # L Lᵀ = H⁻¹
    surrogate_cov = root @ root.T
    surrogate_seconds = time.perf_counter() - start
    seed = zlib.crc32(f"shrinkage/{prior}/{dataset}".encode())
    rng = np.random.default_rng(seed)
    target_accept = args.hs_target_accept if horseshoe else args.target_accept
    draws = args.hs_draws if horseshoe else args.draws
    warmup = args.hs_warmup if horseshoe else args.warmup
    if horseshoe:
        fn, theta_of = horseshoe_parts(A, mode[-1], float(np.sqrt(surrogate_cov[-1, -1])))
        n_par = 2 * (dim - 1) + 1
        init = np.concatenate(
            [
                0.5 * rng.standard_normal((args.chains, dim - 1)),
                0.5 * rng.standard_normal((args.chains, dim - 1)),
                rng.standard_normal((args.chains, 1)),
            ],
            axis=1,
        )
        mass = "dense" if args.hs_dense else "diagonal"
        sampler = (
            "NumPyro NUTS, non-centred horseshoe: w_j = τ exp(u_j) z_j, z_j ~ N(0, 1), "
            f"exp(u_j) ~ half-Cauchy(0, 1), b = m_b + s_b β; {mass} mass matrix adapted, "
            f"target accept {target_accept}, max tree depth "
            f"{args.max_tree_depth}"
        )
    else:
        fn = whitened_potential(A, prior, mode, root)
        n_par = dim
        init = args.init_scale * rng.standard_normal((args.chains, dim))
        # the potential's consistency with the normalized log posterior: a constant gap
        probe = rng.multivariate_normal(mode, surrogate_cov, size=4)
        probe_z = solve_triangular(root, (probe - mode).T, lower=False).T
        gaps = log_posterior(A, prior, probe) + np.array([float(fn(z)) for z in probe_z])
        print(f"  potential vs log posterior: spread of the gap {np.ptp(gaps):.1e}", flush=True)
        sampler = (
            "NumPyro NUTS on z, θ = m + L z (m, L Lᵀ: mode and inverse Hessian of the "
            "Gaussian surrogate with the prior's variance), diagonal mass matrix adapted on z, "
            f"target accept {target_accept}, max tree depth {args.max_tree_depth}"
        )
    print(f"{prior}/{dataset}: d+1 = {dim}, {n_par} sampled coordinates", flush=True)
    kernel = NUTS(
        potential_fn=fn,
        dense_mass=bool(horseshoe and args.hs_dense),
        target_accept_prob=target_accept,
        max_tree_depth=args.max_tree_depth,
    )
    mcmc = MCMC(
        kernel,
        num_warmup=warmup,
        num_samples=draws,
        num_chains=args.chains,
        chain_method="sequential",
        progress_bar=False,
    )
    key = jax.random.PRNGKey(seed % 2**31)
    start = time.perf_counter()
    mcmc.run(key, init_params=init, extra_fields=("diverging", "num_steps"))
    q = np.asarray(mcmc.get_samples(group_by_chain=True))
    wall = time.perf_counter() - start
    extra = mcmc.get_extra_fields(group_by_chain=True)
    steps = np.asarray(extra["num_steps"])
    step_size = np.atleast_1d(np.asarray(mcmc.last_state.adapt_state.step_size))
    if horseshoe:
        theta = np.asarray(theta_of(q))
        sampler_diag = diagnostics(q)
        sampler_diag.pop("mcse_mean")
    else:
        theta = q @ root.T + mode
    del q
    diag = diagnostics(theta)
    flat = theta.reshape(-1, dim)
    mean = flat.mean(axis=0)
    centered = flat - mean
    cov = centered.T @ centered / (len(flat) - 1)
    del theta, flat, centered
    mcse = diag.pop("mcse_mean")
    n_gauss = n_gaussian_parameters(dim)
    result = {
        "prior": prior,
        "prior_label": PRIOR_LABELS[prior],
        "prior_parameters": PRIORS[prior],
        "dataset": dataset,
        "source": DATASETS[dataset][1],
        "M": int(A.shape[0]),
        "d": int(dim - 1),
        "chains": args.chains,
        "draws_per_chain": draws,
        "warmup": warmup,
        "target_accept": target_accept,
        "max_tree_depth": args.max_tree_depth,
        "sampler": sampler,
        **diag,
        "noise_floor_nats": n_gauss / (2 * diag["ess_bulk_min"]),
        "divergences": int(np.asarray(extra["diverging"]).sum()),
        "mean_leapfrog_steps": float(steps.mean()),
        "max_leapfrog_steps": int(steps.max()),
        "hit_max_tree_depth": int((steps >= 2**args.max_tree_depth - 1).sum()),
        "step_size": [float(s) for s in step_size],
        "wall_seconds": wall,
        "surrogate_seconds": surrogate_seconds,
        "kl_nuts_surrogate": gaussian_kl(mean, cov, mode, surrogate_cov),
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
    }
    if horseshoe:
        result.update({f"sampler_{k}": v for k, v in sampler_diag.items()})
    cov_store = cov.astype(np.float32) if dim > 100 else cov
    path = reference_path(prior, dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        mean=mean,
        cov=cov_store,
        sd=np.sqrt(np.diag(cov)),
        mcse_mean=mcse,
        diagnostics=json.dumps(result),
    )
    print(
        f"  R-hat max {result['rhat_max']:.4f}, ESS bulk min/median "
        f"{result['ess_bulk_min']:.0f}/{result['ess_bulk_median']:.0f}, tail min "
        f"{result['ess_tail_min']:.0f}, {result['divergences']} divergences, "
        f"{result['mean_leapfrog_steps']:.1f} steps/draw, {wall:.0f} s"
        + (
            f"; sampler coordinates: R-hat max {result['sampler_rhat_max']:.4f}, ESS bulk min "
            f"{result['sampler_ess_bulk_min']:.0f}"
            if horseshoe
            else ""
        ),
        flush=True,
    )
    return result


def is_check(prior: str, dataset: str, draws: int, data_dir) -> dict:
    """Importance sampling of the exact posterior (the horseshoe by its marginal density,
    no latent scales) from a Student-t proposal around the NUTS Gaussian, against the
    reference: an independent check of the sampler and of its parametrization."""
    from _ground_truth import ground_truth

    from vsbayes import Gaussian
    from vsbayes.exceptions import EstimationError

    mean_ref, cov_ref, _ = load_reference(prior, dataset)
    with np.load(reference_path(prior, dataset)) as data:
        mcse = data["mcse_mean"]
    X, y = load_dataset(dataset, data_dir)
    A = signed_design(X, y)
    try:
        truth = ground_truth(
            lambda t: log_posterior(A, prior, t), Gaussian(mean_ref, cov_ref), draws, seed=0
        )
    except EstimationError as error:  # degenerate weights: no positive-definite covariance
        result = {"prior": prior, "dataset": dataset, "is_draws": draws, "is_ess": 0.0}
        result["failed"] = f"{type(error).__name__}: {error}"
        print(json.dumps(result), flush=True)
        return result
    mean, cov = np.asarray(truth["mean"]), np.asarray(truth["cov"])
    gap = np.abs(mean - mean_ref) / mcse
    # the IS mean's own error, sd / √ESS, beside NUTS's: the gap's standard error
    combined = np.abs(mean - mean_ref) / np.sqrt(mcse**2 + np.diag(cov_ref) / truth["ess"])
    result = {
        "prior": prior,
        "dataset": dataset,
        "is_draws": draws,
        "is_ess": truth["ess"],
        "max_mean_gap_in_nuts_mcse": float(gap.max()),
        "median_mean_gap_in_nuts_mcse": float(np.median(gap)),
        "max_mean_gap_in_joint_se": float(combined.max()),
        "median_mean_gap_in_joint_se": float(np.median(combined)),
        "max_sd_relative_gap": float(np.max(np.abs(np.sqrt(np.diag(cov) / np.diag(cov_ref)) - 1))),
        "kl_nuts_is": gaussian_kl(mean_ref, cov_ref, mean, cov),
    }
    print(json.dumps(result), flush=True)
    return result


def write_summary() -> None:
    rows = []
    for prior in PRIORS:
        for dataset in DATASETS:
            ref = load_reference(prior, dataset)
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
        "# NUTS references of the shrinkage-prior benchmark",
        "",
        "Produced by `benchmarks/nuts_shrinkage_reference.py` (its docstring has the sampler "
        "details; `_shrinkage_cases.py` the model, priors and data). Binary logistic "
        "regression on standardized features, θ = [w, b], b ~ N(0, 10⁶), the prior on w as "
        "in the first column. R-hat: rank-normalized split R-hat (max of bulk and folded), "
        "max over θ's d+1 coordinates; ESS: bulk (min / median) and tail (min) over θ's "
        "coordinates; for the horseshoe also over the sampler's coordinates (z, log λ, β). "
        "Noise floor: n / (2 ESS_bulk_min) nats, n = the Gaussian's parameters. Chains run "
        "one after the other on one core of a machine shared with other jobs (wall times "
        "are loaded ones).",
        "",
        "| prior | dataset | M | d | chains × draws | target accept | R-hat max | ESS bulk min / "
        "median | ESS tail min | sampler R-hat / ESS min | divergences | steps/draw "
        "| wall (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        sampler = (
            f"{r['sampler_rhat_max']:.4f} / {r['sampler_ess_bulk_min']:.0f}"
            if "sampler_rhat_max" in r
            else "—"
        )
        lines.append(
            f"| {r['prior_label']} | {r['dataset']} | {r['M']} | {r['d']} | {r['chains']} × "
            f"{r['draws_per_chain']} | {r['target_accept']} | {r['rhat_max']:.4f} | "
            f"{r['ess_bulk_min']:.0f} / {r['ess_bulk_median']:.0f} | {r['ess_tail_min']:.0f} "
            f"| {sampler} | {r['divergences']} | {r['mean_leapfrog_steps']:.1f} | "
            f"{r['wall_seconds']:.0f} |"
        )
    checks_path = REFERENCE_DIR / "is_check.json"
    checks = json.loads(checks_path.read_text()) if checks_path.is_file() else []
    if checks:
        lines += [
            "",
            "Cross-check by importance sampling of the exact posterior (the horseshoe by its "
            "marginal density p(w) = exp(u) E₁(u) / (τ √(2π³)), u = w²/2τ², no latent scales; "
            "Student-t proposal, ν = 5, around the NUTS Gaussian, refined once; "
            "`_ground_truth.ground_truth`): largest / median gap of the IS mean from the NUTS "
            "mean in the gap's standard error (NUTS's MCSE and the IS mean's sd/√ESS "
            "combined; in NUTS MCSE alone where not recorded), largest relative gap of the "
            "sds, KL(NUTS‖IS). The check has power only where the IS ESS is large: the "
            "horseshoe's spike at 0 defeats a Student-t proposal (ESS < 100: no check).",
            "",
            "| prior | dataset | IS draws | IS ESS | max / median mean gap (SE) | max sd gap "
            "| KL(NUTS‖IS) |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for c in checks:
            if c["is_ess"] < 100:  # failed, or too few effective draws to check anything
                lines.append(
                    f"| {c['prior']} | {c['dataset']} | {c['is_draws']} | {c['is_ess']:.0f} | "
                    "no check: degenerate weights | | |"
                )
                continue
            unit = "joint_se" if "max_mean_gap_in_joint_se" in c else "nuts_mcse"
            lines.append(
                f"| {c['prior']} | {c['dataset']} | {c['is_draws']} | {c['is_ess']:.0f} | "
                f"{c[f'max_mean_gap_in_{unit}']:.2f} / {c[f'median_mean_gap_in_{unit}']:.2f}"
                f" | {c['max_sd_relative_gap']:.2%} | {c['kl_nuts_is']:.3g} |"
            )
    missing = [f"{p}/{d}" for p in PRIORS for d in DATASETS if load_reference(p, d) is None]
    lines += [""]
    lines += [f"{r['prior']}/{r['dataset']}: {r['note']}." for r in rows if r.get("note")]
    if missing:
        lines.append(f"Not run: {', '.join(missing)}.")
    lines += [NOT_RUN_REASONS[m] for m in missing if m in NOT_RUN_REASONS]
    lines += [
        "",
        f"Machine: {info['cpu']} ({platform_line}), run on 1 core, niced; JAX "
        f"{versions.get('jax', '?')}, NumPyro {versions.get('numpyro', '?')}, NumPy "
        f"{info['numpy']}; commit {info['commit']}; load average at the end "
        f"{' / '.join(f'{x:g}' for x in info['load_average'])}.",
        "",
    ]
    (REFERENCE_DIR / "summary.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--priors", nargs="+", default=list(PRIORS), choices=list(PRIORS))
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--data-dir", default=str(_uci.DEFAULT_DATA_DIR))
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=10_000, help="per chain, after warm-up")
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--hs-draws", type=int, default=5_000, help="horseshoe, per chain")
    parser.add_argument("--hs-warmup", type=int, default=2_000)
    parser.add_argument("--hs-target-accept", type=float, default=0.99)
    parser.add_argument("--hs-dense", action="store_true", help="dense mass (horseshoe)")
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--init-scale", type=float, default=1.0, help="of z at the start")
    parser.add_argument("--skip-existing", action="store_true")
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument(
        "--is-check",
        type=int,
        default=0,
        metavar="DRAWS",
        help="instead of NUTS: check the stored references by importance sampling",
    )
    args = parser.parse_args()
    if args.is_check:
        path = REFERENCE_DIR / "is_check.json"
        checks = json.loads(path.read_text()) if path.is_file() else []
        for prior in args.priors:
            for dataset in args.datasets:
                if load_reference(prior, dataset) is None:
                    continue
                new = is_check(prior, dataset, args.is_check, args.data_dir)
                checks = [c for c in checks if (c["prior"], c["dataset"]) != (prior, dataset)]
                checks.append(new)
                write_json(path, checks)  # cell by cell: a stopped run keeps what it did
        write_summary()
        return

    import jax

    jax.config.update("jax_enable_x64", True)
    if not args.summary_only:
        for prior in args.priors:
            for dataset in args.datasets:
                if args.skip_existing and reference_path(prior, dataset).is_file():
                    continue
                run_cell(prior, dataset, args)
                write_summary()
    write_summary()


if __name__ == "__main__":
    main()
