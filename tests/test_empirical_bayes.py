"""Prior scales by the evidence: EmpiricalBayesClassifier (one C, or ARD's per feature)."""

import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.datasets import load_iris, load_wine, make_classification
from sklearn.exceptions import DataConversionWarning
from sklearn.metrics import log_loss
from sklearn.preprocessing import StandardScaler
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


# Laplace inside, no refinement and two grid points: every check fits many times (the
# refinement's own evidence, and a maximum inside the grid, are tested below).
@parametrize_with_checks(
    [EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=2, refine=False)]
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
    # A column-vector y: scikit-learn's one DataConversionWarning, not one per fit.
    with pytest.warns(DataConversionWarning) as caught:
        column = clone(model).fit(X, y[:, None])
    assert len(caught) == 1
    assert column.C_ == model.C_


@pytest.mark.parametrize(
    "prior, field",
    [(vsbayes.LaplacePrior(1.0), "scale"), (vsbayes.HorseshoePrior(0.1), "global_scale")],
)
def test_a_shrinkage_priors_scale_maximizes_the_evidence(data, prior, field):
    X, y = data
    base = vsbayes.EPLogisticRegression(prior=prior)
    with warnings.catch_warnings():  # the grid's edge may win (a warning): not checked here
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = EmpiricalBayesClassifier(base, Cs=[0.03, 0.3, 3.0], refine=False).fit(X, y)
    # The grid moves the prior's scale (C is unused under prior=): the estimator's own
    # evidence on it, its maximum chosen, the final fit under that prior.
    assert getattr(model.prior_, field) == model.C_ == model.Cs_[np.argmax(model.log_evidence_)]
    assert model.estimator_.prior == model.prior_
    at_best = vsbayes.EPLogisticRegression(prior=model.prior_).fit(X, y)
    assert model.log_evidence_.max() == pytest.approx(
        at_best.log_marginal_likelihood_value_, abs=1e-9
    )
    assert len(set(np.round(model.log_evidence_, 6))) == 3  # the scale changes the fit


def test_the_l1_bracket_is_the_l1_priors(data):
    X, y = data
    base = vsbayes.LaplaceLogisticRegression(penalty="l1", l1_ratio=1.0)
    with pytest.warns(ConvergenceWarning, match="edge of Cs"):  # two Cs: one is the best
        model = EmpiricalBayesClassifier(base, Cs=[0.1, 1.0], refine=False).fit(X, y)
    for c, evidence in zip(model.Cs_, model.log_evidence_, strict=True):
        fit = vsbayes.LaplaceLogisticRegression(penalty="l1", l1_ratio=1.0, C=c).fit(X, y)
        assert evidence == pytest.approx(fit.log_marginal_likelihood_value_, abs=1e-9)


def test_ard_refuses_a_shrinkage_prior(data):
    X, y = data
    base = vsbayes.EPLogisticRegression(prior=vsbayes.LaplacePrior(1.0))
    with pytest.raises(ValueError, match="own prior must be None"):
        EmpiricalBayesClassifier(base, scales="ard").fit(X, y)


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
        # A Gaussian prior replaces C: no C to choose.
        ({"estimator": vsbayes.LaplaceLogisticRegression(prior=(np.zeros(3), 1.0))}, "no C"),
        # A flat prior ignores C; no iteration gives no evidence.
        ({"estimator": vsbayes.LaplaceLogisticRegression(penalty=None)}, "no C"),
        ({"estimator": vsbayes.LaplaceLogisticRegression(max_iter=0)}, "max_iter=0"),
    ],
)
def test_parameters_are_checked(data, params, message):
    X, y = data
    with pytest.raises((ValueError, TypeError), match=message):
        EmpiricalBayesClassifier(**params).fit(X, y)


# --- automatic relevance determination (scales="ard") -------------------------------------


