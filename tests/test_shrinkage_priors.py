"""Shrinkage priors: Laplace (penalty="l1"/"elasticnet"), Student-t and horseshoe."""

import math
import warnings

import numpy as np
import pytest
from scipy import integrate
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression

from vsbayes import (
    EPLogisticRegression,
    HorseshoePrior,
    LaplaceLogisticRegression,
    LaplacePrior,
    StudentTPrior,
    VSLogisticRegression,
)
from vsbayes.approximations import expectation_propagation, glm_laplace
from vsbayes.approximations.expectation_propagation import (
    DEFAULT_DAMPING,
    _BinaryRows,
    _sweeps_with_prior_sites,
)
from vsbayes.exceptions import ConvergenceWarning, UnreliableFitWarning
from vsbayes.models import BinaryGLMPosterior
from vsbayes.models.shrinkage_priors import elastic_net_factor

FACTORS = {
    "laplace": LaplacePrior(0.5).coefficient_factor(),
    "student_t": StudentTPrior(3.0, 0.5).coefficient_factor(),
    # A mixing density of width √(2/ν) in log σ², narrower than the default step
    "student_t_300": StudentTPrior(300.0, 0.5).coefficient_factor(),
    "horseshoe": HorseshoePrior(0.1).coefficient_factor(),
    "elastic_net": elastic_net_factor(1.0, 0.5),
}


def _quad(f, low=-30.0, high=30.0, points=()):
    """∫ f over [low, high], split at the kink/spike at 0 (and at ``points``)."""
    opts = {"limit": 200, "epsabs": 0.0, "epsrel": 1e-10}
    left = [p for p in points if low < p < 0.0] or None
    right = [p for p in points if 0.0 < p < high] or None
    return (
        integrate.quad(f, low, 0.0, points=left, **opts)[0]
        + integrate.quad(f, 0.0, high, points=right, **opts)[0]
    )


@pytest.mark.parametrize("name", FACTORS)
def test_prior_densities_are_normalized(name):
    factor = FACTORS[name]
    total = _quad(lambda t: math.exp(factor.log_density(np.array([t]))[0]), -1e3, 1e3)
    tail = 1e-3 if name in ("student_t", "horseshoe") else 1e-10  # mass beyond ±1000
    assert abs(total - 1.0) < tail


@pytest.mark.parametrize("name", FACTORS)
def test_tilted_moments_match_quadrature(name):
    factor = FACTORS[name]
    cav_mean, cav_var = np.array([-2.0, 0.3, 3.0]), np.array([0.05, 0.2, 4.0])
    if name == "horseshoe":
        # Also the extremes of the cavities EP meets under it (breast cancer): a narrow one
        # by the spike, a wide one far in the tails.
        cav_mean, cav_var = np.append(cav_mean, [0.05, -25.0]), np.append(cav_var, [1e-3, 75.0])
    log_z, mean, var, fitted = factor.tilted_moments(cav_mean, cav_var)
    assert fitted.all()
    for i, (m, v) in enumerate(zip(cav_mean, cav_var, strict=True)):
        sd = math.sqrt(v)

        def moment(k, m=m, v=v, sd=sd):
            return _quad(
                lambda t: (
                    t**k
                    * math.exp(
                        factor.log_ratio(np.array([t]))[0]
                        - 0.5 * (t - m) ** 2 / v
                        - 0.5 * math.log(2 * math.pi * v)
                    )
                ),
                min(-30.0, m - 15.0 * sd),
                max(30.0, m + 15.0 * sd),
                points=(m - sd, m, m + sd),
            )

        z0, z1, z2 = moment(0), moment(1), moment(2)
        exact_mean, exact_var = z1 / z0, z2 / z0 - (z1 / z0) ** 2
        # The trapezoid rule in log σ² is exact to round-off: quad's own 1e-10 decides.
        assert abs(log_z[i] - math.log(z0)) < 1e-8
        assert abs(mean[i] - exact_mean) < 1e-8 * math.sqrt(exact_var)
        assert abs(var[i] - exact_var) < 1e-8 * exact_var


