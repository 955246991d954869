"""The scikit-learn estimators: API conventions and drop-in use."""

import pickle

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from _helpers import ALL, make
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_iris, make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import vsbayes
from vsbayes._warnings import warn
from vsbayes.estimators import _base as estimator_base

# The (estimator, check) pairs that pass only because a binary problem fell back to its
# Laplace approximation (an UnreliableFitWarning), with the reason. Any other fallback in a
# check, and any pair here that no longer falls back, fails the test below.
_EXTREME_WEIGHTS = (
    "class weights 1e3 and 1e-4 (check_class_weight_classifiers): EP's sweeps stall short "
    "of a fixed point and raise"
)
_BMC_EXTREME = (
    "class weights 1e3 and 1e-4: nearly all the mass sits on few of BMC's points (ESS ~10), "
    "so its Gaussian-process estimate is rejected"
)
_MULTINOMIAL_EXTREME = (
    "class weights 1e3 and 1e-4 on 3 classes: the multinomial posterior's sampling kernel is "
    "Laplace's (there is no multinomial EP), and nearly all the mass sits on a few points "
    "(ESS ~6 of 1760), so the fit is rejected"
)
LAPLACE_FALLBACKS: dict[tuple[str, str], str] = {
    ("ISLogisticRegression", "check_class_weight_classifiers"): _MULTINOMIAL_EXTREME,
    ("EPLogisticRegression", "check_class_weight_classifiers"): _EXTREME_WEIGHTS,
    ("EPProbitRegression", "check_class_weight_classifiers"): _EXTREME_WEIGHTS,
    ("BMCLogisticRegression", "check_class_weight_classifiers"): _BMC_EXTREME,
    ("BMCProbitRegression", "check_class_weight_classifiers"): _BMC_EXTREME,
}


# Cheaper settings for scikit-learn's checks, which test the API, not accuracy: BMC's
# Gaussian process on 8n points made its four sample-weight checks a third of the suite.
# 128 points, not 512 (the process's cubic cost: 4 s of the suite): no check's fit is
# rejected for it (a rejection would fail below), so every check still sees BMC's own fit.
CHECK_SETTINGS = {
    vsbayes.BMCLogisticRegression: {"n_samples": 128},
    vsbayes.BMCProbitRegression: {"n_samples": 128},
}


# Settings of one (estimator, check) pair, whose fits they leave bitwise the same. With class
# weights 1e3 and 1e-4, the logistic EPs that BMC and IS take as their kernel fail on each
# of the check's problems (binary or multinomial, their sweeps stall and raise, or creep to
# their 200 sweeps: 9 s of the suite), so the points are drawn from Laplace's kernel either
# way. The same EPs still fail in EPLogisticRegression's and VSLogisticRegression's checks,
# the probit estimators' checks still take the sampling fits' route through a failed EP (in
# closed form, 0.5 s), and test_strategy.py tests the kernel of an unconverged EP.
_LAPLACE_KERNEL = {"kernel": "laplace"}
# The sample-weight checks' data have 30 features: BMC refuses fewer points than the
# n = 528 parameters of the Gaussian over the 31 coefficients (D-155), so they take n.
_BMC_N = {"n_samples": 528}
PAIR_SETTINGS = {
    ("BMCLogisticRegression", "check_class_weight_classifiers"): _LAPLACE_KERNEL,
    ("ISLogisticRegression", "check_class_weight_classifiers"): _LAPLACE_KERNEL,
    **{
        (name, f"check_sample_weight_equivalence_on_{form}_data"): _BMC_N
        for name in ("BMCLogisticRegression", "BMCProbitRegression")
        for form in ("dense", "sparse")
    },
}


@parametrize_with_checks([make(cls, **CHECK_SETTINGS.get(cls, {})) for cls in ALL])
def test_sklearn_compatible(estimator, check, monkeypatch):
    pair = (type(estimator).__name__, getattr(check, "func", check).__name__)
    if pair in PAIR_SETTINGS:  # a copy: the checks share the estimator
        estimator = clone(estimator).set_params(**PAIR_SETTINGS[pair])
    fallbacks = []

    def recording_warn(message, category):
        if "Falling back to the Laplace approximation" in message:
            fallbacks.append(message)
        warn(message, category)

    monkeypatch.setattr(estimator_base, "warn", recording_warn)
    check(estimator)
    assert bool(fallbacks) == (pair in LAPLACE_FALLBACKS), (pair, fallbacks[:1])


