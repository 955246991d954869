"""Long NUTS references of the multinomial (softmax) posterior on iris, wine and 20 classes.

The model is :class:`vsbayes.models.SoftmaxGLMPosterior` on the standardized data at C = 1:
W ~ N(0, C I), intercepts ~ N(0, 10⁶), θ = [W.ravel(), b]. The posterior is flat in the
likelihood along the d + 1 directions that add one vector to every class, where it is its
prior (variance C / K per coefficient, 10⁶ / K for the intercepts' sum): NUTS in the natural
coordinates would need a step size for the narrowest direction and thousands of steps to
cross the widest. As ``benchmarks/nuts_reference.py`` does for the binary model, NUTS runs
in the coordinates z of θ = m + L z, m the Laplace mode and L Lᵀ the inverse Hessian there
(a fixed linear map: the target is the exact posterior), with a diagonal mass matrix
adapted on z during warm-up; chains one after another.

Written to ``results/nuts_reference/softmax_<case>.npz``: the draws' mean and covariance
of θ, their Monte Carlo standard errors, the posterior-predictive average of the softmax
over the draws on every training row (``proba``, (M, K)) with its Monte Carlo standard
error, and the diagnostics (rank-normalized split R-hat, bulk/tail ESS, divergences, wall
time). Run single-threaded on one core::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
    taskset -c 1 python benchmarks/nuts_softmax_reference.py --cases iris wine

With ``--l1 C`` the prior on each of the K·d coefficients is Laplace(C)
(``LogisticRegression(penalty="l1", C=C)``'s penalty as a prior, docs/decisions.md D-053;
intercepts N(0, 10⁶)), written to ``softmax_l1_<case>.npz``; NUTS runs in the coordinates of
the Laplace approximation at the L1 mode (the kinks' curvature its prior's), the target
exact (the Laplace prior's kinks make the potential non-differentiable at 0 only)::

    taskset -c 1 python benchmarks/nuts_softmax_reference.py --cases iris wine --l1 1

(classes20 was run with ``--draws 50000 --warmup 1000``: 4 × 50,000 draws. Its first
reference, 4 × 5,000 draws, put KL(reference ‖ EP) at 0.58 nats, of which about 0.46 was the
reference's own Monte Carlo error: see ``moment_kl_noise``.)

The moment Gaussian of finitely many draws is itself off: KL(draws' Gaussian ‖ the exact
moments') has a positive bias of about p(p + 3)/(4 N_eff) nats (p = 120, N_eff = 20,000:
0.18), added to every method's KL(reference ‖ method); with NUTS, whose draws of second
moments are less effective than of means, it was 2.5 times that on classes20. The file
records it (``moment_kl_noise``): the mean over batch-means bootstrap replicates (batches
of 500 consecutive draws, resampled with replacement) of KL(replicate's Gaussian ‖ the
draws'), the bootstrap estimate of that bias.

:func:`load_reference` returns the moments with the d + 1 shift directions set to their
exact posterior, the prior (:func:`with_exact_shifts`): the draws' moments there are Monte
Carlo error alone. What is left of the reference's own error, in the contrasts, was
measured against long importance sampling of the contrasts' posterior
(``kl_error_calibration.py --multinomial``): 0.0006 nats on iris, 0.005 on wine.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib

import numpy as np
from _high_dim_cases import INTERCEPT_PRIOR_VAR, PRIOR_VAR, REFERENCE_DIR, gaussian_kl
from nuts_reference import diagnostics
from scipy.special import softmax
from sklearn.datasets import load_iris, load_wine, make_classification
from sklearn.preprocessing import StandardScaler

from vsbayes import Gaussian
from vsbayes.approximations import softmax_laplace
from vsbayes.models import SoftmaxGLMPosterior
from vsbayes.models.shrinkage_priors import elastic_net_factor
from vsbayes.models.softmax_contrasts import ContrastPosterior


def classes20(return_X_y: bool = True):
    """Twenty classes on five features, 300 rows (15 a class): many classes, few rows each,
    where the softmax posterior is far from Gaussian."""
    return make_classification(
        300,
        5,
        n_informative=5,
        n_redundant=0,
        n_classes=20,
        n_clusters_per_class=1,
        random_state=0,
    )


#: Above these bytes of the draws' probabilities, their MCSE is from batch means.
PROBA_BYTES = 1e9

LOADERS = {"iris": load_iris, "wine": load_wine, "classes20": classes20}


def load_case(case: str) -> tuple[np.ndarray, np.ndarray]:
    """The standardized features and the class indices."""
    X, y = LOADERS[case](return_X_y=True)
    return StandardScaler().fit_transform(X), np.asarray(y)


def model_of(X, y, l1: float | None = None) -> SoftmaxGLMPosterior:
    """The posterior at C = 1, or with ``l1`` the Laplace(l1) prior on the coefficients."""
    return SoftmaxGLMPosterior(
        X,
        y,
        np.ones(len(y)),
        int(y.max()) + 1,
        prior_var=PRIOR_VAR,
        intercept_prior_var=INTERCEPT_PRIOR_VAR,
        coefficient_prior=None if l1 is None else elastic_net_factor(l1, 1.0),
    )


def reference_path(case: str, l1: float | None = None):
    if l1 is not None:
        return REFERENCE_DIR / f"softmax_l1_{case}.npz"
    return REFERENCE_DIR / f"softmax_{case}.npz"


def load_reference(case: str, exact_shifts: bool = True):
    """``(mean, cov, proba, diagnostics)`` of the stored reference, or ``None``; with
    ``exact_shifts`` the moments' shift directions exact (:func:`with_exact_shifts`), else
    the draws' moments as stored."""
    path = reference_path(case)
    if not path.is_file():
        return None
    with np.load(path) as data:
        mean, cov = data["mean"], data["cov"]
        if exact_shifts:
            mean, cov = with_exact_shifts(*load_case(case), mean, cov)
        return mean, cov, data["proba"], json.loads(str(data["diagnostics"]))