@pytest.mark.parametrize("name", FACTORS)
def test_fast_tilted_moments_are_the_mixture_rules_to_1e_6(name):
    # method="fast" (leave-one-out's relaxations, which stop at site changes of 1e-3): the
    # same trapezoid rule in log σ², coarser and over each prior's own tails, within the
    # 1e-6 its docstring states of the default rule (itself exact to round-off, above), on
    # cavities of means within ±8 prior scales and variances 1e-4 to 1e2 times the prior's.
    factor = FACTORS[name]
    scale = math.sqrt(factor.start_var)
    mean, var = np.meshgrid(np.linspace(-8.0, 8.0, 33), np.geomspace(1e-4, 1e2, 25))
    cav_mean, cav_var = (mean * scale).ravel(), (var * factor.start_var).ravel()
    log_z, t_mean, t_var, fitted = factor.tilted_moments(cav_mean, cav_var)
    fast = factor.tilted_moments(cav_mean, cav_var, method="fast")
    assert fitted.all() and fast[3].all()
    assert np.max(np.abs(fast[0] - log_z)) < 1e-6 * 2  # (log Z: the two moments' errors)
    assert np.max(np.abs(fast[1] - t_mean) / np.sqrt(t_var)) < 1e-6
    assert np.max(np.abs(fast[2] - t_var) / t_var) < 1e-6


@pytest.mark.parametrize("name", ["student_t", "horseshoe"])
def test_tilted_departure_matches_quadrature(name):
    factor = FACTORS[name]
    cav_mean, cav_var = np.array([0.4, 1.5, 0.0]), np.array([0.01, 0.5, 4.0])
    departure = factor.tilted_departure(cav_mean, cav_var)
    _, mean, var, _ = factor.tilted_moments(cav_mean, cav_var)
    for i, (m, v) in enumerate(zip(cav_mean, cav_var, strict=True)):

        def log_tilted(t, m=m, v=v):
            return factor.log_ratio(np.array([t]))[0] - 0.5 * (t - m) ** 2 / v

        peak = max(log_tilted(t) for t in np.linspace(m - 5 * v**0.5, m + 5 * v**0.5, 201))
        log_z = peak + math.log(_quad(lambda t, peak=peak: math.exp(log_tilted(t) - peak)))

        def integrand(t, i=i, log_z=log_z):
            log_p = log_tilted(t) - log_z
            log_q = -0.5 * (t - mean[i]) ** 2 / var[i] - 0.5 * math.log(2 * math.pi * var[i])
            return math.exp(log_p) * (log_p - log_q) if log_p > -700 else 0.0

        # The grid of 801 points over ±12 sds: ~1e-3 nats of a density with a log spike.
        assert abs(departure[i] - _quad(integrand)) < 2e-3 + 0.02 * departure[i]
    # A cavity far narrower than the prior's scale: the tilted density is nearly Gaussian.
    assert departure[0] < 0.01 < departure.max()


@pytest.fixture(scope="module")
def one_feature():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 1))
    y = np.where(rng.random(30) < 1 / (1 + np.exp(-0.8 * X[:, 0])), 1.0, -1.0)
    return X, y


@pytest.mark.parametrize(
    "name, mean_sds, sd_rel, log_z_tol",
    # EP's own error on one coefficient and 30 rows (measured: Laplace 0.002 sd, 3.6 %,
    # 0.012 nats; Student-t 0.03 sd, 8 %, 0.03; horseshoe 0.04 sd, 8 %, 0.05), with room.
    [
        ("laplace", 0.02, 0.06, 0.03),
        ("student_t", 0.06, 0.12, 0.06),
        ("horseshoe", 0.08, 0.12, 0.1),
        ("elastic_net", 0.02, 0.04, 0.02),
    ],
)
def test_ep_with_prior_sites_against_quadrature(name, mean_sds, sd_rel, log_z_tol, one_feature):
    X, y = one_feature
    model = BinaryGLMPosterior(
        X,
        y,
        np.ones(len(y)),
        "logistic",
        prior_var=1.0,
        intercept_prior_var=None,
        coefficient_prior=FACTORS[name],
    )
    ep = expectation_propagation(model, start=glm_laplace(model).mean, tol=1e-10)
    signed, factor = y * X[:, 0], FACTORS[name]

    def log_p(t):  # the exact log-posterior, scalar (model.log_density's float32 aside)
        return -np.logaddexp(0.0, -signed * t).sum() + factor.log_density(np.array([t]))[0]

    peak = log_p(ep.mean[0])

    def moment(k):
        return _quad(lambda t: t**k * math.exp(log_p(t) - peak), -15.0, 15.0)

    z0, z1, z2 = moment(0), moment(1), moment(2)
    mean, sd = z1 / z0, math.sqrt(z2 / z0 - (z1 / z0) ** 2)
    assert abs(ep.mean[0] - mean) < mean_sds * sd
    assert abs(math.sqrt(ep.cov[0, 0]) - sd) < sd_rel * sd
    assert abs(ep.log_Z - (math.log(z0) + peak)) < log_z_tol


