"""Estimators of the multinomial predictive ``E[softmax(f)]`` on wide rows, side by side.

The multinomial ``predict_proba`` averages the softmax over replicate QMC nodes (D-066).
On standardized digits (10 classes, Laplace posterior at C = 1) every row is wide: latent
standard deviations of 2 to 45 against the softmax's transition width of about 1, so the
integrand is nearly a step across the hyperplanes where two classes tie, and its largest
error falls only as N^-0.4. This benchmark measures, on the rule's own nested nodes (8
scrambled replicates; 4,096, 16,384 and 65,536 nodes a row), four unbiased estimators of
the same integral (D-096 in docs/decisions.md):

- ``plain``: the softmax at the nodes (the rule of ``predict_proba``);
- ``own direction``: each class k conditioned on its own direction ``u_k = Qᵀ e_k``, along
  which its logit ``f_k − log Σ_{j≠k} e^{f_j}`` moves by exactly the shift: the conditional
  expectation is a logistic-normal integral, one per class and node (the rule measured in
  D-076);
- ``top direction``: every class conditioned on the direction of the row's leading class t
  (largest latent mean) alone: along ``u_t`` the classes j ≠ t keep their shares
  ``e^{f_j} / Σ_{l≠t} e^{f_l}`` of ``1 − σ(c_t)``, so one logistic-normal integral per node
  gives all K conditional expectations (they sum to 1 at every node);
- ``Gumbel mixture`` (leading classes): with ``d_j = f_j − f_k`` and ``E ~ Exp(1)``,
  ``softmax_k(f) = 1 / (1 + Σ_j e^{d_j}) = E_E[Π_j exp(−E e^{d_j})]``; splitting off an
  independent Gaussian part of each ``d_j`` (``Cov d = diag(λ) + rest``, ``λ_j`` a fraction
  of ``Var d_j`` kept positive semi-definite) and averaging it exactly, each factor becomes
  ``G(x; λ_j) = E[exp(−e^{x + √λ_j Z})]`` (tabulated), a smooth step as wide as
  ``√λ_j``: every boundary of class k is smoothed, not only those along one direction.
  Its integrand is bounded by 1 for a class that usually leads; for a rare class the
  factors are tiny except on rare nodes, and the estimator's spread grows.

Reference: per row and class the estimate with the smaller replicate spread among the
own-direction rule and the Gumbel mixture (the three leading classes), on ``--reference-
nodes`` nodes each; a second reference on other scramblings gives the references' own
error. Errors: the largest absolute error over the classes, per row, on rows sampled
evenly in the rank of their latent spread (``prediction_timing.stratified_rows``).

Costs are not timed here (these are float64 prototypes, one row at a time): the table
states what each estimator evaluates per node, and the primitive costs measured in the
same process (float32 NumPy, per value): the plain rule spends about 1.6 ns per class and
node on digits, so any per-node special function (a logistic-normal integral, a table
look-up) costs as much as several classes' whole share.

Usage: python benchmarks/softmax_estimators.py [--rows 200] [--reference-nodes 262144]
       python benchmarks/softmax_estimators.py --quick --out /tmp/bench_out  (20 rows,
       references on 2^16 nodes)
Writes DIR/softmax_estimators.{csv,json,md,png}; references cached under results/cache.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import numpy as np
from _common import CACHE, RESULTS, fmt, machine, machine_line, write_csv, write_json
from prediction_timing import latent_moments, multinomial_problems, stratified_rows
from scipy.special import ndtr, ndtri
from scipy.stats import qmc

from vsbayes.models import predictive as _predictive
from vsbayes.models import softmax_predictive_rules as _rules
from vsbayes.sampling.rules import sobol_normal_points

EULER_GAMMA = 0.5772156649015329
LOG_EXP_VARIANCE = np.pi**2 / 6  # variance of log E, E ~ Exp(1)
# λ of the Gumbel mixture on a ladder (1 to 4096, 4 steps an octave): one table per rung.
LADDER = 2.0 ** (np.arange(49) / 4.0)
TABLE_HALF_WIDTH, TABLE_POINTS = 10.0, 5001
TABLE_GRID = np.linspace(-TABLE_HALF_WIDTH, TABLE_HALF_WIDTH, TABLE_POINTS)
# Share of the largest diagonal part that keeps Cov d − diag(λ) positive semi-definite.
SMOOTHING_SHARE = 0.9
LEADING = 3  # classes per row given the Gumbel mixture
LEVELS = {"4,096": [0], "16,384": [1], "65,536": [1, 2, 3]}  # the rule's nested node sets
ESTIMATORS = ("plain", "own direction", "top direction", "Gumbel mixture", "best of the four")
PER_NODE = {
    "plain": "K exponentials",
    "own direction": "K exponentials, K logarithms, K logistic-normal integrals",
    "top direction": "K exponentials, 1 logarithm, 1 logistic-normal integral",
    "Gumbel mixture": "per class: K − 1 table look-ups (+ 1 QMC dimension)",
    "best of the four": "all of them",
}


def logistic_normal(a, variance):
    """``E[σ(a + s Z)]``, s² = variance: the nine-probit mixture (absolute error 4e-10)."""
    return _predictive._probit_mixture(a, variance)


def conditioning(reduced):
    """Per row, the centred factor (n, K, K − 1) and, per class k, the node coefficients
    ``v_k`` (n, K, K − 1) of the independent part along ``u_k`` and its variance s_k²."""
    n, dim, _ = reduced.shape
    q = _rules.centred_basis(dim + 1)
    root = np.linalg.cholesky(reduced)
    solved = np.linalg.solve(root, np.broadcast_to(q.T, (n, dim, dim + 1)))  # L⁻¹ u_k
    variance = 1.0 / np.einsum("nak,nak->nk", solved, solved)
    return q @ root, np.swapaxes(solved * variance[:, None, :], 1, 2), variance


def logit_against_rest(f):
    """``f_k − log Σ_{j≠k} e^{f_j}`` for every k (nodes, K), without cancellation."""
    out = np.empty_like(f)
    for k in range(f.shape[1]):
        others = np.delete(f, k, axis=1)
        top = others.max(axis=1)
        out[:, k] = f[:, k] - top - np.log(np.exp(others - top[:, None]).sum(axis=1))
    return out


def node_values(f, z, v, variance, leader):
    """The plain, own-direction and top-direction integrands at the nodes (3, nodes, K)."""
    shifted = f - f.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    plain = e / e.sum(axis=1, keepdims=True)
    logits = logit_against_rest(f) - z @ v.T
    own = logistic_normal(logits, variance[None, :])
    lead = own[:, leader]
    rest = np.delete(e, leader, axis=1)
    top = e / rest.sum(axis=1, keepdims=True) * (1.0 - lead)[:, None]
    top[:, leader] = lead
    return plain, own, top


def replicate_estimates(mean, reduced, half):
    """Per row and replicate the three estimators' averages (n, 3, R, K) on the nodes ±half
    (dim, R, h): plain, own direction, top direction."""
    n, k = mean.shape
    factor, v, variance = conditioning(reduced)
    centred = mean - mean.mean(axis=1, keepdims=True)
    leaders = centred.argmax(axis=1)
    replicates = half.shape[1]
    out = np.empty((n, 3, replicates, k))
    for i in range(n):
        for r in range(replicates):
            z = half[:, r, :].T
            z = np.vstack([z, -z])
            values = node_values(z @ factor[i].T + centred[i], z, v[i], variance[i], leaders[i])
            out[i, :, r] = [w.mean(axis=0) for w in values]
    return out


# --- the Gumbel mixture ----------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def survival_tables():
    """``log G(x; λ)`` for every rung λ of LADDER on the standardized grid
    ``y = (x + γ) / √(λ + π²/6)``: ``G(x) = P(log E + √λ Z > x) = E[Φ((log E − x)/√λ)]``
    by the trapezoid rule in log E (step 0.04, the density and Φ both analytic)."""
    u = np.arange(-25.0, 4.0, 0.04)
    density = np.exp(u - np.exp(u)) * 0.04
    out = np.empty((len(LADDER), TABLE_POINTS))
    for rung, lam in enumerate(LADDER):
        x = -EULER_GAMMA + np.sqrt(lam + LOG_EXP_VARIANCE) * TABLE_GRID
        survival = np.concatenate(
            [ndtr((u - part[:, None]) / np.sqrt(lam)) @ density for part in np.array_split(x, 10)]
        )
        out[rung] = np.log(np.clip(survival, 1e-300, 1.0))
    return out


def log_survival(x, rung, exact):
    """``log G(x; λ)`` per column (nodes, J): linear interpolation in the rung's table
    (spacing 0.004: error ~1e-6 relative), ``−e^x`` where λ = 0 (``exact``)."""
    table = survival_tables().ravel()
    y = (x + EULER_GAMMA) / np.sqrt(LADDER[rung] + LOG_EXP_VARIANCE)
    step = TABLE_GRID[1] - TABLE_GRID[0]
    position = np.clip((y + TABLE_HALF_WIDTH) / step, 0.0, TABLE_POINTS - 1.000001)
    index = position.astype(np.int64)
    fraction = position - index
    start = rung * TABLE_POINTS + index
    values = table[start] * (1.0 - fraction) + table[start + 1] * fraction
    return np.where(exact, -np.exp(np.minimum(x, 700.0)), values)


def mixture_setup(centred, cov, k):
    """Means of ``d_j = f_j − f_k`` (j ≠ k), the factor of their non-smoothed part, and
    the rungs of their smoothed parts (λ_j = 0 below the ladder: ``exact``)."""
    others = [j for j in range(len(centred)) if j != k]
    difference = np.zeros((len(others), len(centred)))
    difference[np.arange(len(others)), others] = 1.0
    difference[:, k] = -1.0
    mu = difference @ centred
    cov_d = difference @ cov @ difference.T
    sd = np.sqrt(np.diag(cov_d))
    share = SMOOTHING_SHARE * max(0.0, np.linalg.eigvalsh(cov_d / np.outer(sd, sd)).min())
    lam = share * sd**2
    rung = np.floor(4.0 * np.log2(np.maximum(lam, 1e-300))).astype(int)
    exact = rung < 0
    rung = np.clip(rung, 0, len(LADDER) - 1)
    eigenvalues, vectors = np.linalg.eigh(cov_d - np.diag(np.where(exact, 0.0, LADDER[rung])))
    return mu, vectors * np.sqrt(np.clip(eigenvalues, 0.0, None)), rung, exact


@functools.lru_cache(maxsize=16)
def mixture_nodes(dim, n_points, seed):
    """Scrambled Sobol points in dim + 1 dimensions: log E (first) and z (the rest)."""
    u = qmc.Sobol(dim + 1, scramble=True, rng=np.random.default_rng(seed)).random(n_points)
    log_e = np.log(-np.log1p(-u[:, 0]))
    return ndtri(np.clip(u[:, 1:], 1e-16, 1.0 - 1e-16)), log_e


def mixture_estimates(mean, reduced, classes, n_points, seed, replicates=8):
    """Per row and replicate the Gumbel mixture of ``classes[i]`` (n, R, K; NaN for the
    others) on ``2 n_points`` nodes per replicate (z and −z)."""
    n, k = mean.shape
    q = _rules.centred_basis(k)
    out = np.full((n, replicates, k), np.nan)
    for i in range(n):
        cov = q @ reduced[i] @ q.T
        centred = mean[i] - mean[i].mean()
        for c in classes[i]:
            mu, root, rung, exact = mixture_setup(centred, cov, c)
            for r in range(replicates):
                z, log_e = mixture_nodes(k - 1, n_points, seed + r)
                total = 0.0
                for start in range(0, n_points, 2**15):
                    part = slice(start, start + 2**15)
                    for sign in (1.0, -1.0):
                        x = mu + sign * (z[part] @ root.T) + log_e[part, None]
                        total += np.exp(log_survival(x, rung, exact).sum(axis=1)).sum()
                out[i, r, c] = total / (2 * n_points)
    return out


# --- references and the study -----------------------------------------------------------


def best_of(candidates):
    """Per row and class the candidate (list of (n, R, K)) whose replicates spread least:
    its mean and standard error."""
    means = np.stack([c.mean(axis=1) for c in candidates])
    errors = np.stack([c.std(axis=1, ddof=1) / np.sqrt(c.shape[1]) for c in candidates])
    errors = np.where(np.isnan(errors), np.inf, errors)
    choice = errors.argmin(axis=0)
    return np.take_along_axis(means, choice[None], 0)[0], np.take_along_axis(
        errors, choice[None], 0
    )[0]


def reference(mean, reduced, leading, n_nodes, seed, path):
    """The best-of reference on ``n_nodes`` nodes per estimator (cached at ``path``)."""
    if path.exists():
        saved = np.load(path)
        return saved["value"], saved["error"]
    per_replicate = n_nodes // 16
    half = np.stack(
        [sobol_normal_points(mean.shape[1] - 1, per_replicate, (seed, r)).T for r in range(8)],
        axis=1,
    )
    own = replicate_estimates(mean, reduced, half)[:, 1]
    mixture = mixture_estimates(mean, reduced, leading, per_replicate, seed)
    value, error = best_of([own, mixture])
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, value=value, error=error)
    return value, error


def summary(error):
    return {
        "max_error": float(error.max()),
        "p99_error": float(np.quantile(error, 0.99)),
        "median_error": float(np.median(error)),
    }


def primitive_costs():
    """ns per value of float32 NumPy primitives (medians of 20 passes over 2^16 values)."""
    x = np.random.default_rng(0).standard_normal(2**16).astype(np.float32)
    out = np.empty_like(x)
    index = np.random.default_rng(1).integers(0, 5001, 2**16)
    table = np.random.default_rng(2).standard_normal(5001 * 49).astype(np.float32)
    cases = {
        "exp": lambda: np.exp(x, out=out),
        "log": lambda: np.log(np.abs(x), out=out),
        "tanh": lambda: np.tanh(x, out=out),
        "multiply-add": lambda: np.multiply(x, x, out=out).__iadd__(x),
        "table gather": lambda: np.take(table, index, out=out),
        "Φ (scipy ndtr)": lambda: ndtr(x, out=out),
    }
    result = {}
    for name, call in cases.items():
        call()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        result[name] = float(np.median(times)) / x.size * 1e9
    return result


def run(args):
    problems = multinomial_problems()
    X, _, laplace = problems["digits"]
    mean, reduced = latent_moments(laplace, X)
    q = _rules.centred_basis(mean.shape[1])
    rows = stratified_rows(q @ reduced @ q.T, args.rows)
    mean, reduced = mean[rows], reduced[rows]
    proba = laplace.predict_proba(X[rows])
    tag = f"{len(rows)}_{args.reference_nodes}"
    leading_guess = np.argsort(-proba, axis=1)[:, :LEADING]
    ref, ref_error = reference(
        mean,
        reduced,
        leading_guess,
        args.reference_nodes,
        41,
        CACHE / f"softmax_estimators_reference_{tag}_41.npz",
    )
    second, _ = reference(
        mean,
        reduced,
        leading_guess,
        args.reference_nodes,
        43,
        CACHE / f"softmax_estimators_reference_{tag}_43.npz",
    )
    result = {
        "rows": len(rows),
        "reference_nodes": args.reference_nodes,
        "reference_self_error": summary(np.abs(ref - second).max(axis=1)),
        "reference_standard_error": float(ref_error.max()),
        "reference_sum_defect": float(np.abs(ref.sum(axis=1) - 1.0).max()),
        "predict_proba": summary(np.abs(proba - ref).max(axis=1)),
        "levels": [],
        "per_node": PER_NODE,
        "primitive_ns": primitive_costs(),
    }
    leading = np.argsort(-ref, axis=1)[:, :LEADING]
    for label, levels in LEVELS.items():
        half = np.concatenate([_rules.replicate_nodes(mean.shape[1] - 1, lv) for lv in levels], 2)
        t0 = time.perf_counter()
        three = replicate_estimates(mean, reduced, half.astype(float))
        mixture = mixture_estimates(mean, reduced, leading, half.shape[1] * half.shape[2], 7)
        print(f"  {label} nodes: {time.perf_counter() - t0:.0f} s", flush=True)
        candidates = [three[:, 0], three[:, 1], three[:, 2], mixture]
        entry = {"nodes": label}
        for name, estimates in zip(ESTIMATORS[:3], candidates[:3], strict=True):
            spread = estimates.std(axis=1, ddof=1).max(axis=1) / np.sqrt(estimates.shape[1])
            entry[name] = summary(np.abs(estimates.mean(axis=1) - ref).max(axis=1)) | {
                "standard_error": summary(spread)
            }
        lead = np.arange(len(rows)), leading[:, 0]
        entry["Gumbel mixture"] = summary(np.abs(mixture.mean(axis=1)[lead] - ref[lead])) | {
            "classes": "the leading class of each row"
        }
        entry["own direction, leading class"] = summary(
            np.abs(three[:, 1].mean(axis=1)[lead] - ref[lead])
        )
        best, _ = best_of(candidates)
        entry["best of the four"] = summary(np.abs(best - ref).max(axis=1))
        result["levels"].append(entry)
    return result


def markdown(result, info):
    lines = [
        "# Estimators of the multinomial predictive on digits",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        machine_line(info),
        "",
        f"Reference: {result['rows']} rows, {result['reference_nodes']:,} nodes per "
        "estimator; two references on other scramblings differ by "
        f"{fmt(result['reference_self_error']['max_error'])} at most (median "
        f"{fmt(result['reference_self_error']['median_error'])}); their classes sum to 1 "
        f"within {fmt(result['reference_sum_defect'])}. `predict_proba` today: largest "
        f"error {fmt(result['predict_proba']['max_error'])}, 99 % "
        f"{fmt(result['predict_proba']['p99_error'])}.",
        "",
        "| nodes | estimator | max error | 99 % error | median error | evaluates per node |",
        "|---|---|---|---|---|---|",
    ]
    for entry in result["levels"]:
        for name in (
            *ESTIMATORS[:3],
            "own direction, leading class",
            "Gumbel mixture",
            "best of the four",
        ):
            s = entry[name]
            lines.append(
                f"| {entry['nodes']} | {name} | {fmt(s['max_error'])} | {fmt(s['p99_error'])} "
                f"| {fmt(s['median_error'])} | {PER_NODE.get(name.split(',')[0], '')} |"
            )
    lines += [
        "",
        "Primitive costs, float32 NumPy, ns per value: "
        + ", ".join(f"{k} {v:.2g}" for k, v in result["primitive_ns"].items()),
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--reference-nodes", type=int, default=2**18)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=str, default=str(RESULTS))
    args = parser.parse_args()
    if args.quick:
        args.rows, args.reference_nodes = 20, 2**16
    info = machine()
    result = run(args)
    out = Path(args.out)
    write_json(out / "softmax_estimators.json", {"machine": info} | result)
    (out / "softmax_estimators.md").write_text(markdown(result, info) + "\n")
    rows = [
        {"nodes": e["nodes"], "estimator": name}
        | {k: e[name][k] for k in ("max_error", "p99_error", "median_error")}
        for e in result["levels"]
        for name in (
            *ESTIMATORS[:3],
            "own direction, leading class",
            "Gumbel mixture",
            "best of the four",
        )
    ]
    write_csv(out / "softmax_estimators.csv", rows)
    plot(result, out / "softmax_estimators.png")


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [int(e["nodes"].replace(",", "")) for e in result["levels"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, style in zip(
        (*ESTIMATORS[:3], "own direction, leading class", "Gumbel mixture"),
        ("o-", "s-", "^-", "v--", "d-"),
        strict=True,
    ):
        ax.loglog(nodes, [e[name]["max_error"] for e in result["levels"]], style, label=name)
    ax.axhline(1e-4, color="grey", lw=0.8, ls=":")
    ax.axhline(
        result["reference_self_error"]["max_error"],
        color="k",
        lw=0.8,
        ls="--",
        label="references differ",
    )
    ax.set_xlabel("nodes per row")
    ax.set_ylabel("largest absolute error over the rows")
    ax.set_title("digits: E[softmax(f)] estimators (leading class: dashed/diamond)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