def with_exact_shifts(X, y, mean, cov) -> tuple[np.ndarray, np.ndarray]:
    """The draws' moment Gaussian of θ with its d + 1 shift directions (one vector added to
    every class) set to their exact posterior: the prior, independent of the contrasts
    (:class:`vsbayes.models.softmax_contrasts.ContrastPosterior`). The likelihood does not
    see them, so the draws' moments there are Monte Carlo error alone, which every KL to a
    method that sets them exactly (all of vsbayes' multinomial methods) counted as the
    method's: 0.0007 nats on iris, 0.0063 on wine (docs/decisions.md D-103)."""
    contrasts = ContrastPosterior(model_of(X, y))
    exact = contrasts.lift(contrasts.reduce(Gaussian(mean, cov)))
    return exact.mean, exact.cov


def potential(model: SoftmaxGLMPosterior, mode: np.ndarray, root: np.ndarray):
    """JAX potential −log p(m + L z) (constants dropped) of the whitened coordinates z."""
    import jax
    import jax.numpy as jnp

    k, d = model.n_classes, model.n_features
    X = jnp.asarray(model.X)
    onehot = jnp.asarray(np.eye(k)[model.y])
    inv_v = jnp.asarray(1.0 / model.prior_var)
    m, L = jnp.asarray(mode), jnp.asarray(root)
    factor = getattr(model, "coefficient_prior", None)
    if factor is not None:  # Laplace(b) on W: −|θ|/b; the intercepts' Gaussian prior
        lam = factor.l1
        inv_v = jnp.asarray(np.where(np.arange(model.dim) < k * d, 0.0, 1.0 / model.prior_var))

    def fn(z):
        theta = m + L @ z
        W, b = theta[: k * d].reshape(k, d), theta[k * d :]
        f = X @ W.T + b
        log_lik = jnp.sum(onehot * f) - jnp.sum(jax.nn.logsumexp(f, axis=1))
        log_prior = -0.5 * jnp.sum(theta * theta * inv_v)
        if factor is not None:
            log_prior = log_prior - lam * jnp.sum(jnp.abs(W))
        return -(log_lik + log_prior)

    return fn