def test_prior_alone_is_recovered_exactly():
    # A likelihood of negligible weight: the posterior is the prior, whose only
    # non-Gaussian factor is the prior site, fitted exactly (variance 2b² of Laplace(b)).
    X = np.array([[1.0], [-1.0]])
    model = BinaryGLMPosterior(
        X,
        np.array([1.0, 1.0]),
        np.full(2, 1e-9),
        "logistic",
        prior_var=1.0,
        intercept_prior_var=None,
        coefficient_prior=FACTORS["laplace"],
    )
    ep = expectation_propagation(model, start=np.zeros(1), tol=1e-12)
    np.testing.assert_allclose(ep.cov[0, 0], 2 * 0.5**2, rtol=1e-7)
    assert abs(ep.mean[0]) < 1e-8
    assert abs(ep.log_Z - 2e-9 * math.log(0.5)) < 1e-8  # ∫ prior × σ(θ)^s σ(-θ)^s


@pytest.fixture(scope="module")
def binary():
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X[::3, :10]), y[::3]


@pytest.mark.parametrize(
    "C, ratio, solver, fit_intercept", [(0.1, 1.0, "liblinear", False), (0.5, 0.5, "saga", True)]
)
def test_mode_is_logistic_regressions_l1_solution(C, ratio, solver, fit_intercept, binary):
    X, y = binary
    est = LaplaceLogisticRegression(
        l1_ratio=ratio, C=C, tol=1e-12, fit_intercept=fit_intercept
    ).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lr = LogisticRegression(
            l1_ratio=ratio,
            C=C,
            solver=solver,
            tol=1e-12,
            max_iter=100_000,
            fit_intercept=fit_intercept,
        ).fit(X, y)
    # The same objective's minimizer (up to the intercept's N(0, 10⁶) and the solver's tol;
    # liblinear penalizes an intercept: none here).
    np.testing.assert_allclose(est.coef_, lr.coef_, atol=1e-5)
    np.testing.assert_allclose(est.intercept_, lr.intercept_, atol=1e-5)
    np.testing.assert_array_equal(est.coef_ == 0, np.abs(lr.coef_) < 1e-7)
    assert np.isfinite(est.log_marginal_likelihood_value_)
    assert np.all(np.linalg.eigvalsh(est.sigma_) > 0)


def test_ep_estimator_posterior_mean_is_not_sparse(binary):
    X, y = binary
    ep = EPLogisticRegression(penalty="l1", l1_ratio=1, C=0.1).fit(X, y)
    mode = LaplaceLogisticRegression(penalty="l1", l1_ratio=1, C=0.1).fit(X, y)
    assert np.all(ep.coef_ != 0) and np.any(mode.coef_ == 0)
    same = EPLogisticRegression(prior=LaplacePrior(scale=0.1)).fit(X, y)
    np.testing.assert_allclose(same.coef_, ep.coef_, rtol=1e-10)
    assert ep.summary() is not None


def test_duplicated_columns_under_l1_give_a_proper_posterior():
    # Both copies non-zero at the L1 mode: the likelihood and Σ|θ_j| are flat along their
    # difference, so the Hessian is singular; the prior's variance stands in there.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = (X @ rng.normal(size=3) + rng.logistic(size=30) > 0).astype(int)
    X = np.hstack([X, X[:, :1]])
    laplace = LaplaceLogisticRegression(l1_ratio=1.0).fit(X, y)
    ep = EPLogisticRegression(l1_ratio=1.0).fit(X, y)
    for est in (laplace, ep):
        assert np.all(np.linalg.eigvalsh(est.sigma_) > 0)
        assert np.isfinite(est.log_marginal_likelihood_value_)
    assert not ep.laplace_fallback_[0]
    # EP's posterior is symmetric in the two copies, as the exact posterior is.
    np.testing.assert_allclose(ep.coef_[0, 0], ep.coef_[0, 3], rtol=1e-6)


