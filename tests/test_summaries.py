"""The posterior as people use it: summary(), prediction intervals, posterior predictive
draws, leave-one-out (EP's cavities and PSIS), WAIC and the ArviZ export."""

import contextlib
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import expit, logsumexp
from scipy.stats import norm
from sklearn.base import clone
from sklearn.datasets import make_classification

from vsbayes import config_context
from vsbayes.estimators import (
    INTERCEPT_PRIOR_VAR,
    EPLogisticRegression,
    EPProbitRegression,
    LaplaceLogisticRegression,
    LaplaceProbitRegression,
)
from vsbayes.exceptions import MemoryLimitError, PSISWarning
from vsbayes.models.psis import pareto_smoothed_log_weights


def binary_data(n=150, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = (X @ [1.0, -0.5] + rng.logistic(size=n) > 0).astype(int)
    return X, y


def three_class_data(n=150, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.standard_normal((n, 2)) + np.eye(3)[y][:, :2]
    return X, y


@pytest.fixture(scope="module")
def binary():
    X, y = binary_data()
    return X, y, EPLogisticRegression().fit(X, y)


@pytest.fixture(scope="module")
def multinomial():
    X, y = three_class_data()
    return X, y, EPLogisticRegression().fit(X, y)


def brute_force(estimator_class, X, y, rows):
    out = []
    for i in rows:
        keep = np.arange(len(y)) != i
        refit = estimator_class().fit(X[keep], y[keep])
        out.append(refit.predict_log_proba(X[i : i + 1])[0, y[i]])
    return np.array(out)


# --- summary ------------------------------------------------------------------------------


def test_summary_binary_rows_are_the_gaussian_marginals(binary):
    _, _, model = binary
    table = model.summary(level=0.9)
    assert list(table.index) == ["x0", "x1", "(intercept)"]
    assert list(table.columns) == ["mean", "sd", "5%", "95%", "P(sign)"]
    mean = np.r_[model.coef_[0], model.intercept_]
    sd = np.sqrt(np.diag(model.sigma_))
    np.testing.assert_allclose(table["mean"], mean, rtol=1e-14)
    np.testing.assert_allclose(table["sd"], sd, rtol=1e-14)
    z = norm.ppf(0.95)
    np.testing.assert_allclose(table["95%"], mean + z * sd, rtol=1e-12)
    np.testing.assert_allclose(table["P(sign)"], norm.cdf(np.abs(mean) / sd), rtol=1e-12)
    attrs = table.attrs
    assert attrs["level"] == 0.9 and attrs["method"] == "expectation propagation"
    assert attrs["log_evidence"] == model.log_marginal_likelihood_value_


def test_summary_names_features_of_a_dataframe():
    pd = pytest.importorskip("pandas")
    X, y = binary_data()
    frame = pd.DataFrame(X, columns=["age", "dose"])
    table = LaplaceLogisticRegression().fit(frame, y).summary()
    assert list(table.index) == ["age", "dose", "(intercept)"]


def test_summary_without_pandas_is_a_structured_array(binary, monkeypatch):
    _, _, model = binary
    with_pandas = model.summary()
    monkeypatch.setitem(sys.modules, "pandas", None)
    table = model.summary()
    assert table.dtype.names == ("coefficient", "mean", "sd", "2.5%", "97.5%", "P(sign)")
    assert list(table["coefficient"]) == ["x0", "x1", "(intercept)"]
    np.testing.assert_array_equal(table["sd"], with_pandas["sd"])
    assert table.attrs["method"] == "expectation propagation"


def test_summary_multinomial_shows_the_centred_coefficients(multinomial):
    _, _, model = multinomial
    table = model.summary()
    assert table.index.names == ["class", "coefficient"]
    means = table["mean"].to_numpy().reshape(3, 3)  # class × (x0, x1, intercept)
    np.testing.assert_allclose(means.sum(axis=0), 0.0, atol=1e-12)
    # The centred coefficients' sd against draws of the joint posterior, centred.
    coef, intercept = model.sample_coef(40_000, random_state=0)
    draws = np.concatenate([coef, intercept[:, :, None]], axis=2)
    draws -= draws.mean(axis=1, keepdims=True)
    sd = draws.std(axis=0).ravel()
    # The sample sd's relative error is 1/√(2N) = 0.0035; 4 of them.
    np.testing.assert_allclose(table["sd"], sd, rtol=0.015)
    # Identified: far below the prior sd of the common shift (√(10⁶/3) for the intercept).
    assert table["sd"].max() < 5


def test_summary_one_vs_rest_rows_per_class():
    X, y = three_class_data()
    model = LaplaceProbitRegression().fit(X, y)
    table = model.summary()
    for k in range(3):
        np.testing.assert_allclose(
            table.loc[k]["sd"], np.sqrt(np.diag(model.sigma_[k])), rtol=1e-14
        )


def test_summary_of_a_dask_fit():
    da = pytest.importorskip("dask.array")
    X, y = binary_data()
    model = LaplaceLogisticRegression().fit(da.from_array(X, chunks=50), da.from_array(y))
    table = model.summary()
    np.testing.assert_allclose(table["sd"], np.sqrt(np.diag(model.sigma_)), rtol=1e-14)
    with pytest.raises(ValueError, match=r"X\.compute"):
        model.predict_proba_interval(da.from_array(X, chunks=50))


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, True, "0.9", np.nan])
def test_bad_level_is_named(binary, level):
    X, _, model = binary
    with pytest.raises(ValueError, match="level"):
        model.summary(level=level)
    with pytest.raises(ValueError, match="level"):
        model.predict_proba_interval(X[:3], level=level)


@pytest.mark.parametrize(
    "level, ends",
    [(0.95, ["2.5%", "97.5%"]), (1e-6, ["49.99995%", "50.00005%"]), (1 - 1e-9, ["5e-08%", "100%"])],
)
def test_interval_columns_are_two_distinct_names(binary, level, ends, monkeypatch):
    """Each end of the interval has its own column, however narrow the interval (at 4
    significant digits both ends of a 1e-6 interval were "50%": one column overwrote the
    other, and the structured array refused the duplicate)."""
    _, _, model = binary
    table = model.summary(level=level)
    assert list(table.columns[2:4]) == ends
    assert np.all(table[ends[0]] < table[ends[1]])
    monkeypatch.setitem(sys.modules, "pandas", None)
    assert list(model.summary(level=level).dtype.names[3:5]) == ends
    with pytest.raises(ValueError, match="level=1e-17 is too small"):
        model.summary(level=1e-17)


@pytest.mark.parametrize("n_draws", [0, -3, 2.5, True])
def test_bad_n_draws_is_named(binary, n_draws):
    X, y, model = binary
    for call in (
        lambda: model.sample_proba(X[:3], n_draws),
        lambda: model.sample_y(X[:3], n_draws),
        lambda: model.loo(X, y, n_draws=n_draws),
        lambda: model.predict_proba_interval(X[:3], n_draws=n_draws),
        lambda: model.sample_coef(n_draws),
    ):
        with pytest.raises(ValueError, match="n_draws"):
            call()