@pytest.fixture(scope="module")
def binary_data():
    X, y = make_classification(
        n_samples=200, n_features=4, n_informative=3, n_redundant=0, random_state=3
    )
    return X, y


def pipeline_scores(estimator, X, y):
    """The best log loss of a grid search over C and the mean accuracy of 3-fold CV, both
    of ``estimator`` behind a StandardScaler in a pipeline."""
    pipe = make_pipeline(StandardScaler(), estimator)
    step = type(estimator).__name__.lower()
    search = GridSearchCV(pipe, {f"{step}__C": [0.1, 1.0]}, scoring="neg_log_loss", cv=3)
    search.fit(X, y)
    return search.best_score_, cross_val_score(pipe, X, y, cv=3).mean()


@pytest.fixture(scope="module")
def logistic_regression_scores(binary_data):
    """LogisticRegression's pipeline scores, once for every estimator's comparison."""
    return pipeline_scores(LogisticRegression(), *binary_data)


@pytest.mark.parametrize("cls", ALL)
def test_pipeline_grid_search_and_cross_validation(cls, binary_data, logistic_regression_scores):
    """A drop-in for LogisticRegression: same scores, within the noise of 3-fold CV."""
    log_loss, accuracy = pipeline_scores(make(cls), *binary_data)
    lr_log_loss, lr_accuracy = logistic_regression_scores
    assert log_loss == pytest.approx(lr_log_loss, abs=0.02)
    assert accuracy == pytest.approx(lr_accuracy, abs=0.02)


@pytest.mark.parametrize("cls", ALL)
def test_clone_and_pickle_round_trip(cls, binary_data):
    X, y = binary_data
    fitted = make(cls).fit(X, y)
    restored = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(restored.predict_proba(X), fitted.predict_proba(X))
    again = clone(fitted).fit(X, y)
    np.testing.assert_array_equal(again.coef_, fitted.coef_)
    assert not hasattr(clone(fitted), "coef_")


@pytest.mark.parametrize("cls", ALL)
def test_string_labels_and_three_classes(cls):
    X, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    est = make(cls).fit(StandardScaler().fit_transform(X), names)
    Xs = StandardScaler().fit_transform(X)
    assert list(est.classes_) == list(names[[0, 50, 100]])
    assert est.coef_.shape == (3, 4) and est.intercept_.shape == (3,)
    if cls._multinomial:  # one joint posterior of [coef_.ravel(), intercept_]
        assert est.sigma_.shape == (15, 15) and np.ndim(est.log_marginal_likelihood_value_) == 0
        assert est.n_iter_.shape == (1,)
    else:  # one-vs-rest
        assert est.sigma_.shape == (3, 5, 5)
        assert est.log_marginal_likelihood_value_.shape == (3,)
        assert est.n_iter_.shape == (3,)
    proba = est.predict_proba(Xs)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    assert np.mean(est.predict(Xs) == names) > 0.85
    assert est.decision_function(Xs).shape == (150, 3)


@pytest.mark.parametrize("cls", ALL)
def test_sparse_input_equals_dense(cls, binary_data):
    X, y = binary_data
    X = np.where(np.abs(X) < 0.5, 0.0, X)
    dense = make(cls).fit(X, y)
    sparse = make(cls).fit(sp.csr_matrix(X), y)
    np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=1e-8)
    np.testing.assert_allclose(
        sparse.predict_proba(sp.csr_matrix(X)), dense.predict_proba(X), rtol=1e-8
    )


def test_pandas_feature_names_and_float32(binary_data):
    X, y = binary_data
    frame = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    est = vsbayes.VSLogisticRegression(random_state=0).fit(frame, y)
    assert list(est.feature_names_in_) == ["a", "b", "c", "d"]
    single = vsbayes.VSLogisticRegression(random_state=0).fit(X.astype(np.float32), y)
    np.testing.assert_allclose(single.coef_, est.coef_, rtol=1e-5)