def test_l1_mode_of_an_unscaled_column_is_liblinears(binary):
    # A column 10⁶ times the others: the steps' ridge, a share of the mean curvature, would
    # dwarf the others' curvature and stall Newton (100 iterations, not converged).
    X, y = binary
    X = X[:, :4] * [1e6, 1.0, 1.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = LaplaceLogisticRegression(l1_ratio=1.0, fit_intercept=False, tol=1e-12).fit(X, y)
    # (liblinear's coordinate order is random: on this column its fits spread by 4e-4
    # relative over seeds, so the reference is seeded.)
    lr = LogisticRegression(
        l1_ratio=1.0,
        solver="liblinear",
        fit_intercept=False,
        tol=1e-12,
        max_iter=100_000,
        random_state=0,
    ).fit(X, y)
    np.testing.assert_allclose(est.coef_, lr.coef_, rtol=1e-4, atol=1e-6 * np.abs(lr.coef_).max())
    # The covariance is the inverse Hessian at the mode (no stand-in: the column is no
    # singular direction): the likelihood's curvature, and 1/(2C²) at the kinks.
    p = 1.0 / (1.0 + np.exp(-X @ est.coef_[0]))
    hessian = (X * (p * (1 - p))[:, None]).T @ X + np.diag(np.where(est.coef_[0] == 0, 0.5, 0))
    np.testing.assert_allclose(est.sigma_ @ hessian, np.eye(4), atol=1e-6)


def test_a_shrinkage_prior_leaves_c_unused_even_infinite(binary):
    X, y = binary
    prior = StudentTPrior(3.0, 0.5)
    inf = LaplaceLogisticRegression(prior=prior, C=np.inf).fit(X, y)
    one = LaplaceLogisticRegression(prior=prior).fit(X, y)
    np.testing.assert_array_equal(inf.coef_, one.coef_)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"prior": StudentTPrior(df=0.0)}, "df"),
        ({"prior": StudentTPrior(df=3.0, scale=-1.0)}, "scale"),
        ({"prior": LaplacePrior(scale=np.inf)}, "scale"),
        ({"prior": HorseshoePrior(global_scale=np.nan)}, "global_scale"),
        ({"l1_ratio": 1.5}, "l1_ratio"),
        ({"penalty": "elasticnet", "l1_ratio": -0.1}, "l1_ratio"),
        # Variances beyond float64's range (an OverflowError or ZeroDivisionError before)
        ({"prior": LaplacePrior(scale=1e150)}, "scale"),
        ({"prior": HorseshoePrior(global_scale=1e-300)}, "global_scale"),
        ({"prior": StudentTPrior(df=1e4)}, "df"),
        ({"l1_ratio": 1.0, "C": 1e300}, "C=1e"),
        ({"penalty": "elasticnet", "l1_ratio": 0.5, "C": 1e-300}, "C=1e"),
    ],
)
def test_bad_input_names_the_parameter(params, match, binary):
    X, y = binary
    with pytest.raises(ValueError, match=match):
        EPLogisticRegression(**params).fit(X, y)


def test_unsupported_routes_say_what_is_supported(binary):
    X, y = binary
    y3 = np.arange(len(y)) % 3
    with pytest.raises(ValueError, match="OneVsRestClassifier"):  # (multinomial: EP's)
        VSLogisticRegression(prior=StudentTPrior()).fit(X, y3)
    with pytest.raises(ValueError, match="no mode"):
        LaplaceLogisticRegression(prior=HorseshoePrior()).fit(X, y)
    with pytest.raises(AttributeError, match="partial_fit"):  # hidden, as MLPClassifier's
        VSLogisticRegression(l1_ratio=1).partial_fit(X, y, classes=[0, 1])
    assert not hasattr(VSLogisticRegression(prior=StudentTPrior()), "partial_fit")
    assert hasattr(VSLogisticRegression(), "partial_fit")


