"""All-zero rows without an intercept: a constant factor, which EP keeps apart.

Such a row (an empty document of a term matrix) has the latent value 0 under every θ: its
factor is the constant F(0)^s (binary: 2^(−s) for both links; multinomial K^(−s)). The
posterior is that of the other rows, and the evidence theirs times the constant. EP
divided by the row's zero latent variance (RuntimeWarnings, then a Laplace fallback with
an UnreliableFitWarning; the multinomial EP raised a LinAlgError).
"""

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import vsbayes as vb
from vsbayes.exceptions import UnreliableFitWarning
from vsbayes.models import BinaryGLMPosterior, SoftmaxGLMPosterior
from vsbayes.models.latent import constant_rows, touched_columns

# The fit with the constant rows runs the same sweeps on the same rows as the fit without
# them, from a Laplace start equal to round-off (the zero rows add exact zeros to its sums):
# the same fixed point to round-off, far inside 1e-8.
RTOL = 1e-8
# The sampling fits' log densities take log F in float32 (to 1e-7 per observation, see
# BinaryGLMPosterior.log_likelihood): the constant rows' share of their evidence is exact
# to that per unit of weight.
FAST_LOG_CDF = 1e-7


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    zero = np.zeros(30, dtype=bool)
    zero[::4] = True
    X[zero] = 0.0
    y = (X[:, 0] + rng.normal(size=30) > 0).astype(int)
    weights = rng.uniform(0.2, 2.5, size=30)
    weights[0] = 0.0  # a zero row of weight 0: dropped as every such row
    return X, y, np.arange(30) % 3, weights, zero


def with_explicit_zeros(X, zero):
    """X as CSR whose zero rows are stored entries of value 0.0."""
    filled = X.copy()
    filled[zero] = 1.0
    sparse = sp.csr_matrix(filled)
    for i in np.flatnonzero(zero):
        sparse.data[sparse.indptr[i] : sparse.indptr[i + 1]] = 0.0
    return sparse


def test_constant_rows_dense_sparse_and_stored_zeros(data):
    X, y, _, weights, zero = data
    sparse = with_explicit_zeros(X, zero)
    assert sparse.nnz == X.shape[0] * X.shape[1]  # every zero row's entries are stored
    np.testing.assert_array_equal(constant_rows(X), zero)
    np.testing.assert_array_equal(constant_rows(sp.csr_matrix(X)), zero)
    np.testing.assert_array_equal(constant_rows(sparse), zero)
    # The models' own rows (weight 0 dropped); an intercept makes every row informative.
    priors = {"prior_var": 1.0, "intercept_prior_var": None}
    model = BinaryGLMPosterior(sparse, 2 * y - 1, weights, "probit", **priors)
    split = model.informative_rows()
    np.testing.assert_array_equal(split.constant, zero[weights > 0])
    assert split.log_likelihood == pytest.approx(-math.log(2) * weights[zero].sum(), rel=1e-15)
    assert split.model.n_observations == int((~zero & (weights > 0)).sum())
    softmax = SoftmaxGLMPosterior(X, y, weights, 3, **priors).informative_rows()
    assert softmax.log_likelihood == pytest.approx(-math.log(3) * weights[zero].sum(), rel=1e-15)
    with_intercept = BinaryGLMPosterior(
        X, 2 * y - 1, weights, "logistic", prior_var=1.0, intercept_prior_var=1.0
    ).informative_rows()
    assert not with_intercept.constant.any()


