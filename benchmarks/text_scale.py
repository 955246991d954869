"""Text-scale problems: the structured posterior covariance against LogisticRegression.

Synthetic text-shaped data: CSR rows whose non-zeros fall in columns drawn from a Zipf law
(column j with probability ∝ 1/(j + 10), as word frequencies: a few frequent columns seen
in many rows, a long tail of rare ones), exponential values, each row scaled to unit norm
as TF-IDF's. Labels from a sparse true coefficient vector (5 % of the features of each
class) scaled so that the true latent values have standard deviation 3: Bernoulli through
the logistic link (binary), or the softmax (20 classes). (An earlier version drew the
columns uniformly: each feature then appeared in ~10 rows, too few to learn anything,
and every held-out log loss was ~0.69; those rows are replaced.) Each case runs in its
own subprocess, so that its peak memory (``ru_maxrss``) is its own.

Parts:

1. **fit** — ``VSLogisticRegression().fit`` against ``LogisticRegression()`` on the same
   rows (interleaved repeats, medians; LR's time the faster of default BLAS threads and one
   thread): 5000 × 20,000 (0.2 %), 20,000 × 50,000 (0.05 %), and a 20-newsgroups-shaped
   11,314 × 101,631 (0.16 %, ~160 non-zeros per row). Reported: the time ratio, the
   process's peak memory, the structure chosen and why, held-out log loss (2000 rows) of
   both at the same C. Targets: ≤ 30× and ≤ 2 GB (≤ 50× and ≤ 4 GB for the newsgroups
   shape).
2. **accuracy** — where the dense covariance is affordable (2000 × 5000, 1 %, C = 1 and
   10): the structure auto chooses and the forced "lowrank" one against the dense Laplace
   posterior: the largest difference of held-out probabilities (target ≤ 0.01), of
   marginal sds (relative, target ≤ 10 %), held-out log loss against LogisticRegression's
   at the same C.
   **estimate** — on 5000 × 20,000, the estimated marginal variances (beyond 4096 rows)
   against the exact ones.
3. **multinomial** — 20 classes × 10,000 features (10,000 rows, 0.5 %):
   ``VSLogisticRegression().fit`` (auto: the structured multinomial posterior) against
   ``LogisticRegression()``: time ratio (target ≤ 50×), peak memory (≤ 4 GB), held-out log
   loss. Where the dense posterior is affordable (20 classes × 200 features, 2000 rows,
   5 %): the forced "lowrank" structure against the dense Laplace posterior (held-out
   probabilities, marginal sds of the coefficients and ``summary()``'s, evidence).
   With parts 2 and 3, the held-out log loss at C = 1 taken apart: the predictive rule
   against a reference on the same latent moments (binary: Gauss–Hermite; multinomial:
   Monte Carlo), the plug-in at the mode, LogisticRegression's, the gap per row with its
   standard error, and the evidence: is a gap the rule's or the model's?
   **one-vs-rest** — 5 classes × 5000 features (2000 rows, 1 %): the estimators that fit
   one binary problem per class (``VBLogisticRegression``, ``VSProbitRegression``), each
   problem with the binary fit's structure (D-200), against ``LogisticRegression()``: time
   ratio, peak memory, held-out log loss.
4. **predict** — ``predict_proba`` on 10⁶ sparse rows × 10⁴ features (0.1 %) of a model
   fitted on 5000 rows, against LogisticRegression's (best and median of rounds; target
   ≤ 10×).
5. **guard** — a 200,000 × 1,000,000 problem under a 256 MiB memory limit: seconds until
   the refusal, and its message.

The machine is shared (2 cores, other engineers' jobs): times are noisy, ratios are taken
in one process side by side.

Usage: python benchmarks/text_scale.py [--part all|PART[,PART...]] (fit, accuracy, estimate,
       multinomial, ovr, predict, guard; a partial rerun keeps the other parts' previous rows)
       [--quick] [--out DIR]   (writes DIR/text_scale.{csv,json,md,png}; DIR = benchmarks/results)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

FIT_CASES = {
    "5000x20000": (5000, 20_000, 0.002, 30.0, 2.0),
    "20000x50000": (20_000, 50_000, 0.0005, 30.0, 2.0),
    "newsgroups-shaped 11314x101631": (11_314, 101_631, 0.0016, 50.0, 4.0),
}
QUICK_FIT_CASES = {"2000x8000": (2000, 8000, 0.003, 30.0, 2.0)}
HELD_OUT = 2000
SIGNAL = 3.0  # standard deviation of the true latent values
MULTINOMIAL_CASE = (10_000, 10_000, 0.005, 20)  # rows, features, density, classes
QUICK_MULTINOMIAL_CASE = (2000, 3000, 0.01, 10)
ONE_VS_REST_CASE = (2000, 5000, 0.01, 5)  # rows, features, density, classes
ONE_VS_REST_ESTIMATORS = ("VBLogisticRegression", "VSProbitRegression")
PARTS = ("fit", "accuracy", "estimate", "multinomial", "ovr", "predict", "guard")


def scattered_csr(m: int, p: int, density: float, rng, zipf: bool = True) -> sp.csr_matrix:
    """CSR with ``density·p`` non-zeros per row (at least one) in random columns — Zipf
    distributed (∝ 1/(j + 10)), or uniform — exponential values; built from its index
    arrays (``scipy.sparse.random`` permutes all m·p positions: 9 GB at the newsgroups
    shape)."""
    per_row = max(1, round(density * p))
    if zipf:
        cumulative = np.cumsum(1.0 / (np.arange(p) + 10.0))
        cumulative /= cumulative[-1]
        indices = np.minimum(np.searchsorted(cumulative, rng.random(m * per_row)), p - 1)
    else:
        indices = rng.integers(0, p, size=m * per_row)
    indptr = np.arange(0, m * per_row + 1, per_row)
    X = sp.csr_matrix((rng.exponential(1.0, m * per_row), indices, indptr), shape=(m, p))
    X.sum_duplicates()
    return X


def text_data(m: int, p: int, density: float, seed: int = 0, n_classes: int = 2, zipf: bool = True):
    """``(X, y)``: unit-norm CSR rows of exponential values in Zipf-distributed columns,
    labels from a sparse true coefficient vector per class (5 % of the features) scaled so
    that the true latent values have standard deviation :data:`SIGNAL`."""
    from sklearn.preprocessing import normalize

    rng = np.random.default_rng(seed)
    X = normalize(scattered_csr(m, p, density, rng, zipf))
    k = 1 if n_classes == 2 else n_classes
    support = rng.random((k, p)) < 0.05
    W = np.zeros((k, p))
    W[support] = rng.normal(0.0, 1.0, int(support.sum()))
    latent = np.asarray(X @ W.T)
    latent *= SIGNAL / latent.std()
    if n_classes == 2:
        return X, rng.random(m) < 1.0 / (1.0 + np.exp(-latent[:, 0]))
    latent -= latent.max(axis=1, keepdims=True)
    proba = np.exp(latent)
    proba /= proba.sum(axis=1, keepdims=True)
    return X, (proba.cumsum(axis=1) < rng.random((m, 1))).sum(axis=1).clip(0, k - 1)


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def binary_log_losses(fit, held, y_held) -> dict:
    """Held-out log loss of a binary fit's posterior predictive three ways: the library's
    rule, a 200-node Gauss–Hermite reference of ``E[σ(f)]`` on the same latent moments, and
    the plug-in ``σ(E f)`` at the posterior mean (the mode): a gap between the rule and the
    reference is the predictive rule's; between the reference and the plug-in, the
    posterior averaging's (the model's)."""
    from scipy.special import expit

    mean, var = fit.latent_mean_and_variance(held)
    nodes, weights = np.polynomial.hermite_e.hermegauss(200)
    reference = expit(mean[:, None] + np.sqrt(var)[:, None] * nodes) @ (weights / weights.sum())
    labels = np.asarray(y_held, dtype=float)

    def loss(proba):
        proba = np.clip(proba, 1e-15, 1 - 1e-15)
        return float(-np.mean(labels * np.log(proba) + (1 - labels) * np.log1p(-proba)))

    rule = fit.predict_proba(held)[:, 1]
    return {
        "rule_log_loss": loss(rule),
        "reference_log_loss": loss(reference),
        "plugin_log_loss": loss(expit(mean)),
        "max_rule_error": float(np.abs(rule - reference).max()),
        "median_latent_sd": float(np.median(np.sqrt(var))),
    }


def multinomial_log_losses(fit, held, y_held, draws: int = 8192) -> dict:
    """As :func:`binary_log_losses` for the multinomial posterior: the reference is Monte
    Carlo, ``draws`` antithetic draws per row of its centred latent Gaussian (the rows'
    moments as the predictive reads them), seeded."""
    from scipy.special import log_softmax, softmax

    predictive = fit._predictive()
    latents = predictive.latent(held)
    mean, cov = latents(slice(None))  # (m, K), centred (m, K, K)
    values, vectors = np.linalg.eigh(cov)
    roots = vectors * np.sqrt(np.maximum(values, 0.0))[:, None, :]  # (m, K, K)
    rng = np.random.default_rng(0)
    reference = np.empty_like(mean)
    for start in range(0, mean.shape[0], 25):
        rows = slice(start, start + 25)
        z = rng.standard_normal((draws // 2, mean.shape[1]))
        z = np.concatenate([z, -z])
        latent = mean[rows, None, :] + np.einsum("mkl,nl->mnk", roots[rows], z)
        reference[rows] = softmax(latent, axis=2).mean(axis=1)
    labels = np.searchsorted(fit.classes_, y_held)
    rule = fit.predict_proba(held)
    picked = np.arange(len(labels)), labels

    def loss(proba):
        return float(-np.mean(np.log(np.clip(proba[picked], 1e-15, None))))

    trace = np.trace(cov, axis1=1, axis2=2)
    return {
        "rule_log_loss": loss(rule),
        "reference_log_loss": loss(reference),
        "plugin_log_loss": float(-np.mean(log_softmax(mean, axis=1)[picked])),
        "max_rule_error": float(np.abs(rule - reference).max()),
        "reference_draws": draws,
        "median_latent_trace": float(np.median(trace)),
        "wide_row_share": float(np.mean(trace > 0.08)),
    }


def run_fit_case(name: str, repeats: int) -> dict:
    from _common import speed_ratio
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    import vsbayes

    m, p, density, ratio_target, memory_target = {**FIT_CASES, **QUICK_FIT_CASES}[name]
    X, y = text_data(m + HELD_OUT, p, density)
    train, held = X[:m], X[m:]
    y_train, y_held = y[:m], y[m:]
    data_peak = peak_gib()
    result = speed_ratio(
        lambda k: vsbayes.VSLogisticRegression().fit(train, y_train),
        train,
        y_train,
        repeats=repeats,
        warmup=False,
    )
    fit = result["result"]
    lr = LogisticRegression().fit(train, y_train)
    return {
        "part": "fit",
        "case": name,
        "rows": m,
        "features": p,
        "nnz_per_row": float(train.nnz / m),
        "seconds": result["seconds"],
        "lr_seconds": result["lr_seconds"],
        "ratio": result["ratio"],
        "ratio_target": ratio_target,
        "peak_gib": peak_gib(),
        "data_peak_gib": data_peak,
        "memory_target_gib": memory_target,
        "structure": fit.covariance_structure_,
        "reason": fit.covariance_reason_,
        "error": fit.posteriors_[0].error,
        "log_loss": float(log_loss(y_held, fit.predict_proba(held))),
        "lr_log_loss": float(log_loss(y_held, lr.predict_proba(held))),
        "times": result["times"],
    }


def run_accuracy_case(C: float) -> list[dict]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    import vsbayes

    m, p, density = 2000, 5000, 0.01
    X, y = text_data(m + HELD_OUT, p, density, seed=1)
    train, held = X[:m], X[m:]
    y_train, y_held = y[:m], y[m:]
    with vsbayes.config_context(covariance="dense"):
        dense = vsbayes.LaplaceLogisticRegression(C=C).fit(train, y_train)
    dense_proba = dense.predict_proba(held)[:, 1]
    dense_sd = np.sqrt(np.diag(dense.sigma_))
    lr = LogisticRegression(C=C).fit(train, y_train)
    lr_loss = float(log_loss(y_held, lr.predict_proba(held)))
    # Per held-out row, the dense posterior predictive's log loss less LR's: its mean and
    # standard error say whether the gap is more than the held-out rows' noise.
    gap = log_loss_rows(y_held, dense.predict_proba(held), dense.classes_) - log_loss_rows(
        y_held, lr.predict_proba(held), lr.classes_
    )
    decomposition = {
        **{f"dense_{key}": value for key, value in binary_log_losses(dense, held, y_held).items()},
        "dense_evidence": float(dense.log_marginal_likelihood_value_),
        "gap_to_lr": float(gap.mean()),
        "gap_to_lr_se": float(gap.std(ddof=1) / np.sqrt(gap.size)),
    }
    rows = []
    for label, settings in (("auto", {}), ("lowrank", {"covariance": "lowrank"})):
        with vsbayes.config_context(**settings):
            start = time.perf_counter()
            fit = vsbayes.LaplaceLogisticRegression(C=C).fit(train, y_train)
            seconds = time.perf_counter() - start
        proba = fit.predict_proba(held)[:, 1]
        sd = np.sqrt(fit.sigma_.diagonal())
        rows.append(
            {
                "part": "accuracy",
                "case": f"2000x5000 C={C:g} {label}",
                "structure": fit.covariance_structure_,
                "seconds": seconds,
                "max_proba_diff": float(np.abs(proba - dense_proba).max()),
                "max_sd_rel_diff": float(np.abs(sd / dense_sd - 1.0).max()),
                "log_loss": float(log_loss(y_held, fit.predict_proba(held))),
                "dense_log_loss": float(log_loss(y_held, dense.predict_proba(held))),
                "lr_log_loss": lr_loss,
                "evidence_diff": float(
                    fit.log_marginal_likelihood_value_ - dense.log_marginal_likelihood_value_
                ),
                **decomposition,
            }
        )
    return rows


def log_loss_rows(y, proba, classes) -> np.ndarray:
    """Each row's log loss, ``−log p(y_i)`` (``proba``'s columns: ``classes``)."""
    labels = np.searchsorted(classes, y)
    return -np.log(np.clip(np.asarray(proba)[np.arange(len(labels)), labels], 1e-15, None))


def run_estimate_case() -> dict:
    """5000 × 20,000: the estimated marginal variances (auto) against the exact ones (the
    same structure with the M × M factorization allowed beyond its row limit)."""
    import vsbayes
    import vsbayes.approximations.structured_laplace as structured

    X, y = text_data(5000 + HELD_OUT, 20_000, 0.002)
    train, held, y_train = X[:5000], X[5000:], y[:5000]
    start = time.perf_counter()
    estimated = vsbayes.VSLogisticRegression().fit(train, y_train)
    estimated_seconds = time.perf_counter() - start
    structured.EXACT_DIAGONAL_MAX_ROWS = 10**9
    start = time.perf_counter()
    exact = vsbayes.VSLogisticRegression().fit(train, y_train)
    exact_seconds = time.perf_counter() - start
    sd_ratio = np.sqrt(estimated.sigma_.diagonal() / exact.sigma_.diagonal())
    return {
        "part": "estimate",
        "case": "5000x20000 estimated vs exact marginals",
        "seconds": estimated_seconds,
        "exact_seconds": exact_seconds,
        "max_proba_diff": float(
            np.abs(estimated.predict_proba(held) - exact.predict_proba(held)).max()
        ),
        "max_sd_rel_diff": float(np.abs(sd_ratio - 1.0).max()),
        "median_sd_rel_diff": float(np.median(np.abs(sd_ratio - 1.0))),
        "error_factor": float(estimated.posteriors_[0].error_factor),
        "evidence_diff": float(
            estimated.log_marginal_likelihood_value_ - exact.log_marginal_likelihood_value_
        ),
    }


def run_multinomial_case(quick: bool) -> list[dict]:
    """20 classes × 10,000 features: the structured multinomial posterior against
    LogisticRegression; and where the dense one is affordable, against it."""
    from _common import speed_ratio
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    import vsbayes

    m, p, density, k = QUICK_MULTINOMIAL_CASE if quick else MULTINOMIAL_CASE
    X, y = text_data(m + HELD_OUT, p, density, seed=4, n_classes=k)
    train, held, y_train, y_held = X[:m], X[m:], y[:m], y[m:]
    data_peak = peak_gib()
    result = speed_ratio(
        lambda _: vsbayes.VSLogisticRegression().fit(train, y_train),
        train,
        y_train,
        repeats=1,
        warmup=False,
    )
    fit = result["result"]
    lr = LogisticRegression().fit(train, y_train)
    start = time.perf_counter()
    proba = fit.predict_proba(held)
    predict_seconds = time.perf_counter() - start
    rows = [
        {
            "part": "multinomial",
            "case": f"{k} classes x {p} features, {m} rows",
            "rows": m,
            "features": p,
            "classes": k,
            "nnz_per_row": float(train.nnz / m),
            "seconds": result["seconds"],
            "lr_seconds": result["lr_seconds"],
            "ratio": result["ratio"],
            "ratio_target": 50.0,
            "peak_gib": peak_gib(),
            "data_peak_gib": data_peak,
            "memory_target_gib": 4.0,
            "structure": fit.covariance_structure_,
            "reason": fit.covariance_reason_,
            "error": fit.posteriors_[0].error,
            "predict_seconds": predict_seconds,
            "log_loss": float(log_loss(y_held, proba, labels=fit.classes_)),
            "lr_log_loss": float(log_loss(y_held, lr.predict_proba(held), labels=lr.classes_)),
            "times": result["times"],
        }
    ]
    # Where the dense posterior is affordable: 20 classes × 200 features (4020 parameters).
    m, p, density = (1000, 100, 0.05) if quick else (2000, 200, 0.05)
    X, y = text_data(m + HELD_OUT, p, density, seed=5, n_classes=k)
    train, held, y_train, y_held = X[:m], X[m:], y[:m], y[m:]
    with vsbayes.config_context(covariance="dense"):
        start = time.perf_counter()
        dense = vsbayes.LaplaceLogisticRegression().fit(train, y_train)
        dense_seconds = time.perf_counter() - start
    dense_proba = dense.predict_proba(held)
    dense_sd = np.sqrt(np.diag(dense.sigma_))
    dense_summary_sd = dense.summary()["sd"].to_numpy()
    lr = LogisticRegression().fit(train, y_train)
    lr_loss = float(log_loss(y_held, lr.predict_proba(held)))
    gap = log_loss_rows(y_held, dense_proba, dense.classes_) - log_loss_rows(
        y_held, lr.predict_proba(held), lr.classes_
    )
    decomposition = {
        **{
            f"dense_{key}": value
            for key, value in multinomial_log_losses(dense, held, y_held).items()
        },
        "dense_evidence": float(dense.log_marginal_likelihood_value_),
        "gap_to_lr": float(gap.mean()),
        "gap_to_lr_se": float(gap.std(ddof=1) / np.sqrt(gap.size)),
    }
    for rank in (4, 32):
        with vsbayes.config_context(covariance="lowrank", covariance_rank=rank):
            start = time.perf_counter()
            fit = vsbayes.LaplaceLogisticRegression().fit(train, y_train)
            seconds = time.perf_counter() - start
        proba = fit.predict_proba(held)
        sd_ratio = np.sqrt(fit.sigma_.diagonal()) / dense_sd
        coefficients = slice(0, k * p)  # (the intercepts' sds: vague prior, shift direction)
        # summary()'s sds: of the centred coefficients (the contrasts), intercepts included.
        summary_ratio = fit.summary()["sd"].to_numpy() / dense_summary_sd
        rows.append(
            {
                "part": "multinomial-accuracy",
                "case": f"{k} classes x {p} features, {m} rows, lowrank rank {rank} (+{k - 1})",
                "structure": fit.covariance_structure_,
                "seconds": seconds,
                "dense_seconds": dense_seconds,
                "error_factor": float(fit.posteriors_[0].error_factor),
                "max_proba_diff": float(np.abs(proba - dense_proba).max()),
                "max_sd_rel_diff": float(np.abs(sd_ratio[coefficients] - 1.0).max()),
                "median_sd_rel_diff": float(np.median(np.abs(sd_ratio[coefficients] - 1.0))),
                "max_summary_sd_rel_diff": float(np.abs(summary_ratio - 1.0).max()),
                "log_loss": float(log_loss(y_held, proba, labels=fit.classes_)),
                "dense_log_loss": float(log_loss(y_held, dense_proba, labels=dense.classes_)),
                "lr_log_loss": lr_loss,
                "evidence_diff": float(
                    fit.log_marginal_likelihood_value_ - dense.log_marginal_likelihood_value_
                ),
                **{
                    f"structured_{key}": value
                    for key, value in (
                        multinomial_log_losses(fit, held, y_held).items() if rank == 4 else ()
                    )
                },
                **decomposition,
            }
        )
    return rows


def run_one_vs_rest_case(name: str, repeats: int) -> dict:
    """One one-vs-rest estimator on :data:`ONE_VS_REST_CASE` against LogisticRegression."""
    from _common import speed_ratio
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    import vsbayes

    m, p, density, k = ONE_VS_REST_CASE
    X, y = text_data(m + HELD_OUT, p, density, seed=3, n_classes=k)
    train, held = X[:m], X[m:]
    y_train, y_held = y[:m], y[m:]
    data_peak = peak_gib()
    cls = getattr(vsbayes, name)
    result = speed_ratio(
        lambda i: cls(random_state=0).fit(train, y_train), train, y_train, repeats=repeats
    )
    fit = result["result"]
    lr = LogisticRegression().fit(train, y_train)
    start = time.perf_counter()
    proba = fit.predict_proba(held)
    return {
        "part": "ovr",
        "case": f"{name}, {k} classes × {p}",
        "rows": m,
        "features": p,
        "nnz_per_row": float(train.nnz / m),
        "seconds": result["seconds"],
        "lr_seconds": result["lr_seconds"],
        "ratio": result["ratio"],
        "predict_seconds": time.perf_counter() - start,
        "peak_gib": peak_gib(),
        "data_peak_gib": data_peak,
        "structure": ", ".join(dict.fromkeys(str(s) for s in fit.covariance_structure_)),
        "reason": fit.covariance_reason_[0],
        "log_loss": float(log_loss(y_held, proba, labels=fit.classes_)),
        "lr_log_loss": float(log_loss(y_held, lr.predict_proba(held), labels=lr.classes_)),
        "times": result["times"],
    }


def run_predict_case(n_rows: int, rounds: int, zipf: bool = True) -> dict:
    """predict_proba on ``n_rows`` new rows; ``zipf=False``: the uniformly scattered
    columns of the earlier version (whose rows' products hit the cache less often)."""
    from sklearn.linear_model import LogisticRegression

    import vsbayes

    X, y = text_data(5000, 10_000, 0.001, seed=2, zipf=zipf)
    fit = vsbayes.VSLogisticRegression().fit(X, y)
    lr = LogisticRegression().fit(X, y)
    rows, _ = text_data(n_rows, 10_000, 0.001, seed=3, zipf=zipf)
    ours, theirs = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        fit.predict_proba(rows)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        lr.predict_proba(rows)
        theirs.append(time.perf_counter() - start)
    return {
        "part": "predict",
        "case": f"predict_proba {n_rows} x 10000 (0.1 %, {'Zipf' if zipf else 'uniform'} columns)",
        "structure": fit.covariance_structure_,
        "seconds": float(np.median(ours)),
        "lr_seconds": float(np.median(theirs)),
        "ratio": float(np.median(ours) / np.median(theirs)),
        "best_ratio": float(min(ours) / min(theirs)),
        "ratio_target": 10.0,
        "peak_gib": peak_gib(),
    }


def run_guard_case() -> dict:
    import vsbayes
    from vsbayes.exceptions import MemoryLimitError

    X = scattered_csr(200_000, 1_000_000, 1e-5, np.random.default_rng(0), zipf=False)
    y = np.arange(200_000) % 2
    start = time.perf_counter()
    message = ""
    with vsbayes.config_context(memory_limit=256 * 2**20):
        try:
            vsbayes.VSLogisticRegression().fit(X, y)
        except MemoryLimitError as error:
            message = str(error)
    return {
        "part": "guard",
        "case": "200000x1000000 under 256 MiB",
        "seconds": time.perf_counter() - start,
        "refused": bool(message),
        "message": message,
    }


def in_subprocess(args: list[str]) -> list[dict]:
    """One case in a fresh interpreter (its own peak memory); its rows as JSON."""
    done = subprocess.run(
        [sys.executable, __file__, "--worker", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return [{"part": args[0], "case": " ".join(args[1:]), "failed": done.stderr[-2000:]}]
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(args: list[str]) -> None:
    from _common import recorded_warnings

    part = args[0]
    with recorded_warnings():
        if part == "fit":
            rows = [run_fit_case(args[1], int(args[2]))]
        elif part == "accuracy":
            rows = run_accuracy_case(float(args[1]))
        elif part == "estimate":
            rows = [run_estimate_case()]
        elif part == "multinomial":
            rows = run_multinomial_case(args[1] == "quick")
        elif part == "ovr":
            rows = [run_one_vs_rest_case(args[1], int(args[2]))]
        elif part == "predict":
            rows = [run_predict_case(int(args[1]), int(args[2]), args[3] == "zipf")]
        else:
            rows = [run_guard_case()]
    print(json.dumps(rows, default=float))


def _part_machines(earlier: dict) -> dict[str, str]:
    """Each part's machine line in a previous run's JSON (``machines``; older runs kept
    one line, with the parts rerun and the line of the others' rows inside it)."""
    if "machines" in earlier:
        return earlier["machines"]
    line = earlier["machine"]
    head, _, rest = line.partition(" Parts rerun here: ")
    if not rest:
        return dict.fromkeys(PARTS, line)
    rerun, _, others = rest.partition("; the others' rows are from: ")
    machines = dict.fromkeys(PARTS, others)
    machines.update(dict.fromkeys(rerun.split(", "), head))
    return machines


def report(rows: list[dict], out: Path, machines: dict[str, str]) -> None:
    from _common import fmt, write_csv, write_json

    present = [p for p in PARTS if any(r.get("part", "").split("-")[0] == p for r in rows)]
    lines_of: dict[str, list[str]] = {}
    for part in present:
        lines_of.setdefault(machines[part], []).append(part)
    if len(lines_of) == 1:
        machine = next(iter(lines_of))
    else:
        machine = " ".join(f"Parts {', '.join(ps)}: {m}" for m, ps in lines_of.items())
    write_json(
        out / "text_scale.json",
        {"machine": machine, "machines": {p: machines[p] for p in present}, "rows": rows},
    )
    columns = sorted({key for row in rows for key in row if key not in ("times",)})
    write_csv(out / "text_scale.csv", [{c: row.get(c, "") for c in columns} for row in rows])
    lines = [
        "# Text-scale problems: structured posterior covariance",
        "",
        f"{machine} Shared with other engineers' jobs (2 cores): times are noisy;",
        "ratios are taken side by side in one process (medians of interleaved repeats).",
        "",
        "## Fit (VSLogisticRegression() against LogisticRegression(), same rows)",
        "",
        "| case | nnz/row | VS s | LR s | ratio (target) | peak GiB (target) | structure | "
        "held-out log loss VS / LR |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("part") == "fit" and "failed" not in r:
            lines.append(
                f"| {r['case']} | {r['nnz_per_row']:.0f} | {fmt(r['seconds'])} | "
                f"{fmt(r['lr_seconds'])} | {fmt(r['ratio'])} (≤ {r['ratio_target']:g}) | "
                f"{r['peak_gib']:.2f} (≤ {r['memory_target_gib']:g}; data alone "
                f"{r['data_peak_gib']:.2f}) | {r['structure']} | "
                f"{r['log_loss']:.4f} / {r['lr_log_loss']:.4f} |"
            )
    lines += ["", "Structures chosen and their stated error:", ""]
    for r in rows:
        if r.get("part") == "fit" and "failed" not in r:
            lines.append(f"- {r['case']}: {r['reason']}. Error: {r['error'] or 'exact'}.")
    lines += [
        "",
        "## Accuracy against the dense Laplace posterior (2000 × 5000, 1 %)",
        "",
        "| case | structure | s | max Δp held out (≤ 0.01) | max rel Δsd (≤ 10 %) | "
        "log loss / dense / LR | Δ evidence |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("part") == "accuracy" and "failed" not in r:
            lines.append(
                f"| {r['case']} | {r['structure']} | {fmt(r['seconds'])} | "
                f"{r['max_proba_diff']:.2g} | {100 * r['max_sd_rel_diff']:.2g} % | "
                f"{r['log_loss']:.4f} / {r['dense_log_loss']:.4f} / {r['lr_log_loss']:.4f} | "
                f"{r['evidence_diff']:.2g} |"
            )
    for r in rows:
        if r.get("part") == "estimate" and "failed" not in r:
            lines += [
                "",
                f"Beyond {4096} rows the marginal variances are estimated (D-056). On "
                f"{r['case']}: fit {fmt(r['seconds'])} s against {fmt(r['exact_seconds'])} s "
                f"with the exact ones; marginal sds within {100 * r['max_sd_rel_diff']:.2g} % "
                f"(median {100 * r['median_sd_rel_diff']:.2g} %; stated bound: variances "
                f"within a factor {r['error_factor']:.3g}), held-out probabilities within "
                f"{r['max_proba_diff']:.2g}, evidence {r['evidence_diff']:+.3g}.",
            ]
    lines += [
        "",
        "## Multinomial (VSLogisticRegression() against LogisticRegression(), same rows)",
        "",
        "| case | nnz/row | VS s | LR s | ratio (target) | peak GiB (target) | structure | "
        "held-out log loss VS / LR | predict_proba 2000 rows s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("part") == "multinomial" and "failed" not in r:
            lines.append(
                f"| {r['case']} | {r['nnz_per_row']:.0f} | {fmt(r['seconds'])} | "
                f"{fmt(r['lr_seconds'])} | {fmt(r['ratio'])} (≤ {r['ratio_target']:g}) | "
                f"{r['peak_gib']:.2f} (≤ {r['memory_target_gib']:g}; data alone "
                f"{r['data_peak_gib']:.2f}) | {r['structure']} | "
                f"{r['log_loss']:.4f} / {r['lr_log_loss']:.4f} | {fmt(r['predict_seconds'])} |"
            )
            lines += ["", f"Structure: {r['reason']}. Error: {r['error']}."]
    lines += [
        "",
        "Against the dense multinomial Laplace posterior where it is affordable (marginal sds "
        "of the coefficients; the rank is the configured one plus the K − 1 intercept "
        "contrasts):",
        "",
        "| case | s (dense s) | stated factor | max Δp held out | max / median rel Δsd | "
        "max rel Δsd, summary() | log loss / dense / LR | Δ evidence |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("part") == "multinomial-accuracy" and "failed" not in r:
            lines.append(
                f"| {r['case']} | {fmt(r['seconds'])} ({fmt(r['dense_seconds'])}) | "
                f"{r['error_factor']:.3g} | {r['max_proba_diff']:.2g} | "
                f"{100 * r['max_sd_rel_diff']:.2g} % / {100 * r['median_sd_rel_diff']:.2g} % | "
                f"{100 * r.get('max_summary_sd_rel_diff', np.nan):.2g} % | "
                f"{r['log_loss']:.4f} / {r['dense_log_loss']:.4f} / {r['lr_log_loss']:.4f} | "
                f"{r['evidence_diff']:.3g} |"
            )
    lines += [
        "",
        "## One-vs-rest (one binary problem per class, each with the binary fit's structure)",
        "",
        "| case | nnz/row | s | LR s | ratio | peak GiB (data alone) | structure | "
        "held-out log loss / LR | predict_proba 2000 rows s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("part") == "ovr" and "failed" not in r:
            lines.append(
                f"| {r['case']} | {r['nnz_per_row']:.0f} | {fmt(r['seconds'])} | "
                f"{fmt(r['lr_seconds'])} | {fmt(r['ratio'])} | {r['peak_gib']:.2f} "
                f"({r['data_peak_gib']:.2f}) | {r['structure']} | "
                f"{r['log_loss']:.4f} / {r['lr_log_loss']:.4f} | {fmt(r['predict_seconds'])} |"
            )
    reasons = [r["reason"] for r in rows if r.get("part") == "ovr" and "failed" not in r]
    if reasons:
        lines += ["", f"Structure of each problem: {reasons[0]}."]
    lines += [
        "",
        "## Held-out log loss at C = 1: the predictive rule or the model?",
        "",
        "The posterior predictive's held-out log loss by the library's rule, by a reference on "
        "the same latent moments (binary: 200-node Gauss–Hermite; multinomial: Monte Carlo, "
        "antithetic draws per row), and the plug-in at the posterior mode, against "
        "LogisticRegression's at the same C; the gap to LR per held-out row (mean ± standard "
        "error); the Laplace evidence at that C.",
        "",
        "| case | posterior | rule | reference | max \\|rule − reference\\| | plug-in | LR | "
        "gap to LR | evidence |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    seen = set()
    for r in rows:
        if "failed" in r or "dense_rule_log_loss" not in r:
            continue
        label = r["case"].rsplit(" ", 1)[0] if r["part"] == "accuracy" else r["case"]
        label = label.split(", lowrank")[0]
        fits = [("dense", "dense_")]
        if "structured_rule_log_loss" in r:
            fits.append((r["structure"], "structured_"))
        for name, key in fits:
            if (label, name) in seen:
                continue
            seen.add((label, name))
            gap = f"{r['gap_to_lr']:+.4f} ± {r['gap_to_lr_se']:.4f}" if key == "dense_" else ""
            evidence = f"{r['dense_evidence']:.1f}" if key == "dense_" else ""
            lines.append(
                f"| {label} | {name} | {r[key + 'rule_log_loss']:.4f} | "
                f"{r[key + 'reference_log_loss']:.4f} | {r[key + 'max_rule_error']:.2g} | "
                f"{r[key + 'plugin_log_loss']:.4f} | {r['lr_log_loss']:.4f} | {gap} | "
                f"{evidence} |"
            )
    lines += ["", "## predict_proba and the memory guard", ""]
    for r in rows:
        if r.get("part") == "predict" and "failed" not in r:
            lines.append(
                f"- {r['case']} ({r['structure']}): {fmt(r['seconds'])} s against "
                f"LogisticRegression's {fmt(r['lr_seconds'])} s: {fmt(r['ratio'])}× (best of "
                f"rounds {fmt(r['best_ratio'])}×; target ≤ 10×)."
            )
        if r.get("part") == "guard" and "failed" not in r:
            lines.append(
                f"- {r['case']}: refused={r['refused']} after {r['seconds']:.2f} s: "
                f'"{r["message"]}"'
            )
    failed = [r for r in rows if "failed" in r]
    if failed:
        lines += ["", "## Failed cases", ""]
        lines += [f"- {r['part']} {r['case']}: `{r['failed'][-300:]}`" for r in failed]
    (out / "text_scale.md").write_text("\n".join(lines) + "\n")
    plot(rows, out / "text_scale.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [
        r for r in rows if r.get("part") in ("fit", "multinomial", "predict") and "failed" not in r
    ]
    if not timed:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    names = [
        r["case"].replace("newsgroups-shaped ", "ng ").replace("predict_proba ", "predict ")
        for r in timed
    ]
    axes[0].barh(names, [r["ratio"] for r in timed], color="tab:blue")
    for i, r in enumerate(timed):
        axes[0].plot([r["ratio_target"]] * 2, [i - 0.4, i + 0.4], color="tab:red")
    axes[0].set_xlabel("time / LogisticRegression (red: target)")
    fits = [r for r in timed if r["part"] in ("fit", "multinomial")]
    axes[1].barh(
        [n for n, r in zip(names, timed, strict=True) if r["part"] in ("fit", "multinomial")],
        [r["peak_gib"] for r in fits],
        color="tab:green",
    )
    for i, r in enumerate(fits):
        axes[1].plot([r["memory_target_gib"]] * 2, [i - 0.4, i + 0.4], color="tab:red")
    axes[1].set_xlabel("peak memory of the fit's process, GiB (red: target)")
    axes[1].set_xlim(0, 4.5)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", default="all", help="all, or parts separated by commas: " + ", ".join(PARTS)
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--worker", nargs="+")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    from _common import machine, machine_line

    rows: list[dict] = []
    parts = list(PARTS) if args.part == "all" else args.part.split(",")
    if not set(parts) <= set(PARTS):
        parser.error(f"--part: {args.part!r} is not 'all' or among {', '.join(PARTS)}")
    if "fit" in parts:
        cases = QUICK_FIT_CASES if args.quick else FIT_CASES
        for name in cases:
            repeats = 1 if args.quick or cases[name][0] > 10_000 else 3
            rows += in_subprocess(["fit", name, str(repeats)])
    if "accuracy" in parts:
        for C in (1.0,) if args.quick else (1.0, 10.0):
            rows += in_subprocess(["accuracy", str(C)])
    if "estimate" in parts and not args.quick:
        rows += in_subprocess(["estimate"])
    if "multinomial" in parts:
        rows += in_subprocess(["multinomial", "quick" if args.quick else "full"])
    if "ovr" in parts:
        for name in ONE_VS_REST_ESTIMATORS:
            rows += in_subprocess(["ovr", name, "1" if args.quick else "3"])
    if "predict" in parts:
        for columns in ("zipf", "uniform"):
            rows += in_subprocess(["predict", str(10**5 if args.quick else 10**6), "3", columns])
    if "guard" in parts:
        rows += in_subprocess(["guard"])
    line = machine_line(machine())
    machines = dict.fromkeys(parts, line)
    previous = args.out / "text_scale.json"
    if args.part != "all" and previous.exists():
        # A partial rerun keeps the other parts' rows of the previous run, and their
        # machine lines.
        earlier = json.loads(previous.read_text())
        kept = [r for r in earlier["rows"] if r.get("part", "").split("-")[0] not in parts]
        machines = {**_part_machines(earlier), **machines}
        rows = kept + rows
    report(rows, args.out, machines)
    print((args.out / "text_scale.md").read_text())


if __name__ == "__main__":
    main()