@parametrize_with_checks(
    [
        EmpiricalBayesClassifier(
            vsbayes.LaplaceLogisticRegression(), Cs=2, refine=False, scales="ard", max_iter=2
        )
    ]
)
def test_sklearn_compatible_ard(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # tiny data, few ARD steps
        check(estimator)


@pytest.fixture(scope="module")
def sparse_truth():
    """40 features, 4 relevant: 300 rows to fit, 2000 to test."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2300, 40))
    coef = np.zeros(40)
    coef[[3, 11, 20, 31]] = [1.5, -1.2, 1.0, -0.8]
    y = (X @ coef + rng.logistic(size=2300) > 0).astype(int)
    return X[:300], y[:300], X[300:], y[300:], coef != 0


@pytest.fixture(scope="module")
def ard_fit(sparse_truth):
    X, y, *_ = sparse_truth
    model = EmpiricalBayesClassifier(vsbayes.EPLogisticRegression(), Cs=5, scales="ard")
    return model.fit(X, y)


def test_ard_recovers_the_relevant_features(sparse_truth, ard_fit):
    X, y, X_test, y_test, truth = sparse_truth
    support = ard_fit.get_support()
    # Every relevant feature (|z| ≥ 5 here), and at most one of the 36 irrelevant ones: a
    # noise feature stays when its |z| exceeds about 2.4 (π ≈ 5/42), 1.6 % of them.
    assert support[truth].all() and support[~truth].sum() <= 1
    assert ard_fit.n_features_selected_ == support.sum()
    assert set(ard_fit.get_support(indices=True)) >= {3, 11, 20, 31}
    assert ard_fit.transform(X).shape == (300, support.sum())
    assert np.all(ard_fit.relevance_[truth] > 0.99)
    np.testing.assert_array_equal(ard_fit.relevance_ > 0.5, support)
    # Pruned: no coefficient, no prior variance; kept: the estimator's posterior under ARD's.
    assert np.all(ard_fit.coef_[:, ~support] == 0)
    assert np.all(ard_fit.prior_variances_[~support] == 0)
    np.testing.assert_array_equal(ard_fit.coef_[:, support], ard_fit.estimator_.coef_)
    assert ard_fit.estimator_.n_features_in_ == support.sum()
    # Against one C for all 40 features, held out: the irrelevant ones only add noise.
    shared = EmpiricalBayesClassifier(vsbayes.EPLogisticRegression(), Cs=5, refine=False)
    shared.fit(X, y)
    assert log_loss(y_test, ard_fit.predict_proba(X_test)) < log_loss(
        y_test, shared.predict_proba(X_test)
    )


def test_ard_variances_are_the_evidence_fixed_point(sparse_truth, ard_fit):
    """At convergence each kept variance solves the evidence's stationarity condition
    1/α_j = m_j² + Σ_jj (the EM form of MacKay's fixed point) under the Laplace posterior
    with those variances, to ARD's tolerance."""
    X, y, *_ = sparse_truth
    kept = ard_fit.get_support()
    variances = ard_fit.prior_variances_[kept]
    k = kept.sum()
    prior = (np.zeros(k + 1), np.r_[variances, 1e6])
    laplace = vsbayes.LaplaceLogisticRegression(prior=prior).fit(X[:, kept], y)
    posterior = laplace.posteriors_[0]
    second_moment = np.asarray(posterior.mean)[:k] ** 2 + np.diag(posterior.cov)[:k]
    np.testing.assert_allclose(second_moment, variances, rtol=5e-3)


def test_ard_one_feature_maximizes_laplaces_evidence():
    """With one feature, ARD's variance is a shared C: the Laplace evidence's maximum over C,
    up to the fixed point's neglect of the likelihood curvature's change with the mode."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((400, 1))
    y = (0.7 * X[:, 0] + rng.logistic(size=400) > 0).astype(int)
    model = EmpiricalBayesClassifier(
        vsbayes.LaplaceLogisticRegression(), Cs=5, scales="ard", inclusion_prior=0.5
    ).fit(X, y)
    (variance,) = model.prior_variances_
    shared = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=5).fit(X, y)
    assert variance == pytest.approx(shared.C_, rel=0.05)


def test_an_ard_step_that_prunes_many_and_lowers_the_evidence_is_taken_back():
    """Each ARD step moves every feature to its optimum given the others' posterior as it
    was; on correlated, nearly separated data (wine, 3 classes, standardized) the first
    step pruned 12 of 13 features together and took the Laplace evidence from -34.3 to
    -210.9, for good (training accuracy 0.69). Such a step is taken back and its best
    change made alone (π = ½ at the first step: the objective is the evidence), so the
    evidence cannot fall there; ARD then keeps 3 features (training accuracy 0.93)."""
    X, y = load_wine(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    model = EmpiricalBayesClassifier(
        vsbayes.LaplaceLogisticRegression(), Cs=[1e3, 1e4], scales="ard"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the grid's edge (separation)
        model.fit(X, y)
    first, second = model.ard_log_evidence_[:2]
    assert second >= first - 1e-6
    assert model.n_features_selected_ > 1


def test_ard_summary_marks_the_pruned_rows(ard_fit):
    table = ard_fit.summary()
    assert list(table.columns[-2:]) == ["relevance", "selected"]
    assert table["selected"].tolist() == [*ard_fit.support_.tolist(), True]
    pruned = table.index[:-1][~ard_fit.support_]
    assert table.attrs["pruned"] == list(pruned)
    assert (table.loc[pruned, ["mean", "sd"]] == 0).all().all()
    assert table.loc[pruned, "P(sign)"].isna().all()
    assert np.isnan(table.loc["(intercept)", "relevance"])


def test_posterior_in_use_is_the_fitted_estimators(sparse_truth, ard_fit):
    """Intervals, draws, leave-one-out and the ArviZ export, as every estimator has them:
    the fitted estimator's on its columns (the kept ones under ARD), named as in X."""
    X, y, X_test, *_ = sparse_truth
    inner, kept = ard_fit.estimator_, ard_fit.support_
    for ours, theirs in zip(
        ard_fit.predict_proba_interval(X_test[:3], level=0.8),
        inner.predict_proba_interval(X_test[:3, kept], level=0.8),
        strict=True,
    ):
        np.testing.assert_array_equal(ours, theirs)
    draws = ard_fit.sample_proba(X_test[:3], 5, random_state=0)
    np.testing.assert_array_equal(draws, inner.sample_proba(X_test[:3, kept], 5, random_state=0))
    assert set(np.unique(ard_fit.sample_y(X_test[:3], 5, random_state=0))) <= {0, 1}
    # The coefficient draws in X's columns, as coef_: a pruned feature's are 0.
    coef, intercept = ard_fit.sample_coef(4, random_state=0)
    inner_coef, inner_intercept = inner.sample_coef(4, random_state=0)
    assert coef.shape == (4, *ard_fit.coef_.shape) and np.all(coef[:, :, ~kept] == 0)
    np.testing.assert_array_equal(coef[:, :, kept], inner_coef)
    np.testing.assert_array_equal(intercept, inner_intercept)
    loo = ard_fit.loo(X, y, refit_above=None)
    assert loo.method == "ep-cavity" and loo.pointwise.shape == (300,)
    with pytest.raises(ValueError, match="level"):
        ard_fit.predict_proba_interval(X_test[:3], level=1.0)
    pytest.importorskip("arviz_base")
    tree = ard_fit.to_inference_data(n_draws=10)
    names = tree["posterior"]["coef"].coords["feature"].values.tolist()
    assert names == [f"x{j}" for j in np.flatnonzero(kept)]


def test_ard_multiclass_shares_a_feature_across_classes():
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    rng = np.random.default_rng(0)
    X = np.hstack([X, rng.standard_normal((150, 16))])  # 16 noise features
    # Multinomial (the classes' coefficients correlated) and one-vs-rest (independent).
    for estimator in (vsbayes.LaplaceLogisticRegression(), vsbayes.EPProbitRegression()):
        model = EmpiricalBayesClassifier(estimator, Cs=5, scales="ard").fit(X, y)
        # The petal measurements, and at most 3 of the 16 noise features.
        assert model.support_[2:4].all() and model.support_[4:].sum() <= 3
        assert model.coef_.shape == (3, 20) and model.predict_proba(X).shape == (150, 3)
        assert len(model.summary()) == 3 * (20 + 1)
        if isinstance(estimator, vsbayes.LaplaceLogisticRegression):
            # The multinomial estimator is fitted under the chosen variances as prior=: its
            # leave-one-out takes them (it refused any prior= beyond two classes).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", vsbayes.exceptions.PSISWarning)
                loo = model.loo(X, y, n_draws=400, random_state=0)
            assert loo.method == "psis" and np.isfinite(loo.elpd_loo)


@pytest.mark.parametrize("scales", ["shared", "ard"])
def test_a_class_without_weight_is_left_out(scales):
    # As by the estimators (D-148): ARD's priors have one block per class of positive
    # weight (they had one per class of y, and the estimator's fit refused their size).
    rng = np.random.default_rng(0)
    X = rng.standard_normal((150, 3))
    y = np.digitize(X @ [1.0, -1.0, 0.5] + rng.logistic(size=150), [-1.0, 1.0])
    with pytest.warns(UserWarning, match=r"Class\(es\) \[0\] of y have no row"):
        model = EmpiricalBayesClassifier(scales=scales).fit(X, y, sample_weight=(y != 0) * 1.0)
    np.testing.assert_array_equal(model.classes_, [1, 2])
    assert model.predict_proba(X).shape == (150, 2)


def test_ard_on_sparse_input_matches_dense(sparse_truth, ard_fit):
    X, y, *_ = sparse_truth
    model = EmpiricalBayesClassifier(vsbayes.EPLogisticRegression(), Cs=5, scales="ard")
    model.fit(sp.csr_matrix(X), y)
    np.testing.assert_array_equal(model.support_, ard_fit.support_)
    np.testing.assert_allclose(model.prior_variances_, ard_fit.prior_variances_, rtol=1e-8)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"scales": "per-feature"}, "scales must be"),
        ({"scales": "ard", "inclusion_prior": 1.0}, "inclusion_prior must be"),
        ({"scales": "ard", "inclusion_prior": "bayes"}, "inclusion_prior must be"),
        ({"scales": "ard", "threshold_lambda": 0.0}, "threshold_lambda"),
        ({"scales": "ard", "max_iter": 0}, "max_iter"),
        (
            {
                "scales": "ard",
                "estimator": vsbayes.LaplaceLogisticRegression(prior=(np.zeros(5), np.ones(5))),
            },
            "prior must be None",
        ),
    ],
)
def test_ard_parameters_are_checked(data, params, message):
    X, y = data
    with pytest.raises((ValueError, TypeError), match=message):
        EmpiricalBayesClassifier(**params).fit(X, y)


