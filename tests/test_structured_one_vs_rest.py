"""One-vs-rest fits beyond two classes take the binary fit's covariance structures (D-200):
each problem is the binary structured fit of its class against the rest, exact where the
structure is exact, and every read works from the structures."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.multiclass import OneVsRestClassifier

import vsbayes
import vsbayes._memory as _memory
from vsbayes._blas import single_blas_thread
from vsbayes.approximations.structured_laplace import kept_bytes, structure_bytes
from vsbayes.estimators._base import INTERCEPT_PRIOR_VAR
from vsbayes.exceptions import MemoryLimitError
from vsbayes.gaussian import StructuredCovariance, StructuredCovariances

# The structured fits of the non-Laplace methods say they stopped at Laplace; forced
# estimated evidences warn (D-178): the tests here are about the structures.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

M, P, K = 40, 120, 3  # more features than rows: the dual form's regime


@pytest.fixture(autouse=True)
def one_thread():
    with single_blas_thread():  # small matrices: BLAS's idle threads would spin
        yield


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = sp.random(M, P, density=0.1, format="csr", random_state=1)
    X.data = rng.exponential(1.0, X.nnz)
    truth = np.zeros((P, K))
    truth[:12] = rng.normal(0.0, 3.0, (12, K))
    y = np.argmax(X @ truth + rng.gumbel(size=(M, K)), axis=1)
    return X, y


def fitted(cls, X, y, structure, **params):
    with vsbayes.config_context(covariance=structure):
        return cls(tol=1e-12, **params).fit(X, y)


def test_the_dual_form_is_the_dense_one_vs_rest_fit(data):
    """ "dual" is exact: every problem's posterior is the dense one's to round-off."""
    X, y = data
    dense = fitted(vsbayes.LaplaceProbitRegression, X, y, "dense")
    dual = fitted(vsbayes.LaplaceProbitRegression, X, y, "dual")
    assert isinstance(dual.sigma_, StructuredCovariances)
    assert dual.sigma_.shape == dense.sigma_.shape == (K, P + 1, P + 1)
    assert list(dual.covariance_structure_) == ["dual"] * K
    assert len(dual.covariance_reason_) == K
    assert not dual._is_multinomial()
    # The same Newton iterates in two factorizations: round-off of the O(1) entries.
    np.testing.assert_allclose(dual.coef_, dense.coef_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(dual.sigma_), dense.sigma_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(dual.sigma_.diagonal(), np.diagonal(dense.sigma_, 0, 1, 2), 1e-10)
    np.testing.assert_allclose(np.asarray(dual.sigma_[1:]), dense.sigma_[1:], rtol=0, atol=1e-10)
    np.testing.assert_allclose(
        dual.log_marginal_likelihood_value_, dense.log_marginal_likelihood_value_, 1e-10
    )
    for read in ("predict_proba", "decision_function", "latent_mean_and_variance"):
        np.testing.assert_allclose(
            getattr(dual, read)(X), getattr(dense, read)(X), rtol=1e-9, atol=1e-12
        )
    np.testing.assert_array_equal(dual.predict(X), dense.predict(X))
    for lower, upper in zip(
        dual.predict_proba_interval(X[:5], random_state=0),
        dense.predict_proba_interval(X[:5], random_state=0),
        strict=True,
    ):
        np.testing.assert_allclose(lower, upper, atol=1e-9)
    np.testing.assert_allclose(
        dual.summary()["sd"].to_numpy(), dense.summary()["sd"].to_numpy(), rtol=1e-9
    )


@pytest.mark.parametrize("structure", ["lowrank", "diagonal"])
def test_approximate_structures_keep_the_exact_marginals(data, structure):
    """On few rows "lowrank" and "diagonal" hold the exact marginal variances (one M × M
    factorization per problem), as the binary fits do."""
    X, y = data
    dense = fitted(vsbayes.LaplaceProbitRegression, X, y, "dense")
    structured = fitted(vsbayes.LaplaceProbitRegression, X, y, structure)
    assert list(structured.covariance_structure_) == [structure] * K
    np.testing.assert_allclose(structured.coef_, dense.coef_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(
        structured.sigma_.diagonal(), np.diagonal(dense.sigma_, 0, 1, 2), rtol=1e-8
    )
    np.testing.assert_allclose(
        structured.log_marginal_likelihood_value_, dense.log_marginal_likelihood_value_, 1e-10
    )


def test_each_problem_is_the_binary_fit_of_its_class(data):
    """One home: problem k is the binary structured fit of class k against the rest, as
    OneVsRestClassifier fits it, to the bit."""
    X, y = data
    ovr = fitted(vsbayes.VBLogisticRegression, X, y, "lowrank")
    with vsbayes.config_context(covariance="lowrank"):
        wrapped = OneVsRestClassifier(vsbayes.VBLogisticRegression(tol=1e-12)).fit(X, y)
    for k, binary in enumerate(wrapped.estimators_):
        assert binary.covariance_structure_ == ovr.covariance_structure_[k] == "lowrank"
        np.testing.assert_array_equal(ovr.coef_[k], binary.coef_[0])
        np.testing.assert_array_equal(ovr.intercept_[k], binary.intercept_[0])
        assert isinstance(ovr.sigma_[k], StructuredCovariance)
        np.testing.assert_array_equal(ovr.sigma_[k].diagonal(), binary.sigma_.diagonal())
        assert ovr.log_marginal_likelihood_value_[k] == binary.log_marginal_likelihood_value_


def test_draws_come_from_the_structures(data):
    X, y = data
    model = fitted(vsbayes.LaplaceProbitRegression, X, y, "dual")
    coef, intercept = model.sample_coef(4000, random_state=0)
    assert coef.shape == (4000, K, P) and intercept.shape == (4000, K)
    # 4000 draws: a variance's relative standard error is √(2/4000) ≈ 0.022; 5 of them.
    drawn = np.concatenate([coef.var(axis=0), intercept.var(axis=0)[:, None]], axis=1)
    np.testing.assert_allclose(drawn, model.sigma_.diagonal(), rtol=5 * np.sqrt(2 / 4000))
    proba = model.sample_proba(X[:3], 10, random_state=0)
    assert proba.shape == (10, 3, K)
    np.testing.assert_allclose(proba.sum(axis=2), 1.0, rtol=1e-12)
    assert set(np.unique(model.sample_y(X[:3], 10, random_state=0))) <= set(model.classes_)


def test_a_dense_sigma_beyond_the_limit_is_refused(data, monkeypatch):
    X, y = data
    model = fitted(vsbayes.LaplaceProbitRegression, X, y, "dual")
    monkeypatch.setattr(_memory, "memory_limit", lambda: model.sigma_.dense_bytes() / 2)
    with pytest.raises(MemoryLimitError, match=r"sigma_\.diagonal\(\)"):
        np.asarray(model.sigma_)
    model.predict_proba(X)  # reads the structures only


def test_the_problems_are_sized_together_before_any_work(data, monkeypatch):
    """Each problem's fit is sized beside the other problems' posteriors: under a limit the
    binary fit's "dual" fits but K of them do not, a forced "dual" is refused before any
    work, and "auto" takes a structure that fits."""
    X, y = data
    p, held = P + 1, float(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)
    binary = structure_bytes("dual", p, M, 0, held)
    limit = binary + 0.5 * (K - 1) * kept_bytes("dual", p, M, 0)
    monkeypatch.setattr(_memory, "memory_limit", lambda: limit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with vsbayes.config_context(covariance="dual"):
            assert vsbayes.LaplaceProbitRegression().fit(X, y == 0).covariance_structure_ == "dual"
            with pytest.raises(MemoryLimitError, match=f"each of {K} one-vs-rest problems"):
                vsbayes.LaplaceProbitRegression().fit(X, y)
        chosen = vsbayes.LaplaceProbitRegression().fit(X, y).covariance_structure_
    assert set(chosen) <= {"lowrank", "diagonal"}


def test_a_one_vs_rest_stream_carries_the_structures(data):
    """partial_fit streams one-vs-rest problems as binary ones: each class's posterior is
    OneVsRestClassifier's binary stream's."""
    X, y = data
    with vsbayes.config_context(covariance="dual"):
        stream = vsbayes.LaplaceProbitRegression()
        wrapped = OneVsRestClassifier(vsbayes.LaplaceProbitRegression())
        for rows in (slice(0, 15), slice(15, 16), slice(16, M)):
            stream.partial_fit(X[rows], y[rows], classes=np.arange(K))
            wrapped.partial_fit(X[rows], y[rows], classes=np.arange(K))
    assert isinstance(stream.sigma_, StructuredCovariances)
    for k, binary in enumerate(wrapped.estimators_):
        np.testing.assert_allclose(stream.coef_[k], binary.coef_[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(
            stream.sigma_[k].diagonal(), binary.sigma_.diagonal(), rtol=1e-12
        )


def test_a_callback_sees_the_later_problems_at_their_diagonal_prior(data):
    """A callback's view of a structured one-vs-rest fit: the problems not reached yet at
    their prior, as a "diagonal" structure beside the structured fits (a dense p × p prior
    beside them made the view densify every structure)."""
    pytest.importorskip("sklearn.callback")  # scikit-learn >= 1.9
    X, y = data
    ends = []

    class Recorder:
        def setup(self, estimator, context):
            pass

        def on_fit_task_begin(self, estimator, context, *, fitted_estimator=None):
            pass

        def on_fit_task_end(self, estimator, context, *, X=None, fitted_estimator=None):
            if context.task_name.startswith("one-vs-rest problem"):
                ends.append(fitted_estimator)

        def teardown(self, estimator, context):
            pass

    with vsbayes.config_context(covariance="dual"):
        model = vsbayes.LaplaceProbitRegression().set_callbacks(Recorder()).fit(X, y)
    assert len(ends) == K
    first = ends[0]
    assert isinstance(first.sigma_, StructuredCovariances)
    np.testing.assert_array_equal(first.coef_[0], model.coef_[0])
    np.testing.assert_array_equal(first.coef_[1:], 0.0)  # the prior's mean
    later = first.sigma_.diagonal()[1:]
    np.testing.assert_array_equal(later[:, :P], 1.0)  # C = 1
    np.testing.assert_array_equal(later[:, P], INTERCEPT_PRIOR_VAR)
    np.testing.assert_array_equal(ends[-1].coef_, model.coef_)


def test_sigma_is_indexed_by_class_and_refuses_a_dense_index_clearly(data):
    """sigma_[k] (an int, a NumPy integer, a slice, a list of classes) reads the structures;
    a dense stack's element index says what to read instead, not Python's tuple error."""
    X, y = data
    model = fitted(vsbayes.LaplaceProbitRegression, X, y, "dual")
    assert model.sigma_[np.int64(2)] is model.sigma_[-1] is model.sigma_.covariances[2]
    chosen = model.sigma_[[2, 0]]
    assert isinstance(chosen, StructuredCovariances) and chosen.shape == (2, P + 1, P + 1)
    np.testing.assert_array_equal(chosen.diagonal(), model.sigma_.diagonal()[[2, 0]])
    masked = model.sigma_[np.array([True, False, True])]
    assert masked.covariances == model.sigma_[[0, 2]].covariances
    with pytest.raises(IndexError, match="one entry per class"):
        model.sigma_[np.array([True, False])]
    for index in [(0, 1, 1), (slice(None), 1, 1), "0", 1.0]:
        with pytest.raises(TypeError, match=r"sigma_\[k\]\.toarray\(\)\[i, j\]"):
            model.sigma_[index]