def test_draws_beyond_the_memory_limit_are_refused_naming_n_draws(multinomial):
    """Every read that draws sizes its draws first and refuses with the remedy, never a
    NumPy MemoryError: the coefficient draws (15 parameters) and one row's latent draws
    are what exceed 1 MiB here, not the drawn probabilities (20,000 × 1 × 3: 0.5 MiB)."""
    X, _, model = multinomial
    with config_context(memory_limit=2**20):
        for call in (
            lambda: model.sample_coef(20_000),
            lambda: model.sample_proba(X[:1], 20_000),
            lambda: model.sample_y(X[:1], 20_000),
            lambda: model.predict_proba_interval(X[:1], n_draws=20_000),
        ):
            with pytest.raises(MemoryLimitError, match="n_draws"):
                call()
        model.sample_coef(1000)  # (0.36 MiB: drawn)


def test_drawn_labels_and_probabilities_stay_within_their_blocks(multinomial):
    """sample_y holds its labels whole (with their uniform draws and class indices), never
    the draws' probabilities (n_draws × n × 3) and their cumulative sums, which took it to
    3 × the labels' memory; the blocks of both reads keep their temporaries within the
    working memory (a quarter of it per block: 0.5 MiB at 2 MiB)."""
    import tracemalloc

    from sklearn import config_context as sklearn_config

    X, _, model = multinomial
    n_draws = 2400
    probabilities = 8.0 * n_draws * len(X) * 3
    labels = n_draws * len(X) * (16 + model.classes_.dtype.itemsize)  # uniform, index, label
    block = 2**20 / 2
    draws = 8.0 * 3 * n_draws * 9  # the coefficient draws: 3 copies of 2400 × 9
    peaks = {}
    with sklearn_config(working_memory=2):
        for name, call in (
            ("sample_y", lambda: model.sample_y(X, n_draws, random_state=0)),
            ("sample_proba", lambda: model.sample_proba(X, n_draws, random_state=0)),
        ):
            call()  # (the first call's imports and caches are not the read's)
            tracemalloc.start()
            try:
                call()
                peaks[name] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        blocked = model.sample_y(X, n_draws, random_state=0)
    assert peaks["sample_y"] < labels + block + draws
    assert peaks["sample_proba"] < probabilities + block + draws
    # The blocks change no label: each is read from the same probabilities.
    np.testing.assert_array_equal(blocked, model.sample_y(X, n_draws, random_state=0))


@pytest.mark.parametrize("failed_fit", [False, True])
def test_unfitted_estimator_says_fit_first(binary, failed_fit):
    # failed_fit: a fresh fit refused after setting classes_ (one class in y) leaves no
    # posterior; its reads say "fit first", not that coef_ is missing (D-278).
    from sklearn.exceptions import NotFittedError

    X, y, _ = binary
    model = EPLogisticRegression()
    if failed_fit:
        with pytest.raises(ValueError, match="class"):
            model.fit(X, np.zeros_like(y))
    for call in (
        lambda: model.predict_proba(X[:3]),
        lambda: model.decision_function(X[:3]),
        model.summary,
        lambda: model.predict_proba_interval(X[:3]),
        lambda: model.sample_proba(X[:3], 5),
        lambda: model.sample_y(X[:3], 5),
        lambda: model.loo(X, y),
        lambda: model.to_inference_data(X, y),
        lambda: model.sample_coef(5),
        lambda: model.thompson_sample(X[:3]),
    ):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            call()


def test_draws_of_a_fitted_estimator_skip_scikit_learns_fitted_check(binary, monkeypatch):
    """A set coef_ meets check_is_fitted's criterion: its tags and scan of the attributes,
    twice a seventh of a one-draw sample_coef, are not run after a fit (D-270); before
    one the reads still say "fit first" (test_unfitted_estimator_says_fit_first)."""
    from vsbayes.estimators import _prediction, _summaries

    X, _, model = binary
    calls = []
    for module in (_prediction, _summaries):
        check = module.check_is_fitted
        monkeypatch.setattr(
            module,
            "check_is_fitted",
            lambda *a, check=check, **k: calls.append(1) or check(*a, **k),
        )
    model.sample_coef(1, random_state=0)
    model.thompson_sample(X[:3], random_state=0)
    model.sample_proba(X[:3], 2, random_state=0)
    assert calls == []


