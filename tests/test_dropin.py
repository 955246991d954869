"""LogisticRegression's conventions beyond the scikit-learn estimator checks."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import ALL, assert_valid_fit, make
from sklearn.datasets import load_iris, make_classification
from sklearn.preprocessing import StandardScaler

from vsbayes import EPLogisticRegression, LaplaceLogisticRegression, VSLogisticRegression
from vsbayes.exceptions import (
    ConvergenceWarning,
    NotPositiveDefiniteError,
    PSISWarning,
    UnreliableFitWarning,
)


@pytest.fixture(scope="module")
def binary():
    X, y = make_classification(120, 5, random_state=0)
    return StandardScaler().fit_transform(X), y


@pytest.mark.parametrize("Estimator", [LaplaceLogisticRegression, VSLogisticRegression])
def test_sparsify_densify_round_trip(Estimator, binary):
    X, y = binary
    est = Estimator(random_state=0).fit(X, y)
    dense_coef, proba = est.coef_.copy(), est.predict_proba(X)
    table, (lower, _) = est.summary(), est.predict_proba_interval(X[:3])
    warnings.simplefilter("ignore", PSISWarning)  # (Laplace's k̂ here; pytest restores)
    elpd = est.loo(X, y, n_draws=200).elpd_loo
    assert est.sparsify() is est and sp.issparse(est.coef_)
    np.testing.assert_array_equal(est.coef_.toarray(), dense_coef)
    np.testing.assert_array_equal(est.predict_proba(X), proba)
    # The posterior's summaries read a sparsified coef_ as the dense one.
    np.testing.assert_array_equal(est.summary()["mean"], table["mean"])
    np.testing.assert_array_equal(est.predict_proba_interval(X[:3])[0], lower)
    assert est.loo(X, y, n_draws=200).elpd_loo == elpd
    assert est.densify() is est and isinstance(est.coef_, np.ndarray)
    np.testing.assert_array_equal(est.coef_, dense_coef)


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def test_predict_proba_lr_is_linear_classifiers_formula(binary, iris):
    # LinearClassifierMixin's private one-vs-rest normalization, which code written for
    # LogisticRegression calls: the same formula on this estimator's decision_function.
    from sklearn.linear_model._base import LinearClassifierMixin

    X, y = iris
    est = LaplaceLogisticRegression().fit(X, y)
    expected = LinearClassifierMixin._predict_proba_lr(est, X)
    np.testing.assert_allclose(est._predict_proba_lr(X), expected, rtol=1e-12)
    # Two classes: the decision function is the predictive's logit.
    X, y = binary
    est = LaplaceLogisticRegression().fit(X, y)
    np.testing.assert_allclose(est._predict_proba_lr(X), est.predict_proba(X), rtol=1e-12)
    # Scores beyond exp's range (a confident fit far from the data) give no overflow
    # warning; a row whose every logistic is 0 is uniform, as there.
    extreme = np.array([[-1e3, -800.0, -900.0], [1e3, 0.0, -1e3]])
    est.decision_function = lambda X: extreme
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proba = est._predict_proba_lr(X[:2])
    np.testing.assert_allclose(proba, [[1 / 3, 1 / 3, 1 / 3], [2 / 3, 1 / 3, 0.0]], rtol=1e-12)


@pytest.mark.parametrize("data", ["binary", "iris"])
def test_rows_beyond_float64_are_refused_not_halved(data, request):
    # Features ~1e155 overflow the latent variance: a binary predictive of an infinite
    # variance was 1/2 for every such row, silently (with NumPy's overflow warnings).
    X, y = request.getfixturevalue(data)
    model = LaplaceLogisticRegression().fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"overflow float64.*Rescale X"):
            model.predict_proba(X[:3] * 1e155)
        # Fitted on them, refused at once (the routes failed on their own internals).
        with pytest.raises(ValueError, match=r"squares overflow float64.*Rescale X"):
            LaplaceLogisticRegression().fit(X * 1e155, y)


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
    # A column on a scale 10⁻⁸ of the others is no zero one: the flat prior's posterior is
    # proper, and the fit is the unscaled one's, reparametrized.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3))
    y = (X @ [1.0, -1.0, 0.5] + rng.logistic(size=60) > 0).astype(int)
    scale = np.array([1e-8, 1.0, 1.0])
    unscaled = LaplaceLogisticRegression(penalty=None).fit(X, y)
    scaled = LaplaceLogisticRegression(penalty=None).fit(X * scale, y)
    np.testing.assert_allclose(scaled.coef_ * scale, unscaled.coef_, rtol=1e-8)


def test_float32_in_float32_out(binary):
    X, y = binary
    est = VSLogisticRegression().fit(X.astype(np.float32), y)
    assert est.coef_.dtype == est.intercept_.dtype == np.float32
    assert est.predict_proba(X[:3].astype(np.float32)).dtype == np.float32
    # A float64 X promotes, as LogisticRegression's X @ coef_.T does.
    for read in (est.predict_proba, est.decision_function, est.predict_log_proba):
        assert read(X[:3]).dtype == np.float64
    assert est.sample_proba(X[:3], n_draws=2).dtype == np.float64
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
    # A refit whose problem has another shape (more classes: the joint multinomial, as
    # one binary problem before; fewer features; no intercept) starts cold, as a new fit.
    for X_next, y_next, fit_intercept in [
        (X, np.arange(len(y)) % 3, True),
        (X, y, True),
        (X[:, :3], y, True),
        (X, y, False),
    ]:
        warm.set_params(fit_intercept=fit_intercept).fit(X_next, y_next)
        cold = LaplaceLogisticRegression(fit_intercept=fit_intercept).fit(X_next, y_next)
        np.testing.assert_allclose(warm.coef_, cold.coef_, atol=1e-6)


def test_clone_keeps_a_fitted_prior(binary):
    # An earlier fit as prior= is data: cross-validation's clones must keep it fitted.
    from sklearn.base import clone
    from sklearn.model_selection import cross_val_score

    X, y = binary
    earlier = LaplaceLogisticRegression().fit(X[:60], y[:60])
    est = LaplaceLogisticRegression(prior=earlier, C=2.0)
    twin = clone(est)
    assert twin.prior is earlier and twin.C == 2.0 and not hasattr(twin, "coef_")
    assert np.all(np.isfinite(cross_val_score(est, X[60:], y[60:], cv=2)))
    # An unfitted estimator as prior is a parameter like any other: cloned.
    assert clone(LaplaceLogisticRegression(prior=LaplaceLogisticRegression())).prior is not None


def test_a_fitted_prior_in_a_search_grid(binary):
    # GridSearchCV clones its grid's values, which unfits a fitted prior: the error says
    # so and names FrozenEstimator, whose clone stays fitted (D-263). It told the user,
    # who had fitted it, to fit it.
    from sklearn.frozen import FrozenEstimator
    from sklearn.model_selection import GridSearchCV

    X, y = binary
    earlier = LaplaceLogisticRegression().fit(X[:60], y[:60])
    search = GridSearchCV(LaplaceLogisticRegression(), {"prior": [earlier]}, cv=2)
    with pytest.raises(ValueError, match=r"(?s)cloned there.*FrozenEstimator\(fitted\)"):
        search.set_params(error_score="raise").fit(X[60:], y[60:])
    search.set_params(param_grid={"prior": [None, FrozenEstimator(earlier)]}).fit(X[60:], y[60:])
    direct = LaplaceLogisticRegression(prior=earlier).fit(X[60:], y[60:])
    frozen = search.cv_results_["params"][1]["prior"]
    refit = LaplaceLogisticRegression(prior=frozen).fit(X[60:], y[60:])
    np.testing.assert_array_equal(refit.coef_, direct.coef_)


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
            if route == "dual":  # the likelier cause, not collinearity, is named
                assert "rows cannot span" in str(error), error
            continue
        assert_valid_fit(est, X)


class _Recorder:
    """A scikit-learn callback (``sklearn.callback.FitCallback``) recording each hook's
    task and fitted estimator."""

    def __init__(self):
        self.record = []

    def setup(self, estimator, context):
        self.record.append(("setup", context, None))

    def on_fit_task_begin(self, estimator, context, *, fitted_estimator=None):
        self.record.append(("begin", context, fitted_estimator))

    def on_fit_task_end(self, estimator, context, *, X=None, fitted_estimator=None):
        self.record.append(("end", context, fitted_estimator))

    def teardown(self, estimator, context):
        self.record.append(("teardown", context, None))

    def tasks(self, hook):
        return [(c.task_name, f) for h, c, f in self.record if h == hook]


@pytest.fixture(scope="module")
def observed_sites_fit(binary):
    pytest.importorskip("sklearn.callback")  # scikit-learn >= 1.9
    recorder = _Recorder()
    est = VSLogisticRegression(strategy="sites").set_callbacks(recorder).fit(*binary)
    return est, recorder


def test_callbacks_see_the_fit_its_stages_and_their_iterations(observed_sites_fit):
    est, recorder = observed_sites_fit
    hooks = [h for h, _, _ in recorder.record]
    assert hooks[0] == "setup" and hooks[-1] == "teardown" and hooks.count("setup") == 1
    begun, ended = recorder.tasks("begin"), recorder.tasks("end")
    assert sorted(n for n, _ in begun) == sorted(n for n, _ in ended)
    names = [n for n, _ in begun]
    assert names[:2] == ["fit", "Newton's method for the mode"]
    assert names.count("EP sweep") == est.n_iter_[0]  # the site-fit route's iterations
    root = recorder.record[0][1]
    assert [c.task_name for c in root._children_map.values()] == [
        "Newton's method for the mode",
        "expectation propagation",
    ]
    # The root's end: the estimator as fitted; a stage's end: its result; EP's sweeps: the
    # posterior of their sites (the evidence of sites between sweeps is not computed).
    fitted = ended[-1][1]
    np.testing.assert_array_equal(fitted.coef_, est.coef_)
    last_sweep = [f for n, f in ended if n == "EP sweep"][-1]
    np.testing.assert_allclose(last_sweep.coef_, est.coef_, rtol=1e-10)
    assert np.isnan(last_sweep.log_marginal_likelihood_value_)
    # No state of the callbacks is left on the estimator.
    assert not [name for name in vars(est) if "callback_" in name]


def test_a_newton_iteration_ends_at_the_max_iter_fit(binary):
    pytest.importorskip("sklearn.callback")
    X, y = binary
    recorder = _Recorder()
    est = LaplaceLogisticRegression().set_callbacks(recorder).fit(X, y)
    ends = [f for n, f in recorder.tasks("end") if n == "newton iteration"]
    assert len(ends) == est.n_iter_[0]
    for i in (0, len(ends) - 1):  # an unconverged iterate, and the mode
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            stopped = LaplaceLogisticRegression(max_iter=i + 1).fit(X, y)
        np.testing.assert_array_equal(ends[i].coef_, stopped.coef_)
        np.testing.assert_array_equal(ends[i].sigma_, stopped.sigma_)
        np.testing.assert_array_equal(ends[i].predict_proba(X), stopped.predict_proba(X))


def test_one_vs_rest_problems_are_tasks_the_later_ones_at_their_prior(iris):
    pytest.importorskip("sklearn.callback")
    from vsbayes import LaplaceProbitRegression

    X, y = iris
    recorder = _Recorder()
    est = LaplaceProbitRegression().set_callbacks(recorder).fit(X, y)
    problems = [f for n, f in recorder.tasks("end") if n.startswith("one-vs-rest problem")]
    assert len(problems) == 3
    first = problems[0]
    np.testing.assert_array_equal(first.coef_[0], est.coef_[0])
    np.testing.assert_array_equal(first.coef_[1:], 0.0)  # the prior's mean
    np.testing.assert_array_equal(problems[-1].coef_, est.coef_)


def test_a_multinomial_global_fit_reports_its_rounds_as_coefficients(iris):
    # The global VS fit samples the class contrasts; its rounds' states reached the
    # callbacks in those coordinates, and building their fitted estimator raised ("cannot
    # reshape array of size 10 into shape (3,4,newaxis)") inside fit: the states are
    # lifted to the coefficients as the fit's own result is.
    pytest.importorskip("sklearn.callback")
    X, y = iris
    recorder = _Recorder()
    est = VSLogisticRegression(strategy="global", random_state=0)
    est.set_callbacks(recorder).fit(X, y)
    rounds = [f for n, f in recorder.tasks("end") if n == "round" and f is not None]
    assert rounds
    for fitted in rounds:
        assert fitted.coef_.shape == est.coef_.shape
        assert fitted.predict_proba(X[:5]).shape == (5, 3)
    # The last round's state is the fit itself, lifted the same way.
    np.testing.assert_allclose(rounds[-1].coef_, est.coef_, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dask", [False, True])
def test_balanced_class_weights_weigh_the_sample_weights(dask):
    # scikit-learn's "balanced" weights with sample weights are W / (K · W_k), W_k the
    # class's total sample weight (LogisticRegression's since scikit-learn 1.7); the row
    # counts had given LaplaceLogisticRegression an intercept of 0.84 against
    # LogisticRegression's 0.028 on the mode of the same objective.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 3))
    y = np.digitize(X @ [1.0, -0.5, 0.3] + rng.logistic(size=90), [-0.5, 1.5])  # 3 classes
    weights = rng.uniform(0.1, 3.0, len(y)) * np.where(y == 1, 4.0, 1.0)
    totals = np.bincount(y, weights)
    balanced = totals.sum() / (3 * totals)
    expected = LaplaceLogisticRegression().fit(X, y, sample_weight=weights * balanced[y])
    if dask:
        da = pytest.importorskip("dask.array")
        X, y, weights = (da.from_array(a, chunks=30) for a in (X, y, weights))
    est = LaplaceLogisticRegression(class_weight="balanced").fit(X, y, sample_weight=weights)
    # The same weights up to the product's round-off: the same Newton iterates.
    np.testing.assert_allclose(est.coef_, expected.coef_, rtol=1e-9)
    np.testing.assert_allclose(est.intercept_, expected.intercept_, rtol=1e-9, atol=1e-12)
    if not dask:  # leave-one-out weighs the rows as the fit did (it checks they match)
        warnings.simplefilter("ignore", PSISWarning)  # (pytest restores)
        assert np.isfinite(est.loo(X, y, sample_weight=weights, n_draws=200).elpd_loo)


@pytest.mark.parametrize("class_weight", ["auto", [1.0, 2.0]])
def test_a_wrong_class_weight_is_told_by_the_estimator(class_weight, binary):
    # scikit-learn's compute_class_weight had named itself ("The 'class_weight' parameter
    # of compute_class_weight"), a function the user did not call.
    X, y = binary
    with pytest.raises(ValueError, match=r"^class_weight must be a dict, 'balanced' or None"):
        LaplaceLogisticRegression(class_weight=class_weight).fit(X, y)


@pytest.mark.parametrize("dask", [False, True])
def test_a_negative_sample_weight_is_refused_with_the_remedy(dask, binary):
    # LogisticRegression takes negative weights; a posterior cannot (the likelihood's
    # reciprocal): refused, with scikit-learn's opening words, the reason and what to do.
    X, y = binary
    weights = np.ones(len(y))
    weights[3] = -0.5
    if dask:
        da = pytest.importorskip("dask.array")
        X, y, weights = (da.from_array(a, chunks=60) for a in (X, y, weights))
    message = r"^Negative values in data passed to sample_weight: .* weight >= 0"
    with pytest.raises(ValueError, match=message):
        LaplaceLogisticRegression().fit(X, y, sample_weight=weights)


def test_a_fallback_on_separated_classes_names_them():
    # EP's sweeps stall at C = 1e8 on these three separated classes (EP converges on
    # others alike: which fits fall back depends on the draws — of seeds 0-5, 0-2 fell back
    # before the site fits' start from the kernel's Newton step, 1 and 2 after it, D-213;
    # of seeds 0-7, 2 and 6 since the early sweeps' fits stop at a hundredth of their
    # change, D-262); the fallback's warning names the cause and a remedy, where VS's had
    # advised more samples.
    rng = np.random.default_rng(2)
    X = rng.standard_normal((60, 3))
    rng.standard_normal(60)  # (a draw of the data this was found on)
    y = np.digitize(X[:, 0] + 0.5 * rng.standard_normal(60), [-0.5, 0.5])
    X[:, 0] += 5 * y
    message = "Falling back(?s:.)*linearly separable.*smaller C"
    with pytest.warns(UnreliableFitWarning, match=message):
        est = EPLogisticRegression(C=1e8).fit(X, y)
    assert est.laplace_fallback_.all()


def test_a_fallback_under_huge_weights_says_the_likelihood_holds_the_posterior():
    """Weights 1e8 at C = 1: the mode is C = 1e8's and separates breast cancer's classes,
    but the posterior is 1e8 times narrower than that prior-limited one and nearly Gaussian
    (the skewness expansion in range); EP's sweeps stall on the arithmetic (D-229). The
    fallback's warning says so, not that the prior limits a one-sided posterior."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    message = "Falling back(?s:.)*the likelihood under sample weights up to 1e\\+08, not the prior"
    with pytest.warns(UnreliableFitWarning, match=message) as record:
        est = EPLogisticRegression().fit(X, y, sample_weight=np.full(len(y), 1e8))
    assert est.laplace_fallback_.all()
    assert not any("linearly separable" in str(w.message) for w in record)