def test_priors_are_parameters_sklearn_can_clone():
    est = VSLogisticRegression(prior=StudentTPrior(df=4.0, scale=2.0))
    copy = clone(est)
    assert copy.prior == est.prior and copy.prior is not None
    assert repr(HorseshoePrior(0.2)) == "HorseshoePrior(global_scale=0.2)"
    assert est.get_params()["prior"] == StudentTPrior(4.0, 2.0)


@pytest.mark.parametrize(
    "prior, strategy, reason",
    [
        # EP's coefficient sites close to Gaussian: EP kept without a global fit.
        (StudentTPrior(3.0, 1.0), "sites", "(≤ 0.5): EP is kept"),
        # A Cauchy prior at a small scale: EP's sites drop nats; the global fit corrects it.
        (StudentTPrior(1.0, 0.3), "global", "the global fit departs from EP"),
        # The horseshoe's spikes: no Gaussian kernel's sample would see the mass.
        (HorseshoePrior(0.1), "sites", "effective sample size of at most"),
    ],
)
def test_auto_strategy_weighs_what_eps_prior_sites_drop(prior, strategy, reason, binary):
    X, y = binary
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = VSLogisticRegression(prior=prior, random_state=0).fit(X, y)
    assert est.strategy_ == [strategy]
    assert reason in est.strategy_reason_[0]


def test_heavy_tailed_fallback_says_why_and_converges_to_its_bias(binary):
    # Collinear features under the horseshoe: EP's sites with negative precisions find no
    # fixed point, and EP is rerun with non-negative ones.
    X, y = binary
    model = BinaryGLMPosterior(
        X,
        np.where(y == 1, 1.0, -1.0),
        np.ones(len(y)),
        "logistic",
        prior_var=1.0,
        intercept_prior_var=1e6,
        coefficient_prior=FACTORS["horseshoe"],
    )
    start = glm_laplace(model).mean
    with pytest.warns(UnreliableFitWarning, match="correlated features compete") as record:
        ep = expectation_propagation(model, start=start, tol=1e-10)
    # It says what to do about this cause, not the stalled sweeps' generic remedies.
    message = str(record[0].message)
    assert "To avoid it" in message and "smaller C" not in message
    # The rerun stops at √tol: its posterior is within about tol (in KL) of the rerun's
    # fixed point, far inside its own bias.
    assert ep.converged and ep.site_change <= 1e-5
    strict = _sweeps_with_prior_sites(
        model, _BinaryRows("auto"), start, DEFAULT_DAMPING, 1e-10, 200, 5, nonnegative=True
    )
    sd = np.sqrt(np.diag(strict.cov))
    np.testing.assert_allclose(ep.mean, strict.mean, rtol=0, atol=1e-3 * sd.min())
    np.testing.assert_allclose(np.sqrt(np.diag(ep.cov)), sd, rtol=1e-3)