def test_plain_rows_skip_scikit_learns_checks_and_others_take_them(binary, monkeypatch):
    """Finite float64 rows of the fitted width, to an estimator fitted without names, are
    read as they are (validate_data would return them so: D-271); the same rows as a list,
    float32, with a NaN, or of another width take scikit-learn's checks, results and errors."""
    import pandas as pd

    from vsbayes.estimators import _prediction

    X, y, model = binary
    rows = X[:4].copy()
    validated = []
    check = _prediction.validate_data
    monkeypatch.setattr(
        _prediction,
        "validate_data",
        lambda *a, **k: validated.append(1) or check(*a, **k),
    )
    plain = model.predict_proba(rows)
    draws = model.thompson_sample(rows, random_state=0).scores
    assert validated == []
    np.testing.assert_array_equal(model.predict_proba(rows.tolist()), plain)
    np.testing.assert_array_equal(
        model.thompson_sample(rows.tolist(), random_state=0).scores, draws
    )
    model.predict_proba(rows.astype(np.float32))
    assert len(validated) == 3
    rows[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        model.predict_proba(rows)
    with pytest.raises(ValueError, match="features"):
        model.predict_proba(X[:4, :1])
    named = clone(model).fit(pd.DataFrame(X, columns=["a", "b"]), y)
    with pytest.warns(UserWarning, match="feature names"):
        named.predict_proba(X[:4])


def test_plain_rows_whose_sum_overflows_warn_as_before(binary):
    """Finite rows whose sum overflows take scikit-learn's checks without a RuntimeWarning
    of the shortcut's sum (D-275): the read's own error as before, and partial_fit's checks."""
    X, y, model = binary
    huge = np.full((3, X.shape[1]), 1e308)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="overflow float64"):
            model.predict_proba(huge)
    refit = clone(model).fit(X, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # (whatever the update makes of such rows: the check's warning is the test's)
        with contextlib.suppress(ValueError):
            refit.partial_fit(huge, y[:3])
    assert not [w for w in caught if "in reduce" in str(w.message)]


def test_wrong_width_is_named(binary):
    X, y, model = binary
    for call in (
        lambda: model.predict_proba_interval(X[:, :1]),
        lambda: model.sample_proba(X[:, :1], 5),
        lambda: model.loo(X[:, :1], y),
    ):
        with pytest.raises(ValueError, match="X has 1 features"):
            call()


# --- prediction intervals and draws -------------------------------------------------------


def test_binary_interval_is_the_links_quantiles(binary):
    X, y, model = binary
    lower, upper = model.predict_proba_interval(X[:5], level=0.8)
    mean, var = model.latent_mean_and_variance(X[:5])
    z = norm.ppf(0.9)
    expit = 1.0 / (1.0 + np.exp(-(mean + z * np.sqrt(var))))
    np.testing.assert_allclose(upper[:, 1], expit, rtol=1e-12)
    np.testing.assert_allclose(lower[:, 0], 1.0 - upper[:, 1], rtol=1e-12)
    # And the quantiles of the drawn probabilities (N = 20000: quantile error ~ 0.005).
    draws = model.sample_proba(X[:5], 20_000, random_state=1)[:, :, 1]
    np.testing.assert_allclose(np.quantile(draws, 0.9, axis=0), upper[:, 1], atol=0.01)
    # A float32 fit's probabilities, intervals and draws alike are float32 (predict_proba's).
    X32 = X.astype(np.float32)
    fit32 = LaplaceLogisticRegression().fit(X32, y)
    assert fit32.predict_proba(X32[:3]).dtype == np.float32
    assert {b.dtype for b in fit32.predict_proba_interval(X32[:3])} == {np.dtype(np.float32)}
    assert fit32.sample_proba(X32[:3], 10, random_state=0).dtype == np.float32
    # ... and its coefficient draws coef_'s dtype, the same draws as float64's, rounded.
    coef32, intercept32 = fit32.sample_coef(10, random_state=0)
    assert coef32.dtype == intercept32.dtype == fit32.coef_.dtype == np.float32
    coef64, _ = LaplaceLogisticRegression().fit(X, y).sample_coef(10, random_state=0)
    np.testing.assert_allclose(coef32, coef64, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "estimator_class, far",
    [(LaplaceLogisticRegression, 40.0), (LaplaceProbitRegression, 8.0)],
)
def test_binary_interval_keeps_the_digits_of_a_small_probability(estimator_class, far):
    """Rows predicted with near certainty (latent means beyond 37 logits, 8.3 probits, where
    F(f) rounds to 1): the unlikely class's bounds are F(-f) at the latent's quantiles, not
    1 - F(f), which rounded them to 0, below the median of the drawn probabilities."""
    X, y = binary_data()
    model = estimator_class(C=10.0).fit(X, y)
    rows = np.array([[far, 0.0], [-far, 0.0]])
    lower, upper = model.predict_proba_interval(rows, level=0.5)
    mean, var = model.latent_mean_and_variance(rows)
    cdf = expit if estimator_class is LaplaceLogisticRegression else norm.cdf
    ends = mean[:, None] + norm.ppf([0.25, 0.75]) * np.sqrt(var)[:, None]
    # Each class's bounds are its link's values at the latent's quantiles, to round-off.
    expected_lower = np.column_stack([cdf(-ends[:, 1]), cdf(ends[:, 0])])
    expected_upper = np.column_stack([cdf(-ends[:, 0]), cdf(ends[:, 1])])
    np.testing.assert_allclose(lower, expected_lower, rtol=1e-12)
    np.testing.assert_allclose(upper, expected_upper, rtol=1e-12)
    assert lower[0, 0] > 0 and lower[1, 1] > 0  # each row's unlikely class
    # The interval holds the median of the drawn probabilities, however small.
    median = np.median(model.sample_proba(rows, 2001, random_state=0), axis=0)
    assert np.all((lower <= median) & (median <= upper))


def test_multinomial_interval_matches_the_draws(multinomial):
    X, y, model = multinomial
    lower, upper = model.predict_proba_interval(X[:4], level=0.9, random_state=0)
    draws = model.sample_proba(X[:4], 20_000, random_state=1)
    np.testing.assert_allclose(np.quantile(draws, 0.05, axis=0), lower, atol=0.015)
    np.testing.assert_allclose(np.quantile(draws, 0.95, axis=0), upper, atol=0.015)
    assert np.all(lower <= upper)
    # Reproducible by default (the fit's seed), as the fit itself.
    again = [model.predict_proba_interval(X[:4], level=0.9, n_draws=256) for _ in range(2)]
    np.testing.assert_array_equal(again[0], again[1])
    loo = [model.loo(X, y, n_draws=100, refit_above=None) for _ in range(2)]
    assert loo[0].elpd_waic == loo[1].elpd_waic


@pytest.mark.parametrize("estimator_class", [LaplaceLogisticRegression, LaplaceProbitRegression])
def test_a_rows_interval_is_the_same_in_any_batch(estimator_class):
    """Beyond two classes (multinomial and one-vs-rest) a row's interval does not depend on
    the rows passed with it: every row takes the same standard normal draws (they differed
    by 0.009 at 4096 draws, the Monte Carlo error, alone or among 10 rows)."""
    X, y = three_class_data()
    model = estimator_class().fit(X, y)
    together = model.predict_proba_interval(X[:10], random_state=0)
    alone = model.predict_proba_interval(X[5:6], random_state=0)
    # The same draws through the row's latent moments, computed in blocks of other sizes.
    for batch, single in zip(together, alone, strict=True):
        np.testing.assert_allclose(batch[5:6], single, rtol=0, atol=1e-12)


def test_one_vs_rest_draws_of_far_rows_are_distributions():
    """Rows far out (radius 300), where a draw can put every class's probit latent below
    -38: each F(f_k) underflows to 0, and the one-vs-rest normalization F(f_k) / Σ F(f_l),
    formed in the linear domain, gave 0/0: NaN intervals (on 1932 of 2000 such rows) and
    drawn probabilities, and sample_y the first class for those draws, silently."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 2)), np.arange(30) % 3  # coefficients near 0, wide
    model = LaplaceProbitRegression().fit(X, y)
    rows = 300 * rng.standard_normal((40, 2))
    lower, upper = model.predict_proba_interval(rows, random_state=0)
    assert np.isfinite(lower).all() and np.isfinite(upper).all()
    proba = model.sample_proba(rows, 50, random_state=0)
    np.testing.assert_allclose(proba.sum(axis=2), 1.0, rtol=1e-12)
    # The same coefficient draws (the same seed): each drawn label has positive probability
    # under its draw.
    index = np.searchsorted(model.classes_, model.sample_y(rows, 50, random_state=0))
    assert np.all(np.take_along_axis(proba, index[..., None], axis=2) > 0)


def test_draws_average_to_predict_proba_and_are_seeded(multinomial):
    X, _, model = multinomial
    draws = model.sample_proba(X[:6], 20_000, random_state=2)
    # MC error of the mean of a probability: ≤ 0.5/√N = 0.0035; 4 of them.
    np.testing.assert_allclose(draws.mean(axis=0), model.predict_proba(X[:6]), atol=0.015)
    labels = model.sample_y(X[:6], 5000, random_state=3)
    assert labels.shape == (5000, 6) and set(np.unique(labels)) <= set(model.classes_)
    frequency = (labels[:, :, None] == model.classes_).mean(axis=0)
    np.testing.assert_allclose(frequency, model.predict_proba(X[:6]), atol=0.03)
    np.testing.assert_array_equal(
        model.sample_y(X[:6], 10, random_state=4), model.sample_y(X[:6], 10, random_state=4)
    )


def test_sparse_rows_give_the_dense_results(binary):
    X, _, model = binary
    lower, upper = model.predict_proba_interval(sp.csr_matrix(X[:5]))
    dense = model.predict_proba_interval(X[:5])
    np.testing.assert_allclose(lower, dense[0], rtol=1e-12)
    np.testing.assert_allclose(upper, dense[1], rtol=1e-12)
    np.testing.assert_allclose(
        model.sample_proba(sp.csr_matrix(X[:5]), 4, random_state=0),
        model.sample_proba(X[:5], 4, random_state=0),
        rtol=1e-12,
    )


# --- leave-one-out ------------------------------------------------------------------------


def test_ep_loo_matches_refits(binary):
    X, y, model = binary
    result = model.loo(X, y, random_state=0)
    assert result.method == "ep-cavity" and result.pareto_k is None
    rows = [0, 1, 2, 3]
    # The cavity is the posterior without the row, the other sites held: on 150 rows the
    # refits' sites move by O(1/n²) (measured: ≤ 5e-4).
    np.testing.assert_allclose(
        result.pointwise[rows], brute_force(EPLogisticRegression, X, y, rows), atol=3e-3
    )
    assert result.se > 0 and 0 < result.p_loo < 5
    assert result.elpd_loo == pytest.approx(result.pointwise.sum())


def test_ep_loo_refits_its_influential_rows(binary):
    X, y, model = binary
    # One row's p_loo share is 0.38: above 0.3, below the default 0.5.
    assert not model.loo(X, y, random_state=0).refitted.any()
    result = model.loo(X, y, random_state=0, refit_above=0.3)
    cavities = model.loo(X, y, random_state=0, refit_above=None)
    refitted = np.flatnonzero(result.refitted)
    assert 0 < refitted.size < 10 and not cavities.refitted.any()
    # The influential rows' terms are brute force's (EP refitted warm from the fit's sites,
    # to the refits' site tolerance 1e-3: measured 1.5e-4 here); the others, the cavities'.
    np.testing.assert_allclose(
        result.pointwise[refitted], brute_force(EPLogisticRegression, X, y, refitted), atol=1e-3
    )
    others = ~result.refitted
    np.testing.assert_array_equal(result.pointwise[others], cavities.pointwise[others])
    for bad in (-0.1, True, np.nan, "0.1"):
        with pytest.raises(ValueError, match="refit_above"):
            model.loo(X, y, refit_above=bad)
    pd = pytest.importorskip("pandas")  # the refits keep a DataFrame's feature names
    frame = pd.DataFrame(X, columns=["a", "b"])
    framed = (
        EPLogisticRegression()
        .fit(frame, y)
        .loo(frame, pd.Series(y), random_state=0, refit_above=0.3)
    )
    np.testing.assert_allclose(framed.pointwise, result.pointwise, rtol=1e-12)


def test_a_refitted_row_alone_in_its_class_scores_minus_infinity(monkeypatch):
    # Where EP's influential rows are refitted by the estimator (here: the warm refits
    # made to fail), without the only row of its class no refit exists (one class), and
    # no posterior gives it any probability: its term is -inf, the standard error inf,
    # without a RuntimeWarning.
    from vsbayes import LaplacePrior
    from vsbayes.estimators import _leave_one_out
    from vsbayes.exceptions import EstimationError

    def stalled(*args, **kwargs):
        raise EstimationError("stalled")

    monkeypatch.setattr(_leave_one_out, "refit_without_rows", stalled)
    X, y = binary_data(n=12)
    y[:] = 0
    y[3] = 1
    model = EPLogisticRegression(prior=LaplacePrior()).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = model.loo(X, y, random_state=0, refit_above=0.0)
    assert result.refitted[3] and result.pointwise[3] == -np.inf
    assert np.isfinite(np.delete(result.pointwise, 3)).all()
    assert result.elpd_loo == -np.inf and result.se == np.inf and np.isfinite(result.waic_se)


def _counting_clones(monkeypatch):
    """The estimator refits of leave-one-out (each a ``clone``), counted."""
    from vsbayes.estimators import _leave_one_out

    clones = []
    counted = _leave_one_out.clone

    def counting(estimator):
        clones.append(1)
        return counted(estimator)

    monkeypatch.setattr(_leave_one_out, "clone", counting)
    return clones


@pytest.mark.parametrize("prior", ["laplace", "student-t"])
def test_shrinkage_loo_relaxes_the_prior_sites_and_does_not_refit(prior, monkeypatch):
    # Binary EP under a shrinkage prior: its influential rows' refits are EP warm from the
    # fit's sites, the rows' sites under the Gaussian base times its coefficient sites
    # (D-158), under the Student-t alternating with those sites relaxed without the row
    # (D-194).
    from vsbayes import LaplacePrior, StudentTPrior
    from vsbayes.approximations import expectation_propagation
    from vsbayes.approximations.ep_leave_one_out import refit_without_rows
    from vsbayes.models import BinaryGLMPosterior

    X, y = binary_data(n=30, seed=1)
    shrinkage = LaplacePrior(1.0) if prior == "laplace" else StudentTPrior()
    model = EPLogisticRegression(prior=shrinkage).fit(X, y)
    clones = _counting_clones(monkeypatch)
    result = model.loo(X, y, random_state=0, refit_above=0.0)  # every row refitted
    assert result.refitted.all() and not clones  # no refit of the estimator
    cavities = model.loo(X, y, random_state=0, refit_above=None)

    # 1. The refits reach EP's fixed point without the row under the fixed prior sites:
    # cold EP (to 1e-10) on the other rows under the Gaussian prior they make (proper
    # here: base + τ > 0), to the sweeps' tolerance (1e-7, as the Gaussian prior's).
    tau, nu = model.posteriors_[0].prior_sites
    factor = model._shrinkage_factor()
    assert np.all(1.0 / factor.base_var + tau > 0)
    labels = np.where(y == 1, 1.0, -1.0)

    def fitted(keep, **prior_of):
        prior_of["intercept_prior_var"] = INTERCEPT_PRIOR_VAR
        weights = np.ones(keep.sum())
        return BinaryGLMPosterior(X[keep], labels[keep], weights, "logistic", **prior_of)

    every = np.ones(len(y), dtype=bool)
    full = fitted(every, prior_var=1.0, coefficient_prior=factor)
    rows = np.array([0, 7, 19])
    warm = refit_without_rows(
        full, model.posteriors_[0].sites, rows, prior_sites=(tau, nu), tol=1e-10
    )
    precision = 1.0 / factor.base_var + tau
    for j, i in enumerate(rows):
        keep = every & (np.arange(len(y)) != i)
        gaussian = fitted(keep, prior_var=1.0 / precision, prior_mean=np.r_[nu / precision, 0])
        cold = expectation_propagation(gaussian, tol=1e-10)
        a = labels[i] * np.r_[X[i], 1.0]
        assert warm.mean[j] == pytest.approx(a @ cold.mean, abs=1e-7)
        assert warm.var[j] == pytest.approx(a @ cold.cov @ a, rel=1e-7)

    # 2. Against brute force (the estimator refitted without each row: its prior sites
    # move too). Student-t: the coefficient sites are relaxed as well, so that each refit
    # is EP without the row, the same fixed point as the estimator's (signed, as the
    # fit), to the refits' stopping rules: the rows' sweeps at a site change of 1e-3
    # (each term within 2e-3 nats, D-071), the coefficient sites' relaxation where its
    # term is expected to move less than 1e-3 nats more; hence 3e-3 (measured on 4 seeds
    # of this design: at most 1.3e-3, as under the Laplace priors relaxed). Laplace
    # (log-concave): the sites are held (D-194), which keeps row i's pull on them in the
    # refit: the error of the cavity (which holds all the sites) restricted to the d
    # prior sites, so on average no larger than the cavity's, which holds the M − 1 rows'
    # sites too. Its size, measured on 6 seeds of this design (30 rows; Laplace(1),
    # Laplace(0.3), Student-t): at most 0.086 nats a row, 0.0031 on average (the
    # cavities': 0.10 and 0.0053); the bounds are twice those.
    brute = brute_force(lambda: clone(model), X, y, np.arange(len(y)))
    assert clones == []  # (brute force's clones are sklearn's, not counted)
    error = result.pointwise - brute
    if prior == "laplace":
        assert np.max(np.abs(error)) < 0.17 and abs(error.mean()) < 0.0062
        assert np.mean(np.abs(error)) <= np.mean(np.abs(cavities.pointwise - brute))
    else:
        assert np.max(np.abs(error)) < 3e-3
        assert np.max(np.abs(cavities.pointwise - brute)) > 10 * np.max(np.abs(error))


def test_shrinkage_loo_relaxes_the_prior_sites_in_middling_rows_cavities():
    # The rows not refitted whose share of p_loo exceeds RELAX_P_LOO take their cavity
    # with the coefficient sites relaxed without the row (D-194): what the cavity keeps of
    # the row's pull on those sites (under the horseshoe, its spike) goes, what it keeps
    # on the rows' sites stays. So those rows are closer to brute force than their
    # cavities, by the coefficient sites' share of the cavities' error (measured on 4
    # seeds of this design under the Laplace, Student-t and horseshoe priors: in all 12;
    # here 0.019 nats a row on average against 0.050).
    from vsbayes import HorseshoePrior

    X, y = binary_data(n=30, seed=1)
    model = EPLogisticRegression(prior=HorseshoePrior(0.3)).fit(X, y)
    result = model.loo(X, y, random_state=0)
    cavities = model.loo(X, y, random_state=0, refit_above=None)
    moved = np.flatnonzero(~result.refitted & (result.pointwise != cavities.pointwise))
    assert moved.size
    brute = brute_force(lambda: clone(model), X, y, moved)
    relaxed = np.abs(result.pointwise[moved] - brute).mean()
    assert relaxed < 0.5 * np.abs(cavities.pointwise[moved] - brute).mean()


def test_shrinkage_loo_refits_the_estimator_where_the_fixed_sites_are_improper(monkeypatch):
    # Prior sites whose precisions leave a refit's posterior improper (a heavy-tailed
    # prior's can be negative): the warm refits are refused, the estimator refitted.
    from vsbayes import StudentTPrior

    X, y = binary_data(n=30, seed=1)
    model = EPLogisticRegression(prior=StudentTPrior()).fit(X, y)
    warm = model.loo(X, y, random_state=0)
    rows = np.flatnonzero(warm.refitted)
    assert rows.size
    posterior = model.posteriors_[0]
    tau, nu = posterior.prior_sites
    object.__setattr__(posterior, "prior_sites", (tau - 1e3, nu))  # (improper alone)
    clones = _counting_clones(monkeypatch)
    refitted = model.loo(X, y, random_state=0)
    assert len(clones) == rows.size
    np.testing.assert_allclose(
        refitted.pointwise[rows], brute_force(lambda: clone(model), X, y, rows), rtol=1e-12
    )


def test_ep_loo_refits_the_estimator_where_warm_ep_fails(binary, monkeypatch):
    from vsbayes.estimators import _leave_one_out
    from vsbayes.exceptions import EstimationError

    X, y, model = binary
    warm = model.loo(X, y, random_state=0, refit_above=0.3)

    def stalled(*args, **kwargs):
        raise EstimationError("stalled")

    monkeypatch.setattr(_leave_one_out, "refit_without_rows", stalled)
    refitted = model.loo(X, y, random_state=0, refit_above=0.3)
    rows = np.flatnonzero(warm.refitted)
    assert rows.size
    # The estimator's own refits (brute force's, to the digit), as close as the warm ones.
    np.testing.assert_allclose(
        refitted.pointwise[rows], brute_force(EPLogisticRegression, X, y, rows), rtol=1e-12
    )
    np.testing.assert_allclose(refitted.pointwise, warm.pointwise, atol=1e-3)


def test_multinomial_ep_loo_matches_refits(multinomial):
    X, y, model = multinomial
    result = model.loo(X, y, random_state=0)
    rows = [0, 3]
    np.testing.assert_allclose(
        result.pointwise[rows], brute_force(EPLogisticRegression, X, y, rows), atol=1e-2
    )
    # The multinomial default refits the rows above 0.01 nats (the binary one, above 0.5):
    # their terms are EP refitted without them, to the refits' site tolerance 1e-3.
    refitted = np.flatnonzero(result.refitted)
    assert refitted.size > model.loo(X, y, random_state=0, refit_above=0.5).refitted.sum()
    np.testing.assert_allclose(
        result.pointwise[refitted[:2]],
        brute_force(EPLogisticRegression, X, y, refitted[:2]),
        atol=2e-3,
    )
    # Sparse rows: the dense rows' cavities.
    cavities = model.loo(X, y, random_state=0, refit_above=None)
    sparse = model.loo(sp.csr_matrix(X), y, random_state=0, refit_above=None)
    np.testing.assert_allclose(sparse.pointwise, cavities.pointwise, rtol=1e-12)


def test_multinomial_loo_under_a_given_prior():
    """A multinomial fit under a Gaussian prior= (EmpiricalBayesClassifier(scales="ard")'s
    fits) has leave-one-out and the ArviZ export: they were refused. EP's terms are those of
    refits under the same prior, PSIS weighs its draws by that prior's density."""
    X, y = three_class_data(n=90, seed=1)
    rng = np.random.default_rng(0)
    prior = (0.3 * rng.standard_normal(9), np.r_[np.tile([0.5, 4.0], 3), [100.0] * 3])

    def refits(rows):
        out = []
        for i in rows:
            keep = np.arange(len(y)) != i
            refit = EPLogisticRegression(prior=prior).fit(X[keep], y[keep])
            out.append(refit.predict_log_proba(X[i : i + 1])[0, y[i]])
        return np.array(out)

    # (Under prior= a row's refit is the estimator's: above 0.01 nats, 88 rows, 3 s.)
    ep = EPLogisticRegression(prior=prior).fit(X, y).loo(X, y, random_state=0, refit_above=0.2)
    refitted = np.flatnonzero(ep.refitted)[:2]
    assert refitted.size == 2
    # A refitted row's term is the refit's (EP's tolerance); a cavity's within the
    # cavities' error (0.02 nats at most here against the refits).
    np.testing.assert_allclose(ep.pointwise[refitted], refits(refitted), atol=1e-6)
    np.testing.assert_allclose(ep.pointwise[:2], refits([0, 1]), atol=0.03)
    laplace = LaplaceLogisticRegression(prior=prior).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PSISWarning)
        psis = laplace.loo(X, y, random_state=0)
    # (Both estimate the same leave-one-out; PSIS's Monte Carlo error ~0.2 nats here.)
    assert psis.elpd_loo == pytest.approx(ep.elpd_loo, abs=0.5)
    tree = laplace.to_inference_data(X, y, n_draws=50, random_state=0)
    # lp is log p(y | θ) + log N(θ; prior), up to a constant: the prior's density enters.
    coef = tree.posterior["coef"].values[0]
    assert np.isfinite(tree.sample_stats["lp"].values).all() and coef.shape == (50, 3, 2)


