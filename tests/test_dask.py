"""Dask arrays as data: fits over row chunks on a LocalCluster equal the in-memory fits."""

import contextlib
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import EarlyCluster

da = pytest.importorskip("dask.array", reason="the dask extra is not installed")
distributed = pytest.importorskip("distributed", reason="the dask extra is not installed")

from vsbayes import (  # noqa: E402
    BMCLogisticRegression,
    EPLogisticRegression,
    EPProbitRegression,
    ISLogisticRegression,
    ISProbitRegression,
    LaplaceLogisticRegression,
    LaplaceProbitRegression,
    VBLogisticRegression,
    VSLogisticRegression,
    VSProbitRegression,
)
from vsbayes.models import ChunkedPosterior  # noqa: E402
from vsbayes.models.dask_chunks import DaskChunks, _active_client  # noqa: E402

# Row chunks change only the order of the sums over rows: results agree to round-off, far
# within D-020's 1e-8 (the VS fit's error is ~1e-2 nats; its draws are the same).
RTOL = 1e-8


# Started (its workers importing vsbayes) while the tests before this module run, and
# stopped while the tests after it run: see EarlyCluster.
CLUSTER_CLIENT = EarlyCluster("cluster_client")


@pytest.fixture(scope="module")
def cluster_client():
    # One cluster for the module, not the default client: only the tests that ask for
    # `client` (or `compute_on(CLUSTER)`) compute on it.
    yield CLUSTER_CLIENT.client()
    CLUSTER_CLIENT.close_soon()


@pytest.fixture
def client(cluster_client):
    """The module's cluster, the client that dask and vsbayes compute with during the test;
    the other tests run on dask's local scheduler."""
    with cluster_client.as_current():
        yield cluster_client


# Where a parametrized fit computes. A fit over chunks does the same sums on dask's local
# scheduler as on the cluster (vsbayes.models.dask_chunks: the chunks' objects in this
# process instead of on the workers); what only the cluster tests is the transport (the
# chunks' objects built on the workers, the functions and arguments pickled, large ones
# scattered). Each kind of work sent to the workers keeps one fit on the cluster; the other
# fits of the same work run locally, ~0.05 s instead of ~0.7 s (a round trip per pass).
CLUSTER, LOCAL = "cluster", "local"


@pytest.fixture
def compute_on(request):
    """``compute_on(CLUSTER)``: a context computing on the module's cluster;
    ``compute_on(LOCAL)``: on dask's local scheduler (the cluster not asked for: a
    selection of local tests alone starts none)."""

    def context(where):
        assert where in (CLUSTER, LOCAL)
        if where == LOCAL:
            return contextlib.nullcontext()
        return request.getfixturevalue("cluster_client").as_current()

    return context


def on(where, estimator):
    return pytest.param(estimator, where, id=f"{type(estimator).__name__}-{where}")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 4))
    y = (X @ np.array([1.0, -0.5, 0.25, 0.0]) + rng.logistic(size=3000) > 0).astype(int)
    weights = rng.uniform(0.0, 2.0, size=3000)
    return X, y, weights


def as_dask(X, y, *more, chunk=700):
    rows = [da.from_array(v, chunks=chunk) for v in (y, *more)]
    return (da.from_array(X, chunks=(chunk, -1)), *rows)


def assert_same_posterior(a, b):
    np.testing.assert_allclose(b.coef_, a.coef_, rtol=RTOL)
    np.testing.assert_allclose(b.intercept_, a.intercept_, rtol=RTOL)
    np.testing.assert_allclose(b.sigma_, a.sigma_, rtol=RTOL, atol=RTOL * np.abs(a.sigma_).max())
    np.testing.assert_allclose(b.log_marginal_likelihood_value_, a.log_marginal_likelihood_value_)