@pytest.mark.parametrize(
    ("estimator", "multinomial", "exact"),
    [
        (vb.EPLogisticRegression(fit_intercept=False), False, True),
        (vb.EPLogisticRegression(fit_intercept=False, damping=0.5), True, True),
        (vb.EPProbitRegression(fit_intercept=False), False, True),
        (vb.EPLogisticRegression(fit_intercept=False, l1_ratio=1.0, C=0.5), False, True),
        (vb.VSLogisticRegression(fit_intercept=False), False, True),  # EP's sites ("auto")
        (vb.VSLogisticRegression(fit_intercept=False), True, True),
        (vb.VSProbitRegression(fit_intercept=False, strategy="global"), False, False),
        (vb.ISLogisticRegression(fit_intercept=False, random_state=0), False, False),
        (vb.BMCLogisticRegression(fit_intercept=False, random_state=0), False, False),
        (vb.VBLogisticRegression(fit_intercept=False), False, True),
        (vb.LaplaceLogisticRegression(fit_intercept=False), True, True),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, vb.BayesianGLMClassifier) else str(v),
)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "stored-zeros"])
def test_zero_rows_leave_the_posterior_and_multiply_the_evidence(
    data, estimator, multinomial, exact, sparse
):
    X, y, y3, weights, zero = data
    labels, k = (y3, 3) if multinomial else (y, 2)
    design = with_explicit_zeros(X, zero) if sparse else X
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.simplefilter("error", UnreliableFitWarning)
        full = estimator.__sklearn_clone__().fit(design, labels, sample_weight=weights)
    kept = estimator.__sklearn_clone__().fit(X[~zero], labels[~zero], sample_weight=weights[~zero])
    np.testing.assert_allclose(full.coef_, kept.coef_, rtol=RTOL, atol=RTOL * abs(kept.coef_).max())
    scale = np.abs(kept.sigma_).max()
    np.testing.assert_allclose(full.sigma_, kept.sigma_, rtol=RTOL, atol=RTOL * scale)
    factor = -math.log(k) * weights[zero].sum()  # one problem, binary or multinomial
    tolerance = 1e-10 if exact else FAST_LOG_CDF * weights[zero].sum()
    assert full.log_marginal_likelihood_value_ == pytest.approx(
        kept.log_marginal_likelihood_value_ + factor, abs=tolerance
    )


def test_rows_all_zero_leave_the_prior(data):
    """No informative row: EP's posterior is the prior, its evidence the constant."""
    X, y, y3, _, _ = data
    for labels, k in ((y, 2), (y3, 3)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = vb.EPLogisticRegression(fit_intercept=False, C=2.0).fit(0 * X, labels)
        np.testing.assert_array_equal(model.coef_, 0.0)
        np.testing.assert_allclose(np.diag(model.sigma_), 2.0, rtol=1e-12)
        assert model.log_marginal_likelihood_value_ == pytest.approx(-30 * math.log(k), rel=1e-14)


@pytest.mark.parametrize("multinomial", [False, True], ids=["binary", "multinomial"])
def test_ep_leave_one_out_of_a_zero_row_is_its_constant(data, multinomial):
    """EP's cavity of a zero row is the posterior's point mass at 0 (its site is 0): both
    its terms are s log F(0); the other rows' terms, cavities and warm refits
    (refit_above=0: every row whose term falls below its lppd), are those without it."""
    X, y, y3, weights, zero = data
    labels, k = (y3, 3) if multinomial else (y, 2)
    estimator = vb.EPLogisticRegression(fit_intercept=False)
    full = estimator.__sklearn_clone__().fit(X, labels, sample_weight=weights)
    kept = estimator.__sklearn_clone__().fit(X[~zero], labels[~zero], sample_weight=weights[~zero])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loo = full.loo(X, labels, sample_weight=weights, refit_above=0.0)
    reference = kept.loo(X[~zero], labels[~zero], sample_weight=weights[~zero], refit_above=0.0)
    assert loo.method == "ep-cavity" and not loo.refitted[zero].any()
    np.testing.assert_allclose(loo.pointwise[zero], -math.log(k) * weights[zero], rtol=1e-14)
    np.testing.assert_allclose(loo.pointwise[~zero], reference.pointwise, rtol=RTOL)
    np.testing.assert_array_equal(loo.refitted[~zero], reference.refitted)


def test_touched_columns_dense_sparse_stored_zeros_and_masked_rows():
    X = np.array([[1.0, 0.0, 0.0, 2.0], [0.0, 0.0, 3.0, 0.0], [0.0, 4.0, 0.0, 0.0]])
    rows = np.array([True, True, False])  # column 1 only in a masked-out row
    expected = np.array([True, False, True, True])
    sparse = sp.csr_matrix(X)
    sparse.data[sparse.data == 2.0] = 0.0  # a stored zero: column 3 untouched
    # Duplicates summing to zero: column 0 of row 0 is 1 − 1 + 1 = 1, row 1's 2 − 2 = 0.
    coo = sp.coo_matrix(([1.0, -1.0, 1.0, 2.0, -2.0], ([0, 0, 0, 1, 1], [0, 0, 0, 2, 2])), (3, 4))
    np.testing.assert_array_equal(touched_columns(X, rows), expected)
    np.testing.assert_array_equal(touched_columns(sparse, rows), [True, False, True, False])
    np.testing.assert_array_equal(touched_columns(coo, rows), [True, False, False, False])