@pytest.mark.parametrize("data", [binary_data, three_class_data])
def test_psis_loo_agrees_with_ep(data):
    # Both estimate the exact posterior's leave-one-out; on 150 rows and 3-9 parameters
    # the posterior is near Gaussian (k̂ small) and they agree to the draws' MC error.
    X, y = data()
    # (EP's cavities alone: within this tolerance; its refits are tested above.)
    ep = EPLogisticRegression().fit(X, y).loo(X, y, random_state=0, refit_above=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PSISWarning)
        psis = LaplaceLogisticRegression().fit(X, y).loo(X, y, random_state=0)
    assert psis.method == "psis" and psis.pareto_k.max() < 0.7
    assert psis.posterior_pareto_k < 0.7
    assert psis.elpd_loo == pytest.approx(ep.elpd_loo, abs=0.3)
    assert psis.elpd_waic == pytest.approx(ep.elpd_waic, abs=0.3)


def test_psis_loo_weighs_the_draws_by_the_fits_own_prior():
    # A shrinkage prior (l1) and a Gaussian prior= are the prior PSIS corrects towards:
    # N(0, C) in their place targeted another posterior (3 nats off EP's on 120 rows).
    X, y = binary_data(n=120, seed=3)
    ep = EPLogisticRegression(l1_ratio=1.0, C=0.05).fit(X, y).loo(X, y, refit_above=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PSISWarning)
        psis = LaplaceLogisticRegression(l1_ratio=1.0, C=0.05).fit(X, y).loo(X, y, random_state=0)
    assert psis.method == "psis"
    assert psis.elpd_loo == pytest.approx(ep.elpd_loo, abs=0.3)
    # The default prior given explicitly as prior=: the same draws, the same terms.
    default = LaplaceLogisticRegression(C=2.0).fit(X, y).loo(X, y, random_state=0)
    given = LaplaceLogisticRegression(prior=(np.zeros(3), [2.0, 2.0, INTERCEPT_PRIOR_VAR]))
    given = given.fit(X, y).loo(X, y, random_state=0)
    np.testing.assert_allclose(given.pointwise, default.pointwise, rtol=1e-7)