def moment_kl_noise(
    theta: np.ndarray, batch: int = 500, replicates: int = 200, seed: int = 0
) -> tuple[float, float]:
    """The bootstrap estimate (mean, sd over replicates) of the Monte Carlo bias of the draws'
    moment Gaussian in KL: KL(replicate's moment Gaussian ‖ all draws'), the replicates
    resampling batches of ``batch`` consecutive draws of every chain (``theta``: (chains,
    draws, p)), longer than NUTS's autocorrelation, with replacement."""
    chains, draws, dim = theta.shape
    per_chain = draws // batch
    batches = theta[:, : per_chain * batch].reshape(chains * per_chain, batch, dim)
    sums = batches.sum(axis=1)
    outers = np.einsum("bni,bnj->bij", batches, batches)
    count = len(batches) * batch

    def moments(index):
        mean = sums[index].sum(axis=0) / count
        cov = (outers[index].sum(axis=0) - count * np.outer(mean, mean)) / (count - 1)
        return mean, cov

    full = moments(np.arange(len(batches)))
    rng = np.random.default_rng(seed)
    kls = [
        gaussian_kl(*moments(rng.integers(0, len(batches), len(batches))), *full)
        for _ in range(replicates)
    ]
    return float(np.mean(kls)), float(np.std(kls))


def run_case(case: str, args) -> dict:
    X, y = load_case(case)
    return sample_reference(X, y, case, reference_path(case, args.l1), args)


