"""Shrinkage priors (penalty="l1"/"elasticnet") on the multinomial posterior: its mode is
scikit-learn's multinomial L1/elastic-net solution, EP fits one site per coefficient."""

import warnings

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_t
from sklearn.base import clone
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from vsbayes import (
    EPLogisticRegression,
    ISLogisticRegression,
    LaplaceLogisticRegression,
    LaplacePrior,
    StudentTPrior,
    VSLogisticRegression,
)
from vsbayes.approximations.softmax_ep import softmax_ep
from vsbayes.approximations.softmax_prior_sites import (
    _cavities,
    softmax_ep_with_prior_sites,
    under_prior_sites,
)
from vsbayes.estimators import _methods
from vsbayes.exceptions import ConvergenceWarning
from vsbayes.models import SoftmaxGLMPosterior
from vsbayes.models.shrinkage_priors import elastic_net_factor
from vsbayes.models.softmax_predictive import observed_class_log_predictive


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _saga(X, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (saga's ConvergenceWarning at tol=1e-12)
        return LogisticRegression(solver="saga", tol=1e-12, max_iter=100_000, **params).fit(X, y)


@pytest.mark.parametrize("penalty, ratio", [("l1", 1.0), ("elasticnet", 0.5)])
def test_mode_is_sagas_multinomial_solution(penalty, ratio, iris):
    X, y = iris
    est = LaplaceLogisticRegression(penalty=penalty, l1_ratio=ratio, C=0.5, tol=1e-12).fit(X, y)
    lr = _saga(X, y, penalty=penalty, l1_ratio=ratio, C=0.5)
    # The same objective's minimizer, up to saga's own convergence (its iterates stop
    # within ~1e-6 of the solution at tol=1e-12) and the intercepts' N(0, 10⁶) prior.
    np.testing.assert_allclose(est.coef_, lr.coef_, atol=1e-5)
    np.testing.assert_allclose(est.intercept_, lr.intercept_, atol=1e-5)
    np.testing.assert_array_equal(est.coef_ == 0, np.abs(lr.coef_) < 1e-7)
    if ratio == 1.0:  # not centred: each column's median over the three classes is 0
        np.testing.assert_array_equal(np.median(est.coef_, axis=0), 0.0)
    assert np.all(np.linalg.eigvalsh(est.sigma_) > 0)
    assert np.isfinite(est.log_marginal_likelihood_value_)


def test_four_classes_mode_has_sagas_objective():
    # With an even number of classes each column's penalty is flat between its two middle
    # coefficients: the mode is not unique, its contrasts and objective are.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 3))
    y = np.argmax(X @ rng.normal(size=(3, 4)) + rng.gumbel(size=(80, 4)), axis=1)
    est = LaplaceLogisticRegression(penalty="l1", l1_ratio=1, C=0.5, tol=1e-12).fit(X, y)
    lr = _saga(X, y, penalty="l1", l1_ratio=1, C=0.5)

    def objective(coef, intercept):
        f = X @ coef.T + intercept
        log_lik = f[np.arange(len(y)), y].sum() - logsumexp(f, axis=1).sum()
        return log_lik - np.abs(coef).sum() / 0.5

    ours, theirs = objective(est.coef_, est.intercept_), objective(lr.coef_, lr.intercept_)
    assert ours >= theirs - 1e-8 * abs(theirs)
    centred = est.coef_ - est.coef_.mean(axis=0)
    np.testing.assert_allclose(centred, lr.coef_ - lr.coef_.mean(axis=0), atol=1e-5)
    # The singular Laplace precision (a flat mode) takes the prior's variance (D-123).
    assert np.all(np.linalg.eigvalsh(est.sigma_) > 0)


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    f = X @ (1.5 * rng.normal(size=(3, 2))).T
    y = np.argmax(f + rng.gumbel(size=f.shape), axis=1)
    return X, y


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_ep_with_prior_sites_against_importance_sampling(ratio, small):
    X, y = small
    model = SoftmaxGLMPosterior(
        X,
        y,
        np.ones(len(y)),
        3,
        prior_var=1.0,
        intercept_prior_var=1.0,
        coefficient_prior=elastic_net_factor(0.5, ratio),
    )
    ep = softmax_ep_with_prior_sites(model, tol=1e-8)
    assert ep.converged
    # Self-normalized IS from EP's Gaussian widened 1.5× with t₅ tails: an ESS of ~2·10⁴
    # of 10⁵ draws leaves ~0.01 sd of Monte Carlo error in the means.
    proposal = multivariate_t(ep.mean, 2.25 * ep.cov, df=5)
    draws = proposal.rvs(100_000, random_state=1)
    log_w = model.log_density(draws) - proposal.logpdf(draws)
    w = np.exp(log_w - log_w.max())
    log_z = log_w.max() + np.log(w.mean())
    w /= w.sum()
    effective_sample_size = 1.0 / (w @ w)
    assert effective_sample_size > 10_000
    mean = w @ draws
    sd = np.sqrt(w @ (draws - mean) ** 2)
    # EP's own error here (measured with 4·10⁵ draws): means within 0.02 sd, sds within
    # 3 %, the evidence within 0.06 nats; Laplace's at the L1 mode was 0.7 sd.
    np.testing.assert_array_less(np.abs(ep.mean - mean) / sd, 0.06)
    np.testing.assert_array_less(np.abs(np.sqrt(np.diag(ep.cov)) / sd - 1.0), 0.06)
    assert abs(ep.log_Z - log_z) < 0.15


def test_estimators_fit_iris_under_l1(iris):
    X, y = iris[0][::2], iris[1][::2]
    ep = EPLogisticRegression(penalty="l1", l1_ratio=1, C=0.5).fit(X, y)
    vs = VSLogisticRegression(penalty="l1", l1_ratio=1, C=0.5).fit(X, y)
    assert not ep.laplace_fallback_[0]
    assert vs.strategy_ == ["sites"] and "one site per coefficient" in vs.strategy_reason_[0]
    np.testing.assert_allclose(vs.coef_, ep.coef_, rtol=1e-10)
    same = EPLogisticRegression(prior=LaplacePrior(scale=0.5)).fit(X, y)
    np.testing.assert_allclose(same.coef_, ep.coef_, rtol=1e-10)
    # The posterior mean is not sparse, nor centred; the fit predicts.
    assert np.all(ep.coef_ != 0)
    assert np.abs(ep.coef_.sum(axis=0)).max() > 1e-3
    proba = ep.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert ep.score(X, y) > 0.9
    table = ep.summary()
    np.testing.assert_allclose(table["mean"].to_numpy()[:4], ep.coef_[0])
    assert np.isfinite(table["relevance"].to_numpy()[:4]).all()
    lower, upper = ep.predict_proba_interval(X[:5], random_state=0)
    assert np.all(lower <= upper) and lower.shape == (5, 3)
    laplace = LaplaceLogisticRegression(penalty="l1", l1_ratio=1, C=0.5).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PSIS's k̂ warning: Laplace at an L1 mode)
        assert np.isfinite(laplace.loo(X, y).elpd_loo)


def test_unsupported_multinomial_routes_say_what_is(iris):
    X, y = iris
    with pytest.raises(ValueError, match=r"contrasts.*OneVsRestClassifier"):
        ISLogisticRegression(penalty="l1", l1_ratio=1).fit(X, y)
    with pytest.raises(ValueError, match="not log-concave"):
        EPLogisticRegression(prior=StudentTPrior()).fit(X, y)
    with pytest.raises(ValueError, match="strategy='global'"):
        VSLogisticRegression(penalty="l1", l1_ratio=1, strategy="global").fit(X, y)
    # The Student-t prior's mode is the Laplace approximation's: no sites.
    fit = LaplaceLogisticRegression(prior=StudentTPrior(3.0, 1.0)).fit(X, y)
    assert np.all(np.isfinite(fit.coef_))


def test_a_wide_multinomial_under_a_shrinkage_prior_is_refused_naming_it(iris):
    # Beyond the dense multinomial posterior's size the refusal said to use the structured
    # covariance, which a shrinkage prior does not take: it names the prior and the
    # Gaussian prior that does.
    X, y = iris
    X = np.hstack([X, np.random.default_rng(0).standard_normal((150, 3400))])
    with pytest.raises(ValueError, match=r"LaplacePrior.*keeps the dense.*penalty='l2'"):
        LaplaceLogisticRegression(penalty="l1", l1_ratio=1).fit(X, y)


def test_a_cavity_below_the_base_by_round_off_is_the_base():
    # A nearly untouched column (a digit's corner pixel): its posterior precision is its
    # prior site's plus the base's plus ~0, which round-off put 1e-12 below the two.
    factor = elastic_net_factor(0.1, 1.0)
    base = np.array([factor.base_var] * 2)
    tau = np.array([49.99985167, 10.0])
    var = 1.0 / (tau + 1.0 / base - np.array([1e-12 * 50.0, -1.0]))  # the second: data
    cav_mean, cav_var, ok, exact = _cavities(
        np.zeros(2), var, tau, np.zeros(2), np.zeros(2, bool), base, True
    )
    np.testing.assert_array_equal(exact, [True, False])
    assert ok.all() and cav_var[0] == base[0] and cav_mean[0] == 0.0
    np.testing.assert_allclose(1.0 / cav_var[1], 1.0 + 1.0 / base[1], rtol=1e-9)


def _left_out_terms(X, y, rows, latent_without):
    """log p(y_i | y_−i) of ``rows``, ``latent_without(keep, x)`` the latent K values'
    mean (1, K) and covariance (1, K, K) at the row x (1, d) under the posterior of the
    rows ``keep``."""
    out = []
    for i in rows:
        f_mean, f_cov = latent_without(np.arange(len(y)) != i, X[i : i + 1])
        out.append(observed_class_log_predictive(f_mean, f_cov, y[i : i + 1])[0])
    return np.array(out)


def test_loo_keeps_the_prior_sites_and_does_not_refit(monkeypatch):
    # Leave-one-out under a shrinkage prior: EP refitted without each influential row, warm
    # from the fit's sites, under the prior sites' Gaussian (base × sites) held fixed.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = np.argmax(X @ np.array([[1.5, -1.0, 0.0], [0.0, 1.2, -1.0]]) + rng.gumbel(size=(30, 3)), 1)
    est = EPLogisticRegression(penalty="l1", l1_ratio=1, C=1.0).fit(X, y)
    fits = []
    counted = _methods.prior_sites_ep

    def counting(*args, **kwargs):
        fits.append(1)
        return counted(*args, **kwargs)

    monkeypatch.setattr(_methods, "prior_sites_ep", counting)
    loo = est.loo(X, y)
    assert not fits  # no EP of the prior sites: no refit of the estimator
    assert loo.refitted.sum() >= 20  # (tiny data: nearly every row is influential)
    # (Every third refitted row is checked: each check is a fit.)
    rows = np.flatnonzero(loo.refitted)[::3]
    # 1. The warm refits reach EP's fixed point under the fixed prior sites: cold EP (to
    # 1e-8) on the rows without i under the same Gaussian prior. The refits stop at a site
    # change of 1e-3 (REFIT_TOL), each term within ~2e-3 nats of its fixed point (D-060).
    factor, tau_nu = est._shrinkage_factor(), est.posteriors_[0].prior_sites
    priors = est._priors(X, np.ones(len(y)), False)

    def fixed_sites(keep, x):
        model = SoftmaxGLMPosterior(X, y, keep * 1.0, 3, coefficient_prior=factor, **priors)
        ep = softmax_ep(under_prior_sites(model, *tau_nu))
        # f = W x + b: θ's class-major W, then the intercepts.
        jacobian = np.hstack([np.kron(np.eye(3), x), np.eye(3)])
        return (jacobian @ ep.mean)[None], (jacobian @ ep.cov @ jacobian.T)[None]

    cold = _left_out_terms(X, y, rows, fixed_sites)
    np.testing.assert_allclose(loo.pointwise[rows], cold, atol=5e-3)

    # 2. Against brute force (the estimator refitted without each row: its prior sites
    # move too). Under the Gaussian prior N(0, 1) the same loo is within 0.012 nats of
    # brute force per row, 6e-4 on average (4 seeds of this design, every row); holding
    # the prior sites fixed adds the approximation's own error: at most 0.045 per row and
    # 0.0047 on average (+0.14 nats in sum, 0.5 % of elpd) on 4 seeds at C = 1.
    def estimator_refit(keep, x):
        latent = clone(est).fit(X[keep], y[keep])._predictive().latent(x)
        return latent(next(iter(latent.chunks)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        brute = _left_out_terms(X, y, rows, estimator_refit)
    assert len(fits) == rows.size  # (the counter counts: each refit ran the prior sites' EP)
    difference = loo.pointwise[rows] - brute
    assert np.max(np.abs(difference)) < 0.06
    assert abs(difference.mean()) < 0.01


def test_a_multinomial_shrinkage_fit_of_much_work_warns_before_its_first_step(monkeypatch):
    # D-236's count for the multinomial posterior (p = K(d + 1)): its dense steps' p³ and
    # the K(K + 1)/2 class pairs' Gram matrices of the rows, over EP's steps, or Newton's
    # alone in the Laplace approximation. Beyond the bound (here lowered to a tenth of the
    # Laplace approximation's count) the fit warns with the count before it starts, for
    # the smooth prior (Student-t: the Laplace approximation) and the L1 one (EP), then
    # fits; at twice that count only EP's sweeps warn. A sparse design with every entry
    # stored counts as the dense one.
    import scipy.sparse as sp

    from vsbayes.approximations import _glm_gaussian
    from vsbayes.models.work import LAPLACE_SHRINKAGE_STEPS, expected_shrinkage_work

    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    y = np.argmax(X[:, :3] + rng.gumbel(size=(60, 3)), axis=1)
    factor = StudentTPrior().coefficient_factor()
    options = {"prior_var": 1.0, "intercept_prior_var": 1e6, "coefficient_prior": factor}
    model = SoftmaxGLMPosterior(X, y, np.ones(60), 3, **options)
    work = expected_shrinkage_work(model, LAPLACE_SHRINKAGE_STEPS)
    stored = SoftmaxGLMPosterior(sp.csr_matrix(X), y, np.ones(60), 3, **options)
    assert expected_shrinkage_work(stored, LAPLACE_SHRINKAGE_STEPS) == work
    said = r"\(15 coefficients of 3 classes, 60 rows\) will take about"
    laplace = LaplaceLogisticRegression(prior=StudentTPrior())
    ep = EPLogisticRegression(prior=LaplacePrior())
    monkeypatch.setattr(_glm_gaussian, "MAX_SHRINKAGE_WORK", 0.1 * work)
    for estimator in (laplace, ep):
        with pytest.warns(UserWarning, match=said):
            estimator.fit(X, y)
        assert estimator.coef_.shape == (3, 4) and np.all(np.isfinite(estimator.coef_))
    monkeypatch.setattr(_glm_gaussian, "MAX_SHRINKAGE_WORK", 2.0 * work)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        laplace.fit(X, y)
    assert not [w for w in caught if "will take about" in str(w.message)]
    with pytest.warns(UserWarning, match=said):
        ep.fit(X, y)


def test_the_rows_ep_warns_for_the_last_round_only(small, monkeypatch):
    """Each round of the prior sites runs the rows' EP to an inexact tolerance, which may
    stop short and say so: every round's ConvergenceWarning was shown (59 in one fit of
    100 × 10 rows, 3 classes, penalty="l1"); the kept ones are the last round's, whose
    posterior is returned."""
    from vsbayes.approximations import softmax_prior_sites

    rounds = []

    def warning_ep(*args, **kwargs):
        rounds.append(None)
        warnings.warn(f"the rows' EP of round {len(rounds)}", ConvergenceWarning, stacklevel=2)
        return softmax_ep(*args, **kwargs)

    monkeypatch.setattr(softmax_prior_sites, "softmax_ep", warning_ep)
    X, y = small
    model = SoftmaxGLMPosterior(
        X,
        y,
        np.ones(len(y)),
        3,
        prior_var=1.0,
        intercept_prior_var=1.0,
        coefficient_prior=elastic_net_factor(0.5, 1.0),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        softmax_ep_with_prior_sites(model, tol=1e-8)
    assert len(rounds) > 1
    assert [str(w.message) for w in caught] == [f"the rows' EP of round {len(rounds)}"]
