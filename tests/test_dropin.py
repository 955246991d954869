"""LogisticRegression's conventions beyond the scikit-learn estimator checks."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_iris, make_classification
from sklearn.preprocessing import StandardScaler

from vsbayes import LaplaceLogisticRegression, VSLogisticRegression


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