@pytest.mark.parametrize(
    ("estimator", "where"),
    [
        # Newton's passes over the chunks, logistic.
        on(CLUSTER, LaplaceLogisticRegression()),
        on(LOCAL, LaplaceProbitRegression(C=0.5, fit_intercept=False)),
        on(LOCAL, VSLogisticRegression(random_state=0)),
        # With dask input the kernel is Laplace's (EP needs the rows in memory). On the
        # cluster: Newton's passes, probit, then the points' log densities (the points
        # scattered to the workers).
        on(
            CLUSTER,
            VSProbitRegression(strategy="global", kernel="laplace", n_samples=300, random_state=1),
        ),
        on(LOCAL, ISProbitRegression(kernel="laplace", n_samples=2000, random_state=2)),
        on(LOCAL, BMCLogisticRegression(kernel="laplace", n_samples=200, random_state=3)),
    ],
)
def test_fit_on_a_cluster_equals_the_in_memory_fit(compute_on, data, estimator, where):
    X, y, weights = data
    local = estimator.__sklearn_clone__().fit(X, y, sample_weight=weights)
    Xd, yd, wd = as_dask(X, y, weights)
    with compute_on(where):
        chunked = estimator.__sklearn_clone__().fit(Xd, yd, sample_weight=wd)
    assert_same_posterior(local, chunked)
    assert chunked.n_features_in_ == X.shape[1]
    if hasattr(chunked, "strategy_"):  # the default: Gaussian enough, the Laplace shortcut
        expected = ["global"] if estimator.strategy == "global" else ["laplace"]
        assert chunked.strategy_.tolist() == local.strategy_.tolist() == expected


# EP's sweeps over chunks are plainly damped (no Anderson mixing): the same fixed point,
# reached to the estimators' tolerance (site changes below 1e-10) by another path. VB's
# updates are the same, in other sums.
EP_RTOL = 1e-7


@pytest.mark.parametrize(
    ("estimator", "where"),
    [
        on(CLUSTER, EPLogisticRegression()),  # EP's sweeps over the chunks
        on(LOCAL, EPProbitRegression(C=0.5)),
        on(CLUSTER, VBLogisticRegression()),  # VB's updates over the chunks
        on(CLUSTER, VSLogisticRegression(strategy="sites")),  # the sites' VS fits
        on(LOCAL, ISProbitRegression(n_samples=2000, random_state=2)),  # EP's kernel
    ],
)
def test_site_updates_over_chunks_reach_the_in_memory_fixed_point(
    compute_on, data, estimator, where
):
    X, y, weights = data
    local = estimator.__sklearn_clone__().fit(X, y, sample_weight=weights)
    with compute_on(where):
        chunked = estimator.__sklearn_clone__().fit(*as_dask(X, y, weights))
    np.testing.assert_allclose(chunked.coef_, local.coef_, rtol=EP_RTOL)
    np.testing.assert_allclose(chunked.sigma_, local.sigma_, rtol=EP_RTOL, atol=1e-12)
    np.testing.assert_allclose(
        chunked.log_marginal_likelihood_value_, local.log_marginal_likelihood_value_, rtol=1e-10
    )


