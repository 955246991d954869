"""C by the evidence: EmpiricalBayesClassifier."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_iris
from sklearn.utils.estimator_checks import parametrize_with_checks

import vsbayes
from vsbayes import EmpiricalBayesClassifier
from vsbayes.exceptions import ConvergenceWarning


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((200, 4))
    y = (X @ [1.5, -1.0, 0.5, 0.0] + rng.logistic(size=200) > 0).astype(int)
    return X, y


# Laplace inside and no refinement: every check fits many times (the refinement's own
# evidence is tested below).
@parametrize_with_checks(
    [EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=3, refine=False)]
)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # tiny data: C at the grid edge
        check(estimator)


def test_chosen_c_maximizes_the_estimators_own_evidence(data):
    X, y = data
    model = EmpiricalBayesClassifier(vsbayes.EPLogisticRegression(), Cs=9).fit(X, y)
    best = int(np.argmax(model.log_evidence_))
    assert model.Cs_[best - 1] <= model.C_ <= model.Cs_[best + 1]
    # The chosen C's evidence is the best the refinement saw, and at least the grid's.
    at_c = vsbayes.EPLogisticRegression(C=model.C_).fit(X, y).log_marginal_likelihood_value_
    assert at_c == pytest.approx(model.refined_log_evidence_.max(), abs=1e-9)
    grid_best = vsbayes.EPLogisticRegression(C=model.Cs_[best]).fit(X, y)
    assert at_c >= grid_best.log_marginal_likelihood_value_ - 1e-9
    np.testing.assert_array_equal(model.coef_, model.estimator_.coef_)
    assert np.all(np.diff(model.refined_Cs_) > 0)


def test_without_refinement_the_grid_maximum(data):
    X, y = data
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), refine=False)
    model.fit(X, y)
    assert model.Cs_[np.argmax(model.log_evidence_)] == model.C_
    assert model.refined_Cs_.tolist() == [model.C_]


def test_warns_when_the_evidence_peaks_at_the_grid_edge(data):
    X, y = data
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=[1e-4, 1e-3])
    with pytest.warns(ConvergenceWarning, match="edge of Cs"):
        model.fit(X, y)


def test_multiclass_sums_the_evidence():
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    model = EmpiricalBayesClassifier(vsbayes.LaplaceProbitRegression(), Cs=5).fit(X, y)
    one_vs_rest = vsbayes.LaplaceProbitRegression(C=model.C_).fit(X, y)
    assert model.refined_log_evidence_.max() == pytest.approx(
        one_vs_rest.log_marginal_likelihood_value_.sum()
    )
    assert model.predict_proba(X).shape == (150, 3)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"Cs": 1}, "Cs"),
        ({"Cs": [1.0, -1.0]}, "Cs must be"),
        ({"estimator": "LogisticRegression"}, "estimator must be a vsbayes"),
        ({"refine": "yes"}, "refine"),
    ],
)
def test_parameters_are_checked(data, params, message):
    X, y = data
    with pytest.raises((ValueError, TypeError), match=message):
        EmpiricalBayesClassifier(**params).fit(X, y)
