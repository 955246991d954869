"""Bad inputs, degenerate data, sampling trouble and numerical extremes.

Every case ends in one of two ways: a ValueError (or subclass) whose message names what was
wrong, or a valid fit (``assert_valid_fit``) with at most the documented warnings —
:class:`~vsbayes.exceptions.UnreliableFitWarning` and
:class:`~sklearn.exceptions.ConvergenceWarning`, each with its remedy.
"""

import threading
import warnings

import numpy as np
import pandas as pd
import pytest
from _helpers import ALL, SAMPLING, assert_valid_fit, make
from sklearn.datasets import load_breast_cancer, load_iris, make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

import vsbayes
from vsbayes.engine._agreement import check_mean_against_is, check_mean_within_fit
from vsbayes.engine.families import FullFamily
from vsbayes.engine.variational_sampling import UNRELIABLE_KL
from vsbayes.exceptions import (
    DegenerateEstimateError,
    EstimationError,
    NotPositiveDefiniteError,
    UnknownErrorWarning,
    UnreliableFitWarning,
)

DOCUMENTED_WARNINGS = (UnreliableFitWarning, ConvergenceWarning)
# EP-logistic integrates every site numerically; it is exercised where it is fast.
QUICK = [cls for cls in ALL if cls is not vsbayes.EPLogisticRegression]