def test_zero_weight_rows_are_left_out(binary):
    X, y, _ = binary
    weights = np.ones(len(y))
    weights[:10] = 0.0
    for estimator in (EPProbitRegression, LaplaceLogisticRegression):
        with_zeros = estimator().fit(X, y, sample_weight=weights)
        result = with_zeros.loo(X, y, sample_weight=weights, random_state=0)
        assert np.all(result.pointwise[:10] == 0.0)
        without = estimator().fit(X[10:], y[10:]).loo(X[10:], y[10:], random_state=0)
        np.testing.assert_allclose(result.pointwise[10:], without.pointwise, atol=1e-8)


def test_weighted_ep_loo_uses_the_whole_factor(binary):
    # A weight-2 row's term is log ∫ F² × cavity: below twice its weight-1 term's (Jensen).
    X, y, _ = binary
    weights = np.ones(len(y))
    weights[0] = 2.0
    result = EPLogisticRegression().fit(X, y, sample_weight=weights).loo(X, y, weights)
    assert np.isfinite(result.elpd_loo) and result.pointwise[0] < 0


def test_heavy_tails_are_named(binary):
    # Nearly separable data with a flat prior: the Laplace approximation is poor.
    rng = np.random.default_rng(5)
    X = rng.standard_normal((40, 6))
    y = (X[:, 0] + 0.2 * rng.standard_normal(40) > 0).astype(int)
    model = LaplaceLogisticRegression(C=100.0).fit(X, y)
    with pytest.warns(PSISWarning, match="Pareto k̂"):
        result = model.loo(X, y, random_state=0)
    assert result.n_bad > 0 or result.posterior_pareto_k > 0.7


