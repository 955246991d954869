"""The high-dimension benchmark cases, their error measure and their cached NUTS references.

Each case is a binary problem ``(X, y)`` with labels y in {-1, +1}: five dense ones from
scikit-learn (standardized by ``StandardScaler``; constant columns stay all-zero) and one
sparse CSR problem with simulated labels (not standardized, so it stays sparse). The model is
vsbayes' binary GLM at C = 1: ``w ~ N(0, I_d)``, intercept ``b ~ N(0, 10⁶)``, θ = [w, b]
(intercept last), logistic or probit link (logistic only for the sparse case).

The references are long NUTS runs (``benchmarks/nuts_reference.py``), kept as the
moment-matched Gaussian of the draws in ``results/nuts_reference/<case>_<link>.npz``;
:func:`load_reference` reads them and :func:`gaussian_kl` measures a method's Gaussian
against one. Nothing here needs NumPyro or JAX.

The ``LARGE_REFERENCES`` (over 1 MB: their covariance has 500² and 2000² entries) are not
committed; they live in ``results/cache/nuts_reference/`` (ignored by git), where
``python benchmarks/nuts_reference.py --restore`` copies the copies committed before
``COMMITTED_AT`` (seconds, bitwise the same), or
``python benchmarks/nuts_reference.py --cases classif_d500_m300 sparse_d2000`` reruns NUTS
(about 4, 6 and 20 minutes on one core; needs the ``bench`` extra).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, solve_triangular

REFERENCE_DIR = Path(__file__).resolve().parent / "results" / "nuts_reference"
#: Where the references over 1 MB are generated on demand (ignored by git).
LARGE_REFERENCE_DIR = REFERENCE_DIR.parent / "cache" / "nuts_reference"
LARGE_REFERENCES = ("classif_d500_m300_logistic", "classif_d500_m300_probit",
                    "sparse_d2000_logistic")  # fmt: skip
#: The last commit with the large references in ``REFERENCE_DIR``.
COMMITTED_AT = "e3e12ddf27c1fd67ece7bef7ae6d6a877701ab6f"

#: Prior of the model: variance C of each weight and of the intercept.
PRIOR_VAR = 1.0
INTERCEPT_PRIOR_VAR = 1e6

_DENSE = ("logistic", "probit")

#: name -> (M, d) without the intercept, links, source
CASES = {
    "breast_cancer": {
        "shape": (569, 30),
        "links": _DENSE,
        "source": "sklearn load_breast_cancer, malignant/benign, standardized",
    },
    "digits3": {
        "shape": (1797, 64),
        "links": _DENSE,
        "source": "sklearn load_digits, class 3 vs rest, standardized (constant pixels stay 0)",
    },
    "classif_d100": {
        "shape": (1000, 100),
        "links": _DENSE,
        "source": "make_classification(n_samples=1000, n_features=100, random_state=0), "
        "standardized",
    },
    "classif_d200": {
        "shape": (1000, 200),
        "links": _DENSE,
        "source": "make_classification(n_samples=1000, n_features=200, random_state=0), "
        "standardized",
    },
    "classif_d500_m300": {
        "shape": (300, 500),
        "links": _DENSE,
        "source": "make_classification(n_samples=300, n_features=500, random_state=0), "
        "standardized",
    },
    "sparse_d2000": {
        "shape": (5000, 2000),
        "links": ("logistic",),
        "source": "scipy.sparse.random CSR, 1 % non-zeros (N(0,1) values), labels drawn from "
        "σ(X w* + 0.5) with w* ~ N(0, I); not standardized",
    },
}


def cells() -> list[tuple[str, str]]:
    """Every (case, link) pair of the benchmark, cheap cases first."""
    return [(name, link) for name, case in CASES.items() for link in case["links"]]


def _standardized(X) -> np.ndarray:
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit_transform(np.asarray(X, dtype=float))


def _sparse_case() -> tuple[sp.csr_matrix, np.ndarray]:
    M, d = CASES["sparse_d2000"]["shape"]
    values = np.random.default_rng(1)
    X = sp.random(
        M, d, density=0.01, format="csr", random_state=0, data_rvs=values.standard_normal
    ).astype(float)
    w_star = np.random.default_rng(2).standard_normal(d)
    p = 1.0 / (1.0 + np.exp(-(X @ w_star + 0.5)))
    y = np.where(np.random.default_rng(3).random(M) < p, 1.0, -1.0)
    return X, y


def load_case(name: str):
    """``(X, y)`` of one case: X float64 (dense ndarray or CSR), y in {-1.0, +1.0}."""
    from sklearn import datasets

    if name == "breast_cancer":
        X, y = datasets.load_breast_cancer(return_X_y=True)
        X, y = _standardized(X), np.where(y == 1, 1.0, -1.0)
    elif name == "digits3":
        X, y = datasets.load_digits(return_X_y=True)
        X, y = _standardized(X), np.where(y == 3, 1.0, -1.0)
    elif name in CASES and name.startswith("classif_d"):
        M, d = CASES[name]["shape"]
        X, y = datasets.make_classification(n_samples=M, n_features=d, random_state=0)
        X, y = _standardized(X), np.where(y == 1, 1.0, -1.0)
    elif name == "sparse_d2000":
        X, y = _sparse_case()
    else:
        raise ValueError(f"Unknown case {name!r}; choose from {list(CASES)}.")
    if X.shape != CASES[name]["shape"]:
        raise ValueError(f"{name}: shape {X.shape}, expected {CASES[name]['shape']}.")
    return X, y


def n_gaussian_parameters(dim: int) -> int:
    """Free parameters of a Gaussian in ``dim`` dimensions: mean and covariance."""
    return dim + dim * (dim + 1) // 2


def gaussian_kl(mean_ref, cov_ref, mean, cov) -> float:
    """``KL(N(mean_ref, cov_ref) || N(mean, cov))`` in nats, through Cholesky factors.

    With ``cov_ref = L₀L₀ᵀ`` and ``cov = L₁L₁ᵀ``:
    ``½ (‖L₁⁻¹L₀‖²_F + ‖L₁⁻¹(mean - mean_ref)‖² - k + 2 Σ log diag L₁ - 2 Σ log diag L₀)``.
    Returns ``inf`` when ``cov`` is not positive definite.
    """
    mean_ref, mean = np.asarray(mean_ref, float), np.asarray(mean, float)
    cov_ref, cov = np.asarray(cov_ref, float), np.asarray(cov, float)
    lower_ref = np.linalg.cholesky(cov_ref)
    try:
        lower, _ = cho_factor(cov, lower=True)
    except np.linalg.LinAlgError:
        return float("inf")
    lower = np.tril(lower)
    a = solve_triangular(lower, lower_ref, lower=True)
    v = solve_triangular(lower, mean - mean_ref, lower=True)
    log_det = 2.0 * (np.log(np.diag(lower)).sum() - np.log(np.diag(lower_ref)).sum())
    return float(0.5 * (np.sum(a * a) + v @ v - len(mean_ref) + log_det))


def reference_path(case: str, link: str) -> Path:
    name = f"{case}_{link}"
    return (LARGE_REFERENCE_DIR if name in LARGE_REFERENCES else REFERENCE_DIR) / f"{name}.npz"


def restore_large_references() -> list[Path]:
    """Copy the ``LARGE_REFERENCES`` missing from the cache out of the git history."""
    restored = []
    LARGE_REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    for name in LARGE_REFERENCES:
        path = LARGE_REFERENCE_DIR / f"{name}.npz"
        if path.is_file():
            continue
        committed = f"{COMMITTED_AT}:benchmarks/results/nuts_reference/{name}.npz"
        done = subprocess.run(
            ["git", "show", committed], capture_output=True, check=True, cwd=REFERENCE_DIR.parent
        )
        path.write_bytes(done.stdout)
        restored.append(path)
    return restored


def load_reference(case: str, link: str):
    """``(mean, cov, diagnostics)`` of the NUTS reference of one cell, or ``None``.

    ``mean`` (d+1,) and ``cov`` (d+1, d+1) (float64, also when stored as float32) are those
    of the draws, θ = [w, b]; ``diagnostics`` is a dict (R-hat, ESS, draws, wall time...).
    """
    path = reference_path(case, link)
    if not path.is_file():
        return None
    with np.load(path) as data:
        mean = data["mean"].astype(float)
        cov = data["cov"].astype(float)
        diagnostics = json.loads(str(data["diagnostics"]))
    return mean, cov, diagnostics