def fit_checked(estimator, X, y, sample_weight=None, allowed=DOCUMENTED_WARNINGS):
    """Fit, check the result is valid and return the warnings it emitted (all of them
    instances of ``allowed``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X, y, sample_weight=sample_weight)
    unexpected = [w for w in caught if not issubclass(w.category, allowed)]
    assert not unexpected, [str(w.message) for w in unexpected]
    assert_valid_fit(estimator, X)
    return [w.message for w in caught]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    y = (X @ [1.0, -1.0, 0.5, 0.0] + rng.logistic(size=60) > 0).astype(int)
    return X, y


@pytest.fixture(scope="module")
def separable():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    return X, (X[:, 0] > 0).astype(int)


# --- invalid input: a ValueError that says what was wrong -------------------------------


def _with(X, index, value):
    X = X.astype(object if isinstance(value, str) else float)
    X[index] = value
    return X


def _dates(n):
    return np.datetime64("2020-01-01") + np.arange(n).astype("timedelta64[D]")


def _periods(n):
    return pd.period_range("2020-01-01", periods=n, freq="D")


def _frame(X):
    return pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])])


def _with_na(y):
    labels = pd.Series(np.where(y == 1, "yes", "no"), dtype="string")
    labels[2] = pd.NA
    return labels


def _text_with_nan(y):
    return _with_na(y).to_numpy(object, na_value=np.nan)


INVALID = {
    "NaN in X": (lambda X, y: (_with(X, (3, 1), np.nan), y, None), "NaN"),
    "inf in X": (lambda X, y: (_with(X, (3, 1), np.inf), y, None), "infinity"),
    "NaN in y": (lambda X, y: (X, _with(y, 2, np.nan), None), "NaN"),
    "one class": (lambda X, y: (X, np.ones_like(y), None), "class"),
    "empty X": (lambda X, y: (X[:0], y[:0], None), "0 sample"),
    "mismatched lengths": (lambda X, y: (X, y[:-1], None), "inconsistent numbers of samples"),
    "text in X": (lambda X, y: (_with(X, (0, 0), "a"), y, None), "numeric"),
    # A datetime64 array became nanosecond counts (~1e18), a meaningless fit; a DataFrame's
    # datetime column raised numpy's DTypePromotionError.
    "dates in X": (lambda X, y: (_dates(len(y))[:, None], y, None), "X holds dates"),
    "a date column": (lambda X, y: (_frame(X).assign(t=_dates(len(y))), y, None), "'t' of X"),
    # A column of pandas periods: "TypeError: float() argument must be ... not 'Period'".
    "a period column": (lambda X, y: (_frame(X).assign(t=_periods(len(y))), y, None), "'t' of X"),
    # scikit-learn's check of a nullable pandas y with pd.NA raised "TypeError: boolean
    # value of NA is ambiguous".
    "NA in a pandas y": (lambda X, y: (X, _with_na(y), None), "1 missing label .*drop those"),
    # Text labels with a None: "'<' not supported between instances of 'NoneType' and 'str'".
    "None in y": (lambda X, y: (X, _with_na(y).to_numpy(object, na_value=None), None), "1 missing"),
    # Text labels with a NaN (pandas' missing text once in numpy): "Input contains NaN".
    "NaN in text y": (lambda X, y: (X, _text_with_nan(y), None), "1 missing"),
    "negative weight": (lambda X, y: (X, y, np.r_[-1.0, np.ones(len(y) - 1)]), "weight"),
    "all-zero weights": (lambda X, y: (X, y, np.zeros(len(y))), "weight"),
    "one class left by zero weights": (lambda X, y: (X, y, (y == 1) * 1.0), r"class.*weight"),
    "weights of the wrong length": (lambda X, y: (X, y, np.ones(len(y) + 1)), "sample_weight"),
}


@pytest.mark.parametrize("case", INVALID)
@pytest.mark.parametrize("cls", ALL)
def test_invalid_input_raises_a_value_error_naming_it(cls, case, data):
    make_input, match = INVALID[case]
    X, y, weights = make_input(*data)
    with pytest.raises(ValueError, match=match):
        make(cls).fit(X, y, sample_weight=weights)


@pytest.mark.parametrize("cls", QUICK)
def test_a_class_without_weight_is_a_class_absent(cls, data):
    """A class of y whose rows all have zero weight (a bagging bootstrap that drew none of
    them, class_weight 0) is one the data do not have, as its rows would be absent: it
    was fitted, with the intercept's vague prior, as that prior's tail, a wide Gaussian
    whose predictive gave it ~0.5 on every row, silently (D-148)."""
    X, y = data
    y = np.where(X[:, 2] > 0.8, 2, y)  # three classes
    absent = make(cls).fit(X[y != 2], y[y != 2])
    for weights, params in [((y != 2) * 1.0, {}), (None, {"class_weight": {0: 1, 1: 1, 2: 0}})]:
        with pytest.warns(UserWarning, match=r"Class\(es\) \[2\] of y have no row"):
            estimator = make(cls, **params).fit(X, y, sample_weight=weights)
        np.testing.assert_array_equal(estimator.classes_, [0, 1])
        # The same rows of positive weight: the same fit, to the sums' round-off.
        np.testing.assert_allclose(
            estimator.predict_proba(X), absent.predict_proba(X), rtol=1e-9, atol=1e-12
        )


def test_bagging_with_classes_missing_from_a_bootstrap():
    # scikit-learn's own degenerate case (test_bagging.py::test_probability): five rows
    # drawn, as sample weights, cannot hold iris's three classes.
    from sklearn.datasets import load_iris
    from sklearn.ensemble import BaggingClassifier

    X, y = load_iris(return_X_y=True)
    with pytest.warns(UserWarning, match=r"of y have no row of positive weight"):
        bagging = BaggingClassifier(
            vsbayes.LaplaceLogisticRegression(), max_samples=5, n_estimators=4, random_state=0
        ).fit(X, y)
    assert any(len(member.classes_) < 3 for member in bagging.estimators_)
    proba = bagging.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("cls", ALL)
def test_wrong_number_of_features_at_predict(cls, data):
    X, y = data
    estimator = make(cls).fit(X[:, :3], y)
    for method in ("predict", "predict_proba", "decision_function"):
        with pytest.raises(ValueError, match="features"):
            getattr(estimator, method)(X)


# --- degenerate data: a valid posterior --------------------------------------------------


@pytest.mark.parametrize("cls", ALL)
def test_separable_classes_with_a_moderate_prior(cls, separable):
    X, y = separable
    estimator = make(cls)
    assert fit_checked(estimator, X, y, allowed=()) == []
    assert estimator.score(X, y) == 1.0


@pytest.mark.parametrize("cls", QUICK)
def test_separable_classes_with_the_papers_vague_prior(cls, separable):
    """C = 1e5: the posterior is a ridge along the separating direction, far from Gaussian.
    Sampling methods may fall back to Laplace (warned, recorded); nothing may blow up."""
    X, y = separable
    estimator = make(cls, C=1e5)
    messages = fit_checked(estimator, X, y)
    if getattr(estimator, "laplace_fallback_", np.array([False]))[0]:
        assert any("Falling back to the Laplace" in str(m) for m in messages)
    # the slope of the separating feature is positive, and no sd exceeds the prior's
    assert estimator.coef_[0, 0] > 0
    assert np.sqrt(np.diag(estimator.sigma_)[:3]).max() < np.sqrt(1e5)


@pytest.mark.parametrize("rounds, kernel_scale", [(3, 2.0), (3, 3.0), (4, 2.0), (4, 3.0)])
def test_adaptive_rounds_never_return_an_extrapolated_fit(separable, rounds, kernel_scale):
    """With few points per round on the separable ridge, a round's fit can rest on two or
    three points and extrapolate (before the IS agreement check: a mean 1300 prior sds
    out). Now such fits are rejected: the posterior mean stays within a few prior sds."""
    X, y = separable
    for seed in range(4):
        estimator = vsbayes.VSLogisticRegression(
            C=1e5, rounds=rounds, kernel_scale=kernel_scale, random_state=seed
        )
        fit_checked(estimator, X, y)
        assert np.abs(estimator.coef_).max() < 5 * np.sqrt(1e5)


@pytest.mark.parametrize("cls", QUICK)
def test_constant_and_duplicated_columns(cls, data):
    X, y = data
    X = np.column_stack([X, np.ones(len(X)), X[:, 0]])
    estimator = make(cls)
    fit_checked(estimator, X, y)
    if cls in (vsbayes.LaplaceLogisticRegression, vsbayes.LaplaceProbitRegression):
        # the posterior is symmetric in the two copies of column 0
        assert estimator.coef_[0, 0] == pytest.approx(estimator.coef_[0, 5], rel=1e-8)


@pytest.mark.parametrize("cls", QUICK)
def test_more_features_than_observations(cls):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((10, 30))
    y = np.tile([0, 1], 5)
    estimator = make(cls)
    fit_checked(estimator, X, y)
    # the 20 directions the data do not see keep their prior variance C = 1 (to the
    # sampling error of the sampling methods); the 10 others are narrower
    variances = np.linalg.eigvalsh(estimator.sigma_[:30, :30])
    assert np.sum(variances > 0.5) >= 20


@pytest.mark.parametrize("cls", QUICK)
def test_one_observation_per_class(cls):
    X = np.array([[0.0, 1.0], [1.0, 0.0]])
    estimator = make(cls)
    fit_checked(estimator, X, [0, 1], allowed=())
    assert list(estimator.predict(X)) == [0, 1]


@pytest.mark.parametrize("cls", QUICK)
def test_extremely_imbalanced_classes(cls):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((2000, 3))
    y = np.zeros(2000, dtype=int)
    y[:3] = 1
    estimator = make(cls)
    fit_checked(estimator, X, y)
    assert estimator.predict_proba(X)[:, 1].mean() < 0.01


@pytest.mark.parametrize("cls", QUICK)
@pytest.mark.parametrize("scale", [1e-8, 1e8])
def test_feature_scales_are_equivariant(cls, scale, data):
    """Scaling X by s and the prior variance by 1/s² gives coefficients scaled by 1/s: the
    methods work in Laplace-whitened coordinates, so this holds to round-off, even for the
    sampling methods (same seed, same draws)."""
    X, y = data
    reference = make(cls).fit(X, y)
    estimator = make(cls, C=1.0 / scale**2)
    fit_checked(estimator, X * scale, y)
    np.testing.assert_allclose(estimator.coef_ * scale, reference.coef_, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cls", QUICK)
def test_mixed_feature_scales(cls, data):
    X, y = data
    fit_checked(make(cls), X * [1e-8, 1.0, 1e8, 1.0], y)


def test_collinear_columns_on_a_huge_scale_raise_with_the_remedy(data):
    """Precision 1e17 along the data, 1 (the prior) across: no float64 Gaussian exists."""
    X, y = data
    X = np.column_stack([X, X[:, 0]]) * 1e8
    with pytest.raises(ValueError, match="Standardize the features") as raised:
        vsbayes.VSLogisticRegression().fit(X, y)
    assert not isinstance(raised.value, NotPositiveDefiniteError)  # named, not from deep inside


@pytest.mark.parametrize(
    ("scale", "weight", "cause"),
    [([1.0, 1.0, 1e8, 1.0], 1.0, "feature 2"), (1.0, 1e9, "sample weights are too large")],
)
def test_a_multinomial_shift_beyond_float64_names_its_cause(data, scale, weight, cause):
    """The softmax does not see a column's shift across the classes, which its prior alone
    holds: a feature at 1e8 (curvature 1e17 against the prior's 1) or weights summing to
    6e10 (against the intercepts' 1e-6) leave it below the likelihood's round-off. The
    error said "Standardize the features, drop duplicated columns, or use a smaller C",
    which does nothing for weights; it names the column and the remedy that works."""
    X, y = data
    y = np.where(X[:, 2] > 0.8, 2, y)
    with pytest.raises(ValueError, match=cause):
        vsbayes.LaplaceLogisticRegression().fit(X * scale, y, sample_weight=np.full(len(y), weight))
    if weight > 1:  # the remedy named: the intercept as a column of ones, prior variance C
        ones = np.column_stack([X, np.ones(len(X))])
        fitted = vsbayes.LaplaceLogisticRegression(fit_intercept=False)
        fit_checked(fitted, ones, y, sample_weight=np.full(len(y), weight))


# --- sampling trouble: a warning with the remedy and a documented fallback ---------------


def test_too_few_samples_for_the_family_raise(data):
    X, y = data  # 4 features + intercept: n = 21 parameters
    with pytest.raises(ValueError, match="n_samples >= 21"):
        vsbayes.VSLogisticRegression(n_samples=20).fit(X, y)
    # the diagonal family has n = 11 parameters: 20 points are enough, if barely (< 2n)
    for seed in range(5):
        with pytest.warns(UnreliableFitWarning):
            vsbayes.VSLogisticRegression(
                n_samples=20, family="diagonal", strategy="global", random_state=seed
            ).fit(X, y)


def test_bmc_sample_cap_is_an_error(data):
    X, y = data
    with pytest.raises(ValueError, match="at most 16384"):
        vsbayes.BMCLogisticRegression(n_samples=20000).fit(X, y)


def test_low_effective_sample_size_warns_with_the_remedy(separable):
    X, y = separable
    with pytest.warns(UnreliableFitWarning, match=r"effective sample size.*more samples"):
        vsbayes.VSLogisticRegression(
            C=1e5, rounds=1, kernel="laplace", strategy="global", random_state=0
        ).fit(X, y)


@pytest.mark.parametrize("cls", SAMPLING)
def test_failed_sampling_fit_falls_back_to_laplace(cls, separable):
    """Too few points for the ridge: whatever fails (non-integrable fit, singular IS
    covariance, implausible mean) is warned about and replaced by the Laplace posterior."""
    X, y = separable
    # From the Laplace kernel: far from this posterior (EP's kernel makes these fits work).
    options = {"strategy": "global"} if cls.__name__.startswith("VS") else {}
    estimator = cls(C=1e5, n_samples=40, kernel="laplace", random_state=0, **options)
    with pytest.warns(UnreliableFitWarning, match="Falling back to the Laplace"):
        estimator.fit(X, y)
    assert estimator.laplace_fallback_.tolist() == [True]
    laplace = vsbayes.LaplaceLogisticRegression(C=1e5).fit(X, y)
    if "Probit" not in cls.__name__:
        np.testing.assert_array_equal(estimator.coef_, laplace.coef_)
    assert_valid_fit(estimator, X)


def test_fits_far_from_the_importance_sampling_mean_are_errors(rng):
    """VS: the IS mean must be a plausible draw from the fit (distance in the fit's sds);
    BMC: the means must agree to within IS standard errors (distance × ESS)."""
    z = rng.standard_normal((400, 3))
    weights = np.ones(400)
    points = FullFamily(z)
    check_mean_within_fit("VS", np.full(3, 1.0), np.eye(3), points, weights, "remedy")
    with pytest.raises(DegenerateEstimateError, match=r"standard deviations.*remedy"):
        check_mean_within_fit("VS", np.full(3, 5.0), np.eye(3), points, weights, "remedy")
    check_mean_against_is("BMC", np.full(3, 0.1), z, weights, "remedy")
    with pytest.raises(DegenerateEstimateError, match=r"standard errors.*remedy"):
        check_mean_against_is("BMC", np.full(3, 1.0), z, weights, "remedy")


# --- extremes ------------------------------------------------------------------------------


@pytest.mark.parametrize("log_Z", [-5000.0, 5000.0])
@pytest.mark.parametrize(
    "fitter",
    [vsbayes.variational_sampling, vsbayes.importance_sampling, vsbayes.bayesian_monte_carlo],
)
def test_engine_log_evidence_of_plus_minus_5000(fitter, log_Z):
    target = vsbayes.Gaussian([1.0, -2.0], [[2.0, 0.5], [0.5, 1.0]], log_Z)
    kernel = vsbayes.Gaussian(target.mean, target.cov)
    fit = fitter(target.log_density, kernel, 200, random_state=0)
    # the kernel is the target: VS and IS are exact, BMC nearly so
    tol = 1e-3 if fitter is vsbayes.bayesian_monte_carlo else 1e-9
    assert fit.log_Z == pytest.approx(log_Z, abs=tol * abs(log_Z))
    assert vsbayes.laplace(target.log_density, [0.0, 0.0]).log_Z == pytest.approx(log_Z)


@pytest.mark.parametrize("cls", ALL)
def test_log_evidence_near_minus_5000(cls):
    """8000 coin flips: the log evidence is about -8000 log 2; every method agrees to a nat."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((8000, 2))
    y = rng.integers(0, 2, 8000)
    estimator = make(cls)
    fit_checked(estimator, X, y, allowed=())
    laplace = make(
        vsbayes.LaplaceProbitRegression
        if "Probit" in cls.__name__
        else vsbayes.LaplaceLogisticRegression
    ).fit(X, y)
    assert estimator.log_marginal_likelihood_value_ < -5000
    assert estimator.log_marginal_likelihood_value_ == pytest.approx(
        laplace.log_marginal_likelihood_value_, abs=1.0
    )


@pytest.mark.parametrize("cls", QUICK)
def test_posterior_sds_of_thousands(cls):
    """A vague prior (C = 1e7) and more features than observations: the sds along the
    directions the data do not see are the prior's, in the thousands."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((6, 8))
    y = [0, 1, 0, 1, 1, 0]
    estimator = make(cls, C=1e7)
    fit_checked(estimator, X, y)
    assert np.sqrt(np.diag(estimator.sigma_)).max() >= 1e3


@pytest.mark.parametrize(
    "cls",
    [
        vsbayes.LaplaceLogisticRegression,
        vsbayes.VSLogisticRegression,
        vsbayes.ISProbitRegression,
        vsbayes.EPProbitRegression,
        vsbayes.VBLogisticRegression,
    ],
)
def test_one_hundred_features(cls):
    """d = 100, M = 300: valid fits. (BMC is left out: its N×N Gram matrix at the auto N of
    16384 points takes 2 GB and minutes; EP-logistic and the probit twins cost the same as
    these.)"""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((300, 100))
    y = (X[:, :5].sum(axis=1) + rng.logistic(size=300) > 0).astype(int)
    fit_checked(make(cls), X, y)


# --- reproducibility -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", SAMPLING)
def test_same_seed_same_bits_whatever_n_jobs(cls, data):
    X, y = data
    one = cls(random_state=7).fit(X, y)
    two = cls(random_state=7, n_jobs=2).fit(X, y)
    for name in ("coef_", "intercept_", "sigma_", "log_marginal_likelihood_value_"):
        np.testing.assert_array_equal(getattr(two, name), getattr(one, name))


@pytest.mark.parametrize("cls", [vsbayes.VSLogisticRegression, vsbayes.ISProbitRegression])
def test_fits_in_two_threads_equal_sequential_fits(cls):
    rng = np.random.default_rng(6)
    problems = []
    for _ in range(2):
        X = rng.standard_normal((3000, 8))
        problems.append((X, (X[:, 0] + rng.logistic(size=3000) > 0).astype(int)))
    sequential = [cls(random_state=1).fit(X, y) for X, y in problems]
    threaded = [cls(random_state=1) for _ in problems]
    threads = [
        threading.Thread(target=est.fit, args=problem)
        for est, problem in zip(threaded, problems, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Equal to round-off, not to the bit: every BLAS call runs on one thread, in blocks fixed
    # by the problem, but SIMD kernels (BLAS's, NumPy's sums) peel unaligned ends, and fits
    # in other threads allocate their arrays at other alignments.
    for a, b in zip(sequential, threaded, strict=True):
        np.testing.assert_allclose(b.coef_, a.coef_, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(b.sigma_, a.sigma_, atol=1e-12 * np.abs(a.sigma_).max())


@pytest.mark.parametrize("cls", [vsbayes.VSLogisticRegression, vsbayes.EPProbitRegression])
def test_same_bits_whatever_the_blas_threads(cls):
    # The blocks the fits run side by side depend on the problem's size only, never on the
    # threads BLAS may use (which set how many run at once).
    rng = np.random.default_rng(8)
    X = rng.standard_normal((20_000, 12))
    y = (X[:, 0] + rng.logistic(size=len(X)) > 0).astype(int)
    with threadpool_limits(limits=1, user_api="blas"):
        one = cls(random_state=3).fit(X, y)
    with threadpool_limits(limits=2, user_api="blas"):
        two = cls(random_state=3).fit(X, y)
    for name in ("coef_", "intercept_", "sigma_", "log_marginal_likelihood_value_"):
        np.testing.assert_array_equal(getattr(two, name), getattr(one, name))


@pytest.mark.parametrize("cls", ALL)
def test_read_only_memmapped_inputs_are_never_written(cls, data, tmp_path):
    X, y = data
    weights = np.linspace(0.5, 2.0, len(y))
    loaded = []
    for name, array in (("X", X), ("y", y), ("w", weights)):
        np.save(tmp_path / f"{name}.npy", array)
        loaded.append(np.load(tmp_path / f"{name}.npy", mmap_mode="r"))
    estimator = make(cls).fit(*loaded[:2], sample_weight=loaded[2])
    estimator.predict_proba(loaded[0])
    for array, original in zip(loaded, (X, y, weights), strict=True):
        np.testing.assert_array_equal(array, original)


def test_ill_conditioned_ep_fit_is_valid():
    """Six features on a 1e6 scale, two observations with small weights, C = 1e4: the
    posterior's condition number is ~1e15. The dual form gave improper final cavities here
    (found by the property test); the primal one, used below p = 256, gives a valid fit."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 6)) * 1e6
    weights = 10.0 ** rng.uniform(-3, 0, 2)
    estimator = vsbayes.EPProbitRegression(C=1e4, fit_intercept=False)
    estimator.fit(X, [0, 1], sample_weight=weights)
    assert_valid_fit(estimator, X)


def test_failed_ep_fit_falls_back_to_laplace(monkeypatch):
    import vsbayes.estimators._methods as ep_module

    def improper(*args, **kwargs):
        raise EstimationError("2 of the final expectation-propagation cavities are improper")

    monkeypatch.setattr(ep_module, "ep_posterior", improper)
    X = np.random.default_rng(0).standard_normal((20, 2))
    estimator = vsbayes.EPProbitRegression()
    with pytest.warns(UnreliableFitWarning, match="cavities are improper.*Falling back"):
        estimator.fit(X, X[:, 0] > 0)
    assert estimator.laplace_fallback_.tolist() == [True]
    assert_valid_fit(estimator, X)


def _separated_three_classes():
    return make_classification(
        n_samples=60,
        n_features=8,
        n_informative=6,
        n_redundant=0,
        n_classes=3,
        n_clusters_per_class=1,
        class_sep=2.0,
        flip_y=0.05,
        random_state=1,
    )


@pytest.mark.parametrize("C", [1.0, 1e4])
def test_multinomial_laplace_warns_where_its_predictive_leaves_its_separating_mode(C):
    """Three classes the mode separates: at C = 1e4 the Gaussian about the mode is wide
    along the one-sided directions and its predictive moves the training rows' classes
    (the warning's figures are the fit's own); at C = 1 it does not, and no warning."""
    X, y = _separated_three_classes()
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = vsbayes.LaplaceLogisticRegression(C=C).fit(X, y)
    leaves = [w for w in caught if "predictive leaves its mode" in str(w.message)]
    mode = model.classes_[np.argmax(X @ model.coef_.T + model.intercept_, axis=1)]
    assert np.all(mode == y)  # the mode separates the classes at both C
    moved = np.mean(model.predict(X) != mode)
    if C == 1.0:
        assert not leaves and moved == 0
    else:
        assert len(leaves) == 1 and leaves[0].category is UnreliableFitWarning
        assert moved > 0.5
        assert "VSLogisticRegression or EPLogisticRegression" in str(leaves[0].message)


def test_empirical_bayes_grid_fits_keep_the_laplace_predictive_warning_to_themselves():
    """EmpiricalBayesClassifier's exploratory Laplace fits at large C on separated classes
    do not repeat the Laplace predictive's warning: its own says the classes separate."""
    X, y = _separated_three_classes()
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    search = vsbayes.EmpiricalBayesClassifier(vsbayes.LaplaceLogisticRegression())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search.fit(X, y)
    messages = [str(w.message) for w in caught]
    assert not any("predictive leaves its mode" in m for m in messages)
    assert any("largest at the edge of Cs" in m for m in messages)


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def test_a_global_fit_whose_predicted_error_is_large_warns(iris):
    """A global fit the user forced to the diagonal family predicted 0.3-22 nats on iris's
    multinomial posterior, silently; this one (0.63 nats) classifies 0.65 of the training
    rows right against 0.97. Above UNRELIABLE_KL the engine warns, naming the remedies; the
    same fit asked for a target_kl it meets does not (it is what was asked), nor does the
    full family's fit of the same points (0.009 nats)."""
    X, y = iris
    options = {"strategy": "global", "rule": "qmc", "rounds": 3, "random_state": 0}
    with pytest.warns(UnreliableFitWarning, match=r"predicted error .* family='gaussian'"):
        forced = vsbayes.VSLogisticRegression(family="diagonal", **options).fit(X, y)
    assert forced.kl_error_[0] > UNRELIABLE_KL
    assert forced.score(X, y) < 0.9  # (what the warning is about)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableFitWarning)
        met = vsbayes.VSLogisticRegression(family="diagonal", target_kl=5.0, **options)
        met.fit(X, y)
        full = vsbayes.VSLogisticRegression(**options).fit(X, y)
    assert met.stop_reason_[0] == "target_kl" and met.kl_error_[0] == forced.kl_error_[0]
    assert full.kl_error_[0] < UNRELIABLE_KL / 10


def test_a_binary_global_fit_whose_predicted_error_is_large_warns():
    """The binary posterior too: the diagonal family at max(8n, 256) points on breast
    cancer's correlated posterior (8 features) predicts 0.2-1.3 nats over seeds and rules,
    beyond UNRELIABLE_KL here, and says to use family='gaussian'."""
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:, :8]
    model = vsbayes.VSLogisticRegression(family="diagonal", strategy="global", random_state=0)
    with pytest.warns(UnreliableFitWarning, match="family='gaussian'"):
        model.fit(X, y)
    assert model.kl_error_[0] > UNRELIABLE_KL


def test_an_unknown_error_in_many_dimensions_is_no_divergence(monkeypatch):
    """digits3 (3 against the rest) on its 32 most variable pixels, 600 rows, probit: a
    near-separable posterior in 33 dimensions. The global fit at its 8n points has
    weights q/π of an effective sample size below n = 595, the in-sample correction's
    pole, although it stays within a factor 2 of EP's variances in every direction
    (0.68-1.77). Its leverages give a finite error (0.94 nats; 0.42 from the spread of
    seeds 0-2), which warns as large (D-237); without them (beyond their budget)
    kl_error is inf, whose warning said the kernel was narrower than the fit, which it is
    not: in many dimensions small differences along each spread the weights (D-224)."""
    from sklearn.datasets import load_digits

    from vsbayes.engine import vs_solver

    X, y = load_digits(return_X_y=True)
    columns = np.argsort(-X.var(axis=0), kind="stable")[:32]
    X, y = StandardScaler().fit_transform(X[:600, columns]), (y[:600] == 3).astype(int)
    fit = vsbayes.VSProbitRegression(strategy="global", random_state=0)
    with pytest.warns(UnreliableFitWarning, match="predicted error is"):
        fit.fit(X, y)
    assert np.isfinite(fit.kl_error_[0])
    monkeypatch.setattr(vs_solver, "_LEVERAGE_BUDGET", 0.0)
    with pytest.warns(UnknownErrorWarning, match="along many of its 33 dimensions"):
        fit.fit(X, y)
    assert np.isinf(fit.kl_error_[0])
    ep = vsbayes.EPProbitRegression().fit(X, y)
    lower = np.linalg.cholesky(ep.sigma_)
    ratio = np.linalg.solve(lower, np.linalg.solve(lower, fit.sigma_).T)
    assert np.all(np.abs(np.log(np.linalg.eigvalsh(ratio))) < np.log(2.0))