def test_one_vs_rest_has_no_loo():
    X, y = three_class_data()
    with pytest.raises(ValueError, match="one-vs-rest"):
        LaplaceProbitRegression().fit(X, y).loo(X, y)


def test_loo_refuses_unknown_labels(binary):
    X, y, model = binary
    with pytest.raises(ValueError, match="not fitted on"):
        model.loo(X, y + 5)


def test_loo_refuses_rows_other_than_the_fits(binary):
    """EP's terms pair row i with the fit's site i, and PSIS reweights by the fit's
    likelihood: other rows of the same count (shuffled, held out, relabelled, reweighted)
    must not get numbers that look like leave-one-out."""
    X, y, model = binary
    order = np.random.default_rng(0).permutation(len(y))
    for other_X, other_y, weights in (
        (X[order], y[order], None),
        (X + 1.0, y, None),
        (X, 1 - y, None),
        (X, y, np.full(len(y), 2.0)),
    ):
        with pytest.raises(ValueError, match=r"not the data .* fitted on"):
            model.loo(other_X, other_y, sample_weight=weights)
    with pytest.raises(ValueError, match=r"not the data .* fitted on"):
        model.to_inference_data(X[:-1], y[:-1], n_draws=10)
    # The same rows in another container or dtype are the same data.
    sparse = model.loo(sp.csr_matrix(X), list(y), refit_above=None)
    single = model.loo(X.astype(np.float32), y, np.ones(len(y)), refit_above=None)
    assert sparse.method == single.method == "ep-cavity"
    assert single.elpd_loo == pytest.approx(sparse.elpd_loo, rel=1e-5)


# --- Pareto smoothing ---------------------------------------------------------------------


def test_pareto_k_of_known_tails():
    rng = np.random.default_rng(0)
    for shape in (0.2, 0.5, 0.9):
        # log of Pareto-tailed weights with tail shape `shape`.
        log_w = shape * rng.exponential(size=(200, 2000))
        smoothed, k = pareto_smoothed_log_weights(log_w)
        # The fit's sd is ~0.1 per row: the mean of 200 within 0.05 (with the prior's pull).
        assert k.mean() == pytest.approx(shape, abs=0.05)
        np.testing.assert_allclose(np.exp(smoothed).sum(axis=1), 1.0, rtol=1e-12)


def test_the_fewest_draws_psis_takes_are_those_it_names():
    log_weights = np.random.default_rng(0).standard_normal((1, 21))
    assert np.isfinite(pareto_smoothed_log_weights(log_weights)[1]).all()
    with pytest.raises(ValueError, match="at least 21 draws per row; got 20"):
        pareto_smoothed_log_weights(log_weights[:, :20])


def test_flat_weights_need_no_smoothing():
    smoothed, k = pareto_smoothed_log_weights(np.zeros((2, 100)))
    assert np.all(k == -np.inf)
    np.testing.assert_allclose(smoothed, -np.log(100), rtol=1e-14)