def test_shared_scale_selects_every_feature(data):
    X, y = data
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), refine=False)
    model.fit(X, y)
    assert model.get_support().all() and model.n_features_selected_ == 4
    np.testing.assert_array_equal(model.prior_variances_, np.full(4, model.C_))
    assert model.summary()["selected"].all()


@pytest.mark.parametrize("n_classes", [1, 3])
def test_ard_step_maximizes_a_gaussian_evidence(n_classes):
    """For a Gaussian likelihood factor, where the evidence in α is exact, one ARD step
    recovers the factor from the posterior and returns the α that maximizes
    ½[K log α − log det(αI + S) + hᵀ(αI + S)⁻¹h] (a full K × K block S: the multinomial
    case) and the gain over α = ∞."""
    from types import SimpleNamespace

    from scipy.optimize import minimize_scalar

    from vsbayes.estimators.empirical_bayes import _data_factors, _evidence_optimum

    rng = np.random.default_rng(n_classes)
    k, n = n_classes, 4
    factors = rng.standard_normal((n, k, k + 2))
    S = np.einsum("jab,jcb->jac", factors, factors)  # (n, K, K), positive definite
    h = rng.standard_normal((n, k)) * np.array([3.0, 2.0, 0.1, 0.05])[:, None]
    alpha = np.full(n, 0.7)
    # The posterior under N(0, 1/α_j) in the multinomial layout [W.ravel()] (no intercept).
    index = np.arange(k)[None, :] * n + np.arange(n)[:, None]
    precision = np.zeros((k * n, k * n))
    natural = np.zeros(k * n)
    for j in range(n):
        precision[np.ix_(index[j], index[j])] = S[j] + alpha[j] * np.eye(k)
        natural[index[j]] = h[j]
    cov = np.linalg.inv(precision)
    posterior = SimpleNamespace(mean=cov @ natural, cov=cov, var=np.diag(cov).copy())
    if k == 1:
        fit = SimpleNamespace(posteriors_=[posterior], _is_multinomial=lambda: False)
    else:
        fit = SimpleNamespace(
            posteriors_=[posterior], _is_multinomial=lambda: True, classes_=np.arange(k)
        )
    optimum, gain = _evidence_optimum(*_data_factors(fit, alpha), alpha)

    def evidence(a, j):
        inverse = np.linalg.inv(a * np.eye(k) + S[j])
        return 0.5 * (
            k * np.log(a) - np.linalg.slogdet(a * np.eye(k) + S[j])[1] + h[j] @ inverse @ h[j]
        )

    for j in range(n):
        best = minimize_scalar(
            lambda t, j=j: -evidence(np.exp(t), j),
            bounds=(-25, 25),
            method="bounded",
            options={"xatol": 1e-10},
        )
        at_infinity = evidence(1e12, j)
        if -best.fun - at_infinity > 1e-6:  # an interior maximum
            assert optimum[j] == pytest.approx(np.exp(best.x), rel=1e-4)
            assert gain[j] == pytest.approx(-best.fun - at_infinity, rel=1e-6, abs=1e-9)
        else:  # the evidence is largest at α = ∞: the feature is out
            assert optimum[j] == np.inf and gain[j] == 0.0


