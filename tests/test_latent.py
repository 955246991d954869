"""Per-row latent moments (layer 4): from the covariance (the fits' sweeps) and from a factor
(prediction), dense and sparse rows, against the direct ``J Σ Jᵀ``; and the fitted
predictive's kinds."""

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn

from vsbayes.models import fitted_predictive as fitted
from vsbayes.models import latent
from vsbayes.models.softmax_predictive_rules import centred_basis


def sparse_rows(rng, m, d, density=0.2):
    return sp.random(m, d, density=density, format="csr", rng=rng, data_rvs=rng.standard_normal)


def random_cov(rng, p):
    root = rng.normal(size=(p, p + 2)) / np.sqrt(p)
    return root @ root.T


def direct_moments(X, coef, cov):
    """Mean (M, r) and covariance (M, r, r) of g = B x̃, from dense rows and the full Σ."""
    X = X.toarray() if sp.issparse(X) else X
    r, w = coef.shape
    x = np.column_stack([X, np.ones(len(X))]) if w > X.shape[1] else X
    blocks = cov.reshape(r, w, r, w)
    return x @ coef.T, np.einsum("ij,ajcl,il->iac", x, blocks, x)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_row_variances_are_the_quadratic_forms(kind):
    rng = np.random.default_rng(0)
    design = sparse_rows(rng, 200, 30)
    dense = design.toarray()
    cov = random_cov(rng, 30)
    want = np.einsum("ij,jk,ik->i", dense, cov, dense)
    design = dense if kind == "dense" else design
    np.testing.assert_allclose(latent.row_variances(design, cov), want, rtol=1e-12)
    # Blocks of one row (a 1-byte budget) change nothing beyond round-off.
    np.testing.assert_allclose(latent.row_variances(design, cov, 1), want, rtol=1e-12)


@pytest.mark.parametrize("n_scores", [1, 3])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("kind", ["dense", "dense_pairs", "sparse_product", "sparse_pairs"])
def test_row_moments_are_the_latent_moments(n_scores, fit_intercept, kind, monkeypatch):
    rng = np.random.default_rng([n_scores, fit_intercept])
    d = 12
    X = sparse_rows(rng, 150, d)
    if kind.startswith("dense"):
        X = X.toarray()
    monkeypatch.setattr(latent, "_GATHER_COST", 1e-9 if kind == "sparse_pairs" else 1e9)
    by_pairs = kind == "dense_pairs"
    w = d + fit_intercept
    coef = rng.normal(size=(n_scores, w))
    cov = random_cov(rng, n_scores * w)
    want_mean, want_cov = direct_moments(X, coef, cov)
    mean, cov_rows = latent.row_moments(X, coef, cov, by_pairs=by_pairs)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cov_rows, want_cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(cov_rows, np.swapaxes(cov_rows, 1, 2))
    with sklearn.config_context(working_memory=0.001):  # blocks of a few rows
        small_mean, small_cov = latent.row_moments(X, coef, cov, by_pairs=by_pairs)
    np.testing.assert_allclose(small_mean, mean, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(small_cov, cov_rows, rtol=1e-12, atol=1e-14)


def test_one_score_is_the_row_variance():
    # The binary latent is the one-score case: row_moments on [x, 1] with one score is
    # row_variances of the design [x, 1].
    rng = np.random.default_rng(4)
    X = rng.normal(size=(80, 5))
    coef, cov = rng.normal(size=(1, 6)), random_cov(rng, 6)
    _, cov_rows = latent.row_moments(X, coef, cov)
    design = np.column_stack([X, np.ones(80)])
    np.testing.assert_allclose(cov_rows[:, 0, 0], latent.row_variances(design, cov), rtol=1e-13)


@pytest.mark.parametrize(
    "sparse, k, d, density",
    [
        (False, 3, 6, 0.5),
        (True, 3, 6, 0.5),
        (False, 5, 6, 1.0),
        (False, 3, 20, 1.0),
        (True, 4, 60, 0.03),
    ],
)
def test_joint_latents_are_the_centred_moments(sparse, k, d, density):
    # The multinomial posterior's K scores, centred: P J Σ Jᵀ P with P = I - 11ᵀ/K; sparse
    # rows by a dense copy of the chunk, or (few non-zeros among many features) by pairs;
    # the dense forms: the rows' pair products against the blocks' triangles (d = 6), or
    # the blocks side by side (3 classes × 21 parameters: more products than pairs' work).
    rng = np.random.default_rng(5)
    X = sparse_rows(rng, 60, d, density=density)
    X = X if sparse else X.toarray()
    coef, intercept = rng.normal(size=(k, d)), rng.normal(size=k)
    cov = random_cov(rng, k * d + k)
    # θ = [W.ravel(), b] to the (K, w) rows [w_k, b_k] of direct_moments.
    order = np.hstack([np.arange(k * d).reshape(k, d), k * d + np.arange(k)[:, None]]).ravel()
    want_mean, want_cov = direct_moments(
        X, np.column_stack([coef, intercept]), cov[np.ix_(order, order)]
    )
    centre = np.eye(k) - 1.0 / k
    joint = latent.JointLatents(X, coef, intercept, cov)
    assert joint.pairs == (sparse and d == 60)
    assert joint.forms.triangular == (d == 6)
    mean, cov_rows = joint(slice(0, 60))
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cov_rows, centre @ want_cov @ centre, rtol=1e-10, atol=1e-12)
    # What the predictive rule takes: the covariance in the centred basis Q, Qᵀ J Σ Jᵀ Q.
    basis = centred_basis(k)
    _, reduced = joint.centred(slice(0, 60))
    np.testing.assert_allclose(reduced, basis.T @ want_cov @ basis, rtol=1e-10, atol=1e-12)


def test_fitted_predictive_kind_follows_the_posterior():
    rng = np.random.default_rng(6)
    d = 3
    kinds = {
        (1, (d + 1, d + 1)): fitted.BinaryPredictive,
        (3, (3, d + 1, d + 1)): fitted.OneVsRestPredictive,
        (3, (3 * d + 3, 3 * d + 3)): fitted.MultinomialPredictive,
    }
    for (n_rows, shape), kind in kinds.items():
        predictive = fitted.fitted_predictive(
            rng.normal(size=(n_rows, d)), np.zeros(n_rows), np.zeros(shape), "logistic"
        )
        assert type(predictive) is kind