def test_weights_spread_beyond_exps_range_get_an_infinite_k():
    # Most of the tail underflows beside the largest weight (the prior as the proposal,
    # max_iter=0): no Pareto fit (it took logs of negative numbers, NaN); the raw weights.
    log_w = np.full((1, 1000), -800.0)
    log_w[0, :5] = [0.0, -1.0, -2.0, -3.0, -4.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        smoothed, k = pareto_smoothed_log_weights(log_w)
    assert k[0] == np.inf
    np.testing.assert_allclose(smoothed, log_w - logsumexp(log_w), rtol=1e-14)


def test_a_pareto_shape_far_above_one_overflows_its_top_quantiles_quietly():
    # k̂ ~ 170 (a LaplaceLogisticRegression at C = 1e6 on 5 separated rows, its loo): the
    # top quantiles overflow to inf, which the smoothing truncates at the largest raw
    # weight; numpy's "overflow encountered in expm1" reached the user's loo call.
    from vsbayes.models.psis import _generalized_pareto_quantiles

    probabilities = (np.arange(190) + 0.5) / 190
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantiles = _generalized_pareto_quantiles(probabilities, 170.0, 1e-220)
    assert quantiles[0] > 0 and quantiles[-1] == np.inf


def test_pareto_k_matches_arviz():
    array_stats = pytest.importorskip("arviz_stats.base").array_stats
    rng = np.random.default_rng(1)
    # 900 draws: a tail of 3√S = 90 draws (ArviZ floors 3√S, the reference R code rounds
    # up; at a square S they agree).
    log_w = 0.6 * rng.exponential(size=(3, 900))
    smoothed, k = pareto_smoothed_log_weights(log_w)
    for row in range(3):
        theirs, their_k = array_stats.psislw(-log_w[row])
        assert k[row] == pytest.approx(float(their_k), abs=1e-10)
        np.testing.assert_allclose(smoothed[row], theirs, atol=1e-10)


# --- ArviZ --------------------------------------------------------------------------------


def test_inference_data_without_arviz_names_the_extra(binary, monkeypatch):
    _, _, model = binary
    monkeypatch.setitem(sys.modules, "arviz_base", None)
    with pytest.raises(ImportError, match=r"vsbayes\[arviz\]"):
        model.to_inference_data()


def test_inference_data_refuses_data_it_would_ignore(binary):
    """The log-likelihood group needs X and y: one without the other, or weights without
    them, were dropped silently."""
    X, y, model = binary
    for args, named in (((X, None), "y"), ((None, y), "X"), ((None, None, np.ones(len(y))), "X")):
        with pytest.raises(ValueError, match=f"without {named}"):
            model.to_inference_data(*args)


def test_inference_data_for_arviz(multinomial):
    pytest.importorskip("arviz_base")
    X, y, model = multinomial
    tree = model.to_inference_data(X, y, n_draws=2000, random_state=0)
    posterior = tree["posterior"]
    assert posterior["coef"].dims == ("chain", "draw", "class", "feature")
    assert list(posterior["feature"].values) == ["x0", "x1"]
    assert posterior.attrs["method"] == "expectation propagation"
    assert tree["log_likelihood"]["y"].shape == (1, 2000, len(y))
    loo = pytest.importorskip("arviz_stats").loo
    result = loo(tree)
    ours = model.loo(X, y, random_state=0)
    # ArviZ's PSIS of EP's draws against EP's cavities: MC error of 2000 draws.
    assert float(result.elpd) == pytest.approx(ours.elpd_loo, abs=0.5)


def test_inference_data_holds_the_log_likelihood_once(binary):
    """The export's memory check counts the draws' log-likelihoods once (n_draws × n): its
    blocks fill one array, where joining a list of them held it twice."""
    pytest.importorskip("arviz_base")
    import tracemalloc

    from sklearn import config_context as sklearn_config

    X, y, model = binary
    n_draws = 4000
    counted = 8.0 * n_draws * (3 * 3 + len(y))  # the check's: 3 copies of θ, one row of ll
    with sklearn_config(working_memory=2):  # (a block: 0.5 MiB of temporaries)
        model.to_inference_data(X, y, n_draws=10)  # (the first call's imports)
        tracemalloc.start()
        try:
            tree = model.to_inference_data(X, y, n_draws=n_draws, random_state=0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < counted + 2**20 / 2
    # The same values as the draws' own log-likelihoods.
    coef = tree["posterior"]["coef"].values[0, :, 0]
    f = X @ coef.T + tree["posterior"]["intercept"].values[0, :, 0]
    expected = -np.logaddexp(0.0, -np.where(y == 1, 1.0, -1.0)[:, None] * f).T
    np.testing.assert_allclose(tree["log_likelihood"]["y"].values[0], expected, rtol=1e-12)


@pytest.mark.parametrize("penalty", ["l2", "l1"])
def test_inference_data_draws_are_the_summarys_coefficients(penalty):
    """The exported draws are of the coefficients summary() shows: the centred ones of a
    multinomial posterior, the fitted ones under a shrinkage prior (which identifies them;
    intercepts centred), so ArviZ's summary of the export agrees with summary()."""
    pytest.importorskip("arviz_base")
    X, y = three_class_data()
    model = LaplaceLogisticRegression(penalty=penalty, C=0.5).fit(X, y)
    table = model.summary()
    n_draws = 4000
    tree = model.to_inference_data(n_draws=n_draws, random_state=0)
    coef = tree["posterior"]["coef"].values[0]
    intercept = tree["posterior"]["intercept"].values[0]
    draws = np.concatenate([coef, intercept[:, :, None]], axis=2).reshape(n_draws, -1)
    sd = table["sd"].to_numpy()
    # Monte Carlo errors: the mean's 1/√N = 0.016 sd, the sd's relative 1/√(2N) = 0.011;
    # five of them over the 9 entries.
    np.testing.assert_allclose((draws.mean(axis=0) - table["mean"]) / sd, 0.0, atol=0.08)
    np.testing.assert_allclose(draws.std(axis=0), sd, rtol=0.06)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_inference_data_near_certain_rows(n_classes):
    """Rows predicted with near certainty keep exact log-likelihoods, and ArviZ's
    leave-one-out of the approximation's draws (``lp``, ``log_q``) is finite on them and
    agrees with ``loo()``."""
    pytest.importorskip("arviz_base")
    loo_approximate_posterior = pytest.importorskip("arviz_stats").loo_approximate_posterior
    # Rows far out on their own class's side, beside data that determine the posterior.
    X, y = binary_data() if n_classes == 2 else three_class_data()
    if n_classes == 2:
        centres, labels = np.array([[1.0, -0.5], [-1.0, 0.5]]), np.array([1, 0])
    else:
        centres, labels = np.eye(3)[:, :2] - 0.4, np.arange(3)
    far = np.repeat(np.arange(len(centres)), 4)
    X = np.vstack([X, 80.0 * centres[far] / np.linalg.norm(centres[far], axis=1)[:, None]])
    y = np.concatenate([y, labels[far]])
    model = LaplaceLogisticRegression().fit(X, y)
    tree = model.to_inference_data(X, y, n_draws=1000, random_state=0)
    log_lik = tree["log_likelihood"]["y"].values[0]  # (draws, rows)
    # Independently: log p(y | θ) = −log1p(Σ_{j≠y} exp(f_j − f_y)) from the exported draws.
    coef = tree["posterior"]["coef"].values[0]
    intercept = tree["posterior"]["intercept"].values[0]
    f = np.einsum("skd,nd->snk", coef, X) + intercept[:, None, :]
    if n_classes == 2:
        gaps = -np.where(y == 1, 1.0, -1.0) * f[..., 0]
        expected = -np.log1p(np.exp(gaps))
    else:
        observed = np.arange(3) == y[:, None]  # (rows, classes)
        gaps = f - f[:, observed][:, :, None]
        expected = -np.log1p(np.where(observed, 0.0, np.exp(gaps)).sum(axis=2))
    # Rows whose probability is above 1 − 3e-7 in every draw.
    nearest = gaps if n_classes == 2 else np.sort(gaps, axis=2)[..., -2]
    certain = nearest.max(axis=0) < -15.0
    assert certain.sum() >= 4
    near = log_lik[:, certain]
    assert np.all(near < 0.0) and np.all(near > -1e-6)
    np.testing.assert_allclose(near, expected[:, certain], rtol=1e-10)
    stats = tree["sample_stats"]
    theirs = loo_approximate_posterior(
        tree, log_p=stats["lp"], log_q=stats["log_q"], pointwise=True
    )
    assert np.all(np.isfinite(theirs.elpd_i.values)) and np.all(np.isfinite(theirs.pareto_k.values))
    ours = model.loo(X, y, n_draws=1000, random_state=0)
    assert abs(float(theirs.elpd) - ours.elpd_loo) < ours.se


# --- every estimator ------------------------------------------------------------------------


def every_estimator():
    from vsbayes.estimators import METHODS

    for name, method in METHODS.items():
        for link, cls in method.classes.items():
            yield pytest.param(cls, id=f"{name}-{link}")


@pytest.mark.parametrize("estimator_class", list(every_estimator()))
def test_every_estimator_summarizes_and_predicts_intervals(estimator_class):
    X2, y2 = binary_data(n=60, seed=3)
    X3, y3 = three_class_data(n=60, seed=3)
    for X, y in ((sp.csr_matrix(X2), y2), (X3, y3)):
        params = {"random_state": 0} if "random_state" in estimator_class().get_params() else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = estimator_class(**params).fit(X, y)
        table = model.summary(level=0.8)
        assert np.all(table["sd"] > 0) and np.all(table["10%"] < table["90%"])
        lower, upper = model.predict_proba_interval(X[:3], n_draws=200, random_state=0)
        assert lower.shape == (3, len(model.classes_)) and np.all(lower <= upper)
        assert model.sample_proba(X[:3], 2, random_state=0).shape == (2, 3, len(model.classes_))


@pytest.mark.filterwarnings("ignore:EPLogisticRegression. with:UserWarning")  # (structured)
def test_unreliable_psis_names_a_remedy_that_applies():
    """Leave-one-out by importance sampling that warns names what gives its terms without
    it: EP's cavities, but not to an EP estimator (it told EPLogisticRegression to use
    EPLogisticRegression): a stream's are refitted by fit, and a structured posterior has
    no sites at all (held-out rows instead)."""
    rng = np.random.default_rng(0)
    X = sp.random(80, 300, density=0.03, format="csr", random_state=1)
    X.data = rng.exponential(1.0, X.nnz)
    truth = np.zeros(300)
    truth[:20] = rng.normal(0, 3, 20)
    y = (rng.random(80) < expit(X @ truth)).astype(int)
    with config_context(covariance="dual"):
        structured = EPLogisticRegression().fit(X, y)
    with pytest.warns(PSISWarning, match=r"structured .*cross_val_score") as record:
        structured.loo(X, y, n_draws=200, random_state=0)
    X = rng.standard_normal((40, 6))
    y = (X[:, 0] + 0.2 * rng.standard_normal(40) > 0).astype(int)
    stream = EPLogisticRegression(C=100.0)
    for start in range(0, 40, 10):
        stream.partial_fit(X[start : start + 10], y[start : start + 10], classes=[0, 1])
    with pytest.warns(PSISWarning, match=r"Fit EPLogisticRegression on these rows") as more:
        stream.loo(X, y, random_state=0)
    assert not any("Use EPLogisticRegression" in str(w.message) for w in [*record, *more])


def test_a_streams_loo_refuses_rows_other_than_its_batches():
    """A stream keeps its rows' count and class weights: loo of the last batch alone (or of
    other data) would score rows under a posterior that has seen them as if left out, so it
    is refused; the stream's rows, and a fit's continued by a batch, are taken."""
    X, y = make_classification(90, 4, random_state=0)
    stream = LaplaceLogisticRegression()
    for start in range(0, 90, 30):
        stream.partial_fit(X[start : start + 30], y[start : start + 30], classes=[0, 1])
    with pytest.raises(ValueError, match="X has 30 rows; the stream's batches had 90"):
        stream.loo(X[60:], y[60:])
    assert np.isfinite(stream.loo(X, y).elpd_loo)
    continued = LaplaceLogisticRegression().fit(X[:60], y[:60]).partial_fit(X[60:], y[60:])
    with pytest.raises(ValueError, match="X has 60 rows; the stream's batches had 90"):
        continued.loo(X[:60], y[:60])
    assert np.isfinite(continued.loo(X, y).elpd_loo)
    # And each class's total weight: a weighted stream's rows without their weights (or
    # with other labels) are not its likelihood; they were taken, as if of weight 1.
    weights = np.where(np.arange(90) % 3 == 0, 2.0, 1.0)
    weighted = LaplaceLogisticRegression(class_weight={0: 1.0, 1: 3.0})
    weighted.fit(X[:30], y[:30], sample_weight=weights[:30])
    for start in (30, 60):
        rows = slice(start, start + 30)
        weighted.partial_fit(X[rows], y[rows], sample_weight=weights[rows])
    with pytest.raises(ValueError, match="the weight of each class's rows"):
        weighted.loo(X, y)
    relabelled = np.where(np.arange(90) < 4, 1 - y, y)  # (4 rows' labels: other weights)
    with pytest.raises(ValueError, match="the weight of each class's rows"):
        weighted.loo(X, relabelled, weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PSISWarning)  # (one row's k̂ above 0.7)
        assert np.isfinite(weighted.loo(X, y, weights).elpd_loo)


def test_psis_draws_do_not_depend_on_round_off_of_the_covariance():
    # Fits on CSR and on dense X agree to round-off (coefficients 2e-15 apart here); the
    # draws of Σ's eigenvectors, each fixed up to a sign, were another sample for each:
    # Pareto k̂ 0.28 apart, other rows warned. Cholesky's factor is continuous in Σ.
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:, :8]
    dense = LaplaceLogisticRegression().fit(X, y)
    sparse = LaplaceLogisticRegression().fit(sp.csr_matrix(X), y)
    assert np.abs(sparse.sigma_ - dense.sigma_).max() < 1e-12  # (the same posterior)
    first, second = dense.loo(X, y, n_draws=1000), sparse.loo(X, y, n_draws=1000)
    # Round-off in the draws (~1e-14) moves each k̂ by about as little; 1e-6 is far below
    # the Monte Carlo difference of two samples (~0.1).
    np.testing.assert_allclose(second.pareto_k, first.pareto_k, atol=1e-6)
    assert second.elpd_loo == pytest.approx(first.elpd_loo, abs=1e-9)