# Its three Cs are few for a maximum inside them; the edge's warning is not what it tests.
@pytest.mark.filterwarnings("ignore:The evidence is largest at the edge")
def test_warns_when_the_compared_evidences_are_estimates(monkeypatch):
    """A structured posterior with estimated marginals has an estimated evidence (low by
    an error growing with C): choosing C among them warns and says so in a fitted
    attribute; the exact structures' evidences (here "dual") do not."""
    import vsbayes.approximations.structured_laplace as structured

    rng = np.random.default_rng(3)
    X = sp.random(60, 80, density=0.1, random_state=rng, format="csr")
    y = np.asarray(X @ rng.normal(0.0, 3.0, 80)).ravel() + rng.logistic(size=60) > 0
    eb = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=[0.1, 1.0, 10.0])
    with vsbayes.config_context(covariance="dual"), warnings.catch_warnings():
        warnings.simplefilter("error", vsbayes.exceptions.UnreliableFitWarning)
        assert not eb.fit(X, y).evidence_is_estimate_
    monkeypatch.setattr(structured, "EXACT_DIAGONAL_MAX_ROWS", 0)  # as over 4096 rows
    estimated = vsbayes.config_context(covariance="lowrank", covariance_rank=2)
    with estimated, pytest.warns(vsbayes.exceptions.UnreliableFitWarning, match="estimated log"):
        assert eb.fit(X, y).evidence_is_estimate_