@pytest.mark.parametrize(
    "estimator", [EPLogisticRegression, EPProbitRegression], ids=lambda c: c.__name__
)
def test_chunked_ep_keeps_zero_rows_apart(estimator):
    """All-zero rows without an intercept (a whole chunk of them, too) have a constant
    factor F(0)^s: each chunk's EP runs on its other rows (a chunk of none, on no rows),
    the fixed point of the rows without them; the evidence is theirs times 2^(−Σ s)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3))
    zero = np.zeros(60, dtype=bool)
    zero[::4], zero[40:50] = True, True  # the chunk of rows 40-49 is all zeros
    X[zero] = 0.0
    y = (X[:, 0] + rng.normal(size=60) > 0).astype(int)
    weights = rng.uniform(0.2, 2.5, size=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        chunked = estimator(fit_intercept=False).fit(*as_dask(X, y, weights, chunk=10))
    local = estimator(fit_intercept=False).fit(X[~zero], y[~zero], sample_weight=weights[~zero])
    np.testing.assert_allclose(chunked.coef_, local.coef_, rtol=EP_RTOL)
    np.testing.assert_allclose(chunked.sigma_, local.sigma_, rtol=EP_RTOL, atol=1e-12)
    constant = -np.log(2.0) * weights[zero].sum()
    assert chunked.log_marginal_likelihood_value_ == pytest.approx(
        local.log_marginal_likelihood_value_ + constant, rel=1e-10
    )


def test_auto_over_chunks_takes_ep_where_the_global_fit_costs_more():
    # Skewed (Laplace not enough) and not data-rich: in memory "auto" keeps EP's sites; over
    # chunks it took the global fit whatever its work (hours at 4000 × 300, 1.5 s by EP).
    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 6))
    y = (X @ rng.normal(0.0, 3.0, 6) + rng.logistic(size=120) > 0).astype(int)
    local = VSLogisticRegression(random_state=0).fit(X, y)
    chunked = VSLogisticRegression(random_state=0).fit(*as_dask(X, y, chunk=50))
    assert chunked.strategy_.tolist() == local.strategy_.tolist() == ["sites"]
    assert "EP over the chunks" in chunked.strategy_reason_[0]
    np.testing.assert_allclose(chunked.coef_, local.coef_, rtol=EP_RTOL)
    np.testing.assert_allclose(chunked.sigma_, local.sigma_, rtol=EP_RTOL, atol=1e-12)


def test_prediction_on_a_dask_array_is_lazy_and_equal(client, data):
    X, y, _ = data
    Xd, _ = as_dask(X, y)
    model = VSLogisticRegression(random_state=0).fit(X, y)
    for name in ("predict_proba", "predict_log_proba", "decision_function", "predict"):
        lazy = getattr(model, name)(Xd)
        assert isinstance(lazy, da.Array), name
        expected = getattr(model, name)(X)
        assert lazy.shape == expected.shape and lazy.dtype == expected.dtype, name
        np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-12, err_msg=name)
    # The latent moments too (they computed the whole dask array into memory).
    for lazy, expected in zip(
        model.latent_mean_and_variance(Xd), model.latent_mean_and_variance(X), strict=True
    ):
        assert isinstance(lazy, da.Array) and lazy.shape == expected.shape
        np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("thompson_sample", ()),  # (it computed the whole dask array into memory)
        ("sample_proba", ()),
        ("predict_proba_interval", ()),
        ("loo", ("y",)),
        ("to_inference_data", ()),
    ],
)
def test_reads_needing_rows_in_memory_refuse_dask_input(name, args):
    X, y = tiny_binary(5, n=40)
    model = LaplaceLogisticRegression().fit(X, y)
    Xd, yd = as_dask(X, y, chunk=20)
    with pytest.raises(ValueError, match=f"{name} needs X in memory.*X.compute()"):
        getattr(model, name)(Xd, *(yd for _ in args))


def test_three_classes_one_vs_rest_and_balanced_weights():
    # On dask's local scheduler: one-vs-rest runs the binary fits, whose passes over the
    # chunks test_fit_on_a_cluster_equals_the_in_memory_fit sends to a cluster.
    rng = np.random.default_rng(1)
    X = rng.normal(size=(900, 3))
    y = np.array(["a", "b", "c"])[np.argmax(X @ rng.normal(size=(3, 3)), axis=1)]
    local = LaplaceProbitRegression(class_weight="balanced").fit(X, y)
    Xd, yd = as_dask(X, y, chunk=250)
    chunked = LaplaceProbitRegression(class_weight="balanced").fit(Xd, yd)
    assert_same_posterior(local, chunked)
    assert chunked.classes_.tolist() == ["a", "b", "c"]
    np.testing.assert_allclose(chunked.predict_proba(Xd).compute(), local.predict_proba(X))


# Over dask chunks the multinomial global fit samples from the Laplace kernel (no
# multinomial EP there): the in-memory fit is asked for it too.
@pytest.mark.parametrize(
    ("estimator", "where"),
    [
        on(LOCAL, LaplaceLogisticRegression(C=0.5)),
        # On the cluster: Newton's passes over the multinomial chunks, then the points' log
        # densities.
        on(CLUSTER, VSLogisticRegression(kernel="laplace", random_state=0)),
    ],
)
def test_multinomial_fit_on_a_cluster_equals_the_in_memory_fit(compute_on, estimator, where):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(1200, 2))
    y = np.argmax(X @ rng.normal(size=(2, 3)) + rng.gumbel(size=(1200, 3)), axis=1)
    local = estimator.__sklearn_clone__().fit(X, y)
    with compute_on(where):
        chunked = estimator.__sklearn_clone__().fit(*as_dask(X, y, chunk=500))
    # Along a common shift of the classes the posterior is its prior (variance 1e6/3 for
    # the intercepts), which the round-off of the Hessian's null direction moves (1e-9 of
    # the intercepts' mean, 1e-7 relative of their variance): compare the centred
    # parameters, which predictions use.
    np.testing.assert_allclose(chunked.coef_, local.coef_, rtol=RTOL)
    np.testing.assert_allclose(
        chunked.intercept_ - chunked.intercept_.mean(),
        local.intercept_ - local.intercept_.mean(),
        rtol=RTOL,
    )
    k, d = 3, 2
    centre = np.kron(np.eye(d + 1), np.eye(k) - 1.0 / k)
    order = np.r_[np.arange(k * d).reshape(k, d).T.ravel(), k * d + np.arange(k)]
    centred = [centre @ m.sigma_[np.ix_(order, order)] @ centre for m in (local, chunked)]
    np.testing.assert_allclose(centred[1], centred[0], rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(
        chunked.predict_proba(X), local.predict_proba(X), rtol=1e-7, atol=1e-10
    )


def test_multinomial_ep_over_chunks_is_named_as_not_implemented():
    # On dask's local scheduler: the multinomial passes over the chunks go to a cluster in
    # test_multinomial_fit_on_a_cluster_equals_the_in_memory_fit.
    rng = np.random.default_rng(2)
    X = rng.normal(size=(600, 2))
    y = np.argmax(X @ rng.normal(size=(2, 3)) + rng.gumbel(size=(600, 3)), axis=1)
    Xd, yd = as_dask(X, y, chunk=200)
    with pytest.raises(ValueError, match="multinomial EP"):
        EPLogisticRegression().fit(Xd, yd)
    with pytest.raises(ValueError, match="strategy='sites'"):
        VSLogisticRegression(strategy="sites").fit(Xd, yd)
    # The global fits sample from the Laplace kernel instead of the multinomial EP's.
    local = ISLogisticRegression(kernel="laplace", n_samples=3000, random_state=0).fit(X, y)
    chunked = ISLogisticRegression(n_samples=3000, random_state=0).fit(Xd, yd)
    np.testing.assert_allclose(chunked.coef_, local.coef_, rtol=1e-6)


def test_sparse_chunks_equal_dense(compute_on, data):
    X, y, _ = data
    X = np.where(np.abs(X) > 1.0, X, 0.0)
    Xd, yd = as_dask(X, y)
    # The dense chunks on dask's local scheduler (the same sums as on the cluster: see
    # compute_on), the sparse ones on the cluster.
    dense = LaplaceLogisticRegression().fit(Xd, yd)
    with compute_on(CLUSTER):
        sparse = LaplaceLogisticRegression().fit(Xd.map_blocks(sp.csr_matrix), yd)
    assert_same_posterior(dense, sparse)


def test_dask_dataframes_are_taken_with_their_column_names(data):
    # On dask's local scheduler: the frames become row-chunked arrays, whose passes go to a
    # cluster in test_fit_on_a_cluster_equals_the_in_memory_fit.
    dd = pytest.importorskip("dask.dataframe", reason="dask DataFrames need pandas and pyarrow")
    pd = pytest.importorskip("pandas")
    X, y, weights = data
    frame = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    local = LaplaceLogisticRegression().fit(frame, y, sample_weight=weights)
    parts = dd.from_pandas(frame.assign(y=y, w=weights), npartitions=3)
    chunked = LaplaceLogisticRegression().fit(parts[["a", "b", "c", "d"]], parts["y"], parts["w"])
    assert_same_posterior(local, chunked)
    assert chunked.feature_names_in_.tolist() == ["a", "b", "c", "d"]
    proba = chunked.predict_proba(parts[["a", "b", "c", "d"]])
    np.testing.assert_allclose(proba.compute(), local.predict_proba(frame))
    with pytest.raises(ValueError, match="feature names should match"):
        chunked.predict_proba(parts[["b", "a", "c", "d"]])


def tiny_binary(seed, n=80):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = (X @ np.array([1.0, -0.5, 0.25]) + rng.logistic(size=n) > 0).astype(int)
    return X, y


# Fits where Newton's line search over the chunks, comparing float32 log F terms with the
# exact value, stalled short of the mode (5e-5 to 2e-4 relative off); it compares exact
# values now, as in memory.
@pytest.mark.parametrize(("seed", "C"), [(0, 10.0), (1, 10**0.5), (2, 1.0)])
def test_chunked_newton_reaches_the_in_memory_mode(seed, C):
    X, y = tiny_binary(seed)
    local = LaplaceLogisticRegression(C=C).fit(X, y)
    chunked = LaplaceLogisticRegression(C=C).fit(*as_dask(X, y, chunk=20))
    assert_same_posterior(local, chunked)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("empty", ["masked out", "zero weights"])
def test_a_chunk_without_rows_adds_nothing(n_classes, empty):
    # A boolean mask can leave a chunk with no rows, and zero weights a chunk with none
    # to fit: the likelihood's blocks over no rows were a range() of step 0.
    X, y = tiny_binary(3, n=90)
    if n_classes == 3:
        y = y + (X[:, 1] > 0.5)
    weights = np.ones(90)
    keep = np.arange(90) // 30 != 1
    Xd, yd, wd = as_dask(X, y, weights, chunk=30)
    if empty == "masked out":
        mask = da.from_array(keep, chunks=30)
        Xd, yd, wd = Xd[mask], yd[mask], wd[mask]
    else:
        wd = da.from_array(np.where(keep, 1.0, 0.0), chunks=30)
    estimator = ISLogisticRegression(kernel="laplace", n_samples=200, random_state=0)
    chunked = estimator.__sklearn_clone__().fit(Xd, yd, sample_weight=wd)
    local = estimator.__sklearn_clone__().fit(X[keep], y[keep])
    np.testing.assert_allclose(chunked.coef_, local.coef_, rtol=RTOL)
    if n_classes == 2:
        np.testing.assert_allclose(chunked.sigma_, local.sigma_, rtol=RTOL, atol=1e-14)
    else:  # (the covariance along the classes' common shift: see the multinomial test)
        np.testing.assert_allclose(
            chunked.predict_proba(X), local.predict_proba(X), rtol=1e-7, atol=1e-10
        )


def test_feature_names_mismatch_is_warned_of_once():
    # As scikit-learn does, once: it came from every chunk (and on a cluster, from the
    # workers, where it was lost).
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe", reason="dask DataFrames need pandas and pyarrow")
    X, y = tiny_binary(8, n=60)
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    named = LaplaceLogisticRegression().fit(frame, y)
    unnamed = LaplaceLogisticRegression().fit(X, y)
    Xd, _ = as_dask(X, y, chunk=20)
    parts = dd.from_pandas(frame, npartitions=3)
    for model, given, in_memory, message in [
        (named, Xd, frame, "X does not have valid feature names, but {} was fitted with"),
        (unnamed, parts, X, "X has feature names, but {} was fitted without"),
    ]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            proba = model.predict_proba(given).compute()
        expected = message.format("LaplaceLogisticRegression") + " feature names"
        assert [str(w.message) for w in caught] == [expected]
        np.testing.assert_array_equal(proba, model.predict_proba(in_memory))


@pytest.mark.parametrize(("n_classes", "n_features"), [(2, 200), (3, 60)])
def test_the_chunks_results_are_sized_before_newton(n_classes, n_features):
    # Each pass gathers a p × p result per chunk before their sum: 8 + 2 more matrices
    # than in memory. With them the fit is beyond the limit that the in-memory one is
    # within: refused before Newton's first step (it allocated them all).
    import sklearn

    from vsbayes import config_context
    from vsbayes.exceptions import MemoryLimitError

    rng = np.random.default_rng(9)
    X = rng.normal(size=(40, n_features))
    y = np.argmax(X[:, :n_classes] + rng.gumbel(size=(40, n_classes)), axis=1)
    # (blocks of 256 KiB: the multinomial guard counts one)
    with sklearn.config_context(working_memory=1), config_context(memory_limit=3 * 2**20):
        LaplaceLogisticRegression().fit(X, y)
        with pytest.raises(MemoryLimitError, match=r"over 8 dask chunks.*larger dask chunks"):
            LaplaceLogisticRegression().fit(*as_dask(X, y, chunk=5))


def test_unknown_chunk_sizes_and_the_local_scheduler(data):
    # No client: dask's local scheduler; a boolean mask leaves the row chunks unknown.
    assert _active_client() is None
    X, y, _ = data
    keep = X[:, 3] > -1.0
    Xd, yd = as_dask(X, y)
    mask = da.from_array(keep, chunks=700)
    chunked = LaplaceLogisticRegression().fit(Xd[mask], yd[keep])
    assert_same_posterior(LaplaceLogisticRegression().fit(X[keep], y[keep]), chunked)
    # y masked by the same dask array: its sizes unknown as well.
    chunked = LaplaceLogisticRegression().fit(Xd[mask], yd[mask])
    assert_same_posterior(LaplaceLogisticRegression().fit(X[keep], y[keep]), chunked)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda X, y: (X.map_blocks(lambda b: np.where(b > 3, np.nan, b)), y), "NaN"),
        (lambda X, y: (X, y[:-1]), "rows"),
        (lambda X, y: (X[:, 0], y), "2-dimensional"),
        (lambda X, y: (X, y * 0), "only one class"),
        (lambda X, y: (X.astype(str), y), "real numbers"),
        # (a NaN label was cast to int by type_of_target: a RuntimeWarning first)
        (lambda X, y: (X, da.where(y > 0, np.nan, 0.0)), "y contains NaN"),
        # (as in memory: was "mean, cov and log_Z must be finite", from a Gaussian's check)
        (lambda X, y: (X * 1e200, y), "X has values up to .* whose squares overflow"),
    ],
)
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_invalid_dask_input_raises_a_value_error(data, change, match):
    X, y, _ = data
    with pytest.raises(ValueError, match=match):
        LaplaceLogisticRegression().fit(*change(*as_dask(X, y)))


@pytest.mark.parametrize("name", ["y", "sample_weight"])
def test_in_memory_labels_or_weights_of_another_length_are_named(name):
    # (dask's own "Chunks do not add up to shape" said neither what nor how many)
    X, y = tiny_binary(5, n=40)
    Xd, _ = as_dask(X, y, chunk=20)
    given = {"y": y, "sample_weight": np.ones(40)}
    given[name] = given[name][:30]
    with pytest.raises(ValueError, match=f"X has 40 rows but {name} has 30"):
        LaplaceLogisticRegression().fit(Xd, given["y"], sample_weight=given["sample_weight"])
    given[name] = np.ones((40, 2))
    with pytest.raises(ValueError, match=rf"{name} must be 1-dimensional; got shape \(40, 2\)"):
        LaplaceLogisticRegression().fit(Xd, given["y"], sample_weight=given["sample_weight"])


def test_dask_frames_of_pandas_nullable_numbers_are_numbers():
    # Int64, boolean and Float64 columns are numbers in memory (scikit-learn's validation
    # makes them floats); a dask frame's to_dask_array made them objects, refused as text.
    dd = pytest.importorskip("dask.dataframe", reason="dask DataFrames need pandas and pyarrow")
    pd = pytest.importorskip("pandas")
    X, y = tiny_binary(6, n=40)
    frame = pd.DataFrame(
        {
            "a": X[:, 0],
            "b": pd.array((X[:, 1] > 0).astype(int), dtype="Int64"),
            "c": pd.array(X[:, 2] > 0.5, dtype="boolean"),
            "d": pd.array(X[:, 2], dtype="Float64"),
        }
    )
    local = LaplaceLogisticRegression().fit(frame, y)
    chunked = LaplaceLogisticRegression().fit(dd.from_pandas(frame, npartitions=2), y)
    assert_same_posterior(local, chunked)
    assert chunked.feature_names_in_.tolist() == ["a", "b", "c", "d"]
    missing = frame.astype({"b": "Int64"})
    missing.loc[3, "b"] = pd.NA  # a missing value: named as in memory, not as text
    with pytest.raises(ValueError, match="NaN"):
        LaplaceLogisticRegression().fit(dd.from_pandas(missing, npartitions=2), y)


def test_prediction_over_a_chunk_a_filter_emptied():
    # The in-memory methods refuse a block of no rows ("Found array with 0 sample(s)").
    X, y = tiny_binary(7, n=60)
    model = LaplaceLogisticRegression().fit(X, y)
    keep = np.arange(60) // 20 != 1
    Xd, _ = as_dask(X, y, chunk=20)
    Xd = Xd[da.from_array(keep, chunks=20)]
    for name in ("predict_proba", "decision_function", "predict"):
        lazy, expected = getattr(model, name)(Xd), getattr(model, name)(X[keep])
        np.testing.assert_array_equal(lazy.compute(), expected, err_msg=name)
    _, lazy = model.latent_mean_and_variance(Xd)
    np.testing.assert_array_equal(lazy.compute(), model.latent_mean_and_variance(X[keep])[1])


def test_float32_chunks_keep_their_dtype_as_in_memory():
    X, y = tiny_binary(4)
    X = X.astype(np.float32)
    local = LaplaceLogisticRegression().fit(X, y)
    Xd, yd = as_dask(X, y, chunk=20)
    chunked = LaplaceLogisticRegression().fit(Xd, yd)
    assert chunked.coef_.dtype == chunked.intercept_.dtype == local.coef_.dtype == np.float32
    np.testing.assert_array_equal(chunked.coef_, local.coef_)  # rounded to float32 alike
    assert chunked.predict_proba(Xd).dtype == local.predict_proba(X).dtype == np.float32


def test_ard_prediction_on_a_dask_array_is_lazy_and_equal():
    # The selected columns are taken lazily (the whole array was computed into memory).
    from vsbayes import EmpiricalBayesClassifier

    rng = np.random.default_rng(6)
    X = rng.normal(size=(80, 5))
    y = (X[:, 0] - X[:, 1] + rng.logistic(size=80) > 0).astype(int)
    model = EmpiricalBayesClassifier(LaplaceLogisticRegression(), scales="ard").fit(X, y)
    assert not model.support_.all()
    Xd, _ = as_dask(X, y, chunk=20)
    for name in ("predict_proba", "decision_function", "predict"):
        lazy = getattr(model, name)(Xd)
        assert isinstance(lazy, da.Array), name
        np.testing.assert_array_equal(lazy.compute(), getattr(model, name)(X), err_msg=name)
    with pytest.raises(ValueError, match="expecting 5 features"):
        model.predict(Xd[:, :4])


def test_negative_weights_and_wrong_features_are_named(data):
    X, y, weights = data
    Xd, yd, wd = as_dask(X, y, -weights)
    with pytest.raises(ValueError, match="Negative"):
        LaplaceLogisticRegression().fit(Xd, yd, sample_weight=wd)
    model = LaplaceLogisticRegression().fit(X, y)
    with pytest.raises(ValueError, match="expecting 4 features"):
        model.predict_proba(Xd[:, :3])


def _warning_chunk(X, y):
    warnings.warn(f"chunk of {len(y)} rows", UserWarning, stacklevel=1)
    return len(y)


def test_warnings_raised_on_the_workers_reach_the_caller(client, data):
    X, y, _ = data
    Xd, yd = as_dask(X, y, chunk=1000)
    with pytest.warns(UserWarning, match="chunk of 1000 rows.*dask worker") as caught:
        DaskChunks(_warning_chunk, [Xd, yd])
    assert len(caught) == 1  # three chunks, one distinct warning


def test_chunked_posterior_passes_move_only_small_results(client, data):
    X, y, weights = data
    Xd, yd, wd = as_dask(X, np.where(y == 1, 1.0, -1.0), weights)
    model = ChunkedPosterior(Xd, yd, wd, "logistic", prior_var=1.0, intercept_prior_var=None)
    theta = np.random.default_rng(0).normal(size=(50, 4))
    sent, received = model.chunks.bytes_sent, model.chunks.bytes_received
    model.log_density(theta)
    # The points with each chunk's task (small), and N values per chunk back: no rows.
    assert model.chunks.bytes_sent - sent == model.chunks.n_chunks * theta.nbytes
    assert model.chunks.bytes_received - received == model.chunks.n_chunks * 50 * 8


def test_joblib_dask_backend_gives_the_same_bits(client):
    # In-memory data with n_jobs inside joblib's dask backend: the likelihood's blocks run
    # on the workers (one BLAS thread, as every fit's BLAS calls), the same blocks as in
    # this process, so the same bits.
    joblib = pytest.importorskip("joblib")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 3))  # several likelihood blocks of 256 points
    y = (X[:, 0] + rng.logistic(size=3000) > 0).astype(int)
    estimator = VSLogisticRegression(strategy="global", kernel="laplace", random_state=0)
    local = estimator.__sklearn_clone__().fit(X, y)
    with joblib.parallel_config(backend="dask"), distributed.get_task_stream(client) as tasks:
        remote = estimator.__sklearn_clone__().set_params(n_jobs=2).fit(X, y)
    assert tasks.data  # the blocks did run on the workers
    np.testing.assert_array_equal(remote.coef_, local.coef_)
    np.testing.assert_array_equal(remote.sigma_, local.sigma_)


def test_a_lazy_prediction_keeps_the_predictive_tol_of_its_call():
    # A dask prediction is lazy: its chunks, computed after the call's config_context has
    # exited, read the predictive_tol the call saw (D-276), not the default; and the chunks
    # computed on dask's threads leave the global setting as it was.
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    from vsbayes import LaplaceLogisticRegression, config_context, get_config

    X, y = load_digits(n_class=5, return_X_y=True)
    X, y = StandardScaler().fit_transform(X[:150, ::4]), y[:150]
    model = LaplaceLogisticRegression(C=10).fit(X, y)
    rows = X[:12]
    default = get_config()["predictive_tol"]
    with config_context(predictive_tol=1e-4):
        tight = model.predict_proba(rows)
        lazy = model.predict_proba(da.from_array(rows, chunks=4))
    assert np.abs(tight - model.predict_proba(rows)).max() > 1e-5  # the setting matters
    np.testing.assert_array_equal(lazy.compute(scheduler="threads"), tight)
    assert get_config()["predictive_tol"] == default
