"""LogisticRegression's conventions beyond the scikit-learn estimator checks."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import ALL, assert_valid_fit, make
from sklearn.datasets import load_iris, make_classification
from sklearn.preprocessing import StandardScaler

from vsbayes import LaplaceLogisticRegression, VSLogisticRegression
from vsbayes.exceptions import ConvergenceWarning, NotPositiveDefiniteError


@pytest.fixture(scope="module")
def binary():
    X, y = make_classification(120, 5, random_state=0)
    return StandardScaler().fit_transform(X), y


@pytest.mark.parametrize("Estimator", [LaplaceLogisticRegression, VSLogisticRegression])
def test_sparsify_densify_round_trip(Estimator, binary):
    X, y = binary
    est = Estimator(random_state=0).fit(X, y)
    dense_coef, proba = est.coef_.copy(), est.predict_proba(X)
    assert est.sparsify() is est and sp.issparse(est.coef_)
    np.testing.assert_array_equal(est.coef_.toarray(), dense_coef)
    np.testing.assert_array_equal(est.predict_proba(X), proba)
    assert est.densify() is est and isinstance(est.coef_, np.ndarray)
    np.testing.assert_array_equal(est.coef_, dense_coef)


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def test_two_default_fits_are_identical(binary):
    X, y = binary
    first, second = VSLogisticRegression().fit(X, y), VSLogisticRegression().fit(X, y)
    np.testing.assert_array_equal(first.coef_, second.coef_)
    np.testing.assert_array_equal(first.sigma_, second.sigma_)


@pytest.mark.parametrize(
    "estimator",
    [
        LaplaceLogisticRegression(),
        VSLogisticRegression(),
        VSLogisticRegression(strategy="global"),
        VSLogisticRegression(strategy="sites"),
    ],
    ids=repr,
)
def test_multinomial_coefficients_are_centred(estimator, iris):
    X, y = iris
    est = estimator.fit(X, y)
    # Round-off of a mean over three classes: a few ulps of the largest entry.
    assert abs(est.intercept_.sum()) <= 1e-12 * np.abs(est.intercept_).max()
    assert np.all(np.abs(est.coef_.sum(axis=0)) <= 1e-12 * np.abs(est.coef_).max())
    # The shift direction of each column keeps its prior: variance C along 1_K/√K.
    k, d = est.coef_.shape
    shift = np.zeros(len(est.sigma_))
    shift[np.arange(k) * d] = 1 / np.sqrt(k)  # the first feature's classes
    np.testing.assert_allclose(shift @ est.sigma_ @ shift, est.C, rtol=1e-10)


def test_logistic_regression_keywords_fit(binary):
    X, y = binary
    est = VSLogisticRegression(
        penalty="l2",
        solver="lbfgs",
        max_iter=1000,
        tol=1e-4,
        warm_start=False,
        dual=False,
        intercept_scaling=1,
        l1_ratio=None,
    ).fit(X, y)
    assert est.coef_.shape == (1, X.shape[1])


@pytest.mark.parametrize("solver", ["lbfgs", "newton-cg", "newton-cholesky", "sag", "saga"])
def test_solver_does_not_change_the_fit(solver, binary):
    X, y = binary
    reference = LaplaceLogisticRegression().fit(X, y)
    est = LaplaceLogisticRegression(solver=solver).fit(X, y)
    np.testing.assert_array_equal(est.coef_, reference.coef_)


def test_liblinear_penalizes_the_intercept_as_liblinear(binary):
    from sklearn.linear_model import LogisticRegression

    X, y = binary
    est = LaplaceLogisticRegression(solver="liblinear", intercept_scaling=2.0, tol=1e-12)
    est.fit(X, y)
    lr = LogisticRegression(solver="liblinear", intercept_scaling=2.0, tol=1e-10).fit(X, y)
    # Both are the mode of the same penalized likelihood (liblinear's own tolerance).
    np.testing.assert_allclose(est.coef_, lr.coef_, atol=1e-4)
    np.testing.assert_allclose(est.intercept_, lr.intercept_, atol=1e-4)
    with pytest.raises(ValueError, match="multiclass"):
        LaplaceLogisticRegression(solver="liblinear").fit(X, np.arange(len(y)) % 3)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"dual": True}, "dual=False"),
        ({"penalty": None, "solver": "liblinear"}, "liblinear"),
    ],
)
def test_keywords_without_a_meaning_here_are_refused(params, match, binary):
    X, y = binary
    with pytest.raises(ValueError, match=match):
        LaplaceLogisticRegression(**params).fit(X, y)


@pytest.fixture(scope="module")
def overlapping():
    X, y = make_classification(300, 5, n_redundant=0, flip_y=0.1, random_state=0)
    return X, y


@pytest.mark.parametrize("params", [{"penalty": None}, {"C": np.inf}])
def test_flat_prior_posterior_is_the_normalized_likelihood(params, overlapping):
    from sklearn.linear_model import LogisticRegression

    X, y = overlapping
    est = LaplaceLogisticRegression(**params).fit(X, y)
    lr = LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(X, y)
    # The vague intercept prior N(0, 10⁶)'s and the flat prior's pull: far below 1e-3.
    np.testing.assert_allclose(est.coef_, lr.coef_, atol=1e-3)
    assert np.isnan(est.log_marginal_likelihood_value_)
    assert np.all(np.isfinite(est.sigma_))


@pytest.mark.parametrize("C", [1e30, 1e300, np.inf])
def test_huge_C_gives_a_valid_posterior(C, overlapping):
    X, y = overlapping
    for Estimator in (LaplaceLogisticRegression, VSLogisticRegression):
        est = Estimator(C=C).fit(X, y)
        np.linalg.cholesky(est.sigma_)


def test_flat_prior_refuses_separable_and_collinear_data(binary):
    X, y = binary
    separable = X[:, :1], (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="separated"):
        LaplaceLogisticRegression(penalty=None).fit(*separable)
    collinear = np.hstack([X, X[:, :1]])
    y_noisy = (X[:, 0] + np.random.default_rng(0).normal(0, 2, len(y)) > 0).astype(int)
    with pytest.raises(ValueError, match="rank"):
        LaplaceLogisticRegression(penalty=None).fit(collinear, y_noisy)


def test_float32_in_float32_out(binary):
    X, y = binary
    est = VSLogisticRegression().fit(X.astype(np.float32), y)
    assert est.coef_.dtype == est.intercept_.dtype == np.float32
    assert est.predict_proba(X[:3].astype(np.float32)).dtype == np.float32
    liblinear = LaplaceLogisticRegression(solver="liblinear").fit(X.astype(np.float32), y)
    assert liblinear.coef_.dtype == np.float64  # as LogisticRegression's liblinear


def test_max_iter_zero_is_the_prior(binary):
    X, y = binary
    with pytest.warns(ConvergenceWarning, match="max_iter=0"):
        est = VSLogisticRegression(max_iter=0).fit(X, y)
    assert np.all(est.coef_ == 0) and est.n_iter_[0] == 0
    np.testing.assert_allclose(est.predict_proba(X), 0.5)


def test_unconverged_newton_stops_at_its_laplace_approximation(binary):
    X, y = binary
    with pytest.warns(ConvergenceWarning, match="lbfgs failed to converge"):
        est = VSLogisticRegression(max_iter=1, tol=1e-15).fit(X, y)
    assert est.strategy_[0] == "laplace" and est.n_iter_[0] == 1


def test_warm_start_starts_newton_at_the_previous_mean(binary):
    X, y = binary
    cold = LaplaceLogisticRegression().fit(X, y)
    warm = LaplaceLogisticRegression(warm_start=True).fit(X, y)
    warm.fit(X, y)
    assert warm.n_iter_[0] < cold.n_iter_[0]
    np.testing.assert_allclose(warm.coef_, cold.coef_, atol=1e-6)
    # Two single Newton steps with warm starts are two steps at once.
    two = LaplaceLogisticRegression(max_iter=2, tol=1e-15)
    one = LaplaceLogisticRegression(max_iter=1, tol=1e-15, warm_start=True)
    with pytest.warns(ConvergenceWarning):
        two.fit(X, y)
        one.fit(X, y).fit(X, y)
    np.testing.assert_allclose(one.coef_, two.coef_, rtol=1e-12)


@pytest.fixture(scope="module")
def shapes_for_huge_C():
    """Tiny problems on each route: binary (primal), more features than rows (dual),
    three classes (the joint multinomial, or one-vs-rest) and sparse rows."""
    X, y = make_classification(40, 3, n_informative=2, n_redundant=0, random_state=1)
    Xm, ym = make_classification(
        45, 3, n_informative=3, n_redundant=0, n_classes=3, n_clusters_per_class=1, random_state=1
    )
    Xw, yw = make_classification(12, 20, random_state=1)
    sparse = sp.csr_matrix(np.where(np.abs(X) > 0.5, X, 0.0))
    return {"binary": (X, y), "multinomial": (Xm, ym), "dual": (Xw, yw), "sparse": (sparse, y)}


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_C_1e300_gives_a_valid_posterior_or_a_clear_error_on_every_route(cls, shapes_for_huge_C):
    # A prior variance of 1e300 makes the precision's prior part 1e-300: where the
    # curvature cannot make it positive definite in float64, the estimator says so with
    # its C, never a NotPositiveDefiniteError from a factorization deep inside.
    for route, (X, y) in shapes_for_huge_C.items():
        est = make(cls, C=1e300)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(X, y)
        except ValueError as error:
            assert "C=1e+300" in str(error), (route, error)
            assert not isinstance(error, NotPositiveDefiniteError), route
            continue
        assert_valid_fit(est, X)