@pytest.mark.parametrize("scales", ["shared", "ard"])
def test_a_wrong_width_is_told_by_the_estimator_called(data, scales):
    # The error names EmpiricalBayesClassifier (the class the user called) and both widths,
    # not the estimator inside it (one C: that estimator saw X as given).
    X, y = data
    model = EmpiricalBayesClassifier(
        vsbayes.LaplaceLogisticRegression(), Cs=2, refine=False, scales=scales
    ).fit(X, y)
    narrow = X[:, :3]
    calls = {
        "predict_proba": lambda: model.predict_proba(narrow),
        "predict": lambda: model.predict(narrow),
        "decision_function": lambda: model.decision_function(narrow),
        "predict_proba_interval": lambda: model.predict_proba_interval(narrow, n_draws=8),
        "sample_proba": lambda: model.sample_proba(narrow, n_draws=8),
        "sample_y": lambda: model.sample_y(narrow, n_draws=8),
        "loo": lambda: model.loo(narrow, y),
        "score": lambda: model.score(narrow, y),
        "to_inference_data": lambda: model.to_inference_data(narrow, y),
    }
    for name, call in calls.items():
        with pytest.raises(
            ValueError,
            match="X has 3 features, but EmpiricalBayesClassifier is expecting 4 features",
        ) as error:
            call()
        assert "LogisticRegression" not in str(error.value), name


