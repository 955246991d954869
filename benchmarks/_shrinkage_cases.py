"""The shrinkage-prior benchmark's cases: datasets, priors and their cached NUTS references.

Model: binary logistic regression, θ = [w, b] (intercept last), the intercept b ~ N(0, 10⁶)
and one prior on the coefficients w (``PRIORS``), all on standardized features (as
``_high_dim_cases.py``: ``StandardScaler``, so one prior scale means the same on every
feature):

* ``gaussian``: w_j ~ N(0, 1), vsbayes' default prior at C = 1 (the one the estimators
  fit today: the benchmark's end-to-end check before the other priors exist);
* ``laplace``: density exp(-|w_j| / s) / (2 s), s = 1 (prior sd √2): the Bayesian L1, whose
  mode is ``LogisticRegression(penalty="l1", C=s)``'s solution;
* ``student_t``: Student t, ν = 3, scale 1 (prior sd √3; heavier tails than the Gaussian,
  the weakly informative choice of Gelman et al. 2008 for unit-scale inputs);
* ``horseshoe``: w_j | λ_j ~ N(0, λ_j² τ²), λ_j ~ half-Cauchy(0, 1), the global scale τ = 0.1
  fixed (a priori P(|w_j| > 1) ≈ 2τ/π ≈ 6 %: most coefficients near zero, a few free).

Datasets (``DATASETS``): the paper's Ionosphere and WPBC (the UCI files, read from
``--data-dir``, prepared as ``_uci.py`` then standardized without the constant column),
scikit-learn's breast cancer, and a synthetic sparse-truth problem (``sparse_truth``: M =
500, d = 200, 10 relevant features).

References: long NUTS runs (``benchmarks/nuts_shrinkage_reference.py``), the moment-matched
Gaussian of the draws with diagnostics, in ``results/nuts_reference/shrinkage/<prior>_<dataset>
.npz``; :func:`load_reference` reads one. Nothing here imports NumPyro or JAX (nor the priors'
classes, until :func:`vsbayes_prior` is called).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import _uci
import numpy as np

REFERENCE_DIR = Path(__file__).resolve().parent / "results" / "nuts_reference" / "shrinkage"
INTERCEPT_PRIOR_VAR = 1e6

#: name -> parameters of the prior on each coefficient (the fixed public API's names).
PRIORS = {
    "gaussian": {"var": 1.0},
    "laplace": {"scale": 1.0},
    "student_t": {"df": 3.0, "scale": 1.0},
    "horseshoe": {"global_scale": 0.1},
}
PRIOR_LABELS = {
    "gaussian": "Gaussian N(0, 1) (C = 1)",
    "laplace": "Laplace, scale 1",
    "student_t": "Student t, ν = 3, scale 1",
    "horseshoe": "horseshoe, τ = 0.1",
}

#: name -> (M, d) without the intercept, source
DATASETS = {
    "ionosphere": ((351, 32), "UCI Ionosphere (the paper's), attributes 3-34, standardized"),
    "wpbc": ((194, 33), "UCI WPBC (the paper's), rows with '?' dropped, standardized"),
    "breast_cancer": ((569, 30), "sklearn load_breast_cancer, malignant/benign, standardized"),
    "sparse_d200": (
        (500, 200),
        "synthetic: x ~ N(0, I_200), 10 relevant coefficients ±(0.5 … 2), y ~ σ(x·w*), "
        "standardized",
    ),
}
#: The synthetic problem's relevant features (its first ten columns).
SPARSE_RELEVANT = np.arange(10)


def _standardized(X) -> np.ndarray:
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit_transform(np.asarray(X, dtype=float))


def sparse_truth(M: int = 500, d: int = 200, relevant: int = 10, seed: int = 0):
    """``(X, y, w_star)``: x ~ N(0, I_d), the first ``relevant`` coefficients ±(0.5 … 2)
    (alternating signs), the others 0, y ~ Bernoulli(σ(x·w*)) in {0, 1}; X not standardized."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((M, d))
    w_star = np.zeros(d)
    w_star[:relevant] = np.linspace(0.5, 2.0, relevant) * np.where(np.arange(relevant) % 2, -1, 1)
    y = (rng.random(M) < 1.0 / (1.0 + np.exp(-X @ w_star))).astype(int)
    return X, y, w_star


