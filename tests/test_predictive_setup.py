"""What a fitted estimator's reads compute from its covariance whatever the rows (binary and
one-vs-rest factors, the multinomial blocks), kept from one read to the next (D-259):
computed once, the same bits as computed afresh, made again by every fit, shared by
threads, neither pickled nor copied."""

from __future__ import annotations

import copy
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_classification

import vsbayes
from vsbayes.models import fitted_predictive as fitted_module
from vsbayes.models import latent as latent_module
from vsbayes.models.fitted_predictive import fitted_predictive

X2, Y2 = make_classification(n_samples=80, n_features=6, random_state=0)
X3, Y3 = make_classification(
    n_samples=90, n_features=5, n_informative=4, n_redundant=0, n_classes=3, random_state=0
)


@pytest.fixture
def factorizations(monkeypatch):
    """Counts the binary and one-vs-rest factorizations and the multinomial blocks made."""
    counts = {"factor": 0, "forms": 0}
    factor, forms = latent_module._intercept_first_factor, fitted_module.JointForms

    def counted_factor(*args):
        counts["factor"] += 1
        return factor(*args)

    def counted_forms(*args):
        counts["forms"] += 1
        return forms(*args)

    monkeypatch.setattr(latent_module, "_intercept_first_factor", counted_factor)
    monkeypatch.setattr(fitted_module, "JointForms", counted_forms)
    return counts


def _reads(est, X):
    """Every read of the rows' latent moments."""
    return [
        est.predict_proba(X),
        est.predict_log_proba(X),
        est.decision_function(X),
        est.predict(X),
        *est.latent_mean_and_variance(X),
        *est.predict_proba_interval(X, n_draws=64, random_state=0),
    ]


def _afresh(est, X):
    """predict_proba computed with nothing kept."""
    predictive = est._predictive()
    predictive.setup = None
    return predictive.log_proba(est._validate_prediction_data(X), np.exp)


@pytest.mark.parametrize(
    ("est", "X", "y", "kind", "per_fit"),
    [
        (vsbayes.LaplaceLogisticRegression(), X2, Y2, "factor", 1),
        (vsbayes.LaplaceProbitRegression(), X3, Y3, "factor", 3),  # one-vs-rest
        (vsbayes.LaplaceLogisticRegression(), X3, Y3, "forms", 1),  # multinomial
    ],
    ids=["binary", "one-vs-rest", "multinomial"],
)
def test_reads_compute_the_setup_once_per_fit(factorizations, est, X, y, kind, per_fit):
    est.fit(X, y)
    before = factorizations[kind]
    first = _reads(est, X[:7])
    assert factorizations[kind] - before == per_fit
    again = _reads(est, X[7:30])
    assert factorizations[kind] - before == per_fit
    # The same bits as computed afresh.
    np.testing.assert_array_equal(first[0], _afresh(est, X[:7]))
    np.testing.assert_array_equal(again[0], _afresh(est, X[7:30]))
    # A refit under another C (set_params) computes its own, and reads it.
    est.set_params(C=0.1).fit(X, y)
    proba = est.predict_proba(X[:7])
    assert factorizations[kind] - before == 4 * per_fit  # (2 afresh)
    assert not np.array_equal(proba, first[0])
    np.testing.assert_array_equal(proba, _afresh(est, X[:7]))


def test_partial_fit_and_warm_start_read_their_own_posterior(factorizations):
    est = vsbayes.LaplaceLogisticRegression()
    est.partial_fit(X2[:40], Y2[:40], classes=[0, 1])
    first = est.predict_proba(X2)
    est.partial_fit(X2[40:], Y2[40:])
    assert factorizations["factor"] == 1
    second = est.predict_proba(X2)
    assert factorizations["factor"] == 2
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(second, _afresh(est, X2))
    warm = vsbayes.LaplaceLogisticRegression(warm_start=True).fit(X2[:40], Y2[:40])
    warm.predict_proba(X2)
    warm.fit(X2, Y2)
    proba = warm.predict_proba(X2)
    assert factorizations["factor"] == 5  # (1 afresh)
    np.testing.assert_array_equal(proba, _afresh(warm, X2))


def test_sigma_cannot_change_under_its_kept_factor(factorizations):
    est = vsbayes.LaplaceLogisticRegression().fit(X2, Y2)
    est.predict_proba(X2)
    with pytest.raises(ValueError, match="read-only"):
        est.sigma_[0, 0] = 1.0
    # Replaced, it is factored again.
    est.sigma_ = 4.0 * est.sigma_
    np.testing.assert_array_equal(est.predict_proba(X2), _afresh(est, X2))
    assert factorizations["factor"] == 3  # (1 afresh)


def test_the_setup_is_neither_pickled_nor_copied():
    est = vsbayes.LaplaceLogisticRegression().fit(X3, Y3)
    proba = est.predict_proba(X3)
    assert est._predictive_setup_._entries
    for twin in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        assert not twin._predictive_setup_._entries
        np.testing.assert_array_equal(twin.predict_proba(X3), proba)
    assert not hasattr(clone(est), "_predictive_setup_")


def test_reads_in_threads_compute_the_setup_once(factorizations, monkeypatch):
    # Reads started together on a fresh fit: one computes, the others wait and share it
    # (the factor slowed so that they all arrive while it runs).
    est = vsbayes.LaplaceLogisticRegression().fit(X2, Y2)
    factor = latent_module._intercept_first_factor

    def slow(*args):
        time.sleep(0.05)
        return factor(*args)

    monkeypatch.setattr(latent_module, "_intercept_first_factor", slow)
    start = threading.Barrier(4)

    def read(rows):
        start.wait()
        return est.predict_proba(X2[rows])

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(read, [slice(i, i + 20) for i in range(0, 80, 20)]))
    assert factorizations["factor"] == 1
    np.testing.assert_array_equal(np.vstack(results), _afresh(est, X2))


def test_without_a_setup_each_read_computes_its_own(factorizations):
    # A predictive made without a setup (an estimator fitted before it was kept).
    est = vsbayes.LaplaceLogisticRegression().fit(X2, Y2)
    predictive = fitted_predictive(est.coef_, est.intercept_, est.sigma_, "logistic")
    first = predictive.log_proba(X2)
    np.testing.assert_array_equal(predictive.log_proba(X2), first)
    assert factorizations["factor"] == 2