@pytest.mark.parametrize(
    "estimator, named",
    [
        (vsbayes.EPLogisticRegression(penalty="l1"), "penalty='l1'"),
        (vsbayes.EPLogisticRegression(prior=vsbayes.LaplacePrior(scale=0.5)), "prior=LaplacePrior"),
    ],
)
def test_a_shrinkage_prior_on_dask_rows_is_refused_naming_what_was_set(estimator, named):
    # Each grid fit refused it naming its own prior: LaplacePrior(scale=0.0001), the first
    # grid value, which the user never wrote.
    import dask.array as da

    X, y = make_classification(60, 4, random_state=0)
    search = vsbayes.EmpiricalBayesClassifier(estimator)
    with pytest.raises(ValueError, match=re.escape(named)) as error:
        search.fit(da.from_array(X, chunks=30), da.from_array(y, chunks=30))
    assert "0.0001" not in str(error.value)


def test_evidence_at_the_upper_edge_on_separable_classes_is_warned_as_such():
    # Standardized wine is linearly separable: the Laplace evidence grows with C to the
    # grid's edge (+0.3 nats a step from C = 100 to 1e4), where the posterior's sds are ~70
    # and Laplace's predictions nearly uniform. "Widen Cs" would not find a maximum.
    X, y = load_wine(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    search = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), refine=False)
    with pytest.warns(ConvergenceWarning, match="the classes are linearly separable") as record:
        search.fit(X, y)
    assert search.Cs_[-1] == search.C_
    assert not any("Widen Cs" in str(w.message) for w in record)


@pytest.mark.parametrize("scales", ["shared", "ard"])
@pytest.mark.parametrize(
    "bad, message",
    [
        ("nan", "Input X contains NaN.\nEmpiricalBayesClassifier does not accept"),
        ("no rows", r"minimum of 1 is required by EmpiricalBayesClassifier"),
        ("text", "X must be numeric .*OneHotEncoder"),
        ("dates", "holds dates or times"),
        ("missing label", "y has 1 missing label"),
        ("continuous labels", "Unknown label type: continuous"),
        ("one class", "at least 2 classes"),
    ],
)
def test_bad_training_data_is_told_by_the_estimator_called(data, scales, bad, message):
    # Checked before the grid: the error named the grid's LaplaceLogisticRegression (one
    # C), or lacked the estimators' remedy (ARD's own check of text); with one C the
    # last four were "its fit at 0.0001 failed: ..." (dates: numpy's DTypePromotionError,
    # a missing label: "Input y contains NaN") (D-264).
    X, y = data
    y = {"missing label": np.where(np.arange(len(y)) == 3, None, y).astype(object),
         "continuous labels": y + X[:, 0] / 10, "one class": 0 * y}.get(bad, y)  # fmt: skip
    X = {"nan": np.where(np.eye(*X.shape, dtype=bool), np.nan, X), "no rows": X[:0],
         "text": np.full(X.shape, "a"),
         "dates": X.astype("datetime64[s]")}.get(bad, X)  # fmt: skip
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=2, scales=scales)
    with pytest.raises(ValueError, match=message) as error:
        model.fit(X, y[: len(X)])
    assert "LaplaceLogisticRegression" not in str(error.value)
    assert "evidence search" not in str(error.value)