def test_relevance_is_eps_own_shrinkage_at_its_cavities(binary):
    X, y = binary
    # A prior under which EP reaches its fixed point here (the horseshoe's falls back to
    # non-negative sites, whose cavities do not reproduce the marginals).
    factor = StudentTPrior(3.0, 1.0).coefficient_factor()
    model = BinaryGLMPosterior(
        X,
        np.where(y == 1, 1.0, -1.0),
        np.ones(len(y)),
        "logistic",
        prior_var=1.0,
        intercept_prior_var=1e6,
        coefficient_prior=factor,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = expectation_propagation(model, start=glm_laplace(model).mean, tol=1e-10)
    d = X.shape[1]
    cav_mean, cav_var = ep.prior_cavities
    expected = factor._mixture_moments(cav_mean, cav_var)[4]
    relevance = factor.relevance(ep.mean[:d], np.diag(ep.cov)[:d])
    # The cavity is found to a tilted variance within 1e-8 of the marginal's.
    np.testing.assert_allclose(relevance, expected, atol=1e-6)
    assert np.all((relevance > 0) & (relevance < 1))


def test_summary_marks_relevance_under_a_shrinkage_prior(binary):
    X, y = binary
    est = EPLogisticRegression(prior=StudentTPrior(3.0, 1.0)).fit(X, y)
    table = est.summary()
    relevance = table["relevance"].to_numpy()
    assert np.isnan(relevance[-1]) and np.all((relevance[:-1] > 0) & (relevance[:-1] < 1))
    assert "selected" not in table.columns  # ½ selects under the horseshoe only
    plain = EPLogisticRegression().fit(X, y).summary()
    assert "relevance" not in plain.columns


@pytest.mark.parametrize(
    "prior, variance",
    [
        (LaplacePrior(0.5), 2 * 0.5**2),
        (StudentTPrior(3.0, 0.5), 3 * 0.5**2),
        # Infinite variance: the prior's variance at its local scale's median stands in.
        (HorseshoePrior(0.1), 0.1**2),
        ("elastic_net", None),  # its Gaussian part is the base: nothing to divide out
    ],
    ids=["laplace", "student_t", "horseshoe", "elastic_net"],
)
def test_all_zero_columns_keep_ep_and_their_prior(prior, variance):
    # A column no weighted row touches (a word absent from the training documents, or
    # present only in rows of weight 0) has its prior as posterior: its cavity is the
    # prior's Gaussian base itself, which made every such site improper and the whole fit
    # fall back to Laplace's (and VS spend minutes before it).
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    y = (X @ [1.0, -1.0, 0.5, 0.0] + rng.logistic(size=60) > 0).astype(int)
    X = sp.csr_matrix(np.hstack([X, np.zeros((len(y), 2))]))
    weights = np.ones(len(y))
    weights[:5] = 0.0
    X = X.tolil()
    X[:5, 5] = 1.0  # touched by zero-weight rows only
    X = X.tocsr()
    params = {"prior": prior}
    if prior == "elastic_net":
        params = {"penalty": "elasticnet", "l1_ratio": 0.5}
        factor = elastic_net_factor(1.0, 0.5)
        variance = _quad(lambda t: t * t * math.exp(factor.log_density(np.array(t))))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableFitWarning)
        est = EPLogisticRegression(**params).fit(X, y, sample_weight=weights)
    assert not est.laplace_fallback_[0]
    np.testing.assert_allclose(np.diag(est.sigma_)[4:6], variance, rtol=1e-10)
    np.testing.assert_allclose(est.sigma_[4:6, :4], 0.0, atol=1e-12)
    np.testing.assert_allclose(est.coef_[0, 4:6], 0.0, atol=1e-12)
    # The informed coefficients are those of the fit without the empty columns; the
    # evidence too (the empty columns' prior integrates to one).
    alone = EPLogisticRegression(**params).fit(X[:, :4], y, sample_weight=weights)
    np.testing.assert_allclose(est.coef_[0, :4], alone.coef_[0], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(
        est.log_marginal_likelihood_value_, alone.log_marginal_likelihood_value_, rtol=1e-8
    )
    # No data: all prior, relevance 0 (was NaN, or the horseshoe's stand-in's 0.2).
    np.testing.assert_array_equal(est.summary()["relevance"].to_numpy()[4:6], 0.0)


@pytest.mark.parametrize("ratio", [1.0 - 1e-12, 1.0 - 1e-6, 0.5, 1e-6])
def test_elastic_net_normalizer_is_exact_to_either_limit(ratio):
    """The elastic net's log normalizer, log ∫ exp(-r|t|/C - (1 - r)t²/2C) dt, in closed
    form by erfcx: exp(x²/2) Φ(-x) formed as a product cancelled ~x²/2 = 5e11 digits at
    r = 1 - 1e-12 (4e-4 nats off per coefficient). Against quadrature, near the L1 limit
    the Laplace prior's own, whose density it tends to (its t² term adds 1e-12 C)."""
    C = 0.7
    factor = elastic_net_factor(C, ratio)
    t_max = 60.0 * C / max(ratio, math.sqrt(1.0 - ratio))
    total = _quad(lambda t: math.exp(factor.log_density(np.array([t]))[0]), -t_max, t_max)
    assert total == pytest.approx(1.0, abs=1e-9)
    if ratio > 1.0 - 1e-6:
        laplace = LaplacePrior(C / ratio).coefficient_factor()
        grid = np.linspace(-5.0, 5.0, 11)
        np.testing.assert_allclose(
            factor.log_density(grid), laplace.log_density(grid), rtol=0, atol=1e-9
        )


@pytest.mark.parametrize(
    "prior", [{"penalty": "l1", "l1_ratio": 1.0}, {"prior": HorseshoePrior(0.1)}]
)
def test_a_dense_shrinkage_fit_beyond_the_work_limit_is_refused_first(monkeypatch, prior):
    # A shrinkage prior keeps the dense covariance: beyond MAX_DENSE_PARAMS coefficients
    # (here lowered to 40) its p × p steps would run for hours (text scale: 20,001), so
    # the fit is refused before any, naming the structure the Gaussian prior takes and the
    # most features that pass; at the limit it fits.
    from vsbayes.approximations import _glm_gaussian, newton_laplace

    monkeypatch.setattr(_glm_gaussian, "MAX_DENSE_PARAMS", 40)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 40))
    y = (X[:, 0] + rng.logistic(size=60) > 0).astype(int)
    with monkeypatch.context() as patched:
        patched.setattr(newton_laplace, "shrinkage_laplace", None)  # a Newton step raises
        for estimator in (VSLogisticRegression(**prior), EPLogisticRegression(**prior)):
            with pytest.raises(ValueError, match=r"41 coefficients, above the 40 .* 39 feat"):
                estimator.fit(X, y)
    fit = EPLogisticRegression(**prior).fit(X[:, :39], y)
    assert np.all(np.isfinite(fit.coef_))