def sample_reference(X, y, case: str, path, args) -> dict:
    """NUTS on the softmax posterior of ``(X, y)`` (y: class indices 0..K-1), its moments,
    draws' quantiles, predictive and diagnostics saved to ``path``; returns the diagnostics."""
    import jax
    import numpyro
    from numpyro.diagnostics import effective_sample_size
    from numpyro.infer import MCMC, NUTS

    model = model_of(X, y, getattr(args, "l1", None))
    dim = model.dim
    laplace = softmax_laplace(model, tol=1e-12)
    mode, laplace_cov = laplace.mean, laplace.cov
    # L = R⁻ᵀ for the precision H = R Rᵀ: L Lᵀ = H⁻¹.
    root = np.linalg.cholesky(laplace_cov)
    fn = potential(model, mode, root)
    rng = np.random.default_rng(zlib.crc32(f"softmax/{case}".encode()))
    probe = rng.standard_normal((3, dim))
    ours = np.array([-float(fn(z)) for z in probe])
    theirs = model.log_density(mode + probe @ root.T)
    gap = float(np.ptp(ours - theirs))  # the constants differ; the shapes must not
    print(f"{case}: p={dim}, log-density gap to vsbayes' model {gap:.1e}", flush=True)

    kernel = NUTS(potential_fn=fn, dense_mass=False, target_accept_prob=args.target_accept)
    mcmc = MCMC(
        kernel,
        num_warmup=args.warmup,
        num_samples=args.draws,
        num_chains=args.chains,
        chain_method="sequential",
        progress_bar=False,
    )
    init = 0.5 * rng.standard_normal((args.chains, dim))
    key = jax.random.PRNGKey(zlib.crc32(f"softmax/{case}".encode()) % 2**31)
    start = time.perf_counter()
    mcmc.run(key, init_params=init, extra_fields=("diverging", "num_steps"))
    z = np.asarray(mcmc.get_samples(group_by_chain=True))
    wall = time.perf_counter() - start
    extra = mcmc.get_extra_fields(group_by_chain=True)
    steps = np.asarray(extra["num_steps"])
    theta = z @ root.T + mode  # (chains, draws, dim)
    diag = diagnostics(theta)
    mcse = diag.pop("mcse_mean")
    noise, noise_sd = moment_kl_noise(theta)
    flat = theta.reshape(-1, dim)
    # The summary's identified quantities: coefficients and intercepts centred over the
    # classes, (draws, d + 1, K), and their 2.5 % and 97.5 % quantiles.
    W_all, b_all = model.split(flat)
    centred = np.concatenate([W_all, b_all[:, :, None]], axis=2).transpose(0, 2, 1)
    centred -= centred.mean(axis=2, keepdims=True)
    quantiles = np.quantile(centred, [0.025, 0.975], axis=0)
    del W_all, b_all, centred
    mean = flat.mean(axis=0)
    centred = flat - mean
    cov = centred.T @ centred / (len(flat) - 1)
    # Posterior-predictive average on every training row, in blocks of draws. Its Monte
    # Carlo standard error from each probability's ESS over the draws where they fit in
    # PROBA_BYTES (iris, wine), else from the means of batches of 500 consecutive draws of
    # every chain (classes20 at 4 × 50,000 draws: the draws' probabilities are 9.6 GB).
    n_rows, k = X.shape[0], model.n_classes
    batch = 500
    by_ess = theta.shape[0] * theta.shape[1] * n_rows * k * 8.0 <= PROBA_BYTES
    sums = np.zeros((n_rows, k))
    chain_parts = []
    for c in range(args.chains):
        for start in range(0, theta.shape[1], batch):
            Wc, bc = model.split(theta[c, start : start + batch])
            probs = softmax(np.einsum("nd,skd->snk", X, Wc) + bc[:, None, :], axis=2)
            sums += probs.sum(axis=0)
            chain_parts.append(probs.reshape(len(probs), -1) if by_ess else probs.mean(axis=0))
    proba = sums / len(flat)
    if by_ess:
        per_chain = np.concatenate(chain_parts).reshape(args.chains, -1, n_rows * k)
        ess = effective_sample_size(per_chain)
        spread = per_chain.reshape(-1, n_rows * k).std(axis=0)
        proba_mcse = (spread / np.sqrt(ess)).reshape(n_rows, k)
        del per_chain
    else:
        means = np.stack(chain_parts)
        proba_mcse = means.std(axis=0, ddof=1) / np.sqrt(len(means))
    del chain_parts
    result = {
        "case": case,
        "M": int(X.shape[0]),
        "d": int(X.shape[1]),
        "K": int(k),
        "p": int(dim),
        "chains": args.chains,
        "draws_per_chain": args.draws,
        "warmup": args.warmup,
        "target_accept": args.target_accept,
        **diag,
        "divergences": int(np.asarray(extra["diverging"]).sum()),
        "mean_leapfrog_steps": float(steps.mean()),
        "wall_seconds": wall,
        "kl_nuts_laplace": gaussian_kl(mean, cov, mode, laplace_cov),
        "moment_kl_noise": noise,
        "moment_kl_noise_sd": noise_sd,
        "proba_mcse_max": float(proba_mcse.max()),
        "log_density_gap_vs_vsbayes": gap,
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        mean=mean,
        quantiles=quantiles,
        cov=cov,
        mcse_mean=mcse,
        proba=proba,
        proba_mcse=proba_mcse,
        laplace_mode=mode,
        diagnostics=json.dumps(result),
    )
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(LOADERS), choices=list(LOADERS))
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=25_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--target-accept", type=float, default=0.9)
    parser.add_argument(
        "--l1", type=float, default=None, help="Laplace(C) prior on W (penalty='l1', C)"
    )
    args = parser.parse_args()
    import jax

    jax.config.update("jax_enable_x64", True)
    for case in args.cases:
        run_case(case, args)


if __name__ == "__main__":
    main()