def test_prediction_input_is_told_once_by_the_estimator_called(data):
    # One C: X is checked here, then passed as given to estimator_, whose NaN error named
    # it, and whose feature-names warning repeated this class's naming it (D-264).
    pd = pytest.importorskip("pandas")
    X, y = data
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=2, refine=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # (the evidence at Cs' edge)
        model.fit(pd.DataFrame(X, columns=list("abcd")), y)
    calls = {
        "predict_proba": lambda X: model.predict_proba(X),
        "predict_proba_interval": lambda X: model.predict_proba_interval(X[:3]),
        "sample_y": lambda X: model.sample_y(X[:3], n_draws=4),
        "loo": lambda X: model.loo(X, y, n_draws=100),
        "to_inference_data": lambda X: model.to_inference_data(X, y, n_draws=4),
    }
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call(X)
        names = [str(w.message) for w in caught if "feature names" in str(w.message)]
        assert len(names) == 1 and "EmpiricalBayesClassifier" in names[0], (name, names)
    with pytest.raises(ValueError, match=r"NaN\.\nEmpiricalBayesClassifier does not accept"):
        model.predict(pd.DataFrame(np.where(np.eye(*X.shape), np.nan, X), columns=list("abcd")))


def test_ard_coefficients_keep_the_float32_of_x(sparse_truth):
    # The pruned features' zeros are of the fitted coefficients' dtype, as
    # LogisticRegression's coef_ is float32 for float32 X.
    X, y, *_ = sparse_truth
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=2, scales="ard")
    model.fit(X[:, :12].astype(np.float32), y)
    assert not model.support_.all()  # (features were pruned: the zeros were filled in)
    assert model.coef_.dtype == np.float32


def test_a_refit_without_feature_names_forgets_the_earlier_ones(data):
    # Fitted on a DataFrame, then on an array: feature_names_in_ had stayed, and predict on
    # arrays warned that X has no valid feature names.
    pd = pytest.importorskip("pandas")
    X, y = data
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=2, refine=False)
    model.fit(pd.DataFrame(X, columns=list("abcd")), y).fit(X, y)
    assert not hasattr(model, "feature_names_in_")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.predict(X)


@pytest.mark.parametrize("scales", ["shared", "ard"])
def test_posterior_reads_name_the_estimator_called(data, scales):
    # loo and to_inference_data delegate to estimator_, whose checks named it ("not the
    # data LaplaceLogisticRegression was fitted on"): the user fitted this class.
    X, y = data
    weights = np.linspace(0.5, 2.0, len(y))
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=3, scales=scales)
    model.fit(X, y, sample_weight=weights)
    for read in (model.loo, lambda X, y: model.to_inference_data(X, y, n_draws=10)):
        with pytest.raises(ValueError, match="not the data EmpiricalBayesClassifier was") as e:
            read(X, y)  # (without the fit's weights)
        assert "LaplaceLogisticRegression" not in str(e.value)
    assert np.isfinite(model.loo(X, y, weights).elpd_loo)  # (the fit's data: scored)


def test_one_vs_rest_loo_names_the_estimator_called():
    X, y = make_classification(n_samples=60, n_classes=3, n_informative=3, random_state=0)
    model = EmpiricalBayesClassifier(vsbayes.LaplaceProbitRegression(), Cs=3).fit(X, y)
    with pytest.raises(ValueError, match="EmpiricalBayesClassifier fitted one binary posterior"):
        model.loo(X, y)


def _wide_sparse_truth():
    """120 rows × 400 sparse features, 4 of them dense and relevant: more features than
    rows, as text is."""
    rng = np.random.default_rng(0)
    X = sp.random(120, 400, density=0.05, random_state=rng, format="lil")
    X[:, :4] = rng.standard_normal((120, 4))
    X = sp.csr_matrix(X)
    coef = np.zeros(400)
    coef[:4] = [2.0, -2.0, 1.5, -1.5]
    y = (rng.random(120) < 1.0 / (1.0 + np.exp(-(X @ coef)))).astype(int)
    return X, y