def _wide_sparse(m=60, p=300, seed=0):
    """Sparse rows with more features than rows (the dual form's case, p > 256), labels
    from a few strong coefficients (some in a Student-t prior's tail at the mode)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    X = sp.random(m, p, density=0.05, random_state=seed, format="csr")
    X.data = rng.exponential(size=X.nnz)
    w = np.zeros(p)
    w[:15] = rng.normal(0.0, 4.0, 15)
    y = (X @ w + rng.logistic(size=m) > 0).astype(float)
    return X, y


def _reference_mode_gaussian(model, theta):
    """The Laplace Gaussian at ``theta`` by dense algebra: the exact negative Hessian, with
    the prior's ``mode_curvature``, inverted (what the dual form must reproduce)."""
    t = np.asarray(model.design @ theta).ravel()
    _, curvature = model.link.derivatives(t)
    design = model.design.toarray()
    precision = design.T @ (design * (model.sample_weight * curvature)[:, None])
    d = model.n_features
    precision[np.arange(d), np.arange(d)] += model.coefficient_prior.mode_curvature(theta[:d])
    precision[d, d] += 1.0 / model.prior_var[d]
    return np.linalg.inv(precision)


@pytest.mark.parametrize("prior", [StudentTPrior(3.0, 1.0), HorseshoePrior(0.1)])
@pytest.mark.parametrize("wide", [False, True])
def test_smooth_prior_mode_is_newtons_and_exact(prior, wide, monkeypatch):
    # The Student-t's majorizer (ν + 1)/(νs² + t²) converged linearly (77 iterations at
    # 2000 × 1000, ratio 0.8; 29 on the narrow problem here): Newton's step on the exact
    # Hessian where it is positive definite converges quadratically, to the same mode. With
    # more features than rows no p × p matrix is formed until the covariance (the dual form
    # through the M × M matrix), and that covariance is the dense inverse's to round-off.
    from vsbayes.approximations.shrinkage_mode import shrinkage_laplace

    X, y = _wide_sparse(60, 300) if wide else _wide_sparse(300, 100)
    model = BinaryGLMPosterior(
        X,
        2.0 * y - 1.0,
        np.ones(len(y)),
        "logistic",
        prior_var=1.0,
        intercept_prior_var=1e6,
        coefficient_prior=prior.coefficient_factor(),
    )
    if wide:
        monkeypatch.setattr(model, "weighted_gram", None)  # any p × p Gram matrix raises
    fit = shrinkage_laplace(model, tol=1e-12, max_iter=15)
    assert fit.converged and fit.n_iter <= 10
    # The mode to the objective's round-off: a step of 1e-7 on the horseshoe's curvature
    # 1/τ² = 100 gains 1e-12 nats, below the line search's resolution of the sum.
    assert fit.grad_norm < 1e-5
    cov = _reference_mode_gaussian(model, fit.mean)
    np.testing.assert_allclose(fit.cov, cov, rtol=1e-8, atol=1e-8 * np.abs(cov).max())