@pytest.mark.parametrize("cls", ALL)
def test_integer_weights_equal_duplicated_rows(cls, binary_data):
    X, y = binary_data
    weights = np.where(np.arange(len(y)) % 3 == 0, 2.0, 1.0)
    rows = np.repeat(np.arange(len(y)), weights.astype(int))
    weighted = make(cls).fit(X, y, sample_weight=weights)
    duplicated = make(cls).fit(X[rows], y[rows])
    # The log-posterior is the same function, and the sampling uses the same draws, so
    # the results agree to round-off (far inside the Monte Carlo error).
    np.testing.assert_allclose(weighted.coef_, duplicated.coef_, rtol=1e-7)
    np.testing.assert_allclose(weighted.sigma_, duplicated.sigma_, rtol=1e-7)
    assert weighted.log_marginal_likelihood_value_ == pytest.approx(
        duplicated.log_marginal_likelihood_value_, rel=1e-9
    )


def test_laplace_mode_is_sklearn_and_vs_moves_away_from_it():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    laplace = vsbayes.LaplaceLogisticRegression().fit(X, y)
    vs = vsbayes.VSLogisticRegression(random_state=0).fit(X, y)
    # The posterior mean differs from the mode by a fraction of a posterior sd.
    sd = np.sqrt(np.diag(laplace.sigma_))[:-1]
    shift = np.abs(vs.coef_ - laplace.coef_).ravel() / sd
    assert 0 < shift.max() < 1.0
    assert np.mean(vs.predict(X) == laplace.predict(X)) > 0.98


@pytest.mark.parametrize("cls", ALL)
def test_latent_moments_sampling_and_decision(cls, binary_data):
    X, y = binary_data
    est = make(cls).fit(X, y)
    mean, var = est.latent_mean_and_variance(X[:5])
    design = np.column_stack([X[:5], np.ones(5)])
    np.testing.assert_allclose(mean, design @ np.append(est.coef_, est.intercept_), rtol=1e-12)
    np.testing.assert_allclose(var, np.einsum("ij,jk,ik->i", design, est.sigma_, design))
    coef, intercept = est.sample_coef(20_000, random_state=1)
    assert coef.shape == (20_000, 1, 4) and intercept.shape == (20_000, 1)
    draws = np.column_stack([coef[:, 0], intercept[:, 0]])
    sd = np.sqrt(np.diag(est.sigma_))
    # Sample mean within 5 standard errors of the posterior mean.
    assert np.all(np.abs(draws.mean(axis=0) - est.posteriors_[0].mean) < 5 * sd / np.sqrt(20_000))
    logit = est.decision_function(X)
    proba = est.predict_proba(X)[:, 1]
    np.testing.assert_allclose(logit, np.log(proba) - np.log1p(-proba), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(est.predict(X), est.classes_[(proba > 0.5).astype(int)])


def test_no_intercept():
    X, y = load_iris(return_X_y=True)
    mask = y < 2
    est = vsbayes.VSProbitRegression(fit_intercept=False, random_state=0).fit(X[mask], y[mask])
    assert est.sigma_.shape == (4, 4)
    np.testing.assert_array_equal(est.intercept_, [0.0])


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"C": -1.0}, "C"),
        ({"n_samples": 0}, "n_samples"),
        ({"family": "full"}, "family"),
        ({"rule": "sobol"}, "rule"),
        ({"rounds": 0}, "rounds"),
        ({"kernel_scale": 0.0}, "kernel_scale"),
        ({"fit_intercept": "yes"}, "fit_intercept"),
        ({"n_jobs": 0}, "n_jobs must be"),
        ({"class_weight": {0: -1.0, 1: 1.0}}, "class_weight must"),
        ({"class_weight": {0: np.nan, 1: 1.0}}, "class_weight must"),
    ],
)
def test_invalid_parameters_are_named(params, match, binary_data):
    X, y = binary_data
    with pytest.raises(ValueError, match=match):
        vsbayes.VSLogisticRegression(**params).fit(X, y)


def test_n_jobs_gives_bitwise_identical_fits(binary_data):
    X, y = binary_data
    one = vsbayes.VSLogisticRegression(random_state=0).fit(X, y)
    two = vsbayes.VSLogisticRegression(random_state=0, n_jobs=2).fit(X, y)
    np.testing.assert_array_equal(two.coef_, one.coef_)
    np.testing.assert_array_equal(two.sigma_, one.sigma_)