def test_ard_reads_a_structured_posteriors_marginal_variances_only():
    # Under a memory limit below the dense 401 × 401 covariance (a stand-in for text
    # scale), ARD's Laplace fits take the structured covariance (exact marginals, M ≤
    # 4096), and its steps read their marginal variances (it densified the covariance,
    # 6.2 GiB at 5000 × 20,000; here beyond the limit: MemoryLimitError). Same steps as
    # the dense fits, to round-off: the marginal variances are exact.
    X, y = _wide_sparse_truth()
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=3, scales="ard")
    dense = clone(model).fit(X, y)
    # 1 MB: room for the "lowrank" structure (0.7 MB), none for the dense covariance
    # (1.3 MB).
    with vsbayes.config_context(memory_limit=1e6):
        probe = vsbayes.LaplaceLogisticRegression(prior=(np.zeros(401), np.ones(401)))
        assert probe.fit(X, y).covariance_structure_ != "dense"
        structured = clone(model).fit(X, y)
    np.testing.assert_array_equal(structured.support_, dense.support_)
    assert set(np.flatnonzero(dense.support_)) >= {0, 1, 2, 3}
    # Round-off of the evidence's terms (~1e-13 relative), grown by ARD's few steps.
    np.testing.assert_allclose(structured.prior_variances_, dense.prior_variances_, rtol=1e-8)
    np.testing.assert_allclose(structured.ard_log_evidence_, dense.ard_log_evidence_, rtol=1e-10)
    assert not structured.evidence_is_estimate_


@pytest.mark.filterwarnings("ignore:The evidence is largest at the edge")
@pytest.mark.filterwarnings("ignore:C_ = .* was chosen among estimated")
def test_ard_on_estimated_marginal_variances_warns(monkeypatch):
    # Over 4096 rows the structured covariance's marginal variances are estimated: ARD's
    # steps then rest on them, and say so.
    import vsbayes.approximations.structured_laplace as structured

    X, y = _wide_sparse_truth()
    monkeypatch.setattr(structured, "EXACT_DIAGONAL_MAX_ROWS", 0)  # as over 4096 rows
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=3, scales="ard")
    estimated = vsbayes.config_context(covariance="lowrank", covariance_rank=2)
    with estimated, pytest.warns(vsbayes.exceptions.UnreliableFitWarning, match="ARD's per-"):
        assert model.fit(X, y).evidence_is_estimate_


def test_multinomial_ard_beyond_the_dense_posterior_is_refused_before_the_search(monkeypatch):
    # ARD's prior on the multinomial posterior keeps its dense covariance: a problem whose
    # first ARD step cannot be fitted is refused before the grid's fits (which took
    # minutes at 5000 × 20,000 with 5 classes before the refusal), naming ARD and the
    # most features that fit.

    def no_grid(*args, **kwargs):
        raise AssertionError("the grid was fitted")

    X, y = load_iris(return_X_y=True)
    X = np.hstack([X, np.random.default_rng(0).standard_normal((150, 3400))])
    model = EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression(), Cs=3, scales="ard")
    monkeypatch.setattr(vsbayes.LaplaceLogisticRegression, "fit", no_grid)
    with pytest.raises(ValueError, match=r"scales='ard' on 3 classes .* at most 3332 features"):
        model.fit(X, y)
    # Within the size, it fits (3 classes × 11 parameters).
    monkeypatch.undo()
    with pytest.warns(ConvergenceWarning, match="edge of Cs"):  # (iris's classes separate)
        model.fit(X[:, :10], y)
    assert model.coef_.shape == (3, 10)


def test_a_refused_grid_fit_names_the_search(monkeypatch):
    # The grid's fits refuse a shrinkage prior beyond the dense size before any work; the
    # refusal names the estimator and the scale the grid tried, which the user never
    # wrote: the error says whose search it is (and keeps the cause's type and text).
    from vsbayes.approximations import _glm_gaussian

    monkeypatch.setattr(_glm_gaussian, "MAX_DENSE_PARAMS", 40)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 40))
    y = (X[:, 0] > 0).astype(int)
    base = vsbayes.LaplaceLogisticRegression(penalty="l1", l1_ratio=1.0)
    with pytest.raises(ValueError, match=r"^EmpiricalBayesClassifier's evidence search .*41 co"):
        EmpiricalBayesClassifier(base, Cs=3).fit(X, y)