def test_negative_prior_sites_in_the_dual_form_are_the_dense_posterior(monkeypatch):
    # A heavy-tailed prior's EP sites with precisions below -1/base took the dense p × p
    # precision at every sweep (5001² at text scale, hours); with more coefficients than
    # rows the dual form plus a rank-k correction gives the same Gaussian to round-off,
    # and refuses (NotPositiveDefiniteError) exactly where the precision is indefinite.
    from vsbayes.approximations._glm_gaussian import NegativeSitesGaussian
    from vsbayes.exceptions import NotPositiveDefiniteError

    X, y = _wide_sparse(60, 300)
    model = BinaryGLMPosterior(
        X, 2.0 * y - 1.0, np.ones(len(y)), "logistic", prior_var=1e4, intercept_prior_var=1e6
    )
    rng = np.random.default_rng(1)
    tau = rng.uniform(0.05, 0.25, 60)
    linear = rng.normal(size=301)
    design = model.design.toarray()
    gram = design.T @ (design * tau[:, None])
    floor = 1.0 / model.prior_var
    diagonal = floor + rng.uniform(0.5, 2.0, 301)
    columns = np.flatnonzero(np.diag(gram)[:300] > 0.3)[:6]  # well informed by the rows
    diagonal[columns] = -0.1 * np.diag(gram)[columns]
    precision = gram + np.diag(diagonal)
    cov = np.linalg.inv(precision)
    monkeypatch.setattr(model, "weighted_gram", None)  # no p × p Gram matrix
    post = NegativeSitesGaussian(model, tau, linear, diagonal, floor)
    scale = np.abs(cov).max()
    np.testing.assert_allclose(post.mean, cov @ linear, rtol=1e-8, atol=1e-8 * scale)
    np.testing.assert_allclose(post.var, np.diag(cov), rtol=1e-8)
    np.testing.assert_allclose(post.t_var, np.einsum("ij,jk,ik->i", design, cov, design), rtol=1e-8)
    np.testing.assert_allclose(post.t_mean, design @ cov @ linear, rtol=1e-8, atol=1e-8 * scale)
    np.testing.assert_allclose(post.cov, cov, rtol=1e-8, atol=1e-8 * scale)
    assert abs(post.half_log_det - 0.5 * np.linalg.slogdet(precision)[1]) < 1e-8
    diagonal[columns] = -2.0 * np.diag(gram)[columns]  # beyond what the rows hold
    assert np.linalg.eigvalsh(gram + np.diag(diagonal)).min() < 0
    with pytest.raises(NotPositiveDefiniteError):
        NegativeSitesGaussian(model, tau, linear, diagonal, floor)


def test_a_shrinkage_fit_of_much_work_warns_before_its_first_step(monkeypatch):
    # Under MAX_DENSE_PARAMS a fit is not refused, but many rows make each step long (the
    # dense route's M p² Gram matrices, or the dual form's M³): the work is counted before
    # the first step, and beyond the bound (here lowered to the count's tenth) it warns
    # with the count, then fits.
    from vsbayes.approximations import _glm_gaussian
    from vsbayes.models.work import expected_shrinkage_work

    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 5))
    y = (X[:, 0] + rng.logistic(size=60) > 0).astype(int)
    model = BinaryGLMPosterior(
        X,
        2.0 * y - 1.0,
        np.ones(60),
        "logistic",
        prior_var=1.0,
        intercept_prior_var=1e6,
        coefficient_prior=StudentTPrior().coefficient_factor(),
    )
    monkeypatch.setattr(_glm_gaussian, "MAX_SHRINKAGE_WORK", 0.1 * expected_shrinkage_work(model))
    for estimator in (
        VSLogisticRegression(prior=StudentTPrior()),
        LaplaceLogisticRegression(penalty="l1", l1_ratio=1.0),
    ):
        with pytest.warns(UserWarning, match=r"6 coefficients, 60 rows\) will take about"):
            estimator.fit(X, y)
        assert np.all(np.isfinite(estimator.coef_))