def load_dataset(name: str, data_dir=_uci.DEFAULT_DATA_DIR) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)``: X (M, d) standardized, no constant column; y in {-1.0, +1.0}."""
    if name in ("ionosphere", "wpbc"):
        X, y = _uci.load(name, data_dir)
        X = _standardized(X[:, :-1])  # the constant column goes: the intercept is separate
    elif name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        X, y = load_breast_cancer(return_X_y=True)
        X = _standardized(X)
    elif name == "sparse_d200":
        X, y, _ = sparse_truth()
        X = _standardized(X)
    else:
        raise ValueError(f"Unknown dataset {name!r}; choose from {list(DATASETS)}.")
    if X.shape != DATASETS[name][0]:
        raise ValueError(f"{name}: shape {X.shape}, expected {DATASETS[name][0]}.")
    return X, np.where(np.asarray(y) == 1, 1.0, -1.0)


def prior_variance(prior: str) -> float:
    """The coefficient prior's variance (inf for the horseshoe): the Gaussian surrogate whose
    Laplace approximation preconditions NUTS."""
    p = PRIORS[prior]
    if prior == "gaussian":
        return p["var"]
    if prior == "laplace":
        return 2.0 * p["scale"] ** 2
    if prior == "student_t":
        return p["df"] / (p["df"] - 2.0) * p["scale"] ** 2
    return math.inf


def log_prior_coefficients(prior: str, w: np.ndarray) -> np.ndarray:
    """Normalized log prior density of the coefficient rows ``w`` (N, d), summed over j
    (the horseshoe's by its exact marginal, Carvalho, Polson and Scott 2010:
    p(w) = exp(u) E₁(u) / (τ √(2π³)), u = w² / (2τ²))."""
    from scipy.special import exp1, gammaln

    w = np.atleast_2d(w)
    p = PRIORS[prior]
    if prior == "gaussian":
        v = p["var"]
        terms = -0.5 * (w * w / v + math.log(2 * math.pi * v))
    elif prior == "laplace":
        s = p["scale"]
        terms = -np.abs(w) / s - math.log(2 * s)
    elif prior == "student_t":
        nu, s = p["df"], p["scale"]
        log_norm = gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * math.log(nu * math.pi)
        log_norm -= math.log(s)
        terms = log_norm - 0.5 * (nu + 1) * np.log1p((w / s) ** 2 / nu)
    else:
        tau = p["global_scale"]
        u = w * w / (2 * tau * tau)
        # log(e^u E₁(u)): E₁ underflows beyond u ≈ 700 (|w| ≈ 3.7 at τ = 0.1), where the
        # asymptotic series e^u E₁(u) = (1 - 1/u + 2/u² - 6/u³ + …)/u is exact to 1e-7
        large = u > 50.0
        small_u = np.where(large, 1.0, u)
        big_u = np.where(large, u, 50.0)
        series = np.log1p(-1 / big_u + 2 / big_u**2 - 6 / big_u**3 + 24 / big_u**4) - np.log(big_u)
        with np.errstate(divide="ignore"):
            log_scaled = np.where(large, series, small_u + np.log(exp1(small_u)))
        terms = log_scaled - math.log(tau) - 0.5 * math.log(2 * math.pi**3)
    return terms.sum(axis=1)


def vsbayes_prior(prior: str, dim: int):
    """The ``prior=`` argument of the vsbayes estimators for ``prior`` on ``dim - 1``
    coefficients and an intercept: a (mean, variances) pair for the Gaussian, else an
    instance of the prior's class (``AttributeError`` if vsbayes has none yet)."""
    import vsbayes

    p = PRIORS[prior]
    if prior == "gaussian":
        variances = np.full(dim, p["var"])
        variances[-1] = INTERCEPT_PRIOR_VAR
        return (np.zeros(dim), variances)
    if prior == "laplace":
        return vsbayes.LaplacePrior(scale=p["scale"])
    if prior == "student_t":
        return vsbayes.StudentTPrior(df=p["df"], scale=p["scale"])
    return vsbayes.HorseshoePrior(global_scale=p["global_scale"])


#: The classes each prior needs from vsbayes (``--check-api``).
PRIOR_CLASSES = {
    "gaussian": None,
    "laplace": "LaplacePrior",
    "student_t": "StudentTPrior",
    "horseshoe": "HorseshoePrior",
}


def reference_path(prior: str, dataset: str) -> Path:
    return REFERENCE_DIR / f"{prior}_{dataset}.npz"


def load_reference(prior: str, dataset: str):
    """``(mean, cov, diagnostics)`` of the NUTS reference of θ = [w, b], or ``None``."""
    path = reference_path(prior, dataset)
    if not path.is_file():
        return None
    with np.load(path) as data:
        mean = data["mean"].astype(float)
        cov = data["cov"].astype(float)
        diagnostics = json.loads(str(data["diagnostics"]))
    return mean, cov, diagnostics
